"""tunefleet's tuner: the coordinator that owns the tuning log and drives measurement agents.

For applications: ``tuner.best_kernel(workload)`` returns a compiled kernel with the best known
config (see :mod:`tuner.apply`). It is imported lazily, so ``import tuner`` stays light and numba
is not imported before ``best_kernel`` has set numba's environment.
"""

__all__ = ["best_kernel"]


def __getattr__(name: str):
    if name == "best_kernel":
        from tuner.apply import best_kernel

        return best_kernel
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
