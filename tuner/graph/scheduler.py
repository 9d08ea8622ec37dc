"""The task scheduler: spend a model's trial budget where the estimated model latency gains most.

The model latency is estimated as ``sum over tasks of count * best mean time`` (operators that are not
tasks, such as elementwise ops, pooling and data movement, are not counted). The scheduler follows
Ansor's task scheduler (Zheng et al., OSDI 2020, section 6; TVM's ``auto_scheduler.TaskScheduler``):

1. **Warm-up**, round robin: every task gets a first chunk of ``round_trials`` trials (the job
   measures the template's default config first), most important tasks first (count x FLOPs), so a
   budget too small for every task still covers the heaviest ones. When the budget is smaller than
   ``tasks x round_trials`` the chunk shrinks to ``budget // tasks`` (at least 1), as in Ansor.
2. **Gradient rounds**: each round gives one more chunk to the task ``i`` with the most negative
   estimated gradient of the model latency ``f = sum_j w_j g_j`` w.r.t. its trials ``t_i``::

       df/dt_i ~= w_i * (alpha * backward_i + (1 - alpha) * forward_i)

   with ``w_i`` the task's count (d f / d g_i) and ``g_i`` its best time, in seconds per trial:

   - ``backward_i = (g_i(t_now) - g_i(t_then)) / (t_now - t_then)`` over the task's last
     ``backward_window`` rounds (0 until it has that many), the improvement it has actually shown;
   - ``forward_i = (min(g_i - g_i * c / t_i, beta * flops_i / best_rate) - g_i) / c`` for a chunk
     of ``c`` trials: optimistically, one more chunk improves by ``c / t_i`` of the current time, or
     brings the task up to ``1 / beta`` of the best FLOP rate reached by a task of the same operator
     and dtype (Ansor's similarity groups; a task that stays below that rate after 5 more rounds than every
     other task of its group leaves the group).

   Ties (every gradient equal) go to the task of largest ``count * best time``. Ansor's constants:
   ``alpha = 0.2``, ``beta = 2``, ``backward_window = 3``.

A round asks the tuner for ``trials = t_i + chunk`` (resume semantics: ``trials`` is how many configs
the log should hold for the task afterwards). The budget counts configs in the log for the model's
tasks, including those from earlier runs: re-running with the same budget resumes rather than
measuring the budget again. A task leaves the rotation ("retired") when its tuner reports an error,
when no config of it ran successfully, or when a round ends with fewer configs than asked (its search
space is exhausted).

The scheduler talks to an object with ``tune(task, trials)`` that returns the best mean time in
seconds (or None) or a :class:`TuneOutcome`; :class:`FleetTaskTuner` is the one over a
:class:`~tuner.daemon.FleetClient`, so the scheduler is testable with a fake.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from tuner.graph.tasks import Task

if TYPE_CHECKING:
    from tuner.fleet import JobSpec, JobStatus


@dataclass(frozen=True)
class TuneOutcome:
    """What one tuning job of a task ended with.

    ``trials``: configs the log holds for the task after the job (None: as many as asked); fewer than
    asked with ``exhausted`` means the search space has no more. ``error``: the job could not run.
    """

    best_s: float | None
    trials: int | None = None
    default_s: float | None = None
    exhausted: bool = False
    error: str = ""


class TaskTuner(Protocol):
    def tune(self, task: Task, trials: int) -> "float | None | TuneOutcome":
        """Tune ``task`` until the log holds ``trials`` configs for it; the best mean time so far."""


@dataclass
class TaskState:
    """Where one task stands in the schedule."""

    index: int
    task: Task
    trials: int = 0
    best_s: float | None = None
    default_s: float | None = None
    rounds: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)  # (trials, best_s) after each round
    retired: str = ""  # why the task gets no more trials

    @property
    def weight(self) -> int:
        return self.task.count

    @property
    def alive(self) -> bool:
        return not self.retired

    @property
    def group(self) -> str:
        """Tasks of one operator and dtype reach comparable FLOP rates (Ansor's similarity groups)."""
        return f"{self.task.workload.op}/{self.task.workload.dtype}"

    def rate(self) -> float | None:
        """FLOP/s of the best config."""
        return self.task.flops / self.best_s if self.best_s else None


@dataclass(frozen=True)
class RoundReport:
    """One round, as the progress callback sees it."""

    number: int
    phase: str  # "warm-up" or "gradient"
    state: TaskState
    trials_before: int
    best_before: float | None
    spent: int
    budget: int
    latency_s: float | None  # the model estimate over the tasks that have a best time
    measured_tasks: int
    tasks: int


@dataclass(frozen=True)
class ScheduleResult:
    states: tuple[TaskState, ...]
    budget: int
    spent: int
    rounds: int

    def latency(self) -> tuple[float | None, float | None, int]:
        """(before, after, tasks): ``sum count * default`` and ``sum count * best`` over the tasks
        that have both, so the two are comparable, and how many tasks that is."""
        both = [s for s in self.states if s.best_s is not None and s.default_s is not None]
        if not both:
            return None, None, 0
        before = sum(s.weight * s.default_s for s in both)
        after = sum(s.weight * s.best_s for s in both)
        return before, after, len(both)


class TaskScheduler:
    """Ansor-style gradient task scheduling over ``tuner.tune(task, trials)``; see the module docstring."""

    def __init__(self, tasks: Sequence[Task], tuner: TaskTuner, *, round_trials: int = 8, alpha: float = 0.2,
                 beta: float = 2.0, backward_window: int = 3,
                 on_round: Callable[[RoundReport], None] | None = None,
                 on_start: Callable[[TaskState, int, str], None] | None = None) -> None:
        if not tasks:
            raise ValueError("no tasks to schedule")
        if round_trials < 1:
            raise ValueError("round_trials must be >= 1")
        self.states = [TaskState(i, task) for i, task in enumerate(tasks)]
        self.tuner = tuner
        self.round_trials = round_trials
        self.alpha = alpha
        self.beta = beta
        self.backward_window = backward_window
        self.on_round = on_round or (lambda report: None)
        self.on_start = on_start or (lambda state, trials, phase: None)
        self._groups: dict[str, set[int]] = {}
        for state in self.states:
            self._groups.setdefault(state.group, set()).add(state.index)
        self.rounds = 0

    # -- the schedule -------------------------------------------------------------------------
    @property
    def spent(self) -> int:
        return sum(s.trials for s in self.states)

    def run(self, budget: int) -> ScheduleResult:
        """Tune until the log holds ``budget`` configs over all tasks (or no task can go on)."""
        if budget < 1:
            raise ValueError("budget must be >= 1")
        chunk = min(self.round_trials, max(1, budget // len(self.states)))
        order = sorted(self.states, key=lambda s: (-s.task.total_flops, s.index))
        for state in order:
            if self.spent >= budget:
                break
            self._round(state, min(chunk, budget - self.spent), "warm-up", budget)
        while self.spent < budget:
            alive = [s for s in self.states if s.alive and s.trials > 0]
            if not alive:
                break
            state = self.pick(alive, chunk)
            self._round(state, min(chunk, budget - self.spent), "gradient", budget)
        return ScheduleResult(tuple(self.states), budget, self.spent, self.rounds)

    def pick(self, candidates: Sequence[TaskState], chunk: int) -> TaskState:
        """The task whose next chunk is estimated to lower the model latency most."""
        scored = [(self.gradient(s, chunk), -(s.weight * (s.best_s or 0.0)), s.index, s) for s in candidates]
        return min(scored, key=lambda item: item[:3])[3]

    def gradient(self, state: TaskState, chunk: int) -> float:
        """Estimated d(model latency)/d(trials of ``state``), seconds per trial (<= 0)."""
        g, t = state.best_s, state.trials
        if g is None or t <= 0:
            return 0.0
        backward = 0.0
        if len(state.history) > self.backward_window:
            (t_now, g_now), (t_then, g_then) = state.history[-1], state.history[-1 - self.backward_window]
            if t_now > t_then:
                backward = (g_now - g_then) / (t_now - t_then)
        g_next = g - g * chunk / t
        group = [self.states[j] for j in self._groups.get(state.group, ()) if self.states[j].best_s]
        if len(group) > 1:
            best_rate = max(s.rate() for s in group)
            g_next = min(g_next, self.beta * state.task.flops / best_rate)
        forward = (g_next - g) / chunk
        return state.weight * (self.alpha * backward + (1 - self.alpha) * forward)

    # -- one round ----------------------------------------------------------------------------
    def _round(self, state: TaskState, more: int, phase: str, budget: int) -> None:
        target = state.trials + more
        before_trials, before_best = state.trials, state.best_s
        self.on_start(state, target, phase)
        outcome = self.tuner.tune(state.task, target)
        if not isinstance(outcome, TuneOutcome):
            outcome = TuneOutcome(best_s=outcome)
        self.rounds += 1
        state.rounds += 1
        if outcome.trials is not None:
            reported = outcome.trials
        else:  # a plain result: as many as asked, unless the job could not run at all
            reported = before_trials if outcome.error else target
        state.trials = max(state.trials, reported)
        if outcome.default_s is not None:
            state.default_s = outcome.default_s
        if outcome.best_s is not None and math.isfinite(outcome.best_s) and outcome.best_s > 0:
            state.best_s = outcome.best_s if state.best_s is None else min(state.best_s, outcome.best_s)
        if state.best_s is not None:
            state.history.append((state.trials, state.best_s))
        if outcome.error:
            state.retired = outcome.error
        elif state.best_s is None:
            state.retired = f"no config ran successfully in {state.trials} trials"
        elif outcome.exhausted or reported < target:
            state.retired = f"search space exhausted at {state.trials} configs"
        self._adjust_group(state)
        latency, measured = self._estimate()
        self.on_round(RoundReport(self.rounds, phase, state, before_trials, before_best, self.spent, budget,
                                  latency, measured, len(self.states)))

    def _adjust_group(self, state: TaskState) -> None:
        """Ansor: a task tuned 5 rounds more than its peers yet below 1/beta of their best rate is not
        similar to them; it leaves the group (and the group's rate no longer bounds its estimate)."""
        members = self._groups.get(state.group, set())
        if state.index not in members or len(members) < 2 or state.rate() is None:
            return
        others = [self.states[j] for j in members if j != state.index]
        rates = [s.rate() for s in others if s.rate() is not None]
        if not rates:
            return
        if state.rate() < max(rates) / self.beta and state.rounds > 5 + max(s.rounds for s in others):
            members.discard(state.index)

    def _estimate(self) -> tuple[float | None, int]:
        known = [s for s in self.states if s.best_s is not None]
        if not known:
            return None, 0
        return sum(s.weight * s.best_s for s in known), len(known)


class FleetTaskTuner:
    """``tune(task, trials)`` as a fleet job: submit with ``trials`` (resume semantics), follow it to its end.

    Every job is ``spec`` (device key, target, strategy, seed, timing, ...) with the task's workload
    and the round's ``trials``. A request the daemon refuses (no template for the operator on the
    target, ...) or a job that fails ends the task with that message as its error; losing the
    daemon raises the client's ``FleetError``. Interrupting (KeyboardInterrupt) cancels the running job.
    """

    def __init__(self, client, spec: "JobSpec", on_status: "Callable[[JobStatus], None] | None" = None) -> None:
        self.client = client
        self.spec = spec
        self.on_status = on_status or (lambda status: None)
        self.jobs: list[int] = []

    def tune(self, task: Task, trials: int) -> TuneOutcome:
        from measure_agent.protocol.errors import InvalidRequest

        try:
            status = self.client.submit(replace(self.spec, workload=task.workload.key, trials=trials))
        except InvalidRequest as exc:
            return TuneOutcome(best_s=None, error=str(exc))
        self.jobs.append(status.job_id)
        final = status
        try:
            for final in self.client.watch(status.job_id):
                self.on_status(final)
        except KeyboardInterrupt:
            self.client.cancel(status.job_id)
            raise
        return outcome_of(final, trials)


def outcome_of(status: "JobStatus", trials: int) -> TuneOutcome:
    """A finished job's :class:`TuneOutcome`."""
    if status.state != "done":
        reason = status.message or "no reason given"
        return TuneOutcome(best_s=status.best_mean_s, trials=status.done, default_s=status.default_mean_s,
                           error=f"job {status.job_id} {status.state}: {reason}")
    return TuneOutcome(best_s=status.best_mean_s, trials=status.done, default_s=status.default_mean_s,
                       exhausted=status.done < trials and not status.stopped_early)
