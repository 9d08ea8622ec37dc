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
