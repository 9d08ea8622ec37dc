import itertools
import json

import numpy as np
import pytest

from measure_agent.space import BoolKnob, ChoiceKnob, ConfigError, ConfigSpace, Constraint, SplitKnob


def small_space():
    return ConfigSpace(
        [
            SplitKnob("tile_m", 10, ((1, 2, 4), (1, 2, 3))),
            ChoiceKnob("order", ("mn", "nm")),
            BoolKnob("parallel"),
            ChoiceKnob("unroll", (1, 2, 4)),
        ],
        [Constraint(("tile_m", "unroll"), lambda t, u: t[2] * u <= 6, "mr * unroll <= 6")],
    )


def brute_force_valid(space):
    out = []
    for values in itertools.product(*(k.values for k in space.knobs)):
        config = space._config_unchecked(dict(zip(space.knob_names, values)))
        if space.is_valid(config):
            out.append(config)
    return out


def test_split_values_have_ceil_outer_and_bounded_product():
    knob = SplitKnob("m", 10, ((1, 2, 4, 8, 16), (1, 3)))
    for outer, f1, f2 in knob.values:
        assert f1 * f2 <= 10
        assert outer == -(-10 // (f1 * f2))
    assert (1, 16, 1) not in knob.values  # tile larger than the axis is not a member
    assert knob.values[0] == (10, 1, 1)


def test_size_counts_exactly_without_enumerating_product():
    space = small_space()
    assert space.size == len(brute_force_valid(space))
    assert space.size < space.product_size


def test_index_roundtrip_and_json_roundtrip():
    space = small_space()
    for config in brute_force_valid(space):
        assert space.from_index(space.index_of(config)) == config
        text = config.json_text()
        assert space.from_json(json.loads(text)) == config
        assert space.from_json(text) == config


def test_sampling_is_uniform_over_valid_configs():
    space = small_space()
    valid = brute_force_valid(space)
    rng = np.random.default_rng(1)
    draws = space.sample(rng, 200 * len(valid))
    counts = {c.digest: 0 for c in valid}
    for c in draws:
        assert space.is_valid(c)
        counts[c.digest] += 1
    expected = 200
    assert min(counts.values()) > expected * 0.6 and max(counts.values()) < expected * 1.4


def test_neighbours_differ_in_one_knob_and_are_valid():
    space = small_space()
    config = space.sample(np.random.default_rng(3))[0]
    neighbours = space.neighbours(config)
    assert neighbours
    for n in neighbours:
        assert space.is_valid(n)
        diffs = [a for a, b in zip(config.items, n.items) if a != b]
        assert len(diffs) == 1


def test_iter_valid_matches_brute_force():
    space = small_space()
    assert [c.digest for c in space.iter_valid()] == [c.digest for c in brute_force_valid(space)]


@pytest.mark.parametrize(
    "obj, fragment",
    [
        ({"tile_m": [5, 2, 1], "order": "mn", "parallel": True, "unroll": 1, "extra": 1}, "unknown knob 'extra'"),
        ({"tile_m": [5, 2, 1], "order": "mn", "parallel": True}, "lacks knob 'unroll'"),
        ({"tile_m": [5, 2, 1], "order": "zz", "parallel": True, "unroll": 1}, "'zz' of knob order"),
        ({"tile_m": [5, 2, 1], "order": "mn", "parallel": 1, "unroll": 1}, "not true or false"),
        ({"tile_m": [1, 7, 1], "order": "mn", "parallel": True, "unroll": 1}, "not a valid split"),
        ({"tile_m": [2, 2, 3], "order": "mn", "parallel": True, "unroll": 4}, "violates constraint"),
        ("{not json", "not valid JSON"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_invalid_configs_are_refused_with_a_reason(obj, fragment):
    with pytest.raises(ConfigError) as info:
        small_space().from_json(obj)
    assert fragment in str(info.value)


def test_large_space_samples_without_enumeration():
    knobs = [ChoiceKnob(f"k{i}", tuple(range(10))) for i in range(10)]  # 10^10 configs
    space = ConfigSpace(knobs, [Constraint(("k0", "k1"), lambda a, b: a <= b, "k0 <= k1")])
    assert space.size == 55 * 10**8
    configs = space.sample(np.random.default_rng(0), 50)
    assert all(c["k0"] <= c["k1"] for c in configs)
    assert len({c.digest for c in configs}) == 50


def test_from_json_checks_each_value_once_and_gives_what_make_gives():
    """from_json no longer hands its parsed values to make() to be checked a second time: every
    member it accepts is what make() returns, and a bool knob limited to one value still refuses
    the other."""
    space = small_space()
    for config in brute_force_valid(space):
        parsed = space.from_json(json.dumps(config.to_json()))
        assert parsed == space.make(config.as_dict()) and parsed.items == config.items
    only_on = ConfigSpace([BoolKnob("parallel", values=(True,)), ChoiceKnob("unroll", (1, 2))])
    assert only_on.from_json({"parallel": True, "unroll": 2.0})["unroll"] == 2
    with pytest.raises(ConfigError, match="of knob parallel is not one of"):
        only_on.from_json({"parallel": False, "unroll": 1})
