"""The tuning log: measured results of every trial, in SQLite or PostgreSQL, and its JSON lines form."""

from tuner.log.jsonl import ImportSummary, LogFormatError, export_trials, import_trials
from tuner.log.records import (
    LOG_FORMAT,
    LOG_VERSION,
    TRIAL_STATUSES,
    JobRecord,
    RecordError,
    TrialRecord,
)
from tuner.log.schema import FINAL_JOB_STATUSES, JOB_STATUSES
from tuner.log.storage import NotFoundError, TuningLog, TuningLogError

__all__ = [
    "FINAL_JOB_STATUSES",
    "ImportSummary",
    "JOB_STATUSES",
    "JobRecord",
    "LOG_FORMAT",
    "LOG_VERSION",
    "LogFormatError",
    "NotFoundError",
    "RecordError",
    "TRIAL_STATUSES",
    "TrialRecord",
    "TuningLog",
    "TuningLogError",
    "export_trials",
    "import_trials",
]
