"""SDDMM on the GPU: dot products of X's and Y's rows at A's stored entries.

CUDA cores (CSR): one thread per stored entry; the entry's row comes from a precomputed
entry -> row array, so threads need no search.

Tensor cores (ME-BCRS, tf32 ``mma.m16n8k8``): the products of a window's 8 rows with 16 of its
vectors form one 16x8 tile D = Y_v X_w^T, accumulated over the feature axis 8 at a time (A
operand: Y rows of the 16 vectors, B operand: X rows of the window). Each lane writes its four
dot products where the vector mask says the entry is stored; the caller zeroes the output first,
so padding slots stay 0. One warp per (window, 16 vectors).
"""
import math

from numba import cuda, float32

from ._mma import mma_tf32_m16n8k8, to_tf32
from .spmm import BLOCK_WIDTH, WINDOW, _zero

__all__ = ["csr_sddmm", "mebcrs_sddmm_tf32", "scale_add", "launch_csr_sddmm",
           "launch_mebcrs_sddmm_tf32", "launch_scale_add"]

VECTORS_PER_WARP = 16


def _csr_sddmm(rows, indices, X, Y, out):
    p = cuda.grid(1)
    if p >= out.shape[0]:
        return
    x = X[rows[p]]
    y = Y[indices[p]]
    acc = 0.0
    for f in range(X.shape[1]):
        acc += x[f] * y[f]
    out[p] = acc


def _mebcrs_sddmm_tf32(row_window_offset, col_idx, vector_mask, n_rows, X, Y, out):
    w = cuda.blockIdx.x
    lane = cuda.threadIdx.x % 32
    g = lane >> 2
    t = lane & 3
    first = row_window_offset[w]
    n_vectors = row_window_offset[w + 1] - first
    first_slot = cuda.blockIdx.y * VECTORS_PER_WARP  # the warp's 16 vectors within the window
    if first_slot >= n_vectors:
        return  # the whole warp leaves together, so no mma is left half-issued
    row0 = w * WINDOW
    n_features = X.shape[1]
    v_lo = first_slot + g  # A rows g and g + 8: two vectors of this lane
    v_hi = v_lo + 8
    src_lo = col_idx[first + v_lo] if v_lo < n_vectors else -1
    src_hi = col_idx[first + v_hi] if v_hi < n_vectors else -1
    x_row = row0 + g  # B column g: a window row
    c0 = float32(0.0)
    c1 = float32(0.0)
    c2 = float32(0.0)
    c3 = float32(0.0)
    for f0 in range(0, n_features, 8):
        f_a = f0 + t
        f_b = f0 + t + 4
        a0 = float32(0.0)
        a1 = float32(0.0)
        a2 = float32(0.0)
        a3 = float32(0.0)
        b0 = float32(0.0)
        b1 = float32(0.0)
        if f_a < n_features:
            if src_lo >= 0:
                a0 = Y[src_lo, f_a]
            if src_hi >= 0:
                a1 = Y[src_hi, f_a]
            if x_row < n_rows:
                b0 = X[x_row, f_a]
        if f_b < n_features:
            if src_lo >= 0:
                a2 = Y[src_lo, f_b]
            if src_hi >= 0:
                a3 = Y[src_hi, f_b]
            if x_row < n_rows:
                b1 = X[x_row, f_b]
        c0, c1, c2, c3 = mma_tf32_m16n8k8(to_tf32(a0), to_tf32(a1), to_tf32(a2), to_tf32(a3),
                                          to_tf32(b0), to_tf32(b1), c0, c1, c2, c3)
    # d0 (v_lo, row 2t), d1 (v_lo, 2t + 1), d2 (v_hi, 2t), d3 (v_hi, 2t + 1).
    for k in range(4):
        slot = v_lo if k < 2 else v_hi
        r = 2 * t + (k & 1)
        if slot < n_vectors and vector_mask[first + slot] & (1 << r):
            block_start = (slot // BLOCK_WIDTH) * BLOCK_WIDTH
            width = min(BLOCK_WIDTH, n_vectors - block_start)
            value = c0 if k == 0 else (c1 if k == 1 else (c2 if k == 2 else c3))
            out[(first + block_start) * WINDOW + r * width + (slot - block_start)] = value


def _scale_add(out, addend, alpha, beta):
    """out = alpha * out + beta * addend, elementwise (beta == 0 leaves ``addend`` unread)."""
    k = cuda.grid(1)
    if k < out.shape[0]:
        if beta == 0:
            out[k] = alpha * out[k]
        else:
            out[k] = alpha * out[k] + beta * addend[k]


scale_add = cuda.jit(_scale_add)
csr_sddmm = cuda.jit(_csr_sddmm)
mebcrs_sddmm_tf32 = cuda.jit(_mebcrs_sddmm_tf32)


def launch_csr_sddmm(rows, indices, X, Y, out, threads=128):
    """Run the CUDA-core kernel (``rows[k]`` is the row of stored entry k)."""
    if out.shape[0] == 0:
        return
    csr_sddmm[math.ceil(out.shape[0] / threads), threads](rows, indices, X, Y, out)


def launch_mebcrs_sddmm_tf32(A, X, Y, out, widest_window):
    """Run the tensor-core kernel; ``out`` is the flat values layout (zeroed here first)."""
    if out.shape[0] == 0:
        return
    flat = out.reshape((out.shape[0], 1))
    _zero[(math.ceil(out.shape[0] / 16), 1), (16, 16)](flat)
    n_windows = A.row_window_offset.shape[0] - 1
    grid = (n_windows, max(1, math.ceil(widest_window / VECTORS_PER_WARP)))
    mebcrs_sddmm_tf32[grid, 32](A.row_window_offset, A.col_idx, A.vector_mask, A.shape[0], X, Y,
                                out)


def launch_scale_add(out, addend, alpha, beta, threads=128):
    """Apply ``alpha`` and ``beta`` to a result on the device."""
    if out.shape[0] == 0 or (alpha == 1.0 and beta == 0.0):
        return
    scale_add[math.ceil(out.shape[0] / threads), threads](out, addend, alpha, beta)
