"""``tuner best``: the fastest recorded configs of a workload on a device."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from tuner.cli.common import (
    EXIT_FAILURE,
    WORKLOAD_HELP,
    CliError,
    add_db_arguments,
    local_device_key,
    open_log,
    positive_int,
    workload_arg,
)

if TYPE_CHECKING:
    from tuner.log import BestConfig

DEVICE_KEY_HELP = ("device key (default: this host: its detected key and every key under which the log recorded "
                   "a device of the same identity, e.g. a fleet's --rpc-key); a glob such as 'x86_64-*' ranks "
                   "the trials of all matching devices together")
NEAREST_HELP = (
    "if the workload was never tuned on the device, use the nearest tuned workload of the same operator and "
    "dtype: smallest log-distance over sizes, sqrt(sum(log2(a/b)^2)), whose config is valid for this shape "
    "(split tiles are kept, their outer counts recomputed). Flagged approximate."
)


def register(subparsers) -> None:
    p = subparsers.add_parser("best", help="the fastest recorded config of a workload on a device",
                              description="The fastest recorded configs of a workload on a device.")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu")
    p.add_argument("--top", type=positive_int, default=1, help="show the K best (JSON: a list when K > 1)")
    p.add_argument("--nearest", action="store_true", help=NEAREST_HELP)
    p.add_argument("--json", action="store_true",
                   help="print JSON (with 'approximate' and 'tuned_workload'; approximate results add 'distance')")
    add_db_arguments(p, device=False)
    p.add_argument("--device-key", help=DEVICE_KEY_HELP)
    p.set_defaults(func=run)


def best_config_of(args: argparse.Namespace, top: int = 1) -> BestConfig:
    """The best config for ``--workload``, ``--device-key``, ``--target``, ``--nearest`` and ``--db``,
    as ``tuner best`` and ``tuner show-kernel --best`` both answer; one-line errors when there is none."""
    from measure_agent.templates import TemplateNotFound
    from tuner.log import resolve_best_config

    workload = workload_arg(args.workload)
    device_key = args.device_key or local_device_key()
    identity = None if args.device_key else device_key  # this host: also its keys on a fleet
    with open_log(args.db, existing=True) as log:
        try:
            best = resolve_best_config(log, workload, device_key, args.target, nearest=args.nearest, top=top,
                                       device_identity=identity)
        except TemplateNotFound as exc:
            raise CliError(str(exc)) from None
    if best.found:
        return best
    keys = list(best.device_keys)
    devices = f"device {device_key}" if keys == [device_key] else f"devices matching {device_key} ({len(keys)})"
    if best.rejected is not None:
        raise CliError(f"the tuned configs of {workload.key} on {devices} (target {args.target}) are not valid "
                       f"for the installed {workload.op} template (tuned with another version?)", EXIT_FAILURE)
    nearby = f"; no tuned {workload.op}/{workload.dtype} workload has a config valid for it" if args.nearest else ""
    raise CliError(f"no successful trial of {workload.key} on {devices} (target {args.target}){nearby}", EXIT_FAILURE)


def run(args: argparse.Namespace) -> int:
    best = best_config_of(args, args.top)
    rows = [m.to_json() for m in best.matches]
    if args.json:
        print(json.dumps(rows[0] if args.top == 1 else rows, sort_keys=True))
        return 0
    for rank, (match, row) in enumerate(zip(best.matches, rows), 1):
        gflops = f"{row['gflops']:.2f} GFLOPS" if row["gflops"] else "- GFLOPS"
        device = f"  {match.device_key}" if len(best.device_keys) > 1 else ""
        print(f"#{rank} {row['mean_s'] * 1e3:.4f} ms  {gflops}{device}  {json.dumps(row['config'], sort_keys=True)}")
    first, workload = best.match, best.workload
    if best.kind == "family":
        print(f"RANGE: {workload.key} is in the tuned range {first.family}; served by the config tuned for its "
              f"nearest representative {first.tuned_workload} (log-distance {first.distance:.2f}); "
              "times are that workload's")
    elif best.kind == "approximate":
        print(f"APPROXIMATE: {workload.key} was never tuned on {best.device_key}; these configs were tuned for "
              f"{first.tuned_workload} (nearest tuned shape, log-distance {first.distance:.2f}); "
              "times are that workload's")
    else:
        print(f"workload {workload.key} on {best.device_key} ({best.target})")
        if first.device_key != best.device_key and args.device_key is None:
            print(f"FROM KEY {first.device_key}: {best.why}")
    return 0
