"""Tuned numba matmul vs the default schedule vs numpy (OpenBLAS), measured side by side.

For each size, a tuning job runs through the real path (an embedded daemon and a local agent,
exactly what ``tuner tune`` does) with a fixed trial budget into a temporary log. Then the default
config, the best tuned config and numpy's ``A @ B`` are timed again in one sitting, interleaved,
and the table prints GFLOPS and ratios. Kernel times come from the measurement engine (worker
processes with the numba settings kernels need); numpy runs in this process.

    python bench/matmul_cpu.py                      # 512 and 1024, 64 trials each
    python bench/matmul_cpu.py --sizes 512 --trials 32 --parallel 2

Target (issue 2): the tuned kernel reaches >= 0.5x numpy at 1024 within 64 trials.
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

from measure_agent.engine.runtime import KernelRuntime  # noqa: E402

# numba reads these at import: set them before anything imports it (the --asm report compiles here,
# with the workers' settings).
KernelRuntime.resolve().apply()  # the workers' settings, before numba is imported (malloc thresholds too)

import numpy as np  # noqa: E402

from measure_agent.device import detect_device  # noqa: E402
from measure_agent.engine import MeasureEngine, MeasureInput, TimingConfig  # noqa: E402
from measure_agent.templates import default_catalog  # noqa: E402
from measure_agent.workload import parse_workload  # noqa: E402
from tuner.daemon import FleetClient  # noqa: E402
from tuner.daemon.embedded import local_fleet  # noqa: E402
from tuner.fleet import JobSpec  # noqa: E402
from tuner.log import TuningLog  # noqa: E402


def tune(workload, trials: int, parallel: int, strategy: str, db: str, device_key: str) -> tuple[float, int]:
    """Run the tuning job; returns (seconds it took, trials measured)."""
    start = time.perf_counter()
    with TuningLog(db) as log, local_fleet(log, device_key, parallel=parallel) as daemon:
        with FleetClient(daemon.address) as client:
            job = client.submit(JobSpec(workload.key, device_key, strategy=strategy, trials=trials,
                                        timing=TimingConfig(repeat=3, min_repeat_ms=50)))
            final = None
            for final in client.watch(job.job_id):
                print(f"    {final.done}/{final.total} measured", end="\r", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return time.perf_counter() - start, final.measured_now if final else 0


def time_numpy(a: np.ndarray, b: np.ndarray, repeat: int) -> float:
    a @ b
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        n = 0
        while True:
            a @ b
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed > 0.05:
                break
        best = min(best, elapsed / n)
    return best


def fma_counts(workload, config) -> tuple[int, int]:
    """(packed, scalar) FMA instructions in the compiled kernel: is the register tile vectorised?"""
    from measure_agent.engine.build import compile_kernel, kernel_assembly, load_kernel

    template = default_catalog().get("matmul", "cpu")
    source = template.render(workload, config)
    kernel = load_kernel(source, Path(tempfile.mkdtemp(prefix="tunefleet-asm-")))
    args = [np.zeros((1, 1), np.float32)] * 3 + list(source.runtime_args)
    compile_kernel(kernel, tuple(args))
    asm = kernel_assembly(kernel, source)
    packed = sum(1 for line in asm.splitlines() if "vfmadd" in line and "ps" in line.split()[0])
    scalar = sum(1 for line in asm.splitlines() if "vfmadd" in line and "ss" in line.split()[0])
    return packed, scalar


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=2, help="build workers (default 2)")
    parser.add_argument("--strategy", default="xgb")
    parser.add_argument("--repeat", type=int, default=7, help="timed repeats in the final comparison")
    parser.add_argument("--asm", action="store_true", help="count packed vs scalar FMAs of the best kernel")
    args = parser.parse_args()

    device = detect_device()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunefleet-bench-") as tmp:
        db = f"sqlite:///{tmp}/bench.db"
        for n in args.sizes:
            workload = parse_workload(f"matmul(M={n},N={n},K={n})")
            print(f"tuning {workload.key} with {args.trials} trials ({args.strategy})", file=sys.stderr)
            tune_s, measured = tune(workload, args.trials, args.parallel, args.strategy, db, device.default_key)
            with TuningLog(db) as log:
                best = log.best(workload.key, device.default_key, "cpu", top=1)[0]
            template = default_catalog().get("matmul", "cpu")
            space = template.space(workload, device)
            default_config = template.default_config(workload, space)
            best_config = space.from_json(best.config)
            # Side by side: default, best and numpy, interleaved rounds, best of each.
            timing = TimingConfig(number=1, repeat=3, min_repeat_ms=100)
            a = np.random.default_rng(0).uniform(-1, 1, (n, n)).astype(np.float32)
            b = np.random.default_rng(1).uniform(-1, 1, (n, n)).astype(np.float32)
            kernel_best = {"default": float("inf"), "tuned": float("inf")}
            numpy_best = float("inf")
            with MeasureEngine(timing) as engine:
                for _ in range(max(1, args.repeat // 3)):
                    results = engine.measure([MeasureInput(workload, default_config), MeasureInput(workload, best_config)])
                    for name, result in zip(("default", "tuned"), results):
                        if result.min_s:
                            kernel_best[name] = min(kernel_best[name], result.min_s)
                    numpy_best = min(numpy_best, time_numpy(a, b, 3))
            flops = workload.flops
            row = {
                "n": n, "trials": measured, "tune_s": tune_s,
                "default": flops / kernel_best["default"] / 1e9,
                "tuned": flops / kernel_best["tuned"] / 1e9,
                "numpy": flops / numpy_best / 1e9,
                "config": best.config,
            }
            if args.asm:
                row["fma"] = fma_counts(workload, best_config)
            rows.append(row)
    print(f"\nmatmul float32 on {device.cpu_model} ({device.cores} cores, {' '.join(device.isa_features)}), "
          f"numba {device.numba_version}")
    print(f"{'size':>6} {'trials':>6} {'tune s':>7} {'default':>9} {'tuned':>9} {'numpy':>9} "
          f"{'tuned/numpy':>11} {'tuned/default':>13}")
    for r in rows:
        print(f"{r['n']:>6} {r['trials']:>6} {r['tune_s']:>7.0f} {r['default']:>9.1f} {r['tuned']:>9.1f} "
              f"{r['numpy']:>9.1f} {r['tuned'] / r['numpy']:>11.2f} {r['tuned'] / r['default']:>13.2f}")
    print("(GFLOPS; best of interleaved rounds measured after tuning)")
    for r in rows:
        extra = f"  FMAs packed/scalar {r['fma'][0]}/{r['fma'][1]}" if "fma" in r else ""
        print(f"  best config {r['n']}: {r['config']}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
