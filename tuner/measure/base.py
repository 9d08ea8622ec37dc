"""Where candidates are measured, seen from the tuner."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from measure_agent.engine import MeasureInput, MeasureResult


class Measurer(ABC):
    """Measures candidates on one device key and says what measured them.

    Contract: ``measure`` returns exactly one result per input, in order, and never raises for
    a candidate's fault (failures are results). ``parallelism`` is how many candidates it can
    usefully take at once: strategies size their batches by it.
    """

    device_key: str
    device_info: dict
    agent_name: str
    template_version: str
    parallelism: int = 1

    @abstractmethod
    def measure(self, items: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Measure every item."""

    def close(self) -> None:
        """Release workers and connections."""

    def __enter__(self) -> "Measurer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
