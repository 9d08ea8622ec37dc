"""GotoBLAS-style GEMM loop nests: the kernels of the matmul, dense and batch_matmul templates.

``out[(b,) m, n] = sum_k A[(b,) m, k] * B(k, n)``, with an optional batch axis and B either
``[(b,) K, N]`` or transposed (``[N, K]``, dense weights): a register-blocked micro-kernel and cache
blocks (MC, NC, KC) as runtime arguments, in one of two loop nests (``render_gemm``'s ``nest``):

``work_items`` (dense, batch_matmul):

    [pack_b] copy the right operand into zero-padded NR-wide column panels: bp[(b,) panel, k, c]
             (one parallel pass per call, counted in the timing)
    for each work item ((batch b,) MC-block of rows, NC-block of columns), in parallel if asked
        for each KC-block of the reduction                                (pc)
          [pack_a] copy the MC x KC block of A into MR-high strips, zero-padded
          for the NR-wide panels and MR-high strips of the block, in ``loop_order``
            MR x NR register tile, reduced over the KC block (``unroll_k`` copies per iteration),
            stored to out (added to it after the first KC block)

``blocks_outer`` (matmul; no batch axis, B not transposed), the classic GotoBLAS order:

    for each NC-block of columns                                          (jc)
      for each KC-block of the reduction                                  (pc)
        [pack_b] copy the KC x NC block of B into NR-wide panels, in parallel if asked
        for each MC-block of rows, in parallel if asked                   (ic)
          [pack_a], panels and strips, register tile: as above

Two micro-kernels (``vector_axis``):
- ``n``: vectorised over output columns: each A value broadcast against NR-wide rows of B. B must
  be packed when it is stored transposed (dense weights are [N, K]).
- ``k``: vectorised over the reduction (only for a transposed B, where A rows and B rows are both
  contiguous along k): MR x NR accumulator *vectors* of lanes along k, summed horizontally at the
  end of the block, the K remainder added one element at a time. Nothing is packed: the right
  choice for matrix-vector shapes (M = 1), where packing would triple the memory traffic.

``gemm_space`` and ``gemm_default`` are the space and default of dense and batch_matmul; the matmul
template keeps its own (no ``vector_axis`` knob, NR whole vectors only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.cpu._common import (
    PARALLEL_MIN_FLOPS,
    UNROLLS,
    CpuSpace,
    VectorTarget,
    header,
    indent,
    kernel_head,
    kernel_tail,
    loop_kind,
    pick_split,
    reduction_blocks,
    Tile,
    target_of,
    unrolled_loop,
)

LOOP_ORDERS = ("n_outer", "m_outer")
# Cache blocks along M: MC = tiles * MR; along N: NC = tiles * NR.
MC_TILES = (1, 2, 4, 8, 16, 32, 64, 128)
NC_TILES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ITEMS = 8  # parallel work items wanted by the default (several per core)
GEMV_MAX_ROWS = 64  # a transposed B with at most this many rows of A: reduction-vectorised default
# The reduction-vectorised default streams W once at memory speed (~1 FLOP per 2 bytes read), so
# a second core's bandwidth pays for the parallel region from far fewer FLOPs than the GEMMs'
# PARALLEL_MIN_FLOPS. Measured, batch 1, 2 threads against the same tiles serial (2-core Zen 4,
# quiet, against OpenBLAS's 2-thread GEMV): N x K = 256 x 512 (0.26 MFLOP) 11.7 -> 5.2 us (BLAS
# 6.2), 1000 x 512 36.9 -> 18.5 us (14.8), 1000 x 1280 74.4 -> 37.9 us (34.8), 1000 x 2048 (above
# the old threshold) 127 -> 66 us (62.6).
GEMV_PARALLEL_MIN_FLOPS = 200_000


@dataclass(frozen=True)
class GemmShape:
    """``out[(b,) m, n] = sum_k A[(b,) m, k] * B(k, n)``: B is ``B[(b,) k, n]`` or, when
    ``transposed``, ``B[n, k]`` (dense weights)."""

    batch: int  # 0: no batch axis
    M: int
    N: int
    K: int
    transposed: bool


def gemm_space(shape: GemmShape, dtype: str, vt: VectorTarget) -> ConfigSpace:
    vector_axes = ("n", "k") if shape.transposed else ("n",)
    knobs = [
        ChoiceKnob("vector_axis", vector_axes),
        SplitKnob("tile_m", shape.M, (MC_TILES, vt.broadcast_tiles)),
        SplitKnob("tile_n", shape.N, (NC_TILES, vt.axis_tiles(dtype, shape.N))),
        ChoiceKnob("kc", reduction_blocks(shape.K)),
        ChoiceKnob("loop_order", LOOP_ORDERS),
        ChoiceKnob("unroll_k", UNROLLS),
        BoolKnob("pack_a"),
    ]
    lanes = vt.lanes(dtype)
    if shape.transposed:
        knobs.append(ChoiceKnob("k_lanes", (lanes, 2 * lanes)))
    else:
        knobs.append(BoolKnob("pack_b"))
    knobs.append(BoolKnob("parallel"))
    constraints = [
        Constraint(
            ("vector_axis", "tile_m", "tile_n"),
            lambda axis, tm, tn: (vt.vector_ok(tn[-1], tm[-1], dtype, shape.N) if axis == "n"
                                  else tn[-1] in vt.broadcast_tiles and tm[-1] * tn[-1] <= vt.max_accumulators),
            f"vectorised over n: NR is a multiple of the vector ({lanes} lanes) or the whole axis, "
            f"over k: NR is a broadcast tile; the accumulators fit in {vt.max_accumulators} registers",
        ),
        Constraint(
            ("vector_axis", "pack_a"),
            lambda axis, pack_a: axis == "n" or not pack_a,
            "vectorised over k, A rows are read in place (contiguous along k): no A packing",
        ),
    ]
    if shape.transposed:
        constraints.append(Constraint(
            ("vector_axis", "tile_m", "tile_n", "k_lanes"),
            lambda axis, tm, tn, kl: (kl == lanes if axis == "n"
                                      else tm[-1] * tn[-1] * (kl // lanes) <= vt.max_accumulators),
            f"k_lanes (reduction lanes per (row, column) pair: one or two vectors) only vectorising over k, "
            f"with the accumulators fitting in {vt.max_accumulators} registers",
        ))
    return CpuSpace(knobs, constraints, vector=vt)


def gemm_default(shape: GemmShape, dtype: str, space: ConfigSpace, flops: int) -> Config:
    """MR = 6 rows (8 with 32 registers, or fewer) x NR = two vectors (AVX2 float32: 6 x 16, 12
    accumulators; AVX-512: 8 x 32), B
    packed, no K blocking, MC up to 96 rows; for a transposed B with few rows of A (a
    matrix-vector product, a small batch of a dense layer) the reduction-vectorised kernel instead,
    B read in place: one or two rows of A x 8 or 4 rows of B per tile, from 3 rows of A up a 4 x 4
    tile (as many rows of B as 16 accumulators allow), on all cores from 0.2 MFLOP (it streams
    B: :data:`GEMV_PARALLEL_MIN_FLOPS`) where the GEMMs wait for 4. Rows, then columns, are split
    into blocks until there are about eight work items."""
    vt = target_of(space)
    lanes = vt.lanes(dtype)
    batch = max(1, shape.batch)
    if shape.transposed and shape.M <= GEMV_MAX_ROWS:
        # Measured on AVX-512 with one thread (dense N x K = 1000 x 2048 and 768 x 768): the
        # column-vectorised default packs B for 4-64 rows of A and ran 4-47 GFLOPS where a 4 x 4
        # reduction tile ran 45-82 (2-11x); from 256 rows the packed default was ahead (87-90 vs 61-75).
        mr = min(4, shape.M)
        accumulators = min(8 if shape.M <= 2 else 16, vt.max_accumulators)
        tile_m = pick_split(space.knob("tile_m"), mr, shape.M)
        nr = max(t for t in vt.broadcast_tiles if t * tile_m[-1] <= accumulators and t <= shape.N)
        axis = "k"
        parallel = flops >= GEMV_PARALLEL_MIN_FLOPS
    else:
        nr = shape.N if shape.N <= 2 * lanes else 2 * lanes
        mr = max(1, min(vt.default_rows, vt.max_accumulators // vt.accumulator_vectors(1, nr, dtype)))
        tile_m = _row_blocks(space, shape, mr)
        axis = "n"
        parallel = flops >= PARALLEL_MIN_FLOPS
    tile_n = _column_blocks(space, shape, tile_m, nr)
    values = {
        "vector_axis": axis,
        "tile_m": tile_m,
        "tile_n": tile_n,
        "kc": shape.K,
        "loop_order": "n_outer",
        "unroll_k": 1,
        "pack_a": False,
        "parallel": parallel,
    }
    if shape.transposed:
        values["k_lanes"] = lanes
    else:
        values["pack_b"] = True
    return space.make(values)


def _row_blocks(space: ConfigSpace, shape: GemmShape, mr: int) -> tuple[int, ...]:
    """tile_m of the column-vectorised default: MR rows, MC up to 96 rows."""
    return pick_split(space.knob("tile_m"), mr, min(96, max(mr, shape.M // max(1, 4 // max(1, shape.batch)))))


def _column_blocks(space: ConfigSpace, shape: GemmShape, tile_m: tuple[int, ...], nr: int) -> tuple[int, ...]:
    """tile_n: NR columns, blocks as wide as possible, split only when rows and batches give too
    few work items."""
    row_items = max(1, shape.batch) * math.ceil(shape.M / (tile_m[1] * tile_m[2]))
    n_splits = max(1, math.ceil(ITEMS / row_items))
    return pick_split(space.knob("tile_n"), nr, max(nr, shape.N // n_splits), inner_ok=lambda t: t == nr)


def gemm_runtime_args(config: Config) -> tuple[int, int, int]:
    _, mc_tiles, mr = config["tile_m"]
    _, nc_tiles, nr = config["tile_n"]
    return mc_tiles * mr, nc_tiles * nr, config["kc"]


# -- rendering -----------------------------------------------------------------------------------


class _Operands:
    """Index expressions of A, B, out for a shape (indices unsigned; ``ub`` the batch index)."""

    def __init__(self, shape: GemmShape) -> None:
        self.batch = shape.batch > 0
        self.transposed = shape.transposed

    def a(self, i: str, k: str) -> str:
        return f"A[ub, {i}, {k}]" if self.batch else f"A[{i}, {k}]"

    def b(self, k: str, j: str) -> str:
        if self.transposed:
            return f"B[{j}, {k}]"
        return f"B[ub, {k}, {j}]" if self.batch else f"B[{k}, {j}]"

    def out(self, i: str, j: str) -> str:
        return f"out[ub, {i}, {j}]" if self.batch else f"out[{i}, {j}]"

    def panels(self) -> str:
        return "bp[b_item]" if self.batch else "bp"


# The loop nests render_gemm offers (its ``nest`` argument).
NESTS = ("work_items", "blocks_outer")


def render_gemm(*, title: str, entry: str, shape: GemmShape, workload, config: Config,
                nest: str = "work_items", outline_serial: bool = True, remainder_loop: bool = False) -> str:
    """The kernel text of ``config`` (knobs as in :func:`gemm_space`; without a ``vector_axis``
    knob, vectorised over ``n``).

    ``nest``: ``work_items`` (B packed whole, once per call; parallel (batch, MC, NC) work items,
    each looping over the KC blocks) or ``blocks_outer`` (no batch axis, B not transposed: NC and KC
    blocks outermost, the KC x NC block of B packed for each, its MC row blocks in parallel).
    ``outline_serial``: how a ``parallel=False`` config compiles (see :func:`kernel_head`).
    ``remainder_loop`` (``unrolled_loop``): how the ``n`` micro-kernel unrolls k. The matmul
    template needs it (2-core Zen 3, 512^3 and 1024^3 float32: with guarded copies instead, an
    unroll_k=4 parallel kernel ran at 5-10 GFLOPS instead of 40-85); dense and batch_matmul keep the
    guarded copies their kernels were measured with (with a remainder loop, batch_matmul 8 x 128^3
    6 x 16 unrolled 4x ran 191 -> 161, Sapphire Rapids).
    """
    if nest not in NESTS:
        raise ValueError(f"unknown GEMM loop nest {nest!r}; expected one of {NESTS}")
    if nest == "blocks_outer" and (shape.batch or shape.transposed):
        raise ValueError("the blocks_outer nest has no batch axis and reads B as [K, N]")
    axis = config.get("vector_axis", "n")
    _, _, mr = config["tile_m"]
    _, _, nr = config["tile_n"]
    pack_a = config["pack_a"]
    pack_b = config["pack_b"] if not shape.transposed else axis == "n"
    parallel = config["parallel"]
    loop = loop_kind(parallel, outline_serial)
    ops = _Operands(shape)
    lines = header(title, workload, config, f"{entry}(A, B, out, MC, NC, KC)",
                   "MC = tile_m[1] * MR, NC = tile_n[1] * NR, KC = kc", ("tile_m", "tile_n", "kc"), parallel,
                   outline_serial)
    emit = lines.append
    emit(f"MR = {mr}  # rows of out per register tile")
    emit(f"NR = {nr}  # columns of out per register tile")
    if axis == "k":
        emit(f"KV = {config['k_lanes']}  # reduction lanes of partial sums per (row, column) pair")
    emit("")
    emit("")
    lines += kernel_head(entry, "A, B, out, MC, NC, KC", parallel, outline_serial)
    body: list[str] = []
    add = body.append
    if ops.batch:
        add("BATCH, M, K = A.shape")
        add("N = B.shape[2]")
    else:
        if nest == "work_items":
            add("BATCH = 1")
        add("M, K = A.shape")
        add("N = B.shape[0]" if shape.transposed else "N = B.shape[1]")
    add("# cache blocks: whole register tiles, at least one")
    add("MC = max(MR, MC - MC % MR)")
    add("NC = max(NR, NC - NC % NR)")
    add("KC = max(KC, 1)")
    panel_setup = _panel_setup(axis, pack_b, nr, ops, nest)
    strip_setup = _strip_setup(pack_a, mr)
    if config["loop_order"] == "n_outer":  # one B panel stays hot while the A strips stream past
        tiles = (["for panel in range(n_panels):"] + indent(panel_setup, 4)
                 + indent(["for strip in range(m_strips):"], 4) + indent(strip_setup, 8))
    else:  # one A strip stays hot while the B panels stream past
        tiles = (["for strip in range(m_strips):"] + indent(strip_setup, 4)
                 + indent(["for panel in range(n_panels):"], 4) + indent(panel_setup, 8))
    if axis == "n":
        tile = _tile_vector_n(ops, config, pack_a, pack_b, nest, remainder_loop)
    else:
        tile = _tile_vector_k(ops, config)
    block = (_pack_a(ops) if pack_a else []) + tiles + indent(tile, 8)
    if nest == "work_items":
        body += _work_items_nest(ops, loop, pack_b, block)
    else:
        body += _blocks_outer_nest(ops, loop, pack_b, block, config.get("parallel_axis", "m"))
    lines += indent(body, 4)
    lines += kernel_tail(entry, "A, B, out, MC, NC, KC", parallel, outline_serial)
    emit("")
    return "\n".join(lines)


def _work_items_nest(ops: _Operands, loop: str, pack_b: bool, block: list[str]) -> list[str]:
    """B packed whole first, then the (batch, MC, NC) work items in parallel, each over its KC
    blocks; ``block`` computes one MC x NC block of out from one KC block."""
    lines = ["n_panels_all = (N + NR - 1) // NR"]
    if pack_b:
        lines += _pack_b(ops, loop)
    return lines + [
        "m_blocks = (M + MC - 1) // MC",
        "n_blocks = (N + NC - 1) // NC",
        "# work items: (batch, MC-row block, NC-column block)" if ops.batch
        else "# work items: (MC-row block, NC-column block)",
        f"for item in {loop}(BATCH * m_blocks * n_blocks):",
        "    b_item = item // (m_blocks * n_blocks)",
        "    ub = np.uint64(b_item)",
        "    ic = item // n_blocks % m_blocks * MC",
        "    jc = item % n_blocks * NC",
        "    mc = min(MC, M - ic)",
        "    nc = min(NC, N - jc)",
        "    m_strips = (mc + MR - 1) // MR",
        "    n_panels = (nc + NR - 1) // NR",
        "    for pc in range(0, K, KC):",
        "        kc = min(KC, K - pc)",
        "        kb = np.uint64(pc)  # unsigned indices: no negative-index wraparound in hot loads",
    ] + indent(block, 8)


def _blocks_outer_nest(ops: _Operands, loop: str, pack_b: bool, block: list[str], parallel_axis: str = "m") -> list[str]:
    """The classic GotoBLAS order: for each NC block of columns and KC block of the reduction, the
    KC x NC block of B packed, then its MC row blocks; ``block`` computes one MC x NC block of out
    from the KC block.

    ``parallel_axis`` ``m``: the packing (into one buffer reused by every block) and then the MC row
    blocks run in parallel, two parallel regions per (NC, KC) block, every core reading the panels
    all cores packed. ``n``: the NC column blocks run in parallel, one region per call, each packing
    its own panels (into its own slice of a buffer allocated before the loop: a buffer allocated
    inside the parallel body left the micro-kernel scalar, 7 GFLOPS) and looping over its KC and MC
    blocks itself. On a 2-core AVX-512 Xeon (float32, OMP_WAIT_POLICY=passive, where each region's
    wake-up shows) ``n`` with NC = N/4 ran 10-25% faster at 256^3 and 512^3, about the same at 1024^3.
    """
    pack = [
        "for k in range(kc):",
        "    for c in range(nr):",
        f"        bp[panel, k, c] = {ops.b('pc + k', 'j0 + c')}",
        "    for c in range(nr, NR):",
        "        bp[panel, k, c] = 0",
    ]
    alloc = "np.empty(((min(NC, N) + NR - 1) // NR, min(KC, K), NR), dtype=B.dtype)"
    rows = [
        f"for row_block in {loop if parallel_axis == 'm' else 'range'}((M + MC - 1) // MC):",
        "    ic = row_block * MC",
        "    mc = min(MC, M - ic)",
        "    m_strips = (mc + MR - 1) // MR",
    ] + indent(block, 4)
    if parallel_axis == "n":
        lines = ["n_blocks = (N + NC - 1) // NC"]
        if pack_b:
            lines += ["# each column block's B block, packed into NR-wide panels, zero-padded: "
                      "bp[panel, k, c] = B[pc + k, jc + panel * NR + c]",
                      "bp_blocks = np.empty((n_blocks, (min(NC, N) + NR - 1) // NR, min(KC, K), NR), dtype=B.dtype)"]
        lines += [
            f"for n_block in {loop}(n_blocks):",
            "    jc = n_block * NC",
            "    nc = min(NC, N - jc)",
            "    n_panels = (nc + NR - 1) // NR",
        ]
        if pack_b:
            lines += ["    bp = bp_blocks[n_block]"]
        lines += [
            "    for pc in range(0, K, KC):",
            "        kc = min(KC, K - pc)",
            "        kb = np.uint64(pc)  # unsigned indices: no negative-index wraparound in hot loads",
        ]
        if pack_b:
            lines += indent(["for panel in range(n_panels):",
                             "    j0 = jc + panel * NR",
                             "    nr = min(NR, jc + nc - j0)"] + indent(pack, 4), 8)
        return lines + indent(rows, 8)
    lines: list[str] = []
    if pack_b:
        lines += ["# B block packed into NR-wide panels, zero-padded: bp[panel, k, c] = B[pc + k, jc + panel * NR + c]",
                  f"bp = {alloc}"]
    lines += [
        "for jc in range(0, N, NC):",
        "    nc = min(NC, N - jc)",
        "    n_panels = (nc + NR - 1) // NR",
        "    for pc in range(0, K, KC):",
        "        kc = min(KC, K - pc)",
        "        kb = np.uint64(pc)  # unsigned indices: no negative-index wraparound in hot loads",
    ]
    if pack_b:
        lines += indent([
            f"for panel in {loop}(n_panels):",
            "    j0 = jc + panel * NR",
            "    nr = min(NR, jc + nc - j0)",
        ] + indent(pack, 4), 8)
    return lines + indent(rows, 8)


def _pack_a(ops: _Operands) -> list[str]:
    return [
        "# A block packed into MR-high strips, zero-padded: a_packed[strip, k, r] = A[i0 + r, pc + k]",
        "a_packed = np.empty((m_strips, kc, MR), dtype=A.dtype)",
        "for strip in range(m_strips):",
        "    i0 = ic + strip * MR",
        "    mr = min(MR, ic + mc - i0)",
        "    for k in range(kc):",
        "        for r in range(mr):",
        f"            a_packed[strip, k, r] = {ops.a('i0 + r', 'pc + k')}",
        "        for r in range(mr, MR):",
        "            a_packed[strip, k, r] = 0",
    ]


def _pack_b(ops: _Operands, loop: str) -> list[str]:
    source = ops.b("k", "j0 + c")
    return [
        "# B packed into zero-padded NR-wide column panels: bp[(b,) panel, k, c] = B(k, panel * NR + c)",
        "bp = np.empty((BATCH, n_panels_all, K, NR), dtype=B.dtype)" if ops.batch
        else "bp = np.empty((n_panels_all, K, NR), dtype=B.dtype)",
        f"for bpanel in {loop}(BATCH * n_panels_all):",
        "    b_item, panel = bpanel // n_panels_all, bpanel % n_panels_all",
        "    ub = np.uint64(b_item)",
        "    j0 = panel * NR",
        "    nr = min(NR, N - j0)",
        f"    dest = {ops.panels()}[panel]",
    ] + ([
        "    for c in range(nr):  # B is [N, K]: read along k",
        "        for k in range(K):",
        f"            dest[k, c] = {source}",
    ] if ops.transposed else [
        "    for k in range(K):",
        "        for c in range(nr):",
        f"            dest[k, c] = {source}",
    ]) + [
        "    for c in range(nr, NR):",
        "        for k in range(K):",
        "            dest[k, c] = 0",
    ]


def _panel_setup(axis: str, pack_b: bool, nr: int, ops: _Operands, nest: str) -> list[str]:
    """Columns of the tile: B is read at columns jb + c, c in [0, NR); out gets c in [c_lo, c_hi)."""
    if axis == "k":
        return [
            "j0 = jc + panel * NR",
            "jb, c_lo, c_hi = j0, 0, min(NR, jc + nc - j0)",
            f"b_rows = stack_array({nr}, np.uint64)  # NR rows of B; a partial panel repeats its last row",
            "for c in range(NR):",
            "    b_rows[c] = np.uint64(min(j0 + c, N - 1))",
        ]
    if pack_b:
        # work_items: panels of all of B (index j0 // NR); blocks_outer: of the NC block only
        packed = f"{ops.panels()}[j0 // NR]" if nest == "work_items" else "bp[panel]"
        return [
            "j0 = jc + panel * NR",
            "jb, c_lo, c_hi = j0, 0, min(NR, jc + nc - j0)",
            f"b_panel = {packed}",
        ]
    return [
        "j0 = jc + panel * NR",
        "jb = min(j0, N - NR)  # a partial last panel shifts left to stay inside B",
        "c_lo, c_hi = j0 - jb, min(jc + nc, jb + NR) - jb",
        "b_cols = np.uint64(jb)",
    ]


def _strip_setup(pack_a: bool, mr: int) -> list[str]:
    """Rows of the tile: out gets rows i0 + r for r < mr."""
    lines = ["i0 = ic + strip * MR", "mr = min(MR, ic + mc - i0)"]
    if pack_a:
        return lines + ["a_strip = a_packed[strip]"]
    return lines + [
        f"a_rows = stack_array({mr}, np.uint64)  # MR rows of A; a partial strip repeats its last row",
        "for r in range(MR):",
        "    a_rows[r] = np.uint64(i0 + min(r, mr - 1))",
    ]


def _store(ops: _Operands, tile: Tile) -> list[str]:
    return tile.store(row="r", target=lambda b: ops.out(f"np.uint64(i0 + {b})", "np.uint64(jb + c)"),
                      whole="mr == MR and c_lo == 0 and c_hi == NR", rows_edge="0, mr", lanes_edge="c_lo, c_hi",
                      first="pc == 0", contiguous=True, row_loops=True)


def _tile_vector_n(ops: _Operands, config: Config, pack_a: bool, pack_b: bool, nest: str,
                   remainder_loop: bool) -> list[str]:
    _, _, mr = config["tile_m"]
    _, _, nr = config["tile_n"]
    tile = Tile(mr, nr, "c")  # rows: MR rows of A (broadcast); lanes: NR columns of B
    # packed panels hold all of K (work_items) or the KC block only (blocks_outer)
    packed_k = "kb + kk" if nest == "work_items" else "kk"
    b_load = f"b_panel[{packed_k}, c]" if pack_b else ops.b("kb + kk", "b_cols + np.uint64(c)")
    # The NR lanes of B copied to a stack buffer (registers, after SROA), then each of the MR rows
    # written out with its own loop over the lanes. As a loop over the rows, LLVM vectorised some
    # tiles across the rows instead, with gathers and scatters of the accumulators (AVX-512 Zen 4,
    # 512^3 float32: 6, 7 and 12 rows x 32 and 6, 8 and 12 rows x 16 ran at 3-5 GFLOPS; so: 6 x 32
    # 209, 12 x 32 208, 8 x 16 204). The 8 x 32 default compiles to the same hot loop (120
    # instructions, 64 FMAs, no spills) and ran within noise of before (best of 21: 211 vs 212
    # GFLOPS). Rows written out around one loop over the lanes instead spilled the default (4 stack
    # accesses, 3-5% slower).
    a_load = (lambda r: f"a_strip[kk, {r}]") if pack_a else (lambda r: ops.a(f"a_rows[{r}]", "kb + kk"))
    update = ["kk = np.uint64(k)", f"bl = stack_array({nr}, out.dtype)  # the k-th NR lanes of B",
              "for c in range(NR):", f"    bl[c] = {b_load}"]
    update += tile.update_by_rows("av", a_load, lambda r: "bl[c]", "NR")
    # The tile is zeroed and stored row by row (Tile's row_loops), as in memory. Zeroed and stored
    # one loop over the lanes updating every row (dense v4 and batch_matmul v3), some
    # tiles became 128/256-bit code or gathered in the hot loop (Sapphire Rapids, one thread,
    # batch_matmul 4 x 96 x 64 x 64: 4 x 16 45.3 -> 75.2 GFLOPS, 2 x 32 46.0 -> 74.3, 6 x 16
    # unrolled 4x 3.8 -> 83.9; dense 64 x 96 x 128 6 x 16 and 5 x 16 unrolled 4x 3.6 -> 68.5 and
    # 69.9); the matmul template always had it (Zen 3: serial kernels 2-25 -> 50-75).
    return (tile.zero(row_loops=True) + unrolled_loop("k", "0", "kc", config["unroll_k"], update, remainder_loop)
            + _store(ops, tile))


def _tile_vector_k(ops: _Operands, config: Config) -> list[str]:
    _, _, mr = config["tile_m"]
    _, _, nr = config["tile_n"]
    kv = config["k_lanes"]
    pairs = [(r, c) for r in range(mr) for c in range(nr)]
    partial = Tile(mr * nr, kv, "l")  # rows: the MR x NR (row, column) pairs; lanes: KV reduction lanes
    # lanes outermost, then rows of A (one load each), then rows of B: SLP turned every (MR, NR, KV)
    # tile written this way into MR x NR x KV/lanes vector FMAs (AVX-512, float32: 1x2 .. 1x12 x 16
    # and 1x2 .. 1x8 x 32), but with the lanes innermost only some: 1x4 x 32 and 1x12 x 16 became
    # 4-wide FMAs (a GEMV 2-4x slower)
    update = ["kk = kb + np.uint64(q * KV)",
              "for l in range(KV):",
              "    kl = kk + np.uint64(l)",
              "    for r in range(MR):",
              f"        a = {ops.a('a_rows[r]', 'kl')}",
              "        for c in range(NR):",
              f"            {partial.at('(r * NR + c)', 'vacc')} += a * {ops.b('kl', 'b_rows[c]')}"]
    lines = [f"vacc = stack_array({partial.size}, out.dtype)  # MR x NR vectors of KV partial sums, in registers",
             "for l in range(KV):"] + [f"    {partial.at(i, 'vacc')} = 0" for i in range(len(pairs))]
    lines += ["k_vectors = kc // KV"] + unrolled_loop("q", "0", "k_vectors", config["unroll_k"], update)
    lines += [f"acc = stack_array({mr * nr}, out.dtype)  # horizontal sums, then the K remainder",
              "k_rest = k_vectors * KV"]
    for i, (r, c) in enumerate(pairs):
        lines += [
            f"v = vacc[{i * kv}]",
            "for l in range(1, KV):",
            f"    v += vacc[{i * kv} + l]",
            "for k in range(k_rest, kc):",
            f"    v += {ops.a(f'a_rows[{r}]', 'kb + np.uint64(k)')} * {ops.b('kb + np.uint64(k)', f'b_rows[{c}]')}",
            f"acc[{i}] = v",
        ]
    return lines + _store(ops, Tile(mr, nr, "c"))
