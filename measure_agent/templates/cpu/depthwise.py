"""Depthwise 2-D convolution on CPUs (NCHW and NHWC), via numba, with direct border handling.

Output channel ``o = c * M + m`` (M: the channel multiplier) is input channel ``c = o // M``
convolved with its own R x S filter. The rendered kernel computes

    [weights] wt[r, s, o]: NHWC weights [R, S, C, M] viewed as is; NCHW [C, M, R, S] transposed
              into it (R*S*C*M elements, one pass per call)
    [pad]     only with ``border = padded_copy``: a zero-padded copy of the input, once per call
    for each work item (image n, OC-block of output channels, HB-block of output rows,
                        WC-block of output columns), in parallel if asked
      for the OT-channel tiles and the output rows of the item, in ``loop_order``
        rows: the filter rows r that fall inside the input are computed per output row, so the
              top and bottom borders cost nothing (no padded copy)
        interior columns (all S taps inside the input): OT x WT register tiles, accumulators in
              registers, the S taps of each filter row applied to one loaded input row segment
        border columns (and, vectorising over columns, all columns when the interior is narrower
              than WT): one column at a time with the taps clipped to the input

The register tile is vectorised along ``vector_axis``:
- ``w``: over output columns (contiguous in NCHW): WT input values per tap loaded as a vector, the
  weight of each of the OT channels broadcast. A partial tile (at the end of a column block or of
  the interior) shifts to stay inside the interior columns; stores are masked.
- ``c``: over output channels (contiguous in NHWC with M = 1): OT weights and OT input values per
  tap loaded as vectors, for each of WT columns. A partial last channel tile shifts down to stay
  inside the channels; stores are masked.

or, NCHW with planes up to PLANE_MAX_ELEMENTS, ``vector_axis = plane``: no register tile; each
channel's zero-padded plane (in stride phases) on the stack and one vector loop over its flattened
grid (``_render_plane``). Work items are (image, OC-block of output channels). Larger NCHW planes:
``vector_axis = rows``, the same over chunks of output rows (``_render_rows``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from measure_agent.device import DeviceInfo
from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cpu._common import (
    BLOCK_TILES,
    COLUMNS_WRITTEN_OUT_MIN,
    ROWS_WRITTEN_OUT_MIN,
    UNROLLS,
    CpuSpace,
    check_workload,
    header,
    indent,
    kernel_head,
    kernel_tail,
    pick_split,
    pick_tile,
    Tile,
    target_of,
    unrolled_loop,
    vector_target,
)
from measure_agent.templates.cpu._conv import ConvGeometry, Layout, pad_input
from measure_agent.workload import Workload

VECTOR_AXES = ("w", "c")
# NCHW: the whole zero-padded plane of a channel on the stack (split into stride phases, see
# _PhasePlanes), each output computed on the padded plane's grid (rows as wide as a padded row), so
# that every filter tap is one contiguous shifted load of the flattened plane and LLVM vectorises
# one long loop over it; the valid columns are copied out. Up to planes of this many elements
# (58 x 58: 56x56 with a 3x3 filter), which with the grid stay within L1. 2 threads, Sapphire
# Rapids, against the column tiles' defaults (GFLOPS): 960ch 7x7 13.9 -> 48.9, 192ch 28x28 34.9 ->
# 96.9, 96ch 56x56 50.4 -> 90.5; stride 2: 144ch 56x56 27.8 -> 47.0, 576ch 14x14 8.0 -> 28.5, 5x5
# 72ch 56x56 36.3 -> 76.7. Beyond it they lost: 32ch 112x112 69.5 -> 64.8, 96ch 112x112 s2 30.0 -> 25.8.
PLANE_AXIS = "plane"
PLANE_MAX_ELEMENTS = 4096
# NCHW planes beyond PLANE_MAX_ELEMENTS: the plane kernel over chunks of tile_h[1] output rows
# (_render_rows), each chunk's padded input rows copied to the stack, so that the taps are shifted
# contiguous loads there too and no column is a border column. Offered where a chunk of one row fits
# in ROWS_MAX_ELEMENTS (phase planes and grid).
# Defaults take the most rows (ROW_BLOCKS) whose chunk stays within ROWS_CHUNK_ELEMENTS (8 KiB of
# float32: a quarter of a 32 KiB L1d, the rest for the input rows read and the outputs written).
# 2 threads, Zen 4, against the column tiles' defaults (GFLOPS, torch 2.14 beside): 32ch 112x112
# 35-46 -> 82-84 with 4 rows (8: 82-84, 16: 70-89; torch 40-47); 96ch 112x112 s2 26 -> 49-51 with
# 4 rows (2: 42, 8: 38-39, 16: 44; torch 24-26). Shapes it was not chosen on, old -> new: 5x5 64ch
# 80x80 50.4 -> 95.5, 24ch 150x150 s2 23.1 -> 39.7, 2 images of 16ch 96x128 50.8 -> 89.1.
ROWS_AXIS = "rows"
ROWS_MAX_ELEMENTS = 8192
ROWS_CHUNK_ELEMENTS = 2048
BORDERS = ("direct", "padded_copy")
LOOP_ORDERS = ("channels_outer", "rows_outer")
ROW_BLOCKS = (1, 2, 4, 8, 16, 32, 64)
ITEMS_PER_CORE = 4
CORES_GUESS = 2
# NHWC defaults: one channel tile per work item and rows split until each core has ~16 items
# (prange hands each thread the same number of items: whole-channel blocks left one thread 4/5
# of the work), and at most 20 accumulators: the 12 x 2-vector tile (24) spilled. Measured on a
# 2-core Zen 4 against torch 2.13 channels_last (GFLOPS, old default -> new): 96ch 112x112 s2
# 43 -> 73 (torch 77), 144ch 56x56 40 -> 91 (110), 144ch 56x56 s2 25 -> 60 (41), 192ch 28x28 31
# -> 87 (63), 960ch 7x7 19 -> 42 (25).
NHWC_ITEMS_PER_CORE = 16
NHWC_MAX_ACCUMULATORS = 20
# Output rows at most this wide (28x28 planes and smaller) get 4-vector channel tiles two columns
# wide, where the channels fill them to within 1/8. Defaults before -> after, 2 threads, Zen 4
# (GFLOPS, torch channels_last): 960ch 7x7 40 -> 62-68 (18-24), 384ch 14x14 36-57 -> 70-73 (36-37),
# 576ch 14x14 s2 35-36 -> 45-50 (15), 192ch 28x28 79-85 -> 81-82 (62). On wider planes such tiles
# lost (96ch 112x112 s2 68 -> 41-53) or tied.
NHWC_SMALL_PLANE_COLUMNS = 28
NHWC_SMALL_PLANE_VECTORS = 4
# Depthwise kernels run at a tenth of a GEMM's FLOP rate (5-11 GFLOPS on one core), so the
# parallel region pays off at far fewer FLOPs than the GEMMs' PARALLEL_MIN_FLOPS (4 MFLOP) says.
# Measured, NCHW 3x3, defaults on 2 threads against the same config serial (2-core Xeon, quiet,
# GOMP's bounded spin): 0.23 MFLOP (256ch 14x14 s2) 52 -> 29 us, 0.51 MFLOP 59 -> 33 us, 0.85
# MFLOP (960ch 7x7) 97 -> 59 us, 2.0 MFLOP (144ch 56x56 s2) 179 -> 83 us. NHWC gains as much once
# its items are equal (144ch 56x56 s2: 23 -> 44-54 GFLOPS on 2 threads; 960ch 7x7: 19 -> 42).
DEPTHWISE_PARALLEL_MIN_FLOPS = 200_000


def _tiles(config: Config) -> tuple[int, int]:
    return config["tile_c"][-1], config["tile_w"][-1]


class _DepthwiseCpuTemplate(Template):
    """Register-blocked depthwise conv2d for CPUs (float32 and float64), any channel multiplier.

    Knobs:
    - ``vector_axis``: ``w`` (vectorise over output columns, broadcast weights), ``c``
      (vectorise over output channels) or, NCHW with small planes, ``plane``
      (vectorise over the flattened padded plane; tile_c's register tile 1, the other knobs one
      value each) or, NCHW with larger planes, ``rows`` (the same over chunks of tile_h[1] output
      rows; tile_h free too).
    - ``tile_c`` = (blocks, OC/OT, OT): OT output channels per register tile; OC per work item.
    - ``tile_w`` = (blocks, WC/WT, WT): WT output columns per register tile; WC per work item.
    - ``tile_h`` = (blocks, HB): HB output rows per work item.
    - ``border``: ``direct`` (clip the taps at the borders: no copy) or ``padded_copy`` (copy the
      input into a zero-padded buffer each call, then every column is interior).
    - ``loop_order``: inside a work item, ``channels_outer`` (plane by plane: NCHW's natural order)
      or ``rows_outer`` (row by row across the channels: NHWC's).
    - ``unroll_r``: copies of the filter-row loop's body per iteration.
    - ``parallel``: run the work items on all cores (numba ``prange``).

    OT, WT, border, orders, unrolling and parallel are compiled in; OC, HB and WC are runtime
    arguments (``depthwise(x, w, out, OC, HB, WC)``).
    """

    target = "cpu"
    # 2: 512-bit vectors on AVX-512 hosts; 3: the zero-padded input copied in plain loops;
    # 4: edge tiles and border columns stored without gathers (unsigned indices); 5: the tile's rows
    # written out (ROWS_WRITTEN_OUT), partial column tiles shifted within the item and stored whole;
    # 6: tiles over channels write their columns out (COLUMNS_WRITTEN_OUT); 7: NCHW vector_axis=plane;
    # 8: NCHW vector_axis=rows; 9: NHWC tiles over channels through flat views (FLAT_TILES)
    version = "9"
    layout: str

    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        check_workload(self, workload)
        g = ConvGeometry.of(workload)
        vt = vector_target(device)
        dtype = workload.dtype
        plane = self.layout == "nchw" and _plane_fits(g)
        rows = self.layout == "nchw" and not plane and _row_chunk_elements(g, 1) <= ROWS_MAX_ELEMENTS
        knobs = [
            ChoiceKnob("vector_axis", VECTOR_AXES + ((PLANE_AXIS,) if plane else ())
                       + ((ROWS_AXIS,) if rows else ())),
            SplitKnob("tile_c", g.K, (BLOCK_TILES, vt.axis_tiles(dtype, g.K))),
            SplitKnob("tile_w", g.OW, (BLOCK_TILES, vt.axis_tiles(dtype, g.OW))),
            SplitKnob("tile_h", g.OH, (ROW_BLOCKS,)),
            ChoiceKnob("border", BORDERS),
            ChoiceKnob("loop_order", LOOP_ORDERS),
            ChoiceKnob("unroll_r", UNROLLS),
            BoolKnob("parallel"),
        ]
        constraints = [
            Constraint(
                ("vector_axis", "tile_c", "tile_w"),
                lambda axis, tc, tw: (vt.vector_ok(tw[-1], tc[-1], dtype, g.OW) if axis == "w"
                                      else vt.vector_ok(tc[-1], tw[-1], dtype, g.K) if axis == "c"
                                      else True),
                f"the vector-axis tile is a multiple of the vector ({vt.lanes(dtype)} lanes) or the whole "
                f"axis, the other a broadcast tile, and the accumulators fit in {vt.max_accumulators} registers",
            ),
        ]
        if plane:
            named = {knob.name: knob for knob in knobs}
            fixed = _plane_fixed(named["tile_w"], named["tile_h"])
            constraints.append(Constraint(
                ("vector_axis", "tile_c", *fixed),
                lambda axis, tc, *rest: axis != PLANE_AXIS or (tc[-1] == 1 and rest == tuple(fixed.values())),
                "vector_axis=plane: tile_c's register tile is 1 (tile_c[1] channels per work item) and "
                + ", ".join(f"{k}={v}" for k, v in fixed.items()),
            ))
        if rows:
            named = {knob.name: knob for knob in knobs}
            fixed = _rows_fixed(named["tile_w"])
            chunks_that_fit = frozenset(v[1] for v in named["tile_h"].values
                                        if _row_chunk_elements(g, min(v[1], g.OH)) <= ROWS_MAX_ELEMENTS)
            constraints.append(Constraint(
                ("vector_axis", "tile_c", "tile_h", *fixed),
                lambda axis, tc, th, *rest: axis != ROWS_AXIS or (
                    tc[-1] == 1 and rest == tuple(fixed.values()) and th[1] in chunks_that_fit),
                "vector_axis=rows: tile_c's register tile is 1 (tile_c[1] channels per work item), a chunk of "
                f"tile_h[1] rows fits in {ROWS_MAX_ELEMENTS} elements and "
                + ", ".join(f"{k}={v}" for k, v in fixed.items()),
            ))
        return CpuSpace(knobs, constraints, vector=vt)

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        """The layout's work split (``_default_split``: vector axis, loop order, border, tile_c,
        tile_w and rows per item), the tallest row block within those rows, no unrolling; parallel
        from DEPTHWISE_PARALLEL_MIN_FLOPS."""
        g = ConvGeometry.of(workload)
        split = self._default_split(g, space, workload.dtype)
        rows = split.chunk_rows or max(1, g.OH // split.h_splits)
        tile_h = max((v for v in space.knob("tile_h").values if v[1] <= rows), key=lambda v: v[1])
        values = {
            "vector_axis": split.vector_axis,
            "tile_c": split.tile_c,
            "tile_w": split.tile_w,
            "tile_h": tile_h,
            "border": split.border,
            "loop_order": split.loop_order,
            "unroll_r": 1,
            "parallel": workload.flops >= DEPTHWISE_PARALLEL_MIN_FLOPS,
        }
        if split.vector_axis == PLANE_AXIS:
            values.update(_plane_fixed(space.knob("tile_w"), space.knob("tile_h")))
        elif split.vector_axis == ROWS_AXIS:
            values.update(_rows_fixed(space.knob("tile_w")))
        return space.make(values)

    def _default_split(self, g: ConvGeometry, space: ConfigSpace, dtype: str) -> _DefaultSplit:
        raise NotImplementedError

    def render(self, workload: Workload, config: Config) -> KernelSource:
        check_workload(self, workload)
        g = ConvGeometry.of(workload)
        ot, wt = _tiles(config)
        text = _render(self, workload, config, g)
        return KernelSource(text=text, entry="depthwise",
                            runtime_args=(config["tile_c"][1] * ot, config["tile_h"][1], config["tile_w"][1] * wt))


@dataclass(frozen=True)
class _PhasePlanes:
    """A channel's zero-padded plane split into SH x SW phase planes (phase (ph, pw) holds the
    padded plane's rows ph, ph + SH, ... and columns pw, pw + SW, ...): tap (r, s) of output (oh,
    ow) is then element (oh + r*DH // SH, ow + s*DW // SW) of phase (r*DH % SH, s*DW % SW), so
    every tap is one shifted contiguous load on a grid of OH rows of ``cols`` (unit stride: one
    phase, the padded plane itself)."""

    rows: int  # rows of a phase plane
    cols: int  # columns of a phase plane: the grid's row stride
    margin: int  # elements the last grid row's taps read past the last phase

    @classmethod
    def of(cls, g: ConvGeometry) -> "_PhasePlanes":
        return cls(-(-(g.H + 2 * g.PH) // g.SH), -(-(g.W + 2 * g.PW) // g.SW), (g.S - 1) * g.DW // g.SW)

    @property
    def phase_elements(self) -> int:
        return self.rows * self.cols

    def elements(self, g: ConvGeometry) -> int:
        return g.SH * g.SW * self.phase_elements + self.margin

    def tap_offset(self, g: ConvGeometry, r: int, s: int) -> int:
        phase = (r * g.DH % g.SH) * g.SW + s * g.DW % g.SW
        return phase * self.phase_elements + r * g.DH // g.SH * self.cols + s * g.DW // g.SW


def _plane_fits(g: ConvGeometry) -> bool:
    return _PhasePlanes.of(g).elements(g) <= PLANE_MAX_ELEMENTS


def _rows_fixed(tile_w: SplitKnob) -> dict[str, object]:
    """The one value a row-chunk config takes of each knob it does not use (no register tile,
    column blocks, border or loop-order choice); tile_h is free: its rows per block are the rows
    per chunk."""
    return {"tile_w": tile_w.values[0], "border": "padded_copy", "loop_order": "channels_outer", "unroll_r": 1}


def _plane_fixed(tile_w: SplitKnob, tile_h: SplitKnob) -> dict[str, object]:
    """The one value a plane config takes of each knob it does not use (a row-chunk config's, and
    no row blocks either), so that plane configs differ only in channels per work item and
    parallel: the space's constraint and the default both use it."""
    fixed = _rows_fixed(tile_w)
    return {"tile_w": fixed.pop("tile_w"), "tile_h": tile_h.values[0], **fixed}


def _interior_columns(g: ConvGeometry) -> int:
    """Output columns whose S taps all fall inside the unpadded input (the kernel's ow_lo..ow_hi)."""
    ow_lo = min(g.OW, -(-g.PW // g.SW))
    ow_hi = max(ow_lo, min(g.OW, (g.W - 1 + g.PW - (g.S - 1) * g.DW) // g.SW + 1))
    return ow_hi - ow_lo


@dataclass(frozen=True)
class _DefaultSplit:
    """What a layout's default decides: the register tile, its vector axis and the work items."""

    vector_axis: str
    loop_order: str
    border: str
    tile_c: tuple[int, ...]
    tile_w: tuple[int, ...]
    h_splits: int  # row blocks per plane
    chunk_rows: int = 0  # ROWS_AXIS: output rows per chunk (tile_h[1])


# Not done: NCHW layers of small planes computed channels-last (transpose the input in, NHWC channel
# tiles, transpose the output back), which would fill the vector lanes a 7-wide row leaves empty.
# The two transposes alone, as numba loops (unsigned indices, 16-channel blocks, 2 threads, Zen 4),
# took 30 + 22 us on 960ch 7x7 against 68 us for the whole NCHW default, and 67 + 35 us on 576ch
# 14x14: without vector shuffles they cost more than the lanes they would fill. The plane kernels
# (PLANE_AXIS) fill them instead, and are the default where they fit.
class DepthwiseConv2dNchwCpuTemplate(_DepthwiseCpuTemplate):
    __doc__ = _DepthwiseCpuTemplate.__doc__
    op = "depthwise_conv2d_nchw"
    layout = "nchw"

    def _default_split(self, g: ConvGeometry, space: ConfigSpace, dtype: str) -> _DefaultSplit:
        """Layers whose planes fit (PLANE_MAX_ELEMENTS): ``vector_axis = plane``, channel blocks for about
        eight work items; larger planes whose rows fit (ROWS_MAX_ELEMENTS): ``vector_axis = rows``,
        as many rows per chunk as ROWS_CHUNK_ELEMENTS allows, where the images and channels make
        eight work items (its only parallel axis). Otherwise vectorised over columns: WT = the whole row when it is at
        most a vector or whole vectors up to three, else one or two vectors; OT channels filling
        about eight accumulators, plane by plane, work items over channel blocks, then rows when
        the channels run out; direct border handling, unless the rows are so narrow that fewer
        than WT columns are interior (7x7 planes): then a padded copy."""
        c_splits = max(1, math.ceil(ITEMS_PER_CORE * CORES_GUESS / g.N))
        if PLANE_AXIS in space.knob("vector_axis").values:  # planes that fit (PLANE_MAX_ELEMENTS)
            tile_c = pick_split(space.knob("tile_c"), 1, max(1, g.K // c_splits), inner_ok=lambda t: t == 1)
            fixed = _plane_fixed(space.knob("tile_w"), space.knob("tile_h"))
            return _DefaultSplit(PLANE_AXIS, fixed["loop_order"], fixed["border"], tile_c, fixed["tile_w"], 1)
        # larger planes: the same, in chunks of rows, where the channels make enough work items
        if ROWS_AXIS in space.knob("vector_axis").values and g.N * g.K >= ITEMS_PER_CORE * CORES_GUESS:
            tile_c = pick_split(space.knob("tile_c"), 1, max(1, g.K // c_splits), inner_ok=lambda t: t == 1)
            fixed = _rows_fixed(space.knob("tile_w"))
            chunk = max((rows for rows in ROW_BLOCKS
                         if _row_chunk_elements(g, min(rows, g.OH)) <= ROWS_CHUNK_ELEMENTS), default=1)
            return _DefaultSplit(ROWS_AXIS, fixed["loop_order"], fixed["border"], tile_c, fixed["tile_w"], 1,
                                 chunk_rows=chunk)
        vt = target_of(space)
        lanes = vt.lanes(dtype)
        # the whole row when it is at most a vector or whole vectors; else one or two vectors
        # (AVX-512, stride 2: a 28-wide tile ran at 2 GFLOPS, 16-wide at 9.5)
        whole = g.OW <= lanes or (g.OW % lanes == 0 and g.OW <= 3 * lanes)
        wt = g.OW if whole else min(2, g.OW // lanes) * lanes
        # narrow rows: tiles need every column interior, so copy with padding
        border = "padded_copy" if _interior_columns(g) < wt else "direct"
        ot = max(1, min(4, 8 // vt.accumulator_vectors(1, wt, dtype)))
        ot = max(t for t in vt.broadcast_tiles if t <= max(ot, 1) and t <= g.K)
        tile_c = pick_split(space.knob("tile_c"), ot, max(ot, g.K // c_splits), inner_ok=lambda t: t == ot)
        tile_w = pick_split(space.knob("tile_w"), wt, g.OW, inner_ok=lambda t: t == wt)
        h_splits = 1
        if c_splits > 1:  # channel blocks as wanted; rows too when channels run out
            h_splits = max(1, math.ceil(c_splits / math.ceil(g.K / (tile_c[1] * ot))))
        return _DefaultSplit("w", "channels_outer", border, tile_c, tile_w, h_splits)


class DepthwiseConv2dNhwcCpuTemplate(_DepthwiseCpuTemplate):
    __doc__ = _DepthwiseCpuTemplate.__doc__
    op = "depthwise_conv2d_nhwc"
    layout = "nhwc"

    def _default_split(self, g: ConvGeometry, space: ConfigSpace, dtype: str) -> _DefaultSplit:
        """Vectorised over channels: OT = two vectors or all channels (one vector where two would
        leave a partial last channel tile and one would not), WT the column tile that fits
        the registers and wastes least on the interior columns with at most
        NHWC_MAX_ACCUMULATORS (rows of at most NHWC_SMALL_PLANE_COLUMNS: four vectors by two
        columns); row by row, one channel tile per work item and rows split for
        NHWC_ITEMS_PER_CORE items per core; direct border handling."""
        vt = target_of(space)
        lanes = vt.lanes(dtype)
        wide = NHWC_SMALL_PLANE_VECTORS * lanes
        if g.OW <= NHWC_SMALL_PLANE_COLUMNS and g.K >= wide and math.ceil(g.K / wide) * wide * 8 <= g.K * 9:
            ot, wt = wide, 2  # small planes: short rows, so a wide channel tile (at most 1/8 wasted)
        else:
            ot = g.K if g.K <= 2 * lanes else 2 * lanes
            if g.K % ot and g.K % lanes == 0:
                # one vector when two would leave a partial last channel tile (144 channels at 56x56,
                # 2-core AVX-512 Xeon: 106-111 GFLOPS instead of 50-72; 48 at 112x112 level)
                ot = lanes
            accumulators = min(vt.max_accumulators, NHWC_MAX_ACCUMULATORS)
            wt = pick_tile(max(1, _interior_columns(g)), vt.broadcast_tiles,
                           accumulators // vt.accumulator_vectors(1, ot, dtype))
        # one channel tile per work item: equal items (a block of several tiles leaves a short
        # last block, and prange gives each thread the same number of items), rows split too
        c_splits = math.ceil(g.K / ot)
        h_splits = max(1, math.ceil(NHWC_ITEMS_PER_CORE * CORES_GUESS / (g.N * c_splits)))
        tile_c = pick_split(space.knob("tile_c"), ot, max(ot, g.K // c_splits), inner_ok=lambda t: t == ot)
        tile_w = pick_split(space.knob("tile_w"), wt, g.OW, inner_ok=lambda t: t == wt)
        return _DefaultSplit("c", "rows_outer", "direct", tile_c, tile_w, h_splits)


# -- rendering -----------------------------------------------------------------------------------


def _render(template: _DepthwiseCpuTemplate, workload: Workload, config: Config, g: ConvGeometry) -> str:
    if config["vector_axis"] == PLANE_AXIS:
        return _render_plane(template, workload, config, g)
    if config["vector_axis"] == ROWS_AXIS:
        return _render_rows(template, workload, config, g)
    ot, wt = _tiles(config)
    axis = config["vector_axis"]
    parallel = config["parallel"]
    padded = config["border"] == "padded_copy" and g.padded
    lay = Layout(template.layout)
    loop = "prange"  # always (see kernel_head); parallel=False runs it on one thread
    multiplier = workload["multiplier"]
    lines = header(f"{workload.op}_cpu v{template.version}: depthwise convolution, register tile "
                   f"{ot} output channels x {wt} output columns, vectorised over "
                   f"{'output columns' if axis == 'w' else 'output channels'}",
                   workload, config, "depthwise(x, w, out, OC, HB, WC)",
                   "OC = tile_c[1] * OT, HB = tile_h[1], WC = tile_w[1] * WT", ("tile_c", "tile_w", "tile_h"),
                   parallel)
    emit = lines.append
    emit(f"OT = {ot}  # output channels per register tile")
    emit(f"WT = {wt}  # output columns per register tile")
    emit(f"M = {multiplier}  # channel multiplier: output channel o reads input channel o // M")
    emit(f"R, S = {g.R}, {g.S}  # filter taps")
    emit(f"SH, SW = {g.SH}, {g.SW}  # strides")
    emit(f"DH, DW = {g.DH}, {g.DW}  # dilations")
    emit(f"PH, PW = {g.PH}, {g.PW}  # padding")
    flat = _flat_tiles(lay, config, multiplier, padded)
    if flat:
        emit(f"XH, XW, XC, YH, YW = {g.H}, {g.W}, {g.C}, {g.OH}, {g.OW}  # the workload's sizes (FLAT_TILES)")
    emit("")
    emit("")
    lines += kernel_head("depthwise", "x, w, out, OC, HB, WC", parallel)
    body: list[str] = []
    add = body.append
    if lay.nchw:
        add("N, C, H, W = x.shape")
        add("OH, OW = out.shape[2], out.shape[3]")
    else:
        add("N, H, W, C = x.shape")
        add("OH, OW = out.shape[1], out.shape[2]")
    add("O = C * M  # output channels")
    add("# cache blocks: whole register tiles, at least one")
    add("OC = max(OT, OC - OC % OT)")
    add("WC = max(WT, WC - WC % WT)")
    add("HB = max(HB, 1)")
    if lay.nchw:
        add("# weights as wt[r, s, o] (from [C, M, R, S])")
        add("wt = np.empty((R, S, O), dtype=w.dtype)")
        add("for o in range(O):")
        add("    for r in range(R):")
        add("        for s in range(S):")
        add("            wt[r, s, o] = w[o // M, o % M, r, s]")
    else:
        add("wt = w.reshape((R, S, O))  # weights as wt[r, s, o] (a view of [R, S, C, M])")
    if flat:
        add("if H != XH or W != XW or C != XC or OH != YH or OW != YW:")
        add("    raise ValueError('the arrays are not the shapes this kernel was rendered for')")
        add("# flat views with constant strides: a tile's taps are constant offsets from one index (FLAT_TILES)")
        add("xf = x.reshape(N * XH * XW * XC)")
        add("wf = w.reshape(R * S * XC)")
        add("of = out.reshape(N * YH * YW * XC)")
    if padded:
        body += pad_input(g, lay, loop, True)
        add("OFF_H, OFF_W, HX, WX = 0, 0, HP, WP  # tap (r, s) of output (oh, ow) reads xp[oh*SH + r*DH, ow*SW + s*DW]")
    else:
        add("xp = x  # direct border handling: taps outside the input are skipped, nothing is copied")
        add("# tap (r, s) of output (oh, ow) reads x[oh*SH + r*DH - PH, ow*SW + s*DW - PW]")
        add("OFF_H, OFF_W, HX, WX = PH, PW, H, W")
    add("# interior output columns [ow_lo, ow_hi): all S taps inside the input")
    add("ow_lo = min(OW, (OFF_W + SW - 1) // SW)")
    add("ow_hi = max(ow_lo, min(OW, (WX - 1 + OFF_W - (S - 1) * DW) // SW + 1))")
    body += _main_loop(lay, config, loop, multiplier, g, flat)
    lines += indent(body, 4)
    lines += kernel_tail("depthwise", "x, w, out, OC, HB, WC", parallel)
    emit("")
    return "\n".join(lines)


def _render_plane(template: _DepthwiseCpuTemplate, workload: Workload, config: Config, g: ConvGeometry) -> str:
    """NCHW (see PLANE_AXIS and :class:`_PhasePlanes`): for each output channel, its input
    channel's plane copied into the zero-padded phase planes ``xp`` on the stack (once per input
    channel), then ``grid[q] = sum over taps of w[r, s] * xp[q + tap_offset(r, s)]`` over the grid
    of OH rows of XWP (q = oh * XWP + ow; the columns from OW on are never stored), then the valid
    columns copied to ``out``."""
    parallel = config["parallel"]
    multiplier = workload["multiplier"]
    planes = _PhasePlanes.of(g)
    xn = planes.elements(g)
    grid = g.OH * planes.cols
    lines = header(f"{workload.op}_cpu v{template.version}: depthwise convolution, vectorised over the "
                   "flattened zero-padded plane of each channel",
                   workload, config, "depthwise(x, w, out, OC, HB, WC)",
                   "OC = tile_c[1] (HB and WC unused)", ("tile_c", "tile_w", "tile_h"), parallel)
    emit = lines.append
    emit(f"M = {multiplier}  # channel multiplier: output channel o reads input channel o // M")
    emit(f"PH, PW = {g.PH}, {g.PW}  # padding")
    emit(f"SH, SW = {g.SH}, {g.SW}  # strides: SH x SW phase planes")
    emit(f"H, W, OH, OW = {g.H}, {g.W}, {g.OH}, {g.OW}  # planes (constant: the copies compile to vector moves)")
    lines += _phase_constants(planes, xn)
    emit(f"GRID = {grid}  # outputs computed: OH rows of XWP")
    emit("")
    emit("")
    lines += kernel_head("depthwise", "x, w, out, OC, HB, WC", parallel)
    taps = [(r, t) for r in range(g.R) for t in range(g.S)]
    terms = [f"xp[q + {planes.tap_offset(g, r, t)}] * w{r}_{t}" for r, t in taps]
    body = _grid_work_items(xn, grid) + [
        "        if o == o_lo or m == 0:  # a new input channel: copy its plane in",
        "            for h in range(H):",
        "                row = (h + PH) % SH * SW * PLANE + (h + PH) // SH * XWP",
    ]
    body += _copy_row(g, planes, "row", "h", 16)
    body += [f"        w{r}_{t} = w[c, m, {r}, {t}]" for r, t in taps]
    body += _grid_sum(terms, 8)
    body += [
        "        for oh in range(OH):",
        "            for ow in range(OW):",
        "                out[n, o, oh, ow] = grid[oh * XWP + ow]",
    ]
    lines += indent(body, 4)
    lines += kernel_tail("depthwise", "x, w, out, OC, HB, WC", parallel)
    emit("")
    return "\n".join(lines)


def _chunk_span(g: ConvGeometry, chunk: int) -> int:
    """The padded input rows that ``chunk`` output rows read."""
    return (chunk - 1) * g.SH + (g.R - 1) * g.DH + 1


def _row_chunk(g: ConvGeometry, chunk: int) -> "_PhasePlanes":
    """The phase planes of ``chunk`` output rows (ROWS_AXIS): the whole plane's, cut to the rows
    they read."""
    return replace(_PhasePlanes.of(g), rows=-(-_chunk_span(g, chunk) // g.SH))


def _row_chunk_elements(g: ConvGeometry, chunk: int) -> int:
    """Stack elements of a row-chunk kernel: its phase planes and its grid."""
    planes = _row_chunk(g, chunk)
    return planes.elements(g) + chunk * planes.cols


def _render_rows(template: _DepthwiseCpuTemplate, workload: Workload, config: Config, g: ConvGeometry) -> str:
    """NCHW planes too large for PLANE_AXIS: the plane kernel over chunks of CH output rows
    (tile_h[1]): for each output channel and chunk, the padded input rows the chunk reads copied
    into phase planes ``xp`` on the stack (rows outside the input zeroed), the grid of CH rows of
    XWP computed in one vector loop, its valid columns copied to ``out``."""
    parallel = config["parallel"]
    multiplier = workload["multiplier"]
    chunk = min(config["tile_h"][1], g.OH)
    planes = _row_chunk(g, chunk)
    xn = planes.elements(g)
    grid = chunk * planes.cols
    span = _chunk_span(g, chunk)
    lines = header(f"{workload.op}_cpu v{template.version}: depthwise convolution, vectorised over the "
                   f"flattened zero-padded rows of chunks of {chunk} output rows of each channel",
                   workload, config, "depthwise(x, w, out, OC, HB, WC)",
                   "OC = tile_c[1] (HB and WC unused: the rows per chunk are CH)", ("tile_c", "tile_w", "tile_h"),
                   parallel)
    emit = lines.append
    emit(f"M = {multiplier}  # channel multiplier: output channel o reads input channel o // M")
    emit(f"PH, PW = {g.PH}, {g.PW}  # padding")
    emit(f"SH, SW = {g.SH}, {g.SW}  # strides: SH x SW phase planes")
    emit(f"H, W, OH, OW = {g.H}, {g.W}, {g.OH}, {g.OW}")
    emit(f"CH = {chunk}  # output rows per chunk (tile_h[1])")
    emit(f"SPAN = {span}  # padded input rows a chunk reads")
    lines += _phase_constants(planes, xn)
    emit(f"GRID = {grid}  # outputs computed per chunk: CH rows of XWP")
    emit("")
    emit("")
    lines += kernel_head("depthwise", "x, w, out, OC, HB, WC", parallel)
    taps = [(r, t) for r in range(g.R) for t in range(g.S)]
    terms = [f"xp[q + {planes.tap_offset(g, r, t)}] * w{r}_{t}" for r, t in taps]
    body = _grid_work_items(xn, grid)
    body += [f"        w{r}_{t} = w[c, m, {r}, {t}]" for r, t in taps]
    body += [
        "        for oh0 in range(0, OH, CH):",
        "            for p in range(SPAN):  # padded input row oh0 * SH + p",
        "                h = oh0 * SH + p - PH",
        "                row = p % SH * SW * PLANE + p // SH * XWP",
        "                if 0 <= h < H:",
    ]
    body += _copy_row(g, planes, "row", "h", 20)
    body += ["                else:  # a padding row (or past the last)"]
    body += ["                    for j in range(XWP):"]
    body += [f"                        xp[row + {pw * planes.phase_elements} + j] = 0" for pw in range(g.SW)]
    body += _grid_sum(terms, 12)
    body += [
        "            for i in range(min(CH, OH - oh0)):",
        "                for ow in range(OW):",
        "                    out[n, o, oh0 + i, ow] = grid[i * XWP + ow]",
    ]
    lines += indent(body, 4)
    lines += kernel_tail("depthwise", "x, w, out, OC, HB, WC", parallel)
    emit("")
    return "\n".join(lines)


def _grid_work_items(xn: int, grid: int) -> list[str]:
    """The plane and row-chunk kernels' work items (image, channel block), their stack buffers
    (phase planes ``xp`` zeroed, ``grid``) and their loop over output channels ``o`` (input
    channel ``c``, multiplier index ``m``)."""
    return [
        "N, C = x.shape[0], x.shape[1]",
        "O = C * M  # output channels",
        "OC = max(OC, 1)",
        "o_blocks = (O + OC - 1) // OC",
        "# work items: (image, channel block)",
        "for item in prange(N * o_blocks):",
        "    n = item // o_blocks",
        "    o_lo = item % o_blocks * OC",
        "    o_hi = min(O, o_lo + OC)",
        f"    xp = stack_array({xn}, x.dtype)  # the phase planes (XN): their padding columns stay zero",
        "    for i in range(XN):",
        "        xp[i] = 0",
        f"    grid = stack_array({grid}, out.dtype)  # GRID",
        "    for o in range(o_lo, o_hi):",
        "        c = o // M",
        "        m = o % M",
    ]


def _grid_sum(terms: list[str], depth: int) -> list[str]:
    """The one vector loop over the grid: ``grid[q]`` = the sum of the taps' ``terms`` (indented ``depth``)."""
    pad = " " * depth
    lines = [f"{pad}for q in range(GRID):", f"{pad}    grid[q] = (" + terms[0]]
    lines += [f"{pad}               + {term}" for term in terms[1:]]
    lines[-1] += ")"
    return lines


def _phase_constants(planes: "_PhasePlanes", xn: int) -> list[str]:
    """The plane and row-chunk kernels' constants describing their phase planes."""
    return [f"XWP = {planes.cols}  # a phase plane's columns: the grid's row stride",
            f"PLANE = {planes.phase_elements}  # elements of a phase plane ({planes.rows} rows of XWP)",
            f"XN = {xn}  # the phase planes, plus the taps the last grid row reads past them"]


def _copy_row(g: ConvGeometry, planes: "_PhasePlanes", row: str, h: str, depth: int) -> list[str]:
    """Lines (indented ``depth``) copying input row ``h`` of channel ``c`` of image ``n`` into the
    phase planes ``xp`` at phase row offset ``row`` (its padding columns are left as they are)."""
    # padded column j * SW + pw is input column j * SW + pw - PW: for j in [j_lo, j_hi) all SW of
    # them are inside the input, and one loop that loads them together and stores each to its
    # phase is vectorised as an interleaved group (a scatter per element was not: 144ch 56x56 s2
    # ran slower than the column tiles); the input columns left over are copied one by one
    pad = " " * depth
    j_lo = -(-g.PW // g.SW)
    j_hi = max(j_lo, (g.W + g.PW - g.SW) // g.SW + 1)
    lines = [f"{pad}for j in range({j_lo}, {j_hi}):"]
    shift = lambda k: f" + {k}" if k > 0 else f" - {-k}" if k < 0 else ""  # noqa: E731
    plane = planes.phase_elements
    lines += [f"{pad}    xp[{row}{shift(pw * plane)} + j] = x[n, c, {h}, j * SW{shift(pw - g.PW)}]"
              for pw in range(g.SW)]
    covered = {j * g.SW + pw - g.PW for j in range(j_lo, j_hi) for pw in range(g.SW)}
    for col in (col for col in range(g.W) if col not in covered):
        phase, j = (col + g.PW) % g.SW, (col + g.PW) // g.SW
        lines += [f"{pad}xp[{row} + {phase * plane + j}] = x[n, c, {h}, {col}]"]
    return lines


def _main_loop(lay: Layout, config: Config, loop: str, multiplier: int, g: ConvGeometry, flat: bool) -> list[str]:
    axis = config["vector_axis"]
    ot, wt = _tiles(config)
    lines = [
        "o_blocks = (O + OC - 1) // OC",
        "h_blocks = (OH + HB - 1) // HB",
        "w_blocks = (OW + WC - 1) // WC",
        "# work items: (image, channel block, row block, column block)",
        f"for item in {loop}(N * o_blocks * h_blocks * w_blocks):",
        "    n = item // (o_blocks * h_blocks * w_blocks)",
        "    o_blk = item // (h_blocks * w_blocks) % o_blocks",
        "    h_blk = item // w_blocks % h_blocks",
        "    w_blk = item % w_blocks",
        "    o_lo, o_hi = o_blk * OC, min(O, o_blk * OC + OC)",
        "    h_lo, h_hi = h_blk * HB, min(OH, h_blk * HB + HB)",
        "    w_lo, w_hi = w_blk * WC, min(OW, w_blk * WC + WC)",
        "    un = np.uint64(n)",
        "    # columns [a, t_end) by register tiles; [w_lo, a) and [t_end, w_hi) one at a time",
        "    a = min(max(w_lo, ow_lo), w_hi)",
        "    b = max(a, min(w_hi, ow_hi))",
    ]
    if axis == "w" or flat:
        lines.append("    t_end = b if ow_hi - ow_lo >= WT else a  # an interior narrower than WT: column by column")
    else:
        lines.append("    t_end = b")
    channel_setup = _channel_setup(axis, ot)
    row_setup = [
        "uoh = np.uint64(oh)",
        "ih0 = oh * SH - OFF_H  # input row of filter row 0",
        "r_lo = 0 if ih0 >= 0 else (DH - 1 - ih0) // DH  # filter rows inside the input",
        "r_hi = min(R, (HX - 1 - ih0) // DH + 1)",
    ]
    tiles = _flat_tile_columns(config, g) if flat else _tile_columns(lay, config, multiplier, g.SW)
    columns = tiles + _single_columns(lay, config, multiplier)
    if config["loop_order"] == "channels_outer":
        nest = (["for o0 in range(o_lo, o_hi, OT):"] + indent(channel_setup, 4)
                + indent(["for oh in range(h_lo, h_hi):"], 4) + indent(row_setup + columns, 8))
    else:
        nest = (["for oh in range(h_lo, h_hi):"] + indent(row_setup, 4)
                + indent(["for o0 in range(o_lo, o_hi, OT):"], 4) + indent(channel_setup + columns, 8))
    return lines + indent(nest, 4)


def _channel_setup(axis: str, ot: int) -> list[str]:
    """The tile's output channels o_base + oo for oo in [o_first, o_last)."""
    if axis == "w":
        lines = ["o_base, o_first, o_last = o0, 0, min(OT, o_hi - o0)",
                 f"orow = stack_array({ot}, np.uint64)  # output channel of each tile row (edge: repeats)",
                 f"crow = stack_array({ot}, np.uint64)  # its input channel",
                 "for oo in range(OT):",
                 "    orow[oo] = np.uint64(min(o0 + oo, O - 1))",
                 "    crow[oo] = np.uint64(min(o0 + oo, O - 1) // M)"]
        return lines
    return ["o_base = min(o0, O - OT)  # a partial last tile shifts down to stay inside the channels",
            "o_first, o_last = o0 - o_base, min(o_hi, o_base + OT) - o_base",
            "uob = np.uint64(o_base)"]


def _channel(axis: str, multiplier: int, oo: str = "oo") -> tuple[str, str]:
    """(output channel, input channel) of tile channel ``oo`` (a variable or a literal)."""
    if axis == "w":
        return f"orow[{oo}]", f"crow[{oo}]"
    out_channel = f"(uob + np.uint64({oo}))"
    if multiplier == 1:
        return out_channel, out_channel
    return out_channel, f"{out_channel} // np.uint64(M)"


# ROWS_WRITTEN_OUT: tiles vectorised over unit-stride columns whole vectors wide with at least
# ROWS_WRITTEN_OUT_MIN rows (channels) update one row per line, each with its own loop over the lanes,
# not a loop over the rows around a loop over the lanes. As a loop over the rows, LLVM vectorised
# some tiles across the rows instead (gathers of the inputs, no vector FMAs), the pathology
# cpu/_gemm.py's micro-kernel had: on 32ch 112x112 (AVX-512, Zen 4, best of 9-11 interleaved) 8
# channels x 16 columns ran at 2.3 GFLOPS (227 gathers), written out 28.2; 8 x 8 11.6 -> 14.7.
# Strided and partial-vector tiles (whose loads are shuffles either way) keep the loop over the rows:
# written out they measured 8-35% slower (144ch 56x56 s2 4 x 16, 960ch 7x7 4 x 7), but within this
# host's noise (the same code differed by up to 20% in one run), so they were left as they were.
ROWS_WRITTEN_OUT_LANES = 8
# COLUMNS_WRITTEN_OUT: tiles vectorised over channels with at least COLUMNS_WRITTEN_OUT_MIN columns
# update every column in one loop over the lanes (Tile.update_rows_per_lane), as conv2d's do: as a
# loop over the columns, LLVM vectorised NHWC tiles of 16 channels x 4 or 8 columns across the
# columns (48-192 gathers, 128/256-bit FMAs). AVX-512 Zen 4, best of 7 interleaved, GFLOPS: 72ch
# 56x56 5x5 s2 16 x 8 1.5 -> 26.4 serial, 2.9 -> 51.2 on 2 threads (unroll_r 4: 1.5 -> 8.7), 16 x 4
# 1.5 -> 25.1; 64ch 56x56 16 x 8 1.7 -> 10.8 serial, 3.6 -> 20.3. Every other NHWC tile of 3-10
# columns x 16 or 32 channels (unroll_r 1 or 4) compiled to the same FMAs either way, as did NCHW
# tiles over channels (which gather).


# Column tiles that shift left to stay whole (vector_axis=w and FLAT_TILES): the tile over columns
# [col_base, col_base + WT) that ends with the item's interior [a, b), or with the plane's where the
# item's is narrower; its own columns are [j_first, j_last) of it, and it is stored whole when all
# of its columns and channels are the item's.
SHIFTED_TILE_SETUP = ["col_base = max(ow_lo, min(w0, b - WT))",
                      "j_first, j_last = w0 - col_base, min(t_end, col_base + WT) - col_base"]
SHIFTED_TILE_WHOLE = "o_first == 0 and o_last == OT and col_base >= a and col_base + WT <= b"


def _tile_columns(lay: Layout, config: Config, multiplier: int, stride_w: int) -> list[str]:
    axis = config["vector_axis"]
    ot, wt = _tiles(config)
    if axis == "w":  # rows: the OT channels (weights broadcast); lanes: the WT columns
        tile = Tile(ot, wt, "j")
        # a partial tile shifts left to end with the item's interior columns [a, b), so that it is
        # stored whole (its first columns get the values the tile before it stored there), unless the
        # item's interior is narrower than the tile: then it ends with the whole interior and stores
        # only its own columns. Before, it ended with the plane's interior and was stored column by
        # column from a stack buffer. Best / median of 15 interleaved rounds (Zen 4, GFLOPS): 8ch
        # 112x112 serial 23.3 / 23.2 -> 25.3 / 25.0 (another run: 100 -> 74 us), 96ch 28x28 17.8 /
        # 17.5 -> 26.6 / 19.7; 32ch 112x112 and 144ch 56x56 s2 within noise.
        setup = SHIFTED_TILE_SETUP + ["col0 = col_base * SW - OFF_W"]
        x_lane = "np.uint64(col0 + j * SW + s * DW)"
        if stride_w == 1 and wt % ROWS_WRITTEN_OUT_LANES == 0 and ot >= ROWS_WRITTEN_OUT_MIN:
            # each of the OT rows written out with its own loop over the lanes (see ROWS_WRITTEN_OUT)
            update = tile.update_by_rows(
                "wv", lambda b: f"wt[ur, us, {_channel(axis, multiplier, str(b))[0]}]",
                lambda b: lay.x('un', _channel(axis, multiplier, str(b))[1], 'uih', x_lane), "WT")
        else:
            o_chan, c_chan = _channel(axis, multiplier)
            update = ["for oo in range(OT):", f"    wv = wt[ur, us, {o_chan}]", "    for j in range(WT):",
                      f"        {tile.at('oo')} += wv * {lay.x('un', c_chan, 'uih', x_lane)}"]
        store = tile.store(row="oo", target=lambda b: lay.out("un", f"np.uint64(o_base + {b})", "uoh",
                                                               "np.uint64(col_base + j)"),
                           whole=SHIFTED_TILE_WHOLE, rows_edge="o_first, o_last", lanes_edge="j_first, j_last",
                           first=None,
                           contiguous=lay.nchw)
    else:  # rows: the WT columns; lanes: the OT channels (weights and inputs both vectors)
        tile = Tile(wt, ot, "oo")
        o_chan, c_chan = _channel(axis, multiplier)
        setup = ["col_base, j_last = w0, min(WT, t_end - w0)",
                 f"cols = stack_array({wt}, np.uint64)  # input column of each tile column (edge: repeats)",
                 "for j in range(WT):",
                 "    cols[j] = np.uint64(min(w0 + j, t_end - 1) * SW - OFF_W)"]
        if wt >= COLUMNS_WRITTEN_OUT_MIN:  # one loop over the lanes updating every column (COLUMNS_WRITTEN_OUT)
            update = tile.update_rows_per_lane(
                "wk", f"wt[ur, us, {o_chan}]",
                lambda b: lay.x("un", c_chan, "uih", f"cols[{b}] + np.uint64(s * DW)"), "OT")
        else:
            update = ["for j in range(WT):",
                      "    for oo in range(OT):",
                      f"        {tile.at('j')} += wt[ur, us, {o_chan}] * "
                      f"{lay.x('un', c_chan, 'uih', 'cols[j] + np.uint64(s * DW)')}"]
        store = tile.store(row="j", target=lambda b: lay.out("un", "np.uint64(o_base + oo)", "uoh",
                                                              f"np.uint64(col_base + {b})"),
                           whole="o_first == 0 and o_last == OT and j_last == WT",
                           rows_edge="0, j_last", lanes_edge="o_first, o_last", first=None,
                           contiguous=not lay.nchw)
    reduction = unrolled_loop("r", "r_lo", "r_hi", config["unroll_r"], [
        "uih, ur = np.uint64(ih0 + r * DH), np.uint64(r)",
        "for s in range(S):  # the S taps of one filter row",
        "    us = np.uint64(s)",
    ] + indent(update, 4))
    return (["for w0 in range(a, t_end, WT):  # interior columns: register tiles"]
            + indent(setup + tile.zero() + reduction + store, 4))


# FLAT_TILES: NHWC tiles over channels (no channel multiplier, direct border handling) index the
# input, weights and output as flat views whose strides are the workload's sizes, constants: every
# tap of a tile is then a constant offset from one index per filter row, and LLVM addresses them as
# one register plus displacements, loading each input vector once for the taps that share it.
# Before, each tile column had its input column in a stack array and each (column, tap) its own
# pointer: 24-30 pointers for an 8-10 column 3x3 tile, spilled to the stack and incremented there
# every filter row. A partial last tile shifts left to stay whole, as for vector_axis=w. Zen 4, 2
# threads, defaults, best of 7-9 interleaved, us (torch 2.14 beside): 96ch 112x112 574 -> 161 (171),
# 144ch 56x56 153 -> 80 (92), 192ch 28x28 70 -> 30 (58), 576ch 14x14 42 -> 24 (54), 72ch 56x56 5x5
# s2 50 -> 31 (64), 144ch 56x56 s2 -> 33 (96); but 960ch 7x7 18 -> 23-28 (47-64), cause not found.


def _flat_tiles(lay: Layout, config: Config, multiplier: int, padded: bool) -> bool:
    return not lay.nchw and config["vector_axis"] == "c" and multiplier == 1 and not padded


def _flat_tile_columns(config: Config, g: ConvGeometry) -> list[str]:
    """Register tiles of WT columns x OT channels over the interior columns (FLAT_TILES)."""
    ot, wt = _tiles(config)
    tile = Tile(wt, ot, "oo")
    taps = range(g.S)
    update = (["xr = np.uint64(((n * XH + ih0 + r * DH) * XW + col_base * SW - OFF_W) * XC + o_base)",
               "wr = np.uint64(r * S * XC + o_base)",
               "for oo in range(OT):"]
              + [f"    wk{s} = wf[wr + np.uint64({s * g.C} + oo)]" for s in taps]
              + [f"    {tile.at(j)} += xf[xr + np.uint64({(j * g.SW + s * g.DW) * g.C} + oo)] * wk{s}"
                 for j in range(wt) for s in taps])
    reduction = unrolled_loop("r", "r_lo", "r_hi", config["unroll_r"], update)
    store = ["ob = np.uint64(((n * YH + oh) * YW + col_base) * XC + o_base)"] + tile.store(
        row="j", target=lambda b: f"of[ob + np.uint64({b} * XC + oo)]",
        whole=SHIFTED_TILE_WHOLE, rows_edge="j_first, j_last", lanes_edge="o_first, o_last", first=None,
        contiguous=True)
    return (["for w0 in range(a, t_end, WT):  # interior columns: register tiles"]
            + indent(SHIFTED_TILE_SETUP + tile.zero() + reduction + store, 4))


def _single_columns(lay: Layout, config: Config, multiplier: int) -> list[str]:
    axis = config["vector_axis"]
    ot, _ = _tiles(config)
    o_chan, c_chan = _channel(axis, multiplier)
    return [
        "for part in range(2):  # border columns (and short runs): one at a time, taps clipped",
        "    c_lo, c_hi = (w_lo, a) if part == 0 else (t_end, w_hi)",
        "    for ow in range(c_lo, c_hi):",
        "        iw0 = ow * SW - OFF_W  # input column of filter column 0",
        "        s_lo = 0 if iw0 >= 0 else (DW - 1 - iw0) // DW",
        "        s_hi = min(S, (WX - 1 - iw0) // DW + 1)",
        f"        col = stack_array({ot}, out.dtype)",
        "        for oo in range(OT):",
        "            col[oo] = 0",
        "        for r in range(r_lo, r_hi):",
        "            uih, ur = np.uint64(ih0 + r * DH), np.uint64(r)",
        "            for s in range(s_lo, s_hi):",
        "                uiw, us = np.uint64(iw0 + s * DW), np.uint64(s)",
        "                for oo in range(OT):",
        f"                    col[oo] += wt[ur, us, {o_chan}] * {lay.x('un', c_chan, 'uih', 'uiw')}",
        "        for oo in range(o_first, o_last):",
        # an unsigned index into the stack buffer: a signed one is wrapped below zero (gathers)
        f"            {lay.out('un', 'np.uint64(o_base + oo)', 'uoh', 'np.uint64(ow)')} = col[np.uint64(oo)]",
    ]
