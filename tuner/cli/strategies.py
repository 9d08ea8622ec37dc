"""``tuner bench-strategies``: search strategies replayed on recorded spaces (Kernel Tuner caches).

For every space, strategy and budget it prints the mean fraction of the optimum found (optimum
time / best time found; failed configs use up evaluations and never count as found) and the score
against exact random search ((random - found) / (random - optimum), random being the exact
expected best of uniform sampling without replacement at that budget). ``--transfer`` adds, per
strategy, a row ``NAME+transfer`` where each space starts from what a previous tuning job left in
the log for every other given space of the same kernel (other devices, weighted lower). The
benchmark itself is :func:`tuner.replay.bench_strategies`; this module parses and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from tuner.cli.common import INT64_MAX, CliError, cannot_write, non_negative_int, positive_float, positive_int


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: budgets must be integers >= 1")
    return sorted(set(values))


def _name_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no strategy named")
    return list(dict.fromkeys(names))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench-strategies",
        help="replay search strategies on recorded tuning spaces (Kernel Tuner cache files)",
        description="Replay search strategies on recorded tuning spaces and score them against exact random search.",
    )
    p.add_argument("--space", action="extend", nargs="+", required=True, metavar="FILE",
                   help="Kernel Tuner cache files (.json or .json.gz): --space A B, a shell glob, or --space repeated")
    p.add_argument("--strategies", type=_name_list, default=["default", "random", "ga"],
                   help="comma-separated strategy names (default: default,random,ga)")
    p.add_argument("--budgets", type=_int_list, default=[25, 50, 100, 200],
                   help="comma-separated evaluation budgets (default: 25,50,100,200)")
    p.add_argument("--repeats", type=positive_int, default=20, help="runs per space and strategy (default 20)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="configs per batch (default 8)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the first repeat (default 0)")
    p.add_argument("--time-budget", type=positive_float, metavar="SECONDS",
                   help="stop each run after this much wall time (results then count what was evaluated)")
    p.add_argument("--transfer", action="store_true",
                   help="also run each strategy with a transfer prior from the other spaces of the same kernel")
    p.add_argument("--jobs", type=positive_int, default=1, help="worker processes (default 1)")
    p.add_argument("--json", action="store_true", help="print a JSON list of result objects")
    p.add_argument("--json-out", metavar="FILE", help="also write the JSON list to FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.replay import BenchError, ReplayError, bench_strategies, check_strategies, load_cache

    try:
        check_strategies(args.strategies)  # before reading the files: a typo should not wait for them
    except BenchError as exc:
        raise CliError(str(exc)) from None
    if args.seed + args.repeats - 1 > INT64_MAX:  # repeat r runs with seed --seed + r
        raise CliError(f"--seed + --repeats - 1 must be at most {INT64_MAX}")
    if args.json_out:
        _check_writable(args.json_out)  # before the benchmark, which may run for hours
    try:
        spaces = [load_cache(path) for path in args.space]
    except ReplayError as exc:
        raise CliError(str(exc)) from None
    for space in spaces:
        if space.skipped:
            print(f"note: {space.name}: left out {space.skipped} cache entries outside the space "
                  "(values not in tune_params, or excluded by the restrictions)", file=sys.stderr)
    started = time.perf_counter()
    try:
        rows = bench_strategies(spaces, args.strategies, args.budgets, args.repeats, batch_size=args.batch_size,
                                seed=args.seed, time_budget_s=args.time_budget, transfer=args.transfer,
                                jobs=args.jobs)
    except BenchError as exc:
        raise CliError(str(exc)) from None
    total = time.perf_counter() - started
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print_table(rows, args, total)
    if args.json_out:  # after printing: results a failed write would lose are on stdout
        _write_json(args.json_out, rows)
    return 0


def _check_writable(path: str) -> None:
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise cannot_write(path, exc) from None
    if not existed:
        os.unlink(path)


def _write_json(path: str, rows: list[dict[str, Any]]) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    except OSError as exc:
        raise cannot_write(path, exc) from None


def _print_table(rows: list[dict[str, Any]], args: argparse.Namespace, total: float) -> None:
    from tuner.replay import family_summaries

    budgets = args.budgets
    width = max(len("space"), *(len(r["space"]) for r in rows))
    swidth = max(len("exact random"), *(len(r["strategy"]) for r in rows))
    head = f"{'space':<{width}}  {'strategy':<{swidth}}  " + "  ".join(f"{'@' + str(b):<13}" for b in budgets)
    print(f"mean fraction of optimum (score vs exact random search), {args.repeats} repeats, batch {args.batch_size}")
    print(head + "   s/run")
    cells: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        cells.setdefault((r["space"], r["strategy"]), {})[r["budget"]] = r
    last_space = None
    for (space, strategy), by_budget in cells.items():
        if space != last_space:
            rnd = "  ".join(f"{by_budget[b]['random_fraction']:.3f}        " for b in budgets)
            print(f"{space:<{width}}  {'exact random':<{swidth}}  {rnd}")
        text = "  ".join(f"{by_budget[b]['fraction']:.3f} ({by_budget[b]['score']:+.2f})" for b in budgets)
        seconds = next(iter(by_budget.values()))["seconds_per_run"]
        print(f"{space:<{width}}  {strategy:<{swidth}}  {text}  {seconds:6.2f}")
        last_space = space
    print()
    print("per kernel family (mean over its spaces)")
    for summary in family_summaries(rows):
        text = "  ".join(f"{summary.random_fraction[b]:<13.3f}" for b in budgets)
        print(f"{summary.family:<{width}}  {'exact random':<{swidth}}  {text}")
        for strategy, by_budget in summary.fractions.items():
            text = "  ".join(f"{by_budget[b]:<13.3f}" for b in budgets)
            print(f"{summary.family:<{width}}  {strategy:<{swidth}}  {text}")
    print(f"\ntotal wall time {total:.1f} s")
