"""Our strategies beside Kernel Tuner's, in one harness, on the shared replay spaces.

    python bench/peers_search.py [--spaces-dir DIR] [--only SUBSTR,...] [--repeats 10]
        [--budgets 25,50,100,200] [--ours default,ga,sa,random]
        [--peers random_sample,genetic_algorithm,...] [--json OUT.jsonl] [--curves OUT.json]

Kernel Tuner 1.5 (the ``bench`` extra) runs its strategies in simulation mode on the same Kernel
Tuner cache files that ``tuner bench-strategies`` replays: each strategy's ``tune`` is called with
Kernel Tuner's own :class:`SimulationRunner`, the file's cache and ``max_fevals`` as the budget, so a
peer counts evaluations exactly as Kernel Tuner does (distinct configs served from the cache, failed
ones included), like our replay. The metric is the same: per space, strategy and budget, the mean
over ``--repeats`` runs (seeds 0..R-1) of optimum time / best time found within the budget, with its
standard error. Peers whose behaviour depends on ``max_fevals`` (their schedule is scaled to it) run
once per budget; the others run once to the largest budget and are read at each budget, as ours are.
A peer that stops before its budget (its own iteration limit) is restarted, up to 20 times, with
what it evaluated before still counted, so every peer gets the budget it is judged at.

Prints per space and per kernel family every strategy's mean +- s.e. at every budget, the best peer
per cell and the default's margin over it; with ``--halves`` also the family tables of each half of
every family (spaces sorted by name, alternately assigned: ``fit`` and ``held-out``). ``--json``
appends one JSON line per finished (space, strategy) cell as it goes, so a long run can be read while
it runs; ``--curves`` writes mean best-so-far fractions per evaluation (for docs/search.md's plot).
Runs in this one process (Kernel Tuner's strategies draw from the global ``random`` and
``numpy.random`` state, seeded per run).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.replay import ReplaySpace, find_cache_files, load_cache, replay_run  # noqa: E402

KERNEL_TUNER_PEERS = ("random_sample", "genetic_algorithm", "simulated_annealing", "bayes_opt", "diff_evo",
                      "firefly_algorithm", "pso", "hybrid_vndx", "adaptive_tabu_greywolf")
# Strategies whose schedule is scaled to max_fevals (or their own "budget" option): one run per budget.
BUDGET_AWARE = {"simulated_annealing", "bayes_opt", "hybrid_vndx", "adaptive_tabu_greywolf"}
# Their own evaluation budget option (default 5000), set to the budget so they schedule for it.
OWN_BUDGET_OPTION = {"hybrid_vndx": "budget", "adaptive_tabu_greywolf": "budget"}
MAX_RESTARTS = 20
OURS = ("default", "ga", "sa", "random")


class PeerError(RuntimeError):
    """Kernel Tuner is missing or a peer failed (one-line message)."""


# -- Kernel Tuner's side -------------------------------------------------------------------------
@dataclass
class KernelTunerSpace:
    """One cache file as Kernel Tuner sees it: its parameters, restrictions and cache, read once.

    Each run gets a fresh Kernel Tuner ``Searchspace`` (:meth:`searchspace`): the object keeps
    state between calls (``get_random_neighbor`` pops neighbours from a partial cache so that they
    are not chosen again), which would carry one run's exploration into the next."""

    tune_params: dict
    restrictions: list | None
    cache: dict
    kernel_name: str
    device_name: str

    def searchspace(self) -> Any:
        from kernel_tuner.searchspace import Searchspace
        return Searchspace(self.tune_params, self.restrictions, 1_000_000_000)


def kernel_tuner_space(path: str) -> KernelTunerSpace:
    try:
        from kernel_tuner import util
    except ImportError:
        raise PeerError("kernel_tuner is not installed: pip install 'tunefleet[bench]'") from None
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        data = json.load(f)
    errors = {"ErrorConfig": util.ErrorConfig(), "InvalidConfig": util.InvalidConfig(),
              "CompilationFailedConfig": util.CompilationFailedConfig(),
              "RuntimeFailedConfig": util.RuntimeFailedConfig()}
    for entry in data["cache"].values():  # as Kernel Tuner's read_cache marks failed configs
        for value in list(entry.values()):
            if isinstance(value, str) and value in errors:
                entry["__error__"] = errors[value]
    tune_params = {k: data["tune_params"][k] for k in data["tune_params_keys"]}
    restrictions = data.get("restrictions") or None
    return KernelTunerSpace(tune_params, restrictions, data["cache"], data.get("kernel_name", ""),
                            data.get("device_name", ""))


def kernel_tuner_run(kt: KernelTunerSpace, strategy: str, budget: int, seed: int) -> list[float | None]:
    """Times (ms; None: failed) of the distinct configs one Kernel Tuner run evaluated, in order."""
    from kernel_tuner import util
    from kernel_tuner.interface import Options, _tuning_options, strategy_map
    from kernel_tuner.runners.simulation import SimulationRunner

    order: list[str] = []

    class RecordingRunner(SimulationRunner):
        """Kernel Tuner's simulation runner, noting each config the first time it is served."""

        def run(self, parameter_space, tuning_options):
            results = []
            for element in parameter_space:
                known = len(self.visited_results)
                results += super().run([element], tuning_options)
                if len(self.visited_results) > known:
                    order.append(",".join(str(v) for v in element))
            return results

    searchspace = kt.searchspace()
    random.seed(seed)
    np.random.seed(seed)
    runner = RecordingRunner(None, Options(kernel_name=kt.kernel_name), Options(quiet=True), 7, None)
    runner.dev.env["device_name"] = kt.device_name
    options = Options([(k, None) for k in _tuning_options.keys()])
    strategy_options = {"max_fevals": budget}
    if strategy in OWN_BUDGET_OPTION:
        strategy_options[OWN_BUDGET_OPTION[strategy]] = budget
    options.update(
        tune_params=kt.tune_params, restrictions=searchspace._modified_restrictions,
        restrictions_unmodified=kt.restrictions, objective=["time"], objective_higher_is_better=[False],
        strategy_options=Options(strategy_options), cache=kt.cache, cachefile=None, simulation_mode=True,
        verbose=False, quiet=True, metrics=None, max_fevals=budget, simulated_time=0, seed=seed,
        verify=util.normalize_verify_function(None), budget=util.TuningBudget(None, budget),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # A strategy that ends before the budget (its own iteration limit: firefly after ~100
        # evaluations, simulated annealing's schedule) is started again, as a user with budget left
        # would: configs it evaluated before are served from the runner again without counting.
        for _ in range(MAX_RESTARTS):
            try:
                strategy_map[strategy].tune(searchspace, runner, options)
            except util.StopCriterionReached:
                break
            if len(order) >= budget or options.budget.is_done():
                break
    out = []
    for key in order[:budget]:
        t = kt.cache[key].get("time")
        out.append(None if "__error__" in kt.cache[key] or not isinstance(t, (int, float)) else float(t))
    return out


# -- both sides: traces to cells -----------------------------------------------------------------
@dataclass
class Cell:
    space: str
    family: str
    strategy: str  # ours: our name; peers: "kt:" + Kernel Tuner's name
    budget: int
    fractions: list[float]  # one per repeat

    @property
    def mean(self) -> float:
        return float(np.mean(self.fractions))

    @property
    def se(self) -> float:
        n = len(self.fractions)
        return float(np.std(self.fractions, ddof=1) / math.sqrt(n)) if n > 1 else 0.0

    def as_json(self) -> dict:
        return {"space": self.space, "family": self.family, "strategy": self.strategy, "budget": self.budget,
                "fraction": round(self.mean, 6), "se": round(self.se, 6), "repeats": len(self.fractions)}


def fraction_at(times: Sequence[float | None], budget: int, optimum: float) -> float:
    ok = [t for t in times[:budget] if t is not None]
    return optimum / min(ok) if ok else 0.0


def curve(times: Sequence[float | None], length: int, optimum: float) -> list[float]:
    """Best-so-far fraction of the optimum after 1..length evaluations."""
    out, best = [], math.inf
    for i in range(length):
        t = times[i] if i < len(times) else None
        if t is not None:
            best = min(best, t)
        out.append(optimum / best if best < math.inf else 0.0)
    return out


def run_cells(replay: ReplaySpace, kt: KernelTunerSpace | None, strategy: str, budgets: list[int], repeats: int,
              batch_size: int) -> tuple[list[Cell], list[float]]:
    """The cells of one strategy on one space, and its mean best-so-far curve to the largest budget."""
    peer = strategy.startswith("kt:")
    name = strategy[3:] if peer else strategy
    top = budgets[-1]
    per_budget: dict[int, list[float]] = {b: [] for b in budgets}
    curves = []
    for seed in range(repeats):
        if peer:
            assert kt is not None
            if name in BUDGET_AWARE:
                for b in budgets:
                    times = kernel_tuner_run(kt, name, b, seed)
                    per_budget[b].append(fraction_at(times, b, replay.optimum))
            else:
                times = kernel_tuner_run(kt, name, top, seed)
                for b in budgets:
                    per_budget[b].append(fraction_at(times, b, replay.optimum))
        else:
            times = replay_run(replay, name, top, seed, batch_size).costs
            for b in budgets:
                per_budget[b].append(fraction_at(times, b, replay.optimum))
        curves.append(curve(times, top, replay.optimum))  # budget-aware peers: the run of the largest budget
    cells = [Cell(replay.name, replay.family, strategy, b, per_budget[b]) for b in budgets]
    return cells, list(np.mean(curves, axis=0))


# -- tables -------------------------------------------------------------------------------------
def family_cells(cells: Sequence[Cell], spaces_of: dict[str, list[str]]) -> dict[tuple[str, str, int], tuple[float, float]]:
    """(group, strategy, budget) -> (mean over the group's spaces, its s.e.) for every group in
    ``spaces_of`` (group name -> space names) whose spaces all have the cell."""
    by_key = {(c.space, c.strategy, c.budget): c for c in cells}
    strategies = sorted({c.strategy for c in cells})
    budgets = sorted({c.budget for c in cells})
    out = {}
    for group, names in spaces_of.items():
        for s in strategies:
            for b in budgets:
                found = [by_key.get((n, s, b)) for n in names]
                if names and all(found):
                    mean = float(np.mean([c.mean for c in found]))
                    se = math.sqrt(sum(c.se ** 2 for c in found)) / len(found)
                    out[(group, s, b)] = (mean, se)
    return out


def print_table(title: str, groups: list[str], table: dict, ours: Sequence[str], peers: Sequence[str],
                budgets: Sequence[int], repeats: int) -> None:
    print(f"\n{title} (mean fraction of the optimum +- s.e., {repeats} repeats)")
    header = f"{'group':<26} {'strategy':<28}" + "".join(f"{'@' + str(b):>16}" for b in budgets)
    print(header)
    for g in groups:
        rows = [s for s in list(ours) + list(peers) if (g, s, budgets[0]) in table]
        if not rows:
            continue
        for s in rows:
            print(f"{g:<26} {s:<28}" + "".join(
                f"{table[(g, s, b)][0]:>9.3f} +-{table[(g, s, b)][1]:.3f}" for b in budgets))
        best_line, margin_line = [], []
        for b in budgets:
            cands = [(table[(g, s, b)][0], s) for s in rows if s != "default" and (g, s, b) in table]
            if not cands or (g, "default", b) not in table:
                best_line.append(f"{'':>16}")
                margin_line.append(f"{'':>16}")
                continue
            best_mean, best_name = max(cands)
            se = math.sqrt(table[(g, "default", b)][1] ** 2 + table[(g, best_name, b)][1] ** 2)
            best_line.append(f"{best_name.removeprefix('kt:')[:15]:>16}")
            margin_line.append(f"{table[(g, 'default', b)][0] - best_mean:>+9.3f} +-{se:.3f}")
        print(f"{g:<26} {'best other':<28}" + "".join(best_line))
        print(f"{g:<26} {'default - best other':<28}" + "".join(margin_line))


def halves(spaces: Sequence[ReplaySpace]) -> dict[str, list[str]]:
    """Each family's spaces sorted by name, alternately in its ``fit`` and ``held-out`` half."""
    by_family: dict[str, list[str]] = {}
    for s in spaces:
        by_family.setdefault(s.family, []).append(s.name)
    out: dict[str, list[str]] = {}
    for family, names in by_family.items():
        names = sorted(names)
        out[f"{family}/fit"] = names[0::2]
        out[f"{family}/held-out"] = names[1::2]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spaces-dir", default=str(ROOT.parent / "shared" / "spaces"))
    parser.add_argument("--only", default="", help="comma-separated substrings of space names to keep")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budgets", default="25,50,100,200")
    parser.add_argument("--batch-size", type=int, default=8, help="our strategies' batch (as bench-strategies)")
    parser.add_argument("--ours", default=",".join(OURS))
    parser.add_argument("--peers", default=",".join(KERNEL_TUNER_PEERS[:6]),
                        help=f"Kernel Tuner strategies; known: {', '.join(KERNEL_TUNER_PEERS)}")
    parser.add_argument("--json", default="", help="append one JSON line per finished cell to this file")
    parser.add_argument("--curves", default="", help="write mean best-so-far curves per space to this JSON file")
    parser.add_argument("--halves", action="store_true", help="also print each family split in halves")
    parser.add_argument("--from-json", default="", help="print the tables of earlier --json files (comma-separated); run nothing")
    parser.add_argument("--plot", default="", help="with --from-json and --plot-curves: write this PNG of --plot-family's curves")
    parser.add_argument("--plot-curves", default="", help="earlier --curves files (comma-separated) for --plot")
    parser.add_argument("--plot-family", default="convolution")
    args = parser.parse_args(argv)
    try:
        budgets = sorted({int(b) for b in args.budgets.split(",") if b})
    except ValueError:
        print(f"--budgets must be comma-separated integers, not {args.budgets!r}", file=sys.stderr)
        return 2
    if not budgets or budgets[0] <= 0 or args.repeats < 1:
        print("budgets and --repeats must be positive", file=sys.stderr)
        return 2
    ours = [s for s in args.ours.split(",") if s]
    peers = ["kt:" + s for s in args.peers.split(",") if s]
    unknown = [p[3:] for p in peers if p[3:] not in KERNEL_TUNER_PEERS]
    if unknown:
        print(f"unknown Kernel Tuner strategy {unknown[0]!r}; known: {', '.join(KERNEL_TUNER_PEERS)}", file=sys.stderr)
        return 2

    if args.from_json:
        cells = []
        for path in args.from_json.split(","):
            for line in Path(path).read_text().splitlines():
                row = json.loads(line)
                if "fractions" in row:
                    cells.append(Cell(row["space"], row["family"], row["strategy"], row["budget"], row["fractions"]))
        if args.plot:
            curves: dict[str, dict[str, list[float]]] = {}
            for path in args.plot_curves.split(","):
                for space, by_strategy in json.loads(Path(path).read_text()).items():
                    curves.setdefault(space, {}).update(by_strategy)
            plot_family(cells, curves, args.plot_family, args.plot)
        space_names = sorted({(c.family, c.space) for c in cells})
        spaces_of = {name: [name] for _, name in space_names}
        families = {}
        for family, name in space_names:
            families.setdefault(family, []).append(name)
        half_groups: dict[str, list[str]] = {}
        for family, names in families.items():
            half_groups[f"{family}/fit"] = sorted(names)[0::2]
            half_groups[f"{family}/held-out"] = sorted(names)[1::2]
        report(cells, spaces_of, families, half_groups if args.halves else {}, ours,
               [s for s in sorted({c.strategy for c in cells}) if s not in ours], budgets,
               max(len(c.fractions) for c in cells))
        return 0

    files = find_cache_files(args.spaces_dir, args.only.split(","))
    if not files:
        print(f"no Kernel Tuner cache files in {args.spaces_dir}", file=sys.stderr)
        return 1
    cells: list[Cell] = []
    curves: dict[str, dict[str, list[float]]] = {}
    spaces = []
    started = time.perf_counter()
    for path in files:
        replay = load_cache(path)
        spaces.append(replay)
        kt = kernel_tuner_space(str(path)) if peers else None
        for strategy in ours + peers:
            t0 = time.perf_counter()
            try:
                new, mean_curve = run_cells(replay, kt, strategy, budgets, args.repeats, args.batch_size)
            except PeerError as exc:
                print(str(exc), file=sys.stderr)
                return 1
            cells += new
            curves.setdefault(replay.name, {})[strategy] = mean_curve
            seconds = time.perf_counter() - t0
            print(f"{replay.name:<24} {strategy:<28} " + " ".join(f"@{c.budget} {c.mean:.3f}+-{c.se:.3f}" for c in new)
                  + f"  ({seconds:.0f} s)", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    for c in new:
                        f.write(json.dumps({**c.as_json(), "fractions": c.fractions, "seconds": round(seconds, 2)}) + "\n")
            if args.curves:
                Path(args.curves).write_text(json.dumps(curves))
    families: dict[str, list[str]] = {}
    for s in spaces:
        families.setdefault(s.family, []).append(s.name)
    report(cells, {s.name: [s.name] for s in spaces}, families, halves(spaces) if args.halves else {}, ours, peers,
           budgets, args.repeats)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return 0


def plot_family(cells: Sequence[Cell], curves: dict[str, dict[str, list[float]]], family: str, out: str) -> None:
    """Best so far against evaluations, averaged over the family's spaces: the default, our GA,
    Kernel Tuner's GA and the peer with the best family mean at the largest budget."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spaces = sorted({c.space for c in cells if c.family == family})
    top = max(c.budget for c in cells)
    at_top: dict[str, list[float]] = {}
    for c in cells:
        if c.family == family and c.budget == top:
            at_top.setdefault(c.strategy, []).append(c.mean)
    peers = [s for s in at_top if s.startswith("kt:") and len(at_top[s]) == len(spaces)]
    best_peer = max(peers, key=lambda s: float(np.mean(at_top[s])))
    shown = ["default", "ga", "kt:genetic_algorithm", best_peer]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for strategy in dict.fromkeys(shown):
        if not all(strategy in curves.get(space, {}) for space in spaces):
            continue
        mean = np.mean([curves[space][strategy] for space in spaces], axis=0)
        label = strategy + (" (best peer at %d)" % top if strategy == best_peer else "")
        ax.plot(np.arange(1, len(mean) + 1), mean, label=label, lw=2 if strategy == "default" else 1.3)
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best so far (fraction of optimum)")
    ax.set_title(f"{family}: mean over {len(spaces)} spaces")
    ax.set_ylim(0.6, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def report(cells: Sequence[Cell], spaces_of: dict[str, list[str]], families: dict[str, list[str]],
           half_groups: dict[str, list[str]], ours: Sequence[str], peers: Sequence[str], budgets: Sequence[int],
           repeats: int) -> None:
    print_table("Per space", list(spaces_of), family_cells(cells, spaces_of), ours, peers, budgets, repeats)
    print_table("Per family", list(families), family_cells(cells, families), ours, peers, budgets, repeats)
    if half_groups:
        print_table("Per family half (fit: spaces 1, 3, .. by name; held-out: 2, 4, ..)", list(half_groups),
                    family_cells(cells, half_groups), ours, peers, budgets, repeats)


if __name__ == "__main__":
    raise SystemExit(main())
