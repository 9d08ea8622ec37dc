"""JSON text from outside (files, the network, the command line) decoded within bounds.

Python's :mod:`json` recurses once per nesting level, so ``"[" * 100000`` raises RecursionError,
and a huge text or a number of thousands of digits fails with other errors than
:class:`json.JSONDecodeError`; each would reach a user as a traceback. :func:`loads_bounded`
checks the length and the nesting depth before decoding (the depth by a scan of the brackets
outside strings, so it does not depend on how deep the caller's stack already is) and refuses
with a one-line :class:`JSONBoundsError`. Syntax errors still raise :class:`json.JSONDecodeError`
(both are ``ValueError``), whose line and column callers report.

Standard library only: the measuring side decodes what the daemon sends with it.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

# Far deeper than any config, trial line, best-configs file or Kernel Tuner cache (about 5 levels),
# far below Python's recursion limit for the decoder and for whatever walks the result later.
MAX_JSON_DEPTH = 64
MAX_JSON_CHARS = 64 * 2**20  # the default; callers with larger or smaller inputs pass their own

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_NESTING_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONBoundsError(ValueError):
    """JSON text beyond a size or nesting limit, or that cannot be decoded into values (one line)."""


def loads_bounded(text: str, what: str = "JSON text", *, max_chars: int = MAX_JSON_CHARS,
                  max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)`` for ``text`` of at most ``max_chars`` characters nested at most
    ``max_depth`` levels. Raises :class:`JSONBoundsError` naming ``what`` beyond the bounds, and
    :class:`json.JSONDecodeError` for text that is not JSON."""
    if len(text) > max_chars:
        raise JSONBoundsError(f"{what} is longer than {max_chars} characters")
    if nested_deeper_than(text, max_depth):
        raise JSONBoundsError(f"{what} is nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except (RecursionError, MemoryError) as exc:  # only when the caller's own stack or memory is nearly spent
        raise JSONBoundsError(f"{what} is too large to decode ({type(exc).__name__})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise JSONBoundsError(f"{what} cannot be decoded: {' '.join(str(exc).split())}") from None


def nested_deeper_than(text: str, limit: int) -> bool:
    """Whether JSON ``text`` opens more than ``limit`` arrays and objects inside each other
    (brackets within strings do not count). Linear in the text, without a loop per character."""
    if text.count("[") + text.count("{") <= limit:  # the common case: cannot be deeper than that
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_NESTING_STEP.__getitem__, brackets)), default=0) > limit


__all__ = ["MAX_JSON_CHARS", "MAX_JSON_DEPTH", "JSONBoundsError", "loads_bounded", "nested_deeper_than"]
