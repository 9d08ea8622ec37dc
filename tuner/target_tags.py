"""TVM's target tags for the devices tunefleet serves, spelled as TVM spells them.

Each tag stands for the TVM target string it is registered with in TVM's ``src/target/tag.cc``
(``TVM_REGISTER_TARGET_TAG`` / ``TVM_REGISTER_CUDA_TAG``), written with only the options that say
which device may measure a job (kind, ``-arch``, ``-mtriple``, ``-mcpu``, ``-mattr``), plus the
architecture of the host CPU where the tag fixes the board (a Jetson's GPU sits beside an aarch64
CPU). TVM's Jetson tags name the host core, but its Orin Nano entry says ``carmel`` (Xavier's
core; Orin's is Cortex-A78AE), so only the host's architecture is required here.

``raspberry-pi/5`` is tunefleet's own: TVM registers no Raspberry Pi 5 tag.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetTag:
    """What a tag means: a TVM target string and, for a board, its host CPU's architecture."""

    target: str
    host_arch: str = ""


def _cuda(arch: str, host_arch: str = "") -> TargetTag:
    return TargetTag(f"cuda -arch={arch}", host_arch)


_RASPBERRY_PI = {
    "raspberry-pi/4b-aarch64": TargetTag("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon"),
    "raspberry-pi/5": TargetTag("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 -mattr=+neon"),
}

_JETSON = {
    "nvidia/jetson-nano": _cuda("sm_53", "aarch64"),
    "nvidia/jetson-tx1": _cuda("sm_53", "aarch64"),
    "nvidia/tegra-x1": _cuda("sm_53", "aarch64"),
    "nvidia/jetson-tx2": _cuda("sm_62", "aarch64"),
    "nvidia/jetson-agx-xavier": _cuda("sm_72", "aarch64"),
    "nvidia/jetson-orin-nano": _cuda("sm_87", "aarch64"),
    "nvidia/jetson-agx-orin-32gb": _cuda("sm_87", "aarch64"),
    "nvidia/jetson-agx-orin-64gb": _cuda("sm_87", "aarch64"),
}

# Data-centre and desktop GPUs (TVM registers many more, mostly long retired).
_NVIDIA_GPUS = {
    "nvidia/nvidia-h100": "sm_90a",
    "nvidia/nvidia-a100": "sm_80",
    "nvidia/nvidia-a30": "sm_80",
    "nvidia/nvidia-a40": "sm_86",
    "nvidia/nvidia-a10": "sm_86",
    "nvidia/nvidia-a10g": "sm_86",
    "nvidia/nvidia-a16": "sm_86",
    "nvidia/nvidia-a2": "sm_86",
    "nvidia/rtx-a6000": "sm_86",
    "nvidia/nvidia-t4": "sm_75",
    "nvidia/nvidia-v100": "sm_70",
    "nvidia/tesla-p100": "sm_60",
    "nvidia/tesla-p40": "sm_61",
    "nvidia/tesla-p4": "sm_61",
    "nvidia/quadro-rtx-8000": "sm_75",
    "nvidia/quadro-rtx-6000": "sm_75",
    "nvidia/geforce-rtx-4090": "sm_89",
    "nvidia/geforce-rtx-4070-ti": "sm_89",
    "nvidia/geforce-rtx-3090-ti": "sm_86",
    "nvidia/geforce-rtx-3090": "sm_86",
    "nvidia/geforce-rtx-3080-ti": "sm_86",
    "nvidia/geforce-rtx-3080": "sm_86",
    "nvidia/geforce-rtx-3070-ti": "sm_86",
    "nvidia/geforce-rtx-3070": "sm_86",
    "nvidia/geforce-rtx-3060": "sm_86",
    "nvidia/nvidia-titan-rtx": "sm_75",
    "nvidia/geforce-rtx-2080-ti": "sm_75",
    "nvidia/geforce-rtx-2080": "sm_75",
    "nvidia/geforce-rtx-2070": "sm_75",
    "nvidia/geforce-rtx-2060": "sm_75",
    "nvidia/nvidia-titan-v": "sm_70",
    "nvidia/geforce-gtx-1080-ti": "sm_61",
    "nvidia/geforce-gtx-1080": "sm_61",
    "nvidia/geforce-gtx-1070": "sm_61",
    "nvidia/geforce-gtx-1060": "sm_61",
}

# x86 servers: TVM's AWS C5 tags (Skylake-SP and Cascade Lake Xeons).
_X86_SERVERS = {
    f"aws/cpu/c5.{size}": TargetTag(f"llvm -mcpu={cpu}")
    for size, cpu in (("large", "skylake-avx512"), ("xlarge", "skylake-avx512"), ("2xlarge", "skylake-avx512"),
                      ("4xlarge", "skylake-avx512"), ("9xlarge", "skylake-avx512"), ("12xlarge", "cascadelake"),
                      ("18xlarge", "skylake-avx512"), ("24xlarge", "cascadelake"))
}

TARGET_TAGS: dict[str, TargetTag] = {
    **_RASPBERRY_PI,
    **_JETSON,
    **{tag: _cuda(arch) for tag, arch in _NVIDIA_GPUS.items()},
    **_X86_SERVERS,
}
