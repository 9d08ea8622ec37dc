"""Typed inputs and results of measurement.

Failures are data, not exceptions: every candidate yields exactly one :class:`MeasureResult`
whose :class:`MeasureStatus` says what happened (as AutoTVM's ``MeasureErrorNo``).
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass, field

from measure_agent.space import Config
from measure_agent.workload import Workload


class MeasureStatus(enum.Enum):
    OK = "ok"
    INVALID_CONFIG = "invalid_config"  # not a member of the template's space: refused, never built
    COMPILE_ERROR = "compile_error"
    BUILD_TIMEOUT = "build_timeout"
    RUNTIME_ERROR = "runtime_error"  # raised, or crashed its worker (signal)
    RUN_TIMEOUT = "run_timeout"
    WRONG_ANSWER = "wrong_answer"

    @property
    def is_ok(self) -> bool:
        return self is MeasureStatus.OK


@dataclass(frozen=True)
class TimingConfig:
    """How a built kernel is timed, as AutoTVM's ``measure_option``.

    After ``warmup`` untimed calls, the kernel is timed ``repeat`` times; each time is the mean of
    ``number`` back-to-back calls. When one repeat takes less than ``min_repeat_ms``, ``number``
    grows until it does not, so fast kernels are not dominated by timer resolution.
    """

    number: int = 1
    repeat: int = 3
    min_repeat_ms: float = 0.0
    warmup: int = 1
    build_timeout_s: float = 120.0
    run_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if self.number < 1 or self.repeat < 1 or self.warmup < 0:
            raise ValueError("number and repeat must be >= 1 and warmup >= 0")
        if self.min_repeat_ms < 0 or self.build_timeout_s <= 0 or self.run_timeout_s <= 0:
            raise ValueError("min_repeat_ms must be >= 0 and timeouts > 0")


@dataclass(frozen=True)
class MeasureInput:
    """One candidate: a config of a workload's space on a target."""

    workload: Workload
    config: Config
    target: str = "cpu"


@dataclass(frozen=True)
class MeasureResult:
    """What measuring one candidate produced. ``costs`` are seconds per call, one per repeat."""

    status: MeasureStatus
    costs: tuple[float, ...] = ()
    compile_time_s: float = 0.0
    message: str = ""
    details: dict = field(default_factory=dict, compare=False)
    measured_by: str = ""  # the agent that measured it, when it came over the fleet

    @property
    def mean_s(self) -> float | None:
        return statistics.fmean(self.costs) if self.status.is_ok and self.costs else None

    @property
    def min_s(self) -> float | None:
        return min(self.costs) if self.status.is_ok and self.costs else None
