"""Shared pieces of the CPU (numba) templates: target awareness, tile choices, rendering helpers.

Every CPU template here builds its kernels from the same recipe (see the shared notes on numba CPU
kernels and ``cpu/_gemm.py``, the GEMM nest of the matmul, dense and batch_matmul templates):

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
DEFAULT_BROADCAST_TILES_32_REGISTERS = (1, 2, 4, 5, 8, 10)
# Cache blocks, in register tiles: block = tiles * tile (runtime arguments).
BLOCK_TILES = (1, 2, 4, 8, 16, 32, 64)
UNROLLS = (1, 2, 4)
# Defaults run on all cores from about this much work: below it (some 0.2 ms on one core) the
# fork/join of a parallel region, and a busy host's scheduling of the second thread, cost more
# than they save.
PARALLEL_MIN_FLOPS = 4_000_000


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

    @property
    def default_broadcast_tiles(self) -> tuple[int, ...]:
        """The broadcast tiles a default config picks from. On AVX-512 (Zen 5, numba 0.68) a conv
        tile of 2 vectors x 6 or x 12 columns, or of 1 vector, ran at 5 GFLOPS instead of 220-310
        (x 4, 5, 8, 10): LLVM vectorised them across their columns (gathers), which conv2d's
        COLUMNS_WRITTEN_OUT no longer lets it do (Zen 4: 32 x 6 1.8 -> 60 GFLOPS). Defaults of 12
        columns, which all 24 accumulator registers, still ran slower than those they would
        replace (Sapphire Rapids, 2 threads, best of 8: 1x1 256 -> 64 56x56 32 x 10 179 vs 32 x 12
        110 GFLOPS, 96 -> 32 28x28 143 vs 102, 7x7 s2 3 -> 64 32 x 8 242 vs 182, 1x1 2048 -> 512
        7x7 over channels 10 x 32 221 vs 12 x 32 207). The space keeps them all."""
        return DEFAULT_BROADCAST_TILES_32_REGISTERS if self.registers >= 32 else BROADCAST_TILES

    @property
    def default_rows(self) -> int:
        """Rows (broadcasts) of a default register tile two vectors wide: 6 with 16 registers (12
        accumulators, the best measured on AVX2), 8 with 32 (on AVX-512 a 6-row tile once ran at 3
        GFLOPS for a 512^3 matmul against 220 with 8: the micro-kernel's row loop compiled to
        gathers, which cpu/_gemm.py no longer writes; 6 x 32 now runs level with 8 x 32)."""
        return 8 if self.registers >= 32 else 6

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


def pick_tile(extent: int, tiles, at_most: int) -> int:
    """The register tile for an axis of ``extent`` from ``tiles`` (at most ``at_most``) that wastes
    least: the fraction of computed elements that are real (the last tile of a row computes a whole
    tile), weighted mildly towards longer tiles (more accumulators per load). 56 columns -> 6,
    28 -> 6, 14 -> 5, 7 -> 4, 49 -> 5."""
    fitting = [t for t in tiles if t <= min(at_most, extent)] or [min(tiles)]
    longest = max(fitting)
    return max(fitting, key=lambda t: (extent / (math.ceil(extent / t) * t)) * (t / longest) ** 0.25)


def pick_choice(values, at_most):
    """The largest value <= ``at_most`` (else the smallest)."""
    fitting = [v for v in values if v <= at_most]
    return max(fitting) if fitting else min(values)


# -- rendering -----------------------------------------------------------------------------------


def indent(lines: list[str], spaces: int) -> list[str]:
    pad = " " * spaces
    return [pad + line if line else line for line in lines]


def header(title: str, workload, config: Config, call: str, blocks: str, tiled: tuple[str, ...],
           parallel: bool, outline_serial: bool = True) -> list[str]:
    """Comment lines naming the kernel, workload and compile-time config, then the imports.

    The text holds only what is compiled in, so configs that differ only in cache blocks share one
    kernel: the ``tiled`` knobs are named, and their cache blocks (``blocks``: how ``call``'s
    runtime arguments derive from them) are runtime arguments; their register tiles are the
    constants below the imports. ``outline_serial``: as for :func:`kernel_head`.
    """
    items = [f"{k}={v}" for k, v in config.items if k not in tiled]
    lines = [f"# tunefleet {title}", f"# workload: {workload.key}"]
    line = "# config:"
    for item in items:
        if len(line) + len(item) + 1 > 100:
            lines.append(line)
            line = "#  "
        line += " " + item
    lines.append(line)
    lines.append(f"# blocked knobs ({', '.join(tiled)}): cache blocks are runtime arguments, register tiles the "
                 "constants below")
    lines.append(f"#   {call} with {blocks}")
    if parallel:
        numba_import = "from numba import njit, prange"
    elif outline_serial:
        numba_import = "from numba import get_num_threads, njit, prange, set_num_threads"
    else:
        numba_import = "from numba import njit"
    lines += [
        "import numpy as np",
        numba_import,
        "",
        "from measure_agent.templates.cpu_stack import stack_array",
        "",
    ]
    return lines


def kernel_head(entry: str, params: str, parallel: bool, outline_serial: bool = True) -> list[str]:
    """Decorator and signature of the kernel's loop nest.

    By default (``outline_serial``) the loop nest is always compiled with ``parallel=True`` and its
    outer loops are ``prange`` loops: numba outlines a ``prange`` body into its own function, which
    LLVM optimised far better than the same loops in one serial function (on one thread, conv NHWC
    87 vs 31 GFLOPS, batched matmul 76 vs 31, dense 70 vs 31). A ``parallel=False`` config gets the
    same loops run on the calling thread only, by the wrapper of :func:`kernel_tail`. Without
    ``outline_serial`` a ``parallel=False`` kernel is one plain ``njit`` function with ``range``
    loops (:func:`loop_kind`), its entry point itself.
    """
    if not parallel and not outline_serial:
        return [f"@njit(cache=True, parallel=False, fastmath={FASTMATH}, error_model='numpy', boundscheck=False)",
                f"def {entry}({params}):"]
    name = entry if parallel else f"_{entry}"
    return [f"@njit(cache=True, parallel=True, fastmath={FASTMATH}, error_model='numpy', boundscheck=False)",
            f"def {name}({params}):"]


def loop_kind(parallel: bool, outline_serial: bool = True) -> str:
    """The loop of a kernel's parallel loops: ``prange`` unless the kernel is compiled serial."""
    return "prange" if parallel or outline_serial else "range"


def kernel_tail(entry: str, params: str, parallel: bool, outline_serial: bool = True) -> list[str]:
    """For ``parallel=False`` with ``outline_serial``: the entry point, running the loop nest on
    the calling thread.

    A Python function: numba cannot cache a compiled function that sets its thread count, and the
    engine's run worker loads kernels from the cache its build worker filled. Its ``compile``
    compiles (and caches) the loop nest, so the build step still does all the compiling.
    """
    if parallel or not outline_serial:
        return []
    return [
        "",
        "",
        f"def {entry}({params}):",
        "    # parallel=False: the loop nest above, on this thread only",
        "    threads = get_num_threads()",
        "    set_num_threads(1)",
        "    try:",
        f"        _{entry}({params})",
        "    finally:",
        "        set_num_threads(threads)",
        "",
        "",
        f"{entry}.compile = _{entry}.compile  # building the kernel compiles the loop nest",
    ]


# Direct conv and depthwise tiles vectorised over columns update their rows written out
# (Tile.update_by_rows) from this many rows: every tile seen vectorised across its rows had 6 or
# more (6-12 there, 6-12 in the GEMM micro-kernel), and a 2 x 32 conv tile with an unrolled
# reduction, written out, became mixed 512/256/128-bit code (58.5 -> 38.2 GFLOPS, AVX-512 Zen 4).
ROWS_WRITTEN_OUT_MIN = 5
# Conv2d and depthwise tiles vectorised over channels update their columns in one loop over the
# lanes (Tile.update_rows_per_lane) from this many columns: in a compile-only grid (AVX-512, 16 or 32
# lanes, unrolled 1-4x) tiles of 3, 4, 6, 8 and 12 columns compiled to gathers or 128/256-bit FMAs as
# loops, 2 columns never; written out, 2 x 32 and 2 x 16 with an unrolled reduction ran 75.8 -> 42.6
# and 50.8 -> 35.9 GFLOPS (Zen 4, best of 9) with the same FMAs.
COLUMNS_WRITTEN_OUT_MIN = 3


class Tile:
    """A register tile ``acc[b * V + v]``: B rows along the broadcast axis, V lanes along the vector
    axis (a multiple of the vector width, or a whole narrow axis).

    The kernels' updates are constant-bound loops over the lanes, which LLVM unrolls completely, so
    that the accumulators are indexed by constants only: SROA keeps them in registers and the SLP
    vectoriser turns each row into vector FMAs. Tiles that LLVM could vectorise across their rows
    write the rows out (:meth:`update_by_rows`); small ones keep a loop over the rows around the
    lane loop (see ROWS_WRITTEN_OUT_MIN); tiles over channels update every column in one lane loop
    (:meth:`update_rows_per_lane`, from COLUMNS_WRITTEN_OUT_MIN columns). What must not happen is
    another unrolled block of the kernel asking SLP for vectors along the *rows*: a constant-bound
    store to an output that is contiguous along the rows (NCHW output, tile vectorised over
    channels) made SLP vectorise the store instead, and in a serial (non-``prange``) kernel the
    whole 16 x 6 conv tile then ran scalar (3 instead of 88 GFLOPS). Such tiles are stored only
    through the edge buffer, in loops with runtime bounds (``contiguous=False``); the others get a
    constant-bound store for whole tiles. Zeroing, copies and stores write the B rows out, one
    line each, with a loop over the lanes; or, with ``row_loops``, as loops over the rows, then the
    lanes (the elements in memory order: what the matmul kernels need, see ``cpu/_gemm.py``).
    """

    def __init__(self, rows: int, lanes: int, lane: str) -> None:
        self.B, self.V, self.v = rows, lanes, lane
        self.size = rows * lanes

    def at(self, b: int | str, name: str = "acc", *, unsigned: bool = False) -> str:
        """The accumulator of row ``b`` (an int, or a variable name) in the current lane.
        ``unsigned``: index as ``np.uint64``, for loops with runtime bounds; numba wraps a signed
        index below zero, and LLVM then reads the buffer with gathers (depthwise NHWC edge tiles:
        1.35x faster unsigned, with 45% of tiles at an edge)."""
        if isinstance(b, int):
            index = f"{b * self.V} + {self.v}" if b else self.v
        else:
            index = f"{b} * {self.V} + {self.v}"
        return f"{name}[np.uint64({index})]" if unsigned else f"{name}[{index}]"

    def update_by_rows(self, scalar: str, broadcast: Callable[[int], str], lane: Callable[[int], str],
                       lanes_bound: str) -> list[str]:
        """The update ``acc[b, v] += broadcast(b) * lane(b)``, one row at a time: row ``b``'s
        broadcast value into ``scalar``, then its own loop over the lanes (``range(lanes_bound)``,
        lane variable ``self.v``). As a loop over the rows around the lane loop, LLVM vectorised
        some tiles across the rows instead, with gathers (and scatters of the accumulators), no
        vector FMAs: matmul 6 x 32 and 8 x 16, conv2d 6 x 16 and depthwise 8 x 16 ran at 1.5-5
        GFLOPS on AVX-512 (Zen 4) where written out they run 28-209 (measurements at the callers)."""
        lines: list[str] = []
        for b in range(self.B):
            lines += [f"{scalar} = {broadcast(b)}", f"for {self.v} in range({lanes_bound}):",
                      f"    {self.at(b)} += {scalar} * {lane(b)}"]
        return lines

    def update_rows_per_lane(self, lane_value: str, lane: str, row_factor: Callable[[int], str],
                             lanes_bound: str) -> list[str]:
        """The update ``acc[b, v] += row_factor(b) * lane`` with ``lane`` the same for every row: one
        loop over the lanes (``range(lanes_bound)``) that reads ``lane`` into ``lane_value`` and
        updates every row, written out. For tiles whose rows share one vector (conv2d and NHWC
        depthwise vectorised over channels); :meth:`update_by_rows`, one lane loop per row, became
        128-bit code there when the reduction was unrolled (measurements at the callers)."""
        return ([f"for {self.v} in range({lanes_bound}):", f"    {lane_value} = {lane}"]
                + [f"    {self.at(b)} += {row_factor(b)} * {lane_value}" for b in range(self.B)])

    def zero(self, row_loops: bool = False) -> list[str]:
        if row_loops:
            return [f"acc = stack_array({self.size}, out.dtype)  # the register tile: {self.B} x {self.V}",
                    f"for t in range({self.size}):", "    acc[t] = 0"]
        return [f"acc = stack_array({self.size}, out.dtype)  # the register tile: {self.B} x {self.V}",
                f"for {self.v} in range({self.V}):"] + [f"    {self.at(b)} = 0" for b in range(self.B)]

    def store(self, *, row: str, target, whole: str, rows_edge: str, lanes_edge: str, first: str | None,
              contiguous: bool, row_loops: bool = False) -> list[str]:
        """Store the tile: ``target(b)`` is the output element of row ``b`` (an int or ``row``, the
        edge loop's variable) in lane ``self.v``. ``contiguous``: the output is contiguous along
        the lanes, so whole tiles (``whole``) get a constant-bound store; all other tiles, and all
        tiles when the output is not contiguous along the lanes, store rows ``rows_edge`` and lanes
        ``lanes_edge`` (range arguments) from a copy in a second stack buffer (dynamic indices must
        not touch ``acc``). Assigns when ``first`` holds, else adds (later reduction blocks;
        ``first=None``: always assigns)."""
        v = self.v

        def whole_store(op: str) -> list[str]:
            if row_loops:
                return [f"for {row} in range({self.B}):", f"    for {v} in range({self.V}):",
                        f"        {target(row)} {op} {self.at(row)}"]
            return [f"for {v} in range({self.V}):"] + [f"    {target(b)} {op} {self.at(b)}" for b in range(self.B)]

        def edge_store(op: str) -> list[str]:
            return [f"for {row} in range({rows_edge}):",
                    f"    for {v} in range({lanes_edge}):",
                    f"        {target(row)} {op} {self.at(row, 'edge', unsigned=True)}"]

        def either(nest) -> list[str]:
            if first is None:
                return nest("=")
            return [f"if {first}:"] + indent(nest("="), 4) + ["else:"] + indent(nest("+="), 4)

        if row_loops:
            copy = [f"edge = stack_array({self.size}, out.dtype)", f"for t in range({self.size}):", "    edge[t] = acc[t]"]
        else:
            copy = [f"edge = stack_array({self.size}, out.dtype)",
                    f"for {v} in range({self.V}):"] + [f"    {self.at(b, 'edge')} = {self.at(b)}" for b in range(self.B)]
        if not contiguous:
            return ["# the output is strided along the tile's vectors: store through a copy, in loops"] + \
                copy + either(edge_store)
        return ([f"if {whole}:  # whole tile: constant bounds"] + indent(either(whole_store), 4)
                + ["else:  # edge tile: only the tile's own elements"] + indent(copy + either(edge_store), 4))


def unrolled_loop(var: str, start: str, stop: str, factor: int, body: list[str],
                  remainder_loop: bool = False) -> list[str]:
    """``for var in range(start, stop): body``, with the body written ``factor`` times per
    iteration (every copy after the first guarded by ``var < stop``, so no remainder loop; or,
    with ``remainder_loop``, unguarded copies up to the last whole group, then a plain loop)."""
    if factor == 1:
        return [f"for {var} in range({start}, {stop}):"] + indent(body, 4)
    if remainder_loop:
        main = f"{var}_main"
        lines = [f"{main} = {stop} - ({stop} - {start}) % {factor}",
                 f"for {var}_u in range({start}, {main}, {factor}):  # unrolled {factor}x"]
        for step in range(factor):
            lines += indent([f"{var} = {var}_u + {step}" if step else f"{var} = {var}_u"] + body, 4)
        return lines + [f"for {var} in range({main}, {stop}):  # the remainder"] + indent(body, 4)
    lines = [f"for {var}_u in range({start}, {stop}, {factor}):  # unrolled {factor}x"]
    lines += indent([f"{var} = {var}_u"] + body, 4)
    for step in range(1, factor):
        lines += indent([f"{var} = {var}_u + {step}", f"if {var} < {stop}:"] + indent(body, 4), 4)
    return lines
