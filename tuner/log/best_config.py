"""The best config of a workload on a device, from a tuning log or a best-configs file: one resolver.

``tuner best``, ``tuner show-kernel --best``, :func:`tuner.best_kernel` and ``tuner report`` all ask
:func:`resolve_best_config` (or its exact-only form :func:`exact_best_config`), so they give one
answer: a :class:`BestConfig` whose ``kind`` is ``tuned``, ``family``, ``approximate`` or
``default`` (nothing usable) and whose ``why`` says so in one line. The source is anything that
implements :class:`BestSource`: a :class:`~tuner.log.TuningLog` or a
:class:`~tuner.log.bestfile.BestConfigs`.

**Exact**: the fastest ok trials of the workload on the device(s) and target whose config the
installed template accepts, in the space of the device that measured it (its register tiles depend
on that device's ISA; the source records each device's info). A trial the template rejects is
skipped; when every exact trial is rejected, the answer says why (``rejected``).

**Family**: without an exact match, a shape inside the range of a tuned family
(``tuner tune --workload "matmul(M=1..512,...)"``) gets the config of the family's nearest
representative valid for it, always: that is what tuning a range is for.

**Nearest** (asked for; when the exact workload has no usable ok trial on the device(s) and
target): among the workloads of the same operator and dtype that do, the *closest* is the one with
the smallest log-distance over sizes,

    d(a, b) = sqrt( sum over the operator's size parameters p of (log2(a.p / b.p))^2 )

so halving or doubling one size is distance 1 whatever the magnitude (M=64 is as close to 128 as
M=512 to 1024); ties go to the smaller |log2 of the FLOP ratio|, then to the workload key. Its ok
configs are tried fastest first and the first ones *valid for the requested shape* are returned:
a config is transferred by recomputing the outer factor of every split knob (which a split derives
from the axis length: ``outer = ceil(extent / tile)``), then must pass the template's
``space(requested).from_json``, the space built for the device that measured the config. A
workload none of whose configs is valid is skipped for the next closest. Such a result is flagged
``approximate``, with the ``tuned_workload`` it was measured on (its ``mean_s`` is that workload's
time, not a prediction). Family members are ranked the same way.

:func:`find_best` is the ranked list underneath (``tuner best --top K``), with ``validate``
optional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

from measure_agent.space import Config, ConfigError, ConfigSpace, SplitKnob
from measure_agent.workload import Workload, parse_workload
from tuner.log.records import TrialRecord

if TYPE_CHECKING:
    from measure_agent.device import DeviceInfo
    from measure_agent.templates import TemplateCatalog

BEST_CONFIG_KINDS = ("tuned", "family", "approximate", "default")


class BestSource(Protocol):
    """Where best configs are looked up: :class:`~tuner.log.TuningLog` and
    :class:`~tuner.log.bestfile.BestConfigs` implement every method.

    Device keys are exact keys (resolve a user's glob with :meth:`resolve_device_keys` first);
    ``device_key`` arguments take one key or a sequence of keys ranked together. Workload keys may
    be any spelling of the workload (they are canonicalised).
    """

    @property
    def name(self) -> str:
        """What to call the source in messages: the database URL (password masked) or the file."""
        ...

    def best(self, workload_key: str, device_key: str | Sequence[str], target: str = "cpu",
             top: int | None = 1) -> list[TrialRecord]:
        """Up to ``top`` ok trials of exactly this workload, fastest first (ties: the earlier trial,
        then the order recorded), so the same source always ranks the same way; ``top=None``: all."""
        ...

    def tuned_workload_keys(self, op: str, dtype: str, device_key: str | Sequence[str],
                            target: str = "cpu") -> list[str]:
        """Sorted keys of the workloads of ``op`` and ``dtype`` with an ok trial on the device(s)
        and target."""
        ...

    def families(self, op: str, dtype: str) -> list[tuple[str, list[str]]]:
        """(family key, its representative workload keys) of each shape-range family of ``op`` and
        ``dtype``; ``[]`` where the source records none (a best-configs file)."""
        ...

    def recorded_device_info(self, device_key: str) -> dict[str, Any] | None:
        """The device info recorded for ``device_key`` (``{}`` when it was recorded without any),
        ``None`` when the source does not know the device."""
        ...

    def resolve_device_keys(self, key_or_pattern: str) -> list[str]:
        """A device key as a user gave it: a glob (``x86_64-*``) becomes the matching keys of the
        source, sorted; a plain key stays itself, known to the source or not."""
        ...

    def recorded_devices(self) -> dict[str, dict[str, Any]]:
        """Every device key of the source with its recorded info (``{}`` where none was recorded),
        in key order: what :func:`keys_of_device` reads device identities from."""
        ...


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


@dataclass(frozen=True)
class RejectedConfig:
    """The fastest exact trial, whose config the installed template does not accept."""

    record: TrialRecord
    reason: str  # the template's one-line objection (a ConfigError message)


@dataclass(frozen=True)
class BestConfig:
    """The answer to "which config for this workload on this device": what every entry point uses.

    ``kind``: ``tuned`` (measured on exactly this workload), ``family`` (a tuned shape range's
    nearest representative), ``approximate`` (the nearest tuned shape) or ``default`` (nothing
    usable: the caller falls back to the template's default config or reports ``why``).
    ``matches`` are the usable configs, best first (up to the ``top`` asked; empty for ``default``);
    ``tuned_on`` is the device info recorded for the first one's device (the space it was checked
    against; ``None`` for a generic or unknown device); ``rejected`` is set when exact trials exist
    but the template accepts none of them (whether or not a family or nearest config was found).
    ``kind`` is one of :data:`BEST_CONFIG_KINDS`, derived from the first match.
    """

    workload: Workload
    target: str
    device_key: str  # as asked: a key or a glob
    device_keys: tuple[str, ...]  # what it stands for in the source
    why: str  # one line: where the config comes from, or why there is none
    matches: tuple[BestMatch, ...] = ()
    tuned_on: DeviceInfo | None = None
    rejected: RejectedConfig | None = None

    @property
    def kind(self) -> str:
        match = self.match
        if match is None:
            return "default"
        if match.family:
            return "family"
        return "approximate" if match.approximate else "tuned"

    @property
    def found(self) -> bool:
        return bool(self.matches)

    @property
    def approximate(self) -> bool:
        """Not measured on this workload (``family`` or ``approximate``)."""
        return self.kind in ("family", "approximate")

    @property
    def match(self) -> BestMatch | None:
        return self.matches[0] if self.matches else None

    @property
    def config(self) -> dict | None:
        """JSON form of the config to use (valid for ``workload``); ``None`` for ``default``."""
        return self.matches[0].config if self.matches else None

    @property
    def record(self) -> TrialRecord | None:
        """The measured trial the config comes from."""
        return self.matches[0].record if self.matches else None


def resolve_best_config(
    source: BestSource,
    workload: Workload | str,
    device_key: str,
    target: str = "cpu",
    *,
    nearest: bool = False,
    top: int = 1,
    catalog: TemplateCatalog | None = None,
    device_identity: str | None = None,
) -> BestConfig:
    """The best config for ``workload`` on ``device_key`` (a key or a glob) and ``target``: exact,
    else family, else (with ``nearest``) the nearest tuned shape; every config validated (module
    docstring). ``top`` keeps that many alternatives in ``matches``. ``catalog`` defaults to the
    installed templates; a missing template raises
    :class:`~measure_agent.templates.TemplateNotFound` once a config needs checking.

    ``device_identity`` (a host's detected key, ``DeviceInfo.default_key``) also ranks the trials of
    every key under which the source recorded a device of that identity (:func:`keys_of_device`):
    what a fleet measured on this kind of board under its ``--rpc-key`` is found on the board itself.
    The answer's matches name the key each config was recorded under."""
    return _resolve(source, workload, device_key, target, top, catalog, nearest=nearest, family=True,
                    device_identity=device_identity)


def exact_best_config(
    source: BestSource,
    workload: Workload | str,
    device_key: str,
    target: str = "cpu",
    *,
    catalog: TemplateCatalog | None = None,
) -> BestConfig:
    """The fastest ok config of exactly this workload, device and target that the template
    accepts, or ``default`` with ``why``: no family, no nearest shape. Cheap: the fastest trial is
    read alone (all of them only when it is rejected) and the device info once."""
    return _resolve(source, workload, device_key, target, 1, catalog, nearest=False, family=False)


def find_best(
    source: BestSource,
    workload: Workload | str,
    device_keys: str | Sequence[str],
    target: str = "cpu",
    top: int = 1,
    *,
    nearest: bool = False,
    validate: bool = False,
    catalog: TemplateCatalog | None = None,
) -> list[BestMatch]:
    """Up to ``top`` configs for ``workload`` on the device(s), best first; ``[]`` if none.

    Exact matches come first and alone. Without one, a shape inside the range of a tuned family
    gets the config of the family's nearest representative valid for it, always; other shapes get
    the nearest tuned shape's only with ``nearest`` (module docstring). ``validate`` also drops
    exact matches whose config the installed template no longer accepts. ``catalog`` defaults to
    the production templates (needed only for ``nearest`` and ``validate``).
    """
    workload = _workload(workload)
    keys = [device_keys] if isinstance(device_keys, str) else list(device_keys)
    matches, _ = _Search(source, workload, keys, target, catalog).run(top, validate=validate, nearest=nearest,
                                                                      family=True)
    return matches


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


def keys_of_device(source: BestSource, identity: str) -> list[str]:
    """The device keys under which ``source`` recorded a device whose identity is ``identity``.

    A device's identity is the key it detects for itself (``DeviceInfo.default_key``: arch, board or
    CPU model, cores, vector ISA, GPU), computed from the info recorded with its trials, so it holds
    whatever key a fleet measured it under, and for logs written before identities were asked for.
    Keys recorded without info have no identity and are never included.
    """
    from measure_agent.device import DeviceInfo

    keys = []
    for key, info in source.recorded_devices().items():
        if not info:
            continue
        try:
            if DeviceInfo.from_json(info).default_key == identity:
                keys.append(key)
        except (ValueError, TypeError):
            continue  # info another version recorded in a shape this one cannot read: no identity
    return keys


def recorded_device(source: BestSource, device_key: str) -> DeviceInfo | None:
    """The :class:`~measure_agent.device.DeviceInfo` the source recorded for ``device_key``, or
    ``None`` when it has none (the template then assumes a generic device)."""
    from measure_agent.device import DeviceInfo

    return DeviceInfo.from_recorded(source.recorded_device_info(device_key))


# -- internals ---------------------------------------------------------------------------------
def _workload(workload: Workload | str) -> Workload:
    return parse_workload(workload) if isinstance(workload, str) else workload


def _resolve(source: BestSource, workload: Workload | str, device_key: str, target: str, top: int,
             catalog: TemplateCatalog | None, *, nearest: bool, family: bool,
             device_identity: str | None = None) -> BestConfig:
    workload = _workload(workload)
    keys = source.resolve_device_keys(device_key)
    if device_identity:
        keys += [key for key in keys_of_device(source, device_identity) if key not in keys]
    search = _Search(source, workload, keys, target, catalog)
    matches, rejected = search.run(top, validate=True, nearest=nearest, family=family)
    if not matches:
        return BestConfig(workload, target, device_key, tuple(keys), _why_none(source, rejected), rejected=rejected)
    first = matches[0]
    return BestConfig(workload, target, device_key, tuple(keys), _why_found(workload, device_key, first, device_identity),
                      tuple(matches), tuned_on=search.device(first.device_key), rejected=rejected)


def _why_found(workload: Workload, device_key: str, match: BestMatch, device_identity: str | None = None) -> str:
    where = f"the config tuned for {match.tuned_workload} on {match.device_key}"
    if match.family:
        why = (f"{workload.key} is in the tuned range {match.family}; using {where} (its nearest representative, "
               f"log-distance {match.distance:.2f})")
    elif match.approximate:
        why = (f"no tuned config for {workload.key} on {device_key}; using {where} (nearest tuned shape, "
               f"log-distance {match.distance:.2f})")
    else:
        why = f"tuned for {workload.key} on {match.device_key}"
    if device_identity and match.device_key not in (device_key, device_identity):
        why += f" (key {match.device_key} holds trials measured by a device of identity {device_identity})"
    return why


def _why_none(source: BestSource, rejected: RejectedConfig | None) -> str:
    if rejected is None:
        return f"nothing tuned in {source.name}"
    record = rejected.record
    return (f"{source.name} has one, rejected: its config {record.config} for {record.device_key} is not valid for "
            f"the installed template ({rejected.reason})")


class _Search:
    """One lookup: the exact trials, then a family's or the nearest shapes' (module docstring)."""

    def __init__(self, source: BestSource, workload: Workload, device_keys: list[str], target: str,
                 catalog: TemplateCatalog | None) -> None:
        self._source = source
        self._workload = workload
        self._keys = device_keys
        self._target = target
        self._catalog = catalog
        self._devices: dict[str, DeviceInfo | None] = {}  # recorded device per key, read once

    def run(self, top: int, *, validate: bool, nearest: bool,
            family: bool) -> tuple[list[BestMatch], RejectedConfig | None]:
        if type(top) is not int or top < 1:
            raise ValueError(f"top must be a positive integer, not {top!r}")
        exact, rejected = self._exact(top, validate)
        if exact:
            return exact, None
        family_key, members = self._family() if family else (None, [])
        if family_key is None and not nearest:
            return [], rejected
        tuned = set(self._source.tuned_workload_keys(self._workload.op, self._workload.dtype, self._keys,
                                                     self._target))
        keys = [k for k in members if k in tuned] if family_key is not None else sorted(tuned)
        for distance, key in self._by_distance(keys):
            found = []
            for record in self._ranked(key, top):
                try:
                    config = transfer_config(self.space(record.device_key), record.config)
                except ConfigError:
                    continue
                found.append(BestMatch(self._workload.key, record, config.to_json(), approximate=True,
                                       distance=distance, family=family_key))
                if len(found) == top:
                    break
            if found:
                return found, rejected
        return [], rejected

    def _exact(self, top: int, validate: bool) -> tuple[list[BestMatch], RejectedConfig | None]:
        key = self._workload.key
        if not validate:
            return [BestMatch(key, r, r.config) for r in self._source.best(key, self._keys, self._target, top=top)], None
        found: list[BestMatch] = []
        rejected = None
        for record in self._ranked(key, top):
            try:
                config = self.space(record.device_key).from_json(record.config)
            except ConfigError as exc:
                rejected = rejected or RejectedConfig(record, str(exc))
                continue
            found.append(BestMatch(key, record, config.to_json()))
            if len(found) == top:
                break
        return found, (rejected if not found else None)

    def _ranked(self, workload_key: str, top: int) -> Iterator[TrialRecord]:
        """The ok trials fastest first; the ``top`` fastest are read alone, the rest only if needed
        (when the template rejects some of those), so the usual lookup reads ``top`` rows."""
        first = self._source.best(workload_key, self._keys, self._target, top=top)
        yield from first
        if len(first) == top:
            yield from self._source.best(workload_key, self._keys, self._target, top=None)[top:]

    def _by_distance(self, keys: list[str]) -> list[tuple[float, str]]:
        ranked = []
        for key in keys:
            other = parse_workload(key)
            if other.key == self._workload.key:
                continue
            flops_gap = abs(math.log2(other.flops / self._workload.flops))
            ranked.append((workload_distance(self._workload, other), flops_gap, key))
        return [(distance, key) for distance, _, key in sorted(ranked)]

    def _family(self) -> tuple[str | None, list[str]]:
        """The tuned family whose range contains the workload (the narrowest if several), and its members."""
        from measure_agent.workload.family import parse_family

        found = []
        for key, members in self._source.families(self._workload.op, self._workload.dtype):
            family = parse_family(key)
            if family.contains(self._workload):
                width = sum(math.log2(hi / lo) for _, lo, hi in family.ranges)
                found.append((width, key, members))
        if not found:
            return None, []
        _, key, members = min(found)
        return key, members

    def device(self, device_key: str) -> DeviceInfo | None:
        if device_key not in self._devices:
            self._devices[device_key] = recorded_device(self._source, device_key)
        return self._devices[device_key]

    def space(self, device_key: str) -> ConfigSpace:
        """The workload's space for configs measured on ``device_key`` (the catalog caches spaces)."""
        if self._catalog is None:
            from measure_agent.templates import default_catalog

            self._catalog = default_catalog()
        return self._catalog.space(self._workload, self._target, self.device(device_key))


__all__ = [
    "BEST_CONFIG_KINDS",
    "BestConfig",
    "BestMatch",
    "BestSource",
    "RejectedConfig",
    "exact_best_config",
    "find_best",
    "recorded_device",
    "resolve_best_config",
    "transfer_config",
    "workload_distance",
]
