"""A steady-state genetic algorithm (model-free), in ask/tell form.

The first ``population`` configs are uniformly random. Then every proposed config is a child of
two parents chosen by binary tournament among the ``population`` fastest configs measured so far
(failed configs never breed while successes exist): uniform crossover, then each knob mutated with
probability ``mutation_rate`` (at least one knob when the child equals a parent). Children that
violate a constraint or were seen before are discarded and bred again; when breeding keeps failing
the strategy falls back to mutating the elite, then to random configs.
"""

from __future__ import annotations

import numpy as np

from measure_agent.space import Config, ConfigSpace
from tuner.search.indexed import IndexedStrategy


class GeneticSearch(IndexedStrategy):
    def __init__(self, space: ConfigSpace, seed: int = 0, *, population: int = 20,
                 mutation_rate: float | None = None, tournament: int = 2) -> None:
        super().__init__(space, seed)
        self.population = population
        movable = int(np.count_nonzero(self.index.sizes > 1))
        self.mutation_rate = mutation_rate if mutation_rate is not None else max(0.1, 1.0 / max(movable, 1))
        self.tournament = tournament

    def propose(self, n: int) -> list[Config]:
        if n <= 0:
            return []
        ok = sum(c is not None for c in self._costs)
        if len(self._costs) < self.population or ok < 2:
            return self._random(n)
        out: list[Config] = []
        elite = np.array([self._digits[i] for i in self._ranked_observations()[: self.population]])
        ranks = np.arange(len(elite))
        ok_mask = np.array([self._costs[i] is not None for i in self._ranked_observations()[: self.population]])
        for _ in range(10):
            if len(out) >= n:
                break
            m = 16 * (n - len(out))
            a = self._tournament(ranks, ok_mask, m)
            b = self._tournament(ranks, ok_mask, m)
            mask = self.rng.random((m, elite.shape[1])) < 0.5
            children = np.where(mask, elite[a], elite[b])
            children = self._mutate_values(children, self.mutation_rate)
            same = np.all(children == elite[a], axis=1) | np.all(children == elite[b], axis=1)
            if np.any(same):
                children[same] = self._mutate_values(children[same], 1.0 / elite.shape[1], force=True)
            out += self._take(children, n - len(out))
        if len(out) < n:  # breeding found nothing new: mutate the elite harder
            out += self._take(self.index.mutate(elite[self.rng.integers(len(elite), size=16 * n)], self.rng, 2), n - len(out))
        return out + self._random(n - len(out))

    def _tournament(self, ranks: np.ndarray, ok_mask: np.ndarray, m: int) -> np.ndarray:
        pool = ranks[ok_mask] if ok_mask.sum() >= 2 else ranks
        picks = self.rng.choice(pool, size=(m, self.tournament))
        return picks.min(axis=1)  # lower rank = faster

    def _mutate_values(self, digits: np.ndarray, rate: float, force: bool = False) -> np.ndarray:
        sizes = self.index.sizes
        hit = (self.rng.random(digits.shape) < rate) & (sizes > 1)
        if force:
            movable = np.flatnonzero(sizes > 1)
            if len(movable):
                hit[np.arange(len(digits)), self.rng.choice(movable, size=len(digits))] = True
        new = (digits + 1 + (self.rng.random(digits.shape) * np.maximum(sizes - 1, 1)).astype(np.int64)) % sizes
        return np.where(hit, new, digits)

    def _take(self, candidates: np.ndarray, n: int) -> list[Config]:
        out: list[Config] = []
        if n <= 0 or not len(candidates):
            return out
        valid = candidates[self.index.valid_mask(candidates)]
        for digits in valid:
            if len(out) >= n:
                break
            config = self._claim_digits(digits)
            if config is not None:
                out.append(config)
        return out
