"""Depthwise conv2d on CUDA GPUs, NCHW and NHWC: tiled over the output's channels, rows and columns.

``out[image, oc, oh, ow] = sum_{r,s} data[image, oc // MULT, ih, iw] * weight(oc // MULT, oc % MULT, r, s)``
with ``ih = oh*STRIDE_H - PAD_H + r*DIL_H`` and ``iw = ow*STRIDE_W - PAD_W + s*DIL_W`` (zero in the
padding). The reduction is only R x S long and each output channel reads its own input channel, so
the reuse to exploit is between neighbouring outputs' overlapping windows.

A block computes a BC x BH x BW tile of (output channel, row, column) of one image with
TC x TH x TW threads; each thread accumulates an RC x RH x RW register tile (``cuda.local.array``
of literal size) at interleaved positions (channel ``c0 + tc + i*TC``, and so on). Threads are
bound so that threadIdx.x walks the axis that is contiguous in memory: columns for NCHW
(x = ow, y = oh, z = channel), channels for NHWC (x = channel, y = ow, z = oh); images share grid z
with the z-axis tiles. With ``shared`` on, the block first stages the input patch its tile reads
(BC channels x ((BH-1)*STRIDE_H + (R-1)*DIL_H + 1) rows x the same for columns, zero-padded) in
shared memory with coalesced loads, then ``cuda.syncthreads()``; with it off, every product reads
global memory. ``unroll`` unrolls the loop over window columns in the rendered source.

Knobs: ``tile_c``, ``tile_h``, ``tile_w`` = (blocks, threads, register tile) per output axis;
``shared``; ``unroll``. Configs beyond the device's limits (threads, blockDim.z <= 64, shared
memory, registers) are pruned, as are blocks of less than a warp when the tiles allow one.
"""

from __future__ import annotations

from measure_agent.device import DeviceInfo
from measure_agent.space import BoolKnob, Config, ConfigSpace, Constraint, SplitKnob
from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.cuda.common import (
    ITEMSIZE,
    MAX_BLOCK_DIM_Z,
    MAX_GRID_YZ,
    GpuLimits,
    ceil_div,
    choose_default,
    grid_yz,
    indent,
    log2,
    min_threads_wanted,
    pick_split,
    registers_estimate,
)
from measure_agent.workload import Workload
from measure_agent.workload.operators import conv_output_hw

THREADS = {"x": (1, 2, 4, 8, 16, 32, 64), "y": (1, 2, 4, 8, 16, 32), "z": (1, 2, 4, 8, 16)}
REGS = (1, 2, 4)
AXES = ("c", "h", "w")
VERSION = "1"


class _DepthwiseCudaTemplate(Template):
    target = "cuda"
    timed_on_host_cpu = False
    version = VERSION
    layout: str
    binding: dict[str, str]  # grid/thread dimension -> output axis

    def _extents(self, workload: Workload) -> dict[str, int]:
        p = workload.params
        oh, ow = conv_output_hw(p)
        return {"c": p["C"] * p["multiplier"], "h": oh, "w": ow}

    def _dim_of(self, axis: str) -> str:
        return next(dim for dim, a in self.binding.items() if a == axis)

    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        self._check(workload)
        extents = self._extents(workload)
        limits = GpuLimits.of(device)
        splits = {a: SplitKnob(f"tile_{a}", extents[a], (THREADS[self._dim_of(a)], REGS)) for a in AXES}
        z_axis = self.binding["z"]
        min_threads = min_threads_wanted(*splits.values(), limit=limits.max_threads)
        p, dtype = workload.params, workload.dtype

        def fits(tc, th, tw, shared) -> bool:
            tiles = {"c": tc, "h": th, "w": tw}
            return (tiles[z_axis][1] <= MAX_BLOCK_DIM_Z
                    and limits.fits(tc[1] * th[1] * tw[1], _shared_bytes(p, tc, th, tw, shared, dtype),
                                    _registers(tc, th, tw, dtype)))

        constraints = [
            Constraint(("tile_c", "tile_h", "tile_w", "shared"), fits,
                       f"threads, shared memory and registers per block must fit the device "
                       f"({limits.max_threads} threads, {limits.max_shared_bytes} B shared, "
                       f"{limits.max_registers} registers; blockDim.z <= {MAX_BLOCK_DIM_Z})"),
            Constraint(("tile_c", "tile_h", "tile_w"), lambda tc, th, tw: tc[1] * th[1] * tw[1] >= min_threads,
                       f"at least {min_threads} threads per block (a warp, when the tiles allow it)"),
        ]
        knobs = [splits["c"], splits["h"], splits["w"], BoolKnob("shared"), BoolKnob("unroll")]
        return ConfigSpace(knobs, constraints)

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        """A 2 x 2 (rows x columns) register tile, the input patch staged in shared memory, the
        window unrolled; 128 threads along the contiguous axis first: 16 columns x 8 rows (NCHW),
        32 channels x 4 columns (NHWC). Smaller tiles when that leaves too few blocks to fill a
        large GPU, or when the device or the problem demands it."""
        def candidate(threads: dict[str, int], regs: dict[str, int], shared: bool) -> dict:
            values = {f"tile_{a}": pick_split(space.knob(f"tile_{a}"), threads[a], regs[a]) for a in AXES}
            return {**values, "shared": shared, "unroll": True}

        def blocks(values: dict) -> int:
            return workload["N"] * values["tile_c"][0] * values["tile_h"][0] * values["tile_w"][0]

        if self.layout == "nchw":
            wanted = [{"c": 1, "h": 8, "w": 16}, {"c": 1, "h": 4, "w": 16}, {"c": 4, "h": 4, "w": 8},
                      {"c": 8, "h": 4, "w": 4}, {"c": 32, "h": 1, "w": 1}]
        else:
            wanted = [{"c": 32, "h": 1, "w": 4}, {"c": 32, "h": 1, "w": 1}, {"c": 8, "h": 4, "w": 4},
                      {"c": 1, "h": 4, "w": 16}, {"c": 1, "h": 32, "w": 1}]
        regs = [{"c": 1, "h": 2, "w": 2}, {"c": 1, "h": 1, "w": 1}]
        preferences = [candidate(t, r, s) for s in (True, False) for r in regs for t in wanted]
        return choose_default(space, preferences, blocks)

    def render(self, workload: Workload, config: Config) -> KernelSource:
        self._check(workload)
        return KernelSource(text=self._render(workload, config), entry="run", launch="cuda")

    def features(self, workload: Workload, config: Config) -> dict[str, float]:
        """Structural features for the cost model (names shared with the GEMM templates)."""
        extents = self._extents(workload)
        tiles = {a: config[f"tile_{a}"] for a in AXES}
        threads = tiles["c"][1] * tiles["h"][1] * tiles["w"][1]
        per_thread = tiles["c"][2] * tiles["h"][2] * tiles["w"][2]
        blocks = workload["N"]
        padded = 1
        for a in AXES:
            block = tiles[a][1] * tiles[a][2]
            blocks *= ceil_div(extents[a], block)
            padded *= ceil_div(extents[a], block) * block
        p = workload.params
        return {
            "threads": float(threads),
            "outputs_per_thread": float(per_thread),
            "log2_blocks": log2(blocks),
            "shared_bytes": float(_shared_bytes(p, tiles["c"], tiles["h"], tiles["w"], config["shared"],
                                                workload.dtype)),
            "registers_estimate": float(_registers(tiles["c"], tiles["h"], tiles["w"], workload.dtype)),
            "edge_waste": 1.0 - (extents["c"] * extents["h"] * extents["w"]) / padded,
            "window": float(p["R"] * p["S"]),
        }

    def _check(self, workload: Workload) -> None:
        if workload.op != self.op:
            raise ValueError(f"{type(self).__name__} renders {self.op}, not {workload.op}")
        if workload.dtype not in ITEMSIZE:
            raise ValueError(f"{type(self).__name__} supports float32 and float64, not {workload.dtype}")

    # -- rendering ------------------------------------------------------------------------------
    def _render(self, workload: Workload, config: Config) -> str:
        p = workload.params
        oh_size, ow_size = conv_output_hw(p)
        extents = self._extents(workload)
        t = {a: config[f"tile_{a}"][1] for a in AXES}
        r = {a: config[f"tile_{a}"][2] for a in AXES}
        b = {a: t[a] * r[a] for a in AXES}
        tiles = {a: ceil_div(extents[a], b[a]) for a in AXES}
        shared, unroll = config["shared"], config["unroll"]
        ph, pw = _patch(p, b["h"], b["w"])
        threads = t["c"] * t["h"] * t["w"]
        x, y, z = self.binding["x"], self.binding["y"], self.binding["z"]
        nchw = self.layout == "nchw"
        dtype = workload.dtype
        up = {a: a.upper() for a in AXES}

        lines: list[str] = []
        emit = lines.append
        emit(f"# tunefleet {self.op} cuda v{self.version}: {workload.key}")
        emit("# out[image, oc, oh, ow] = sum_{r,s} data[image, oc // MULT, ih, iw] * weight(oc // MULT, oc % MULT, r, s)")
        emit("# with ih = oh*STRIDE_H - PAD_H + r*DIL_H, iw = ow*STRIDE_W - PAD_W + s*DIL_W (zero in the padding)")
        emit(f"# config: {config.json_text()}")
        emit("# A block of TC x TH x TW threads computes a BC x BH x BW tile of (channel, row, column) of one image;")
        emit("# each thread keeps an RC x RH x RW register tile at c0 + tc + i*TC, h0 + th + a*TH, w0 + tw + b*TW.")
        emit(f"# Threads: x = {_AXIS_NAME[x]}, y = {_AXIS_NAME[y]}, z = {_AXIS_NAME[z]}; grid z also walks the images.")
        if shared:
            emit("# The input patch the block reads is staged in shared memory first.")
        emit(f"from numba import cuda, {dtype}")
        emit("")
        emit(f"DTYPE = {dtype}")
        emit(f"IMAGES, CH_IN, H, W = {p['N']}, {p['C']}, {p['H']}, {p['W']}")
        emit(f"MULT, CH_OUT = {p['multiplier']}, {extents['c']}  # output channel oc reads input channel oc // MULT")
        emit(f"R, S = {p['R']}, {p['S']}")
        emit(f"STRIDE_H, STRIDE_W = {p['stride_h']}, {p['stride_w']}")
        emit(f"PAD_H, PAD_W = {p['pad_h']}, {p['pad_w']}")
        emit(f"DIL_H, DIL_W = {p['dilation_h']}, {p['dilation_w']}")
        emit(f"OH, OW = {oh_size}, {ow_size}")
        emit(f"TC, TH, TW = {t['c']}, {t['h']}, {t['w']}  # threads per block along channels, rows, columns")
        emit(f"RC, RH, RW = {r['c']}, {r['h']}, {r['w']}  # register tile per thread")
        emit(f"BC, BH, BW = {b['c']}, {b['h']}, {b['w']}  # block tile")
        emit(f"TILES_C, TILES_H, TILES_W = {tiles['c']}, {tiles['h']}, {tiles['w']}")
        emit(f"THREADS = {threads}")
        if shared:
            size = b["c"] * ph * pw
            emit(f"PATCH_H, PATCH_W = {ph}, {pw}  # input rows and columns a block tile reads")
            emit(f"PATCH_SIZE, PATCH_LOADS = {size}, {ceil_div(size, threads)}  # elements; per thread")
        grid = (tiles[x], grid_yz(tiles[y]), grid_yz(p["N"] * tiles[z]))
        emit(f"GRID = {grid}  # ({x} tiles, {y} tiles, images x {z} tiles); "
             f"the kernel loops when y or z exceed {MAX_GRID_YZ}")
        emit(f"BLOCK = ({t[x]}, {t[y]}, {t[z]})")
        emit("")
        emit("")
        data_index = "image, oc // MULT, ih, iw" if nchw else "image, ih, iw, oc // MULT"
        weight_index = "oc // MULT, oc % MULT, r, s" if nchw else "r, s, oc // MULT, oc % MULT"
        out_index = "image, oc, oh, ow" if nchw else "image, oh, ow, oc"
        emit("@cuda.jit(device=True)")
        emit("def load_x(data, image, oc, ih, iw):")
        emit('    """The input output channel oc reads at (ih, iw); zero in the padding."""')
        emit("    if 0 <= ih < H and 0 <= iw < W:")
        emit(f"        return data[{data_index}]")
        emit("    return DTYPE(0)")
        emit("")
        emit("")
        emit("@cuda.jit(device=True)")
        emit("def load_w(weight, oc, r, s):")
        emit(f"    return weight[{weight_index}]")
        emit("")
        emit("")
        emit("@cuda.jit(cache=True)")
        emit("def kernel(data, weight, out):")
        body = [f"t{a} = cuda.threadIdx.{self._dim_of(a)}" for a in AXES]
        body.append(f"{x}0 = cuda.blockIdx.x * B{up[x]}")
        if shared:
            body.append(f"tid = t{x} + T{up[x]} * (t{y} + T{up[y]} * t{z})")
            shape, names = ((b["c"], ph, pw), "(BC, PATCH_H, PATCH_W)") if nchw else \
                ((ph, pw, b["c"]), "(PATCH_H, PATCH_W, BC)")
            body.append(f"patch = cuda.shared.array({shape}, DTYPE)  # {names}")
        body.append(f"acc = cuda.local.array(({r['c']}, {r['h']}, {r['w']}), DTYPE)  # (RC, RH, RW): the register tile")
        inner: list[str] = [
            f"image = zz // TILES_{up[z]}",
            f"{z}0 = (zz % TILES_{up[z]}) * B{up[z]}",
            "ih0 = h0 * STRIDE_H - PAD_H",
            "iw0 = w0 * STRIDE_W - PAD_W",
        ]
        if shared:
            if nchw:
                decompose = ["cl = e // (PATCH_H * PATCH_W)", "pr = (e // PATCH_W) % PATCH_H", "pc = e % PATCH_W"]
                target = "patch[cl, pr, pc]"
            else:
                decompose = ["pr = e // (PATCH_W * BC)", "pc = (e // BC) % PATCH_W", "cl = e % BC"]
                target = "patch[pr, pc, cl]"
            inner += [
                "for step in range(PATCH_LOADS):  # stage the input patch, coalesced, zero outside",
                "    e = tid + step * THREADS",
                "    if e < PATCH_SIZE:",
                *indent(decompose, 8),
                "        v = DTYPE(0)",
                "        if c0 + cl < CH_OUT:",
                "            v = load_x(data, image, c0 + cl, ih0 + pr, iw0 + pc)",
                f"        {target} = v",
                "cuda.syncthreads()",
            ]
        inner += [
            "for i in range(RC):",
            "    for a in range(RH):",
            "        for b in range(RW):",
            "            acc[i, a, b] = 0",
            "for r in range(R):",
        ]

        def window_step(s: str) -> list[str]:
            row = "(th + a * TH) * STRIDE_H + r * DIL_H"
            col = f"(tw + b * TW) * STRIDE_W + {s} * DIL_W"
            if shared:
                value = f"patch[tc + i * TC, {row}, {col}]" if nchw else f"patch[{row}, {col}, tc + i * TC]"
            else:
                value = f"load_x(data, image, oc, ih0 + {row}, iw0 + {col})"
            return [
                "for i in range(RC):",
                "    oc = min(c0 + tc + i * TC, CH_OUT - 1)  # clamped: results beyond CH_OUT are not stored",
                f"    wv = load_w(weight, oc, r, {s})",
                "    for a in range(RH):",
                "        for b in range(RW):",
                f"            acc[i, a, b] += wv * {value}",
            ]

        if unroll:
            for s in range(p["S"]):
                inner += [f"    # s = {s}"] + indent(window_step(str(s)), 4)
        else:
            inner += ["    for s in range(S):"] + indent(window_step("s"), 8)
        inner += [
            "for i in range(RC):",
            "    oc = c0 + tc + i * TC",
            "    if oc < CH_OUT:",
            "        for a in range(RH):",
            "            oh = h0 + th + a * TH",
            "            if oh < OH:",
            "                for b in range(RW):",
            "                    ow = w0 + tw + b * TW",
            "                    if ow < OW:",
            f"                        out[{out_index}] = acc[i, a, b]",
        ]
        if shared:
            inner += ["cuda.syncthreads()  # before the next tile restages the patch"]
        z_loop = [f"for zz in range(cuda.blockIdx.z, IMAGES * TILES_{up[z]}, cuda.gridDim.z):"] + indent(inner, 4)
        y_loop = [f"for tile_{y} in range(cuda.blockIdx.y, TILES_{up[y]}, cuda.gridDim.y):  "
                  f"# once unless TILES_{up[y]} > 65535",
                  f"    {y}0 = tile_{y} * B{up[y]}"] + indent(z_loop, 4)
        body += y_loop
        lines.extend(indent(body, 4))
        emit("")
        emit("")
        emit("def run(data, weight, out):")
        emit('    """Launch on device arrays; asynchronous (the caller synchronises)."""')
        emit("    kernel[GRID, BLOCK](data, weight, out)")
        emit("")
        emit("")
        emit("run.kernels = (kernel,)  # what the engine compiles at build time (same arguments as run)")
        emit("")
        return "\n".join(lines)


_AXIS_NAME = {"c": "output channels", "h": "output rows", "w": "output columns"}


def _patch(p: dict[str, int], bh: int, bw: int) -> tuple[int, int]:
    ph = (bh - 1) * p["stride_h"] + (p["R"] - 1) * p["dilation_h"] + 1
    pw = (bw - 1) * p["stride_w"] + (p["S"] - 1) * p["dilation_w"] + 1
    return ph, pw


def _shared_bytes(p: dict[str, int], tc, th, tw, shared: bool, dtype: str) -> int:
    if not shared:
        return 0
    ph, pw = _patch(p, th[1] * th[2], tw[1] * tw[2])
    return tc[1] * tc[2] * ph * pw * ITEMSIZE[dtype]


def _registers(tc, th, tw, dtype: str) -> int:
    return registers_estimate(tc[2] * th[2] * tw[2], tc[2] + 2, dtype)


class DepthwiseConv2dNchwCudaTemplate(_DepthwiseCudaTemplate):
    op = "depthwise_conv2d_nchw"
    layout = "nchw"
    binding = {"x": "w", "y": "h", "z": "c"}


class DepthwiseConv2dNhwcCudaTemplate(_DepthwiseCudaTemplate):
    op = "depthwise_conv2d_nhwc"
    layout = "nhwc"
    binding = {"x": "c", "y": "w", "z": "h"}
