"""The tuning log: measured results of every trial, in SQLite or PostgreSQL, and its file forms.

* :class:`TuningLog` (``storage``): the database; its schema is versioned by Alembic migrations
  (``migrate``, ``migrations/``).
* ``jsonl``: every trial as JSON lines (export, import, merging logs from several sites).
* ``bestfile``: the best configs only, as one small versioned JSON file for applications.
* ``best_config``: the best config of a workload on a device (exact, else a tuned family's or the
  nearest tuned shape's, validated against the installed template): the one resolver behind
  ``tuner best``, ``tuner show-kernel --best``, ``tuner report`` and ``tuner.best_kernel``.
"""

from tuner.log.bestfile import (
    BEST_FORMAT,
    BEST_VERSION,
    BestConfigs,
    BestFileError,
    export_best,
    load_best_file,
)
from tuner.log.best_config import (
    BestConfig,
    BestMatch,
    BestSource,
    RejectedConfig,
    exact_best_config,
    find_best,
    keys_of_device,
    resolve_best_config,
    workload_distance,
)
from tuner.log.jsonl import (
    DEVICE_INFO_POLICIES,
    DeviceConflict,
    DeviceInfoConflict,
    ImportSummary,
    LogFormatError,
    export_trials,
    import_sources,
    import_trials,
)
from tuner.log.records import (
    LOG_FORMAT,
    LOG_VERSION,
    TRIAL_STATUSES,
    JobRecord,
    RecordError,
    TrialRecord,
)
from tuner.log.schema import FINAL_JOB_STATUSES, JOB_STATUSES
from tuner.log.database import LogUnavailable
from tuner.log.storage import NotFoundError, PruneSummary, TuningLog, TuningLogError, is_device_pattern

__all__ = [
    "BEST_FORMAT",
    "BEST_VERSION",
    "BestConfig",
    "BestConfigs",
    "BestFileError",
    "BestMatch",
    "BestSource",
    "DEVICE_INFO_POLICIES",
    "DeviceConflict",
    "DeviceInfoConflict",
    "FINAL_JOB_STATUSES",
    "ImportSummary",
    "JOB_STATUSES",
    "JobRecord",
    "LOG_FORMAT",
    "LOG_VERSION",
    "LogFormatError",
    "NotFoundError",
    "PruneSummary",
    "RecordError",
    "RejectedConfig",
    "TRIAL_STATUSES",
    "TrialRecord",
    "TuningLog",
    "TuningLogError",
    "LogUnavailable",
    "exact_best_config",
    "keys_of_device",
    "export_best",
    "export_trials",
    "find_best",
    "import_sources",
    "import_trials",
    "is_device_pattern",
    "load_best_file",
    "resolve_best_config",
    "workload_distance",
]
