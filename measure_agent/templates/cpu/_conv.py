"""Shared pieces of the convolution templates (conv2d and depthwise conv2d, NCHW and NHWC)."""

from __future__ import annotations

from dataclasses import dataclass

from measure_agent.workload import Workload
from measure_agent.workload.operators import conv_output_hw


@dataclass(frozen=True)
class ConvGeometry:
    """Sizes of a convolution workload (K: output channels), with the view conv2d iterates over."""

    N: int
    C: int
    K: int
    H: int
    W: int
    R: int
    S: int
    SH: int
    SW: int
    PH: int
    PW: int
    DH: int
    DW: int
    OH: int
    OW: int

    @classmethod
    def of(cls, workload: Workload) -> "ConvGeometry":
        p = workload.params
        oh, ow = conv_output_hw(p)
        k = p["K"] if "K" in p else p["C"] * p["multiplier"]  # depthwise: output channels
        return cls(p["N"], p["C"], k, p["H"], p["W"], p["R"], p["S"], p["stride_h"], p["stride_w"],
                   p["pad_h"], p["pad_w"], p["dilation_h"], p["dilation_w"], oh, ow)

    @property
    def flat(self) -> bool:
        """Pointwise with unit stride and no padding: every output row continues the previous one."""
        return (self.R == self.S == 1 and self.SH == self.SW == 1 and self.PH == self.PW == 0
                and self.OH > 1)

    @property
    def rows(self) -> int:
        return 1 if self.flat else self.OH

    @property
    def cols(self) -> int:
        return self.OH * self.OW if self.flat else self.OW

    @property
    def padded(self) -> bool:
        return self.PH > 0 or self.PW > 0


class Layout:
    """Index expressions of one layout (all indices unsigned)."""

    def __init__(self, layout: str) -> None:
        self.nchw = layout == "nchw"

    def x(self, n: str, c: str, row: str, col: str) -> str:
        return f"xp[{n}, {c}, {row}, {col}]" if self.nchw else f"xp[{n}, {row}, {col}, {c}]"

    def w(self, k: str, c: str, r: str, s: str) -> str:
        return f"w[{k}, {c}, {r}, {s}]" if self.nchw else f"w[{r}, {s}, {c}, {k}]"

    def out(self, n: str, k: str, row: str, col: str) -> str:
        return f"out[{n}, {k}, {row}, {col}]" if self.nchw else f"out[{n}, {row}, {col}, {k}]"


def pad_input(g: ConvGeometry, lay: Layout, loop: str, padded: bool,
              size: str = "H + 2 * PH, W + 2 * PW") -> list[str]:
    """Lines that bind ``xp``: the input, or (``padded``) a zero-padded copy made each call of
    ``size`` (``HP, WP``: at least the padded input; zeros past it)."""
    if not padded:
        return ["xp = x  # no padding: read the input in place"]
    lines = ["# zero-padded copy of the input (one pass per call): the tiles then read without bounds checks",
             f"HP, WP = {size}"]
    if lay.nchw:
        lines += [
            "xp = np.empty((N, C, HP, WP), dtype=x.dtype)",
            f"for nc in {loop}(N * C):",
            "    n, c = nc // C, nc % C",
            "    for i in range(HP):  # plain loops: numba's slice assignments cost ~2x here",
            "        if i < PH or i >= PH + H:",
            "            for j in range(WP):",
            "                xp[n, c, i, j] = 0",
            "        else:",
            "            for j in range(PW):",
            "                xp[n, c, i, j] = 0",
            "            for j in range(W):",
            "                xp[n, c, i, PW + j] = x[n, c, i - PH, j]",
            "            for j in range(PW + W, WP):",
            "                xp[n, c, i, j] = 0",
        ]
    else:
        lines += [
            "xp = np.empty((N, HP, WP, C), dtype=x.dtype)",
            f"for ni in {loop}(N * HP):",
            "    n, i = ni // HP, ni % HP",
            "    if i < PH or i >= PH + H:",
            "        xp[n, i] = 0",
            "    else:",
            "        xp[n, i, :PW] = 0",
            "        xp[n, i, PW + W:] = 0",
            "        xp[n, i, PW:PW + W] = x[n, i - PH]",
        ]
    return lines
