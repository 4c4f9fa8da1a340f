"""Dense rows held in vector registers while a row's stored entries stream past.

The plain SpMM loop ``out[row, j] += value * B[col, j]`` keeps the output row in memory: LLVM
cannot prove that ``out`` and ``B`` do not overlap, so every stored entry reloads and rewrites
the row (a store-to-load dependence of about ten cycles per entry, measured on Cora at N=32),
behind a run-time overlap check per group of entries. Numba has no SIMD types to hold the row
instead, so the two intrinsics here are written as LLVM vector code:

- `add_row_products` (SpMM) keeps up to `MAX_VECTORS` accumulators of `VECTOR_BYTES` each in
  registers for a whole row of A and writes the output row once;
- `dot_row_products` (SDDMM) keeps a row of X in registers and dots it with the Y row of every
  stored entry of that row.

Rows are read with vector loads, a partial last vector with masked loads and stores (no read
or write past the row). Each handles one register-sized chunk of columns; the callers loop over
chunks.

Numba's on-disk cache keys a kernel on its own module's source: after editing this file, clear
the kernels' ``__pycache__`` (or touch ``spmm.py`` and ``sddmm.py``) so they are compiled again.
"""
import llvmlite.binding as llvm_binding
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["VECTOR_BYTES", "MAX_VECTORS", "add_row_products", "dot_row_products"]


def _vector_bytes():
    """Widest vector register of the CPU Numba compiles for: its feature string when one is
    set, the host's otherwise, 16 bytes when neither is known (e.g. ``NUMBA_CPU_NAME=generic``
    for portable caches), which any target can split its vectors into."""
    features = numba.config.CPU_FEATURES
    if not features:
        if numba.config.CPU_NAME not in (None, "host"):
            return 16
        try:
            features = llvm_binding.get_host_cpu_features().flatten()
        except RuntimeError:   # llvmlite cannot read the features on this platform
            return 16
    enabled = {flag[1:] for flag in features.split(",") if flag.startswith("+")}
    if "avx512f" in enabled:
        return 64
    return 32 if "avx" in enabled else 16


VECTOR_BYTES = _vector_bytes()
# Vectors per chunk: 8 (128 float32 columns with AVX-512) leave at least half of the
# registers (16 with AVX2, 32 with AVX-512) for the broadcast value and the loads; 16 vectors
# were no faster at N=256.
MAX_VECTORS = 8

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _as_i64(builder, value):
    return value if value.type == _I64 else builder.sext(value, _I64)


def _splat(builder, scalar, lanes):
    vector_type = ir.VectorType(scalar.type, lanes)
    first = builder.insert_element(ir.Constant(vector_type, ir.Undefined), scalar,
                                   ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, ir.Constant(vector_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


class _Chunk:
    """Vector operations over one chunk of ``width`` columns of a float dtype: full vectors,
    then a last vector of which only the live lanes are read or written."""

    def __init__(self, context, builder, dtype, width):
        self.builder = builder
        element = context.get_value_type(dtype)
        self.itemsize = context.get_abi_sizeof(element)
        self.lanes = VECTOR_BYTES // self.itemsize
        self.type = ir.VectorType(element, self.lanes)
        self.pointer = self.type.as_pointer()
        self.zero = ir.Constant(self.type, [0.0] * self.lanes)
        self.alignment = ir.Constant(_I32, self.itemsize)
        lanes = ir.Constant(_I64, self.lanes)
        self.n_vectors = builder.udiv(builder.add(width, ir.Constant(_I64, self.lanes - 1)),
                                      lanes)
        live = builder.sub(width, builder.mul(builder.sub(self.n_vectors, ir.Constant(_I64, 1)),
                                              lanes))
        lane_ids = ir.Constant(ir.VectorType(_I64, self.lanes), list(range(self.lanes)))
        self.tail_mask = builder.icmp_signed("<", lane_ids, _splat(builder, live, self.lanes))
        suffix = f"v{self.lanes}f{self.itemsize * 8}"
        self._fma = self._declare(f"llvm.fma.{suffix}", self.type, [self.type] * 3)
        self._masked_load = self._declare(f"llvm.masked.load.{suffix}.p0", self.type,
                                          [self.pointer, _I32, self.tail_mask.type, self.type])
        self._masked_store = self._declare(f"llvm.masked.store.{suffix}.p0", ir.VoidType(),
                                           [self.type, self.pointer, _I32, self.tail_mask.type])
        self._sum = self._declare(f"llvm.vector.reduce.fadd.{suffix}", element,
                                  [element, self.type])

    def _declare(self, name, return_type, argument_types):
        function_type = ir.FunctionType(return_type, argument_types)
        return cgutils.get_or_insert_function(self.builder.module, function_type, name)

    def _address(self, start, k):
        return self.builder.bitcast(self.builder.gep(start, [ir.Constant(_I64, k * self.lanes)]),
                                    self.pointer)

    def load(self, start, k, last):
        """Vector ``k`` of the row at ``start``; ``last`` reads the live lanes only (others 0)."""
        address = self._address(start, k)
        if last:
            return self.builder.call(self._masked_load,
                                     [address, self.alignment, self.tail_mask, self.zero])
        return self.builder.load(address, align=self.itemsize)

    def store(self, value, start, k, last):
        address = self._address(start, k)
        if last:
            self.builder.call(self._masked_store,
                              [value, address, self.alignment, self.tail_mask])
        else:
            self.builder.store(value, address, align=self.itemsize)

    def fma(self, a, b, c):
        return self.builder.call(self._fma, [a, b, c])

    def sum(self, vector):
        """Sum of the lanes, in any order (a shuffle tree, not a serial chain)."""
        negative_zero = ir.Constant(self.type.element, -0.0)
        return self.builder.call(self._sum, [negative_zero, vector], fastmath=("reassoc",))

    def for_each_count(self, emit):
        """Emit ``emit(n)`` once per vector count n = 1..MAX_VECTORS and run the one that
        matches the chunk: straight-line code per count, so accumulators get fixed registers."""
        builder = self.builder
        done = builder.append_basic_block("chunk.done")
        switch = builder.switch(self.n_vectors, done)
        for count in range(1, MAX_VECTORS + 1):
            block = builder.append_basic_block(f"chunk.{count}")
            switch.add_case(ir.Constant(_I64, count), block)
            builder.position_at_end(block)
            emit(count)
            builder.branch(done)
        builder.position_at_end(done)


def _contiguous(ndim, *arrays):
    return all(isinstance(a, types.Array) and a.ndim == ndim and a.layout == "C" for a in arrays)


def _one_float_dtype(*arrays):
    dtypes = {a.dtype for a in arrays}
    return len(dtypes) == 1 and dtypes <= {types.float32, types.float64}


def _row_start(builder, array, columns, row, first_column):
    """Pointer to ``array[row, first_column]`` of a C-contiguous 2-D array."""
    return builder.gep(array.data, [builder.add(builder.mul(row, columns), first_column)])


@intrinsic
def add_row_products(typingctx, out, B, indices, data, row, p_start, p_stop, j0, width,
                     value_step, value_offset):
    """``out[row, j0:j0 + width] = sum(data[p * value_step + value_offset] *
    B[indices[p], j0:j0 + width])`` over ``p_start <= p < p_stop``, for
    ``0 < width <= MAX_VECTORS * VECTOR_BYTES / B.itemsize``.

    ``out`` and ``B`` are C-contiguous 2-D arrays of ``data``'s float dtype, ``indices`` and
    ``data`` contiguous 1-D arrays. ``value_step`` and ``value_offset`` pick one head's column
    of per-edge values stored (nnz, heads) and flattened; 1 and 0 for a plain CSR. The sum
    starts from zero, so rows without entries are written as zeros.
    """
    if not (_contiguous(2, out, B) and _contiguous(1, indices, data)
            and _one_float_dtype(out, B, data)):
        return None
    signature = types.void(out, B, indices, data, row, p_start, p_stop, j0, width, value_step,
                           value_offset)

    def codegen(context, builder, sig, args):
        out_array, B_array, indices_array, data_array = (
            context.make_array(array_type)(context, builder, value)
            for array_type, value in zip(sig.args[:4], args[:4]))
        row_value, start, stop, first_column, width_value, step, offset = (
            _as_i64(builder, a) for a in args[4:])
        chunk = _Chunk(context, builder, sig.args[1].dtype, width_value)
        B_columns = cgutils.unpack_tuple(builder, B_array.shape, 2)[1]
        out_columns = cgutils.unpack_tuple(builder, out_array.shape, 2)[1]
        out_start = _row_start(builder, out_array, out_columns, row_value, first_column)

        def emit(n_vectors):
            # Allocas go to the entry block; LLVM promotes them to registers (SROA).
            sums = [cgutils.alloca_once_value(builder, chunk.zero) for _ in range(n_vectors)]
            with cgutils.for_range_slice(builder, start, stop, ir.Constant(_I64, 1)) as (p, _):
                column = _as_i64(builder, builder.load(builder.gep(indices_array.data, [p])))
                slot = builder.add(builder.mul(p, step), offset)
                value = _splat(builder, builder.load(builder.gep(data_array.data, [slot])),
                               chunk.lanes)
                source = _row_start(builder, B_array, B_columns, column, first_column)
                for k in range(n_vectors):
                    b = chunk.load(source, k, last=k == n_vectors - 1)
                    builder.store(chunk.fma(value, b, builder.load(sums[k])), sums[k])
            for k in range(n_vectors):
                chunk.store(builder.load(sums[k]), out_start, k, last=k == n_vectors - 1)

        chunk.for_each_count(emit)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def dot_row_products(typingctx, out, X, Y, indices, row, p_start, p_stop, j0, width, accumulate):
    """``out[p] (+)= dot(X[row, j0:j0 + width], Y[indices[p], j0:j0 + width])`` for
    ``p_start <= p < p_stop``, with ``width`` bounded as for `add_row_products`.

    ``X`` and ``Y`` are C-contiguous 2-D arrays of ``out``'s float dtype, ``out`` and
    ``indices`` contiguous 1-D arrays. ``accumulate`` (a compile-time bool) adds to ``out[p]``
    instead of overwriting it, for chunks after the first.
    """
    if not isinstance(accumulate, types.BooleanLiteral):
        return None
    if not (_contiguous(2, X, Y) and _contiguous(1, out, indices)
            and _one_float_dtype(out, X, Y)):
        return None
    add_to_out = accumulate.literal_value
    signature = types.void(out, X, Y, indices, row, p_start, p_stop, j0, width, accumulate)

    def codegen(context, builder, sig, args):
        out_array, X_array, Y_array, indices_array = (
            context.make_array(array_type)(context, builder, value)
            for array_type, value in zip(sig.args[:4], args[:4]))
        row_value, start, stop, first_column, width_value = (_as_i64(builder, a)
                                                             for a in args[4:9])
        chunk = _Chunk(context, builder, sig.args[1].dtype, width_value)
        X_columns = cgutils.unpack_tuple(builder, X_array.shape, 2)[1]
        Y_columns = cgutils.unpack_tuple(builder, Y_array.shape, 2)[1]
        x_start = _row_start(builder, X_array, X_columns, row_value, first_column)

        def emit(n_vectors):
            x = [chunk.load(x_start, k, last=k == n_vectors - 1) for k in range(n_vectors)]
            with cgutils.for_range_slice(builder, start, stop, ir.Constant(_I64, 1)) as (p, _):
                column = _as_i64(builder, builder.load(builder.gep(indices_array.data, [p])))
                y_start = _row_start(builder, Y_array, Y_columns, column, first_column)
                # Masked-off lanes load as 0 in y, so they add nothing.
                products = builder.fmul(x[0], chunk.load(y_start, 0, last=n_vectors == 1))
                for k in range(1, n_vectors):
                    products = chunk.fma(x[k], chunk.load(y_start, k, last=k == n_vectors - 1),
                                         products)
                total = chunk.sum(products)
                slot = builder.gep(out_array.data, [p])
                if add_to_out:
                    total = builder.fadd(builder.load(slot), total)
                builder.store(total, slot)

        chunk.for_each_count(emit)
        return context.get_dummy_value()

    return signature, codegen
