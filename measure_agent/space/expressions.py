"""Constraint expressions over tuning parameters (Kernel Tuner's restrictions), parsed safely.

They live beside the space they narrow (replayed cache files, user spaces, ``--constraint``) and
need only the standard library, so the measuring side can evaluate them as well as the tuner.

A restriction is a Python-like expression such as ``"block_size_x * block_size_y <= 1024"`` or
``"MWG % (MDIMC * VWM) == 0 and SA <= SB"`` (Kernel Tuner's syntax). It is parsed with :mod:`ast`
and only these constructs are accepted: numbers, strings and booleans; parameter names; the
arithmetic operators ``+ - * / // % **``; unary ``- + not``; comparisons (``== != < <= > >=``,
chained, and ``in`` / ``not in`` a literal tuple or list); ``and`` / ``or``; and ``x if c else
y``. Anything else (calls, attributes, subscripts, lambdas, comprehensions, unknown names) is
refused with :class:`RestrictionError` before anything runs. Nothing is ever passed to
``eval``: the checked tree is turned into nested Python closures.

Evaluating a restriction that divides by zero makes it false (the config is not valid); any other
evaluation error (comparing a string with a number, an overflow) raises :class:`RestrictionError`
naming the values, since it is a mistake in the restriction.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from measure_agent.space.space import Constraint

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_MAX_EXPONENT = 256  # keeps ``2 ** 10 ** 10`` from eating the machine
_MAX_LENGTH = 2000


class RestrictionError(ValueError):
    """A restriction expression that is not allowed or does not parse (one-line message)."""


@dataclass(frozen=True)
class Restriction:
    """A parsed expression: ``names`` are the parameters it reads, in order of first use."""

    text: str
    names: tuple[str, ...]
    _fn: Callable[[Mapping[str, Any]], Any]

    def __call__(self, values: Mapping[str, Any]) -> bool:
        try:
            return bool(self._fn(values))
        except ZeroDivisionError:
            return False
        except RestrictionError:
            raise
        except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
            # e.g. comparing a string parameter with a number: a mistake in the restriction
            shown = ", ".join(f"{n}={values[n]!r}" for n in self.names if n in values)
            raise RestrictionError(f"restriction {self.text!r} cannot be evaluated for {shown}: "
                                   f"{type(exc).__name__}: {exc}") from None

    def predicate(self) -> Callable[..., bool]:
        """A function of the values of ``names``, positionally (a :class:`Constraint` predicate)."""
        names = self.names

        def holds(*args: Any) -> bool:
            return self(dict(zip(names, args)))

        return holds


def parse_restriction(text: str, params: Iterable[str]) -> Restriction:
    """Parse ``text``; every name in it must be one of ``params``. Raises :class:`RestrictionError`."""
    if not isinstance(text, str):
        raise RestrictionError(f"a restriction must be a string or a callable, not {type(text).__name__}")
    if len(text) > _MAX_LENGTH:
        raise RestrictionError(f"restriction longer than {_MAX_LENGTH} characters")
    known = set(params)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise RestrictionError(f"cannot parse restriction {text!r}: {exc.msg}") from None
    names: list[str] = []
    fn = _compile(tree.body, text, known, names)
    return Restriction(text, tuple(names), fn)


def restriction_constraint(text: str, params: Iterable[str]) -> Constraint | None:
    """The :class:`Constraint` of a restriction over ``params``, or None for one that names no
    parameter and holds (it narrows nothing). Raises :class:`RestrictionError`, also when it is
    always false."""
    restriction = parse_restriction(text, params)
    if not restriction.names:
        if not restriction({}):
            raise RestrictionError(f"restriction {text!r} is always false")
        return None
    return Constraint(restriction.names, restriction.predicate(), text)


def _refuse(node: ast.AST, text: str, why: str | None = None) -> RestrictionError:
    what = why or f"{type(node).__name__} is not allowed"
    return RestrictionError(
        f"unsafe or unsupported restriction {text!r}: {what} "
        "(only parameter names, numbers, strings, arithmetic, comparisons and and/or/not are allowed)"
    )


def _compile(node: ast.AST, text: str, known: set[str], names: list[str]) -> Callable[[Mapping[str, Any]], Any]:
    def sub(child: ast.AST) -> Callable[[Mapping[str, Any]], Any]:
        return _compile(child, text, known, names)

    if isinstance(node, ast.Constant):
        value = node.value
        if not isinstance(value, (int, float, str, bool)) or isinstance(value, complex):
            raise _refuse(node, text, f"constant {value!r} is not allowed")
        return lambda values: value
    if isinstance(node, ast.Name):
        name = node.id
        if name in ("True", "False"):  # pragma: no cover - parsed as Constant on 3.8+
            value = name == "True"
            return lambda values: value
        if name not in known:
            raise RestrictionError(f"restriction {text!r} names unknown parameter {name!r}")
        if name not in names:
            names.append(name)
        return lambda values: values[name]
    if isinstance(node, ast.BinOp):
        left, right = sub(node.left), sub(node.right)
        if isinstance(node.op, ast.Pow):
            def power(values: Mapping[str, Any]) -> Any:
                base, exponent = left(values), right(values)
                if isinstance(exponent, (int, float)) and abs(exponent) > _MAX_EXPONENT:
                    raise RestrictionError(f"exponent {exponent} too large in restriction {text!r}")
                return base ** exponent
            return power
        op = _BINARY.get(type(node.op))
        if op is None:
            raise _refuse(node, text, f"operator {type(node.op).__name__} is not allowed")
        return lambda values: op(left(values), right(values))
    if isinstance(node, ast.UnaryOp):
        operand = sub(node.operand)
        if isinstance(node.op, ast.USub):
            return lambda values: -operand(values)
        if isinstance(node.op, ast.UAdd):
            return lambda values: +operand(values)
        if isinstance(node.op, ast.Not):
            return lambda values: not operand(values)
        raise _refuse(node, text, f"operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.BoolOp):
        parts = [sub(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda values: all(p(values) for p in parts)
        return lambda values: any(p(values) for p in parts)
    if isinstance(node, ast.Compare):
        first = sub(node.left)
        ops = []
        for op_node, right_node in zip(node.ops, node.comparators):
            op = _COMPARE.get(type(op_node))
            if op is None:
                raise _refuse(node, text, f"comparison {type(op_node).__name__} is not allowed")
            if isinstance(op_node, (ast.In, ast.NotIn)) and not isinstance(right_node, (ast.Tuple, ast.List)):
                raise _refuse(node, text, "'in' needs a literal tuple or list on its right")
            ops.append((op, sub(right_node)))

        def compare(values: Mapping[str, Any]) -> bool:
            left_value = first(values)
            for op, right in ops:
                right_value = right(values)
                if not op(left_value, right_value):
                    return False
                left_value = right_value
            return True

        return compare
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [sub(e) for e in node.elts]
        return lambda values: tuple(i(values) for i in items)
    if isinstance(node, ast.IfExp):
        test, body, orelse = sub(node.test), sub(node.body), sub(node.orelse)
        return lambda values: body(values) if test(values) else orelse(values)
    raise _refuse(node, text)
