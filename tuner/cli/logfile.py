"""``tuner log export|import``: the tuning log as JSON lines."""

from __future__ import annotations

import argparse
import sys

from tuner.cli.common import CliError, add_db_arguments, open_log, workload_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("log", help="export or import the tuning log as JSON lines")
    actions = p.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write one JSON object per trial per line to stdout")
    export.add_argument("--workload", help="only this workload")
    add_db_arguments(export)
    export.set_defaults(func=run_export)
    imp = actions.add_parser("import", help="read trials written by 'tuner log export' (all or nothing)")
    imp.add_argument("file", help="JSON-lines file, or - for stdin")
    add_db_arguments(imp, device=False)
    imp.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from tuner.log import export_trials

    workload_key = workload_arg(args.workload).key if args.workload else None
    with open_log(args.db) as log:
        export_trials(log, sys.stdout, workload_key=workload_key, device_key=args.device_key)
    return 0


def run_import(args: argparse.Namespace) -> int:
    from tuner.log import LogFormatError, import_trials

    try:
        fh = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    with fh, open_log(args.db) as log:
        try:
            summary = import_trials(log, fh)
        except LogFormatError as exc:
            raise CliError(f"{args.file}: {exc}; nothing imported") from None
    print(f"read {summary.read} trials: {summary.inserted} imported, {summary.duplicates} already present")
    return 0
