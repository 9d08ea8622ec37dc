"""Shape ranges: ``matmul(M=1..512,N=768,K=768)`` names a family of workloads (dynamic shapes).

A family is tuned at a few representative shapes and any shape in its range is served by the
config tuned for the nearest representative that is valid for it.

Representatives: for each ranged size, both ends of the range and every power of two strictly
inside it (M=1..512 gives 1, 2, 4, ..., 256, 512). With several ranged sizes the representatives
are their cross product; when that exceeds :data:`MAX_REPRESENTATIVES`, each range keeps its ends
and evenly spaced (in log scale) powers of two until the product fits.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from measure_agent.workload.operators import OPERATORS
from measure_agent.workload.workload import Workload, WorkloadError, make_workload

MAX_REPRESENTATIVES = 16
_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$", re.DOTALL)
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")


@dataclass(frozen=True)
class WorkloadFamily:
    op: str
    dtype: str
    fixed: tuple[tuple[str, int], ...]  # sizes given as numbers (all parameters, canonical names)
    ranges: tuple[tuple[str, int, int], ...]  # (size, low, high)

    @property
    def key(self) -> str:
        """Canonical text: the operator's parameters in order, ranges as LOW..HIGH."""
        values = dict(self.fixed)
        values.update({name: f"{lo}..{hi}" for name, lo, hi in self.ranges})
        inner = ",".join(f"{p.name}={values[p.name]}" for p in OPERATORS[self.op].params)
        return f"{self.op}({inner},dtype={self.dtype})"

    def contains(self, workload: Workload) -> bool:
        if workload.op != self.op or workload.dtype != self.dtype:
            return False
        params = workload.params
        ranged = {name: (lo, hi) for name, lo, hi in self.ranges}
        for name, value in params.items():
            if name in ranged:
                lo, hi = ranged[name]
                if not lo <= value <= hi:
                    return False
            elif dict(self.fixed).get(name) != value:
                return False
        return True

    def representatives(self) -> list[Workload]:
        points = {name: _points(lo, hi) for name, lo, hi in self.ranges}
        while math.prod(len(p) for p in points.values()) > MAX_REPRESENTATIVES:
            widest = max(points, key=lambda n: len(points[n]))
            if len(points[widest]) <= 2:
                break
            points[widest] = _thin(points[widest])
        names = list(points)
        shapes = []
        for combo in itertools.product(*(points[n] for n in names)):
            sizes = dict(self.fixed)
            sizes.update(zip(names, combo))
            try:
                shapes.append(make_workload(self.op, dict(sizes, dtype=self.dtype)))
            except WorkloadError:
                continue  # e.g. a conv window that does not fit the smallest input
        return shapes


def _points(lo: int, hi: int) -> list[int]:
    inside = [1 << k for k in range(0, hi.bit_length() + 1) if lo < (1 << k) < hi]
    return sorted({lo, hi, *inside})


def _thin(points: list[int]) -> list[int]:
    """About half the points, evenly spread over the list (the points are log-spaced), ends kept."""
    keep = max(2, (len(points) + 1) // 2)
    step = (len(points) - 1) / (keep - 1)
    return sorted({points[round(i * step)] for i in range(keep)})


def is_family(text: str) -> bool:
    return ".." in text


def parse_family(text: str) -> WorkloadFamily:
    """Parse ``op(NAME=LOW..HIGH,...)``; raises :class:`WorkloadError`."""
    match = _CALL.match(text or "")
    if not match:
        raise WorkloadError(f"cannot parse shape range {text!r}; expected e.g. matmul(M=1..512,N=768,K=768)")
    op, body = match.group(1), match.group(2)
    args: dict[str, str] = {}
    ranges: dict[str, tuple[int, int]] = {}
    for part in (p.strip() for p in body.split(",") if p.strip()):
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep:
            raise WorkloadError(f"argument {part!r} of {op} is not NAME=VALUE")
        found = _RANGE.match(value)
        if found:
            lo, hi = int(found.group(1)), int(found.group(2))
            if not 1 <= lo < hi:
                raise WorkloadError(f"range {name}={value} must have 1 <= LOW < HIGH")
            ranges[name] = (lo, hi)
            args[name] = str(lo)  # validated below through the smallest and largest shapes
        else:
            args[name] = value
    if not ranges:
        raise WorkloadError(f"{text!r} has no LOW..HIGH range")
    smallest = make_workload(op, dict(args))
    if any(name not in smallest.params for name in ranges):
        unknown = next(name for name in ranges if name not in smallest.params)
        raise WorkloadError(f"cannot range {unknown!r}: not a size of {op}")
    largest = dict(args)
    largest.update({name: str(hi) for name, (_, hi) in ranges.items()})
    make_workload(op, largest)  # bounds and window checks at the large end too
    fixed = tuple((k, v) for k, v in smallest.sizes if k not in ranges)
    ordered = tuple((p.name, *ranges[p.name]) for p in OPERATORS[op].params if p.name in ranges)
    return WorkloadFamily(op=op, dtype=smallest.dtype, fixed=fixed, ranges=ordered)
