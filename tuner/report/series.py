"""The data of a job's convergence chart, one piece of code for ``tuner report`` and the dashboard.

Both draw it with the same script (``tuner/dashboard/static/convergence.js`` on uPlot): the report
embeds it inline, the dashboard serves it. :func:`convergence_series` is plain JSON, in columns,
as uPlot takes it.
"""

from __future__ import annotations

from typing import Any

from tuner.report.data import ReportData


def convergence_series(data: ReportData) -> dict[str, Any]:
    """Columns over the job's trials in order (trial ``i`` at index ``i - 1``).

    ``trial``: trial numbers; ``seconds``: seconds from the job's creation to the trial's record;
    ``gflops``: each trial's GFLOPS (``None`` for a failed one); ``best``: best GFLOPS so far;
    ``failed``: 0 where the trial failed (drawn on the axis), else ``None``; ``status``: each
    trial's status. ``earlier_best`` is the best GFLOPS of the history the job resumed from, and
    ``best_trial`` the number of the job's fastest trial (``None`` without an ok one).
    """
    start = data.job.created_at
    gflops = data.trial_gflops
    return {
        "title": f"job {data.job.id}: {data.workload.key} on {data.job.device_key}",
        "trial": list(range(1, len(data.trials) + 1)),
        "seconds": [round(max(0.0, (t.created_at - start).total_seconds()), 3) for t in data.trials],
        "gflops": [_round(v) for v in gflops],
        "best": [_round(v) for v in data.best_so_far],
        "failed": [0 if v is None else None for v in gflops],
        "status": [t.status for t in data.trials],
        "earlier_best": _round(data.gflops(data.earlier_best_s)),
        "earlier_trials": data.earlier_trials,
        "best_trial": data.best_trial_number,
    }


def _round(value: float | None) -> float | None:
    """Six significant digits: enough for any chart or table, at any scale of GFLOPS."""
    return None if value is None else float(f"{value:.6g}")
