"""SpMM on the CPU: ``out = A @ B`` for CSR and row-window blocked A, dense B.

Each kernel is a body over a range of rows (or windows) and two drivers: a parallel one that
runs the parts of a nonzero-balanced partition under ``prange`` (skewed rows spread across
threads), and a serial one for work too small to pay for waking the thread pool. There is no
per-row allocation. B may have any strides; the CSR kernel sums contiguous rows in registers.
"""
import numpy as np
from numba import njit, prange

from ._registers import compile_per_layout, sum_rows_products

_JIT = dict(cache=True, nogil=True, fastmath=True)


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


@njit(inline="always", **_JIT)  # a call per row costs more than short rows take
def _add_row_products(out_row, indptr, indices, data, B, row):
    """``out_row = A[row] @ B`` for one row (or one column tile of it).

    Nonzeros are taken four at a time: four independent B rows are in flight and the output
    row is read and written once per four instead of once per nonzero.
    """
    n_cols_out = out_row.shape[0]
    out_row[:] = 0
    p = indptr[row]
    p_stop = indptr[row + 1]
    while p + 4 <= p_stop:
        v0, v1, v2, v3 = data[p], data[p + 1], data[p + 2], data[p + 3]
        b0, b1 = B[indices[p]], B[indices[p + 1]]
        b2, b3 = B[indices[p + 2]], B[indices[p + 3]]
        for j in range(n_cols_out):
            out_row[j] += v0 * b0[j] + v1 * b1[j] + v2 * b2[j] + v3 * b3[j]
        p += 4
    while p < p_stop:
        value = data[p]
        source = B[indices[p]]
        for j in range(n_cols_out):
            out_row[j] += value * source[j]
        p += 1


def _csr_rows(indptr, indices, data, B, out, tile, start, stop):
    """Rows ``start:stop`` of ``out = A @ B``; compiled per layout (`compile_per_layout`)."""


def _csr_rows_in_registers(indptr, indices, data, B, out, tile, start, stop):
    """Contiguous B and out: each output row is summed in vector registers, a register-sized
    chunk of columns at a time (`sum_rows_products`), and written once."""
    sum_rows_products(out, B, indptr, indices, data, start, stop, 1)


def _csr_rows_strided(indptr, indices, data, B, out, tile, start, stop):
    """B with any strides (a transposed torch tensor, a column slice), ``tile`` output columns
    at a time.

    B no wider than a tile (the default: up to 4096 columns) goes through whole rows; wider B
    is cut into column tiles so pieces of the output row and of the gathered B rows stay in
    cache. The tiles are 2-D slices, which Numba compiles as any-layout arrays, slower per
    element; measured, whole rows won up to 3703 columns, hence the wide default.
    """
    n_cols_out = B.shape[1]
    for row in range(start, stop):
        if n_cols_out <= tile:
            _add_row_products(out[row], indptr, indices, data, B, row)
        else:
            for j0 in range(0, n_cols_out, tile):
                j1 = min(j0 + tile, n_cols_out)
                _add_row_products(out[row, j0:j1], indptr, indices, data, B[:, j0:j1], row)


compile_per_layout(_csr_rows, _csr_rows_in_registers, _csr_rows_strided, _JIT)


@njit(parallel=True, **_JIT)
def csr_spmm(indptr, indices, data, B, out, tile, row_bounds):
    for part in prange(row_bounds.size - 1):
        _csr_rows(indptr, indices, data, B, out, tile, row_bounds[part], row_bounds[part + 1])


@njit(**_JIT)
def csr_spmm_serial(indptr, indices, data, B, out, tile, row_bounds):
    _csr_rows(indptr, indices, data, B, out, tile, 0, indptr.size - 1)


@njit(**_JIT)
def _blocked_windows(row_window_offset, col_idx, values, vector_mask, window, block_width, B, out,
                     start, stop):
    """Windows ``start:stop``: each vector's B row is loaded once for all rows of its window."""
    n_rows = out.shape[0]
    n_cols_out = B.shape[1]
    mask_bytes = (window + 7) // 8
    for w in range(start, stop):
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


@njit(parallel=True, **_JIT)
def blocked_spmm(row_window_offset, col_idx, values, vector_mask, window, block_width, B, out,
                 window_bounds):
    for part in prange(window_bounds.size - 1):
        _blocked_windows(row_window_offset, col_idx, values, vector_mask, window, block_width, B,
                         out, window_bounds[part], window_bounds[part + 1])


@njit(**_JIT)
def blocked_spmm_serial(row_window_offset, col_idx, values, vector_mask, window, block_width, B,
                        out, window_bounds):
    _blocked_windows(row_window_offset, col_idx, values, vector_mask, window, block_width, B, out,
                     0, row_window_offset.size - 1)


def _csr_rows_heads(indptr, indices, values, B, out, start, stop):
    """Rows ``start:stop`` of the multi-head product ``out[i, h] = sum_p values[p, h] B[j_p, h]``
    (one attention matrix per head sharing A's pattern, as in multi-head GAT); compiled per
    layout (`compile_per_layout`)."""


def _csr_rows_heads_in_registers(indptr, indices, values, B, out, start, stop):
    """Contiguous operands: per row and head, the head's output row is summed in registers
    (B and out seen as (rows, heads * features), the head's values as a strided column)."""
    n_heads, n_features = B.shape[1], B.shape[2]
    B_rows = B.reshape(B.shape[0], n_heads * n_features)
    out_rows = out.reshape(out.shape[0], n_heads * n_features)
    sum_rows_products(out_rows, B_rows, indptr, indices, values.reshape(values.size), start,
                      stop, n_heads)


def _csr_rows_heads_strided(indptr, indices, values, B, out, start, stop):
    n_heads, n_features = B.shape[1], B.shape[2]
    for row in range(start, stop):
        out_row = out[row]
        out_row[:] = 0
        for p in range(indptr[row], indptr[row + 1]):
            source = B[indices[p]]
            for h in range(n_heads):
                value = values[p, h]
                for f in range(n_features):
                    out_row[h, f] += value * source[h, f]


compile_per_layout(_csr_rows_heads, _csr_rows_heads_in_registers, _csr_rows_heads_strided,
                   _JIT)


@njit(parallel=True, **_JIT)
def csr_spmm_heads(indptr, indices, values, B, out, row_bounds):
    for part in prange(row_bounds.size - 1):
        _csr_rows_heads(indptr, indices, values, B, out, row_bounds[part], row_bounds[part + 1])


@njit(**_JIT)
def csr_spmm_heads_serial(indptr, indices, values, B, out, row_bounds):
    _csr_rows_heads(indptr, indices, values, B, out, 0, indptr.size - 1)
