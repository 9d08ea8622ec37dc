"""Fixed-size arrays on the stack of a numba function, for register-resident accumulators.

A tile of accumulators allocated with ``np.zeros`` lives on the heap and LLVM cannot rule out that
it aliases the inputs, so it is never kept in registers. An array whose size is a compile-time
literal, ``alloca``'d in the function's entry block, is split into scalars by LLVM (SROA) and, once
the updates are unrolled, turned into vector registers by the SLP vectoriser.

Rendered kernels import this module (it is installed with the agent), so it must stay small and
depend only on numba and llvmlite.
"""

from __future__ import annotations

import math

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array


def _literal_shape(shape) -> tuple[int, ...] | None:
    if isinstance(shape, types.IntegerLiteral):
        return (shape.literal_value,)
    if isinstance(shape, types.BaseTuple) and all(isinstance(t, types.IntegerLiteral) for t in shape):
        return tuple(t.literal_value for t in shape)
    return None


def _element_type(dtype):
    if isinstance(dtype, types.NumberClass):
        return dtype.instance_type
    if isinstance(dtype, types.DType):
        return dtype.dtype
    return None


@intrinsic(prefer_literal=True)
def stack_array(typingctx, shape, dtype):
    """``stack_array(SHAPE, np.float32)``: an uninitialised C-contiguous array on the stack.

    ``SHAPE`` is an integer literal or a tuple of integer literals; ``dtype`` a numba number class
    (``np.float32``) or an array's ``.dtype``. The memory belongs to the calling function's frame
    (its entry block): every call at the same site returns the same memory, and the array must not
    outlive the function (never return it or store it in another array).
    """
    dims = _literal_shape(shape)
    element = _element_type(dtype)
    if dims is None:
        raise TypingError("stack_array needs a literal int or tuple of literal ints as its shape")
    if element is None:
        raise TypingError(f"stack_array needs a number type as dtype, got {dtype}")
    if any(d <= 0 for d in dims):
        raise TypingError(f"stack_array shape must be positive, got {dims}")
    array_type = types.Array(element, len(dims), "C")

    def codegen(context, builder, signature, args):
        element_ir = context.get_data_type(element)
        count = math.prod(dims)
        # alloca_once puts the allocation in the entry block, where SROA/mem2reg can promote it.
        storage = cgutils.alloca_once(builder, ir.ArrayType(element_ir, count))
        data = builder.bitcast(storage, element_ir.as_pointer())
        itemsize = context.get_abi_sizeof(element_ir)
        strides, stride = [], itemsize
        for d in reversed(dims):
            strides.append(stride)
            stride *= d
        intp = lambda v: context.get_constant(types.intp, v)  # noqa: E731
        array = make_array(array_type)(context, builder)
        populate_array(
            array,
            data=data,
            shape=[intp(d) for d in dims],
            strides=[intp(s) for s in reversed(strides)],
            itemsize=intp(itemsize),
            meminfo=None,
        )
        return array._getvalue()

    return array_type(shape, dtype), codegen
