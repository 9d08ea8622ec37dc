"""Workloads: an operator with concrete sizes and a dtype, and its canonical key.

A workload is what a user writes on the command line (``matmul(M=512,N=512,K=512)``) and what
crosses the wire to an agent. It is parsed into an immutable :class:`Workload` whose ``key`` is
canonical: the operator's parameters in declaration order, the dtype always spelled out, so two
spellings of the same problem share one row in the tuning log.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from measure_agent.workload.compact import CompactFormError, expand_compact, looks_compact
from measure_agent.workload.operators import OPERATORS, OperatorSpec, elements

SUPPORTED_DTYPES = ("float32", "float64")

_CALL_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$", re.DOTALL)


class WorkloadError(ValueError):
    """A workload string or dictionary that does not describe a valid problem."""


@dataclass(frozen=True)
class Workload:
    """An operator applied to concrete sizes. Immutable and hashable."""

    op: str
    sizes: tuple[tuple[str, int], ...]
    dtype: str = "float32"

    @property
    def spec(self) -> OperatorSpec:
        return OPERATORS[self.op]

    @property
    def params(self) -> dict[str, int]:
        return dict(self.sizes)

    def __getitem__(self, name: str) -> int:
        for key, value in self.sizes:
            if key == name:
                return value
        raise KeyError(name)

    @functools.cached_property  # a cache key everywhere: computed once per (immutable) workload
    def key(self) -> str:
        """Canonical text: declaration order, defaults included, an axis pair given once when equal."""
        values = dict(self.sizes)
        parts = []
        pairs = {first: (short, second) for short, (first, second) in self.spec.axis_pairs}
        skip = {second for _, (_, second) in self.spec.axis_pairs}
        for name, value in self.sizes:
            if name in skip and values[name] == values[_first_of(self.spec, name)]:
                continue
            if name in pairs and values[name] == values[pairs[name][1]]:
                parts.append(f"{pairs[name][0]}={value}")
            else:
                parts.append(f"{name}={value}")
        return f"{self.op}({','.join(parts)},dtype={self.dtype})"

    def __str__(self) -> str:
        return self.key

    @property
    def flops(self) -> int:
        return self.spec.flops(self.params)


def _first_of(spec: OperatorSpec, second: str) -> str:
    return next(first for _, (first, other) in spec.axis_pairs if other == second)


def parse_workload(text: str) -> Workload:
    """Parse ``op(NAME=INT,...[,dtype=...])`` or a compact name (``matmul_512x512x512``).

    Raises :class:`WorkloadError` with a one-line message naming the problem.
    """
    if not isinstance(text, str) or not text.strip():
        raise WorkloadError("empty workload; expected e.g. matmul(M=512,N=512,K=512)")
    return _parse_workload_text(text)


@functools.lru_cache(maxsize=1024)  # an agent parses the same few workloads for every candidate
def _parse_workload_text(text: str) -> Workload:
    if ".." in text:
        raise WorkloadError(f"{text.strip()!r} is a shape range (LOW..HIGH), a family of workloads: tune it with "
                            "'tuner tune', which tunes representative shapes; other commands take one shape")
    if looks_compact(text.strip()):
        try:
            op, args = expand_compact(text.strip())
        except CompactFormError as exc:
            raise WorkloadError(str(exc)) from None
        return make_workload(op, args)
    match = _CALL_RE.match(text)
    if not match:
        raise WorkloadError(
            f"cannot parse workload {text!r}; expected OP(NAME=VALUE,...), e.g. matmul(M=512,N=512,K=512)"
        )
    op, body = match.group(1), match.group(2)
    args: dict[str, str] = {}
    for part in (p.strip() for p in body.split(",")):
        if not part:
            continue
        if "=" not in part:
            raise WorkloadError(f"argument {part!r} of {op} is not NAME=VALUE")
        name, value = (s.strip() for s in part.split("=", 1))
        if name in args:
            raise WorkloadError(f"argument {name} given twice")
        args[name] = value
    return make_workload(op, args)


def make_workload(op: str, args: dict[str, object]) -> Workload:
    """Build a validated workload from an operator name and its arguments (strings or ints)."""
    if op not in OPERATORS:
        known = ", ".join(sorted(OPERATORS))
        raise WorkloadError(f"unknown operator {op!r}; known operators: {known}")
    spec = OPERATORS[op]
    args = dict(args)
    dtype = str(args.pop("dtype", "float32"))
    if dtype not in SUPPORTED_DTYPES:
        raise WorkloadError(f"unsupported dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    for short, (first, second) in spec.axis_pairs:
        if short in args:
            if first in args or second in args:
                raise WorkloadError(f"give {short} or {first}/{second} of {op}, not both")
            args[first] = args[second] = args.pop(short)
    names = spec.param_names
    unknown = [name for name in args if name not in names]
    if unknown:
        raise WorkloadError(f"unknown argument {unknown[0]!r} for {op}; expected {spec.signature}")
    sizes = []
    for param in spec.params:
        name = param.name
        if name not in args:
            if param.default is None:
                raise WorkloadError(f"missing size {name} for {op}; expected {spec.signature}")
            sizes.append((name, param.default))
            continue
        raw = args[name]
        try:
            value = _to_int(raw)
        except ValueError:
            raise WorkloadError(f"size {name}={raw} of {op} is not an integer") from None
        if value < param.minimum:
            requirement = "must be positive" if param.minimum == 1 else f"must be at least {param.minimum}"
            raise WorkloadError(f"size {name}={value} of {op} {requirement}")
        if value > spec.max_size:
            raise WorkloadError(f"size {name}={value} of {op} exceeds the limit {spec.max_size}")
        sizes.append((name, value))
    workload = Workload(op=op, sizes=tuple(sizes), dtype=dtype)
    _check_shapes(workload)
    return workload


def _check_shapes(workload: Workload) -> None:
    spec, params = workload.spec, workload.params
    try:
        shapes = spec.array_shapes(params)
    except ValueError as exc:  # e.g. a window larger than the padded input
        raise WorkloadError(f"{workload.op} with these sizes has no output: {exc}") from None
    for shape in shapes:
        if any(d < 1 for d in shape):
            raise WorkloadError(f"{workload.op} with these sizes has an empty output {tuple(shape)}: "
                                "the window does not fit the (padded) input")
        if elements(shape) > spec.max_elements:
            raise WorkloadError(f"{workload.op} with these sizes needs an array of {elements(shape)} elements, "
                                f"more than the limit {spec.max_elements}")


def _to_int(raw: object) -> int:
    if isinstance(raw, bool):
        raise ValueError(raw)
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(text)
    return int(text)
