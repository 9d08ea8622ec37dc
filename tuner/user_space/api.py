"""User-defined tuning spaces and tuning of plain Python functions (Kernel Tuner style).

    from tuner.user_space import tune_function

    result = tune_function(
        {"block_x": [16, 32, 64, 128], "block_y": [1, 2, 4, 8], "unroll": [1, 2, 4]},
        objective=lambda p: run_my_kernel(**p),          # seconds (lower is better) or None if it failed
        restrictions=["block_x * block_y <= 256", lambda unroll, block_y: unroll <= block_y],
        strategy="default", budget=100,
    )
    result.best, result.best_value

Restrictions are strings over parameter names (parsed safely, see
:mod:`measure_agent.space.expressions`) or callables. A callable whose parameters are named after
tuning parameters receives just those values; a callable with one other parameter receives a dict
of every parameter (it then ties all parameters together, so prefer named parameters in large
spaces). Each restriction only involves the parameters it names, so spaces of billions of configs
are counted, sampled and searched without enumerating them.
"""

from __future__ import annotations

import inspect
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from measure_agent.space import ChoiceKnob, Config, ConfigSpace, Constraint, RestrictionError, restriction_constraint
from tuner.search import DEFAULT_STRATEGY, Observation, PriorObservation, make_strategy
from tuner.user_space.cache_file import CacheFile

Restriction = str | Callable[..., bool]


class UserSpace:
    """A tuning space from a ``{name: [values]}`` dict and restrictions."""

    def __init__(self, tune_params: Mapping[str, Sequence[Any]], restrictions: Sequence[Restriction] = ()) -> None:
        if not isinstance(tune_params, Mapping) or not tune_params:
            raise ValueError("tune_params must be a non-empty dict of parameter name -> list of values")
        knobs = []
        for name, values in tune_params.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"parameter names must be non-empty strings, not {name!r}")
            if isinstance(values, np.ndarray):
                values = values.tolist() if values.ndim == 1 else None
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not len(values):
                raise ValueError(f"tune_params[{name!r}] must be a non-empty list of values (or a 1-D numpy array)")
            knobs.append(ChoiceKnob(name, tuple(_plain(v) for v in values)))
        self.tune_params = {k.name: list(k.values) for k in knobs}
        names = list(self.tune_params)
        if isinstance(restrictions, (str, bytes)) or callable(restrictions):
            restrictions = [restrictions]
        if isinstance(restrictions, Mapping) or not isinstance(restrictions, (Sequence, type(None))):
            raise RestrictionError("restrictions must be a list of expression strings or callables, "
                                   f"not a {type(restrictions).__name__}")
        constraints = []
        restrictions = list(restrictions or ())
        # Expression strings, for cache files; a callable cannot be written down.
        self.expressions: list[str] | None = (
            [r for r in restrictions if isinstance(r, str)] if all(isinstance(r, str) for r in restrictions) else None)
        for restriction in restrictions:
            constraint = _constraint(restriction, names)
            if constraint is not None:
                constraints.append(constraint)
        self.space = ConfigSpace(knobs, constraints)

    @property
    def size(self) -> int:
        """Exact number of valid configs (raises ``OverflowError`` when a restriction over very many
        parameters makes it impossible to count)."""
        return self.space.size

    def config(self, params: Mapping[str, Any]) -> Config:
        """The config of a ``{name: value}`` dict; raises ``ConfigError`` if it is not valid."""
        return self.space.make(dict(params))

    def is_valid(self, params: Mapping[str, Any]) -> bool:
        try:
            self.config(params)
        except ValueError:
            return False
        return True


def _plain(value: Any) -> Any:
    """numpy scalars (``np.arange(4)``'s items, ``np.float32(0.5)``) as Python values, so configs
    serialise to JSON and compare like the user's literals."""
    return value.item() if isinstance(value, np.generic) else value


def _constraint(restriction: Restriction, names: list[str]) -> Constraint | None:
    if isinstance(restriction, str):
        return restriction_constraint(restriction, names)
    if not callable(restriction):
        raise RestrictionError(f"a restriction must be a string or a callable, not {type(restriction).__name__}")
    description = getattr(restriction, "__name__", "restriction")
    try:
        params = list(inspect.signature(restriction).parameters.values())
    except (TypeError, ValueError):
        params = []
    plain = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    if plain and not (var_positional or var_keyword) and all(p.name in names for p in plain):
        knob_names = tuple(p.name for p in plain)
        return Constraint(knob_names, _checked(restriction, description, knob_names, by_keyword=True), description)
    every = tuple(names)
    if not plain and var_keyword and not var_positional:  # def ok(**params)
        return Constraint(every, _checked(restriction, description, every, by_keyword=True), description)
    required = [p for p in plain if p.default is p.empty]
    positional = [p for p in plain if p.kind != p.KEYWORD_ONLY]
    if len(required) <= 1 and (positional or var_positional) and not any(p.kind == p.KEYWORD_ONLY for p in required):
        return Constraint(every, _checked(restriction, description, every, by_keyword=False), description)
    raise RestrictionError(
        f"callable restriction {description} must take parameters named after tuning parameters "
        f"({', '.join(names)}) or one dict of all of them"
    )


def _checked(restriction: Callable[..., Any], description: str, knob_names: tuple[str, ...],
             by_keyword: bool) -> Callable[..., bool]:
    """A constraint predicate calling ``restriction`` with the values as keywords or as one dict;
    an exception inside it becomes a :class:`RestrictionError` naming the values."""

    def holds(*values: Any) -> bool:
        named = dict(zip(knob_names, values))
        try:
            return bool(restriction(**named) if by_keyword else restriction(named))
        except Exception as exc:  # noqa: BLE001 - user code; say which restriction and values
            shown = ", ".join(f"{k}={v!r}" for k, v in named.items())
            raise RestrictionError(f"restriction {description} raised {type(exc).__name__} for {shown}: {exc}") from exc

    return holds


@dataclass
class TuneResult:
    """What :func:`tune_function` found."""

    best: dict[str, Any] | None  # fastest params, None when every evaluation failed
    best_value: float | None
    evaluations: list[tuple[dict[str, Any], float | None]] = field(default_factory=list)  # in order
    stopped: str = "budget"  # budget | time | early_stopping | exhausted
    seconds: float = 0.0
    from_cache: int = 0  # leading evaluations read from the cache file, not run again
    errors: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # exceptions caught by ``catch``

    @property
    def evaluated(self) -> int:
        return len(self.evaluations)


def tune_function(
    tune_params: Mapping[str, Sequence[Any]] | UserSpace,
    objective: Callable[[dict[str, Any]], float | None],
    restrictions: Sequence[Restriction] = (),
    *,
    strategy: str = DEFAULT_STRATEGY,
    budget: int = 100,
    time_budget_s: float | None = None,
    early_stopping: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
    prior: Sequence[PriorObservation] | None = None,
    on_result: Callable[[dict[str, Any], float | None], None] | None = None,
    cache: str | os.PathLike | None = None,
    device_name: str | None = None,
    kernel_name: str | None = None,
    catch: type[Exception] | tuple[type[Exception], ...] = (),
) -> TuneResult:
    """Minimise ``objective`` over the space: at most ``budget`` distinct configs, and no new batch
    after ``time_budget_s`` seconds or ``early_stopping`` evaluations without improvement.

    ``objective`` gets a ``{name: value}`` dict and returns a cost (a positive number, lower is
    better, e.g. seconds) or None when the config failed; a NaN or infinite cost counts as failed.
    Anything else (a string, a bool, zero or a negative number) raises ``ValueError`` naming the
    params. An exception of a type in ``catch`` marks the config failed (its message is kept in
    ``TuneResult.errors``); any other exception propagates. ``prior`` gives records of related
    problems (transfer learning) to model-based strategies. ``seed=None`` draws a fresh seed.

    ``cache`` names a Kernel Tuner-format cache file: each evaluation is appended to it at once,
    and a run given a file that already holds evaluations of this space starts from them instead
    of calling ``objective`` again (they count toward ``budget``), so an interrupted run resumes.
    The file records ``device_name`` (default: this host's CPU model; name the GPU when the
    objective times one) and ``kernel_name`` (default: the name in the file, else the objective's
    ``__name__``), so Kernel Tuner resumes from it too; a file of another device or kernel is refused.
    """
    for name, value, optional in (("budget", budget, False), ("batch_size", batch_size, False),
                                  ("early_stopping", early_stopping, True)):
        if not (optional and value is None) and (not isinstance(value, (int, np.integer)) or isinstance(value, bool)
                                                 or value < 1):
            raise ValueError(f"{name} must be an integer >= 1{' or None' if optional else ''}, not {value!r}")
    if time_budget_s is not None and (isinstance(time_budget_s, bool)
                                      or not isinstance(time_budget_s, (int, float, np.number))
                                      or not time_budget_s >= 0):
        raise ValueError(f"time_budget_s must be a number >= 0 or None, not {time_budget_s!r}")
    if not callable(objective):
        raise TypeError(f"objective must be a callable taking a dict of params, not {type(objective).__name__}")
    space = tune_params if isinstance(tune_params, UserSpace) else UserSpace(tune_params, restrictions)
    if isinstance(tune_params, UserSpace) and restrictions:
        raise ValueError("restrictions belong to the UserSpace when one is given")
    if prior is not None:
        prior = list(prior)
        wrong = next((p for p in prior if not isinstance(p, PriorObservation)), None)
        if wrong is not None:
            raise TypeError(f"prior must hold PriorObservation records, not {type(wrong).__name__} ({wrong!r})")
    catch = catch if isinstance(catch, tuple) else (catch,)
    if not all(isinstance(c, type) and issubclass(c, Exception) for c in catch):
        raise TypeError(f"catch must be an exception class or a tuple of them, not {catch!r}")
    search = make_strategy(strategy, space.space, seed=seed)
    if prior:
        search.observe_prior(prior)
    cache_file = None
    if cache is not None:
        objective_name = getattr(objective, "__name__", None) or type(objective).__name__
        cache_file = CacheFile.open(cache, space.tune_params, space.expressions or (),  # CacheFileError
                                    device_name=device_name, kernel_name=kernel_name,
                                    default_kernel_name=objective_name)
    started = time.perf_counter()
    result = TuneResult(best=None, best_value=None)
    since_improvement = 0

    def account(params: dict[str, Any], cost: float | None) -> None:
        nonlocal since_improvement
        result.evaluations.append((params, cost))
        if cost is not None and (result.best_value is None or cost < result.best_value):
            result.best, result.best_value = params, cost
            since_improvement = 0
        else:
            since_improvement += 1

    try:
        if cache_file is not None:
            # Entries a changed restriction now excludes stay in the file but are not part of this run.
            cached = [(space.space.make(dict(zip(space.tune_params, values))), cost)
                      for values, cost in cache_file.previous.items()
                      if space.is_valid(dict(zip(space.tune_params, values)))][:budget]
            for config, cost in cached:
                account(config.as_dict(), cost)
            search.observe([Observation(config, cost) for config, cost in cached])
            result.from_cache = len(cached)
        while result.evaluated < budget:
            if time_budget_s is not None and time.perf_counter() - started >= time_budget_s:
                result.stopped = "time"
                break
            if early_stopping is not None and since_improvement >= early_stopping:
                result.stopped = "early_stopping"
                break
            batch = search.propose(min(batch_size, budget - result.evaluated))
            if not batch:
                result.stopped = "exhausted"
                break
            observations = []
            for config in batch:
                params = config.as_dict()
                try:
                    value = objective(dict(params))
                except catch as exc:
                    value = None
                    result.errors.append((params, f"{type(exc).__name__}: {exc}"))
                cost = _cost(value, params)
                if cache_file is not None:
                    cache_file.record(params, cost)
                observations.append(Observation(config, cost))
                account(params, cost)
                if on_result is not None:
                    on_result(params, cost)
            search.observe(observations)
    finally:
        if cache_file is not None:
            cache_file.close()
    result.seconds = time.perf_counter() - started
    return result


def _cost(value: Any, params: Mapping[str, Any]) -> float | None:
    """The objective's return value as a cost: None (failed) or a positive float."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"objective returned {value!r} ({type(value).__name__}) for {dict(params)}: return a "
                         "cost (a positive number, lower is better) or None when the config failed")
    try:
        cost = float(value)
    except OverflowError:
        return None  # an int too large for a float: no usable cost
    if not math.isfinite(cost):
        return None
    if cost <= 0:
        raise ValueError(f"objective returned {value!r} for {dict(params)}: costs must be positive (lower is "
                         "better; e.g. seconds, or 1/throughput to maximise a throughput)")
    return cost
