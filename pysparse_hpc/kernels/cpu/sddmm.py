"""SDDMM on the CPU: for every stored (i, j) of A, ``alpha * dot(X[i], Y[j]) + beta * A[i, j]``.

One code path for single- and multi-head: X is (M, heads, F), Y is (K, heads, F) and the result
(stored entries, heads); the single-head form is the ``heads = 1`` view. ``zero`` is a scalar of
the compute dtype so the dot products accumulate in it. With ``beta == 0`` A's values are not
read at all (BLAS semantics: a NaN in A does not leak into the result).
"""
from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def csr_sddmm(indptr, indices, a_values, X, Y, alpha, beta, zero, out, row_bounds):
    n_heads = X.shape[1]
    n_features = X.shape[2]
    for part in prange(row_bounds.size - 1):
        for row in range(row_bounds[part], row_bounds[part + 1]):
            x_row = X[row]
            for p in range(indptr[row], indptr[row + 1]):
                y_row = Y[indices[p]]
                for h in range(n_heads):
                    acc = zero
                    for f in range(n_features):
                        acc += x_row[h, f] * y_row[h, f]
                    if beta == 0:
                        out[p, h] = alpha * acc
                    else:
                        out[p, h] = alpha * acc + beta * a_values[p, h]


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def blocked_sddmm(row_window_offset, col_idx, a_values, vector_mask, window, block_width, X, Y,
                  alpha, beta, zero, out, window_bounds):
    """Each vector's Y row is loaded once and dotted with every stored row of its window.

    Slots without a stored entry (padding) are set to 0, so the result keeps A's pattern.
    """
    n_rows = X.shape[0]
    n_heads = X.shape[1]
    n_features = X.shape[2]
    mask_bytes = (window + 7) // 8
    for part in prange(window_bounds.size - 1):
        for w in range(window_bounds[part], window_bounds[part + 1]):
            row0 = w * window
            first = row_window_offset[w]
            n_vectors = row_window_offset[w + 1] - first
            out[first * window:(first + n_vectors) * window] = 0
            block_start = 0
            while block_start < n_vectors:
                width = min(block_width, n_vectors - block_start)
                for s in range(block_start, block_start + width):
                    vector = first + s
                    y_row = Y[col_idx[vector]]
                    base = (first + block_start) * window + (s - block_start)
                    for byte in range(mask_bytes):
                        bits = vector_mask[vector * mask_bytes + byte]
                        r = byte * 8
                        while bits:
                            if bits & 1 and row0 + r < n_rows:
                                x_row = X[row0 + r]
                                slot = base + r * width
                                for h in range(n_heads):
                                    acc = zero
                                    for f in range(n_features):
                                        acc += x_row[h, f] * y_row[h, f]
                                    if beta == 0:
                                        out[slot, h] = alpha * acc
                                    else:
                                        out[slot, h] = alpha * acc + beta * a_values[slot, h]
                            bits >>= 1
                            r += 1
                block_start += block_width
