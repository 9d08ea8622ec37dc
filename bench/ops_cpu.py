"""CPU operator templates on real layers: default config vs tuned vs a numpy/BLAS reference.

Each layer (batch 1, float32) is tuned through the real path: ``tuner.job.TuningJob`` with the
``xgb`` strategy on a ``tuner.measure.LocalMeasurer`` (the agent's measurement engine: isolated
build and run workers, every candidate checked against the numpy reference), recording into a
temporary SQLite ``TuningLog``, for a fixed trial budget. Then, in this process, the default
config, the tuned best and the references are timed interleaved (round after round, best of all
rounds), so that the ratios compare runs under the same machine load; the tuner's own numbers
(mean of its repeats) are printed beside them. Each timing is the mean of back-to-back calls
lasting at least 20 ms (AutoTVM's min_repeat_ms), after a pause that lets OpenBLAS's spinning
threads go idle, for the kernels and the references alike.

References: conv2d: im2col (numpy) + one BLAS GEMM (numpy's OpenBLAS); depthwise: numpy, one
accumulate per filter tap over shifted views of the padded input; dense: BLAS ``X @ W.T``; and
PyTorch CPU (``torch.nn.functional``) when ``import torch`` works.

    python bench/ops_cpu.py                            # every layer, 24 trials each
    python bench/ops_cpu.py --trials 12 --layers r50_conv3x3_64 r50_conv1x1_256_64 mv2_dw_32 mv2_dw_960
    NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/ops_cpu.py    # one core each, both sides

Targets (issue 4): tuned conv2d >= 1.2x the im2col reference, tuned depthwise >= 3x numpy.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the engine's worker processes import measure_agent too, also from a plain checkout
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

from measure_agent.engine.runtime import KernelRuntime  # noqa: E402

# The kernels timed here come from the engine's disk cache, compiled (and keyed) with the workers'
# settings; any kernel this process compiles or loads itself must see them before numba is
# imported, and the kernels timed in this process run with the workers' thread settings.
KernelRuntime.resolve().apply()  # the workers' settings, before numba is imported (malloc thresholds too)

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

from measure_agent.engine import TimingConfig  # noqa: E402
from measure_agent.engine.build import load_kernel  # noqa: E402
from measure_agent.engine.arrays import empty_aligned  # noqa: E402
from measure_agent.engine.checking import check_output, make_problem  # noqa: E402
from measure_agent.engine.worker import time_calls_of, timed_costs  # noqa: E402
from measure_agent.templates import default_catalog  # noqa: E402
from measure_agent.workload import Workload, parse_workload  # noqa: E402
from tuner.job import TuneOptions, TuningJob  # noqa: E402
from tuner.log import TuningLog  # noqa: E402
from tuner.measure import LocalMeasurer  # noqa: E402

# name -> (workload, where it comes from)
LAYERS = {
    "r50_conv1x1_256_64": ("conv2d_nchw(N=1,C=256,H=56,W=56,K=64,R=1,S=1)",
                           "ResNet-50 conv2_x bottleneck, 1x1 reduce 256->64 at 56x56"),
    "r50_conv3x3_64": ("conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)",
                       "ResNet-50 conv2_x bottleneck, 3x3 64->64 at 56x56"),
    "r50_conv3x3_128": ("conv2d_nchw(N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1)",
                        "ResNet-50 conv3_x bottleneck, 3x3 128->128 at 28x28"),
    "r50_conv3x3_128_s2": ("conv2d_nchw(N=1,C=128,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1)",
                           "ResNet-50 (v1.5) conv3_1, 3x3 128->128 stride 2, 56x56 -> 28x28"),
    "r50_conv3x3_256": ("conv2d_nchw(N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1)",
                        "ResNet-50 conv4_x bottleneck, 3x3 256->256 at 14x14"),
    "r50_conv1x1_2048_512": ("conv2d_nchw(N=1,C=2048,H=7,W=7,K=512,R=1,S=1)",
                             "ResNet-50 conv5_x bottleneck, 1x1 reduce 2048->512 at 7x7"),
    "r50_conv3x3_64_nhwc": ("conv2d_nhwc(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)",
                            "ResNet-50 conv2_x 3x3 64->64 at 56x56, NHWC layout"),
    "mv2_dw_32": ("depthwise_conv2d_nchw(N=1,C=32,H=112,W=112,R=3,S=3,pad=1)",
                  "MobileNetV2 block 1 depthwise 3x3, 32 channels at 112x112"),
    "mv2_dw_144_s2": ("depthwise_conv2d_nchw(N=1,C=144,H=56,W=56,R=3,S=3,stride=2,pad=1)",
                      "MobileNetV2 block 4 depthwise 3x3 stride 2, 144 channels, 56x56 -> 28x28"),
    "mv2_dw_960": ("depthwise_conv2d_nchw(N=1,C=960,H=7,W=7,R=3,S=3,pad=1)",
                   "MobileNetV2 blocks 15-17 depthwise 3x3, 960 channels at 7x7"),
    "mv2_dw_960_nhwc": ("depthwise_conv2d_nhwc(N=1,C=960,H=7,W=7,R=3,S=3,pad=1)",
                        "the same, NHWC layout"),
    "mv2_dw_144_nhwc": ("depthwise_conv2d_nhwc(N=1,C=144,H=56,W=56,R=3,S=3,pad=1)",
                        "MobileNetV2 block 3 depthwise 3x3, 144 channels at 56x56, NHWC"),
    "mv3_dw_72_5x5_s2": ("depthwise_conv2d_nhwc(N=1,C=72,H=56,W=56,R=5,S=5,stride=2,pad=2)",
                         "MobileNetV3-Large bneck 4 depthwise 5x5 stride 2, 72 channels, 56x56 -> 28x28, NHWC"),
    "r50_fc": ("dense(M=1,N=1000,K=2048)", "ResNet-50 classifier, 2048 -> 1000"),
    "mv2_fc": ("dense(M=1,N=1000,K=1280)", "MobileNetV2 classifier, 1280 -> 1000"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", choices=sorted(LAYERS), help="default: all")
    parser.add_argument("--trials", type=int, default=24, help="configs measured per layer (default 24)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="build workers (2)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds at the end (15)")
    parser.add_argument("--top", type=int, default=3,
                        help="the tuner's fastest configs re-timed at the end; the best of them (and the "
                             "default, which is a trial too) is 'tuned' (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    names = args.layers or list(LAYERS)
    catalog = default_catalog()
    torch = _torch()
    print(f"reference: numpy {np.__version__} (BLAS: {_blas_name()})" + (f", torch {torch.__version__}" if torch else
                                                                          ", no torch"), flush=True)
    threads = {name: os.environ.get(var, str(os.cpu_count()))
               for name, var in (("numba", "NUMBA_NUM_THREADS"), ("BLAS", "OPENBLAS_NUM_THREADS"))}
    print(f"threads: numba {threads['numba']}, BLAS {threads['BLAS']}; "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}", flush=True)
    timing = TimingConfig(number=1, repeat=5, min_repeat_ms=20, warmup=1, build_timeout_s=300, run_timeout_s=60)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ops_cpu-") as tmp:
        cache_dir = Path(tmp) / "kernels"
        with LocalMeasurer(timing, build_workers=args.workers, cache_dir=cache_dir) as measurer, \
                TuningLog(f"sqlite:///{tmp}/log.db") as log:
            for name in names:
                text, origin = LAYERS[name]
                workload = parse_workload(text)
                start = time.monotonic()
                job = TuningJob(workload, measurer, log, catalog,
                                TuneOptions(trials=args.trials, strategy="xgb", seed=args.seed))
                summary = job.run()
                tune_s = time.monotonic() - start
                row = {"name": name, "origin": origin, "workload": workload, "tune_s": tune_s,
                       "errors": summary.errors, "trials": summary.measured_now,
                       "tuner_default_s": summary.default.mean_s if summary.default else None,
                       "tuner_best_s": summary.best.mean_s if summary.best else None}
                template = catalog.get(workload.op, "cpu")
                top = log.best(workload.key, measurer.device_key, "cpu", top=args.top)
                finalists = [job.space.from_json(r.config) for r in top]
                row.update(time_interleaved(workload, template, job.default_config, finalists, cache_dir, torch,
                                            args.rounds))
                rows.append(row)
                print_row(row, flush=True)
    print()
    print(f"GFLOPS, timed interleaved in this process after tuning (best of {args.rounds} rounds); "
          "tuner = the tuner's own mean of 5 repeats")
    print_table(rows)
    print()
    for row in rows:
        print(f"{row['name']}: {row['workload'].key}\n    {row['origin']}\n"
              f"    tuned ({row['winner']}): {row['best_config']}")
    return 0 if all(r["tuned_ok"] for r in rows) else 1


# -- timing --------------------------------------------------------------------------------------


def time_interleaved(workload: Workload, template, default, finalists, cache_dir: Path, torch, rounds: int) -> dict:
    """Best-of-rounds seconds of the default, the tuner's finalists and the references, timed
    round-robin so that each sees the same machine load. "tuned" is the fastest of the finalists and
    the default (the tuner measured it too; on a noisy host its own ranking is not final)."""
    problem = make_problem(workload)
    calls = {}
    correct = True
    configs = {"default": default}
    for i, config in enumerate(c for c in dict.fromkeys(finalists) if c != default):
        configs[f"top{i + 1}"] = config
    for label, config in configs.items():
        source = template.render(workload, config)
        kernel = load_kernel(source, cache_dir)
        out = empty_aligned(workload.spec.output_shape(workload.params), workload.dtype)  # as the agents time
        out.fill(np.nan)
        args = (*problem.inputs, out, *source.runtime_args)
        kernel(*args)
        correct = correct and check_output(problem, out).correct
        calls[label] = (lambda kernel=kernel, args=args: kernel(*args))
    reference_name, reference = numpy_reference(workload, problem.inputs)
    expected = reference()
    assert np.allclose(expected, problem.expected, rtol=1e-3, atol=1e-3), "the bench's reference is wrong"
    calls["ref"] = reference
    torch_call = torch_reference(torch, workload, problem.inputs) if torch else None
    if torch_call:
        calls["torch"] = torch_call
    best = {label: float("inf") for label in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for label, call in calls.items():
            # OpenBLAS's threads spin for tens of ms after a call (numba's OpenMP threads here wait
            # passively): without a pause, whatever runs right after the BLAS reference shares a
            # core with a spinner, which halved the measured speed of 2-thread kernels.
            time.sleep(SETTLE_S)
            best[label] = min(best[label], time_block(call))
    winner = min(configs, key=lambda label: best[label])
    return {"default_s": best["default"], "tuned_s": best[winner], "ref_s": best["ref"],
            "torch_s": best.get("torch"), "ref_name": reference_name, "tuned_ok": correct,
            "best_config": configs[winner], "winner": winner}


SETTLE_S = 0.15  # longer than OpenBLAS's spin after a call (2**28 cycles by default)
# each timing: the mean of back-to-back calls lasting at least 20 ms, grown as the engine does
BLOCK = TimingConfig(number=1, repeat=1, min_repeat_ms=20, warmup=0)


def time_block(call) -> float:
    """Mean seconds per call over back-to-back calls that last at least 20 ms together."""
    costs, _ = timed_costs(lambda n: time_calls_of(call, n), BLOCK)
    return costs[0]


def numpy_reference(workload: Workload, inputs) -> tuple[str, callable]:
    p = workload.params
    op = workload.op
    if op == "dense":
        x, w = inputs
        return "BLAS X@W.T", lambda: x @ w.T
    x, w = inputs
    nchw = op.endswith("nchw")
    pads = ((0, 0), (0, 0), (p["pad_h"],) * 2, (p["pad_w"],) * 2) if nchw else \
        ((0, 0), (p["pad_h"],) * 2, (p["pad_w"],) * 2, (0, 0))
    span = ((p["R"] - 1) * p["dilation_h"] + 1, (p["S"] - 1) * p["dilation_w"] + 1)
    out_shape = workload.spec.output_shape(p)
    oh, ow = (out_shape[2], out_shape[3]) if nchw else (out_shape[1], out_shape[2])
    sh, sw, dh, dw = p["stride_h"], p["stride_w"], p["dilation_h"], p["dilation_w"]
    if op.startswith("conv2d"):
        k = p["K"]

        def im2col_gemm():
            xp = np.pad(x, pads) if p["pad_h"] or p["pad_w"] else x
            axes = (2, 3) if nchw else (1, 2)
            win = sliding_window_view(xp, span, axis=axes)
            if nchw:  # [N, C, OH, OW, R, S] -> columns [N, C*R*S, OH*OW]; out = W[K, C*R*S] @ columns
                win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :oh, :ow]
                n, c = win.shape[:2]
                cols = np.ascontiguousarray(win.transpose(0, 1, 4, 5, 2, 3)).reshape(n, c * p["R"] * p["S"], oh * ow)
                return np.matmul(w.reshape(k, -1), cols).reshape(n, k, oh, ow)
            # NHWC: [N, OH, OW, C, R, S] -> rows [N*OH*OW, R*S*C]; out = rows @ W[R*S*C, K]
            win = win[:, ::sh, ::sw, :, ::dh, ::dw][:, :oh, :ow]
            n = win.shape[0]
            rows = np.ascontiguousarray(win.transpose(0, 1, 2, 4, 5, 3)).reshape(n * oh * ow, -1)
            return (rows @ w.reshape(-1, k)).reshape(n, oh, ow, k)

        return "im2col+BLAS", im2col_gemm
    m = p["multiplier"]

    def taps():
        xp = np.pad(x, pads) if p["pad_h"] or p["pad_w"] else x
        if nchw:  # out [N, C, M, OH, OW] += view [N, C, 1, OH, OW] * w[C, M, r, s]
            acc = np.zeros((x.shape[0], x.shape[1], m, oh, ow), x.dtype)
            for r in range(p["R"]):
                for s in range(p["S"]):
                    view = xp[:, :, r * dh: r * dh + (oh - 1) * sh + 1: sh, s * dw: s * dw + (ow - 1) * sw + 1: sw]
                    acc += view[:, :, None] * w[None, :, :, r, s, None, None]
            return acc.reshape(out_shape)
        acc = np.zeros((x.shape[0], oh, ow, x.shape[3], m), x.dtype)  # [N, OH, OW, C, M]
        for r in range(p["R"]):
            for s in range(p["S"]):
                view = xp[:, r * dh: r * dh + (oh - 1) * sh + 1: sh, s * dw: s * dw + (ow - 1) * sw + 1: sw]
                acc += view[..., None] * w[r, s]
        return acc.reshape(out_shape)

    return "numpy taps", taps


def torch_reference(torch, workload: Workload, inputs):
    """The same layer through PyTorch CPU (its NCHW ops; NHWC inputs are permuted views)."""
    p = workload.params
    F = torch.nn.functional
    if workload.op == "dense":
        x, w = (torch.from_numpy(a) for a in inputs)
        return lambda: F.linear(x, w)
    x, w = inputs
    nchw = workload.op.endswith("nchw")
    tx = torch.from_numpy(x) if nchw else torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(
        memory_format=torch.channels_last)
    kwargs = dict(stride=(p["stride_h"], p["stride_w"]), padding=(p["pad_h"], p["pad_w"]),
                  dilation=(p["dilation_h"], p["dilation_w"]))
    if workload.op.startswith("conv2d"):
        tw = torch.from_numpy(w) if nchw else torch.from_numpy(w).permute(3, 2, 0, 1).contiguous()
        return lambda: F.conv2d(tx, tw, **kwargs)
    c, m = p["C"], p["multiplier"]
    tw = torch.from_numpy(w).reshape(c * m, 1, p["R"], p["S"]) if nchw else \
        torch.from_numpy(w).permute(2, 3, 0, 1).reshape(c * m, 1, p["R"], p["S"]).contiguous()
    return lambda: F.conv2d(tx, tw, groups=c, **kwargs)


def _torch():
    try:
        import torch

        return torch
    except Exception:  # noqa: BLE001 - not installed or broken: no torch column
        return None


def _blas_name() -> str:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001
        return "?"


# -- output --------------------------------------------------------------------------------------


def _gflops(workload: Workload, seconds) -> str:
    return f"{workload.flops / seconds / 1e9:.1f}" if seconds else "-"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


HEADER = (f"{'layer':<22} {'default':>8} {'tuned':>8} {'ref':>8} {'torch':>7} {'tuned/def':>9} {'tuned/ref':>9} "
          f"{'target':>7}   {'tuner: default -> best':>23} {'trials':>6} {'tune s':>7}")


def print_row(row: dict, flush: bool = False) -> None:
    w = row["workload"]
    op = w.op
    target = 1.2 if op.startswith("conv2d") else 3.0 if op.startswith("depthwise") else None
    met = "-" if target is None else ("met" if row["ref_s"] / row["tuned_s"] >= target else "MISSED")
    tuner = f"{_gflops(w, row['tuner_default_s'])} -> {_gflops(w, row['tuner_best_s'])}"
    print(f"{row['name']:<22} {_gflops(w, row['default_s']):>8} {_gflops(w, row['tuned_s']):>8} "
          f"{_gflops(w, row['ref_s']):>8} {_gflops(w, row['torch_s']):>7} "
          f"{_ratio(row['default_s'], row['tuned_s']):>9} {_ratio(row['ref_s'], row['tuned_s']):>9} "
          f"{met + (f' {target}x' if target else ''):>7}   {tuner:>23} {row['trials']:>6} {row['tune_s']:>7.0f}"
          + ("" if row["tuned_ok"] else "  WRONG ANSWER"), flush=flush)


def print_table(rows: list[dict]) -> None:
    print(HEADER)
    for row in rows:
        print_row(row)


if __name__ == "__main__":
    sys.exit(main())
