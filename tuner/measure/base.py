"""Where candidates are measured, seen from the tuner."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from measure_agent.engine import MeasureInput, MeasureResult


class MeasurementAborted(Exception):
    """Measuring cannot go on (the job was cancelled, or no device came in time).

    ``job_status`` is what the job becomes: ``cancelled`` or ``failed``; None leaves it ``running``
    in the log, to be resumed (the daemon is stopping).
    """

    def __init__(self, message: str, job_status: str | None = "failed") -> None:
        super().__init__(message)
        self.job_status = job_status


class Measurer(ABC):
    """Measures candidates on one device key, asynchronously, and says what measured them.

    Contract:
    - every item passed to ``submit`` comes back exactly once from ``collect``, as the same object,
      paired with its result; results come in the order they are ready, not the order submitted;
    - failures of candidates are results, never exceptions; ``collect`` raises
      :class:`MeasurementAborted` only when measuring as a whole cannot go on;
    - ``collect(timeout_s)`` returns what is ready, waiting up to ``timeout_s`` for the first
      result; it returns at once (possibly empty) when nothing is in flight;
    - ``parallelism`` is how many candidates the devices measure at once (the agents' build
      workers): the tuning loop keeps about three times that many submitted, so that every agent
      can lease its next batch while it measures one;
    - ``shares_cpu_with_tuner`` says that the devices time kernels on the CPU this process runs on
      (the embedded local agent, or agents a daemon was told share its host): for kernels timed on
      the host CPU the loop then proposes a new batch only once everything submitted has come back,
      so that the tuner's own work (model fits, proposals) never runs while a kernel is being
      timed, as in AutoTVM's and Kernel Tuner's sequential loops. Otherwise proposing overlaps
      measuring, which a fleet needs.
    """

    device_key: str
    device_info: dict
    agent_name: str
    template_version: str
    parallelism: int = 1
    shares_cpu_with_tuner: bool = False

    @abstractmethod
    def submit(self, items: Sequence[MeasureInput]) -> None:
        """Queue items for measurement."""

    @abstractmethod
    def collect(self, timeout_s: float) -> list[tuple[MeasureInput, MeasureResult]]:
        """Results that are ready."""

    def measure(self, items: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Submit ``items`` and wait for all of them; results in the order of ``items``."""
        self.submit(items)
        results: dict[int, MeasureResult] = {}
        while len(results) < len(items):
            for item, result in self.collect(1.0):
                results[id(item)] = result
        return [results[id(item)] for item in items]

    def close(self) -> None:
        """Release workers and connections."""

    def __enter__(self) -> "Measurer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncMeasurer(Measurer):
    """A measurer that measures everything submitted when ``collect`` is called."""

    def __init__(self) -> None:
        self._pending: list[MeasureInput] = []

    @abstractmethod
    def measure_now(self, items: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Measure ``items`` (in order) before returning."""

    def submit(self, items: Sequence[MeasureInput]) -> None:
        self._pending.extend(items)

    def collect(self, timeout_s: float) -> list[tuple[MeasureInput, MeasureResult]]:
        items, self._pending = self._pending, []
        return list(zip(items, self.measure_now(items))) if items else []
