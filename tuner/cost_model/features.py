"""Numeric features of configs for the cost model.

Each knob contributes its value(s) as numbers, their log2 (tile sizes act multiplicatively) and
its position in the knob's value order.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace


def config_features(space: ConfigSpace, configs: Sequence[Config]) -> np.ndarray:
    """A (len(configs), n_features) float32 matrix; columns are the same for every config."""
    rows = []
    for config in configs:
        row: list[float] = []
        for knob in space.knobs:
            value = config[knob.name]
            numbers = knob.numeric(value)
            row.extend(numbers)
            row.extend(math.log2(x) if x > 0 else -1.0 for x in numbers)
            row.append(float(knob.index_of(value)))
        rows.append(row)
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
