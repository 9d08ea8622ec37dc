"""Model-guided search (AutoTVM's XGBTuner): measure, fit a ranking model, anneal over it.

After ``initial_random`` random configs, every batch is chosen by simulated annealing over the
cost model's scores, started from the best measured configs and random points, with a share
``epsilon`` of uniformly random picks so the model keeps seeing unexplored regions.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace
from tuner.cost_model import XGBCostModel, config_features
from tuner.search.base import Observation, SearchStrategy


class XGBSearch(SearchStrategy):
    def __init__(
        self,
        space: ConfigSpace,
        seed: int = 0,
        initial_random: int = 16,
        epsilon: float = 0.05,
        objective: str = "rank:pairwise",
        anneal_chains: int = 128,
        anneal_steps: int = 40,
    ) -> None:
        super().__init__(space, seed)
        self.initial_random = initial_random
        self.epsilon = epsilon
        self.anneal_chains = anneal_chains
        self.anneal_steps = anneal_steps
        self.model = XGBCostModel(objective=objective, seed=seed)
        self._observed: list[Observation] = []
        self._model_size = 0

    def observe(self, observations: Sequence[Observation]) -> None:
        super().observe(observations)
        self._observed.extend(observations)

    def propose(self, n: int) -> list[Config]:
        ok = sum(1 for o in self._observed if o.cost is not None)
        if len(self._observed) < self.initial_random or ok < 2:
            return self.random_new(n)
        if self._model_size != len(self._observed):
            configs = [o.config for o in self._observed]
            self.model.fit(config_features(self.space, configs), [o.cost for o in self._observed])
            self._model_size = len(self._observed)
        n_random = int(self.rng.binomial(n, self.epsilon)) if n > 1 else 0
        picks = self._best_by_model(n - n_random)
        return picks + self.random_new(n - len(picks))

    def _score(self, configs: list[Config]) -> np.ndarray:
        return self.model.predict(config_features(self.space, configs))

    def _best_by_model(self, n: int) -> list[Config]:
        """Simulated annealing over the model; returns the ``n`` best-scored new configs."""
        if n <= 0:
            return []
        measured = sorted((o for o in self._observed if o.cost is not None), key=lambda o: o.cost)
        starts = [o.config for o in measured[: self.anneal_chains // 2]]
        starts += self.space.sample(self.rng, self.anneal_chains - len(starts))
        points = starts
        scores = self._score(points)
        candidates: dict[str, tuple[float, Config]] = {}

        def remember(configs: list[Config], values: np.ndarray) -> None:
            for config, value in zip(configs, values):
                if self.is_new(config):
                    candidates[config.digest] = (float(value), config)

        remember(points, scores)
        temperature = 1.0
        for _ in range(self.anneal_steps):
            moved = [self.space.mutate(p, self.rng, knobs_to_change=1 + int(self.rng.integers(2))) for p in points]
            moved_scores = self._score(moved)
            remember(moved, moved_scores)
            spread = float(np.std(scores)) or 1.0
            accept = (moved_scores >= scores) | (
                self.rng.random(len(points)) < np.exp(np.minimum(0.0, (moved_scores - scores) / (spread * temperature)))
            )
            points = [m if a else p for p, m, a in zip(points, moved, accept)]
            scores = np.where(accept, moved_scores, scores)
            temperature = max(0.05, temperature * 0.9)
        ranked = sorted(candidates.values(), key=lambda item: -item[0])
        picks: list[Config] = []
        for _, config in ranked:
            if len(picks) >= n:
                break
            if self.claim(config):
                picks.append(config)
        return picks
