"""Tuning jobs in the daemon: validated on submission, each run by a :class:`TuningJob` in a thread."""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence

from measure_agent.engine import TimingConfig
from measure_agent.protocol.errors import InvalidRequest, NotFound
from measure_agent.templates import TemplateCatalog, TemplateNotFound
from measure_agent.workload import Workload, WorkloadError, parse_workload
from tuner.daemon.fleet_measurer import FleetMeasurer
from tuner.daemon.scheduler import Scheduler
from tuner.job import Progress, TuneOptions, TuningJob
from tuner.log import JobRecord, NotFoundError, TuningLog
from tuner.measure import MeasurementAborted
from tuner.search import STRATEGIES
from tuner.steering import SteeringError, TargetSpec, parse_pin, parse_target, steer_space

DEVICE_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")
MAX_TRIALS = 1_000_000
FINAL_STATES = ("done", "failed", "cancelled", "interrupted")
logger = logging.getLogger("tunefleet.daemon")


@dataclass(frozen=True)
class JobRequest:
    workload: Workload
    device_key: str
    target: str = "cpu"
    strategy: str = "xgb"
    trials: int = 64
    seed: int = 0
    early_stopping: int | None = None
    priority: int = 0
    timing: TimingConfig = TimingConfig()
    wait_timeout_s: float = 0.0
    pins: tuple[tuple[str, str], ...] = ()
    constraints: tuple[str, ...] = ()
    transfer: bool = True  # start from the log's records of other workloads and devices
    time_budget_s: float | None = None  # wall time of one run of the job (restarts when it resumes)

    @property
    def target_spec(self) -> TargetSpec:
        return parse_target(self.target)


def validate_request(workload: str, device_key: str, target: str, strategy: str, trials: int, seed: int,
                     early_stopping: int, priority: int, timing: TimingConfig | None, wait_timeout_s: float,
                     catalog: TemplateCatalog, pins: Sequence[str] = (), constraints: Sequence[str] = (),
                     transfer: bool = True, time_budget_s: float = 0.0) -> JobRequest:
    """A :class:`JobRequest` from raw fields; raises :class:`InvalidRequest` naming the problem."""
    try:
        parsed = parse_workload(workload)
        spec = parse_target(target or "cpu")
        catalog.get(parsed.op, spec.family)
        pairs = tuple(parse_pin(p) for p in pins)
        # pins and constraints are checked against the space now, so a bad one fails the submission
        steer_space(catalog.space(parsed, spec.family), pairs, tuple(constraints))
    except (WorkloadError, TemplateNotFound, SteeringError) as exc:
        raise InvalidRequest(str(exc)) from None
    if not DEVICE_KEY_RE.match(device_key or ""):
        raise InvalidRequest(f"invalid device key {device_key!r}: letters, digits and ._:+- only, at most 128")
    if strategy not in STRATEGIES:
        raise InvalidRequest(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if not 1 <= trials <= MAX_TRIALS:
        raise InvalidRequest(f"trials must be between 1 and {MAX_TRIALS}")
    if early_stopping < 0 or wait_timeout_s < 0 or time_budget_s < 0:
        raise InvalidRequest("early stopping, wait timeout and time budget must not be negative")
    if not -1000 <= priority <= 1000:
        raise InvalidRequest("priority must be between -1000 and 1000")
    return JobRequest(parsed, device_key, spec.text, strategy, trials, seed, early_stopping or None,
                      priority, timing or TimingConfig(), wait_timeout_s, pairs, tuple(constraints),
                      transfer=transfer, time_budget_s=time_budget_s or None)


@dataclass(frozen=True)
class JobSnapshot:
    """A job's state at one moment (what clients see)."""

    job_id: int
    state: str
    request: JobRequest
    created_at: float
    done: int = 0
    measured_now: int = 0
    errors: int = 0
    best_mean_s: float | None = None
    best_config: dict | None = None
    default_mean_s: float | None = None
    default_status: str = ""
    stopped_early: bool = False
    queued: int = 0
    leased: int = 0
    message: str = ""
    version: int = 0

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


@dataclass
class _Job:
    snapshot: JobSnapshot
    cancel: threading.Event = field(default_factory=threading.Event)  # by a user: the job ends
    interrupt: threading.Event = field(default_factory=threading.Event)  # daemon stopping: resumes later
    thread: threading.Thread | None = None


def _options_of(request: JobRequest, template_version: str) -> dict:
    """Everything needed to resume the job after a restart, stored with it in the log."""
    t = request.timing
    return {
        "fleet": True, "seed": request.seed, "early_stopping": request.early_stopping,
        "priority": request.priority, "wait_timeout_s": request.wait_timeout_s,
        "template_version": template_version, "target": request.target,
        "pins": [f"{k}={v}" for k, v in request.pins], "constraints": list(request.constraints),
        "transfer": request.transfer, "time_budget_s": request.time_budget_s,
        "timing": {"number": t.number, "repeat": t.repeat, "min_repeat_ms": t.min_repeat_ms, "warmup": t.warmup,
                   "build_timeout_s": t.build_timeout_s, "run_timeout_s": t.run_timeout_s},
    }


def _request_of(record: JobRecord) -> JobRequest:
    options = record.options
    return JobRequest(
        workload=parse_workload(record.workload_key), device_key=record.device_key,
        target=options.get("target", record.target),
        pins=tuple(parse_pin(p) for p in options.get("pins", ())), constraints=tuple(options.get("constraints", ())),
        strategy=record.strategy, trials=record.trials, seed=int(options.get("seed", 0)),
        early_stopping=options.get("early_stopping"), priority=int(options.get("priority", 0)),
        timing=TimingConfig(**options["timing"]) if "timing" in options else TimingConfig(),
        wait_timeout_s=float(options.get("wait_timeout_s", 0.0)),
        transfer=bool(options.get("transfer", True)), time_budget_s=options.get("time_budget_s"),
    )


class JobManager:
    """Owns the running jobs. Results go to ``log`` as they arrive; the log is the source of truth."""

    def __init__(self, scheduler: Scheduler, log: TuningLog, catalog: TemplateCatalog) -> None:
        self.scheduler = scheduler
        self.log = log
        self.catalog = catalog
        self._jobs: dict[int, _Job] = {}
        self._changed = threading.Condition()

    def submit(self, request: JobRequest) -> JobSnapshot:
        job_id = self.log.create_job(request.workload.key, request.device_key, request.target_spec.family,
                                     request.strategy, request.trials, _options_of(request, self.catalog.version))
        self._start(JobSnapshot(job_id=job_id, state="running", request=request, created_at=time.time()))
        return self.get(job_id)

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
                request = _request_of(record)
            except (WorkloadError, ValueError, KeyError, TypeError) as exc:
                self.log.finish_job(record.id, "failed")
                logger.warning("job %d not resumed: %s", record.id, exc)
                continue
            self._start(JobSnapshot(job_id=record.id, state="running", request=request,
                                    created_at=record.created_at.timestamp()))
            resumed.append(record.id)
        if resumed:
            logger.info("resumed jobs %s from the log", ", ".join(map(str, resumed)))
        return resumed

    def _start(self, snapshot: JobSnapshot) -> None:
        job = _Job(snapshot)
        with self._changed:
            self._jobs[snapshot.job_id] = job
        job.thread = threading.Thread(target=self._run, args=(job,), name=f"tunefleet-job-{snapshot.job_id}",
                                      daemon=True)
        job.thread.start()

    def get(self, job_id: int) -> JobSnapshot:
        with self._changed:
            job = self._jobs.get(job_id)
            if job is not None:
                return self._with_counts(job.snapshot)
        return self._from_log(job_id)

    def _from_log(self, job_id: int) -> JobSnapshot:
        """A job of an earlier daemon run, as the log remembers it."""
        try:
            record = self.log.get_job(job_id)
            request = _request_of(record)
        except (NotFoundError, WorkloadError, ValueError, KeyError, TypeError):
            raise NotFound(f"no job {job_id} in this daemon") from None
        key = (record.workload_key, record.device_key, record.target)
        best = self.log.best(*key, top=1)
        of_job = self.log.trials(job_id=job_id)
        return JobSnapshot(
            job_id=job_id, state=record.status, request=request, created_at=record.created_at.timestamp(),
            done=self.log.count_trials(*key), measured_now=len(of_job),
            errors=sum(1 for t in of_job if t.status != "ok"),
            best_mean_s=best[0].mean_s if best else None, best_config=best[0].config if best else None,
        )

    def list(self) -> list[JobSnapshot]:
        with self._changed:
            return [self._with_counts(j.snapshot) for _, j in sorted(self._jobs.items())]

    def cancel(self, job_id: int) -> JobSnapshot:
        with self._changed:
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(f"no job {job_id} in this daemon")
        job.cancel.set()
        self.scheduler.cancel_job(job_id)
        if job.thread is not None:
            job.thread.join(timeout=10)
        return self.get(job_id)

    def watch(self, job_id: int, poll_s: float = 1.0, is_active=lambda: True,
              min_interval_s: float = 0.1) -> Iterator[JobSnapshot]:
        """Snapshots after every change (and every ``poll_s`` for queue counts) until the job ends,
        at most one per ``min_interval_s``: a large fleet reports hundreds of results a second, and
        a watcher needs the latest state, not each step."""
        last = None
        while is_active():
            snapshot = self.get(job_id)
            if snapshot != last:
                yield snapshot
                last = snapshot
                if not snapshot.finished:
                    self._wait_unless_finished(job_id, min_interval_s)
            if snapshot.finished:
                return
            with self._changed:
                if self._latest_version(job_id) == snapshot.version:
                    self._changed.wait(poll_s)

    def shutdown(self) -> None:
        """Interrupt every running job: its results so far are in the log, and it stays ``running``
        there, so the next daemon start resumes it."""
        with self._changed:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.interrupt.set()
            self.scheduler.cancel_job(job.snapshot.job_id)
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout=10)

    # -- internals --------------------------------------------------------------------------
    def _with_counts(self, snapshot: JobSnapshot) -> JobSnapshot:
        queued, leased = self.scheduler.job_counts(snapshot.job_id)
        state = snapshot.state
        message = snapshot.message
        if state == "running" and not self.scheduler.job_started(snapshot.job_id):
            state = "queued"  # nothing has reached an agent yet
            key, target = snapshot.request.device_key, snapshot.request.target_spec
            if target.has_requirements and self.scheduler.agent_count(key) and not self.scheduler.agent_count(
                    key, target.matches):
                message = (f"no registered agent of key {key} matches target {target.text!r}; "
                           "it waits for one that does")
        return replace(snapshot, queued=queued, leased=leased, state=state, message=message)

    def _wait_unless_finished(self, job_id: int, seconds: float) -> None:
        """Sleep ``seconds``, but wake as soon as the job ends (its final state is news at once)."""
        deadline = time.monotonic() + seconds
        with self._changed:
            while True:
                job = self._jobs.get(job_id)
                remaining = deadline - time.monotonic()
                if job is None or job.snapshot.finished or remaining <= 0:
                    return
                self._changed.wait(remaining)

    def _latest_version(self, job_id: int) -> int | None:
        job = self._jobs.get(job_id)
        return job.snapshot.version if job is not None else None

    def _update(self, job: _Job, **changes) -> None:
        with self._changed:
            job.snapshot = replace(job.snapshot, version=job.snapshot.version + 1, **changes)
            self._changed.notify_all()

    def _run(self, job: _Job) -> None:
        request = job.snapshot.request
        target = request.target_spec
        measurer = FleetMeasurer(self.scheduler, request.device_key, job.snapshot.job_id, request.priority,
                                 request.timing, self.catalog.version, job.cancel, request.wait_timeout_s,
                                 interrupt=job.interrupt,
                                 requirement=target.matches if target.has_requirements else None)
        flops = request.workload.flops

        def on_progress(progress: Progress) -> None:
            best = flops / (progress.best_gflops * 1e9) if progress.best_gflops else None
            self._update(job, done=progress.done, measured_now=progress.measured_now, errors=progress.errors,
                         best_mean_s=best)

        options = TuneOptions(trials=request.trials, strategy=request.strategy, seed=request.seed,
                              early_stopping=request.early_stopping, target=target.family,
                              pins=request.pins, constraints=request.constraints,
                              transfer=request.transfer, time_budget_s=request.time_budget_s)
        try:
            try:
                # The space depends on the device (vector width, GPU limits): propose nothing
                # before an agent that can measure the job has said what it is.
                measurer.wait_for_device()
            except MeasurementAborted as exc:
                if exc.job_status is not None:  # cancelled or timed out, not a stopping daemon
                    self.log.finish_job(job.snapshot.job_id, exc.job_status)
                raise
            tuning = TuningJob(request.workload, measurer, self.log, self.catalog, options,
                               on_progress=on_progress, job_id=job.snapshot.job_id)
            summary = tuning.run()
        except MeasurementAborted as exc:
            self._update(job, state=exc.job_status or "interrupted", message=str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a job's failure must not take the daemon down
            self.log.finish_job(job.snapshot.job_id, "failed")
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
            message="" if summary.best else "no config ran successfully",
        )
