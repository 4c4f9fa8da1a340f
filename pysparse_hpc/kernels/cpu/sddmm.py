"""SDDMM on the CPU: ``out[k] = dot(X[i], Y[j])`` for every stored entry k = (i, j) of A.

The kernels compute the dot products only; ``alpha`` and ``beta`` are applied by the caller in
one vectorized pass. Single-head kernels take 2-D X (M, F) and Y (K, F) and, when both are
contiguous, hold a row of X in vector registers for all of the row's stored entries;
multi-head kernels take (M, heads, F) and (K, heads, F) and write (slots, heads). ``zero`` is
a scalar of the compute dtype, so dot products accumulate in it. Like the SpMM kernels, each
has a row-range body, a parallel driver over nonzero-balanced parts and a serial driver.
"""
from numba import njit, prange

from ._registers import compile_per_layout, dot_rows_products, dot_rows_unsummed

_JIT = dict(cache=True, nogil=True, fastmath=True)


def _csr_rows(indptr, indices, X, Y, zero, out, start, stop):
    """Rows ``start:stop`` of the single-head SDDMM; compiled per layout (`compile_per_layout`)."""


def _csr_rows_in_registers(indptr, indices, X, Y, zero, out, start, stop):
    """Contiguous X and Y: a register-sized chunk of X's row stays in registers while the Y
    rows of the row's stored entries are dotted with it (`dot_rows_products`)."""
    if X.shape[1] == 0:   # empty dot products
        out[indptr[start]:indptr[stop]] = zero
        return
    dot_rows_products(out, X, Y, indptr, indices, start, stop)


def _csr_rows_strided(indptr, indices, X, Y, zero, out, start, stop):
    """X and Y with any strides: four stored entries at a time (four Y rows in flight, X's
    row reused)."""
    n_features = X.shape[1]
    for row in range(start, stop):
        x = X[row]
        p = indptr[row]
        p_stop = indptr[row + 1]
        while p + 4 <= p_stop:
            y0, y1 = Y[indices[p]], Y[indices[p + 1]]
            y2, y3 = Y[indices[p + 2]], Y[indices[p + 3]]
            a0 = a1 = a2 = a3 = zero
            for f in range(n_features):
                xf = x[f]
                a0 += xf * y0[f]
                a1 += xf * y1[f]
                a2 += xf * y2[f]
                a3 += xf * y3[f]
            out[p], out[p + 1], out[p + 2], out[p + 3] = a0, a1, a2, a3
            p += 4
        while p < p_stop:
            y = Y[indices[p]]
            acc = zero
            for f in range(n_features):
                acc += x[f] * y[f]
            out[p] = acc
            p += 1


compile_per_layout(_csr_rows, _csr_rows_in_registers, _csr_rows_strided, _JIT)


@njit(**_JIT)
def _csr_rows_heads(indptr, indices, X, Y, zero, out, start, stop):
    n_heads, n_features = X.shape[1], X.shape[2]
    for row in range(start, stop):
        x = X[row]
        for p in range(indptr[row], indptr[row + 1]):
            y = Y[indices[p]]
            for h in range(n_heads):
                acc = zero
                for f in range(n_features):
                    acc += x[h, f] * y[h, f]
                out[p, h] = acc


@njit(parallel=True, **_JIT)
def csr_sddmm(indptr, indices, X, Y, zero, out, row_bounds):
    for part in prange(row_bounds.size - 1):
        if X.ndim == 2:
            _csr_rows(indptr, indices, X, Y, zero, out, row_bounds[part], row_bounds[part + 1])
        else:
            _csr_rows_heads(indptr, indices, X, Y, zero, out, row_bounds[part],
                            row_bounds[part + 1])


@njit(**_JIT)
def csr_sddmm_serial(indptr, indices, X, Y, zero, out, row_bounds):
    if X.ndim == 2:
        _csr_rows(indptr, indices, X, Y, zero, out, 0, indptr.size - 1)
    else:
        _csr_rows_heads(indptr, indices, X, Y, zero, out, 0, indptr.size - 1)


@njit(parallel=True, **_JIT)
def csr_sddmm_unsummed(indptr, indices, X, Y, zero, out, row_bounds):
    """`csr_sddmm` without the per-entry sums, for the benchmark's bound only (wrong results,
    see `dot_rows_unsummed`): C-contiguous 2-D X and Y, ``out`` with lanes - 1 spare slots."""
    for part in prange(row_bounds.size - 1):
        dot_rows_unsummed(out, X, Y, indptr, indices, row_bounds[part], row_bounds[part + 1])


@njit(**_JIT)
def csr_sddmm_unsummed_serial(indptr, indices, X, Y, zero, out, row_bounds):
    dot_rows_unsummed(out, X, Y, indptr, indices, 0, indptr.size - 1)


@njit(**_JIT)
def _blocked_windows(row_window_offset, col_idx, vector_mask, window, block_width, X, Y, zero,
                     out, start, stop):
    """Each vector's Y row is loaded once and dotted with every stored row of its window.

    Slots without a stored entry (padding) are set to 0, so the result keeps A's pattern.
    ``out`` is (slots,) for 2-D X and Y, (slots, heads) for 3-D.
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
                y = Y[col_idx[vector]]
                base = (first + block_start) * window + (s - block_start)
                for byte in range(mask_bytes):
                    bits = vector_mask[vector * mask_bytes + byte]
                    r = byte * 8
                    while bits:
                        if bits & 1:
                            x = X[row0 + r]
                            slot = base + r * width
                            if X.ndim == 2:
                                acc = zero
                                for f in range(x.shape[0]):
                                    acc += x[f] * y[f]
                                out[slot] = acc
                            else:
                                for h in range(x.shape[0]):
                                    acc = zero
                                    for f in range(x.shape[1]):
                                        acc += x[h, f] * y[h, f]
                                    out[slot, h] = acc
                        bits >>= 1
                        r += 1
            block_start += block_width


@njit(parallel=True, **_JIT)
def blocked_sddmm(row_window_offset, col_idx, vector_mask, window, block_width, X, Y, zero, out,
                  window_bounds):
    for part in prange(window_bounds.size - 1):
        _blocked_windows(row_window_offset, col_idx, vector_mask, window, block_width, X, Y, zero,
                         out, window_bounds[part], window_bounds[part + 1])


@njit(**_JIT)
def blocked_sddmm_serial(row_window_offset, col_idx, vector_mask, window, block_width, X, Y, zero,
                         out, window_bounds):
    _blocked_windows(row_window_offset, col_idx, vector_mask, window, block_width, X, Y, zero, out,
                     0, row_window_offset.size - 1)
