"""Matmul on CPUs: a GotoBLAS-style loop nest with a register-blocked micro-kernel, via numba.

The rendered kernel computes ``out = A @ B`` (``A`` is M x K, ``B`` is K x N, C-contiguous) as:

    for each NC-wide column block of B and out                         (jc)
      for each KC-long block of the reduction                          (pc)
        [pack_b] copy the KC x NC block of B into NR-wide panels, zero-padded
        for each MC-high row block of A and out, in parallel if asked  (ic)
          [pack_a] copy the MC x KC block of A into MR-high strips, zero-padded
          for each NR-wide panel and MR-high strip, in ``loop_order``  (jr, ir)
            MR x NR micro-tile: accumulators in registers, k loop unrolled ``unroll_k`` times,
            then stored to out (added to it after the first KC block)

What makes this fast with numba on x86 (see the shared notes on numba CPU kernels): accumulators in
a fixed-size stack array (``cpu_stack.stack_array``) that LLVM keeps in registers; constant-bound
update loops that LLVM fully unrolls and its SLP vectoriser (``NUMBA_SLP_VECTORIZE=1``) turns into
vector FMAs; fastmath without reassociation; unsigned indices in the hot loads.

Remainders: packed panels and strips are zero-padded; unpacked A repeats its last row in a partial
strip; unpacked B shifts the last partial panel left so it stays inside B (hence ``N >= NR``);
stores are masked to the tile's own rows and columns. Correctness never depends on SLP.
"""

from __future__ import annotations

from measure_agent.device import DeviceInfo
from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cpu._common import (
    FASTMATH,
    CpuSpace,
    check_workload,
    indent,
    pick_split,
    reduction_blocks,
    target_of,
    vector_target,
)
from measure_agent.workload import Workload

# Default register tile, MR rows x NR columns given in vectors: 12 accumulator vectors, the fastest
# measured at 512^3 and 1024^3 on a 2-core Zen 3 (AVX2: float32 6 x 16, float64 3 x 16; float64
# 6 x 8 spilled once LLVM unrolled its k loop, 3 x 16 did not). With 32 registers (AVX-512) float32
# takes VectorTarget.default_rows (8) rows instead: 6 x 32 spilled there.
DEFAULT_TILE_VECTORS = {"float32": (6, 2), "float64": (3, 4)}
# Cache blocks are multiples of the register tile: MC = (MC/MR) * MR, NC = (NC/NR) * NR.
MC_TILES = (1, 2, 4, 8, 16, 32, 64, 128)
NC_TILES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KC_MIN = 16
LOOP_ORDERS = ("n_outer", "m_outer")
K_UNROLLS = (1, 2, 4)


class MatmulCpuTemplate(Template):
    """Register-blocked, cache-blocked matmul for CPUs (float32 and float64).

    Knobs:
    - ``tile_m`` = (blocks, MC/MR, MR): MR rows per register tile, MC rows of A per cache block
      (the unit of parallel work). MC is a runtime argument.
    - ``tile_n`` = (blocks, NC/NR, NR): NR columns per register tile (half a vector to four
      vectors of the device's ISA), NC columns of B per cache block. NC is a runtime argument.
    - ``kc``: K block length KC (runtime argument); ``kc == K`` means no K-blocking.
    - ``loop_order``: inside a cache block, ``n_outer`` walks NR-wide B panels outside MR-high A
      strips (one KC x NR panel of B stays hot while the MC x KC block of A streams past it);
      ``m_outer`` the reverse (one MR x KC strip of A stays hot, B streams).
    - ``unroll_k``: copies of the micro-kernel's k-loop body per iteration.
    - ``pack_b``: copy B into contiguous zero-padded NR-wide panels per (NC, KC) block.
    - ``pack_a``: copy A into contiguous zero-padded MR-high strips per (MC, KC) block.
    - ``parallel``: run MC row blocks (and B packing) on all cores with numba ``prange``.

    Constraints: the MR x NR accumulators fit in 3/4 of the device's vector registers (12 of 16
    on AVX2); unpacked B needs ``N >= NR``. MR, NR, loop order, unroll, packing and parallel are
    compiled in; MC, NC and KC are not, so configs differing only in them share one kernel.
    """

    op = "matmul"
    target = "cpu"
    version = "2"  # 2: compiled with 512-bit vectors on AVX-512 hosts (codegen_environment)

    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        check_workload(self, workload)
        m, n, k, dtype = workload["M"], workload["N"], workload["K"], workload.dtype
        vt = vector_target(device)
        knobs = [
            SplitKnob("tile_m", m, (MC_TILES, vt.broadcast_tiles)),
            SplitKnob("tile_n", n, (NC_TILES, vt.vector_tiles(dtype))),
            ChoiceKnob("kc", reduction_blocks(k, KC_MIN)),
            ChoiceKnob("loop_order", LOOP_ORDERS),
            ChoiceKnob("unroll_k", K_UNROLLS),
            BoolKnob("pack_b"),
            BoolKnob("pack_a"),
            BoolKnob("parallel"),
        ]
        constraints = [
            Constraint(
                ("tile_m", "tile_n"),
                lambda tm, tn: vt.accumulator_vectors(tm[-1], tn[-1], dtype) <= vt.max_accumulators,
                f"MR x NR accumulators must fit in {vt.max_accumulators} vector registers",
            ),
            Constraint(
                ("tile_n", "pack_b"),
                lambda tn, pack_b: pack_b or tn[-1] <= n,
                "unpacked B reads whole NR-wide rows of B, so it needs N >= NR",
            ),
        ]
        return CpuSpace(knobs, constraints, vector=vt)

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        """The best measured register tile (``DEFAULT_TILE_VECTORS``, or the largest that fits
        the axes); MC up to 16 tiles but at least four row blocks when M allows (they are the
        parallel work items); NC as wide as possible; no K-blocking; B packed; parallel when the
        problem is big enough to pay for it."""
        m, n, k, dtype = workload["M"], workload["N"], workload["K"], workload.dtype
        vt = target_of(space)
        mr, nr_vectors = DEFAULT_TILE_VECTORS[dtype]
        if dtype == "float32":
            mr = vt.default_rows  # AVX-512: 8 x 32 (6 x 32 spilled)
        nr = nr_vectors * vt.lanes(dtype)
        tile_m = pick_split(space.knob("tile_m"), inner_at_most=mr, block_at_most=max(1, min(16 * mr, m // 4)))
        tile_n = pick_split(space.knob("tile_n"), inner_at_most=nr, block_at_most=n)
        return space.make(
            {
                "tile_m": tile_m,
                "tile_n": tile_n,
                "kc": k,
                "loop_order": "n_outer",
                "unroll_k": 1,
                "pack_b": True,
                "pack_a": False,
                "parallel": m * n * k >= 64**3,
            }
        )

    def render(self, workload: Workload, config: Config) -> KernelSource:
        check_workload(self, workload)
        _, mc_tiles, mr = config["tile_m"]
        _, nc_tiles, nr = config["tile_n"]
        text = _render_text(
            workload=workload,
            mr=mr,
            nr=nr,
            loop_order=config["loop_order"],
            unroll_k=config["unroll_k"],
            pack_a=config["pack_a"],
            pack_b=config["pack_b"],
            parallel=config["parallel"],
        )
        return KernelSource(text=text, entry="matmul", runtime_args=(mc_tiles * mr, nc_tiles * nr, config["kc"]))


# -- rendering ---------------------------------------------------------------------------------


def _render_text(
    *,
    workload: Workload,
    mr: int,
    nr: int,
    loop_order: str,
    unroll_k: int,
    pack_a: bool,
    pack_b: bool,
    parallel: bool,
) -> str:
    loop = "prange" if parallel else "range"
    lines: list[str] = []
    emit = lines.append

    # The text holds only compile-time knobs: configs differing in MC, NC, KC share one kernel.
    emit(f"# tunefleet matmul_cpu v{MatmulCpuTemplate.version}: out = A @ B for {workload.key}")
    emit(f"# config: MR={mr} NR={nr} loop_order={loop_order} unroll_k={unroll_k} "
         f"pack_a={pack_a} pack_b={pack_b} parallel={parallel}")
    emit("# cache blocks MC, NC, KC (tile_m, tile_n, kc) are runtime arguments: matmul(A, B, out, MC, NC, KC)")
    emit("import numpy as np")
    emit(f"from numba import njit{', prange' if parallel else ''}")
    emit("")
    emit("from measure_agent.templates.cpu_stack import stack_array")
    emit("")
    emit(f"MR = {mr}  # rows of A per register tile")
    emit(f"NR = {nr}  # columns of B per register tile")
    emit("")
    emit("")
    emit(f"@njit(cache=True, parallel={parallel}, fastmath={FASTMATH}, error_model='numpy', boundscheck=False)")
    emit("def matmul(A, B, out, MC, NC, KC):")
    emit("    M, K = A.shape")
    emit("    N = B.shape[1]")
    emit("    if K == 0:")
    emit("        out[:, :] = 0")
    emit("        return")
    emit("    MC, NC, KC = max(MC, 1), max(NC, 1), max(KC, 1)")
    if pack_b:
        emit("    # B block packed into NR-wide panels, zero-padded: b_packed[panel, k, c] = B[pc + k, j0 + c]")
        emit("    b_packed = np.empty(((min(NC, N) + NR - 1) // NR, min(KC, K), NR), dtype=B.dtype)")
    emit("    for jc in range(0, N, NC):")
    emit("        nc = min(NC, N - jc)")
    emit("        n_panels = (nc + NR - 1) // NR")
    emit("        for pc in range(0, K, KC):")
    emit("            kc = min(KC, K - pc)")
    emit("            kb = np.uint64(pc)  # unsigned indices: no negative-index wraparound in hot loads")
    if pack_b:
        emit(f"            for panel in {loop}(n_panels):")
        emit("                j0 = jc + panel * NR")
        emit("                nr = min(NR, jc + nc - j0)")
        emit("                for k in range(kc):")
        emit("                    for c in range(nr):")
        emit("                        b_packed[panel, k, c] = B[pc + k, j0 + c]")
        emit("                    for c in range(nr, NR):")
        emit("                        b_packed[panel, k, c] = 0")
    emit(f"            for block in {loop}((M + MC - 1) // MC):")
    emit("                ic = block * MC")
    emit("                mc = min(MC, M - ic)")
    emit("                m_strips = (mc + MR - 1) // MR")
    if pack_a:
        emit("                # A block packed into MR-high strips, zero-padded: a_packed[strip, k, r] = A[i0 + r, pc + k]")
        emit("                a_packed = np.empty((m_strips, kc, MR), dtype=A.dtype)")
        emit("                for strip in range(m_strips):")
        emit("                    i0 = ic + strip * MR")
        emit("                    mr = min(MR, ic + mc - i0)")
        emit("                    for k in range(kc):")
        emit("                        for r in range(mr):")
        emit("                            a_packed[strip, k, r] = A[i0 + r, pc + k]")
        emit("                        for r in range(mr, MR):")
        emit("                            a_packed[strip, k, r] = 0")

    panel_setup = _panel_setup(pack_b)
    strip_setup = _strip_setup(pack_a, mr)
    if loop_order == "n_outer":
        outer, outer_setup, inner, inner_setup = "panel", panel_setup, "strip", strip_setup
        outer_count, inner_count = "n_panels", "m_strips"
    else:
        outer, outer_setup, inner, inner_setup = "strip", strip_setup, "panel", panel_setup
        outer_count, inner_count = "m_strips", "n_panels"
    emit(f"                for {outer} in range({outer_count}):")
    lines.extend(indent(outer_setup, 20))
    emit(f"                    for {inner} in range({inner_count}):")
    lines.extend(indent(inner_setup, 24))
    lines.extend(indent(_micro_tile(mr, nr, unroll_k, pack_a, pack_b), 24))
    emit("")
    return "\n".join(lines)


def _panel_setup(pack_b: bool) -> list[str]:
    """Columns of the tile: B is read at columns jb + c, c in [0, NR); out gets c in [c_lo, c_hi)."""
    if pack_b:
        return [
            "j0 = jc + panel * NR",
            "jb = j0",
            "c_lo, c_hi = 0, min(NR, jc + nc - j0)",
            "b_panel = b_packed[panel]",
        ]
    return [
        "j0 = jc + panel * NR",
        "jb = min(j0, N - NR)  # a partial last panel shifts left to stay inside B",
        "c_lo, c_hi = j0 - jb, min(jc + nc, jb + NR) - jb",
        "b_cols = np.uint64(jb)",
    ]


def _strip_setup(pack_a: bool, mr: int) -> list[str]:
    """Rows of the tile: out gets rows i0 + r for r < mr."""
    lines = [
        "i0 = ic + strip * MR",
        "mr = min(MR, ic + mc - i0)",
    ]
    if pack_a:
        return lines + ["a_strip = a_packed[strip]"]
    return lines + [
        f"a_rows = stack_array({mr}, np.uint64)  # MR row indices; a partial strip repeats its last row",
        "for r in range(MR):",
        "    a_rows[r] = np.uint64(i0 + min(r, mr - 1))",
    ]


def _micro_tile(mr: int, nr: int, unroll_k: int, pack_a: bool, pack_b: bool) -> list[str]:
    a_load = "a_strip[kk, r]" if pack_a else "A[a_rows[r], kb + kk]"
    b_load = "b_panel[kk, c]" if pack_b else "B[kb + kk, b_cols + np.uint64(c)]"

    def update(kk: str) -> list[str]:
        return [
            f"kk = {kk}",
            "for r in range(MR):",
            f"    a = {a_load}",
            "    for c in range(NR):",
            f"        acc[r * NR + c] += a * {b_load}",
        ]

    lines = [
        f"acc = stack_array({mr * nr}, out.dtype)  # MR * NR accumulators, kept in registers",
        "for t in range(MR * NR):",
        "    acc[t] = 0",
    ]
    if unroll_k == 1:
        lines += ["for k in range(kc):"]
        lines += indent(update("np.uint64(k)"), 4)
    else:
        lines += [
            f"k_main = kc - kc % {unroll_k}",
            f"for k in range(0, k_main, {unroll_k}):",
        ]
        for step in range(unroll_k):
            lines += indent(update("np.uint64(k)" if step == 0 else f"np.uint64(k + {step})"), 4)
        lines += ["for k in range(k_main, kc):"]
        lines += indent(update("np.uint64(k)"), 4)
    # acc is only ever indexed by constants (after unrolling) so LLVM keeps all of it in registers;
    # an edge tile copies it to a second stack buffer for its variable-bound masked store.
    whole_store = [
        "out_cols = np.uint64(jb)",
        "if pc == 0:",
        "    for r in range(MR):",
        "        for c in range(NR):",
        "            out[np.uint64(i0 + r), out_cols + np.uint64(c)] = acc[r * NR + c]",
        "else:",
        "    for r in range(MR):",
        "        for c in range(NR):",
        "            out[np.uint64(i0 + r), out_cols + np.uint64(c)] += acc[r * NR + c]",
    ]
    edge_store = [
        f"edge = stack_array({mr * nr}, out.dtype)",
        "for t in range(MR * NR):",
        "    edge[t] = acc[t]",
        "if pc == 0:",
        "    for r in range(mr):",
        "        for c in range(c_lo, c_hi):",
        "            out[i0 + r, jb + c] = edge[r * NR + c]",
        "else:",
        "    for r in range(mr):",
        "        for c in range(c_lo, c_hi):",
        "            out[i0 + r, jb + c] += edge[r * NR + c]",
    ]
    lines += ["if mr == MR and c_lo == 0 and c_hi == NR:  # whole tile: constant bounds, vector stores"]
    lines += indent(whole_store, 4)
    lines += ["else:  # edge tile: store only the tile's own rows and columns"]
    lines += indent(edge_store, 4)
    return lines
