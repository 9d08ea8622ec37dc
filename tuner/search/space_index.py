"""Array views of a :class:`ConfigSpace` for strategies that handle thousands of configs per batch.

A config is a row of digits (the index of each knob's value). Knobs tied by constraints form
groups; each group's valid combinations are enumerated once (a constraint names a few knobs, so
groups stay small) and encoded as mixed-radix integers, so checking, sampling and mutating many
configs at once are numpy operations, never one ``Config`` at a time. A space whose exact size is
at most ``enumerate_limit`` is enumerated outright (:meth:`SpaceIndex.all_digits`), which lets a
strategy score every config of the space with one model call.

Built only from the space's public structure (knobs and constraints); cached per space object.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace

ENUMERATE_LIMIT = 250_000


@dataclass
class _Group:
    positions: np.ndarray  # knob positions in the space
    radix: np.ndarray  # multipliers turning the group's digits into one code
    codes: np.ndarray | None  # sorted codes of the valid combinations; None: too large to enumerate
    combos: np.ndarray | None  # (n_valid, len(positions)) digits, in code order
    constraints: tuple  # the constraints of this group (for the slow path)


class SpaceIndex:
    def __init__(self, space: ConfigSpace, enumerate_limit: int = ENUMERATE_LIMIT) -> None:
        self.space = space
        self.knobs = space.knobs
        self.names = space.knob_names
        self.sizes = np.array([k.size for k in self.knobs], dtype=np.int64)
        self._position = {name: i for i, name in enumerate(self.names)}
        self.groups = self._build_groups()
        grouped = {int(p) for g in self.groups for p in g.positions}
        self.free = np.array([i for i in range(len(self.knobs)) if i not in grouped], dtype=np.int64)
        if any(g.codes is None for g in self.groups):
            self.size: int | None = None
        else:
            self.size = math.prod(len(g.codes) for g in self.groups) * math.prod(int(self.sizes[i]) for i in self.free)
        self.enumerable = self.size is not None and self.size <= enumerate_limit
        self._all: np.ndarray | None = None
        self._row_of: dict[bytes, int] | None = None

    # -- construction ------------------------------------------------------------------------
    def _build_groups(self) -> list[_Group]:
        parent = list(range(len(self.knobs)))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for c in self.space.constraints:
            first = self._position[c.knobs[0]]
            for other in c.knobs[1:]:
                parent[find(self._position[other])] = find(first)
        members: dict[int, list[int]] = {}
        for c in self.space.constraints:
            for name in c.knobs:
                members.setdefault(find(self._position[name]), [])
        for i in range(len(self.knobs)):
            if find(i) in members:
                members[find(i)].append(i)
        groups = []
        for root, positions in members.items():
            pos = np.array(sorted(positions), dtype=np.int64)
            constraints = tuple(c for c in self.space.constraints if find(self._position[c.knobs[0]]) == root)
            sizes = self.sizes[pos]
            radix = np.ones(len(pos), dtype=np.int64)
            for j in range(len(pos) - 2, -1, -1):
                radix[j] = radix[j + 1] * sizes[j + 1]
            codes = combos = None
            listed = self.space.group_combinations(tuple(self.names[int(p)] for p in pos))
            if listed is not None:
                combos = np.array(listed, dtype=np.int64).reshape(len(listed), len(pos))
                codes = combos @ radix if len(combos) else np.zeros(0, dtype=np.int64)
            groups.append(_Group(pos, radix, codes, combos, constraints))
        return groups

    # -- conversions ---------------------------------------------------------------------------
    def digits_of(self, config: Config) -> np.ndarray:
        return np.array(self.space.indices(config), dtype=np.int64)

    def config(self, digits: Sequence[int]) -> Config:
        return self.space.from_indices([int(d) for d in digits])

    def values(self, digits: Sequence[int]) -> dict[str, Any]:
        return {k.name: k.values[int(d)] for k, d in zip(self.knobs, digits)}

    @staticmethod
    def key(digits: np.ndarray) -> bytes:
        return np.ascontiguousarray(digits, dtype=np.int64).tobytes()

    def keys(self, digits: np.ndarray) -> list[bytes]:
        rows = np.ascontiguousarray(digits, dtype=np.int64)
        width = rows.shape[1] * 8
        raw = rows.tobytes()
        return [raw[i * width:(i + 1) * width] for i in range(len(rows))]

    # -- whole space -----------------------------------------------------------------------------
    def all_digits(self) -> np.ndarray:
        """Every valid config as a (size, n_knobs) digit matrix (only when :attr:`enumerable`)."""
        if not self.enumerable:
            raise OverflowError("space too large to enumerate")
        if self._all is None and self.size == 0:
            self._all = np.zeros((0, len(self.knobs)), dtype=np.int64)
        if self._all is None:
            parts: list[tuple[np.ndarray, np.ndarray]] = [(g.positions, g.combos) for g in self.groups]
            parts += [(np.array([i]), np.arange(self.sizes[i]).reshape(-1, 1)) for i in self.free]
            out = np.zeros((self.size, len(self.knobs)), dtype=np.int64)
            repeat = self.size
            tile = 1
            for positions, combos in parts:
                repeat //= len(combos)
                index = np.tile(np.repeat(np.arange(len(combos)), repeat), tile)
                out[:, positions] = combos[index]
                tile *= len(combos)
            self._all = out
        return self._all

    def row_of(self, digits: np.ndarray) -> int | None:
        """Row of a config in :meth:`all_digits`."""
        if self._row_of is None:
            self._row_of = {k: i for i, k in enumerate(self.keys(self.all_digits()))}
        return self._row_of.get(self.key(digits))

    # -- many configs at once ------------------------------------------------------------------
    def valid_mask(self, digits: np.ndarray) -> np.ndarray:
        digits = np.asarray(digits, dtype=np.int64)
        ok = np.ones(len(digits), dtype=bool)
        for g in self.groups:
            sub = digits[:, g.positions]
            if g.codes is not None:
                code = sub @ g.radix
                where = np.searchsorted(g.codes, code)
                where = np.minimum(where, max(len(g.codes) - 1, 0))
                ok &= (g.codes[where] == code) if len(g.codes) else False
            else:
                for r in np.flatnonzero(ok):
                    values = {self.names[int(p)]: self.knobs[int(p)].values[int(d)] for p, d in zip(g.positions, sub[r])}
                    ok[r] = all(c.holds(values) for c in g.constraints)
        return ok

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` configs drawn uniformly from the valid space (with replacement)."""
        out = np.zeros((n, len(self.knobs)), dtype=np.int64)
        for i in self.free:
            out[:, i] = rng.integers(self.sizes[i], size=n)
        for g in self.groups:
            if g.combos is not None:
                if len(g.combos) == 0:
                    raise ValueError("the space has no valid configuration")
                out[:, g.positions] = g.combos[rng.integers(len(g.combos), size=n)]
            else:
                out[:, g.positions] = self._reject_sample(g, rng, n)
        return out

    def _reject_sample(self, g: _Group, rng: np.random.Generator, n: int) -> np.ndarray:
        found = np.zeros((0, len(g.positions)), dtype=np.int64)
        for _ in range(1000):
            trial = np.stack([rng.integers(self.sizes[p], size=max(4 * n, 64)) for p in g.positions], axis=1)
            full = np.zeros((len(trial), len(self.knobs)), dtype=np.int64)
            full[:, g.positions] = trial
            ok = self._group_ok(g, full)
            found = np.concatenate([found, trial[ok]])
            if len(found) >= n:
                return found[:n]
        raise ValueError("could not sample a valid configuration; constraints too tight")

    def _group_ok(self, g: _Group, digits: np.ndarray) -> np.ndarray:
        ok = np.ones(len(digits), dtype=bool)
        for r in range(len(digits)):
            values = {self.names[int(p)]: self.knobs[int(p)].values[int(digits[r, p])] for p in g.positions}
            ok[r] = all(c.holds(values) for c in g.constraints)
        return ok

    def mutate(self, digits: np.ndarray, rng: np.random.Generator, changes: np.ndarray | int = 1,
               local: bool = False, tries: int = 6) -> np.ndarray:
        """Each row with ``changes`` knobs set to other values, kept valid (a row that found no
        valid move stays as it was). ``local`` moves a value one or two steps in its knob's order
        instead of anywhere."""
        digits = np.asarray(digits, dtype=np.int64)
        n, width = digits.shape
        changes = np.broadcast_to(np.asarray(changes, dtype=np.int64), (n,))
        out = digits.copy()
        todo = np.arange(n)
        movable = np.flatnonzero(self.sizes > 1)
        if len(movable) == 0:
            return out
        steps = np.array([-2, -1, 1, 2])
        for _ in range(tries):
            if len(todo) == 0:
                break
            m = len(todo)
            trial = digits[todo].copy()
            k = np.minimum(changes[todo], len(movable))
            # Distinct random knobs per row: the first k of a random permutation of the movable ones.
            chosen = movable[np.argsort(rng.random((m, len(movable))), axis=1)]
            hit = np.zeros((m, width), dtype=bool)
            for j in range(int(k.max()) if m else 0):
                rows = np.flatnonzero(k > j)
                hit[rows, chosen[rows, j]] = True
            sizes = np.broadcast_to(self.sizes, trial.shape)
            if local:
                step = steps[rng.choice(4, size=trial.shape, p=(0.15, 0.35, 0.35, 0.15))]
                moved = np.clip(trial + step, 0, sizes - 1)
            else:
                new = (rng.random(trial.shape) * np.maximum(sizes - 1, 1)).astype(np.int64)
                moved = new + (new >= trial)
                moved = np.minimum(moved, sizes - 1)
            trial = np.where(hit, moved, trial)
            ok = self.valid_mask(trial) & np.any(trial != digits[todo], axis=1)
            out[todo[ok]] = trial[ok]
            todo = todo[~ok]
        return out


_INDEX_CACHE: "weakref.WeakKeyDictionary[ConfigSpace, SpaceIndex]" = weakref.WeakKeyDictionary()


def space_index(space: ConfigSpace) -> SpaceIndex:
    """The (cached) :class:`SpaceIndex` of ``space``."""
    index = _INDEX_CACHE.get(space)
    if index is None:
        index = _INDEX_CACHE[space] = SpaceIndex(space)
    return index
