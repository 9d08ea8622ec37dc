"""``tuner tune``: run a tuning job (on this host, or on a fleet) with a progress bar."""

from __future__ import annotations

import argparse

from measure_agent.arguments import device_key_type
from measure_agent.engine import TimingConfig
from measure_agent.protocol.errors import FleetError, InvalidRequest
from measure_agent.templates import TemplateNotFound, default_catalog
from tuner.cli.common import (
    EXIT_FAILURE,
    WORKLOAD_HELP,
    CliError,
    add_client_security_arguments,
    add_db_arguments,
    add_tracker_argument,
    int32,
    non_negative_float,
    non_negative_int,
    opened_fleet,
    positive_float,
    positive_int32,
    share_fraction,
    workload_arg,
)
from tuner.cli.jobs_view import print_summary, watch_with_progress
from tuner.fleet import JobSpec, JobStatus
from tuner.search import DEFAULT_STRATEGY, STRATEGIES


def add_search_arguments(p: argparse.ArgumentParser, jobs: str = "a job") -> None:
    """How each job searches and measures: shared by ``tune``, ``submit`` and ``tune-model``."""
    p.add_argument("--target", default="cpu",
                   help='cpu, cuda, or a TVM-style target such as "cuda -arch=sm_72" or "llvm -mattr=+avx2" '
                   "(on a fleet, only matching agents measure); default cpu")
    p.add_argument("--strategy", default=DEFAULT_STRATEGY, choices=sorted(STRATEGIES))
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--number", type=positive_int32, default=1, help="calls per timed repeat (default 1)")
    p.add_argument("--repeat", type=positive_int32, default=3, help="timed repeats (default 3)")
    p.add_argument("--min-repeat-ms", type=non_negative_float, default=50.0,
                   help="grow --number until one repeat lasts this long (default 50)")
    p.add_argument("--timeout", type=positive_float, default=20.0, help="run timeout per candidate, seconds (default 20)")
    p.add_argument("--build-timeout", type=positive_float, default=120.0,
                   help="build timeout per candidate, seconds (default 120)")
    p.add_argument("--priority", type=int32, default=0, help="fleet jobs of higher priority are served first")
    p.add_argument("--wait-timeout", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help=f"fail {jobs} when no agent of the key is present for this long (default: wait)")


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """What a job is: shared by ``tune`` and ``submit``."""
    p.add_argument("--workload", required=True,
                   help=WORKLOAD_HELP + "; a size may be a range LOW..HIGH (e.g. M=1..512) to tune a family of shapes")
    p.add_argument("--trials", type=positive_int32, default=64,
                   help="distinct configs the log should hold for this workload and device when done "
                   "(default 64); re-running the same command resumes")
    p.add_argument("--early-stopping", type=positive_int32, metavar="N", help="stop after N trials without improvement")
    p.add_argument("--time-budget", type=positive_float, metavar="SECONDS",
                   help="propose no new candidates after this much wall time (what is in flight is finished and "
                   "recorded); re-running resumes")
    p.add_argument("--no-transfer", dest="transfer", action="store_false",
                   help="do not start from the log's records of other shapes and devices of the operator")
    p.add_argument("--reuse-share", type=share_fraction, default=0.0, metavar="FRACTION",
                   help="share of each batch (0 to below 1; default 0) given to runtime variants of the best "
                   "kernels measured so far, which need no compile: tuning is faster where compiles dominate")
    add_search_arguments(p, "the job")
    p.add_argument("--pin", action="append", default=[], metavar="KNOB=VALUE",
                   help="fix a knob (repeatable); VALUE as JSON, e.g. --pin parallel=true --pin tile_n=[4,1,16]; "
                   "see 'tuner space' for the knobs")
    p.add_argument("--constraint", action="append", default=[], metavar="EXPR",
                   help='narrow the space (repeatable), e.g. "tile_m * tile_n <= 4096"; a split knob stands for '
                   "its tile size")


def add_local_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """Where a command measures: a fleet (``--tracker``, ``--rpc-key``) or this host (``--parallel``)."""
    p.add_argument("--parallel", type=positive_int32, default=1, help="build workers of the local agent (default 1)")
    add_tracker_argument(p, "the daemon; without it, measure on this host (a configured one is used with "
                            "--rpc-key)", local_unless_rpc_key=True)
    p.add_argument("--rpc-key", metavar="KEY", type=device_key_type,
                   help="device key of the fleet agents to use (with --tracker)")
    add_client_security_arguments(p)


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="tune a workload on this host, or on a fleet with --tracker")
    add_job_arguments(p)
    add_local_fleet_arguments(p)
    add_db_arguments(p)
    p.set_defaults(func=run)


def timing_from_args(args: argparse.Namespace) -> TimingConfig:
    try:
        return TimingConfig(number=args.number, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                            build_timeout_s=args.build_timeout, run_timeout_s=args.timeout)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def search_spec_from_args(args: argparse.Namespace, workload: str, device_key: str, **fields) -> JobSpec:
    """The :class:`JobSpec` of the search and timing options of ``args`` (:func:`add_search_arguments`);
    ``fields`` sets the rest."""
    return JobSpec(workload=workload, device_key=device_key, target=args.target, strategy=args.strategy,
                   seed=args.seed, priority=args.priority, timing=timing_from_args(args),
                   wait_timeout_s=args.wait_timeout, **fields)


def job_spec_from_args(args: argparse.Namespace, workload: str, device_key: str, family: str = "") -> JobSpec:
    """The :class:`JobSpec` of ``tune``/``submit`` arguments (:func:`add_job_arguments`)."""
    return search_spec_from_args(args, workload, device_key, trials=args.trials,
                                 early_stopping=args.early_stopping, pins=tuple(args.pin),
                                 constraints=tuple(args.constraint), family=family, transfer=args.transfer,
                                 time_budget_s=args.time_budget, reuse_share=args.reuse_share)


def run(args: argparse.Namespace) -> int:
    from tuner.steering import SteeringError, parse_target

    workloads, family = _workloads(args.workload)
    timing_from_args(args)  # bad timing is a usage error before anything starts
    if not args.tracker:  # on a fleet, the daemon validates against its own templates
        try:
            default_catalog().get(workloads[0].op, parse_target(args.target).family)
        except (SteeringError, TemplateNotFound) as exc:
            raise CliError(str(exc)) from None
    with opened_fleet(args, "tune", args.target) as fleet:
        return _run_jobs(fleet.client, workloads, family, fleet.device_key, args)


def _workloads(text: str):
    """The workloads to tune: one, or the representative shapes of a range (a family)."""
    from measure_agent.workload import WorkloadError
    from measure_agent.workload.family import is_family, parse_family

    if not is_family(text):
        return [workload_arg(text)], None
    try:
        family = parse_family(text)
    except WorkloadError as exc:
        raise CliError(str(exc)) from None
    shapes = family.representatives()
    if not shapes:
        raise CliError(f"no valid shape in the range {family.key}")
    return shapes, family


def _run_jobs(client, workloads, family, device_key: str, args: argparse.Namespace) -> int:
    if family is not None:
        print(f"shape range {family.key}: tuning {len(workloads)} representative shapes "
              f"({', '.join(w.key for w in workloads)})", flush=True)
    worst = 0
    for workload in workloads:
        spec = job_spec_from_args(args, workload.key, device_key, family.key if family else "")
        worst = max(worst, run_job(client, spec))
    if family is not None:
        print(f"family {family.key} recorded: any shape in the range is served by the nearest representative")
    return worst


def submit_job(client, spec: JobSpec) -> JobStatus:
    """Submit ``spec``; a job the daemon refuses is a usage error (exit 2), a lost daemon exit 1."""
    try:
        return client.submit(spec)
    except InvalidRequest as exc:
        raise CliError(str(exc)) from None
    except FleetError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None


def run_job(client, spec: JobSpec) -> int:
    """Submit ``spec``, follow it with a progress bar and print its summary; the exit code."""
    status = submit_job(client, spec)
    try:
        final = watch_with_progress(client, status)
    except KeyboardInterrupt:
        client.cancel(status.job_id)
        raise
    return print_summary(final)
