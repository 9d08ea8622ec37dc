"""Shared machinery of strategies that work on digit rows (see :mod:`tuner.search.space_index`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace
from tuner.search.base import Observation, SearchStrategy
from tuner.search.space_index import SpaceIndex, space_index


class IndexedStrategy(SearchStrategy):
    """Keeps every observation as a digit row and cost, and a set of seen rows (proposed or
    observed) so that nothing is proposed twice."""

    def __init__(self, space: ConfigSpace, seed: int = 0) -> None:
        super().__init__(space, seed)
        self.index: SpaceIndex = space_index(space)
        self._digits: list[np.ndarray] = []
        self._costs: list[float | None] = []
        self._keys: set[bytes] = set()
        self._best = np.inf
        self._best_row: np.ndarray | None = None
        if self.index.enumerable:
            self._all = self.index.all_digits()
            self._taken = np.zeros(len(self._all), dtype=bool)

    def observe(self, observations: Sequence[Observation]) -> None:
        super().observe(observations)
        for obs in observations:
            digits = self.index.digits_of(obs.config)
            self._mark(digits, self.index.key(digits))
            self._digits.append(digits)
            self._costs.append(obs.cost)
            if obs.cost is not None and obs.cost < self._best:
                self._best = obs.cost
                self._best_row = digits

    def claim(self, config: Config) -> bool:
        """Mark ``config`` as proposed (also when the caller proposes it, e.g. a job's default)."""
        digits = self.index.digits_of(config)
        self._mark(digits, self.index.key(digits))
        return super().claim(config)

    # -- helpers -------------------------------------------------------------------------------
    def _mark(self, digits: np.ndarray, key: bytes) -> None:
        self._keys.add(key)
        if self.index.enumerable:
            row = self.index.row_of(digits)
            if row is not None:
                self._taken[row] = True

    def _is_new(self, digits: np.ndarray) -> bool:
        return self.index.key(digits) not in self._keys

    def _claim_digits(self, digits: np.ndarray) -> Config | None:
        """The config of ``digits``, marked as proposed; None if it was seen before."""
        key = self.index.key(digits)
        if key in self._keys:
            return None
        config = self.index.config(digits)
        self._mark(digits, key)
        return config if SearchStrategy.claim(self, config) else None

    def _random(self, n: int) -> list[Config]:
        """Up to ``n`` uniformly drawn configs never seen before."""
        out: list[Config] = []
        if n <= 0:
            return out
        if self.index.enumerable:
            while len(out) < n:
                free = np.flatnonzero(~self._taken)
                if not len(free):
                    break
                for row in self.rng.choice(free, size=min(n - len(out), len(free)), replace=False):
                    config = self._claim_digits(self._all[row])
                    if config is not None:
                        out.append(config)
            return out
        for _ in range(50):
            if len(out) >= n:
                break
            for digits in self.index.sample(self.rng, 2 * (n - len(out))):
                config = self._claim_digits(digits)
                if config is not None:
                    out.append(config)
                    if len(out) >= n:
                        break
        return out

    def _ranked_observations(self) -> list[int]:
        """Indices of observations, fastest first; failures last."""
        return sorted(range(len(self._costs)), key=lambda i: (self._costs[i] is None, self._costs[i] or 0.0, i))
