# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Typed conversion between canonical CSR and the blocked row-window formats (ME-BCRS and kin).

Layout (see the ``pysparse_hpc.blocked_array`` docstring): rows are grouped into windows of
``window`` rows; every distinct column with a nonzero in a window is one vector of ``window``
values; the vectors of a window are cut into blocks of ``block_width`` consecutive vectors, each
stored row-major ``[window][width]``, the last block of a window compactly ``[window][n mod k]``.
A bitmask per vector records which of its rows hold a stored entry, so explicit zeros survive
and padding can be told apart from data.
"""
import numpy as np

from cython.parallel cimport parallel, prange
from libc.stdint cimport INT64_MAX
from libc.stdlib cimport free, malloc
from libc.string cimport memset

include "_fused.pxi"


cdef inline int64_t value_offset(int64_t first_vector, int64_t n_vectors, int64_t slot,
                                 int64_t row, int64_t window, int64_t block_width) noexcept nogil:
    """Position in ``values`` of (row, vector ``slot``) of a window starting at ``first_vector``."""
    cdef int64_t block_start = (slot // block_width) * block_width
    cdef int64_t width = n_vectors - block_start
    if width > block_width:
        width = block_width
    return (first_vector + block_start) * window + row * width + (slot - block_start)


def count_window_vectors(const index_t[::1] indptr, const index_t[::1] indices,
                         Py_ssize_t n_cols, Py_ssize_t window):
    """Number of distinct columns (vectors) in each row window.

    Duplicates and unsorted rows are allowed here: a column counts once per window.

    Returns
    -------
    counts : ndarray of int64, shape (n_windows,)
    """
    cdef Py_ssize_t n_rows = indptr.shape[0] - 1
    cdef Py_ssize_t n_windows = (n_rows + window - 1) // window
    counts_np = np.zeros(n_windows, dtype=np.int64)
    # last_window[c] = the last window in which column c was seen; one array for all windows.
    last_window_np = np.full(max(n_cols, 1), -1, dtype=np.int64)
    cdef int64_t[::1] counts = counts_np
    cdef int64_t[::1] last_window = last_window_np
    cdef Py_ssize_t w, row_stop
    cdef int64_t p, column, n_vectors
    with nogil:
        for w in range(n_windows):
            row_stop = min((w + 1) * window, n_rows)
            n_vectors = 0
            for p in range(indptr[w * window], indptr[row_stop]):
                column = indices[p]
                if last_window[column] != w:
                    last_window[column] = w
                    n_vectors += 1
            counts[w] = n_vectors
    return counts_np


cdef int64_t* _merge_runs(int64_t* keys, int64_t* spare, int64_t* run_starts,
                          Py_ssize_t n_runs) noexcept nogil:
    """Merge the ascending runs ``keys[run_starts[i]:run_starts[i + 1]]`` into one.

    Bottom-up pairwise merging, log2(n_runs) linear passes ping-ponging between ``keys`` and
    ``spare`` (``run_starts`` is overwritten). The element choice is a conditional move, not a
    branch: which run wins is data dependent and would mispredict half the time. Returns the
    buffer that holds the result.
    """
    cdef int64_t* source = keys
    cdef int64_t* target = spare
    cdef int64_t* swap
    cdef Py_ssize_t run, merged
    cdef int64_t i, j, out, i_stop, j_stop, a, b
    cdef bint take_b
    while n_runs > 1:
        merged = 0
        for run in range(0, n_runs, 2):
            i = run_starts[run]
            i_stop = run_starts[run + 1]
            j = i_stop
            j_stop = run_starts[run + 2] if run + 1 < n_runs else i_stop
            out = i
            while i < i_stop and j < j_stop:
                a = source[i]
                b = source[j]
                take_b = b < a
                target[out] = b if take_b else a
                j += take_b
                i += 1 - take_b
                out += 1
            while i < i_stop:
                target[out] = source[i]
                i += 1
                out += 1
            while j < j_stop:
                target[out] = source[j]
                j += 1
                out += 1
            run_starts[merged] = run_starts[run]
            merged += 1
        run_starts[merged] = run_starts[n_runs]
        n_runs = merged
        swap = source
        source = target
        target = swap
    return source


cdef int64_t _merge_window(
    Py_ssize_t w, Py_ssize_t n_rows, const index_t* indptr, const index_t* indices,
    Py_ssize_t window, int row_bits, int64_t* keys, int64_t* spare, int64_t* run_starts,
) noexcept nogil:
    """Order window ``w``'s entries by column; return its number of vectors.

    Each entry becomes the key ``column << row_bits | local_row``, written to ``keys`` at the
    entry's own CSR position, so every window owns a disjoint slice. The window's sorted rows are
    at most ``window`` ascending runs of keys: merging them orders the entries by column, rows
    breaking ties. Rows must be canonical. Raw pointers, not memoryviews: a memoryview argument
    costs atomic reference counting on every call, and this runs once per window per thread.
    """
    cdef Py_ssize_t row0 = w * window
    cdef Py_ssize_t n_local = min(window, n_rows - row0)
    cdef int64_t first = indptr[row0]
    cdef int64_t n_entries = indptr[row0 + n_local] - first
    cdef Py_ssize_t r, n_runs = 0
    cdef int64_t p, e, n_vectors = 0, previous = -1, column
    cdef int64_t* window_keys = keys + first
    cdef int64_t* gathered
    cdef int passes = 0
    if n_entries == 0:
        return 0
    for r in range(n_local):
        n_runs += indptr[row0 + r] < indptr[row0 + r + 1]
    while (1 << passes) < n_runs:
        passes += 1
    # Merging ping-pongs between two buffers: start in the one that makes it end in ``keys``.
    gathered = window_keys if passes % 2 == 0 else spare
    n_runs = 0
    for r in range(n_local):
        if indptr[row0 + r] == indptr[row0 + r + 1]:
            continue
        run_starts[n_runs] = indptr[row0 + r] - first
        n_runs += 1
        for p in range(indptr[row0 + r], indptr[row0 + r + 1]):
            gathered[p - first] = (<int64_t>indices[p] << row_bits) | r
    run_starts[n_runs] = n_entries
    if gathered == window_keys:
        _merge_runs(window_keys, spare, run_starts, n_runs)
    else:
        _merge_runs(spare, window_keys, run_starts, n_runs)
    for e in range(n_entries):
        column = window_keys[e] >> row_bits
        n_vectors += column != previous
        previous = column
    return n_vectors


cdef void _emit_window(
    Py_ssize_t w, Py_ssize_t n_rows, const index_t* indptr, const int64_t* keys,
    const moved_t* data, Py_ssize_t window, Py_ssize_t block_width, int row_bits,
    const index_t* row_window_offset, index_t* col_idx, moved_t* values, uint8_t* vector_mask,
    int64_t* cursor,
) noexcept nogil:
    """Write window ``w``'s vectors from its column-ordered keys (see `_merge_window`)."""
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    cdef int64_t row_mask = (<int64_t>1 << row_bits) - 1
    cdef Py_ssize_t row0 = w * window
    cdef Py_ssize_t n_local = min(window, n_rows - row0)
    cdef int64_t first_vector = row_window_offset[w]
    cdef int64_t n_vectors = row_window_offset[w + 1] - first_vector
    cdef int64_t first = indptr[row0]
    cdef int64_t n_entries = indptr[row0 + n_local] - first
    cdef Py_ssize_t r
    cdef int64_t e, key, column, previous = -1, s = -1
    cdef int64_t block_start = 0, width, slot_in_block = -1, base = 0, mask_base = 0
    if n_vectors == 0:
        return
    # The outputs come uninitialized: zero this window's share here, in cache and in parallel.
    memset(&values[first_vector * window], 0, n_vectors * window * sizeof(moved_t))
    memset(&vector_mask[first_vector * mask_bytes], 0, n_vectors * mask_bytes)
    for r in range(n_local):
        cursor[r] = indptr[row0 + r]
    width = min(block_width, n_vectors)
    for e in range(first, first + n_entries):
        key = keys[e]
        column = key >> row_bits
        r = key & row_mask
        if column != previous:
            previous = column
            s += 1
            slot_in_block += 1
            if slot_in_block == width:
                block_start += block_width
                width = min(block_width, n_vectors - block_start)
                slot_in_block = 0
            col_idx[first_vector + s] = <index_t>column
            base = (first_vector + block_start) * window + slot_in_block
            mask_base = (first_vector + s) * mask_bytes
        # Within a row, keys come in column order, which is the row's storage order.
        values[base + r * width] = data[cursor[r]]
        cursor[r] += 1
        vector_mask[mask_base + (r >> 3)] |= <uint8_t>(1 << (r & 7))


def csr_to_blocked(const index_t[::1] indptr, const index_t[::1] indices,
                   const moved_t[::1] data, Py_ssize_t window, Py_ssize_t block_width,
                   int num_threads=1):
    """Convert canonical CSR arrays to the blocked arrays.

    Two parallel passes over the windows: the first orders each window's entries by column and
    counts its vectors, the second (after a prefix sum gives every window its place) writes them.

    Parameters
    ----------
    indptr, indices, data : ndarray
        Canonical CSR (sorted rows, no duplicates); ``data`` may be float16 viewed as uint16.
    window, block_width : int
        Rows per window, vectors per block.
    num_threads : int
        OpenMP threads; windows touch disjoint ranges of every array.

    Returns
    -------
    row_window_offset, col_idx, values, vector_mask : ndarray
    """
    cdef Py_ssize_t n_rows = indptr.shape[0] - 1
    cdef Py_ssize_t n_windows = (n_rows + window - 1) // window
    cdef Py_ssize_t nnz = indices.shape[0]
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    cdef int row_bits = 0
    while (1 << row_bits) < window:
        row_bits += 1
    index_dtype = np.int32 if index_t is int32_t else np.int64
    cdef int64_t[::1] keys = np.empty(max(nnz, 1), dtype=np.int64)
    cdef int64_t[::1] vectors_per_window = np.zeros(n_windows, dtype=np.int64)
    cdef Py_ssize_t w
    cdef int64_t widest_window = 0
    for w in range(n_windows):
        widest_window = max(widest_window,
                            indptr[min((w + 1) * window, n_rows)] - indptr[w * window])
    # Per-thread scratch: the merge's spare buffer and run starts (pass 1), row cursors (pass 2).
    cdef int64_t scratch_words = widest_window + 2 * window + 1
    cdef int64_t* scratch
    # A flag in memory, not a local: Cython makes locals assigned in a parallel block private.
    cdef int64_t[::1] out_of_memory = np.zeros(1, dtype=np.int64)
    threads = max(1, num_threads)
    with nogil, parallel(num_threads=threads):
        scratch = <int64_t*>malloc(scratch_words * sizeof(int64_t))
        if scratch == NULL:
            out_of_memory[0] = 1
        else:
            for w in prange(n_windows, schedule="guided"):
                vectors_per_window[w] = _merge_window(
                    w, n_rows, &indptr[0], &indices[0] if nnz else NULL, window, row_bits,
                    &keys[0], scratch, scratch + widest_window)
            free(scratch)
    if out_of_memory[0]:
        raise MemoryError(f"cannot allocate {scratch_words} words of merge scratch")

    row_window_offset_np = np.zeros(n_windows + 1, dtype=index_dtype)
    np.cumsum(vectors_per_window, out=row_window_offset_np[1:])
    cdef int64_t total_vectors = row_window_offset_np[n_windows]
    col_idx_np = np.empty(total_vectors, dtype=index_dtype)
    values_np = np.empty(total_vectors * window, dtype=np.asarray(data).dtype)
    vector_mask_np = np.empty(total_vectors * mask_bytes, dtype=np.uint8)
    if total_vectors == 0:
        return row_window_offset_np, col_idx_np, values_np, vector_mask_np
    cdef index_t[::1] row_window_offset = row_window_offset_np
    cdef index_t[::1] col_idx = col_idx_np
    cdef moved_t[::1] values = values_np
    cdef uint8_t[::1] vector_mask = vector_mask_np
    with nogil, parallel(num_threads=threads):
        scratch = <int64_t*>malloc(window * sizeof(int64_t))
        if scratch == NULL:
            out_of_memory[0] = 1
        else:
            for w in prange(n_windows, schedule="guided"):
                _emit_window(w, n_rows, &indptr[0], &keys[0], &data[0], window, block_width,
                             row_bits, &row_window_offset[0], &col_idx[0], &values[0],
                             &vector_mask[0], scratch)
            free(scratch)
    if out_of_memory[0]:
        raise MemoryError(f"cannot allocate {window} words of scratch")
    return row_window_offset_np, col_idx_np, values_np, vector_mask_np


def blocked_row_counts(const index_t[::1] row_window_offset, const uint8_t[::1] vector_mask,
                       Py_ssize_t n_rows, Py_ssize_t window):
    """Stored entries per row, read from the vector masks (the CSR row lengths)."""
    cdef Py_ssize_t n_windows = row_window_offset.shape[0] - 1
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    counts_np = np.zeros(n_rows, dtype=np.int64)
    cdef int64_t[::1] counts = counts_np
    cdef Py_ssize_t w, local_row, row
    cdef int64_t vector
    with nogil:
        for w in range(n_windows):
            for vector in range(row_window_offset[w], row_window_offset[w + 1]):
                for local_row in range(window):
                    row = w * window + local_row
                    if row >= n_rows:
                        break
                    if vector_mask[vector * mask_bytes + (local_row >> 3)] & (1 << (local_row & 7)):
                        counts[row] += 1
    return counts_np


def blocked_to_csr(const index_t[::1] row_window_offset, const index_t[::1] col_idx,
                   const moved_t[::1] values, const uint8_t[::1] vector_mask,
                   Py_ssize_t n_rows, Py_ssize_t window, Py_ssize_t block_width,
                   const index_t[::1] indptr):
    """Gather the stored entries of a blocked array back into CSR order.

    ``indptr`` is the CSR row pointer (prefix sum of `blocked_row_counts`). Columns come out
    ascending because vectors are ascending within a window, so the result is canonical.
    """
    cdef Py_ssize_t n_windows = row_window_offset.shape[0] - 1
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    cdef int64_t nnz = indptr[n_rows]
    index_dtype = np.int32 if index_t is int32_t else np.int64
    indices_np = np.empty(nnz, dtype=index_dtype)
    data_np = np.empty(nnz, dtype=np.asarray(values).dtype)
    cdef index_t[::1] indices = indices_np
    cdef moved_t[::1] data = data_np
    cdef Py_ssize_t w, local_row, row
    cdef int64_t s, first_vector, n_vectors, out
    with nogil:
        for w in range(n_windows):
            first_vector = row_window_offset[w]
            n_vectors = row_window_offset[w + 1] - first_vector
            for local_row in range(window):
                row = w * window + local_row
                if row >= n_rows:
                    break
                out = indptr[row]
                for s in range(n_vectors):
                    if vector_mask[(first_vector + s) * mask_bytes + (local_row >> 3)] & (1 << (local_row & 7)):
                        indices[out] = col_idx[first_vector + s]
                        data[out] = values[value_offset(first_vector, n_vectors, s, local_row,
                                                        window, block_width)]
                        out += 1
    return indices_np, data_np
