"""tunefleet's tuner: the coordinator that owns the tuning log and drives measurement agents.

For applications: ``tuner.best_kernel(workload)`` returns a compiled kernel with the best known
config (see :mod:`tuner.apply`). It is imported lazily, so ``import tuner`` stays light and numba
is not imported before ``best_kernel`` has set numba's environment. ``tuner.empty_aligned(shape,
dtype)`` allocates arrays as the agents time kernels on (64-byte aligned; see
:mod:`measure_agent.engine.arrays`).
"""

__all__ = ["best_kernel", "empty_aligned"]


def __getattr__(name: str):
    if name == "best_kernel":
        from tuner.apply import best_kernel

        return best_kernel
    if name == "empty_aligned":
        from measure_agent.engine.arrays import empty_aligned

        return empty_aligned
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
