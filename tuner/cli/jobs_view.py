"""Showing fleet jobs: progress bars, summaries and status lines (shared by tune, wait, status)."""

from __future__ import annotations

import json

from measure_agent.protocol.errors import FleetError
from tuner.cli.common import EXIT_FAILURE, CliError
from tuner.fleet import JobStatus


def watch_with_progress(client, status: JobStatus) -> JobStatus:
    """Follow a job to its end with a progress bar; returns the final status."""
    from tuner.job import Progress
    from tuner.progress import ProgressDisplay

    title = f"job {status.job_id}: {status.workload} on {status.device_key}"
    final = status
    with ProgressDisplay(title) as display:
        try:
            for final in client.watch(status.job_id):
                display.update(Progress(final.done, final.total, final.measured_now, final.errors,
                                        final.gflops(final.best_mean_s), state=final.state))
        except FleetError as exc:
            raise CliError(f"lost the daemon while following job {status.job_id}: {exc}", EXIT_FAILURE) from None
    return final


def print_summary(status: JobStatus) -> int:
    """The end-of-job report; exit code 0 when the job ended with a best config."""
    if status.state != "done" or not status.best_config:
        reason = status.message or "no config ran successfully"
        print(f"job {status.job_id} {status.state}: {reason} ({status.measured_now} measured, {status.errors} errors)")
        return EXIT_FAILURE
    best_s = status.best_mean_s
    print(f"workload:  {status.workload}")
    print(f"device:    {status.device_key}")
    print(f"trials:    {status.measured_now} measured now, {status.done} in the log, {status.errors} errors"
          f"{' (stopped early)' if status.stopped_early else ''}")
    print(f"best:      {json.dumps(status.best_config, sort_keys=True)}")
    print(f"time:      {best_s * 1e3:.4f} ms   {status.gflops(best_s):.2f} GFLOPS")
    if status.default_mean_s is not None:
        default_s = status.default_mean_s
        print(f"default:   {default_s * 1e3:.4f} ms   {status.gflops(default_s):.2f} GFLOPS")
        print(f"speed-up:  {default_s / best_s:.2f}x over the default config")
    elif status.default_status:
        print(f"default:   failed ({status.default_status})")
    if status.message:
        print(f"note:      {status.message}")
    return 0


def status_line(status: JobStatus) -> str:
    best = f"{status.gflops(status.best_mean_s):.2f} GFLOPS" if status.best_mean_s is not None else "-"
    return (f"{status.job_id:>5}  {status.state:<9}  {status.done:>5}/{status.total:<5}  errors {status.errors:<4} "
            f"best {best:<14} prio {status.priority:<3} {status.device_key}  {status.workload}")
