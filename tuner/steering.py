"""What users impose on a search: pinned knobs, constraints, and target strings.

``--pin KNOB=VALUE`` fixes a knob; ``--constraint "EXPR"`` narrows the space with an expression over
knob names (parsed safely: arithmetic, comparisons, and/or; never ``eval``). In an expression, a
split knob's name stands for its tile size, the product of its inner factors. Both are validated
against the template's space, and a combination that leaves no valid config is refused, as is one
that takes longer than :data:`CONSTRAINT_CHECK_BUDGET_S` to check.

Target strings follow TVM: ``cpu``, ``cuda``, ``"cuda -arch=sm_72"``, ``"llvm -mcpu=cortex-a72"``,
``"llvm -mattr=+avx2,+fma"``. The family (cpu or cuda) picks the templates; the options say which
agents of a fleet may measure the job.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from measure_agent.bounded_json import JSONBoundsError, loads_bounded
from measure_agent.space import (
    ConfigError,
    ConfigSpace,
    Constraint,
    Knob,
    RestrictionError,
    SplitKnob,
    parse_restriction,
)
from measure_agent.space.space import MAX_CONFIG_JSON_CHARS

# How long steer_space may spend checking pins and constraints against a space (counting its valid
# configs evaluates them once per combination, up to millions): the daemon validates a submitted
# job on an RPC thread, so a costly constraint is refused rather than left to stall it.
CONSTRAINT_CHECK_BUDGET_S = 10.0
_CLOCK_EVERY = 256  # evaluations between two looks at the clock
_SHOWN_CHARS = 80  # of a pin or constraint named in a message


class SteeringError(ValueError):
    """A pin, constraint or target string that does not fit (one-line message)."""


# -- pins and constraints ------------------------------------------------------------------------
def parse_pin(text: str) -> tuple[str, str]:
    """``"KNOB=VALUE"`` -> (knob, raw value); the value is checked against the space later."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise SteeringError(f"--pin takes KNOB=VALUE, not {text!r}")
    return name.strip(), value.strip()


def _pin_value(space: ConfigSpace, name: str, raw: str) -> Any:
    try:
        knob = space.knob(name)
    except KeyError:
        raise SteeringError(f"cannot pin unknown knob {name!r}; knobs are {', '.join(space.knob_names)}") from None
    try:
        value = loads_bounded(raw, "the value", max_chars=MAX_CONFIG_JSON_CHARS)
    except json.JSONDecodeError:
        value = raw  # a bare word: a string choice
    except JSONBoundsError as exc:
        raise SteeringError(f"cannot pin {name}={_shortened(raw)}: {exc}") from None
    try:
        return knob.from_json(value)
    except ConfigError as exc:
        raise SteeringError(f"cannot pin {name}={_shortened(raw)}: {exc}") from None


def _shortened(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _expression_value(knob: Knob) -> Callable[[Any], Any]:
    """How a knob's value reads in a constraint: a split's is its tile size, the product of its
    inner factors (computed once per value of the knob: constraints are evaluated millions of
    times); any other is itself."""
    if not isinstance(knob, SplitKnob):
        return lambda value: value
    tile_sizes = {value: math.prod(value[1:]) for value in knob.values}

    def tile_size(value: Any) -> int:
        try:
            return tile_sizes[value]
        except (KeyError, TypeError):  # not one of the knob's values (a list from JSON, say)
            return math.prod(value[1:])

    return tile_size


class _CheckClock:
    """The time left to check pins and constraints; every constraint evaluation ticks, and a tick
    that finds the budget spent (looking at the clock only every ``_CLOCK_EVERY`` ticks) refuses
    the constraint being evaluated. Stopped once the space is checked: the tuning that follows is
    bounded by its own budgets."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.deadline: float | None = time.monotonic() + budget_s
        self.ticks = 0

    def tick(self, description: str) -> None:
        self.ticks += 1
        if self.ticks % _CLOCK_EVERY == 0 and self.deadline is not None and time.monotonic() > self.deadline:
            raise SteeringError(f"constraint {_shortened(description)!r} is too costly to check: checking the pins and "
                                f"constraints against the space took over {self.budget_s:g} s "
                                f"({self.ticks} evaluations); simplify it or pin some of its knobs")

    def stop(self) -> None:
        self.deadline = None


def steer_space(space: ConfigSpace, pins: Sequence[tuple[str, str]] = (),
                constraints: Sequence[str] = (), budget_s: float | None = None) -> ConfigSpace:
    """``space`` narrowed by pins and constraints; raises :class:`SteeringError`, also when
    checking them against the space takes longer than ``budget_s`` seconds (default
    :data:`CONSTRAINT_CHECK_BUDGET_S`)."""
    if not pins and not constraints:
        return space
    clock = _CheckClock(CONSTRAINT_CHECK_BUDGET_S if budget_s is None else budget_s)
    added: list[Constraint] = []
    for name, raw in pins:
        pinned = _pin_value(space, name, raw)
        description = f"{name} = {_shortened(raw)} (pinned)"

        def is_pinned(value: Any, pinned=pinned, description=description) -> bool:
            clock.tick(description)
            return value == pinned

        added.append(Constraint((name,), is_pinned, description))
    for text in constraints:
        try:
            restriction = parse_restriction(text, space.knob_names)
        except RestrictionError as exc:
            raise SteeringError(str(exc)) from None
        if not restriction.names:
            raise SteeringError(f"constraint {text!r} names no knob")
        readers = tuple((n, _expression_value(space.knob(n))) for n in restriction.names)

        def holds(*values: Any, restriction=restriction, readers=readers, text=text) -> bool:
            clock.tick(text)
            return restriction({n: read(v) for (n, read), v in zip(readers, values)})

        added.append(Constraint(tuple(restriction.names), holds, text))
    steered = ConfigSpace(space.knobs, tuple(space.constraints) + tuple(added))
    try:  # counting evaluates every constraint once per combination: bad ones fail here, not later
        try:
            size = steered.size
        except OverflowError:  # a group too large to count: look for one valid config instead
            try:
                steered.sample(np.random.default_rng(0))
                size = 1
            except ConfigError:
                size = 0
    except RestrictionError as exc:  # e.g. comparing a number with a string, a huge power
        raise SteeringError(str(exc)) from None
    finally:
        clock.stop()
    if size == 0:
        raise SteeringError("the pins and constraints leave no valid config: "
                            + "; ".join(c.description for c in added))
    return steered


# -- target strings ------------------------------------------------------------------------------
_FAMILIES = {"cpu": "cpu", "llvm": "cpu", "c": "cpu", "cuda": "cuda", "nvptx": "cuda", "sleep": "sleep"}


@dataclass(frozen=True)
class TargetSpec:
    """A parsed target: the template family and what a measuring device must have."""

    text: str
    family: str
    arch: str | None = None  # cuda: sm_XY
    mcpu: str | None = None
    mattr: tuple[str, ...] = ()  # "+avx2", "-avx512f"

    @property
    def has_requirements(self) -> bool:
        return bool(self.arch or self.mcpu or self.mattr)

    def matches(self, device: Mapping[str, Any]) -> bool:
        """Whether a device (its info as recorded: isa_features, cpu_model, compute_capability...) fits."""
        if self.arch:
            wanted = self.arch.removeprefix("sm_")
            capability = str(device.get("compute_capability", "")).replace(".", "")
            if capability != wanted:
                return False
        if self.mcpu:
            names = " ".join(str(device.get(k, "")) for k in ("cpu_model", "board", "llvm_cpu"))
            if _alnum(self.mcpu) not in _alnum(names):
                return False
        features = {f.lower() for f in device.get("isa_features", ())}
        for attr in self.mattr:
            present = attr[1:].lower() in features
            if present != attr.startswith("+"):
                return False
        return True

    def describe(self) -> str:
        return self.text


def _alnum(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def parse_target(text: str) -> TargetSpec:
    """Parse a TVM-style target string; raises :class:`SteeringError`."""
    try:
        words = shlex.split(text or "cpu")
    except ValueError as exc:
        raise SteeringError(f"cannot parse target {text!r}: {exc}") from None
    if not words:
        words = ["cpu"]
    family = _FAMILIES.get(words[0])
    if family is None:
        raise SteeringError(f"unknown target {words[0]!r}; expected cpu, cuda, llvm (e.g. \"llvm -mattr=+avx2\")")
    arch = mcpu = None
    mattr: list[str] = []
    for word in words[1:]:
        key, _, value = word.lstrip("-").partition("=")
        if not value:
            raise SteeringError(f"target option {word!r} needs a value, e.g. -arch=sm_72")
        if key == "arch" and family == "cuda":
            if not re.fullmatch(r"sm_\d{2,3}", value):
                raise SteeringError(f"cuda -arch takes sm_XY (e.g. sm_72), not {value!r}")
            arch = value
        elif key == "mcpu" and family == "cpu":
            mcpu = value
        elif key == "mattr" and family == "cpu":
            for attr in value.split(","):
                if not re.fullmatch(r"[+-][a-z0-9_.]+", attr.strip().lower()):
                    raise SteeringError(f"-mattr takes +feature or -feature, not {attr!r}")
                mattr.append(attr.strip().lower())
        elif key in ("keys", "model", "libs", "num-cores", "device", "max_num_threads", "thread_warp_size"):
            continue  # TVM options that do not constrain which device measures
        else:
            raise SteeringError(f"target option -{key} is not understood for {words[0]}")
    return TargetSpec(text=" ".join(words), family=family, arch=arch, mcpu=mcpu, mattr=tuple(mattr))
