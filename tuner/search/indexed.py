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

    # -- breeding from the measured elite (the genetic algorithm, and the default once it stalls) ----
    def default_mutation_rate(self) -> float:
        """One knob in ``movable`` on average, at least 0.1 per knob."""
        movable = int(np.count_nonzero(self.index.sizes > 1))
        return max(0.1, 1.0 / max(movable, 1))

    def breed(self, n: int, population: int, mutation_rate: float, tournament: int = 2) -> list[Config]:
        """Up to ``n`` never-seen valid children of the ``population`` fastest measured configs
        (failed ones never breed while two succeeded): parents by tournament of ``tournament``,
        uniform crossover, each knob mutated with probability ``mutation_rate`` (one knob at least
        when a child equals a parent). When breeding keeps finding seen or invalid children, the
        elite is mutated harder (two knobs). Fewer than ``n`` only when both find nothing new."""
        ranked = self._ranked_observations()[:population]
        out: list[Config] = []
        if n <= 0 or len(ranked) < 2:
            return out
        elite = np.array([self._digits[i] for i in ranked])
        ranks = np.arange(len(elite))
        ok = np.array([self._costs[i] is not None for i in ranked])
        pool = ranks[ok] if ok.sum() >= 2 else ranks
        for _ in range(10):
            if len(out) >= n:
                break
            m = 16 * (n - len(out))
            a = self.rng.choice(pool, size=(m, tournament)).min(axis=1)  # lower rank = faster
            b = self.rng.choice(pool, size=(m, tournament)).min(axis=1)
            mask = self.rng.random((m, elite.shape[1])) < 0.5
            children = self._mutate_values(np.where(mask, elite[a], elite[b]), mutation_rate)
            same = np.all(children == elite[a], axis=1) | np.all(children == elite[b], axis=1)
            if np.any(same):
                children[same] = self._mutate_values(children[same], 1.0 / elite.shape[1], force=True)
            out += self._claim_rows(children, n - len(out))
        if len(out) < n:  # breeding found nothing new: mutate the elite harder
            mutants = self.index.mutate(elite[self.rng.integers(len(elite), size=16 * n)], self.rng, 2)
            out += self._claim_rows(mutants, n - len(out))
        return out

    def _mutate_values(self, digits: np.ndarray, rate: float, force: bool = False) -> np.ndarray:
        """Each movable knob set to another value with probability ``rate`` (``force``: one more)."""
        sizes = self.index.sizes
        hit = (self.rng.random(digits.shape) < rate) & (sizes > 1)
        if force:
            movable = np.flatnonzero(sizes > 1)
            if len(movable):
                hit[np.arange(len(digits)), self.rng.choice(movable, size=len(digits))] = True
        new = (digits + 1 + (self.rng.random(digits.shape) * np.maximum(sizes - 1, 1)).astype(np.int64)) % sizes
        return np.where(hit, new, digits)

    def _claim_rows(self, candidates: np.ndarray, n: int) -> list[Config]:
        """The first ``n`` valid never-seen rows of ``candidates``, claimed, as configs."""
        out: list[Config] = []
        if n <= 0 or not len(candidates):
            return out
        for digits in candidates[self.index.valid_mask(candidates)]:
            if len(out) >= n:
                break
            config = self._claim_digits(digits)
            if config is not None:
                out.append(config)
        return out

    def _ranked_observations(self) -> list[int]:
        """Indices of observations, fastest first; failures last."""
        return sorted(range(len(self._costs)), key=lambda i: (self._costs[i] is None, self._costs[i] or 0.0, i))
