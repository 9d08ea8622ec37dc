"""What a job report shows, gathered from the tuning log (no plotting, no HTML here)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from measure_agent.workload import Workload, parse_workload
from tuner.log import BestConfig, JobRecord, TrialRecord, TuningLog


@dataclass(frozen=True)
class StatusCount:
    """How many trials of the job ended with ``status``, and one of their messages."""

    status: str
    count: int
    sample_message: str


@dataclass(frozen=True)
class ReportData:
    """A job and its trials, with the numbers the report page and the plot are made of.

    ``trials`` are the job's trials, oldest first (trial number ``i`` is ``trials[i - 1]``).
    ``earlier_trials`` counts the trials of the same workload, device key and target recorded before
    the job was created (the history it resumed from), ``earlier_best_s`` is the best of them.
    ``best_config`` is what ``tuner best`` and ``tuner.best_kernel`` serve for exactly the job's
    workload, device and target now (``None`` without the template): the job's best, an earlier
    trial's, or none with the reason (say, the template rejects the configs).
    """

    job: JobRecord
    workload: Workload
    device_info: dict
    trials: list[TrialRecord]
    earlier_trials: int = 0
    earlier_best_s: float | None = None
    default_config: dict | None = None
    best_config: BestConfig | None = None
    generated_at: datetime | None = None

    # -- per-trial numbers ---------------------------------------------------------------
    def gflops(self, seconds: float | None) -> float | None:
        return self.workload.flops / seconds / 1e9 if seconds else None

    @property
    def trial_gflops(self) -> list[float | None]:
        """GFLOPS of each trial in order (``None`` for a failed one)."""
        return [self.gflops(t.mean_s) for t in self.trials]

    @property
    def best_so_far(self) -> list[float | None]:
        """Best GFLOPS among trials ``1..i`` of this job, for each ``i`` (``None`` before the first ok one)."""
        best: float | None = None
        out = []
        for value in self.trial_gflops:
            if value is not None and (best is None or value > best):
                best = value
            out.append(best)
        return out

    @property
    def ok_trials(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.is_ok]

    @property
    def best(self) -> TrialRecord | None:
        top = self.top(1)
        return top[0] if top else None

    @property
    def best_trial_number(self) -> int | None:
        best = self.best
        return next(i for i, t in enumerate(self.trials, 1) if t is best) if best else None

    def top(self, n: int = 10) -> list[TrialRecord]:
        """The ``n`` fastest ok trials of the job, fastest first (ties: the earlier trial first)."""
        ranked = sorted(enumerate(self.ok_trials), key=lambda it: (it[1].mean_s, it[0]))
        return [t for _, t in ranked[:n]]

    def trial_number(self, record: TrialRecord) -> int:
        return next(i for i, t in enumerate(self.trials, 1) if t is record)

    @property
    def best_config_trial_number(self) -> int | None:
        """The trial number of :attr:`best_config` in this job (``None``: not a trial of this job)."""
        record = self.best_config.record if self.best_config else None
        return next((i for i, t in enumerate(self.trials, 1) if t == record), None)

    def is_default(self, record: TrialRecord) -> bool:
        return self.default_config is not None and record.config == self.default_config

    @property
    def default_trial(self) -> TrialRecord | None:
        return next((t for t in self.trials if self.is_default(t)), None)

    # -- errors ----------------------------------------------------------------------------
    @property
    def status_counts(self) -> list[StatusCount]:
        """Trials per status, most frequent first (``ok`` included), each with a sample message."""
        counts: dict[str, int] = {}
        samples: dict[str, str] = {}
        for t in self.trials:
            counts[t.status] = counts.get(t.status, 0) + 1
            if t.message.strip() and t.status not in samples:
                samples[t.status] = t.message.strip()
        order = sorted(counts, key=lambda s: (-counts[s], s))
        return [StatusCount(s, counts[s], samples.get(s, "")) for s in order]

    @property
    def error_count(self) -> int:
        return sum(1 for t in self.trials if not t.is_ok)

    # -- times -----------------------------------------------------------------------------
    @property
    def duration(self) -> timedelta | None:
        """From the job's creation to its end (or to its last trial while it runs)."""
        end = self.job.finished_at or (self.trials[-1].created_at if self.trials else None)
        return end - self.job.created_at if end else None


def collect(log: TuningLog, job_id: int, *, default_config: bool = True) -> ReportData:
    """Read job ``job_id`` and its trials; raises :class:`tuner.log.NotFoundError` for an unknown job."""
    from tuner.log.records import utcnow

    job = log.get_job(job_id)
    workload = parse_workload(job.workload_key)
    info = log.recorded_device_info(job.device_key) or {}
    trials = log.trials(job_id=job_id)
    history = [t for t in log.trials(workload_key=job.workload_key, device_key=job.device_key, target=job.target,
                                     created_before=job.created_at) if t.job_id != job_id]
    earlier_best = min((t.mean_s for t in history if t.mean_s), default=None)
    return ReportData(
        job=job,
        workload=workload,
        device_info=info,
        trials=trials,
        earlier_trials=len(history),
        earlier_best_s=earlier_best,
        default_config=_default_config(workload, job.target, info) if default_config else None,
        best_config=_best_config(log, workload, job),
        generated_at=utcnow(),
    )


def _best_config(log: TuningLog, workload: Workload, job: JobRecord) -> BestConfig | None:
    """What the log serves for the job's workload, device and target (the daemon's exact lookup)."""
    from measure_agent.templates import TemplateNotFound
    from tuner.log import exact_best_config

    try:
        return exact_best_config(log, workload, job.device_key, job.target)
    except TemplateNotFound:  # a report of a job whose template is not installed here
        return None


def _default_config(workload: Workload, target: str, device_info: dict) -> dict | None:
    """The template's default config for the job (what a job measures first), if the template is installed."""
    try:
        from measure_agent.device import DeviceInfo
        from measure_agent.templates import default_catalog

        catalog = default_catalog()
        template = catalog.get(workload.op, target)
        device = DeviceInfo.from_recorded(device_info)
        space = catalog.space(workload, target, device)
        return json.loads(json.dumps(template.default_config(workload, space).to_json()))
    except Exception:  # noqa: BLE001 - only a marker on the page; a report must not fail for it
        return None
