"""Numeric features of configs for the cost model.

Two sources, concatenated into one matrix whose columns are fixed for a space:

* generic knob features, for any space: each knob's value(s) as numbers, their log2 (tile sizes
  act multiplicatively) and the value's position in the knob's order; and for every pair of
  numeric knobs with positive values, log2 of their product and of their ratio (threads per block,
  work per thread and alignment are such products and ratios);
* structural features a template may provide by implementing the narrow :class:`FeatureProvider`
  protocol (``features(workload, config) -> {name: number}``): quantities such as tile footprint
  bytes, trip counts or arithmetic intensity, which mean the same for every workload of an
  operator, so that records of one shape inform the model of another.

Configs of other workloads (with other knob values, e.g. splits of another extent) are featurised
from their values by the same column definitions (:meth:`Featurizer.rows_from_values`): numbers
stay numbers, and what has no meaning in this space (the position of a foreign value) is missing
(NaN), which XGBoost handles natively.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from measure_agent.space import Config, ConfigSpace


@runtime_checkable
class FeatureProvider(Protocol):
    """Optional template capability: structural features of a config of a workload.

    Return the same names for every config of an operator (a missing name is treated as unknown),
    with finite floats, cheaply: strategies call it for every config they score.
    """

    def features(self, workload: Any, config: Config) -> Mapping[str, float]:
        ...


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _log2(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(x > 0, np.log2(np.where(x > 0, x, 1.0)), -1.0)
    return np.where(np.isnan(x), np.nan, out)


class Featurizer:
    """Feature columns of a space, computed many configs at a time.

    ``workload`` and ``provider`` add the provider's structural features for configs of
    ``workload``; ``pairwise`` adds log2 products and ratios of numeric knob pairs.
    """

    def __init__(
        self,
        space: ConfigSpace,
        provider: FeatureProvider | None = None,
        workload: Any = None,
        pairwise: bool = True,
    ) -> None:
        self.space = space
        self.provider = provider
        self.workload = workload
        self.knobs = space.knobs
        # Per knob: (size, n_components) numbers of each value; numeric flags per component.
        self._numbers: list[np.ndarray] = []
        self._numeric: list[bool] = []
        for knob in self.knobs:
            rows = [knob.numeric(v) for v in knob.values]
            width = max(len(r) for r in rows)
            table = np.full((knob.size, width), np.nan)
            for i, r in enumerate(rows):
                table[i, : len(r)] = r
            self._numbers.append(table)
            self._numeric.append(all(_is_number(v) or isinstance(v, tuple) for v in knob.values)
                                 and not all(isinstance(v, bool) for v in knob.values))
        self.columns: list[str] = []
        for knob, table in zip(self.knobs, self._numbers):
            for j in range(table.shape[1]):
                suffix = f"[{j}]" if table.shape[1] > 1 else ""
                self.columns += [f"{knob.name}{suffix}", f"log2({knob.name}{suffix})"]
            self.columns.append(f"index({knob.name})")
        # Components eligible for pairwise features: numeric, positive, not constant.
        self._components: list[tuple[int, int]] = []
        if pairwise:
            for k, (knob, table) in enumerate(zip(self.knobs, self._numbers)):
                if not self._numeric[k]:
                    continue
                for j in range(table.shape[1]):
                    col = table[:, j]
                    if np.all(np.isfinite(col)) and np.all(col > 0) and len(np.unique(col)) > 1:
                        self._components.append((k, j))
        self._pairs = [(a, b) for i, a in enumerate(self._components) for b in self._components[i + 1:]]
        for a, b in self._pairs:
            na, nb = self._component_name(a), self._component_name(b)
            self.columns += [f"log2({na}*{nb})", f"log2({na}/{nb})"]

        self.structural: list[str] = []
        if provider is not None and workload is not None:
            sample = space.sample(np.random.default_rng(0), 1)[0]
            try:
                self.structural = sorted(provider.features(workload, sample))
            except Exception:  # a provider's bug must not stop tuning: knob features only
                self.structural = []
            self.columns += self.structural

    def _component_name(self, comp: tuple[int, int]) -> str:
        k, j = comp
        name = self.knobs[k].name
        return f"{name}[{j}]" if self._numbers[k].shape[1] > 1 else name

    @property
    def width(self) -> int:
        return len(self.columns)

    # -- configs of this space ----------------------------------------------------------------
    def from_digits(self, digits: np.ndarray, configs: Sequence[Config] | None = None) -> np.ndarray:
        """Features of configs of this space given as a digit matrix (see ``SpaceIndex``).

        Structural features need the configs themselves; pass them, or they are rebuilt.
        """
        digits = np.asarray(digits, dtype=np.int64).reshape(-1, len(self.knobs))
        numbers = [self._numbers[k][digits[:, k]] for k in range(len(self.knobs))]
        return self._assemble(numbers, digits.astype(np.float64), self._structural_rows(digits, configs))

    def rows(self, configs: Sequence[Config]) -> np.ndarray:
        """Features of configs of this space."""
        digits = np.array([self.space.indices(c) for c in configs], dtype=np.int64).reshape(len(configs), -1)
        return self.from_digits(digits, configs)

    def _structural_rows(self, digits: np.ndarray, configs: Sequence[Config] | None) -> np.ndarray | None:
        if not self.structural:
            return None
        if configs is None:
            configs = [self.space.from_indices([int(d) for d in row]) for row in digits]
        return self._provider_rows(self.workload, configs)

    def _provider_rows(self, workload: Any, configs: Sequence[Any]) -> np.ndarray:
        out = np.full((len(configs), len(self.structural)), np.nan)
        for i, config in enumerate(configs):
            try:
                values = self.provider.features(workload, config)
            except Exception:  # a provider's bug must not stop tuning: the features are unknown
                continue
            for j, name in enumerate(self.structural):
                value = values.get(name)
                if value is not None and math.isfinite(float(value)):
                    out[i, j] = float(value)
        return out

    # -- configs of other workloads (transfer) -------------------------------------------------
    def rows_from_values(
        self,
        values: Sequence[Mapping[str, Any]],
        workload: Any = None,
        configs: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """Features of configs given as ``{knob: value}`` (JSON form accepted), possibly of another
        workload of the same operator. ``configs`` (the same configs as ``Config`` of that
        workload's space) lets the provider add structural features."""
        n = len(values)
        numbers = [np.full((n, t.shape[1]), np.nan) for t in self._numbers]
        index = np.full((n, len(self.knobs)), np.nan)
        for i, row in enumerate(values):
            for k, knob in enumerate(self.knobs):
                if knob.name not in row:
                    continue
                raw = row[knob.name]
                raw = tuple(raw) if isinstance(raw, list) else raw
                try:
                    d = knob.index_of(raw)
                except ValueError:
                    d = None
                if d is not None:
                    numbers[k][i] = self._numbers[k][d]
                    index[i, k] = d
                elif isinstance(raw, tuple) and all(_is_number(x) for x in raw):
                    width = numbers[k].shape[1]
                    numbers[k][i, : min(width, len(raw))] = [float(x) for x in raw[:width]]
                elif _is_number(raw) and self._numeric[k]:
                    numbers[k][i, 0] = float(raw)
        structural = None
        if self.structural:
            if configs is not None and workload is not None:
                structural = self._provider_rows(workload, configs)
            else:
                structural = np.full((n, len(self.structural)), np.nan)
        return self._assemble(numbers, index, structural)

    # -- shared ----------------------------------------------------------------------------------
    def _assemble(self, numbers: list[np.ndarray], index: np.ndarray, structural: np.ndarray | None) -> np.ndarray:
        n = len(index)
        parts: list[np.ndarray] = []
        for k in range(len(self.knobs)):
            table = numbers[k]
            for j in range(table.shape[1]):
                parts += [table[:, j], _log2(table[:, j])]
            parts.append(index[:, k])
        if self._pairs:
            logs = {c: _log2(numbers[c[0]][:, c[1]]) for c in self._components}
            for a, b in self._pairs:
                parts += [logs[a] + logs[b], logs[a] - logs[b]]

        matrix = np.stack(parts, axis=1) if parts else np.zeros((n, 0))
        if structural is not None:
            matrix = np.concatenate([matrix, structural], axis=1)
        return matrix.astype(np.float32)


def config_features(space: ConfigSpace, configs: Sequence[Config]) -> np.ndarray:
    """A (len(configs), n_features) float32 matrix; columns are the same for every config."""
    return Featurizer(space).rows(configs)
