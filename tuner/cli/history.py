"""``tuner history``: the trials recorded for a workload."""

from __future__ import annotations

import argparse
import json

from tuner.cli.common import WORKLOAD_HELP, add_db_arguments, open_log, positive_int, workload_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("history", help="list the trials recorded for a workload",
                              description="List the trials recorded for a workload, oldest first (the most "
                              "recent --limit of them), on every device unless --device-key is given.")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", help="only this target")
    p.add_argument("--status", help="only trials with this status (ok, compile_error, ...)")
    p.add_argument("--limit", type=positive_int, default=50, help="show the N most recent trials (default 50)")
    p.add_argument("--json", action="store_true", help="print a JSON list (trials as in 'tuner log export')")
    add_db_arguments(p, device=False)
    p.add_argument("--device-key", help="only this device; a glob such as 'x86_64-*' matches several")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.cli.common import CliError
    from tuner.log import TRIAL_STATUSES

    workload = workload_arg(args.workload)
    if args.status is not None and args.status not in TRIAL_STATUSES:
        raise CliError(f"status {args.status!r} is not one of {', '.join(TRIAL_STATUSES)}")
    with open_log(args.db, existing=True) as log:
        keys = log.resolve_device_keys(args.device_key) if args.device_key else None
        records = log.trials(workload.key, keys, args.target, args.status, limit=args.limit)
        total = log.count_trials(workload.key, keys, args.target, args.status)
    if args.json:
        print(json.dumps([{k: v for k, v in r.to_json().items() if k not in ("format", "version", "device_info")}
                          for r in records], sort_keys=True))
        return 0
    if not records:
        print(f"no trials of {workload.key}" + (f" on {args.device_key}" if args.device_key else ""))
        return 0
    for r in records:
        time = f"{r.mean_s * 1e3:10.4f} ms {workload.flops / r.mean_s / 1e9:8.2f} GFLOPS" if r.mean_s else f"{'-':>13} {'-':>15}"
        print(f"{r.created_at.strftime('%Y-%m-%d %H:%M:%S')}  {r.device_key}  {r.target}  {r.status:<14} {time}  "
              f"{json.dumps(r.config, sort_keys=True)}")
    shown = f"the {len(records)} most recent of {total}" if total > len(records) else f"{total}"
    print(f"{shown} trials of {workload.key}")
    return 0
