"""Applied = measured, the call itself: the run worker times a CPU kernel through the same
``KernelCall`` an application's ``tuner.best_kernel`` kernel is, checks and thread count included."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from measure_agent.engine import MeasureStatus, TimingConfig
from measure_agent.engine import kernel_call as kernel_call_module
from measure_agent.engine.kernel_call import KernelCall, time_kernel_calls
from measure_agent.engine.runtime import KernelRuntime
from measure_agent.engine.worker import Worker
from measure_agent.templates import default_catalog
from measure_agent.workload import parse_workload
from tuner.apply import TunedKernel

W = parse_workload("matmul(M=3,N=4,K=5)")


class Recorder:
    """Stands in for the numba dispatcher: keeps what it was called with, computes the product."""

    def __init__(self):
        self.calls = []

    def __call__(self, a, b, out, *runtime_args):
        self.calls.append((a, b, out, runtime_args))
        np.matmul(a, b, out=out)


def _call(runtime_args=()):
    recorder = Recorder()
    return KernelCall(recorder, W, runtime_args, KernelRuntime(num_threads=1)), recorder


def test_arrays_the_kernel_takes_are_passed_as_they_are_with_the_runtime_args():
    call, recorder = _call(runtime_args=(8, 16))
    a, b = np.ones((3, 5), np.float32), np.ones((5, 4), np.float32)
    out = np.empty((3, 4), np.float32)
    assert call(a, b, out=out) is out
    [(seen_a, seen_b, seen_out, runtime_args)] = recorder.calls
    assert seen_a is a and seen_b is b and seen_out is out and runtime_args == (8, 16)
    np.testing.assert_allclose(out, 5.0)


def test_other_layouts_are_made_contiguous_and_an_output_is_allocated():
    call, recorder = _call()
    a = np.asfortranarray(np.arange(15, dtype=np.float32).reshape(3, 5))
    b = np.arange(40, dtype=np.float32).reshape(5, 8)[:, ::2]  # strided view
    result = call(a, b)
    seen_a, seen_b, _, _ = recorder.calls[0]
    assert seen_a.flags.c_contiguous and seen_b.flags.c_contiguous
    np.testing.assert_allclose(result, a @ b)


@pytest.mark.parametrize("inputs, error, words", [
    ((np.ones((3, 5), np.float64), np.ones((5, 4), np.float32)), TypeError, "must be float32, not float64"),
    ((np.ones((3, 5), np.float32), np.ones((4, 5), np.float32)), ValueError, "must have shape (5, 4)"),
    ((np.ones((3, 5), np.float32),), TypeError, "takes 2 input arrays, got 1"),
])
def test_bad_inputs_are_one_line_errors_and_the_kernel_is_not_called(inputs, error, words):
    call, recorder = _call()
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(*inputs)
    assert recorder.calls == []


def test_an_output_that_overlaps_an_input_or_is_not_writeable_is_refused():
    call, recorder = _call()
    buffer = np.ones(40, np.float32)
    a, b = buffer[:15].reshape(3, 5), np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match="must not share memory"):
        call(a, b, out=buffer[:12].reshape(3, 4))
    frozen = np.empty((3, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable C-contiguous float32 array of shape"):
        call(a, b, out=frozen)
    assert recorder.calls == []


def test_time_kernel_calls_makes_the_calls_it_times():
    call, recorder = _call()
    a, b, out = np.ones((3, 5), np.float32), np.ones((5, 4), np.float32), np.empty((3, 4), np.float32)
    assert time_kernel_calls(call, (a, b), out, 7) >= 0.0
    assert len(recorder.calls) == 7 and all(seen[2] is out for seen in recorder.calls)


def test_an_applied_kernel_calls_through_the_engine_call_path():
    # no override: what an application calls is KernelCall.__call__, the code the worker times
    assert issubclass(TunedKernel, KernelCall) and "__call__" not in vars(TunedKernel)


def test_the_run_worker_times_every_call_through_kernel_call(monkeypatch, kernel_cache_dir):
    seen = []
    real_call = KernelCall.__call__

    def counting_call(self, *inputs, out=None):
        seen.append(self)
        return real_call(self, *inputs, out=out)

    monkeypatch.setattr(kernel_call_module.KernelCall, "__call__", counting_call)
    workload = parse_workload("matmul(M=8,N=16,K=8)")
    catalog = default_catalog()
    worker = Worker(catalog, kernel_cache_dir)
    space = catalog.space(workload, "cpu", worker.device)
    config = catalog.get(workload.op, "cpu").default_config(workload, space)
    timing = TimingConfig(number=3, repeat=2, warmup=2)
    answer = worker.handle({"op": "run", "workload": workload.key, "target": "cpu", "config": config.to_json(),
                            "timing": asdict(timing)})
    assert answer["status"] == MeasureStatus.OK.value, answer
    number = answer["details"]["number"]
    # the warm-up calls and every timed call (repeats redone on a busy host add more)
    assert len(seen) >= timing.warmup + number * timing.repeat
    assert len({id(call) for call in seen}) == 1 and seen[0].runtime == KernelRuntime.resolve()


def test_the_run_worker_times_on_64_byte_aligned_arrays_and_an_application_gets_the_same(monkeypatch,
                                                                                     kernel_cache_dir):
    """Where an array starts within a cache line changes some kernels' speed (engine/arrays.py): the
    worker's inputs and output, and an output the call allocates, start on a 64-byte boundary."""
    from measure_agent.engine.checking import make_inputs, make_problem

    seen = []
    real_call = KernelCall.__call__

    def recording_call(self, *inputs, out=None):
        result = real_call(self, *inputs, out=out)
        seen.append([a.ctypes.data % 64 for a in (*inputs, result)])
        return result

    monkeypatch.setattr(kernel_call_module.KernelCall, "__call__", recording_call)
    workload = parse_workload("depthwise_conv2d_nhwc(N=1,C=20,H=5,W=5,R=3,S=3,pad=1)")
    catalog = default_catalog()
    worker = Worker(catalog, kernel_cache_dir)
    config = catalog.get(workload.op, "cpu").default_config(workload, catalog.space(workload, "cpu", worker.device))
    answer = worker.handle({"op": "run", "workload": workload.key, "target": "cpu", "config": config.to_json(),
                            "timing": asdict(TimingConfig(number=1, repeat=1, warmup=1))})
    assert answer["status"] == MeasureStatus.OK.value, answer
    assert seen and all(offsets == [0, 0, 0] for offsets in seen)
    # the same draw as the reference's, at the alignment
    for drawn, checked in zip(make_inputs(workload), make_problem(workload).inputs):
        assert drawn.ctypes.data % 64 == 0 and drawn.flags.c_contiguous
        np.testing.assert_array_equal(drawn, checked)

    seen.clear()
    call, _ = _call()
    call(np.ones((3, 5), np.float32), np.ones((5, 4), np.float32))  # an output it allocates
    assert seen[-1][-1] == 0


@pytest.mark.parametrize("shape, dtype", [((3, 5), np.float32), (7, np.float64), ((2, 1, 3), np.float32)])
def test_empty_aligned_gives_c_contiguous_arrays_on_the_boundary(shape, dtype):
    import tuner

    for _ in range(8):  # the allocator's offsets vary: every one must be corrected
        array = tuner.empty_aligned(shape, dtype)
        assert array.dtype == dtype and array.shape == ((shape,) if isinstance(shape, int) else shape)
        assert array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % 64 == 0
    with pytest.raises(ValueError, match="power of two"):
        tuner.empty_aligned((2, 2), np.float32, alignment=48)
