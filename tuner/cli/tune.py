"""``tuner tune``: run a tuning job (on this host, or on a fleet) with a progress bar."""

from __future__ import annotations

import argparse

from measure_agent.engine import TimingConfig
from measure_agent.protocol.errors import FleetError
from measure_agent.templates import TemplateNotFound, default_catalog
from tuner.cli.common import (
    EXIT_FAILURE,
    WORKLOAD_HELP,
    CliError,
    add_client_security_arguments,
    add_db_arguments,
    fleet_client,
    local_device_key,
    non_negative_float,
    open_log,
    positive_float,
    positive_int,
    workload_arg,
)
from tuner.cli.jobs_view import print_summary, submit_arguments, watch_with_progress
from tuner.search import DEFAULT_STRATEGY, STRATEGIES


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """What a job is: shared by ``tune`` and ``submit``."""
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu", help="template family (default: cpu)")
    p.add_argument("--strategy", default=DEFAULT_STRATEGY, choices=sorted(STRATEGIES))
    p.add_argument("--trials", type=positive_int, default=64,
                   help="distinct configs the log should hold for this workload and device when done "
                   "(default 64); re-running the same command resumes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--early-stopping", type=positive_int, metavar="N", help="stop after N trials without improvement")
    p.add_argument("--number", type=positive_int, default=1, help="calls per timed repeat (default 1)")
    p.add_argument("--repeat", type=positive_int, default=3, help="timed repeats (default 3)")
    p.add_argument("--min-repeat-ms", type=non_negative_float, default=50.0,
                   help="grow --number until one repeat lasts this long (default 50)")
    p.add_argument("--timeout", type=positive_float, default=20.0, help="run timeout per candidate, seconds (default 20)")
    p.add_argument("--build-timeout", type=positive_float, default=120.0,
                   help="build timeout per candidate, seconds (default 120)")
    p.add_argument("--priority", type=int, default=0, help="fleet jobs of higher priority are served first")
    p.add_argument("--wait-timeout", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="fail when no agent of the key is present for this long (default: wait)")


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="tune a workload on this host, or on a fleet with --tracker")
    add_job_arguments(p)
    p.add_argument("--parallel", type=positive_int, default=1, help="build workers of the local agent (default 1)")
    p.add_argument("--tracker", metavar="HOST:PORT", help="the daemon; without it, tune on this host")
    p.add_argument("--rpc-key", metavar="KEY", help="device key of the fleet agents to use (with --tracker)")
    add_client_security_arguments(p)
    add_db_arguments(p)
    p.set_defaults(func=run)


def timing_from_args(args: argparse.Namespace) -> TimingConfig:
    try:
        return TimingConfig(number=args.number, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                            build_timeout_s=args.build_timeout, run_timeout_s=args.timeout)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from tuner.daemon import FleetClient

    workload = workload_arg(args.workload)
    timing = timing_from_args(args)
    if args.tracker:  # the daemon validates against its own templates
        if not args.rpc_key:
            raise CliError("--tracker needs --rpc-key KEY: the device key of the agents to use")
        with fleet_client(args) as client:
            return _run_job(client, workload, args.rpc_key, args, timing)
    from tuner.daemon.embedded import local_fleet

    try:
        default_catalog().get(workload.op, args.target)
    except TemplateNotFound as exc:
        raise CliError(str(exc)) from None
    device_key = args.device_key or local_device_key()
    with open_log(args.db) as log, local_fleet(log, device_key, parallel=args.parallel) as daemon:
        with FleetClient(daemon.address) as client:
            return _run_job(client, workload, device_key, args, timing)


def _run_job(client, workload, device_key: str, args: argparse.Namespace, timing: TimingConfig) -> int:
    try:
        status = client.submit(**submit_arguments(workload, device_key, args, timing))
    except FleetError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    try:
        final = watch_with_progress(client, status)
    except KeyboardInterrupt:
        client.cancel(status.job_id)
        raise
    return print_summary(final)
