"""How hard is each replay space for a search strategy? Facts of the space, not of a strategy.

    python bench/space_anatomy.py [--spaces-dir DIR] [--only SUBSTR,...] [--budget 200]

Per Kernel Tuner cache in ``../shared/spaces`` it prints:

* ``valid``: configs that ran; ``>=.99``, ``>=.98``, ``>=.95``: how many reach that fraction of the
  optimum (the size of the target a search must hit);
* ``P(rand)``: the exact probability that random search hits a config >= 0.98 within ``--budget``
  distinct evaluations;
* ``1-knob``: the best fraction among the optimum's valid configs one knob away (any other value
  of one knob). A low value means the optimum is an isolated peak that local steps cannot climb to;
* ``model rank``: the optimum's rank (0 = first) among all configs by the default cost model
  (XGBoost ``rank:pairwise`` on the strategies' features) trained on every other config of the
  space. A high rank means the knob features cannot express the peak even with all the data, so a
  model-guided search finds it only by exploration;
* ``needs``: the mean fraction this space must reach at the budget for its family's mean to be
  0.98 when every other space of the family reaches 1.0 (issue 5's target at 200).

Where ``1-knob`` is low, ``model rank`` is high and ``P(rand)`` is small, the space caps what any
strategy reaches on average: convolution_A100 is such a space (see docs/search.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.cost_model import Featurizer, XGBCostModel  # noqa: E402
from tuner.replay import ReplaySpace, find_cache_files, load_cache, rank_probabilities  # noqa: E402


def anatomy(replay: ReplaySpace, budget: int) -> dict:
    space = replay.space
    configs = list(space.iter_valid())
    costs = [replay.cost(c) for c in configs]
    fractions = np.array([replay.optimum / c if c is not None else 0.0 for c in costs])
    best = int(np.argmax(fractions))
    best_digits = np.array(space.indices(configs[best]))
    digits = np.array([space.indices(c) for c in configs])
    one_knob = (np.count_nonzero(digits != best_digits, axis=1) == 1) & (fractions > 0)
    neighbour_best = float(fractions[one_knob].max()) if np.any(one_knob) else 0.0
    features = Featurizer(space).rows(configs)
    others = np.arange(len(configs)) != best
    model = XGBCostModel()
    model.fit(features[others], [c for c, keep in zip(costs, others) if keep])
    scores = model.predict(features)
    valid = int(np.count_nonzero(fractions > 0))
    near = int(np.count_nonzero(fractions >= 0.98))
    # the best of a random search is one of the ``near`` fastest configs
    p_random = float(rank_probabilities(replay.size, valid, budget)[0][:near].sum())
    return {
        "space": replay.name,
        "family": replay.family,
        "valid": valid,
        "total": replay.size,
        "at_99": int(np.count_nonzero(fractions >= 0.99)),
        "at_98": near,
        "at_95": int(np.count_nonzero(fractions >= 0.95)),
        "p_random": p_random,
        "one_knob": neighbour_best,
        "model_rank": int(np.count_nonzero(scores > scores[best])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spaces-dir", default=str(ROOT.parent / "shared" / "spaces"))
    parser.add_argument("--only", default="", help="comma-separated substrings of space names to keep")
    parser.add_argument("--budget", type=int, default=200)
    args = parser.parse_args()
    files = find_cache_files(args.spaces_dir, args.only.split(","))
    if not files:
        print(f"no Kernel Tuner cache files in {args.spaces_dir}", file=sys.stderr)
        return 1
    rows = [anatomy(load_cache(p), args.budget) for p in files]
    family_size: dict[str, int] = {}
    for row in rows:
        family_size[row["family"]] = family_size.get(row["family"], 0) + 1
    print(f"{'space':<24} {'valid':>11} {'>=.99':>6} {'>=.98':>6} {'>=.95':>6} "
          f"{'P(rand)':>8} {'1-knob':>7} {'model rank':>11} {'needs':>6}")
    for row in rows:
        n = family_size[row["family"]]
        needs = 0.98 * n - (n - 1)  # the others at 1.0
        print(f"{row['space']:<24} {row['valid']:>5}/{row['total']:<5} {row['at_99']:>6} {row['at_98']:>6} "
              f"{row['at_95']:>6} {row['p_random']:>8.3f} {row['one_knob']:>7.3f} "
              f"{row['model_rank']:>5}/{row['valid']:<5} {needs:>6.3f}")
    print(f"\nP(rand): random search hits a config >= 0.98 of the optimum within {args.budget} evaluations;"
          "\n1-knob: best fraction one knob away from the optimum; model rank: the optimum's rank by a"
          "\ncost model trained on every other config; needs: this space's mean for a family mean of 0.98.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
