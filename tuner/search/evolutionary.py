"""A steady-state genetic algorithm (model-free), in ask/tell form.

The first ``population`` configs are uniformly random. Then every proposed config is a child of
two parents chosen by binary tournament among the ``population`` fastest configs measured so far
(failed configs never breed while successes exist): uniform crossover, then each knob mutated with
probability ``mutation_rate`` (at least one knob when the child equals a parent). Children that
violate a constraint or were seen before are discarded and bred again; when breeding keeps failing
the strategy falls back to mutating the elite, then to random configs.
"""

from __future__ import annotations

from measure_agent.space import Config, ConfigSpace
from tuner.search.indexed import IndexedStrategy


class GeneticSearch(IndexedStrategy):
    def __init__(self, space: ConfigSpace, seed: int = 0, *, population: int = 20,
                 mutation_rate: float | None = None, tournament: int = 2) -> None:
        super().__init__(space, seed)
        self.population = population
        self.mutation_rate = mutation_rate if mutation_rate is not None else self.default_mutation_rate()
        self.tournament = tournament

    def propose(self, n: int) -> list[Config]:
        if n <= 0:
            return []
        ok = sum(c is not None for c in self._costs)
        if len(self._costs) < self.population or ok < 2:
            return self._random(n)
        out = self.breed(n, self.population, self.mutation_rate, self.tournament)
        return out + self._random(n - len(out))
