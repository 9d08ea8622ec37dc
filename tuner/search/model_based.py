"""Model-guided search: measure, fit a ranking model, propose what it ranks best.

The loop (after AutoTVM's XGBTuner, tuned on the replayed GPU spaces in ``../shared/spaces``):

* a few random configs first (``initial_random``), fewer when a transfer prior exists: a nearly
  uniform space-filling design, each the one of ``initial_pool`` uniform draws farthest (in knobs
  changed) from those before it. Measured over 60 seeds on the replay spaces, a pool of 8 lifted
  GEMM @25/@50/@100 from 0.899/0.960/0.984 to 0.915/0.967/0.987, other families within noise;
  pools of 16 and 32 spread more and did worse on GEMM_K20 from 100 on;
* after every batch, an XGBoost model is retrained on every measurement (failed configs ranked
  last) plus, for transfer learning, records of related workloads and devices in their own ranking
  groups with lower weights. Its objective (``objective="auto"``, the default) is ``rank:pairwise``
  unless the uniformly random picks show a flat top: when the median of their times is within
  ``flat_ratio`` (1.2x) of their best, good configs are common and what matters is ordering the
  many near-best ones, which ``rank:ndcg`` (the top ranks weigh most) does better; where good
  configs are rare, pairwise ranking over all pairs generalises better from the bulk. An explicit
  ``rank:pairwise``, ``rank:ndcg`` or ``reg:squarederror`` (regression on -log cost) is kept;
* candidates: when the space is small enough to enumerate (``SpaceIndex.enumerable``), every
  unmeasured config is scored with one predict call; otherwise simulated annealing over the
  model's scores explores the valid space from the best measured configs and random points;
* picks, per batch: a ``local_share`` of the model's best configs within one or two knobs of
  the best config found so far (a local step); a ``value_share`` of "value probes", each the
  model's best config among those with the least measured value of a random knob (this finds
  narrow peaks next to broad plateaus that the model's averages hide, e.g. pnpoly's tile size 1);
  an ``epsilon`` share of uniformly random configs, doubled while progress stalls; and the rest
  the best-scored candidates that differ from each other in at least ``min_diff`` knobs (where
  possible). ``ensemble`` > 1 trains several models on row/column subsamples and takes the
  picks round-robin from them (measured: no gain on the replay spaces, 4x the cost);
* breeding, once the model's picks stall (``stall_batches`` batches without a new best): a
  ``breed_share`` of each model batch is bred from the ``breed_population`` fastest measured configs
  by the GA's own crossover and mutation (:meth:`IndexedStrategy.breed`), a proposer that keeps
  improving where the model's ranking has run dry; the model takes the whole batch back when one of
  its own picks improves on the best again (``docs/search.md``: beside Kernel Tuner's strategies).

Measured on the 12 replayed spaces (``bench/strategies.py``, 20 repeats): the value probes lifted
convolution @200 from 0.967 to about 0.975 and put pnpoly_V100 level with random search at 200;
triple-product features, a stall-triggered jump away from the best configs, a pairwise + NDCG
portfolio and an ensemble were tried and did not help. The automatic objective (40 repeats, seeds
20-59) lifted pnpoly_V100 from 0.972/0.982/0.990/0.997 @25/50/100/200 (below random search at
25-100) to 0.978/0.987/0.994/0.999 (above it everywhere) and pnpoly_A100 @100 from 0.992 to 0.996.
Over 60 seeds the rule chose NDCG for the first model batch in 78% of the runs on pnpoly_V100 and
97% on pnpoly_A100, in 8% on GEMM_V100 and in at most 2% on the other nine spaces; that cost the
GEMM family 0.003 at 25 and at most 0.001 from 50 on (``docs/search.md``).
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace
from tuner.cost_model import FeatureProvider, Featurizer, XGBCostModel
from tuner.search.base import Observation, PriorObservation
from tuner.search.indexed import IndexedStrategy

_FEATURE_CACHE: "weakref.WeakKeyDictionary[ConfigSpace, dict]" = weakref.WeakKeyDictionary()


def _featurizer(space: ConfigSpace, provider: FeatureProvider | None, workload: Any) -> tuple[Featurizer, dict]:
    """A featurizer per (space, provider, workload), with a per-space cache of feature tables."""
    per_space = _FEATURE_CACHE.setdefault(space, {})
    key = (id(provider), workload)
    if key not in per_space:
        per_space[key] = (Featurizer(space, provider=provider, workload=workload), {})
    return per_space[key]


class XGBSearch(IndexedStrategy):
    def __init__(
        self,
        space: ConfigSpace,
        seed: int = 0,
        *,
        workload: Any = None,
        features: FeatureProvider | None = None,
        objective: str = "auto",
        initial_random: int = 12,
        initial_pool: int = 8,
        prior_initial_random: int = 4,
        epsilon: float = 0.05,
        min_diff: int = 2,
        local_share: float = 0.25,
        stall_batches: int = 4,
        rounds: int = 60,
        max_train: int = 4000,
        anneal_chains: int = 128,
        anneal_steps: int = 40,
        ensemble: int = 1,
        value_share: float = 0.375,
        prior_decay: float = 64.0,
        flat_ratio: float = 1.2,
        flat_min_samples: int = 8,
        breed_share: float = 0.5,
        breed_population: int = 20,
    ) -> None:
        super().__init__(space, seed)
        self.initial_random = initial_random
        self.initial_pool = initial_pool
        self.prior_initial_random = prior_initial_random
        self.epsilon = epsilon
        self.min_diff = min_diff
        self.local_share = local_share
        self.stall_batches = stall_batches
        self.value_share = value_share
        self.prior_decay = prior_decay
        self.max_train = max_train
        self.anneal_chains = anneal_chains
        self.anneal_steps = anneal_steps
        self.flat_ratio = flat_ratio
        self.flat_min_samples = flat_min_samples
        self.breed_share = breed_share
        self.breed_population = breed_population
        # Set when the model's picks stalled; while set, part of each batch is bred from the elite.
        # Cleared when a model pick (not a bred one) improves on the best again.
        self._breeding = False
        self._bred_keys: set[bytes] = set()
        self._auto = objective == "auto"
        self._random_keys: set[bytes] = set()  # uniform picks and the initial design: a near-unbiased sample
        self._random_costs: list[float] = []  # their measured costs (successes only)
        self._design: list[np.ndarray] = []  # the initial design's picks, as digit rows
        self._ensemble = max(1, ensemble)
        self._rounds = rounds
        self._seed = seed
        self._make_models(["rank:pairwise"] if self._auto
                          else [objective] if isinstance(objective, str) else list(objective))
        self.featurizer, cache = _featurizer(space, features, workload)
        self._model_size = -1
        self._prior_x: np.ndarray | None = None
        self._prior_cost: list[float | None] = []
        self._prior_group: list[int] = []
        self._prior_weight: list[float] = []
        self._batches_since_improvement = 0
        if self.index.enumerable:
            if "all" not in cache:
                cache["all"] = self.featurizer.from_digits(self._all)
            self._all_x = cache["all"]

    # -- the ask/tell contract -------------------------------------------------------------------
    def observe(self, observations: Sequence[Observation]) -> None:
        best_before = self._best
        super().observe(observations)
        for digits, obs in zip(self._digits[len(self._digits) - len(observations):], observations):
            if obs.cost is not None and self.index.key(digits) in self._random_keys:
                self._random_costs.append(obs.cost)
        if observations:
            improved = self._best < best_before
            self._batches_since_improvement = 0 if improved else self._batches_since_improvement + 1
            if self.stall_batches and self._batches_since_improvement >= self.stall_batches:
                self._breeding = True
            elif improved and self.index.key(self._best_row) not in self._bred_keys:
                self._breeding = False  # the model's own picks improve again: they get the batch back

    def observe_prior(self, prior: Sequence[PriorObservation]) -> None:
        if not prior:
            return
        groups: dict[str, int] = {}
        for p in prior:
            groups.setdefault(p.group, len(groups) + 1)
        rows = np.zeros((len(prior), self.featurizer.width), dtype=np.float32)
        # Featurise per source workload, so a provider sees each config with its own workload.
        by_workload: dict[int, list[int]] = {}
        for i, p in enumerate(prior):
            by_workload.setdefault(id(p.workload), []).append(i)
        for idx in by_workload.values():
            workload = prior[idx[0]].workload
            configs = [prior[i].config for i in idx]
            values = [c.as_dict() if isinstance(c, Config) else dict(c) for c in configs]
            as_configs = configs if all(isinstance(c, Config) for c in configs) else None
            if workload is None:  # the same workload: its configs are configs of this space
                workload = self.featurizer.workload
            rows[idx] = self.featurizer.rows_from_values(values, workload, as_configs)
        self._prior_x = rows
        self._prior_cost = [p.cost for p in prior]
        self._prior_group = [groups[p.group] for p in prior]
        self._prior_weight = [float(p.weight) for p in prior]

    def propose(self, n: int) -> list[Config]:
        if n <= 0:
            return []
        own = len(self._costs)
        if sum(c is not None for c in self._prior_cost) >= 2:
            # With a prior the model is useful from the start: a few random configs anchor this
            # problem's own ranking group, the rest of the first batch follows the prior's model.
            warmup = min(self.initial_random, self.prior_initial_random)
            if own < warmup:
                picks = self._initial(min(n, warmup - own))
                return picks + self._model_picks(n - len(picks), local=False)
            return self._model_picks(n, local=True)
        if own < self.initial_random:
            return self._initial(n)
        if sum(c is not None for c in self._costs) < 2:
            return self._random(n)
        return self._model_picks(n, local=True)

    # -- internals -------------------------------------------------------------------------------
    def _make_models(self, objectives: list[str]) -> None:
        # An ensemble (models on different row and column subsamples) spreads the picks of a batch
        # over the hypotheses the data leave open: pick i follows model i mod ensemble.
        sub = 0.8 if self._ensemble > 1 else 1.0
        self.models = [XGBCostModel(objective=obj, rounds=self._rounds, seed=self._seed + 7919 * k,
                                    subsample=sub, colsample=sub)
                       for k in range(self._ensemble) for obj in objectives]
        self.model = self.models[0]

    def _random(self, n: int) -> list[Config]:
        picks = super()._random(n)
        self._random_keys.update(self.index.key(self.index.digits_of(c)) for c in picks)
        return picks

    def _initial(self, n: int) -> list[Config]:
        """The initial design: spread from the earlier initial picks (pending ones included) and
        from whatever else was measured or claimed first (e.g. a job's default config)."""
        anchors = self._design + [d for d in self._digits if self.index.key(d) not in self._random_keys]
        picks = self._spread(n, self.initial_pool, anchors)
        digits = [self.index.digits_of(c) for c in picks]
        self._design += digits
        # Counted with the random picks: near enough to uniform for the flat-top test.
        self._random_keys.update(self.index.key(d) for d in digits)
        return picks

    def _auto_objective(self) -> str:
        """``rank:ndcg`` when the random picks show a flat top (their median time within
        ``flat_ratio`` of their best), else ``rank:pairwise``; pairwise until enough succeeded."""
        times = np.array(self._random_costs)
        if len(times) < self.flat_min_samples:
            return "rank:pairwise"
        return "rank:ndcg" if np.median(times) <= self.flat_ratio * times.min() else "rank:pairwise"

    def _fit(self) -> bool:
        size = len(self._costs)
        if size == self._model_size:
            return self.model.trained
        self._model_size = size
        if self._auto:
            objective = self._auto_objective()
            if objective != self.model.objective:
                self._make_models([objective])
        digits = np.array(self._digits, dtype=np.int64).reshape(size, len(self.index.knobs))
        costs = list(self._costs)
        if size > self.max_train:
            # Keep the fastest quarter and a random sample of the rest: the ranking near the top
            # is what search needs, and training time stays bounded.
            order = np.argsort([c if c is not None else np.inf for c in costs], kind="stable")
            keep = order[: self.max_train // 4]
            rest = self.rng.choice(order[self.max_train // 4:], self.max_train - len(keep), replace=False)
            chosen = np.sort(np.concatenate([keep, rest]))
            digits, costs = digits[chosen], [costs[i] for i in chosen]
        x = self._features(digits)
        groups = [0] * len(costs)
        weights = [1.0] * len(costs)
        if self._prior_x is not None:
            # The prior counts less as the job's own measurements accumulate: related problems
            # point the way at first, but where they differ, this one's own results must win.
            decay = self.prior_decay / (self.prior_decay + size) if self.prior_decay else 1.0
            x = np.concatenate([x, self._prior_x])
            costs = costs + self._prior_cost
            groups = groups + self._prior_group
            weights = weights + [w * decay for w in self._prior_weight]
        for model in self.models:
            model.fit(x, costs, groups=groups, weights=weights if self._prior_x is not None else None)
        return self.model.trained

    def _predict(self, x: np.ndarray) -> np.ndarray:
        """(models, rows) scores, each model's standardised so they can be averaged."""
        out = np.stack([m.predict(x) for m in self.models])
        if len(self.models) > 1:
            out = (out - out.mean(axis=1, keepdims=True)) / (out.std(axis=1, keepdims=True) + 1e-9)
        return out

    def _features(self, digits: np.ndarray) -> np.ndarray:
        if self.index.enumerable:
            rows = [self.index.row_of(d) for d in digits]
            if all(r is not None for r in rows):
                return self._all_x[np.array(rows, dtype=np.int64)]
        return self.featurizer.from_digits(digits)

    def _model_picks(self, n: int, local: bool) -> list[Config]:
        if n <= 0:
            return []
        if not self._fit():
            return self._random(n)
        eps = self.epsilon
        if self.stall_batches and self._batches_since_improvement >= self.stall_batches:
            eps = min(0.5, 2 * eps)  # progress stalled: explore more
        n_random = int(self.rng.binomial(n, eps)) if n > 1 else 0
        n_model = n - n_random
        bred: list[Config] = []
        if self._breeding and self.breed_share > 0 and n_model > 0:
            # The model's picks stopped improving: from now on a share of every batch is bred from
            # the measured elite, which keeps improving where the model's ranking has run dry.
            n_bred = int(np.floor(n_model * self.breed_share + self.rng.random()))
            bred = self.breed(n_bred, self.breed_population, self.default_mutation_rate())
            self._bred_keys.update(self.index.key(self.index.digits_of(c)) for c in bred)
            n_model -= len(bred)
        cand_digits, scores = self._candidates()
        picks: list[Config] = []
        if local and self.local_share > 0 and n_model > 0 and self._best_row is not None:
            n_local = int(np.floor(n_model * self.local_share + self.rng.random()))
            if n_local:
                picks += self._local_picks(cand_digits, scores, n_local)
        if local and self.value_share > 0 and n_model > len(picks):
            n_value = int(np.floor(n_model * self.value_share + self.rng.random()))
            picks += self._value_picks(cand_digits, scores, min(n_value, n_model - len(picks)))
        picks += self._diverse(cand_digits, scores, n_model - len(picks), bred + picks)
        picks = bred + picks
        picks += self._random(n - len(picks))
        return picks

    def _value_picks(self, digits: np.ndarray, scores: np.ndarray, n: int) -> list[Config]:
        """Picks that each try the least measured value of a random knob, with the model's best
        settings of the other knobs: a model that learned a value's average effect misses its
        best combinations (a narrow peak next to a broad plateau), and random picks rarely hit them."""
        out: list[Config] = []
        if n <= 0 or not len(digits):
            return out
        mean = scores.mean(axis=0)
        measured = np.array(self._digits, dtype=np.int64).reshape(len(self._digits), len(self.index.knobs))
        movable = np.flatnonzero(self.index.sizes > 1)
        for _ in range(n):
            k = int(self.rng.choice(movable))
            counts = np.bincount(measured[:, k], minlength=int(self.index.sizes[k]))
            present = np.unique(digits[:, k])
            least = present[counts[present] == counts[present].min()]
            rows = np.flatnonzero(digits[:, k] == int(self.rng.choice(least)))
            for row in rows[np.argsort(-mean[rows], kind="stable")]:
                config = self._claim_digits(digits[row])
                if config is not None:
                    out.append(config)
                    break
        return out

    def _candidates(self) -> tuple[np.ndarray, np.ndarray]:
        if self.index.enumerable:
            free = np.flatnonzero(~self._taken)
            return self._all[free], self._predict(self._all_x[free])
        return self._anneal()

    def _local_picks(self, digits: np.ndarray, scores: np.ndarray, n: int) -> list[Config]:
        best = self._best_row
        scores = scores.mean(axis=0)
        distance = np.count_nonzero(digits != best, axis=1)
        near = np.flatnonzero((distance >= 1) & (distance <= 2))
        if not len(near):
            return []
        order = near[np.argsort(-scores[near], kind="stable")]
        out = []
        for row in order:
            if len(out) >= n:
                break
            config = self._claim_digits(digits[row])
            if config is not None:
                out.append(config)
        return out

    def _diverse(self, digits: np.ndarray, scores: np.ndarray, n: int, already: list[Config]) -> list[Config]:
        """``n`` best-scored candidates: pick ``i`` follows model ``i mod len(models)``, and each
        differs from the picks before it in at least ``min_diff`` knobs while such candidates
        remain; then, if still short, the best of the rest by the models' mean score."""
        if n <= 0 or not scores.shape[1]:
            return []
        top = min(scores.shape[1], max(64 * n, 512))
        orders = [_top(row_scores, top) for row_scores in scores]
        chosen: list[np.ndarray] = [self.index.digits_of(c) for c in already]
        out: list[Config] = []
        positions = [0] * len(orders)
        live = list(range(len(orders)))
        turn = 0
        while len(out) < n and live:
            k = live[turn % len(live)]
            order = orders[k]
            picked = None
            while picked is None and positions[k] < len(order):
                d = digits[order[positions[k]]]
                positions[k] += 1
                if self._is_new(d) and all(np.count_nonzero(d != c) >= self.min_diff for c in chosen):
                    picked = self._claim_digits(d)
            if picked is None:
                live.remove(k)  # this model has no diverse candidate left
                continue
            out.append(picked)
            chosen.append(digits[order[positions[k] - 1]])
            turn += 1
        if len(out) < n:
            for row in _top(scores.mean(axis=0), top):
                if len(out) >= n:
                    break
                picked = self._claim_digits(digits[row])
                if picked is not None:
                    out.append(picked)
        return out

    def _anneal(self) -> tuple[np.ndarray, np.ndarray]:
        """Simulated annealing over the model's scores on a space too large to enumerate; returns
        every new config it visited, with its score."""
        measured = [(c, i) for i, c in enumerate(self._costs) if c is not None]
        measured.sort()
        starts = [self._digits[i] for _, i in measured[: self.anneal_chains // 2]]
        points = np.concatenate([
            np.array(starts, dtype=np.int64).reshape(len(starts), len(self.index.sizes)),  # none before a first result
            self.index.sample(self.rng, self.anneal_chains - len(starts)),
        ])
        scores = self._predict(self.featurizer.from_digits(points)).mean(axis=0)
        visited_d = [points]
        visited_s = [scores]
        temperature = 1.0
        for _ in range(self.anneal_steps):
            changes = 1 + self.rng.integers(2, size=len(points))
            moved = self.index.mutate(points, self.rng, changes)
            moved_scores = self._predict(self.featurizer.from_digits(moved)).mean(axis=0)
            visited_d.append(moved)
            visited_s.append(moved_scores)
            spread = float(np.std(scores)) or 1.0
            accept = (moved_scores >= scores) | (
                self.rng.random(len(points)) < np.exp(np.minimum(0.0, (moved_scores - scores) / (spread * temperature)))
            )
            points = np.where(accept[:, None], moved, points)
            scores = np.where(accept, moved_scores, scores)
            temperature = max(0.05, temperature * 0.9)
        all_d = np.concatenate(visited_d)
        all_s = np.concatenate(visited_s)
        keys = self.index.keys(all_d)
        best: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self._keys and k not in best:
                best[k] = i
        idx = np.array(sorted(best.values()), dtype=np.int64)
        return all_d[idx], all_s[idx][None, :]


def _top(scores: np.ndarray, top: int) -> np.ndarray:
    """Indices of the ``top`` highest scores, best first (ties: lower index first)."""
    if top < len(scores):
        order = np.argpartition(-scores, top - 1)[:top]
    else:
        order = np.arange(len(scores))
    return order[np.argsort(-scores[order], kind="stable")]
