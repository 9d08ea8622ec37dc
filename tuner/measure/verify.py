"""Verifying templates: build and run configs on a device and compare each output with the reference.

The default config and N random valid configs of a workload's space (:func:`choose_configs`) go
through any :class:`~tuner.measure.Measurer` (:func:`verify_configs`); the engine checks every
output against the operator's numpy reference, so each :class:`VerifyRow` carries its status and
its largest absolute and relative error. :class:`FleetVerifyMeasurer` measures through a daemon's
client, on fleet agents or the embedded local one, without recording anything in the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.space import Config, ConfigSpace
from measure_agent.templates import Template
from measure_agent.workload import Workload
from tuner.measure.base import Measurer, SyncMeasurer

def verify_timing(build_timeout_s: float, run_timeout_s: float) -> TimingConfig:
    """How a verification run measures: it checks answers and does not time them, so one call after
    one warm-up. Raises ``ValueError`` for bad timeouts."""
    return TimingConfig(number=1, repeat=1, min_repeat_ms=0.0, warmup=1, build_timeout_s=build_timeout_s,
                        run_timeout_s=run_timeout_s)


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


class FleetVerifyMeasurer(SyncMeasurer):
    """Measures listed configs once on agents of a key, through the daemon (nothing is logged)."""

    agent_name = "fleet"

    def __init__(self, client, device_key: str, target: str, timing: TimingConfig, device_info: dict) -> None:
        super().__init__()
        self.client, self.device_key, self.target, self.timing = client, device_key, target, timing
        self.device_info = device_info
        self.template_version = ""

    def measure_now(self, items: Sequence[MeasureInput]) -> list[MeasureResult]:
        if not items:
            return []
        return self.client.measure(items[0].workload.key, self.device_key, [i.config.json_text() for i in items],
                                   target=self.target, timing=self.timing)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
