"""CUDA templates: spaces and pruning, rendering, and correctness through numba's CUDA simulator.

numba reads ``NUMBA_ENABLE_CUDASIM`` once, when it is imported, and other tests import numba
without it. So simulated kernels never run in this process: a helper process started with
``NUMBA_ENABLE_CUDASIM=1`` (this file run as a script with ``--serve``) renders, launches and
checks them, one JSON request per line; engine tests set the variable for the engine's worker
processes only. Shapes stay tiny: the simulator runs every CUDA thread as a Python thread.

``TUNEFLEET_CUDA_PYTHON=/path/to/python`` (an interpreter with numba-cuda and NVVM, e.g. from
``pip install "numba-cuda[cu12]"``) also compiles kernels to PTX for sm_90 without a GPU and checks
that register tiles stay in registers; with ``ptxas`` and ``cuobjdump`` on the PATH, that the
defaults do not spill and that the GEMM defaults read shared memory in vectors. ``.ci/run``
makes such an interpreter where the machine has a CUDA toolkit (``.ci/cuda_check_env.sh``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from measure_agent.device import DeviceInfo
from measure_agent.engine import MeasureEngine, MeasureInput, MeasureStatus, TimingConfig
from measure_agent.templates import default_catalog
from measure_agent.templates.cuda import cuda_templates
from measure_agent.templates.cuda.common import GpuLimits
from measure_agent.workload import WorkloadError, make_workload, parse_workload

OPS = ("matmul", "dense", "batch_matmul", "conv2d_nchw", "conv2d_nhwc", "depthwise_conv2d_nchw",
       "depthwise_conv2d_nhwc")
CATALOG = default_catalog()

# One realistic workload per operator, for the space and rendering tests (no kernel runs).
REALISTIC = {
    "matmul": "matmul(M=1024,N=1024,K=1024)",
    "dense": "dense(M=1,N=1000,K=2048)",
    "batch_matmul": "batch_matmul(B=12,M=128,N=128,K=64)",
    "conv2d_nchw": "conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)",
    "conv2d_nhwc": "conv2d_nhwc(N=8,C=32,H=28,W=28,K=64,R=3,S=3,stride=2,pad=1)",
    "depthwise_conv2d_nchw": "depthwise_conv2d_nchw(N=1,C=32,H=112,W=112,R=3,S=3,pad=1)",
    "depthwise_conv2d_nhwc": "depthwise_conv2d_nhwc(N=4,C=96,H=56,W=56,R=3,S=3,stride=2,pad=1)",
}

# Tiny edge cases every run checks: remainders, stride 2, padding, dilation, batch > 1, multiplier.
EDGE_CASES = (
    "matmul(M=7,N=9,K=5)",
    "matmul(M=1,N=3,K=1,dtype=float64)",
    "dense(M=3,N=10,K=6)",
    "batch_matmul(B=3,M=5,N=6,K=7)",
    "conv2d_nchw(N=2,C=3,H=7,W=9,K=5,R=3,S=3,stride=2,pad=1)",
    "conv2d_nhwc(N=2,C=3,H=7,W=8,K=5,R=3,S=2,stride_h=2,stride_w=1,pad=1,dilation=2)",
    "depthwise_conv2d_nchw(N=2,C=3,H=7,W=9,R=3,S=3,stride=2,pad=1,multiplier=2)",
    "depthwise_conv2d_nhwc(N=2,C=3,H=7,W=6,R=3,S=2,stride=2,pad=2,dilation=2,multiplier=2,dtype=float64)",
)


def template(op):
    return CATALOG.get(op, "cuda")


def gpu(**extra) -> DeviceInfo:
    return DeviceInfo(arch="x86_64", cpu_model="test", cores=8, extra={k: str(v) for k, v in extra.items()})


# -- spaces, limits and rendering (no numba.cuda) ------------------------------------------------


def test_every_operator_has_a_cuda_template():
    assert sorted(t.op for t in cuda_templates()) == sorted(OPS)
    assert all(t.target == "cuda" for t in cuda_templates())
    for op in OPS:
        assert template(op).op == op


@pytest.mark.parametrize("op", OPS)
def test_default_config_is_valid_and_renders_a_launchable_module(op):
    workload = parse_workload(REALISTIC[op])
    space = template(op).space(workload)
    config = template(op).default_config(workload, space)
    assert space.is_valid(config)
    source = template(op).render(workload, config)
    assert source.entry == "run" and source.launch == "cuda" and source.runtime_args == ()
    text = source.text
    compile(text, "<kernel>", "exec")  # valid Python
    assert "@cuda.jit(cache=True" in text and "def run(" in text and "run.kernels = (kernel,)" in text
    assert "cuda.local.array((" in text  # the register tile, of literal size
    assert ("cuda.syncthreads()" in text) == config["shared"] and ("cuda.shared.array(" in text) == config["shared"]
    assert workload.key in text and config.json_text() in text


@pytest.mark.parametrize("op", OPS)
def test_knobs_show_in_the_source(op):
    """Shared staging and unrolling are visible in the rendered text, as the config says."""
    workload = parse_workload(REALISTIC[op])
    space = template(op).space(workload)
    unroll_knob = "unroll_k" if "unroll_k" in space.knob_names else "unroll"
    seen = set()
    for config in space.sample(np.random.default_rng(1), 150):
        text = template(op).render(workload, config).text
        assert ("cuda.syncthreads()" in text) == config["shared"]
        unrolled = config[unroll_knob] is True or config[unroll_knob] is not False and config[unroll_knob] > 1
        marker = "# k = k0 + kk + 1" if unroll_knob == "unroll_k" else "# s = 1"
        if config["shared"] or unroll_knob == "unroll":
            assert (marker in text) == unrolled
        seen.add((config["shared"], unrolled))
    assert len(seen) == 4  # both knobs take both settings


@pytest.mark.parametrize("op", OPS)
def test_configs_beyond_the_device_limits_are_pruned(op):
    workload = parse_workload(REALISTIC[op])
    tpl = template(op)
    small = gpu(gpu_name="Small", compute_capability="6.1", max_threads_per_block=128,
                max_shared_memory_per_block=8192, max_registers_per_block=16384)
    for device, threads, shared_bytes, registers in ((None, 1024, 48 * 1024, 65536), (small, 128, 8192, 16384)):
        space = tpl.space(workload, device)
        for config in space.sample(np.random.default_rng(0), 300):
            features = tpl.features(workload, config)
            assert features["threads"] <= threads
            assert features["shared_bytes"] <= shared_bytes
            assert features["threads"] * features["registers_estimate"] <= registers
    assert tpl.space(workload, small).size < tpl.space(workload, None).size


def test_limits_come_from_device_extra_with_conservative_defaults():
    assert GpuLimits.of(None) == GpuLimits(1024, 48 * 1024, 65536, None)
    h200 = gpu(gpu_name="NVIDIA H200", compute_capability="9.0", max_threads_per_block=1024,
               max_shared_memory_per_block=49152, max_registers_per_block=65536)
    assert GpuLimits.of(h200) == GpuLimits(1024, 49152, 65536, (9, 0))
    # over the wire the numbers may come as ints; static shared memory stays within 48 KiB
    wire = DeviceInfo.from_json({"arch": "x86_64", "compute_capability": "8.0", "max_shared_memory_per_block": 166912,
                                 "max_threads_per_block": 1024})
    assert GpuLimits.of(wire).max_shared_bytes == 48 * 1024
    # the compute capability fills in what the device did not report: 32 Ki registers on a Jetson Nano
    assert GpuLimits.of(gpu(compute_capability="5.3")).max_registers == 32768
    assert GpuLimits.of(gpu(compute_capability="8.7")).max_registers == 65536


def test_register_file_of_the_compute_capability_prunes_big_blocks():
    workload = parse_workload(REALISTIC["matmul"])
    nano = template("matmul").space(workload, gpu(compute_capability="5.3"))
    orin = template("matmul").space(workload, gpu(compute_capability="8.7"))
    assert nano.size < orin.size == template("matmul").space(workload).size


def test_blocks_have_a_warp_when_the_tiles_allow_it():
    workload = parse_workload(REALISTIC["conv2d_nchw"])
    tpl = template("conv2d_nchw")
    for config in tpl.space(workload).sample(np.random.default_rng(2), 200):
        assert tpl.features(workload, config)["threads"] >= 32
    tiny = parse_workload("matmul(M=1,N=2,K=3)")  # at most 2 threads: still a non-empty space
    assert template("matmul").space(tiny).size > 0


@pytest.mark.parametrize("op", OPS)
def test_features_are_finite_numbers_with_fixed_names(op):
    workload = parse_workload(REALISTIC[op])
    tpl = template(op)
    space = tpl.space(workload)
    names = None
    for config in space.sample(np.random.default_rng(3), 20):
        features = tpl.features(workload, config)
        assert all(isinstance(v, float) and math.isfinite(v) for v in features.values())
        assert names is None or set(features) == names
        names = set(features)


def test_space_is_deterministic_and_depends_on_the_device_only_through_its_gpu_facts():
    workload = parse_workload(REALISTIC["depthwise_conv2d_nchw"])
    tpl = template("depthwise_conv2d_nchw")
    a = tpl.space(workload, gpu(compute_capability="8.0", max_threads_per_block=1024))
    b = tpl.space(workload, DeviceInfo.from_json({"arch": "aarch64", "cpu_model": "other", "cores": 4,
                                                  "compute_capability": "8.0", "max_threads_per_block": 1024,
                                                  "agent_version": "x"}))
    assert a.size == b.size and list(a.iter_valid())[:50] == list(b.iter_valid())[:50]


# -- show-kernel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("target, expected", [("cuda", "@cuda.jit(cache=True"), ("cpu", "def matmul(A, B, out")])
def test_show_kernel_prints_the_source_for_both_targets(capsys, target, expected):
    from tuner.cli import main

    assert main(["show-kernel", "--workload", "matmul(M=64,N=48,K=32)", "--target", target, "--config", "default"]) == 0
    out = capsys.readouterr().out
    assert expected in out
    if target == "cuda":
        assert "cuda.syncthreads()" in out and "GRID = (" in out


def test_show_kernel_of_a_cuda_conv_config(capsys):
    from tuner.cli import main

    workload = parse_workload("depthwise_conv2d_nhwc(N=1,C=8,H=9,W=9,R=3,S=3,pad=1)")
    config = template(workload.op).space(workload).sample(np.random.default_rng(0), 1)[0]
    assert main(["show-kernel", "--workload", workload.key, "--target", "cuda", "--config", config.json_text()]) == 0
    assert config.json_text() in capsys.readouterr().out


# -- correctness through the simulator -----------------------------------------------------------


@pytest.fixture(scope="module")
def simulator():
    """A process that runs rendered kernels under NUMBA_ENABLE_CUDASIM=1 (this file with --serve)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=Path(__file__).resolve().parents[1])

    def run(workload, config) -> dict:
        proc.stdin.write(json.dumps({"workload": workload.key, "config": config.to_json()}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"simulator process died (exit {proc.poll()})"
        return json.loads(line)

    yield run
    proc.stdin.close()
    proc.wait(timeout=30)


def _check(simulator, workload, config):
    reply = simulator(workload, config)
    assert "error" not in reply, f"{workload.key} {config}: {reply.get('error')}"
    assert reply["correct"], f"{workload.key} {config}: max abs error {reply['max_abs_error']}"


@pytest.mark.parametrize("workload_text", EDGE_CASES)
def test_edge_cases_match_the_reference_in_the_simulator(simulator, workload_text):
    workload = parse_workload(workload_text)
    tpl = template(workload.op)
    space = tpl.space(workload)
    _check(simulator, workload, tpl.default_config(workload, space))
    # a config without shared staging and one with: both code paths on every edge case
    rng = np.random.default_rng(len(workload_text))
    for shared in (False, True):
        candidates = [c for c in space.sample(rng, 200) if c["shared"] == shared]
        if candidates:
            _check(simulator, workload, candidates[0])


def _workloads(op: str):
    size = st.integers(1, 12)
    dtype = st.sampled_from(["float32", "float32", "float64"])
    if op in ("matmul", "dense"):
        args = st.fixed_dictionaries({"M": st.integers(1, 6), "N": st.integers(1, 20), "K": st.integers(1, 20)})
    elif op == "batch_matmul":
        args = st.fixed_dictionaries({"B": st.integers(1, 3), "M": size, "N": size, "K": size})
    else:
        window = {"N": st.integers(1, 2), "C": st.integers(1, 4), "H": st.integers(2, 9), "W": st.integers(2, 9),
                  "R": st.integers(1, 3), "S": st.integers(1, 3), "stride_h": st.integers(1, 2),
                  "stride_w": st.integers(1, 2), "pad_h": st.integers(0, 2), "pad_w": st.integers(0, 2),
                  "dilation_h": st.integers(1, 2), "dilation_w": st.integers(1, 2)}
        if op.startswith("depthwise"):
            window["multiplier"] = st.integers(1, 2)
        else:
            window["K"] = st.integers(1, 5)
        args = st.fixed_dictionaries(window)
    return st.tuples(args, dtype)


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_random_shapes_and_configs_match_the_reference_in_the_simulator(simulator, op, data):
    args, dtype = data.draw(_workloads(op), label="sizes")
    try:
        workload = make_workload(op, {**args, "dtype": dtype})
    except WorkloadError:  # the window does not fit: no such workload
        return
    tpl = template(op)
    space = tpl.space(workload)
    seed = data.draw(st.integers(-1, 2**31), label="config seed (-1: default)")
    config = tpl.default_config(workload, space) if seed < 0 else space.sample(np.random.default_rng(seed), 1)[0]
    _check(simulator, workload, config)


def test_engine_measures_cuda_candidates_in_the_simulator(monkeypatch, tmp_path):
    """Build and run workers (separate processes) simulate; results carry the check's errors."""
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    matmul = parse_workload("matmul(M=6,N=10,K=4)")
    depthwise = parse_workload("depthwise_conv2d_nchw(N=2,C=2,H=5,W=6,R=3,S=3,stride=2,pad=1)")
    items = []
    for workload in (matmul, depthwise):
        space = template(workload.op).space(workload)
        items.append(MeasureInput(workload, template(workload.op).default_config(workload, space), "cuda"))
    items.append(MeasureInput(matmul, template("matmul").space(matmul).sample(np.random.default_rng(5), 1)[0], "cuda"))
    timing = TimingConfig(number=1, repeat=2, min_repeat_ms=0, warmup=1, run_timeout_s=120, build_timeout_s=120)
    with MeasureEngine(timing, build_workers=2, cache_dir=tmp_path) as engine:
        results = engine.measure(items)
    for item, result in zip(items, results):
        assert result.status is MeasureStatus.OK, (item, result.message)
        assert len(result.costs) == 2 and all(c > 0 for c in result.costs)
        assert result.details["max_abs_error"] < 1e-5 and "max_rel_error" in result.details


WORKER_FAULTS = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path
    from numba import cuda
    from measure_agent.engine.types import TimingConfig
    from measure_agent.engine.worker import Worker
    from measure_agent.templates import KernelSource, load_catalog
    from measure_agent.workload import parse_workload

    worker = Worker(load_catalog("default"), Path(tempfile.mkdtemp()))
    workload = parse_workload("matmul(M=3,N=4,K=2)")
    source = KernelSource(text="", entry="run", launch="cuda")
    timing = TimingConfig(repeat=1)

    @cuda.jit
    def half(a, b, out):  # writes only the first row: the rest stays NaN
        j = cuda.grid(1)
        if j < out.shape[1]:
            out[0, j] = a[0, 0] * b[0, j] + a[0, 1] * b[1, j]

    print(json.dumps(worker._run_cuda(workload, lambda a, b, out: half[1, 32](a, b, out), source, timing)), flush=True)

    def broken(a, b, out):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS (injected)")

    worker._run_cuda(workload, broken, source, timing)
    print("not reached")
    """
)


def test_cuda_worker_reports_wrong_answers_and_exits_after_a_failed_launch():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", WORKER_FAULTS], capture_output=True, text=True, env=env, timeout=300)
    from measure_agent.engine.worker import CUDA_FAILURE_EXIT_CODE

    assert proc.returncode == CUDA_FAILURE_EXIT_CODE, proc.stderr
    wrong = json.loads(proc.stdout.splitlines()[0])
    assert wrong["status"] == "wrong_answer" and wrong["details"]["max_abs_error"] == float("inf")
    assert "not reached" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == ("CUDA candidate failed, worker exits for a fresh CUDA context: "
                                                    "RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS (injected)")


class _FakeEvent:
    """Records what is done to it in a shared log; its clock reads the log's length in milliseconds."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.at = name, log, None

    def record(self, stream=0):
        self.log.append(f"{self.name}.record")
        self.at = len(self.log)

    def synchronize(self):
        self.log.append(f"{self.name}.synchronize")

    def elapsed_time(self, end):
        assert self.log[-1] == f"{end.name}.synchronize", "read before the end event completed"
        return float(end.at - self.at)


def test_cuda_launches_are_timed_between_two_events():
    from measure_agent.engine.worker import time_launches_with_events

    log: list[str] = []
    names = iter(("start", "end"))
    fake_cuda = type("FakeCuda", (), {"event": staticmethod(lambda: _FakeEvent(next(names), log))})
    seconds = time_launches_with_events(lambda: log.append("launch"), 3, fake_cuda)
    # launches queue between the two records, with no synchronisation until the end event
    assert log == ["start.record", "launch", "launch", "launch", "end.record", "end.synchronize"]
    assert seconds == pytest.approx(4 / 1000.0)  # 4 log steps apart, in milliseconds


EVENT_TIMING = textwrap.dedent(
    """
    import json, tempfile, warnings
    from pathlib import Path
    from numba import cuda
    import measure_agent.engine.worker as worker_module
    from measure_agent.engine.types import TimingConfig
    from measure_agent.engine.worker import Worker, time_launches_with_events
    from measure_agent.templates import KernelSource, load_catalog
    from measure_agent.workload import parse_workload

    @cuda.jit
    def add_one(x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1.0

    x = cuda.to_device([0.0] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Simulator timings are bogus": its events time nothing
        seconds = time_launches_with_events(lambda: add_one[1, 4](x), 3, cuda)
    print(json.dumps({"seconds": seconds, "launched": x.copy_to_host().tolist()}))

    @cuda.jit
    def matmul(a, b, out):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            acc = 0.0
            for k in range(a.shape[1]):
                acc += a[i, k] * b[k, j]
            out[i, j] = acc

    worker = Worker(load_catalog("default"), Path(tempfile.mkdtemp()))
    workload = parse_workload("matmul(M=3,N=4,K=2)")
    source = KernelSource(text="", entry="run", launch="cuda")
    timing = TimingConfig(number=1, repeat=2, min_repeat_ms=0)
    launch = lambda a, b, out: matmul[(1, 1), (4, 4)](a, b, out)
    simulated = worker._run_cuda(workload, launch, source, timing)
    worker_module.cuda_simulated = lambda: False  # as on a GPU: the worker times with events
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_gpu = worker._run_cuda(workload, launch, source, timing)
    print(json.dumps({"simulated": simulated, "events": on_gpu}))
    """
)


def test_cuda_worker_times_with_events_and_the_simulator_with_the_host_clock():
    """Under the simulator, events exist but time nothing (elapsed 0.0): the worker's event path
    runs there (costs of exactly 0), while its simulated path times on the host (costs above 0)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", EVENT_TIMING], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    direct, runs = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    assert direct == {"seconds": 0.0, "launched": [3.0] * 4}  # three launches between the events
    assert runs["simulated"]["status"] == runs["events"]["status"] == "ok"
    assert len(runs["simulated"]["costs"]) == 2 and all(c > 0 for c in runs["simulated"]["costs"])
    assert runs["events"]["costs"] == [0.0, 0.0]


def test_cuda_candidates_fail_cleanly_without_a_gpu(tmp_path):
    """No GPU and no simulator: a compile error naming the problem, and the engine carries on."""
    workload = parse_workload("matmul(M=4,N=4,K=4)")
    space = template("matmul").space(workload)
    item = MeasureInput(workload, template("matmul").default_config(workload, space), "cuda")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = textwrap.dedent(
        """
        import sys, tempfile
        from measure_agent.engine import MeasureEngine, MeasureInput, TimingConfig
        from measure_agent.workload import parse_workload
        import json
        workload, config = parse_workload(sys.argv[1]), json.loads(sys.argv[2])
        from measure_agent.templates import default_catalog
        space = default_catalog().get("matmul", "cuda").space(workload)
        with MeasureEngine(TimingConfig(repeat=1), cache_dir=tempfile.mkdtemp()) as engine:
            [r] = engine.measure([MeasureInput(workload, space.from_json(config), "cuda")])
        print(r.status.value, r.message)
        """
    )
    from measure_agent.device import detect_gpu

    if detect_gpu():
        pytest.skip("this host has a CUDA GPU")
    proc = subprocess.run([sys.executable, "-c", code, workload.key, item.config.json_text()], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("compile_error") and "no usable CUDA GPU" in proc.stdout


# -- optional: real compilation to PTX ----------------------------------------------------------

PTX_CHECK = textwrap.dedent(
    """
    import json, os, re, shutil, subprocess, sys, types
    import numpy as np
    from numba import cuda, typeof
    import numba.cuda.dispatcher as dispatcher
    # compile device functions for sm_90 without a GPU (numba asks the current device otherwise)
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from measure_agent.engine.build import load_kernel
    from measure_agent.templates import default_catalog
    from measure_agent.workload import parse_workload
    catalog = default_catalog()
    ptxas, cuobjdump = shutil.which("ptxas"), shutil.which("cuobjdump")
    for n, (key, config) in enumerate(json.loads(sys.argv[1])):
        workload = parse_workload(key)
        tpl = catalog.get(workload.op, "cuda")
        source = tpl.render(workload, tpl.space(workload).from_json(config))
        kernel = load_kernel(source, sys.argv[2]).kernels[0]
        sig = tuple(typeof(np.zeros((1,) * len(s), workload.dtype)) for s in workload.spec.array_shapes(workload.params))
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        row = {"key": key, "config": config, "local": ptx.count("ld.local") + ptx.count("st.local")}
        if ptxas:  # what the GPU runs: spills and 128-bit shared-memory loads in the SASS
            stem = os.path.join(sys.argv[2], f"k{n}")
            with open(stem + ".ptx", "w") as f:
                f.write(ptx)
            info = subprocess.run([ptxas, "-arch=sm_90", "-v", stem + ".ptx", "-o", stem + ".cubin"],
                                  capture_output=True, text=True, check=True).stderr
            row["spill_bytes"] = sum(int(b) for b in re.findall(r"(\\d+) bytes spill", info))
            if cuobjdump:
                dump = subprocess.run([cuobjdump, "-sass", stem + ".cubin"], capture_output=True, text=True)
                if dump.returncode:  # cuobjdump needs nvdisasm beside it
                    sys.exit("cuobjdump failed: " + dump.stderr[-500:])
                row["lds_vector"] = dump.stdout.count("LDS.128") + dump.stdout.count("LDS.64")
        print(json.dumps(row), flush=True)
    """
)


@pytest.mark.skipif(not os.environ.get("TUNEFLEET_CUDA_PYTHON"), reason="set TUNEFLEET_CUDA_PYTHON to a python "
                    "with numba-cuda and NVVM to compile kernels to PTX (.ci/run makes one where a CUDA toolkit is)")
def test_kernels_compile_to_ptx_with_register_tiles_in_registers(tmp_path):
    """Every default config and a few random ones compile for sm_90 with their register tiles in
    registers; where ptxas is on the PATH, the defaults spill nothing, and where cuobjdump is too,
    the GEMM defaults read their staged operands with vector loads (the point of their layout)."""
    cases, defaults = [], set()
    for op in OPS:
        workload = parse_workload(REALISTIC[op])
        space = template(op).space(workload)
        default = template(op).default_config(workload, space)
        defaults.add((workload.key, default.json_text()))
        configs = [default] + space.sample(np.random.default_rng(0), 2)
        cases += [(workload.key, c.to_json()) for c in configs]
    proc = subprocess.run([os.environ["TUNEFLEET_CUDA_PYTHON"], "-c", PTX_CHECK, json.dumps(cases), str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[1],
                          env={k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == len(cases)
    assert all(row["local"] == 0 for row in rows), rows
    checked = 0
    for row in rows:
        if (row["key"], json.dumps(row["config"], sort_keys=True, separators=(",", ":"))) not in defaults:
            continue
        if "spill_bytes" in row:
            assert row["spill_bytes"] == 0, row
        gemm = parse_workload(row["key"]).op in ("matmul", "batch_matmul", "conv2d_nchw", "conv2d_nhwc")
        if gemm and row["config"]["shared"] and "lds_vector" in row and min(
                row["config"]["tile_m"][2], row["config"]["tile_n"][2]) >= 2:
            assert row["lds_vector"] > 0, row
            checked += 1
    assert checked or not shutil.which("cuobjdump") or not shutil.which("ptxas")


# -- the simulator process -----------------------------------------------------------------------


def _serve() -> None:
    """Answer {"workload", "config"} lines with the check of the rendered kernel, simulated."""
    import tempfile
    import traceback

    from numba import cuda

    from measure_agent.engine.build import load_kernel
    from measure_agent.engine.checking import check_output, make_problem

    assert cuda.is_available() and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    reply_stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # kernels' prints must not break the protocol
    cache = Path(tempfile.mkdtemp(prefix="tunefleet-sim-"))
    for line in sys.stdin:
        try:
            request = json.loads(line)
            workload = parse_workload(request["workload"])
            tpl = CATALOG.get(workload.op, "cuda")
            config = tpl.space(workload).from_json(request["config"])
            run = load_kernel(tpl.render(workload, config), cache)
            problem = make_problem(workload)
            inputs = [cuda.to_device(x) for x in problem.inputs]
            out = cuda.to_device(np.full(problem.expected.shape, np.nan, dtype=workload.dtype))
            run(*inputs, out)
            cuda.synchronize()
            check = check_output(problem, out.copy_to_host())
            reply = {"correct": check.correct, "max_abs_error": check.max_abs_error,
                     "max_rel_error": check.max_rel_error}
        except Exception:  # noqa: BLE001 - reported to the test
            reply = {"error": traceback.format_exc()[-3000:]}
        reply_stream.write(json.dumps(reply) + "\n")


if __name__ == "__main__" and "--serve" in sys.argv:
    _serve()
