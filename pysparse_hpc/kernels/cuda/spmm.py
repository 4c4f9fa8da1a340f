"""SpMM on the GPU: tensor-core ME-BCRS kernels (FlashSparse's swap-and-transpose) and a
CUDA-core CSR kernel.

Swap-and-transpose: ``C^T = B^T A^T``. In ``mma.m16n8k8`` the dense B^T is the left operand
(16 output columns by 8 reduction indices, the columns of 8 vectors) and the sparse A^T the right
one (8 vectors by the 8 rows of a window), so the unit of sparsity is an 8x1 vector. The 16x8
accumulator is a tile of C^T; each lane stores its four values transposed back into C.

tf32 uses m16n8k8 rather than m16n8k4: the reduction extent is then 8 vectors, the block width
the fp16 kernel (m16n8k8, f16) uses too, so one ME-BCRS array (``block_width=8``) serves both
precisions, and each instruction does twice the work.

Grid: one block per (window, ``16 * warps`` output columns); each warp owns 16 columns and walks
the window's blocks, so all warps of a block issue the same number of mma instructions.
"""
import math

import numpy as np
from numba import cuda, float32

from ._mma import mma_tf32_m16n8k8, to_tf32

__all__ = ["mebcrs_spmm_tf32", "csr_spmm", "launch_mebcrs_spmm_tf32", "launch_csr_spmm"]

#: Vectors per block (the mma reduction extent) and rows per window the tf32 kernel assumes.
BLOCK_WIDTH = 8
WINDOW = 8


def _mebcrs_spmm_tf32(row_window_offset, col_idx, values, n_rows, B, out):
    w = cuda.blockIdx.x
    warps = cuda.blockDim.x // 32
    warp = cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    g = lane >> 2
    t = lane & 3
    n_cols_out = B.shape[1]
    j_lo = (cuda.blockIdx.y * warps + warp) * 16 + g  # this lane's two output columns
    j_hi = j_lo + 8
    first = row_window_offset[w]
    n_vectors = row_window_offset[w + 1] - first
    row0 = w * WINDOW
    c0 = float32(0.0)
    c1 = float32(0.0)
    c2 = float32(0.0)
    c3 = float32(0.0)
    for block_start in range(0, n_vectors, BLOCK_WIDTH):
        width = min(BLOCK_WIDTH, n_vectors - block_start)
        base = (first + block_start) * WINDOW
        # A operand: B^T rows j_lo / j_hi, reduction slots t / t + 4 (vectors of the block).
        a0 = float32(0.0)
        a1 = float32(0.0)
        a2 = float32(0.0)
        a3 = float32(0.0)
        b0 = float32(0.0)
        b1 = float32(0.0)
        if t < width:
            source = col_idx[first + block_start + t]
            if j_lo < n_cols_out:
                a0 = B[source, j_lo]
            if j_hi < n_cols_out:
                a1 = B[source, j_hi]
            b0 = values[base + g * width + t]  # A^T[slot t, window row g]
        if t + 4 < width:
            source = col_idx[first + block_start + t + 4]
            if j_lo < n_cols_out:
                a2 = B[source, j_lo]
            if j_hi < n_cols_out:
                a3 = B[source, j_hi]
            b1 = values[base + g * width + t + 4]
        c0, c1, c2, c3 = mma_tf32_m16n8k8(to_tf32(a0), to_tf32(a1), to_tf32(a2), to_tf32(a3),
                                          to_tf32(b0), to_tf32(b1), c0, c1, c2, c3)
    # D[col, row]: d0 (j_lo, 2t), d1 (j_lo, 2t + 1), d2 (j_hi, 2t), d3 (j_hi, 2t + 1).
    row = row0 + 2 * t
    if j_lo < n_cols_out:
        if row < n_rows:
            out[row, j_lo] = c0
        if row + 1 < n_rows:
            out[row + 1, j_lo] = c1
    if j_hi < n_cols_out:
        if row < n_rows:
            out[row, j_hi] = c2
        if row + 1 < n_rows:
            out[row + 1, j_hi] = c3


def _csr_spmm(indptr, indices, data, B, out):
    """CUDA cores: one thread per output entry (row from y, column from x, so loads coalesce)."""
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if row >= out.shape[0] or col >= out.shape[1]:
        return
    acc = 0.0
    for p in range(indptr[row], indptr[row + 1]):
        acc += data[p] * B[indices[p], col]
    out[row, col] = acc


mebcrs_spmm_tf32 = cuda.jit(_mebcrs_spmm_tf32)
csr_spmm = cuda.jit(_csr_spmm)


def launch_mebcrs_spmm_tf32(A, B, out, warps):
    """Run the tf32 kernel on device (or simulated) arrays; ``A`` is an 8x1 ME-BCRS, k = 8."""
    n_windows = A.row_window_offset.size - 1
    n_cols = B.shape[1]
    if n_windows == 0 or n_cols == 0:
        return
    grid = (n_windows, math.ceil(n_cols / (16 * warps)))
    mebcrs_spmm_tf32[grid, 32 * warps](A.row_window_offset, A.col_idx, A.values, A.shape[0], B,
                                       out)


def launch_csr_spmm(indptr, indices, data, B, out, threads_x=32, threads_y=4):
    """Run the CUDA-core CSR kernel."""
    n_rows, n_cols = out.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid = (math.ceil(n_cols / threads_x), math.ceil(n_rows / threads_y))
    csr_spmm[grid, (threads_x, threads_y)](indptr, indices, data, B, out)
