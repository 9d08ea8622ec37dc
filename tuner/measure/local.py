"""Measuring on this host with the agent's own engine."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Callable, Sequence

from measure_agent.device import detect_device
from measure_agent.engine import MeasureEngine, MeasureInput, MeasureResult, TimingConfig
from tuner.measure.base import Measurer


class LocalMeasurer(Measurer):
    """This host as the measuring device, through the same engine a remote agent runs."""

    def __init__(
        self,
        timing: TimingConfig,
        build_workers: int = 1,
        device_key: str | None = None,
        catalog: str = "default",
        cache_dir: Path | None = None,
    ) -> None:
        info = detect_device()
        self.device_info = info.to_json()
        self.device_key = device_key or info.default_key
        self.agent_name = f"local@{socket.gethostname()}"
        self.parallelism = build_workers
        self._engine = MeasureEngine(timing, build_workers=build_workers, catalog=catalog, cache_dir=cache_dir)
        self.template_version = self._engine.template_version

    def measure(self, items: Sequence[MeasureInput],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        results = self._engine.measure(items)
        for index, result in enumerate(results):
            if on_result is not None:
                on_result(index, result)
        return results

    def close(self) -> None:
        self._engine.close()
