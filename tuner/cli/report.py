"""``tuner report``: a tuning job as a self-contained HTML page (and its convergence plot as a PNG)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner.cli.common import EXIT_FAILURE, CliError, add_db_arguments, cannot_write, positive_int

DESCRIPTION = (
    "Write a self-contained HTML page about a tuning job of the log: summary (workload, device and its info, "
    "strategy, trials, status, times, the earlier trials it resumed from), the convergence plot (best GFLOPS so "
    "far against trial number, each trial as a faint point), the top configs and the trials per status with a "
    "sample error message. The page has no external assets (inline CSS; the dashboard's interactive chart inline, "
    "with the plot as a base64 PNG where scripts do not run), so it can be mailed or attached to a ticket. Needs "
    "matplotlib: pip install 'tunefleet[plot]'."
)


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write an HTML report of a tuning job (plot, top configs, errors)",
                              description=DESCRIPTION)
    p.add_argument("job", type=positive_int, metavar="JOB", help="job id (as printed by tune/submit, or 'tuner jobs')")
    p.add_argument("-o", "--output", metavar="FILE.html", help="write the HTML page here ('-': standard output)")
    p.add_argument("--png", metavar="FILE.png", help="write the convergence plot alone as a PNG image")
    p.add_argument("--top", type=positive_int, default=10, help="configs in the top table (default 10)")
    add_db_arguments(p, device=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.cli.common import open_log
    from tuner.log import NotFoundError
    from tuner.report import PlotUnavailable, collect, convergence_png, render_html

    if not args.output and not args.png:
        raise CliError("give -o FILE.html for the page and/or --png FILE.png for the plot alone")
    with open_log(args.db, existing=True) as log:
        try:
            data = collect(log, args.job)
        except NotFoundError as exc:
            raise CliError(str(exc), EXIT_FAILURE) from None
    try:
        png = convergence_png(data)
    except PlotUnavailable as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    if args.png:
        _write(args.png, png)
    if args.output == "-":
        sys.stdout.write(render_html(data, png, top_n=args.top))
        return 0
    if args.output:
        _write(args.output, render_html(data, png, top_n=args.top).encode("utf-8"))
    best = data.best
    best_text = f"best {data.gflops(best.mean_s):.2f} GFLOPS" if best else "no successful trial"
    written = " and ".join(f for f in (args.output, args.png) if f)
    print(f"wrote {written}: job {data.job.id} ({data.job.status}), {len(data.trials)} trials, "
          f"{data.error_count} errors, {best_text}")
    return 0


def _write(path: str, content: bytes) -> None:
    try:
        Path(path).write_bytes(content)
    except OSError as exc:
        raise cannot_write(path, exc) from None
