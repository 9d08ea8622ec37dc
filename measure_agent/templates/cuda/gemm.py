"""GEMM-shaped operators on CUDA GPUs: matmul, dense, batch_matmul and conv2d (implicit GEMM).

Every one of them is ``out[batch, m, n] = sum_k a(batch, m, k) * b(batch, k, n)`` for some way of
reading ``a`` and ``b`` from the inputs and of writing ``out`` (a :class:`GemmView`):

- matmul: ``a = A[m, k]``, ``b = B[k, n]``;  dense: ``b = W[n, k]`` (X @ W.T);
- batch_matmul: the same per batch (grid z);
- conv2d_nchw: m = output channel, n = (image, oh, ow) flattened, k = (c, r, s): ``a`` is the
  weight tensor [K, C*R*S] as it lies in memory and ``b`` the implicit im2col of the data (zero in
  the padding), so nothing is materialised;
- conv2d_nhwc: m = (image, oh, ow), n = output channel, k = (r, s, c): ``a`` is the implicit im2col
  of the data and ``b`` the HWIO weights [R*S*C, K] as they lie in memory.

One kernel shape for all of them (see :func:`_render`): a block of TY x TX threads computes a
BM x BN tile of out (BM = TY*RM, BN = TX*RN); thread (ty, tx) accumulates an RM x RN register tile
(``cuda.local.array`` indexed only by literals, so it lives in registers). Its rows are groups of
VM = min(4, RM) adjacent rows, group g at ``m0 + g*TY*VM + ty*VM`` (columns likewise), so that it
reads its operands from shared memory VM at a time (128-bit loads on sm_90) and a warp's stores
along n are contiguous. With ``shared`` on, the reduction goes in BK-long chunks through two
buffers of the A and B tiles in shared memory (rows padded by VM / VN against bank conflicts of
the transposed writes, keeping rows aligned): while the block computes on one buffer, each thread
reads its share of the next chunk from global memory into registers (coalesced, in the order the
operand lies in memory, zero outside the problem) and writes it into the other buffer, one
barrier per chunk; the BK rank-1 updates are written out ``unroll_k`` at a time. With it off, each
thread reads its operands straight from global memory (rows and columns clamped into range;
out-of-range results are never stored). Bounds are tested only on the axes the tiles do not
divide: the shapes are constants of the rendered kernel.

Knobs: ``tile_m`` = (blocks, TY, RM) and ``tile_n`` = (blocks, TX, RN) split the output axes into
blocks, threads and register tiles; ``tile_k`` = BK (only with ``shared``); ``shared``;
``unroll_k``; ``blocks_per_sm``, the blocks whose registers must fit one multiprocessor together
(the compiler caps registers per thread to match, spilling beyond). Configs beyond the device's
threads, shared memory or registers per block are pruned, as are blocks of less than a warp when
the tiles allow a warp.

Measured on sm_90 SASS (ptxas 13.0, matmul 2048^3, 16 x 16 threads, 8 x 8 tile, BK 8): a chunk,
staging included, is 720 instructions for 512 FMAs (32 of them 128-bit shared loads); the
interleaved layout of version 1 needed 196 for 64 FMAs (4 x 4 tile, scalar shared loads, every
address recomputed). On an H200 the default ran matmul 2048^3 in 0.522 ms (33 TFLOP/s, 0.66x
cuBLAS; version 1: 2.019 ms by default, 1.288 tuned).
"""

from __future__ import annotations

from dataclasses import dataclass

from measure_agent.device import DeviceInfo
from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cuda.common import (
    DEFAULT_MAX_REGISTERS,
    ITEMSIZE,
    MAX_GRID_YZ,
    MAX_REGISTERS_PER_THREAD,
    MIN_BLOCKS,
    GpuLimits,
    ceil_div,
    choose_default,
    grid_yz,
    indent,
    log2,
    min_threads_wanted,
    pick_split,
    powers_of_two_covering,
    registers_estimate,
)
from measure_agent.workload import Workload
from measure_agent.workload.operators import conv_output_hw

THREADS_X = (1, 2, 4, 8, 16, 32, 64)  # along n: consecutive threads, consecutive columns
THREADS_Y = (1, 2, 4, 8, 16, 32)
REGS = (1, 2, 4, 8)
UNROLLS = (1, 2, 4, 8)
# blocks that must fit one multiprocessor's 64K registers together: the compiler caps each thread
# at 64K / (threads * blocks_per_sm) registers (spilling beyond), so that 2 trades spills for
# occupancy (more warps to hide latency and barriers)
BLOCKS_PER_SM = (1, 2)
BK_MIN, BK_MAX = 4, 64
VERSION = "2"


@dataclass(frozen=True)
class GemmView:
    """An operator seen as ``out[batch, m, n] = sum_k a(m, k) * b(k, n)``.

    ``load_a``/``load_b``/``store`` are the bodies of device functions ``load_a(A, [batch,] m, k)``,
    ``load_b(B, [batch,] k, n)`` and ``store(out, [batch,] m, n, value)``; the kernel only calls
    them with m < M, n < N and k < K. ``a_k_fastest``: a's consecutive k are adjacent in memory
    (so shared-memory staging walks k fastest); ``b_n_fastest`` likewise for b and n.
    """

    m: int
    n: int
    k: int
    batch: int
    args: tuple[str, str]  # the kernel's inputs, in the operator's order
    a_arg: str  # which of them a is read from
    b_arg: str
    a_k_fastest: bool
    b_n_fastest: bool
    meaning: tuple[str, ...]
    constants: tuple[str, ...]
    load_a: tuple[str, ...]
    load_b: tuple[str, ...]
    store: tuple[str, ...]


class GemmCudaTemplate(Template):
    """Base of the GEMM-shaped CUDA templates; subclasses say how their operator is a GEMM."""

    target = "cuda"
    timed_on_host_cpu = False
    version = VERSION

    def view(self, workload: Workload) -> GemmView:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- space ----------------------------------------------------------------------------------
    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        self._check(workload)
        view = self.view(workload)
        limits = GpuLimits.of(device)
        tile_m = SplitKnob("tile_m", view.m, (THREADS_Y, REGS))
        tile_n = SplitKnob("tile_n", view.n, (THREADS_X, REGS))
        bk_choices = powers_of_two_covering(view.k, BK_MIN, BK_MAX)
        min_threads = min_threads_wanted(tile_m, tile_n, limit=limits.max_threads)
        dtype = workload.dtype

        def fits(tm, tn, bk, shared) -> bool:
            return limits.fits(tm[1] * tn[1], _shared_bytes(tm, tn, bk, shared, dtype), _registers(tm, tn, dtype))

        def unroll_ok(bk, unroll, shared) -> bool:
            return unroll == 1 or unroll <= (bk if shared else view.k)

        constraints = [
            Constraint(("tile_m", "tile_n", "tile_k", "shared"), fits,
                       f"threads, shared memory and registers per block must fit the device "
                       f"({limits.max_threads} threads, {limits.max_shared_bytes} B shared, "
                       f"{limits.max_registers} registers)"),
            Constraint(("tile_m", "tile_n"), lambda tm, tn: tm[1] * tn[1] >= min_threads,
                       f"at least {min_threads} threads per block (a warp, when the tiles allow it)"),
            Constraint(("tile_k", "shared"), lambda bk, shared: shared or bk == bk_choices[0],
                       f"tile_k only matters with shared staging: without it, tile_k is {bk_choices[0]}"),
            Constraint(("tile_k", "unroll_k", "shared"), unroll_ok,
                       "unroll_k must not exceed the reduction chunk (tile_k with shared staging, else K)"),
            Constraint(("tile_m", "tile_n", "blocks_per_sm"), lambda tm, tn, blocks: blocks == 1 or tm[1] * tn[1] > 128,
                       "blocks_per_sm 2 only caps registers below the compiler's own limit with more than 128 "
                       "threads per block"),
        ]
        knobs = [
            tile_m,
            tile_n,
            ChoiceKnob("tile_k", bk_choices),
            BoolKnob("shared"),
            ChoiceKnob("unroll_k", UNROLLS),
            ChoiceKnob("blocks_per_sm", BLOCKS_PER_SM),
        ]
        return ConfigSpace(knobs, constraints)

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        """16 x 16 threads (more along n when m is short), 8 x 8 float32 / 4 x 4 float64 outputs per
        thread, K staged 8 at a time in shared memory with the chunk written out (unroll_k = tile_k),
        registers capped for two blocks per multiprocessor; smaller tiles when that leaves too few
        blocks to fill a large GPU a few times over, or when the device or the problem demands it.
        On an H200 (matmul 2048^3) the cap ran 0.516 ms against 0.681 without it, conv2d 0.200
        against 0.237; 4 x 4 tiles 0.855."""
        view = self.view(workload)
        bk_wanted = 8
        bks = space.knob("tile_k").values
        bk = max([v for v in bks if v <= bk_wanted] or [bks[0]])

        def candidate(threads_y: int, threads: int, r: int, shared: bool) -> dict:
            tm = pick_split(space.knob("tile_m"), threads_y, r)
            tn = pick_split(space.knob("tile_n"), min(64, max(1, threads // tm[1])), r)
            k = bk if shared else bks[0]
            return {"tile_m": tm, "tile_n": tn, "tile_k": k, "shared": shared,
                    "unroll_k": max(u for u in UNROLLS if u <= k) if shared else 1,
                    "blocks_per_sm": 2 if tm[1] * tn[1] > 128 else 1}

        def blocks(values: dict) -> int:
            return values["tile_m"][0] * values["tile_n"][0] * view.batch

        def blocks_wanted(values: dict) -> int:
            # a big register tile leaves few blocks per multiprocessor: it pays only with a few waves
            return MIN_BLOCKS * max(1, values["tile_m"][2] * values["tile_n"][2] // 32)

        regs = (8, 4, 2, 1) if workload.dtype == "float32" else (4, 2, 1)
        preferences = [candidate(ty, threads, r, shared) for shared in (True, False)
                       for threads, ty in ((256, 16), (128, 8), (64, 8), (32, 4)) for r in regs]
        return choose_default(space, preferences, blocks, blocks_wanted)

    # -- rendering ------------------------------------------------------------------------------
    def render(self, workload: Workload, config: Config) -> KernelSource:
        self._check(workload)
        text = _render(self, workload, self.view(workload), config)
        return KernelSource(text=text, entry="run", launch="cuda")

    def features(self, workload: Workload, config: Config) -> dict[str, float]:
        """Structural features for the cost model (same names for every GEMM-shaped operator)."""
        view = self.view(workload)
        _, ty, rm = config["tile_m"]
        _, tx, rn = config["tile_n"]
        bm, bn, bk, shared = ty * rm, tx * rn, config["tile_k"], config["shared"]
        blocks = ceil_div(view.m, bm) * ceil_div(view.n, bn) * view.batch
        itemsize = ITEMSIZE[workload.dtype]
        return {
            "threads": float(tx * ty),
            "outputs_per_thread": float(rm * rn),
            "log2_blocks": log2(blocks),
            "shared_bytes": float(_shared_bytes(config["tile_m"], config["tile_n"], bk, shared, workload.dtype)),
            "registers_estimate": float(_registers(config["tile_m"], config["tile_n"], workload.dtype)),
            # flops per byte a block reads from global memory (reuse of its staged tiles)
            "block_intensity": 2.0 * bm * bn / ((bm + bn) * itemsize),
            "thread_intensity": 2.0 * rm * rn / (rm + rn),
            "edge_waste": 1.0 - (view.m * view.n) / (ceil_div(view.m, bm) * bm * ceil_div(view.n, bn) * bn),
            "k_steps": float(ceil_div(view.k, bk) if shared else view.k),
            "blocks_per_sm": float(config["blocks_per_sm"]),
        }

    def _check(self, workload: Workload) -> None:
        if workload.op != self.op:
            raise ValueError(f"{type(self).__name__} renders {self.op}, not {workload.op}")
        if workload.dtype not in ITEMSIZE:
            raise ValueError(f"{type(self).__name__} supports float32 and float64, not {workload.dtype}")


def _shared_bytes(tile_m, tile_n, bk: int, shared: bool, dtype: str) -> int:
    return _Layout(tile_m[1], tile_m[2], tile_n[1], tile_n[2], bk, shared).shared_bytes(dtype)


def _registers(tile_m, tile_n, dtype: str) -> int:
    rm, rn = tile_m[2], tile_n[2]
    return registers_estimate(rm * rn, rm + rn, dtype)


# -- the operators ------------------------------------------------------------------------------


class MatmulCudaTemplate(GemmCudaTemplate):
    op = "matmul"

    def view(self, workload: Workload) -> GemmView:
        return GemmView(
            m=workload["M"], n=workload["N"], k=workload["K"], batch=1, args=("A", "B"), a_arg="A", b_arg="B",
            a_k_fastest=True, b_n_fastest=True,
            meaning=("out[m, n] = sum_k A[m, k] * B[k, n]",),
            constants=(),
            load_a=("return A[m, k]",), load_b=("return B[k, n]",), store=("out[m, n] = value",),
        )


class DenseCudaTemplate(GemmCudaTemplate):
    op = "dense"

    def view(self, workload: Workload) -> GemmView:
        return GemmView(
            m=workload["M"], n=workload["N"], k=workload["K"], batch=1, args=("X", "W"), a_arg="X", b_arg="W",
            a_k_fastest=True, b_n_fastest=False,
            meaning=("out[m, n] = sum_k X[m, k] * W[n, k]  (X @ W.T)",),
            constants=(),
            load_a=("return X[m, k]",), load_b=("return W[n, k]",), store=("out[m, n] = value",),
        )


class BatchMatmulCudaTemplate(GemmCudaTemplate):
    op = "batch_matmul"

    def view(self, workload: Workload) -> GemmView:
        return GemmView(
            m=workload["M"], n=workload["N"], k=workload["K"], batch=workload["B"], args=("A", "B"), a_arg="A", b_arg="B",
            a_k_fastest=True, b_n_fastest=True,
            meaning=("out[batch, m, n] = sum_k A[batch, m, k] * B[batch, k, n]",),
            constants=(),
            load_a=("return A[batch, m, k]",), load_b=("return B[batch, k, n]",),
            store=("out[batch, m, n] = value",),
        )


def _conv_constants(workload: Workload) -> tuple[str, ...]:
    p = workload.params
    oh, ow = conv_output_hw(p)
    return (
        f"IMAGES, CH_IN, H, W = {p['N']}, {p['C']}, {p['H']}, {p['W']}  # data",
        f"CH_OUT, R, S = {p['K']}, {p['R']}, {p['S']}  # output channels, window rows and columns",
        f"STRIDE_H, STRIDE_W = {p['stride_h']}, {p['stride_w']}",
        f"PAD_H, PAD_W = {p['pad_h']}, {p['pad_w']}",
        f"DIL_H, DIL_W = {p['dilation_h']}, {p['dilation_w']}",
        f"OH, OW = {oh}, {ow}  # output rows and columns",
    )


_PIXEL = (
    "image = {q} // (OH * OW)",
    "oh = ({q} // OW) % OH",
    "ow = {q} % OW",
)


class Conv2dNchwCudaTemplate(GemmCudaTemplate):
    op = "conv2d_nchw"

    def view(self, workload: Workload) -> GemmView:
        p = workload.params
        oh, ow = conv_output_hw(p)
        return GemmView(
            m=p["K"], n=p["N"] * oh * ow, k=p["C"] * p["R"] * p["S"], batch=1, args=("data", "weight"),
            a_arg="weight", b_arg="data",
            a_k_fastest=True, b_n_fastest=True,
            meaning=(
                "implicit GEMM: m = output channel, n = (image, oh, ow), k = (c, r, s)",
                "out[image, m, oh, ow] = sum_k weight[m, c, r, s] * data[image, c, oh*STRIDE_H - PAD_H + r*DIL_H, "
                "ow*STRIDE_W - PAD_W + s*DIL_W]",
            ),
            constants=_conv_constants(workload),
            load_a=("return weight[m, k // (R * S), (k // S) % R, k % S]",),
            load_b=(
                "c = k // (R * S)",
                "ih = ((n // OW) % OH) * STRIDE_H - PAD_H + ((k // S) % R) * DIL_H",
                "iw = (n % OW) * STRIDE_W - PAD_W + (k % S) * DIL_W",
                "if 0 <= ih < H and 0 <= iw < W:",
                "    return data[n // (OH * OW), c, ih, iw]",
                "return DTYPE(0)  # padding",
            ),
            store=tuple(line.format(q="n") for line in _PIXEL) + ("out[image, m, oh, ow] = value",),
        )


class Conv2dNhwcCudaTemplate(GemmCudaTemplate):
    op = "conv2d_nhwc"

    def view(self, workload: Workload) -> GemmView:
        p = workload.params
        oh, ow = conv_output_hw(p)
        return GemmView(
            m=p["N"] * oh * ow, n=p["K"], k=p["R"] * p["S"] * p["C"], batch=1, args=("data", "weight"),
            a_arg="data", b_arg="weight",
            a_k_fastest=True, b_n_fastest=True,
            meaning=(
                "implicit GEMM: m = (image, oh, ow), n = output channel, k = (r, s, c)",
                "out[image, oh, ow, n] = sum_k data[image, oh*STRIDE_H - PAD_H + r*DIL_H, "
                "ow*STRIDE_W - PAD_W + s*DIL_W, c] * weight[r, s, c, n]",
            ),
            constants=_conv_constants(workload),
            load_a=(
                "ih = ((m // OW) % OH) * STRIDE_H - PAD_H + (k // (S * CH_IN)) * DIL_H",
                "iw = (m % OW) * STRIDE_W - PAD_W + ((k // CH_IN) % S) * DIL_W",
                "if 0 <= ih < H and 0 <= iw < W:",
                "    return data[m // (OH * OW), ih, iw, k % CH_IN]",
                "return DTYPE(0)  # padding",
            ),
            load_b=("return weight[k // (S * CH_IN), (k // CH_IN) % S, k % CH_IN, n]",),
            store=tuple(line.format(q="m") for line in _PIXEL) + ("out[image, oh, ow, n] = value",),
        )


# -- rendering ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """Where a config puts things. A thread's RM rows come in GM groups of VM adjacent rows (VM =
    min(4, RM)): row i is ``g*TY*VM + ty*VM + v`` of the block tile (g = i // VM, v = i % VM), so
    the VM values a thread reads from a staged row are adjacent and aligned (one vector load) and
    a warp's stores along n stay contiguous; columns likewise with VN, GN and TX."""

    ty: int
    rm: int
    tx: int
    rn: int
    bk: int
    shared: bool

    @property
    def vm(self) -> int:
        return min(4, self.rm)

    @property
    def vn(self) -> int:
        return min(4, self.rn)

    @property
    def pad_a(self) -> int:
        # rows of both staged tiles are VM (VN) elements longer than the tile: the transposed
        # writes (consecutive threads a row apart) spread over banks, and rows stay aligned to VM
        # elements, which lets the compiler read VM adjacent values in one vector load (ptxas on
        # sm_90 makes 128-bit loads of the padded tiles, scalar ones of an unpadded one)
        return self.vm

    @property
    def pad_b(self) -> int:
        return self.vn

    def shared_bytes(self, dtype: str) -> int:
        if not self.shared:
            return 0
        # two buffers of each tile: the next chunk is written into one while the other is read
        return 2 * self.bk * (self.ty * self.rm + self.pad_a + self.tx * self.rn + self.pad_b) * ITEMSIZE[dtype]


def _plus(name: str, offset: int) -> str:
    return f"{name} + {offset}" if offset else name


def _layout(config: Config) -> _Layout:
    _, ty, rm = config["tile_m"]
    _, tx, rn = config["tile_n"]
    return _Layout(ty, rm, tx, rn, config["tile_k"], config["shared"])


def _render(template: GemmCudaTemplate, workload: Workload, view: GemmView, config: Config) -> str:
    lay = _layout(config)
    ty, rm, tx, rn = lay.ty, lay.rm, lay.tx, lay.rn
    bk, shared, unroll = config["tile_k"], config["shared"], config["unroll_k"]
    bm, bn = ty * rm, tx * rn
    threads = tx * ty
    tiles_m, tiles_n = ceil_div(view.m, bm), ceil_div(view.n, bn)
    batched = view.batch > 1 or template.op == "batch_matmul"
    a_name, b_name = view.a_arg, view.b_arg
    first, second = view.args
    bi = "batch, " if batched else ""
    dtype = workload.dtype

    lines: list[str] = []
    emit = lines.append
    emit(f"# tunefleet {template.op} cuda v{template.version}: {workload.key}")
    for line in view.meaning:
        emit(f"# {line}")
    emit(f"# config: {config.json_text()}")
    emit("# A block of TY x TX threads computes a BM x BN tile of out; thread (ty, tx) keeps an RM x RN")
    emit("# register tile of outputs: its rows are GM groups of VM adjacent rows, row i at")
    emit("# m0 + (i // VM)*TY*VM + ty*VM + i % VM (columns likewise with GN, VN and TX), so that its")
    emit("# operands are read VM (VN) at a time and a warp's stores along n are contiguous.")
    if shared:
        emit("# Each step stages BK of the reduction of both operand tiles in shared memory; the next")
        emit("# step's operands are read from global memory into registers while this step computes.")
    else:
        emit("# Operands are read straight from global memory (no shared-memory staging).")
    emit("from numba import config as numba_config")
    emit("from numba import cuda, " + ("float32" if dtype == "float32" else "float64") + ("" if shared else ", int64"))
    emit("")
    emit(f"DTYPE = {dtype}")
    emit(f"M, N, K = {view.m}, {view.n}, {view.k}  # out is M x N; K is the reduction")
    if batched:
        emit(f"BATCH = {view.batch}")
    emit(f"TX, TY = {tx}, {ty}  # threads per block along n (x) and m (y)")
    emit(f"RM, RN = {rm}, {rn}  # register tile: outputs per thread along m and n")
    emit(f"VM, VN = {lay.vm}, {lay.vn}  # adjacent rows (columns) per group of the register tile")
    emit(f"BM, BN = {bm}, {bn}  # block tile: TY * RM rows, TX * RN columns")
    emit(f"THREADS = {threads}")
    emit(f"TILES_M, TILES_N = {tiles_m}, {tiles_n}")
    if shared:
        emit(f"BK = {bk}  # reduction chunk staged in shared memory")
        emit(f"A_LOADS, B_LOADS = {ceil_div(bm * bk, threads)}, {ceil_div(bk * bn, threads)}"
             "  # shared-memory elements each thread stages per chunk")
    emit(f"UNROLL_K = {unroll}")
    for line in view.constants:
        emit(line)
    grid = (tiles_n, grid_yz(tiles_m), grid_yz(view.batch) if batched else 1)
    emit(f"GRID = {grid}  # (n tiles, m tiles, batch); the kernel loops when y or z exceed {MAX_GRID_YZ}")
    emit(f"BLOCK = ({tx}, {ty}, 1)")
    # A cap the compiler honours by spilling, so that every config launches: without it a big
    # register tile in a big block asks for more registers than a block may have.
    blocks_per_sm = config["blocks_per_sm"]
    max_registers = min(MAX_REGISTERS_PER_THREAD, DEFAULT_MAX_REGISTERS // (threads * blocks_per_sm) // 8 * 8)
    emit(f"# at most {max_registers} registers per thread, so that {blocks_per_sm} block(s) of {threads} threads fit "
         "64K registers (not in the simulator)")
    emit(f"JIT_OPTIONS = {{}} if numba_config.ENABLE_CUDASIM else {{'max_registers': {max_registers}}}")
    emit("")
    emit("")
    for name, params, body, doc in (
        ("load_a", f"{a_name}, {bi}m, k", view.load_a, "a(m, k) of the GEMM"),
        ("load_b", f"{b_name}, {bi}k, n", view.load_b, "b(k, n) of the GEMM"),
        ("store", f"out, {bi}m, n, value", view.store, "out(m, n) = value"),
    ):
        emit("@cuda.jit(device=True)")
        emit(f"def {name}({params}):")
        emit(f'    """{doc}"""')
        lines.extend(indent(body, 4))
        emit("")
        emit("")
    emit("@cuda.jit(cache=True, **JIT_OPTIONS)")
    emit(f"def kernel({first}, {second}, out):")
    body: list[str] = [
        "tx = cuda.threadIdx.x",
        "ty = cuda.threadIdx.y",
        "n0 = cuda.blockIdx.x * BN",
        "a_col = ty * VM  # this thread's first row (a_col + ...) and column (b_col + ...) of the block tile",
        "b_col = tx * VN",
    ]
    if shared:
        a_loads, b_loads = ceil_div(bm * bk, threads), ceil_div(bk * bn, threads)
        body += [
            "tid = ty * TX + tx",
            f"a_tile = cuda.shared.array(({2 * bk}, {bm + lay.pad_a}), DTYPE)  # (2 * BK, BM + {lay.pad_a}): "
            "two buffers of an A chunk, transposed",
            f"b_tile = cuda.shared.array(({2 * bk}, {bn + lay.pad_b}), DTYPE)  # (2 * BK, BN + {lay.pad_b})",
            f"a_next = cuda.local.array({a_loads}, DTYPE)  # (A_LOADS,) this thread's share of the next A chunk",
            f"b_next = cuda.local.array({b_loads}, DTYPE)  # (B_LOADS,)",
            *_share_setup(view, lay, threads),
        ]
    else:
        body += [
            f"rows = cuda.local.array({rm}, int64)  # (RM,) this thread's rows, clamped into range",
            f"cols = cuda.local.array({rn}, int64)  # (RN,) this thread's columns, clamped into range",
        ]
    body += [
        f"acc = cuda.local.array(({rm}, {rn}), DTYPE)  # (RM, RN): the register tile",
        f"a_reg = cuda.local.array({rm}, DTYPE)  # (RM,)",
        f"b_reg = cuda.local.array({rn}, DTYPE)  # (RN,)",
    ]
    loop: list[str] = [
        "m0 = tile_m * BM",
        "for i in range(RM):",
        "    for j in range(RN):",
        "        acc[i, j] = 0",
    ]
    if shared:
        loop += _shared_steps(view, lay, bi, unroll, threads)
    else:
        loop += _global_steps(view, a_name, b_name, bi, unroll)
    store = [f"store(out, {bi}m, n, acc[i, j])"]
    if view.n % bn:
        store = ["if n < N:"] + indent(store, 4)
    store = ["for j in range(RN):", f"    n = n0 + {_COL}"] + indent(store, 4)
    if view.m % bm:
        store = ["if m < M:"] + indent(store, 4)
    loop += ["for i in range(RM):", f"    m = m0 + {_ROW}"] + indent(store, 4)
    tile_loop = ["for tile_m in range(cuda.blockIdx.y, TILES_M, cuda.gridDim.y):  # once unless TILES_M > 65535"]
    tile_loop += indent(loop, 4)
    if batched:
        body += ["for batch in range(cuda.blockIdx.z, BATCH, cuda.gridDim.z):"] + indent(tile_loop, 4)
    else:
        body += tile_loop
    lines.extend(indent(body, 4))
    emit("")
    emit("")
    emit(f"def run({first}, {second}, out):")
    emit('    """Launch on device arrays; asynchronous (the caller synchronises)."""')
    emit(f"    kernel[GRID, BLOCK]({first}, {second}, out)")
    emit("")
    emit("")
    emit("run.kernels = (kernel,)  # what the engine compiles at build time (same arguments as run)")
    emit("")
    return "\n".join(lines)


# row i and column j of a thread's register tile within the block tile (see _Layout)
_ROW = "a_col + i // VM * (TY * VM) + i % VM"
_COL = "b_col + j // VN * (TX * VN) + j % VN"


def _rank1_update(a_expr: str, b_expr: str) -> list[str]:
    """One k of the register tile as loops over RM and RN, constants that NVVM unrolls fully: then
    every index of ``acc`` is a constant (it stays in registers) and adjacent operand reads merge
    into vector loads. Written out in the source instead, the same code took numba ten times longer
    to compile (its passes grow quadratically with a function's statements)."""
    return [
        "for i in range(RM):",
        "    a_reg[i] = " + a_expr.format(_ROW),
        "for j in range(RN):",
        "    b_reg[j] = " + b_expr.format(_COL),
        "for i in range(RM):",
        "    for j in range(RN):",
        "        acc[i, j] += a_reg[i] * b_reg[j]",
    ]


@dataclass(frozen=True)
class _Share:
    """This thread's share of staging one operand chunk: element e = tid + step * THREADS of the
    chunk, read in the order the operand lies in memory (consecutive threads, adjacent elements),
    is element (slow, fast) of the chunk, where ``fast`` runs over ``fast_extent``."""

    operand: str  # "a" or "b"
    count: int  # elements per thread
    total: int  # elements per chunk
    fast_extent: int
    threads: int

    def coords(self, step: int) -> tuple[str, str]:
        """(slow, fast) of this thread's element ``step`` as expressions: of ``{x}_slow0`` and
        ``{x}_fast0`` (tid split once, outside the loops) when step * THREADS is a multiple of the
        fast extent, else of tid itself."""
        offset = step * self.threads
        x = self.operand
        if offset % self.fast_extent == 0:
            return _plus(f"{x}_slow0", offset // self.fast_extent), f"{x}_fast0"
        return f"(tid + {offset}) // {self.fast_extent}", f"(tid + {offset}) % {self.fast_extent}"

    def guard(self, step: int) -> str | None:
        end = step * self.threads
        return f"tid < {self.total - end}" if self.total % self.threads and self.total - end < self.threads else None


def _shares(view: GemmView, lay: _Layout, threads: int) -> tuple[_Share, _Share]:
    bm, bn, bk = lay.ty * lay.rm, lay.tx * lay.rn, lay.bk
    return (_Share("a", ceil_div(bm * bk, threads), bm * bk, bk if view.a_k_fastest else bm, threads),
            _Share("b", ceil_div(bk * bn, threads), bk * bn, bn if view.b_n_fastest else bk, threads))


def _share_setup(view: GemmView, lay: _Layout, threads: int) -> list[str]:
    share_a, share_b = _shares(view, lay, threads)
    return [
        f"a_slow0, a_fast0 = tid // {share_a.fast_extent}, tid % {share_a.fast_extent}"
        "  # this thread's first element of an A chunk",
        f"b_slow0, b_fast0 = tid // {share_b.fast_extent}, tid % {share_b.fast_extent}",
    ]


@dataclass(frozen=True)
class _Operand:
    """What staging one operand depends on; everything else is the same for A and B. A is read as
    ``load_a(A, m, k)``, B as ``load_b(B, k, n)``, and both staged tiles are indexed [k, m or n]."""

    name: str  # "a" or "b": of load_{name}, {name}_tile and {name}_next
    arg: str  # the kernel argument it is read from
    k_first: bool  # load_{name} takes k before the tile index
    k_fastest: bool  # consecutive k are adjacent in memory
    origin: str  # the block's first index along the tile axis: "m0" or "n0"
    bound: str  # the tile axis's extent: "M" or "N"
    tile_ragged: bool  # the block tile does not divide the bound, so tile indices are tested
    k_ragged: bool  # BK does not divide K, so k is tested
    share: _Share

    def coords(self, step: int) -> tuple[str, str]:
        """(index along the tile axis within the block tile, k within the chunk) of this thread's
        element ``step``."""
        slow, fast = self.share.coords(step)
        return (slow, fast) if self.k_fastest else (fast, slow)

    def in_load_order(self, tile: str | None, k: str | None) -> tuple[str | None, str | None]:
        return (k, tile) if self.k_first else (tile, k)


def _operands(view: GemmView, lay: _Layout, threads: int) -> tuple[_Operand, _Operand]:
    bm, bn, k_ragged = lay.ty * lay.rm, lay.tx * lay.rn, bool(view.k % lay.bk)
    share_a, share_b = _shares(view, lay, threads)
    return (_Operand(name="a", arg=view.a_arg, k_first=False, k_fastest=view.a_k_fastest, origin="m0", bound="M",
                     tile_ragged=bool(view.m % bm), k_ragged=k_ragged, share=share_a),
            _Operand(name="b", arg=view.b_arg, k_first=True, k_fastest=not view.b_n_fastest, origin="n0", bound="N",
                     tile_ragged=bool(view.n % bn), k_ragged=k_ragged, share=share_b))


def _chunk_loads(view: GemmView, lay: _Layout, bi: str, threads: int, k0: str) -> list[str]:
    """This thread's share of the A and B chunk at ``k0`` into a_next / b_next (zero outside the
    problem); bounds are tested only on the axes the tiles do not divide."""
    lines: list[str] = []
    for op in _operands(view, lay, threads):
        for step in range(op.share.count):
            tile, k = op.coords(step)
            tests = op.in_load_order(f"{op.origin} + {tile} < {op.bound}" if op.tile_ragged else None,
                                     f"{k0} + {k} < K" if op.k_ragged else None)
            first, second = op.in_load_order(f"{op.origin} + {tile}", f"{k0} + {k}")
            lines += _guarded(f"{op.name}_next[{step}]", f"load_{op.name}({op.arg}, {bi}{first}, {second})",
                              [op.share.guard(step), *tests])
    return lines


def _guarded(target: str, value: str, tests: list[str | None]) -> list[str]:
    tests = [t for t in tests if t]
    if not tests:
        return [f"{target} = {value}"]
    return [f"{target} = DTYPE(0)", f"if {' and '.join(tests)}:", f"    {target} = {value}"]


def _chunk_stores(view: GemmView, lay: _Layout, threads: int, buffer: str) -> list[str]:
    """a_next / b_next into the tiles' rows ``buffer + k`` (buffer 0 or BK)."""
    lines: list[str] = []
    for op in _operands(view, lay, threads):
        for step in range(op.share.count):
            tile, k = op.coords(step)
            store = f"{op.name}_tile[{buffer} + {k}, {tile}] = {op.name}_next[{step}]"
            guard = op.share.guard(step)
            lines += [f"if {guard}:", "    " + store] if guard else [store]
    return lines


def _shared_steps(view: GemmView, lay: _Layout, bi: str, unroll: int, threads: int) -> list[str]:
    """Double-buffered: chunk t is read from rows ``cur`` to ``cur + BK`` of the tiles while chunk
    t + 1 goes from registers into the other buffer, so one barrier per chunk suffices."""
    lines = ["# the first chunk: global memory -> registers -> buffer 0"]
    lines += _chunk_loads(view, lay, bi, threads, "0")
    lines += _chunk_stores(view, lay, threads, "0")
    lines += [
        "cuda.syncthreads()",
        f"for chunk in range({ceil_div(view.k, lay.bk)}):",
        "    k0 = chunk * BK",
        "    # first row of the buffer this chunk reads, and of the other one (& 1 tells the compiler",
        "    # they are not negative, so that every tile read is a constant offset from one address)",
        "    cur = (chunk & 1) * BK",
        "    other = ((chunk + 1) & 1) * BK",
        "    more = k0 + BK < K",
        "    if more:  # the next chunk's reads from global memory overlap this chunk's arithmetic",
        "        k1 = k0 + BK",
        *indent(_chunk_loads(view, lay, bi, threads, "k1"), 8),
    ]
    a_expr, b_expr = "a_tile[cur + {k}, {{}}]", "b_tile[cur + {k}, {{}}]"
    if unroll == lay.bk:
        steps = [str(u) for u in range(unroll)]
        lines += ["    # k = k0 + kk for kk in range(BK), written out (UNROLL_K = BK)"]
        prefix, depth = [], 4
    else:
        steps = ["kk"] + [f"kk + {u}" for u in range(1, unroll)]
        prefix, depth = ["    for kk in range(0, BK, UNROLL_K):  # BK is a multiple of UNROLL_K"], 8
    lines += prefix
    for u, k in enumerate(steps):
        lines += [" " * depth + f"# k = k0 + kk + {u}" if u else " " * depth + "# k = k0 + kk"]
        lines += indent(_rank1_update(a_expr.format(k=k), b_expr.format(k=k)), depth)
    lines += [
        "    if more:  # into the other buffer, which nobody reads now: the last barrier saw its readers done",
        *indent(_chunk_stores(view, lay, threads, "other"), 8),
        "    cuda.syncthreads()",
    ]
    return lines


def _global_steps(view: GemmView, a_name: str, b_name: str, bi: str, unroll: int) -> list[str]:
    lines = [
        "for i in range(RM):",
        f"    rows[i] = min(m0 + {_ROW}, M - 1)",
        "for j in range(RN):",
        f"    cols[j] = min(n0 + {_COL}, N - 1)",
    ]

    def step(k: str) -> list[str]:
        return [
            "for i in range(RM):",
            f"    a_reg[i] = load_a({a_name}, {bi}rows[i], {k})",
            "for j in range(RN):",
            f"    b_reg[j] = load_b({b_name}, {bi}{k}, cols[j])",
            "for i in range(RM):",
            "    for j in range(RN):",
            "        acc[i, j] += a_reg[i] * b_reg[j]",
        ]

    if unroll == 1:
        lines += ["for k in range(K):"] + indent(step("k"), 4)
        return lines
    k_main = view.k - view.k % unroll
    lines += [f"for k in range(0, {k_main}, UNROLL_K):  # K rounded down to a multiple of UNROLL_K"]
    for u in range(unroll):
        lines += [f"    # k = k0 + kk + {u}"] if u else []
        lines += indent(step("k" if u == 0 else f"k + {u}"), 4)
    if k_main < view.k:
        lines += [f"for k in range({k_main}, K):  # the remainder"] + indent(step("k"), 4)
    return lines
