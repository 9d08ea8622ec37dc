"""tunefleet's tuned kernels beside what users would pick instead, on this CPU, in one run (issue 26).

Contestants, per workload:

- ``tunefleet@T``: ``tuner tune --workload W --trials T --parallel 2 --no-transfer --seed 0`` into a
  fresh SQLite log and a fresh kernel cache (no compile of an earlier run is reused), then
  ``tuner.best_kernel(W, db=...)`` re-measured. The larger trial counts resume the same log, as
  re-running ``tuner tune`` does (the 64-trial log is copied aside first, so ``tunefleet@64`` is what
  64 trials gave): the tuning wall time printed for 200 is the sum of both runs. From the log's
  per-trial timestamps and times, the trial and the wall time at which the tuner's own measurement
  first reached each peer's re-measured GFLOPS (its best sample).
- ``tvm@T``: Apache TVM MetaSchedule (``tune_tir``, ``max_trials_global=T``, 64 per iteration, the
  llvm target with this CPU's ``-mcpu``), tuned from scratch for every T in TVM's own venv
  (``--tvm-python``), then the best schedule compiled from its database and re-measured. Two
  workarounds for the 0.27.0.post1 wheel are applied (from shared/peers/tvm_baseline.py): pin
  apache-tvm-ffi 0.1.14.post1, and load only the x86 tensor intrinsics (the full set takes longer
  to import than the builder's timeout).
- ``torch``: PyTorch CPU (``torch.matmul``, ``F.linear``, ``F.conv2d``; NHWC layers as channels-last
  views, as bench/ops_cpu.py does).
- ``onnxruntime``: a one-node ONNX graph (MatMul with both operands as inputs; Gemm/Conv with the
  weights as initializers, so ORT may prepack them); CPU provider, intra-op threads 2. ORT's Conv
  is NCHW only: NHWC layers are "n/a".
- ``openblas``: numpy's ``A @ B`` (``X @ W.T`` for dense); matmul and dense only.

Timing: every contestant is timed in its own process (so one's thread pool never spins beside
another's), one process after another, never two at once, with 2 threads each (NUMBA_NUM_THREADS,
OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, TVM_NUM_THREADS = 2, torch.set_num_threads(2),
ORT intra_op_num_threads=2). In the process: the kernel is called ``--warmup`` times (default 5),
then ``--repeats`` samples (default 15) are taken, each the mean of back-to-back calls lasting at
least ``--min-ms`` (20 ms; the number of calls is fixed once from the warm-up). The measuring
processes run in ``--rounds`` rounds (default 2), every contestant once per round, the order reversed
every other round, after all tuning of the workload is done, so the contestants are measured close
together under the same machine load. Printed: GFLOPS of the best sample over all rounds and of the
median sample. Ratios are only meaningful within one run: the machine is shared. On Linux each
sample also reads how long the process's threads waited for a CPU (as the run worker does,
``measure_agent/engine/cpu_wait.py``); a contestant some of whose samples other work slowed (its
threads waiting more than 5% of a sample) says how many.

Peers that are not installed are reported as ``not installed`` with the command that installs them;
a peer that fails prints one line (its stderr is kept in the run directory, ``--keep``).

    python bench/peers_kernels.py                                  # everything, 64 and 200 trials
    python bench/peers_kernels.py --trials 64 --workloads matmul_512 r50_conv3x3_64 mv2_dw_32 --json out.json
    python bench/peers_kernels.py --quick                          # smoke: small shapes, 4 trials
    python bench/peers_kernels.py --peers torch onnxruntime openblas --no-tune

Workload names: ``matmul_512``, ``matmul_1024`` and the layers of bench/ops_cpu.py (read from its
``LAYERS`` table); a full workload key such as ``conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)``
works too.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

# Only the standard library at module level: the TVM worker runs this file in TVM's own venv.
ROOT = Path(__file__).resolve().parents[1]
THREADS = 2
DISTURBED_WAIT_SHARE = 0.05  # as the run worker judges a repeat (measure_agent/engine/cpu_wait.py)
PEERS = ("tunefleet", "tvm", "torch", "onnxruntime", "openblas")
MATMULS = {"matmul_512": "matmul(M=512,N=512,K=512)", "matmul_1024": "matmul(M=1024,N=1024,K=1024)"}
QUICK = {"matmul_128": "matmul(M=128,N=128,K=128)",
         "conv_small": "conv2d_nchw(N=1,C=16,H=14,W=14,K=16,R=3,S=3,pad=1)"}
DEFAULT_WORKLOADS = ["matmul_512", "matmul_1024", "r50_conv1x1_256_64", "r50_conv3x3_64", "r50_conv3x3_256",
                     "mv2_dw_32", "mv2_dw_144_s2"]
TVM_VENV = Path(os.environ.get("TVM_VENV") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "tvm_peer_venv")
# What works with the 0.27.0.post1 wheel (see shared/peers/tvm_baseline.sh): pip's default
# apache-tvm-ffi 0.1.15.post2 segfaults when MetaSchedule's TuneContext is created.
TVM_PACKAGES = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "numpy", "ml_dtypes", "xgboost",
                "scipy", "psutil", "cloudpickle", "tornado", "typing_extensions")
INSTALL = {
    "torch": "pip install torch==2.13.0",
    "onnxruntime": "pip install onnxruntime onnx",
    "tvm": f"python3.11 -m venv {TVM_VENV} && {TVM_VENV}/bin/pip install " + " ".join(TVM_PACKAGES),
    "tunefleet": "pip install -e '.[server]'",
    "openblas": "pip install numpy",
}


def layer_table() -> dict[str, str]:
    """name -> workload key: the matmuls and bench/ops_cpu.py's LAYERS (read, not imported: importing
    it sets numba's environment for this process)."""
    table = dict(MATMULS)
    tree = ast.parse((ROOT / "bench" / "ops_cpu.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in node.targets):
            table.update({name: value[0] for name, value in ast.literal_eval(node.value).items()})
    return table


# -- the measuring workers (run as `peers_kernels.py --worker ROLE SPEC_JSON`) ---------------------


def time_call(call, timing: dict) -> dict:
    """``samples``: seconds per call, ``repeats`` samples, each the mean of back-to-back calls lasting
    >= min_ms; ``wait_shares``: per sample, the share of it this process's threads waited for a CPU
    (Linux; another process took the cores), as the run worker reads it (empty elsewhere)."""
    clock = _cpu_wait_clock()
    for _ in range(timing["warmup"]):
        call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(timing["min_ms"] / 1e3 / once + 0.999))
    samples, shares = [], []
    for _ in range(timing["repeats"]):
        waited = clock() if clock else 0.0
        start = time.perf_counter()
        for _ in range(number):
            call()
        elapsed = time.perf_counter() - start
        samples.append(elapsed / number)
        if clock:
            shares.append(max(0.0, clock() - waited) / elapsed)
    return {"samples": samples, "wait_shares": shares}


def _cpu_wait_clock():
    """measure_agent's wait clock, loaded from its file: this script also runs in TVM's venv, where
    the package (and numba, which it imports) is not installed; the module needs only the stdlib."""
    spec = importlib.util.spec_from_file_location("tunefleet_cpu_wait", ROOT / "measure_agent" / "engine" / "cpu_wait.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cpu_wait_clock()


def _inputs(spec: dict):
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.random(shape, dtype=np.float32) for shape in spec["input_shapes"]]


def _aligned(tuner, array):
    copy = tuner.empty_aligned(array.shape, array.dtype)
    copy[...] = array
    return copy


def _conv_kwargs(p: dict) -> dict:
    return dict(stride=(p["stride_h"], p["stride_w"]), padding=(p["pad_h"], p["pad_w"]),
                dilation=(p["dilation_h"], p["dilation_w"]))


def worker_tunefleet(spec: dict) -> dict:
    import numpy as np

    import tuner  # before numba: best_kernel applies the engine's runtime settings

    kernel = tuner.best_kernel(spec["workload"], db=spec["db"])
    # 64-byte aligned, as the agents timed them (docs/applying.md: aligned arrays)
    inputs = [_aligned(tuner, x) for x in _inputs(spec)]
    out = tuner.empty_aligned(spec["output_shape"], np.float32)
    return {**time_call(lambda: kernel(*inputs, out=out), spec["timing"]), "kind": kernel.kind,
            "config": kernel.config}


def worker_openblas(spec: dict) -> dict:
    import numpy as np

    a, b = _inputs(spec)
    if spec["op"] == "dense":
        out = np.empty(spec["output_shape"], np.float32)
        call = lambda: np.matmul(a, b.T, out=out)  # noqa: E731
    else:
        out = np.empty(spec["output_shape"], np.float32)
        call = lambda: np.matmul(a, b, out=out)  # noqa: E731
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        version = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001
        version = "?"
    return {**time_call(call, spec["timing"]), "version": f"numpy {np.__version__}, {version}"}


def worker_torch(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(THREADS)
    x, w = (torch.from_numpy(a) for a in _inputs(spec))
    op, p = spec["op"], spec["params"]
    if op == "matmul":
        out = torch.empty(spec["output_shape"])
        call = lambda: torch.matmul(x, w, out=out)  # noqa: E731
    elif op == "dense":
        call = lambda: F.linear(x, w)  # noqa: E731
    else:
        nhwc = op.endswith("nhwc")
        tx = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last) if nhwc else x
        if op.startswith("conv2d"):
            tw = w.permute(3, 2, 0, 1).contiguous() if nhwc else w
            groups = 1
        else:  # depthwise: NCHW weights [C, M, R, S], NHWC [R, S, C, M]
            c, m = p["C"], p["multiplier"]
            tw = (w.permute(2, 3, 0, 1) if nhwc else w).reshape(c * m, 1, p["R"], p["S"]).contiguous()
            groups = c
        kwargs = _conv_kwargs(p)
        call = lambda: F.conv2d(tx, tw, groups=groups, **kwargs)  # noqa: E731
    with torch.inference_mode():
        timed = time_call(call, spec["timing"])
    return {**timed, "version": f"torch {torch.__version__}"}


def worker_onnxruntime(spec: dict) -> dict:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    op, p = spec["op"], spec["params"]
    x, w = _inputs(spec)
    value = helper.make_tensor_value_info
    feeds = {"x": x}
    if op == "matmul":
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        graph_inputs = [value("x", TensorProto.FLOAT, list(x.shape)), value("w", TensorProto.FLOAT, list(w.shape))]
        initializers = []
        feeds["w"] = w
    else:
        graph_inputs = [value("x", TensorProto.FLOAT, list(x.shape))]
        if op == "dense":
            node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
            initializers = [numpy_helper.from_array(w, "w")]
        else:
            if op.endswith("nhwc"):
                raise NotApplicable("ORT's Conv is NCHW only")
            group = 1 if op.startswith("conv2d") else p["C"]
            if op.startswith("depthwise"):
                w = w.reshape(p["C"] * p["multiplier"], 1, p["R"], p["S"])
            node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[p["pad_h"], p["pad_w"]] * 2,
                                    strides=[p["stride_h"], p["stride_w"]],
                                    dilations=[p["dilation_h"], p["dilation_w"]], group=group)
            initializers = [numpy_helper.from_array(np.ascontiguousarray(w), "w")]
    graph = helper.make_graph([node], "g", graph_inputs, [value("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return {**time_call(lambda: session.run(None, feeds), spec["timing"]),
            "version": f"onnxruntime {ort.__version__}"}


class NotApplicable(Exception):
    """This peer has no implementation of the operator (reported as n/a, not as a failure)."""


def _tvm_fast_tensor_intrin():
    """Make ``import tvm.s_tir.tensor_intrin`` register only the x86 intrinsics (the full package
    parses hundreds of GPU/ARM intrinsics, longer than LocalBuilder's 30 s timeout, in every builder
    worker: every candidate then fails). From shared/peers/tvm_baseline.py."""
    import importlib
    import types

    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    import tvm.s_tir  # noqa: F401

    spec = importlib.util.find_spec(name)
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__package__ = name
    package.__file__ = spec.origin
    package.__spec__ = spec
    sys.modules[name] = package
    sys.modules["tvm.s_tir"].tensor_intrin = package
    importlib.import_module(name + ".x86")


def _tvm_prim_func(spec: dict):
    from tvm import te, topi

    op, p = spec["op"], spec["params"]
    x = te.placeholder(spec["input_shapes"][0], name="x", dtype="float32")
    w = te.placeholder(spec["input_shapes"][1], name="w", dtype="float32")
    if op == "matmul":
        k = te.reduce_axis((0, p["K"]), name="k")
        y = te.compute((p["M"], p["N"]), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="y")
    elif op == "dense":
        k = te.reduce_axis((0, p["K"]), name="k")
        y = te.compute((p["M"], p["N"]), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="y")
    else:
        stride, padding, dilation = ((p["stride_h"], p["stride_w"]), (p["pad_h"], p["pad_w"]),
                                     (p["dilation_h"], p["dilation_w"]))
        function = {"conv2d_nchw": topi.nn.conv2d_nchw, "conv2d_nhwc": topi.nn.conv2d_nhwc,
                    "depthwise_conv2d_nchw": topi.nn.depthwise_conv2d_nchw,
                    "depthwise_conv2d_nhwc": topi.nn.depthwise_conv2d_nhwc}.get(op)
        if function is None:
            raise NotApplicable(f"no TVM compute for {op}")
        y = function(x, w, stride, padding, dilation, out_dtype="float32")
    if [int(d) for d in y.shape] != list(spec["output_shape"]):
        raise RuntimeError(f"TVM's output shape {y.shape} is not {spec['output_shape']}")
    return te.create_prim_func([x, w, y])


def _tvm_setup(spec: dict):
    import tvm
    import tvm.s_tir.meta_schedule as ms

    _tvm_fast_tensor_intrin()
    func = _tvm_prim_func(spec)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    target = tvm.target.Target({"kind": "llvm", "mcpu": spec["mcpu"], "num-cores": THREADS})
    return tvm, ms, mod, target


def worker_tvm_tune(spec: dict) -> dict:
    tvm, ms, mod, target = _tvm_setup(spec)
    workdir = spec["workdir"]
    start = time.monotonic()
    database = ms.tune_tir(mod=mod, target=target, work_dir=workdir, max_trials_global=spec["trials"],
                           num_trials_per_iter=64, builder=ms.builder.LocalBuilder(initializer=_tvm_fast_tensor_intrin),
                           runner=ms.runner.LocalRunner(), seed=0, num_tuning_cores=THREADS)
    tune_s = time.monotonic() - start
    records = database.get_all_tuning_records()
    valid = [r for r in records if r.run_secs and all(float(s) < 1e9 for s in r.run_secs)]
    best = min((sum(float(s) for s in r.run_secs) / len(r.run_secs) for r in valid), default=None)
    return {"tune_s": tune_s, "records": len(records), "valid": len(valid), "ms_best_s": best,
            "version": f"tvm {tvm.__version__}"}


def worker_tvm(spec: dict) -> dict:
    import numpy as np

    tvm, ms, mod, target = _tvm_setup(spec)
    database = ms.database.JSONDatabase(work_dir=spec["workdir"], allow_missing=False)
    schedule = ms.tir_integration.compile_tir(database, mod, target)
    if schedule is None:
        raise RuntimeError("MetaSchedule found no valid schedule")
    device = tvm.cpu()

    def run(module):
        executable = tvm.compile(module, target=target)
        runtime = executable.jit() if hasattr(executable, "jit") else executable
        arrays = [tvm.runtime.tensor(a, device) for a in _inputs(spec)]
        arrays.append(tvm.runtime.tensor(np.zeros(spec["output_shape"], np.float32), device))
        function = runtime["main"]
        function(*arrays)
        return function, arrays

    function, arrays = run(schedule.mod)
    _, reference = run(mod)  # the untuned schedule: what the tuned one must compute
    np.testing.assert_allclose(arrays[-1].numpy(), reference[-1].numpy(), rtol=1e-3, atol=1e-3)
    return {**time_call(lambda: function(*arrays), spec["timing"]), "version": f"tvm {tvm.__version__}"}


WORKERS = {"tunefleet": worker_tunefleet, "openblas": worker_openblas, "torch": worker_torch,
           "onnxruntime": worker_onnxruntime, "tvm": worker_tvm, "tvm_tune": worker_tvm_tune}


def worker_main(role: str, spec_json: str) -> int:
    spec = json.loads(spec_json)
    try:
        result = WORKERS[role](spec)
    except NotApplicable as exc:
        result = {"na": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one line for the table; the traceback goes to stderr
        import traceback

        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# -- the driver --------------------------------------------------------------------------------


def thread_environment() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
        env[name] = str(THREADS)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class Runner:
    """Starts the worker processes, one at a time; their stdout/stderr go to the run directory."""

    def __init__(self, run_dir: Path, tvm_python: str | None, verbose: bool) -> None:
        self.run_dir = run_dir
        self.tvm_python = tvm_python
        self.verbose = verbose
        self.count = 0

    def worker(self, role: str, spec: dict, timeout: float, env: dict | None = None) -> dict:
        python = self.tvm_python if role.startswith("tvm") else sys.executable
        self.count += 1
        log = self.run_dir / f"{self.count:03d}-{role}.log"
        env = thread_environment() if env is None else env
        if role.startswith("tvm"):  # TVM's venv must not see this checkout's site packages
            env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        try:
            with open(log, "w") as handle:
                done = subprocess.run([python, str(Path(__file__).resolve()), "--worker", role, json.dumps(spec)],
                                      stdout=subprocess.PIPE, stderr=handle, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s (log: {log})"}
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        with open(log, "a") as handle:
            handle.write(done.stdout)
        if not lines:
            return {"error": f"exit status {done.returncode}, no result (log: {log})"}
        result = json.loads(lines[-1][len("RESULT "):])
        if "error" in result:
            result["error"] += f" (log: {log})"
        return result


def detect_mcpu() -> str:
    """The LLVM CPU name TVM should generate code for (the wrong one halves its speed)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "x86-64"
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    amd = "AuthenticAMD" in text
    if "amx_tile" in flags:
        return "sapphirerapids"
    if "avx512f" in flags:
        return "znver4" if amd else "skylake-avx512"
    if "avx2" in flags:
        return "znver3" if amd else "haswell"
    return "x86-64"


def available(peers: list[str], tvm_python: str | None) -> dict[str, str | None]:
    """peer -> None when it can run here, else why not (with the install command)."""
    why: dict[str, str | None] = {}
    for peer in peers:
        if peer == "tunefleet":
            missing = [m for m in ("numba", "xgboost", "sqlalchemy") if importlib.util.find_spec(m) is None]
        elif peer == "torch":
            missing = [m for m in ("torch",) if importlib.util.find_spec(m) is None]
        elif peer == "onnxruntime":
            missing = [m for m in ("onnxruntime", "onnx") if importlib.util.find_spec(m) is None]
        elif peer == "openblas":
            missing = [m for m in ("numpy",) if importlib.util.find_spec(m) is None]
        else:
            missing = []
            if not tvm_python or not Path(tvm_python).exists():
                missing = [f"TVM's venv ({tvm_python or TVM_VENV / 'bin/python'})"]
            else:
                probe = subprocess.run([tvm_python, "-c", "import tvm.s_tir.meta_schedule"], capture_output=True,
                                       text=True, timeout=300)
                if probe.returncode != 0:
                    missing = [f"tvm in {tvm_python} ({(probe.stderr.strip().splitlines() or ['?'])[-1][:120]})"]
        why[peer] = f"not installed ({', '.join(missing)}): {INSTALL[peer]}" if missing else None
    return why


def tune_tunefleet(workload: str, trials: int, db: Path, env: dict, run_dir: Path) -> tuple[float, datetime, str]:
    """``tuner tune`` up to ``trials`` in ``db``: (wall seconds, start time, error or "")."""
    command = [sys.executable, "-m", "tuner", "tune", "--workload", workload, "--trials", str(trials),
               "--db", f"sqlite:///{db}", "--parallel", str(THREADS), "--no-transfer", "--seed", "0"]
    log = run_dir / f"tune-{db.stem}-{trials}.log"
    started = datetime.now(timezone.utc)
    start = time.monotonic()
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=run_dir)
    wall = time.monotonic() - start
    return wall, started, "" if done.returncode == 0 else f"tuner tune exited {done.returncode} (log: {log})"


def trial_curve(db: Path, workload: str, flops: float) -> list[tuple[datetime, float | None]]:
    """(recorded at, GFLOPS or None for a failed trial) of every trial in ``db``, in order."""
    from measure_agent.workload import parse_workload
    from tuner.log import TuningLog

    key = parse_workload(workload).key
    with TuningLog(f"sqlite:///{db}", create=False) as log:
        return [(t.created_at, flops / t.mean_s / 1e9 if t.is_ok and t.mean_s else None)
                for t in log.trials(workload_key=key)]


def reached(curve, runs: list[tuple[datetime, float]], target: float) -> tuple[int, float] | None:
    """(trial number, tuning seconds) at which the tuner's own measurement first reached ``target``
    GFLOPS. ``runs``: (start, wall) of each ``tuner tune`` run that filled the log, in order."""
    for index, (moment, gflops) in enumerate(curve, 1):
        if gflops is not None and gflops >= target:
            before = 0.0
            for started, wall in runs:
                elapsed = (moment - started).total_seconds()
                if elapsed <= wall + 1:
                    return index, before + max(elapsed, 0.0)
                before += wall
            return index, before
    return None


def measure_round_robin(runner: Runner, contestants: dict[str, tuple[str, dict, dict | None]], rounds: int) -> dict[str, dict]:
    """Every contestant's measuring process once per round, the order reversed every other round."""
    results: dict[str, dict] = {name: {"samples": [], "wait_shares": []} for name in contestants}
    names = list(contestants)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else reversed(names):
            if "error" in results[name] or "na" in results[name]:
                continue
            role, spec, env = contestants[name]
            result = runner.worker(role, spec, timeout=900, env=env)
            if "samples" not in result:
                results[name] = result
                continue
            samples = results[name]["samples"] + result.pop("samples")
            shares = results[name].get("wait_shares", []) + result.pop("wait_shares", [])
            results[name].update(result, samples=samples, wait_shares=shares)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1], argv[2])
    table = layer_table()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", metavar="NAME", help=f"default: {' '.join(DEFAULT_WORKLOADS)}; "
                        f"names: {', '.join(table)}, or workload keys")
    parser.add_argument("--trials", nargs="+", type=int, default=[64, 200], help="trial budgets (default 64 200)")
    parser.add_argument("--tvm-trials", nargs="+", type=int,
                        help="TVM's trial budgets when they differ from --trials (time to TVM@200's quality "
                        "needs tunefleet only up to TVM's tuning time: --trials 64 --tvm-trials 200)")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS), help="default: all")
    parser.add_argument("--no-tune", action="store_true", help="only the untuned peers (torch, onnxruntime, openblas)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: small shapes (matmul 128, a 16-channel conv), 4 trials, 1 round, 5 repeats")
    parser.add_argument("--rounds", type=int, default=2, help="measuring rounds (default 2)")
    parser.add_argument("--repeats", type=int, default=15, help="timed samples per measuring process (default 15)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    parser.add_argument("--min-ms", type=float, default=20.0, help="each sample lasts at least this long (default 20)")
    parser.add_argument("--tvm-python", default=None, help=f"TVM's venv python (default {TVM_VENV}/bin/python)")
    parser.add_argument("--tvm-mcpu", default=None, help=f"LLVM -mcpu for TVM (default from /proc/cpuinfo: "
                        f"{detect_mcpu()})")
    parser.add_argument("--json", metavar="FILE", help="also write every result as JSON")
    parser.add_argument("--keep", metavar="DIR", help="keep logs, tuning logs and TVM work dirs in DIR")
    args = parser.parse_args(argv)
    if args.quick:
        args.workloads = args.workloads or list(QUICK)
        args.trials = [4] if args.trials == [64, 200] else args.trials
        args.rounds, args.repeats = 1, 5
        table.update(QUICK)
    if any(t < 1 for t in args.trials + (args.tvm_trials or [])) or args.rounds < 1 or args.repeats < 1 or args.warmup < 0 or args.min_ms < 0:
        parser.error("--trials, --rounds and --repeats must be >= 1, --warmup and --min-ms >= 0")
    trials = sorted(set(args.trials))
    tvm_trials = sorted(set(args.tvm_trials or trials))
    names = args.workloads or DEFAULT_WORKLOADS
    sys.path.insert(0, str(ROOT))
    from measure_agent.workload import parse_workload

    workloads = {}
    for name in names:
        try:
            workloads[name] = parse_workload(table.get(name, name))
        except ValueError as exc:
            parser.error(f"--workloads: {name!r} is neither a known name ({', '.join(table)}) nor a workload "
                         f"key ({exc})")
    tvm_python = args.tvm_python or str(TVM_VENV / "bin" / "python")
    mcpu = args.tvm_mcpu or detect_mcpu()
    peers = [p for p in args.peers if not (args.no_tune and p in ("tunefleet", "tvm"))]
    missing = available(peers, tvm_python)
    timing = {"warmup": args.warmup, "repeats": args.repeats, "min_ms": args.min_ms}
    print(f"peers_kernels: {THREADS} threads each, own process each, {args.rounds} round(s) x {args.repeats} samples "
          f"(each >= {args.min_ms:g} ms) after {args.warmup} warm-up calls; trials {trials}"
          f"{f' (TVM {tvm_trials})' if tvm_trials != trials else ''}; TVM -mcpu={mcpu}; "
          f"load average {_load()}", flush=True)
    for peer in peers:
        if missing[peer]:
            print(f"  {peer}: {missing[peer]}", flush=True)

    run_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="peers_kernels-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner(run_dir, tvm_python, verbose=False)
    report = {"threads": THREADS, "timing": timing, "rounds": args.rounds, "trials": trials, "tvm_trials": tvm_trials,
              "mcpu": mcpu,
              "missing": {p: m for p, m in missing.items() if m}, "workloads": []}
    try:
        for name, workload in workloads.items():
            report["workloads"].append(run_workload(name, workload, trials, peers, missing, timing, args.rounds,
                                                    mcpu, runner, run_dir, tvm_trials))
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    print_summary(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


def run_workload(name, workload, trials, peers, missing, timing, rounds, mcpu, runner: Runner, run_dir: Path,
                 tvm_trials: list[int] | None = None) -> dict:
    flops = float(workload.flops)
    base = {"workload": workload.key, "op": workload.op, "params": workload.params, "flops": flops,
            "input_shapes": [list(s) for s in workload.spec.input_shapes(workload.params)],
            "output_shape": list(workload.spec.output_shape(workload.params)), "timing": timing}
    print(f"\n== {name}: {workload.key}, {flops / 1e9:.3f} GFLOP, load average {_load()}", flush=True)
    row = {"name": name, "workload": workload.key, "flops": flops, "contestants": {}}
    contestants: dict[str, tuple[str, dict, dict | None]] = {}
    info: dict[str, dict] = {}
    slug = "".join(c if c.isalnum() else "_" for c in name)[:40]

    if "tunefleet" in peers and not missing["tunefleet"]:
        env = thread_environment()
        home = run_dir / f"tunefleet-{slug}"
        home.mkdir(exist_ok=True)
        # a fresh kernel cache and no config file: no compile of an earlier run, no configured fleet
        env.update(XDG_CACHE_HOME=str(home / "cache"), XDG_CONFIG_HOME=str(home / "config"))
        for var in ("TUNEFLEET_DB", "TUNEFLEET_TRACKER"):
            env.pop(var, None)
        db = home / "log.db"
        runs: list[tuple[datetime, float]] = []
        wall_total = 0.0
        for count in trials:
            wall, started, error = tune_tunefleet(workload.key, count, db, env, run_dir)
            runs.append((started, wall))
            wall_total += wall
            key = f"tunefleet@{count}"
            if error:
                info[key] = {"error": error}
                print(f"  {key}: {error}", flush=True)
                break
            snapshot = home / f"log-{count}.db"
            shutil.copyfile(db, snapshot)
            curve = trial_curve(snapshot, workload.key, flops)
            info[key] = {"tune_s": wall_total, "trials_logged": len(curve), "runs": list(runs), "curve": curve,
                         "tuner_best_gflops": max((g for _, g in curve if g), default=None)}
            print(f"  {key}: tuned in {wall_total:.0f} s, {len(curve)} trials logged, best by the tuner's own "
                  f"measurement {_num(info[key]['tuner_best_gflops'])} GFLOPS", flush=True)
            # measured with the kernel cache (XDG_CACHE_HOME) the tuning filled
            contestants[key] = ("tunefleet", {**base, "db": f"sqlite:///{snapshot}"}, env)

    if "tvm" in peers and not missing["tvm"]:
        for count in tvm_trials or trials:
            key = f"tvm@{count}"
            workdir = run_dir / f"tvm-{slug}-{count}"
            start = time.monotonic()
            result = runner.worker("tvm_tune", {**base, "mcpu": mcpu, "trials": count, "workdir": str(workdir)},
                                   timeout=3600)
            wall = time.monotonic() - start
            if "error" in result or "na" in result:
                info[key] = result
                print(f"  {key}: {result.get('error') or 'n/a: ' + result['na']}", flush=True)
                break
            info[key] = {**result, "wall_s": wall}
            print(f"  {key}: tuned in {result['tune_s']:.0f} s ({wall:.0f} s with imports), {result['valid']}/"
                  f"{result['records']} valid records, MetaSchedule's best {_num(flops / result['ms_best_s'] / 1e9 if result['ms_best_s'] else None)} GFLOPS",
                  flush=True)
            contestants[key] = ("tvm", {**base, "mcpu": mcpu, "workdir": str(workdir)}, None)

    for peer in ("torch", "onnxruntime", "openblas"):
        if peer not in peers or missing[peer]:
            continue
        if peer == "openblas" and workload.op not in ("matmul", "dense"):
            info[peer] = {"na": "matmul and dense only"}
            continue
        contestants[peer] = (peer, dict(base), None)

    measured = measure_round_robin(runner, contestants, rounds)

    for key in [*contestants, *[k for k in info if k not in contestants]]:
        result = {**info.get(key, {}), **measured.get(key, {})}
        samples = result.pop("samples", None)
        shares = result.pop("wait_shares", None)
        if samples:
            result["best_gflops"] = flops / min(samples) / 1e9
            result["median_gflops"] = flops / statistics.median(samples) / 1e9
            result["samples"] = len(samples)
        if shares:  # samples another process slowed: their threads waited for a CPU > 5% of the time
            result["disturbed_samples"] = sum(1 for share in shares if share > DISTURBED_WAIT_SHARE)
        row["contestants"][key] = result
    for peer in peers:
        if missing.get(peer):
            row["contestants"].setdefault(peer, {"missing": missing[peer]})

    # when the tuner's own measurement first reached each peer's best GFLOPS (its best sample, not its
    # median: on a loaded 2-core host the median of a 2-thread peer collapses whenever another process
    # takes a core, torch's most of all; the best sample is what the peer does when left alone)
    # TVM@T is compared with tunefleet@T, or with every tunefleet budget when T is TVM's alone (--tvm-trials)
    tunefleet_budgets = {k.split("@")[1] for k in row["contestants"] if k.startswith("tunefleet@")}
    for key, result in row["contestants"].items():
        if not key.startswith("tunefleet@") or "curve" not in result:
            continue
        curve = result.pop("curve")
        result["reach"] = {}
        for peer, peer_result in row["contestants"].items():
            if peer.startswith("tunefleet") or "best_gflops" not in peer_result:
                continue
            if peer.startswith("tvm@") and peer.split("@")[1] in tunefleet_budgets - {key.split("@")[1]}:
                continue
            hit = reached(curve, [tuple(r) for r in result["runs"]], peer_result["best_gflops"])
            result["reach"][peer] = None if hit is None else {"trial": hit[0], "tune_s": hit[1]}
        result["runs"] = [(s.isoformat(), w) for s, w in result["runs"]]
    print_workload(row)
    return row


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_workload(row: dict) -> None:
    print(f"  {'contestant':<15} {'best':>7} {'median':>7} {'tune s':>7}  trial and tuning time at which the tuner's "
          "own measurement first reached the peer's best")
    for key, result in row["contestants"].items():
        if "missing" in result:
            print(f"  {key:<15} {result['missing']}")
            continue
        if "na" in result or "error" in result:
            print(f"  {key:<15} {'n/a: ' + result['na'] if 'na' in result else 'failed: ' + result['error']}")
            continue
        tune_s = result.get("tune_s")
        reach = ""
        if "reach" in result:
            parts = []
            for peer, hit in result["reach"].items():
                parts.append(f"{peer} at trial {hit['trial']}, {hit['tune_s']:.0f} s" if hit else f"{peer} not reached")
            reach = "; ".join(parts)
        disturbed = (f"  ({result['disturbed_samples']} of {result['samples']} samples slowed by other work)"
                     if result.get("disturbed_samples") else "")
        print(f"  {key:<15} {_num(result.get('best_gflops')):>7} {_num(result.get('median_gflops')):>7} "
              f"{_num(tune_s, 0):>7}  {reach}{disturbed}", flush=True)


def print_summary(report: dict) -> None:
    print(f"\nGFLOPS (median sample; best in parentheses), {report['threads']} threads each, load average {_load()}")
    keys = []
    for row in report["workloads"]:
        keys += [k for k in row["contestants"] if k not in keys]
    print("| workload | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for row in report["workloads"]:
        cells = []
        for key in keys:
            result = row["contestants"].get(key)
            if result is None:
                cells.append("")
            elif "median_gflops" in result:
                extra = f", {result['tune_s']:.0f} s" if result.get("tune_s") is not None else ""
                cells.append(f"{result['median_gflops']:.1f} ({result['best_gflops']:.1f}){extra}")
            elif "missing" in result:
                cells.append("not installed")
            else:
                cells.append("n/a" if "na" in result else "failed")
        print(f"| {row['name']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
