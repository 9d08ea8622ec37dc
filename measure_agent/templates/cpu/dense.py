"""Dense (fully connected) layers on CPUs: ``out = X @ W.T`` with X [M, K] and W [N, K], via numba.

The loop nest is the shared GEMM of :mod:`measure_agent.templates.cpu._gemm` with a transposed
right operand: either vectorised over output columns with W repacked into NR-wide panels each call
(``vector_axis = n``, the GotoBLAS micro-kernel), or vectorised over the reduction with W read in
place (``vector_axis = k``, dot products of MR rows of X with NR rows of W: the right kernel for
batch-1 inference, a matrix-vector product bound by reading W once).
"""

from __future__ import annotations

from measure_agent.device import DeviceInfo
from measure_agent.space import Config, ConfigSpace
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cpu._common import check_workload, vector_target
from measure_agent.templates.cpu._gemm import GemmShape, gemm_default, gemm_runtime_args, gemm_space, render_gemm
from measure_agent.workload import Workload


def _shape(workload: Workload) -> GemmShape:
    return GemmShape(batch=0, M=workload["M"], N=workload["N"], K=workload["K"], transposed=True)


class DenseCpuTemplate(Template):
    """Register-blocked, cache-blocked dense layer for CPUs (float32 and float64).

    Knobs:
    - ``vector_axis``: ``n`` (vectorise over output columns; W packed into NR-wide panels each call)
      or ``k`` (vectorise over the reduction; nothing packed; MR x NR vectors of partial sums).
    - ``tile_m`` = (blocks, MC/MR, MR): MR rows of X per register tile, MC rows per work item.
    - ``tile_n`` = (blocks, NC/NR, NR): NR rows of W (output columns) per register tile, NC per
      column block.
    - ``kc``: reduction block length KC; ``kc == K`` means no K-blocking.
    - ``loop_order``: ``n_outer`` (a W panel stays hot while X strips stream) or ``m_outer``.
    - ``unroll_k``: copies of the reduction loop's body per iteration.
    - ``pack_a``: copy X into zero-padded MR-high strips per (MC, KC) block (``n`` only).
    - ``k_lanes``: partial sums per (row, column) pair along k, one or two vectors (``k`` only).
    - ``parallel``: run the MC row blocks on all cores (numba ``prange``).

    MR, NR, the axis, order, unroll, packing and parallel are compiled in; MC, NC and KC are runtime
    arguments (``dense(A, B, out, MC, NC, KC)`` with A = X, B = W).
    """

    op = "dense"
    target = "cpu"
    # 2: compiled with 512-bit vectors on AVX-512 hosts (codegen_environment); 3: the reduction-
    # vectorised tile loops over lanes, then rows (SLP made 4-wide FMAs of some tiles before); 4: the
    # column-vectorised tile's rows written out, not a loop (see cpu/_gemm.py); 5: its register tile
    # zeroed and stored row by row
    version = "5"

    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        check_workload(self, workload)
        return gemm_space(_shape(workload), workload.dtype, vector_target(device))

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        return gemm_default(_shape(workload), workload.dtype, space, workload.flops)

    def render(self, workload: Workload, config: Config) -> KernelSource:
        check_workload(self, workload)
        axis = config["vector_axis"]
        _, _, mr = config["tile_m"]
        _, _, nr = config["tile_n"]
        title = (f"dense_cpu v{self.version}: out = X @ W.T, register tile {mr} x {nr}, vectorised over "
                 + ("output columns (W packed)" if axis == "n" else "the reduction (W read in place)"))
        text = render_gemm(title=title, entry="dense", shape=_shape(workload), workload=workload, config=config)
        return KernelSource(text=text, entry="dense", runtime_args=gemm_runtime_args(config))
