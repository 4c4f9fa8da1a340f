"""Dense rows held in vector registers while a row's stored entries stream past.

The plain SpMM loop ``out[row, j] += value * B[col, j]`` keeps the output row in memory: LLVM
cannot prove that ``out`` and ``B`` do not overlap, so every stored entry reloads and rewrites
the row (a store-to-load dependence of about ten cycles per entry, measured on Cora at N=32),
behind a run-time overlap check per group of entries. Numba has no SIMD types to hold the row
instead, so the two intrinsics here are written as LLVM vector code:

- `sum_rows_products` (SpMM) keeps up to `MAX_VECTORS` accumulators of `VECTOR_BYTES` each in
  registers for a whole row of A and writes the output row once;
- `dot_rows_products` (SDDMM) keeps a row of X in registers and dots it with the Y row of
  every stored entry of that row (`dot_rows_unsummed`, the same without the sums, is only
  for measuring what bounds it).

Both take a range of rows and run the row loop themselves. Rows are read with vector loads, a
partial last vector with masked loads and stores (no read or write past the row); rows wider
than `MAX_VECTORS` vectors are done a register-sized chunk of columns at a time. Which code
the last chunk takes depends only on the width, so it is chosen once per call: choosing it per
row, as a first version did, cost 15-45% on graphs of a few entries per row at N <= 32.

Numba's on-disk cache keys a kernel on its own module's source: after editing this file, clear
the kernels' ``__pycache__`` (or touch ``spmm.py`` and ``sddmm.py``) so they are compiled again.
"""
import contextlib
import inspect

import llvmlite.binding as llvm_binding
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

__all__ = ["VECTOR_BYTES", "MAX_VECTORS", "compile_per_layout", "sum_rows_products",
           "dot_rows_products", "dot_rows_unsummed"]


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


def _opaque(builder, value):
    """``value``, through an empty inline-asm barrier that LLVM cannot see through or hoist.

    Without it, -O3 versions every loop around an entry loop on "this row has entries" (a test
    that does not change inside those loops), nested four deep in `sum_rows_products`: 3.4x the
    machine code and twice the compile time, for SpMM times within the run-to-run spread (8
    heads x 8 columns about 3% faster). The barrier costs no instruction."""
    asm_type = ir.FunctionType(value.type, [value.type])
    return builder.asm(asm_type, "", "=r,0", [value], True)


def _splat(builder, scalar, lanes):
    vector_type = ir.VectorType(scalar.type, lanes)
    first = builder.insert_element(ir.Constant(vector_type, ir.Undefined), scalar,
                                   ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, ir.Constant(vector_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


class _Chunk:
    """Vector operations on rows of a float dtype. ``width`` is the row's last, partial chunk
    (0 to ``MAX_VECTORS`` vectors, `n_vectors`): full vectors, then a last vector of which only
    the live lanes are read or written. Whole chunks before it use the full-vector operations.
    """

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
        """Emit ``emit(n)`` once per vector count n = 0..MAX_VECTORS of the partial chunk and
        run the one that matches: straight-line code per count, so accumulators get fixed
        registers (0: the width is a whole number of chunks)."""
        builder = self.builder
        done = builder.append_basic_block("chunk.done")
        switch = builder.switch(self.n_vectors, done)
        for count in range(MAX_VECTORS + 1):
            block = builder.append_basic_block(f"chunk.{count}")
            switch.add_case(ir.Constant(_I64, count), block)
            builder.position_at_end(block)
            emit(count)
            builder.branch(done)
        builder.position_at_end(done)


def _chunks_of(context, builder, dtype, width):
    """A row of ``width`` columns in register-sized chunks: (number of whole chunks, columns
    per chunk, `_Chunk` of the partial chunk after them)."""
    lanes = VECTOR_BYTES // context.get_abi_sizeof(context.get_value_type(dtype))
    chunk_columns = ir.Constant(_I64, MAX_VECTORS * lanes)
    n_full_chunks = builder.udiv(width, chunk_columns)
    tail_columns = builder.sub(width, builder.mul(n_full_chunks, chunk_columns))
    return n_full_chunks, chunk_columns, _Chunk(context, builder, dtype, tail_columns)


def compile_per_layout(stub, in_registers, strided, jit_options):
    """Overload ``stub`` with ``in_registers`` where every array argument is C-contiguous (what
    the intrinsics here read) and with ``strided`` otherwise, chosen when a call is compiled.

    ``stub``, ``in_registers`` and ``strided`` take the same arguments.
    """
    def choose(*args):
        arrays = [a for a in args if isinstance(a, types.Array)]
        return in_registers if all(a.layout == "C" for a in arrays) else strided

    choose.__signature__ = inspect.signature(stub)   # Numba checks it against the stub's
    overload(stub, jit_options=jit_options)(choose)


def _contiguous(ndim, *arrays):
    return all(isinstance(a, types.Array) and a.ndim == ndim and a.layout == "C" for a in arrays)


def _one_float_dtype(*arrays):
    dtypes = {a.dtype for a in arrays}
    return len(dtypes) == 1 and dtypes <= {types.float32, types.float64}


@contextlib.contextmanager
def _each_row(builder, indptr, first_row, last_row):
    """A loop over rows ``first_row:last_row`` of a CSR row pointer ``indptr`` (an LLVM array
    struct): the body sees ``(row, p_start, p_stop)``, the row's stored entries."""
    one = ir.Constant(_I64, 1)
    with cgutils.for_range_slice(builder, first_row, last_row, one) as (row, _):
        p_start = _as_i64(builder, builder.load(builder.gep(indptr.data, [row])))
        p_stop = _as_i64(builder, builder.load(builder.gep(indptr.data, [builder.add(row, one)])))
        yield row, p_start, p_stop


def _row_start(builder, array, columns, row, first_column):
    """Pointer to ``array[row, first_column]`` of a C-contiguous 2-D array."""
    return builder.gep(array.data, [builder.add(builder.mul(row, columns), first_column)])


@intrinsic
def sum_rows_products(typingctx, out, B, indptr, indices, data, row_start, row_stop, n_heads):
    """``out[i, cols] = sum(data[p * n_heads + h] * B[indices[p], cols])`` over the stored
    entries ``indptr[i] <= p < indptr[i + 1]``, for rows ``row_start <= i < row_stop``, heads
    ``h < n_heads`` and each head's columns ``cols = h * F:(h + 1) * F``, ``F = B.shape[1] //
    n_heads``.

    ``out`` and ``B`` are C-contiguous 2-D arrays of ``data``'s float dtype; ``indptr``,
    ``indices`` and ``data`` contiguous 1-D arrays, ``data`` holding ``n_heads`` values per
    stored entry (one attention matrix per head; 1 for a plain CSR). Sums start from zero, so
    rows without entries are written as zeros.

    The row loop runs inside: the choice of code for the last, partial chunk of a head's
    columns is made once per call, not once per row, which on graphs of a few entries per row
    cost as much as the entries themselves.
    """
    if not (_contiguous(2, out, B) and _contiguous(1, indptr, indices, data)
            and _one_float_dtype(out, B, data)):
        return None
    signature = types.void(out, B, indptr, indices, data, row_start, row_stop, n_heads)

    def codegen(context, builder, sig, args):
        out_array, B_array, indptr_array, indices_array, data_array = (
            context.make_array(array_type)(context, builder, value)
            for array_type, value in zip(sig.args[:5], args[:5]))
        first_row, last_row, heads = (_as_i64(builder, a) for a in args[5:])
        one = ir.Constant(_I64, 1)
        B_columns = cgutils.unpack_tuple(builder, B_array.shape, 2)[1]
        out_columns = cgutils.unpack_tuple(builder, out_array.shape, 2)[1]
        zero_heads = builder.icmp_signed("==", heads, ir.Constant(_I64, 0))
        # No heads, no columns to write; the select only keeps the division defined.
        head_width = builder.udiv(B_columns, builder.select(zero_heads, one, heads))
        n_full_chunks, chunk_columns, chunk = _chunks_of(context, builder, sig.args[1].dtype,
                                                         head_width)

        def sum_chunk(accumulators, masked_last, row, p_start, p_stop, head, first_column):
            """One row's sums over one chunk of columns, from zero, stored once."""
            n_vectors = len(accumulators)
            for accumulator in accumulators:
                builder.store(chunk.zero, accumulator)
            first_entry = _opaque(builder, p_start)   # no loop versioning: see `_opaque`
            with cgutils.for_range_slice(builder, first_entry, p_stop, one) as (p, _):
                column = _as_i64(builder, builder.load(builder.gep(indices_array.data, [p])))
                slot = builder.add(builder.mul(p, heads), head)
                value = _splat(builder, builder.load(builder.gep(data_array.data, [slot])),
                               chunk.lanes)
                source = _row_start(builder, B_array, B_columns, column, first_column)
                for k, accumulator in enumerate(accumulators):
                    last = masked_last and k == n_vectors - 1
                    b = chunk.load(source, k, last)
                    builder.store(chunk.fma(value, b, builder.load(accumulator)), accumulator)
            out_start = _row_start(builder, out_array, out_columns, row, first_column)
            for k, accumulator in enumerate(accumulators):
                chunk.store(builder.load(accumulator), out_start, k,
                            masked_last and k == n_vectors - 1)

        def emit(tail_vectors):
            # Allocas go to the entry block; LLVM promotes them to registers (SROA).
            full = [cgutils.alloca_once(builder, chunk.type) for _ in range(MAX_VECTORS)]
            tail = [cgutils.alloca_once(builder, chunk.type) for _ in range(tail_vectors)]
            with _each_row(builder, indptr_array, first_row, last_row) as (row, p_start, p_stop):
                with cgutils.for_range_slice(builder, ir.Constant(_I64, 0), heads, one) as (h, _):
                    head_start = builder.mul(h, head_width)
                    with cgutils.for_range_slice(builder, ir.Constant(_I64, 0), n_full_chunks,
                                                 one) as (c, _):
                        sum_chunk(full, False, row, p_start, p_stop, h,
                                  builder.add(head_start, builder.mul(c, chunk_columns)))
                    if tail_vectors:
                        sum_chunk(tail, True, row, p_start, p_stop, h,
                                  builder.add(head_start,
                                              builder.mul(n_full_chunks, chunk_columns)))

        chunk.for_each_count(emit)
        return context.get_dummy_value()

    return signature, codegen


def _dot_rows(summed):
    """The codegen of `dot_rows_products` (``summed``) or of `dot_rows_unsummed`."""
    def codegen(context, builder, sig, args):
        out_array, X_array, Y_array, indptr_array, indices_array = (
            context.make_array(array_type)(context, builder, value)
            for array_type, value in zip(sig.args[:5], args[:5]))
        first_row, last_row = (_as_i64(builder, a) for a in args[5:])
        one = ir.Constant(_I64, 1)
        X_columns = cgutils.unpack_tuple(builder, X_array.shape, 2)[1]
        Y_columns = cgutils.unpack_tuple(builder, Y_array.shape, 2)[1]
        n_full_chunks, chunk_columns, chunk = _chunks_of(context, builder, sig.args[1].dtype,
                                                         X_columns)

        def dot_chunk(n_vectors, masked_last, row, p_start, p_stop, first_column, add_to_out):
            """One row's dot products over one chunk of columns, stored or added to out."""
            x_start = _row_start(builder, X_array, X_columns, row, first_column)
            x = [chunk.load(x_start, k, masked_last and k == n_vectors - 1)
                 for k in range(n_vectors)]
            with cgutils.for_range_slice(builder, p_start, p_stop, one) as (p, _):
                column = _as_i64(builder, builder.load(builder.gep(indices_array.data, [p])))
                y_start = _row_start(builder, Y_array, Y_columns, column, first_column)
                # Masked-off lanes load as 0 in y, so they add nothing. Even and odd vectors
                # go to two chains, halving the dependent FMAs per entry (1.01-1.07x).
                chains = []
                for k in range(n_vectors):
                    y = chunk.load(y_start, k, masked_last and k == n_vectors - 1)
                    if k < 2:
                        chains.append(builder.fmul(x[k], y))
                    else:
                        chains[k % 2] = chunk.fma(x[k], y, chains[k % 2])
                products = chains[0] if n_vectors == 1 else builder.fadd(chains[0], chains[1])
                slot = builder.gep(out_array.data, [p])
                if summed:
                    total = chunk.sum(products)
                    if add_to_out:
                        total = builder.fadd(builder.load(slot), total)
                    builder.store(total, slot)
                else:
                    chunk.store(products, slot, 0, False)

        def emit(tail_vectors):
            rows = (builder, indptr_array, first_row, last_row)
            first_column = ir.Constant(_I64, 0)
            no_full_chunk = builder.icmp_signed("==", n_full_chunks, ir.Constant(_I64, 0))
            with builder.if_else(no_full_chunk) as (then, otherwise):
                with then:   # fewer columns than a chunk: the usual case
                    if tail_vectors:
                        with _each_row(*rows) as (row, p_start, p_stop):
                            dot_chunk(tail_vectors, True, row, p_start, p_stop, first_column,
                                      False)
                with otherwise:
                    with _each_row(*rows) as (row, p_start, p_stop):
                        dot_chunk(MAX_VECTORS, False, row, p_start, p_stop, first_column, False)
                        with cgutils.for_range_slice(builder, one, n_full_chunks, one) as (c, _):
                            dot_chunk(MAX_VECTORS, False, row, p_start, p_stop,
                                      builder.mul(c, chunk_columns), True)
                        if tail_vectors:
                            dot_chunk(tail_vectors, True, row, p_start, p_stop,
                                      builder.mul(n_full_chunks, chunk_columns), True)

        chunk.for_each_count(emit)
        return context.get_dummy_value()

    return codegen


def _dot_rows_signature(out, X, Y, indptr, indices, row_start, row_stop):
    if not (_contiguous(2, X, Y) and _contiguous(1, out, indptr, indices)
            and _one_float_dtype(out, X, Y)):
        return None
    return types.void(out, X, Y, indptr, indices, row_start, row_stop)


@intrinsic
def dot_rows_products(typingctx, out, X, Y, indptr, indices, row_start, row_stop):
    """``out[p] = dot(X[i], Y[indices[p]])`` for the stored entries ``indptr[i] <= p <
    indptr[i + 1]`` of rows ``row_start <= i < row_stop``; ``X.shape[1] > 0``.

    ``X`` and ``Y`` are C-contiguous 2-D arrays of ``out``'s float dtype; ``out``, ``indptr``
    and ``indices`` contiguous 1-D arrays. A register-sized chunk of X's row is loaded once per
    row and dotted with the matching chunk of each Y row; chunks after the first add to
    ``out[p]``. As in `sum_rows_products`, the code for the last chunk is chosen once per call.
    """
    signature = _dot_rows_signature(out, X, Y, indptr, indices, row_start, row_stop)
    return None if signature is None else (signature, _dot_rows(summed=True))


@intrinsic
def dot_rows_unsummed(typingctx, out, X, Y, indptr, indices, row_start, row_stop):
    """`dot_rows_products` without the sums, for measuring what bounds it (wrong results).

    Every load and multiply-add is the same, but each entry's vector of lane-wise products
    (of its last chunk) is stored whole at ``out[p:p + lanes]`` instead of being summed, so
    ``out`` needs ``lanes - 1`` slots past the entries and each store overwrites all but the
    first lane of the previous entry's. The benchmark times it as the floor of a kernel that
    reads one Y row per stored entry (``python -m pysparse_hpc.bench sddmm --bound``).
    """
    signature = _dot_rows_signature(out, X, Y, indptr, indices, row_start, row_stop)
    return None if signature is None else (signature, _dot_rows(summed=False))
