"""Every operator's ``input_shapes`` are the shapes of what ``make_inputs`` draws, and what
``tuner.best_kernel``'s kernels check their arguments against."""

import numpy as np
import pytest

from measure_agent.workload import parse_workload
from measure_agent.workload.operators import OPERATORS

# One small workload per operator, with unequal sizes so that a swapped axis shows.
WORKLOADS = {
    "matmul": "matmul(M=3,N=5,K=7)",
    "dense": "dense(M=3,N=5,K=7)",
    "batch_matmul": "batch_matmul(B=2,M=3,N=5,K=7)",
    "conv2d_nchw": "conv2d_nchw(N=2,C=3,H=9,W=8,K=5,R=3,S=2,stride=2,pad=1)",
    "conv2d_nhwc": "conv2d_nhwc(N=2,C=3,H=9,W=8,K=5,R=3,S=2,stride=2,pad=1)",
    "depthwise_conv2d_nchw": "depthwise_conv2d_nchw(N=2,C=3,H=9,W=8,R=3,S=2,multiplier=2)",
    "depthwise_conv2d_nhwc": "depthwise_conv2d_nhwc(N=2,C=3,H=9,W=8,R=3,S=2,multiplier=2)",
}


def test_every_operator_has_a_workload_here():
    assert set(WORKLOADS) == set(OPERATORS)


@pytest.mark.parametrize("op", sorted(WORKLOADS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_input_shapes_are_the_shapes_of_make_inputs(op, dtype):
    workload = parse_workload(WORKLOADS[op][:-1] + f",dtype={dtype})")
    spec, params = workload.spec, workload.params
    shapes = spec.input_shapes(params)
    inputs = spec.make_inputs(params, np.dtype(dtype), np.random.default_rng(0))
    assert tuple(x.shape for x in inputs) == shapes
    assert all(x.dtype == np.dtype(dtype) for x in inputs)
    assert spec.array_shapes(params) == [*shapes, spec.output_shape(params)]
    # the reference accepts them and writes the output shape
    assert spec.reference(params, *inputs).shape == spec.output_shape(params)


@pytest.mark.parametrize("op", sorted(WORKLOADS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_problems_the_engine_times_take_the_calls_fast_path(op, dtype):
    """The run worker times through ``KernelCall``: the problem's inputs must be passed on as they
    are (a conversion inside every timed call would be timed too)."""
    from measure_agent.engine.checking import make_problem
    from measure_agent.engine.kernel_call import KernelCall
    from measure_agent.engine.runtime import KernelRuntime

    workload = parse_workload(WORKLOADS[op][:-1] + f",dtype={dtype})")
    seen = []
    call = KernelCall(lambda *args: seen.append(args), workload, (), KernelRuntime(num_threads=1))
    problem = make_problem(workload)
    out = np.empty(workload.spec.output_shape(workload.params), dtype=dtype)
    call(*problem.inputs, out=out)
    [args] = seen
    assert all(passed is given for passed, given in zip(args, problem.inputs)) and args[len(problem.inputs)] is out
