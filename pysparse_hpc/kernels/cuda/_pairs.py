"""Paired loads and stores: two neighbouring elements of a row in one memory instruction.

FlashSparse's memory-efficient thread mapping gives each lane two adjacent output columns, so a
lane reads ``B[i, j:j + 2]`` and writes ``C[i, j:j + 2]`` with one 64-bit (float32) or 32-bit
(float16) access instead of two. On a real target `load_pair` / `store_pair` emit one vector
load or store of ``<2 x dtype>`` aligned to the pair; the caller must guarantee that alignment
(`pairs_aligned`: an even column, rows a whole number of pairs apart, an aligned base). Under the
simulator they are two plain element accesses.
"""
from numba import cuda

from ._mma import SIMULATED

__all__ = ["load_pair", "store_pair", "pairs_aligned"]


def pairs_aligned(view):
    """Whether every even column of the 2-D device array ``view`` starts an aligned pair."""
    if len(view.shape) != 2 or view.shape[1] % 2:
        return False
    itemsize = view.dtype.itemsize
    pair = 2 * itemsize
    if view.strides[1] != itemsize or (view.shape[0] > 1 and view.strides[0] % pair):
        return False
    interface = getattr(view, "__cuda_array_interface__", None)
    address = interface["data"][0] if interface is not None else view.ctypes.data  # simulator
    return address % pair == 0


if not SIMULATED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

    def _pair_pointer(context, builder, array_type, array, row, col, row_type, col_type):
        """A ``<2 x dtype>*`` to ``array[row, col]`` and the alignment of a pair."""
        data = context.make_array(array_type)(context, builder, array)
        indices = [context.cast(builder, row, row_type, types.intp),
                   context.cast(builder, col, col_type, types.intp)]
        pointer = cgutils.get_item_pointer(context, builder, array_type, data, indices,
                                           wraparound=False)
        element = context.get_data_type(array_type.dtype)
        vector = ir.VectorType(element, 2)
        alignment = 2 * context.get_abi_sizeof(element)
        return builder.bitcast(pointer, vector.as_pointer()), alignment

    @intrinsic
    def load_pair(typingctx, array, row, col):
        """``(array[row, col], array[row, col + 1])`` in one aligned vector load."""
        sig = types.UniTuple(array.dtype, 2)(array, row, col)

        def codegen(context, builder, signature, args):
            pointer, alignment = _pair_pointer(context, builder, signature.args[0], args[0],
                                               args[1], args[2], *signature.args[1:])
            pair = builder.load(pointer, align=alignment)
            values = [builder.extract_element(pair, ir.Constant(ir.IntType(32), k))
                      for k in range(2)]
            return context.make_tuple(builder, signature.return_type, values)
        return sig, codegen

    @intrinsic
    def store_pair(typingctx, array, row, col, first, second):
        """``array[row, col], array[row, col + 1] = first, second`` in one aligned vector store
        (the values are converted to the array's dtype)."""
        sig = types.void(array, row, col, first, second)

        def codegen(context, builder, signature, args):
            array_type = signature.args[0]
            pointer, alignment = _pair_pointer(context, builder, array_type, args[0], args[1],
                                               args[2], *signature.args[1:3])
            pair = ir.Constant(pointer.type.pointee, ir.Undefined)
            for k, (value, value_type) in enumerate(zip(args[3:], signature.args[3:])):
                value = context.cast(builder, value, value_type, array_type.dtype)
                pair = builder.insert_element(pair, value, ir.Constant(ir.IntType(32), k))
            builder.store(pair, pointer, align=alignment)
            return context.get_dummy_value()
        return sig, codegen

else:
    @cuda.jit(device=True)
    def load_pair(array, row, col):
        """``(array[row, col], array[row, col + 1])``."""
        return array[row, col], array[row, col + 1]

    @cuda.jit(device=True)
    def store_pair(array, row, col, first, second):
        """``array[row, col], array[row, col + 1] = first, second``."""
        array[row, col] = first
        array[row, col + 1] = second
