"""Strategies replayed on recorded spaces: fraction of optimum and score against exact random search.

One run of a strategy on a space measures (looks up) batches of configs until ``max(budgets)``
distinct configs were evaluated (failed ones included) or the time budget ran out; the best time
found within the first ``b`` evaluations gives the result at budget ``b`` (strategies do not know
the budget, so one run serves every budget). Per space, strategy and budget:

* ``fraction``: mean over repeats of optimum time / best time found (0 when nothing valid was found);
* ``score``: ``(random - found) / (random - optimum)`` where ``found`` is the mean best time found
  and ``random`` the exact expected best time of uniform sampling without replacement at that
  budget (:mod:`tuner.replay.baseline`): 0 is random search, 1 the optimum every time.

:func:`bench_strategies` is the whole benchmark of ``tuner bench-strategies`` (every strategy on
every space, optionally with a transfer prior, in worker processes), for any client to call; the
command only parses its options and prints the rows.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tuner.replay.baseline import random_baseline
from tuner.replay.cache import ReplaySpace
from tuner.search import STRATEGIES, Observation, PriorObservation, make_strategy


@dataclass
class RunTrace:
    costs: list[float | None]  # in evaluation order
    seconds: float  # wall time of the whole run (strategy + lookups)
    propose_seconds: float = 0.0
    configs: list = field(default_factory=list)  # the configs, in evaluation order


def replay_run(
    replay: ReplaySpace,
    strategy: str,
    budget: int,
    seed: int,
    batch_size: int = 8,
    time_budget_s: float | None = None,
    prior: Sequence[PriorObservation] | None = None,
    options: dict[str, Any] | None = None,
) -> RunTrace:
    """Run ``strategy`` on ``replay`` for ``budget`` distinct evaluations."""
    start = time.perf_counter()
    search = make_strategy(strategy, replay.space, seed=seed, **(options or {}))
    if prior:
        search.observe_prior(prior)
    seen: set[tuple] = set()
    costs: list[float | None] = []
    configs = []
    propose_s = 0.0
    while len(costs) < budget:
        if time_budget_s is not None and time.perf_counter() - start >= time_budget_s:
            break
        t0 = time.perf_counter()
        batch = search.propose(min(batch_size, budget - len(costs)))
        propose_s += time.perf_counter() - t0
        if not batch:
            break
        observations = []
        for config in batch:
            key = replay.key(config)
            if key in seen:
                raise RuntimeError(f"strategy {strategy} proposed {config} twice")
            seen.add(key)
            cost = replay.cost(config)
            costs.append(cost)
            configs.append(config)
            observations.append(Observation(config, cost / 1e3 if cost is not None else None))
        search.observe(observations)
    return RunTrace(costs, time.perf_counter() - start, propose_s, configs)


def best_at(costs: Sequence[float | None], budget: int) -> float | None:
    ok = [c for c in costs[:budget] if c is not None]
    return min(ok) if ok else None


@dataclass
class CellResult:
    space: str
    strategy: str
    budget: int
    fraction: float  # mean optimum / best found
    fraction_std: float
    score: float  # vs exact random search
    random_fraction: float  # exact expected fraction of random search
    found_time: float  # mean best time found
    random_time: float  # exact expected best time of random search
    optimum: float
    repeats: int
    seconds_per_run: float  # mean wall time of one run to the largest budget
    extra: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {
            "space": self.space, "strategy": self.strategy, "budget": self.budget,
            "fraction": round(self.fraction, 6), "fraction_std": round(self.fraction_std, 6),
            "score": round(self.score, 6), "random_fraction": round(self.random_fraction, 6),
            "found_time": self.found_time, "random_time": self.random_time, "optimum": self.optimum,
            "repeats": self.repeats, "seconds_per_run": round(self.seconds_per_run, 4), **self.extra,
        }


def evaluate(
    replay: ReplaySpace,
    strategy: str,
    budgets: Sequence[int],
    repeats: int,
    batch_size: int = 8,
    seed0: int = 0,
    prior: Sequence[PriorObservation] | None = None,
    label: str | None = None,
    options: dict[str, Any] | None = None,
    time_budget_s: float | None = None,
    on_run: Callable[[RunTrace], None] | None = None,
) -> list[CellResult]:
    """Results of ``repeats`` runs (seeds ``seed0 ..``) at every budget."""
    budgets = sorted(set(int(b) for b in budgets))
    traces = []
    for r in range(repeats):
        trace = replay_run(replay, strategy, budgets[-1], seed0 + r, batch_size, time_budget_s, prior, options)
        traces.append(trace)
        if on_run:
            on_run(trace)
    return summarise(replay, label or strategy, budgets, traces)


def summarise(replay: ReplaySpace, label: str, budgets: Sequence[int], traces: Sequence[RunTrace]) -> list[CellResult]:
    worst = float(replay.sorted_times[-1])
    seconds = float(np.mean([t.seconds for t in traces]))
    out = []
    for b in budgets:
        found = [best_at(t.costs, b) for t in traces]
        fractions = np.array([replay.optimum / f if f is not None else 0.0 for f in found])
        times = np.array([f if f is not None else worst for f in found])
        base = random_baseline(replay.sorted_times, replay.size, b)
        denom = base.best_time - replay.optimum
        score = float((base.best_time - times.mean()) / denom) if denom > 0 else 0.0
        out.append(CellResult(
            space=replay.name, strategy=label, budget=b,
            fraction=float(fractions.mean()), fraction_std=float(fractions.std()),
            score=score, random_fraction=base.fraction, found_time=float(times.mean()),
            random_time=base.best_time, optimum=replay.optimum, repeats=len(traces), seconds_per_run=seconds,
        ))
    return out


def replay_prior(
    source: ReplaySpace, budget: int = 200, seed: int = 1_000_003, strategy: str = "default", weight: float = 0.5
) -> list[PriorObservation]:
    """What a tuning log would hold after a job of ``budget`` trials on ``source``, as a transfer
    prior: one ranking group per source space, ``weight`` < 1 since it is another device."""
    trace = replay_run(source, strategy, budget, seed)
    return [
        PriorObservation(config.to_json(), cost / 1e3 if cost is not None else None, group=source.name, weight=weight)
        for config, cost in zip(trace.configs, trace.costs)
    ]


# -- the benchmark of many strategies on many spaces -----------------------------------------------
class BenchError(ValueError):
    """Benchmark options that cannot run (one-line message)."""


def check_strategies(names: Sequence[str]) -> None:
    """Raise :class:`BenchError` naming the first unknown strategy (before anything runs)."""
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise BenchError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(sorted(STRATEGIES))}")


def bench_strategies(
    spaces: Sequence[ReplaySpace],
    strategies: Sequence[str],
    budgets: Sequence[int],
    repeats: int,
    *,
    batch_size: int = 8,
    seed: int = 0,
    time_budget_s: float | None = None,
    transfer: bool = False,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """Every strategy on every space: the rows of :meth:`CellResult.as_json` plus ``family``,
    ``kernel``, ``prior_records`` and ``seconds_total``, by space, strategy and budget.

    Repeat ``r`` runs with seed ``seed + r``. ``transfer`` adds, after each strategy, the rows of
    ``NAME+transfer``: the strategy started from what a tuning job of the default strategy left on
    every other given space of the same kernel (:func:`replay_prior`). ``jobs`` > 1 runs the
    (space, strategy) cells in that many worker processes. Raises :class:`BenchError`.
    """
    check_strategies(strategies)
    names = [s.name for s in spaces]
    if len(set(names)) != len(names):
        raise BenchError("two spaces have the same name; give each file a distinct name")
    tasks = [(i, strategy, with_prior) for i in range(len(spaces)) for strategy in strategies
             for with_prior in ((False, True) if transfer else (False,))]
    options = {"budgets": budgets, "repeats": repeats, "batch_size": batch_size, "seed": seed,
               "time_budget": time_budget_s}
    if jobs > 1 and len(tasks) > 1:
        # Spawned, never forked: forking this (often threaded) process can leave a worker waiting on a
        # lock another thread held at the fork, and the pool then waits forever. Spaces pickle as
        # their cache data (ReplaySpace.__reduce__).
        pool = multiprocessing.get_context("spawn").Pool(
            min(jobs, len(tasks)), initializer=_init_worker, initargs=(options, spaces))
        with pool:
            results = pool.map(_run_task, tasks, chunksize=1)
    else:
        _init_worker(options, spaces)
        results = [_run_task(t) for t in tasks]
    return [row for cell_rows in results for row in cell_rows]


@dataclass
class FamilySummary:
    """The mean fraction of the optimum over the spaces of one kernel family, per budget."""

    family: str
    random_fraction: dict[int, float]  # exact random search
    fractions: dict[str, dict[int, float]]  # strategy label -> budget -> mean fraction


def family_summaries(rows: Sequence[dict[str, Any]]) -> list[FamilySummary]:
    """Rows of :func:`bench_strategies` averaged per kernel family, in order of first appearance."""
    fractions: dict[str, dict[str, dict[int, list[float]]]] = {}
    randoms: dict[str, dict[int, list[float]]] = {}
    seen_random: set[tuple[str, int]] = set()
    for r in rows:
        by_strategy = fractions.setdefault(r["family"], {})
        by_strategy.setdefault(r["strategy"], {}).setdefault(r["budget"], []).append(r["fraction"])
        if (r["space"], r["budget"]) not in seen_random:  # one exact random value per space and budget
            seen_random.add((r["space"], r["budget"]))
            randoms.setdefault(r["family"], {}).setdefault(r["budget"], []).append(r["random_fraction"])
    return [
        FamilySummary(family, _means(randoms[family]),
                      {strategy: _means(by_budget) for strategy, by_budget in by_strategy.items()})
        for family, by_strategy in fractions.items()
    ]


def _means(by_budget: dict[int, list[float]]) -> dict[int, float]:
    return {b: sum(values) / len(values) for b, values in by_budget.items()}


# The spaces, options and transfer priors of this process: set once per worker (or for a run in
# this process), so tasks carry only indices and cached priors serve every task of the worker.
_STATE: dict[str, Any] = {}


def _init_worker(options: dict[str, Any], spaces: Sequence[ReplaySpace]) -> None:
    _STATE["spaces"] = list(spaces)
    _STATE["options"] = options
    _STATE["priors"] = {}


def _prior_for(i: int) -> list[PriorObservation]:
    """The transfer prior of space ``i``: every other space of the same kernel and knobs."""
    spaces = _STATE["spaces"]
    target = spaces[i]
    prior = []
    for j, source in enumerate(spaces):
        if j == i or source.kernel != target.kernel or source.space.knob_names != target.space.knob_names:
            continue
        if j not in _STATE["priors"]:
            _STATE["priors"][j] = replay_prior(source)
        prior += _STATE["priors"][j]
    return prior


def _run_task(task: tuple[int, str, bool]) -> list[dict[str, Any]]:
    i, strategy, transfer = task
    space = _STATE["spaces"][i]
    opts = _STATE["options"]
    prior = _prior_for(i) if transfer else None
    label = f"{strategy}+transfer" if transfer else strategy
    started = time.perf_counter()
    cells = evaluate(space, strategy, opts["budgets"], opts["repeats"], batch_size=opts["batch_size"],
                     seed0=opts["seed"], prior=prior, label=label, time_budget_s=opts["time_budget"])
    seconds = time.perf_counter() - started
    rows = []
    for cell in cells:
        row = cell.as_json()
        row["family"] = space.family
        row["kernel"] = space.kernel
        row["prior_records"] = len(prior or ())
        row["seconds_total"] = round(seconds, 3)
        rows.append(row)
    return rows
