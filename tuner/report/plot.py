"""The convergence plot of a job, as PNG bytes (matplotlib, Agg backend, imported only when called)."""

from __future__ import annotations

import io

from tuner.report.data import ReportData
from tuner.report.series import convergence_series

PLOT_INSTALL_HINT = "pip install 'tunefleet[plot]'"

BEST_COLOR = "#d9480f"
TRIAL_COLOR = "#1c7ed6"
FAILED_COLOR = "#868e96"
HISTORY_COLOR = "#495057"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (one-line message naming the install command)."""


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise PlotUnavailable(f"plots need matplotlib, which is not installed: {PLOT_INSTALL_HINT}") from None
    return Figure, FigureCanvasAgg, MaxNLocator


def convergence_png(data: ReportData, *, width_in: float = 9.0, height_in: float = 4.4, dpi: int = 144) -> bytes:
    """Best GFLOPS so far against trial number, each trial's GFLOPS as faint points, failures as ticks.

    A figure of its own on the Agg canvas (no pyplot, no global state), so it is safe in threads.
    """
    Figure, FigureCanvasAgg, MaxNLocator = _matplotlib()
    fig = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    job = data.job
    ax.set_title(f"job {job.id}: {data.workload.key} on {job.device_key}", fontsize=10.5, loc="left")
    ax.set_xlabel("trial number (this job)")
    ax.set_ylabel("GFLOPS")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(True, alpha=0.25, linewidth=0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    # The same columns the interactive chart of the page and the dashboard draws (report/series.py).
    series = convergence_series(data)
    n = len(series["trial"])
    ok = [(i, v) for i, v in zip(series["trial"], series["gflops"]) if v is not None]
    failed = [i for i, f in zip(series["trial"], series["failed"]) if f is not None]
    earlier_best = series["earlier_best"]

    if not n:
        ax.text(0.5, 0.5, "no trials recorded for this job", transform=ax.transAxes, ha="center", va="center",
                color=FAILED_COLOR, fontsize=12)
        ax.set_xticks([])
        ax.set_yticks([])
    if ok:
        ax.scatter([i for i, _ in ok], [v for _, v in ok], s=14, color=TRIAL_COLOR, alpha=0.35, linewidths=0,
                   label=f"trial ({len(ok)} ok)", zorder=2)
        best = series["best"]
        xs = [i for i, b in zip(series["trial"], best) if b is not None]
        ys = [b for b in best if b is not None]
        xs.append(n)
        ys.append(ys[-1])
        ax.step(xs, ys, where="post", color=BEST_COLOR, linewidth=2, label="best so far", zorder=3)
        top_x = series["best_trial"]
        top_y = series["gflops"][top_x - 1]
        ax.scatter([top_x], [top_y], s=40, color=BEST_COLOR, zorder=4)
        ax.annotate(f"{top_y:.2f} GFLOPS (trial {top_x})", (top_x, top_y), xytext=(6, 6),
                    textcoords="offset points", fontsize=9, color=BEST_COLOR,
                    ha="right" if top_x > 0.75 * n else "left")
        default = data.default_trial
        if default is not None and default.is_ok:
            ax.scatter([data.trial_number(default)], [data.gflops(default.mean_s)], s=46, facecolors="none",
                       edgecolors="black", linewidths=1.2, label="default config", zorder=5)
    if failed:
        ax.scatter(failed, [0] * len(failed), marker="|", s=60, color=FAILED_COLOR, alpha=0.7,
                   label=f"failed ({len(failed)})", zorder=2, clip_on=False)
    if earlier_best is not None:
        ax.axhline(earlier_best, color=HISTORY_COLOR, linestyle="--", linewidth=1,
                   label=f"best of {data.earlier_trials} earlier trials ({earlier_best:.2f})", zorder=1)
    if n:
        ax.set_xlim(0.5 if n > 1 else 0, n + 0.5 if n > 1 else 2)
        ymax = max([v for _, v in ok] + ([earlier_best] if earlier_best else []), default=1.0)
        ax.set_ylim(0, ymax * 1.12)
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8.5, frameon=False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return buffer.getvalue()
