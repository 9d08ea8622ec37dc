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

Restrictions come from users, cache files and job submissions, so one evaluation is kept cheap
whatever the text: at most :data:`MAX_RESTRICTION_CHARS` characters nested at most
:data:`MAX_RESTRICTION_DEPTH` levels (far from Python's recursion limit), arithmetic on numbers
only (no string repetition or ``%`` formatting, no sequence arithmetic), and every number that
arithmetic takes or makes within ±:data:`MAX_NUMBER`, checked before a power is computed. A
restriction that breaks a bound is refused with a one-line :class:`RestrictionError` instead of
being computed.

Evaluating a restriction that divides by zero makes it false (the config is not valid); any other
evaluation error (comparing a string with a number, a number out of bounds) raises
:class:`RestrictionError` naming the values, since it is a mistake in the restriction.
"""

from __future__ import annotations

import ast
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from measure_agent.space.space import Constraint

MAX_RESTRICTION_CHARS = 2000
MAX_RESTRICTION_DEPTH = 100  # syntax-tree levels; parsing and evaluation recurse about twice per level
MAX_NUMBER = 2**64  # products of a few tile sizes are far below; no operation builds a huge integer
MAX_EXPONENT = 256

_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}
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
_SHOWN_VALUE_CHARS = 80


class RestrictionError(ValueError):
    """A restriction expression that is not allowed or does not parse (one-line message)."""


class _OutOfBounds(ArithmeticError):
    """An operation a restriction may not compute (a string operand, a number beyond the bounds)."""


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
            shown = ", ".join(f"{n}={_shown(values[n])}" for n in self.names if n in values)
            why = str(exc) if isinstance(exc, _OutOfBounds) else f"{type(exc).__name__}: {exc}"
            raise RestrictionError(f"restriction {self.text!r} cannot be evaluated{' for ' if shown else ''}{shown}: "
                                   f"{' '.join(why.split())}") from None

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
    if len(text) > MAX_RESTRICTION_CHARS:
        raise RestrictionError(f"restriction {_shown(text)} is longer than {MAX_RESTRICTION_CHARS} characters")
    known = set(params)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise RestrictionError(f"cannot parse restriction {text!r}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # a NUL byte; nesting beyond the parser's stack
        raise RestrictionError(f"cannot parse restriction {text!r}: {type(exc).__name__}") from None
    if _depth(tree.body) > MAX_RESTRICTION_DEPTH:
        raise RestrictionError(f"restriction {_shown(text)} is nested deeper than {MAX_RESTRICTION_DEPTH} levels")
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


def _shown(value: Any) -> str:
    """``repr`` cut to a length a one-line message can carry."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an integer of more than 4300 digits, a deeply nested list
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[:_SHOWN_VALUE_CHARS - 3] + "..."


def _depth(root: ast.AST) -> int:
    """Nesting depth of a syntax tree, walked without recursion (the tree may be thousands deep)."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _number(value: Any, symbol: str) -> int | float:
    """``value`` as an operand of arithmetic: a number within ±MAX_NUMBER (bools count as 0 and 1)."""
    if type(value) not in (int, float, bool):
        if isinstance(value, numbers.Integral):  # numpy integers and the like
            value = int(value)
        elif isinstance(value, numbers.Real):
            value = float(value)
        else:
            raise _OutOfBounds(f"{symbol} takes numbers, not {type(value).__name__} {_shown(value)}")
    if not -MAX_NUMBER <= value <= MAX_NUMBER:  # also refuses inf and nan
        raise _OutOfBounds(f"{_shown(value)} is too large for {symbol} (numbers are limited to ±2**64)")
    return value


def _result(value: Any, symbol: str) -> int | float:
    if type(value) is complex:  # a negative number to a fractional power
        raise _OutOfBounds(f"{symbol} gives the complex number {value!r}")
    if not -MAX_NUMBER <= value <= MAX_NUMBER:
        raise _OutOfBounds(f"{symbol} gives {_shown(value)}, too large (numbers are limited to ±2**64)")
    return value


_PLAIN_NUMBERS = frozenset((int, float, bool))


def _checked_arithmetic(op: Callable[[Any, Any], Any], symbol: str) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        # the common case checked inline: evaluation runs once per combination of a space
        if (type(a) in _PLAIN_NUMBERS and type(b) in _PLAIN_NUMBERS
                and -MAX_NUMBER <= a <= MAX_NUMBER and -MAX_NUMBER <= b <= MAX_NUMBER):
            result = op(a, b)
        else:
            result = op(_number(a, symbol), _number(b, symbol))
        if -MAX_NUMBER <= result <= MAX_NUMBER:
            return result
        return _result(result, symbol)  # raises

    return apply


def _power(base: Any, exponent: Any) -> Any:
    base, exponent = _number(base, "**"), _number(exponent, "**")
    if abs(exponent) > MAX_EXPONENT:
        raise _OutOfBounds(f"exponent {exponent!r} too large (at most {MAX_EXPONENT})")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        # |base| ** exponent >= 2 ** ((bits - 1) * exponent): refuse before building the number
        if (abs(base).bit_length() - 1) * exponent > MAX_NUMBER.bit_length() - 1:
            raise _OutOfBounds(f"{base!r} ** {exponent!r} is too large (numbers are limited to ±2**64)")
    return _result(base ** exponent, "**")  # floats: too large raises OverflowError, also refused


def _refuse(node: ast.AST, text: str, why: str | None = None) -> RestrictionError:
    what = why or f"{type(node).__name__} is not allowed"
    return RestrictionError(
        f"unsafe or unsupported restriction {text!r}: {what} "
        "(only parameter names, numbers, strings, arithmetic, comparisons and and/or/not are allowed)"
    )


def _literal_non_number(node: ast.AST) -> str | None:
    """What a literal operand of arithmetic is when it is not a number (caught before evaluating)."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
        return type(node.value).__name__
    if isinstance(node, (ast.Tuple, ast.List)):
        return type(node).__name__.lower()
    return None


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
        symbol = _SYMBOLS.get(type(node.op))
        if symbol is None:
            raise _refuse(node, text, f"operator {type(node.op).__name__} is not allowed")
        for operand in (node.left, node.right):
            kind = _literal_non_number(operand)
            if kind is not None:
                raise _refuse(node, text, f"arithmetic ({symbol}) on a {kind} is not allowed")
        left, right = sub(node.left), sub(node.right)
        op = _power if isinstance(node.op, ast.Pow) else _checked_arithmetic(_ARITHMETIC[type(node.op)], symbol)
        return lambda values: op(left(values), right(values))
    if isinstance(node, ast.UnaryOp):
        operand = sub(node.operand)
        if isinstance(node.op, ast.USub):
            return lambda values: -_number(operand(values), "-")
        if isinstance(node.op, ast.UAdd):
            return lambda values: +_number(operand(values), "+")
        if isinstance(node.op, ast.Not):
            return lambda values: not operand(values)
        raise _refuse(node, text, f"operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.BoolOp):
        parts = [sub(v) for v in node.values]
        if isinstance(node.op, ast.And):
            def conjunction(values: Mapping[str, Any]) -> bool:
                for part in parts:
                    if not part(values):
                        return False
                return True

            return conjunction

        def disjunction(values: Mapping[str, Any]) -> bool:
            for part in parts:
                if part(values):
                    return True
            return False

        return disjunction
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
        if len(ops) == 1:  # the common case, without the loop
            (op, right), = ops
            return lambda values: op(first(values), right(values))

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
