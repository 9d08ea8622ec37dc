"""Replay of recorded tuning spaces (Kernel Tuner cache files): offline strategy benchmarks."""

from tuner.replay.baseline import RandomBaseline, random_baseline, rank_probabilities
from tuner.replay.bench import CellResult, RunTrace, evaluate, replay_run, summarise
from tuner.replay.cache import FAILED_TIMES, ReplayError, ReplaySpace, load_cache, parse_cache

__all__ = [
    "FAILED_TIMES", "CellResult", "RandomBaseline", "ReplayError", "ReplaySpace", "RunTrace", "evaluate",
    "load_cache", "parse_cache", "random_baseline", "rank_probabilities", "replay_run", "summarise",
]
