"""Strategies against a synthetic objective: contract and (for xgb) that the model helps."""

import numpy as np
import pytest

from measure_agent.space import ChoiceKnob, ConfigSpace, Constraint
from tuner.search import STRATEGIES, Observation, make_strategy


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


def test_same_seed_same_proposals():
    a = make_strategy("xgb", synthetic_space(), seed=9).propose(10)
    b = make_strategy("xgb", synthetic_space(), seed=9).propose(10)
    assert a == b


def test_xgb_beats_random_on_a_structured_objective():
    seeds = range(6)
    xgb = np.mean([run("xgb", 60, s)[0] for s in seeds])
    rnd = np.mean([run("random", 60, s)[0] for s in seeds])
    optimum = 1.0
    assert xgb < rnd
    assert xgb - optimum < 0.5 * (rnd - optimum)


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'magic'"):
        make_strategy("magic", synthetic_space())
