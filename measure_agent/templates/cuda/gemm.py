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
(``cuda.local.array`` of literal size) at rows ``m0 + ty + i*TY`` and columns ``n0 + tx + j*TX``
(interleaved, so a warp's loads and stores along n are adjacent). With ``shared`` on, each step
stages a BK-long chunk of the reduction of the A and B tiles in shared memory (cooperative,
coalesced loads in the order the operand lies in memory, zero outside the problem), then
``cuda.syncthreads()``, then BK rank-1 updates of the register tile, unrolled ``unroll_k`` times;
with it off, each thread reads its operands straight from global memory (rows and columns clamped
into range; out-of-range results are never stored).

Knobs: ``tile_m`` = (blocks, TY, RM) and ``tile_n`` = (blocks, TX, RN) split the output axes into
blocks, threads and register tiles; ``tile_k`` = BK (only with ``shared``); ``shared``;
``unroll_k``. Configs beyond the device's threads, shared memory or registers per block are pruned,
as are blocks of less than a warp when the tiles allow a warp.
"""

from __future__ import annotations

from dataclasses import dataclass

from measure_agent.device import DeviceInfo
from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cuda.common import (
    ITEMSIZE,
    MAX_GRID_YZ,
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
BK_MIN, BK_MAX = 4, 64
VERSION = "1"


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
        ]
        knobs = [
            tile_m,
            tile_n,
            ChoiceKnob("tile_k", bk_choices),
            BoolKnob("shared"),
            ChoiceKnob("unroll_k", UNROLLS),
        ]
        return ConfigSpace(knobs, constraints)

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        """16 x 16 threads (more along n when m is short), 4 x 4 float32 / 2 x 2 float64 outputs per
        thread, K staged 16 (float32) / 8 (float64) at a time in shared memory, unrolled 4 times;
        smaller tiles when that leaves too few blocks to fill a large GPU, or when the device or
        the problem demands it."""
        view = self.view(workload)
        bk_wanted = 16 if workload.dtype == "float32" else 8
        bks = space.knob("tile_k").values
        bk = max([v for v in bks if v <= bk_wanted] or [bks[0]])

        def candidate(threads_y: int, threads: int, r: int, shared: bool) -> dict:
            tm = pick_split(space.knob("tile_m"), threads_y, r)
            tn = pick_split(space.knob("tile_n"), min(64, max(1, threads // tm[1])), r)
            k = bk if shared else bks[0]
            return {"tile_m": tm, "tile_n": tn, "tile_k": k, "shared": shared, "unroll_k": min(4, k) if shared else 1}

        def blocks(values: dict) -> int:
            return values["tile_m"][0] * values["tile_n"][0] * view.batch

        regs = (4, 2, 1) if workload.dtype == "float32" else (2, 1)
        preferences = [candidate(ty, threads, r, shared) for shared in (True, False)
                       for threads, ty in ((256, 16), (128, 8), (64, 8), (32, 4)) for r in regs]
        return choose_default(space, preferences, blocks)

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
        }

    def _check(self, workload: Workload) -> None:
        if workload.op != self.op:
            raise ValueError(f"{type(self).__name__} renders {self.op}, not {workload.op}")
        if workload.dtype not in ITEMSIZE:
            raise ValueError(f"{type(self).__name__} supports float32 and float64, not {workload.dtype}")


def _shared_bytes(tile_m, tile_n, bk: int, shared: bool, dtype: str) -> int:
    if not shared:
        return 0
    bm, bn = tile_m[1] * tile_m[2], tile_n[1] * tile_n[2]
    return (bk * (bm + 1) + bk * bn) * ITEMSIZE[dtype]


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


def _render(template: GemmCudaTemplate, workload: Workload, view: GemmView, config: Config) -> str:
    _, ty, rm = config["tile_m"]
    _, tx, rn = config["tile_n"]
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
    emit("# register tile of outputs at rows m0 + ty + i*TY and columns n0 + tx + j*TX.")
    if shared:
        emit("# Each step stages BK of the reduction of both operand tiles in shared memory.")
    else:
        emit("# Operands are read straight from global memory (no shared-memory staging).")
    emit("from numba import cuda, " + ("float32" if dtype == "float32" else "float64") + ("" if shared else ", int64"))
    emit("")
    emit(f"DTYPE = {dtype}")
    emit(f"M, N, K = {view.m}, {view.n}, {view.k}  # out is M x N; K is the reduction")
    if batched:
        emit(f"BATCH = {view.batch}")
    emit(f"TX, TY = {tx}, {ty}  # threads per block along n (x) and m (y)")
    emit(f"RM, RN = {rm}, {rn}  # register tile: outputs per thread along m and n")
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
    emit("@cuda.jit(cache=True)")
    emit(f"def kernel({first}, {second}, out):")
    body: list[str] = [
        "tx = cuda.threadIdx.x",
        "ty = cuda.threadIdx.y",
        "n0 = cuda.blockIdx.x * BN",
    ]
    if shared:
        body += [
            "tid = ty * TX + tx",
            f"a_tile = cuda.shared.array(({bk}, {bm + 1}), DTYPE)  # (BK, BM + 1): A chunk, transposed; "
            "+1 against bank conflicts",
            f"b_tile = cuda.shared.array(({bk}, {bn}), DTYPE)  # (BK, BN)",
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
        loop += _shared_steps(view, a_name, b_name, bi, unroll)
    else:
        loop += _global_steps(view, a_name, b_name, bi, unroll)
    loop += [
        "for i in range(RM):",
        "    m = m0 + ty + i * TY",
        "    if m < M:",
        "        for j in range(RN):",
        "            n = n0 + tx + j * TX",
        "            if n < N:",
        f"                store(out, {bi}m, n, acc[i, j])",
    ]
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


def _rank1_update(a_expr: str, b_expr: str) -> list[str]:
    return [
        "for i in range(RM):",
        f"    a_reg[i] = {a_expr}",
        "for j in range(RN):",
        f"    b_reg[j] = {b_expr}",
        "for i in range(RM):",
        "    for j in range(RN):",
        "        acc[i, j] += a_reg[i] * b_reg[j]",
    ]


def _shared_steps(view: GemmView, a_name: str, b_name: str, bi: str, unroll: int) -> list[str]:
    if view.a_k_fastest:
        a_rc = ["r = e // BK", "c = e % BK"]
    else:
        a_rc = ["r = e % BM", "c = e // BM"]
    if view.b_n_fastest:
        b_cj = ["c = e // BN", "j = e % BN"]
    else:
        b_cj = ["c = e % BK", "j = e // BK"]
    lines = [
        "for k0 in range(0, K, BK):",
        "    # stage a[m0:m0+BM, k0:k0+BK] (transposed) and b[k0:k0+BK, n0:n0+BN]; zero outside",
        "    for step in range(A_LOADS):",
        "        e = tid + step * THREADS",
        "        if e < BM * BK:",
        *indent(a_rc, 12),
        "            m = m0 + r",
        "            k = k0 + c",
        "            v = DTYPE(0)",
        "            if m < M and k < K:",
        f"                v = load_a({a_name}, {bi}m, k)",
        "            a_tile[c, r] = v",
        "    for step in range(B_LOADS):",
        "        e = tid + step * THREADS",
        "        if e < BK * BN:",
        *indent(b_cj, 12),
        "            k = k0 + c",
        "            n = n0 + j",
        "            v = DTYPE(0)",
        "            if k < K and n < N:",
        f"                v = load_b({b_name}, {bi}k, n)",
        "            b_tile[c, j] = v",
        "    cuda.syncthreads()",
    ]
    if unroll == 1:
        lines += ["    for kk in range(BK):"]
        lines += indent(_rank1_update("a_tile[kk, ty + i * TY]", "b_tile[kk, tx + j * TX]"), 8)
    else:
        lines += ["    for kk in range(0, BK, UNROLL_K):  # BK is a multiple of UNROLL_K"]
        for u in range(unroll):
            kk = "kk" if u == 0 else f"kk + {u}"
            lines += [f"        # k = k0 + {kk}"]
            lines += indent(_rank1_update(f"a_tile[{kk}, ty + i * TY]", f"b_tile[{kk}, tx + j * TX]"), 8)
    lines += ["    cuda.syncthreads()  # before the next chunk overwrites the tiles"]
    return lines


def _global_steps(view: GemmView, a_name: str, b_name: str, bi: str, unroll: int) -> list[str]:
    lines = [
        "for i in range(RM):",
        "    rows[i] = min(m0 + ty + i * TY, M - 1)",
        "for j in range(RN):",
        "    cols[j] = min(n0 + tx + j * TX, N - 1)",
    ]

    def step(k: str) -> list[str]:
        return _rank1_update(f"load_a({a_name}, {bi}rows[i], {k})", f"load_b({b_name}, {bi}{k}, cols[j])")

    if unroll == 1:
        lines += ["for k in range(K):"] + indent(step("k"), 4)
        return lines
    k_main = view.k - view.k % unroll
    lines += [f"for k in range(0, {k_main}, UNROLL_K):  # K rounded down to a multiple of UNROLL_K"]
    for u in range(unroll):
        lines += indent(step("k" if u == 0 else f"k + {u}"), 4)
    if k_main < view.k:
        lines += [f"for k in range({k_main}, K):  # the remainder"] + indent(step("k"), 4)
    return lines
