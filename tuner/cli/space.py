"""``tuner space``: the knobs of a template, their choices, its constraints and size."""

from __future__ import annotations

import argparse
import json

from measure_agent.space import SplitKnob
from measure_agent.templates import TemplateNotFound, default_catalog
from tuner.cli.common import WORKLOAD_HELP, CliError, workload_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("space", help="show the knobs, choices, constraints and size of a workload's space")
    p.add_argument("--workload", required=True, help=WORKLOAD_HELP)
    p.add_argument("--target", default="cpu", help="cpu, cuda or a TVM-style target string (default cpu)")
    p.add_argument("--pin", action="append", default=[], metavar="KNOB=VALUE", help="show the space with this pin")
    p.add_argument("--constraint", action="append", default=[], metavar="EXPR", help="show it with this constraint")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from measure_agent.device import detect_device
    from tuner.steering import SteeringError, parse_pin, parse_target, steer_space

    workload = workload_arg(args.workload)
    try:
        target = parse_target(args.target)
        template = default_catalog().get(workload.op, target.family)
        full = template.space(workload, detect_device() if target.family == "cpu" else None)
        space = steer_space(full, tuple(parse_pin(p) for p in args.pin), tuple(args.constraint))
    except (SteeringError, TemplateNotFound) as exc:
        raise CliError(str(exc)) from None
    default = template.default_config(workload, full)
    knobs = [
        {
            "name": k.name,
            "kind": "split" if isinstance(k, SplitKnob) else ("bool" if k.values == (False, True) else "choice"),
            "choices": [list(v) if isinstance(v, tuple) else v for v in k.values],
            "default": default.to_json()[k.name],
        }
        for k in space.knobs
    ]
    size = _size(space)
    if args.json:
        print(json.dumps({"workload": workload.key, "target": target.text, "template_version": template.version,
                          "knobs": knobs, "constraints": [c.description for c in space.constraints],
                          "size": size, "product_size": space.product_size}, sort_keys=True))
        return 0
    print(f"{workload.key} on {target.text} (template {template.op}/{template.target} v{template.version})")
    for knob in knobs:
        shown = knob["choices"] if len(knob["choices"]) <= 16 else knob["choices"][:16] + ["..."]
        print(f"  {knob['name']:<14} {knob['kind']:<6} default {json.dumps(knob['default']):<14} "
              f"{len(knob['choices'])} choices: {json.dumps(shown)}")
    if any(isinstance(k, SplitKnob) for k in space.knobs):
        print("  (a split value is [outer, ..., inner]; in --constraint its name stands for the tile size)")
    for description in (c.description for c in space.constraints):
        print(f"  constraint: {description}")
    print(f"  size: {size} valid configs of {space.product_size} combinations")
    return 0


def _size(space) -> int | str:
    try:
        return space.size
    except OverflowError:
        return "too many to count"
