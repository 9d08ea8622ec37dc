"""Device detection from recorded /proc files: x86 server, Jetson Orin, Raspberry Pi 4 and 5, an
aarch64 program under qemu-user on x86; GPUs.

Each directory under tests/data/devices/ holds a machine's /proc/cpuinfo, its device-tree
``model`` (NUL-terminated, as the kernel writes it; absent on x86 and under emulation), where
recorded its ``/proc/self/auxv`` and ``facts.json``: what the files cannot say (architecture,
usable cores, the GPU numba.cuda reports) and what detection must conclude.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from measure_agent import device as device_module
from measure_agent.device import (
    AT_HWCAP,
    AT_HWCAP2,
    DeviceInfo,
    aarch64_hwcap_features,
    board_family,
    board_slug,
    detect_device,
    describe_cpu,
    detect_gpu,
    gpu_facts,
    parse_auxv,
    parse_cpuinfo,
    recognise_board,
)
from measure_agent.protocol.convert import capabilities_to_json, capabilities_to_proto

DEVICES = Path(__file__).parent / "data" / "devices"
RECORDED = sorted(p.name for p in DEVICES.iterdir() if (p / "facts.json").exists())
GPU_KEYS = {"gpu_name", "compute_capability", "max_threads_per_block", "max_shared_memory_per_block",
            "max_registers_per_block"}


def recorded(name: str, with_device_tree: bool = True) -> tuple[DeviceInfo, dict]:
    directory = DEVICES / name
    facts = json.loads((directory / "facts.json").read_text())
    board_path = directory / "model" if with_device_tree else directory / "no-such-file"
    auxv = directory / "auxv"
    info = detect_device(str(directory / "cpuinfo"), str(board_path), arch=facts["arch"], cores=facts["cores"],
                         gpu=facts["gpu"], auxv_path=str(auxv) if auxv.exists() else None)
    return info, facts


def test_all_five_machines_are_recorded():
    assert RECORDED == ["jetson_orin_nano", "qemu_user_aarch64_on_x86", "raspberry_pi_4", "raspberry_pi_5",
                        "x86_avx512_server"]


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_machine_is_described_and_keyed(name):
    info, facts = recorded(name)
    expected = facts["expected"]
    assert info.arch == facts["arch"] and info.cores == facts["cores"]
    assert info.cpu_model == expected["cpu_model"]
    assert info.board == expected["board"]
    assert list(info.isa_features) == expected["isa_features"]
    assert info.extra == facts["gpu"]
    assert info.default_key == expected["default_key"]
    # the key survives the trip through JSON (the tuning log) and the wire (agent capabilities)
    assert DeviceInfo.from_json(info.to_json()).default_key == info.default_key
    caps = capabilities_to_proto(info, "1", "v", [])
    assert DeviceInfo.from_json(capabilities_to_json(caps)).default_key == info.default_key


@pytest.mark.parametrize("name", ["raspberry_pi_4", "raspberry_pi_5"])
def test_raspberry_pi_is_recognised_from_cpuinfo_without_a_device_tree(name):
    """Containers often lack /proc/device-tree; Raspberry Pi kernels also print the model in cpuinfo."""
    with_tree, facts = recorded(name)
    without_tree, _ = recorded(name, with_device_tree=False)
    assert without_tree.board == with_tree.board == facts["expected"]["board"]
    assert without_tree.default_key == facts["expected"]["default_key"]


def test_jetson_without_a_device_tree_is_named_by_its_cores_and_gpu():
    info, _ = recorded("jetson_orin_nano", with_device_tree=False)
    assert info.board == ""
    assert info.default_key == "aarch64-arm-cortex-a78ae-6c-asimd+orin"


def test_jetson_gpu_facts_reach_the_capabilities():
    info, facts = recorded("jetson_orin_nano")
    assert board_family(info.board) == "jetson"
    caps = capabilities_to_proto(info, "1", "v", [])
    assert (caps.gpu_name, caps.compute_capability) == ("Orin", "8.7")
    assert (caps.max_threads_per_block, caps.max_shared_memory_per_block, caps.max_registers_per_block) == (
        1024, 49152, 65536)


def test_a_server_with_a_gpu_has_it_in_its_key():
    h200 = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0", "max_threads_per_block": "1024",
            "max_shared_memory_per_block": "49152", "max_registers_per_block": "65536"}
    directory = DEVICES / "x86_avx512_server"
    info = detect_device(str(directory / "cpuinfo"), str(directory / "model"), arch="x86_64", cores=160, gpu=h200)
    assert info.board == ""  # "model : 106" in x86 cpuinfo is a number, not a board
    assert info.default_key == "x86_64-intel-xeon-platinum-8380-160c-avx512+h200"
    rtx = DeviceInfo("x86_64", "AMD Ryzen 9 7950X 16-Core Processor", 32, ("avx2", "avx512f"),
                     extra={"gpu_name": "NVIDIA GeForce RTX 4090"})
    assert rtx.default_key == "x86_64-amd-ryzen-9-7950x-32c-avx512+geforce-rtx-4090"


def test_hosts_without_a_gpu_or_board_keep_their_key():
    info = DeviceInfo("x86_64", "AMD EPYC 7B13", 2, ("sse4_2", "avx", "avx2", "fma"))
    assert info.default_key == "x86_64-amd-epyc-7b13-2c-avx2"


def test_raspberry_pi_4_on_a_32_bit_os():
    cpuinfo = "".join(
        f"processor\t: {i}\nmodel name\t: ARMv7 Processor rev 3 (v7l)\nBogoMIPS\t: 108.00\n"
        "Features\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32\n"
        "CPU implementer\t: 0x41\nCPU architecture: 7\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n"
        for i in range(4)
    ) + "Hardware\t: BCM2711\nRevision\t: c03114\nSerial\t\t: 100000002d2a3c5f\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n"
    model, flags = parse_cpuinfo(cpuinfo)
    assert (model, flags) == ("ARM Cortex-A72", ("neon",))
    info = DeviceInfo("armv7l", model, 4, flags, board=recognise_board("", cpuinfo))
    assert info.default_key == "armv7l-raspberry-pi-4-model-b-4c-neon"


def test_big_little_cores_are_all_named_and_known_models_are_kept():
    cpuinfo = "".join(f"processor\t: {i}\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: {part}\n\n"
                      for i, part in enumerate(["0xd05"] * 4 + ["0xd0b"] * 4))
    assert parse_cpuinfo(cpuinfo)[0] == "ARM Cortex-A55 + Cortex-A76"
    named = "processor\t: 0\nmodel name\t: Ampere Altra Q80-30\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    assert parse_cpuinfo(named)[0] == "Ampere Altra Q80-30"
    unknown = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xfff\nHardware\t: Acme SoC\n"
    assert parse_cpuinfo(unknown)[0] == "Acme SoC"


@pytest.mark.parametrize("board, family, slug", [
    ("NVIDIA Jetson Orin Nano Developer Kit", "jetson", "jetson-orin-nano"),
    ("NVIDIA Jetson AGX Orin Developer Kit", "jetson", "jetson-agx-orin"),
    ("NVIDIA Jetson Xavier NX Developer Kit", "jetson", "jetson-xavier-nx"),
    ("Raspberry Pi 4 Model B Rev 1.4", "raspberry-pi", "raspberry-pi-4-model-b"),
    ("Raspberry Pi 5 Model B Rev 1.0", "raspberry-pi", "raspberry-pi-5-model-b"),
    ("Raspberry Pi Compute Module 4 Rev 1.0", "raspberry-pi", "raspberry-pi-compute-module-4"),
    ("Radxa ROCK 5B", "", ""),
    ("", "", ""),
])
def test_board_names(board, family, slug):
    assert board_family(board) == family
    assert board_slug(board) == slug


def test_gpu_facts_from_a_numba_device():
    fake = types.SimpleNamespace(name=b"NVIDIA H200", compute_capability=(9, 0), MAX_THREADS_PER_BLOCK=1024,
                                 MAX_SHARED_MEMORY_PER_BLOCK=49152, MAX_REGISTERS_PER_BLOCK=65536)
    assert gpu_facts(fake) == {"gpu_name": "NVIDIA H200", "compute_capability": "9.0",
                               "max_threads_per_block": "1024", "max_shared_memory_per_block": "49152",
                               "max_registers_per_block": "65536"}


@pytest.fixture()
def fresh_gpu_cache():
    device_module._detect_gpu_once.cache_clear()
    yield
    device_module._detect_gpu_once.cache_clear()


def test_gpu_detection_asks_numba_once_when_a_driver_is_present(monkeypatch, tmp_path, fresh_gpu_cache):
    import numba

    driver = tmp_path / "version"
    driver.write_text("NVRM version: 550.54.15\n")
    monkeypatch.setattr(device_module, "_NVIDIA_DRIVER_FILES", (str(driver),))
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    calls = []
    device = types.SimpleNamespace(name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0),
                                   MAX_THREADS_PER_BLOCK=1024, MAX_SHARED_MEMORY_PER_BLOCK=49152,
                                   MAX_REGISTERS_PER_BLOCK=65536)
    fake_cuda = types.SimpleNamespace(is_available=lambda: calls.append(1) or True, gpus=[device])
    monkeypatch.setattr(numba, "cuda", fake_cuda, raising=False)
    assert detect_gpu()["compute_capability"] == "8.0"
    assert detect_gpu()["gpu_name"] == "NVIDIA A100-SXM4-80GB"
    assert len(calls) == 1  # cached for the process
    info = detect_device("/nonexistent", "/nonexistent", arch="x86_64", cores=8)
    assert set(info.extra) == GPU_KEYS and info.default_key.endswith("+a100-sxm4-80gb")
    # never under the simulator, even with a driver
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert detect_gpu() == {}


def test_gpu_detection_survives_a_broken_driver(monkeypatch, tmp_path, fresh_gpu_cache):
    import numba

    driver = tmp_path / "nvidiactl"
    driver.write_text("")
    monkeypatch.setattr(device_module, "_NVIDIA_DRIVER_FILES", (str(driver),))
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)

    def broken():
        raise RuntimeError("CUDA driver library cannot be found")

    monkeypatch.setattr(numba, "cuda", types.SimpleNamespace(is_available=broken), raising=False)
    assert detect_gpu() == {}


def test_detection_on_a_cpu_only_host_never_imports_numba_cuda():
    """Without an NVIDIA driver (or under the simulator) numba.cuda is not even imported."""
    code = ("import sys; from measure_agent.device import detect_device, _NVIDIA_DRIVER_FILES; import os\n"
            "driver = any(os.path.exists(p) for p in _NVIDIA_DRIVER_FILES)\n"
            "info = detect_device()\n"
            "print(driver, 'numba.cuda' in sys.modules, sorted(info.extra))")
    for env_extra in ({}, {"NUMBA_ENABLE_CUDASIM": "1"}):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"} | env_extra
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        driver, imported, extra = proc.stdout.split(" ", 2)
        if driver == "True" and not env_extra:
            continue  # a GPU host: detection may ask numba
        assert imported == "False" and extra.strip() == "[]"


# -- aarch64 under qemu-user: the architecture first, the features from the auxiliary vector --------


def auxv_bytes(entries: dict[int, int]) -> bytes:
    import struct

    return b"".join(struct.pack("<QQ", kind, value) for kind, value in [*entries.items(), (0, 0)])


def test_qemu_user_aarch64_on_x86_is_an_emulated_aarch64_device_never_the_x86_host():
    """qemu-user passes the host's /proc/cpuinfo through: detection must not take the x86 flags
    (which would give the agent AVX2 spaces and an x86-looking key) nor the host's model as its own."""
    info, _ = recorded("qemu_user_aarch64_on_x86")
    assert info.arch == "aarch64" and info.cpu_model.startswith("emulated on x86 @ ")
    assert not set(info.isa_features) & {"sse4_2", "avx", "avx2", "fma", "avx512f"}
    assert "asimd" in info.isa_features
    x86_model, x86_flags = parse_cpuinfo((DEVICES / "qemu_user_aarch64_on_x86" / "cpuinfo").read_text())
    assert "avx2" in x86_flags and info.cpu_model == f"emulated on x86 @ {x86_model}"  # the host it is on


def test_the_auxv_hwcap_words_name_aarch64_features_in_kernel_bit_order():
    auxv = parse_auxv(auxv_bytes({3: 0x40, AT_HWCAP: 0b11 | 1 << 10 | 1 << 20 | 1 << 22, AT_HWCAP2: 0b10}))
    assert auxv[AT_HWCAP] == 0x500403 and auxv[3] == 0x40
    assert aarch64_hwcap_features(auxv) == {"fp", "asimd", "asimdhp", "asimddp", "sve", "sve2"}
    assert parse_auxv(b"") == {} and aarch64_hwcap_features({}) == set()
    # entries after AT_NULL are not read
    assert parse_auxv(auxv_bytes({AT_HWCAP: 2}) + auxv_bytes({AT_HWCAP2: 2})) == {AT_HWCAP: 2}


def test_a_real_aarch64_host_takes_its_features_from_the_auxv_and_its_model_from_cpuinfo():
    pi4 = (DEVICES / "raspberry_pi_4" / "cpuinfo").read_text()
    with_auxv = describe_cpu("aarch64", pi4, auxv_bytes({AT_HWCAP: 0b11 | 1 << 20}))
    assert (with_auxv.model, with_auxv.isa_features, with_auxv.emulated_on) == ("ARM Cortex-A72",
                                                                                ("asimd", "asimddp"), "")
    assert describe_cpu("aarch64", pi4).isa_features == ("asimd",)  # no auxv: cpuinfo's Features
    # x86 hosts are as before, and never read an auxv as aarch64 HWCAP bits
    x86 = (DEVICES / "x86_avx512_server" / "cpuinfo").read_text()
    assert describe_cpu("x86_64", x86, auxv_bytes({AT_HWCAP: 0xFFFF})) == describe_cpu("x86_64", x86)


def test_an_emulated_program_without_an_auxv_claims_no_features_rather_than_the_hosts():
    x86 = (DEVICES / "x86_avx512_server" / "cpuinfo").read_text()
    cpu = describe_cpu("aarch64", x86)
    assert cpu.emulated_on == "x86" and cpu.isa_features == ()
    assert DeviceInfo("aarch64", cpu.model, 4, cpu.isa_features).default_key == "aarch64-emulated-on-x86-4c"
    # and x86 emulated on an arm host (qemu-user the other way round) likewise
    pi4 = (DEVICES / "raspberry_pi_4" / "cpuinfo").read_text()
    assert describe_cpu("x86_64", pi4).model == "emulated on arm @ ARM Cortex-A72"


def test_a_recorded_machine_never_reads_the_running_hosts_auxv(monkeypatch):
    """``arch=`` describes another machine: this process's auxv (x86 here) must not be taken as its HWCAP."""
    read = []
    monkeypatch.setattr(device_module, "_read_bytes", lambda path: read.append(path) or b"")
    recorded("raspberry_pi_4")
    assert "/proc/self/auxv" not in read
