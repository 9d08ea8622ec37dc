"""``tuner verify``: build and run a template's configs on this host and compare them with the reference.

The default config and N random valid configs of a workload's space go through a :class:`Measurer`
(here a :class:`LocalMeasurer`: the real engine and its isolated build and run workers), which
checks every output against the operator's numpy reference. Each config gets a line with its
status and its largest absolute and relative error; any failure or mismatch makes the exit status
non-zero. :func:`verify_configs` takes any measurer, so a fleet measurer can verify on remote agents.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from measure_agent.device import DeviceInfo
from measure_agent.engine import MeasureInput, MeasureStatus, TimingConfig
from measure_agent.space import Config, ConfigSpace
from measure_agent.templates import Template, TemplateNotFound, default_catalog
from measure_agent.workload import Workload
from tuner.cli.common import (
    add_client_security_arguments,
    EXIT_FAILURE,
    WORKLOAD_HELP,
    CliError,
    non_negative_int,
    positive_float,
    positive_int,
    require_local_gpu,
    tracker_address,
    workload_arg,
)
from tuner.measure import Measurer, SyncMeasurer


@dataclass(frozen=True)
class VerifyRow:
    """One verified config: what the measurer said about it."""

    config: Config
    status: MeasureStatus
    max_abs_error: float | None  # None when there was no output to check (build or run failure)
    max_rel_error: float | None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is MeasureStatus.OK


def verify_configs(measurer: Measurer, workload: Workload, target: str, configs: Sequence[Config]) -> list[VerifyRow]:
    """Build, run and check ``configs`` on ``measurer``'s device; one row per config, in order."""
    items = [MeasureInput(workload, config, target) for config in configs]
    results = measurer.measure(items)
    rows = []
    for item, result in zip(items, results):
        rows.append(VerifyRow(
            config=item.config,
            status=result.status,
            max_abs_error=_number(result.details.get("max_abs_error")),
            max_rel_error=_number(result.details.get("max_rel_error")),
            message=result.message,
        ))
    return rows


def choose_configs(template: Template, workload: Workload, space: ConfigSpace, samples: int,
                   seed: int) -> list[tuple[str, Config]]:
    """The default config and up to ``samples`` distinct random valid others, labelled."""
    default = template.default_config(workload, space)
    chosen = [("default", default)]
    seen = {default.digest}
    rng = np.random.default_rng(seed)
    for _ in range(samples * 20):
        if len(chosen) > samples:
            break
        config = space.sample(rng, 1)[0]
        if config.digest not in seen:
            seen.add(config.digest)
            chosen.append((f"random {len(chosen)}", config))
    return chosen


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
    p.add_argument("--tracker", type=tracker_address, metavar="HOST:PORT",
                   help="verify on fleet agents instead of this host")
    p.add_argument("--rpc-key", metavar="KEY", help="device key of the fleet agents (with --tracker)")
    add_client_security_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.measure import LocalMeasurer

    workload = workload_arg(args.workload)
    if args.tracker or args.rpc_key:
        if not (args.tracker and args.rpc_key):
            raise CliError("verify on a fleet needs both --tracker and --rpc-key")
        return _run_on_fleet(args, workload)
    try:
        template = default_catalog().get(workload.op, args.target)
    except TemplateNotFound as exc:
        raise CliError(str(exc)) from None
    require_local_gpu(template.target)
    try:
        timing = TimingConfig(number=1, repeat=1, min_repeat_ms=0.0, warmup=1,
                              build_timeout_s=args.build_timeout, run_timeout_s=args.timeout)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    with LocalMeasurer(timing, build_workers=args.parallel) as measurer:
        # the space of the measuring device: the one its workers validate against
        device = DeviceInfo.from_json(measurer.device_info)
        space = template.space(workload, device)
        chosen = choose_configs(template, workload, space, args.samples, args.seed)
        print(f"verify {workload.key} on {measurer.device_key}, target {args.target}: the default config and "
              f"{len(chosen) - 1} random ones (seed {args.seed})", flush=True)
        rows = verify_configs(measurer, workload, args.target, [config for _, config in chosen])
    return report(rows, [label for label, _ in chosen])


class _FleetVerifyMeasurer(SyncMeasurer):
    """Measures listed configs once on agents of a key, through the daemon (nothing is logged)."""

    agent_name = "fleet"

    def __init__(self, client, device_key: str, target: str, timing: TimingConfig, device_info: dict) -> None:
        super().__init__()
        self.client, self.device_key, self.target, self.timing = client, device_key, target, timing
        self.device_info = device_info
        self.template_version = ""

    def measure_now(self, items):
        from measure_agent.protocol.convert import result_from_proto

        if not items:
            return []
        reply = self.client.measure(items[0].workload.key, self.device_key, [i.config.json_text() for i in items],
                                    target=self.target, timing=self.timing)
        return [result_from_proto(m) for m in reply.measurements]


def _run_on_fleet(args: argparse.Namespace, workload) -> int:
    from measure_agent.protocol.convert import capabilities_to_json
    from measure_agent.protocol.errors import FleetError, InvalidRequest
    from tuner.cli.common import fleet_client
    from tuner.steering import SteeringError, parse_target

    try:
        family = parse_target(args.target).family
        template = default_catalog().get(workload.op, family)
        timing = TimingConfig(number=1, repeat=1, min_repeat_ms=0.0, warmup=1,
                              build_timeout_s=args.build_timeout, run_timeout_s=args.timeout)
    except (SteeringError, TemplateNotFound, ValueError) as exc:
        raise CliError(str(exc)) from None
    with fleet_client(args) as client:
        try:
            agents = [a for a in client.agents().agents if a.key == args.rpc_key]
            if not agents:
                raise CliError(f"no agent of key {args.rpc_key} is connected to {args.tracker}", EXIT_FAILURE)
            info = capabilities_to_json(agents[0].capabilities)
            space = template.space(workload, DeviceInfo.from_json(info))
            chosen = choose_configs(template, workload, space, args.samples, args.seed)
            print(f"verify {workload.key} on fleet key {args.rpc_key} ({len(agents)} agents), target {args.target}: "
                  f"the default config and {len(chosen) - 1} random ones (seed {args.seed})", flush=True)
            measurer = _FleetVerifyMeasurer(client, args.rpc_key, args.target, timing, info)
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


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _error(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    return f"{value:.3g}"

