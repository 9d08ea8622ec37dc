"""The ``tuner`` command line: one module per command group, each with a ``register(subparsers)``."""

from __future__ import annotations

import argparse
import sys

from tuner.cli import best, daemon, db, fleet, history, kernel, logfile, strategies, tune
from tuner.cli.common import CliError

COMMAND_MODULES = (tune, best, kernel, logfile, daemon, fleet, db, history, strategies)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="tunefleet: auto-tune tensor kernels, record results, query the best configs.",
        epilog="Workloads: OP(NAME=SIZE,...), e.g. matmul(M=512,N=512,K=512); dtype defaults to float32. "
        "The tuning log is SQLite at ~/.local/share/tunefleet/tuning.db unless --db or TUNEFLEET_DB says otherwise.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("tuner: interrupted; measured results are in the log, re-run the same command to resume", file=sys.stderr)
        return 130
