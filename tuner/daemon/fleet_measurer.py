"""A job's view of the fleet: measuring means queueing candidates for agents of one device key."""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from measure_agent.engine import MeasureInput, MeasureResult, TimingConfig
from tuner.daemon.scheduler import Batch, Scheduler
from tuner.measure import MeasurementAborted, Measurer


class FleetMeasurer(Measurer):
    agent_name = "fleet"

    def __init__(self, scheduler: Scheduler, device_key: str, job_id: int, priority: int, timing: TimingConfig,
                 template_version: str, cancel: threading.Event, wait_timeout_s: float = 0.0,
                 interrupt: threading.Event | None = None,
                 requirement: Callable[[dict], bool] | None = None, shares_cpu_with_tuner: bool = False) -> None:
        self.scheduler = scheduler
        self.shares_cpu_with_tuner = shares_cpu_with_tuner  # agents on the daemon's host: see Measurer
        self.device_key = device_key
        self.job_id = job_id
        self.priority = priority
        self.timing = timing
        self.template_version = template_version
        self.cancel = cancel
        self.wait_timeout_s = wait_timeout_s
        self.interrupt = interrupt or threading.Event()
        self.requirement = requirement  # which agents of the key may measure (target options)
        self._batches: list[tuple[Batch, int]] = []  # with how many of its finished results were collected
        self._waiting_since: float | None = None
        self._parallelism = (-1, 0)  # (the scheduler's agents_version it was counted at, the count)

    @property
    def parallelism(self) -> int:  # type: ignore[override]
        # asked at every step of the job: counted again only when the fleet changed
        version = self.scheduler.agents_version
        if self._parallelism[0] != version:
            self._parallelism = (version, self.scheduler.parallelism(self.device_key, self.requirement))
        return self._parallelism[1]

    @property
    def batches_in_flight(self) -> int:
        """Submitted batches not all of whose results were collected yet (a batch is let go once they
        all were)."""
        return len(self._batches)

    @property
    def device_info(self) -> dict:  # type: ignore[override]
        return self.scheduler.device_info(self.device_key, self.requirement)

    def device_ready(self) -> bool:
        """Whether an agent that may measure the job has registered (its device info shapes the
        job's space), without waiting; raises :class:`MeasurementAborted` on cancel, daemon stop or
        ``wait_timeout_s`` without such an agent."""
        if self._waiting_since is None:
            self._waiting_since = self.scheduler.now()
        if self.scheduler.device_info(self.device_key, self.requirement):
            self._waiting_since = None
            return True
        self._check_can_go_on()
        return False

    def wait_for_device(self) -> None:
        """:meth:`device_ready`, waiting until it is."""
        while True:
            generation = self.scheduler.generation
            if self.device_ready():
                return
            self.scheduler.wait_for_change(generation, 0.5)

    def submit(self, items: Sequence[MeasureInput]) -> None:
        # a cancelled job (or a stopping daemon) queues nothing more: collect checks only when no
        # result is ready, and a driver that gathered results before the step always finds some
        self._check_can_go_on()
        if items:
            batch = self.scheduler.submit(self.device_key, self.job_id, self.priority, items, self.timing,
                                          self.requirement)
            self._batches.append((batch, 0))

    def collect(self, timeout_s: float) -> list[tuple[MeasureInput, MeasureResult]]:
        if not self._batches:
            return []
        if self._waiting_since is None:
            self._waiting_since = self.scheduler.now()
        deadline = self.scheduler.now() + timeout_s
        while True:
            generation = self.scheduler.generation
            ready = self._take_ready()
            if ready:
                self._waiting_since = None
                return ready
            self._check_can_go_on()
            remaining = deadline - self.scheduler.now()
            if remaining <= 0:
                return []
            self.scheduler.wait_for_change(generation, min(remaining, 0.5))

    def _take_ready(self) -> list[tuple[MeasureInput, MeasureResult]]:
        """The results that arrived since the last call. The scheduler sets ``results[i]`` before
        it appends ``i`` to ``finished`` (under its lock), so the slice read here without the lock
        names only results that are there."""
        ready = []
        batches = []
        for batch, taken in self._batches:
            new = batch.finished[taken:]
            ready += [(batch.items[index], batch.results[index]) for index in new]
            taken += len(new)
            if taken < len(batch.items):
                batches.append((batch, taken))
        self._batches = batches
        return ready

    def _check_can_go_on(self) -> None:
        if self.interrupt.is_set():  # the daemon is stopping: the job stays running in the log
            raise MeasurementAborted("the daemon stopped; the job resumes when it starts again", job_status=None)
        if self.cancel.is_set():
            self.scheduler.cancel_job(self.job_id)
            raise MeasurementAborted("cancelled", job_status="cancelled")
        waited = self.scheduler.seconds_without_agents(self.device_key, self._waiting_since or self.scheduler.now(),
                                                       self.requirement)
        if self.wait_timeout_s and waited > self.wait_timeout_s:
            self.scheduler.cancel_job(self.job_id)
            raise MeasurementAborted(f"no agent of key {self.device_key!r} for {self.wait_timeout_s:g} s (--wait-timeout)")
