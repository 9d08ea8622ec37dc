"""Shared pieces of the CPU (numba) templates: target awareness, tile choices, rendering helpers.

Every CPU template here builds its kernels from the same recipe (see the shared notes on numba CPU
kernels and ``templates/matmul_cpu.py``):

- a register tile of accumulators in a fixed-size stack array (``cpu_stack.stack_array``), updated
  by constant-bound loops that LLVM fully unrolls and its SLP vectoriser turns into vector FMAs;
  one axis of the tile (the *vector axis*) is contiguous in memory and a multiple of the ISA's
  vector width, the other (the *broadcast axis*) is loaded one scalar at a time;
- fastmath without reassociation (so LLVM never vectorises a reduction the wrong way);
- unsigned indices in the hot loads and stores (no negative-index wraparound checks);
- cache blocks as runtime arguments, so configs that differ only in them share one kernel;
- a whole-tile store with constant bounds, and an edge store (through a second stack buffer) with
  the tile's own elements only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from measure_agent.device import DeviceInfo
from measure_agent.space import Config, ConfigSpace, SplitKnob

FASTMATH = "{'contract', 'nnan', 'ninf', 'nsz', 'arcp', 'afn'}"
DTYPES = ("float32", "float64")

# Register tiles along the broadcast axis (one scalar load, then one FMA per accumulator vector).
BROADCAST_TILES = (1, 2, 3, 4, 5, 6, 8)
BROADCAST_TILES_32_REGISTERS = BROADCAST_TILES + (10, 12)
# Cache blocks, in register tiles: block = tiles * tile (runtime arguments).
BLOCK_TILES = (1, 2, 4, 8, 16, 32, 64)
UNROLLS = (1, 2, 4)


@dataclass(frozen=True)
class VectorTarget:
    """What the ISA offers a register tile: float32 lanes per vector and vector registers."""

    isa: str
    float32_lanes: int
    registers: int

    def lanes(self, dtype: str) -> int:
        return self.float32_lanes if dtype == "float32" else max(1, self.float32_lanes // 2)

    @property
    def max_accumulators(self) -> int:
        """Vector accumulators a tile may use: 12 of 16 registers (measured best on AVX2: 8-12;
        16 spilled), 24 of 32; the rest hold the broadcast scalars and the loaded vectors."""
        return self.registers * 3 // 4

    def vector_tiles(self, dtype: str) -> tuple[int, ...]:
        """Register tile lengths along the vector axis: half a vector (for narrow axes), then one
        to four whole vectors."""
        lanes = self.lanes(dtype)
        return tuple(sorted({max(2, lanes // 2), lanes, 2 * lanes, 3 * lanes, 4 * lanes}))

    @property
    def broadcast_tiles(self) -> tuple[int, ...]:
        return BROADCAST_TILES_32_REGISTERS if self.registers >= 32 else BROADCAST_TILES

    def accumulator_vectors(self, broadcast: int, vector: int, dtype: str) -> int:
        return broadcast * math.ceil(vector / self.lanes(dtype))

    def axis_tiles(self, dtype: str, extent: int) -> tuple[int, ...]:
        """Register tile lengths of an axis that may be either the vector or the broadcast axis:
        both kinds, and the whole axis when it is narrower than the longest vector tile."""
        tiles = set(self.broadcast_tiles) | set(self.vector_tiles(dtype))
        if extent < max(self.vector_tiles(dtype)):
            tiles.add(extent)
        return tuple(sorted(tiles))

    def vector_ok(self, vector: int, broadcast: int, dtype: str, extent: int) -> bool:
        """A register tile vectorised over an axis of length ``extent``: the vector tile is a
        vector-tile choice or the whole (narrow) axis, the broadcast tile a broadcast choice, and
        the accumulators fit in the registers."""
        return ((vector in self.vector_tiles(dtype) or vector == extent)
                and broadcast in self.broadcast_tiles
                and self.accumulator_vectors(broadcast, vector, dtype) <= self.max_accumulators)


GENERIC = VectorTarget("generic", 8, 16)  # no device: an AVX2-like x86-64


def vector_target(device: DeviceInfo | None) -> VectorTarget:
    """The vector width and register count of ``device`` (AVX2-like when unknown)."""
    if device is None:
        return GENERIC
    features = set(device.isa_features)
    if "avx512f" in features:
        return VectorTarget("avx512", 16, 32)
    if "avx2" in features:
        return VectorTarget("avx2", 8, 16)
    if features & {"neon", "asimd", "sve"}:
        return VectorTarget("neon", 4, 32)
    if features & {"sse4_2", "avx"}:
        return VectorTarget("sse", 4, 16)
    return GENERIC


class CpuSpace(ConfigSpace):
    """A template's space that remembers the vector target it was built for (the default config
    sizes its register tile by it)."""

    def __init__(self, knobs, constraints=(), *, vector: VectorTarget) -> None:
        super().__init__(knobs, constraints)
        self.vector = vector


def target_of(space: ConfigSpace) -> VectorTarget:
    return getattr(space, "vector", GENERIC)


def check_workload(template, workload) -> None:
    if workload.op != template.op:
        raise ValueError(f"{type(template).__name__} renders {template.op}, not {workload.op}")
    if workload.dtype not in DTYPES:
        raise ValueError(f"{type(template).__name__} supports float32 and float64, not {workload.dtype}")


def reduction_blocks(length: int, smallest: int = 16) -> tuple[int, ...]:
    """Reduction block lengths: powers of two from ``smallest`` below ``length``, then ``length``
    itself (no blocking)."""
    out = []
    block = smallest
    while block < length:
        out.append(block)
        block *= 2
    return tuple(out) + (length,)


def pick_split(knob: SplitKnob, inner_at_most: int, block_at_most: int,
               inner_ok: Callable[[int], bool] = lambda t: True) -> tuple[int, ...]:
    """The split with the largest inner tile <= ``inner_at_most`` accepted by ``inner_ok`` (else
    the smallest accepted), then the largest block (middle factor * inner) <= ``block_at_most``
    (else the smallest block)."""
    inners = sorted({v[-1] for v in knob.values if inner_ok(v[-1])}) or sorted({v[-1] for v in knob.values})
    fitting = [t for t in inners if t <= inner_at_most]
    inner = fitting[-1] if fitting else inners[0]
    candidates = [v for v in knob.values if v[-1] == inner]
    within = [v for v in candidates if math.prod(v[1:]) <= block_at_most]
    if within:
        return max(within, key=lambda v: v[1])
    return min(candidates, key=lambda v: v[1])


def pick_choice(values, at_most):
    """The largest value <= ``at_most`` (else the smallest)."""
    fitting = [v for v in values if v <= at_most]
    return max(fitting) if fitting else min(values)


# -- rendering -----------------------------------------------------------------------------------


def indent(lines: list[str], spaces: int) -> list[str]:
    pad = " " * spaces
    return [pad + line if line else line for line in lines]


def header(title: str, workload, config: Config, runtime: str, parallel: bool) -> list[str]:
    """Comment lines naming the kernel, workload and config, then the imports."""
    items = [f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in config.items]
    lines = [f"# tunefleet {title} for {workload.key}"]
    line = "# config:"
    for item in items:
        if len(line) + len(item) + 1 > 100:
            lines.append(line)
            line = "#  "
        line += " " + item
    lines.append(line)
    lines.append(f"# runtime arguments (cache blocks; configs differing only in them share this kernel): {runtime}")
    lines += [
        "import numpy as np",
        f"from numba import njit{', prange' if parallel else ''}",
        "",
        "from measure_agent.templates.cpu_stack import stack_array",
        "",
    ]
    return lines


def njit_line(parallel: bool) -> str:
    return (f"@njit(cache=True, parallel={parallel}, fastmath={FASTMATH}, error_model='numpy', "
            "boundscheck=False)")


def zero_tile(size: int) -> list[str]:
    return [
        f"acc = stack_array({size}, out.dtype)  # the register tile",
        f"for t in range({size}):",
        "    acc[t] = 0",
    ]


def store_tile(*, size: int, whole: str, outer: str, outer_size: str, outer_edge: str, inner: str,
               inner_size: str, inner_edge: str, target: str, acc_index: str, first: str | None) -> list[str]:
    """Store the register tile ``acc`` into ``target`` (an output element written with the loop
    variables ``outer`` and ``inner``), assigning when ``first`` holds and adding otherwise (later
    reduction blocks; ``first=None``: always assign). ``whole``: the condition for the constant-bound
    store over the tile's sizes ``outer_size`` x ``inner_size``; otherwise the loops run over the
    edge ranges ``outer_edge``, ``inner_edge`` (range arguments). ``acc`` is only ever indexed by
    constants after unrolling (so it stays in registers): the edge store copies it to a second stack
    buffer first."""

    def loops(outer_range: str, inner_range: str, buffer: str) -> list[str]:
        def nest(op: str) -> list[str]:
            return [
                f"for {outer} in range({outer_range}):",
                f"    for {inner} in range({inner_range}):",
                f"        {target} {op} {buffer}[{acc_index}]",
            ]
        if first is None:
            return nest("=")
        return [f"if {first}:"] + indent(nest("="), 4) + ["else:"] + indent(nest("+="), 4)

    return (
        [f"if {whole}:  # whole tile: constant bounds"]
        + indent(loops(outer_size, inner_size, "acc"), 4)
        + ["else:  # edge tile: only the tile's own elements"]
        + indent([f"edge = stack_array({size}, out.dtype)", f"for t in range({size}):", "    edge[t] = acc[t]"], 4)
        + indent(loops(outer_edge, inner_edge, "edge"), 4)
    )


def unrolled_loop(var: str, start: str, stop: str, factor: int, body: list[str]) -> list[str]:
    """``for var in range(start, stop): body``, with the body written ``factor`` times per
    iteration (every copy after the first guarded by ``var < stop``, so no remainder loop)."""
    if factor == 1:
        return [f"for {var} in range({start}, {stop}):"] + indent(body, 4)
    lines = [f"for {var}_u in range({start}, {stop}, {factor}):  # unrolled {factor}x"]
    lines += indent([f"{var} = {var}_u"] + body, 4)
    for step in range(1, factor):
        lines += indent([f"{var} = {var}_u + {step}", f"if {var} < {stop}:"] + indent(body, 4), 4)
    return lines
