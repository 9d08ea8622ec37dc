"""Array views of spaces used by the strategies: enumeration, validity, sampling, mutation."""

import collections

import numpy as np

from measure_agent.space import BoolKnob, ChoiceKnob, ConfigSpace, Constraint, SplitKnob
from tuner.search.space_index import SpaceIndex


def space():
    return ConfigSpace(
        [SplitKnob("tile", 12, ((1, 2, 4), (1, 2, 3))), ChoiceKnob("order", ("mn", "nm")), BoolKnob("par"),
         ChoiceKnob("unroll", (1, 2, 4, 8)), ChoiceKnob("free", (1, 2, 3))],
        [Constraint(("tile", "unroll"), lambda t, u: t[2] * u <= 8, "mr * unroll <= 8"),
         Constraint(("order", "par"), lambda o, p: o == "mn" or not p, "nm is serial")],
    )


def test_enumeration_matches_the_space():
    s = space()
    index = SpaceIndex(s)
    assert index.enumerable and index.size == s.size
    enumerated = {tuple(row) for row in index.all_digits().tolist()}
    assert enumerated == {s.indices(c) for c in s.iter_valid()}
    assert len(enumerated) == s.size
    for row in index.all_digits()[::7]:
        assert index.row_of(row) is not None and s.is_valid(index.config(row))


def test_valid_mask_and_uniform_sampling():
    s = space()
    index = SpaceIndex(s)
    rng = np.random.default_rng(0)
    raw = np.stack([rng.integers(k.size, size=2000) for k in s.knobs], axis=1)
    expected = np.array([s.is_valid(s.from_indices(r)) for r in raw.tolist()])
    assert np.array_equal(index.valid_mask(raw), expected)
    draws = index.sample(rng, 20000)
    assert index.valid_mask(draws).all()
    counts = collections.Counter(map(tuple, draws.tolist()))
    assert len(counts) == s.size
    assert max(counts.values()) / min(counts.values()) < 3  # ~ 20000 / 102 each


def test_mutation_stays_valid_and_changes_the_asked_number_of_knobs():
    s = space()
    index = SpaceIndex(s)
    rng = np.random.default_rng(1)
    start = index.sample(rng, 500)
    for changes in (1, 2):
        for local in (False, True):
            moved = index.mutate(start, rng, changes, local=local)
            assert index.valid_mask(moved).all()
            diff = np.count_nonzero(moved != start, axis=1)
            assert diff.max() <= changes and (diff > 0).mean() > 0.8


def test_huge_space_is_not_enumerated():
    knobs = [ChoiceKnob(f"k{i}", tuple(range(10))) for i in range(10)]
    s = ConfigSpace(knobs, [Constraint(("k0", "k1"), lambda a, b: a <= b, "k0 <= k1")])
    index = SpaceIndex(s)
    assert not index.enumerable and index.size == s.size == 55 * 10**8
    draws = index.sample(np.random.default_rng(0), 100)
    assert (draws[:, 0] <= draws[:, 1]).all()
