"""The matmul CPU template: its space, its default, and that every config computes A @ B.

Each distinct kernel text costs a numba compile (about 1-5 s), so the tests share one kernel cache
per module and keep the number of distinct compile-time variants small.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba.core.errors import TypingError

from measure_agent.device import DeviceInfo
from measure_agent.engine.build import load_kernel
from measure_agent.space import Config, ConfigSpace
from measure_agent.templates.catalog import default_catalog
from measure_agent.templates.cpu._common import GENERIC
from measure_agent.templates.cpu_stack import stack_array
from measure_agent.templates.cpu.matmul import K_UNROLLS, LOOP_ORDERS, MatmulCpuTemplate
from measure_agent.workload import Workload, make_workload

TEMPLATE = MatmulCpuTemplate()


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("matmul_cpu_kernels")


def matmul_workload(m: int, n: int, k: int, dtype: str = "float32") -> Workload:
    return make_workload("matmul", {"M": m, "N": n, "K": k, "dtype": dtype})


def split_with(space: ConfigSpace, knob: str, tiles: int, inner: int) -> tuple[int, ...]:
    """The value of split ``knob`` whose middle and inner factors are ``tiles`` and ``inner``."""
    for value in space.knob(knob).values:
        if value[1:] == (tiles, inner):
            return value
    raise AssertionError(f"{knob} has no split (..., {tiles}, {inner}) in {space.knob(knob).values}")


def make_config(workload: Workload, **choices) -> Config:
    """A config from the default with ``choices``; ``tile_m``/``tile_n`` given as (tiles, inner)."""
    space = TEMPLATE.space(workload)
    values = TEMPLATE.default_config(workload, space).as_dict()
    for knob in ("tile_m", "tile_n"):
        if knob in choices:
            values[knob] = split_with(space, knob, *choices.pop(knob))
    if choices.get("kc") == "K":
        choices["kc"] = workload["K"]
    values.update(choices)
    return space.make(values)


def check_config(workload: Workload, config: Config, cache_dir, seed: int = 0) -> None:
    source = TEMPLATE.render(workload, config)
    kernel = load_kernel(source, cache_dir)
    rng = np.random.default_rng(seed)
    a, b = workload.spec.make_inputs(workload.params, np.dtype(workload.dtype), rng)
    out = np.full(workload.spec.output_shape(workload.params), np.nan, dtype=workload.dtype)
    kernel(a, b, out, *source.runtime_args)
    # |sum_k a*b| <= K for inputs in [-1, 1]; FMA contraction changes rounding, not more.
    eps = np.finfo(workload.dtype).eps
    np.testing.assert_allclose(out, a @ b, rtol=16 * eps, atol=16 * eps * workload["K"], err_msg=str(config))


# -- every config computes A @ B ------------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 40),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_configs_compute_matmul(kernel_cache, m, n, k, dtype, seed):
    workload = matmul_workload(m, n, k, dtype)
    space = TEMPLATE.space(workload)
    config = space.sample(np.random.default_rng(seed))[0]
    check_config(workload, config, kernel_cache, seed)


# Hand-picked so that across the set every knob value is used at least once (no device, so
# AVX2-like tiles): MR 1..8, every NR of both dtypes, both loop orders, each unroll, packing on and
# off, serial and parallel, K blocked (kc=16 on K=29) and not. Parallel variants compile slowest
# (5-10 s), so only two are parallel here; the blocking test below and the random test add more.
HAND_PICKED = [
    ("float32", (13, 29, 7), dict(tile_m=(1, 1), tile_n=(1, 4), loop_order="n_outer", unroll_k=1,
                                  pack_a=False, pack_b=False, parallel=False)),
    ("float32", (13, 29, 7), dict(tile_m=(1, 8), tile_n=(2, 8), loop_order="m_outer", unroll_k=2,
                                  pack_a=True, pack_b=False, parallel=True)),
    ("float32", (13, 37, 29), dict(tile_m=(2, 3), tile_n=(1, 32), kc=16, loop_order="n_outer",
                                   unroll_k=4, pack_a=False, pack_b=True, parallel=False)),
    ("float32", (13, 37, 29), dict(tile_m=(1, 5), tile_n=(1, 16), kc=16, loop_order="m_outer",
                                   unroll_k=4, pack_a=True, pack_b=False, parallel=False)),
    ("float32", (13, 37, 29), dict(tile_m=(2, 4), tile_n=(1, 24), kc="K", loop_order="n_outer",
                                   unroll_k=2, pack_a=False, pack_b=False, parallel=False)),
    ("float64", (13, 29, 7), dict(tile_m=(2, 4), tile_n=(2, 12), loop_order="m_outer", unroll_k=1,
                                  pack_a=False, pack_b=True, parallel=False)),
    ("float64", (13, 37, 29), dict(tile_m=(4, 2), tile_n=(1, 16), kc=16, loop_order="n_outer",
                                   unroll_k=4, pack_a=True, pack_b=False, parallel=False)),
    ("float64", (13, 37, 29), dict(tile_m=(1, 3), tile_n=(1, 8), kc=16, loop_order="m_outer",
                                   unroll_k=2, pack_a=True, pack_b=True, parallel=False)),
    ("float64", (13, 29, 7), dict(tile_m=(1, 6), tile_n=(4, 4), loop_order="n_outer", unroll_k=4,
                                  pack_a=False, pack_b=False, parallel=False)),
    # Parallel over NC column blocks (each packing its own panels), K blocked, partial last block.
    ("float32", (13, 37, 29), dict(tile_m=(2, 3), tile_n=(1, 8), kc=16, loop_order="n_outer", unroll_k=2,
                                   pack_a=False, pack_b=True, parallel=True, parallel_axis="n")),
    ("float64", (13, 37, 29), dict(tile_m=(1, 4), tile_n=(2, 8), kc=16, loop_order="m_outer", unroll_k=1,
                                   pack_a=True, pack_b=False, parallel=False, parallel_axis="n")),
    # Tiles larger than every axis (float64: NR = 2, half a vector).
    ("float32", (1, 1, 1), dict(loop_order="n_outer", unroll_k=1, pack_a=False, pack_b=True,
                                parallel=False)),
    ("float64", (1, 1, 1), dict(loop_order="m_outer", unroll_k=4, pack_a=False, pack_b=True,
                                parallel=True)),
]


@pytest.mark.parametrize(
    "dtype, shape, choices", HAND_PICKED, ids=[f"{d}-{'x'.join(map(str, s))}-{i}" for i, (d, s, _) in enumerate(HAND_PICKED)]
)
def test_hand_picked_configs_compute_matmul(kernel_cache, dtype, shape, choices):
    workload = matmul_workload(*shape, dtype)
    check_config(workload, make_config(workload, **dict(choices)), kernel_cache)


def test_hand_picked_configs_cover_every_knob_value():
    seen: dict[str, set] = {}
    for dtype, shape, choices in HAND_PICKED:
        config = make_config(matmul_workload(*shape, dtype), **dict(choices))
        seen.setdefault("MR", set()).add(config["tile_m"][-1])
        seen.setdefault(f"NR-{dtype}", set()).add(config["tile_n"][-1])
        seen.setdefault("k_blocked", set()).add(config["kc"] < shape[2])
        for knob in ("loop_order", "unroll_k", "pack_a", "pack_b", "parallel"):
            seen.setdefault(knob, set()).add(config[knob])
    assert seen["MR"] == set(GENERIC.broadcast_tiles)
    assert seen["NR-float32"] == set(GENERIC.vector_tiles("float32"))
    assert seen["NR-float64"] == set(GENERIC.vector_tiles("float64"))
    assert seen["loop_order"] == set(LOOP_ORDERS)
    assert seen["unroll_k"] == set(K_UNROLLS)
    for knob in ("pack_a", "pack_b", "parallel", "k_blocked"):
        assert seen[knob] == {False, True}, knob


def test_cache_blocks_share_one_kernel_and_are_all_correct(kernel_cache):
    """Configs that differ only in MC, NC, KC render the same text, and many small blocks (several
    row, column and K blocks, each with edge tiles) still compute A @ B."""
    workload = matmul_workload(70, 50, 40)
    fixed = dict(loop_order="n_outer", unroll_k=2, pack_a=True, pack_b=True, parallel=True)
    blockings = [
        dict(tile_m=(1, 4), tile_n=(1, 16), kc=16),
        dict(tile_m=(2, 4), tile_n=(2, 16), kc=32),
        dict(tile_m=(8, 4), tile_n=(2, 16), kc="K"),
        dict(tile_m=(16, 4), tile_n=(1, 16), kc=16),
    ]
    configs = [make_config(workload, **fixed, **blocking) for blocking in blockings]
    sources = [TEMPLATE.render(workload, config) for config in configs]
    assert len({s.text for s in sources}) == 1
    assert len({s.runtime_args for s in sources}) == len(sources)
    for config in configs:
        check_config(workload, config, kernel_cache)


@pytest.mark.parametrize("pack", [False, True])
def test_kernel_tolerates_blocks_that_are_not_tile_multiples(kernel_cache, pack):
    """The engine passes multiples of the tile, but the kernel does not rely on it."""
    workload = matmul_workload(23, 41, 19)
    config = make_config(workload, tile_m=(1, 4), tile_n=(1, 16), loop_order="m_outer", unroll_k=2,
                         pack_a=pack, pack_b=pack, parallel=False)
    source = TEMPLATE.render(workload, config)
    kernel = load_kernel(source, kernel_cache)
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (23, 19)).astype(np.float32)
    b = rng.uniform(-1, 1, (19, 41)).astype(np.float32)
    for mc, nc, kc in [(5, 17, 3), (1, 1, 1), (7, 100, 100), (0, 0, 0)]:
        out = np.full((23, 41), np.nan, dtype=np.float32)
        kernel(a, b, out, mc, nc, kc)
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5, err_msg=f"MC={mc} NC={nc} KC={kc}")


# -- the space and the default -------------------------------------------------------------------


@pytest.mark.parametrize(
    "m, n, k, dtype",
    [(1, 1, 1, "float32"), (1, 1, 1, "float64"), (512, 512, 512, "float32"), (1024, 1024, 1024, "float64"),
     (1000, 3, 77, "float32"), (5, 700, 2, "float64")],
)
def test_default_config_is_valid(m, n, k, dtype):
    workload = matmul_workload(m, n, k, dtype)
    space = TEMPLATE.space(workload)
    config = TEMPLATE.default_config(workload, space)
    assert space.is_valid(config)
    assert config["kc"] == k  # no K-blocking
    assert config["pack_b"] is True


def test_default_config_for_a_large_float32_matmul():
    workload = matmul_workload(512, 512, 512)
    config = TEMPLATE.default_config(workload, TEMPLATE.space(workload))
    assert config["tile_m"][-1] == 6 and config["tile_n"][-1] == 16
    assert config["parallel"] is True


def test_space_respects_register_and_unpacked_b_limits():
    for dtype in ("float32", "float64"):
        workload = matmul_workload(40, 6, 40, dtype)
        space = TEMPLATE.space(workload)
        configs = space.sample(np.random.default_rng(0), 300)
        for config in configs:
            mr, nr = config["tile_m"][-1], config["tile_n"][-1]
            assert GENERIC.accumulator_vectors(mr, nr, dtype) <= 12
            assert config["pack_b"] or nr <= 6
        assert any(not c["pack_b"] for c in configs)


def test_space_adapts_to_the_device_isa():
    workload = matmul_workload(512, 512, 512)
    avx512 = DeviceInfo(arch="x86_64", cpu_model="test", cores=8, isa_features=("avx2", "fma", "avx512f"))
    generic, wide = TEMPLATE.space(workload), TEMPLATE.space(workload, avx512)
    generic_nr = {v[-1] for v in generic.knob("tile_n").values}
    wide_nr = {v[-1] for v in wide.knob("tile_n").values}
    assert max(generic_nr) == 32 and max(wide_nr) == 64  # four vectors of 8 or 16 float32 lanes
    assert max(v[-1] for v in wide.knob("tile_m").values) == 12  # 32 registers: taller tiles
    assert TEMPLATE.default_config(workload, wide)["tile_n"][-1] == 32
    catalog_space = default_catalog().space(workload, "cpu", avx512)
    assert catalog_space.knob("tile_n").values == wide.knob("tile_n").values


def test_space_is_deterministic_and_kc_ends_with_no_blocking():
    workload = matmul_workload(100, 200, 300)
    first, second = TEMPLATE.space(workload), TEMPLATE.space(workload)
    assert first.knob_names == second.knob_names
    assert first.size == second.size
    kc_values = first.knob("kc").values
    assert kc_values == tuple(sorted(kc_values)) and kc_values[-1] == 300


# -- rendering -----------------------------------------------------------------------------------


def test_rendered_text_is_readable_and_carries_the_config():
    workload = matmul_workload(100, 200, 300)
    config = make_config(workload, tile_m=(8, 6), tile_n=(4, 16), kc=64, loop_order="m_outer",
                         unroll_k=4, pack_a=True, pack_b=False, parallel=True)
    source = TEMPLATE.render(workload, config)
    assert source.entry == "matmul"
    assert source.runtime_args == (48, 64, 64)  # MC = 8 * 6, NC = 4 * 16, KC
    text = source.text
    assert workload.key in text
    assert "MR = 6" in text and "NR = 16" in text
    assert "loop_order=m_outer" in text and "unroll_k=4" in text
    assert "pack_a=True" in text and "pack_b=False" in text and "parallel=True" in text
    assert "def matmul(A, B, out, MC, NC, KC):" in text
    assert "prange" in text and "parallel=True" in text
    assert "'reassoc'" not in text and "fastmath=True" not in text
    compile(text, "<kernel>", "exec")


def test_render_imports_only_numpy_numba_and_the_stack_helper():
    workload = matmul_workload(10, 10, 10)
    text = TEMPLATE.render(workload, TEMPLATE.default_config(workload, TEMPLATE.space(workload))).text
    imports = {line for line in text.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {
        "import numpy as np",
        "from numba import njit",
        "from numba import njit, prange",
        "from numba import get_num_threads, njit, prange, set_num_threads",  # serial kernels, outlined
        "from measure_agent.templates.cpu_stack import stack_array",
    }


def test_catalog_has_the_template():
    template = default_catalog().get("matmul", "cpu")
    assert isinstance(template, MatmulCpuTemplate)
    assert (template.op, template.target, template.version) == ("matmul", "cpu", "5")


# -- the stack helper ----------------------------------------------------------------------------


def test_stack_array_holds_values_and_needs_a_literal_length():
    @njit
    def fill_and_sum(x):
        tile = stack_array(4, x.dtype)
        for i in range(4):
            tile[i] = x[i] * 2
        return tile.sum(), tile.shape[0]

    assert fill_and_sum(np.arange(4, dtype=np.float32)) == (12.0, 4)

    @njit
    def runtime_length(n):
        return stack_array(n, np.float64)[0]

    with pytest.raises(TypingError, match="integer literal"):
        runtime_length(3)
