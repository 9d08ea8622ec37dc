"""Exact expectations of random search, from the sorted times of a space (no simulation).

Uniform sampling of ``n`` distinct configs out of ``N`` (``N - V`` of which fail) finds as best
the valid config of rank ``i`` (times sorted, fastest first) with probability ``q_i - q_{i+1}``
where ``q_i = C(N - i + 1, n) / C(N, n)`` is the probability that none of the ``i - 1`` faster
configs was drawn. ``q_{V+1}`` is the probability that no valid config was drawn at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RandomBaseline:
    best_time: float  # expected best time found (a run that finds nothing counts the worst valid time)
    fraction: float  # expected optimum / best time (a run that finds nothing counts 0)
    p_none: float  # probability that no valid config is drawn


def rank_probabilities(n_total: int, n_valid: int, budget: int) -> tuple[np.ndarray, float]:
    """(P(best found has rank i) for i = 1..n_valid, P(nothing valid found))."""
    if not 0 < n_valid <= n_total:
        raise ValueError("need 0 < n_valid <= n_total")
    n = min(max(int(budget), 0), n_total)
    i = np.arange(1, n_valid + 1, dtype=np.float64)
    remaining = n_total - i + 1  # configs left once the i - 1 faster ones are excluded
    ratio = np.clip((remaining - n) / remaining, 0.0, 1.0)  # q_{i+1} / q_i
    q_next = np.cumprod(ratio)  # q_{i+1}
    q = np.concatenate([[1.0], q_next[:-1]])  # q_i
    return q - q_next, float(q_next[-1])


def random_baseline(sorted_times: np.ndarray, n_total: int, budget: int) -> RandomBaseline:
    """Exact expected result of random search without replacement at ``budget`` evaluations.

    ``sorted_times`` are the valid configs' times, ascending; ``n_total`` counts failed configs too.
    """
    times = np.asarray(sorted_times, dtype=np.float64)
    p, p_none = rank_probabilities(n_total, len(times), budget)
    best = float(p @ times + p_none * times[-1])
    fraction = float(p @ (times[0] / times))
    return RandomBaseline(best, fraction, p_none)
