"""A tuning job as every client states it (:class:`JobSpec`) and sees it (:class:`JobStatus`).

One typed object holds every field of a job, validated in one place (:meth:`JobSpec.validate`).
The command line, ``tune-model`` and the local path build a ``JobSpec``; the daemon's client sends
it, the daemon's service reads it back, the job manager stores it with the job in the log (so a
restarted daemon resumes it) and runs it as the loop's :class:`~tuner.job.TuneOptions`. Protobuf
messages exist only at the daemon's edge (``tuner/daemon/service.py`` and ``client.py``), which
convert field by field by name: a new field is added here and in the proto, nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from measure_agent.arguments import INT32_MAX, INT64_MAX
from measure_agent.device import DeviceKeyError, check_device_key
from measure_agent.engine import TimingConfig
from measure_agent.protocol.errors import shown
from measure_agent.workload import Workload, WorkloadError, parse_workload

if TYPE_CHECKING:
    from measure_agent.device import DeviceInfo
    from measure_agent.templates import TemplateCatalog
    from tuner.steering import TargetSpec

# What one job may ask for; the daemon refuses more (docs/security.md lists every limit).
MAX_TRIALS = 1_000_000
MAX_PRIORITY = 1000
MAX_WORKLOAD_CHARS = 1000  # workload and family texts
MAX_TARGET_CHARS = 256
MAX_PINS = 64
MAX_CONSTRAINTS = 64
MAX_PIN_CHARS = 1000  # one "KNOB=VALUE"
MAX_CONSTRAINT_CHARS = 2000  # one expression
MAX_WAIT_TIMEOUT_S = 30 * 86400.0
MAX_TIME_BUDGET_S = 365 * 86400.0
FINAL_STATES = ("done", "failed", "cancelled", "interrupted")


class JobSpecError(ValueError):
    """A job field that does not fit (one-line message naming the field)."""


@dataclass(frozen=True)
class JobSpec:
    """Everything a tuning job is; immutable. Build one, then :meth:`validate` it.

    ``trials`` is how many distinct configs the log should hold for (workload, device key, target)
    when the job ends, so submitting the same spec again resumes instead of measuring anew.
    """

    workload: str  # "matmul(M=512,N=512,K=512)" or a compact name; canonical after validate()
    device_key: str  # whose agents measure the job
    target: str = "cpu"  # cpu, cuda, a TVM target string ("llvm -mattr=+avx2") or tag ("nvidia/jetson-orin-nano")
    strategy: str = "xgb"
    trials: int = 64
    seed: int = 0
    early_stopping: int | None = None  # stop after this many trials without improvement
    priority: int = 0  # jobs of one device key: higher first, equal ones take turns
    timing: TimingConfig = field(default_factory=TimingConfig)
    wait_timeout_s: float = 0.0  # fail when no agent of the key is present this long (0: wait)
    pins: tuple[str, ...] = ()  # "KNOB=VALUE", VALUE as JSON or a bare word
    constraints: tuple[str, ...] = ()  # expressions over knob names every measured config satisfies
    family: str = ""  # the shape range ("matmul(M=1..512,...)") this workload represents, if any
    transfer: bool = True  # start from the log's records of other shapes and devices
    time_budget_s: float | None = None  # propose nothing new after this much wall time of one run
    # share of each batch, in [0, 1), given to configs that reuse an already compiled best kernel
    # (tuner.search.kernel_reuse): they cost no compile
    reuse_share: float = 0.0

    # -- derived views (no state of their own) -----------------------------------------------
    @property
    def parsed_workload(self) -> Workload:
        return parse_workload(self.workload)

    @property
    def target_spec(self) -> "TargetSpec":
        from tuner.steering import parse_target

        return parse_target(self.target)

    @property
    def pin_pairs(self) -> tuple[tuple[str, str], ...]:
        from tuner.steering import parse_pin

        return tuple(parse_pin(p) for p in self.pins)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, catalog: "TemplateCatalog | None" = None,
                 devices: "Sequence[DeviceInfo]" = ()) -> "JobSpec":
        """This spec with the workload and target in canonical form; raises :class:`JobSpecError`.

        With ``catalog`` (the daemon's templates) it also checks that a template serves the
        operator on the target and that pins and constraints fit its space, so a bad job fails
        when submitted rather than when an agent first measures it. A space depends on the device
        (a pinned 32-wide register tile exists on AVX-512, not on AVX2): ``devices`` are the kinds
        of device that may measure the job (the daemon's agents of its key), and the pins and
        constraints must leave a config on one of them. With none known, the knob names are checked
        and the constraints evaluated over the device-independent space (so a costly one is refused
        now); the job's device checks pinned values and emptiness when it starts.
        """
        from tuner.search import STRATEGIES
        from tuner.steering import SteeringError, check_steering_names, parse_target, steer_space

        _check_text("workload", self.workload, MAX_WORKLOAD_CHARS)
        _check_text("family", self.family, MAX_WORKLOAD_CHARS)
        _check_text("target", self.target, MAX_TARGET_CHARS)
        _check_texts("pins", self.pins, MAX_PINS, MAX_PIN_CHARS)
        _check_texts("constraints", self.constraints, MAX_CONSTRAINTS, MAX_CONSTRAINT_CHARS)
        try:
            workload = parse_workload(self.workload)
            target = parse_target(self.target or "cpu")
            pairs = self.pin_pairs
        except (WorkloadError, SteeringError) as exc:
            raise JobSpecError(str(exc)) from None
        try:
            check_device_key(self.device_key)
        except DeviceKeyError as exc:
            raise JobSpecError(str(exc)) from None
        if self.strategy not in STRATEGIES:
            raise JobSpecError(f"unknown strategy {shown(self.strategy)}; choose from {', '.join(STRATEGIES)}")
        _check_int("trials", self.trials, 1, MAX_TRIALS)
        _check_int("seed", self.seed, 0, INT64_MAX)
        if self.early_stopping is not None:
            _check_int("early stopping", self.early_stopping, 1, INT32_MAX)
        _check_int("priority", self.priority, -MAX_PRIORITY, MAX_PRIORITY)
        _check_seconds("wait timeout", self.wait_timeout_s, allow_zero=True, most=MAX_WAIT_TIMEOUT_S)
        if self.time_budget_s is not None:
            _check_seconds("time budget", self.time_budget_s, allow_zero=False, most=MAX_TIME_BUDGET_S)
        if not isinstance(self.timing, TimingConfig):
            raise JobSpecError("timing must be a TimingConfig")
        _check_timing(self.timing)
        if not isinstance(self.transfer, bool):
            raise JobSpecError("transfer must be true or false")
        if (isinstance(self.reuse_share, bool) or not isinstance(self.reuse_share, (int, float))
                or not 0.0 <= self.reuse_share < 1.0):
            raise JobSpecError(f"reuse share must be a number in [0, 1), not {shown(self.reuse_share)}")
        family = _checked_family(self.family, workload) if self.family else ""
        if catalog is not None:
            from measure_agent.templates import TemplateNotFound

            try:
                catalog.get(workload.op, target.family)
                if not devices:
                    check_steering_names(catalog.space(workload, target.family), pairs, self.constraints)
            except (TemplateNotFound, SteeringError) as exc:
                raise JobSpecError(str(exc)) from None
            if (pairs or self.constraints) and devices:
                errors = []
                for device in devices:
                    try:
                        steer_space(catalog.space(workload, target.family, device), pairs, self.constraints)
                        break
                    except SteeringError as exc:
                        errors.append(str(exc))
                else:
                    kinds = "its device" if len(devices) == 1 else f"any of its {len(devices)} kinds of device"
                    raise JobSpecError(f"{errors[0]} (on {kinds})")
        return replace(self, workload=workload.key, target=target.text, pins=tuple(self.pins),
                       constraints=tuple(self.constraints), family=family)

    # -- the form stored with a job in the log ------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["pins"], data["constraints"] = list(self.pins), list(self.constraints)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "JobSpec":
        """Inverse of :meth:`to_json`. Fields a record lacks take their defaults (a job stored by an
        earlier version resumes); unknown keys are ignored. Raises ``TypeError``/``ValueError``."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("timing"), Mapping):
            values["timing"] = TimingConfig(**values["timing"])
        for name in ("pins", "constraints"):
            if name in values:
                values[name] = tuple(str(item) for item in values[name])
        return cls(**values)


@dataclass(frozen=True)
class JobStatus:
    """A job at one moment, as clients see it (immutable; the daemon sends a new one per change)."""

    job_id: int
    state: str  # queued, running, done, failed, cancelled, interrupted
    spec: JobSpec
    done: int = 0  # distinct configs in the log for the job's workload, device key and target
    measured_now: int = 0  # measured by this job
    errors: int = 0  # failed measurements of this job
    best_mean_s: float | None = None
    best_config: dict | None = None
    default_mean_s: float | None = None
    default_status: str = ""  # the default config's status when it did not run ok
    stopped_early: bool = False
    queued_candidates: int = 0
    leased_candidates: int = 0
    message: str = ""
    created_at: float = 0.0
    flops: float = 0.0  # of one call of the workload

    @property
    def workload(self) -> str:
        return self.spec.workload

    @property
    def device_key(self) -> str:
        return self.spec.device_key

    @property
    def target(self) -> str:
        return self.spec.target

    @property
    def strategy(self) -> str:
        return self.spec.strategy

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def total(self) -> int:
        return self.spec.trials

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    def gflops(self, seconds: float | None) -> float | None:
        """The workload's rate at ``seconds`` per call."""
        return self.flops / seconds / 1e9 if seconds else None

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``tuner status --json`` and ``tuner jobs --json``."""
        return {
            "job_id": self.job_id, "state": self.state, "workload": self.workload, "device_key": self.device_key,
            "target": self.target, "strategy": self.strategy, "priority": self.priority, "done": self.done,
            "total": self.total, "measured_now": self.measured_now, "errors": self.errors,
            "best_mean_s": self.best_mean_s, "best_config": self.best_config,
            "queued_candidates": self.queued_candidates, "leased_candidates": self.leased_candidates,
            "message": self.message,
        }


# -- checks -----------------------------------------------------------------------------------------
def _check_text(name: str, value: Any, most: int) -> None:
    if not isinstance(value, str):
        raise JobSpecError(f"{name} must be text, not {type(value).__name__}")
    if len(value) > most:
        raise JobSpecError(f"{name} must be at most {most} characters, not {len(value)}")
    if "\x00" in value:
        raise JobSpecError(f"{name} must not contain NUL characters")


def _check_texts(name: str, values: Any, count: int, most: int) -> None:
    if not isinstance(values, (tuple, list)):
        raise JobSpecError(f"{name} must be a list of texts")
    if len(values) > count:
        raise JobSpecError(f"at most {count} {name}, not {len(values)}")
    for value in values:
        _check_text(f"each of the {name}", value, most)


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise JobSpecError(f"{name} must be an integer from {low} to {high}, not {shown(value)}")


def _check_seconds(name: str, value: Any, *, allow_zero: bool, most: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise JobSpecError(f"{name} must be a finite number of seconds, not {shown(value)}")
    if value < 0:
        raise JobSpecError(f"{name} must not be negative, not {value!r}")
    if value == 0 and not allow_zero:
        raise JobSpecError(f"{name} must be more than 0 seconds")
    if value > most:
        raise JobSpecError(f"{name} must be at most {most:g} seconds, not {value!r}")


def _check_timing(timing: TimingConfig) -> None:
    """TimingConfig checks its own bounds when made; this catches one made around them."""
    try:
        TimingConfig(**asdict(timing))
    except (TypeError, ValueError) as exc:
        raise JobSpecError(str(exc)) from None


def _checked_family(text: str, workload: Workload) -> str:
    """The canonical key of the range ``text``, which must contain ``workload``."""
    from measure_agent.workload.family import parse_family

    try:
        family = parse_family(text)
    except WorkloadError as exc:
        raise JobSpecError(str(exc)) from None
    if not family.contains(workload):
        raise JobSpecError(f"{workload.key} is not in the range {family.key}")
    return family.key
