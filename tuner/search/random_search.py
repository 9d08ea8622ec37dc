"""Uniform random sampling of the valid space, without repeats."""

from __future__ import annotations

from measure_agent.space import Config
from tuner.search.base import SearchStrategy


class RandomSearch(SearchStrategy):
    def propose(self, n: int) -> list[Config]:
        return self.random_new(n)
