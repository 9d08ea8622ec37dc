"""The ``tuner`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from typing import Iterator, NoReturn

from measure_agent.engine import TimingConfig
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateNotFound, default_catalog
from measure_agent.workload import Workload, WorkloadError, parse_workload
from tuner.search import DEFAULT_STRATEGY, STRATEGIES

EXIT_USAGE = 2
EXIT_FAILURE = 1

WORKLOAD_HELP = (
    "workload as OP(NAME=SIZE,...[,dtype=float32|float64]), e.g. 'matmul(M=512,N=512,K=512)'"
)


class CliError(Exception):
    """A user-facing error: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> NoReturn:
    print(f"tuner: error: {message}", file=sys.stderr)
    sys.exit(code)


def _workload(text: str) -> Workload:
    try:
        return parse_workload(text)
    except WorkloadError as exc:
        raise CliError(str(exc)) from None


@contextmanager
def _open_log(db: str | None) -> Iterator["TuningLog"]:  # noqa: F821 - imported lazily
    from tuner.log import TuningLog, TuningLogError
    from tuner.settings import resolve_db_url

    try:
        log = TuningLog(resolve_db_url(db))
    except TuningLogError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    try:
        yield log
    finally:
        log.close()


def _local_device_key() -> str:
    from measure_agent.device import detect_device

    return detect_device().default_key


# -- commands ---------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    from tuner.job import TuneOptions, TuningJob, gflops
    from tuner.measure import LocalMeasurer
    from tuner.progress import ProgressDisplay

    workload = _workload(args.workload)
    catalog = default_catalog()
    try:
        catalog.get(workload.op, args.target)
        timing = TimingConfig(
            number=args.number, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
            build_timeout_s=args.build_timeout, run_timeout_s=args.timeout,
        )
        options = TuneOptions(
            trials=args.trials, strategy=args.strategy, seed=args.seed,
            early_stopping=args.early_stopping, target=args.target,
        )
    except (ValueError, TemplateNotFound) as exc:
        raise CliError(str(exc)) from None
    if args.parallel < 1:
        raise CliError("--parallel must be >= 1")
    with _open_log(args.db) as log, LocalMeasurer(
        timing, build_workers=args.parallel, device_key=args.device_key
    ) as measurer, ProgressDisplay(f"tuning {workload.key} on {measurer.device_key}") as display:
        job = TuningJob(workload, measurer, log, catalog, options, on_progress=display.update)
        summary = job.run()
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


def cmd_best(args: argparse.Namespace) -> int:
    from tuner.job import gflops

    workload = _workload(args.workload)
    device_key = args.device_key or _local_device_key()
    with _open_log(args.db) as log:
        records = log.best(workload.key, device_key, args.target, top=args.top)
    if not records:
        raise CliError(f"no successful trial of {workload.key} on device {device_key} (target {args.target})", EXIT_FAILURE)
    rows = [
        {
            "workload": r.workload_key,
            "device_key": r.device_key,
            "target": r.target,
            "config": r.config,
            "mean_s": r.mean_s,
            "gflops": gflops(workload, r.mean_s),
            "costs": list(r.costs),
            "measured_at": r.created_at.isoformat(),
        }
        for r in records
    ]
    if args.json:
        print(json.dumps(rows[0] if args.top == 1 else rows, sort_keys=True))
        return 0
    for rank, row in enumerate(rows, 1):
        print(f"#{rank} {row['mean_s'] * 1e3:.4f} ms  {row['gflops']:.2f} GFLOPS  {json.dumps(row['config'], sort_keys=True)}")
    print(f"workload {workload.key} on {device_key} ({args.target})")
    return 0


def cmd_show_kernel(args: argparse.Namespace) -> int:
    workload = _workload(args.workload)
    try:
        template = default_catalog().get(workload.op, args.target)
    except TemplateNotFound as exc:
        raise CliError(str(exc)) from None
    space = template.space(workload)
    if args.best:
        device_key = args.device_key or _local_device_key()
        with _open_log(args.db) as log:
            records = log.best(workload.key, device_key, args.target, top=1)
        if not records:
            raise CliError(f"no tuned config of {workload.key} on {device_key}; tune it first or use --config default", EXIT_FAILURE)
        config_json = records[0].config
    elif args.config == "default":
        config_json = template.default_config(workload, space).to_json()
    else:
        config_json = args.config
    try:
        config = space.from_json(config_json)
    except ConfigError as exc:
        raise CliError(f"invalid config for {workload.op}/{args.target}: {exc}") from None
    source = template.render(workload, config)
    sys.stdout.write(source.text)
    if not source.text.endswith("\n"):
        sys.stdout.write("\n")
    if source.runtime_args:
        print(f"# called as {source.entry}(*inputs, out, *{list(source.runtime_args)})")
    return 0


def cmd_log_export(args: argparse.Namespace) -> int:
    from tuner.log import export_trials

    workload_key = _workload(args.workload).key if args.workload else None
    with _open_log(args.db) as log:
        export_trials(log, sys.stdout, workload_key=workload_key, device_key=args.device_key)
    return 0


def cmd_log_import(args: argparse.Namespace) -> int:
    from tuner.log import LogFormatError, import_trials

    try:
        fh = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    with fh, _open_log(args.db) as log:
        try:
            summary = import_trials(log, fh)
        except LogFormatError as exc:
            raise CliError(f"{args.file}: {exc}; nothing imported") from None
    print(f"read {summary.read} trials: {summary.inserted} imported, {summary.duplicates} already present")
    return 0


# -- parser -----------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="tunefleet: auto-tune tensor kernels, record results, query the best configs.",
        epilog="Workloads: OP(NAME=SIZE,...), e.g. matmul(M=512,N=512,K=512); dtype defaults to float32. "
        "The tuning log is SQLite at ~/.local/share/tunefleet/tuning.db unless --db or TUNEFLEET_DB says otherwise.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser, device: bool = True) -> None:
        p.add_argument("--db", help="database URL or SQLite file (default: $TUNEFLEET_DB or the per-user SQLite log)")
        if device:
            p.add_argument("--device-key", help="device key (default: this host's key)")

    tune = sub.add_parser("tune", help="tune a workload on this host")
    tune.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    tune.add_argument("--target", default="cpu", help="template family (default: cpu)")
    tune.add_argument("--strategy", default=DEFAULT_STRATEGY, choices=sorted(STRATEGIES))
    tune.add_argument("--trials", type=_positive_int, default=64,
                      help="distinct configs the log should hold for this workload and device (default 64); "
                      "re-running resumes")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--early-stopping", type=_positive_int, metavar="N",
                      help="stop after N trials without improvement")
    tune.add_argument("--parallel", type=_positive_int, default=1, help="build workers (default 1)")
    tune.add_argument("--number", type=_positive_int, default=1, help="calls per timed repeat (default 1)")
    tune.add_argument("--repeat", type=_positive_int, default=3, help="timed repeats (default 3)")
    tune.add_argument("--min-repeat-ms", type=_non_negative_float, default=50.0,
                      help="grow --number until one repeat lasts this long (default 50)")
    tune.add_argument("--timeout", type=_positive_float, default=20.0, help="run timeout per candidate, seconds")
    tune.add_argument("--build-timeout", type=_positive_float, default=120.0, help="build timeout per candidate, seconds")
    common(tune)
    tune.set_defaults(func=cmd_tune)

    best = sub.add_parser("best", help="the fastest recorded config of a workload on a device")
    best.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    best.add_argument("--target", default="cpu")
    best.add_argument("--top", type=_positive_int, default=1, help="show the K best")
    best.add_argument("--json", action="store_true", help="print JSON")
    common(best)
    best.set_defaults(func=cmd_best)

    show = sub.add_parser("show-kernel", help="print the kernel source of a config")
    show.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    show.add_argument("--target", default="cpu")
    which = show.add_mutually_exclusive_group(required=True)
    which.add_argument("--best", action="store_true", help="the best recorded config")
    which.add_argument("--config", help="a config as JSON, or 'default'")
    common(show)
    show.set_defaults(func=cmd_show_kernel)

    log = sub.add_parser("log", help="export or import the tuning log as JSON lines")
    log_sub = log.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    export = log_sub.add_parser("export", help="write one JSON object per trial per line to stdout")
    export.add_argument("--workload", help="only this workload")
    common(export)
    export.set_defaults(func=cmd_log_export)
    imp = log_sub.add_parser("import", help="read trials written by 'tuner log export'")
    imp.add_argument("file", help="JSON-lines file, or - for stdin")
    common(imp, device=False)
    imp.set_defaults(func=cmd_log_import)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        _fail(str(exc), exc.code)
    except KeyboardInterrupt:
        _fail("interrupted; measured results are in the log, re-run the same command to resume", 130)


if __name__ == "__main__":
    sys.exit(main())
