"""``tuner show-kernel``: print the kernel source a config renders to."""

from __future__ import annotations

import argparse
import sys

from measure_agent.space import ConfigError
from measure_agent.templates import TemplateNotFound, default_catalog
from tuner.cli.best import DEVICE_KEY_HELP, NEAREST_HELP, best_config_of
from tuner.cli.common import WORKLOAD_HELP, CliError, add_db_arguments, open_log, workload_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("show-kernel", help="print the kernel source of a config")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--best", action="store_true",
                       help="the config 'tuner best' gives (with the same --device-key, --nearest and --db)")
    which.add_argument("--config", help="a config as JSON, or 'default'")
    p.add_argument("--nearest", action="store_true", help=f"with --best: {NEAREST_HELP}")
    add_db_arguments(p, device=False)
    p.add_argument("--device-key", help=DEVICE_KEY_HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload = workload_arg(args.workload)
    try:
        template = default_catalog().get(workload.op, args.target)
    except TemplateNotFound as exc:
        raise CliError(str(exc)) from None
    if args.best:
        best = best_config_of(args)
        if best.approximate:  # stdout stays the kernel source alone
            print(f"tuner: note: {best.why}", file=sys.stderr)
        # the resolver checked it in the space of the device that measured it
        device, config_json = best.tuned_on, best.config
    else:
        # A config belongs to the space of its device (register tiles follow the ISA): with
        # --device-key, the device the log recorded for the key; otherwise this host.
        device = _recorded_device(args) if args.device_key else _this_host()
        config_json = args.config
    space = default_catalog().space(workload, args.target, device)
    if config_json == "default":
        config_json = template.default_config(workload, space).to_json()
    try:
        config = space.from_json(config_json)
    except ConfigError as exc:
        raise CliError(f"invalid config for {workload.op}/{args.target}: {exc}") from None
    source = template.render(workload, config)
    sys.stdout.write(source.text if source.text.endswith("\n") else source.text + "\n")
    if source.runtime_args:
        print(f"# called as {source.entry}(*inputs, out, *{list(source.runtime_args)})")
    return 0


def _recorded_device(args: argparse.Namespace):
    from tuner.log.best_config import recorded_device

    with open_log(args.db, existing=True) as log:
        return recorded_device(log, args.device_key)


def _this_host():
    from measure_agent.device import detect_device

    return detect_device()
