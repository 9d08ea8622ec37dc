"""A job's view of the fleet: measuring means queueing candidates for agents of one device key."""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from measure_agent.engine import MeasureInput, MeasureResult, TimingConfig
from tuner.daemon.scheduler import Scheduler
from tuner.measure import MeasurementAborted, Measurer


class FleetMeasurer(Measurer):
    agent_name = "fleet"

    def __init__(self, scheduler: Scheduler, device_key: str, job_id: int, priority: int, timing: TimingConfig,
                 template_version: str, cancel: threading.Event, wait_timeout_s: float = 0.0) -> None:
        self.scheduler = scheduler
        self.device_key = device_key
        self.job_id = job_id
        self.priority = priority
        self.timing = timing
        self.template_version = template_version
        self.cancel = cancel
        self.wait_timeout_s = wait_timeout_s

    @property
    def parallelism(self) -> int:  # type: ignore[override]
        return self.scheduler.parallelism(self.device_key)

    @property
    def device_info(self) -> dict:  # type: ignore[override]
        return self.scheduler.device_info(self.device_key)

    def measure(self, items: Sequence[MeasureInput],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        batch = self.scheduler.submit(self.device_key, self.job_id, self.priority, items, self.timing)
        since = self.scheduler.now()
        delivered: set[int] = set()

        def deliver() -> None:
            # Hand each result over as it arrives: the job logs it before the batch is complete.
            for index, result in enumerate(list(batch.results)):
                if result is not None and index not in delivered:
                    delivered.add(index)
                    if on_result is not None:
                        on_result(index, result)

        while not self.scheduler.wait(batch, 0.5):
            deliver()
            if self.cancel.is_set():
                self.scheduler.cancel_job(self.job_id)
                raise MeasurementAborted("cancelled", job_status="cancelled")
            waited = self.scheduler.seconds_without_agents(self.device_key, since)
            if self.wait_timeout_s and waited > self.wait_timeout_s:
                self.scheduler.cancel_job(self.job_id)
                raise MeasurementAborted(
                    f"no agent of key {self.device_key!r} for {self.wait_timeout_s:g} s (--wait-timeout)"
                )
        deliver()
        return [r for r in batch.results if r is not None]
