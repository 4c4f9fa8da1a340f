"""SDDMM on the CPU: for every stored (i, j) of A, ``alpha * dot(X[i], Y[j]) + beta * A[i, j]``.

One code path for single- and multi-head: X is (M, heads, F), Y is (K, heads, F) and the result
(stored slots, heads); the single-head form is the ``heads = 1`` view. ``zero`` is a scalar of
the compute dtype so the dot products accumulate in it. With ``beta == 0`` A's values are not
read at all (BLAS semantics: a NaN in A does not leak into the result). Like the SpMM kernels,
each has a row-range body, a parallel driver over balanced parts and a serial driver.
"""
from numba import njit, prange

_JIT = dict(cache=True, nogil=True, fastmath=True)


@njit(**_JIT)
def _dot_into(out, slot, x_row, y_row, alpha, beta, a_values, zero):
    for h in range(x_row.shape[0]):
        acc = zero
        for f in range(x_row.shape[1]):
            acc += x_row[h, f] * y_row[h, f]
        if beta == 0:
            out[slot, h] = alpha * acc
        else:
            out[slot, h] = alpha * acc + beta * a_values[slot, h]


@njit(**_JIT)
def _csr_rows(indptr, indices, a_values, X, Y, alpha, beta, zero, out, start, stop):
    for row in range(start, stop):
        x_row = X[row]
        for p in range(indptr[row], indptr[row + 1]):
            _dot_into(out, p, x_row, Y[indices[p]], alpha, beta, a_values, zero)


@njit(parallel=True, **_JIT)
def csr_sddmm(indptr, indices, a_values, X, Y, alpha, beta, zero, out, row_bounds):
    for part in prange(row_bounds.size - 1):
        _csr_rows(indptr, indices, a_values, X, Y, alpha, beta, zero, out, row_bounds[part],
                  row_bounds[part + 1])


@njit(**_JIT)
def csr_sddmm_serial(indptr, indices, a_values, X, Y, alpha, beta, zero, out, row_bounds):
    _csr_rows(indptr, indices, a_values, X, Y, alpha, beta, zero, out, 0, indptr.size - 1)


@njit(**_JIT)
def _blocked_windows(row_window_offset, col_idx, a_values, vector_mask, window, block_width, X, Y,
                     alpha, beta, zero, out, start, stop):
    """Each vector's Y row is loaded once and dotted with every stored row of its window.

    Slots without a stored entry (padding) are set to 0, so the result keeps A's pattern.
    """
    mask_bytes = (window + 7) // 8
    for w in range(start, stop):
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
                        if bits & 1:
                            _dot_into(out, base + r * width, X[row0 + r], y_row, alpha, beta,
                                      a_values, zero)
                        bits >>= 1
                        r += 1
            block_start += block_width


@njit(parallel=True, **_JIT)
def blocked_sddmm(row_window_offset, col_idx, a_values, vector_mask, window, block_width, X, Y,
                  alpha, beta, zero, out, window_bounds):
    for part in prange(window_bounds.size - 1):
        _blocked_windows(row_window_offset, col_idx, a_values, vector_mask, window, block_width,
                         X, Y, alpha, beta, zero, out, window_bounds[part],
                         window_bounds[part + 1])


@njit(**_JIT)
def blocked_sddmm_serial(row_window_offset, col_idx, a_values, vector_mask, window, block_width,
                         X, Y, alpha, beta, zero, out, window_bounds):
    _blocked_windows(row_window_offset, col_idx, a_values, vector_mask, window, block_width, X, Y,
                     alpha, beta, zero, out, 0, row_window_offset.size - 1)
