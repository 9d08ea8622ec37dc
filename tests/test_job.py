"""The tuning loop against the testing templates: logging, resume, early stopping."""

import pytest

from measure_agent.engine import MeasureResult, MeasureStatus, TimingConfig
from measure_agent.templates import default_catalog
from measure_agent.templates import testing_catalog as fault_catalog
from measure_agent.workload import parse_workload
from tuner.job import TuneOptions, TuningJob
from tuner.log import TuningLog
from tuner.measure import LocalMeasurer, Measurer, SyncMeasurer

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


class OneResultAtATime(Measurer):
    """Returns one result per ``collect``, like an agent measuring one candidate after another;
    notes every ``submit`` made while earlier candidates were still being measured."""

    device_key = "one-at-a-time"
    device_info = {"arch": "none"}
    agent_name = "one-at-a-time"
    template_version = "any"
    parallelism = 2

    def __init__(self, shares_cpu_with_tuner: bool) -> None:
        self.shares_cpu_with_tuner = shares_cpu_with_tuner
        self.pending = []
        self.submits_while_measuring = 0
        self.submits = 0

    def submit(self, items):
        self.submits += 1
        self.submits_while_measuring += bool(self.pending)
        self.pending += items

    def collect(self, timeout_s):
        if not self.pending:
            return []
        item = self.pending.pop(0)
        return [(item, MeasureResult(MeasureStatus.OK, costs=(1.0 + int(item.config.digest[:6], 16) % 97,)))]


@pytest.mark.parametrize("shares_cpu, catalog, target, overlaps", [
    (True, default_catalog, "cpu", False),  # timed on the CPU the tuner runs on: propose between batches
    (False, default_catalog, "cpu", True),  # a fleet elsewhere: the next batch is proposed while measuring
    (True, fault_catalog, "sleep", True),  # timed by sleeping: nothing to disturb
])
def test_the_tuner_proposes_only_between_batches_when_it_shares_the_cpu_kernels_are_timed_on(
        log, shares_cpu, catalog, target, overlaps):
    measurer = OneResultAtATime(shares_cpu)
    workload = parse_workload("matmul(M=64,N=64,K=64)")
    summary = TuningJob(workload, measurer, log, catalog(),
                        TuneOptions(trials=24, strategy="xgb", seed=1, target=target)).run()
    assert summary.measured_now == 24
    assert (measurer.submits_while_measuring > 0) is overlaps
    if not overlaps:  # batches of about three times the parallelism, not one candidate at a time
        assert measurer.submits <= 24 // 4


class DisturbedEveryThird(SyncMeasurer):
    """Every third timing says its threads waited for a CPU half of a repeat; one says nonsense."""

    device_key = "busy-host"
    device_info = {"arch": "none"}
    agent_name = "busy-host"
    template_version = "testing"

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def measure_now(self, items):
        results = []
        for item in items:
            self.count += 1
            share = 0.5 if self.count % 3 == 0 else ("lots" if self.count == 4 else 0.01)
            results.append(MeasureResult(MeasureStatus.OK, costs=(1.0 + item.config["variant"],),
                                         details={"cpu_wait_share": share}))
        return results


def test_a_job_says_how_many_timings_other_work_on_the_host_slowed(log):
    summary, _ = tune(log, DisturbedEveryThird(), trials=9, strategy="grid", batch_size=3)
    assert summary.measured_now == 9 and summary.disturbed_timings == 3
    assert summary.note.startswith("3 of 9 timings were slowed by other work on the measuring host")
    quiet, _ = tune(log, ScriptedMeasurer(), trials=12, strategy="grid", batch_size=3)
    assert quiet.disturbed_timings == 0 and quiet.note == ""


def test_the_summary_prints_the_jobs_note(capsys):
    from tuner.cli.jobs_view import print_summary
    from tuner.fleet import JobSpec, JobStatus

    status = JobStatus(job_id=3, state="done", spec=JobSpec("matmul(M=8,N=8,K=8)", "busy-host"), measured_now=9,
                       best_mean_s=1e-3, best_config={"variant": 0}, flops=1024.0,
                       message="3 of 9 timings were slowed by other work on the measuring host")
    assert print_summary(status) == 0
    assert "note:      3 of 9 timings were slowed" in capsys.readouterr().out


def test_a_step_can_use_a_refill_chunk_of_results_or_what_is_left_in_flight(log):
    """What a driver of many jobs gathers before it steps one: half the parallelism (the chunk a
    refill proposes), and at the end of the budget no more than is still in flight."""
    measurer = OneResultAtATime(shares_cpu_with_tuner=False)
    measurer.parallelism = 8
    job = TuningJob(parse_workload("matmul(M=64,N=64,K=64)"), measurer, log, fault_catalog(),
                    TuneOptions(trials=30, strategy="random", seed=1, target="sleep"))
    assert job.results_worth_a_step == 0  # before the first step: nothing in flight
    steps = job.steps()
    next(steps)
    assert job.results_worth_a_step == 4
    seen = []
    with pytest.raises(StopIteration):
        while True:
            next(steps)
            seen.append((job.results_worth_a_step, len(measurer.pending)))
    # OneResultAtATime measures one candidate per step: in flight is what it still holds
    assert all(wanted == min(4, pending) for wanted, pending in seen)
    assert [wanted for wanted, _ in seen[-4:]] == [3, 2, 1, 0]
