"""Dense layers: chosen configs (or every config of a small list) vs BLAS ``X @ W.T``, timed
interleaved in one process (best of rounds), same thread count on both sides.

    python bench/dense_gemv.py                          # r50_fc and mv2_fc shapes, default + candidates
    python bench/dense_gemv.py --workloads "dense(M=1,N=1000,K=2048)" --rounds 30
    python bench/dense_gemv.py --copy                   # also a numpy copy of W: the memory roofline

Each config's kernel is built through the engine's disk cache (a temporary directory) with the
workers' settings. Also prints, per workload, the bytes of W streamed per second by each kernel and
by a ``np.copyto`` of W (read + write), for the roofline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

from measure_agent.engine.runtime import KernelRuntime  # noqa: E402

KernelRuntime.resolve().apply()  # the workers' settings, before numba is imported (malloc thresholds too)

import numpy as np  # noqa: E402

from measure_agent.device import detect_device  # noqa: E402
from measure_agent.engine.build import load_kernel  # noqa: E402
from measure_agent.engine.checking import check_output, make_problem  # noqa: E402
from measure_agent.templates import default_catalog  # noqa: E402
from measure_agent.workload import parse_workload  # noqa: E402
from ops_cpu import SETTLE_S, time_block  # noqa: E402

WORKLOADS = ("dense(M=1,N=1000,K=2048)", "dense(M=1,N=1000,K=1280)")


def candidates(template, workload, space):
    """The default; for matrix-vector shapes (M <= 2) also the reduction-vectorised kernels a GEMV
    should be (2-12 rows of W per tile sharing the loads of x, one or two vectors of lanes, serial
    and parallel); then any configs given as a JSON list of knob values in DENSE_CONFIGS."""
    default = template.default_config(workload, space)
    out = {"default": default}
    wanted = []
    if workload["M"] <= 2:
        for nr, lanes_x in ((8, 1), (4, 2), (12, 1), (4, 1), (2, 2)):
            for parallel in (True, False):
                wanted.append({"vector_axis": "k", "tile_n": nr, "k_lanes": lanes_x, "parallel": parallel})
    extra = os.environ.get("DENSE_CONFIGS")
    if extra:
        wanted += json.loads(extra)
    lanes = space.knob("k_lanes").values[0]
    for values in wanted:
        values = dict(values)
        if isinstance(values.get("tile_n"), int):  # NR: NC = 8 NR-wide tiles (several work items per thread)
            nr = values["tile_n"]
            tiles = [v for v in space.knob("tile_n").values if v[-1] == nr]
            if not tiles:  # this host's vector width has no such tile (AVX2: no 12 rows)
                print(f"  {nr} rows of W a tile are not in this space")
                continue
            values["tile_n"] = next((v for v in tiles if v[1] == 8), tiles[0])
        if values.get("k_lanes") in (1, 2):
            values["k_lanes"] *= lanes
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        try:
            config = space.make({**dict(default.items), **values})
        except Exception as exc:  # noqa: BLE001 - not in this space: say so, go on
            print(f"  {values} is not in the space: {exc}")
            continue
        if config not in out.values():
            _, _, nr = config["tile_n"]
            label = f"k{nr}x{config['k_lanes']}{'p' if config['parallel'] else 's'}" \
                if config["vector_axis"] == "k" else f"c{len(out)}"
            out[label] = config
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--copy", action="store_true")
    args = parser.parse_args()
    device = detect_device()
    template = default_catalog().get("dense", "cpu")
    print(f"threads: numba {os.environ.get('NUMBA_NUM_THREADS', os.cpu_count())}, "
          f"BLAS {os.environ.get('OPENBLAS_NUM_THREADS', os.cpu_count())}")
    with tempfile.TemporaryDirectory(prefix="dense_gemv-") as tmp:
        for text in args.workloads:
            workload = parse_workload(text)
            space = template.space(workload, device)
            problem = make_problem(workload)
            x, w = problem.inputs
            calls, configs = {}, candidates(template, workload, space)
            for label, config in configs.items():
                source = template.render(workload, config)
                t0 = time.monotonic()
                kernel = load_kernel(source, Path(tmp))
                out = np.full(workload.spec.output_shape(workload.params), np.nan, dtype=workload.dtype)
                cargs = (*problem.inputs, out, *source.runtime_args)
                kernel(*cargs)
                ok = check_output(problem, out).correct
                print(f"  {label}: built in {time.monotonic() - t0:.1f}s, correct={ok}: {config}", flush=True)
                calls[label] = (lambda kernel=kernel, cargs=cargs: kernel(*cargs))
            calls["blas"] = lambda: x @ w.T
            if args.copy:
                dst = np.empty_like(w)
                calls["copy W"] = lambda: np.copyto(dst, w)
            best = {label: float("inf") for label in calls}
            for call in calls.values():
                call()
            for _ in range(args.rounds):
                for label, call in calls.items():
                    time.sleep(SETTLE_S)
                    best[label] = min(best[label], time_block(call))
            print(f"{workload.key}: W {w.nbytes / 1e6:.1f} MB")
            for label, s in sorted(best.items(), key=lambda kv: kv[1]):
                moved = 2 * w.nbytes if label == "copy W" else w.nbytes
                print(f"  {label:<10} {s * 1e6:8.1f} us  {workload.flops / s / 1e9:6.1f} GFLOPS  "
                      f"{moved / s / 1e9:6.1f} GB/s  blas/this {best['blas'] / s:5.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
