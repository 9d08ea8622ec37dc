"""An aarch64 agent (a Raspberry Pi, or deploy/arm/smoke.sh's under qemu-user) tunes NEON spaces and
renders NEON-width register tiles; its numba code generation gets no x86 settings. Runs on any host:
the device is the recorded qemu_user_aarch64_on_x86 machine (tests/data/devices/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from measure_agent.device import DeviceInfo, detect_device
from measure_agent.engine import build
from measure_agent.templates.catalog import default_catalog
from measure_agent.templates.cpu._common import target_of, vector_target
from measure_agent.workload import parse_workload

from kernel_checks import check_kernel
from script_modules import load_script

EMULATED = Path(__file__).parent / "data" / "devices" / "qemu_user_aarch64_on_x86"
PI4 = DeviceInfo("aarch64", "ARM Cortex-A72", 4, ("asimd",), board="Raspberry Pi 4 Model B Rev 1.4")
AVX2 = DeviceInfo("x86_64", "AMD EPYC", 2, ("sse4_2", "avx", "avx2", "fma"))
# the workloads deploy/arm/smoke.sh tunes on the emulated agent
SMOKE_WORKLOADS = ("matmul_64x64x64", "conv2d_nchw_1x16x16x16_k16_r3s3_s1_p1", "conv2d_nhwc_1x16x16x16_k16_r3s3_s1_p1",
                   "depthwise_conv2d_nchw_1x16x16x16_r3s3_s1_p1", "dense_16x64x64")
NEON_VECTOR_TILES = {"float32": (2, 4, 8, 12, 16), "float64": (2, 4, 6, 8)}  # half, 1, 2, 3, 4 128-bit vectors


@pytest.fixture(scope="module")
def emulated() -> DeviceInfo:
    return detect_device(str(EMULATED / "cpuinfo"), str(EMULATED / "no-device-tree"), arch="aarch64", cores=2,
                         gpu={}, auxv_path=str(EMULATED / "auxv"))


def knobs(space) -> list[tuple[str, tuple]]:
    return [(k.name, tuple(k.values)) for k in space.knobs]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", SMOKE_WORKLOADS)
def test_the_emulated_agent_tunes_the_spaces_of_a_raspberry_pi(emulated, name, dtype):
    """Its SVE bits do not widen the tiles (numba's LLVM emits NEON for a generic aarch64), and the
    x86 host's AVX2 never reaches them."""
    workload = parse_workload(name if dtype == "float32" else f"{name}_float64")
    catalog = default_catalog()
    space = catalog.space(workload, "cpu", emulated)
    assert target_of(space).isa == "neon" and target_of(space).lanes(dtype) == {"float32": 4, "float64": 2}[dtype]
    assert knobs(space) == knobs(catalog.space(workload, "cpu", PI4))
    assert knobs(space) != knobs(catalog.space(workload, "cpu", AVX2))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_neon_register_tiles_are_whole_128_bit_vectors(emulated, dtype):
    target = vector_target(emulated)
    assert target.vector_tiles(dtype) == NEON_VECTOR_TILES[dtype]
    assert target.max_accumulators == 24  # of aarch64's 32 vector registers


@pytest.mark.parametrize("name", ["matmul_64x64x64", "matmul_64x64x64_float64", "conv2d_nhwc_1x16x16x16_k16_r3s3_s1_p1"])
def test_the_neon_default_renders_a_two_vector_tile_that_computes_the_reference(emulated, name, tmp_path):
    """The kernel an aarch64 agent builds by default: rendered here, compiled for this host (the
    source is the same Python on every CPU) and checked against numpy."""
    workload = parse_workload(name)
    catalog = default_catalog()
    template = catalog.get(workload.op, "cpu")
    space = catalog.space(workload, "cpu", emulated)
    config = template.default_config(workload, space)
    vector_tile = config["tile_n"][-1] if workload.op == "matmul" else config["tile_k"][-1]
    lanes = vector_target(emulated).lanes(workload.dtype)
    assert vector_tile % lanes == 0 and vector_tile in NEON_VECTOR_TILES[workload.dtype]
    check_kernel(template, workload, config, tmp_path)


def test_aarch64_code_generation_gets_no_x86_settings():
    """Under qemu-user LLVM could read the x86 host's /proc/cpuinfo: whatever it says, an aarch64
    worker must not be told AVX-512 features."""
    assert build.codegen_environment("+64bit,+avx2,+avx512f,+fma", arch="aarch64") == {}
    assert build.codegen_environment("+neon,+v8a", arch="aarch64") == {}
    assert build.codegen_environment("+64bit,+avx2,+avx512f,+fma", arch="x86_64") == {
        "NUMBA_CPU_FEATURES": "+64bit,+avx2,+avx512f,+fma,-prefer-256-bit"}


# -- deploy/arm/smoke.sh's checks (pi_cost.py), on recorded trials --------------------------------


def load_pi_cost():
    return load_script("deploy/arm/pi_cost.py")


def exported_trial(device: DeviceInfo, name: str, status: str = "ok", compile_s: float = 30.0) -> str:
    import json

    workload = parse_workload(name)
    catalog = default_catalog()
    space = catalog.space(workload, "cpu", device)
    config = catalog.get(workload.op, "cpu").default_config(workload, space)
    return json.dumps({"workload": workload.key, "device_key": device.default_key, "status": status,
                       "config": config.to_json(), "compile_time_s": compile_s, "message": "",
                       "device_info": device.to_json()}) + "\n"


def test_the_smoke_accepts_neon_trials_of_the_emulated_agent_and_prints_the_ratios(emulated, tmp_path):
    pi_cost = load_pi_cost()
    export = tmp_path / "trials.jsonl"
    export.write_text(exported_trial(emulated, "matmul_64x64x64", compile_s=20.0)
                      + exported_trial(emulated, "dense_16x64x64", compile_s=40.0)
                      + exported_trial(AVX2, "matmul_64x64x64", compile_s=3.0))
    summary = pi_cost.check(export, emulated.default_key, "aarch64", "asimd", "neon",
                            ["matmul_64x64x64", "dense_16x64x64"])
    assert summary["trials"] == 2 and summary["compile_median_s"] == 30.0 and summary["float32_lanes"] == 4
    x86 = dict(summary, key=AVX2.default_key, compile_median_s=3.0, compile_max_s=3.0, idle_rss_mib=100.0,
               build_worker_peak_mib=500.0, float32_lanes=8)
    arm = dict(summary, idle_rss_mib=170.0, build_worker_peak_mib=650.0)
    table = pi_cost.table(arm, x86)
    assert "1.7x" in table and "1.3x" in table and "10.0x" in table


@pytest.mark.parametrize("problem, message", [("status", "is wrong_result"), ("x86 device", "measured on x86_64"),
                                              ("x86 space", "not in the neon space"),
                                              ("missing workload", "no trial of dense")])
def test_the_smoke_refuses_what_is_not_an_aarch64_trial(emulated, tmp_path, problem, message):
    pi_cost = load_pi_cost()
    export = tmp_path / "trials.jsonl"
    if problem == "status":
        export.write_text(exported_trial(emulated, "matmul_64x64x64", status="wrong_result"))
    elif problem == "x86 device":  # an x86 agent that joined under the aarch64 key
        lines = exported_trial(AVX2, "matmul_64x64x64").replace(AVX2.default_key, emulated.default_key)
        export.write_text(lines)
    elif problem == "x86 space":  # an aarch64 device whose features a broken detection took from the host
        x86_flags = DeviceInfo("aarch64", emulated.cpu_model, 2, ("asimd", "avx2"))
        export.write_text(exported_trial(x86_flags, "matmul_64x64x64").replace(x86_flags.default_key,
                                                                               emulated.default_key))
    else:
        export.write_text(exported_trial(emulated, "matmul_64x64x64"))
    with pytest.raises(SystemExit, match=message):
        pi_cost.check(export, emulated.default_key, "aarch64", "asimd", "neon", ["matmul_64x64x64", "dense_16x64x64"])
