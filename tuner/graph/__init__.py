"""Model-level tuning: an ONNX graph's tunable tasks and the scheduler that shares a budget among them.

``onnx`` is optional (``pip install 'tunefleet[model]'``): it is imported only when a model is read,
and its absence is a one-line :class:`ModelError`.
"""

from tuner.graph.scheduler import (
    FleetTaskTuner,
    RoundReport,
    ScheduleResult,
    TaskScheduler,
    TaskState,
    TuneOutcome,
)
from tuner.graph.tasks import (
    INSTALL_HINT,
    ModelError,
    ModelTasks,
    Skipped,
    Task,
    extract_tasks,
    import_onnx,
    load_model,
    tasks_from_model,
)

__all__ = [
    "INSTALL_HINT",
    "FleetTaskTuner",
    "ModelError",
    "ModelTasks",
    "RoundReport",
    "ScheduleResult",
    "Skipped",
    "Task",
    "TaskScheduler",
    "TaskState",
    "TuneOutcome",
    "extract_tasks",
    "import_onnx",
    "load_model",
    "tasks_from_model",
]
