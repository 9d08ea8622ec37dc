"""Measuring on this host with the agent's own engine."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Sequence

from measure_agent.device import detect_device
from measure_agent.engine import MeasureEngine, MeasureInput, MeasureResult, TimingConfig
from tuner.measure.base import SyncMeasurer


class LocalMeasurer(SyncMeasurer):
    """This host as the measuring device, calling the engine in-process.

    ``tuner tune`` goes through an embedded daemon and agent instead (one path for local and
    remote); this direct form serves tests and benchmarks that measure without a fleet.
    """

    def __init__(
        self,
        timing: TimingConfig,
        build_workers: int = 1,
        device_key: str | None = None,
        catalog: str = "default",
        cache_dir: Path | None = None,
    ) -> None:
        super().__init__()
        info = detect_device()
        self.device_info = info.to_json()
        self.device_key = device_key or info.default_key
        self.agent_name = f"local@{socket.gethostname()}"
        self.parallelism = build_workers
        self._engine = MeasureEngine(timing, build_workers=build_workers, catalog=catalog, cache_dir=cache_dir)
        self.template_version = self._engine.template_version
        self.runtime = self._engine.runtime  # how its workers run kernels (best_kernel applies the same)

    def measure_now(self, items: Sequence[MeasureInput]) -> list[MeasureResult]:
        return self._engine.measure(items)

    def close(self) -> None:
        self._engine.close()
