"""User-defined spaces (Kernel Tuner style): restrictions, tune_function, huge spaces, safety."""

import math

import pytest

from tuner.search import STRATEGIES
from tuner.user_space import RestrictionError, UserSpace, parse_restriction, tune_function

PARAMS = {"block_x": [16, 32, 64, 128, 256], "block_y": [1, 2, 4, 8, 16], "unroll": [1, 2, 4, 8],
          "vector": [1, 2, 4], "cache": ["shared", "global"]}


def objective(p):
    if p["unroll"] == 8 and p["vector"] == 4:
        return None  # a failing corner
    return (1.0 + abs(math.log2(p["block_x"] * p["block_y"]) - 7) + abs(p["unroll"] - 4) / 2
            + (p["cache"] == "global") + 0.5 * (p["vector"] != 2))


def test_string_and_callable_restrictions_define_the_space():
    restrictions = ["block_x * block_y <= 256", "unroll <= 4 or vector == 1",
                    lambda block_y, unroll: block_y >= unroll, lambda p: p["cache"] == "shared" or p["vector"] > 1]
    space = UserSpace(PARAMS, restrictions)
    brute = 0
    import itertools
    for values in itertools.product(*PARAMS.values()):
        p = dict(zip(PARAMS, values))
        ok = (p["block_x"] * p["block_y"] <= 256 and (p["unroll"] <= 4 or p["vector"] == 1)
              and p["block_y"] >= p["unroll"] and (p["cache"] == "shared" or p["vector"] > 1))
        brute += ok
        assert space.is_valid(p) == ok
    assert space.size == brute


def test_a_restriction_only_involves_the_parameters_it_names():
    space = UserSpace(PARAMS, ["block_x * block_y <= 256", lambda unroll, vector: unroll * vector <= 16])
    groups = {tuple(sorted(c.knobs)) for c in space.space.constraints}
    assert groups == {("block_x", "block_y"), ("unroll", "vector")}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_tune_function_with_every_strategy(strategy):
    restrictions = ["block_x * block_y <= 512", lambda block_y, unroll: block_y >= unroll]
    seen = []
    result = tune_function(PARAMS, objective, restrictions, strategy=strategy, budget=40, seed=1,
                           on_result=lambda p, v: seen.append(p))
    space = UserSpace(PARAMS, restrictions)
    assert result.evaluated == 40 == len(seen)
    assert len({tuple(sorted(p.items())) for p in seen}) == 40
    assert all(space.is_valid(p) for p in seen)
    assert result.best is not None and result.best_value == objective(result.best)
    assert result.best_value == min(v for _, v in result.evaluations if v is not None)


def test_budget_time_budget_early_stopping_and_exhaustion():
    tiny = {"a": [1, 2, 3], "b": [1, 2]}
    result = tune_function(tiny, lambda p: p["a"] * p["b"], budget=100)
    assert result.evaluated == 6 and result.stopped == "exhausted" and result.best == {"a": 1, "b": 1}
    result = tune_function(PARAMS, objective, budget=1000, time_budget_s=0.0)
    assert result.stopped == "time" and result.evaluated == 0
    result = tune_function(PARAMS, lambda p: 1.0, budget=200, early_stopping=10, batch_size=4)
    assert result.stopped == "early_stopping" and result.evaluated < 20
    failing = tune_function(tiny, lambda p: float("nan"), budget=3, strategy="random")
    assert failing.best is None and all(v is None for _, v in failing.evaluations)


def test_a_space_of_billions_is_searched_without_enumerating():
    params = {f"p{i}": [1, 2, 4, 8, 16, 32, 64, 128] for i in range(11)}
    restrictions = ["p0 * p1 <= 512", "p2 >= p3", lambda p4, p5: p4 != p5]
    space = UserSpace(params, restrictions)
    assert space.size > 10**9
    # exact: 8^11 narrowed independently by each restriction
    pairs_01 = sum(a * b <= 512 for a in params["p0"] for b in params["p1"])
    assert space.size == pairs_01 * 36 * 56 * 8**5

    def cost(p):
        return sum(abs(math.log2(v) - 3) for v in p.values()) + 1.0

    for strategy in ("default", "random"):
        result = tune_function(space, cost, strategy=strategy, budget=48, seed=0)
        assert result.evaluated == 48
        assert all(space.is_valid(p) for p, _ in result.evaluations)
        assert result.best["p0"] * result.best["p1"] <= 512 and result.best["p2"] >= result.best["p3"]


@pytest.mark.parametrize("text", [
    "__import__('os').system('echo hacked')",
    "open('/etc/passwd')",
    "block_x.__class__",
    "block_x[0]",
    "[x for x in (1, 2)]",
    "lambda: 1",
    "(block_x := 3)",
    "exec('1')",
])
def test_restrictions_refuse_unsafe_code(text):
    with pytest.raises(RestrictionError, match="not allowed"):
        parse_restriction(text, PARAMS)
    with pytest.raises(RestrictionError):
        UserSpace(PARAMS, [text])


def test_restriction_errors_are_clear():
    with pytest.raises(RestrictionError, match="unknown parameter 'block_z'"):
        parse_restriction("block_z < 3", PARAMS)
    with pytest.raises(RestrictionError, match="cannot parse"):
        parse_restriction("block_x <", PARAMS)
    with pytest.raises(RestrictionError, match="always false"):
        UserSpace(PARAMS, ["1 > 2"])
    with pytest.raises(RestrictionError, match="too large"):
        parse_restriction("2 ** block_x ** 9 > 0", PARAMS)({"block_x": 16})


def test_restriction_expressions_evaluate_like_python():
    r = parse_restriction("block_x % (block_y * 2) == 0 and not block_x // 2 > 100 and cache in ('shared',)", PARAMS)
    assert r.names == ("block_x", "block_y", "cache")
    assert r({"block_x": 64, "block_y": 4, "cache": "shared"})
    assert not r({"block_x": 256, "block_y": 4, "cache": "shared"})
    assert not r({"block_x": 64, "block_y": 4, "cache": "global"})
    assert parse_restriction("1 < block_x <= 32", PARAMS)({"block_x": 32})
    assert not parse_restriction("block_x / (block_y - 1) > 1", PARAMS)({"block_x": 4, "block_y": 1})  # x / 0: false
    assert parse_restriction("-block_x if block_y > 2 else +block_x", PARAMS)({"block_x": 4, "block_y": 1}) is True


# -- bad input: clear errors, never a raw traceback from deep inside ------------------------------
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_restrictions_that_exclude_everything_say_so(strategy):
    from measure_agent.space import ConfigError

    with pytest.raises(ConfigError, match=r"no valid configuration: no combination of block_x, block_y satisfies"):
        tune_function(PARAMS, objective, ["block_x * block_y > 4096"], strategy=strategy, budget=5)


def test_grid_walks_a_huge_space_straight_to_its_first_valid_configs():
    # 10^20 configs; only those with a0 == 9 and a19 == 9 are valid: the first one sits past 9e19
    # invalid ones in index order, so grid must skip invalid prefixes instead of scanning.
    params = {f"a{i}": list(range(10)) for i in range(20)}
    result = tune_function(params, lambda p: 1.0 + sum(p.values()), ["a0 == 9 and a19 == 9"],
                           strategy="grid", budget=12)
    assert result.evaluated == 12
    assert all(p["a0"] == 9 and p["a19"] == 9 for p, _ in result.evaluations)
    first = result.evaluations[0][0]
    assert first == {**{f"a{i}": 0 for i in range(20)}, "a0": 9, "a19": 9}
    assert result.evaluations[1][0]["a18"] == 1  # index order: the last free knob moves fastest


def test_iter_valid_is_index_order_and_matches_brute_force():
    import itertools

    space = UserSpace({"a": [1, 2, 3, 4], "b": [1, 2, 3], "c": ["x", "y"], "d": [0, 1, 2]},
                      ["a * d <= 4", lambda b, c: c == "x" or b > 1])
    brute = [p for p in (dict(zip("abcd", v)) for v in itertools.product([1, 2, 3, 4], [1, 2, 3], ["x", "y"], [0, 1, 2]))
             if space.is_valid(p)]
    assert [c.as_dict() for c in space.space.iter_valid()] == brute


@pytest.mark.parametrize("strategy", ["sa", "xgb", "random"])
def test_objective_must_return_a_positive_number_or_none(strategy):
    for bad, message in ((-1.0, "costs must be positive"), (0, "costs must be positive"),
                         ("1.5", "objective returned '1.5'"), (True, "objective returned True"),
                         ([1.0], "objective returned")):
        with pytest.raises(ValueError, match=message):
            tune_function(PARAMS, lambda p, bad=bad: bad, strategy=strategy, budget=3)
    result = tune_function(PARAMS, lambda p: float("nan") if p["unroll"] == 1 else 2.0, strategy=strategy,
                           budget=10, batch_size=5)
    assert all((v is None) == (p["unroll"] == 1) for p, v in result.evaluations)


def test_annealing_accepts_costs_that_are_not_positive():
    from tuner.search import Observation, make_strategy

    search = make_strategy("sa", UserSpace(PARAMS).space, seed=3)
    for _ in range(5):
        batch = search.propose(4)
        search.observe([Observation(c, -10.0 + c["unroll"]) for c in batch])


def test_numpy_values_in_tune_params_become_python_values():
    import json

    import numpy as np

    params = {"a": np.arange(4), "b": [np.float32(0.5), np.float32(1.5)], "c": [np.bool_(False), np.bool_(True)],
              "d": list(np.array([8, 16]))}
    result = tune_function(params, lambda p: 1.0 + p["a"] + p["b"] + p["c"] + p["d"], budget=32, strategy="xgb")
    assert result.best == {"a": 0, "b": 0.5, "c": False, "d": 8}
    assert all(type(v) in (int, float, bool) for p, _ in result.evaluations for v in p.values())
    json.dumps(result.evaluations)
    with pytest.raises(ValueError, match="non-empty list of values"):
        UserSpace({"a": np.zeros((2, 2))})


@pytest.mark.parametrize("params, message", [
    ({"a": [1, [2]]}, "value \\[2\\] is not hashable"),
    ({"a": [1, True]}, "duplicate values 1 and True"),
    ({"a": [2, 2.0]}, "duplicate values 2 and 2.0"),
])
def test_bad_knob_values_are_named(params, message):
    with pytest.raises(ValueError, match=message):
        UserSpace(params)


def test_bad_restrictions_are_explained():
    with pytest.raises(RestrictionError, match="restrictions must be a list"):
        UserSpace(PARAMS, {"block_x": 16})
    # a restriction that cannot be evaluated names itself and the values
    with pytest.raises(RestrictionError, match=r"'cache > 1' cannot be evaluated for cache='shared'"):
        tune_function(PARAMS, objective, ["cache > 1"], budget=3)

    def picky(block_x):
        raise KeyError("oops")

    with pytest.raises(RestrictionError, match=r"restriction picky raised KeyError for block_x=16"):
        tune_function(PARAMS, objective, [picky], budget=3)
    # **kwargs restrictions get every parameter by name
    space = UserSpace(PARAMS, [lambda **p: p["block_x"] * p["block_y"] <= 64])
    assert space.is_valid({"block_x": 16, "block_y": 4, "unroll": 1, "vector": 1, "cache": "shared"})
    assert not space.is_valid({"block_x": 32, "block_y": 4, "unroll": 1, "vector": 1, "cache": "shared"})


@pytest.mark.parametrize("kwargs, error, message", [
    ({"budget": None}, ValueError, "budget must be an integer >= 1"),
    ({"budget": 0}, ValueError, "budget must be an integer >= 1"),
    ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1"),
    ({"time_budget_s": -1}, ValueError, "time_budget_s must be a number >= 0 or None"),
    ({"seed": "x"}, ValueError, "seed must be a non-negative integer or None"),
    ({"prior": [1, 2]}, TypeError, "prior must hold PriorObservation records, not int"),
])
def test_bad_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        tune_function(PARAMS, objective, **kwargs)


def test_seed_none_draws_a_fresh_seed():
    runs = [tune_function(PARAMS, objective, strategy="xgb", budget=10, seed=None) for _ in range(2)]
    assert all(r.evaluated == 10 for r in runs)
    firsts = [[tuple(p.values()) for p, _ in r.evaluations] for r in runs]
    assert firsts[0] != firsts[1]
