"""What every CUDA template shares: the measuring GPU's limits, knob choices and rendering helpers.

Templates only render text: nothing here imports numba. The rendered modules import ``from numba
import cuda``, which is numba's built-in CUDA target or, where the ``numba-cuda`` package is
installed, NVIDIA's out-of-tree one that replaces it; both run under ``NUMBA_ENABLE_CUDASIM=1``.

Limits come from ``DeviceInfo.extra`` (``max_threads_per_block``, ``max_shared_memory_per_block``,
``max_registers_per_block``, ``compute_capability``; strings or ints, as they cross the wire). A
device that does not report them (``device=None``, a CPU-only host, an older agent) gets the
conservative defaults: 1024 threads and 48 KiB of shared memory per block, and the register file
of its compute capability when that is known (64 Ki registers per block, 32 Ki on the Jetson Nano
and TX2 generations, CC 5.3 and 6.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from measure_agent.device import DeviceInfo
from measure_agent.space import Config, ConfigSpace, SplitKnob

DEFAULT_MAX_THREADS = 1024
# numba allocates ``cuda.shared.array`` statically, and static shared memory is limited to 48 KiB
# per block on every compute capability (more needs dynamic shared memory and an opt-in).
STATIC_SHARED_LIMIT = 48 * 1024
DEFAULT_MAX_REGISTERS = 65536
MAX_REGISTERS_PER_THREAD = 255
MAX_BLOCK_DIM_Z = 64
MAX_GRID_YZ = 65535  # gridDim.y and gridDim.z; gridDim.x allows 2**31 - 1
WARP = 32

# Register file per block where it differs from 64 Ki (compute capability -> registers).
_REGISTERS_BY_CC = {(5, 3): 32768, (6, 2): 32768}

ITEMSIZE = {"float32": 4, "float64": 8}


def _int(value: object, default: int) -> int:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return default
    return number if number > 0 else default


def parse_compute_capability(text: object) -> tuple[int, int] | None:
    """``"8.0"`` -> ``(8, 0)``; None when absent or malformed."""
    if not text:
        return None
    parts = str(text).strip().split(".")
    try:
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    except ValueError:
        return None
    return major, minor


@dataclass(frozen=True)
class GpuLimits:
    """Per-block limits that prune a CUDA space."""

    max_threads: int = DEFAULT_MAX_THREADS
    max_shared_bytes: int = STATIC_SHARED_LIMIT
    max_registers: int = DEFAULT_MAX_REGISTERS
    compute_capability: tuple[int, int] | None = None

    @classmethod
    def of(cls, device: DeviceInfo | None) -> "GpuLimits":
        extra = device.extra if device is not None else {}
        cc = parse_compute_capability(extra.get("compute_capability"))
        registers_default = _REGISTERS_BY_CC.get(cc, DEFAULT_MAX_REGISTERS) if cc else DEFAULT_MAX_REGISTERS
        return cls(
            max_threads=min(_int(extra.get("max_threads_per_block"), DEFAULT_MAX_THREADS), DEFAULT_MAX_THREADS),
            max_shared_bytes=min(_int(extra.get("max_shared_memory_per_block"), STATIC_SHARED_LIMIT),
                                 STATIC_SHARED_LIMIT),
            max_registers=_int(extra.get("max_registers_per_block"), registers_default),
            compute_capability=cc,
        )

    def fits(self, threads: int, shared_bytes: int, registers_per_thread: int) -> bool:
        return (
            threads <= self.max_threads
            and shared_bytes <= self.max_shared_bytes
            and registers_per_thread <= MAX_REGISTERS_PER_THREAD
            and threads * registers_per_thread <= self.max_registers
        )


def registers_estimate(accumulators: int, operands: int, dtype: str) -> int:
    """A rough count of 32-bit registers per thread: the register tile, its operands and about 24
    for indices and addresses. The compiler decides the real number; this only prunes configs that
    are sure to spill or not to launch."""
    words = 2 if dtype == "float64" else 1
    return words * (accumulators + operands) + 24


def min_threads_wanted(*splits: SplitKnob, limit: int = DEFAULT_MAX_THREADS) -> int:
    """A full warp per block, or as many threads as the tiles of these axes can have at all."""
    possible = 1
    for split in splits:
        possible *= max(value[1] for value in split.values)
    return min(WARP, possible, limit)


def pick_split(knob: SplitKnob, threads_at_most: int, regs_at_most: int) -> tuple[int, ...]:
    """The split ``(blocks, threads, regs)`` with the most threads <= ``threads_at_most``, then the
    largest register tile <= ``regs_at_most`` (the smallest ones when nothing fits)."""
    def rank(value: tuple[int, ...]) -> tuple:
        _, threads, regs = value
        return (threads <= threads_at_most, threads if threads <= threads_at_most else -threads,
                regs <= regs_at_most, regs if regs <= regs_at_most else -regs)

    return max(knob.values, key=rank)


# A default config should give the GPU at least this many blocks when the problem allows it (about
# one per multiprocessor of a large GPU: 108 on an A100, 132 on an H100/H200).
MIN_BLOCKS = 128


def choose_default(space: ConfigSpace, candidates: Iterable[dict], blocks_of: Callable[[dict], int],
                   blocks_wanted: Callable[[dict], int] = lambda values: MIN_BLOCKS) -> Config:
    """The first valid candidate (knob -> value mappings in order of preference) that launches at
    least ``blocks_wanted(candidate)`` blocks (``MIN_BLOCKS`` unless told); else the valid one with
    the most blocks; else any valid config."""
    valid = []
    for values in candidates:
        config = Config(tuple((name, values[name]) for name in space.knob_names))
        if space.is_valid(config):
            if blocks_of(values) >= blocks_wanted(values):
                return config
            valid.append((blocks_of(values), -len(valid), config))
    if valid:
        return max(valid, key=lambda item: item[:2])[2]
    return next(space.iter_valid())


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def powers_of_two_covering(extent: int, start: int, stop: int) -> tuple[int, ...]:
    """``start, 2*start, ...`` up to the first value >= ``extent`` (at most ``stop``)."""
    out = [start]
    while out[-1] < extent and out[-1] * 2 <= stop:
        out.append(out[-1] * 2)
    return tuple(out)


def indent(lines: Iterable[str], spaces: int) -> list[str]:
    pad = " " * spaces
    return [pad + line if line else line for line in lines]


def grid_yz(tiles: int) -> int:
    """Blocks launched along grid y or z: all tiles, or the limit (the kernel then loops)."""
    return max(1, min(tiles, MAX_GRID_YZ))


def log2(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0
