"""Immutable records of the tuning log, and the JSON line form of a trial.

A :class:`TrialRecord` is validated when built, so a record that exists is one the log accepts:
the workload key is canonical, the status is a :class:`MeasureStatus` value, times are finite
non-negative floats, ``mean_s`` is set exactly for ``ok`` trials and ``created_at`` is aware UTC.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property, lru_cache
from typing import Any, Mapping, Sequence

from measure_agent.engine.types import MeasureResult, MeasureStatus
from measure_agent.space import Config, canonical_config_text, config_digest
from measure_agent.workload import WorkloadError, parse_workload

LOG_FORMAT = "tunefleet-log"
LOG_VERSION = 1
TRIAL_STATUSES = tuple(s.value for s in MeasureStatus)

# Fields every JSON line must carry; ``device_info`` is read by the importer, not by the record.
LINE_FIELDS = (
    "format",
    "version",
    "workload",
    "device_key",
    "target",
    "config",
    "status",
    "costs",
    "mean_s",
    "compile_time_s",
    "message",
    "agent",
    "template_version",
    "timestamp",
    "device_info",
)


class RecordError(ValueError):
    """A record field with a value the tuning log does not accept (one-line message)."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def canonical_json(value: Any) -> str:
    """Compact JSON text with sorted keys: the form in which JSON payloads are stored."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_workload_key(key: str) -> str:
    """The canonical spelling of a workload key; raises :class:`WorkloadError` if unparseable."""
    if not isinstance(key, str):
        raise WorkloadError(f"workload key must be a string, not {type(key).__name__}")
    return _canonical_workload_key(key)


@lru_cache(maxsize=4096)
def _canonical_workload_key(key: str) -> str:
    return parse_workload(key).key


def format_timestamp(moment: datetime) -> str:
    """ISO-8601 UTC with microseconds, e.g. ``2024-05-01T12:00:00.000001Z``."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(text: str) -> datetime:
    """Inverse of :func:`format_timestamp`; any ISO-8601 time with an offset is accepted."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise RecordError(f"timestamp {text!r} is not ISO-8601") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise RecordError(f"timestamp {text!r} has no time zone; expected UTC such as ...Z")
    return moment.astimezone(timezone.utc)


@dataclass(frozen=True)
class TrialRecord:
    """One measured config, as the log stores it. Immutable; treat ``config`` as read-only.

    ``config`` is the JSON form of a config (``Config.to_json()``); a :class:`Config` is accepted
    too and converted. ``job_id`` is local to one log and is not part of the JSON line form.
    """

    workload_key: str
    device_key: str
    target: str
    config: dict = field(hash=False)
    status: str
    costs: tuple[float, ...] = ()
    mean_s: float | None = None
    compile_time_s: float = 0.0
    message: str = ""
    agent: str = ""
    template_version: str = ""
    created_at: datetime = field(default_factory=utcnow)
    job_id: int | None = None

    def __post_init__(self) -> None:
        try:
            workload_key = canonical_workload_key(self.workload_key)
        except WorkloadError as exc:
            raise RecordError(f"workload: {exc}") from None
        object.__setattr__(self, "workload_key", workload_key)
        _require_key("device_key", self.device_key)
        _require_key("target", self.target)
        known = self.config.json_text() if isinstance(self.config, Config) else None
        if known is not None and not _may_be_non_finite(known):
            # a Config knows its canonical text and digest: no second serialisation per trial
            text = known
            self.__dict__["config_digest"] = self.config.digest
        else:
            text = _config_text(self.config)
        object.__setattr__(self, "config", json.loads(text))  # a copy: the caller's dict cannot change it
        self.__dict__["config_text"] = text  # what the cached property computes, known now
        status = self.status.value if isinstance(self.status, MeasureStatus) else self.status
        if status not in TRIAL_STATUSES:
            raise RecordError(f"status {status!r} is not one of {', '.join(TRIAL_STATUSES)}")
        object.__setattr__(self, "status", status)
        if type(self.costs) is not tuple and (isinstance(self.costs, (str, bytes))
                                              or not isinstance(self.costs, Sequence)):
            raise RecordError("costs must be a list of seconds")
        object.__setattr__(self, "costs", tuple(_seconds(f"costs[{i}]", c) for i, c in enumerate(self.costs)))
        if status == MeasureStatus.OK.value:
            if self.mean_s is None:
                raise RecordError("an ok trial needs mean_s")
            object.__setattr__(self, "mean_s", _seconds("mean_s", self.mean_s))
        elif self.mean_s is not None:
            raise RecordError(f"mean_s must be null for a {status} trial")
        object.__setattr__(self, "compile_time_s", _seconds("compile_time_s", self.compile_time_s))
        for name in ("workload_key", "device_key", "target", "message", "agent", "template_version"):
            _require_storable_text(name, getattr(self, name))
        if not isinstance(self.created_at, datetime):
            raise RecordError("created_at must be a datetime")
        if self.created_at.tzinfo is None or self.created_at.utcoffset() is None:
            raise RecordError("created_at must be timezone-aware (UTC)")
        object.__setattr__(self, "created_at", self.created_at.astimezone(timezone.utc))
        if self.job_id is not None and (type(self.job_id) is not int or self.job_id < 1):
            raise RecordError(f"job_id must be a positive integer or None, not {self.job_id!r}")

    @classmethod
    def from_result(
        cls,
        workload_key: str,
        device_key: str,
        target: str,
        config: Config | Mapping[str, Any],
        result: MeasureResult,
        *,
        agent: str = "",
        template_version: str = "",
        created_at: datetime | None = None,
        job_id: int | None = None,
    ) -> "TrialRecord":
        """The record of a measurement result (``created_at`` defaults to now)."""
        return cls(
            workload_key=workload_key,
            device_key=device_key,
            target=target,
            config=config,
            status=result.status.value,
            costs=result.costs,
            mean_s=result.mean_s,
            compile_time_s=result.compile_time_s,
            message=result.message,
            agent=agent,
            template_version=template_version,
            created_at=created_at or utcnow(),
            job_id=job_id,
        )

    @cached_property
    def config_text(self) -> str:
        """Canonical JSON text of the config, identical to ``Config.json_text()``."""
        return canonical_config_text(self.config)

    @cached_property
    def config_digest(self) -> str:
        """Identity of the config within a workload, device and target; equals ``Config.digest``."""
        return config_digest(self.config_text)

    @property
    def is_ok(self) -> bool:
        return self.status == MeasureStatus.OK.value

    def to_json(self, device_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON line form (see :data:`LINE_FIELDS`), carrying ``device_info`` of the device."""
        return {
            "format": LOG_FORMAT,
            "version": LOG_VERSION,
            "workload": self.workload_key,
            "device_key": self.device_key,
            "target": self.target,
            "config": json.loads(self.config_text),
            "status": self.status,
            "costs": list(self.costs),
            "mean_s": self.mean_s,
            "compile_time_s": self.compile_time_s,
            "message": self.message,
            "agent": self.agent,
            "template_version": self.template_version,
            "timestamp": format_timestamp(self.created_at),
            "device_info": dict(device_info or {}),
        }

    @classmethod
    def from_json(cls, obj: Any) -> "TrialRecord":
        """Parse the JSON line form; raises :class:`RecordError` naming the first problem.

        Every field of :data:`LINE_FIELDS` must be present with its JSON type; unknown extra fields
        are ignored. ``device_info`` is checked to be an object but not kept by the record.
        """
        if not isinstance(obj, dict):
            raise RecordError("a line must be a JSON object")
        missing = [name for name in LINE_FIELDS if name not in obj]
        if missing:
            raise RecordError(f"missing field {missing[0]!r}")
        if obj["format"] != LOG_FORMAT:
            raise RecordError(f"format is {obj['format']!r}, expected {LOG_FORMAT!r}")
        version = obj["version"]
        if type(version) is not int or version != LOG_VERSION:
            raise RecordError(f"unsupported version {version!r}; this tunefleet reads version {LOG_VERSION}")
        for name in ("workload", "device_key", "target", "status", "message", "agent", "template_version", "timestamp"):
            _require_type(obj, name, str, "a string")
        for name in ("config", "device_info"):
            _require_type(obj, name, dict, "an object")
        if obj["device_info"]:
            from measure_agent.device import DeviceInfo

            try:
                DeviceInfo.from_json(obj["device_info"])  # spaces are built from it later
            except ValueError as exc:
                raise RecordError(f"field 'device_info': {exc}") from None
        _require_type(obj, "costs", list, "a list")
        if obj["mean_s"] is not None and not _is_number(obj["mean_s"]):
            raise RecordError("field 'mean_s' must be a number or null")
        if not _is_number(obj["compile_time_s"]):
            raise RecordError("field 'compile_time_s' must be a number")
        return cls(
            workload_key=obj["workload"],
            device_key=obj["device_key"],
            target=obj["target"],
            config=obj["config"],
            status=obj["status"],
            costs=obj["costs"],
            mean_s=obj["mean_s"],
            compile_time_s=obj["compile_time_s"],
            message=obj["message"],
            agent=obj["agent"],
            template_version=obj["template_version"],
            created_at=parse_timestamp(obj["timestamp"]),
        )


@dataclass(frozen=True)
class JobRecord:
    """A tuning job: ``status`` is one of ``running``, ``done``, ``failed``, ``cancelled``."""

    id: int
    workload_key: str
    device_key: str
    target: str
    strategy: str
    trials: int
    options: dict = field(hash=False)
    status: str
    created_at: datetime
    finished_at: datetime | None = None

    @property
    def is_finished(self) -> bool:
        return self.status != "running"


def _require_key(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise RecordError(f"{name} must be a non-empty string without surrounding spaces, not {value!r}")


def storable_text(value: Any, most: int) -> str:
    """``value`` as text every backend can hold (no NUL, no lone surrogate), at most ``most`` characters."""
    text = str(value).replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return text[:most]


def _require_storable_text(name: str, value: Any) -> None:
    # PostgreSQL text cannot hold NUL and no database takes lone surrogates; refusing them on every
    # backend keeps a log movable between backends.
    if not isinstance(value, str):
        raise RecordError(f"{name} must be a string, not {type(value).__name__}")
    if "\x00" in value:
        raise RecordError(f"{name} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RecordError(f"{name} is not valid Unicode text (lone surrogate)") from None


def _require_type(obj: dict, name: str, kind: type, description: str) -> None:
    if not isinstance(obj[name], kind):
        raise RecordError(f"field {name!r} must be {description}, not {type(obj[name]).__name__}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(name: str, value: Any) -> float:
    if not _is_number(value):
        raise RecordError(f"{name} must be a number of seconds, not {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise RecordError(f"{name} must be finite and non-negative, not {value!r}")
    return value


def _may_be_non_finite(text: str) -> bool:
    """Whether canonical JSON text may hold NaN or an infinity, which the log refuses (a string
    value spelling them only sends the text the slower, exact way)."""
    return "NaN" in text or "Infinity" in text


def _config_text(config: Any) -> str:
    """The canonical text of a config (:func:`canonical_config_text`), which proves it can be
    stored; the record's config is read back from it, so it is a copy in the log's key order."""
    if isinstance(config, Config):
        config = config.to_json()
    if not isinstance(config, Mapping):
        raise RecordError(f"config must be a JSON object, not {type(config).__name__}")
    if not all(isinstance(k, str) for k in config):
        raise RecordError("config keys must be knob names (strings)")
    try:
        return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"config is not JSON-serialisable: {exc}") from None


__all__ = [
    "JobRecord",
    "LINE_FIELDS",
    "LOG_FORMAT",
    "LOG_VERSION",
    "RecordError",
    "TRIAL_STATUSES",
    "TrialRecord",
    "canonical_json",
    "canonical_workload_key",
    "format_timestamp",
    "parse_timestamp",
    "utcnow",
]
