"""Time hand-picked matmul configs directly (no search), side by side with numpy and torch, and
report the machine code of each kernel's hottest loop (``inspect_asm``).

    python bench/matmul_probe.py --size 512 --configs default 'mr=8,nr=32,mc=64,nc=512'
        [--rounds 3] [--asm] [--threads 2]

A config spec is ``default`` or ``key=value`` pairs over the default config: mr, nr, mc, nc (rows /
columns: MC and NC in elements), kc, order (n_outer/m_outer), unroll, pack_a, pack_b (0/1),
parallel (0/1), axis (the parallel axis, m/n). Specs outside the template's constraints are rendered anyway (marked ``!``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure_agent.engine.runtime import KernelRuntime  # noqa: E402

KernelRuntime.resolve().apply()  # the workers' settings, before numba is imported (malloc thresholds too)

import numpy as np  # noqa: E402

from measure_agent.device import detect_device  # noqa: E402
from measure_agent.engine.build import compile_kernel, kernel_assembly, load_kernel  # noqa: E402
from measure_agent.space import ConfigError  # noqa: E402
from measure_agent.templates import default_catalog  # noqa: E402
from measure_agent.workload import parse_workload  # noqa: E402


def make_config(space, default, spec: str):
    values = default.as_dict()
    if spec != "default":
        for item in spec.split(","):
            key, value = item.split("=")
            v = value
            if key == "mr":
                values["tile_m"] = (values["tile_m"][0], max(1, values["tile_m"][1] * values["tile_m"][2] // int(v)), int(v))
            elif key == "nr":
                values["tile_n"] = (values["tile_n"][0], max(1, values["tile_n"][1] * values["tile_n"][2] // int(v)), int(v))
            elif key == "mc":
                values["tile_m"] = (values["tile_m"][0], max(1, int(v) // values["tile_m"][2]), values["tile_m"][2])
            elif key == "nc":
                values["tile_n"] = (values["tile_n"][0], max(1, int(v) // values["tile_n"][2]), values["tile_n"][2])
            elif key == "kc":
                values["kc"] = int(v)
            elif key == "order":
                values["loop_order"] = v
            elif key == "unroll":
                values["unroll_k"] = int(v)
            elif key == "axis":
                values["parallel_axis"] = v
            elif key in ("pack_a", "pack_b", "parallel"):
                values[key] = bool(int(v))
            else:
                raise SystemExit(f"unknown key {key}")
    try:
        return space.make(values), True
    except ConfigError:
        return space._config_unchecked(values), False


def asm_report(asm: str) -> str:
    """Instruction mix of the basic block with the most zmm FMAs (the micro-kernel's k loop)."""
    blocks, current = [], []
    for line in asm.splitlines():
        s = line.strip()
        if re.match(r"^\.?[A-Za-z_$][\w$.]*:", s) or s.startswith(".LBB"):
            blocks.append(current)
            current = []
        elif s and not s.startswith(".") and not s.startswith("#"):
            current.append(s)
    blocks.append(current)
    fma = lambda i: i.startswith("vfmadd") or i.startswith("vfnmadd")
    best = max(blocks, key=lambda b: sum(1 for i in b if fma(i) and "zmm" in i))
    n_fma = sum(1 for i in best if fma(i) and "zmm" in i)
    n_fma_y = sum(1 for i in best if fma(i) and "ymm" in i)
    bcast = sum(1 for i in best if i.startswith("vbroadcastss") or ("{1to16}" in i))
    bcast_fused = sum(1 for i in best if fma(i) and "{1to16}" in i)
    loads = sum(1 for i in best if i.startswith("vmovups") and "(" in i.split(",")[0])
    fma_mem = sum(1 for i in best if fma(i) and "(" in i and "{1to16}" not in i)
    spills = sum(1 for i in best if "rsp" in i and ("zmm" in i or "ymm" in i))
    total_fma_zmm = sum(1 for l in asm.splitlines() if fma(l.strip()) and "zmm" in l)
    scalar = sum(1 for l in asm.splitlines() if re.match(r"\s*vfn?madd\w*ss", l))
    return (f"hot block: {len(best)} instrs, {n_fma} zmm FMA ({n_fma_y} ymm), {bcast} broadcasts "
            f"({bcast_fused} fused {{1to16}}), {loads} zmm loads + {fma_mem} FMA memory operands, "
            f"{spills} stack (rsp) vector accesses; whole kernel: {total_fma_zmm} zmm FMA, {scalar} scalar FMA")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--configs", nargs="+", default=["default"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--asm", action="store_true")
    p.add_argument("--dump", help="write the hot block of each kernel here (directory)")
    p.add_argument("--torch", action="store_true")
    args = p.parse_args()
    n = args.size
    device = detect_device()
    workload = parse_workload(f"matmul(M={n},N={n},K={n})")
    template = default_catalog().get("matmul", "cpu")
    space = template.space(workload, device)
    default = template.default_config(workload, space)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    cache = Path(tempfile.mkdtemp(prefix="tunefleet-probe-"))
    entries = []
    for spec in args.configs:
        config, valid = make_config(space, default, spec)
        source = template.render(workload, config)
        kernel = load_kernel(source, cache)
        out = np.zeros((n, n), np.float32)
        t0 = time.perf_counter()
        compile_kernel(kernel, (a, b, out) + tuple(source.runtime_args))
        ct = time.perf_counter() - t0
        kernel(a, b, out, *source.runtime_args)
        err = float(np.abs(out - ref).max())
        label = spec + ("" if valid else " !")
        mc, nc, kc = source.runtime_args
        desc = f"axis={config.get('parallel_axis')} MR={config['tile_m'][2]} NR={config['tile_n'][2]} MC={mc} NC={nc} KC={kc} {config['loop_order']} u{config['unroll_k']} pa={int(config['pack_a'])} pb={int(config['pack_b'])} par={int(config['parallel'])}"
        print(f"{label}: {desc}  compile {ct:.1f}s  max err {err:.1e}", flush=True)
        if args.asm:
            asm = kernel_assembly(kernel, source)
            # a parallel kernel's loops are outlined into gufuncs: inspect_asm holds them too
            print("   ", asm_report(asm), flush=True)
        entries.append((label, kernel, source.runtime_args, out))
    timers = [("numpy", lambda: a @ b)]
    if args.torch:
        import torch
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        timers.append(("torch", lambda: ta @ tb))
    for label, kernel, rargs, out in entries:
        timers.append((label, lambda k=kernel, r=rargs, o=out: k(a, b, o, *r)))
    best = {name: float("inf") for name, _ in timers}
    for _ in range(args.rounds):
        for name, fn in timers:
            fn()
            for _ in range(5):
                start = time.perf_counter()
                count = 0
                while True:
                    fn()
                    count += 1
                    el = time.perf_counter() - start
                    if el > 0.03:
                        break
                best[name] = min(best[name], el / count)
    flops = 2 * n**3
    print(f"\nmatmul {n}^3 float32, GFLOPS (best of {args.rounds} interleaved rounds)")
    for name, _ in timers:
        print(f"  {flops / best[name] / 1e9:7.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
