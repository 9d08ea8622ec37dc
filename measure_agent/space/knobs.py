"""Knobs: the dimensions of a schedule space.

A knob has a finite, ordered tuple of values. Order matters: neighbours in local search are
adjacent values, and the cost model sees a value's position as well as the value itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration that is not a member of its space."""


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _shown(values: tuple, limit: int = 12) -> str:
    """The values of a knob for an error message, shortened when there are many."""
    if len(values) <= limit:
        return str(list(values))
    return f"[{', '.join(map(repr, values[:limit // 2]))}, ..., {', '.join(map(repr, values[-2:]))}] ({len(values)} values)"


@dataclass(frozen=True)
class ChoiceKnob:
    """A categorical choice among ordered values (ints, strings or floats)."""

    name: str
    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"knob {self.name} has no values")
        positions: dict[Any, int] = {}
        for i, value in enumerate(self.values):
            if not _hashable(value):
                raise ValueError(f"knob {self.name}: value {value!r} is not hashable (use numbers, strings or tuples)")
            if value in positions:
                # True == 1 == 1.0 in Python, so these collide too
                raise ValueError(f"knob {self.name} has duplicate values {self.values[positions[value]]!r} and {value!r}")
            positions[value] = i
        object.__setattr__(self, "_positions", positions)

    @property
    def size(self) -> int:
        return len(self.values)

    def index_of(self, value: Any) -> int:
        position = self._positions.get(value) if _hashable(value) else None
        # True == 1 in Python: a bool is never a member of a non-bool knob, and the reverse
        if position is None or isinstance(value, bool) != isinstance(self.values[position], bool):
            raise ConfigError(f"value {value!r} of knob {self.name} is not one of {_shown(self.values)}")
        return position

    def to_json(self, value: Any) -> Any:
        return value

    def from_json(self, raw: Any) -> Any:
        # JSON may turn 2 into 2.0; accept what compares equal to a member of the same kind.
        return self.values[self.index_of(raw)]

    def numeric(self, value: Any) -> list[float]:
        """Numbers describing a value to a cost model (the value itself when numeric)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return [float(value)]
        return [float(self.index_of(value))]


@dataclass(frozen=True)
class BoolKnob(ChoiceKnob):
    """An on/off switch; ``False`` comes first."""

    values: tuple[Any, ...] = (False, True)

    def from_json(self, raw: Any) -> Any:
        if isinstance(raw, bool):
            self.index_of(raw)  # a knob may allow only one of them
            return raw
        raise ConfigError(f"value {raw!r} of knob {self.name} is not true or false")

    def numeric(self, value: Any) -> list[float]:
        return [1.0 if value else 0.0]


@dataclass(frozen=True)
class SplitKnob:
    """Split of an axis of length ``extent`` into ``len(factor_choices) + 1`` ordered factors.

    A value is a tuple ``(outer, f1, ..., fn)``: ``f1..fn`` are drawn from ``factor_choices[i]`` and
    ``outer = ceil(extent / (f1 * ... * fn))``, so tiles need not divide the axis (the template
    handles the remainder). Only values whose inner product does not exceed ``max(extent,
    fn)`` are members: a tile larger than the axis is the same schedule as one that fits.
    """

    name: str
    extent: int
    factor_choices: tuple[tuple[int, ...], ...]
    values: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        combos: list[tuple[int, ...]] = [()]
        for choices in self.factor_choices:
            combos = [c + (f,) for c in combos for f in choices]
        innermost_min = min(self.factor_choices[-1]) if self.factor_choices else 1
        limit = max(self.extent, innermost_min)
        values = []
        for inner in combos:
            product = math.prod(inner)
            if product <= limit or all(f == 1 for f in inner[:-1]) and inner[-1] == innermost_min:
                values.append((max(1, math.ceil(self.extent / product)),) + inner)
        if not values:
            raise ValueError(f"split knob {self.name} has no valid factors for extent {self.extent}")
        object.__setattr__(self, "values", tuple(values))
        object.__setattr__(self, "_positions", {value: i for i, value in enumerate(values)})

    @property
    def size(self) -> int:
        return len(self.values)

    def index_of(self, value: Any) -> int:
        try:
            return self._positions[tuple(value)]
        except (KeyError, TypeError):
            raise ConfigError(
                f"split {value!r} of knob {self.name} is not a valid split of {self.extent}"
            ) from None

    def to_json(self, value: tuple[int, ...]) -> list[int]:
        return list(value)

    def from_json(self, raw: Any) -> tuple[int, ...]:
        if not isinstance(raw, (list, tuple)) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in raw
        ):
            raise ConfigError(f"split knob {self.name} takes a list of integers, got {raw!r}")
        value = tuple(raw)
        self.index_of(value)
        return value

    def numeric(self, value: tuple[int, ...]) -> list[float]:
        return [float(f) for f in value]


Knob = ChoiceKnob | SplitKnob


def powers_of_two(limit: int, start: int = 1) -> tuple[int, ...]:
    """``start, 2*start, ...`` up to and including ``limit`` (at least ``start``)."""
    out = [start]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    return tuple(out)
