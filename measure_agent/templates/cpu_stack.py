"""Fixed-size arrays on the stack of a numba function, for register-resident accumulators.

A tile of accumulators allocated with ``np.zeros`` lives on the heap and LLVM cannot rule out that
it aliases the inputs, so it is never kept in registers. An array whose size is a compile-time
literal, ``alloca``'d in the function's entry block, is split into scalars by LLVM (SROA) and, once
the updates are unrolled, turned into vector registers by the SLP vectoriser.

Rendered kernels import this module (it is installed with the agent), so it must stay small and
depend only on numba and llvmlite.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array


def _element_type(dtype):
    if isinstance(dtype, types.NumberClass):
        return dtype.instance_type
    if isinstance(dtype, types.DType):
        return dtype.dtype
    return None


@intrinsic(prefer_literal=True)
def stack_array(typingctx, length, dtype):
    """``stack_array(LENGTH, np.float32)``: an uninitialised 1-D array of LENGTH elements on the stack.

    ``LENGTH`` must be an integer literal written at the call site: a global or a tuple shape loses
    its literal type inside ``prange`` bodies, so only 1-D is offered (index a 2-D tile as
    ``r * NR + c``). ``dtype`` is a numba number class (``np.float32``) or an array's ``.dtype``.
    The memory belongs to the calling function's frame (its entry block): every call at the same
    site returns the same memory, and the array must not outlive the function (never return it or
    store it in another array).
    """
    if not isinstance(length, types.IntegerLiteral):
        raise TypingError(f"stack_array needs an integer literal as its length, got {length}")
    count = length.literal_value
    if count <= 0:
        raise TypingError(f"stack_array length must be positive, got {count}")
    element = _element_type(dtype)
    if element is None:
        raise TypingError(f"stack_array needs a number type as dtype, got {dtype}")
    array_type = types.Array(element, 1, "C")

    def codegen(context, builder, signature, args):
        element_ir = context.get_data_type(element)
        # alloca_once puts the allocation in the entry block, where SROA/mem2reg can promote it.
        storage = cgutils.alloca_once(builder, ir.ArrayType(element_ir, count))
        data = builder.bitcast(storage, element_ir.as_pointer())
        itemsize = context.get_abi_sizeof(element_ir)
        intp = lambda v: context.get_constant(types.intp, v)  # noqa: E731
        array = make_array(array_type)(context, builder)
        populate_array(
            array,
            data=data,
            shape=[intp(count)],
            strides=[intp(itemsize)],
            itemsize=intp(itemsize),
            meminfo=None,
        )
        return array._getvalue()

    return array_type(length, dtype), codegen
