"""Typed inputs and results of measurement.

Failures are data, not exceptions: every candidate yields exactly one :class:`MeasureResult`
whose :class:`MeasureStatus` says what happened (as AutoTVM's ``MeasureErrorNo``).
"""

from __future__ import annotations

import enum
import math
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


# The most a timing config may ask for. A candidate then occupies an agent for a bounded time
# (its lease deadline follows from these), whatever a client sent. docs/security.md lists them.
TIMING_LIMITS = {
    "number": 1_000_000,  # calls per timed repeat (min_repeat_ms grows it further only by measuring)
    "repeat": 1000,
    "min_repeat_ms": 60_000.0,
    "warmup": 1000,
    "build_timeout_s": 3600.0,
    "run_timeout_s": 3600.0,
}


@dataclass(frozen=True)
class TimingConfig:
    """How a built kernel is timed, as AutoTVM's ``measure_option``.

    After ``warmup`` untimed calls, the kernel is timed ``repeat`` times; each time is the mean of
    ``number`` back-to-back calls. When one repeat takes less than ``min_repeat_ms``, ``number``
    grows until it does not, so fast kernels are not dominated by timer resolution. Every value is
    finite and within :data:`TIMING_LIMITS`.
    """

    number: int = 1
    repeat: int = 3
    min_repeat_ms: float = 0.0
    warmup: int = 1
    build_timeout_s: float = 120.0
    run_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        for name in ("number", "repeat", "warmup"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"timing {name} must be an integer, not {value!r}")
        for name in ("min_repeat_ms", "build_timeout_s", "run_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"timing {name} must be a finite number, not {value!r}")
        if self.number < 1 or self.repeat < 1 or self.warmup < 0:
            raise ValueError("number and repeat must be >= 1 and warmup >= 0")
        if self.min_repeat_ms < 0 or self.build_timeout_s <= 0 or self.run_timeout_s <= 0:
            raise ValueError("min_repeat_ms must be >= 0 and timeouts > 0")
        for name, limit in TIMING_LIMITS.items():
            if getattr(self, name) > limit:
                raise ValueError(f"timing {name} must be at most {limit:g}, not {getattr(self, name)!r}")

    @classmethod
    def clamped(cls, **values: float) -> "TimingConfig":
        """A config of ``values`` brought within bounds (what an agent does with what it receives,
        so no message can occupy it for longer than the limits allow); NaN takes the default."""
        defaults = cls()
        bounded = {}
        for name, limit in TIMING_LIMITS.items():
            value = values.get(name, getattr(defaults, name))
            if not isinstance(value, (int, float)) or value != value:  # NaN
                value = getattr(defaults, name)
            low = {"number": 1, "repeat": 1, "warmup": 0}.get(name, 0.0)
            value = min(max(value, low), limit)
            if name.endswith("_s") and value <= 0:
                value = getattr(defaults, name)
            bounded[name] = int(value) if name in ("number", "repeat", "warmup") else float(value)
        return cls(**bounded)


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
