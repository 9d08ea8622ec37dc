"""Search strategies: which configs to measure next (ask/tell: ``propose(n)`` / ``observe``).

By name (:data:`STRATEGIES`, :func:`make_strategy`):

* ``random``: uniform sampling of the valid space without repeats;
* ``grid``: every valid config in index order;
* ``ga``: steady-state genetic algorithm (model-free);
* ``sa``: simulated annealing on measurements with parallel chains (model-free);
* ``xgb``: model-guided search (XGBoost ranking model, value probes, local steps, transfer prior);
* ``default``: an alias of the strategy that did best on the replayed spaces (``xgb``; see
  ``bench/strategies.py``); what ``tuner tune`` uses.

Strategies work on any :class:`~measure_agent.space.ConfigSpace`, including spaces of billions of
configs (never enumerated unless small: :mod:`tuner.search.space_index`).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from measure_agent.space import ConfigError, ConfigSpace
from tuner.cost_model import FeatureProvider
from tuner.search.annealing import AnnealingSearch
from tuner.search.base import Observation, PriorObservation, SearchStrategy
from tuner.search.evolutionary import GeneticSearch
from tuner.search.grid_search import GridSearch
from tuner.search.model_based import XGBSearch
from tuner.search.random_search import RandomSearch

STRATEGIES: dict[str, type[SearchStrategy]] = {
    "random": RandomSearch,
    "grid": GridSearch,
    "ga": GeneticSearch,
    "sa": AnnealingSearch,
    "xgb": XGBSearch,
}
# ``default`` is an alias of the strategy that did best on the replayed spaces (bench/strategies.py).
DEFAULT_ALIAS = "xgb"
STRATEGIES["default"] = STRATEGIES[DEFAULT_ALIAS]
DEFAULT_STRATEGY = "default"


def make_strategy(name: str, space: ConfigSpace, seed: int | None = 0, **context: Any) -> SearchStrategy:
    """The strategy called ``name`` (one of :data:`STRATEGIES`).

    ``context`` holds optional keywords (``workload``, ``features``: a template, used when it
    implements :class:`~tuner.cost_model.FeatureProvider`, and strategy options); each strategy
    receives those its constructor accepts and the rest are ignored, so callers can pass the same
    context to every strategy. ``seed=None`` draws a fresh seed. Raises :class:`~measure_agent.space.ConfigError` when the
    constraints leave no valid config.
    """
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None
    if context.get("features") is not None and not isinstance(context["features"], FeatureProvider):
        context = {k: v for k, v in context.items() if k != "features"}  # a template without the capability
    if seed is None:  # a fresh run: draw a seed (strategies derive their model seeds from it)
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, not {seed!r}")
    empty = space.empty_reason()
    if empty is not None:
        raise ConfigError(f"the space has no valid configuration: {empty}")
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in context.items() if k in accepted}
    return cls(space, seed=seed, **kwargs)


__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "AnnealingSearch", "GeneticSearch", "GridSearch", "Observation", "PriorObservation", "RandomSearch",
           "SearchStrategy", "XGBSearch", "make_strategy"]
