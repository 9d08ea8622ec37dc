"""Inputs, reference outputs and the correctness check of a measured kernel."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from measure_agent.engine.arrays import aligned_copy
from measure_agent.workload import Workload

# Inputs are drawn from a fixed seed so every agent checks against the same problem.
INPUT_SEED = 20261129


@dataclass(frozen=True)
class Problem:
    """Inputs of a workload with the expected output and its error bound."""

    inputs: tuple[np.ndarray, ...]
    expected: np.ndarray
    tolerance: np.ndarray  # per-element bound on |actual - expected|


def make_inputs(workload: Workload) -> tuple[np.ndarray, ...]:
    """The workload's inputs as :func:`make_problem` draws them, without the reference: what an
    application timing a kernel needs. (Computing the reference runs numpy's BLAS, whose threads
    then spin for ~0.1-0.2 s and slow a parallel kernel timed in that window up to 2x.) They are
    64-byte aligned C-contiguous arrays: a kernel's speed may depend on where an array starts
    (:mod:`measure_agent.engine.arrays`)."""
    rng = np.random.default_rng(INPUT_SEED)
    return tuple(aligned_copy(x) for x in workload.spec.make_inputs(workload.params, np.dtype(workload.dtype), rng))


def make_problem(workload: Workload) -> Problem:
    """Random inputs, the numpy reference and a rigorous per-element error bound.

    For sums of products (matmul, conv, dense) the rounding error of any summation order is at
    most ``n * eps * (|A| |B|)`` (Higham); kernel and reference may each be off by that much, so
    their difference is bounded by twice it. A wrong kernel misses by far more.
    """
    spec = workload.spec
    params = workload.params
    dtype = np.dtype(workload.dtype)
    inputs = make_inputs(workload)
    expected = spec.reference(params, *inputs)
    magnitude = spec.reference(params, *(np.abs(x) for x in inputs))
    n = spec.reduction_length(params)
    eps = np.finfo(dtype).eps
    tolerance = 2.0 * (n + 2) * eps * magnitude + np.finfo(dtype).tiny
    return Problem(inputs=inputs, expected=expected, tolerance=tolerance)


@dataclass(frozen=True)
class CheckResult:
    correct: bool
    max_abs_error: float
    max_rel_error: float


def check_output(problem: Problem, actual: np.ndarray) -> CheckResult:
    if actual.shape != problem.expected.shape:
        return CheckResult(False, float("inf"), float("inf"))
    diff = np.abs(actual.astype(np.float64) - problem.expected.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = bool(np.all(np.isfinite(actual)))
        max_abs = float(np.max(diff)) if diff.size else 0.0
        scale = float(np.max(np.abs(problem.expected))) if diff.size else 1.0
        max_rel = max_abs / scale if scale > 0 else max_abs
        correct = finite and bool(np.all(diff <= problem.tolerance))
    return CheckResult(correct, max_abs if finite else float("inf"), max_rel if finite else float("inf"))
