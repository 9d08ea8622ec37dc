"""Replay of Kernel Tuner cache files: parsing, the exact random baseline, bench-strategies."""

import gzip
import io
import itertools
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from tuner.cli import main
from tuner.replay import (
    BenchError, ReplayError, bench_strategies, evaluate, family_summaries, find_cache_files, load_cache, parse_cache,
    random_baseline, rank_probabilities,
)
from tuner.replay.bench import replay_run
from script_modules import load_script

DATA = Path(__file__).parent / "data"


def tiny_cache(restrictions=True, failed=("ErrorConfig", "CompilationFailedConfig", "RuntimeFailedConfig")):
    """A 4 x 3 x 2 space; restricted to bx * by <= 64; a few failures of each kind."""
    params = {"bx": [8, 16, 32, 64], "by": [1, 2, 4], "unroll": [0, 1]}
    cache = {}
    for i, (bx, by, unroll) in enumerate(itertools.product(*params.values())):
        if bx * by > 64:
            continue
        time = 1.0 + abs(bx - 32) / 8 + abs(by - 2) + 0.3 * unroll
        entry = {"bx": bx, "by": by, "unroll": unroll, "time": time, "times": [time] * 3}
        if i % 7 == 3:
            entry["time"] = failed[i % len(failed)]
        cache[f"{bx},{by},{unroll}"] = entry
    data = {"device_name": "Tiny GPU", "kernel_name": "tiny", "tune_params_keys": list(params),
            "tune_params": params, "objective": "time", "cache": cache}
    if restrictions:
        data["restrictions"] = ["bx * by <= 64"]
    return data


def write(path, data, compress):
    text = json.dumps(data)
    if compress:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("restrictions", [True, False])
def test_parse_plain_and_gz_with_and_without_restrictions(tmp_path, compress, restrictions):
    data = tiny_cache(restrictions)
    path = write(tmp_path / ("tiny.json.gz" if compress else "tiny.json"), data, compress)
    replay = load_cache(path)
    assert replay.name == "tiny"
    assert replay.kernel == "tiny" and replay.device == "Tiny GPU"
    assert replay.size == len(data["cache"]) == 18  # 9 (bx, by) pairs with bx * by <= 64, x 2 unrolls
    assert replay.space.size == 18
    failed = [k for k, e in data["cache"].items() if isinstance(e["time"], str)]
    assert failed and replay.n_failed == len(failed)
    assert {type(e["time"]) for e in data["cache"].values()} == {float, str}
    configs = list(replay.space.iter_valid())
    assert len(configs) == 18
    for config in configs:
        entry = data["cache"][f"{config['bx']},{config['by']},{config['unroll']}"]
        expected = None if isinstance(entry["time"], str) else entry["time"]
        assert replay.cost(config) == expected
        assert replay(config.as_dict()) == expected
    assert replay.optimum == min(e["time"] for e in data["cache"].values() if not isinstance(e["time"], str))


def test_restricted_space_counts_configs_missing_from_the_cache_as_failed():
    data = tiny_cache()
    del data["cache"]["16,1,0"]
    replay = parse_cache(data, "tiny")
    assert replay.size == 18
    assert replay.cost(replay.space.make({"bx": 16, "by": 1, "unroll": 0})) is None
    assert replay.n_failed == 1 + sum(isinstance(e["time"], str) for e in data["cache"].values())


def test_without_restrictions_the_cache_keys_are_the_space():
    data = tiny_cache(restrictions=False)
    del data["cache"]["16,1,0"]
    replay = parse_cache(data, "tiny")
    assert replay.size == replay.space.size == 17
    assert not replay.space.is_valid(replay.space._config_unchecked({"bx": 16, "by": 1, "unroll": 0}))


def test_entries_outside_tune_params_are_counted_and_unknown_failure_markers_accepted():
    data = tiny_cache()
    data["cache"]["128,1,0"] = {"bx": 128, "by": 1, "unroll": 0, "time": 0.5}  # bx=128 is not a tune_param
    data["cache"]["64,2,0"] = {"bx": 64, "by": 2, "unroll": 0, "time": 0.5}  # outside the restriction
    data["cache"]["8,1,0"]["time"] = "SkippableFailureConfig"  # a marker of a newer Kernel Tuner
    replay = parse_cache(data, "tiny")
    assert replay.skipped == 2 and replay.size == 18
    assert replay.cost(replay.space.make({"bx": 8, "by": 1, "unroll": 0})) is None


def test_a_cache_as_space_larger_than_its_product_limit_is_searched_by_every_strategy():
    # 8 knobs x 7 values = 5.8M combinations, of which 60 are recorded (no restrictions): the
    # recorded set is the space and is used directly, never sampled by rejection.
    rng = np.random.default_rng(0)
    names = [f"p{i}" for i in range(8)]
    params = {n: list(range(7)) for n in names}
    cache = {}
    while len(cache) < 60:
        values = [int(v) for v in rng.integers(7, size=8)]
        cache[",".join(map(str, values))] = {**dict(zip(names, values)), "time": 1.0 + sum(values) / 10}
    replay = parse_cache({"tune_params": params, "tune_params_keys": names, "cache": cache}, "wide")
    assert replay.space.product_size > 2_000_000 and replay.size == replay.space.size == 60
    for strategy in ("random", "grid", "ga", "sa", "xgb"):
        trace = replay_run(replay, strategy, budget=30, seed=0)
        assert len(trace.costs) == 30 and all(c is not None for c in trace.costs)


def test_shared_fixture_parses(tmp_path):
    replay = load_cache(DATA / "pnpoly_trimmed.json.gz")
    assert replay.size == replay.space.size == len(replay.times)
    assert replay.n_failed > 0


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("tune_params"), "lacks 'tune_params'"),
    (lambda d: d.update(restrictions=["__import__('os').system('true')"]), "not allowed"),
    (lambda d: d["cache"]["8,1,0"].update(time=[1, 2]), "no usable time"),
    (lambda d: d.update(tune_params_keys=["bx", "by"]), "does not match"),
    (lambda d: d["cache"]["8,1,0"].update(time="fast"), "neither a number nor a failure marker"),
    (lambda d: d["cache"]["8,1,0"].update(time=10 ** 400), "no usable time"),
    (lambda d: d.update(restrictions=["bx < 'big'"]), r"cannot be evaluated for bx=8.*TypeError"),
    (lambda d: d["cache"].update({"8.0,1,0": dict(d["cache"]["8,1,0"], bx=8.0, time=99.0)}),
     "are the same config with different times"),
    (lambda d: d.update(cache={"7,7,7": {"bx": 7, "by": 7, "unroll": 7, "time": 1.0}}),
     "none of the 1 cache entries is a config of 'tune_params'"),
])
def test_bad_files_are_refused_with_a_clear_error(mutate, message):
    data = tiny_cache()
    mutate(data)
    with pytest.raises(ReplayError, match=message):
        parse_cache(data, "tiny")


def test_unreadable_file(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ReplayError, match="not a JSON cache file"):
        load_cache(tmp_path / "x.json")


# -- the exact random baseline -------------------------------------------------------------------

def brute_force(times_with_failures, budget):
    """Expected best time and fraction over every subset of ``budget`` configs (exhaustive)."""
    valid = [t for t in times_with_failures if t is not None]
    optimum, worst = min(valid), max(valid)
    best_sum = fraction_sum = 0.0
    count = 0
    for subset in itertools.combinations(times_with_failures, budget):
        ok = [t for t in subset if t is not None]
        best_sum += min(ok) if ok else worst
        fraction_sum += optimum / min(ok) if ok else 0.0
        count += 1
    return best_sum / count, fraction_sum / count


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 9])
def test_exact_random_baseline_matches_brute_force(budget):
    times = [3.0, None, 1.5, 2.0, None, 7.0, 2.0, 4.5, None]
    valid = np.sort([t for t in times if t is not None])
    base = random_baseline(valid, len(times), budget)
    best, fraction = brute_force(times, budget)
    assert base.best_time == pytest.approx(best, rel=1e-12)
    assert base.fraction == pytest.approx(fraction, rel=1e-12)
    p, p_none = rank_probabilities(len(times), len(valid), budget)
    assert p.sum() + p_none == pytest.approx(1.0)


def test_exact_random_baseline_matches_simulated_random_search():
    rng = np.random.default_rng(0)
    times = list(rng.lognormal(size=40)) + [None] * 10
    valid = np.sort([t for t in times if t is not None])
    budget = 6
    draws = [min([t for t in (times[i] for i in rng.choice(50, budget, replace=False)) if t is not None],
                 default=valid[-1]) for _ in range(20000)]
    base = random_baseline(valid, len(times), budget)
    assert base.best_time == pytest.approx(np.mean(draws), rel=0.02)


def test_random_strategy_scores_about_zero_and_fraction_counts_failures():
    replay = load_cache(DATA / "pnpoly_trimmed.json.gz")
    cells = evaluate(replay, "random", [5, 20], repeats=60)
    for cell in cells:
        assert abs(cell.fraction - cell.random_fraction) < 0.05
    trace = replay_run(replay, "random", 30, seed=1)
    assert len(trace.costs) == 30 and len(set(map(str, trace.configs))) == 30


# -- the command ------------------------------------------------------------------------------------

def run_cli(argv):
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def test_bench_strategies_json_shape(tmp_path):
    path = write(tmp_path / "tiny_A.json.gz", tiny_cache(), True)
    other = write(tmp_path / "tiny_B.json", tiny_cache(restrictions=False), False)
    code, out = run_cli(["bench-strategies", "--space", str(path), "--space", str(other),
                         "--strategies", "default,random,ga", "--budgets", "4,8", "--repeats", "2", "--json"])
    assert code == 0
    rows = json.loads(out)
    assert isinstance(rows, list) and len(rows) == 2 * 3 * 2
    for row in rows:
        assert {"space", "strategy", "budget", "fraction", "score", "seconds_per_run", "random_fraction"} <= set(row)
        assert 0.0 <= row["fraction"] <= 1.0
        assert isinstance(row["score"], float)
    assert {(r["space"], r["strategy"], r["budget"]) for r in rows} == {
        (s, st, b) for s in ("tiny_A", "tiny_B") for st in ("default", "random", "ga") for b in (4, 8)}


def test_bench_strategies_table_and_transfer_rows(tmp_path):
    a = write(tmp_path / "tiny_A.json", tiny_cache(), False)
    b = write(tmp_path / "tiny_B.json", tiny_cache(), False)
    # several files after one --space, as a shell glob gives them
    code, out = run_cli(["bench-strategies", "--space", str(a), str(b), "--strategies", "default",
                         "--budgets", "5", "--repeats", "1", "--transfer"])
    assert code == 0
    assert "default+transfer" in out and "exact random" in out and "per kernel family" in out


def test_bench_strategies_refuses_unknown_strategy_and_bad_file(tmp_path, capsys):
    path = write(tmp_path / "tiny.json", tiny_cache(), False)
    assert main(["bench-strategies", "--space", str(path), "--strategies", "magic"]) == 2
    assert "unknown strategy 'magic'" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[]")
    assert main(["bench-strategies", "--space", str(tmp_path / "bad.json")]) == 2
    assert "expected a JSON object" in capsys.readouterr().err


def test_bench_strategies_is_callable_without_the_command():
    spaces = [parse_cache(tiny_cache(), "tiny_A"), parse_cache(tiny_cache(restrictions=False), "tiny_B")]
    rows = bench_strategies(spaces, ["random"], [4, 8], 2, transfer=True)
    assert [(r["space"], r["strategy"], r["budget"]) for r in rows] == [
        (s, st, b) for s in ("tiny_A", "tiny_B") for st in ("random", "random+transfer") for b in (4, 8)]
    assert all(r["prior_records"] > 0 for r in rows if r["strategy"] == "random+transfer")
    # worker processes give the same results, also for spaces that were never files
    timing = ("seconds_per_run", "seconds_total")
    in_workers = bench_strategies(spaces, ["random"], [4, 8], 2, transfer=True, jobs=2)
    assert [{k: v for k, v in r.items() if k not in timing} for r in in_workers] == [
        {k: v for k, v in r.items() if k not in timing} for r in rows]
    [summary] = family_summaries(rows)
    assert summary.family == "tiny" and list(summary.fractions) == ["random", "random+transfer"]
    at_4 = [r["fraction"] for r in rows if r["strategy"] == "random" and r["budget"] == 4]
    assert summary.fractions["random"][4] == pytest.approx(sum(at_4) / 2)
    assert summary.random_fraction[8] == pytest.approx(rows[1]["random_fraction"])


def test_bench_strategies_refuses_what_cannot_run():
    space = parse_cache(tiny_cache(), "tiny")
    with pytest.raises(BenchError, match="unknown strategy 'magic'"):
        bench_strategies([space], ["magic"], [4], 1)
    with pytest.raises(BenchError, match="same name"):
        bench_strategies([space, space], ["random"], [4], 1)


def test_cache_files_of_a_folder(tmp_path):
    for name in ("GEMM_A.json", "GEMM_B.json.gz", "conv_A.json", "notes.txt", "GEMM_C.jsonl"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in find_cache_files(tmp_path)] == ["GEMM_A.json", "GEMM_B.json.gz", "conv_A.json"]
    assert [p.name for p in find_cache_files(tmp_path, ["conv", ""])] == ["conv_A.json"]


def _space_anatomy():
    return load_script("bench/space_anatomy.py")


def test_space_anatomy_facts_of_a_space():
    replay = parse_cache(tiny_cache(), "tiny")
    facts = _space_anatomy().anatomy(replay, budget=5)
    fractions = {k: replay.optimum / t for k, t in replay.times.items() if t is not None}
    best = max(fractions, key=fractions.get)
    one_away = [f for k, f in fractions.items() if sum(a != b for a, b in zip(k, best)) == 1]
    assert facts["valid"] == len(fractions)
    assert facts["total"] == replay.size
    assert facts["at_98"] == sum(f >= 0.98 for f in fractions.values())
    assert facts["one_knob"] == pytest.approx(max(one_away))
    assert 0 <= facts["model_rank"] < facts["valid"]
    # random search hits one of the h configs >= 0.98 in 5 draws: 1 - C(N - h, 5) / C(N, 5)
    h = facts["at_98"]
    assert facts["p_random"] == pytest.approx(1 - math.comb(replay.size - h, 5) / math.comb(replay.size, 5))


SHARED_SPACES = Path(__file__).resolve().parents[2] / "shared" / "spaces"


@pytest.mark.skipif(not SHARED_SPACES.is_dir(), reason="the real Kernel Tuner caches are not in this checkout")
@pytest.mark.parametrize("name", ["GEMM_K20", "convolution_A100"])
def test_real_kernel_tuner_restrictions_evaluate_as_python_does(name):
    # The bounded evaluator (numbers only, within 2**64, limited depth) keeps the real restrictions
    # of CLBlast's GEMM and the convolution kernel exactly as Python evaluates them.
    from tuner.user_space import parse_restriction, read_cache_json

    data = read_cache_json(SHARED_SPACES / f"{name}.json.gz")
    params = data["tune_params"]
    rng = np.random.default_rng(0)
    combos = [{k: v[int(rng.integers(len(v)))] for k, v in params.items()} for _ in range(2000)]
    assert data["restrictions"]
    for text in data["restrictions"]:
        restriction = parse_restriction(text, params)
        for values in combos:
            try:
                expected = bool(eval(text, {}, dict(values)))  # noqa: S307 - the cache's own restrictions
            except ZeroDivisionError:
                expected = False
            assert restriction(values) is expected, (text, values)


def test_a_replay_space_pickles_as_its_cache_data():
    import pickle

    for space in (parse_cache(tiny_cache(), "tiny_A"), parse_cache(tiny_cache(restrictions=False), "tiny_B")):
        again = pickle.loads(pickle.dumps(space))
        assert (again.name, again.size, again.times, again.optimum) == (space.name, space.size, space.times, space.optimum)
        assert [c.to_json() for c in again.space.iter_valid()] == [c.to_json() for c in space.space.iter_valid()]
