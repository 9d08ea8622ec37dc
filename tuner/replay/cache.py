"""Kernel Tuner cache files as replayable tuning spaces.

A cache file (``.json`` or ``.json.gz``) holds ``tune_params`` (name -> list of values),
``tune_params_keys`` (the order of values in each cache key), optional ``restrictions`` (Kernel
Tuner expressions over the params) and ``cache``: ``"v1,v2,...": {param: value, ..., "time": ms}``
where a string ``time`` (``"ErrorConfig"``, ``"CompilationFailedConfig"``,
``"RuntimeFailedConfig"``, ...) marks a config that failed.

The space is the product of ``tune_params`` narrowed by the restrictions; a config of that space
missing from the cache counts as failed. Without a ``restrictions`` key the space is exactly the
set of configs in the cache.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from measure_agent.space import ChoiceKnob, Config, ConfigSpace, Constraint, RestrictionError, restriction_constraint
from tuner.user_space.cache_file import CacheFileError, read_cache_json

FAILED_TIMES = ("ErrorConfig", "CompilationFailedConfig", "RuntimeFailedConfig", "InvalidConfig")


class ReplayError(ValueError):
    """A cache file that cannot be replayed (one-line message)."""


@dataclass
class ReplaySpace:
    """A recorded tuning space: every config's time (None: failed), in the file's unit."""

    name: str
    kernel: str
    device: str
    space: ConfigSpace
    times: dict[tuple, float | None]  # values in tune_params_keys order -> time or None
    size: int  # configs in the space (failed and missing ones included)
    path: str = ""
    meta: dict = field(default_factory=dict)
    skipped: int = 0  # cache entries left out: values outside tune_params, or outside the restrictions
    # The parsed cache data: a space pickles as this data and is parsed again where it is unpickled,
    # since its constraints are closures (worker processes are spawned, never forked: see bench.py).
    source: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    def __reduce__(self):
        if self.source is None:
            raise TypeError(f"{self.name}: a ReplaySpace built without its cache data cannot be pickled")
        return (parse_cache, (self.source, self.name, self.path))

    def __post_init__(self) -> None:
        ok = sorted(t for t in self.times.values() if t is not None)
        self.sorted_times = np.array(ok, dtype=np.float64)
        if not len(ok):
            raise ReplayError(f"{self.name}: no config of the space succeeded")
        self.optimum = float(ok[0])
        self.n_failed = self.size - len(ok)

    @property
    def family(self) -> str:
        """Kernel family for grouping results: the file name up to its first underscore."""
        return self.name.split("_", 1)[0]

    def key(self, config: Config) -> tuple:
        return tuple(v for _, v in config.items)

    def cost(self, config: Config) -> float | None:
        """The recorded time of a config, or None if it failed (or is not in the cache)."""
        return self.times.get(self.key(config))

    def __call__(self, params: Mapping[str, Any]) -> float | None:
        """Objective form for :func:`tuner.user_space.tune_function`: a dict of param values."""
        return self.times.get(tuple(params[n] for n in self.space.knob_names))


def _read_json(path: Path) -> dict:
    try:
        return read_cache_json(path)  # also a cache its writer never closed (a crashed run)
    except CacheFileError as exc:
        raise ReplayError(str(exc)) from None


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def find_cache_files(directory: str | os.PathLike, only: Sequence[str] = ()) -> list[Path]:
    """The Kernel Tuner cache files (``*.json``, ``*.json.gz``) of a folder, sorted; with ``only``,
    those whose file name contains one of its substrings."""
    files = sorted(p for p in Path(directory).glob("*.json*") if p.name.endswith((".json", ".json.gz")))
    keep = [s for s in only if s]
    return [p for p in files if any(s in p.name for s in keep)] if keep else files


def load_cache(path: str | os.PathLike, name: str | None = None) -> ReplaySpace:
    """Read a Kernel Tuner cache file into a :class:`ReplaySpace`. Raises :class:`ReplayError`."""
    path = Path(path)
    data = _read_json(path)
    label = name or path.name.removesuffix(".gz").removesuffix(".json")
    return parse_cache(data, label, str(path))


def parse_cache(data: Mapping[str, Any], name: str = "space", path: str = "") -> ReplaySpace:
    for required in ("tune_params", "cache"):
        if required not in data:
            raise ReplayError(f"{name}: cache file lacks {required!r}")
    tune_params = data["tune_params"]
    if not isinstance(tune_params, dict) or not tune_params:
        raise ReplayError(f"{name}: 'tune_params' must map parameter names to lists of values")
    keys = list(data.get("tune_params_keys") or tune_params)
    if sorted(keys) != sorted(tune_params):
        raise ReplayError(f"{name}: 'tune_params_keys' does not match 'tune_params'")
    knobs = []
    for k in keys:
        values = tune_params[k]
        if not isinstance(values, list) or not values:
            raise ReplayError(f"{name}: tune_params[{k!r}] must be a non-empty list")
        try:
            knobs.append(ChoiceKnob(k, tuple(values)))
        except (ValueError, TypeError) as exc:
            raise ReplayError(f"{name}: {exc}") from None
    cache = data["cache"]
    if not isinstance(cache, dict):
        raise ReplayError(f"{name}: 'cache' must be an object")

    # Cache entries -> value tuples in ``keys`` order, matched to the knobs' own values.
    times: dict[tuple, float | None] = {}
    first_key: dict[tuple, str] = {}
    outside: list[str] = []
    for text, entry in cache.items():
        if not isinstance(entry, dict):
            raise ReplayError(f"{name}: cache entry {text!r} is not an object")
        parts = str(text).split(",")
        values = []
        for i, knob in enumerate(knobs):
            if knob.name in entry:
                found, value = _match(knob, entry[knob.name])
            elif len(parts) == len(knobs):
                found, value = _match(knob, parts[i].strip(), by_text=True)
            else:
                raise ReplayError(f"{name}: cache entry {text!r} lacks parameter {knob.name!r}")
            if not found:
                outside.append(str(text))  # a value outside tune_params: not a config of this space
                break
            values.append(value)
        else:
            config, t = tuple(values), _time(name, text, entry)
            if config in times and times[config] != t:
                raise ReplayError(f"{name}: cache entries {first_key[config]!r} and {text!r} are the same config "
                                  f"with different times ({times[config]!r}, {t!r})")
            times[config] = t
            first_key.setdefault(config, str(text))
    if cache and not times:
        raise ReplayError(f"{name}: none of the {len(cache)} cache entries is a config of 'tune_params' "
                          f"(first key {outside[0]!r})")
    matched = len(times)

    if "restrictions" in data and data["restrictions"] is not None:
        restrictions = data["restrictions"]
        if isinstance(restrictions, str):
            restrictions = [restrictions]
        if not isinstance(restrictions, list) or not all(isinstance(r, str) for r in restrictions):
            raise ReplayError(f"{name}: 'restrictions' must be a list of expression strings")
        try:
            constraints = [c for c in (restriction_constraint(text, keys) for text in restrictions) if c is not None]
        except RestrictionError as exc:
            raise ReplayError(f"{name}: {exc}") from None
        space = ConfigSpace(knobs, constraints)
        try:
            size = space.size
            times = {k: v for k, v in times.items() if _holds(space, k)}
        except RestrictionError as exc:
            raise ReplayError(f"{name}: {exc}") from None
        except OverflowError:
            raise ReplayError(f"{name}: the restrictions tie too many parameters together to count the space") from None
    else:
        # The space is the set of configs in the cache: one membership constraint over the knobs
        # that vary (constant knobs stay out of it, so the group stays as small as it can).
        varying = [k.name for k in knobs if k.size > 1]
        positions = [keys.index(n) for n in varying]
        members = {tuple(v[p] for p in positions) for v in times}
        if len(members) != len(times):
            raise ReplayError(f"{name}: cache keys disagree on parameters that have one value")
        constraints = []
        if varying:
            constraints.append(Constraint(tuple(varying), lambda *vals: vals in members, "recorded in the cache",
                                          allowed=frozenset(members)))
        space = ConfigSpace(knobs, constraints)
        size = len(times)
    meta = {k: v for k, v in data.items() if k not in ("cache",)}
    return ReplaySpace(
        skipped=len(outside) + matched - len(times),
        name=name,
        kernel=str(data.get("kernel_name", name)),
        device=str(data.get("device_name", "")),
        space=space,
        times=times,
        size=size,
        path=path,
        meta=meta,
        source=data,
    )


def _match(knob: ChoiceKnob, raw: Any, by_text: bool = False) -> tuple[bool, Any]:
    if not by_text:
        for value in knob.values:
            if _same(value, raw):
                return True, value
    text = str(raw)
    for value in knob.values:
        if str(value) == text:
            return True, value
    return False, None


def _time(name: str, key: str, entry: Mapping[str, Any]) -> float | None:
    """The time of a cache entry; None for a failed config (a string such as "ErrorConfig")."""
    t = entry.get("time")
    if isinstance(t, str):
        # Kernel Tuner marks failures with the names of its error classes, all "...Config"
        if t in FAILED_TIMES or (t.endswith("Config") and t.isidentifier()):
            return None
        raise ReplayError(f"{name}: cache entry {key!r} has time {t!r}, neither a number nor a failure "
                          f"marker ({', '.join(FAILED_TIMES)})")
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        try:
            value = float(t)
        except OverflowError:
            value = math.inf
        if math.isfinite(value) and value > 0:
            return value
    raise ReplayError(f"{name}: cache entry {key!r} has no usable time ({t!r})")


def _holds(space: ConfigSpace, values: tuple) -> bool:
    named = dict(zip(space.knob_names, values))
    return all(c.holds(named) for c in space.constraints)
