"""Configurations and the schedule space they live in.

A :class:`ConfigSpace` is the product of its knobs' values, narrowed by constraints. Knobs tied
together by constraints form groups; the valid combinations of each group are enumerated once (they
are small: a constraint names a few knobs), so the space can be counted exactly and sampled
uniformly without ever enumerating the full product, which for real templates has millions of
points.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from measure_agent.bounded_json import JSONBoundsError, loads_bounded
from measure_agent.space.knobs import ConfigError, Knob

# A constraint group larger than this is not enumerated; it is sampled by rejection instead.
_MAX_GROUP_ENUMERATION = 2_000_000
# A config's JSON text (a few knobs, each a number, a word or a short list) is far shorter than this.
MAX_CONFIG_JSON_CHARS = 2**20


def canonical_config_text(config_json: Mapping[str, Any]) -> str:
    """Compact JSON text with sorted keys of a config's JSON form (:meth:`Config.to_json`): the
    config as the tuning log stores it, whoever builds it (a :class:`Config` or a log record)."""
    return json.dumps(config_json, sort_keys=True, separators=(",", ":"))


def config_digest(config_text: str) -> str:
    """The identity of a canonical config text: the first 16 hex digits of its SHA-1. The log's
    unique key per (workload, device, target) holds these, so the formula must never change."""
    return hashlib.sha1(config_text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Config:
    """An immutable assignment of a value to every knob of a space."""

    items: tuple[tuple[str, Any], ...]

    def __getitem__(self, name: str) -> Any:
        for key, value in self.items:
            if key == name:
                return value
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form: splits become lists."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.items}

    def json_text(self) -> str:
        """Canonical compact JSON text (sorted keys): the identity of a config in the log."""
        return self._identity[0]

    @property
    def digest(self) -> str:
        return self._identity[1]

    @cached_property
    def _identity(self) -> tuple[str, str]:
        # Computed once per config (a search, a job and the daemon ask for it several times per
        # candidate); kept in the instance's __dict__, outside the fields that equality and hash use.
        text = canonical_config_text(self.to_json())
        return text, config_digest(text)

    def __str__(self) -> str:
        return self.json_text()


@dataclass(frozen=True)
class Constraint:
    """A predicate over some knobs, called with their values in ``knobs`` order."""

    knobs: tuple[str, ...]
    predicate: Callable[..., bool]
    description: str
    # The value tuples (in ``knobs`` order) for which the predicate holds, when the constraint is
    # a list of allowed combinations: the space then enumerates them instead of the knobs' product.
    allowed: frozenset[tuple] | None = None

    def holds(self, config_values: dict[str, Any]) -> bool:
        return bool(self.predicate(*(config_values[k] for k in self.knobs)))


class ConfigSpace:
    """The valid configurations of a template for one workload and device."""

    def __init__(self, knobs: Sequence[Knob], constraints: Sequence[Constraint] = ()) -> None:
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate knob names in {names}")
        self.knobs: tuple[Knob, ...] = tuple(knobs)
        self._by_name = {k.name: k for k in self.knobs}
        for c in constraints:
            missing = [n for n in c.knobs if n not in self._by_name]
            if missing:
                raise ValueError(f"constraint {c.description!r} names unknown knob {missing[0]}")
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self._groups = self._constraint_groups()
        self._group_valid: dict[tuple[str, ...], list[tuple[int, ...]] | None] = {}

    # -- structure -------------------------------------------------------------------------
    def knob(self, name: str) -> Knob:
        return self._by_name[name]

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    @property
    def product_size(self) -> int:
        """Size of the unconstrained product of all knobs."""
        return math.prod(k.size for k in self.knobs)

    @property
    def size(self) -> int:
        """Exact number of valid configurations."""
        total = 1
        for group in self._groups:
            valid = self.group_combinations(group)
            if valid is None:
                raise OverflowError("constraint group too large to count exactly")
            total *= len(valid)
        for knob in self.knobs:
            if not any(knob.name in g for g in self._groups):
                total *= knob.size
        return total

    # -- conversion -------------------------------------------------------------------------
    def make(self, values: dict[str, Any]) -> Config:
        """A config from a name -> value mapping; raises :class:`ConfigError` if not valid."""
        config = self._config_unchecked(values)
        self.validate(config)
        return config

    def from_json(self, obj: Any) -> Config:
        """Parse and validate the JSON form of a config (a dict, or its text)."""
        if isinstance(obj, str):
            try:
                obj = loads_bounded(obj, "config", max_chars=MAX_CONFIG_JSON_CHARS)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"config is not valid JSON: {exc.msg}") from None
            except JSONBoundsError as exc:
                raise ConfigError(str(exc)) from None
        if not isinstance(obj, dict):
            raise ConfigError("config must be a JSON object mapping knob names to values")
        unknown = [k for k in obj if k not in self._by_name]
        if unknown:
            raise ConfigError(f"unknown knob {unknown[0]!r}; knobs are {', '.join(self.knob_names)}")
        missing = [k for k in self.knob_names if k not in obj]
        if missing:
            raise ConfigError(f"config lacks knob {missing[0]!r}")
        # Each knob's from_json returns a member of the knob (or raises): what make() would check
        # again; only the constraints are left to check.
        values = {name: self._by_name[name].from_json(obj[name]) for name in self.knob_names}
        for c in self.constraints:
            if not c.holds(values):
                raise ConfigError(f"config violates constraint: {c.description}")
        return Config(tuple(values.items()))

    def validate(self, config: Config) -> None:
        names = [k for k, _ in config.items]
        if tuple(names) != self.knob_names:
            raise ConfigError(f"config knobs {names} do not match the space {list(self.knob_names)}")
        values = config.as_dict()
        for knob in self.knobs:
            knob.index_of(values[knob.name])
        for c in self.constraints:
            if not c.holds(values):
                raise ConfigError(f"config violates constraint: {c.description}")

    def is_valid(self, config: Config) -> bool:
        try:
            self.validate(config)
        except ConfigError:
            return False
        return True

    def index_of(self, config: Config) -> int:
        """Position of a config in the unconstrained product (mixed radix, first knob slowest)."""
        index = 0
        for knob in self.knobs:
            index = index * knob.size + knob.index_of(config[knob.name])
        return index

    def from_index(self, index: int) -> Config:
        """Inverse of :meth:`index_of` (the result may violate constraints)."""
        if not 0 <= index < self.product_size:
            raise ConfigError(f"index {index} outside the space of {self.product_size}")
        digits = []
        for knob in reversed(self.knobs):
            index, digit = divmod(index, knob.size)
            digits.append(knob.values[digit])
        return Config(tuple(zip(self.knob_names, reversed(digits))))

    def indices(self, config: Config) -> tuple[int, ...]:
        return tuple(k.index_of(config[k.name]) for k in self.knobs)

    def from_indices(self, indices: Sequence[int]) -> Config:
        return Config(tuple((k.name, k.values[i]) for k, i in zip(self.knobs, indices)))

    # -- exploration ------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator, count: int = 1) -> list[Config]:
        """``count`` configs drawn uniformly (with replacement) from the valid space."""
        return [self._sample_one(rng) for _ in range(count)]

    def iter_valid(self) -> Iterator[Config]:
        """All valid configs in index order (lazy; the space may be huge).

        Walks the knobs depth-first and cuts every prefix that no valid combination of a
        constraint group starts with, so it never scans long runs of invalid configs (only
        groups too large to enumerate are checked when complete).
        """
        n = len(self.knobs)
        where: dict[int, tuple[int, int]] = {}  # knob position -> (group, position in group)
        prefixes: list[list[set[tuple[int, ...]]] | None] = []
        group_constraints: list[list[Constraint]] = []
        for g, group in enumerate(self._groups):
            for j, name in enumerate(group):
                where[self.knob_names.index(name)] = (g, j)
            valid = self.group_combinations(group)
            if valid is not None and not valid:
                return
            prefixes.append(None if valid is None else [{v[:j + 1] for v in valid} for j in range(len(group))])
            group_constraints.append([c for c in self.constraints if c.knobs[0] in group])
        digits = [0] * n
        partial: list[list[int]] = [[] for _ in self._groups]

        def complete_group_ok(g: int) -> bool:
            values = {name: self._by_name[name].values[d] for name, d in zip(self._groups[g], partial[g])}
            return all(c.holds(values) for c in group_constraints[g])

        def walk(position: int) -> Iterator[Config]:
            if position == n:
                yield self.from_indices(digits)
                return
            slot = where.get(position)
            for d in range(self.knobs[position].size):
                digits[position] = d
                if slot is None:
                    yield from walk(position + 1)
                    continue
                g, j = slot
                partial[g].append(d)
                allowed = prefixes[g]
                if allowed is not None:
                    ok = tuple(partial[g]) in allowed[j]
                else:
                    ok = j < len(self._groups[g]) - 1 or complete_group_ok(g)
                if ok:
                    yield from walk(position + 1)
                partial[g].pop()

        yield from walk(0)

    def empty_reason(self) -> str | None:
        """Why the space has no valid config (the constraints of a group that excludes every
        combination), or None when it has some or cannot tell (a group too large to enumerate)."""
        for group in self._groups:
            if self.group_combinations(group) == []:
                rules = "; ".join(c.description for c in self.constraints if c.knobs[0] in group)
                return f"no combination of {', '.join(group)} satisfies: {rules}"
        return None

    def neighbours(self, config: Config) -> list[Config]:
        """Valid configs that differ in one knob, by one step of its value order."""
        base = list(self.indices(config))
        out = []
        for pos, knob in enumerate(self.knobs):
            for step in (-1, 1):
                j = base[pos] + step
                if 0 <= j < knob.size:
                    digits = base.copy()
                    digits[pos] = j
                    candidate = self.from_indices(digits)
                    if self.is_valid(candidate):
                        out.append(candidate)
        return out

    def mutate(self, config: Config, rng: np.random.Generator, knobs_to_change: int = 1) -> Config:
        """A valid config with up to ``knobs_to_change`` knobs set to random values."""
        base = list(self.indices(config))
        for _ in range(100):
            digits = base.copy()
            for pos in rng.choice(len(self.knobs), size=min(knobs_to_change, len(self.knobs)), replace=False):
                digits[pos] = int(rng.integers(self.knobs[pos].size))
            candidate = self.from_indices(digits)
            if self.is_valid(candidate):
                return candidate
        return config

    # -- internals --------------------------------------------------------------------------
    def _config_unchecked(self, values: dict[str, Any]) -> Config:
        unknown = [k for k in values if k not in self._by_name]
        if unknown:
            raise ConfigError(f"unknown knob {unknown[0]!r}; knobs are {', '.join(self.knob_names)}")
        missing = [k for k in self.knob_names if k not in values]
        if missing:
            raise ConfigError(f"config lacks knob {missing[0]!r}")
        return Config(tuple((name, values[name]) for name in self.knob_names))

    def _constraint_groups(self) -> list[tuple[str, ...]]:
        parent = {name: name for name in self._by_name}

        def find(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for c in self.constraints:
            for other in c.knobs[1:]:
                parent[find(other)] = find(c.knobs[0])
        groups: dict[str, list[str]] = {}
        for c in self.constraints:
            for name in c.knobs:
                groups.setdefault(find(name), [])
        for name in self.knob_names:
            root = find(name)
            if root in groups:
                groups[root].append(name)
        return [tuple(g) for g in groups.values()]

    def group_combinations(self, group: tuple[str, ...]) -> list[tuple[int, ...]] | None:
        """The valid digit tuples of a constraint group (its knobs in space order), sorted; None
        when the group is too large to enumerate."""
        if group not in self._group_valid:
            knobs = [self._by_name[n] for n in group]
            constraints = [c for c in self.constraints if c.knobs[0] in group]
            listed = next((c for c in constraints if c.allowed is not None and set(c.knobs) == set(group)), None)
            if listed is not None:
                self._group_valid[group] = self._listed_combos(group, listed, constraints)
            elif math.prod(k.size for k in knobs) > _MAX_GROUP_ENUMERATION:
                self._group_valid[group] = None
            else:
                valid = []
                for digits in itertools.product(*(range(k.size) for k in knobs)):
                    values = {k.name: k.values[d] for k, d in zip(knobs, digits)}
                    if all(c.holds(values) for c in constraints):
                        valid.append(digits)
                self._group_valid[group] = valid
        return self._group_valid[group]

    def _listed_combos(self, group: tuple[str, ...], listed: Constraint,
                       constraints: list[Constraint]) -> list[tuple[int, ...]]:
        order = [listed.knobs.index(name) for name in group]
        knobs = [self._by_name[n] for n in group]
        valid = set()
        for values in listed.allowed or ():
            try:
                digits = tuple(k.index_of(values[i]) for k, i in zip(knobs, order))
            except ConfigError:
                continue
            named = {k.name: k.values[d] for k, d in zip(knobs, digits)}
            if all(c.holds(named) for c in constraints):
                valid.add(digits)
        return sorted(valid)

    def _sample_one(self, rng: np.random.Generator) -> Config:
        values: dict[str, Any] = {}
        for group in self._groups:
            valid = self.group_combinations(group)
            if valid is None:
                values.update(self._reject_sample_group(group, rng))
                continue
            if not valid:
                raise ConfigError("the space has no valid configuration")
            digits = valid[int(rng.integers(len(valid)))]
            for name, d in zip(group, digits):
                values[name] = self._by_name[name].values[d]
        for knob in self.knobs:
            if knob.name not in values:
                values[knob.name] = knob.values[int(rng.integers(knob.size))]
        return Config(tuple((name, values[name]) for name in self.knob_names))

    def _reject_sample_group(self, group: tuple[str, ...], rng: np.random.Generator) -> dict[str, Any]:
        constraints = [c for c in self.constraints if c.knobs[0] in group]
        for _ in range(100_000):
            values = {n: self._by_name[n].values[int(rng.integers(self._by_name[n].size))] for n in group}
            if all(c.holds(values) for c in constraints):
                return values
        raise ConfigError("could not sample a valid configuration; constraints too tight")
