"""The tuning loop: ask the strategy, measure, record in the log, tell the strategy.

The log is the source of truth. A job first loads what the log already holds for its workload,
device and target, so re-running the same command resumes: ``trials`` is the number of distinct
configs the log should hold for that triple when the job ends, and configs already measured are
never measured again.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generator

import numpy as np

from measure_agent.device import DeviceInfo
from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus
from measure_agent.engine.build import source_digest
from measure_agent.engine.cpu_wait import DISTURBED_WAIT_SHARE
from measure_agent.space import Config
from measure_agent.templates import TemplateCatalog
from measure_agent.workload import Workload
from tuner.log import LogUnavailable, TrialRecord, TuningLog, exact_best_config
from tuner.log.records import RecordError, storable_text
from tuner.measure import MeasurementAborted, Measurer
from tuner.search import Observation, make_strategy
from tuner.search.kernel_reuse import KernelReuse
from tuner.steering import steer_space
from tuner.search.transfer import prior_from_log

if TYPE_CHECKING:
    from tuner.fleet import JobSpec


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 64
    strategy: str = "xgb"
    seed: int = 0
    early_stopping: int | None = None  # stop after this many trials without improvement
    batch_size: int | None = None  # candidates in flight; default: three times the parallelism, at least 4
    target: str = "cpu"  # the template family
    pins: tuple[tuple[str, str], ...] = ()  # (knob, raw value) fixed by the user
    constraints: tuple[str, ...] = ()  # expressions every measured config satisfies
    transfer: bool = True  # start from the log's records of other workloads/devices (tuner.search.transfer)
    time_budget_s: float | None = None  # propose nothing new after this many seconds of wall time
    # share of each batch given to runtime variants of the best kernels measured so far: configs
    # that render an already compiled kernel, so they cost no compile (tuner.search.kernel_reuse)
    reuse_share: float = 0.0

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError("trials must be >= 1")
        if self.early_stopping is not None and self.early_stopping < 1:
            raise ValueError("early stopping must be >= 1")
        if not 0.0 <= self.reuse_share < 1.0:
            raise ValueError(f"reuse_share must be in [0, 1), not {self.reuse_share!r}")

    @classmethod
    def from_spec(cls, spec: "JobSpec") -> "TuneOptions":
        """What the loop takes from a job's spec (the rest goes to its measurer)."""
        return cls(trials=spec.trials, strategy=spec.strategy, seed=spec.seed, early_stopping=spec.early_stopping,
                   target=spec.target_spec.family, pins=spec.pin_pairs, constraints=tuple(spec.constraints),
                   transfer=spec.transfer, time_budget_s=spec.time_budget_s,
                   reuse_share=float(spec.reuse_share))


@dataclass(frozen=True)
class Progress:
    """State of a running job, passed to the progress callback after every batch."""

    done: int  # distinct configs in the log for this workload/device/target
    total: int
    measured_now: int  # measured by this job
    errors: int  # failed measurements of this job
    best_gflops: float | None
    state: str = "running"  # a fleet job is "queued" until an agent takes its first candidate


@dataclass(frozen=True)
class TuneSummary:
    job_id: int
    workload: Workload
    device_key: str
    best: TrialRecord | None
    default: TrialRecord | None
    measured_now: int
    errors: int
    total_in_log: int
    stopped_early: bool = False
    status_counts: dict[str, int] = field(default_factory=dict)
    disturbed_timings: int = 0  # measured ok, but other work on the host took the kernel's CPU

    @property
    def note(self) -> str:
        """What a user should know about how the job was measured; empty when nothing."""
        if not self.disturbed_timings:
            return ""
        return (f"{self.disturbed_timings} of {self.measured_now} timings were slowed by other work on the measuring "
                f"host (the kernel's threads waited for a CPU even in the repeats timed again): their times may "
                f"read slow; measure on a quieter host to compare them")

    @property
    def speedup_over_default(self) -> float | None:
        if self.best and self.default and self.best.mean_s and self.default.mean_s:
            return self.default.mean_s / self.best.mean_s
        return None


def gflops(workload: Workload, seconds: float | None) -> float | None:
    return workload.flops / seconds / 1e9 if seconds else None


class TuningJob:
    """Tunes one workload on one measurer, recording every result in ``log``."""

    def __init__(
        self,
        workload: Workload,
        measurer: Measurer,
        log: TuningLog,
        catalog: TemplateCatalog,
        options: TuneOptions = TuneOptions(),
        on_progress: Callable[[Progress], None] | None = None,
        job_id: int | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        """``job_id``: a job already created in ``log`` (the daemon creates it when submitted);
        ``on_note`` hears when the log goes away (results are held and retried) and comes back."""
        self.workload = workload
        self.measurer = measurer
        self.log = log
        self.options = options
        self.catalog = catalog
        self.template = catalog.get(workload.op, options.target)
        # The space may depend on the device (vector width, GPU limits): use what the measurer reports.
        device = DeviceInfo.from_recorded(measurer.device_info)
        full_space = catalog.space(workload, options.target, device)
        # checked within a time budget when the job was submitted; a job does not stop over it now
        self.space = steer_space(full_space, options.pins, options.constraints, budget_s=math.inf)
        self.default_config = self.template.default_config(workload, full_space)
        self.on_progress = on_progress or (lambda progress: None)
        self.on_note = on_note or (lambda note: None)
        self.job_id = job_id
        self._refill = 1  # see results_worth_a_step
        self._in_flight = 0

    @property
    def results_worth_a_step(self) -> int:
        """How many results the next step of :meth:`steps` can use at once: a refill's chunk, or
        what is in flight when that is less (0: nothing is). A driver of many jobs gathers up to
        this many before it steps: one log transaction and one proposal for the group."""
        return min(max(1, self._refill), self._in_flight)

    def run(self) -> TuneSummary:
        """Tune to the end in this thread (waiting up to a second at a time for results)."""
        steps = self.steps(wait_s=1.0)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(self, wait_s: float = 0.0) -> Generator[bool, None, TuneSummary]:
        """The loop, one step at a time: each step proposes, collects and records what it can,
        waiting at most ``wait_s`` for results, and yields whether it got anything done. The
        generator returns the :class:`TuneSummary`. A few threads can so drive many jobs (the daemon
        does), resting when no job has anything to do."""
        opts = self.options
        key = (self.workload.key, self.measurer.device_key, opts.target)
        if self.measurer.device_info:
            self.log.upsert_device(self.measurer.device_key, self.measurer.device_info)
        history = self.log.trials(workload_key=key[0], device_key=key[1], target=key[2])
        strategy = make_strategy(opts.strategy, self.space, seed=_strategy_seed(opts.seed, len(history)),
                                 workload=self.workload, features=self.template)
        if opts.transfer:
            strategy.observe_prior(prior_from_log(self.log, self.workload, key[1], opts.target, space_of=self.template.space))
        started = time.monotonic()
        strategy.observe([self._observation(r) for r in history if self._in_space(r.config)])
        measured = {d for d in (self._digest(r.config) for r in history) if d}
        job_id = self.job_id or self.log.create_job(
            key[0], key[1], opts.target, opts.strategy, opts.trials,
            {"seed": opts.seed, "early_stopping": opts.early_stopping, "template_version": self.measurer.template_version,
             "pins": [f"{k}={v}" for k, v in opts.pins], "constraints": list(opts.constraints)},
        )
        best = min((r.mean_s for r in history if r.mean_s), default=math.inf)
        reuse = KernelReuse(self.space, self._kernel_digest, seed=opts.seed) if opts.reuse_share > 0 else None
        fastest = _Fastest()  # the best measured configs: whose kernels reuse varies
        reuse_credit = 0.0
        for record in history:
            if record.mean_s and self._in_space(record.config):
                fastest.add(record.mean_s, self.space.from_json(record.config))
        measured_now = errors = since_improvement = disturbed = 0
        stopped_early = False
        status_counts: dict[str, int] = {}
        # the default is measured for the speed-up report, unless the user's pins exclude it
        pending_default = self.default_config.digest not in measured and self.space.is_valid(self.default_config)
        in_flight: set[str] = set()
        between_batches = self.measurer.shares_cpu_with_tuner and self.template.timed_on_host_cpu
        unlogged = _HeldResults(self.log, self.on_note)  # measured, not yet in the log (it is away)
        final_status: str | None = "failed"
        try:
            while True:
                # Keep about `window` candidates in flight: agents hold up to twice their
                # parallelism (one batch measuring, the next leased ahead), plus a queue for the
                # agent that asks next. Refill in chunks of half the parallelism so the strategy
                # proposes in batches. A fleet's parallelism changes as agents come and go.
                # While the log is away nothing new is proposed: what is measured waits in memory.
                parallelism = self.measurer.parallelism
                window = opts.batch_size or max(4, 3 * parallelism)
                chunk = window // 2 if opts.batch_size else max(1, parallelism // 2)
                room = min(window - len(in_flight), opts.trials - len(measured) - len(in_flight))
                self._refill = chunk
                # Proposing (a model fit, ranking the space) on the cores a kernel is being timed on
                # takes them from its threads: where they are shared, propose between batches.
                ready_for_more = not in_flight if between_batches else len(in_flight) <= window - chunk
                if not stopped_early and not unlogged and room > 0 and ready_for_more:
                    batch: list[Config] = []
                    if pending_default:
                        batch.append(self.default_config)
                        strategy.claim(self.default_config)
                        pending_default = False
                    if reuse is not None:
                        # a running share: batches of one candidate get their turn too
                        reuse_credit += opts.reuse_share * (room - len(batch))
                        wanted = int(reuse_credit)
                        variants = reuse.variants(fastest.configs(), wanted, strategy.is_new)
                        reuse_credit -= len(variants) if variants else wanted
                        # claimed in the strategy, which then never proposes them itself
                        batch += [c for c in variants if strategy.claim(c) and c.digest not in measured]
                    batch += [c for c in strategy.propose(room - len(batch)) if c.digest not in measured]
                    self.measurer.submit([MeasureInput(self.workload, c, opts.target) for c in batch])
                    in_flight.update(c.digest for c in batch)
                if not in_flight and not unlogged:
                    break  # budget reached, space exhausted, or stopped early and drained
                arrived = self.measurer.collect(timeout_s=wait_s) if in_flight else []
                records = [self._record(job_id, item.config, result) for item, result in arrived]
                unlogged.write(records)  # one transaction per arrival group, or held for a retry
                if not arrived:
                    if not in_flight:
                        unlogged.wait(wait_s)
                    self._in_flight = len(in_flight)
                    yield False
                    continue
                # the configs measured are the ones proposed: no need to read them back from the records
                strategy.observe([Observation(item.config, record.mean_s)
                                  for (item, _), record in zip(arrived, records)])
                for item, result in arrived:
                    in_flight.discard(item.config.digest)
                    measured.add(item.config.digest)
                    measured_now += 1
                    status_counts[result.status.value] = status_counts.get(result.status.value, 0) + 1
                    if not result.status.is_ok:
                        errors += 1
                    elif _disturbed(result):
                        disturbed += 1
                    mean_s = result.mean_s  # a property that averages the costs: once
                    if mean_s is not None:
                        fastest.add(mean_s, item.config)
                    if mean_s is not None and mean_s < best:
                        best = mean_s
                        since_improvement = 0
                    else:
                        since_improvement += 1
                self.on_progress(Progress(len(measured), opts.trials, measured_now, errors,
                                          gflops(self.workload, best if best < math.inf else None)))
                if opts.early_stopping and since_improvement >= opts.early_stopping:
                    stopped_early = True  # what is in flight is still collected and logged
                if opts.time_budget_s is not None and time.monotonic() - started >= opts.time_budget_s:
                    stopped_early = True  # wall-time budget spent: drain what is in flight
                self._in_flight = len(in_flight)
                yield True
            final_status = "done"
        except MeasurementAborted as exc:
            final_status = exc.job_status
            raise
        except GeneratorExit:  # abandoned by its driver (the process is ending): resumed later
            final_status = None
            raise
        finally:
            if final_status is not None:  # None: interrupted, left running to be resumed
                unlogged.retrying(lambda: self.log.finish_job(job_id, final_status), attempts=5)
        # the answer `tuner best` gives: the fastest config the installed template accepts
        best = exact_best_config(self.log, self.workload, key[1], opts.target, catalog=self.catalog)
        default_records = self.log.trials(workload_key=key[0], device_key=key[1], target=key[2],
                                          config_digest=self.default_config.digest)
        return TuneSummary(
            job_id=job_id,
            workload=self.workload,
            device_key=key[1],
            best=best.record,
            default=default_records[0] if default_records else None,
            measured_now=measured_now,
            errors=errors,
            total_in_log=len(measured),
            stopped_early=stopped_early,
            status_counts=status_counts,
            disturbed_timings=disturbed,
        )

    # -- helpers ----------------------------------------------------------------------------
    def _kernel_digest(self, config: Config) -> str:
        return source_digest(self.template.render(self.workload, config))

    def _in_space(self, config_json: dict) -> bool:
        try:
            self.space.from_json(config_json)
        except ValueError:
            return False
        return True

    def _digest(self, config_json: dict) -> str:
        try:
            return self.space.from_json(config_json).digest
        except ValueError:
            return ""

    def _observation(self, record: TrialRecord) -> Observation:
        return Observation(self.space.from_json(record.config), record.mean_s)

    def _record(self, job_id: int, config: Config, result: MeasureResult) -> TrialRecord:
        agent = result.measured_by or self.measurer.agent_name
        try:
            return TrialRecord.from_result(
                self.workload.key, self.measurer.device_key, self.options.target, config, result,
                agent=agent, template_version=self.measurer.template_version, job_id=job_id,
            )
        except RecordError as exc:
            # A result the log cannot hold (an infinite cost, a NUL in a message) is the agent's
            # fault, not the job's: it becomes a failed trial saying why, and tuning goes on.
            failed = MeasureResult(MeasureStatus.RUNTIME_ERROR, message=f"invalid measurement from the agent: {exc}")
            return TrialRecord.from_result(
                self.workload.key, self.measurer.device_key, self.options.target, config.to_json(), failed,
                agent=storable_text(agent, 128), template_version=self.measurer.template_version, job_id=job_id,
            )


def _disturbed(result: MeasureResult) -> bool:
    """Whether the agent says other work on its host slowed the timing (details from the network:
    anything but a number says nothing)."""
    share = result.details.get("cpu_wait_share")
    return isinstance(share, (int, float)) and share > DISTURBED_WAIT_SHARE


class _Fastest:
    """The ``keep`` fastest measured configs (kernel reuse varies the best kernels)."""

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep
        self._entries: list[tuple[float, str, Config]] = []

    def add(self, mean_s: float, config: Config) -> None:
        if len(self._entries) >= self.keep * 4 and (mean_s, config.digest) >= self._entries[-1][:2]:
            return  # slower than every one kept (most results are): nothing changes
        bisect.insort(self._entries, (mean_s, config.digest, config), key=lambda entry: (entry[0], entry[1]))
        del self._entries[self.keep * 4:]  # a few more than kept: several may share one kernel

    def configs(self) -> list[Config]:
        return [config for _, _, config in self._entries]


def _strategy_seed(seed: int, recorded: int) -> int:
    """The strategy's seed: the job's own on a fresh start; on a resume (the log holds ``recorded``
    trials of the workload), one derived from both. A resumed strategy with the job's own seed would
    draw, in the same order, what the earlier run drew and the log holds, and a random start that
    finds only seen configs gives up: the job ended 'done' short of its budget. Still deterministic
    per seed and log."""
    if not recorded:
        return seed
    return int(np.random.SeedSequence([seed, recorded]).generate_state(1)[0])


class _HeldResults:
    """Results measured while the tuning log is away (:class:`LogUnavailable`), held in memory and
    written with capped exponential backoff; at most the loop's in-flight window, since nothing new
    is proposed while any are held. Inserts are idempotent, so a write that reached the database
    before its connection dropped is not recorded twice when retried."""

    FIRST_BACKOFF_S = 0.5
    MAX_BACKOFF_S = 30.0

    def __init__(self, log: TuningLog, on_note: Callable[[str], None]) -> None:
        self.log = log
        self.on_note = on_note
        self.held: list[TrialRecord] = []
        self._backoff = self.FIRST_BACKOFF_S
        self._next_try = 0.0

    def __bool__(self) -> bool:
        return bool(self.held)

    def write(self, records: list[TrialRecord]) -> None:
        self.held += records
        if not self.held or time.monotonic() < self._next_try:
            return
        try:
            self.log.record_trials(self.held)
        except LogUnavailable as exc:
            self._next_try = time.monotonic() + self._backoff
            self.on_note(f"the tuning log is unavailable ({exc}); holding {len(self.held)} results, "
                         f"retrying in {self._backoff:g} s")
            self._backoff = min(self.MAX_BACKOFF_S, self._backoff * 2)
            return
        if self._backoff > self.FIRST_BACKOFF_S:
            self.on_note("")  # the log is back
        self.held = []
        self._backoff = self.FIRST_BACKOFF_S
        self._next_try = 0.0

    def wait(self, most_s: float) -> None:
        """Sleep until the next write may be tried, ``most_s`` at most (nothing else to do meanwhile)."""
        time.sleep(max(0.0, min(most_s, self._next_try - time.monotonic())))

    def retrying(self, action: Callable[[], object], attempts: int) -> None:
        """``action`` (a small write), retried while the log is away, ``attempts`` times at most."""
        for attempt in range(attempts):
            try:
                action()
                return
            except LogUnavailable:
                if attempt == attempts - 1:
                    raise
                time.sleep(min(self.MAX_BACKOFF_S, self.FIRST_BACKOFF_S * 2 ** attempt))
