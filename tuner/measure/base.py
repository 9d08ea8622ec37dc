"""Where candidates are measured, seen from the tuner."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

from measure_agent.engine import MeasureInput, MeasureResult


class MeasurementAborted(Exception):
    """Measuring cannot go on (the job was cancelled, or no device came in time).

    ``job_status`` is what the job becomes: ``cancelled`` or ``failed``.
    """

    def __init__(self, message: str, job_status: str = "failed") -> None:
        super().__init__(message)
        self.job_status = job_status


class Measurer(ABC):
    """Measures candidates on one device key and says what measured them.

    Contract: ``measure`` returns exactly one result per input, in order, and never raises for
    a candidate's fault (failures are results). When given, ``on_result(index, result)`` is called
    once per item as soon as its result is known, so the caller can log it before the whole batch
    is done. ``parallelism`` is how many candidates it can usefully take at once: strategies size
    their batches by it.
    """

    device_key: str
    device_info: dict
    agent_name: str
    template_version: str
    parallelism: int = 1

    @abstractmethod
    def measure(self, items: Sequence[MeasureInput],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure every item."""

    def close(self) -> None:
        """Release workers and connections."""

    def __enter__(self) -> "Measurer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
