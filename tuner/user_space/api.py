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
:mod:`tuner.user_space.restrictions`) or callables. A callable whose parameters are named after
tuning parameters receives just those values; a callable with one other parameter receives a dict
of every parameter (it then ties all parameters together, so prefer named parameters in large
spaces). Each restriction only involves the parameters it names, so spaces of billions of configs
are counted, sampled and searched without enumerating them.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from measure_agent.space import ChoiceKnob, Config, ConfigSpace, Constraint
from tuner.search import DEFAULT_STRATEGY, Observation, PriorObservation, make_strategy
from tuner.user_space.restrictions import RestrictionError, parse_restriction

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
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not len(values):
                raise ValueError(f"tune_params[{name!r}] must be a non-empty list of values")
            knobs.append(ChoiceKnob(name, tuple(values)))
        self.tune_params = {k.name: list(k.values) for k in knobs}
        names = list(self.tune_params)
        if isinstance(restrictions, (str, bytes)) or callable(restrictions):
            restrictions = [restrictions]
        constraints = []
        for restriction in restrictions or ():
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


def _constraint(restriction: Restriction, names: list[str]) -> Constraint | None:
    if isinstance(restriction, str):
        parsed = parse_restriction(restriction, names)
        if not parsed.names:
            if not parsed({}):
                raise RestrictionError(f"restriction {restriction!r} is always false")
            return None
        return Constraint(parsed.names, parsed.predicate(), restriction)
    if not callable(restriction):
        raise RestrictionError(f"a restriction must be a string or a callable, not {type(restriction).__name__}")
    description = getattr(restriction, "__name__", "restriction")
    try:
        params = list(inspect.signature(restriction).parameters.values())
    except (TypeError, ValueError):
        params = []
    plain = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    if plain and not variadic and all(p.name in names for p in plain):
        knob_names = tuple(p.name for p in plain)

        def named(*values: Any) -> bool:
            return bool(restriction(**dict(zip(knob_names, values))))

        return Constraint(knob_names, named, description)
    required = [p for p in plain if p.default is p.empty]
    if len(required) <= 1 and (required or variadic or len(plain) >= 1):
        every = tuple(names)

        def whole(*values: Any) -> bool:
            return bool(restriction(dict(zip(every, values))))

        return Constraint(every, whole, description)
    raise RestrictionError(
        f"callable restriction {description} must take parameters named after tuning parameters "
        f"({', '.join(names)}) or one dict of all of them"
    )


@dataclass
class TuneResult:
    """What :func:`tune_function` found."""

    best: dict[str, Any] | None  # fastest params, None when every evaluation failed
    best_value: float | None
    evaluations: list[tuple[dict[str, Any], float | None]] = field(default_factory=list)  # in order
    stopped: str = "budget"  # budget | time | early_stopping | exhausted
    seconds: float = 0.0

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
) -> TuneResult:
    """Minimise ``objective`` over the space: at most ``budget`` distinct configs, and no new batch
    after ``time_budget_s`` seconds or ``early_stopping`` evaluations without improvement.

    ``objective`` gets a ``{name: value}`` dict and returns a cost (lower is better, e.g. seconds)
    or None when the config failed; a non-finite cost counts as failed. Exceptions propagate.
    ``prior`` gives records of related problems (transfer learning) to model-based strategies.
    """
    if budget < 1:
        raise ValueError("budget must be >= 1")
    space = tune_params if isinstance(tune_params, UserSpace) else UserSpace(tune_params, restrictions)
    if isinstance(tune_params, UserSpace) and restrictions:
        raise ValueError("restrictions belong to the UserSpace when one is given")
    search = make_strategy(strategy, space.space, seed=seed)
    if prior:
        search.observe_prior(prior)
    started = time.perf_counter()
    result = TuneResult(best=None, best_value=None)
    since_improvement = 0
    while result.evaluated < budget:
        if time_budget_s is not None and time.perf_counter() - started >= time_budget_s:
            result.stopped = "time"
            break
        batch = search.propose(min(batch_size, budget - result.evaluated))
        if not batch:
            result.stopped = "exhausted"
            break
        observations = []
        for config in batch:
            params = config.as_dict()
            value = objective(dict(params))
            cost = float(value) if value is not None and not isinstance(value, bool) else None
            if cost is not None and not math.isfinite(cost):
                cost = None
            observations.append(Observation(config, cost))
            result.evaluations.append((params, cost))
            if on_result is not None:
                on_result(params, cost)
            if cost is not None and (result.best_value is None or cost < result.best_value):
                result.best, result.best_value = params, cost
                since_improvement = 0
            else:
                since_improvement += 1
        search.observe(observations)
        if early_stopping is not None and since_improvement >= early_stopping:
            result.stopped = "early_stopping"
            break
    result.seconds = time.perf_counter() - started
    return result
