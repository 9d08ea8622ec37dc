"""``tuner show-kernel``: print the kernel source a config renders to."""

from __future__ import annotations

import argparse
import sys

from measure_agent.device import detect_device
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateNotFound, default_catalog
from tuner.cli.common import (
    EXIT_FAILURE,
    WORKLOAD_HELP,
    CliError,
    add_db_arguments,
    local_device_key,
    open_log,
    workload_arg,
)


def register(subparsers) -> None:
    p = subparsers.add_parser("show-kernel", help="print the kernel source of a config")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--best", action="store_true", help="the best recorded config on the device")
    which.add_argument("--config", help="a config as JSON, or 'default'")
    add_db_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload = workload_arg(args.workload)
    try:
        template = default_catalog().get(workload.op, args.target)
    except TemplateNotFound as exc:
        raise CliError(str(exc)) from None
    from tuner.log.lookup import recorded_device

    # A config belongs to the space of its device (register tiles follow the ISA): with --best or
    # --device-key, the device the log recorded for the key; otherwise this host.
    device_key = args.device_key or local_device_key()
    if args.best or args.device_key:
        with open_log(args.db, existing=True) as log:
            records = log.best(workload.key, device_key, args.target, top=1) if args.best else []
            device = recorded_device(log, device_key)
    else:
        device = detect_device()
    space = template.space(workload, device)
    if args.best:
        if not records:
            raise CliError(f"no tuned config of {workload.key} on {device_key}; tune it first or use --config default",
                           EXIT_FAILURE)
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
    sys.stdout.write(source.text if source.text.endswith("\n") else source.text + "\n")
    if source.runtime_args:
        print(f"# called as {source.entry}(*inputs, out, *{list(source.runtime_args)})")
    return 0
