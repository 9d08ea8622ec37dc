"""Where Kernel Tuner's ``diff_evo`` gets its lead at 25 evaluations: the order of its first picks.

    python bench/diff_evo_start.py [--spaces-dir DIR] [--only GEMM,pnpoly] [--repeats 40] [--take 25]

At 25 evaluations ``diff_evo`` (Kernel Tuner 1.5) is still evaluating its first population: a Latin
hypercube of ``16 x dimensions`` targets over the knobs' value indices
(``Searchspace.get_LHS_sample``), each target snapped to the valid config of least summed index
difference, the *first in the constraint solver's order* on ties (the solver lists GEMM from the
largest MWG, NWG, MDIMC, NDIMC, SA=1, SB=1 down), and the resulting indices deduplicated through a
Python ``set``, which evaluates them in the order of their hashes (index modulo the set's table
size). This script draws the same design (SciPy's ``LatinHypercube``, seeded per repeat) and
prints, per space, the mean fraction of the optimum (± s.e.) of the best of its first ``--take``
configs three ways:

* ``kt``: ties and evaluation order as Kernel Tuner has them;
* ``kt-ties``: Kernel Tuner's ties, the population in random order;
* ``random``: the same targets, ties broken at random and the population in random order.

``kt - random`` is what the solver's order contributes; ``random`` is what the stratified design
itself is worth. Needs the ``bench`` extra (``kernel_tuner``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tuner.replay import find_cache_files  # noqa: E402


def first_picks(index_rows: np.ndarray, sizes: Sequence[int], population: int, take: int,
                seed: int) -> tuple[list[int], list[int], list[int]]:
    """Positions (in the solver's order) of the first ``take`` configs of a ``diff_evo`` start:
    as Kernel Tuner picks them; with its ties but in random order; with ties and order at random."""
    from scipy.stats.qmc import LatinHypercube

    rng = np.random.default_rng(seed)
    targets = LatinHypercube(len(sizes), seed=seed).integers(
        l_bounds=[0] * len(sizes), u_bounds=[s - 1 for s in sizes], n=population, endpoint=True)
    first, randomly = [], []
    for target in targets:
        distance = np.abs(index_rows - target).sum(axis=1)
        ties = np.flatnonzero(distance == distance.min())
        first.append(int(ties[0]))
        randomly.append(int(rng.choice(ties)))
    kt_order = list(set(first))[:take]  # what Kernel Tuner evaluates first
    kt_ties = list(dict.fromkeys(first))
    rng.shuffle(kt_ties)
    shuffled = list(dict.fromkeys(randomly))
    rng.shuffle(shuffled)
    return kt_order, kt_ties[:take], shuffled[:take]


def space_rows(path: Path) -> tuple[str, np.ndarray, list[int], np.ndarray, float]:
    """(name, value-index rows in the solver's order, knob sizes, times (inf: failed), optimum)."""
    from peers_search import kernel_tuner_space

    kt = kernel_tuner_space(str(path))
    searchspace = kt.searchspace()
    values = list(kt.tune_params.values())
    rows = np.array([[v.index(x) for v, x in zip(values, config)] for config in searchspace.list], dtype=np.int64)
    times = np.full(len(rows), np.inf)
    for i, config in enumerate(searchspace.list):
        entry = kt.cache.get(",".join(str(v) for v in config), {})
        t = entry.get("time")
        if "__error__" not in entry and isinstance(t, (int, float)):
            times[i] = float(t)
    name = Path(path).name.split(".")[0]
    return name, rows, [len(v) for v in values], times, float(times.min())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spaces-dir", default=str(ROOT.parent / "shared" / "spaces"))
    parser.add_argument("--only", default="", help="comma-separated substrings of space names to keep")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--take", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        import kernel_tuner  # noqa: F401
    except ImportError:
        print("kernel_tuner is not installed: pip install 'tunefleet[bench]'", file=sys.stderr)
        return 2
    files = find_cache_files(Path(args.spaces_dir), args.only.split(","))
    if not files:
        print(f"no Kernel Tuner cache files in {args.spaces_dir}", file=sys.stderr)
        return 1
    print(f"best of the first {args.take} configs of a diff_evo start, {args.repeats} repeats (seeds 0..)")
    for path in files:
        name, rows, sizes, times, optimum = space_rows(path)
        population = 16 * sum(s > 1 for s in sizes)
        found: dict[str, list[float]] = {"kt": [], "kt-ties": [], "random": []}
        for seed in range(args.repeats):
            for label, picks in zip(found, first_picks(rows, sizes, population, args.take, seed)):
                best = times[picks].min()
                found[label].append(optimum / best if math.isfinite(best) else 0.0)
        cells = "  ".join(f"{label} {np.mean(v):.3f} ± {np.std(v, ddof=1) / math.sqrt(len(v)):.3f}"
                          for label, v in found.items())
        print(f"{name:24s} population {population:4d}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
