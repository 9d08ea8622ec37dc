"""Workloads: an operator with concrete sizes and a dtype, and its canonical key.

A workload is what a user writes on the command line (``matmul(M=512,N=512,K=512)``) and what
crosses the wire to an agent. It is parsed into an immutable :class:`Workload` whose ``key`` is
canonical: the operator's parameters in declaration order, the dtype always spelled out, so two
spellings of the same problem share one row in the tuning log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from measure_agent.workload.operators import OPERATORS, OperatorSpec

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

    @property
    def key(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in self.sizes)
        return f"{self.op}({inner},dtype={self.dtype})"

    def __str__(self) -> str:
        return self.key

    @property
    def flops(self) -> int:
        return self.spec.flops(self.params)


def parse_workload(text: str) -> Workload:
    """Parse ``op(NAME=INT,...[,dtype=...])`` into a :class:`Workload`.

    Raises :class:`WorkloadError` with a one-line message naming the problem.
    """
    if not isinstance(text, str) or not text.strip():
        raise WorkloadError("empty workload; expected e.g. matmul(M=512,N=512,K=512)")
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
    unknown = [name for name in args if name not in spec.params]
    if unknown:
        raise WorkloadError(
            f"unknown argument {unknown[0]!r} for {op}; expected {', '.join(spec.params)}"
        )
    sizes = []
    for name in spec.params:
        if name not in args:
            raise WorkloadError(f"missing size {name} for {op}; expected {spec.signature}")
        raw = args[name]
        try:
            value = _to_int(raw)
        except ValueError:
            raise WorkloadError(f"size {name}={raw} of {op} is not an integer") from None
        if value <= 0:
            raise WorkloadError(f"size {name}={value} of {op} must be positive")
        if value > spec.max_size:
            raise WorkloadError(f"size {name}={value} of {op} exceeds the limit {spec.max_size}")
        sizes.append((name, value))
    return Workload(op=op, sizes=tuple(sizes), dtype=dtype)


def _to_int(raw: object) -> int:
    if isinstance(raw, bool):
        raise ValueError(raw)
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(text)
    return int(text)
