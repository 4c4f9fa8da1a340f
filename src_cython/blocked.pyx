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


cdef void _fill_window(
    Py_ssize_t w, Py_ssize_t n_rows, const index_t* indptr, const index_t* indices,
    const moved_t* data, Py_ssize_t window, Py_ssize_t block_width, int row_bits,
    const index_t* row_window_offset, index_t* col_idx, moved_t* values,
    uint8_t* vector_mask, int64_t* keys, int64_t* spare, int64_t* run_starts,
    int64_t* cursor,
) noexcept nogil:
    """Fill window ``w``: merge its sorted rows into one column order, then emit vectors.

    Each entry becomes the key ``column << row_bits | local_row``; a window's rows are at most
    ``window`` ascending runs of keys, so merging them orders the entries by column (rows
    breaking ties). Consecutive keys of one column form one vector. Rows must be canonical.
    Raw pointers, not memoryviews: a memoryview argument costs atomic reference counting on
    every call, and this runs once per window on every thread.
    """
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    cdef int64_t row_mask = (<int64_t>1 << row_bits) - 1
    cdef Py_ssize_t r, n_runs = 0
    cdef Py_ssize_t row0 = w * window
    cdef Py_ssize_t n_local = min(window, n_rows - row0)
    cdef int64_t first_vector = row_window_offset[w]
    cdef int64_t n_vectors = row_window_offset[w + 1] - first_vector
    cdef int64_t n_entries = 0, e, p, key, column, previous = -1, s = -1
    cdef int64_t block_start = 0, width = 0, slot_in_block = 0, base = 0, mask_base = 0
    cdef int64_t* ordered
    if n_vectors == 0:
        return
    # The arrays come uninitialized: zero this window's share here, in cache and in parallel.
    memset(&values[first_vector * window], 0, n_vectors * window * sizeof(moved_t))
    memset(&vector_mask[first_vector * mask_bytes], 0, n_vectors * mask_bytes)
    for r in range(n_local):
        cursor[r] = indptr[row0 + r]
        if indptr[row0 + r] == indptr[row0 + r + 1]:
            continue
        run_starts[n_runs] = n_entries
        n_runs += 1
        for p in range(indptr[row0 + r], indptr[row0 + r + 1]):
            keys[n_entries] = (<int64_t>indices[p] << row_bits) | r
            n_entries += 1
    run_starts[n_runs] = n_entries
    ordered = _merge_runs(keys, spare, run_starts, n_runs)
    width = min(block_width, n_vectors)
    slot_in_block = -1
    for e in range(n_entries):
        key = ordered[e]
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
        values[base + r * width] = data[cursor[r]]
        cursor[r] += 1
        vector_mask[mask_base + (r >> 3)] |= <uint8_t>(1 << (r & 7))


def csr_to_blocked(const index_t[::1] indptr, const index_t[::1] indices,
                   const moved_t[::1] data, Py_ssize_t window, Py_ssize_t block_width,
                   const index_t[::1] row_window_offset, int num_threads=1):
    """Fill the blocked arrays of a canonical CSR matrix.

    Parameters
    ----------
    indptr, indices, data : ndarray
        Canonical CSR (sorted rows, no duplicates); ``data`` may be float16 viewed as uint16.
    window, block_width : int
        Rows per window, vectors per block.
    row_window_offset : ndarray of the index dtype, shape (n_windows + 1,)
        Prefix sum of `count_window_vectors`.
    num_threads : int
        OpenMP threads; windows write disjoint ranges, so they are filled in parallel.

    Returns
    -------
    col_idx, values, vector_mask : ndarray
    """
    cdef Py_ssize_t n_windows = row_window_offset.shape[0] - 1
    cdef int64_t total_vectors = row_window_offset[n_windows]
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    index_dtype = np.int32 if index_t is int32_t else np.int64
    col_idx_np = np.empty(total_vectors, dtype=index_dtype)
    values_np = np.empty(total_vectors * window, dtype=np.asarray(data).dtype)
    vector_mask_np = np.empty(total_vectors * mask_bytes, dtype=np.uint8)
    cdef index_t[::1] col_idx = col_idx_np
    cdef moved_t[::1] values = values_np
    cdef uint8_t[::1] vector_mask = vector_mask_np
    # Scratch per thread: keys and spare hold one window's entries, then run starts and cursors.
    cdef int64_t widest_window = 0
    cdef Py_ssize_t w
    cdef int row_bits = 0
    while (1 << row_bits) < window:
        row_bits += 1
    cdef Py_ssize_t n_rows = indptr.shape[0] - 1
    cdef Py_ssize_t nnz = indices.shape[0]
    cdef int64_t n_vectors_total = total_vectors
    for w in range(n_windows):
        widest_window = max(widest_window,
                            indptr[min((w + 1) * window, n_rows)] - indptr[w * window])
    cdef int64_t scratch_words = 2 * widest_window + 2 * window + 1
    cdef int64_t* scratch
    with nogil, parallel(num_threads=max(1, num_threads)):
        scratch = <int64_t*>malloc(scratch_words * sizeof(int64_t))
        if scratch != NULL:
            for w in prange(n_windows, schedule="guided"):
                _fill_window(w, n_rows, &indptr[0], &indices[0] if nnz else NULL,
                             &data[0] if nnz else NULL, window, block_width, row_bits,
                             &row_window_offset[0], &col_idx[0] if n_vectors_total else NULL,
                             &values[0] if n_vectors_total else NULL,
                             &vector_mask[0] if n_vectors_total else NULL, scratch,
                             scratch + widest_window, scratch + 2 * widest_window,
                             scratch + 2 * widest_window + window + 1)
            free(scratch)
    return col_idx_np, values_np, vector_mask_np


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
