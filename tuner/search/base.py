"""The search-strategy contract (ask/tell), apart from storing and from the tuning loop."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace


@dataclass(frozen=True)
class Observation:
    """A measured config: ``cost`` in seconds, or None when it failed (any error status)."""

    config: Config
    cost: float | None


@dataclass(frozen=True)
class PriorObservation:
    """A measured config of a related tuning problem, for transfer learning.

    ``config`` is the config's JSON form (``{knob: value}``), which need not be a member of the
    space being searched (another workload's splits differ); ``workload`` is the workload it was
    measured on (None: the same workload). ``cost`` is seconds or None (failed). ``group`` names
    the problem it belongs to (e.g. ``"<workload>@<device>"``): costs are compared only within a
    group. ``weight`` (0..1] says how much it should count against the job's own measurements.
    """

    config: Mapping[str, Any]
    cost: float | None
    group: str
    weight: float = 0.5
    workload: Any = None


# Spaces up to this many valid configs may be listed whole when random draws keep finding seen ones.
ENUMERABLE_SPACE = 1 << 16


class SearchStrategy(ABC):
    """Proposes which configs of a space to measure next.

    Contract:
    - ``propose(n)`` returns at most ``n`` distinct valid configs, none of them proposed before or
      passed to ``observe``; fewer (possibly none) only when the strategy has nothing left to try;
    - ``observe`` may be called with results in any order, including results of configs this
      strategy never proposed (history loaded from the tuning log when a job resumes);
    - strategies are deterministic for a given ``seed`` and sequence of calls;
    - ``observe_prior`` may give records of related problems (transfer learning); see
      :class:`PriorObservation`.
    """

    def __init__(self, space: ConfigSpace, seed: int = 0) -> None:
        self.space = space
        self.rng = np.random.default_rng(seed)
        self._seen: set[str] = set()

    @abstractmethod
    def propose(self, n: int) -> list[Config]:
        """Up to ``n`` new configs to measure."""

    def observe(self, observations: Sequence[Observation]) -> None:
        """Learn from measured configs. Subclasses extend this; they must call super()."""
        for obs in observations:
            self._seen.add(obs.config.digest)

    def observe_prior(self, prior: Sequence[PriorObservation]) -> None:
        """Records of related problems (other workloads or devices) to learn from before the
        job's own measurements; called at most once, before the first ``propose``. Prior
        configs are not part of this job's history: they may still be proposed. Strategies
        without a model ignore it."""

    # -- shared by strategies ---------------------------------------------------------------
    def is_new(self, config: Config) -> bool:
        return config.digest not in self._seen

    def claim(self, config: Config) -> bool:
        """Mark ``config`` as proposed; False if it was seen already."""
        if config.digest in self._seen:
            return False
        self._seen.add(config.digest)
        return True

    def random_new(self, n: int, attempts_per_config: int = 50) -> list[Config]:
        """Up to ``n`` uniformly drawn configs not seen before; fewer only when the space holds
        fewer unseen ones. Drawing gives up after ``attempts_per_config`` tries per config; a space
        small enough to list (:data:`ENUMERABLE_SPACE`) then gives its unseen configs in random
        order, so a mostly explored space is not taken for an exhausted one."""
        out: list[Config] = []
        for _ in range(n * attempts_per_config):
            if len(out) >= n:
                break
            config = self.space.sample(self.rng)[0]
            if self.claim(config):
                out.append(config)
        if len(out) < n and self.space.size <= ENUMERABLE_SPACE:
            unseen = [c for c in self.space.iter_valid() if self.is_new(c)]
            for i in self.rng.permutation(len(unseen))[:n - len(out)]:
                self.claim(unseen[i])
                out.append(unseen[i])
        return out
