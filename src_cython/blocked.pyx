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
from libc.stdint cimport INT64_MAX, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

include "_fused.pxi"

# Sort keys ``column << row_bits | local_row``: 32-bit where every column fits (n_cols <<
# row_bits <= 2^32, any index dtype), halving the bytes every merge level moves; else 64-bit,
# which holds columns below 2^(63 - row_bits) (`key_column_limit`).
ctypedef fused key_t:
    uint32_t
    int64_t


def count_window_vectors(const index_t[::1] indptr, const index_t[::1] indices,
                         Py_ssize_t n_cols, Py_ssize_t window):
    """Number of distinct columns (vectors) in each row window.

    Duplicates and unsorted rows are allowed here: a column counts once per window.

    Returns
    -------
    counts : ndarray of int64, shape (n_windows,)
    """
    _check_window(window)
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


cdef int64_t _count_columns(const key_t* keys, int64_t n, int row_bits) noexcept nogil:
    """Distinct columns in column-ordered keys."""
    cdef int64_t e, column, previous = -1, distinct = 0
    for e in range(n):
        column = keys[e] >> row_bits
        distinct += column != previous
        previous = column
    return distinct


cdef int64_t _merge_runs(key_t* keys, key_t* spare, int64_t* run_starts,
                         Py_ssize_t n_runs, int row_bits) noexcept nogil:
    """Merge the ascending runs ``keys[run_starts[i]:run_starts[i + 1]]`` into one.

    Bottom-up pairwise merging, log2(n_runs) linear passes ping-ponging between ``keys`` and
    ``spare`` (``run_starts`` is overwritten); the caller picks the buffers so the result ends
    in the one it wants. The element choice is a conditional move, not a branch: which run wins
    is data dependent and would mispredict half the time. The last pass also counts the
    distinct columns (``key >> row_bits``), which is returned.
    """
    cdef key_t* source = keys
    cdef key_t* target = spare
    cdef key_t* swap
    cdef Py_ssize_t run, merged
    cdef int64_t i, j, out, i_stop, j_stop, column, previous = -1, distinct = 0
    cdef key_t a, b, chosen
    cdef bint take_b, last_pass
    if n_runs <= 1:
        return _count_columns(keys, run_starts[n_runs], row_bits)
    while n_runs > 1:
        last_pass = n_runs <= 2
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
                chosen = b if take_b else a
                target[out] = chosen
                j += take_b
                i += 1 - take_b
                out += 1
                if last_pass:
                    column = chosen >> row_bits
                    distinct += column != previous
                    previous = column
            while i < i_stop:
                chosen = source[i]
                target[out] = chosen
                i += 1
                out += 1
                if last_pass:
                    column = chosen >> row_bits
                    distinct += column != previous
                    previous = column
            while j < j_stop:
                chosen = source[j]
                target[out] = chosen
                j += 1
                out += 1
                if last_pass:
                    column = chosen >> row_bits
                    distinct += column != previous
                    previous = column
            run_starts[merged] = run_starts[run]
            merged += 1
        run_starts[merged] = run_starts[n_runs]
        n_runs = merged
        swap = source
        source = target
        target = swap
    return distinct


cdef int64_t _merge_window(
    Py_ssize_t w, Py_ssize_t n_rows, const index_t* indptr, const index_t* indices,
    Py_ssize_t window, int row_bits, key_t* keys, key_t* spare, int64_t* run_starts,
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
    cdef Py_ssize_t r, n_runs = (n_local + 1) // 2
    cdef int64_t i, j, i_stop, j_stop, out
    cdef key_t key_i, key_j
    cdef key_t* window_keys = keys + first
    cdef key_t* paired
    cdef int passes = 0
    cdef bint take_j
    if n_entries == 0:
        return 0
    while (1 << passes) < n_runs:
        passes += 1
    # Merging ping-pongs between two buffers: start in the one that makes it end in ``keys``.
    paired = window_keys if passes % 2 == 0 else spare
    # First level straight from CSR: rows 2m and 2m+1 are adjacent in ``indices``, so their
    # merge fills exactly their own slice. Branch-free, as in `_merge_runs`.
    for r in range(0, n_local, 2):
        i = indptr[row0 + r]
        i_stop = indptr[row0 + r + 1]
        j = i_stop
        j_stop = indptr[row0 + r + 2] if r + 1 < n_local else i_stop
        out = i - first
        run_starts[r // 2] = out
        while i < i_stop and j < j_stop:
            key_i = (<key_t>indices[i] << row_bits) | <key_t>r
            key_j = (<key_t>indices[j] << row_bits) | <key_t>(r + 1)
            take_j = key_j < key_i
            paired[out] = key_j if take_j else key_i
            j += take_j
            i += 1 - take_j
            out += 1
        while i < i_stop:
            paired[out] = (<key_t>indices[i] << row_bits) | <key_t>r
            i += 1
            out += 1
        while j < j_stop:
            paired[out] = (<key_t>indices[j] << row_bits) | <key_t>(r + 1)
            j += 1
            out += 1
    run_starts[n_runs] = n_entries
    if paired == window_keys:
        return _merge_runs(window_keys, spare, run_starts, n_runs, row_bits)
    return _merge_runs(spare, window_keys, run_starts, n_runs, row_bits)


cdef inline void _store_mask(uint8_t* vector_mask, int64_t start, Py_ssize_t mask_bytes,
                             uint64_t rows_present) noexcept nogil:
    """Write one vector's row bits, little-endian bytes (the mask is built in a register)."""
    cdef Py_ssize_t b
    for b in range(mask_bytes):
        vector_mask[start + b] = <uint8_t>(rows_present >> (8 * b))


cdef void _emit_window(
    Py_ssize_t w, Py_ssize_t n_rows, const index_t* indptr, const key_t* keys,
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
    cdef key_t key
    cdef int64_t e, column, previous = -1, s = -1
    cdef int64_t block_start = 0, width, slot_in_block = -1, base = 0, vector
    cdef uint64_t rows_present = 0
    if n_vectors == 0:
        return
    # The values come uninitialized: zero this window's share here, in cache and in parallel.
    memset(&values[first_vector * window], 0, n_vectors * window * sizeof(moved_t))
    for r in range(n_local):
        cursor[r] = indptr[row0 + r]
    width = min(block_width, n_vectors)
    for e in range(first, first + n_entries):
        key = keys[e]
        column = key >> row_bits
        r = key & row_mask
        if column != previous:
            if s >= 0:
                _store_mask(vector_mask, (first_vector + s) * mask_bytes, mask_bytes, rows_present)
            rows_present = 0
            previous = column
            s += 1
            slot_in_block += 1
            if slot_in_block == width:
                block_start += block_width
                width = min(block_width, n_vectors - block_start)
                slot_in_block = 0
            col_idx[first_vector + s] = <index_t>column
            base = (first_vector + block_start) * window + slot_in_block
        # Within a row, keys come in column order, which is the row's storage order.
        values[base + r * width] = data[cursor[r]]
        cursor[r] += 1
        rows_present |= (<uint64_t>1) << r
    _store_mask(vector_mask, (first_vector + s) * mask_bytes, mask_bytes, rows_present)


cdef bint _order_windows(
    Py_ssize_t n_windows, Py_ssize_t n_rows, const index_t* indptr, const index_t* indices,
    Py_ssize_t window, int row_bits, key_t* keys, int64_t* vectors_per_window,
    int64_t widest_window, int threads,
) noexcept nogil:
    """Pass 1 of `csr_to_blocked` over all windows in parallel; False when out of memory."""
    # Per-thread scratch: the merge's spare keys, then its run starts.
    cdef int64_t spare_words = (widest_window * sizeof(key_t) + 7) // 8
    cdef int64_t scratch_words = spare_words + window + 1
    cdef int64_t* scratch
    cdef Py_ssize_t w
    # A flag in memory, not a local: Cython makes locals assigned in a parallel block private.
    cdef int out_of_memory[1]
    out_of_memory[0] = 0
    with parallel(num_threads=threads):
        scratch = <int64_t*>malloc(scratch_words * sizeof(int64_t))
        if scratch == NULL:
            out_of_memory[0] = 1
        else:
            for w in prange(n_windows, schedule="guided"):
                vectors_per_window[w] = _merge_window(
                    w, n_rows, indptr, indices, window, row_bits, keys, <key_t*>scratch,
                    scratch + spare_words)
            free(scratch)
    return not out_of_memory[0]


cdef bint _radix_order(
    Py_ssize_t n_windows, Py_ssize_t n_rows, Py_ssize_t n_cols, const index_t* indptr,
    const index_t* indices, Py_ssize_t window, int row_bits, uint32_t* keys,
    int64_t* vectors_per_window,
) noexcept nogil:
    """Pass 1 of `csr_to_blocked` as two counting-sort passes, serial; False when out of memory.

    The same keys as `_order_windows` (each window's entries ordered by column, rows breaking
    ties, in the window's own CSR slice) without merging: a stable counting sort by column
    (scipy's CSR -> CSC, row numbers only), then a stable one by window, walking the columns in
    order. Two scatters of 4 bytes per entry instead of three merge levels of compares; about
    2.4 times faster on one thread, so it serves up to `RADIX_MAX_THREADS` threads.

    It allocates, zeroes and walks one counter per column whatever ``nnz`` is: the caller takes
    it only where the columns are O(nnz) (`ordering_path`).
    """
    cdef int64_t nnz = indptr[n_rows]
    cdef int64_t* colptr = <int64_t*>malloc((n_cols + 1) * sizeof(int64_t))
    cdef int64_t* cursor = <int64_t*>malloc((n_windows + 1) * sizeof(int64_t))
    cdef uint32_t* rows = <uint32_t*>malloc((nnz + 1) * sizeof(uint32_t))
    cdef Py_ssize_t r, c, w
    cdef int64_t p, start, previous
    cdef bint power_of_two = (window & (window - 1)) == 0
    if colptr == NULL or cursor == NULL or rows == NULL:
        free(colptr)
        free(cursor)
        free(rows)
        return False
    memset(colptr, 0, (n_cols + 1) * sizeof(int64_t))
    for p in range(nnz):
        colptr[indices[p] + 1] += 1
    for c in range(n_cols):
        colptr[c + 1] += colptr[c]
    # Rows by column: colptr[c] ends at the end of column c.
    for r in range(n_rows):
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            rows[colptr[c]] = <uint32_t>r
            colptr[c] += 1
    for w in range(n_windows):
        cursor[w] = indptr[w * window]
        vectors_per_window[w] = 0
    start = 0
    for c in range(n_cols):
        previous = -1
        for p in range(start, colptr[c]):
            r = rows[p]
            w = r >> row_bits if power_of_two else r // window
            keys[cursor[w]] = (<uint32_t>c << row_bits) | <uint32_t>(r - w * window)
            cursor[w] += 1
            # rows ascend within a column: a window's entries of one column are consecutive
            vectors_per_window[w] += w != previous
            previous = w
        start = colptr[c]
    free(colptr)
    free(cursor)
    free(rows)
    return True


cdef bint _emit_windows(
    Py_ssize_t n_windows, Py_ssize_t n_rows, const index_t* indptr, const key_t* keys,
    const moved_t* data, Py_ssize_t window, Py_ssize_t block_width, int row_bits,
    const index_t* row_window_offset, index_t* col_idx, moved_t* values, uint8_t* vector_mask,
    int threads,
) noexcept nogil:
    """Pass 2 of `csr_to_blocked` over all windows in parallel; False when out of memory."""
    cdef int64_t* cursor
    cdef Py_ssize_t w
    cdef int out_of_memory[1]
    out_of_memory[0] = 0
    with parallel(num_threads=threads):
        cursor = <int64_t*>malloc(window * sizeof(int64_t))
        if cursor == NULL:
            out_of_memory[0] = 1
        else:
            for w in prange(n_windows, schedule="guided"):
                _emit_window(w, n_rows, indptr, keys, data, window, block_width, row_bits,
                             row_window_offset, col_idx, values, vector_mask, cursor)
            free(cursor)
    return not out_of_memory[0]


#: Up to this many threads pass 1 of `csr_to_blocked` is the serial `_radix_order` (where the
#: 32-bit keys apply); beyond, the parallel merge (`_order_windows`) scales past it.
RADIX_MAX_THREADS = 2

#: Columns beyond ``2 * nnz + RADIX_SLACK_COLUMNS`` make `_radix_order`'s per-column counters
#: outweigh the entries (2 entries in 2**29 columns: 4 GiB zeroed and walked); the merge then
#: costs O(nnz log window) whatever the width. The same bound as `block_stats`' renumbering.
RADIX_SLACK_COLUMNS = 4096


cdef inline int _row_bits(Py_ssize_t window) noexcept nogil:
    """ceil(log2(window)): the low key bits that hold a row of the window."""
    cdef int row_bits = 0
    # bounded: a window below 1 (refused by the callers) must not shift past 63 bits
    while row_bits < 63 and (<uint64_t>1 << row_bits) < <uint64_t>window:
        row_bits += 1
    return row_bits


#: Tallest window: a vector's row mask is built in one 64-bit register (`_emit_window`), so a
#: row at 64 or beyond would shift past it (undefined; in practice bits of other rows).
MAX_WINDOW = 64


cdef _check_window(Py_ssize_t window, Py_ssize_t block_width=1):
    """ValueError for a geometry the ``nogil`` bodies cannot take: they divide by ``window``
    and ``block_width`` (a zero is a SIGFPE under cdivision) and shift by rows of a window."""
    if not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be in [1, {MAX_WINDOW}], got {window}")
    if block_width < 1:
        raise ValueError(f"block_width must be a positive integer, got {block_width}")


def key_column_limit(Py_ssize_t window):
    """Most columns `csr_to_blocked` takes for ``window``-row windows: ``2**(63 - row_bits)``.

    Its 64-bit sort keys are ``column << row_bits | local_row`` with ``row_bits =
    ceil(log2(window))``; a column at or beyond this limit would overflow into the sign bit.
    """
    if window < 1:
        raise ValueError(f"window must be a positive integer, got {window}")
    one = 1  # a Python int: C arithmetic would overflow at 2**63 (one-row windows)
    return one << (63 - _row_bits(window))


def ordering_path(Py_ssize_t n_rows, Py_ssize_t n_cols, Py_ssize_t nnz, Py_ssize_t window,
                  int num_threads):
    """How `csr_to_blocked` orders the entries: ``"radix"`` (`_radix_order`, 32-bit keys),
    ``"merge32"`` or ``"merge64"`` (`_order_windows` with 32- or 64-bit keys).

    32-bit keys need every key ``column << row_bits | local_row`` below 2**32 (tested without a
    shift, which would wrap for huge ``n_cols``) and the rows in 32 bits; an unknown ``n_cols``
    (-1) takes 64-bit keys. The counting sort also needs few threads and O(nnz) columns.
    """
    cdef int row_bits = _row_bits(window)
    cdef bint narrow = (0 <= n_cols and row_bits <= 32
                        and n_cols <= (<int64_t>1 << (32 - row_bits))
                        and <uint64_t>n_rows < (<uint64_t>1 << 32))
    if not narrow:
        return "merge64"
    if max(1, num_threads) <= RADIX_MAX_THREADS and n_cols <= 2 * nnz + RADIX_SLACK_COLUMNS:
        return "radix"
    return "merge32"


def csr_to_blocked(const index_t[::1] indptr, const index_t[::1] indices,
                   const moved_t[::1] data, Py_ssize_t window, Py_ssize_t block_width,
                   int num_threads=1, Py_ssize_t n_cols=-1):
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
    n_cols : int, optional
        Number of columns. Where ``n_cols << ceil(log2(window))`` and the rows fit in 32 bits
        the sort keys are 32-bit (whatever the index dtype) and, on at most
        `RADIX_MAX_THREADS` threads with O(nnz) columns, ordered by counting sorts instead of
        merges (see `ordering_path`); unknown (-1): 64-bit keys, merged.

    Returns
    -------
    row_window_offset, col_idx, values, vector_mask : ndarray

    Raises
    ------
    ValueError
        ``n_cols`` (or, when unknown, the largest column plus one) is beyond
        `key_column_limit`: the 64-bit sort keys would overflow. Renumber the columns that
        hold entries first (``blocked_from_csr`` does). Or ``window`` is outside
        ``[1, MAX_WINDOW]`` or ``block_width`` below 1.
    """
    _check_window(window, block_width)
    cdef Py_ssize_t n_rows = indptr.shape[0] - 1
    cdef Py_ssize_t n_windows = (n_rows + window - 1) // window
    cdef Py_ssize_t nnz = indices.shape[0]
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    cdef int row_bits = _row_bits(window)
    index_dtype = np.int32 if index_t is int32_t else np.int64
    column_limit = key_column_limit(window)  # a Python int: 2**63 for one-row windows
    cdef int64_t largest = n_cols - 1
    cdef Py_ssize_t r
    if n_cols < 0:
        # Unknown width: the largest column decides (rows are sorted: each row's last entry).
        for r in range(n_rows):
            if indptr[r + 1] > indptr[r]:
                largest = max(largest, <int64_t>indices[indptr[r + 1] - 1])
    if largest >= column_limit:
        what = f"{n_cols} columns" if n_cols >= 0 else f"column {largest}"
        raise ValueError(
            f"cannot order {what} in {window}-row windows: the 64-bit sort keys "
            f"(column << {row_bits} | row) hold at most 2**{63 - row_bits} = {column_limit} "
            "columns; renumber the columns that hold entries first (blocked_from_csr does)")
    path = ordering_path(n_rows, n_cols, nnz, window, num_threads)
    cdef bint narrow = path != "merge64"
    keys_np = np.empty(max(nnz, 1), dtype=np.uint32 if narrow else np.int64)
    cdef uint32_t[::1] keys32
    cdef int64_t[::1] keys64
    cdef int64_t[::1] vectors_per_window = np.empty(n_windows, dtype=np.int64)
    cdef Py_ssize_t w
    cdef int64_t widest_window = 0
    cdef bint ok
    cdef const index_t* indices_ptr = &indices[0] if nnz else NULL
    threads = max(1, num_threads)
    for w in range(n_windows):
        widest_window = max(widest_window,
                            indptr[min((w + 1) * window, n_rows)] - indptr[w * window])
    if path == "radix":
        keys32 = keys_np
        with nogil:
            ok = _radix_order(n_windows, n_rows, n_cols, &indptr[0], indices_ptr, window,
                              row_bits, &keys32[0], &vectors_per_window[0] if n_windows else NULL)
    elif narrow:
        keys32 = keys_np
        with nogil:
            ok = _order_windows(n_windows, n_rows, &indptr[0], indices_ptr, window, row_bits,
                                &keys32[0], &vectors_per_window[0] if n_windows else NULL,
                                widest_window, threads)
    else:
        keys64 = keys_np
        with nogil:
            ok = _order_windows(n_windows, n_rows, &indptr[0], indices_ptr, window, row_bits,
                                &keys64[0], &vectors_per_window[0] if n_windows else NULL,
                                widest_window, threads)
    if not ok:
        raise MemoryError(f"cannot allocate the scratch of ordering {nnz} entries")

    row_window_offset_np = np.empty(n_windows + 1, dtype=index_dtype)
    row_window_offset_np[0] = 0
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
    if narrow:
        with nogil:
            ok = _emit_windows(n_windows, n_rows, &indptr[0], &keys32[0], &data[0], window,
                               block_width, row_bits, &row_window_offset[0], &col_idx[0],
                               &values[0], &vector_mask[0], threads)
    else:
        with nogil:
            ok = _emit_windows(n_windows, n_rows, &indptr[0], &keys64[0], &data[0], window,
                               block_width, row_bits, &row_window_offset[0], &col_idx[0],
                               &values[0], &vector_mask[0], threads)
    if not ok:
        raise MemoryError(f"cannot allocate {window} words of scratch")
    return row_window_offset_np, col_idx_np, values_np, vector_mask_np


def blocked_row_counts(const index_t[::1] row_window_offset, const uint8_t[::1] vector_mask,
                       Py_ssize_t n_rows, Py_ssize_t window, int num_threads=1):
    """Stored entries per row, read from the vector masks (the CSR row lengths)."""
    _check_window(window)
    cdef Py_ssize_t n_windows = row_window_offset.shape[0] - 1
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    counts_np = np.zeros(n_rows, dtype=np.int64)
    cdef int64_t[::1] counts = counts_np
    cdef Py_ssize_t w, local_row, n_local
    cdef int64_t vector
    for w in prange(n_windows, nogil=True, schedule="guided", num_threads=max(1, num_threads)):
        n_local = min(window, n_rows - w * window)
        for vector in range(row_window_offset[w], row_window_offset[w + 1]):
            for local_row in range(n_local):
                if vector_mask[vector * mask_bytes + (local_row >> 3)] & (1 << (local_row & 7)):
                    counts[w * window + local_row] += 1
    return counts_np


cdef void _gather_window(
    Py_ssize_t w, Py_ssize_t n_rows, Py_ssize_t window, Py_ssize_t block_width,
    const index_t* row_window_offset, const index_t* col_idx, const moved_t* values,
    const uint8_t* vector_mask, const index_t* indptr, index_t* indices, moved_t* data,
    int64_t* cursor,
) noexcept nogil:
    """Append window ``w``'s entries to their CSR rows, vector by vector (so columns ascend)."""
    cdef Py_ssize_t mask_bytes = (window + 7) // 8
    cdef Py_ssize_t row0 = w * window
    cdef Py_ssize_t n_local = min(window, n_rows - row0)
    cdef int64_t first_vector = row_window_offset[w]
    cdef int64_t n_vectors = row_window_offset[w + 1] - first_vector
    cdef int64_t s, vector, block_start = 0, width, base
    cdef Py_ssize_t r
    for r in range(n_local):
        cursor[r] = indptr[row0 + r]
    while block_start < n_vectors:
        width = min(block_width, n_vectors - block_start)
        for s in range(block_start, block_start + width):
            vector = first_vector + s
            base = (first_vector + block_start) * window + (s - block_start)
            for r in range(n_local):
                if vector_mask[vector * mask_bytes + (r >> 3)] & (1 << (r & 7)):
                    indices[cursor[r]] = col_idx[vector]
                    data[cursor[r]] = values[base + r * width]
                    cursor[r] += 1
        block_start += block_width


def blocked_to_csr(const index_t[::1] row_window_offset, const index_t[::1] col_idx,
                   const moved_t[::1] values, const uint8_t[::1] vector_mask,
                   Py_ssize_t n_rows, Py_ssize_t window, Py_ssize_t block_width,
                   const index_t[::1] indptr, int num_threads=1):
    """Gather the stored entries of a blocked array back into CSR order.

    ``indptr`` is the CSR row pointer (prefix sum of `blocked_row_counts`). Columns come out
    ascending because vectors are ascending within a window, so the result is canonical.
    Windows fill disjoint rows, so they run in parallel.
    """
    _check_window(window, block_width)
    cdef Py_ssize_t n_windows = row_window_offset.shape[0] - 1
    cdef int64_t nnz = indptr[n_rows]
    index_dtype = np.int32 if index_t is int32_t else np.int64
    indices_np = np.empty(nnz, dtype=index_dtype)
    data_np = np.empty(nnz, dtype=np.asarray(values).dtype)
    if nnz == 0:
        return indices_np, data_np
    cdef index_t[::1] indices = indices_np
    cdef moved_t[::1] data = data_np
    cdef Py_ssize_t w
    cdef int64_t* cursor
    # A flag in memory, not a local: Cython makes locals assigned in a parallel block private.
    cdef int64_t[::1] out_of_memory = np.zeros(1, dtype=np.int64)
    with nogil, parallel(num_threads=max(1, num_threads)):
        cursor = <int64_t*>malloc(window * sizeof(int64_t))
        if cursor == NULL:
            out_of_memory[0] = 1
        else:
            for w in prange(n_windows, schedule="guided"):
                _gather_window(w, n_rows, window, block_width, &row_window_offset[0],
                               &col_idx[0], &values[0], &vector_mask[0], &indptr[0],
                               &indices[0], &data[0], cursor)
            free(cursor)
    if out_of_memory[0]:
        raise MemoryError(f"cannot allocate {window} words of scratch")
    return indices_np, data_np
