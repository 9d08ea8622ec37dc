"""Time to quality with and without kernel reuse (issue 26 point 2).

Tunes one workload through the real path (``TuningJob``, ``xgb``, a ``LocalMeasurer`` with its
build and run workers, a fresh kernel cache per run so no run profits from another's compiles)
once per ``--reuse`` share, the runs taking turns when ``--pairs`` > 1. Printed per run: the
median and mean compile time per candidate (as the build workers report it: a candidate whose
kernel is already built loads it from numba's disk cache), the tuning wall time, the best GFLOPS
as the engine recorded it, and the wall time at which the best first reached each ``--at`` GFLOPS.

    python bench/time_to_quality.py                                   # matmul 512, 48 trials, reuse 0 and 0.5
    python bench/time_to_quality.py --workload "conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)" --at 40 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

from measure_agent.engine import TimingConfig  # noqa: E402
from measure_agent.templates import default_catalog  # noqa: E402
from measure_agent.workload import parse_workload  # noqa: E402
from tuner.job import Progress, TuneOptions, TuningJob, gflops  # noqa: E402
from tuner.log import TuningLog  # noqa: E402
from tuner.measure import LocalMeasurer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="matmul(M=512,N=512,K=512)")
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--reuse", type=float, nargs="+", default=[0.0, 0.5], help="reuse shares to compare")
    parser.add_argument("--pairs", type=int, default=1, help="rounds of runs, order reversed every other round")
    parser.add_argument("--at", type=float, nargs="+", default=[50.0, 80.0, 100.0], help="GFLOPS thresholds")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        workload = parse_workload(args.workload)
    except ValueError as exc:
        parser.error(str(exc))
    if args.trials < 1 or any(not 0.0 <= r < 1.0 for r in args.reuse):
        parser.error("--trials must be >= 1 and every --reuse share in [0, 1)")
    timing = TimingConfig(number=1, repeat=3, min_repeat_ms=50, warmup=1, build_timeout_s=300, run_timeout_s=120)
    print(f"{workload.key}, {args.trials} trials, load average {_load()}", flush=True)
    rows = []
    for round_index in range(args.pairs):
        shares = args.reuse if round_index % 2 == 0 else list(reversed(args.reuse))
        for share in shares:
            row = tune(workload, args.trials, share, args.seed, args.workers, timing, args.at)
            rows.append(row)
            print(_line(row, args.at), flush=True)
    print(f"\nload average at the end: {_load()}")
    print("| reuse share | median compile s/candidate | mean compile s | wall s | best GFLOPS | "
          + " | ".join(f"wall to {a:g} GFLOPS" for a in args.at) + " |")
    print("| --- " * (5 + len(args.at)) + "|")
    for row in rows:
        print(f"| {row['share']:g} | {row['median_compile']:.2f} | {row['mean_compile']:.2f} | {row['wall']:.0f} | "
              f"{row['best']:.1f} | " + " | ".join(_when(row['reached'].get(a)) for a in args.at) + " |")
    return 0


def tune(workload, trials: int, share: float, seed: int, workers: int, timing: TimingConfig,
         thresholds: list[float]) -> dict:
    reached: dict[float, float] = {}
    start = time.monotonic()

    def on_progress(progress: Progress) -> None:
        for threshold in thresholds:
            if progress.best_gflops is not None and progress.best_gflops >= threshold and threshold not in reached:
                reached[threshold] = time.monotonic() - start

    with tempfile.TemporaryDirectory(prefix="ttq-") as tmp:
        with LocalMeasurer(timing, build_workers=workers, cache_dir=Path(tmp) / "kernels") as measurer, \
                TuningLog(f"sqlite:///{tmp}/log.db") as log:
            start = time.monotonic()
            summary = TuningJob(workload, measurer, log, default_catalog(),
                                TuneOptions(trials=trials, strategy="xgb", seed=seed, reuse_share=share),
                                on_progress=on_progress).run()
            wall = time.monotonic() - start
            compiles = [t.compile_time_s for t in log.trials(workload_key=workload.key) if t.status != "invalid_config"]
    return {"share": share, "wall": wall, "best": gflops(workload, summary.best.mean_s) if summary.best else 0.0,
            "median_compile": statistics.median(compiles) if compiles else float("nan"),
            "mean_compile": statistics.fmean(compiles) if compiles else float("nan"), "reached": reached}


def _when(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f} s"


def _line(row: dict, thresholds: list[float]) -> str:
    return (f"reuse {row['share']:g}: median compile {row['median_compile']:.2f} s, mean {row['mean_compile']:.2f} s, "
            f"wall {row['wall']:.0f} s, best {row['best']:.1f} GFLOPS, "
            + ", ".join(f"{a:g} GFLOPS at {_when(row['reached'].get(a))}" for a in thresholds))


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
