"""SpMM on the CPU: ``out = A @ B`` for CSR and row-window blocked A, dense row-major B.

Rows (or windows) are split into parts of roughly equal nonzero count so that skewed rows
balance across threads; each part accumulates straight into its output rows.
"""
import numpy as np
from numba import njit, prange


def balanced_parts(indptr, n_parts):
    """Row bounds ``b`` such that rows ``b[i]:b[i+1]`` hold about ``nnz / n_parts`` entries each."""
    n_rows = indptr.size - 1
    n_parts = max(1, min(n_parts, n_rows))
    targets = np.linspace(0, indptr[-1], n_parts + 1)
    bounds = np.searchsorted(indptr, targets, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, n_rows
    return np.unique(np.minimum(bounds, n_rows))


@njit(parallel=True, cache=True, nogil=True)
def csr_spmm(indptr, indices, data, B, out, row_bounds):
    n_cols_out = B.shape[1]
    for part in prange(row_bounds.size - 1):
        for row in range(row_bounds[part], row_bounds[part + 1]):
            for j in range(n_cols_out):
                out[row, j] = 0
            for p in range(indptr[row], indptr[row + 1]):
                value = data[p]
                source = indices[p]
                for j in range(n_cols_out):
                    out[row, j] += value * B[source, j]


@njit(parallel=True, cache=True, nogil=True)
def blocked_spmm(row_window_offset, col_idx, values, vector_mask, window, block_width, B, out,
                 window_bounds):
    """Each vector's B row is loaded once and feeds all rows of its window (the 8x1 reuse)."""
    n_rows = out.shape[0]
    n_cols_out = B.shape[1]
    mask_bytes = (window + 7) // 8
    for part in prange(window_bounds.size - 1):
        for w in range(window_bounds[part], window_bounds[part + 1]):
            row0 = w * window
            row_stop = min(row0 + window, n_rows)
            for row in range(row0, row_stop):
                for j in range(n_cols_out):
                    out[row, j] = 0
            first = row_window_offset[w]
            n_vectors = row_window_offset[w + 1] - first
            for s in range(n_vectors):
                block_start = (s // block_width) * block_width
                width = min(block_width, n_vectors - block_start)
                base = (first + block_start) * window + (s - block_start)
                vector = first + s
                source = col_idx[vector]
                for r in range(row_stop - row0):
                    # The mask, not the value, decides: padding must not turn 0 * inf into NaN.
                    if vector_mask[vector * mask_bytes + (r >> 3)] & (1 << (r & 7)):
                        value = values[base + r * width]
                        for j in range(n_cols_out):
                            out[row0 + r, j] += value * B[source, j]
