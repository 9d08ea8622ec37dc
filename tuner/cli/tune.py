"""``tuner tune``: tune a workload, with a progress bar, and report the best config."""

from __future__ import annotations

import argparse
import json

from measure_agent.engine import TimingConfig
from measure_agent.templates import TemplateNotFound, default_catalog
from tuner.cli.common import (
    EXIT_FAILURE,
    WORKLOAD_HELP,
    CliError,
    add_db_arguments,
    non_negative_float,
    open_log,
    positive_float,
    positive_int,
    workload_arg,
)
from tuner.search import DEFAULT_STRATEGY, STRATEGIES


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="tune a workload on this host")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu", help="template family (default: cpu)")
    p.add_argument("--strategy", default=DEFAULT_STRATEGY, choices=sorted(STRATEGIES))
    p.add_argument("--trials", type=positive_int, default=64,
                   help="distinct configs the log should hold for this workload and device when done "
                   "(default 64); re-running the same command resumes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--early-stopping", type=positive_int, metavar="N", help="stop after N trials without improvement")
    p.add_argument("--parallel", type=positive_int, default=1, help="build workers (default 1)")
    p.add_argument("--number", type=positive_int, default=1, help="calls per timed repeat (default 1)")
    p.add_argument("--repeat", type=positive_int, default=3, help="timed repeats (default 3)")
    p.add_argument("--min-repeat-ms", type=non_negative_float, default=50.0,
                   help="grow --number until one repeat lasts this long (default 50)")
    p.add_argument("--timeout", type=positive_float, default=20.0, help="run timeout per candidate, seconds (default 20)")
    p.add_argument("--build-timeout", type=positive_float, default=120.0,
                   help="build timeout per candidate, seconds (default 120)")
    add_db_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.job import TuneOptions, TuningJob, gflops
    from tuner.measure import LocalMeasurer
    from tuner.progress import ProgressDisplay

    workload = workload_arg(args.workload)
    catalog = default_catalog()
    try:
        catalog.get(workload.op, args.target)
        timing = TimingConfig(number=args.number, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                              build_timeout_s=args.build_timeout, run_timeout_s=args.timeout)
        options = TuneOptions(trials=args.trials, strategy=args.strategy, seed=args.seed,
                              early_stopping=args.early_stopping, target=args.target)
    except (ValueError, TemplateNotFound) as exc:
        raise CliError(str(exc)) from None
    with open_log(args.db) as log, LocalMeasurer(
        timing, build_workers=args.parallel, device_key=args.device_key
    ) as measurer, ProgressDisplay(f"tuning {workload.key} on {measurer.device_key}") as display:
        summary = TuningJob(workload, measurer, log, catalog, options, on_progress=display.update).run()
    if summary.best is None:
        print(f"no config of {workload.key} ran successfully on {summary.device_key} "
              f"({summary.measured_now} measured, statuses {summary.status_counts})")
        return EXIT_FAILURE
    best = summary.best
    print(f"workload:  {workload.key}")
    print(f"device:    {summary.device_key}")
    print(f"trials:    {summary.measured_now} measured now, {summary.total_in_log} in the log, "
          f"{summary.errors} errors{' (stopped early)' if summary.stopped_early else ''}")
    print(f"best:      {json.dumps(best.config, sort_keys=True)}")
    print(f"time:      {best.mean_s * 1e3:.4f} ms   {gflops(workload, best.mean_s):.2f} GFLOPS")
    if summary.default is not None and summary.default.mean_s:
        print(f"default:   {summary.default.mean_s * 1e3:.4f} ms   {gflops(workload, summary.default.mean_s):.2f} GFLOPS")
        print(f"speed-up:  {summary.speedup_over_default:.2f}x over the default config")
    elif summary.default is not None:
        print(f"default:   failed ({summary.default.status})")
    return 0
