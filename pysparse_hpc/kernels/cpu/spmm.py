"""SpMM on the CPU: ``out = A @ B`` for CSR and row-window blocked A, dense B.

Rows (or windows) are split into parts of roughly equal nonzero count so that skewed rows
balance across threads; each part accumulates straight into its output rows (no per-row
allocation). B may have any strides (torch views are passed without copies).
"""
import numpy as np
from numba import njit, prange


def balanced_parts(indptr, n_parts):
    """Bounds ``b`` such that ``b[i]:b[i+1]`` hold about ``indptr[-1] / n_parts`` entries each.

    ``indptr`` is a CSR row pointer or a blocked ``row_window_offset``; the parts split rows or
    windows. Returns int64 bounds starting at 0 and ending at the number of rows.
    """
    n_rows = indptr.size - 1
    n_parts = max(1, min(n_parts, n_rows))
    targets = np.linspace(0, indptr[-1], n_parts + 1)
    bounds = np.searchsorted(indptr, targets, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, n_rows
    return np.unique(np.minimum(bounds, n_rows))


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def csr_spmm(indptr, indices, data, B, out, row_bounds):
    n_cols_out = B.shape[1]
    for part in prange(row_bounds.size - 1):
        for row in range(row_bounds[part], row_bounds[part + 1]):
            out_row = out[row]
            out_row[:] = 0
            for p in range(indptr[row], indptr[row + 1]):
                value = data[p]
                source = B[indices[p]]
                for j in range(n_cols_out):
                    out_row[j] += value * source[j]


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def blocked_spmm(row_window_offset, col_idx, values, vector_mask, window, block_width, B, out,
                 window_bounds):
    """Each vector's B row is loaded once and feeds every row of its window (the 8x1 reuse)."""
    n_rows = out.shape[0]
    n_cols_out = B.shape[1]
    mask_bytes = (window + 7) // 8
    for part in prange(window_bounds.size - 1):
        for w in range(window_bounds[part], window_bounds[part + 1]):
            row0 = w * window
            out[row0:min(row0 + window, n_rows)] = 0
            first = row_window_offset[w]
            n_vectors = row_window_offset[w + 1] - first
            block_start = 0
            while block_start < n_vectors:
                width = min(block_width, n_vectors - block_start)
                for s in range(block_start, block_start + width):
                    vector = first + s
                    source = B[col_idx[vector]]
                    base = (first + block_start) * window + (s - block_start)
                    for byte in range(mask_bytes):
                        # The mask, not the value, decides: padding must not make 0 * inf = NaN.
                        bits = vector_mask[vector * mask_bytes + byte]
                        r = byte * 8
                        while bits:
                            if bits & 1:
                                value = values[base + r * width]
                                out_row = out[row0 + r]
                                for j in range(n_cols_out):
                                    out_row[j] += value * source[j]
                            bits >>= 1
                            r += 1
                block_start += block_width
