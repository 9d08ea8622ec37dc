"""Replay of recorded tuning spaces (Kernel Tuner cache files): offline strategy benchmarks."""

from tuner.replay.baseline import RandomBaseline, random_baseline, rank_probabilities
from tuner.replay.bench import (
    BenchError, CellResult, FamilySummary, RunTrace, bench_strategies, check_strategies, evaluate, family_summaries,
    replay_prior, replay_run, summarise,
)
from tuner.replay.cache import FAILED_TIMES, ReplayError, ReplaySpace, find_cache_files, load_cache, parse_cache

__all__ = [
    "FAILED_TIMES", "BenchError", "CellResult", "FamilySummary", "RandomBaseline", "ReplayError", "ReplaySpace",
    "RunTrace", "bench_strategies", "check_strategies", "evaluate", "family_summaries", "find_cache_files",
    "load_cache", "parse_cache", "random_baseline", "rank_probabilities", "replay_prior", "replay_run", "summarise",
]
