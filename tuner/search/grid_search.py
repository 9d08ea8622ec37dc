"""Exhaustive search in index order (first knob slowest): predictable, for small spaces."""

from __future__ import annotations

from measure_agent.space import Config, ConfigSpace
from tuner.search.base import SearchStrategy


class GridSearch(SearchStrategy):
    def __init__(self, space: ConfigSpace, seed: int = 0) -> None:
        super().__init__(space, seed)
        self._iterator = space.iter_valid()

    def propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        for config in self._iterator:
            if self.claim(config):
                out.append(config)
                if len(out) >= n:
                    break
        return out
