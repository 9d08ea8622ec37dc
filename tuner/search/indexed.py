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

    def _spread(self, n: int, pool: int, anchors: Sequence[np.ndarray] = ()) -> list[Config]:
        """Up to ``n`` never-seen configs for an initial design: each the one of ``pool`` uniform
        draws that differs in the most knobs from ``anchors`` and the picks before it (ties: the
        one whose knob values they use least). Nearly uniform, but a dozen picks cover more
        values of each knob than a dozen uniform ones; ``pool=1`` is uniform sampling."""
        out: list[Config] = []
        chosen = [np.asarray(a, dtype=np.int64) for a in anchors]
        while len(out) < n:
            draws = self._unseen_draws(max(1, pool))
            if not len(draws):
                break
            best = 0
            if chosen and len(draws) > 1:
                same = draws[:, None, :] == np.array(chosen)[None, :, :]
                distance = (~same).sum(axis=2).min(axis=1)
                used = same.sum(axis=(1, 2))
                best = int(np.lexsort((used, -distance))[0])
            config = self._claim_digits(draws[best])
            if config is not None:
                out.append(config)
                chosen.append(draws[best])
        return out

    def _unseen_draws(self, pool: int) -> np.ndarray:
        """Up to ``pool`` distinct uniformly drawn digit rows never seen before."""
        width = len(self.index.sizes)
        if self.index.enumerable:
            free = np.flatnonzero(~self._taken)
            if not len(free):
                return np.zeros((0, width), dtype=np.int64)
            return self._all[self.rng.choice(free, size=min(pool, len(free)), replace=False)]
        rows: dict[bytes, np.ndarray] = {}
        for _ in range(20):
            for digits in self.index.sample(self.rng, pool):
                key = self.index.key(digits)
                if key not in self._keys:
                    rows.setdefault(key, digits)
            if rows:
                break
        return np.array(list(rows.values())[:pool], dtype=np.int64).reshape(-1, width)

    def _ranked_observations(self) -> list[int]:
        """Indices of observations, fastest first; failures last."""
        return sorted(range(len(self._costs)), key=lambda i: (self._costs[i] is None, self._costs[i] or 0.0, i))
