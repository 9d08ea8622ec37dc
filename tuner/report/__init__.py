"""HTML reports of tuning jobs: ``tuner report JOB -o report.html``.

* ``data``: :func:`collect` reads a job, its trials and the history it resumed from into
  :class:`ReportData` (GFLOPS, best so far, top configs, trials per status).
* ``plot``: :func:`convergence_png`, the convergence plot as PNG bytes. matplotlib (the ``plot``
  extra) is imported only there and only when called; without it :class:`PlotUnavailable` says how
  to install it. The rest of the tuner never needs it.
* ``series``: :func:`convergence_series`, the chart's data in columns: the one source of the PNG,
  the page's interactive chart and the dashboard's (which draw it with the same script).
* ``html``: :func:`render_html`, one self-contained page (inline CSS and scripts: uPlot and the
  dashboard's ``convergence.js``; the PNG inside ``<noscript>``).
"""

from tuner.report.data import ReportData, StatusCount, collect
from tuner.report.html import render_html
from tuner.report.plot import PLOT_INSTALL_HINT, PlotUnavailable, convergence_png
from tuner.report.series import convergence_series

__all__ = [
    "PLOT_INSTALL_HINT",
    "PlotUnavailable",
    "ReportData",
    "StatusCount",
    "collect",
    "convergence_png",
    "convergence_series",
    "render_html",
]
