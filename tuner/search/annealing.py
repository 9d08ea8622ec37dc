"""Simulated annealing on measurements (model-free), with parallel chains, in ask/tell form.

Each proposed config is a neighbour of one chain's current config (one knob changed, to an
adjacent value with probability ``local``, else to any value; two knobs now and then). When its
result arrives the chain moves there if it is faster, or if slower with probability
``exp(-(log new - log current) / T)``; failures are never accepted. ``T`` decays geometrically
with each chain step. A chain that finds no unseen valid neighbour, or has not improved for
``restart_after`` steps, restarts from a random config (or, half the time, the best so far).
Results of configs the strategy did not propose (history) seed new chains at the best of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace
from tuner.search.base import Observation
from tuner.search.indexed import IndexedStrategy


@dataclass
class _Chain:
    digits: np.ndarray | None = None
    cost: float | None = None
    steps: int = 0
    since_improvement: int = 0
    pending: bool = False


class AnnealingSearch(IndexedStrategy):
    def __init__(self, space: ConfigSpace, seed: int = 0, *, t_start: float = 0.3, t_min: float = 0.005,
                 decay: float = 0.93, local: float = 0.5, restart_after: int = 25) -> None:
        super().__init__(space, seed)
        self.t_start = t_start
        self.t_min = t_min
        self.decay = decay
        self.local = local
        self.restart_after = restart_after
        self._chains: list[_Chain] = []
        self._pending: dict[bytes, int] = {}  # proposed config -> chain

    def observe(self, observations: Sequence[Observation]) -> None:
        super().observe(observations)
        for obs in observations:
            digits = self.index.digits_of(obs.config)
            chain_id = self._pending.pop(self.index.key(digits), None)
            if chain_id is None:
                continue
            chain = self._chains[chain_id]
            chain.pending = False
            chain.steps += 1
            if chain.digits is None or obs.cost is None and chain.cost is None:
                # A chain's first point: take it even if it failed (it only moves on from there).
                chain.digits, chain.cost = digits, obs.cost
                continue
            if obs.cost is None:
                chain.since_improvement += 1
                continue
            if chain.cost is None or obs.cost < chain.cost:
                chain.digits, chain.cost, chain.since_improvement = digits, obs.cost, 0
                continue
            chain.since_improvement += 1
            t = max(self.t_min, self.t_start * self.decay ** chain.steps)
            if chain.cost > 0:  # relative worsening (log ratio), so the temperature is scale-free
                worse = math.log(obs.cost / chain.cost)
            else:  # costs that are not positive (a user objective): plain difference
                worse = obs.cost - chain.cost
            if self.rng.random() < math.exp(-worse / t):
                chain.digits, chain.cost = digits, obs.cost

    def propose(self, n: int) -> list[Config]:
        if n <= 0:
            return []
        while len(self._chains) < n:
            self._chains.append(_Chain())
        out: list[Config] = []
        for chain_id, chain in enumerate(self._chains):
            if len(out) >= n:
                break
            if chain.pending:
                continue
            config = self._step(chain)
            if config is None:
                continue
            chain.pending = True
            self._pending[self.index.key(self.index.digits_of(config))] = chain_id
            out.append(config)
        return out + self._random(n - len(out))

    def _step(self, chain: _Chain) -> Config | None:
        if chain.digits is None or chain.since_improvement >= self.restart_after:
            return self._restart(chain)
        base = chain.digits[None, :].repeat(24, axis=0)
        changes = 1 + (self.rng.random(24) < 0.2)
        local = self.rng.random() < self.local
        for candidates in (self.index.mutate(base, self.rng, changes, local=local),
                           self.index.mutate(base, self.rng, 1 + changes, local=False)):
            for digits in candidates:
                if np.array_equal(digits, chain.digits):
                    continue
                config = self._claim_digits(digits)
                if config is not None:
                    return config
        return self._restart(chain)

    def _restart(self, chain: _Chain) -> Config | None:
        chain.since_improvement = 0
        chain.steps = 0
        if self._best_row is not None and self.rng.random() < 0.5:
            chain.digits, chain.cost = self._best_row, self._best
            base = self._best_row[None, :].repeat(24, axis=0)
            for digits in self.index.mutate(base, self.rng, 1 + (self.rng.random(24) < 0.5)):
                config = self._claim_digits(digits)
                if config is not None:
                    return config
        chain.digits, chain.cost = None, None
        picks = self._random(1)
        return picks[0] if picks else None
