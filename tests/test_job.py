"""The tuning loop against the testing templates: logging, resume, early stopping."""

import pytest

from measure_agent.engine import MeasureResult, MeasureStatus, TimingConfig
from measure_agent.templates import testing_catalog as fault_catalog
from measure_agent.workload import parse_workload
from tuner.job import TuneOptions, TuningJob
from tuner.log import TuningLog
from tuner.measure import LocalMeasurer, SyncMeasurer

WORKLOAD = parse_workload("matmul(M=8,N=8,K=8)")


@pytest.fixture(scope="module")
def measurer(tmp_path_factory):
    timing = TimingConfig(repeat=1, run_timeout_s=2)
    with LocalMeasurer(timing, build_workers=2, device_key="test-host", catalog="testing",
                       cache_dir=tmp_path_factory.mktemp("kc")) as m:
        yield m


@pytest.fixture()
def log(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'log.db'}") as log:
        yield log


def tune(log, measurer, **options):
    progress = []
    job = TuningJob(WORKLOAD, measurer, log, fault_catalog(), TuneOptions(**options), on_progress=progress.append)
    return job.run(), progress


def test_job_measures_default_first_records_everything_and_resumes(log, measurer):
    summary, progress = tune(log, measurer, trials=6, strategy="grid", batch_size=4)
    trials = log.trials(workload_key=WORKLOAD.key, device_key="test-host")
    assert len(trials) == 6 == summary.measured_now == summary.total_in_log
    assert len({t.config["variant"] for t in trials}) == 6
    assert trials[0].config == {"behaviour": "ok", "sleep_ms": 0, "variant": 0}  # the default
    assert summary.default is not None and summary.best is not None
    assert summary.speedup_over_default is not None
    assert [p.done for p in progress] == [4, 6]
    assert progress[-1].best_gflops > 0
    assert all(t.agent.startswith("local@") and t.template_version for t in trials)
    assert log.get_job(summary.job_id).status == "done"

    # Same command again: nothing left to do.
    again, _ = tune(log, measurer, trials=6, strategy="grid", batch_size=4)
    assert again.measured_now == 0
    assert len(log.trials(workload_key=WORKLOAD.key)) == 6

    # A larger budget continues where the log stands, never re-measuring a config.
    more, _ = tune(log, measurer, trials=9, strategy="random", seed=3, batch_size=4)
    assert more.measured_now == 3
    digests = [repr(sorted(t.config.items())) for t in log.trials(workload_key=WORKLOAD.key)]
    assert len(digests) == len(set(digests)) == 9


def test_failures_are_recorded_as_data(log, measurer):
    summary, _ = tune(log, measurer, trials=12, strategy="random", seed=11, batch_size=12)
    statuses = {t.status for t in log.trials(workload_key=WORKLOAD.key)}
    assert summary.errors == sum(n for s, n in summary.status_counts.items() if s != "ok")
    assert summary.errors > 0 and len(statuses) > 1
    failed = [t for t in log.trials(workload_key=WORKLOAD.key) if t.status != "ok"]
    assert all(t.mean_s is None and t.message for t in failed)


class ScriptedMeasurer(SyncMeasurer):
    """Costs from the config: later grid points (higher variant) are always slower."""

    device_key = "scripted"
    device_info = {"arch": "none"}
    agent_name = "scripted"
    template_version = "testing"

    def measure_now(self, items):
        return [MeasureResult(MeasureStatus.OK, costs=(1.0 + i.config["variant"],)) for i in items]


def test_early_stopping(log):
    summary, progress = tune(log, ScriptedMeasurer(), trials=40, strategy="grid", batch_size=2, early_stopping=4)
    assert summary.stopped_early
    # the default (variant 0) is best; four trials later, at the end of that batch, the job stops
    assert summary.measured_now == 6
    assert summary.best.config["variant"] == 0


@pytest.mark.parametrize("strategy", ["random", "xgb"])
def test_a_resumed_job_with_the_same_seed_reaches_its_budget(log, strategy):
    """A job resumed after its daemon died (or re-run with a larger budget) keeps its seed; its
    strategy must not replay the draws the log already holds until it gives up and the job ends
    'done' short of its budget (seen with 3 daemon kills: 316 of 400)."""
    first, _ = tune(log, ScriptedMeasurer(), trials=120, strategy=strategy, seed=5, batch_size=2)
    assert first.total_in_log == 120
    resumed, _ = tune(log, ScriptedMeasurer(), trials=240, strategy=strategy, seed=5, batch_size=2)
    assert resumed.measured_now == 120 and resumed.total_in_log == 240
    digests = [repr(sorted(t.config.items())) for t in log.trials(workload_key=WORKLOAD.key)]
    assert len(digests) == len(set(digests)) == 240
