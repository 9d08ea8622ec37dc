"""``tuner.best_kernel``: a compiled kernel with the best known config, for applications.

Kernel compiles are the cost here (seconds each): every test uses one tiny matmul, and its configs
are chosen to render the same kernel text (they differ only in runtime cache-block sizes), so the
whole module compiles one kernel, into the session's shared kernel cache.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tuner
import tuner.apply
from measure_agent.device import detect_device
from measure_agent.templates import TemplateNotFound, default_catalog
from measure_agent.workload import WorkloadError, parse_workload
from tuner.apply import NotTunedWarning, TunedKernel
from tuner.log import TrialRecord, TuningLog, TuningLogError, export_best

W = parse_workload("matmul(M=24,N=40,K=16)")
NEAR = parse_workload("matmul(M=32,N=40,K=16)")  # log-distance log2(32/24) from W
DEVICE = "x86_64-test-2c-avx2"


def _variant(workload, config):
    """A valid config other than ``config`` that renders the same kernel text (a runtime knob differs)."""
    template = default_catalog().get(workload.op, "cpu")
    space = template.space(workload)
    text = template.render(workload, config).text
    for knob in space.knobs:
        for value in knob.values:
            if value == config[knob.name]:
                continue
            candidate = dict(config.as_dict(), **{knob.name: value})
            try:
                variant = space.make(candidate)
            except ValueError:
                continue
            if template.render(workload, variant).text == text:
                return variant
    pytest.skip("the matmul template has no runtime-only knob")


@pytest.fixture(scope="module")
def configs():
    template = default_catalog().get("matmul", "cpu")
    default = template.default_config(W, template.space(W))
    near_default = template.default_config(NEAR, template.space(NEAR))
    # what best_kernel falls back to: the default sized for this host's ISA
    host_default = template.default_config(W, template.space(W, detect_device()))
    return {"default": default, "tuned": _variant(W, default), "near": near_default, "host_default": host_default}


@pytest.fixture
def env(monkeypatch, kernel_cache_dir, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(kernel_cache_dir))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("TUNEFLEET_DB", raising=False)
    return tmp_path


def _ok(workload, config, mean, device=DEVICE):
    return TrialRecord(workload.key, device, "cpu", config.to_json(), "ok", (mean,), mean)


@pytest.fixture
def tuned_db(env, configs):
    path = env / "tuned.db"
    with TuningLog(f"sqlite:///{path}") as log:
        log.upsert_device(DEVICE, {"arch": "x86_64"})
        log.record_trials([_ok(W, configs["tuned"], 1e-5), _ok(W, configs["default"], 2e-5),
                           _ok(NEAR, configs["near"], 3e-5, device="aarch64-other")])
    return path


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (24, 16)).astype(np.float32), rng.uniform(-1, 1, (16, 40)).astype(np.float32))


def _check(kernel):
    a, b = _inputs()
    c = kernel(a, b)
    assert c.shape == (24, 40) and c.dtype == np.float32
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_tuned_config_from_a_database(tuned_db, configs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel = tuner.best_kernel("matmul(N=40, M=24, K=16)", DEVICE, db=str(tuned_db))
    assert isinstance(kernel, TunedKernel)
    assert (kernel.kind, kernel.tuned, kernel.approximate, kernel.is_default) == ("tuned", True, False, False)
    assert kernel.config == configs["tuned"].to_json()
    assert (kernel.workload, kernel.tuned_workload, kernel.device_key, kernel.mean_s) == (W, W.key, DEVICE, 1e-5)
    assert kernel.kernel_source.runtime_args and "tuned on" in repr(kernel)
    _check(kernel)

    a, b = _inputs(1)
    out = np.empty((24, 40), np.float32)
    assert kernel(np.asfortranarray(a), b[:, :], out=out) is out  # any layout in, C-contiguous out
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match="must be float32"):
        kernel(a.astype(np.float64), b)
    with pytest.raises(ValueError, match=r"shape \(16, 40\)"):
        kernel(a, b[:, :39])
    with pytest.raises(TypeError, match="takes 2 input arrays"):
        kernel(a)
    with pytest.raises(ValueError, match="out must be"):
        kernel(a, b, out=np.empty((40, 24), np.float32))
    shared = np.zeros(24 * 40, np.float32)  # an input that is part of out: refused, not computed wrongly
    a_in_out = shared[:24 * 16].reshape(24, 16)
    a_in_out[:] = a
    with pytest.raises(ValueError, match="out must not share memory with an input"):
        kernel(a_in_out, b, out=shared.reshape(24, 40))

    # Compiled once per process: another call, another source of the same config, the same kernel.
    again = tuner.best_kernel(W, "x86_64-*", db=f"sqlite:///{tuned_db}")
    assert again.kernel is kernel.kernel and again.kind == "tuned" and again.device_key == DEVICE
    with TuningLog(f"sqlite:///{tuned_db}", create=False) as log:  # an open log will do too
        assert tuner.best_kernel(W, DEVICE, db=log).config == kernel.config


def test_nearest_then_default_fallbacks_warn(tuned_db, configs):
    with pytest.warns(NotTunedWarning, match=r"using the config tuned for matmul\(M=32,N=40,K=16,dtype=float32\) "
                      r"on aarch64-other \(nearest tuned shape, log-distance 0.42\)"):
        near = tuner.best_kernel(W, "aarch64-other", db=tuned_db)
    assert (near.kind, near.approximate, near.tuned) == ("approximate", True, False)
    assert near.tuned_workload == NEAR.key and near.device_key == "aarch64-other" and near.mean_s == 3e-5
    template = default_catalog().get("matmul", "cpu")
    assert template.space(W).from_json(near.config)  # valid for the requested shape
    _check(near)

    with pytest.warns(NotTunedWarning, match="using the template's default config"):
        default = tuner.best_kernel(W, "aarch64-other", db=tuned_db, nearest=False)
    assert (default.kind, default.is_default, default.tuned_workload, default.mean_s) == ("default", True, None, None)
    assert default.config == configs["host_default"].to_json()
    _check(default)
    with pytest.warns(NotTunedWarning, match="nothing tuned in"):
        assert tuner.best_kernel(W, "riscv-*", db=tuned_db).is_default


def test_no_database_at_all_means_default_and_creates_nothing(env, configs):
    with pytest.warns(NotTunedWarning, match="no tuning log at"):
        kernel = tuner.best_kernel(W, DEVICE)
    assert kernel.is_default and kernel.config == configs["host_default"].to_json()
    assert not (env / "data").exists()


def test_best_configs_file_without_a_database(tuned_db, configs, env):
    with TuningLog(f"sqlite:///{tuned_db}", create=False) as log:
        buffer = io.StringIO()
        export_best(log, buffer)
    shipped = env / "app" / "tuned.json"
    shipped.parent.mkdir()
    shipped.write_text(buffer.getvalue())
    tuned_db.unlink()
    kernel = tuner.best_kernel(W, DEVICE, db=shipped)
    assert kernel.tuned and kernel.config == configs["tuned"].to_json()
    _check(kernel)
    with pytest.warns(NotTunedWarning, match="nearest tuned shape"):
        assert tuner.best_kernel(W, "aarch64-*", db=str(shipped)).approximate

    # An entry the installed template rejects is named in the warning, not reported as "nothing tuned".
    document = json.loads(buffer.getvalue())
    entry = next(e for e in document["entries"] if e["workload"] == W.key and e["device_key"] == DEVICE)
    knob = next(iter(entry["config"]))
    entry["config"][knob] = "no-such-value"
    broken = env / "app" / "broken.json"
    broken.write_text(json.dumps(document))
    with pytest.warns(NotTunedWarning, match=rf"has one, rejected: its config .* for {DEVICE} is not valid for the "
                      rf"installed template \(.*{knob}"):
        assert tuner.best_kernel(W, DEVICE, db=broken, nearest=False).is_default


def test_errors(env, tuned_db):
    with pytest.raises(TuningLogError, match="no tuning log or best-configs file at"):
        tuner.best_kernel(W, DEVICE, db=env / "missing.db")
    empty = env / "empty.db"
    empty.touch()
    with pytest.raises(TuningLogError, match="run 'tuner db upgrade"):  # never created or migrated here
        tuner.best_kernel(W, DEVICE, db=empty)
    with pytest.raises(TuningLogError, match="no tuning log at"):
        tuner.best_kernel(W, DEVICE, db=f"sqlite:///{env / 'absent.db'}")
    assert not (env / "absent.db").exists()
    with pytest.raises(TuningLogError, match="Connection refused|connection failed"):
        tuner.best_kernel(W, DEVICE, db="postgresql+psycopg://postgres@127.0.0.1:1/none")
    with pytest.raises(WorkloadError):
        tuner.best_kernel("matmul(M=4)", DEVICE, db=tuned_db)
    with pytest.raises(TemplateNotFound):
        tuner.best_kernel(W, DEVICE, db=tuned_db, target="fpga")
    with pytest.raises(TypeError, match="workload must be a Workload or its key"):
        tuner.best_kernel(None, DEVICE, db=tuned_db)
    with pytest.raises(TypeError, match="device_key must be a string"):
        tuner.best_kernel(W, 5, db=tuned_db)
    with pytest.raises(TypeError, match="db must be a database URL, a file path"):
        tuner.best_kernel(W, DEVICE, db=5)
    listed = env / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(TuningLogError, match="not a best-configs file"):
        tuner.best_kernel(W, DEVICE, db=listed)


APP = r"""
import json, os, sys
import numpy as np
if sys.argv[2] == "numba-first":
    import numba
import tuner

kernel = tuner.best_kernel("matmul(M=24,N=40,K=16)", sys.argv[3], db=sys.argv[1])
import numba
from measure_agent.engine.build import numba_dispatcher

rng = np.random.default_rng(0)
a, b = rng.random((24, 16), dtype=np.float32), rng.random((16, 40), dtype=np.float32)
dispatcher = numba_dispatcher(kernel.kernel, kernel.kernel_source)
stats = dispatcher.stats
print(json.dumps({
    "kind": kernel.kind,
    "applied": kernel.numba_environment_applied,
    "env": [os.environ.get("NUMBA_SLP_VECTORIZE"), os.environ.get("NUMBA_OPT")],
    "slp": numba.config.SLP_VECTORIZE,
    "correct": bool(np.allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)),
    "cache_hits": sum(stats.cache_hits.values()),
    "cache_misses": sum(stats.cache_misses.values()),
}))
"""


def test_another_process_loads_the_kernel_from_the_disk_cache(tuned_db, env, kernel_cache_dir):
    from measure_agent.engine.build import codegen_environment

    script = env / "app.py"
    script.write_text(APP)
    # The checkout first on the path, as for the tests themselves (an editable install made before
    # tuner/__init__.py existed would otherwise give a namespace package without best_kernel).
    root = str(Path(tuner.apply.__file__).resolve().parents[1])
    path = os.pathsep.join([root] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    child_env = dict(os.environ, XDG_CACHE_HOME=str(kernel_cache_dir), PYTHONPATH=path)
    for name in ("NUMBA_SLP_VECTORIZE", "NUMBA_OPT", "NUMBA_CPU_FEATURES"):
        child_env.pop(name, None)
    # An application compiles it first (numba's disk cache is keyed by the code-generation settings,
    # so this test process, which may have imported numba before best_kernel, cannot stand in).
    first = subprocess.run([sys.executable, str(script), str(tuned_db), "fresh", DEVICE], env=child_env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    procs = {mode: subprocess.Popen([sys.executable, str(script), str(tuned_db), mode, DEVICE], env=child_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode in ("fresh", "numba-first")}
    results = {}
    for mode, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results[mode] = json.loads(out.strip().splitlines()[-1])
    fresh, late = results["fresh"], results["numba-first"]
    assert fresh["kind"] == late["kind"] == "tuned" and fresh["correct"] and late["correct"]
    # numba not yet imported: best_kernel set its environment before importing it.
    assert fresh["applied"] is True and fresh["env"] == ["1", "3"] and fresh["slp"] == 1
    # numba imported first: compiled anyway (correct), and says so.
    assert late["applied"] is False and late["env"] == ["1", "3"]
    # Loaded from the on-disk cache, not compiled again.
    assert fresh["cache_hits"] >= 1 and fresh["cache_misses"] == 0
    if not codegen_environment():
        assert late["cache_hits"] >= 1 and late["cache_misses"] == 0
    # else (AVX-512 host): numba imported first compiles with its own defaults, which the cache
    # keeps apart from the 512-bit code the workers made: correct, only slower, as documented.


def test_a_config_tuned_on_an_avx512_device_is_served_and_shown(env, cli_env):
    """Register tiles follow the measuring device's ISA: a config only an AVX-512 space holds is
    checked against the space of the device the log recorded for its key, not a generic one."""
    from measure_agent.device import DeviceInfo

    template = default_catalog().get("matmul", "cpu")
    wide = DeviceInfo("x86_64", "test", 2, ("avx2", "fma", "avx512f"))
    generic, avx512 = template.space(W), template.space(W, wide)
    config = next(c for c in avx512.sample(np.random.default_rng(0), 400) if not generic.is_valid(c))
    db = env / "avx512.db"
    with TuningLog(f"sqlite:///{db}") as log:
        log.upsert_device("x86_64-wide", wide.to_json())
        log.record_trials([_ok(W, config, 1e-5, device="x86_64-wide")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotTunedWarning)
        kernel = tuner.best_kernel(W, "x86_64-wide", db=db)
    assert kernel.kind == "tuned" and kernel.config == config.to_json()
    _check(kernel)
    shown = subprocess.run([sys.executable, "-m", "tuner", "show-kernel", "--workload", W.key, "--best",
                            "--db", str(db), "--device-key", "x86_64-wide"],
                           capture_output=True, text=True, env=cli_env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert template.render(W, config).text.strip() in shown.stdout
