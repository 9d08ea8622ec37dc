"""Applied = measured: an application's ``tuner.best_kernel`` runs kernels with the settings the
engine's run worker measured them with (threading layer, threads, OpenMP wait policy, codegen).

The engine's workers once ran with ``OMP_WAIT_POLICY=passive`` while an application's libgomp spun,
and the applied kernel ran up to 2x slower than recorded on a busy host. Here both sides report the
settings read back from numba, and they must be identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from measure_agent.engine import MeasureEngine, MeasureInput, MeasureStatus, TimingConfig
from measure_agent.engine import runtime as runtime_module
from measure_agent.engine.runtime import (DEFAULT_SPIN_COUNT, KernelRuntime, RuntimeSettingsError,
                                          default_thread_count)
from measure_agent.templates import default_catalog
from measure_agent.workload import parse_workload
from tuner.log import TrialRecord, TuningLog

W = parse_workload("matmul(M=24,N=40,K=16)")
DEVICE = "x86_64-test-2c-avx2"
ROOT = Path(__file__).resolve().parents[1]

APP = """
import json, sys
import tuner

kernel = tuner.best_kernel(sys.argv[2], sys.argv[3], db=sys.argv[1])
print(json.dumps({"kind": kernel.kind, "report": kernel.runtime_report.to_json(),
                  "runtime": kernel.runtime.environment()}))
"""


def test_runtime_resolves_defaults_then_what_the_operator_exported():
    plain = KernelRuntime.resolve({}, host_features="+avx2,+fma")
    assert plain.wait_policy == "passive" and plain.threading_layer == "default"
    assert plain.num_threads == default_thread_count()
    assert dict(plain.codegen) == {"NUMBA_OPT": "3", "NUMBA_SLP_VECTORIZE": "1"}
    exported = KernelRuntime.resolve({"OMP_WAIT_POLICY": "ACTIVE", "NUMBA_NUM_THREADS": "1",
                                      "NUMBA_THREADING_LAYER": "workqueue", "NUMBA_OPT": "0"},
                                     host_features="+avx2,+avx512f")
    assert (exported.wait_policy, exported.num_threads, exported.threading_layer) == ("active", 1, "workqueue")
    env = exported.environment()
    assert env["NUMBA_OPT"] == "3"  # what kernels need is never overridden
    assert env["NUMBA_CPU_FEATURES"].endswith("-prefer-256-bit") and env["NUMBA_NUM_THREADS"] == "1"
    # libgomp's spin before sleeping: bounded by default, as exported otherwise; an exported active
    # policy spins as libgomp does (no count bounds it)
    assert plain.spin_count == DEFAULT_SPIN_COUNT > 0
    assert plain.environment()["GOMP_SPINCOUNT"] == str(DEFAULT_SPIN_COUNT)
    assert exported.spin_count is None and "GOMP_SPINCOUNT" not in env
    sleeping = KernelRuntime.resolve({"GOMP_SPINCOUNT": " 0 "})
    assert sleeping.spin_count == 0 and sleeping.environment()["GOMP_SPINCOUNT"] == "0"
    # glibc's malloc keeps the pages of a kernel's per-call scratch arrays: large thresholds by
    # default, as exported otherwise
    assert dict(plain.malloc) == {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),
                                  "MALLOC_TRIM_THRESHOLD_": str(512 * 1024 * 1024)}
    assert plain.environment()["MALLOC_MMAP_THRESHOLD_"] == str(32 * 1024 * 1024)
    kept = KernelRuntime.resolve({"MALLOC_TRIM_THRESHOLD_": "1048576"})
    assert dict(kept.malloc)["MALLOC_TRIM_THRESHOLD_"] == "1048576"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_malloc_thresholds_take_effect_in_a_running_process():
    """An application's process started long before best_kernel: the thresholds are set through
    mallopt, not only the environment glibc read at start-up."""
    assert KernelRuntime.resolve({}).apply_malloc()


@pytest.mark.parametrize("name, value", [("NUMBA_NUM_THREADS", "two"), ("NUMBA_NUM_THREADS", "0"),
                                         ("OMP_WAIT_POLICY", "sometimes"), ("NUMBA_THREADING_LAYER", "gcd"),
                                         ("GOMP_SPINCOUNT", "lots"), ("GOMP_SPINCOUNT", "-1"),
                                         ("GOMP_SPINCOUNT", "1" + "0" * 40), ("MALLOC_MMAP_THRESHOLD_", "32M"),
                                         ("MALLOC_TRIM_THRESHOLD_", "-1")])
def test_a_bad_exported_setting_is_a_one_line_error(name, value):
    with pytest.raises(RuntimeSettingsError, match=name) as error:
        KernelRuntime.resolve({name: value})
    assert "\n" not in str(error.value)


def test_apply_sets_what_a_process_starting_numba_reads(monkeypatch):
    # as before numba launched its threads (whether an earlier test in this process did is not ours)
    monkeypatch.setattr(runtime_module, "_threads_launched", lambda: False)
    environ: dict[str, str] = {}
    runtime = KernelRuntime(threading_layer="omp", num_threads=3, wait_policy="passive",
                            codegen=(("NUMBA_OPT", "3"),))
    runtime.apply(environ)
    assert environ["OMP_WAIT_POLICY"] == "passive" and environ["NUMBA_THREADING_LAYER"] == "omp"
    assert environ["NUMBA_OPT"] == "3"
    # numba is imported in this test process: its pool size is fixed, so the count is left alone
    assert ("NUMBA_NUM_THREADS" in environ) == ("numba" not in sys.modules)


def test_apply_after_numba_launched_its_threads_leaves_what_it_can_no_longer_change(monkeypatch):
    import numba  # noqa: F401  (the late case: numba imported and its threads running)

    monkeypatch.setattr(runtime_module, "_threads_launched", lambda: True)
    environ = {"OMP_WAIT_POLICY": "active"}
    runtime = KernelRuntime(threading_layer="omp", num_threads=3, wait_policy="passive",
                            codegen=(("NUMBA_OPT", "3"),))
    assert runtime.apply(environ) is False
    # the threads already run with the old values: writing new ones would make the report lie
    assert environ["OMP_WAIT_POLICY"] == "active" and "NUMBA_THREADING_LAYER" not in environ
    assert "NUMBA_NUM_THREADS" not in environ and environ["NUMBA_OPT"] == "3"


def _measured_runtime(cache_dir: Path, db: Path) -> dict:
    """Measure W's default config with the real engine, record it in ``db``; the run worker's report."""
    template = default_catalog().get("matmul", "cpu")
    config = template.default_config(W, template.space(W))
    timing = TimingConfig(number=1, repeat=1, min_repeat_ms=0, warmup=1, build_timeout_s=300, run_timeout_s=60)
    with MeasureEngine(timing, cache_dir=cache_dir) as engine:
        [result] = engine.measure([MeasureInput(W, config)])
        engine_runtime = engine.runtime
    assert result.status is MeasureStatus.OK, result.message
    assert engine_runtime == KernelRuntime.resolve()
    with TuningLog(f"sqlite:///{db}") as log:
        log.upsert_device(DEVICE, {"arch": "x86_64"})
        log.record_trials([TrialRecord(W.key, DEVICE, "cpu", config.to_json(), "ok", result.costs, result.mean_s)])
    return result.details["runtime"]


def _applied_runtime(cache_dir: Path, db: Path, tmp_path: Path) -> dict:
    script = tmp_path / "app.py"
    script.write_text(APP)
    path = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    # a fresh application process, without the variables this test process may have set
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") or k in ("NUMBA_NUM_THREADS",)}
    child_env.update(XDG_CACHE_HOME=str(cache_dir.parent), PYTHONPATH=path)
    done = subprocess.run([sys.executable, str(script), str(db), W.key, DEVICE], env=child_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    applied = json.loads(done.stdout.strip().splitlines()[-1])
    assert applied["kind"] == "tuned"
    return applied


@pytest.mark.parametrize("exported", [{}, {"OMP_WAIT_POLICY": "active", "NUMBA_NUM_THREADS": "1"},
                                      {"GOMP_SPINCOUNT": "20000", "MALLOC_MMAP_THRESHOLD_": "1048576"}],
                         ids=["defaults", "operator-exported", "bounded-spin"])
def test_the_application_runs_kernels_with_the_settings_the_engine_measured_with(
        exported, monkeypatch, kernel_cache_dir, tmp_path):
    for name in ("OMP_WAIT_POLICY", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "GOMP_SPINCOUNT",
                 "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    for name, value in exported.items():
        monkeypatch.setenv(name, value)  # the engine's environment and the application's alike
    cache_dir = kernel_cache_dir / "tunefleet"  # best_kernel's default under XDG_CACHE_HOME
    db = tmp_path / "log.db"
    measured = _measured_runtime(cache_dir, db)
    applied = _applied_runtime(cache_dir, db, tmp_path)
    assert applied["report"] == measured
    expected = KernelRuntime.resolve()
    assert measured["wait_policy"] == expected.wait_policy == exported.get("OMP_WAIT_POLICY", "passive")
    assert measured["spin_count"] == (None if expected.spin_count is None else str(expected.spin_count))
    assert measured["spin_count"] == exported.get("GOMP_SPINCOUNT", None if "OMP_WAIT_POLICY" in exported
                                                  else str(DEFAULT_SPIN_COUNT))
    assert measured["malloc"] == dict(expected.malloc)
    assert measured["malloc"]["MALLOC_MMAP_THRESHOLD_"] == exported.get("MALLOC_MMAP_THRESHOLD_", str(32 * 1024 * 1024))
    assert measured["num_threads"] == measured["pool_threads"] == expected.num_threads
    assert measured["threading_layer"] is not None
    assert {k: v for k, v in measured["codegen"].items()} == dict(expected.codegen)
    assert applied["runtime"] == expected.environment()


def test_every_application_thread_calls_with_the_measured_thread_count():
    """numba's thread count belongs to the calling thread: a kernel first called from a new thread
    sets it there too, once."""
    import threading

    import numba

    from measure_agent.templates import KernelSource
    from measure_agent.workload import parse_workload
    from tuner.apply import TunedKernel

    seen = []

    def kernel(a, b, out):  # stands in for the numba dispatcher: what count is it called with?
        seen.append(numba.get_num_threads())

    workload = parse_workload("matmul(M=2,N=2,K=2)")
    tuned = TunedKernel(workload, "cpu", {}, "default", kernel, KernelSource(text="", entry="matmul"),
                        runtime=KernelRuntime(num_threads=1))
    a = np.ones((2, 2), np.float32)
    worker = threading.Thread(target=lambda: [tuned(a, a) for _ in range(2)])
    tuned(a, a)
    worker.start()
    worker.join()
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)  # this test thread's count, as before
    assert seen == [1, 1, 1]
