"""Showing fleet jobs: progress bars, summaries and status lines (shared by tune, wait, status)."""

from __future__ import annotations

import argparse
import json

from measure_agent.engine import TimingConfig
from measure_agent.protocol.errors import FleetError
from measure_agent.workload import Workload
from tuner.cli.common import EXIT_FAILURE, CliError


def submit_arguments(workload: Workload, device_key: str, args: argparse.Namespace, timing: TimingConfig) -> dict:
    return dict(workload=workload.key, device_key=device_key, target=args.target, strategy=args.strategy,
                trials=args.trials, seed=args.seed, early_stopping=args.early_stopping, priority=args.priority,
                timing=timing, wait_timeout_s=args.wait_timeout, pins=tuple(args.pin),
                constraints=tuple(args.constraint), transfer=args.transfer, time_budget_s=args.time_budget)


def gflops_of(status, seconds: float | None) -> float | None:
    return status.flops / seconds / 1e9 if seconds else None


def watch_with_progress(client, status):
    """Follow a job to its end with a progress bar; returns the final status."""
    from tuner.job import Progress
    from tuner.progress import ProgressDisplay

    title = f"job {status.job_id}: {status.workload} on {status.device_key}"
    final = status
    with ProgressDisplay(title) as display:
        try:
            for final in client.watch(status.job_id):
                best = final.best_mean_s if final.HasField("best_mean_s") else None
                display.update(Progress(final.done, final.total, final.measured_now, final.errors,
                                        gflops_of(final, best), state=final.state))
        except FleetError as exc:
            raise CliError(f"lost the daemon while following job {status.job_id}: {exc}", EXIT_FAILURE) from None
    return final


def print_summary(status) -> int:
    """The end-of-job report; exit code 0 when the job ended with a best config."""
    if status.state != "done" or not status.best_config_json:
        reason = status.message or "no config ran successfully"
        print(f"job {status.job_id} {status.state}: {reason} ({status.measured_now} measured, {status.errors} errors)")
        return EXIT_FAILURE
    best_s = status.best_mean_s
    print(f"workload:  {status.workload}")
    print(f"device:    {status.device_key}")
    print(f"trials:    {status.measured_now} measured now, {status.done} in the log, {status.errors} errors"
          f"{' (stopped early)' if status.stopped_early else ''}")
    print(f"best:      {status.best_config_json}")
    print(f"time:      {best_s * 1e3:.4f} ms   {gflops_of(status, best_s):.2f} GFLOPS")
    if status.HasField("default_mean_s"):
        default_s = status.default_mean_s
        print(f"default:   {default_s * 1e3:.4f} ms   {gflops_of(status, default_s):.2f} GFLOPS")
        print(f"speed-up:  {default_s / best_s:.2f}x over the default config")
    elif status.default_status:
        print(f"default:   failed ({status.default_status})")
    return 0


def status_line(status) -> str:
    best = f"{gflops_of(status, status.best_mean_s):.2f} GFLOPS" if status.HasField("best_mean_s") else "-"
    return (f"{status.job_id:>5}  {status.state:<9}  {status.done:>5}/{status.total:<5}  errors {status.errors:<4} "
            f"best {best:<14} prio {status.priority:<3} {status.device_key}  {status.workload}")


def status_json(status) -> dict:
    return {
        "job_id": status.job_id, "state": status.state, "workload": status.workload, "device_key": status.device_key,
        "target": status.target, "strategy": status.strategy, "priority": status.priority, "done": status.done,
        "total": status.total, "measured_now": status.measured_now, "errors": status.errors,
        "best_mean_s": status.best_mean_s if status.HasField("best_mean_s") else None,
        "best_config": json.loads(status.best_config_json) if status.best_config_json else None,
        "queued_candidates": status.queued_candidates, "leased_candidates": status.leased_candidates,
        "message": status.message,
    }
