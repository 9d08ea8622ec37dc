"""Strategies against a synthetic objective: contract and (for xgb) that the model helps."""

import numpy as np
import pytest

from measure_agent.space import ChoiceKnob, ConfigSpace, Constraint
from tuner.search import DEFAULT_STRATEGY, STRATEGIES, Observation, make_strategy


def synthetic_space():
    return ConfigSpace(
        [
            ChoiceKnob("x", tuple(range(20))),
            ChoiceKnob("y", tuple(range(20))),
            ChoiceKnob("z", ("a", "b", "c")),
        ],
        [Constraint(("x", "y"), lambda x, y: x + y >= 2, "x + y >= 2")],
    )


def cost(config):
    if config["z"] == "c" and config["x"] % 5 == 0:
        return None  # a failing region
    return 1.0 + (config["x"] - 13) ** 2 + 0.5 * (config["y"] - 4) ** 2 + (config["z"] == "b") * 3.0


def run(strategy_name, budget, seed, batch=8):
    space = synthetic_space()
    strategy = make_strategy(strategy_name, space, seed=seed)
    seen = set()
    best = float("inf")
    while len(seen) < budget:
        batch_configs = strategy.propose(min(batch, budget - len(seen)))
        if not batch_configs:
            break
        for c in batch_configs:
            assert space.is_valid(c)
            assert c.digest not in seen, "strategy proposed a config twice"
            seen.add(c.digest)
        observations = [Observation(c, cost(c)) for c in batch_configs]
        strategy.observe(observations)
        best = min([best] + [o.cost for o in observations if o.cost is not None])
    return best, len(seen)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_contract_distinct_valid_configs(name):
    best, n = run(name, 40, seed=1)
    assert n == 40
    assert best < float("inf")


def test_grid_exhausts_the_space_then_proposes_nothing():
    space = synthetic_space()
    strategy = make_strategy("grid", space)
    total = 0
    while batch := strategy.propose(100):
        total += len(batch)
    assert total == space.size


def test_history_is_never_proposed_again():
    space = synthetic_space()
    history = space.sample(np.random.default_rng(5), 30)
    for name in STRATEGIES:
        strategy = make_strategy(name, space, seed=2)
        strategy.observe([Observation(c, cost(c)) for c in history])
        proposed = strategy.propose(50)
        assert not {c.digest for c in proposed} & {c.digest for c in history}


def trajectory(name, seed, budget=48, batch=8, space=None, cost=cost):
    space = space or synthetic_space()
    strategy = make_strategy(name, space, seed=seed)
    proposed = []
    while len(proposed) < budget:
        configs = strategy.propose(batch)
        if not configs:
            break
        proposed += configs
        strategy.observe([Observation(c, cost(c)) for c in configs])
    return proposed


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_same_seed_same_proposals(name):
    assert trajectory(name, 9) == trajectory(name, 9)
    if name != "grid":
        assert trajectory(name, 9) != trajectory(name, 10)


def test_strategy_names_and_default_alias():
    assert {"random", "grid", "ga", "sa", "xgb", "default"} <= set(STRATEGIES)
    assert DEFAULT_STRATEGY == "default"
    assert STRATEGIES["default"] in {STRATEGIES[n] for n in ("random", "grid", "ga", "sa", "xgb")}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_history_from_a_resumed_job_is_never_proposed_again_after_many_batches(name):
    space = synthetic_space()
    history = space.sample(np.random.default_rng(3), 60)
    strategy = make_strategy(name, space, seed=4)
    strategy.observe([Observation(c, cost(c)) for c in history])
    seen = {c.digest for c in history}
    for _ in range(8):
        batch = strategy.propose(8)
        assert len(batch) == 8
        digests = {c.digest for c in batch}
        assert len(digests) == 8 and not digests & seen
        seen |= digests
        strategy.observe([Observation(c, cost(c)) for c in batch])


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_small_space_is_exhausted_without_repeats(name):
    space = ConfigSpace([ChoiceKnob("a", (1, 2, 3)), ChoiceKnob("b", (1, 2, 4, 8))],
                        [Constraint(("a", "b"), lambda a, b: a * b != 8, "a * b != 8")])
    strategy = make_strategy(name, space, seed=0)
    seen = []
    while batch := strategy.propose(4):
        seen += batch
        strategy.observe([Observation(c, float(c["a"] + c["b"])) for c in batch])
    assert len(seen) == len({c.digest for c in seen}) == space.size == 10


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategies_work_on_a_space_of_billions(name):
    knobs = [ChoiceKnob(f"k{i}", tuple(range(10))) for i in range(10)]
    space = ConfigSpace(knobs, [Constraint(("k0", "k1"), lambda a, b: a + b <= 12, "k0 + k1 <= 12"),
                                Constraint(("k2", "k3", "k4"), lambda a, b, c: a != b or c == 0, "k2 != k3 or k4 == 0")])
    assert space.size > 10**9
    configs = trajectory(name, 1, budget=40, space=space, cost=lambda c: 1.0 + sum((c[f"k{i}"] - 4) ** 2 for i in range(10)))
    assert len(configs) == len({c.digest for c in configs}) == 40
    assert all(space.is_valid(c) for c in configs)


@pytest.mark.parametrize("name", ["xgb", "default", "ga"])
def test_guided_search_beats_random_on_a_structured_objective(name):
    seeds = range(6)
    found = np.mean([run(name, 60, s)[0] for s in seeds])
    rnd = np.mean([run("random", 60, s)[0] for s in seeds])
    optimum = 1.0
    assert found < rnd
    if name != "ga":
        assert found - optimum < 0.5 * (rnd - optimum)


def test_regression_objective_also_searches():
    space = synthetic_space()
    strategy = make_strategy("xgb", space, seed=0, objective="reg:squarederror")
    assert strategy.model.objective == "reg:squarederror"
    best = float("inf")
    for _ in range(8):
        batch = strategy.propose(8)
        strategy.observe([Observation(c, cost(c)) for c in batch])
        best = min([best] + [cost(c) for c in batch if cost(c) is not None])
    assert best < 10


def flat_top_cost(config):
    # Most configs within a few percent of the best: a plateau of good configs (pnpoly-like).
    return 1.0 + 0.01 * ((config["x"] * 7 + config["y"]) % 5) + 0.02 * (config["z"] == "b")


def objectives_after(cost_fn, batches, **options):
    strategy = make_strategy("xgb", synthetic_space(), seed=3, **options)
    seen = []
    for _ in range(batches):
        batch = strategy.propose(8)
        strategy.observe([Observation(c, cost_fn(c)) for c in batch])
        seen.append(strategy.model.objective if strategy.model.trained else None)
    return seen


def test_auto_objective_ranks_with_ndcg_where_the_random_picks_show_a_flat_top():
    # The first model batch is proposed after two random batches (16 configs).
    assert objectives_after(flat_top_cost, 4)[2:] == ["rank:ndcg", "rank:ndcg"]
    assert objectives_after(cost, 4)[2:] == ["rank:pairwise", "rank:pairwise"]


def test_auto_objective_keeps_pairwise_until_enough_random_picks_succeeded():
    def mostly_failing(config):
        return flat_top_cost(config) if config["x"] < 2 else None

    assert set(objectives_after(mostly_failing, 3)) <= {None, "rank:pairwise"}


def test_an_explicit_objective_is_kept():
    assert objectives_after(flat_top_cost, 4, objective="rank:pairwise")[2:] == ["rank:pairwise"] * 2


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'magic'"):
        make_strategy("magic", synthetic_space())


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_config_claimed_by_the_caller_is_never_proposed(name):
    space = ConfigSpace([ChoiceKnob("a", (1, 2, 3)), ChoiceKnob("b", (1, 2, 4))])
    strategy = make_strategy(name, space, seed=0)
    default = space.make({"a": 2, "b": 2})
    assert strategy.claim(default) and not strategy.claim(default)
    proposed = []
    while batch := strategy.propose(3):
        assert len(batch) == 3 or len(proposed) + len(batch) == space.size - 1
        proposed += batch
        strategy.observe([Observation(c, float(c["a"] * c["b"])) for c in batch])
    assert default.digest not in {c.digest for c in proposed}
    assert len(proposed) == len({c.digest for c in proposed}) == space.size - 1


def _initial_picks(space, seed, pool, n=12):
    strategy = make_strategy("xgb", space, seed=seed, initial_pool=pool)
    picks = strategy.propose(5) + strategy.propose(n - 5)  # pending picks count for the spread
    assert len({c.digest for c in picks}) == n and all(space.is_valid(c) for c in picks)
    return picks


def _values_covered(space, picks):
    return sum(len({c[k.name] for c in picks}) for k in space.knobs)


@pytest.mark.parametrize("huge", [False, True])
def test_the_initial_design_covers_more_knob_values_than_uniform_picks(huge):
    # Six knobs of 8 values (262,144 configs, or 8^12 when huge: sampled, never enumerated).
    space = ConfigSpace([ChoiceKnob(f"k{i}", tuple(range(8))) for i in range(12 if huge else 6)])
    spread = [_values_covered(space, _initial_picks(space, seed, pool=8)) for seed in range(10)]
    uniform = [_values_covered(space, _initial_picks(space, seed, pool=1)) for seed in range(10)]
    assert np.mean(spread) > np.mean(uniform) + 0.5 * len(space.knobs)


def test_the_initial_design_spreads_away_from_a_config_measured_first():
    space = ConfigSpace([ChoiceKnob(f"k{i}", tuple(range(4))) for i in range(4)])
    default = space.from_json({f"k{i}": 0 for i in range(4)})
    near = 0
    for seed in range(10):
        strategy = make_strategy("xgb", space, seed=seed)
        strategy.claim(default)
        strategy.observe([Observation(default, 1.0)])
        near += sum(np.count_nonzero([c[k.name] == 0 for k in space.knobs]) >= 3 for c in strategy.propose(8))
    # Uniform picks are within one knob of the default with probability 13/255 (about 4 in 80).
    assert near == 0


def test_random_draws_find_the_last_unseen_configs_of_a_mostly_explored_space():
    """Random draws that keep hitting seen configs must not pass for an exhausted space: the job
    loop ends on an empty proposal."""
    space = synthetic_space()
    strategy = make_strategy("random", space, seed=0)
    every = list(space.iter_valid())
    left = every[7::97][:3]
    for config in every:
        if config not in left:
            strategy.claim(config)
    found = strategy.random_new(5)
    assert sorted(c.digest for c in found) == sorted(c.digest for c in left)
    assert strategy.random_new(1) == []  # now it is exhausted


def test_children_are_new_crossovers_of_the_elite():
    """Breeding without random mutation: children are new valid crossovers of the measured elite
    (only a child that would equal a parent is mutated, to be new)."""
    space = synthetic_space()
    strategy = make_strategy("ga", space, seed=3)
    measured = strategy.propose(40)
    strategy.observe([Observation(c, cost(c)) for c in measured])
    ranked = sorted((c for c in measured if cost(c) is not None), key=cost)[:8]
    elite_values = {k: {c[k] for c in ranked} for k in ("x", "y", "z")}
    children = strategy.breed(10, population=8, mutation_rate=0.0)
    assert len(children) == 10
    seen = {c.digest for c in measured}
    for child in children:
        assert space.is_valid(child) and child.digest not in seen
        seen.add(child.digest)
    inherited = [all(child[k] in elite_values[k] for k in ("x", "y", "z")) for child in children]
    assert sum(inherited) >= len(children) // 2
    # the random configs measured first are mostly far from the elite's values: breeding is not random
    assert sum(all(c[k] in elite_values[k] for k in ("x", "y", "z")) for c in measured[:10]) < 5


def test_the_default_breeds_from_its_elite_once_its_model_stalls():
    """Costs that never improve after the first batches: the default stops trusting its model
    alone and part of each later batch is bred from the best measured configs."""
    space = synthetic_space()
    strategy = make_strategy(DEFAULT_STRATEGY, space, seed=0, stall_batches=2)
    bred_calls = []
    original = strategy.breed
    strategy.breed = lambda n, *a, **k: bred_calls.append(n) or original(n, *a, **k)
    for _ in range(3):
        batch = strategy.propose(8)
        strategy.observe([Observation(c, 1.0) for c in batch])  # a flat objective: no progress
    assert not bred_calls  # the first batch set the best, the next two did not beat it
    for _ in range(3):
        batch = strategy.propose(8)
        strategy.observe([Observation(c, 1.0) for c in batch])
    assert len(bred_calls) == 3 and sum(bred_calls) >= 6
