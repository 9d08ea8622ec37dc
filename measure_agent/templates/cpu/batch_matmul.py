"""Batched matmul on CPUs: ``out[b] = A[b] @ B[b]`` with A [B, M, K] and B [B, K, N], via numba.

The loop nest is the shared GEMM of :mod:`measure_agent.templates.cpu._gemm` (the matmul
template's GotoBLAS design) with a batch axis: work items are (batch, MC-row block) pairs, so small
matrices in large batches still keep every core busy, and B is packed for all batches in one
parallel pass before them.
"""

from __future__ import annotations

from measure_agent.device import DeviceInfo
from measure_agent.space import Config, ConfigSpace
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cpu._common import check_workload, vector_target
from measure_agent.templates.cpu._gemm import GemmShape, gemm_default, gemm_runtime_args, gemm_space, render_gemm
from measure_agent.workload import Workload


def _shape(workload: Workload) -> GemmShape:
    return GemmShape(batch=workload["B"], M=workload["M"], N=workload["N"], K=workload["K"], transposed=False)


class BatchMatmulCpuTemplate(Template):
    """Register-blocked, cache-blocked batched matmul for CPUs (float32 and float64).

    Knobs:
    - ``vector_axis``: ``n`` only (output columns: B rows and out rows are contiguous along n).
    - ``tile_m`` = (blocks, MC/MR, MR): MR rows per register tile, MC rows per work item.
    - ``tile_n`` = (blocks, NC/NR, NR): NR columns per register tile, NC per column block.
    - ``kc``: reduction block length KC; ``kc == K`` means no K-blocking.
    - ``loop_order``: ``n_outer`` (a B panel stays hot while A strips stream) or ``m_outer``.
    - ``unroll_k``: copies of the reduction loop's body per iteration.
    - ``pack_a``: copy A into zero-padded MR-high strips per (MC, KC) block.
    - ``pack_b``: copy B into zero-padded NR-wide panels (all batches, once per call); unpacked, a
      partial last panel shifts left to stay inside B.
    - ``parallel``: run the (batch, MC-block) work items on all cores (numba ``prange``).

    MR, NR, order, unroll, packing and parallel are compiled in; MC, NC and KC are runtime
    arguments (``batch_matmul(A, B, out, MC, NC, KC)``).
    """

    op = "batch_matmul"
    target = "cpu"
    # 2: compiled with 512-bit vectors on AVX-512 hosts (codegen_environment); 3: the micro-kernel's
    # rows written out, not a loop (see cpu/_gemm.py); 4: the register tile zeroed and stored row by row
    version = "4"

    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        check_workload(self, workload)
        return gemm_space(_shape(workload), workload.dtype, vector_target(device))

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        return gemm_default(_shape(workload), workload.dtype, space, workload.flops)

    def render(self, workload: Workload, config: Config) -> KernelSource:
        check_workload(self, workload)
        _, _, mr = config["tile_m"]
        _, _, nr = config["tile_n"]
        title = (f"batch_matmul_cpu v{self.version}: out[b] = A[b] @ B[b], register tile {mr} x {nr}, "
                 "vectorised over output columns")
        text = render_gemm(title=title, entry="batch_matmul", shape=_shape(workload), workload=workload,
                           config=config)
        return KernelSource(text=text, entry="batch_matmul", runtime_args=gemm_runtime_args(config))
