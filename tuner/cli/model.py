"""``tuner tasks`` and ``tuner tune-model``: the tunable workloads of an ONNX model, and tuning them all.

``tasks`` lists the model's workloads (see :mod:`tuner.graph.tasks` for the mapping) with how often
each runs per inference. ``tune-model`` shares a total trial budget among them with the task
scheduler of :mod:`tuner.graph.scheduler` (round-robin warm-up, then Ansor's gradient rounds), one
fleet job per round, and prints the estimated model latency with default and with tuned configs:
the sum over tasks of count x mean time, which ignores the operators that are not tasks.
"""

from __future__ import annotations

import argparse
import json
import sys

from measure_agent.protocol.errors import FleetError
from tuner.cli.common import (
    EXIT_FAILURE,
    CliError,
    add_db_arguments,
    check_fleet_arguments,
    opened_fleet,
    positive_int,
    positive_int32,
)
from tuner.cli.tune import add_local_fleet_arguments, add_search_arguments, search_spec_from_args, timing_from_args

LATENCY_NOTE = ("estimated model latency = sum over tasks of count x mean time of one call; operators that "
                "are not tasks (elementwise, pooling, normalisation, data movement) and skipped nodes are not counted")


def register(subparsers) -> None:
    p = subparsers.add_parser("tasks", help="list the tunable workloads of an ONNX model",
                              description="List the tunable workloads of an ONNX model and how often each runs. "
                              "Needs the onnx package (pip install 'tunefleet[model]').")
    _model_arguments(p)
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of tasks (workload, count, flops per call, total_flops, op_type, nodes, "
                   "notes); skipped nodes go to stderr")
    p.set_defaults(func=run_tasks)

    p = subparsers.add_parser("tune-model", help="tune every task of an ONNX model within one trial budget",
                              description="Tune every task of an ONNX model within one trial budget: a round-robin "
                              "warm-up, then rounds for the task whose tuning is estimated to lower the model "
                              "latency most (Ansor's task scheduler). E" + LATENCY_NOTE[1:] + ".")
    _model_arguments(p)
    p.add_argument("--trials", type=positive_int32, required=True,
                   help="total configs the log should hold for the model's tasks when done (earlier runs count: "
                   "re-running resumes)")
    p.add_argument("--round-trials", type=positive_int32, default=8, metavar="N",
                   help="trials per task and round (default 8; the warm-up gives each task one round)")
    p.add_argument("--max-tasks", type=positive_int, metavar="K",
                   help="tune only the K tasks with the most FLOPs (count x FLOPs of one call)")
    add_search_arguments(p, "a job")
    add_local_fleet_arguments(p)
    p.add_argument("--json", action="store_true", help="print the final report as JSON")
    add_db_arguments(p)
    p.set_defaults(func=run_tune_model)


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model")
    p.add_argument("--batch", type=positive_int, metavar="N",
                   help="set the first dimension of every graph input to N (for models with a dynamic batch)")


def _extract(path: str, batch: int | None):
    from tuner.graph import ModelError, extract_tasks

    try:
        return extract_tasks(path, batch)
    except ModelError as exc:
        raise CliError(str(exc)) from None


def _warn(text: str) -> None:
    print(f"tuner: {text}", file=sys.stderr, flush=True)


# -- tuner tasks --------------------------------------------------------------------------------------
def run_tasks(args: argparse.Namespace) -> int:
    found = _extract(args.model, args.batch)
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
        for skipped in found.skipped:
            _warn(f"skipped {skipped}")
        return 0
    print_task_table(found)
    return 0


def print_task_table(found, out=None) -> None:
    out = out or sys.stdout
    batch = f", batch {found.batch}" if found.batch else ""
    print(f"model: {found.source}{batch}: {len(found.tasks)} tasks from {found.nodes} nodes", file=out)
    if found.tasks:
        total = found.total_flops
        print(f"{'#':>3}  {'count':>5}  {'op':<7}  {'MFLOP':>10}  {'share':>6}  workload", file=out)
        for i, task in enumerate(found.tasks, 1):
            share = 100.0 * task.total_flops / total if total else 0.0
            print(f"{i:>3}  {task.count:>5}  {task.op_type:<7}  {task.flops / 1e6:>10.3f}  {share:>5.1f}%  {task.key}",
                  file=out)
            for note in task.notes:
                print(f"{'':>3}  {'':>5}  note: {note}", file=out)
        print(f"tunable work: {total / 1e9:.3f} GFLOP per inference (count x MFLOP of one call)", file=out)
    if found.skipped:
        print(f"skipped ({len(found.skipped)}):", file=out)
        for skipped in found.skipped:
            print(f"  {skipped}", file=out)
    if found.untuned:
        ops = ", ".join(f"{op} x{n}" for op, n in found.untuned)
        print(f"not tuned (no tunable operator): {ops}", file=out)


# -- tuner tune-model ---------------------------------------------------------------------------------
def run_tune_model(args: argparse.Namespace) -> int:
    from tuner.steering import SteeringError, parse_target

    check_fleet_arguments(args, "tune-model")  # before reading the model, which may be large
    found = _extract(args.model, args.batch)
    for skipped in found.skipped:
        _warn(f"skipped {skipped}")
    if not found.tasks:
        raise CliError(f"{args.model} has no tunable task (see: tuner tasks {args.model})")
    timing_from_args(args)  # bad timing is a usage error before anything starts
    try:
        target = parse_target(args.target)
    except SteeringError as exc:
        raise CliError(str(exc)) from None
    tasks = list(found.tasks)
    # On a fleet the daemon's templates decide (a task it refuses is retired with the reason);
    # here, tasks without a local template are left out up front.
    tasks = _most_work(tasks if args.tracker else _with_templates(tasks, target.family), args.max_tasks)
    with opened_fleet(args, "tune-model", args.target) as fleet:
        return _schedule(fleet.client, fleet.device_key, tasks, found, args)


def _with_templates(tasks, family: str):
    """The tasks the local templates can tune; the others are reported, grouped by operator."""
    from measure_agent.templates import TemplateNotFound, default_catalog

    catalog = default_catalog()
    kept, missing = [], {}
    for task in tasks:
        try:
            catalog.get(task.workload.op, family)
        except TemplateNotFound:
            missing.setdefault(task.workload.op, []).append(task)
            continue
        kept.append(task)
    for op, skipped in missing.items():
        _warn(f"skipped {len(skipped)} task(s) of {op}: no template for {op} on target {family}")
    if not kept:
        ops = ", ".join(sorted(missing))
        raise CliError(f"no task of {len(tasks)} has a template on target {family} (operators: {ops})")
    return kept


def _most_work(tasks, limit: int | None):
    if limit is None or limit >= len(tasks):
        return tasks
    keep = set(sorted(range(len(tasks)), key=lambda i: (-tasks[i].total_flops, i))[:limit])
    _warn(f"tuning the {limit} of {len(tasks)} tasks with the most FLOPs (--max-tasks)")
    return [t for i, t in enumerate(tasks) if i in keep]


def _schedule(client, device_key: str, tasks, found, args: argparse.Namespace) -> int:
    from tuner.graph import FleetTaskTuner, TaskScheduler

    # every round's job: the task's workload and trials on these search and timing options
    tuner = FleetTaskTuner(client, search_spec_from_args(args, tasks[0].key, device_key))
    number = task_numbers(found)

    def on_start(state, trials, phase) -> None:
        _warn(f"round {scheduler.rounds + 1} ({phase}): task {number[state.task.key]} x{state.task.count} "
              f"{state.task.key}: {state.trials} -> {trials} trials ...")

    def on_round(report) -> None:
        state = report.state
        best = _ms(state.best_s)
        was = f" (was {_ms(report.best_before)})" if report.best_before is not None else ""
        model = (f"model ~{_ms(report.latency_s)} over {report.measured_tasks}/{report.tasks} tasks"
                 if report.latency_s is not None else "model -")
        retired = f"; retired: {state.retired}" if state.retired else ""
        _warn(f"round {report.number} ({report.phase}): task {number[state.task.key]} now {state.trials} trials, "
              f"best {best}{was}; {model}; budget {report.spent}/{report.budget}{retired}")

    scheduler = TaskScheduler(tasks, tuner, round_trials=args.round_trials, on_start=on_start, on_round=on_round)
    try:
        result = scheduler.run(args.trials)
    except FleetError as exc:
        raise CliError(f"lost the daemon: {exc}", EXIT_FAILURE) from None
    if args.json:
        print(json.dumps(report_json(found, result, device_key, args.target), indent=2))
    else:
        print_report(found, result, device_key, args.target)
    return 0 if any(s.best_s is not None for s in result.states) else EXIT_FAILURE


def task_numbers(found) -> dict[str, int]:
    """Task numbers as ``tuner tasks`` shows them (1-based, graph order), by workload key."""
    return {task.key: i for i, task in enumerate(found.tasks, 1)}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4f} ms"


def report_json(found, result, device_key: str, target: str) -> dict:
    before, after, covered = result.latency()
    number = task_numbers(found)
    return {
        "model": found.source, "device_key": device_key, "target": target, "budget": result.budget,
        "trials": result.spent, "rounds": result.rounds,
        "latency_default_s": before, "latency_tuned_s": after, "latency_tasks": covered,
        "tasks": [{"task": number[s.task.key], **s.task.to_json(), "trials": s.trials, "default_s": s.default_s,
                   "best_s": s.best_s,
                   "retired": s.retired or None} for s in result.states],
    }


def print_report(found, result, device_key: str, target: str, out=None) -> None:
    out = out or sys.stdout
    print(f"model:     {found.source} ({len(result.states)} tasks tuned of {len(found.tasks)})", file=out)
    print(f"device:    {device_key}, target {target}", file=out)
    print(f"trials:    {result.spent} in the log for these tasks (budget {result.budget}), {result.rounds} rounds",
          file=out)
    print(f"{'#':>3}  {'count':>5}  {'trials':>6}  {'default ms':>11}  {'best ms':>11}  {'speed-up':>8}  "
          f"{'count x best':>12}  workload", file=out)
    number = task_numbers(found)
    for state in result.states:
        d, b = state.default_s, state.best_s
        speedup = f"{d / b:.2f}x" if d and b else "-"
        weighted = f"{state.weight * b * 1e3:.4f}" if b else "-"
        print(f"{number[state.task.key]:>3}  {state.weight:>5}  {state.trials:>6}  {_plain_ms(d):>11}  "
              f"{_plain_ms(b):>11}  "
              f"{speedup:>8}  {weighted:>12}  {state.task.key}", file=out)
        if state.retired:
            print(f"{'':>3}  {'':>5}  retired: {state.retired}", file=out)
    before, after, covered = result.latency()
    if before is None:
        print("estimated model latency: unknown (no task has both a default and a tuned time)", file=out)
    else:
        of = f"over {covered} of {len(result.states)} tasks"
        print(f"estimated model latency: {before * 1e3:.4f} ms with default configs -> {after * 1e3:.4f} ms tuned "
              f"({before / after:.2f}x), {of}", file=out)
    print(f"({LATENCY_NOTE})", file=out)


def _plain_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4f}"
