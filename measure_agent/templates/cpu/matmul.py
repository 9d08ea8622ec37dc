"""Matmul on CPUs: ``out = A @ B`` with A [M, K] and B [K, N] (C-contiguous), via numba.

The loop nest is the shared GEMM of :mod:`measure_agent.templates.cpu._gemm` in its classic
GotoBLAS order (``blocks_outer``):

    for each NC-wide column block of B and out                         (jc)
      for each KC-long block of the reduction                          (pc)
        [pack_b] copy the KC x NC block of B into NR-wide panels, zero-padded
        for each MC-high row block of A and out, in parallel if asked  (ic)
          [pack_a] copy the MC x KC block of A into MR-high strips, zero-padded
          for each NR-wide panel and MR-high strip, in ``loop_order``  (jr, ir)
            MR x NR micro-tile: accumulators in registers, k loop unrolled ``unroll_k`` times,
            then stored to out (added to it after the first KC block)

What makes this fast with numba on x86 (see the shared notes on numba CPU kernels and
:mod:`measure_agent.templates.cpu._common`): accumulators in a fixed-size stack array
(``cpu_stack.stack_array``) that LLVM keeps in registers; constant-bound update loops that LLVM
fully unrolls and its SLP vectoriser (``NUMBA_SLP_VECTORIZE=1``) turns into vector FMAs; fastmath
without reassociation; unsigned indices in the hot loads.

Remainders: packed panels and strips are zero-padded; unpacked A repeats its last row in a partial
strip; unpacked B shifts the last partial panel left so it stays inside B (hence ``N >= NR``);
stores are masked to the tile's own rows and columns. Correctness never depends on SLP.

A ``parallel=False`` kernel is outlined like the other GEMM templates' (``kernel_head``): its loops
are ``prange`` loops compiled with ``parallel=True`` and run on the calling thread only. As one plain
serial ``njit`` function, LLVM left the packed-B micro-kernel scalar on AVX-512 (2-core Sapphire
Rapids-class Xeon, numba 0.68, 512^3 float32: 256 scalar FMAs and no zmm ones in ``inspect_asm``,
3.7 GFLOPS; outlined: 16 zmm FMAs per k step, 132 GFLOPS on one core), the same for unroll_k 2 and
pack_a; only unpacked B vectorised there. Its compiled code is ``_matmul``'s (``bench/matmul_probe.py
--asm``, ``bench/matmul_cpu.py --asm``).
"""

from __future__ import annotations

from measure_agent.device import DeviceInfo
from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cpu._common import (
    UNROLLS,
    CpuSpace,
    check_workload,
    pick_split,
    reduction_blocks,
    target_of,
    vector_target,
)
from measure_agent.templates.cpu._gemm import (
    LOOP_ORDERS,
    MC_TILES,
    NC_TILES,
    GemmShape,
    gemm_runtime_args,
    render_gemm,
)
from measure_agent.workload import Workload

__all__ = ["K_UNROLLS", "LOOP_ORDERS", "PARALLEL_AXES", "MatmulCpuTemplate"]

# Default register tile, MR rows x NR columns given in vectors: 12 accumulator vectors, the fastest
# measured at 512^3 and 1024^3 on a 2-core Zen 3 (AVX2: float32 6 x 16, float64 3 x 16; float64
# 6 x 8 spilled once LLVM unrolled its k loop, 3 x 16 did not). With 32 registers (AVX-512) float32
# takes VectorTarget.default_rows (8) rows instead (6 x 32 once compiled to gathers there; see
# cpu/_gemm.py: now 209 GFLOPS at 512^3 on Zen 4, level with 8 x 32).
DEFAULT_TILE_VECTORS = {"float32": (6, 2), "float64": (3, 4)}
KC_MIN = 16
K_UNROLLS = UNROLLS  # copies of the micro-kernel's k-loop body per iteration
# What runs in parallel (render_gemm's blocks_outer nest): MC row blocks (B packed in a parallel
# region of its own before them) or NC column blocks (each packing its own B panels).
PARALLEL_AXES = ("m", "n")
COLUMN_BLOCKS = 4  # the default's parallel column blocks, when N has room for them


def _shape(workload: Workload) -> GemmShape:
    return GemmShape(batch=0, M=workload["M"], N=workload["N"], K=workload["K"], transposed=False)


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
    - ``parallel``: run on all cores with numba ``prange``.
    - ``parallel_axis``: what runs in parallel: ``m``, the MC row blocks of each (NC, KC) block, after
      B's block is packed in a parallel region of its own; ``n``, the NC column blocks, each packing
      its own B panels (one parallel region per call). A serial kernel runs the same loop nest on
      the calling thread.

    Constraints: the MR x NR accumulators fit in 3/4 of the device's vector registers (12 of 16
    on AVX2); unpacked B needs ``N >= NR``. MR, NR, loop order, unroll, packing and parallel are
    compiled in; MC, NC and KC are not, so configs differing only in them share one kernel.
    """

    op = "matmul"
    target = "cpu"
    # 5: the micro-kernel's rows written out, not a loop (LLVM vectorised some tiles across it, with gathers);
    # 4: serial (parallel=False) kernels outlined like dense's and batch_matmul's (scalar otherwise on AVX-512);
    # 3: rendered by the shared GEMM generator (cpu/_gemm.py): cache blocks rounded down to whole
    #    register tiles, the same loop nest and micro-kernel otherwise;
    # 2: compiled with 512-bit vectors on AVX-512 hosts (codegen_environment)
    version = "5"

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
            ChoiceKnob("parallel_axis", PARALLEL_AXES),
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
        the axes); MC up to 16 tiles but at least four row blocks when M allows; no K-blocking; B
        packed; parallel when the problem is big enough to pay for it, over NC column blocks (at
        least four when N allows, else NC as wide as possible and parallel over the row blocks).

        Parallel over columns: on a 2-core AVX-512 Xeon (Sapphire Rapids class, float32) one
        parallel region per call instead of two per (NC, KC) block ran 256^3 at 165-190 GFLOPS
        instead of 147-150, 512^3 at 230-249 instead of 213-215, 1024^3 at 255-279 instead of 233-273
        (numpy/OpenBLAS 226-236, 255-256, 285-291 in the same runs).

        k unrolled 4x on AVX-512 (same machine, two runs each, parallel over columns): 256^3 165-175
        GFLOPS instead of 159-165, 512^3 282-286 instead of 267-269, 1024^3 277-281 instead of
        253-257 (numpy 218-227, 262-276, 295-298). Elsewhere 1 (measured best on AVX2)."""
        m, n, k, dtype = workload["M"], workload["N"], workload["K"], workload.dtype
        vt = target_of(space)
        mr, nr_vectors = DEFAULT_TILE_VECTORS[dtype]
        if dtype == "float32":
            mr = vt.default_rows  # AVX-512: 8 x 32
        nr = nr_vectors * vt.lanes(dtype)
        parallel = m * n * k >= 64**3
        tile_n = pick_split(space.knob("tile_n"), inner_at_most=nr, block_at_most=n)
        tile_m = pick_split(space.knob("tile_m"), inner_at_most=mr, block_at_most=max(1, min(16 * mr, m // 4)))
        axis = "m"
        if parallel and n >= COLUMN_BLOCKS * tile_n[-1]:
            axis = "n"
            tile_n = pick_split(space.knob("tile_n"), inner_at_most=nr, block_at_most=n // COLUMN_BLOCKS)
        return space.make(
            {
                "tile_m": tile_m,
                "tile_n": tile_n,
                "kc": k,
                "loop_order": "n_outer",
                "unroll_k": 4 if vt.isa == "avx512" else 1,
                "pack_b": True,
                "pack_a": False,
                "parallel": parallel,
                "parallel_axis": axis,
            }
        )

    def render(self, workload: Workload, config: Config) -> KernelSource:
        check_workload(self, workload)
        _, _, mr = config["tile_m"]
        _, _, nr = config["tile_n"]
        title = f"matmul_cpu v{self.version}: out = A @ B, register tile {mr} x {nr}, vectorised over output columns"
        # serial kernels are outlined (outline_serial=True): see the module docstring;
        # remainder_loop: measured, see render_gemm
        text = render_gemm(title=title, entry="matmul", shape=_shape(workload), workload=workload, config=config,
                           nest="blocks_outer", outline_serial=True, remainder_loop=True)
        return KernelSource(text=text, entry="matmul", runtime_args=gemm_runtime_args(config))
