"""Winograd F(2x2, 3x3) convolution for the CPU conv2d template (3x3 filters, stride 1, no dilation).

Each 2x2 block of outputs (a *tile*) of one output channel is ``A^T [sum_c (G g G^T) . (B^T d B)] A``
where ``d`` is the tile's 4x4 input patch of channel ``c`` and ``g`` the 3x3 filter: 16 products per
tile and channel instead of the direct convolution's 36 (2.25x fewer multiply-adds), paid for by
transforms of the input, the weights and the output. The 16 elementwise products over the input
channels are 16 independent GEMMs, ``M[xi] = U[xi] (K x C) @ V[xi] (C x tiles)``, which run on the
same register tiles as the direct kernel (vectors over output channels, tiles broadcast).

The rendered kernel, for ``conv2d(x, w, out, KC, HB, WC, CB)`` (the direct kernel's signature):

    [pad]    x copied into a zero-padded NCHW buffer xp whose rows and columns cover whole tiles and
             whole tile panels (no bounds checks in the transforms; NHWC input is transposed here)
    [input]  V[panel, xi, c, j] = (B^T d B)[xi] for tile j of each panel (TT tiles of one tile row;
             a panel past the row's end holds transforms of zeros)
    [weight] U[k / KT, xi, c, k % KT] = (G g G^T)[xi], zero past K
    for each work item (KC output channels x HB/2 tile rows), in parallel if asked
      for each KT-channel tile and each xi (``loop_order``: tiles outer or xi outer)
        for each panel of the item: a KT x TT register tile reduced over the C input channels
        (``unroll_c``), stored to M[channel tile, panel, xi]; U[tile, xi] stays in L1 meanwhile
      for each channel tile and panel: A^T m A -> the panel's 2x2 output blocks (edges: only what
        exists)

V and U carry a spare channel row so that the 16 planes of a panel do not fall on the same cache
sets (C a power of two made them 2-4 KiB apart). Float32 results differ from the direct sum by
rounding only (the transforms add and subtract; G halves exactly).
"""

from __future__ import annotations

from measure_agent.space import Config
from measure_agent.templates.cpu._common import indent, unrolled_loop
from measure_agent.templates.cpu._conv import ConvGeometry, Layout, pad_input


def winograd_applies(g: ConvGeometry) -> bool:
    """F(2x2, 3x3) computes exactly this convolution: 3x3 filter, unit stride and dilation."""
    return g.R == 3 and g.S == 3 and g.SH == 1 and g.SW == 1 and g.DH == 1 and g.DW == 1


def winograd_body(g: ConvGeometry, lay: Layout, config: Config, dtype: str) -> list[str]:
    """The kernel's body (inside ``conv2d(x, w, out, KC, HB, WC, CB)``; WC and CB are unused)."""
    kt, tt = config["tile_k"][-1], config["tile_w"][-1]
    half = f"np.{dtype}(0.5)"
    lines = [
        f"P, Q = (OH + 1) // 2, (OW + 1) // 2  # 2x2 output tiles per column and row",
        "PANELS = (Q + TT - 1) // TT  # panels of TT tiles per tile row",
        "NB = N * P * PANELS",
        "KB = (K + KT - 1) // KT",
        "CP = C + 1  # a spare channel row (see the module docstring)",
    ]
    lines += _pad(g, lay)
    lines += _input_transform()
    lines += _weight_transform(lay, half)
    lines += _gemm_and_output(lay, config, kt, tt)
    return lines


def _pad(g: ConvGeometry, lay: Layout) -> list[str]:
    """xp in NCHW, 2P+2 rows and whole panels of columns (a 3x3 unit-stride output needs the padded
    input's H + 2PH = OH + 2 rows and W + 2PW columns: never more)."""
    size = "2 * P + 2, 2 * PANELS * TT + 2"
    if lay.nchw:
        return pad_input(g, lay, "prange", True, size)
    # NHWC: transposed a row at a time, 16 channels at a time (contiguous reads, and 16 rows of xp
    # written in step)
    return [
        "# zero-padded NCHW copy of the NHWC input, 2P+2 rows and whole panels of columns",
        f"HP, WP = {size}",
        "xp = np.empty((N, C, HP, WP), dtype=x.dtype)",
        "for ni in prange(N * HP):",
        "    n, i = ni // HP, ni % HP",
        "    ih = i - PH",
        "    if ih < 0 or ih >= H:",
        "        for c in range(C):",
        "            for j in range(WP):",
        "                xp[n, c, i, j] = 0",
        "    else:",
        "        for c in range(C):  # the columns left and right of the input",
        "            for j in range(PW):",
        "                xp[n, c, i, j] = 0",
        "            for j in range(PW + W, WP):",
        "                xp[n, c, i, j] = 0",
        "        for c0 in range(0, C, 16):",
        "            for j in range(W):",
        "                for c in range(c0, min(C, c0 + 16)):",
        "                    xp[n, c, i, PW + j] = x[n, ih, j, c]",
    ]


def _input_transform() -> list[str]:
    lines = [
        "# [input] V = B^T d B for every tile and input channel, TT tiles of a tile row per panel",
        "V = np.empty((NB, 16, CP, TT), dtype=x.dtype)",
        "for tb in prange(NB):",
        "    n, p, panel = tb // (P * PANELS), tb // PANELS % P, tb % PANELS",
        "    un, utb = np.uint64(n), np.uint64(tb)",
        "    r0, col0 = np.uint64(2 * p), np.uint64(2 * panel * TT)",
        "    for c in range(C):",
        "        uc = np.uint64(c)",
        "        for j in range(V.shape[3]):  # a runtime bound: vectorised over j (interleaved loads)",
        "            cj = col0 + np.uint64(2 * j)",
    ]
    body = []
    for jj in range(4):
        for i in range(4):
            body.append(f"d{i}{jj} = xp[un, uc, r0 + np.uint64({i}), cj + np.uint64({jj})]")
    for jj in range(4):  # B^T d: rows
        body += [f"t0{jj} = d0{jj} - d2{jj}", f"t1{jj} = d1{jj} + d2{jj}",
                 f"t2{jj} = d2{jj} - d1{jj}", f"t3{jj} = d1{jj} - d3{jj}"]
    for i in range(4):  # (B^T d) B: columns
        body += [f"V[utb, {4 * i}, uc, j] = t{i}0 - t{i}2", f"V[utb, {4 * i + 1}, uc, j] = t{i}1 + t{i}2",
                 f"V[utb, {4 * i + 2}, uc, j] = t{i}2 - t{i}1", f"V[utb, {4 * i + 3}, uc, j] = t{i}1 - t{i}3"]
    return lines + indent(body, 12)


def _weight_transform(lay: Layout, half: str) -> list[str]:
    lines = [
        "# [weight] U = G g G^T, KT output channels contiguous, zero past K",
        "U = np.empty((KB, 16, CP, KT), dtype=x.dtype)",
        "for item in prange(KB * C):",
        "    kb, c = item // C, item % C",
        "    ukb, uc = np.uint64(kb), np.uint64(c)",
        "    for kk in range(KT):",
        "        k = np.uint64(min(kb * KT + kk, K - 1))  # past K: the last filter, zeroed below",
        "        ukk = np.uint64(kk)",
    ]
    body = [f"g{r}{s} = {lay.w('k', 'uc', f'np.uint64({r})', f'np.uint64({s})')}"
            for r in range(3) for s in range(3)]
    for s in range(3):  # G g: rows
        body += [f"h0{s} = g0{s}", f"h1{s} = HALF * (g0{s} + g1{s} + g2{s})",
                 f"h2{s} = HALF * (g0{s} - g1{s} + g2{s})", f"h3{s} = g2{s}"]
    for i in range(4):  # (G g) G^T: columns
        body += [f"U[ukb, {4 * i}, uc, ukk] = h{i}0",
                 f"U[ukb, {4 * i + 1}, uc, ukk] = HALF * (h{i}0 + h{i}1 + h{i}2)",
                 f"U[ukb, {4 * i + 2}, uc, ukk] = HALF * (h{i}0 - h{i}1 + h{i}2)",
                 f"U[ukb, {4 * i + 3}, uc, ukk] = h{i}2"]
    lines = [f"HALF = {half}"] + lines + indent(body, 8)
    lines += [
        "    for kk in range(K - kb * KT, KT):",
        "        for xi in range(16):",
        "            U[ukb, xi, uc, kk] = 0",
    ]
    return lines


def _gemm_and_output(lay: Layout, config: Config, kt: int, tt: int) -> list[str]:
    lines = [
        "# work items: (output-channel block, block of tile rows with all their panels)",
        "KC = max(KT, KC - KC % KT)",
        "rows_per_item = max(1, HB // 2)",
        "k_blocks = (K + KC - 1) // KC",
        "row_blocks = (N * P + rows_per_item - 1) // rows_per_item",
        "# the 16 products of every KT-channel tile and panel (items write disjoint parts)",
        "M = np.empty((KB, NB, 16, TT, KT), dtype=x.dtype)",
        "for item in prange(k_blocks * row_blocks):",
        "    k_blk, r_blk = item // row_blocks, item % row_blocks",
        "    k_lo, k_hi = k_blk * KC, min(K, k_blk * KC + KC)",
        "    tb_lo, tb_hi = r_blk * rows_per_item * PANELS, min(NB, (r_blk + 1) * rows_per_item * PANELS)",
        f"    acc = stack_array({tt * kt}, out.dtype)  # the register tile: {tt} x {kt}",
        f"    y = stack_array({4 * kt}, out.dtype)  # one tile's 2x2 outputs, KT channels",
    ]
    update = ["uc = np.uint64(c)", "for kk in range(KT):", "    u = U[ukb, uxi, uc, kk]"]
    update += [f"    acc[{j * kt} + kk] += V[utb, uxi, uc, {j}] * u" for j in range(tt)]
    # one GEMM's register tile: U[k0 tile, xi] (C x KT) stays in L1 while the item's panels pass
    gemm_tile = ["utb = np.uint64(tb)", "for kk in range(KT):"] + [f"    acc[{j * kt} + kk] = 0" for j in range(tt)]
    gemm_tile += unrolled_loop("c", "0", "C", config["unroll_c"], update)
    gemm_tile += ["for kk in range(KT):"]
    gemm_tile += [f"    M[ukb, utb, uxi, {j}, kk] = acc[{j * kt} + kk]" for j in range(tt)]

    def m(xi: int) -> str:
        return f"M[ukb, utb, {xi}, j, kk]"

    output = [
        "utb = np.uint64(tb)",
        "n, p, panel = tb // (P * PANELS), tb // PANELS % P, tb % PANELS",
        "un, uoh = np.uint64(n), np.uint64(2 * p)",
        "rows = min(2, OH - 2 * p)",
        "k_last = min(KT, k_hi - k0)",
        "for j in range(min(TT, Q - panel * TT)):  # A^T m A for each tile of the panel",
        "    ow = 2 * (panel * TT + j)",
        "    uow = np.uint64(ow)",
        "    for kk in range(KT):",
    ]
    transform = []
    for b in range(4):
        transform += [f"s0{b} = {m(b)} + {m(4 + b)} + {m(8 + b)}", f"s1{b} = {m(4 + b)} - {m(8 + b)} - {m(12 + b)}"]
    transform += [f"y[kk] = s00 + s01 + s02", f"y[{kt} + kk] = s01 - s02 - s03",
                  f"y[{2 * kt} + kk] = s10 + s11 + s12", f"y[{3 * kt} + kk] = s11 - s12 - s13"]
    output += indent(transform, 8)

    def target(i: int | str, jj: int | str) -> str:
        row = "uoh" if i == 0 else f"uoh + np.uint64({i})"
        col = "uow" if jj == 0 else f"uow + np.uint64({jj})"
        return lay.out("un", "np.uint64(k0 + kk)", row, col)

    output += [
        "    if rows == 2 and ow + 1 < OW:",
        "        for kk in range(k_last):",
    ] + [f"            {target(i, jj)} = y[{(2 * i + jj) * kt} + kk]" for i in range(2) for jj in range(2)]
    output += [
        "    else:  # the last row or column of an odd-sized output",
        "        for kk in range(k_last):",
        "            for i in range(rows):",
        "                for jj in range(min(2, OW - ow)):",
        f"                    {target('i', 'jj')} = y[(2 * i + jj) * {kt} + kk]",
    ]
    xi_loop = ["for xi in range(V.shape[1]):  # a runtime bound: the 16 GEMMs stay a loop", "    uxi = np.uint64(xi)"]
    k_loop = ["for k0 in range(k_lo, k_hi, KT):", "    ukb = np.uint64(k0 // KT)"]
    t_loop = ["for tb in range(tb_lo, tb_hi):"]
    if config["loop_order"] == "k_outer":  # each channel tile: its 16 GEMMs, then its outputs
        nest = (k_loop + indent(xi_loop + indent(t_loop + indent(gemm_tile, 4), 4), 4)
                + indent(t_loop + indent(output, 4), 4))
    else:  # each GEMM over all the item's channel tiles, then all outputs
        nest = (xi_loop + indent(k_loop + indent(t_loop + indent(gemm_tile, 4), 4), 4)
                + k_loop + indent(t_loop + indent(output, 4), 4))
    return lines + indent(nest, 4)
