"""Which config to use for a workload: its best measured one, else the nearest tuned shape's.

Shared by ``tuner best`` and :func:`tuner.best_kernel`; works on a :class:`~tuner.log.TuningLog`
or on :class:`~tuner.log.bestfile.BestConfigs` (a best-configs file).

**Nearest** (when the exact workload has no ok trial on the device(s) and target): among the
workloads of the same operator and dtype that do, the *closest* is the one with the smallest
log-distance over sizes,

    d(a, b) = sqrt( sum over the operator's size parameters p of (log2(a.p / b.p))^2 )

so halving or doubling one size is distance 1 whatever the magnitude (M=64 is as close to 128 as
M=512 to 1024); ties go to the smaller |log2 of the FLOP ratio|, then to the workload key. Its ok
configs are tried fastest first and the first ones *valid for the requested shape* are returned:
a config is transferred by recomputing the outer factor of every split knob (which a split derives
from the axis length: ``outer = ceil(extent / tile)``), then must pass the template's
``space(requested).from_json``, the space built for the device that measured the config (its
register tiles depend on that device's ISA). A workload none of whose configs is valid is skipped for the next
closest. Such a result is flagged ``approximate``, with the ``tuned_workload`` it was measured on
(its ``mean_s`` is that workload's time, not a prediction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from measure_agent.space import Config, ConfigError, ConfigSpace, SplitKnob
from measure_agent.workload import Workload, parse_workload
from tuner.log.records import TrialRecord, format_timestamp
from tuner.log.storage import NotFoundError


class BestSource(Protocol):  # TuningLog and BestConfigs
    def best(self, workload_key: str, device_key: str | Sequence[str], target: str = "cpu",
             top: int | None = 1) -> list[TrialRecord]: ...

    def tuned_workload_keys(self, op: str, dtype: str, device_key: str | Sequence[str],
                            target: str = "cpu") -> list[str]: ...


@dataclass(frozen=True)
class BestMatch:
    """A config to use for ``workload`` and the trial it comes from."""

    workload: str  # the requested workload's canonical key
    record: TrialRecord  # the measured trial (of ``tuned_workload``)
    config: dict  # JSON form of the config for ``workload`` (transferred when approximate)
    approximate: bool = False
    distance: float = 0.0
    family: str | None = None  # the shape-range family that served it, if any

    @property
    def tuned_workload(self) -> str:
        return self.record.workload_key

    @property
    def device_key(self) -> str:
        return self.record.device_key

    @property
    def mean_s(self) -> float | None:
        return self.record.mean_s

    @property
    def gflops(self) -> float | None:
        mean = self.record.mean_s
        return parse_workload(self.tuned_workload).flops / mean / 1e9 if mean else None

    def to_json(self) -> dict[str, Any]:
        """The JSON form printed by ``tuner best --json``."""
        data = {
            "workload": self.workload,
            "device_key": self.record.device_key,
            "target": self.record.target,
            "config": self.config,
            "mean_s": self.record.mean_s,
            "gflops": self.gflops,
            "costs": list(self.record.costs),
            "measured_at": self.record.created_at.isoformat(),
            "approximate": self.approximate,
            "tuned_workload": self.tuned_workload,
        }
        if self.family:
            data["family"] = self.family
        if self.approximate:
            data["distance"] = self.distance
            if self.config != self.record.config:
                data["tuned_config"] = self.record.config
        return data


def workload_distance(a: Workload, b: Workload) -> float:
    """Log-distance over sizes (see the module docstring); infinite across operators or dtypes."""
    if a.op != b.op or a.dtype != b.dtype:
        return math.inf
    pb = b.params
    return math.sqrt(sum(math.log2(value / pb[name]) ** 2 for name, value in a.sizes))


def transfer_config(space: ConfigSpace, config_json: dict[str, Any]) -> Config:
    """The config for ``space``'s workload: split outer factors recomputed, then validated.

    Raises :class:`~measure_agent.space.ConfigError` when the result is not a member of the space.
    """
    adapted = dict(config_json)
    for knob in space.knobs:
        raw = adapted.get(knob.name)
        if isinstance(knob, SplitKnob) and isinstance(raw, list) and len(raw) == len(knob.factor_choices) + 1:
            inner = raw[1:]
            if all(isinstance(f, int) and not isinstance(f, bool) and f > 0 for f in inner):
                adapted[knob.name] = [max(1, math.ceil(knob.extent / math.prod(inner)))] + inner
    return space.from_json(adapted)


def find_best(
    source: BestSource,
    workload: Workload | str,
    device_keys: str | Sequence[str],
    target: str = "cpu",
    top: int = 1,
    *,
    nearest: bool = False,
    validate: bool = False,
    catalog=None,
) -> list[BestMatch]:
    """Up to ``top`` configs for ``workload`` on the device(s), best first; ``[]`` if none.

    Exact matches come first and alone. Without one, a shape inside the range of a tuned family
    (``tuner tune --workload "matmul(M=1..512,...)"``) gets the config of the family's nearest
    representative valid for it, always; other shapes get the nearest tuned shape's only with
    ``nearest`` (module docstring). ``validate`` also drops exact matches whose config the installed
    template no longer accepts. ``catalog`` defaults to the production templates (needed only for
    ``nearest`` and ``validate``).
    """
    if isinstance(workload, str):
        workload = parse_workload(workload)
    if type(top) is not int or top < 1:
        raise ValueError(f"top must be a positive integer, not {top!r}")
    if isinstance(device_keys, str):
        device_keys = [device_keys]
    device_keys = list(device_keys)
    space_for = _RecordSpaces(source, workload, target, catalog)
    if validate:
        exact = []
        for record in source.best(workload.key, device_keys, target, top=None):
            try:
                config = space_for(record.device_key).from_json(record.config)
            except ConfigError:
                continue
            exact.append(BestMatch(workload.key, record, config.to_json()))
            if len(exact) == top:
                break
    else:
        exact = [BestMatch(workload.key, r, r.config) for r in source.best(workload.key, device_keys, target, top=top)]
    if exact:
        return exact
    # A shape inside a tuned family's range is served by the family's nearest representative,
    # without asking for --nearest: that is what tuning a range is for.
    family, members = _family_of(source, workload)
    if family is None and not nearest:
        return []
    tuned = set(source.tuned_workload_keys(workload.op, workload.dtype, device_keys, target))
    keys = [k for k in members if k in tuned] if family is not None else sorted(tuned)
    candidates = []
    for key in keys:
        other = parse_workload(key)
        if other.key == workload.key:
            continue
        flops_gap = abs(math.log2(other.flops / workload.flops))
        candidates.append((workload_distance(workload, other), flops_gap, key))
    for distance, _, key in sorted(candidates):
        found = []
        for record in source.best(key, device_keys, target, top=None):
            try:
                config = transfer_config(space_for(record.device_key), record.config)
            except ConfigError:
                continue
            found.append(BestMatch(workload.key, record, config.to_json(), approximate=True, distance=distance,
                                   family=family))
            if len(found) == top:
                break
        if found:
            return found
    return []


def _family_of(source: BestSource, workload: Workload) -> tuple[str | None, list[str]]:
    """The tuned family whose range contains ``workload`` (the narrowest if several), and its members."""
    from measure_agent.workload.family import parse_family

    families = getattr(source, "families", None)  # best-configs files carry no families
    if families is None:
        return None, []
    found = []
    for key, members in families(workload.op, workload.dtype):
        family = parse_family(key)
        if family.contains(workload):
            width = sum(math.log2(hi / lo) for _, lo, hi in family.ranges)
            found.append((width, key, members))
    if not found:
        return None, []
    _, key, members = min(found)
    return key, members


def recorded_device(source, device_key: str):
    """The :class:`~measure_agent.device.DeviceInfo` a log or best-configs file recorded for
    ``device_key``, or ``None`` when it has none (the template then assumes a generic device)."""
    from measure_agent.device import DeviceInfo

    try:
        info = source.device_info(device_key)
    except (NotFoundError, AttributeError):
        return None
    return DeviceInfo.from_recorded(info)


class _RecordSpaces:
    """``workload``'s space for configs measured on each device key (the catalog caches spaces;
    this remembers each key's recorded device). Nothing is looked up until a space is asked for."""

    def __init__(self, source: BestSource, workload: Workload, target: str, catalog) -> None:
        self._source = source
        self._workload = workload
        self._target = target
        self._catalog = catalog
        self._devices: dict[str, Any] = {}

    def __call__(self, device_key: str) -> ConfigSpace:
        if self._catalog is None:
            from measure_agent.templates import default_catalog

            self._catalog = default_catalog()
        if device_key not in self._devices:
            self._devices[device_key] = recorded_device(self._source, device_key)
        return self._catalog.space(self._workload, self._target, self._devices[device_key])
