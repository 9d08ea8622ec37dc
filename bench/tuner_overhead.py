"""Tuner overhead: seconds to propose a batch of 64 configs with 10,000 results observed.

    python bench/tuner_overhead.py [--records 10000] [--batch 64] [--strategy default] [--repeats 3]

Three spaces: a replayed GEMM space (enumerable: every unmeasured config is scored), the matmul
CPU template's space for a 1024^3 workload, and a user-defined space of about 10^11 configs (both
searched by annealing over the model). Observing is not timed; each propose retrains the model on
everything observed (capped by the strategy's ``max_train``), as in a real job after every batch.
Target: <= 1 s per propose(64) at 10,000 records.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.search import Observation, make_strategy  # noqa: E402

SPACES_DIR = ROOT.parent / "shared" / "spaces"


def replay_case():
    from tuner.replay import load_cache

    path = Path(SPACES_DIR) / "GEMM_A100.json.gz"
    if not path.exists():
        return None
    replay = load_cache(path)
    return "GEMM_A100 replay (17,956 configs, enumerated)", replay.space, lambda c: (replay.cost(c) or math.nan) / 1e3


def matmul_case():
    from measure_agent.templates import default_catalog
    from measure_agent.workload import parse_workload

    workload = parse_workload("matmul(M=1024,N=1024,K=1024)")
    catalog = default_catalog()
    space = catalog.get("matmul", "cpu").space(workload)

    def cost(c):
        _, mc, mr = c["tile_m"]
        _, nc, nr = c["tile_n"]
        return 1e-3 * (1 + abs(math.log2(mr * nr) - 5) + abs(math.log2(mc * nc) - 6) / 4 + (not c["parallel"]))

    return f"matmul CPU template, 1024^3 ({space.size:,} configs, annealing)", space, cost


def user_case():
    from tuner.user_space import UserSpace

    params = {f"p{i}": [1, 2, 4, 8, 16, 32, 64, 128] for i in range(12)}
    space = UserSpace(params, ["p0 * p1 <= 512", "p2 >= p3", lambda p4, p5: p4 != p5])
    return (f"user space ({space.size:.2e} configs, annealing)", space.space,
            lambda c: 1e-3 * (1 + sum(abs(math.log2(v) - 3) for _, v in c.items)))


def measure(label, space, cost, records, batch, strategy, repeats):
    rng = np.random.default_rng(0)
    history = []
    seen = set()
    while len(history) < records:
        for config in space.sample(rng, records - len(history)):
            if config.digest not in seen:
                seen.add(config.digest)
                history.append(config)
            if len(history) >= records:
                break
        if len(seen) >= getattr(space, "size", math.inf):
            break
    observations = []
    for c in history:
        value = cost(c)
        observations.append(Observation(c, None if value != value else value))
    times = []
    for r in range(repeats):
        search = make_strategy(strategy, space, seed=r)
        search.observe(observations[:-batch])
        search.propose(8)  # warms caches (feature table, enumeration) that a job fills once
        search.observe(observations[-batch:])  # new results: the timed propose retrains on all of them
        start = time.perf_counter()
        picks = search.propose(batch)
        times.append(time.perf_counter() - start)
        assert len(picks) == batch and len({c.digest for c in picks}) == batch
    print(f"{label}: propose({batch}) with {len(observations):,} observed: "
          f"median {statistics.median(times):.3f} s, max {max(times):.3f} s over {repeats}")
    return statistics.median(times)


def main() -> int:
    global SPACES_DIR
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--strategy", default="default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spaces-dir", default=str(SPACES_DIR), help="the replay spaces (GEMM_A100.json.gz)")
    args = parser.parse_args()
    SPACES_DIR = Path(args.spaces_dir)
    worst = 0.0
    for make in (replay_case, matmul_case, user_case):
        case = make()
        if case is None:
            print(f"skipped {make.__name__}: {SPACES_DIR} not found")
            continue
        worst = max(worst, measure(*case, args.records, args.batch, args.strategy, args.repeats))
    print(f"worst median: {worst:.3f} s (target <= 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
