"""Operator specifications: parameters, FLOP count, inputs and the numpy reference.

The reference is what every measured kernel is checked against, on every device. It lives with the
agent because the agent checks outputs locally before reporting a result.

Layouts (as in TVM): ``conv2d_nchw`` takes data [N,C,H,W] and weights [K,C,R,S] (OIHW) and writes
[N,K,OH,OW]; ``conv2d_nhwc`` takes data [N,H,W,C] and weights [R,S,C,K] (HWIO) and writes
[N,OH,OW,K]. Depthwise: NCHW data with weights [C,multiplier,R,S] writes [N,C*multiplier,OH,OW];
NHWC data with weights [R,S,C,multiplier] writes [N,OH,OW,C*multiplier] (output channel
c*multiplier+m). ``dense`` is X[M,K] times W[N,K] transposed; ``batch_matmul`` is A[B,M,K] @ B[B,K,N].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


@dataclass(frozen=True)
class Param:
    """An integer parameter of an operator; ``default`` None means required."""

    name: str
    default: int | None = None
    minimum: int = 1


@dataclass(frozen=True)
class OperatorSpec:
    """What an operator is, independent of any schedule.

    ``input_shapes(params)`` gives the shapes of the input arrays in call order and
    ``make_inputs(params, dtype, rng)`` random arrays of those shapes; ``reference(params, *inputs)``
    is the expected output and ``output_shape(params)`` its shape. Whatever only sizes arrays
    (bounds checks, ``tuner.best_kernel``'s argument checks) asks the shapes, never the data.
    ``axis_pairs`` maps a short name to two per-axis parameters (``stride`` -> ``stride_h``,
    ``stride_w``): the short name sets both, and the canonical key uses it when both are equal.
    """

    name: str
    params: tuple[Param, ...]
    flops: Callable[[dict[str, int]], int]
    input_shapes: Callable[[dict[str, int]], tuple[tuple[int, ...], ...]]
    reference: Callable[..., np.ndarray]
    output_shape: Callable[[dict[str, int]], tuple[int, ...]]
    reduction_length: Callable[[dict[str, int]], int]
    axis_pairs: tuple[tuple[str, tuple[str, str]], ...] = ()
    max_size: int = 1 << 16
    max_elements: int = 1 << 28  # per array: larger problems are refused as out of bounds

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def signature(self) -> str:
        shown = []
        paired = {name for _, pair in self.axis_pairs for name in pair}
        for p in self.params:
            if p.name in paired:
                continue
            shown.append(f"{p.name}=INT" if p.default is None else f"[{p.name}={p.default}]")
        shown += [f"[{short}=INT]" for short, _ in self.axis_pairs]
        return f"{self.name}({','.join(shown)}[,dtype=float32|float64])"

    def make_inputs(self, p: dict[str, int], dtype: np.dtype, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        """Random inputs in call order: an array of each of :attr:`input_shapes`, uniform in [-1, 1]."""
        return tuple(rng.uniform(-1.0, 1.0, size=shape).astype(dtype, copy=False) for shape in self.input_shapes(p))

    def array_shapes(self, p: dict[str, int]) -> list[tuple[int, ...]]:
        """Shapes of the inputs and the output, for bounds checks (no allocation)."""
        return [*self.input_shapes(p), self.output_shape(p)]


# -- matmul family -------------------------------------------------------------------------------
MATMUL = OperatorSpec(
    name="matmul",
    params=(Param("M"), Param("N"), Param("K")),
    flops=lambda p: 2 * p["M"] * p["N"] * p["K"],
    input_shapes=lambda p: ((p["M"], p["K"]), (p["K"], p["N"])),
    reference=lambda p, a, b: a @ b,
    output_shape=lambda p: (p["M"], p["N"]),
    reduction_length=lambda p: p["K"],
)

DENSE = OperatorSpec(
    name="dense",
    params=(Param("M"), Param("N"), Param("K")),
    flops=lambda p: 2 * p["M"] * p["N"] * p["K"],
    input_shapes=lambda p: ((p["M"], p["K"]), (p["N"], p["K"])),
    reference=lambda p, x, w: x @ w.T,
    output_shape=lambda p: (p["M"], p["N"]),
    reduction_length=lambda p: p["K"],
)

BATCH_MATMUL = OperatorSpec(
    name="batch_matmul",
    params=(Param("B"), Param("M"), Param("N"), Param("K")),
    flops=lambda p: 2 * p["B"] * p["M"] * p["N"] * p["K"],
    input_shapes=lambda p: ((p["B"], p["M"], p["K"]), (p["B"], p["K"], p["N"])),
    reference=lambda p, a, b: np.matmul(a, b),
    output_shape=lambda p: (p["B"], p["M"], p["N"]),
    reduction_length=lambda p: p["K"],
)


# -- convolutions --------------------------------------------------------------------------------
_CONV_WINDOW = (
    Param("stride_h", 1), Param("stride_w", 1), Param("pad_h", 0, minimum=0), Param("pad_w", 0, minimum=0),
    Param("dilation_h", 1), Param("dilation_w", 1),
)
_CONV_PAIRS = (("stride", ("stride_h", "stride_w")), ("pad", ("pad_h", "pad_w")),
               ("dilation", ("dilation_h", "dilation_w")))


def conv_output_hw(p: dict[str, int]) -> tuple[int, int]:
    oh = (p["H"] + 2 * p["pad_h"] - p["dilation_h"] * (p["R"] - 1) - 1) // p["stride_h"] + 1
    ow = (p["W"] + 2 * p["pad_w"] - p["dilation_w"] * (p["S"] - 1) - 1) // p["stride_w"] + 1
    return oh, ow


def _windows_nchw(p: dict[str, int], x: np.ndarray) -> np.ndarray:
    """[N, C, OH, OW, R, S] view of the padded input's receptive fields."""
    xp = np.pad(x, ((0, 0), (0, 0), (p["pad_h"], p["pad_h"]), (p["pad_w"], p["pad_w"])))
    span_h = p["dilation_h"] * (p["R"] - 1) + 1
    span_w = p["dilation_w"] * (p["S"] - 1) + 1
    win = sliding_window_view(xp, (span_h, span_w), axis=(2, 3))
    oh, ow = conv_output_hw(p)
    win = win[:, :, : (oh - 1) * p["stride_h"] + 1: p["stride_h"], : (ow - 1) * p["stride_w"] + 1: p["stride_w"]]
    return win[..., :: p["dilation_h"], :: p["dilation_w"]]


def _conv2d_nchw_ref(p, x, w):
    return np.einsum("ncxyrs,kcrs->nkxy", _windows_nchw(p, x), w, optimize=True).astype(x.dtype, copy=False)


def _conv2d_nhwc_ref(p, x, w):
    windows = _windows_nchw(p, x.transpose(0, 3, 1, 2))
    return np.einsum("ncxyrs,rsck->nxyk", windows, w, optimize=True).astype(x.dtype, copy=False)


def _depthwise_nchw_ref(p, x, w):
    windows = _windows_nchw(p, x)  # [N,C,OH,OW,R,S]
    out = np.einsum("ncxyrs,cmrs->ncmxy", windows, w, optimize=True)
    n, c, m, oh, ow = out.shape
    return out.reshape(n, c * m, oh, ow).astype(x.dtype, copy=False)


def _depthwise_nhwc_ref(p, x, w):
    windows = _windows_nchw(p, x.transpose(0, 3, 1, 2))
    out = np.einsum("ncxyrs,rscm->nxycm", windows, w, optimize=True)
    n, oh, ow, c, m = out.shape
    return out.reshape(n, oh, ow, c * m).astype(x.dtype, copy=False)


def _conv_flops(p: dict[str, int]) -> int:
    oh, ow = conv_output_hw(p)
    return 2 * p["N"] * p["K"] * oh * ow * p["C"] * p["R"] * p["S"]


def _depthwise_flops(p: dict[str, int]) -> int:
    oh, ow = conv_output_hw(p)
    return 2 * p["N"] * p["C"] * p["multiplier"] * oh * ow * p["R"] * p["S"]


_CONV_PARAMS = (Param("N"), Param("C"), Param("H"), Param("W"), Param("K"), Param("R"), Param("S")) + _CONV_WINDOW
_DEPTHWISE_PARAMS = (Param("N"), Param("C"), Param("H"), Param("W"), Param("R"), Param("S")) + _CONV_WINDOW + (
    Param("multiplier", 1),)

CONV2D_NCHW = OperatorSpec(
    name="conv2d_nchw",
    params=_CONV_PARAMS,
    flops=_conv_flops,
    input_shapes=lambda p: ((p["N"], p["C"], p["H"], p["W"]), (p["K"], p["C"], p["R"], p["S"])),
    reference=_conv2d_nchw_ref,
    output_shape=lambda p: (p["N"], p["K"], *conv_output_hw(p)),
    reduction_length=lambda p: p["C"] * p["R"] * p["S"],
    axis_pairs=_CONV_PAIRS,
)

CONV2D_NHWC = OperatorSpec(
    name="conv2d_nhwc",
    params=_CONV_PARAMS,
    flops=_conv_flops,
    input_shapes=lambda p: ((p["N"], p["H"], p["W"], p["C"]), (p["R"], p["S"], p["C"], p["K"])),
    reference=_conv2d_nhwc_ref,
    output_shape=lambda p: (p["N"], *conv_output_hw(p), p["K"]),
    reduction_length=lambda p: p["C"] * p["R"] * p["S"],
    axis_pairs=_CONV_PAIRS,
)

DEPTHWISE_CONV2D_NCHW = OperatorSpec(
    name="depthwise_conv2d_nchw",
    params=_DEPTHWISE_PARAMS,
    flops=_depthwise_flops,
    input_shapes=lambda p: ((p["N"], p["C"], p["H"], p["W"]), (p["C"], p["multiplier"], p["R"], p["S"])),
    reference=_depthwise_nchw_ref,
    output_shape=lambda p: (p["N"], p["C"] * p["multiplier"], *conv_output_hw(p)),
    reduction_length=lambda p: p["R"] * p["S"],
    axis_pairs=_CONV_PAIRS,
)

DEPTHWISE_CONV2D_NHWC = OperatorSpec(
    name="depthwise_conv2d_nhwc",
    params=_DEPTHWISE_PARAMS,
    flops=_depthwise_flops,
    input_shapes=lambda p: ((p["N"], p["H"], p["W"], p["C"]), (p["R"], p["S"], p["C"], p["multiplier"])),
    reference=_depthwise_nhwc_ref,
    output_shape=lambda p: (p["N"], *conv_output_hw(p), p["C"] * p["multiplier"]),
    reduction_length=lambda p: p["R"] * p["S"],
    axis_pairs=_CONV_PAIRS,
)

OPERATORS: dict[str, OperatorSpec] = {
    spec.name: spec
    for spec in (MATMUL, DENSE, BATCH_MATMUL, CONV2D_NCHW, CONV2D_NHWC, DEPTHWISE_CONV2D_NCHW, DEPTHWISE_CONV2D_NHWC)
}


def elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
