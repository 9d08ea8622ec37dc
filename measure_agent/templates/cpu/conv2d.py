"""2-D convolution on CPUs (NCHW and NHWC), via numba: a register-blocked direct convolution, and
for 3x3 filters with unit stride Winograd F(2x2, 3x3) (``algorithm``; see ``cpu/_winograd.py``).

The rendered kernel computes ``out[n, k, oh, ow] = sum_{c, r, s} x[n, c, oh*SH + r*DH - PH,
ow*SW + s*DW - PW] * w[k, c, r, s]`` (NHWC: the same sums in the NHWC/HWIO layouts) as:

    [pad]   copy x into a zero-padded buffer (only when the workload pads; one pass per call)
    [pack]  copy w into KT-wide output-channel tiles, zero-padded: wp[k / KT, reduction position, KT]
            ("NCHWc"-style weights; one pass per call, counted in the timing; needed to vectorise
            over output channels in NCHW, optional otherwise)
    for each work item (image n, KC-block of output channels, HB-block of output rows,
                        WC-block of output columns), in parallel if asked
      for each CB-block of input channels                                   (reduction tiling)
        for the KT-channel tiles and the (row, WT-column) tiles of the item, in ``loop_order``
          KT x WT register tile: accumulators in registers, reduced over the block's channels and
          the R x S taps in ``reduction_order`` (channel loop unrolled ``unroll_c`` times), then
          stored to out (added to it after the first channel block)

The register tile is vectorised along one axis, ``vector_axis``:
- ``k``: over output channels. A vector of KT packed weights is loaded once per (c, r, s) and each
  of the WT input values is broadcast against it (the measured-best conv schedule on AVX2: 1.35x
  over vectorising along the row). The input is read through a per-tile table of column offsets, so
  an edge tile simply repeats its last column (stores are masked).
- ``w``: over output columns (contiguous in NCHW). WT input values are loaded as a vector (one
  load per tap with stride 1) and each of the KT weights is broadcast. An edge tile shifts left to
  stay inside the row (split knobs never offer a tile longer than its axis); its stores are masked.

Packing choice: the weights are repacked inside the kernel, on every call. A kernel keeps no
state between calls and the engine times everything it does, so the pack is part of the measured
cost: one read and one write of the weights, small next to the FMAs when each weight serves many
outputs (56x56, 28x28 and 14x14 layers), not when it serves few (ResNet-50's 7x7 layers: 49). There
the tuner can read the weights in place (``pack_weights = False`` with ``vector_axis = w``), and the
default does for pointwise layers. A deployment that packs once ahead of time would gain the rest.

Pointwise convolutions with unit stride and no padding view the output rows as one long row
(``OH*OW`` columns) so that column tiles and blocks run across row ends. Remainders in every axis
are handled (zero-padded weight tiles, clamped or shifted tiles, masked stores); correctness never
depends on SLP vectorisation.
"""

from __future__ import annotations

import math

from measure_agent.device import DeviceInfo
from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cpu._common import (
    PARALLEL_MIN_FLOPS,
    BLOCK_TILES,
    UNROLLS,
    CpuSpace,
    check_workload,
    header,
    indent,
    kernel_head,
    kernel_tail,
    pick_choice,
    pick_split,
    pick_tile,
    reduction_blocks,
    COLUMNS_WRITTEN_OUT_MIN,
    ROWS_WRITTEN_OUT_MIN,
    Tile,
    target_of,
    unrolled_loop,
    vector_target,
)
from measure_agent.templates.cpu._conv import ConvGeometry, Layout, pad_input
from measure_agent.templates.cpu._winograd import winograd_applies, winograd_body
from measure_agent.workload import Workload

VECTOR_AXES = ("k", "w")
REDUCTION_ORDERS = ("c_outer", "taps_outer")
LOOP_ORDERS = ("k_outer", "spatial_outer")
ROW_BLOCKS = (1, 2, 4, 8, 16, 32, 64)
# Output-channel blocks are sized so that their packed weights stay in L2 (Zen 3: 512 KiB a core).
WEIGHT_BLOCK_BYTES = 256 * 1024
# Enough parallel work items to keep every core busy despite uneven items.
ITEMS_PER_CORE = 4
CORES_GUESS = 2
# A direct NCHW tile (c_outer) whose filter rows have at most UNROLLED_ROW_TAPS taps: LLVM unrolls
# the row and loads all of its WT x S input broadcasts ahead of the FMAs, so a default keeps those
# to ROW_BROADCASTS. Measured (2 threads, 2 vectors of output channels, GFLOPS best of 3 rounds):
# Zen 4 (AVX-512, 32 registers), 3x3 s2 128ch 56x56: WT 10 108-118 (the machine code spills the
# hoisted broadcasts to the stack: +27 stores, +15 reloads), 8 127, 5 152-154, 4 141-160; 3x3 s2
# 64ch 56x56 111 / 136 / 157 / 160 (10 / 8 / 5 / 4); 3x3 s2 256ch 28x28 WT 8 115, 5 133; 3x3 32ch
# 56x56 WT 10 108, 8 145, 5 150; Zen 3 (AVX2, 16 registers), 3x3 s2 128ch WT 6 94-112, 5 129-138.
# A 7-tap row (ResNet's 7x7 stem) stays a loop at wide tiles: WT 2-10 within noise (138-154).
UNROLLED_ROW_TAPS = 3
ROW_BROADCASTS = 16
# Output-channel vectors of a direct tile whose columns ROW_BROADCASTS capped, as the accumulators
# allow, with 32 vector registers (2-core AVX-512 Xeon, 3x3 s2 128ch 56x56: 4 vectors x 4 columns
# 209-223 GFLOPS, 2 x 4 171-187; 3x3 s2 64ch 56x56 224-232 / 176-187; 3x3 s2 256ch 28x28
# 231-232 / 188-192; 3x3 32->64ch 56x56 240 / 201). Not on planes of few outputs, where it was
# slower and why is not known: 3x3 s2 512ch 14x14 (49 outputs) ran 110-117 / 136-140.
MAX_KT_VECTORS = 4
WIDE_KT_MIN_OUTPUTS = 128
# Winograd register tiles: tiles of a panel broadcast against KT-channel vectors. Measured (2-core
# Xeon, AVX-512, 2 vectors of output channels): 8 tiles 272-314 GFLOPS on ResNet-50's 3x3 layers,
# 10 tiles 204-275, 12 tiles ~100 (spills), 5 tiles 147-273.
WINOGRAD_TILES = (4, 5, 6, 8)
# Accumulator registers a default Winograd tile may use: 5/8 of them (10 of AVX2's 16, 20 of 32),
# fewer than a direct tile's 3/4. Measured (2-core Zen 3, AVX2, 2 threads, best (median) of 4
# interleaved rounds, 2 vectors of output channels): 6 tiles (12 accumulators) ran 98-104 (88-96)
# GFLOPS on 3x3 layers of 64 and 96 channels at 56x56, NCHW and NHWC; 4 tiles 196-218 (167-197),
# 5 tiles 185-214 (126-197). On AVX-512 the budget of 20 leaves the measured 8 tiles in reach.
WINOGRAD_ACCUMULATOR_EIGHTHS = 5
# Winograd pays its transforms per tile and channel (C + K), its savings per channel pair (C * K):
# a default takes it from this many input and output channels. Measured, defaults against defaults
# (2-core Xeon, AVX-512, 2 threads, GFLOPS best of 200 calls, two rounds; onnxruntime 1.32 beside):
# 3x3 64ch 56x56 364-365 vs direct 290-320 (ort 357-397); 128ch 28x28 395-434 vs 262-268 (342-403);
# 256ch 14x14 370-398 vs 285-290 (384-415); 64ch 28x28 330-363 vs 258-267; NHWC 64ch 56x56 366-400
# vs 326-359; 32ch 56x56 a tie (280-285 vs 260-300); 16->32ch 112x112 a loss (182-222 vs 254-256).
WINOGRAD_MIN_CHANNELS = 64
# A default Winograd work item's transformed weights, at most (2 threads, ResNet-50's 3x3 layers:
# 128 and 256 channels 302-331 GFLOPS with all channels per item, 352 and 320-329 in blocks of this).
WINOGRAD_WEIGHT_BLOCK_BYTES = 512 * 1024


def _tiles(config: Config) -> tuple[int, int]:
    return config["tile_k"][-1], config["tile_w"][-1]


class _Conv2dCpuTemplate(Template):
    """Register-blocked direct conv2d for CPUs (float32 and float64).

    Knobs:
    - ``algorithm``: ``direct``, or (3x3 filter, unit stride and dilation) ``winograd``: F(2x2, 3x3),
      2.25x fewer multiply-adds for three transforms; its register tile is KT output channels x
      WT 2x2-output tiles of one tile row, its work items KC channels x HB/2 tile rows, and the
      knobs only the direct kernel has are held at one value (``vector_axis = k``, ``tile_w`` =
      one register tile per block, ``tile_c = C``, ``reduction_order = c_outer``, packed weights).
    - ``vector_axis``: ``k`` (vectorise over output channels, broadcast input values) or ``w``
      (vectorise over output columns, broadcast weights).
    - ``tile_k`` = (blocks, KC/KT, KT): KT output channels per register tile; KC per work item.
    - ``tile_w`` = (blocks, WC/WT, WT): WT output columns per register tile; WC per work item.
    - ``tile_h`` = (blocks, HB): HB output rows per work item.
    - ``tile_c``: input channels per reduction block CB (``C``: no reduction blocking).
    - ``reduction_order``: ``c_outer`` (for each input channel, the R x S taps) or ``taps_outer``
      (for each tap, the input channels: contiguous input reads in NHWC).
    - ``loop_order``: inside a work item, ``k_outer`` keeps one channel tile's weights hot while the
      input streams past; ``spatial_outer`` keeps an input patch hot while the weights stream.
    - ``unroll_c``: copies of the channel loop's body per iteration.
    - ``pack_weights``: repack the weights into zero-padded KT-wide tiles at the start of each call.
    - ``parallel``: run the work items on all cores (numba ``prange``).

    KT, WT, the orders, unrolling, packing and parallel are compiled in; KC, WC, HB and CB are
    runtime arguments (``conv2d(x, w, out, KC, HB, WC, CB)``).
    """

    target = "cpu"
    # 2: 512-bit vectors on AVX-512 hosts; 3: the zero-padded input copied in plain loops; 4: winograd;
    # 5: the direct tile's rows written out (ROWS_WRITTEN_OUT); 6: and its columns (COLUMNS_WRITTEN_OUT)
    version = "6"
    layout: str

    # -- space ------------------------------------------------------------------------------
    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        check_workload(self, workload)
        g = ConvGeometry.of(workload)
        vt = vector_target(device)
        dtype = workload.dtype
        algorithms = ("direct", "winograd") if winograd_applies(g) else ("direct",)
        knobs = [
            ChoiceKnob("algorithm", algorithms),
            ChoiceKnob("vector_axis", VECTOR_AXES),
            SplitKnob("tile_k", g.K, (BLOCK_TILES, vt.axis_tiles(dtype, g.K))),
            SplitKnob("tile_w", g.cols, (BLOCK_TILES, vt.axis_tiles(dtype, g.cols))),
            SplitKnob("tile_h", g.rows, (ROW_BLOCKS,)),
            ChoiceKnob("tile_c", reduction_blocks(g.C, 4)),
            ChoiceKnob("reduction_order", REDUCTION_ORDERS),
            ChoiceKnob("loop_order", LOOP_ORDERS),
            ChoiceKnob("unroll_c", UNROLLS),
            BoolKnob("pack_weights"),
            BoolKnob("parallel"),
        ]
        constraints = [
            Constraint(
                ("vector_axis", "tile_k", "tile_w"),
                lambda axis, tk, tw: (vt.vector_ok(tk[-1], tw[-1], dtype, g.K) if axis == "k"
                                      else vt.vector_ok(tw[-1], tk[-1], dtype, g.cols)),
                f"the vector-axis tile is a multiple of the vector ({vt.lanes(dtype)} lanes) or the whole "
                f"axis, the other a broadcast tile, and the accumulators fit in {vt.max_accumulators} registers",
            ),
        ]
        if "winograd" in algorithms:
            constraints.append(Constraint(
                ("algorithm", "vector_axis", "tile_w", "tile_c", "reduction_order", "pack_weights"),
                lambda alg, axis, tw, tc, order, pack: alg == "direct" or (
                    axis == "k" and tw[1] == 1 and tc == g.C and order == "c_outer" and pack),
                "winograd vectorises over output channels with one register tile per column block, all "
                "input channels in one block, c_outer and packed weights (the knobs it does not use)",
            ))
        if self.layout == "nchw":
            constraints.append(Constraint(
                ("vector_axis", "pack_weights"),
                lambda axis, pack: axis == "w" or pack,
                "vectorising over output channels in NCHW needs packed weights (OIHW is strided along K)",
            ))
        return CpuSpace(knobs, constraints, vector=vt)

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        """3x3 unit-stride layers with >= ``WINOGRAD_MIN_CHANNELS`` channels each way: Winograd
        (:meth:`_winograd_default`). Otherwise the direct kernel, vectorised over output channels
        with packed weights: KT = two vectors (or less), WT the column tile that fits the remaining
        accumulator registers and wastes least on the row's last tile (AVX2 float32: 16 x 6 at 56
        or 28 columns, 16 x 5 at 14, 12 accumulators), in NCHW with filter rows of up to 3 taps at
        most ``ROW_BROADCASTS`` broadcasts a row (3x3: WT <= 5), and then, with 32 registers and at
        least ``WIDE_KT_MIN_OUTPUTS`` outputs a plane, KT up to ``MAX_KT_VECTORS`` vectors; all
        input channels in one reduction block; output-channel blocks whose packed weights fit in
        L2; work items split over rows (or columns) until every core has several; with a stride,
        each input patch is kept hot across the channel tiles (``spatial_outer``).

        Pointwise layers with few outputs per weight (ResNet-50's 7x7 1x1 layers: 49) vectorise
        over the (flattened) columns instead and read the weights in place: repacking megabytes of
        weights each call would cost as much as the FMAs."""
        g = ConvGeometry.of(workload)
        vt = target_of(space)
        dtype = workload.dtype
        if "winograd" in space.knob("algorithm").values and min(g.C, g.K) >= WINOGRAD_MIN_CHANNELS:
            return self._winograd_default(workload, space, g, vt)
        lanes = vt.lanes(dtype)
        itemsize = 4 if dtype == "float32" else 8
        few_outputs = g.flat and g.N * g.cols < 128 and g.cols >= 2 * lanes
        if few_outputs:
            axis, pack = "w", False
            wt = 2 * lanes
            kt = pick_choice([t for t in vt.default_broadcast_tiles if t <= g.K],
                             vt.max_accumulators // vt.accumulator_vectors(1, wt, dtype))
        else:
            axis, pack = "k", True
            kt = g.K if g.K <= 2 * lanes else 2 * lanes
            wt_at_most = vt.max_accumulators // vt.accumulator_vectors(1, kt, dtype)
            row_capped = self.layout == "nchw" and g.S <= UNROLLED_ROW_TAPS
            if row_capped:
                wt_at_most = min(wt_at_most, ROW_BROADCASTS // g.S)
            wt = pick_tile(g.cols, vt.default_broadcast_tiles, wt_at_most)
            if row_capped and kt < g.K and vt.registers >= 32 and g.rows * g.cols >= WIDE_KT_MIN_OUTPUTS:
                # the accumulators the capped row left free: more output-channel vectors per broadcast
                # (measured with 32 registers only; AVX2's 16 keep two vectors, not measured here)
                kt = min(g.K, min(MAX_KT_VECTORS, vt.max_accumulators // wt) * lanes)
        kc_at_most = max(kt, WEIGHT_BLOCK_BYTES // (g.C * g.R * g.S * itemsize))
        tile_k = pick_split(space.knob("tile_k"), kt, kc_at_most, inner_ok=lambda t: t == kt)
        k_blocks = math.ceil(g.K / (tile_k[1] * kt))
        # split each image's rows (or, for one long row, its columns) into enough work items
        per_image = max(1, math.ceil(ITEMS_PER_CORE * CORES_GUESS / (g.N * k_blocks)))
        tile_h = max((v for v in space.knob("tile_h").values if v[1] <= max(1, g.rows // per_image)),
                     key=lambda v: v[1])
        col_splits = max(1, math.ceil(per_image / math.ceil(g.rows / tile_h[1])))
        tile_w = pick_split(space.knob("tile_w"), wt, max(wt, g.cols // col_splits), inner_ok=lambda t: t == wt)
        strided = g.SH > 1 or g.SW > 1
        return space.make({
            "algorithm": "direct",
            "vector_axis": axis,
            "tile_k": tile_k,
            "tile_w": tile_w,
            "tile_h": tile_h,
            "tile_c": g.C,
            "reduction_order": "taps_outer" if self.layout == "nhwc" else "c_outer",
            "loop_order": "spatial_outer" if strided else "k_outer",
            "unroll_c": 1,
            "pack_weights": pack,
            "parallel": workload.flops >= PARALLEL_MIN_FLOPS,
        })

    def _winograd_default(self, workload: Workload, space: ConfigSpace, g: ConvGeometry, vt) -> Config:
        """Winograd with KT = two vectors of output channels (or all of them), TT tiles from
        ``WINOGRAD_TILES`` that fit :data:`WINOGRAD_ACCUMULATOR_EIGHTHS` of the registers and waste
        least at the row's end, output-channel
        blocks whose transformed weights fit ``WINOGRAD_WEIGHT_BLOCK_BYTES``, and work items of whole
        tile rows until every core has several."""
        lanes = vt.lanes(workload.dtype)
        itemsize = 4 if workload.dtype == "float32" else 8
        kt = g.K if g.K <= 2 * lanes else 2 * lanes
        # output-channel blocks whose transformed weights (16 x C x KC) stay in L2 while the item's
        # tiles stream past; then enough row blocks for every core to have several items
        wanted_blocks = max(1, min(math.ceil(g.K / kt),
                                   math.ceil(16 * g.C * g.K * itemsize / WINOGRAD_WEIGHT_BLOCK_BYTES)))
        kc = math.ceil(g.K / wanted_blocks / kt) * kt
        tile_k = pick_split(space.knob("tile_k"), kt, kc, inner_ok=lambda t: t == kt)
        k_blocks = math.ceil(g.K / (tile_k[1] * kt))
        q = (g.OW + 1) // 2
        budget = vt.registers * WINOGRAD_ACCUMULATOR_EIGHTHS // 8
        at_most = budget // vt.accumulator_vectors(1, kt, workload.dtype)
        tiles = [t for t in WINOGRAD_TILES if t in vt.broadcast_tiles and t <= min(g.OW, at_most)] or [1]
        # a panel may run past the row's last tile (its slots compute zeros): 8 tiles for 7 of them
        # (14x14 outputs) ran 1.2x faster than 4 + 4 on one thread
        tt = max(tiles, key=lambda t: (q / (math.ceil(q / t) * t)) * (t / max(tiles)) ** 0.25)
        tile_w = min((v for v in space.knob("tile_w").values if v[-1] == tt and v[1] == 1), key=lambda v: v[0])
        tile_rows = g.N * ((g.OH + 1) // 2)
        row_blocks = math.ceil(ITEMS_PER_CORE * CORES_GUESS / k_blocks)
        rows_per_item = max(1, tile_rows // row_blocks)
        tile_h = max((v for v in space.knob("tile_h").values if v[1] <= max(1, 2 * rows_per_item)),
                     key=lambda v: v[1])
        return space.make({
            "algorithm": "winograd",
            "vector_axis": "k",
            "tile_k": tile_k,
            "tile_w": tile_w,
            "tile_h": tile_h,
            "tile_c": g.C,
            "reduction_order": "c_outer",
            "loop_order": "k_outer",
            "unroll_c": 1,
            "pack_weights": True,
            "parallel": workload.flops >= PARALLEL_MIN_FLOPS,
        })

    # -- rendering --------------------------------------------------------------------------
    def render(self, workload: Workload, config: Config) -> KernelSource:
        check_workload(self, workload)
        g = ConvGeometry.of(workload)
        kt, wt = _tiles(config)
        text = _render(self, workload, config, g)
        runtime_args = (config["tile_k"][1] * kt, config["tile_h"][1], config["tile_w"][1] * wt, config["tile_c"])
        return KernelSource(text=text, entry="conv2d", runtime_args=runtime_args)


class Conv2dNchwCpuTemplate(_Conv2dCpuTemplate):
    __doc__ = _Conv2dCpuTemplate.__doc__
    op = "conv2d_nchw"
    layout = "nchw"


class Conv2dNhwcCpuTemplate(_Conv2dCpuTemplate):
    __doc__ = _Conv2dCpuTemplate.__doc__
    op = "conv2d_nhwc"
    layout = "nhwc"


def _render(template: _Conv2dCpuTemplate, workload: Workload, config: Config, g: ConvGeometry) -> str:
    kt, wt = _tiles(config)
    axis = config["vector_axis"]
    parallel = config["parallel"]
    lay = Layout(template.layout)
    loop = "prange"  # always (see kernel_head); parallel=False runs it on one thread
    winograd = config["algorithm"] == "winograd"
    if winograd:
        title = (f"{workload.op}_cpu v{template.version}: Winograd F(2x2, 3x3), register tile {kt} output "
                 f"channels x {wt} tiles of 2x2 outputs, vectorised over output channels")
    else:
        title = (f"{workload.op}_cpu v{template.version}: direct convolution, register tile "
                 f"{kt} output channels x {wt} output columns, vectorised over "
                 f"{'output channels' if axis == 'k' else 'output columns'}")
    lines = header(title, workload, config, "conv2d(x, w, out, KC, HB, WC, CB)",
                   "KC = tile_k[1] * KT, HB = tile_h[1], WC = tile_w[1] * WT, CB = tile_c",
                   ("tile_k", "tile_w", "tile_h", "tile_c"), parallel)
    emit = lines.append
    emit(f"KT = {kt}  # output channels per register tile")
    if winograd:
        emit(f"TT = {wt}  # 2x2-output tiles per register tile (a panel of one tile row)")
    else:
        emit(f"WT = {wt}  # output columns per register tile")
    emit(f"R, S = {g.R}, {g.S}  # filter taps")
    emit(f"SH, SW = {g.SH}, {g.SW}  # strides")
    emit(f"DH, DW = {g.DH}, {g.DW}  # dilations")
    emit(f"PH, PW = {g.PH}, {g.PW}  # padding")
    emit("")
    emit("")
    lines += kernel_head("conv2d", "x, w, out, KC, HB, WC, CB", parallel)
    body: list[str] = []
    add = body.append
    if lay.nchw:
        add("N, C, H, W = x.shape")
        add("K = w.shape[0]")
        add("OH, OW = out.shape[2], out.shape[3]")
    else:
        add("N, H, W, C = x.shape")
        add("K = w.shape[3]")
        add("OH, OW = out.shape[1], out.shape[2]")
    body += (winograd_body(g, lay, config, workload.dtype) if winograd
             else _direct_body(g, lay, config, loop))
    lines += indent(body, 4)
    lines += kernel_tail("conv2d", "x, w, out, KC, HB, WC, CB", parallel)
    emit("")
    return "\n".join(lines)


def _direct_body(g: ConvGeometry, lay: Layout, config: Config, loop: str) -> list[str]:
    """The direct kernel's body, after the shapes are bound."""
    body: list[str] = []
    add = body.append
    if g.flat:
        add("# pointwise, unit stride, no padding: each image's output is one row of OH*OW columns")
        if lay.nchw:
            add("x = x.reshape((N, C, 1, H * W))")
            add("out = out.reshape((N, K, 1, OH * OW))")
        else:
            add("x = x.reshape((N, 1, H * W, C))")
            add("out = out.reshape((N, 1, OH * OW, K))")
        add("OW = OH * OW")
        add("OH = 1")
    add("# cache blocks: whole register tiles, at least one")
    add("KC = max(KT, KC - KC % KT)")
    add("WC = max(WT, WC - WC % WT)")
    add("HB, CB = max(HB, 1), max(CB, 1)")
    body += pad_input(g, lay, loop, g.padded)
    if config["pack_weights"]:
        body += _pack_weights(lay, config["reduction_order"], loop)
    return body + _main_loop(g, lay, config, loop)


def _position(order: str) -> str:
    """The reduction position of (c, r, s) in packed weights: contiguous in the reduction order."""
    return "(c * R + r) * S + s" if order == "c_outer" else "(r * S + s) * C + c"


def _pack_weights(lay: Layout, order: str, loop: str) -> list[str]:
    return [
        f"# weights packed into KT-wide output-channel tiles, zero-padded, in {order} reduction order:",
        f"# wp[k // KT, {_position(order)}, k % KT] = weight (k, c, r, s)",
        "wp = np.empty(((K + KT - 1) // KT, C * R * S, KT), dtype=w.dtype)",
        f"for kt in {loop}((K + KT - 1) // KT):",
        "    for c in range(C):",
        "        for r in range(R):",
        "            for s in range(S):",
        f"                pos = {_position(order)}",
        "                for kk in range(KT):",
        "                    k = kt * KT + kk",
        f"                    wp[kt, pos, kk] = {lay.w('k', 'c', 'r', 's')} if k < K else 0",
    ]


def _main_loop(g: ConvGeometry, lay: Layout, config: Config, loop: str) -> list[str]:
    axis = config["vector_axis"]
    pack = config["pack_weights"]
    kt, wt = _tiles(config)
    lines = [
        "k_blocks = (K + KC - 1) // KC",
        "h_blocks = (OH + HB - 1) // HB",
        "w_blocks = (OW + WC - 1) // WC",
        "# work items: (image, output-channel block, row block, column block)",
        f"for item in {loop}(N * k_blocks * h_blocks * w_blocks):",
        "    n = item // (k_blocks * h_blocks * w_blocks)",
        "    k_blk = item // (h_blocks * w_blocks) % k_blocks",
        "    h_blk = item // w_blocks % h_blocks",
        "    w_blk = item % w_blocks",
        "    k_lo, k_hi = k_blk * KC, min(K, k_blk * KC + KC)",
        "    h_lo, h_hi = h_blk * HB, min(OH, h_blk * HB + HB)",
        "    w_lo, w_hi = w_blk * WC, min(OW, w_blk * WC + WC)",
        "    un = np.uint64(n)",
        "    for c_lo in range(0, C, CB):  # reduction blocks",
        "        c_hi = min(C, c_lo + CB)",
    ]
    k_setup = _k_tile_setup(axis, pack, kt)
    w_setup = _w_tile_setup(axis, wt)
    tile = _micro_tile(g, lay, config)
    if config["loop_order"] == "k_outer":
        nest = (["for k0 in range(k_lo, k_hi, KT):"] + indent(k_setup, 4)
                + indent(["for oh in range(h_lo, h_hi):"], 4)
                + indent(["uoh = np.uint64(oh)", "for w0 in range(w_lo, w_hi, WT):"], 8)
                + indent(w_setup + tile, 12))
    else:
        nest = (["for oh in range(h_lo, h_hi):"]
                + indent(["uoh = np.uint64(oh)", "for w0 in range(w_lo, w_hi, WT):"], 4)
                + indent(w_setup, 8)
                + indent(["for k0 in range(k_lo, k_hi, KT):"], 8)
                + indent(k_setup + tile, 12))
    return lines + indent(nest, 8)


def _k_tile_setup(axis: str, pack: bool, kt: int) -> list[str]:
    """The tile's output channels: k_base + kk for kk in [k_first, k_last)."""
    if pack:
        return ["ukt = np.uint64(k0 // KT)  # this tile's packed weights: wp[ukt] (zero-padded past K)",
                "k_base, k_first, k_last = k0, 0, min(KT, k_hi - k0)"]
    if axis == "k":  # NHWC, unpacked: a vector of KT weights from w[r, s, c, :]
        return ["k_base = min(k0, K - KT)  # a partial last tile shifts down to stay inside K",
                "k_first, k_last = k0 - k_base, min(k_hi, k_base + KT) - k_base",
                "ukb = np.uint64(k_base)"]
    return ["k_base, k_first, k_last = k0, 0, min(KT, k_hi - k0)",
            f"krows = stack_array({kt}, np.uint64)  # a partial tile repeats its last channel",
            "for kk in range(KT):",
            "    krows[kk] = np.uint64(min(k0 + kk, K - 1))"]


def _w_tile_setup(axis: str, wt: int) -> list[str]:
    """The tile's output columns: col_base + j for j in [j_first, j_last)."""
    if axis == "k":
        return ["col_base, j_first, j_last = w0, 0, min(WT, w_hi - w0)",
                f"cols = stack_array({wt}, np.uint64)  # input column of each output column (edge: repeats)",
                "for j in range(WT):",
                "    cols[j] = np.uint64(min(w0 + j, OW - 1) * SW)"]
    return ["col_base = min(w0, OW - WT)  # a partial last tile shifts left to stay inside the row",
            "j_first, j_last = w0 - col_base, min(w_hi, col_base + WT) - col_base",
            "col0 = np.uint64(col_base * SW)"]


# ROWS_WRITTEN_OUT: a tile vectorised over columns with at least ROWS_WRITTEN_OUT_MIN rows (output
# channels) copies the tap's WT input values to a stack buffer, then updates one row per line, each
# with its own loop over the lanes, as cpu/_gemm.py's micro-kernel does. As a loop over the rows,
# LLVM vectorised some tiles across the rows instead (gathers, no vector FMAs). AVX-512 Zen 4, best
# of 9-11 interleaved, GFLOPS: 64ch 56x56 6 x 32 1.7 -> 89.5, 10 x 16 2.2 -> 132.8, 6 x 16 with
# unroll_c 4 3.4 -> 38-70 (two runs; LLVM's SLP vectoriser makes its unrolled copies 128-bit FMAs);
# 128ch 56x56 s2 10 x 8 3.3 -> 20.4; NHWC 64ch 12 x 8 3.1 -> 25.5; unchanged: 6 x 48 59.9 -> 60.2,
# 8 x 32 89.3 -> 90.3, the 1x1 2048->512 default (10 x 32) 136.9 -> 139.4. Tiles vectorised over
# channels are not written out this way: one lane loop per column, with or without the weights
# copied, made some mixed xmm/ymm code (NHWC 32 x 2, unrolled: 144 zmm FMAs -> 108 zmm + 36 ymm + 108
# xmm); they take the form below.
#
# COLUMNS_WRITTEN_OUT: a tile vectorised over output channels with at least COLUMNS_WRITTEN_OUT_MIN
# columns loads each column's input value into its own variable, then updates every column in one
# loop over the lanes (Tile.update_rows_per_lane). As a loop over the columns around a loop over the
# lanes, LLVM vectorised tiles of 3-12 columns across the columns (one-vector tiles of 3, 4, 8 and
# 12, 6 at any width; compile-only grid, AVX-512): gathers or 128/256-bit FMAs. Zen 4, best of
# 7 interleaved, GFLOPS: NHWC 64ch 56x56 16 x 12 unrolled 4x 2.3 -> 82.3, 16 x 12 2.3 -> 98.1, 32 x
# 6 1.8 -> 59.5; 128ch 56x56 s2 32 x 6 3.2 -> 129.8, 16 x 3 unrolled 4x 30.4 -> 62.9. The other
# tiles of 3-10 columns compiled to the same FMAs either way (16 x 5 unrolled 4x 150.6 -> 153.9, 16
# x 10 unrolled 4x 204.0 -> 204.7, the s2 default 32 x 4 183.8 -> 189.1, the 1x1 256->64 default 32
# x 10 201.1 -> 199.7). One lane loop per column (update_by_rows) instead made 16 x 5 and 16 x 6
# unrolled 4x 128-bit code (94 -> 73 GFLOPS).
def _micro_tile(g: ConvGeometry, lay: Layout, config: Config) -> list[str]:
    axis = config["vector_axis"]
    pack = config["pack_weights"]
    order = config["reduction_order"]
    kt, wt = _tiles(config)
    row = "uih"  # the input row of the current tap, in padded coordinates
    if axis == "k":  # rows: the WT columns (input values broadcast); lanes: the KT channels
        tile = Tile(wt, kt, "kk")
        w_vec = "wp[ukt, pos, kk]" if pack else lay.w("ukb + np.uint64(kk)", "uc", "ur", "us")
        if wt >= COLUMNS_WRITTEN_OUT_MIN:
            # each column's input value in its own variable, then one loop over the lanes updating
            # every column (COLUMNS_WRITTEN_OUT)
            update = [f"xv{b} = {lay.x('un', 'uc', row, f'cols[{b}] + np.uint64(s * DW)')}" for b in range(wt)]
            update += tile.update_rows_per_lane("wk", w_vec, lambda b: f"xv{b}", "KT")
        else:
            update = ["for j in range(WT):",
                      f"    xv = {lay.x('un', 'uc', row, 'cols[j] + np.uint64(s * DW)')}",
                      "    for kk in range(KT):",
                      f"        {tile.at('j')} += xv * {w_vec}"]
        store = tile.store(row="j", target=lambda b: lay.out("un", "np.uint64(k_base + kk)", "uoh",
                                                              f"np.uint64(col_base + {b})"),
                           whole="k_first == 0 and k_last == KT and j_first == 0 and j_last == WT",
                           rows_edge="j_first, j_last", lanes_edge="k_first, k_last", first="c_lo == 0",
                           contiguous=not lay.nchw)
    else:  # rows: the KT channels (weights broadcast); lanes: the WT columns
        tile = Tile(kt, wt, "j")
        w_scalar = (lambda b: f"wp[ukt, pos, {b}]") if pack else (lambda b: lay.w(f"krows[{b}]", "uc", "ur", "us"))
        x_lane = lay.x('un', 'uc', row, 'col0 + np.uint64(j * SW + s * DW)')
        if kt >= ROWS_WRITTEN_OUT_MIN:
            # the WT input values copied to a stack buffer (registers), then each of the KT rows
            # written out with its own loop over the lanes (see ROWS_WRITTEN_OUT)
            update = [f"xl = stack_array({wt}, out.dtype)  # the tap's WT input values", "for j in range(WT):",
                      f"    xl[j] = {x_lane}"]
            update += tile.update_by_rows("wv", w_scalar, lambda b: "xl[j]", "WT")
        else:
            update = ["for kk in range(KT):", f"    wv = {w_scalar('kk')}", "    for j in range(WT):",
                      f"        {tile.at('kk')} += wv * {x_lane}"]
        store = tile.store(row="kk", target=lambda b: lay.out("un", f"np.uint64(k_base + {b})", "uoh",
                                                               "np.uint64(col_base + j)"),
                           whole="k_first == 0 and k_last == KT and j_first == 0 and j_last == WT",
                           rows_edge="k_first, k_last", lanes_edge="j_first, j_last", first="c_lo == 0",
                           contiguous=lay.nchw)
    pos = [f"pos = np.uint64({_position(order)})"] if pack else []
    channel = ["uc = np.uint64(c)"]
    if order == "c_outer":
        c_body = channel + [
            "for r in range(R):",
            "    uih, ur = np.uint64(oh * SH + r * DH), np.uint64(r)",
            "    for s in range(S):",
            "        us = np.uint64(s)",
        ] + indent(pos + update, 8)
        reduction = unrolled_loop("c", "c_lo", "c_hi", config["unroll_c"], c_body)
    else:
        c_body = channel + pos + update
        reduction = [
            "for r in range(R):",
            "    uih, ur = np.uint64(oh * SH + r * DH), np.uint64(r)",
            "    for s in range(S):",
            "        us = np.uint64(s)",
        ] + indent(unrolled_loop("c", "c_lo", "c_hi", config["unroll_c"], c_body), 8)
    return tile.zero() + reduction + store
