"""One call of a compiled CPU kernel: the same code where the run worker times it and where an
application uses it (``tuner.best_kernel``), so that what was measured is what is applied.

A fast kernel (0.1-0.3 ms) is sensitive to the Python around it: the checks an application's call
makes (types, shapes, the output buffer, the thread count) cost a microsecond in a warm loop but
about ten times that right after the calling thread was woken from waiting for the kernel's other
threads, which is every call. When the engine timed the bare numba dispatcher and the application
called it through its own checks, the applied kernel ran 9-27% slower than recorded on such
kernels. Both now call through :class:`KernelCall` and time back-to-back calls with
:func:`time_kernel_calls`, so both pay the same checks, which are kept few and cheap: arrays that
already are what the kernel takes (the usual case) are passed on as they are.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from measure_agent.engine.arrays import empty_aligned
from measure_agent.engine.runtime import KernelRuntime
from measure_agent.workload import Workload


class KernelCall:
    """``call(*inputs, out=None) -> out``: the operator's inputs (numpy arrays of the workload's
    dtype and shapes; other layouts are made C-contiguous, other dtypes refused) and an optional
    preallocated C-contiguous output, which must not overlap an input (the kernels read their
    inputs while writing it). The numba dispatcher ``kernel`` is called as
    ``kernel(*inputs, out, *runtime_args)`` with the thread count of ``runtime``
    (:meth:`KernelRuntime.call_threads`), set once per calling thread: numba's count belongs to
    the thread that calls."""

    def __init__(self, kernel: Callable, workload: Workload, runtime_args: Sequence[Any] = (),
                 runtime: KernelRuntime | None = None) -> None:
        self.kernel = kernel
        self.workload = workload
        self.runtime = runtime if runtime is not None else KernelRuntime.resolve()
        self._runtime_args = tuple(runtime_args)
        self._dtype = np.dtype(workload.dtype)
        self._input_shapes = tuple(tuple(s) for s in workload.spec.input_shapes(workload.params))
        self._output_shape = tuple(workload.spec.output_shape(workload.params))
        self._threads: int | None = None  # capped at numba's pool, known once it started
        self._calling_thread = threading.local()  # threads_set: numba's count set in this thread

    def __call__(self, *inputs: Any, out: np.ndarray | None = None) -> np.ndarray:
        dtype = self._dtype
        if len(inputs) != len(self._input_shapes):
            raise TypeError(f"{self.workload.op} takes {len(self._input_shapes)} input arrays, got {len(inputs)}")
        for array, shape in zip(inputs, self._input_shapes):
            if (type(array) is not np.ndarray or array.dtype is not dtype or array.shape != shape
                    or not array.flags.c_contiguous):
                inputs = self._conformed(inputs)
                break
        if out is None:
            out = empty_aligned(self._output_shape, dtype)  # as the run worker's (engine/arrays.py)
        else:
            if (type(out) is not np.ndarray or out.dtype != dtype or out.shape != self._output_shape
                    or not out.flags.c_contiguous or not out.flags.writeable):
                raise ValueError(f"out must be a writeable C-contiguous {dtype} array of shape {self._output_shape}")
            for array in inputs:
                if np.shares_memory(out, array):
                    raise ValueError("out must not share memory with an input")
        if not getattr(self._calling_thread, "threads_set", False):
            self._set_threads()
        self.kernel(*inputs, out, *self._runtime_args)
        return out

    def _conformed(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The inputs as the kernel takes them (C-contiguous arrays), or a one-line error."""
        arrays = []
        for index, (value, shape) in enumerate(zip(inputs, self._input_shapes)):
            array = np.ascontiguousarray(value)
            if array.dtype != self._dtype:
                raise TypeError(f"input {index} of {self.workload.key} must be {self._dtype}, not {array.dtype}")
            if array.shape != shape:
                raise ValueError(f"input {index} of {self.workload.key} must have shape {shape}, not {array.shape}")
            arrays.append(array)
        return tuple(arrays)

    def _set_threads(self) -> None:
        import numba

        if self._threads is None:
            self._threads = self.runtime.call_threads()
        if numba.get_num_threads() != self._threads:
            numba.set_num_threads(self._threads)
        self._calling_thread.threads_set = True


def time_kernel_calls(call: KernelCall, inputs: Sequence[np.ndarray], out: np.ndarray, number: int) -> float:
    """Seconds for ``number`` back-to-back ``call(*inputs, out=out)``, by the host's clock: how the
    run worker times a CPU kernel, and how a bench times an applied one."""
    start = time.perf_counter()
    for _ in range(number):
        call(*inputs, out=out)
    return time.perf_counter() - start
