"""What the measuring machine is: recorded with every trial and used to name the device key."""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import struct
from dataclasses import asdict, dataclass, field
from importlib import metadata

# What a device key may be: it names agents in logs, metrics labels and URLs, so a short, plain word.
DEVICE_KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")


class DeviceKeyError(ValueError):
    """A device key that is not a plain word (one-line message)."""


def check_device_key(key: str) -> str:
    """``key`` if it is a valid device key; raises :class:`DeviceKeyError` naming the rule otherwise.

    The one check of a key: agents (``--key``), the daemon (registration, jobs, measure requests)
    and the tuner's command line all use it.
    """
    if not isinstance(key, str) or not DEVICE_KEY_PATTERN.match(key):
        from measure_agent.protocol.errors import shown

        raise DeviceKeyError(f"invalid device key {shown(key)}: letters, digits and ._:+- only (not first), "
                             "at most 128")
    return key


@dataclass(frozen=True)
class DeviceInfo:
    """Facts about a measuring host that change what is fast on it."""

    arch: str
    cpu_model: str
    cores: int
    isa_features: tuple[str, ...] = ()
    numba_version: str = ""
    llvm_version: str = ""
    os: str = ""
    board: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        data = asdict(self)
        data["isa_features"] = list(self.isa_features)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "DeviceInfo":
        """Inverse of :meth:`to_json`; keys it does not know (GPU limits, versions) go to ``extra``."""
        fields = cls.__dataclass_fields__
        _check_recorded(data)
        known = {k: data[k] for k in fields if k in data and k != "extra"}
        known["isa_features"] = tuple(known.get("isa_features", ()))
        known.setdefault("arch", "unknown")
        known.setdefault("cpu_model", "unknown")
        known.setdefault("cores", 0)
        extra = dict(data.get("extra") or {})
        extra.update({k: str(v) for k, v in data.items() if k not in fields})
        return cls(**known, extra=extra)

    @classmethod
    def from_recorded(cls, data: dict | None) -> "DeviceInfo | None":
        """:meth:`from_json` of recorded info, or ``None`` where none was recorded (``{}``): spaces
        then assume a generic device."""
        return cls.from_json(data) if data else None

    @functools.cached_property  # the key of every space lookup: computed once per (immutable) device
    def fingerprint(self) -> str:
        """A stable text identity (what a space may depend on)."""
        return json.dumps(self.to_json(), sort_keys=True)

    @property
    def default_key(self) -> str:
        """A stable, descriptive key such as ``x86_64-amd-epyc-2c-avx2``.

        A Raspberry Pi or Jetson is named by its board (``aarch64-raspberry-pi-4-model-b-4c-asimd``,
        ``aarch64-jetson-orin-nano-6c-asimd``): the board fixes the SoC, and with it the GPU. Other
        hosts with a CUDA GPU append it (``...-avx512+h200``), so that GPUs of different kinds never
        share a key.
        """
        board = board_slug(self.board)
        if board:
            slug = board
        else:
            model = re.sub(r"\(r\)|\(tm\)|cpu|processor|\d+-core|@.*$", " ", self.cpu_model.lower())
            slug = re.sub(r"[^a-z0-9]+", "-", model).strip("-")[:40].strip("-") or "cpu"
        vector = next((f for f in ("avx512f", "avx2", "neon", "asimd", "sse4_2") if f in self.isa_features), "")
        parts = [self.arch, slug, f"{self.cores}c"] + ([vector.replace("avx512f", "avx512")] if vector else [])
        key = "-".join(parts)
        gpu = self.extra.get("gpu_name", "")
        if gpu and not board:
            gpu_slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\bnvidia\b", " ", gpu.lower())).strip("-")[:32].strip("-")
            key += f"+{gpu_slug or 'gpu'}"
        return key


# ISA features worth recording: they decide vector width and so the best register tiles. A target's
# -mattr can require only these (tuner/steering.py).
RECORDED_ISA_FEATURES = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "neon", "asimd", "sve",
                      "asimdhp", "asimddp", "sve2")

# (implementer, part) from /proc/cpuinfo on ARM -> core name: aarch64 kernels print no model name
# (and 32-bit ones only "ARMv7 Processor rev 3 (v7l)").
_ARM_IMPLEMENTERS = {0x41: "ARM", 0x4E: "NVIDIA", 0x51: "Qualcomm", 0x61: "Apple", 0xC0: "Ampere"}
_ARM_PARTS = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57", (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD42): "Cortex-A78AE", (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510",
    (0x41, 0xD47): "Cortex-A710", (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4B): "Cortex-A78C", (0x41, 0xD4F): "Neoverse-V2", (0x41, 0xD80): "Cortex-A520",
    (0x41, 0xD81): "Cortex-A720", (0x41, 0xD82): "Cortex-X4", (0x4E, 0x004): "Carmel",
}
_GENERIC_MODEL = re.compile(r"^(ARMv\d|BCM\d|$)", re.IGNORECASE)


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _read(path: str) -> str:
    return _read_bytes(path).decode(errors="replace").replace("\x00", "")


# -- the auxiliary vector: what the kernel (or qemu-user) says this process's CPU offers ----------

AT_HWCAP = 16
AT_HWCAP2 = 26
# aarch64 HWCAP and HWCAP2 bits, in bit order, named as /proc/cpuinfo names them (Linux,
# arch/arm64/include/uapi/asm/hwcap.h and arch/arm64/kernel/cpuinfo.c).
AARCH64_HWCAP = (
    "fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp", "asimdhp", "cpuid",
    "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4", "asimddp", "sha512", "sve", "asimdfhm",
    "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg",
)
AARCH64_HWCAP2 = (
    "dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint", "svei8mm",
    "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng", "bti", "mte", "ecv", "afp", "rpres",
    "mte3", "sme", "sme_i16i64", "sme_f64f64", "sme_i8i32", "sme_f16f32", "sme_b16f32", "sme_f32f32",
    "sme_fa64", "wfxt", "ebf16", "sve_ebf16", "cssc", "rprfm", "sve2p1", "sme2", "sme2p1", "sme_i16i32",
    "sme_bi32i32", "sme_b16b16", "sme_f16f16", "mops", "hbc", "sve_b16b16", "lrcpc3", "lse128",
)


def parse_auxv(data: bytes) -> dict[int, int]:
    """The entries of a 64-bit little-endian ``/proc/self/auxv`` (type, value pairs up to AT_NULL)."""
    entries: dict[int, int] = {}
    for offset in range(0, len(data) - 15, 16):
        kind, value = struct.unpack_from("<QQ", data, offset)
        if kind == 0:
            break
        entries[kind] = value
    return entries


def aarch64_hwcap_features(auxv: dict[int, int]) -> set[str]:
    """The aarch64 features the HWCAP words of ``auxv`` name (empty without them)."""
    features: set[str] = set()
    for kind, names in ((AT_HWCAP, AARCH64_HWCAP), (AT_HWCAP2, AARCH64_HWCAP2)):
        word = auxv.get(kind, 0)
        features.update(name for bit, name in enumerate(names) if word >> bit & 1)
    return features


def arch_family(machine: str) -> str:
    """``x86``, ``arm`` or empty, of a ``platform.machine()`` name."""
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    if machine.startswith(("aarch64", "arm")):
        return "arm"
    return ""


def cpuinfo_family(text: str) -> str:
    """``x86``, ``arm`` or empty: the kind of CPU a ``/proc/cpuinfo`` describes. Under qemu-user it
    is the host's, not the emulated program's."""
    keys = {line.split(":", 1)[0].strip().lower() for line in text.splitlines() if ":" in line}
    if "vendor_id" in keys or "flags" in keys:
        return "x86"
    if "cpu implementer" in keys or "features" in keys:
        return "arm"
    return ""


@dataclass(frozen=True)
class CpuDescription:
    """A CPU's model name and recorded ISA features, and whether it is emulated on another kind."""

    model: str
    isa_features: tuple[str, ...]
    emulated_on: str = ""  # "x86" for an aarch64 program under qemu-user on an x86 host


def describe_cpu(arch: str, cpuinfo: str, auxv: bytes = b"") -> CpuDescription:
    """Architecture first: ``arch`` (``platform.machine()``) says what code runs here; ``cpuinfo``
    names the model, and its features unless the auxiliary vector ``auxv`` (aarch64) names them.

    Under qemu-user /proc/cpuinfo is the host's: an aarch64 program on an x86 host reads Intel
    flags there. Such a CPU is "emulated on x86 @ <host model>", with the features from the auxv
    (which qemu writes for the emulated CPU), never the host's.
    """
    model, flags = parse_cpuinfo(cpuinfo)
    own, host = arch_family(arch), cpuinfo_family(cpuinfo)
    emulated_on = host if own and host and own != host else ""
    if emulated_on:
        model, flags = f"emulated on {emulated_on} @ {model or 'unknown'}", ()
    if arch.lower() == "aarch64" and auxv:
        hwcap = aarch64_hwcap_features(parse_auxv(auxv))
        if hwcap:
            flags = tuple(f for f in RECORDED_ISA_FEATURES if f in hwcap)
    return CpuDescription(model, flags, emulated_on)


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """CPU model name and interesting ISA flags from ``/proc/cpuinfo`` text (x86 or ARM).

    On ARM, where the kernel names no model (or only "ARMv8 Processor rev 1 (v8l)" or the SoC),
    the cores are named from their implementer and part codes: "ARM Cortex-A72", or
    "ARM Cortex-A55 + Cortex-A76" for a big.LITTLE SoC.
    """
    model = ""
    flags: set[str] = set()
    implementer: int | None = None
    cores: list[str] = []
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, value = (s.strip() for s in line.split(":", 1))
        key = key.lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value
        elif key in ("flags", "features"):
            flags.update(value.split())
        elif key == "cpu implementer":
            implementer = _hex(value)
        elif key == "cpu part" and implementer is not None:
            part = _hex(value)
            name = _ARM_PARTS.get((implementer, part)) if part is not None else None
            if name and name not in cores:
                cores.append(name)
    if cores and _GENERIC_MODEL.match(model):
        model = f"{_ARM_IMPLEMENTERS.get(implementer or 0, 'ARM')} {' + '.join(cores)}"
    return model, tuple(f for f in RECORDED_ISA_FEATURES if f in flags)


def _hex(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


# -- boards ------------------------------------------------------------------------------------


def recognise_board(device_tree_model: str, cpuinfo_text: str = "") -> str:
    """The board's name: the device tree's model, else the ``Model`` line of /proc/cpuinfo
    (Raspberry Pi kernels print one; containers often lack /proc/device-tree). Empty when neither
    names one (x86 hosts)."""
    board = device_tree_model.replace("\x00", "").strip()
    if board:
        return board
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        # x86 prints "model : 85" (a number); boards print a name
        if sep and key.strip().lower() == "model" and re.search(r"[A-Za-z]", value):
            return value.strip()
    return ""


def board_family(board: str) -> str:
    """``raspberry-pi``, ``jetson`` or empty."""
    lowered = board.lower()
    if "raspberry pi" in lowered:
        return "raspberry-pi"
    if "jetson" in lowered:
        return "jetson"
    return ""


def board_slug(board: str) -> str:
    """The board part of a device key, for boards that fix the whole machine (Raspberry Pi,
    Jetson): the name without vendor, revision and "Developer Kit" (``raspberry-pi-4-model-b``,
    ``jetson-orin-nano``). Empty for other boards."""
    if not board_family(board):
        return ""
    name = board.lower()
    name = re.sub(r"\brev(ision)?\s*[\w.]+", " ", name)
    name = re.sub(r"\bnvidia\b|\bdeveloper kit\b|\bdevkit\b", " ", name)
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")[:40].strip("-")


# -- GPUs --------------------------------------------------------------------------------------

# Present when an NVIDIA driver is (desktop and server driver, Jetson's nvgpu, WSL): only then is
# numba.cuda imported to ask for a GPU, so CPU-only hosts pay nothing.
_NVIDIA_DRIVER_FILES = (
    "/proc/driver/nvidia/version",
    "/dev/nvidiactl",
    "/dev/nvhost-ctrl-gpu",
    "/dev/nvgpu/igpu0/ctrl",
    "/sys/module/nvgpu",
    "/usr/lib/wsl/lib/libcuda.so",
)


def cuda_simulated() -> bool:
    """True under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``): there is no GPU to describe."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


def gpu_facts(device) -> dict[str, str]:
    """``DeviceInfo.extra`` entries describing a numba.cuda device object."""
    name = device.name
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    major, minor = device.compute_capability
    return {
        "gpu_name": str(name),
        "compute_capability": f"{major}.{minor}",
        "max_threads_per_block": str(int(device.MAX_THREADS_PER_BLOCK)),
        "max_shared_memory_per_block": str(int(device.MAX_SHARED_MEMORY_PER_BLOCK)),
        "max_registers_per_block": str(int(device.MAX_REGISTERS_PER_BLOCK)),
    }


def detect_gpu() -> dict[str, str]:
    """Facts about this host's first CUDA GPU (the one kernels run on), or {} when there is none.

    Cheap without a GPU: nothing is imported unless an NVIDIA driver is present, never under the
    CUDA simulator, and the answer is computed once per process.
    """
    if cuda_simulated() or not any(os.path.exists(path) for path in _NVIDIA_DRIVER_FILES):
        return {}
    return dict(_detect_gpu_once())


@functools.lru_cache(maxsize=1)
def _detect_gpu_once() -> tuple[tuple[str, str], ...]:
    try:
        from numba import cuda

        if not cuda.is_available():
            return ()
        return tuple(gpu_facts(cuda.gpus[0]).items())
    except Exception:  # noqa: BLE001 - a broken driver or numba without CUDA: no GPU, never a crash
        return ()


@functools.lru_cache(maxsize=1)
def host_cpu_model() -> str:
    """This host's CPU model name, as :func:`detect_device` records it, without the rest of it."""
    model = describe_cpu(platform.machine(), _read("/proc/cpuinfo")).model
    return model or platform.processor() or "unknown"


def detect_device(
    cpuinfo_path: str = "/proc/cpuinfo",
    board_path: str = "/proc/device-tree/model",
    *,
    arch: str | None = None,
    cores: int | None = None,
    gpu: dict[str, str] | None = None,
    auxv_path: str | None = None,
) -> DeviceInfo:
    """Describe this host (see :func:`describe_cpu`: the architecture first, then its features).

    The keywords replace what is read from the running host rather than from the files, so that a
    recorded ``cpuinfo``, device-tree ``model`` and ``auxv`` of another machine describe that
    machine: ``arch`` (default: ``platform.machine()``), ``cores`` (default: the CPUs this process
    may use), ``gpu`` (``DeviceInfo.extra`` GPU entries; default: :func:`detect_gpu`, ``{}`` for
    none) and ``auxv_path`` (default: this process's, unless ``arch`` names another machine).
    """
    if auxv_path is None and arch is None:
        auxv_path = "/proc/self/auxv"
    arch = arch or platform.machine() or "unknown"
    cpuinfo = _read(cpuinfo_path)
    cpu = describe_cpu(arch, cpuinfo, _read_bytes(auxv_path) if auxv_path else b"")
    model, flags = cpu.model, cpu.isa_features
    # the host's board is not the emulated program's (and an x86 host has none anyway)
    board = "" if cpu.emulated_on else recognise_board(_read(board_path), cpuinfo)
    try:
        import llvmlite.binding as llvm

        llvm_version = ".".join(str(x) for x in llvm.llvm_version_info)
    except Exception:  # noqa: BLE001 - llvmlite missing or broken: record nothing rather than fail
        llvm_version = ""
    try:
        numba_version = metadata.version("numba")
    except metadata.PackageNotFoundError:
        numba_version = ""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return DeviceInfo(
        arch=arch,
        cpu_model=model or platform.processor() or "unknown",
        cores=cores,
        isa_features=flags,
        numba_version=numba_version,
        llvm_version=llvm_version,
        os=f"{platform.system()} {platform.release()}",
        board=board,
        extra=dict(detect_gpu() if gpu is None else gpu),
    )


_TEXT_FIELDS = ("arch", "cpu_model", "numba_version", "llvm_version", "os", "board")


def _check_recorded(data: object) -> None:
    """Refuse recorded device info of the wrong shape (an imported file, an old row) with a
    ``ValueError`` naming the field, before it breaks space lookups later on."""
    if not isinstance(data, dict):
        raise ValueError(f"device info must be an object, not {type(data).__name__}")
    for name in _TEXT_FIELDS:
        if name in data and not isinstance(data[name], str):
            raise ValueError(f"device info field {name!r} must be a string, not {data[name]!r}")
    cores = data.get("cores", 0)
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 0:
        raise ValueError(f"device info field 'cores' must be a non-negative integer, not {cores!r}")
    features = data.get("isa_features", [])
    if not isinstance(features, (list, tuple)) or not all(isinstance(f, str) for f in features):
        raise ValueError(f"device info field 'isa_features' must be a list of strings, not {features!r}")
    if not isinstance(data.get("extra") or {}, dict):
        raise ValueError(f"device info field 'extra' must be an object, not {data['extra']!r}")
