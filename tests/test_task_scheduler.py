"""The model task scheduler with fake tuners, its fleet adapter with a fake client, and both over a daemon."""

from __future__ import annotations

import io
import math

import pytest

from measure_agent.engine import TimingConfig
from measure_agent.protocol.errors import InvalidRequest, Unavailable
from measure_agent.workload import parse_workload
from tuner.fleet import JobSpec, JobStatus
from tuner.graph import FleetTaskTuner, Task, TaskScheduler, TuneOutcome

from fleet_helpers import agent_names, start_agent, start_daemon, stop_all, wait_for


def task(workload: str, count: int = 1) -> Task:
    return Task(parse_workload(workload), count=count, nodes=(f"n{count}",), op_types=("MatMul",))


class Curve:
    """Best time after t trials: ``floor + (start - floor) * exp(-t / tau)``; the default config is ``start``."""

    def __init__(self, start: float, floor: float, tau: float) -> None:
        self.start, self.floor, self.tau = start, floor, tau

    def __call__(self, trials: int) -> float:
        return self.floor + (self.start - self.floor) * math.exp(-trials / self.tau)


class FakeTuner:
    """Deterministic improvement curves per workload key; records every call."""

    def __init__(self, curves: dict[str, Curve], limits: dict[str, int] | None = None,
                 failing: set[str] = frozenset(), prior: dict[str, int] | None = None) -> None:
        self.curves = curves
        self.limits = limits or {}
        self.failing = failing
        self.prior = prior or {}
        self.calls: list[tuple[str, int]] = []

    def tune(self, task: Task, trials: int) -> TuneOutcome | None:
        key = task.key
        self.calls.append((key, trials))
        if key in self.failing:
            return None
        held = max(trials, self.prior.get(key, 0))
        held = min(held, self.limits.get(key, held))
        curve = self.curves[key]
        return TuneOutcome(best_s=curve(held), trials=held, default_s=curve.start,
                           exhausted=held < trials)


A = "matmul(M=64,N=64,K=64,dtype=float32)"
B = "matmul(M=32,N=32,K=32,dtype=float32)"
C = "dense(M=8,N=16,K=32,dtype=float32)"
D = "batch_matmul(B=2,M=8,N=8,K=8,dtype=float32)"
E = "matmul(M=16,N=16,K=16,dtype=float32)"


def trials_of(result) -> dict[str, int]:
    return {s.task.key: s.trials for s in result.states}


def test_warm_up_covers_every_task_before_any_second_round():
    tasks = [task(A, 1), task(B, 2), task(C, 1), task(D, 3), task(E, 1)]
    tuner = FakeTuner({k: Curve(1e-3, 2e-4, 30) for k in (A, B, C, D, E)})
    result = TaskScheduler(tasks, tuner, round_trials=8).run(100)
    first = tuner.calls[:5]
    assert sorted(k for k, _ in first) == sorted([A, B, C, D, E])
    assert all(trials == 8 for _, trials in first)
    # heaviest first: count x FLOPs
    flops = {t.key: t.total_flops for t in tasks}
    assert [k for k, _ in first] == sorted(flops, key=lambda k: -flops[k])
    assert result.spent == 100 and sum(trials_of(result).values()) == 100
    assert all(s.trials >= 8 and s.best_s is not None for s in result.states)
    # every later call resumes a task: its trials grow
    seen: dict[str, int] = {}
    for key, trials in tuner.calls:
        assert trials > seen.get(key, 0)
        seen[key] = trials


def test_large_weight_times_gain_gets_more_trials_than_a_converged_task():
    heavy = task(A, count=6)     # keeps improving for a long time, and runs 6 times per inference
    converged = task(C, count=1)  # at its floor after a few trials (another operator: no group bound)
    tuner = FakeTuner({A: Curve(4e-3, 1e-3, 60), C: Curve(4e-3, 3.99e-3, 2)})
    result = TaskScheduler([heavy, converged], tuner, round_trials=8).run(96)
    got = trials_of(result)
    assert got[A] + got[C] == 96
    assert got[A] >= 3 * got[C], got
    before, after, covered = result.latency()
    assert covered == 2 and after < before


def test_equal_curves_go_to_the_task_that_runs_more_often():
    tuner = FakeTuner({A: Curve(1e-3, 1e-4, 40), B: Curve(1e-3, 1e-4, 40)})
    result = TaskScheduler([task(A, 1), task(B, 5)], tuner, round_trials=4).run(60)
    got = trials_of(result)
    assert got[B] > got[A] >= 4


def test_small_budget_shrinks_the_warm_up_and_covers_the_heaviest_tasks_first():
    tasks = [task(E, 1), task(A, 1), task(B, 1)]  # A has the most FLOPs, then B, then E
    tuner = FakeTuner({k: Curve(1e-3, 1e-4, 10) for k in (A, B, E)})
    result = TaskScheduler(tasks, tuner, round_trials=8).run(2)
    assert tuner.calls == [(A, 1), (B, 1)]
    assert trials_of(result) == {E: 0, A: 1, B: 1}
    result = TaskScheduler(tasks, FakeTuner({k: Curve(1e-3, 1e-4, 10) for k in (A, B, E)}), round_trials=8).run(7)
    assert sum(trials_of(result).values()) == 7 and min(trials_of(result).values()) >= 2


def test_exhausted_and_failing_tasks_are_retired_and_the_budget_goes_elsewhere():
    tuner = FakeTuner({A: Curve(1e-3, 1e-4, 20), B: Curve(1e-3, 1e-4, 20), C: Curve(1e-3, 1e-4, 20)},
                      limits={B: 5}, failing={C})
    reports = []
    result = TaskScheduler([task(A), task(B), task(C)], tuner, round_trials=8, on_round=reports.append).run(40)
    states = {s.task.key: s for s in result.states}
    assert "exhausted at 5" in states[B].retired and states[B].trials == 5
    assert "no config ran successfully" in states[C].retired
    assert states[A].retired == "" and states[A].trials == 40 - 5 - 8
    assert result.spent == 40
    assert [k for k, _ in tuner.calls].count(B) == 1 and [k for k, _ in tuner.calls].count(C) == 1
    assert reports[-1].spent == 40 and reports[-1].budget == 40
    # latency over the tasks with a default and a best: A and B
    assert result.latency()[2] == 2


def test_configs_already_in_the_log_count_against_the_budget():
    tuner = FakeTuner({A: Curve(1e-3, 1e-4, 20), B: Curve(1e-3, 1e-4, 20)}, prior={A: 40})
    result = TaskScheduler([task(A), task(B)], tuner, round_trials=8).run(30)
    assert trials_of(result) == {A: 40, B: 0}  # an earlier run already filled the budget
    assert tuner.calls == [(A, 8)]


def test_tuner_errors_retire_the_task_without_spending_budget():
    class Refusing(FakeTuner):
        def tune(self, task, trials):
            if task.key == B:
                self.calls.append((task.key, trials))
                return TuneOutcome(best_s=None, error="no template for matmul on target fpga")
            return super().tune(task, trials)

    tuner = Refusing({A: Curve(1e-3, 1e-4, 20)})
    result = TaskScheduler([task(A), task(B)], tuner, round_trials=4).run(12)
    states = {s.task.key: s for s in result.states}
    assert states[B].retired == "no template for matmul on target fpga" and states[B].trials == 0
    assert states[A].trials == 12


def test_plain_float_results_are_accepted():
    class Plain:
        def tune(self, task, trials):
            return 1e-3 / trials

    result = TaskScheduler([task(A), task(B, 2)], Plain(), round_trials=4).run(16)
    assert result.spent == 16
    assert all(s.best_s is not None and s.default_s is None for s in result.states)
    assert result.latency() == (None, None, 0)


def test_a_task_lagging_its_operator_group_has_a_steeper_gradient():
    # Same count and history; E runs at 1/8 of the rate of A (same operator): the group bound says it can gain.
    tuner = FakeTuner({})
    scheduler = TaskScheduler([task(A), task(E), task("matmul(M=64,N=64,K=64,dtype=float64)")], tuner)
    a, e, other = scheduler.states
    for state, best in ((a, 1e-3), (e, 1.0 / 64 * 1e-3 * 8)):  # E has 1/64 of A's FLOPs, at 1/8 of A's rate
        state.trials, state.best_s, state.history = 16, best, [(8, best), (16, best)]
    plain = scheduler.gradient(a, 8)
    lagging = scheduler.gradient(e, 8)
    assert plain < 0 and lagging < 0
    # relative to its own time, E's estimated gain is larger than the optimistic 1/t term alone
    assert lagging / e.best_s < plain / a.best_s
    assert scheduler.gradient(other, 8) == 0.0  # not measured yet


def test_scheduler_rejects_bad_arguments():
    with pytest.raises(ValueError):
        TaskScheduler([], FakeTuner({}))
    with pytest.raises(ValueError):
        TaskScheduler([task(A)], FakeTuner({}), round_trials=0)
    with pytest.raises(ValueError):
        TaskScheduler([task(A)], FakeTuner({})).run(0)


def test_tune_model_report_text_and_json():
    from tuner.cli.model import print_report, report_json
    from tuner.graph import ModelTasks

    tasks = (task(A, 2), task(B, 1), task(C, 1))
    found = ModelTasks(source="m.onnx", tasks=tasks, nodes=5)
    tuner = FakeTuner({A: Curve(4e-3, 1e-3, 10), B: Curve(2e-3, 1e-3, 10)}, failing={C})
    result = TaskScheduler([tasks[0], tasks[2], tasks[1]], tuner, round_trials=4).run(20)
    out = io.StringIO()
    print_report(found, result, "box", "cpu", out=out)
    text = out.getvalue()
    assert "(3 tasks tuned of 3)" in text and "20 in the log for these tasks (budget 20)" in text
    rows = [line.split() for line in text.splitlines() if line.strip().split(" ")[0].isdigit()]
    assert [(r[0], r[1], r[-1]) for r in rows] == [("1", "2", A), ("3", "1", C), ("2", "1", B)]  # numbers of `tasks`
    assert "retired: no config ran successfully" in text
    before, after, covered = result.latency()
    assert covered == 2 and f"{before * 1e3:.4f} ms with default configs -> {after * 1e3:.4f} ms tuned" in text
    assert "over 2 of 3 tasks" in text and "not counted" in text
    data = report_json(found, result, "box", "cpu")
    assert data["latency_default_s"] == before and data["latency_tuned_s"] == after and data["trials"] == 20
    assert [t["task"] for t in data["tasks"]] == [1, 3, 2] and data["tasks"][1]["best_s"] is None


# -- the fleet adapter ---------------------------------------------------------------------------------
def status(job_id: int, state: str, done: int, best: float | None = None, default: float | None = None,
           message: str = "", stopped_early: bool = False) -> JobStatus:
    return JobStatus(job_id=job_id, state=state, spec=JobSpec(A, "box"), done=done, message=message,
                     stopped_early=stopped_early, best_mean_s=best, default_mean_s=default)


class FakeClient:
    def __init__(self, finals) -> None:
        self.finals = list(finals)  # one per submit: a JobStatus, an exception to raise, or "interrupt"
        self.submitted: list[JobSpec] = []
        self.cancelled: list[int] = []

    def submit(self, spec):
        self.submitted.append(spec)
        final = self.finals.pop(0)
        if isinstance(final, Exception):
            raise final
        self._final = final
        return status(len(self.submitted), "queued", 0)

    def watch(self, job_id):
        yield status(job_id, "running", 1)
        if self._final == "interrupt":
            raise KeyboardInterrupt
        yield self._final

    def cancel(self, job_id):
        self.cancelled.append(job_id)


def test_fleet_adapter_submits_cumulative_trials_and_reads_the_final_status():
    timing = TimingConfig(repeat=1)
    client = FakeClient([status(1, "done", 8, best=2e-3, default=3e-3),
                         status(2, "done", 16, best=1e-3, default=3e-3)])
    seen = []
    tuner = FleetTaskTuner(client, JobSpec(A, "box", target="cpu", strategy="random", seed=3, timing=timing),
                           on_status=seen.append)
    first = tuner.tune(task(A), 8)
    second = tuner.tune(task(A), 16)
    assert first == TuneOutcome(best_s=2e-3, trials=8, default_s=3e-3)
    assert second.best_s == 1e-3 and second.trials == 16 and not second.exhausted
    first_spec, second_spec = client.submitted
    assert first_spec.workload == second_spec.workload == A and first_spec.device_key == "box"
    assert (first_spec.trials, second_spec.trials) == (8, 16)
    assert (first_spec.target == "cpu" and first_spec.strategy == "random" and first_spec.seed == 3
            and first_spec.timing is timing)
    assert len(seen) == 4 and tuner.jobs == [1, 2]


def test_fleet_adapter_failures_exhaustion_refusal_and_interrupt():
    client = FakeClient([
        status(1, "done", 5, best=1e-3),                                   # asked 8, space had 5
        status(2, "done", 6, best=1e-3, stopped_early=True),               # early stopping: not exhausted
        status(3, "failed", 2, message="no agent of key box within 5 s"),
        InvalidRequest("no template for conv2d_nchw on target cpu; installed: matmul/cpu"),
        "interrupt",
    ])
    tuner = FleetTaskTuner(client, JobSpec(A, "box"))
    exhausted = tuner.tune(task(A), 8)
    assert exhausted.exhausted and exhausted.trials == 5 and not exhausted.error
    assert not tuner.tune(task(A), 8).exhausted
    failed = tuner.tune(task(A), 8)
    assert failed.error == "job 3 failed: no agent of key box within 5 s" and failed.best_s is None
    refused = tuner.tune(task(A), 8)
    assert refused.error.startswith("no template for conv2d_nchw") and refused.trials is None
    with pytest.raises(KeyboardInterrupt):
        tuner.tune(task(A), 8)
    assert client.cancelled == [5]
    # a lost daemon is not a task failure: it propagates
    with pytest.raises(Unavailable):
        FleetTaskTuner(FakeClient([Unavailable("daemon unreachable")]), JobSpec(A, "box")).tune(task(A), 8)


def test_scheduler_over_a_daemon_with_the_testing_catalog(tmp_path, kernel_cache_dir):
    """Real jobs, resume semantics and the log: two sleep 'kernels' (K ms per call) on target ``sleep``."""
    from tuner.daemon import FleetClient
    from tuner.log import TuningLog

    with TuningLog(f"sqlite:///{tmp_path / 'sched.db'}") as log:
        daemon = start_daemon(log)
        agent = start_agent(daemon.address, "sched", "sched-1", kernel_cache_dir)
        try:
            wait_for(lambda: agent_names(daemon) == {"sched-1"}, what="agent joined")
            fast, slow = task("matmul(M=2,N=2,K=1)", count=1), task("matmul(M=2,N=2,K=3)", count=2)
            with FleetClient(daemon.address) as client:
                timing = TimingConfig(repeat=1, warmup=0, min_repeat_ms=0, run_timeout_s=10)
                tuner = FleetTaskTuner(client, JobSpec(fast.key, "sched", target="sleep", strategy="random",
                                                       timing=timing))
                result = TaskScheduler([fast, slow], tuner, round_trials=3).run(10)
                assert result.spent == 10
                held = {s.task.key: len(log.trials(workload_key=s.task.key, device_key="sched", target="sleep"))
                        for s in result.states}
                assert held == {s.task.key: s.trials for s in result.states}
                assert sum(held.values()) == 10 and min(held.values()) >= 3
                for s in result.states:
                    assert s.default_s is not None and s.best_s is not None
                slow_state = next(s for s in result.states if s.task is slow)
                assert slow_state.best_s > 2e-3  # sleeps 3 ms per call
                # same budget again: resumes, nothing new measured
                again = TaskScheduler([fast, slow], tuner, round_trials=3).run(10)
                assert again.spent == 10
                assert sum(len(log.trials(workload_key=t.key, device_key="sched", target="sleep"))
                           for t in (fast, slow)) == 10
        finally:
            stop_all([agent])
            daemon.stop()
