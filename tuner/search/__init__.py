"""Search strategies: which configs to measure next."""

from __future__ import annotations

from measure_agent.space import ConfigSpace
from tuner.search.base import Observation, SearchStrategy
from tuner.search.grid_search import GridSearch
from tuner.search.model_based import XGBSearch
from tuner.search.random_search import RandomSearch

STRATEGIES: dict[str, type[SearchStrategy]] = {
    "random": RandomSearch,
    "grid": GridSearch,
    "xgb": XGBSearch,
}
DEFAULT_STRATEGY = "xgb"


def make_strategy(name: str, space: ConfigSpace, seed: int = 0) -> SearchStrategy:
    """The strategy called ``name`` (one of :data:`STRATEGIES`)."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None
    return cls(space, seed=seed)


__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "GridSearch", "Observation", "RandomSearch",
           "SearchStrategy", "XGBSearch", "make_strategy"]
