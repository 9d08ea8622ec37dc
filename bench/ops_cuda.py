"""CUDA templates on a GPU host: default config vs a short search vs a vendor reference, per layer.

For each layer the measurement engine (isolated build and run workers, exactly what an agent runs)
measures the template's default config, then ``--random`` random valid configs and up to
``--neighbours`` one-step neighbours of the best so far; every candidate's output is checked
against the numpy reference on the way. The reference is torch (cuBLAS / cuDNN) when it is
installed with CUDA, else CuPy (GEMMs only), else numpy on the host. All GPU times are per call,
measured on the GPU between two CUDA events around back-to-back launches (the engine's method,
``measure_agent.engine.worker.time_launches_with_events``; torch's and CuPy's own events for the
reference), best of the repeats; only the numpy reference is timed by the host clock.

    python bench/ops_cuda.py                       # the layers below, about 5-8 minutes on an H100/H200
    python bench/ops_cuda.py --layers matmul conv2d_nchw --random 8
    NUMBA_ENABLE_CUDASIM=1 python bench/ops_cuda.py --smoke   # tiny shapes, checks the script itself

Needs numpy and numba with a CUDA target (numba's built-in one finds the CUDA toolkit through
CUDA_HOME; or ``pip install "numba-cuda[cu12]"``). Writes ``ops_cuda.json`` to ``$OUT`` (or
``--json PATH``) when given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the engine's worker processes import measure_agent too, also from a plain checkout
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import numpy as np  # noqa: E402

from measure_agent.device import cuda_simulated, detect_device  # noqa: E402
from measure_agent.engine import MeasureEngine, MeasureInput, MeasureStatus, TimingConfig  # noqa: E402
from measure_agent.templates import default_catalog  # noqa: E402
from measure_agent.workload import parse_workload  # noqa: E402

LAYERS = {
    "matmul": "matmul(M=2048,N=2048,K=2048)",
    "dense": "dense(M=128,N=4096,K=1024)",
    "batch_matmul": "batch_matmul(B=32,M=256,N=256,K=64)",  # attention scores, 8 heads x 4 sequences
    "conv2d_nchw": "conv2d_nchw(N=8,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)",  # ResNet-50 conv2_x
    "conv2d_nhwc": "conv2d_nhwc(N=8,C=128,H=28,W=28,K=128,R=3,S=3,pad=1)",  # ResNet-50 conv3_x
    "depthwise_conv2d_nchw": "depthwise_conv2d_nchw(N=8,C=128,H=56,W=56,R=3,S=3,pad=1)",  # MobileNet
    "depthwise_conv2d_nhwc": "depthwise_conv2d_nhwc(N=8,C=256,H=28,W=28,R=3,S=3,stride=2,pad=1)",
}
SMOKE = {
    "matmul": "matmul(M=9,N=7,K=5)",
    "conv2d_nhwc": "conv2d_nhwc(N=2,C=3,H=6,W=5,K=4,R=3,S=3,stride=2,pad=1)",
    "depthwise_conv2d_nchw": "depthwise_conv2d_nchw(N=1,C=2,H=5,W=5,R=3,S=3,pad=1,multiplier=2)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", choices=sorted(LAYERS), help="default: all")
    parser.add_argument("--random", type=int, default=24, help="random configs per layer (default 24)")
    parser.add_argument("--neighbours", type=int, default=12, help="neighbours of the best tried per layer (12)")
    parser.add_argument("--parallel", type=int, default=min(8, os.cpu_count() or 1), help="build workers")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop searching after this (default 480)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", action="append", default=[], metavar="LAYER=JSON",
                        help="also measure the default config of LAYER with these knobs changed, e.g. "
                             "'matmul={\"blocks_per_sm\": 2}' (repeatable)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and 2 random configs (simulator)")
    parser.add_argument("--json", help="write results here (default: $OUT/ops_cuda.json when OUT is set)")
    args = parser.parse_args()

    layers = SMOKE if args.smoke else {name: LAYERS[name] for name in (args.layers or LAYERS)}
    args.variants = {}
    for text in args.variant:
        name, _, changes = text.partition("=")
        try:
            args.variants.setdefault(name, []).append(json.loads(changes))
        except json.JSONDecodeError as exc:
            parser.error(f"--variant {text!r}: not LAYER=JSON ({exc})")
    if args.smoke:
        args.random, args.neighbours = 2, 1
    device = detect_device()
    if not device.extra.get("gpu_name") and not cuda_simulated():
        print("no CUDA GPU: numba.cuda finds none (install numba-cuda[cu12], or point CUDA_HOME at a CUDA toolkit "
              "for numba's built-in target); NUMBA_ENABLE_CUDASIM=1 with --smoke checks the script", file=sys.stderr)
        return 2
    print(f"device: {device.extra.get('gpu_name', 'no GPU detected')} (cc {device.extra.get('compute_capability', '?')}), "
          f"key {device.default_key}; reference: {reference_name()}", flush=True)
    catalog = default_catalog()
    timing = TimingConfig(number=1, repeat=5, min_repeat_ms=0 if args.smoke else 20, warmup=2,
                          build_timeout_s=300, run_timeout_s=60)
    deadline = time.monotonic() + args.budget_s
    results = []
    with MeasureEngine(timing, build_workers=max(1, args.parallel), cache_dir=Path(tempfile.mkdtemp())) as engine:
        for i, (name, text) in enumerate(layers.items()):
            workload = parse_workload(text)
            template = catalog.get(workload.op, "cuda")
            space = catalog.space(workload, "cuda", device)
            share = (deadline - time.monotonic()) / (len(layers) - i)
            row = search(engine, workload, template, space, args, time.monotonic() + max(share, 10.0),
                         args.variants.get(name, []))
            row["reference_s"] = reference_time(workload)
            results.append(row)
            print_row(row, flush=True)
    print()
    print("speedup = default time / tuned time; vs ref = reference time / tuned time (1.00x: as fast as the reference)")
    print(f"{'layer':<24} {'default ms':>11} {'tuned ms':>9} {'ref ms':>8} {'speedup':>9} {'vs ref':>9}  GFLOP/s tuned")
    for row in results:
        print_row(row)
    out = args.json or (os.path.join(os.environ["OUT"], "ops_cuda.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps({"device": device.to_json(), "reference": reference_name(),
                                         "results": results}, indent=2, default=str))
        print(f"results in {out}")
    return 0 if all(r["default_s"] and r["tuned_s"] for r in results) else 1


def search(engine, workload, template, space, args, deadline: float, variants=()) -> dict:
    """Default, its variants, random configs, then neighbours of the best: best-of-repeats seconds
    of each."""
    rng = np.random.default_rng(args.seed)
    default = template.default_config(workload, space)
    measured: dict[str, tuple] = {}

    def measure(configs):
        fresh = [c for c in dict.fromkeys(configs) if c.digest not in measured]
        if not fresh:
            return
        for config, result in zip(fresh, engine.measure([MeasureInput(workload, c, "cuda") for c in fresh])):
            measured[config.digest] = (config, result)
            if result.status is not MeasureStatus.OK:
                print(f"    {result.status.value}: {config} {result.message[:200]}", file=sys.stderr)

    start = time.monotonic()
    measure([default])
    chosen = []
    for changes in variants:
        try:
            chosen.append((changes, space.from_json({**default.to_json(), **changes})))
        except Exception as exc:  # noqa: BLE001 - a variant the space refuses is reported, not fatal
            print(f"    variant {changes}: {exc}", file=sys.stderr)
    measure([config for _, config in chosen])  # in one batch: they build in parallel
    for changes, config in chosen:
        result = measured[config.digest][1]
        print(f"    variant {changes}: {result.min_s * 1e3:.3f} ms" if result.min_s else
              f"    variant {changes}: {result.status.value}", flush=True)
    batch = max(1, args.parallel)
    sampled = space.sample(rng, args.random)
    for k in range(0, len(sampled), batch):
        if time.monotonic() > deadline:
            break
        measure(sampled[k:k + batch])
    tried = 0
    while tried < args.neighbours and time.monotonic() < deadline:
        best = fastest(measured)
        fresh = [c for c in space.neighbours(best[1] if best else default) if c.digest not in measured]
        fresh = fresh[: min(batch, args.neighbours - tried)]
        if not fresh:
            break
        measure(fresh)
        tried += len(fresh)
    default_result = measured[default.digest][1]
    best_s, best_config = fastest(measured) or (None, None)
    return {
        "layer": workload.op, "workload": workload.key, "flops": workload.flops,
        "default_config": default.to_json(), "default_s": default_result.min_s,
        "default_status": default_result.status.value,
        "tuned_config": best_config.to_json() if best_config else None, "tuned_s": best_s,
        "measured": len(measured), "failed": sum(1 for _, r in measured.values() if not r.status.is_ok),
        "max_abs_error": max((r.details.get("max_abs_error", 0.0) for _, r in measured.values() if r.status.is_ok),
                             default=None),
        "search_s": round(time.monotonic() - start, 1),
    }


def fastest(measured: dict) -> tuple | None:
    """(seconds, config) of the fastest correct config measured, or None."""
    timed = [(r.min_s, c) for c, r in measured.values() if r.min_s is not None]
    return min(timed, key=lambda t: t[0]) if timed else None


def print_row(row: dict, flush: bool = False) -> None:
    def ms(s):
        return f"{s * 1e3:.3f}" if s else "-"

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    gflops = f"{row['flops'] / row['tuned_s'] / 1e9:.0f}" if row["tuned_s"] else "-"
    print(f"{row['layer']:<24} {ms(row['default_s']):>11} {ms(row['tuned_s']):>9} {ms(row['reference_s']):>8} "
          f"{ratio(row['default_s'], row['tuned_s']):>9} {ratio(row['reference_s'], row['tuned_s']):>9}  {gflops}"
          f"   ({row['measured']} measured, {row['failed']} failed, {row['search_s']} s)", flush=flush)


# -- references ---------------------------------------------------------------------------------


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def _cupy():
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:  # noqa: BLE001
        return None


def reference_name() -> str:
    if _torch() is not None:
        return "torch (cuBLAS/cuDNN)"
    if _cupy() is not None:
        return "cupy (cuBLAS; no convolutions)"
    return "numpy on the host CPU"


def reference_time(workload, repeat: int = 5) -> float | None:
    """Best-of-repeats seconds per call of the reference (CUDA events on a GPU, else the host clock)."""
    from measure_agent.engine.checking import make_problem

    inputs = make_problem(workload).inputs
    p = workload.params
    torch = _torch()
    if torch is not None:
        import torch.nn.functional as F

        torch.backends.cuda.matmul.allow_tf32 = False  # compare like with like: full float32
        torch.backends.cudnn.allow_tf32 = False
        x, w = (torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in inputs)
        stride, pad, dil = (p.get("stride_h", 1), p.get("stride_w", 1)), (p.get("pad_h", 0), p.get("pad_w", 0)), \
            (p.get("dilation_h", 1), p.get("dilation_w", 1))
        op = workload.op
        if op == "matmul":
            call = lambda: x @ w  # noqa: E731
        elif op == "dense":
            call = lambda: F.linear(x, w)  # noqa: E731
        elif op == "batch_matmul":
            call = lambda: torch.bmm(x, w)  # noqa: E731
        elif op == "conv2d_nchw":
            call = lambda: F.conv2d(x, w, stride=stride, padding=pad, dilation=dil)  # noqa: E731
        elif op == "conv2d_nhwc":
            xc = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
            wc = w.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
            call = lambda: F.conv2d(xc, wc, stride=stride, padding=pad, dilation=dil)  # noqa: E731
        else:
            c, m = p["C"], p["multiplier"]
            if op == "depthwise_conv2d_nchw":
                xc, wc = x, w.reshape(c * m, 1, p["R"], p["S"])
            else:
                xc = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
                wc = w.permute(2, 3, 0, 1).reshape(c * m, 1, p["R"], p["S"]).contiguous(
                    memory_format=torch.channels_last)
            call = lambda: F.conv2d(xc, wc, stride=stride, padding=pad, dilation=dil, groups=c)  # noqa: E731
        return _time_with_events(call, lambda: torch.cuda.Event(enable_timing=True),
                                 lambda start, end: start.elapsed_time(end), repeat)
    cupy = _cupy()
    if cupy is not None:
        if workload.op not in ("matmul", "dense", "batch_matmul"):
            return None
        x, w = (cupy.asarray(a) for a in inputs)
        call = (lambda: x @ w.T) if workload.op == "dense" else (lambda: cupy.matmul(x, w))
        return _time_with_events(call, cupy.cuda.Event, cupy.cuda.get_elapsed_time, repeat)
    return _time_on_host(lambda: workload.spec.reference(p, *inputs), repeat)


MIN_REPEAT_S = 0.02  # each repeat runs at least this long


def _time_with_events(call, new_event, elapsed_ms, repeat: int) -> float:
    """Best-of-repeats seconds per call, on the GPU: back-to-back calls between two events, their
    number doubled until a repeat lasts ``MIN_REPEAT_S``."""
    def timed(number: int) -> float:
        start, end = new_event(), new_event()
        start.record()
        for _ in range(number):
            call()
        end.record()
        end.synchronize()
        return elapsed_ms(start, end) / 1000.0

    timed(3)  # warm-up
    number = 1
    while timed(number) < MIN_REPEAT_S and number < 1 << 20:
        number *= 2
    return min(timed(number) / number for _ in range(repeat))


def _time_on_host(call, repeat: int) -> float:
    for _ in range(3):
        call()
    costs = []
    for _ in range(repeat):
        number, elapsed = 0, 0.0
        start = time.perf_counter()
        while elapsed < MIN_REPEAT_S or number < 1:
            call()
            number += 1
            elapsed = time.perf_counter() - start
        costs.append(elapsed / number)
    return min(costs)


if __name__ == "__main__":
    sys.exit(main())
