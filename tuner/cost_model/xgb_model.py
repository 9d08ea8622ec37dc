"""An XGBoost cost model that ranks configs (higher score = expected faster)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xgboost as xgb


class XGBCostModel:
    """Trained on measured costs; failed configs are ranked below every success.

    ``objective`` is ``rank:pairwise`` (default: only the order matters, which is what search
    needs) or ``reg:squarederror`` on -log(cost).
    """

    def __init__(self, objective: str = "rank:pairwise", rounds: int = 60, seed: int = 0) -> None:
        if objective not in ("rank:pairwise", "reg:squarederror"):
            raise ValueError(f"unsupported objective {objective!r}")
        self.objective = objective
        self.rounds = rounds
        self.seed = seed
        self._booster: xgb.Booster | None = None

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def fit(self, features: np.ndarray, costs: Sequence[float | None]) -> None:
        ok = [c for c in costs if c is not None and c > 0]
        if len(ok) < 2:
            self._booster = None
            return
        scores = np.array([-np.log(c) if c is not None and c > 0 else np.nan for c in costs])
        worst = np.nanmin(scores) - 1.0
        labels = np.where(np.isnan(scores), worst, scores)
        # Labels relative to the best keep the scale of the problem out of the model.
        labels = labels - labels.max()
        matrix = xgb.DMatrix(features, label=labels)
        if self.objective.startswith("rank"):
            matrix.set_group([len(labels)])
        params = {
            "objective": self.objective,
            "eta": 0.25,
            "max_depth": 6,
            "min_child_weight": 1,
            "subsample": 1.0,
            "seed": self.seed,
            "nthread": 1,
            "verbosity": 0,
        }
        self._booster = xgb.train(params, matrix, num_boost_round=self.rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self._booster is None:
            raise RuntimeError("cost model is not trained")
        return self._booster.predict(xgb.DMatrix(features))
