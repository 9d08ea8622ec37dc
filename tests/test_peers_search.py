"""bench/peers_search.py on the small recorded space in tests/data: Kernel Tuner's strategies run in
simulation mode in our harness, count evaluations as our replay does, and are reproducible."""

import json
from pathlib import Path

import pytest

pytest.importorskip("kernel_tuner")

from tuner.replay import load_cache  # noqa: E402
from script_modules import load_script  # noqa: E402

DATA = Path(__file__).parent / "data"
SPACE = DATA / "pnpoly_trimmed.json.gz"


def peers_module():
    return load_script("bench/peers_search.py")


@pytest.mark.parametrize("strategy", ["random_sample", "genetic_algorithm", "simulated_annealing", "firefly_algorithm"])
def test_a_kernel_tuner_strategy_gets_exactly_its_budget_of_recorded_configs(strategy):
    peers = peers_module()
    kt = peers.kernel_tuner_space(str(SPACE))
    replay = load_cache(SPACE)
    recorded = {t for t in replay.times.values() if t is not None}
    times = peers.kernel_tuner_run(kt, strategy, 40, seed=3)
    assert len(times) == 40  # restarted when its own iteration limit ends it early
    assert all(t is None or t in recorded for t in times)
    assert times == peers.kernel_tuner_run(kt, strategy, 40, seed=3)  # a fresh search space per run
    assert 0 < peers.fraction_at(times, 40, replay.optimum) <= 1


def test_the_harness_prints_ours_beside_theirs_and_writes_a_json_line_per_cell(tmp_path, capsys):
    peers = peers_module()
    out = tmp_path / "cells.jsonl"
    curves = tmp_path / "curves.json"
    code = peers.main(["--spaces-dir", str(DATA), "--only", "pnpoly_trimmed", "--repeats", "2", "--budgets", "10,30",
                       "--ours", "default,random", "--peers", "random_sample,genetic_algorithm",
                       "--json", str(out), "--curves", str(curves)])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["strategy"], r["budget"]) for r in rows} == {
        (s, b) for s in ("default", "random", "kt:random_sample", "kt:genetic_algorithm") for b in (10, 30)}
    assert all(len(r["fractions"]) == 2 and r["repeats"] == 2 for r in rows)
    text = capsys.readouterr().out
    assert "Per family" in text and "default - best other" in text
    assert len(json.loads(curves.read_text())["pnpoly_trimmed"]["default"]) == 30

    code = peers.main(["--from-json", str(out), "--budgets", "10,30", "--ours", "default,random", "--halves"])
    assert code == 0 and "pnpoly/fit" in capsys.readouterr().out


def test_bad_options_get_a_one_line_error(capsys):
    peers = peers_module()
    assert peers.main(["--spaces-dir", str(DATA), "--peers", "no_such_strategy"]) == 2
    assert peers.main(["--spaces-dir", str(DATA), "--budgets", "ten"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no_such_strategy" in err[0]


def test_diff_evo_start_draws_distinct_valid_configs_in_both_orders(capsys):
    start = load_script("bench/diff_evo_start.py")
    name, rows, sizes, times, optimum = start.space_rows(SPACE)
    assert len(rows) == len(times) and optimum == times.min()
    kt_order, kt_ties, shuffled = start.first_picks(rows, sizes, population=40, take=10, seed=1)
    for picks in (kt_order, kt_ties, shuffled):
        assert len(picks) == 10 == len(set(picks)) and all(0 <= p < len(rows) for p in picks)
    assert set(kt_order) <= set(start.first_picks(rows, sizes, population=40, take=40, seed=1)[1])
    assert start.main(["--spaces-dir", str(DATA), "--only", "pnpoly_trimmed", "--repeats", "3", "--take", "10"]) == 0
    assert "kt-ties" in capsys.readouterr().out
