"""What the measuring machine is: recorded with every trial and used to name the device key."""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from importlib import metadata


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
        known = {k: data[k] for k in fields if k in data and k != "extra"}
        known["isa_features"] = tuple(known.get("isa_features", ()))
        known.setdefault("arch", "unknown")
        known.setdefault("cpu_model", "unknown")
        known.setdefault("cores", 0)
        extra = dict(data.get("extra") or {})
        extra.update({k: str(v) for k, v in data.items() if k not in fields})
        return cls(**known, extra=extra)

    @property
    def fingerprint(self) -> str:
        """A stable text identity (what a space may depend on)."""
        return json.dumps(self.to_json(), sort_keys=True)

    @property
    def default_key(self) -> str:
        """A stable, descriptive key such as ``x86_64-amd-epyc-2c-avx2``."""
        model = re.sub(r"\(r\)|\(tm\)|cpu|processor|\d+-core|@.*$", " ", self.cpu_model.lower())
        slug = re.sub(r"[^a-z0-9]+", "-", model).strip("-")[:40].strip("-") or "cpu"
        vector = next((f for f in ("avx512f", "avx2", "neon", "asimd", "sse4_2") if f in self.isa_features), "")
        parts = [self.arch, slug, f"{self.cores}c"] + ([vector.replace("avx512f", "avx512")] if vector else [])
        return "-".join(parts)


# ISA features worth recording: they decide vector width and so the best register tiles.
_INTERESTING_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "neon", "asimd", "sve")


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace").replace("\x00", "")
    except OSError:
        return ""


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """CPU model name and interesting ISA flags from ``/proc/cpuinfo`` text (x86 or ARM)."""
    model = ""
    flags: set[str] = set()
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, value = (s.strip() for s in line.split(":", 1))
        key = key.lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value
        elif key in ("flags", "features"):
            flags.update(value.split())
    return model, tuple(f for f in _INTERESTING_FLAGS if f in flags)


def detect_device(cpuinfo_path: str = "/proc/cpuinfo", board_path: str = "/proc/device-tree/model") -> DeviceInfo:
    """Describe this host."""
    model, flags = parse_cpuinfo(_read(cpuinfo_path))
    board = _read(board_path).strip()
    try:
        import llvmlite.binding as llvm

        llvm_version = ".".join(str(x) for x in llvm.llvm_version_info)
    except Exception:  # noqa: BLE001 - llvmlite missing or broken: record nothing rather than fail
        llvm_version = ""
    try:
        numba_version = metadata.version("numba")
    except metadata.PackageNotFoundError:
        numba_version = ""
    return DeviceInfo(
        arch=platform.machine() or "unknown",
        cpu_model=model or platform.processor() or "unknown",
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        isa_features=flags,
        numba_version=numba_version,
        llvm_version=llvm_version,
        os=f"{platform.system()} {platform.release()}",
        board=board,
    )
