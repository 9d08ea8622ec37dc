"""What users impose on a search: pinned knobs, constraints, and target strings.

``--pin KNOB=VALUE`` fixes a knob; ``--constraint "EXPR"`` narrows the space with an expression over
knob names (parsed safely: arithmetic, comparisons, and/or; never ``eval``). In an expression, a
split knob's name stands for its tile size, the product of its inner factors. Both are validated
against the template's space, and a combination that leaves no valid config is refused.

Target strings follow TVM: ``cpu``, ``cuda``, ``"cuda -arch=sm_72"``, ``"llvm -mcpu=cortex-a72"``,
``"llvm -mattr=+avx2,+fma"``. The family (cpu or cuda) picks the templates; the options say which
agents of a fleet may measure the job.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from measure_agent.space import ConfigError, ConfigSpace, Constraint, RestrictionError, SplitKnob, parse_restriction


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
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare word: a string choice
    try:
        return knob.from_json(value)
    except ConfigError as exc:
        raise SteeringError(f"cannot pin {name}={raw}: {exc}") from None


def _expression_value(space: ConfigSpace, name: str, value: Any) -> Any:
    knob = space.knob(name)
    if isinstance(knob, SplitKnob):
        return math.prod(value[1:])  # the tile size
    return value


def steer_space(space: ConfigSpace, pins: Sequence[tuple[str, str]] = (),
                constraints: Sequence[str] = ()) -> ConfigSpace:
    """``space`` narrowed by pins and constraints; raises :class:`SteeringError`."""
    if not pins and not constraints:
        return space
    added: list[Constraint] = []
    for name, raw in pins:
        pinned = _pin_value(space, name, raw)
        added.append(Constraint((name,), lambda v, pinned=pinned: v == pinned, f"{name} = {raw} (pinned)"))
    for text in constraints:
        try:
            restriction = parse_restriction(text, space.knob_names)
        except RestrictionError as exc:
            raise SteeringError(str(exc)) from None
        if not restriction.names:
            raise SteeringError(f"constraint {text!r} names no knob")

        def holds(*values: Any, restriction=restriction) -> bool:
            named = {n: _expression_value(space, n, v) for n, v in zip(restriction.names, values)}
            return restriction(named)

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
