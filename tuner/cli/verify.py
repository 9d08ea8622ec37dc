"""``tuner verify``: build and run a template's configs and compare them with the reference.

The procedure is :mod:`tuner.measure.verify`; this command opens the fleet (``--tracker``) or the
embedded daemon with a local agent, as ``tune`` does, and prints one line per config with its status
and its largest absolute and relative error. Any failure or mismatch makes the exit status non-zero.
Nothing is recorded in the tuning log.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Sequence

from measure_agent.arguments import device_key_type
from measure_agent.protocol.errors import FleetError, InvalidRequest
from measure_agent.templates import TemplateNotFound, default_catalog
from tuner.cli.common import (
    EXIT_FAILURE,
    WORKLOAD_HELP,
    CliError,
    add_client_security_arguments,
    add_tracker_argument,
    non_negative_int,
    opened_fleet,
    positive_float,
    positive_int,
    workload_arg,
)
from tuner.measure.verify import FleetVerifyMeasurer, VerifyRow, choose_configs, verify_configs, verify_timing


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "verify", help="check the default and random configs of a template against the reference on this host",
        description="Build and run the default config and N random valid configs of a workload on this host "
        "(through the measurement engine), compare each output with the numpy reference and print the errors. "
        "Exits 1 when any config fails or differs.")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu", help="template family: cpu or cuda (default: cpu)")
    p.add_argument("--samples", type=non_negative_int, default=3, help="random configs besides the default (default 3)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random configs (default 0)")
    p.add_argument("--parallel", type=positive_int, default=1, help="build workers (default 1)")
    p.add_argument("--timeout", type=positive_float, default=60.0, help="run timeout per config, seconds (default 60)")
    p.add_argument("--build-timeout", type=positive_float, default=300.0,
                   help="build timeout per config, seconds (default 300)")
    add_tracker_argument(p, "verify on fleet agents instead of this host (a configured one is used with "
                            "--rpc-key)", local_unless_rpc_key=True)
    p.add_argument("--rpc-key", metavar="KEY", type=device_key_type,
                   help="device key of the fleet agents (with --tracker)")
    add_client_security_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload = workload_arg(args.workload)
    if (args.tracker or args.rpc_key) and not (args.tracker and args.rpc_key):
        raise CliError("verify on a fleet needs both --tracker and --rpc-key")
    try:
        template = default_catalog().get(workload.op, args.target)  # --target is a template family here
        family = template.target
        timing = verify_timing(args.build_timeout, args.timeout)
    except (TemplateNotFound, ValueError) as exc:
        raise CliError(str(exc)) from None
    # the embedded daemon needs a log; verifying records nothing, so a throw-away one
    with tempfile.TemporaryDirectory(prefix="tunefleet-verify-") as scratch:
        with opened_fleet(args, "verify", args.target, db=str(Path(scratch) / "verify.db")) as fleet:
            try:
                agents = fleet.client.agents().agents_of(fleet.device_key)
                if not agents:
                    raise CliError(f"no agent of key {fleet.device_key} is connected to {args.tracker}", EXIT_FAILURE)
                # the space of the measuring device: the one its workers validate against
                space = template.space(workload, agents[0].device)
                chosen = choose_configs(template, workload, space, args.samples, args.seed)
                where = fleet.device_key if fleet.embedded else f"fleet key {fleet.device_key} ({len(agents)} agents)"
                print(f"verify {workload.key} on {where}, target {args.target}: the default config and "
                      f"{len(chosen) - 1} random ones (seed {args.seed})", flush=True)
                measurer = FleetVerifyMeasurer(fleet.client, fleet.device_key, args.target, timing,
                                               agents[0].device_info)
                rows = verify_configs(measurer, workload, family, [config for _, config in chosen])
            except InvalidRequest as exc:
                raise CliError(str(exc)) from None
            except FleetError as exc:
                raise CliError(str(exc), EXIT_FAILURE) from None
    return report(rows, [label for label, _ in chosen])


def report(rows: Sequence[VerifyRow], labels: Sequence[str]) -> int:
    """Print one line per row and a summary; the exit status (0 when every config matched)."""
    width = max([len(label) for label in labels] + [6])
    print(f"{'config':<{width}}  {'status':<14} {'max abs err':>11}  {'max rel err':>11}  knobs")
    for label, row in zip(labels, rows):
        print(f"{label:<{width}}  {row.status.value:<14} {_error(row.max_abs_error):>11}  "
              f"{_error(row.max_rel_error):>11}  {json.dumps(row.config.to_json(), sort_keys=True)}")
        if not row.ok and row.message:
            print(f"{'':<{width}}  {row.message}")
    failed = [(label, row) for label, row in zip(labels, rows) if not row.ok]
    if not failed:
        print(f"all {len(rows)} configs match the reference")
        return 0
    listed = ", ".join(f"{label} ({row.status.value})" for label, row in failed)
    print(f"{len(failed)} of {len(rows)} configs failed: {listed}")
    return EXIT_FAILURE


def _error(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    return f"{value:.3g}"

