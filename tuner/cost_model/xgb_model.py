"""An XGBoost cost model that ranks configs (higher score = expected faster)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

OBJECTIVES = ("rank:pairwise", "rank:ndcg", "reg:squarederror")
# Relevance grades for rank:ndcg by rank quantile within a group: the top matters most.
_NDCG_QUANTILES = (0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75)


class XGBCostModel:
    """Trained on measured costs; failed configs are ranked below every success of their group.

    ``objective`` is ``rank:pairwise`` (default: only the order matters, which is what search
    needs), ``rank:ndcg`` (graded by rank quantile, so the fastest configs weigh most; better where
    good configs are common, worse on the GEMM and convolution replay spaces) or
    ``reg:squarederror`` on -log(cost). ``groups`` (one id per row) keep costs that are
    not comparable apart (other devices, other workloads): rows are only ranked against rows of
    their own group, and for regression each group's labels are relative to its own best.
    ``weights`` (one per row; per group for ranking, where XGBoost weighs groups) make some
    records count less, e.g. those transferred from other workloads.
    """

    def __init__(self, objective: str = "rank:pairwise", rounds: int = 60, seed: int = 0,
                 eta: float = 0.25, max_depth: int = 6, subsample: float = 1.0,
                 colsample: float = 1.0, pair_method: str = "mean", pairs_per_sample: int = 1) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"unsupported objective {objective!r}; choose from {', '.join(OBJECTIVES)}")
        self.objective = objective
        self.rounds = rounds
        self.seed = seed
        self.eta = eta
        self.max_depth = max_depth
        self.subsample = subsample
        self.colsample = colsample
        self.pair_method = pair_method
        self.pairs_per_sample = pairs_per_sample
        self._booster = None  # an xgboost.Booster once trained

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def fit(
        self,
        features: np.ndarray,
        costs: Sequence[float | None],
        groups: Sequence[int] | None = None,
        weights: Sequence[float] | None = None,
    ) -> None:
        features = np.asarray(features, dtype=np.float32)
        costs_arr = np.array([c if c is not None and c > 0 else np.nan for c in costs], dtype=np.float64)
        group_ids = np.zeros(len(costs_arr), dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
        row_weights = np.ones(len(costs_arr)) if weights is None else np.asarray(weights, dtype=np.float64)
        if np.count_nonzero(~np.isnan(costs_arr)) < 2:
            self._booster = None
            return
        order = np.argsort(group_ids, kind="stable")
        features, costs_arr, group_ids, row_weights = features[order], costs_arr[order], group_ids[order], row_weights[order]
        scores = -np.log(costs_arr)
        labels = np.zeros(len(scores))
        starts = np.flatnonzero(np.r_[True, group_ids[1:] != group_ids[:-1]])
        bounds = list(zip(starts, np.r_[starts[1:], len(scores)]))
        for lo, hi in bounds:
            s = scores[lo:hi]
            if np.all(np.isnan(s)):
                labels[lo:hi] = -1.0
                continue
            best, worst = np.nanmax(s), np.nanmin(s)
            # Labels relative to the group's best keep the scale of the problem out of the model;
            # failures sit below the group's slowest success.
            labels[lo:hi] = np.where(np.isnan(s), worst - max(0.5, 0.1 * (best - worst)), s) - best
        if self.objective == "rank:ndcg":
            labels = _grades(labels, bounds)
        import xgboost as xgb  # imported on first training: it takes a quarter second

        matrix = xgb.DMatrix(features, label=labels, missing=np.nan, nthread=1)
        if self.objective.startswith("rank"):
            matrix.set_group([hi - lo for lo, hi in bounds])
            if weights is not None:
                matrix.set_weight([float(row_weights[lo]) for lo, _ in bounds])
        elif weights is not None:
            matrix.set_weight(row_weights)
        params = {
            "objective": self.objective,
            "eta": self.eta,
            "max_depth": self.max_depth,
            "min_child_weight": 1,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample,
            "tree_method": "hist",
            "seed": self.seed,
            "nthread": 1,
            "verbosity": 0,
        }
        if self.objective == "rank:ndcg":
            params["lambdarank_pair_method"] = "topk"
            params["ndcg_exp_gain"] = True
        if self.objective == "rank:pairwise":
            params["lambdarank_pair_method"] = self.pair_method
            params["lambdarank_num_pair_per_sample"] = self.pairs_per_sample
        self._booster = xgb.train(params, matrix, num_boost_round=self.rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self._booster is None:
            raise RuntimeError("cost model is not trained")
        # In-place prediction skips building a DMatrix (the costly part for thousands of rows).
        return self._booster.inplace_predict(np.asarray(features, dtype=np.float32), missing=np.nan)


def _grades(labels: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
    """Integer relevance 0..7 from each group's rank quantiles (higher label = faster)."""
    out = np.zeros(len(labels))
    for lo, hi in bounds:
        part = labels[lo:hi]
        rank = np.argsort(np.argsort(-part, kind="stable"), kind="stable") / max(hi - lo, 1)
        grade = np.zeros(hi - lo)
        for g, q in enumerate(reversed(_NDCG_QUANTILES)):
            grade[rank < q] = g + 1
        out[lo:hi] = grade
    return out
