"""Compact workload names as TVM users write them, e.g. ``matmul_512x512x512``.

Grammar (segments separated by ``_``, after the operator's name)::

    matmul_MxNxK            dense_MxNxK            batch_matmul_BxMxNxK
    conv2d_nchw_NxCxHxW_kK_rRsS[_sS|_sSHxSW][_pP|_pPHxPW][_dD|_dDHxDW]
    conv2d_nhwc_...         (same segments)
    depthwise_conv2d_nchw_NxCxHxW_rRsS[_sS][_pP][_dD][_mM]      (M: channel multiplier)
    ... and an optional last segment ``float32`` or ``float64``

Everything else is refused with a message that shows the canonical syntax, so nothing is guessed.
"""

from __future__ import annotations

import re

from measure_agent.workload.operators import OPERATORS

# Longest names first: depthwise_conv2d_nchw must not be read as conv2d_nchw.
_OP_NAMES = sorted(OPERATORS, key=len, reverse=True)
_DIMS = re.compile(r"^\d+(x\d+)*$")
_SEGMENTS = {
    "k": (re.compile(r"^k(\d+)$"), ("K",)),
    "rs": (re.compile(r"^r(\d+)s(\d+)$"), ("R", "S")),
    "s": (re.compile(r"^s(\d+)(?:x(\d+))?$"), ("stride_h", "stride_w")),
    "p": (re.compile(r"^p(\d+)(?:x(\d+))?$"), ("pad_h", "pad_w")),
    "d": (re.compile(r"^d(\d+)(?:x(\d+))?$"), ("dilation_h", "dilation_w")),
    "m": (re.compile(r"^m(\d+)$"), ("multiplier",)),
}
_DIM_PARAMS = {
    "matmul": ("M", "N", "K"),
    "dense": ("M", "N", "K"),
    "batch_matmul": ("B", "M", "N", "K"),
    "conv2d_nchw": ("N", "C", "H", "W"),
    "conv2d_nhwc": ("N", "C", "H", "W"),
    "depthwise_conv2d_nchw": ("N", "C", "H", "W"),
    "depthwise_conv2d_nhwc": ("N", "C", "H", "W"),
}
_ALLOWED = {
    "matmul": (), "dense": (), "batch_matmul": (),
    "conv2d_nchw": ("k", "rs", "s", "p", "d"), "conv2d_nhwc": ("k", "rs", "s", "p", "d"),
    "depthwise_conv2d_nchw": ("rs", "s", "p", "d", "m"), "depthwise_conv2d_nhwc": ("rs", "s", "p", "d", "m"),
}

GRAMMAR_HELP = (
    "compact forms: matmul_MxNxK, dense_MxNxK, batch_matmul_BxMxNxK, "
    "conv2d_nchw_NxCxHxW_kK_rRsS_sS_pP[_dD], depthwise_conv2d_nchw_NxCxHxW_rRsS_sS_pP[_mM] "
    "(also _nhwc; _sHxW/_pHxW per axis; optional _float64)"
)


class CompactFormError(ValueError):
    """A compact name that cannot be read unambiguously."""


def looks_compact(text: str) -> bool:
    return "(" not in text and any(text.startswith(name + "_") for name in OPERATORS)


def expand_compact(text: str) -> tuple[str, dict[str, str]]:
    """(operator, arguments) of a compact name; raises :class:`CompactFormError`."""
    op = next((name for name in _OP_NAMES if text.startswith(name + "_")), None)
    if op is None:
        raise CompactFormError(f"no operator name starts {text!r}")
    canonical = OPERATORS[op].signature

    def refuse(reason: str) -> CompactFormError:
        return CompactFormError(f"cannot read {text!r}: {reason}; write it as {canonical}")

    segments = text[len(op) + 1:].split("_")
    args: dict[str, str] = {}
    if segments and segments[-1] in ("float32", "float64"):
        args["dtype"] = segments.pop()
    if not segments or not _DIMS.match(segments[0]):
        raise refuse("the sizes must come first, as AxBxC")
    dims = segments[0].split("x")
    names = _DIM_PARAMS[op]
    if len(dims) != len(names):
        raise refuse(f"{len(dims)} sizes given, {op} takes {len(names)} ({'x'.join(names)})")
    args.update(zip(names, dims))
    seen: set[str] = set()
    for segment in segments[1:]:
        kind = next((k for k in _ALLOWED[op] if _SEGMENTS[k][0].match(segment)), None)
        if kind is None:
            allowed = ", ".join(_ALLOWED[op])
            raise refuse(f"unknown segment {segment!r} (" + (f"expected {allowed})" if allowed else
                                                            f"{op} takes nothing after its sizes)"))
        if kind in seen:
            raise refuse(f"segment {kind!r} given twice")
        seen.add(kind)
        values = [v for v in _SEGMENTS[kind][0].match(segment).groups()]
        params = _SEGMENTS[kind][1]
        if len(params) == 2 and kind != "rs" and values[1] is None:
            values[1] = values[0]  # one number sets both axes
        args.update(zip(params, values))
    missing = [p.name for p in OPERATORS[op].params if p.default is None and p.name not in args]
    if missing:
        raise refuse(f"missing {', '.join(missing)}")
    return op, args
