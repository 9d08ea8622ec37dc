"""Shape ranges: representatives, recording a family, dispatching any shape in the range."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from measure_agent.engine import MeasureResult, MeasureStatus
from measure_agent.templates import testing_catalog as fault_catalog
from measure_agent.workload import WorkloadError, parse_workload
from measure_agent.workload.family import MAX_REPRESENTATIVES, parse_family
from tuner.job import TuneOptions, TuningJob
from tuner.log import TuningLog, find_best
from tuner.measure import SyncMeasurer


def test_representatives_are_powers_of_two_plus_the_ends():
    family = parse_family("matmul(M=3..100,N=768,K=768)")
    assert family.key == "matmul(M=3..100,N=768,K=768,dtype=float32)"
    assert [w["M"] for w in family.representatives()] == [3, 4, 8, 16, 32, 64, 100]
    assert all(w["N"] == 768 for w in family.representatives())
    wide = parse_family("matmul(M=1..4096,N=1..4096,K=64)")
    assert len(wide.representatives()) <= MAX_REPRESENTATIVES
    assert {1, 4096} <= {w["M"] for w in wide.representatives()}
    assert family.contains(parse_workload("matmul(M=50,N=768,K=768)"))
    assert not family.contains(parse_workload("matmul(M=101,N=768,K=768)"))
    assert not family.contains(parse_workload("matmul(M=50,N=767,K=768)"))


@pytest.mark.parametrize("text, fragment", [
    ("matmul(M=8..8,N=1,K=1)", "LOW < HIGH"),
    ("matmul(M=1..8,N=1)", "missing size K"),
    ("matmul(M=1..70000,N=1,K=1)", "exceeds the limit"),
])
def test_bad_ranges(text, fragment):
    with pytest.raises(WorkloadError, match=fragment):
        parse_family(text)


def test_one_shape_commands_explain_ranges():
    with pytest.raises(WorkloadError, match="shape range"):
        parse_workload("matmul(M=1..8,N=1,K=1)")


class LaterIsFaster(SyncMeasurer):
    """Higher variants run faster, so the best config is never the default (variant 0)."""

    device_key, device_info, agent_name, template_version = "fam", {}, "fam", "testing"

    def measure_now(self, items):
        return [MeasureResult(MeasureStatus.OK, costs=(100.0 - i.config["variant"],)) for i in items]


def test_a_shape_never_tuned_gets_the_tuned_config_of_its_family(tmp_path):
    family = parse_family("matmul(M=1..16,N=4,K=4)")
    with TuningLog(f"sqlite:///{tmp_path / 'f.db'}") as log:
        options = TuneOptions(trials=4, strategy="grid", pins=(("behaviour", "ok"), ("sleep_ms", "0")))
        for shape in family.representatives():
            TuningJob(shape, LaterIsFaster(), log, fault_catalog(), options).run()
        log.record_family(family.key, family.op, family.dtype, [w.key for w in family.representatives()])
        never_tuned = parse_workload("matmul(M=6,N=4,K=4)")
        [match] = find_best(log, never_tuned, ["fam"], catalog=fault_catalog())  # no --nearest needed
        assert match.family == family.key and match.approximate
        assert match.tuned_workload in {"matmul(M=4,N=4,K=4,dtype=float32)", "matmul(M=8,N=4,K=4,dtype=float32)"}
        assert match.config["variant"] != 0  # the tuned config, not the default
        outside = parse_workload("matmul(M=40,N=4,K=4)")
        assert find_best(log, outside, ["fam"], catalog=fault_catalog()) == []


def test_tune_a_range_then_best_for_an_untuned_shape(cli_env, tmp_path):
    db = f"sqlite:///{tmp_path / 'range.db'}"

    def tuner(*args):
        proc = subprocess.run([sys.executable, "-m", "tuner", *args, "--db", db], capture_output=True, text=True,
                              env=cli_env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = tuner("tune", "--workload", "matmul(M=1..4,N=16,K=8)", "--trials", "1", "--repeat", "1",
                "--min-repeat-ms", "0", "--device-key", "range-host")
    assert "tuning 3 representative shapes" in out and "family matmul(M=1..4,N=16,K=8,dtype=float32) recorded" in out
    best = json.loads(tuner("best", "--workload", "matmul(M=3,N=16,K=8)", "--device-key", "range-host", "--json"))
    assert best["family"] == "matmul(M=1..4,N=16,K=8,dtype=float32)" and best["approximate"] is True
    assert best["tuned_workload"] in ("matmul(M=2,N=16,K=8,dtype=float32)", "matmul(M=4,N=16,K=8,dtype=float32)")
    text = tuner("best", "--workload", "matmul(M=3,N=16,K=8)", "--device-key", "range-host")
    assert "RANGE:" in text
