# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Typed CSR construction: COO to canonical CSR, per-row sorting, transpose, permutation.

Each public ``def`` receives arrays that the Python layer has already validated and cast
(indices of one index dtype, values float32/float64, or float16 viewed as uint16 where values
are only moved), allocates the outputs, and runs a ``nogil`` body that trusts its input.
"""
import numpy as np

from libc.stdlib cimport free, malloc
from libcpp.algorithm cimport sort as cpp_sort
from libcpp.utility cimport pair

include "_fused.pxi"

# (column, position of the value in the input): sorting these pairs orders a row by column and
# keeps duplicates in input order, so sums of duplicates are deterministic.
ctypedef pair[int64_t, int64_t] column_position


cdef int64_t _sort_rows(
    const index_t[::1] indptr_in,
    const index_t[::1] columns_in,
    const int64_t[::1] positions_in,
    const real_t[::1] data_in,
    bint sum_duplicates,
    index_t[::1] indptr_out,
    index_t[::1] columns_out,
    real_t[::1] data_out,
    column_position* scratch,
) noexcept nogil:
    """Write each row sorted by column; merge equal columns when ``sum_duplicates``.

    Returns the number of entries written. Rows already in order skip the sort, so canonical
    input costs one linear pass.
    """
    cdef Py_ssize_t n_rows = indptr_in.shape[0] - 1
    cdef Py_ssize_t row
    cdef int64_t p, start, stop, length, row_out_start, column, position
    cdef int64_t n_out = 0
    cdef bint in_order
    indptr_out[0] = 0
    for row in range(n_rows):
        start = indptr_in[row]
        stop = indptr_in[row + 1]
        length = stop - start
        row_out_start = n_out
        in_order = True
        for p in range(start + 1, stop):
            if columns_in[p] < columns_in[p - 1]:
                in_order = False
                break
        if not in_order:
            for p in range(length):
                scratch[p].first = columns_in[start + p]
                scratch[p].second = positions_in[start + p]
            cpp_sort(scratch, scratch + length)
        for p in range(length):
            if in_order:
                column = columns_in[start + p]
                position = positions_in[start + p]
            else:
                column = scratch[p].first
                position = scratch[p].second
            if sum_duplicates and n_out > row_out_start and columns_out[n_out - 1] == column:
                data_out[n_out - 1] += data_in[position]
            else:
                columns_out[n_out] = <index_t>column
                data_out[n_out] = data_in[position]
                n_out += 1
        indptr_out[row + 1] = <index_t>n_out
    return n_out


cdef object _sort_rows_alloc(
    const index_t[::1] indptr_in,
    const index_t[::1] columns_in,
    const int64_t[::1] positions_in,
    const real_t[::1] data_in,
    bint sum_duplicates,
):
    """Allocate outputs and scratch, run `_sort_rows`, trim to the entries written."""
    cdef Py_ssize_t n_rows = indptr_in.shape[0] - 1
    cdef Py_ssize_t nnz = columns_in.shape[0]
    index_dtype = np.int32 if index_t is int32_t else np.int64
    value_dtype = np.float32 if real_t is float else np.float64
    indptr_np = np.empty(n_rows + 1, dtype=index_dtype)
    columns_np = np.empty(nnz, dtype=index_dtype)
    data_np = np.empty(nnz, dtype=value_dtype)
    cdef index_t[::1] indptr_out = indptr_np
    cdef index_t[::1] columns_out = columns_np
    cdef real_t[::1] data_out = data_np
    cdef int64_t longest_row = 0
    cdef Py_ssize_t row
    for row in range(n_rows):
        if indptr_in[row + 1] - indptr_in[row] > longest_row:
            longest_row = indptr_in[row + 1] - indptr_in[row]
    cdef column_position* scratch = <column_position*>malloc(
        max(longest_row, 1) * sizeof(column_position))
    if scratch == NULL:
        raise MemoryError(f"cannot allocate a sort buffer for a row of {longest_row} entries")
    cdef int64_t n_out
    try:
        with nogil:
            n_out = _sort_rows(indptr_in, columns_in, positions_in, data_in, sum_duplicates,
                               indptr_out, columns_out, data_out, scratch)
    finally:
        free(scratch)
    if n_out < nnz:
        columns_np = columns_np[:n_out].copy()
        data_np = data_np[:n_out].copy()
    return indptr_np, columns_np, data_np


def coo_to_csr(Py_ssize_t n_rows, const index_t[::1] rows, const index_t[::1] columns,
               const real_t[::1] data, bint sum_duplicates=True):
    """Build CSR from COO triplets: rows sorted by a stable counting sort, then each row by column.

    Parameters
    ----------
    n_rows : int
        Number of rows; every entry of ``rows`` is in ``[0, n_rows)``.
    rows, columns : ndarray of int32 or int64
        Triplet coordinates, same dtype, already range-checked.
    data : ndarray of float32 or float64
        Triplet values.
    sum_duplicates : bool
        Merge entries with equal coordinates by summing them (explicit zeros are kept).

    Returns
    -------
    indptr, indices, data : ndarray
        Canonical CSR arrays when ``sum_duplicates``; sorted rows with duplicates otherwise.
    """
    cdef Py_ssize_t nnz = rows.shape[0]
    index_dtype = np.int32 if index_t is int32_t else np.int64
    row_starts_np = np.zeros(n_rows + 1, dtype=index_dtype)
    columns_by_row_np = np.empty(nnz, dtype=index_dtype)
    positions_np = np.empty(nnz, dtype=np.int64)
    cdef index_t[::1] row_starts = row_starts_np
    cdef index_t[::1] columns_by_row = columns_by_row_np
    cdef int64_t[::1] positions = positions_np
    cdef index_t[::1] next_slot
    cdef Py_ssize_t p, row
    cdef int64_t slot
    with nogil:
        for p in range(nnz):
            row_starts[rows[p] + 1] += 1
        for row in range(n_rows):
            row_starts[row + 1] += row_starts[row]
    next_slot_np = row_starts_np[:n_rows].copy()
    next_slot = next_slot_np
    with nogil:
        for p in range(nnz):
            slot = next_slot[rows[p]]
            next_slot[rows[p]] += 1
            columns_by_row[slot] = columns[p]
            positions[slot] = p
    return _sort_rows_alloc(row_starts, columns_by_row, positions, data, sum_duplicates)


def csr_sort_rows(const index_t[::1] indptr, const index_t[::1] indices,
                  const real_t[::1] data, bint sum_duplicates):
    """Return new CSR arrays with every row sorted by column, duplicates merged on request."""
    cdef int64_t[::1] positions = np.arange(indices.shape[0], dtype=np.int64)
    return _sort_rows_alloc(indptr, indices, positions, data, sum_duplicates)


def csr_index_order(const index_t[::1] indptr, const index_t[::1] indices):
    """Classify the column order of a CSR index: 2 canonical, 1 sorted with duplicates, 0 unsorted."""
    cdef Py_ssize_t n_rows = indptr.shape[0] - 1
    cdef Py_ssize_t row
    cdef int64_t p
    cdef int state = 2
    with nogil:
        for row in range(n_rows):
            for p in range(indptr[row] + 1, indptr[row + 1]):
                if indices[p] < indices[p - 1]:
                    state = 0
                    break
                if indices[p] == indices[p - 1]:
                    state = 1
            if state == 0:
                break
    return state


def csr_transpose(Py_ssize_t n_cols, const index_t[::1] indptr, const index_t[::1] indices,
                  const moved_t[::1] data):
    """Transpose by a stable counting sort on columns; canonical input gives canonical output.

    ``data`` is only moved, so float16 may be passed as its uint16 bit pattern. The entries are
    the ones ``indptr`` spans, ``indices[:indptr[-1]]`` (scipy's ``nnz``): both passes must
    agree on them, or columns counted but never filled come back as uninitialized memory.
    """
    cdef Py_ssize_t n_rows = indptr.shape[0] - 1
    # Not indices.shape[0]: arrays shared with scipy keep their length when scipy's
    # eliminate_zeros compacts them in place and lowers indptr[-1] under them.
    cdef Py_ssize_t nnz = indptr[n_rows]
    if nnz > indices.shape[0] or nnz > data.shape[0]:
        raise ValueError(f"indptr[-1] is {nnz}, beyond the {indices.shape[0]} indices and "
                         f"{data.shape[0]} values given")
    index_dtype = np.int32 if index_t is int32_t else np.int64
    t_indptr_np = np.zeros(n_cols + 1, dtype=index_dtype)
    t_indices_np = np.empty(nnz, dtype=index_dtype)
    t_data_np = np.empty(nnz, dtype=np.asarray(data).dtype)
    cdef index_t[::1] t_indptr = t_indptr_np
    cdef index_t[::1] t_indices = t_indices_np
    cdef moved_t[::1] t_data = t_data_np
    cdef index_t[::1] next_slot
    cdef Py_ssize_t row, column
    cdef int64_t p, slot
    with nogil:
        for p in range(nnz):
            t_indptr[indices[p] + 1] += 1
        for column in range(n_cols):
            t_indptr[column + 1] += t_indptr[column]
    next_slot_np = t_indptr_np[:n_cols].copy()
    next_slot = next_slot_np
    with nogil:
        for row in range(n_rows):
            for p in range(indptr[row], indptr[row + 1]):
                slot = next_slot[indices[p]]
                next_slot[indices[p]] += 1
                t_indices[slot] = <index_t>row
                t_data[slot] = data[p]
    return t_indptr_np, t_indices_np, t_data_np


def csr_permute(const index_t[::1] indptr, const index_t[::1] indices, const real_t[::1] data,
                const int64_t[::1] row_order, const int64_t[::1] column_renumbering):
    """Gather rows by ``row_order`` and renumber columns by ``column_renumbering``.

    Row ``i`` of the result is input row ``row_order[i]``; column ``j`` becomes
    ``column_renumbering[j]``. Either may be None (kept as is). Rows are re-sorted by column
    (already-ordered rows cost one pass) and duplicates are kept, so canonical input stays
    canonical.
    """
    cdef Py_ssize_t n_rows = indptr.shape[0] - 1
    cdef Py_ssize_t nnz = indices.shape[0]
    cdef bint gather_rows = row_order is not None
    cdef bint renumber = column_renumbering is not None
    index_dtype = np.int32 if index_t is int32_t else np.int64
    new_indptr_np = np.empty(n_rows + 1, dtype=index_dtype)
    new_columns_np = np.empty(nnz, dtype=index_dtype)
    positions_np = np.empty(nnz, dtype=np.int64)
    cdef index_t[::1] new_indptr = new_indptr_np
    cdef index_t[::1] new_columns = new_columns_np
    cdef int64_t[::1] positions = positions_np
    cdef Py_ssize_t row, source
    cdef int64_t p, out = 0
    with nogil:
        new_indptr[0] = 0
        for row in range(n_rows):
            source = row_order[row] if gather_rows else row
            for p in range(indptr[source], indptr[source + 1]):
                new_columns[out] = <index_t>column_renumbering[indices[p]] if renumber else indices[p]
                positions[out] = p
                out += 1
            new_indptr[row + 1] = <index_t>out
    return _sort_rows_alloc(new_indptr, new_columns, positions, data, False)
