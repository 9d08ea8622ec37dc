"""HTML reports of tuning jobs: ``tuner report JOB -o report.html``.

* ``data``: :func:`collect` reads a job, its trials and the history it resumed from into
  :class:`ReportData` (GFLOPS, best so far, top configs, trials per status).
* ``plot``: :func:`convergence_png`, the convergence plot as PNG bytes. matplotlib (the ``plot``
  extra) is imported only there and only when called; without it :class:`PlotUnavailable` says how
  to install it. The rest of the tuner never needs it.
* ``html``: :func:`render_html`, one self-contained page (inline CSS, the plot as a base64 PNG).
"""

from tuner.report.data import ReportData, StatusCount, collect
from tuner.report.html import render_html
from tuner.report.plot import PLOT_INSTALL_HINT, PlotUnavailable, convergence_png

__all__ = [
    "PLOT_INSTALL_HINT",
    "PlotUnavailable",
    "ReportData",
    "StatusCount",
    "collect",
    "convergence_png",
    "render_html",
]
