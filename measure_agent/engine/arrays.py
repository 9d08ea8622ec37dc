"""Arrays at a fixed alignment: what the engine times kernels on, and what applications should pass.

numpy aligns an array's data to 16 bytes, so where a large array starts within a 64-byte cache line
is left to the allocator and differs from process to process. A kernel whose vector loads follow
the array's own alignment (NHWC depthwise: 64-byte vectors along the channels, every pixel's channels
starting at the same offset within a line) then runs at one speed in the run worker and another in
the application. Measured on a 2-core Xeon (AVX-512), each default config on the same data copied to
each offset (ms, medians of 8 windows of 50 ms): depthwise NHWC 3x3 144ch 56x56 0.367 at offset 0,
0.498-0.504 at 16, 32 or 48; 960ch 7x7 0.023 against 0.034; depthwise NCHW 32ch 112x112 0.248
against 0.261-0.274; matmul, dense and conv2d (which pack or transform their operands) within noise.
The engine times every CPU kernel on 64-byte-aligned inputs and outputs, so what it records does not
depend on where an allocator happened to put them, and ``tuner.empty_aligned`` gives applications
the same arrays.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

ARRAY_ALIGNMENT = 64  # bytes: a cache line, and an AVX-512 vector


def empty_aligned(shape: int | Sequence[int], dtype=np.float32, alignment: int = ARRAY_ALIGNMENT) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of ``alignment`` bytes."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    count = int(np.prod(shape, dtype=np.int64))
    if alignment < 1 or alignment & (alignment - 1) or alignment % dtype.itemsize:
        raise ValueError(f"alignment must be a power of two and a multiple of {dtype.itemsize}, not {alignment}")
    buffer = np.empty(count * dtype.itemsize + alignment, dtype=np.uint8)
    start = -buffer.ctypes.data % alignment
    return buffer[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def aligned_copy(array: np.ndarray, alignment: int = ARRAY_ALIGNMENT) -> np.ndarray:
    """A C-contiguous copy of ``array`` at ``alignment`` bytes."""
    copy = empty_aligned(array.shape, array.dtype, alignment)
    copy[...] = array
    return copy
