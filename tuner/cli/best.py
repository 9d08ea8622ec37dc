"""``tuner best``: the fastest recorded configs of a workload on a device."""

from __future__ import annotations

import argparse
import json

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


def register(subparsers) -> None:
    p = subparsers.add_parser("best", help="the fastest recorded config of a workload on a device")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu")
    p.add_argument("--top", type=positive_int, default=1, help="show the K best (JSON: a list when K > 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_db_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.job import gflops

    workload = workload_arg(args.workload)
    device_key = args.device_key or local_device_key()
    with open_log(args.db) as log:
        records = log.best(workload.key, device_key, args.target, top=args.top)
    if not records:
        raise CliError(f"no successful trial of {workload.key} on device {device_key} (target {args.target})",
                       EXIT_FAILURE)
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
