"""Tuning jobs in the daemon: validated on submission, run as :class:`TuningJob` steps by a few driver threads.

A job is its :class:`~tuner.fleet.JobSpec`, stored with the job in the log, and the
:class:`~tuner.fleet.JobStatus` clients are shown; both are immutable, replaced on every change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Iterator

from measure_agent.device import DeviceInfo
from measure_agent.protocol.errors import InvalidRequest, NotFound
from measure_agent.templates import TemplateCatalog, TemplateNotFound
from tuner.daemon.fleet_measurer import FleetMeasurer
from tuner.daemon.limits import DRIVER_THREADS, FINISHED_JOBS_KEPT, VALIDATION_THREADS
from tuner.daemon.scheduler import Scheduler
from tuner.fleet.jobs import JobSpec, JobSpecError, JobStatus
from tuner.job import Progress, TuneOptions, TuningJob
from tuner.log import JobRecord, NotFoundError, TuningLog, TuningLogError, exact_best_config
from tuner.measure import MeasurementAborted
from tuner.steering import SteeringError, parse_target

# Steps of lower-priority jobs between two of the top priority's. Still needed: without it (rounds in
# priority order only) the hundred-jobs fair-share test saw an urgent job finish after a normal one
# of its key in 2 runs of 12, with it in none of 10 (measured with batched log writes, issue 21).
TOP_PRIORITY_EVERY = 8

# How long a driver waits at most, before it steps, for results to gather: until as many arrived
# as the live job that wants fewest can use at once (its refill chunk, half its agents'
# parallelism: TuningJob.results_worth_a_step), so one log transaction and one proposal serve the
# group. A job keeps about its parallelism queued beyond what agents hold, so the refill comes
# while half of that is still ahead of them. Results reach the log at most this much later (a
# daemon killed meanwhile loses them and the job measures them again when it resumes). Measured
# (light agents, bench/fleet.py): a fixed 20 ms gather before took 40 results a step at 256
# agents x 500 ms, this 128 (the job drivers' CPU per candidate 0.13-0.15 -> 0.12 ms).
RESULT_GATHER_MAX_S = 0.25

logger = logging.getLogger("tunefleet.daemon")


@dataclass
class _Job:
    status: JobStatus
    version: int = 0  # bumped on every change, so watchers wait for news
    cancel: threading.Event = field(default_factory=threading.Event)  # by a user: the job ends
    interrupt: threading.Event = field(default_factory=threading.Event)  # daemon stopping: resumes later
    steps: Iterator[bool] | None = None  # the job's loop, advanced one step at a time by a driver
    tuning: TuningJob | None = None  # once the job's space is known (an agent of its key came)


def _options_of(spec: JobSpec, template_version: str) -> dict:
    """Everything needed to resume the job after a restart, stored with it in the log."""
    return {"fleet": True, "template_version": template_version, **spec.to_json()}


def _spec_of(record: JobRecord) -> JobSpec:
    """The spec a job was stored with (the record's columns name its workload, key and budget)."""
    return JobSpec.from_json({**record.options, "workload": record.workload_key, "device_key": record.device_key,
                              "strategy": record.strategy, "trials": record.trials})


class JobManager:
    """Owns the running jobs. Results go to ``log`` as they arrive; the log is the source of truth."""

    def __init__(self, scheduler: Scheduler, log: TuningLog, catalog: TemplateCatalog,
                 agents_share_host: bool = False) -> None:
        self.scheduler = scheduler
        self.log = log
        self.catalog = catalog
        # the agents run on this host (the embedded local agent): jobs whose kernels are timed on the
        # CPU propose only between batches (Measurer.shares_cpu_with_tuner)
        self.agents_share_host = agents_share_host
        self._jobs: dict[int, _Job] = {}
        self._finished: deque[int] = deque()  # ids of finished jobs still in memory, oldest first
        self._validation = ThreadPoolExecutor(max_workers=VALIDATION_THREADS, thread_name_prefix="tunefleet-validate")
        jobs_lock = threading.RLock()
        self._changed = threading.Condition(jobs_lock)  # a job's status changed
        # Jobs do not each hold a thread: DRIVER_THREADS drivers take turns advancing the runnable
        # ones a step each, and rest on the scheduler's changes when none had anything to do. A
        # round steps every runnable job once, the highest priority first: with a hundred jobs a
        # round takes a while, and an urgent job's results should not wait behind all of it.
        self._runnable: deque[_Job] = deque()  # this round's jobs still to step
        self._stepped: list[_Job] = []  # stepped this round: the next round, once sorted
        self._round_top = 0  # the highest priority of this round's jobs
        self._lower_steps = 0  # steps of lower-priority jobs since the top ones were stepped
        self._drivers: list[threading.Thread] = []
        # Drivers beyond the number of live jobs would only wake on every change to find nothing
        # to step: driver i takes part while more than i jobs live, and waits here otherwise.
        self._live_jobs = 0
        self._driver_wanted = threading.Condition(jobs_lock)
        self._stopping = threading.Event()

    def submit(self, spec: JobSpec) -> JobStatus:
        """Validate ``spec`` against the daemon's templates, record the job and start it;
        raises :class:`InvalidRequest` naming what is wrong."""
        # Checking constraints against a space is CPU work within a time budget: a few at a time on
        # their own threads, so that a burst of costly submissions cannot take the daemon's cores.
        try:
            spec = self._validation.submit(spec.validate, self.catalog, self._devices_of(spec)).result()
        except JobSpecError as exc:
            raise InvalidRequest(str(exc)) from None
        self._check_servable(spec)
        workload = spec.parsed_workload
        if spec.family:
            self.log.record_family(spec.family, workload.op, workload.dtype, [workload.key])
        job_id = self.log.create_job(workload.key, spec.device_key, spec.target_spec.family, spec.strategy,
                                     spec.trials, _options_of(spec, self.catalog.version))
        self._start(self._new_status(job_id, spec, time.time()))
        return self.get(job_id)

    def _devices_of(self, spec: JobSpec) -> list[DeviceInfo]:
        """The kinds of device seen under the job's key that its target admits: the spaces its
        pins and constraints must fit (none known: they are checked when the job starts)."""
        try:
            target = parse_target(spec.target or "cpu")
        except SteeringError:
            return []  # validate says why
        return [DeviceInfo.from_recorded(d) for d in self.scheduler.devices_seen(spec.device_key)
                if not target.has_requirements or target.matches(d)]

    def _check_servable(self, spec: JobSpec) -> None:
        """Refuse a job whose target no agent of its key can serve: none of the kinds of device
        registered under the key since the daemon started (live or gone) matches it. A key no
        agent has registered under yet is not judged: its agents may still join."""
        target = spec.target_spec
        if not target.has_requirements:
            return
        devices = self.scheduler.devices_seen(spec.device_key)
        if devices and not any(target.matches(device) for device in devices):
            raise InvalidRequest(f"target {target.text!r} matches no agent of key {spec.device_key!r}: "
                                 f"they have {target.offered(devices)}")

    def resume(self) -> list[int]:
        """Start again every fleet job the log holds as running (the daemon stopped or died mid-job).

        Each resumes from the log: configs already recorded are not measured again.
        """
        resumed = []
        for record in self.log.jobs(status="running"):
            if not record.options.get("fleet") or record.id in self._jobs:
                continue
            if record.options.get("template_version") != self.catalog.version:
                self.log.finish_job(record.id, "failed")
                logger.warning("job %d not resumed: it was measured with other templates", record.id)
                continue
            try:
                spec = _spec_of(record).validate()
            except (JobSpecError, ValueError, TypeError) as exc:
                self.log.finish_job(record.id, "failed")
                logger.warning("job %d not resumed: %s", record.id, exc)
                continue
            self._start(self._new_status(record.id, spec, record.created_at.timestamp()))
            resumed.append(record.id)
        if resumed:
            logger.info("resumed jobs %s from the log", ", ".join(map(str, resumed)))
        return resumed

    @staticmethod
    def _new_status(job_id: int, spec: JobSpec, created_at: float) -> JobStatus:
        return JobStatus(job_id=job_id, state="running", spec=spec, created_at=created_at,
                         flops=float(spec.parsed_workload.flops))

    def _start(self, status: JobStatus) -> None:
        job = _Job(status)
        job.steps = self._steps(job)
        with self._changed:
            self._jobs[status.job_id] = job
            self._runnable.append(job)
            self._live_jobs += 1
            self._driver_wanted.notify_all()
            if not self._drivers:
                self._drivers = [threading.Thread(target=self._drive, args=(i,), name=f"tunefleet-jobs-{i}",
                                                  daemon=True)
                                 for i in range(DRIVER_THREADS)]
                for driver in self._drivers:
                    driver.start()
        self.scheduler.nudge()  # wake a resting driver

    def _drive(self, index: int) -> None:
        """Advance runnable jobs one step at a time; when a whole round got nothing done, rest
        until the scheduler changes (a result, an agent, a cancellation) or half a second passes.
        Driver ``index`` takes part only while more than ``index`` jobs live."""
        idle_round = 0
        while not self._stopping.is_set():
            generation = self.scheduler.generation
            accepted = self.scheduler.results_accepted
            with self._changed:
                while index >= self._live_jobs and not self._stopping.is_set():
                    self._driver_wanted.wait()
                job = self._next_job()
                pending = len(self._runnable) + len(self._stepped) + 1
            if job is None:
                self._rest(generation, accepted)
                continue
            busy = self._advance(job)
            if busy is None:
                with self._changed:
                    self._live_jobs -= 1
                continue  # the job ended
            with self._changed:
                self._stepped.append(job)
                round_over = not self._runnable
            idle_round = 0 if busy else idle_round + 1
            if idle_round >= pending:
                idle_round = 0
                self._rest(generation, accepted)
            elif busy and round_over:
                # a busy round gathers too: stepping again at once would take the few results
                # that came during the step, a log transaction and a proposal each
                self._gather(accepted)

    def _rest(self, generation: int, accepted: int) -> None:
        """Wait for the scheduler's next change (half a second at most), then :meth:`_gather`."""
        if self.scheduler.wait_for_change(generation, 0.5):
            self._gather(accepted)

    def _gather(self, accepted: int) -> None:
        """Wait up to :data:`RESULT_GATHER_MAX_S` until the results a step can use at once have
        arrived, counted from ``accepted`` (the scheduler's count when the last step began)."""
        wanted = self._results_worth_a_step()
        if wanted:
            self.scheduler.wait_for_results(accepted + wanted, RESULT_GATHER_MAX_S)

    def _results_worth_a_step(self) -> int:
        """The fewest results any live job's next step can use at once (0: one needs none)."""
        with self._changed:
            wanted = [job.tuning.results_worth_a_step for job in self._jobs.values()
                      if job.tuning is not None and not job.status.finished]
        return min(wanted, default=0)

    def _next_job(self) -> "_Job | None":
        """The next job to step (lock held): rounds in priority order, and the round's top
        priority stepped again after every :data:`TOP_PRIORITY_EVERY` steps of lower ones, so an
        urgent job's results are not left waiting a whole round of a hundred jobs."""
        if not self._runnable and self._stepped:
            self._stepped.sort(key=lambda j: -j.status.spec.priority)  # stable: turns kept
            self._runnable.extend(self._stepped)
            self._stepped.clear()
            self._round_top = self._runnable[0].status.spec.priority
            self._lower_steps = 0
        if self._lower_steps >= TOP_PRIORITY_EVERY:
            self._lower_steps = 0
            top = [j for j in self._stepped if j.status.spec.priority >= self._round_top]
            if top:
                self._stepped = [j for j in self._stepped if j.status.spec.priority < self._round_top]
                self._runnable.extendleft(reversed(top))
        job = self._runnable.popleft() if self._runnable else None
        if job is not None and job.status.spec.priority < self._round_top:
            self._lower_steps += 1
        return job

    def _advance(self, job: _Job) -> bool | None:
        """One step of the job: whether it got anything done, None once it has ended."""
        try:
            return next(job.steps)
        except StopIteration:
            return None
        except Exception:  # noqa: BLE001 - _steps handles a job's errors; this is a last resort
            logger.exception("job %d stopped unexpectedly", job.status.job_id)
            self._update(job, state="failed", message="the daemon failed running this job (see its log)")
            return None

    def get(self, job_id: int) -> JobStatus:
        return self._get(job_id)[0]

    def _get(self, job_id: int) -> tuple[JobStatus, int | None]:
        """The job's status and its version (None for a job only the log remembers)."""
        with self._changed:
            job = self._jobs.get(job_id)
            if job is not None:
                return self._with_counts(job.status), job.version
        return self._from_log(job_id), None

    def _from_log(self, job_id: int) -> JobStatus:
        """A job of an earlier daemon run, as the log remembers it."""
        try:
            record = self.log.get_job(job_id)
            spec = _spec_of(record).validate()
        except (NotFoundError, JobSpecError, ValueError, TypeError):
            raise NotFound(f"no job {job_id} in this daemon") from None
        key = (record.workload_key, record.device_key, record.target)
        try:  # the answer `tuner best` gives: the fastest config the installed template accepts
            best = exact_best_config(self.log, *key, catalog=self.catalog).record
        except TemplateNotFound:
            best = None
        of_job = self.log.trials(job_id=job_id)
        return replace(
            self._new_status(job_id, spec, record.created_at.timestamp()), state=record.status,
            done=self.log.count_trials(*key), measured_now=len(of_job),
            errors=sum(1 for t in of_job if t.status != "ok"),
            best_mean_s=best.mean_s if best else None, best_config=best.config if best else None,
        )

    def list(self) -> list[JobStatus]:
        with self._changed:
            return [self._with_counts(j.status) for _, j in sorted(self._jobs.items())]

    def cancel(self, job_id: int) -> JobStatus:
        with self._changed:
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(f"no job {job_id} in this daemon")
        job.cancel.set()
        self.scheduler.cancel_job(job_id)
        self._wait_finished([job], 10)
        return self.get(job_id)

    def _wait_finished(self, jobs: list[_Job], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while any(not j.status.finished for j in jobs) and time.monotonic() < deadline:
                self._changed.wait(0.1)

    def watch(self, job_id: int, poll_s: float = 1.0, is_active=lambda: True,
              min_interval_s: float = 0.1) -> Iterator[JobStatus]:
        """Statuses after every change (and every ``poll_s`` for queue counts) until the job ends,
        at most one per ``min_interval_s``: a large fleet reports hundreds of results a second, and
        a watcher needs the latest state, not each step."""
        last = None
        while is_active():
            status, version = self._get(job_id)
            if status != last:
                yield status
                last = status
                if not status.finished:
                    self._wait_unless_finished(job_id, min_interval_s)
            if status.finished:
                return
            with self._changed:
                if self._latest_version(job_id) == version:
                    self._changed.wait(poll_s)

    def shutdown(self) -> None:
        """Interrupt every running job: its results so far are in the log, and it stays ``running``
        there, so the next daemon start resumes it."""
        self._validation.shutdown(wait=False, cancel_futures=True)
        with self._changed:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.interrupt.set()
            self.scheduler.cancel_job(job.status.job_id)
        self._wait_finished(jobs, 10)
        self._stopping.set()
        with self._changed:
            self._driver_wanted.notify_all()
        self.scheduler.nudge()
        for driver in self._drivers:
            driver.join(timeout=10)

    # -- internals --------------------------------------------------------------------------
    def _with_counts(self, status: JobStatus) -> JobStatus:
        queued, leased = self.scheduler.job_counts(status.job_id)
        state = status.state
        message = status.message
        if state == "running" and not self.scheduler.job_started(status.job_id):
            state = "queued"  # nothing has reached an agent yet
            key, target = status.spec.device_key, status.spec.target_spec
            if target.has_requirements and self.scheduler.agent_count(key) and not self.scheduler.agent_count(
                    key, target.matches):
                message = (f"no registered agent of key {key} matches target {target.text!r}; "
                           "it waits for one that does")
        return replace(status, queued_candidates=queued, leased_candidates=leased, state=state, message=message)

    def _wait_unless_finished(self, job_id: int, seconds: float) -> None:
        """Sleep ``seconds``, but wake as soon as the job ends (its final state is news at once)."""
        deadline = time.monotonic() + seconds
        with self._changed:
            while True:
                job = self._jobs.get(job_id)
                remaining = deadline - time.monotonic()
                if job is None or job.status.finished or remaining <= 0:
                    return
                self._changed.wait(remaining)

    def _latest_version(self, job_id: int) -> int | None:
        job = self._jobs.get(job_id)
        return job.version if job is not None else None

    def _update(self, job: _Job, **changes) -> None:
        with self._changed:
            job.status = replace(job.status, **changes)
            job.version += 1
            if job.status.finished:
                self._forget_old_finished(job.status.job_id)
            self._changed.notify_all()

    def _finish_in_log(self, job_id: int, status: str) -> None:
        """Record how a job ended; when the log is away that cannot wait: clients are told the
        state at once, and a job the log still holds as running resumes at the next start."""
        try:
            self.log.finish_job(job_id, status)
        except TuningLogError as exc:
            logger.warning("job %d %s, but the tuning log could not record it: %s", job_id, status, exc)

    def _forget_old_finished(self, job_id: int) -> None:
        """Keep the last FINISHED_JOBS_KEPT finished jobs in memory (with their final message);
        older ones are served from the log, so memory does not grow with every job ever run."""
        self._finished.append(job_id)
        while len(self._finished) > FINISHED_JOBS_KEPT:
            self._jobs.pop(self._finished.popleft(), None)

    def _steps(self, job: _Job) -> Iterator[bool]:
        try:
            yield from self._tune(job)
        finally:
            # However the job ended, nothing of it stays queued or leased for the agents.
            self.scheduler.cancel_job(job.status.job_id)

    def _tune(self, job: _Job) -> Iterator[bool]:
        spec, job_id = job.status.spec, job.status.job_id
        target = spec.target_spec
        measurer = FleetMeasurer(self.scheduler, spec.device_key, job_id, spec.priority, spec.timing,
                                 self.catalog.version, job.cancel, spec.wait_timeout_s, interrupt=job.interrupt,
                                 requirement=target.matches if target.has_requirements else None,
                                 shares_cpu_with_tuner=self.agents_share_host)
        flops = job.status.flops

        def on_progress(progress: Progress) -> None:
            best = flops / (progress.best_gflops * 1e9) if progress.best_gflops else None
            self._update(job, done=progress.done, measured_now=progress.measured_now, errors=progress.errors,
                         best_mean_s=best)

        try:
            try:
                # The space depends on the device (vector width, GPU limits): propose nothing
                # before an agent that can measure the job has said what it is.
                while not measurer.device_ready():
                    yield False
            except MeasurementAborted as exc:
                if exc.job_status is not None:  # cancelled or timed out, not a stopping daemon
                    self._finish_in_log(job_id, exc.job_status)
                raise
            tuning = TuningJob(spec.parsed_workload, measurer, self.log, self.catalog, TuneOptions.from_spec(spec),
                               on_progress=on_progress, job_id=job_id,
                               on_note=lambda note: self._update(job, message=note))
            job.tuning = tuning
            summary = yield from tuning.steps(wait_s=0.0)
        except MeasurementAborted as exc:
            self._update(job, state=exc.job_status or "interrupted", message=str(exc))
            return
        except SteeringError as exc:  # pins or constraints that no config of the agents' device fits
            # the log first, then the clients: one told that the job failed finds it failed in the log
            self._finish_in_log(job_id, "failed")
            self._update(job, state="failed", message=f"{exc} (on the device of key {spec.device_key!r})")
            return
        except Exception as exc:  # noqa: BLE001 - a job's failure must not take the daemon down
            self._finish_in_log(job_id, "failed")
            self._update(job, state="failed", message=f"{type(exc).__name__}: {exc}")
            return
        self._update(
            job,
            state="done",
            done=summary.total_in_log,
            measured_now=summary.measured_now,
            errors=summary.errors,
            best_mean_s=summary.best.mean_s if summary.best else None,
            best_config=summary.best.config if summary.best else None,
            default_mean_s=summary.default.mean_s if summary.default else None,
            default_status=summary.default.status if summary.default else "",
            stopped_early=summary.stopped_early,
            message=summary.note if summary.best else "no config ran successfully",
        )
