"""What users impose on a search: pinned knobs, constraints, and target strings.

``--pin KNOB=VALUE`` fixes a knob; ``--constraint "EXPR"`` narrows the space with an expression over
knob names (parsed safely: arithmetic, comparisons, and/or; never ``eval``). In an expression, a
split knob's name stands for its tile size, the product of its inner factors. Both are validated
against the template's space, and a combination that leaves no valid config is refused, as is one
that takes longer than :data:`CONSTRAINT_CHECK_BUDGET_S` to check.

Target strings follow TVM: ``cpu``, ``cuda``, ``"cuda -arch=sm_72"``,
``"llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon"``,
``"llvm -mattr=+avx2,+fma"``, and TVM's tags (``nvidia/jetson-orin-nano``,
``raspberry-pi/4b-aarch64``; :mod:`tuner.target_tags`). The family (cpu or cuda) picks the
templates; the options say which agents of a fleet may measure the job.
"""

from __future__ import annotations

import difflib
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
    knob = _knob(space, name)
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


def check_steering_names(space: ConfigSpace, pins: Sequence[tuple[str, str]] = (),
                         constraints: Sequence[str] = (), budget_s: float | None = None) -> None:
    """What can be checked before the measuring device is known: every pinned knob exists, every
    constraint parses and names knobs of the space, and evaluating the constraints over ``space``
    (the device-independent one) fails on no value and ends within ``budget_s`` (a CPU or memory
    bomb is refused here, whatever device comes). Pinned values and whether any config is left
    depend on the device (vector width, registers, GPU limits): :func:`steer_space` on the
    device's space checks those. Raises :class:`SteeringError`."""
    for name, _ in pins:
        _knob(space, name)
    for text in constraints:
        _restriction(space, text)
    if constraints:
        _steered(space, (), constraints, budget_s)


def _knob(space: ConfigSpace, name: str) -> Knob:
    try:
        return space.knob(name)
    except KeyError:
        raise SteeringError(f"cannot pin unknown knob {name!r}; knobs are {', '.join(space.knob_names)}") from None


def _restriction(space: ConfigSpace, text: str):
    try:
        restriction = parse_restriction(text, space.knob_names)
    except RestrictionError as exc:
        raise SteeringError(str(exc)) from None
    if not restriction.names:
        raise SteeringError(f"constraint {text!r} names no knob")
    return restriction


def steer_space(space: ConfigSpace, pins: Sequence[tuple[str, str]] = (),
                constraints: Sequence[str] = (), budget_s: float | None = None) -> ConfigSpace:
    """``space`` narrowed by pins and constraints; raises :class:`SteeringError`, also when
    checking them against the space takes longer than ``budget_s`` seconds (default
    :data:`CONSTRAINT_CHECK_BUDGET_S`)."""
    if not pins and not constraints:
        return space
    steered, size, added = _steered(space, pins, constraints, budget_s)
    if size == 0:
        raise SteeringError("the pins and constraints leave no valid config: "
                            + "; ".join(c.description for c in added))
    return steered


def _steered(space: ConfigSpace, pins: Sequence[tuple[str, str]], constraints: Sequence[str],
             budget_s: float | None) -> tuple[ConfigSpace, int, list[Constraint]]:
    """The narrowed space, how many configs it holds (1 where too many to count but one exists)
    and the constraints added; evaluates every constraint once per combination, so bad or costly
    ones raise :class:`SteeringError` here rather than later."""
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
        restriction = _restriction(space, text)
        readers = tuple((n, _expression_value(space.knob(n))) for n in restriction.names)

        def holds(*values: Any, restriction=restriction, readers=readers, text=text) -> bool:
            clock.tick(text)
            return restriction({n: read(v) for (n, read), v in zip(readers, values)})

        added.append(Constraint(tuple(restriction.names), holds, text))
    steered = ConfigSpace(space.knobs, tuple(space.constraints) + tuple(added))
    try:
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
    return steered, size, added


# -- target strings ------------------------------------------------------------------------------
_FAMILIES = {"cpu": "cpu", "llvm": "cpu", "c": "cpu", "cuda": "cuda", "nvptx": "cuda", "sleep": "sleep"}

# TVM options that do not constrain which device measures (code generation, libraries, limits the
# templates take from the agent's own device); the ones marked True may stand without a value.
_IGNORED_OPTIONS = {
    "keys": False, "libs": False, "model": False, "num-cores": False, "mabi": False, "mfloat-abi": False,
    "opt-level": False, "max_num_threads": False, "thread_warp_size": False, "max_threads_per_block": False,
    "max_shared_memory_per_block": False, "registers_per_block": False, "l2_cache_size_bytes": False,
    "max_function_args": False, "system-lib": True, "link-params": True, "fast-math": True,
    "fast-math-nnan": True, "fast-math-ninf": True, "fast-math-nsz": True, "fast-math-arcp": True,
    "fast-math-contract": True, "fast-math-reassoc": True,
}

# x86 -mcpu names (LLVM's) -> the recorded ISA features code for that CPU needs: any device with
# them can serve it (an Ice Lake server runs what was built for skylake-avx512).
_SSE42 = ("sse4_2",)
_AVX = ("sse4_2", "avx")
_AVX2 = ("sse4_2", "avx", "avx2", "fma")
_AVX512 = _AVX2 + ("avx512f", "avx512bw", "avx512vl")
_X86_CPUS: dict[str, tuple[str, ...]] = {
    "x86-64": (), "x86-64-v2": _SSE42, "nehalem": _SSE42, "westmere": _SSE42,
    "sandybridge": _AVX, "ivybridge": _AVX,
    **dict.fromkeys(("x86-64-v3", "haswell", "broadwell", "skylake", "alderlake", "raptorlake", "znver1", "znver2",
                     "znver3"), _AVX2),
    **dict.fromkeys(("x86-64-v4", "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
                     "icelake-server", "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4",
                     "znver5"), _AVX512),
}
_ANY_CPU = ("native", "generic")  # -mcpu values that ask for no particular core

# LLVM's -mattr names -> the name /proc/cpuinfo (and so DeviceInfo.isa_features) uses. 32-bit ARM
# kernels report "neon", aarch64 ones "asimd": either satisfies +neon or +asimd.
_FEATURE_ALIASES = {"neon": "asimd", "sse4.2": "sse4_2", "dotprod": "asimddp", "fullfp16": "asimdhp"}
_SAME_FEATURE = {"asimd": ("asimd", "neon")}


def _recorded_features() -> frozenset[str]:
    from measure_agent.device import RECORDED_ISA_FEATURES

    return frozenset(RECORDED_ISA_FEATURES) | {"neon"}


def arch_family(name: str) -> str:
    """A CPU architecture as a triple or ``platform.machine()`` spells it, in one spelling:
    ``aarch64`` (arm64), ``x86_64`` (amd64), ``arm`` (any 32-bit ARM: armv7l, armv7a, armhf),
    ``x86`` (i686); others lower-cased as given (riscv64)."""
    lowered = name.strip().lower()
    if lowered in ("aarch64", "arm64", "arm64e", "aarch64_be"):
        return "aarch64"
    if lowered in ("x86_64", "amd64", "x86-64", "x64"):
        return "x86_64"
    if re.fullmatch(r"i[3-6]86|x86", lowered):
        return "x86"
    if lowered.startswith(("arm", "thumb")):
        return "arm"
    return lowered


@dataclass(frozen=True)
class TargetSpec:
    """A parsed target: the template family and what a measuring device must have.

    ``matches`` takes a device's info as recorded: the log's and the scheduler's flat form
    (``compute_capability`` at the top) or ``DeviceInfo.to_json()`` (GPU facts under ``extra``).
    """

    text: str
    family: str
    arch: str | None = None  # cuda: sm_XY (sm_90a: compute capability 9.0)
    mcpu: str | None = None  # an x86 name of _X86_CPUS needs its features; another, that core name
    mattr: tuple[str, ...] = ()  # "+avx2", "-avx512f", in the names devices record ("+asimd" for +neon)
    cpu_archs: tuple[str, ...] = ()  # the device's arch_family must be one of these (-mtriple, arm_cpu, a board)
    unchecked: tuple[str, ...] = ()  # -mattr features devices do not record: they constrain nothing
    tag: str = ""  # the TVM tag the target was written as

    @property
    def has_requirements(self) -> bool:
        return bool(self.arch or self.mcpu or self.mattr or self.cpu_archs)

    def matches(self, device: Mapping[str, Any]) -> bool:
        """Whether a device (its recorded info) can measure jobs of this target."""
        facts = _device_facts(device)
        if self.arch and facts["sm"] != _compute_capability_of(self.arch):
            return False
        if self.cpu_archs and facts["arch"] not in self.cpu_archs:
            return False
        if self.mcpu and not _has_cpu(facts, self.mcpu):
            return False
        return all(_has_feature(facts["features"], attr[1:]) == attr.startswith("+") for attr in self.mattr)

    def offered(self, devices: Sequence[Mapping[str, Any]], most: int = 5) -> str:
        """What ``devices`` have, in the terms of this target's requirements, each kind once
        (``"sm_87"``, ``"aarch64 ARM Cortex-A72 asimd"``): said when no device matches."""
        kinds: list[str] = []
        x86_cpu = self.mcpu in _X86_CPUS
        for device in devices:
            facts = _device_facts(device)
            parts = []
            if self.arch:
                parts.append(f"sm_{facts['sm']}" if facts["sm"] else "no CUDA GPU")
            if self.cpu_archs or x86_cpu:
                parts.append(facts["arch"] or "an unknown arch")
            if self.mcpu:
                parts.append(facts["cpu_model"] or "an unknown CPU")
            if self.mattr or x86_cpu:
                parts.append(" ".join(sorted(facts["features"])) or "no recorded ISA features")
            kind = " ".join(parts)
            if kind not in kinds:
                kinds.append(kind)
        shown = "; ".join(kinds[:most])
        return shown + (f" and {len(kinds) - most} more kinds" if len(kinds) > most else "")

    def describe(self) -> str:
        return self.text


def _device_facts(device: Mapping[str, Any]) -> dict[str, Any]:
    extra = device.get("extra") if isinstance(device.get("extra"), Mapping) else {}
    capability = str(device.get("compute_capability") or extra.get("compute_capability") or "")
    return {
        "sm": capability.replace(".", ""),
        "arch": arch_family(str(device.get("arch") or "")),
        "cpu_model": str(device.get("cpu_model") or ""),
        "llvm_cpu": str(device.get("llvm_cpu") or extra.get("llvm_cpu") or ""),
        "features": {str(f).lower() for f in device.get("isa_features") or ()},
    }


def _compute_capability_of(arch: str) -> str:
    """``sm_87`` -> ``87``; ``sm_90a`` (arch-specific features of 9.0) -> ``90``."""
    return arch.removeprefix("sm_").rstrip("abcdefghijklmnopqrstuvwxyz")


def _has_feature(features: set[str], feature: str) -> bool:
    return any(name in features for name in _SAME_FEATURE.get(feature, (feature,)))


def _has_cpu(facts: Mapping[str, Any], mcpu: str) -> bool:
    """x86 names need their CPU's features (and x86_64); others name a core the device has
    ("cortex-a72" in "ARM Cortex-A72", not "cortex-a7"; "cortex-a78" in "Cortex-A78AE")."""
    if mcpu in _X86_CPUS:
        return facts["arch"] == "x86_64" and all(_has_feature(facts["features"], f) for f in _X86_CPUS[mcpu])
    wanted = re.escape(_alnum(mcpu)) + r"(?![0-9])"
    return any(re.search(wanted, _alnum(facts[name])) for name in ("cpu_model", "llvm_cpu"))


def _alnum(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def parse_target(text: str) -> TargetSpec:
    """Parse a TVM target string or tag; raises :class:`SteeringError`.

    ``KIND [-option=value ...]`` where KIND is ``llvm`` (``cpu``, ``c``), ``cuda`` (``nvptx``) or
    ``sleep`` (the testing templates); options: ``-mtriple`` (the device's architecture),
    ``-device=arm_cpu`` (an ARM device), ``-mcpu``, ``-mattr=+f,-g``, for cuda ``-arch=sm_XY``
    (nvptx: ``-mcpu=sm_XY``); options that do not constrain the device are accepted and ignored.
    A TVM tag (``nvidia/jetson-orin-nano``, ``raspberry-pi/4b-aarch64``: :mod:`tuner.target_tags`)
    stands for its target, optionally followed by options that override it.
    """
    from tuner.target_tags import TARGET_TAGS

    try:
        words = shlex.split(text or "cpu")
    except ValueError as exc:
        raise SteeringError(f"cannot parse target {text!r}: {exc}") from None
    if not words:
        words = ["cpu"]
    canonical = " ".join(words)
    tag_name = words[0].lower() if words[0].lower() in TARGET_TAGS else ""
    host_archs: tuple[str, ...] = ()
    if tag_name:
        tag = TARGET_TAGS[tag_name]
        host_archs = (tag.host_arch,) if tag.host_arch else ()
        words = tag.target.split() + words[1:]
    elif "/" in words[0]:
        close = difflib.get_close_matches(words[0].lower(), TARGET_TAGS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise SteeringError(f"unknown target tag {words[0]!r}; {hint}tunefleet knows TVM's tags for Jetson boards, "
                            "common NVIDIA GPUs and AWS C5 servers, raspberry-pi/4b-aarch64 and raspberry-pi/5 "
                            "(e.g. nvidia/jetson-orin-nano, nvidia/nvidia-a100, aws/cpu/c5.large)")
    kind = words[0].lower()
    family = _FAMILIES.get(kind)
    if family is None:
        raise SteeringError(f"unknown target {words[0]!r}; expected cpu, llvm, cuda, nvptx or a TVM tag "
                            "(e.g. \"llvm -mattr=+avx2\", \"cuda -arch=sm_87\", \"nvidia/jetson-orin-nano\")")
    options = _target_options(words[1:], kind, family)
    arch = options.get("arch")
    mcpu = options.get("mcpu")
    if mcpu in _ANY_CPU:
        mcpu = None
    archs = _intersection(canonical, host_archs, (options["triple"],) if "triple" in options else (),
                          ("aarch64", "arm") if options.get("device") == "arm_cpu" else (),
                          ("x86_64",) if mcpu in _X86_CPUS else ())
    checked, unchecked = _split_features(options.get("mattr", ()))
    return TargetSpec(text=canonical, family=family, arch=arch, mcpu=mcpu, mattr=checked, cpu_archs=archs,
                      unchecked=unchecked, tag=tag_name)


def _target_options(words: Sequence[str], kind: str, family: str) -> dict[str, Any]:
    """The constraining options of a target (later ones override earlier ones, as in TVM)."""
    options: dict[str, Any] = {}
    for word in words:
        if not word.startswith("-"):
            raise SteeringError(f"target option {word!r} must start with -, e.g. -mcpu=cortex-a72")
        key, sep, value = word.lstrip("-").partition("=")
        if key in _IGNORED_OPTIONS:
            if not sep and not _IGNORED_OPTIONS[key]:
                raise SteeringError(f"target option -{key} needs a value, e.g. -{key}=...")
            continue  # does not constrain which device measures
        if not value:
            raise SteeringError(f"target option {word!r} needs a value, e.g. -mcpu=cortex-a72")
        if key == "arch" and family == "cuda" or key == "mcpu" and kind == "nvptx":
            if not re.fullmatch(r"sm_\d{2,3}[a-z]?", value):
                raise SteeringError(f"cuda -{key} takes sm_XY (e.g. sm_87), not {value!r}")
            options["arch"] = value
        elif key == "mtriple" and kind == "nvptx":
            if not value.lower().startswith("nvptx"):
                raise SteeringError(f"nvptx -mtriple takes nvptx64-nvidia-cuda, not {value!r}")
        elif key == "mtriple" and family == "cpu":
            if not re.fullmatch(r"[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*", value):
                raise SteeringError(f"-mtriple takes an LLVM triple such as aarch64-linux-gnu, not {value!r}")
            options["triple"] = arch_family(value.split("-", 1)[0])
        elif key == "device" and family == "cpu":
            options["device"] = value  # arm_cpu constrains; TVM's other device names do not
        elif key == "device" and family == "cuda":
            continue
        elif key == "mcpu" and family == "cpu":
            options["mcpu"] = value.lower()
        elif key == "mattr" and family == "cpu":
            attrs = []
            for attr in value.split(","):
                attr = attr.strip().lower()
                if not re.fullmatch(r"[+-][a-z0-9_.-]+", attr):
                    raise SteeringError(f"-mattr takes +feature or -feature, not {attr!r}")
                attrs.append(attr)
            options["mattr"] = tuple(attrs)
        else:
            raise SteeringError(f"target option -{key} is not understood for {kind}")
    return options


def _intersection(text: str, *choices: tuple[str, ...]) -> tuple[str, ...]:
    """The architectures every non-empty choice allows (empty: any)."""
    allowed: tuple[str, ...] = ()
    for choice in choices:
        if not choice:
            continue
        allowed = choice if not allowed else tuple(a for a in allowed if a in choice)
        if not allowed:
            raise SteeringError(f"target {text!r} contradicts itself: no device is both "
                                + " and ".join("/".join(c) for c in choices if c))
    return allowed


def _split_features(attrs: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(-mattr entries in recorded names, entries devices do not record); a feature named twice
    keeps its last sign."""
    recorded = _recorded_features()
    checked: dict[str, str] = {}
    unchecked: list[str] = []
    for attr in attrs:
        name = _FEATURE_ALIASES.get(attr[1:], attr[1:])
        if name in recorded:
            checked.pop(name, None)  # the last sign counts, in the order written
            checked[name] = attr[0]
        elif attr not in unchecked:
            unchecked.append(attr)
    return tuple(sign + name for name, sign in checked.items()), tuple(unchecked)
