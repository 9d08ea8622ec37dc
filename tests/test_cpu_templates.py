"""The CPU operator templates (conv2d NCHW/NHWC, depthwise NCHW/NHWC, matmul, dense, batch_matmul).

Every valid config must compute the operator's numpy reference for any sizes: random configs of
each template on random small shapes (remainders everywhere, stride 2, padding, dilation, batch 2,
channel multipliers, both dtypes), checked with the engine's own rigorous error bound. Each
distinct kernel costs a numba compile (2-8 s), so the property tests take few examples, mostly
serial configs (their wrapper is the only difference), and share the session's kernel cache; a
few hand-picked configs make sure the rarer knob values (the other vector axis, padded copies,
reduction blocking, unrolling, parallel) are compiled at least once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from measure_agent.device import DeviceInfo, detect_device
from measure_agent.engine.build import kernel_assembly
from measure_agent.space import Config, ConfigSpace
from measure_agent.templates.base import Template
from measure_agent.templates.catalog import default_catalog
from measure_agent.templates.cpu import cpu_templates
from measure_agent.templates.cpu._common import vector_target
from measure_agent.workload import Workload, WorkloadError, make_workload, parse_workload

from kernel_checks import check_kernel, count_instructions

TEMPLATES = {t.op: t for t in cpu_templates()}
CONV_OPS = ("conv2d_nchw", "conv2d_nhwc")
DEPTHWISE_OPS = ("depthwise_conv2d_nchw", "depthwise_conv2d_nhwc")

AVX2 = DeviceInfo("x86_64", "AMD EPYC 7B13", 2, ("sse4_2", "avx", "avx2", "fma"))
AVX512 = DeviceInfo("x86_64", "Intel Xeon", 8, ("sse4_2", "avx", "avx2", "fma", "avx512f"))
NEON = DeviceInfo("aarch64", "ARM Cortex-A72", 4, ("neon", "asimd"))


def check(workload: Workload, config: Config, cache_dir) -> None:
    """Compile the config's kernel (into the session cache) and compare it with the reference."""
    check_kernel(TEMPLATES[workload.op], workload, config, cache_dir)


def serial(space: ConfigSpace, config: Config) -> Config:
    """The same config with ``parallel=False`` (run on one thread: steadier on a busy CI host)."""
    return space.make({**config.as_dict(), "parallel": False})


def with_choices(workload: Workload, device: DeviceInfo | None = None, **choices) -> Config:
    """The default config of ``workload`` (on ``device``) with ``choices``; a split given as its
    inner factors (``(tiles, tile)``) takes the split knob's value that ends with them."""
    template = TEMPLATES[workload.op]
    space = template.space(workload, device)
    values = template.default_config(workload, space).as_dict()
    for name, value in choices.items():
        if isinstance(value, tuple):
            matches = [v for v in space.knob(name).values if v[-len(value):] == value]
            assert matches, f"{name} has no split ending in {value}"
            value = matches[0]
        values[name] = value
    return space.make(values)


# -- random small workloads ----------------------------------------------------------------------

DTYPES = st.sampled_from(["float32", "float64"])


@st.composite
def conv_workloads(draw, op: str) -> Workload:
    args = {
        "N": draw(st.integers(1, 2)),
        "C": draw(st.integers(1, 7)),
        "H": draw(st.integers(1, 11)),
        "W": draw(st.integers(1, 13)),
        "R": draw(st.integers(1, 3)),
        "S": draw(st.integers(1, 3)),
        "stride_h": draw(st.integers(1, 2)),
        "stride_w": draw(st.integers(1, 2)),
        "pad_h": draw(st.integers(0, 2)),
        "pad_w": draw(st.integers(0, 2)),
        "dilation_h": draw(st.sampled_from([1, 1, 2])),
        "dilation_w": draw(st.sampled_from([1, 1, 2])),
        "dtype": draw(DTYPES),
    }
    if op in CONV_OPS:
        args["K"] = draw(st.integers(1, 37))
    else:
        args["multiplier"] = draw(st.sampled_from([1, 1, 2, 3]))
    try:
        return make_workload(op, args)
    except WorkloadError:  # the window does not fit the padded input
        assume(False)
        raise


@st.composite
def gemm_workloads(draw, op: str) -> Workload:
    args = {"M": draw(st.integers(1, 30)), "N": draw(st.integers(1, 45)), "K": draw(st.integers(1, 45)),
            "dtype": draw(DTYPES)}
    if op == "batch_matmul":
        args["B"] = draw(st.integers(1, 3))
    return make_workload(op, args)


def workloads(op: str):
    return conv_workloads(op) if op in CONV_OPS + DEPTHWISE_OPS else gemm_workloads(op)


# -- every valid config computes the reference ---------------------------------------------------


@pytest.mark.parametrize("op", sorted(TEMPLATES))
def test_random_serial_configs_compute_the_reference(kernel_cache_dir, op):
    @settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.filter_too_much])
    @given(workload=workloads(op), seed=st.integers(0, 2**32 - 1))
    def run(workload, seed):
        space = TEMPLATES[op].space(workload)
        config = serial(space, space.sample(np.random.default_rng(seed))[0])
        check(workload, config, kernel_cache_dir)

    run()


# One parallel config per template, and hand-picked serial ones for the knob values that random
# sampling with few examples may miss. Shapes have remainders in every tiled axis.
HAND_PICKED = [
    # conv: vectorised over output channels, parallel, reduction blocks, unrolled
    ("conv2d_nchw(N=2,C=9,H=9,W=11,K=19,R=3,S=3,stride=2,pad=1)",
     dict(vector_axis="k", tile_k=(1, 8), tile_w=(2, 3), tile_h=(2,), tile_c=8, unroll_c=2, parallel=True)),
    # conv: vectorised over output columns, weights in place, taps outer, spatial-outer order
    ("conv2d_nchw(N=1,C=3,H=8,W=13,K=7,R=2,S=3,pad_h=2,pad_w=1,dilation_w=2,dtype=float64)",
     dict(vector_axis="w", tile_k=(1, 3), tile_w=(2, 4), reduction_order="taps_outer",
          loop_order="spatial_outer", pack_weights=False, parallel=False)),
    # conv NHWC: pointwise (one long row per image), unpacked weights vectorised over K
    ("conv2d_nhwc(N=2,C=6,H=5,W=7,K=21,R=1,S=1)",
     dict(vector_axis="k", tile_k=(1, 8), tile_w=(4, 5), pack_weights=False, unroll_c=4, parallel=True)),
    # conv Winograd F(2x2, 3x3): odd output sizes (partial tiles and panels), K remainders, batch 2,
    # unrolled channels, spatial-outer order, parallel; NHWC float64 without padding; asymmetric pads
    ("conv2d_nchw(N=2,C=5,H=9,W=11,K=19,R=3,S=3,pad=1)",
     dict(algorithm="winograd", tile_k=(1, 8), tile_w=(1, 3), tile_h=(4,), unroll_c=2, loop_order="spatial_outer",
          parallel=True)),
    ("conv2d_nhwc(N=1,C=7,H=8,W=13,K=33,R=3,S=3,dtype=float64)",
     dict(algorithm="winograd", tile_k=(2, 8), tile_w=(1, 4), tile_h=(2,), reduction_order="c_outer",
          parallel=False)),
    ("conv2d_nhwc(N=2,C=3,H=6,W=5,K=5,R=3,S=3,pad_h=2,pad_w=0)",
     dict(algorithm="winograd", tile_k=(1, 5), tile_w=(1, 2), tile_h=(1,), reduction_order="c_outer",
          parallel=True)),
    # depthwise: both vector axes, multipliers, direct borders and padded copies
    ("depthwise_conv2d_nchw(N=2,C=5,H=12,W=19,R=3,S=3,pad=1,multiplier=2)",
     dict(vector_axis="w", tile_c=(1, 3), tile_w=(2, 8), tile_h=(4,), unroll_r=2, parallel=True)),
    ("depthwise_conv2d_nchw(N=1,C=6,H=7,W=8,R=3,S=2,stride=2,pad=2,dilation_h=2,dtype=float64)",
     dict(vector_axis="c", tile_c=(1, 4), tile_w=(1, 2), border="padded_copy", loop_order="rows_outer",
          parallel=False)),
    ("depthwise_conv2d_nhwc(N=2,C=11,H=9,W=10,R=3,S=3,stride=2,pad=1,multiplier=3)",
     dict(vector_axis="c", tile_c=(2, 8), tile_w=(1, 3), tile_h=(2,), parallel=True)),
    # dense: reduction-vectorised (two vectors of lanes, K blocked, unrolled) and column-vectorised
    ("dense(M=3,N=29,K=43)",
     dict(vector_axis="k", tile_m=(1, 2), tile_n=(2, 3), kc=16, k_lanes=16, unroll_k=2, parallel=True)),
    # dense GEMV (batch 1): 6 rows of W per tile sharing the loads of x, two vectors of lanes, a
    # partial last tile and a K remainder, parallel
    ("dense(M=1,N=37,K=75)",
     dict(vector_axis="k", tile_m=(1, 1), tile_n=(2, 6), kc=75, k_lanes=16, parallel=True)),
    ("dense(M=13,N=21,K=19,dtype=float64)",
     dict(vector_axis="n", tile_m=(2, 4), tile_n=(1, 8), kc=16, pack_a=True, loop_order="m_outer",
          unroll_k=4, parallel=False)),
    # batch_matmul: unpacked B, packed A, K blocked, parallel
    ("batch_matmul(B=3,M=11,N=37,K=21)",
     dict(tile_m=(2, 3), tile_n=(1, 16), kc=16, pack_a=True, pack_b=False, unroll_k=2, parallel=True)),
    # matmul (more in test_matmul_cpu_template.py): packed B blocks, packed A, K blocked, parallel
    ("matmul(M=13,N=37,K=29)",
     dict(tile_m=(2, 4), tile_n=(1, 16), kc=16, pack_a=True, pack_b=True, unroll_k=4, loop_order="m_outer",
          parallel=True)),
]


@pytest.mark.parametrize("workload_text, choices", HAND_PICKED,
                         ids=[f"{i}-{w.split('(')[0]}" for i, (w, _) in enumerate(HAND_PICKED)])
def test_hand_picked_configs_compute_the_reference(kernel_cache_dir, workload_text, choices):
    workload = parse_workload(workload_text)
    check(workload, with_choices(workload, **choices), kernel_cache_dir)


def test_hand_picked_configs_cover_the_rarer_knob_values():
    """With the serial random configs of the property tests, every template runs in parallel, and
    both vector axes, both border modes and packing on and off are compiled."""
    picked: dict[str, list[Config]] = {}
    for text, choices in HAND_PICKED:
        workload = parse_workload(text)
        picked.setdefault(workload.op, []).append(with_choices(workload, **choices))
    assert set(picked) == set(TEMPLATES)
    assert all(any(c["parallel"] for c in configs) for configs in picked.values())
    for op in ("conv2d_nchw", "depthwise_conv2d_nchw", "dense"):
        assert len({c["vector_axis"] for c in picked[op]}) == 2, op
    assert {c["border"] for op in DEPTHWISE_OPS for c in picked[op]} == {"direct", "padded_copy"}
    assert {c["pack_weights"] for op in CONV_OPS for c in picked[op]} == {False, True}
    assert all({c["algorithm"] for c in picked[op]} == {"direct", "winograd"} for op in CONV_OPS)


def test_cache_blocks_are_runtime_arguments(kernel_cache_dir):
    """Configs differing only in cache blocks render one kernel text; every blocking is correct."""
    workload = parse_workload("conv2d_nchw(N=1,C=9,H=6,W=14,K=20,R=3,S=3,pad=1)")
    blockings = [dict(tile_k=(1, 8), tile_w=(1, 4), tile_h=(1,), tile_c=8),
                 dict(tile_k=(2, 8), tile_w=(2, 4), tile_h=(4,), tile_c=9)]
    configs = [with_choices(workload, vector_axis="k", parallel=False, **b) for b in blockings]
    sources = [TEMPLATES[workload.op].render(workload, c) for c in configs]
    assert len({s.text for s in sources}) == 1
    assert len({s.runtime_args for s in sources}) == 2
    for config in configs:
        check(workload, config, kernel_cache_dir)


def test_winograd_is_offered_only_where_it_computes_the_convolution_and_fixes_the_unused_knobs():
    for text, offered in (("conv2d_nchw(N=1,C=8,H=9,W=9,K=8,R=3,S=3,pad=1)", True),
                          ("conv2d_nhwc(N=1,C=8,H=9,W=9,K=8,R=3,S=3)", True),
                          ("conv2d_nchw(N=1,C=8,H=9,W=9,K=8,R=3,S=3,stride=2)", False),
                          ("conv2d_nchw(N=1,C=8,H=9,W=9,K=8,R=3,S=3,dilation_w=2)", False),
                          ("conv2d_nchw(N=1,C=8,H=9,W=9,K=8,R=1,S=1)", False),
                          ("conv2d_nchw(N=1,C=8,H=9,W=9,K=8,R=3,S=2)", False)):
        workload = parse_workload(text)
        space = TEMPLATES[workload.op].space(workload, AVX512)
        assert ("winograd" in space.knob("algorithm").values) == offered, text
    workload = parse_workload("conv2d_nchw(N=1,C=8,H=9,W=9,K=8,R=3,S=3,pad=1)")
    space = TEMPLATES[workload.op].space(workload, AVX512)
    winograd = [c for c in space.sample(np.random.default_rng(0), 300) if c["algorithm"] == "winograd"]
    assert winograd
    for config in winograd:
        assert (config["vector_axis"], config["tile_w"][1], config["tile_c"], config["reduction_order"],
                config["pack_weights"]) == ("k", 1, 8, "c_outer", True)


def test_winograd_cache_blocks_are_runtime_arguments(kernel_cache_dir):
    workload = parse_workload("conv2d_nchw(N=1,C=6,H=10,W=9,K=20,R=3,S=3,pad=1)")
    configs = [with_choices(workload, algorithm="winograd", tile_k=blocks, tile_w=(1, 4), tile_h=rows,
                            parallel=False)
               for blocks, rows in (((1, 8), (2,)), ((2, 8), (8,)))]
    sources = [TEMPLATES[workload.op].render(workload, c) for c in configs]
    assert len({s.text for s in sources}) == 1 and len({s.runtime_args for s in sources}) == 2
    assert "Winograd" in sources[0].text
    for config in configs:
        check(workload, config, kernel_cache_dir)


# -- spaces and defaults -------------------------------------------------------------------------

# The benchmark's layers (bench/ops_cpu.py) and awkward small ones.
DEFAULT_WORKLOADS = [
    "conv2d_nchw(N=1,C=256,H=56,W=56,K=64,R=1,S=1)",
    "conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)",
    "conv2d_nhwc(N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1)",
    "conv2d_nchw(N=1,C=2048,H=7,W=7,K=512,R=1,S=1)",
    "conv2d_nchw(N=2,C=3,H=5,W=4,K=2,R=3,S=3,stride=2,pad=2,dtype=float64)",
    "depthwise_conv2d_nchw(N=1,C=32,H=112,W=112,R=3,S=3,pad=1)",
    "depthwise_conv2d_nhwc(N=1,C=144,H=56,W=56,R=3,S=3,stride=2,pad=1)",
    "depthwise_conv2d_nchw(N=1,C=960,H=7,W=7,R=3,S=3,pad=1)",
    "depthwise_conv2d_nhwc(N=1,C=1,H=2,W=3,R=1,S=1,multiplier=3,dtype=float64)",
    "dense(M=1,N=1000,K=2048)",
    "dense(M=64,N=3,K=1,dtype=float64)",
    "batch_matmul(B=12,M=128,N=128,K=64)",
    "batch_matmul(B=1,M=1,N=1,K=1)",
    "matmul(M=512,N=512,K=512)",
    "matmul(M=1,N=1,K=1,dtype=float64)",
]


@pytest.mark.parametrize("text", DEFAULT_WORKLOADS)
def test_default_config_is_valid_and_explicit(text):
    workload = parse_workload(text)
    template = TEMPLATES[workload.op]
    for device in (None, AVX2, AVX512, NEON):
        space = template.space(workload, device)
        config = template.default_config(workload, space)
        assert space.is_valid(config)
        assert config == template.default_config(workload, template.space(workload, device))  # deterministic


def test_defaults_follow_the_measured_schedules():
    conv = parse_workload("conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=2,pad=1)")
    config = TEMPLATES["conv2d_nchw"].default_config(conv, TEMPLATES["conv2d_nchw"].space(conv, AVX2))
    assert config["algorithm"] == "direct"  # Winograd needs unit stride
    assert config["vector_axis"] == "k" and config["pack_weights"] and config["parallel"]
    # a 3-tap filter row of at most 16 broadcasts (5 columns): 4 fit 28 columns exactly
    assert (config["tile_k"][-1], config["tile_w"][-1]) == (16, 4)
    assert config["tile_c"] == 64  # no reduction blocking
    for text in ("conv2d_nchw(N=1,C=128,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1)",
                 "conv2d_nchw(N=1,C=256,H=28,W=28,K=256,R=3,S=3,stride=2,pad=1)",
                 "conv2d_nchw(N=1,C=32,H=56,W=56,K=32,R=3,S=3,pad=1)"):
        workload = parse_workload(text)
        for device in (AVX2, AVX512):
            narrow = TEMPLATES["conv2d_nchw"].default_config(workload, TEMPLATES["conv2d_nchw"].space(workload, device))
            assert narrow["algorithm"] == "direct" and narrow["tile_w"][-1] * 3 <= 16, (text, device)
    # 1x1 (no row to unroll), 7-tap rows (stay a loop) and NHWC (taps outermost) keep AVX-512's wide tiles
    for text, wt in (("conv2d_nchw(N=1,C=256,H=56,W=56,K=512,R=1,S=1,stride=2)", 10),
                     ("conv2d_nchw(N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3)", 8),
                     ("conv2d_nhwc(N=1,C=128,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1)", 10)):
        workload = parse_workload(text)
        wide = TEMPLATES[workload.op].default_config(workload, TEMPLATES[workload.op].space(workload, AVX512))
        assert wide["tile_w"][-1] == wt, text
    for text, tiles in (("conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)", (32, 8)),
                        ("conv2d_nhwc(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)", (32, 8)),
                        ("conv2d_nchw(N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1)", (32, 8)),
                        ("conv2d_nchw(N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1)", (32, 8))):
        workload = parse_workload(text)
        config = TEMPLATES[workload.op].default_config(workload, TEMPLATES[workload.op].space(workload, AVX512))
        assert config["algorithm"] == "winograd" and (config["tile_k"][-1], config["tile_w"][-1]) == tiles
        kc = config["tile_k"][1] * config["tile_k"][2]
        assert 16 * workload.params["C"] * kc * 4 <= 512 * 1024 or kc == 32  # transformed weights of an item
    # AVX2: Winograd tiles of at most 10 accumulators (2 vectors x 6 tiles ran at half the speed of
    # x 4 or x 5 on Zen 3), the one that wastes least at the row's end
    for text, tiles in (("conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)", (16, 4)),
                        ("conv2d_nhwc(N=1,C=96,H=56,W=56,K=96,R=3,S=3,pad=1)", (16, 4)),
                        ("conv2d_nchw(N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1)", (16, 5)),
                        ("conv2d_nchw(N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1)", (16, 4))):
        workload = parse_workload(text)
        config = TEMPLATES[workload.op].default_config(workload, TEMPLATES[workload.op].space(workload, AVX2))
        assert config["algorithm"] == "winograd" and (config["tile_k"][-1], config["tile_w"][-1]) == tiles
    for text in ("conv2d_nchw(N=1,C=32,H=56,W=56,K=256,R=3,S=3,pad=1)",  # too few input channels
                 "conv2d_nhwc(N=1,C=64,H=56,W=56,K=64,R=3,S=3,dilation=2,pad=2)"):
        workload = parse_workload(text)
        template = TEMPLATES[workload.op]
        assert template.default_config(workload, template.space(workload, AVX2))["algorithm"] == "direct"
    pointwise = parse_workload("conv2d_nchw(N=1,C=256,H=56,W=56,K=64,R=1,S=1)")
    space = TEMPLATES["conv2d_nchw"].space(pointwise)
    assert space.knob("tile_h").extent == 1 and space.knob("tile_w").extent == 56 * 56  # one long row
    depthwise = parse_workload("depthwise_conv2d_nchw(N=1,C=32,H=112,W=112,R=3,S=3,pad=1)")
    config = TEMPLATES[depthwise.op].default_config(depthwise, TEMPLATES[depthwise.op].space(depthwise))
    assert config["vector_axis"] == "rows" and config["tile_h"][1] == 4  # chunks of rows (ROWS_AXIS)
    depthwise = parse_workload("depthwise_conv2d_nhwc(N=1,C=960,H=7,W=7,R=3,S=3,pad=1)")
    config = TEMPLATES[depthwise.op].default_config(depthwise, TEMPLATES[depthwise.op].space(depthwise))
    # a small plane: channel tiles of four vectors, two columns wide (8 lanes without a device)
    assert config["vector_axis"] == "c" and (config["tile_c"][-1], config["tile_w"][-1]) == (32, 2)
    wider = parse_workload("depthwise_conv2d_nhwc(N=1,C=96,H=112,W=112,R=3,S=3,stride=2,pad=1)")
    config = TEMPLATES[wider.op].default_config(wider, TEMPLATES[wider.op].space(wider))
    assert config["vector_axis"] == "c" and config["tile_c"] == (6, 1, 16)  # two vectors, one per work item
    for text, device, tile in (("C=128,H=56,W=56,K=128", AVX512, 64), ("C=128,H=56,W=56,K=128", AVX2, 16),
                               ("C=512,H=14,W=14,K=512", AVX512, 32)):
        # 3x3 NCHW rows cap the columns at 5 broadcasts x 3 taps: 32 registers take more channel
        # vectors instead, where the plane has outputs enough
        layer = parse_workload(f"conv2d_nchw(N=1,{text},R=3,S=3,stride=2,pad=1)")
        config = TEMPLATES[layer.op].default_config(layer, TEMPLATES[layer.op].space(layer, device))
        assert config["algorithm"] == "direct" and config["tile_k"][-1] == tile, (text, device.isa_features)
    for channels, tile in ((144, 16), (72, 32), (960 * 2, 32)):  # AVX-512: 16 lanes
        # one vector where two would leave a partial last channel tile and one does not
        layer = parse_workload(f"depthwise_conv2d_nhwc(N=1,C={channels},H=56,W=56,R=3,S=3,pad=1)")
        config = TEMPLATES[layer.op].default_config(layer, TEMPLATES[layer.op].space(layer, AVX512))
        assert config["tile_c"][-1] == tile, channels
    gemv = parse_workload("dense(M=1,N=1000,K=2048)")
    config = TEMPLATES["dense"].default_config(gemv, TEMPLATES["dense"].space(gemv))
    assert config["vector_axis"] == "k"  # W read once, in place
    for text in ("dense(M=1,N=1000,K=1280)", "dense(M=1,N=256,K=512)"):  # 2.6 and 0.26 MFLOP
        gemv = parse_workload(text)  # streams W: parallel well below the GEMMs' 4 MFLOP
        assert TEMPLATES["dense"].default_config(gemv, TEMPLATES["dense"].space(gemv))["parallel"]
    tiny = parse_workload("dense(M=1,N=64,K=256)")
    assert not TEMPLATES["dense"].default_config(tiny, TEMPLATES["dense"].space(tiny))["parallel"]
    small_gemm = parse_workload("dense(M=128,N=64,K=64)")  # 1 MFLOP of packed GEMM: serial
    assert not TEMPLATES["dense"].default_config(small_gemm, TEMPLATES["dense"].space(small_gemm))["parallel"]


@pytest.mark.parametrize("op", sorted(TEMPLATES))
def test_register_tiles_fit_and_vector_tiles_are_whole_vectors(op):
    text = {"conv2d_nchw": "conv2d_nchw(N=1,C=8,H=20,W=70,K=96,R=3,S=3)",  # axes wider than 4 vectors
            "conv2d_nhwc": "conv2d_nhwc(N=1,C=8,H=20,W=70,K=96,R=3,S=3)",
            "depthwise_conv2d_nchw": "depthwise_conv2d_nchw(N=1,C=96,H=20,W=70,R=3,S=3)",
            "depthwise_conv2d_nhwc": "depthwise_conv2d_nhwc(N=1,C=96,H=20,W=70,R=3,S=3)",
            "dense": "dense(M=40,N=96,K=40)",
            "batch_matmul": "batch_matmul(B=2,M=40,N=96,K=40)",
            "matmul": "matmul(M=40,N=96,K=40)"}[op]
    workload = parse_workload(text)
    axes = {"conv2d_nchw": ("tile_k", "tile_w"), "conv2d_nhwc": ("tile_k", "tile_w"),
            "depthwise_conv2d_nchw": ("tile_c", "tile_w"), "depthwise_conv2d_nhwc": ("tile_c", "tile_w"),
            "dense": ("tile_n", "tile_m"), "batch_matmul": ("tile_n", "tile_m"), "matmul": ("tile_n", "tile_m")}[op]
    for device, lanes, budget in ((AVX2, 8, 12), (AVX512, 16, 24), (NEON, 4, 24)):
        space = TEMPLATES[op].space(workload, device)
        for config in space.sample(np.random.default_rng(0), 200):
            axis = config.get("vector_axis", "n")
            if op == "dense" and axis == "k":
                assert config["tile_m"][-1] * config["tile_n"][-1] * config["k_lanes"] // lanes <= budget
                continue
            first, second = (config[a][-1] for a in axes)
            channel_axis = axis in ("k", "c", "n")
            vector, broadcast = (first, second) if channel_axis else (second, first)
            assert vector % (lanes // 2) == 0, config  # half a vector or whole vectors (axes are wide)
            assert broadcast * -(-vector // lanes) <= budget, config


def test_space_adapts_to_the_device_isa():
    workload = parse_workload("conv2d_nchw(N=1,C=64,H=56,W=56,K=128,R=3,S=3,pad=1)")
    template = TEMPLATES["conv2d_nchw"]

    def vector_tiles(device):
        space = template.space(workload, device)
        return {c["tile_k"][-1] for c in space.sample(np.random.default_rng(1), 2000) if c["vector_axis"] == "k"}

    avx2, avx512, neon = vector_tiles(AVX2), vector_tiles(AVX512), vector_tiles(NEON)
    assert max(avx2) == 32 and max(avx512) == 64 and max(neon) == 16  # up to four vectors
    assert 48 in avx512 and 48 not in avx2 and 12 in neon and 12 not in avx2
    assert template.space(workload).size == template.space(workload, AVX2).size  # no device: AVX2-like
    # the default's tile follows the vector width: two vectors of channels
    assert template.default_config(workload, template.space(workload, AVX512))["tile_k"][-1] == 32
    assert template.default_config(workload, template.space(workload, NEON))["tile_k"][-1] == 8
    # dense offers one or two vectors of reduction lanes
    dense = parse_workload("dense(M=1,N=1000,K=2048)")
    assert TEMPLATES["dense"].space(dense, AVX512).knob("k_lanes").values == (16, 32)
    assert TEMPLATES["dense"].space(dense, AVX2).knob("k_lanes").values == (8, 16)
    assert vector_target(AVX512).lanes("float64") == 8
    # the catalog passes the device through
    catalog_space = default_catalog().space(workload, "cpu", AVX512)
    assert catalog_space.knob("tile_k").values == template.space(workload, AVX512).knob("tile_k").values


def test_tiles_never_exceed_narrow_axes_and_small_spaces_are_not_empty():
    for text in ("conv2d_nchw(N=1,C=1,H=1,W=1,K=1,R=1,S=1)", "conv2d_nhwc(N=1,C=2,H=3,W=3,K=3,R=3,S=3)",
                 "depthwise_conv2d_nchw(N=1,C=1,H=1,W=2,R=1,S=2)", "dense(M=1,N=1,K=1)",
                 "batch_matmul(B=1,M=1,N=2,K=1,dtype=float64)"):
        workload = parse_workload(text)
        space = TEMPLATES[workload.op].space(workload)
        assert space.size > 0
        for config in space.sample(np.random.default_rng(0), 50):
            for name in ("tile_k", "tile_c", "tile_w", "tile_n", "tile_m"):
                if name in space.knob_names and isinstance(config[name], tuple):
                    assert config[name][-1] <= max(space.knob(name).extent, 1), (text, config)


# -- rendering -----------------------------------------------------------------------------------


REGISTER_TILES = {
    "conv2d_nchw": {"tile_k": "KT", "tile_w": "WT"},
    "conv2d_nhwc": {"tile_k": "KT", "tile_w": "WT"},
    "depthwise_conv2d_nchw": {"tile_c": "OT", "tile_w": "WT"},
    "depthwise_conv2d_nhwc": {"tile_c": "OT", "tile_w": "WT"},
    "dense": {"tile_m": "MR", "tile_n": "NR"},
    "batch_matmul": {"tile_m": "MR", "tile_n": "NR"},
}


@pytest.mark.parametrize("text", DEFAULT_WORKLOADS[:4] + DEFAULT_WORKLOADS[5:8] + DEFAULT_WORKLOADS[9:12])
def test_rendered_kernel_is_readable_and_names_workload_and_config(text):
    workload = parse_workload(text)
    template = TEMPLATES[workload.op]
    space = template.space(workload)
    config = space.sample(np.random.default_rng(7))[0]
    source = template.render(workload, config)
    header = "\n".join(line for line in source.text.splitlines() if line.startswith("#"))
    assert f"tunefleet {workload.op}_cpu v{template.version}" in header
    assert workload.key in header
    for name, value in config.items:
        if name in REGISTER_TILES[workload.op]:  # a cache block (runtime) and a register tile (constant)
            assert f"\n{REGISTER_TILES[workload.op][name]} = {value[-1]}  #" in source.text, name
            assert name in header
        elif name not in ("tile_c", "tile_h", "kc"):  # blocks only: runtime arguments
            assert f"{name}={value}" in header, name
    assert f"def {source.entry}(" in source.text
    assert "'reassoc'" not in source.text and "fastmath=True" not in source.text
    assert "prange(" in source.text  # the loop nest always compiles as numba parallel code ...
    assert ("set_num_threads(1)" in source.text) == (not config["parallel"])  # ... on one thread unless parallel
    assert all(isinstance(a, int) and a > 0 for a in source.runtime_args)
    imports = {line for line in source.text.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"import numpy as np", "from numba import njit, prange",
                       "from numba import get_num_threads, njit, prange, set_num_threads",
                       "from measure_agent.templates.cpu_stack import stack_array"}
    compile(source.text, "<kernel>", "exec")


def test_catalog_has_every_cpu_template():
    catalog = default_catalog()
    versions = {"conv2d_nchw": "6", "conv2d_nhwc": "6", "depthwise_conv2d_nchw": "9",
                "depthwise_conv2d_nhwc": "9", "dense": "5", "batch_matmul": "4", "matmul": "5"}
    for op, version in versions.items():
        template = catalog.get(op, "cpu")
        assert template is not None and template.target == "cpu" and template.version == version


def test_small_batches_of_a_dense_layer_default_to_reduction_tiles(kernel_cache_dir):
    """From 3 to 64 rows of X the default reads W in place with up to 4 x 4 reduction tiles (one
    thread, AVX-512: 45-82 GFLOPS where the packed column tiles ran 4-47); 256 rows stay packed."""
    for device in (None, AVX2, AVX512, NEON):
        for rows in (3, 16, 64):
            w = parse_workload(f"dense(M={rows},N=1000,K=2048)")
            space = TEMPLATES["dense"].space(w, device)
            config = TEMPLATES["dense"].default_config(w, space)
            mr, nr = config["tile_m"][-1], config["tile_n"][-1]
            assert config["vector_axis"] == "k" and mr == min(4, rows) and mr * nr <= 16
        big = parse_workload("dense(M=256,N=1000,K=2048)")
        assert TEMPLATES["dense"].default_config(big, TEMPLATES["dense"].space(big, device))["vector_axis"] == "n"
    small = parse_workload("dense(M=6,N=37,K=75)")  # partial row and column tiles, leftover lanes
    check(small, TEMPLATES["dense"].default_config(small, TEMPLATES["dense"].space(small)), kernel_cache_dir)


def test_a_narrow_b_on_avx512_gets_eight_rows_per_one_vector_tile(kernel_cache_dir):
    """A narrow B (N of 16-31 float32) gets the 8 rows of every AVX-512 default. Until the GEMM
    micro-kernel wrote its rows out (cpu/_gemm.py) 8 rows x one vector read A in place as gathers
    and defaults took 4 rows; now 8 rows run ahead (Sapphire Rapids: batch_matmul 8 x 256 x 16 x
    256 132 -> 263 GFLOPS, where 4 rows of one vector still compiled to 128/256-bit FMAs)."""
    wide = DeviceInfo("x86_64", "test", 2, ("avx2", "fma", "avx512f"))
    catalog = default_catalog()
    for text in ("matmul(M=1024,N=16,K=1024)", "matmul(M=512,N=24,K=512)", "batch_matmul(B=8,M=256,N=16,K=256)"):
        w = parse_workload(text)
        config = catalog.get(w.op, "cpu").default_config(w, catalog.space(w, "cpu", wide))
        assert (config["tile_m"][-1], config["tile_n"][-1]) == (8, 16), text
    for text in ("matmul(M=512,N=512,K=512)", "matmul(M=512,N=8,K=512)"):  # two vectors, half a vector: 8 rows
        w = parse_workload(text)
        assert catalog.get(w.op, "cpu").default_config(w, catalog.space(w, "cpu", wide))["tile_m"][-1] == 8, text
    narrow = parse_workload("matmul(M=37,N=16,K=29)")
    check(narrow, catalog.get("matmul", "cpu").default_config(narrow, catalog.space(narrow, "cpu", wide)),
          kernel_cache_dir)


def test_avx512_defaults_use_register_tiles_that_stay_in_registers():
    """On AVX-512 (Zen 5, numba 0.68) tiles two vectors wide by 6 or 12 rows/columns, or one
    vector wide, ran at 3-6 GFLOPS instead of 200-330 (the GEMM micro-kernel's row loop compiled to
    gathers; cpu/_gemm.py now writes the rows out). The defaults keep the tiles measured best."""
    wide = DeviceInfo("x86_64", "test", 2, ("avx2", "fma", "avx512f"))
    catalog = default_catalog()
    for text in ("matmul(M=512,N=512,K=512)", "batch_matmul(B=8,M=128,N=128,K=64)"):
        w = parse_workload(text)
        space = catalog.space(w, "cpu", wide)
        config = catalog.get(w.op, "cpu").default_config(w, space)
        assert (config["tile_m"][-1], config["tile_n"][-1]) == (8, 32), text
    for text in ("conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)", "conv2d_nchw(N=1,C=256,H=56,W=56,K=64,R=1,S=1)",
                 "conv2d_nhwc(N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1)", "conv2d_nchw(N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1)"):
        w = parse_workload(text)
        space = catalog.space(w, "cpu", wide)
        config = catalog.get(w.op, "cpu").default_config(w, space)
        assert config["vector_axis"] == "k" and config["tile_k"][-1] == 32, text
        assert config["tile_w"][-1] in (4, 5, 8, 10), text


def test_depthwise_nhwc_edges_are_stored_without_gathers(tmp_path):
    """Edge tiles (channels and columns the register tile does not divide) and border columns are
    stored from their stack buffers with unsigned indices: numba wraps a signed index below zero,
    and LLVM then read the buffers with gathers (144ch 56x56 s2: 1.3x slower on one core)."""
    host = detect_device()
    if "avx2" not in host.isa_features:
        pytest.skip("gathers are an x86 AVX2/AVX-512 instruction")
    w = parse_workload("depthwise_conv2d_nhwc(N=1,C=40,H=15,W=15,R=3,S=3,stride=2,pad=1)")
    template = TEMPLATES[w.op]
    space = template.space(w, host)
    config = template.default_config(w, space)
    assert w["C"] % config["tile_c"][-1] and config["vector_axis"] == "c", config  # a channel edge tile
    # a cache of its own: the assembly of a kernel loaded from numba's cache is not at hand
    kernel, source = check_kernel(template, w, config, tmp_path)
    asm = kernel_assembly(kernel, source)
    assert "vfmadd" in asm and "vgather" not in asm


def test_gemm_micro_kernel_rows_do_not_compile_to_gathers(tmp_path):
    """A loop over the register tile's rows let LLVM vectorise a 6 x 32 matmul tile across the rows
    on AVX-512, with gathers and scatters of the accumulators (3-5 GFLOPS instead of ~200): the
    micro-kernel writes its rows out (cpu/_gemm.py). Such a tile compiles to no more gathers and
    scatters than the 8 x 32 default (whose few are in the packing and edge code)."""
    host = detect_device()
    if "avx512f" not in host.isa_features:
        pytest.skip("the tiles that compiled to gathers were measured on AVX-512")
    w = parse_workload("matmul(M=96,N=64,K=32)")
    template = TEMPLATES[w.op]
    space = template.space(w, host)
    default = template.default_config(w, space)
    six_rows = space.make({**default.as_dict(),
                           "tile_m": next(v for v in space.knob("tile_m").values if v[-1] == 6)})

    def gathers_and_scatters(config: Config) -> int:
        kernel, source = check_kernel(template, w, config, tmp_path)
        return count_instructions(kernel_assembly(kernel, source), ("vgather", "vscatter"))

    assert (default["tile_m"][-1], default["tile_n"][-1]) == (8, 32)
    assert gathers_and_scatters(six_rows) <= gathers_and_scatters(default)


def _avx512_space(workload: str) -> tuple[Workload, Template, ConfigSpace]:
    """The workload, its template and its space on this host; skips the test unless the host has
    AVX-512 (where the tiles that compiled to gathers were measured)."""
    host = detect_device()
    if "avx512f" not in host.isa_features:
        pytest.skip("the tiles that compiled to gathers were measured on AVX-512")
    w = parse_workload(workload)
    template = TEMPLATES[w.op]
    return w, template, template.space(w, host)


def _fmas_and_gathers_in_worker(tmp_path, workload: str, config: Config) -> tuple[int, int]:
    """512-bit FMAs, and gathers and scatters, in the machine code of ``config``'s kernel, compiled
    in a process with the measurement workers' settings (512-bit vectors preferred; this process
    compiles with LLVM's 256-bit preference)."""
    script = (
        "import sys\n"
        "from measure_agent.engine.runtime import KernelRuntime\n"
        "KernelRuntime.resolve().apply()\n"
        "from kernel_checks import check_kernel, count_instructions\n"
        "from measure_agent.device import detect_device\n"
        "from measure_agent.engine.build import kernel_assembly\n"
        "from measure_agent.templates import default_catalog\n"
        "from measure_agent.workload import parse_workload\n"
        "w = parse_workload(sys.argv[1])\n"
        "template = default_catalog().get(w.op, 'cpu')\n"
        "config = template.space(w, detect_device()).from_json(sys.argv[2])\n"
        "kernel, source = check_kernel(template, w, config, sys.argv[3])\n"
        "assembly = kernel_assembly(kernel, source)\n"
        "print(count_instructions(assembly, ('vfmadd',), 'zmm'), count_instructions(assembly, ('vgather', 'vscatter')))\n"
    )
    paths = [str(Path(__file__).parent), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run([sys.executable, "-c", script, workload, config.json_text(), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    fmas, gathers = done.stdout.split()[-2:]
    return int(fmas), int(gathers)


@pytest.mark.parametrize("workload, rows_knob, rows", [
    ("depthwise_conv2d_nchw(N=1,C=16,H=34,W=34,R=3,S=3,pad=1)", "tile_c", 8),
    ("conv2d_nchw(N=1,C=8,H=34,W=34,K=12,R=3,S=3,pad=1)", "tile_k", 6),
])
def test_conv_tiles_over_columns_compile_to_vector_fmas(tmp_path, workload, rows_knob, rows):
    """The direct conv and depthwise tiles vectorised over columns write their rows out
    (ROWS_WRITTEN_OUT), as the GEMM micro-kernel does: as a loop over the rows, LLVM vectorised an 8
    x 16 depthwise and a 6 x 16 conv tile across the rows on AVX-512 (gathers, no 512-bit FMAs:
    1.5-3.4 GFLOPS instead of 28-70). Now each of the tile's rows is one 512-bit FMA per filter tap.
    Compiled in a process with the measurement workers' settings (512-bit vectors preferred)."""
    w, template, space = _avx512_space(workload)
    values = {**template.default_config(w, space).as_dict(), "vector_axis": "w",
              "tile_w": next(v for v in space.knob("tile_w").values if v[-1] == 16),
              rows_knob: next(v for v in space.knob(rows_knob).values if v[-1] == rows)}
    if w.op == "conv2d_nchw":
        values.update(algorithm="direct", pack_weights=False, unroll_c=1)
    else:
        values.update(unroll_r=1)
    config = space.make(values)
    assert _fmas_and_gathers_in_worker(tmp_path, workload, config)[0] >= rows * w["S"], config


@pytest.mark.parametrize("workload, rows, unroll_k", [
    ("dense(M=64,N=96,K=128)", 4, 1),
    ("dense(M=64,N=96,K=128)", 5, 4),
    ("batch_matmul(B=2,M=48,N=32,K=32)", 4, 1),
])
def test_gemm_tiles_of_one_vector_compile_to_vector_fmas(tmp_path, workload, rows, unroll_k):
    """dense and batch_matmul zero and store their register tile row by row, as matmul does:
    zeroed and stored in one loop over the lanes updating every row, a 4 x 16 tile compiled to
    128/256-bit FMAs (45 instead of 75 GFLOPS) and 5 x 16 and 6 x 16 tiles unrolled 4x gathered in
    their hot loop (3.6 instead of 68-70; Sapphire Rapids). Now each row is one 512-bit FMA per
    unrolled k (6 x 16 unrolled 4x: 20 of its 24 FMAs), and dense, whose B is packed without
    gathers, gathers nothing."""
    w, template, space = _avx512_space(workload)
    values = {**template.default_config(w, space).as_dict(), "parallel": False, "unroll_k": unroll_k,
              "tile_m": next(v for v in space.knob("tile_m").values if v[-1] == rows),
              "tile_n": next(v for v in space.knob("tile_n").values if v[-1] == 16)}
    if w.op == "dense":
        values["vector_axis"] = "n"
    config = space.make(values)
    fmas, gathers = _fmas_and_gathers_in_worker(tmp_path, workload, config)
    assert fmas >= rows * unroll_k, config
    if w.op == "dense":
        assert gathers == 0, config


@pytest.mark.parametrize("workload, lanes_knob, columns, unroll", [
    ("conv2d_nhwc(N=1,C=8,H=26,W=26,K=16,R=3,S=3,pad=1)", "tile_k", 6, {"unroll_c": 4}),
    ("conv2d_nhwc(N=1,C=8,H=26,W=26,K=16,R=3,S=3,pad=1)", "tile_k", 12, {"unroll_c": 1}),
    ("conv2d_nhwc(N=1,C=8,H=26,W=26,K=16,R=3,S=3,pad=1)", "tile_k", 8, {"unroll_c": 1}),
    ("conv2d_nhwc(N=1,C=8,H=26,W=26,K=16,R=3,S=3,pad=1)", "tile_k", 4, {"unroll_c": 1}),
    ("depthwise_conv2d_nhwc(N=1,C=16,H=26,W=26,R=3,S=3,pad=1)", "tile_c", 8, {"unroll_r": 1}),
    ("depthwise_conv2d_nhwc(N=1,C=16,H=26,W=26,R=3,S=3,pad=1)", "tile_c", 4, {"unroll_r": 1}),
])
def test_tiles_over_channels_compile_to_vector_fmas(tmp_path, workload, lanes_knob, columns, unroll):
    """Conv2d and NHWC depthwise tiles vectorised over channels with at least COLUMNS_WRITTEN_OUT_MIN
    columns write the columns out in one loop over the lanes (COLUMNS_WRITTEN_OUT): as a loop over
    the columns, LLVM vectorised 4-, 6-, 8- and 12-column tiles of one vector across the columns on
    AVX-512 (gathers, 128- and 256-bit FMAs only: 1.5-3.2 GFLOPS instead of 25-130). Each column is
    now one 512-bit FMA per tap (and unrolled channel), and the depthwise tiles gather nothing."""
    w, template, space = _avx512_space(workload)
    values = {**template.default_config(w, space).as_dict(), "parallel": False, **unroll,
              lanes_knob: next(v for v in space.knob(lanes_knob).values if v[-1] == 16),
              "tile_w": next(v for v in space.knob("tile_w").values if v[-1] == columns)}
    if w.op == "conv2d_nhwc":
        values.update(algorithm="direct", vector_axis="k", tile_c=w["C"], reduction_order="c_outer")
    else:
        values.update(vector_axis="c")
    config = space.make(values)
    fmas, gathers = _fmas_and_gathers_in_worker(tmp_path, workload, config)
    assert fmas >= columns * w["S"] * unroll.get("unroll_c", 1), config
    if w.op != "conv2d_nhwc":  # (conv2d's weight packing gathers)
        assert gathers == 0, config


@pytest.mark.parametrize("text", [
    "depthwise_conv2d_nchw(N=2,C=5,H=9,W=11,R=3,S=3,pad=1)",
    "depthwise_conv2d_nchw(N=1,C=4,H=10,W=7,R=5,S=5,pad=2,multiplier=2)",
    "depthwise_conv2d_nchw(N=1,C=3,H=13,W=12,R=3,S=3,pad=2,dilation=2)",
    "depthwise_conv2d_nchw(N=1,C=6,H=8,W=9,R=3,S=3,pad=0,dtype=float64)",
    "depthwise_conv2d_nchw(N=1,C=7,H=6,W=5,R=1,S=1)",
    "depthwise_conv2d_nchw(N=2,C=5,H=9,W=11,R=3,S=3,stride=2,pad=1)",
    "depthwise_conv2d_nchw(N=1,C=4,H=12,W=13,R=5,S=5,stride=2,pad=2,multiplier=2)",
    "depthwise_conv2d_nchw(N=1,C=3,H=15,W=14,R=3,S=3,stride=2,pad=2,dilation=2)",
    "depthwise_conv2d_nchw(N=1,C=3,H=16,W=17,R=3,S=3,stride=3,pad=0,dtype=float64)",
])
def test_nchw_depthwise_planes_are_computed_whole(text, kernel_cache_dir):
    """NCHW layers whose padded planes fit PLANE_MAX_ELEMENTS default to ``vector_axis=plane``
    (each channel's padded plane, split into stride phases, on the stack; one vector loop over its
    flattened grid); every channel block and both thread modes match the reference, with batches,
    multipliers, strides 1-3, dilation, no padding, 1x1 filters and float64."""
    w = parse_workload(text)
    template = TEMPLATES[w.op]
    space = template.space(w, AVX512)
    default = template.default_config(w, space)
    assert default["vector_axis"] == "plane", default
    blocks = sorted({v[1] for v in space.knob("tile_c").values if v[-1] == 1})
    for per_item in (blocks[0], blocks[len(blocks) // 2], blocks[-1]):
        tile_c = next(v for v in space.knob("tile_c").values if v[-1] == 1 and v[1] == per_item)
        for parallel in (True, False):
            check(w, space.make({**default.as_dict(), "tile_c": tile_c, "parallel": parallel}), kernel_cache_dir)
    # a plane config has one value of each knob it does not use: no duplicates of one kernel
    plane_configs = [c for c in space.iter_valid() if c["vector_axis"] == "plane"]
    assert len(plane_configs) == len({(c["tile_c"], c["parallel"]) for c in plane_configs})


@pytest.mark.parametrize("text", [
    "depthwise_conv2d_nchw(N=2,C=5,H=70,W=67,R=3,S=3,pad=1,multiplier=2)",
    "depthwise_conv2d_nchw(N=1,C=3,H=69,W=66,R=5,S=3,stride=2,pad=2,dilation=2,dtype=float64)",
    "depthwise_conv2d_nchw(N=1,C=3,H=65,W=67,R=3,S=2,stride=3,pad=0)",
])
def test_nchw_depthwise_larger_planes_are_computed_in_chunks_of_rows(text, kernel_cache_dir):
    """NCHW planes beyond PLANE_MAX_ELEMENTS offer ``vector_axis=rows`` (the plane kernel over
    chunks of tile_h[1] output rows: each chunk's padded input rows on the stack, rows outside the
    input zeroed); chunks of one row and taller than the plane, both thread modes, match
    the reference, with batches, multipliers, strides 1-3, dilation, no padding and float64."""
    w = parse_workload(text)
    template = TEMPLATES[w.op]
    space = template.space(w, AVX512)
    assert "plane" not in space.knob("vector_axis").values
    rows_configs = [c for c in space.iter_valid() if c["vector_axis"] == "rows"]
    chunks = sorted({c["tile_h"][1] for c in rows_configs})
    assert chunks[0] == 1 and chunks[-1] >= 8, chunks
    for chunk, parallel in ((1, False), (chunks[-1], True)):
        config = next(c for c in rows_configs if c["tile_h"][1] == chunk and c["parallel"] == parallel)
        check(w, config, kernel_cache_dir)
    # one value of each knob it does not use: no duplicates of one kernel
    assert len(rows_configs) == len({(c["tile_c"], c["tile_h"], c["parallel"]) for c in rows_configs})


@pytest.mark.parametrize("text, tile_c, tile_w, unroll_r", [
    # 20 channels by 16: the last channel tile shifts down; 17 columns by 8: the last tile shifts left
    ("depthwise_conv2d_nhwc(N=2,C=20,H=9,W=17,R=3,S=3,pad=1)", (1, 16), (2, 8), 1),
    # an interior of 10 columns, narrower than the 12-column tile: every column one at a time
    ("depthwise_conv2d_nhwc(N=1,C=16,H=6,W=12,R=3,S=3,pad=1)", (1, 16), (1, 12), 2),
    ("depthwise_conv2d_nhwc(N=1,C=24,H=11,W=40,R=3,S=5,stride_h=1,stride_w=3,pad=1,dilation=2,dtype=float64)",
     (1, 8), (1, 4), 4),
    ("depthwise_conv2d_nhwc(N=1,C=40,H=15,W=19,R=5,S=5,stride=2,pad=2)", (1, 32), (2, 3), 1),
])
def test_nhwc_tiles_over_channels_address_the_arrays_flat(text, tile_c, tile_w, unroll_r, kernel_cache_dir):
    """NHWC tiles over channels (direct border, no multiplier) index flat views whose strides are the
    workload's sizes (FLAT_TILES): shifted channel and column tiles, a tile wider than the interior,
    batches, strides, dilation and float64 match the reference, serial and parallel; called with
    arrays of other shapes, the kernel refuses them instead of reading past them."""
    from measure_agent.engine.checking import make_problem

    w = parse_workload(text)
    template = TEMPLATES[w.op]
    space = template.space(w, AVX512)
    config = with_choices(w, AVX512, vector_axis="c", border="direct", tile_c=tile_c, tile_w=tile_w,
                          unroll_r=unroll_r)
    check(w, serial(space, config), kernel_cache_dir)
    kernel, source = check_kernel(template, w, space.make({**config.as_dict(), "parallel": True}), kernel_cache_dir)
    assert "xf = x.reshape(N * XH * XW * XC)" in source.text
    x, weights = make_problem(w).inputs
    out = np.zeros(w.spec.output_shape(w.params), dtype=w.dtype)
    narrower, narrower_out = np.ascontiguousarray(x[:, :, :-1]), np.ascontiguousarray(out[:, :, :-1])
    with pytest.raises(ValueError, match="not the shapes this kernel was rendered for"):
        kernel(narrower, weights, narrower_out, *source.runtime_args)
    # with a padded copy, the tiles keep their indexed columns
    padded = template.render(w, space.make({**config.as_dict(), "border": "padded_copy"}))
    assert "xf = " not in padded.text


def test_plane_kernels_only_where_the_plane_fits():
    """Planes beyond PLANE_MAX_ELEMENTS compute chunks of rows instead (the default where the
    channels make enough work items); NHWC keeps the register tiles."""
    for text in ("depthwise_conv2d_nchw(N=1,C=96,H=112,W=112,R=3,S=3,stride=2,pad=1)",
                 "depthwise_conv2d_nchw(N=1,C=32,H=112,W=112,R=3,S=3,pad=1)",
                 "depthwise_conv2d_nhwc(N=1,C=960,H=7,W=7,R=3,S=3,pad=1)"):
        w = parse_workload(text)
        space = TEMPLATES[w.op].space(w, AVX512)
        assert "plane" not in space.knob("vector_axis").values, text
        if w.op.endswith("nchw"):
            default = TEMPLATES[w.op].default_config(w, space)
            assert default["vector_axis"] == "rows" and default["tile_h"][1] == 4, default
        else:
            assert "rows" not in space.knob("vector_axis").values
    few_channels = parse_workload("depthwise_conv2d_nchw(N=1,C=3,H=112,W=112,R=3,S=3,pad=1)")
    space = TEMPLATES[few_channels.op].space(few_channels, AVX512)
    assert TEMPLATES[few_channels.op].default_config(few_channels, space)["vector_axis"] == "w"
    for text in ("depthwise_conv2d_nchw(N=1,C=960,H=7,W=7,R=3,S=3,pad=1)",
                 "depthwise_conv2d_nchw(N=1,C=144,H=56,W=56,R=3,S=3,stride=2,pad=1)"):
        w = parse_workload(text)
        space = TEMPLATES[w.op].space(w, AVX512)
        assert TEMPLATES[w.op].default_config(w, space)["vector_axis"] == "plane", text


def test_plane_kernels_compile_to_vector_fmas(tmp_path):
    """The plane kernel's grid loop is one 512-bit FMA per filter tap after the first (a multiply)
    and vector (2-core Sapphire
    Rapids, 2 threads: 960ch 7x7 13.9 -> 48.9 GFLOPS, 192ch 28x28 34.9 -> 96.9, 144ch 56x56
    stride 2 27.8 -> 47.0 against the column tiles' defaults); with stride 2 too."""
    for workload in ("depthwise_conv2d_nchw(N=1,C=16,H=14,W=14,R=3,S=3,pad=1)",
                     "depthwise_conv2d_nchw(N=1,C=16,H=28,W=28,R=3,S=3,stride=2,pad=1)"):
        _plane_kernel_compiles_to_vector_fmas(tmp_path, workload)


def _plane_kernel_compiles_to_vector_fmas(tmp_path, workload: str) -> None:
    w, template, space = _avx512_space(workload)
    config = template.default_config(w, space)
    assert config["vector_axis"] == "plane"
    fmas, gathers = _fmas_and_gathers_in_worker(tmp_path, workload, config)
    assert fmas >= w["R"] * w["S"] - 1 and gathers == 0, (fmas, gathers)
