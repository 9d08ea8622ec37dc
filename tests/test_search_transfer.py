"""Transfer learning: records of related problems help model-guided search (behaviour, not time)."""

import math

import numpy as np
import pytest

from measure_agent.engine import MeasureResult, MeasureStatus
from measure_agent.space import ChoiceKnob, Config, ConfigSpace, SplitKnob
from measure_agent.templates import Template, TemplateCatalog
from measure_agent.templates.base import KernelSource
from measure_agent.workload import parse_workload
from tuner.cost_model import FeatureProvider, Featurizer
from tuner.job import TuneOptions, TuningJob
from tuner.log import TuningLog
from tuner.measure import SyncMeasurer
from tuner.search import Observation, PriorObservation, make_strategy
from tuner.search.transfer import prior_from_log

# -- strategy level: a pair of related objectives on one space ------------------------------------


def space():
    return ConfigSpace([ChoiceKnob("x", tuple(range(24))), ChoiceKnob("y", tuple(range(24))),
                        ChoiceKnob("z", ("a", "b", "c"))])


def objective_a(c):
    return 1.0 + (c["x"] - 17) ** 2 + 0.5 * (c["y"] - 5) ** 2 + 4.0 * (c["z"] != "b")


def objective_b(c):  # the same shape, another scale and a slightly shifted optimum
    return 3.0 * (1.0 + (c["x"] - 16) ** 2 + 0.6 * (c["y"] - 5) ** 2 + 4.0 * (c["z"] != "b"))


def best_after(budget, seed, prior=None, name="xgb"):
    s = space()
    strategy = make_strategy(name, s, seed=seed)
    if prior:
        strategy.observe_prior(prior)
    found = math.inf
    evaluated = 0
    while evaluated < budget:
        batch = strategy.propose(min(4, budget - evaluated))
        evaluated += len(batch)
        strategy.observe([Observation(c, objective_b(c)) for c in batch])
        found = min([found] + [objective_b(c) for c in batch])
    return found


def prior_records():
    configs = space().sample(np.random.default_rng(123), 150)
    return [PriorObservation(c.to_json(), objective_a(c), group="a@other-device", weight=0.5) for c in configs]


def test_prior_from_a_related_objective_helps():
    prior = prior_records()
    with_prior = [best_after(12, seed, prior) for seed in range(6)]
    without = [best_after(12, seed) for seed in range(6)]
    optimum = 3.0
    assert np.mean(with_prior) < np.mean(without)
    assert np.mean(with_prior) - optimum < 0.5 * (np.mean(without) - optimum)


def test_prior_configs_may_still_be_proposed_and_model_free_strategies_ignore_it():
    prior = prior_records()
    for name in ("random", "ga", "sa", "grid", "xgb"):
        strategy = make_strategy(name, space(), seed=0)
        strategy.observe_prior(prior)
        assert len(strategy.propose(8)) == 8
    strategy = make_strategy("xgb", space(), seed=0)
    strategy.observe_prior(prior)
    assert all(strategy.is_new(space().from_json(p.config)) for p in prior)


def test_prior_with_only_failures_falls_back_to_random_start():
    prior = [PriorObservation({"x": 1, "y": 1, "z": "a"}, None, group="g")]
    strategy = make_strategy("xgb", space(), seed=0)
    strategy.observe_prior(prior)
    assert len(strategy.propose(8)) == 8


# -- job level: the tuning log's records of another workload ------------------------------------


class TiledTemplate(Template):
    """A template whose splits differ per workload, with structural features that do not."""

    op = "matmul"
    target = "cpu"
    version = "t-1"

    def space(self, workload, device=None):
        return ConfigSpace([SplitKnob("tile", workload["M"], ((1, 2, 4, 8, 16, 32),)),
                            ChoiceKnob("unroll", (1, 2, 3, 4, 5, 6, 7, 8)),
                            ChoiceKnob("variant", tuple(range(16)))])

    def default_config(self, workload, space):
        return space.make({"tile": space.knob("tile").values[0], "unroll": 1, "variant": 0})

    def render(self, workload, config):  # pragma: no cover - never built here
        return KernelSource("", "kernel")

    def features(self, workload, config: Config):
        outer, inner = config["tile"]
        return {"tile_bytes": float(inner * workload["K"] * 4), "tiles": float(outer)}


def tiled_cost(workload, config):
    _, inner = config["tile"]
    return (1.0 + abs(math.log2(inner) - 3) + 0.5 * abs(config["unroll"] - 4) + 0.01 * config["variant"]) * workload["M"] / 64


class TiledMeasurer(SyncMeasurer):
    device_key = "scripted"
    device_info = {}
    agent_name = "scripted"
    template_version = "t-1"

    def measure_now(self, items):
        return [MeasureResult(MeasureStatus.OK, costs=(tiled_cost(i.workload, i.config),)) for i in items]


def test_template_features_are_a_narrow_protocol():
    template = TiledTemplate()
    assert isinstance(template, FeatureProvider)
    workload = parse_workload("matmul(M=96,N=8,K=8)")
    s = template.space(workload)
    f = Featurizer(s, provider=template, workload=workload)
    assert f.structural == ["tile_bytes", "tiles"]
    rows = f.rows(list(s.iter_valid())[:5])
    assert rows.shape == (5, f.width) and np.all(np.isfinite(rows))
    other = parse_workload("matmul(M=64,N=8,K=8)")
    o_space = template.space(other)
    config = o_space.make({"tile": (8, 8), "unroll": 4, "variant": 0})
    foreign = f.rows_from_values([config.as_dict()], other, [config])
    assert foreign[0, f.columns.index("tile_bytes")] == 8 * 8 * 4
    assert np.isnan(foreign[0, f.columns.index("index(tile)")])  # (8, 8) is not a split of 96


def tune(log, workload, trials, seed, transfer, strategy="xgb"):
    catalog = TemplateCatalog("tiled", [TiledTemplate()])
    options = TuneOptions(trials=trials, strategy=strategy, seed=seed, batch_size=4, transfer=transfer)
    return TuningJob(workload, TiledMeasurer(), log, catalog, options).run()


@pytest.fixture()
def make_log(tmp_path):
    logs = []

    def make(name):
        log = TuningLog(f"sqlite:///{tmp_path / name}.db")
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


def test_job_starts_from_the_log_records_of_another_workload(make_log):
    a = parse_workload("matmul(M=64,N=8,K=8)")
    b = parse_workload("matmul(M=96,N=8,K=8)")
    found = {True: [], False: []}
    for seed in range(8):  # a mean over enough seeds: single runs of 10 trials vary by 2x
        for transfer in (True, False):
            log = make_log(f"log-{seed}-{transfer}")
            tune(log, a, trials=40, seed=100, transfer=False, strategy="random")
            summary = tune(log, b, trials=10, seed=seed, transfer=transfer)
            assert summary.measured_now == 10
            found[transfer].append(summary.best.mean_s)
            prior = prior_from_log(log, b, "scripted", "cpu", space_of=TiledTemplate().space)
            assert len(prior) == 40 and {p.group for p in prior} == {f"{a.key}@scripted"}
            assert all(isinstance(p.config, Config) and p.weight == 0.5 for p in prior)
    optimum = 1.0 * 96 / 64
    assert np.mean(found[True]) < np.mean(found[False])
    assert np.mean(found[True]) - optimum < 0.5 * (np.mean(found[False]) - optimum)


def test_job_time_budget_stops_proposing(make_log):
    log = make_log("budget")
    a = parse_workload("matmul(M=64,N=8,K=8)")
    catalog = TemplateCatalog("tiled", [TiledTemplate()])
    options = TuneOptions(trials=200, strategy="random", batch_size=4, time_budget_s=0.0)
    summary = TuningJob(a, TiledMeasurer(), log, catalog, options).run()
    assert summary.stopped_early
    assert 1 <= summary.measured_now <= 4  # the first window is drained, nothing more proposed


def test_no_transfer_ignores_other_workloads(make_log, monkeypatch):
    log = make_log("off")
    a = parse_workload("matmul(M=64,N=8,K=8)")
    b = parse_workload("matmul(M=96,N=8,K=8)")
    tune(log, a, trials=12, seed=0, transfer=False, strategy="random")
    calls = []
    import tuner.job

    real = tuner.job.prior_from_log
    monkeypatch.setattr(tuner.job, "prior_from_log", lambda *a, **k: calls.append(1) or real(*a, **k))
    tune(log, b, trials=4, seed=0, transfer=False)
    assert calls == []
    tune(log, b, trials=8, seed=0, transfer=True)
    assert calls == [1]


def test_a_prior_alone_guides_the_first_proposals_on_a_space_too_large_to_enumerate():
    """A job's first proposal may come before any of its own results: with a prior the model is
    trained already, and annealing must start from random points (it crashed on no starts)."""
    knobs = [ChoiceKnob(f"k{i}", tuple(range(10))) for i in range(10)]
    space = ConfigSpace(knobs)
    rng = np.random.default_rng(0)
    prior = [PriorObservation(c.to_json(), 1.0 + sum(c[f"k{i}"] for i in range(10)), group="other", weight=0.5)
             for c in space.sample(rng, 40)]
    search = make_strategy("xgb", space, seed=0)
    search.observe_prior(prior)
    picks = search.propose(8)
    assert len(picks) == 8 and len({c.digest for c in picks}) == 8
    assert all(space.is_valid(c) for c in picks)
