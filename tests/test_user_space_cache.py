"""tune_function's cache file: evaluations persist as they happen, a run resumes from them, and
the file is a Kernel Tuner cache that replay reads (also when the writer died mid-run)."""

import json

import pytest

from tuner.replay.cache import ReplayError, load_cache
from tuner.user_space import CacheFileError, read_cache_json, tune_function

PARAMS = {"x": [1, 2, 3, 4, 5, 6, 7, 8], "y": [1, 2, 4, 8], "mode": ["a", "b"]}
RESTRICTIONS = ["x * y <= 32"]


class Objective:
    """Counts calls; x == 3 raises, x == 7 fails (None)."""

    def __init__(self):
        self.calls = []

    def __call__(self, p):
        self.calls.append(dict(p))
        if p["x"] == 3:
            raise RuntimeError("kernel crashed")
        if p["x"] == 7:
            return None
        return abs(p["x"] - 5) + 0.1 * p["y"] + (p["mode"] == "b") + 0.5


def test_every_evaluation_is_in_the_cache_file_and_a_rerun_resumes_without_repeating(tmp_path):
    path = tmp_path / "tune.json"
    first = Objective()
    r1 = tune_function(PARAMS, first, RESTRICTIONS, budget=12, cache=path, catch=RuntimeError, seed=3)
    assert r1.from_cache == 0 and r1.evaluated == 12 == len(first.calls)
    data = json.loads(path.read_text())  # closed: plain JSON
    assert data["tune_params"] == PARAMS and data["restrictions"] == RESTRICTIONS
    assert len(data["cache"]) == 12
    for params, cost in r1.evaluations:
        entry = data["cache"][",".join(str(params[k]) for k in PARAMS)]
        assert entry["time"] == (cost if cost is not None else "RuntimeFailedConfig")

    second = Objective()
    r2 = tune_function(PARAMS, second, RESTRICTIONS, budget=30, cache=path, catch=RuntimeError, seed=3)
    assert r2.from_cache == 12 and r2.evaluated == 30 and len(second.calls) == 18
    measured = [tuple(p.values()) for p, _ in r2.evaluations]
    assert len(set(measured)) == 30  # nothing evaluated twice
    assert not {tuple(p.values()) for p in second.calls} & {tuple(p.values()) for p in first.calls}
    assert r2.best_value <= r1.best_value
    assert len(json.loads(path.read_text())["cache"]) == 30

    third = Objective()
    r3 = tune_function(PARAMS, third, RESTRICTIONS, budget=30, cache=path, seed=3)
    assert third.calls == [] and r3.evaluated == 30 and r3.best_value == r2.best_value


def test_a_run_killed_mid_way_leaves_a_readable_cache_and_resumes(tmp_path):
    path = tmp_path / "tune.json"
    objective = Objective()

    def dies_on_the_ninth(p):
        if len(objective.calls) == 8:
            raise KeyboardInterrupt
        return objective(p)

    with pytest.raises(KeyboardInterrupt):
        tune_function(PARAMS, dies_on_the_ninth, RESTRICTIONS, budget=20, cache=path, catch=RuntimeError)
    assert len(read_cache_json(path)["cache"]) == 8

    # A writer that died without closing, with half a line at the end (as Kernel Tuner leaves one).
    text = path.read_text().rstrip()
    assert text.endswith("}\n}")
    body = text[:-len("}\n}")].rstrip() + ",\n" + '"9,9,z": {"x": 9, "y"'
    path.write_text(body)
    assert len(read_cache_json(path)["cache"]) == 8
    assert load_cache(path).size == sum(x * y <= 32 for x in PARAMS["x"] for y in PARAMS["y"]) * 2

    again = Objective()
    result = tune_function(PARAMS, again, RESTRICTIONS, budget=20, cache=path, catch=RuntimeError)
    assert result.from_cache == 8 and len(again.calls) == 12 and result.evaluated == 20
    assert len(json.loads(path.read_text())["cache"]) == 20


def test_caught_exceptions_mark_the_config_failed_and_others_propagate(tmp_path):
    result = tune_function(PARAMS, Objective(), RESTRICTIONS, strategy="grid", budget=40, catch=(RuntimeError,))
    crashed = [p for p, cost in result.evaluations if p["x"] == 3]
    assert crashed and all(cost is None for p, cost in result.evaluations if p["x"] == 3)
    assert [p for p, _ in result.errors] == crashed
    assert all(message == "RuntimeError: kernel crashed" for _, message in result.errors)
    with pytest.raises(RuntimeError, match="kernel crashed"):
        tune_function(PARAMS, Objective(), RESTRICTIONS, strategy="grid", budget=40)
    with pytest.raises(TypeError, match="catch"):
        tune_function(PARAMS, Objective(), budget=4, catch="RuntimeError")


def test_a_cache_of_another_space_or_a_broken_file_is_refused_clearly_and_left_alone(tmp_path):
    path = tmp_path / "tune.json"
    tune_function(PARAMS, Objective(), RESTRICTIONS, budget=5, cache=path, catch=RuntimeError)
    before = path.read_text()
    with pytest.raises(CacheFileError, match="other tune_params"):
        tune_function({"x": [1, 2]}, Objective(), budget=2, cache=path)
    assert path.read_text() == before

    broken = tmp_path / "broken.json"
    broken.write_text("not json at all")
    with pytest.raises(CacheFileError, match="not a JSON cache file"):
        tune_function(PARAMS, Objective(), budget=2, cache=broken)
    assert broken.read_text() == "not json at all"
    with pytest.raises(CacheFileError, match="cannot read"):
        tune_function(PARAMS, Objective(), budget=2, cache=tmp_path)  # a directory

    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"tune_params": PARAMS, "cache": {"1,1,a": {"x": 1, "y": 1, "mode": "a", "time": -1}}}))
    with pytest.raises(CacheFileError, match="no usable time"):
        tune_function(PARAMS, Objective(), budget=2, cache=odd)
    with pytest.raises(CacheFileError, match="numbers, strings"):
        tune_function({"shape": [(1, 2), (2, 1)]}, lambda p: 1.0, budget=2, cache=tmp_path / "t.json")


def test_an_empty_file_is_a_new_cache_and_changed_restrictions_keep_old_entries(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text("")
    first = tune_function(PARAMS, Objective(), budget=16, cache=path, catch=RuntimeError, strategy="grid")
    narrower = ["x * y <= 4"]
    objective = Objective()
    result = tune_function(PARAMS, objective, narrower, budget=100, cache=path, catch=RuntimeError)
    valid = {(x, y, m) for x in PARAMS["x"] for y in PARAMS["y"] for m in PARAMS["mode"] if x * y <= 4}
    assert {tuple(p.values()) for p, _ in result.evaluations} == valid
    assert result.stopped == "exhausted"
    assert result.from_cache == sum(p["x"] * p["y"] <= 4 for p, _ in first.evaluations) > 0
    data = json.loads(path.read_text())
    assert len(data["cache"]) == 16 + len(objective.calls)  # entries outside the new space kept
    assert data["restrictions"] == narrower


def test_replay_reads_an_unterminated_kernel_tuner_cache(tmp_path):
    path = tmp_path / "kt.json"
    lines = ['{"device_name": "X", "kernel_name": "k", "tune_params_keys": ["a"], "tune_params": {"a": [1, 2, 3]},',
             '"objective": "time", "cache": {',
             '"1": {"a": 1, "time": 2.0},',
             '"2": {"a": 2, "time": 1.0},']
    path.write_text("\n".join(lines))
    space = load_cache(path)
    assert space.optimum == 1.0 and space.size == 2
    path.write_text("\n".join(lines[:2]))
    with pytest.raises(ReplayError, match="no config"):
        load_cache(path)


def test_a_cache_of_a_related_problem_is_a_transfer_prior_that_finds_the_optimum_sooner(tmp_path):
    from tuner.user_space import prior_from_cache

    params = {"a": list(range(16)), "b": list(range(16)), "c": [0, 1, 2, 3]}

    def cost(p, shift):  # the "other device" has its optimum one step away in b
        return 1 + 0.1 * (p["a"] - 11) ** 2 + 0.1 * (p["b"] - 3 - shift) ** 2 + 0.5 * (p["c"] != 2)

    source = tmp_path / "other_device.json"
    tune_function(params, lambda p: cost(p, 0), budget=150, cache=source, seed=7)
    prior = prior_from_cache(source, weight=0.5)
    assert len(prior) == 150 and {p.group for p in prior} == {str(source)}
    optimum = 1.0
    cold = [optimum / tune_function(params, lambda p: cost(p, 1), budget=24, seed=s).best_value for s in range(4)]
    warm = [optimum / tune_function(params, lambda p: cost(p, 1), budget=24, seed=s, prior=prior).best_value
            for s in range(4)]
    assert warm == [1.0] * 4 and sum(cold) < sum(warm)

    with pytest.raises(ValueError, match="weight"):
        prior_from_cache(source, weight=0)
    with pytest.raises(CacheFileError, match="cannot read"):
        prior_from_cache(tmp_path / "missing.json")
