"""Operator specifications: parameters, FLOP count, inputs and the numpy reference.

The reference is what every measured kernel is checked against, on every device. It lives with the
agent because the agent checks outputs locally before reporting a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class OperatorSpec:
    """What an operator is, independent of any schedule.

    ``make_inputs(params, dtype, rng)`` returns the input arrays in call order,
    ``reference(*inputs)`` the expected output and ``output_shape(params)`` its shape.
    """

    name: str
    params: tuple[str, ...]
    flops: Callable[[dict[str, int]], int]
    make_inputs: Callable[[dict[str, int], np.dtype, np.random.Generator], tuple[np.ndarray, ...]]
    reference: Callable[..., np.ndarray]
    output_shape: Callable[[dict[str, int]], tuple[int, ...]]
    reduction_length: Callable[[dict[str, int]], int]
    max_size: int = 1 << 16

    @property
    def signature(self) -> str:
        return f"{self.name}({','.join(p + '=INT' for p in self.params)}[,dtype=float32|float64])"


def _matmul_inputs(p: dict[str, int], dtype: np.dtype, rng: np.random.Generator):
    a = rng.uniform(-1.0, 1.0, size=(p["M"], p["K"])).astype(dtype)
    b = rng.uniform(-1.0, 1.0, size=(p["K"], p["N"])).astype(dtype)
    return a, b


MATMUL = OperatorSpec(
    name="matmul",
    params=("M", "N", "K"),
    flops=lambda p: 2 * p["M"] * p["N"] * p["K"],
    make_inputs=_matmul_inputs,
    reference=lambda a, b: a @ b,
    output_shape=lambda p: (p["M"], p["N"]),
    reduction_length=lambda p: p["K"],
)

OPERATORS: dict[str, OperatorSpec] = {spec.name: spec for spec in (MATMUL,)}
