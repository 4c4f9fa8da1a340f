"""SpMM on the GPU: tensor-core ME-BCRS kernels (FlashSparse's swap-and-transpose) and a
CUDA-core CSR kernel.

Swap-and-transpose: ``C^T = B^T A^T``. In ``mma.m16n8k8`` the dense B^T is the left operand
(16 output columns by 8 reduction indices, the columns of 8 vectors) and the sparse A^T the right
one (8 vectors by the 8 rows of a window), so the unit of sparsity is an 8x1 vector. The 16x8
accumulator is a tile of C^T; each lane stores its four values transposed back into C.

tf32 uses m16n8k8 rather than m16n8k4: the reduction extent is then 8 vectors, the block width
the fp16 kernel (m16n8k8, f16) uses too, so one ME-BCRS array (``block_width=8``) serves both
precisions, and each instruction does twice the work.

Grid: one thread block per (part, ``16 * warps`` output columns); each warp owns 16 columns and
walks the part's blocks, so all warps of a thread block issue the same number of mma
instructions. A part is a window, or, for load balance on skewed graphs (FlashSparse's
"balance" variant), a run of at most ``split`` blocks of a long window: the parts of a split
window add their sums into its rows, zeroed first, with fp32 atomics; all other windows store
directly.

Thread mapping (FlashSparse's "memory-efficient" one, no shared memory): MMA rows g and g + 8
stand for output columns 2g and 2g + 1 of the warp's 16, so each lane reads its two values of a
B row, and writes its two results of a C row, as one paired access (`_pairs`).
"""
import math

import numpy as np
from numba import cuda, float32

from ._mma import mma_f16_m16n8k8, mma_tf32_m16n8k8, pack_half2, to_tf32
from ._pairs import load_pair, pairs_aligned, store_pair

__all__ = ["MEBCRS_SPMM_SOURCES", "csr_spmm", "launch_mebcrs_spmm", "launch_csr_spmm",
           "zero_contiguous", "mma_parts"]

#: Vectors per block (the mma reduction extent) and rows per window the tf32 kernel assumes.
BLOCK_WIDTH = 8
WINDOW = 8


def _make_mebcrs_spmm(half, paired):
    """The tensor-core SpMM source for fp16 (``half``) or tf32 inputs, with paired or single
    accesses of B and the output; both flags are closure constants, so each kernel compiles only
    its own branches.

    Both precisions load the same values per lane: reduction slots (t, t + 4) in the tf32
    layout, (2t, 2t + 1) in the fp16 one, for window row g and output columns j and j + 1
    (MMA rows g and g + 8). ``paired`` needs an even width and pair-aligned rows (`pairs_aligned`).
    """
    def kernel(row_window_offset, col_idx, values, n_rows, B, out, part_window, part_first_block,
               part_n_blocks, part_atomic):
        part = cuda.blockIdx.x
        w = part_window[part]
        warps = cuda.blockDim.x // 32
        warp = cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        g = lane >> 2
        t = lane & 3
        n_cols_out = B.shape[1]
        j_lo = (cuda.blockIdx.y * warps + warp) * 16 + 2 * g  # this lane's two output columns
        j_hi = j_lo + 1
        in_lo = j_lo < n_cols_out
        in_hi = j_hi < n_cols_out
        slot0 = 2 * t if half else t
        slot1 = 2 * t + 1 if half else t + 4
        first = row_window_offset[w]
        n_vectors = row_window_offset[w + 1] - first
        row0 = w * WINDOW
        c0 = float32(0.0)
        c1 = float32(0.0)
        c2 = float32(0.0)
        c3 = float32(0.0)
        first_block = part_first_block[part]
        for block in range(first_block, first_block + part_n_blocks[part]):
            block_start = block * BLOCK_WIDTH
            width = min(BLOCK_WIDTH, n_vectors - block_start)
            base = (first + block_start) * WINDOW
            # B^T at (column, slot) and A^T at (slot, window row g); zero past the block's end
            # or the matrix's last column.
            lo0 = float32(0.0)
            hi0 = float32(0.0)
            lo1 = float32(0.0)
            hi1 = float32(0.0)
            sparse0 = float32(0.0)
            sparse1 = float32(0.0)
            if slot0 < width:
                source = col_idx[first + block_start + slot0]
                if paired and in_lo:
                    lo0, hi0 = load_pair(B, source, j_lo)
                elif not paired:
                    if in_lo:
                        lo0 = B[source, j_lo]
                    if in_hi:
                        hi0 = B[source, j_hi]
                sparse0 = values[base + g * width + slot0]
            if slot1 < width:
                source = col_idx[first + block_start + slot1]
                if paired and in_lo:
                    lo1, hi1 = load_pair(B, source, j_lo)
                elif not paired:
                    if in_lo:
                        lo1 = B[source, j_lo]
                    if in_hi:
                        hi1 = B[source, j_hi]
                sparse1 = values[base + g * width + slot1]
            if half:
                c0, c1, c2, c3 = mma_f16_m16n8k8(pack_half2(lo0, lo1), pack_half2(hi0, hi1),
                                                 pack_half2(sparse0, sparse1), c0, c1, c2, c3)
            else:
                c0, c1, c2, c3 = mma_tf32_m16n8k8(to_tf32(lo0), to_tf32(hi0), to_tf32(lo1),
                                                  to_tf32(hi1), to_tf32(sparse0),
                                                  to_tf32(sparse1), c0, c1, c2, c3)
        # D is a tile of C^T: d0 (j_lo, row), d1 (j_lo, row + 1), d2 (j_hi, row), d3 (j_hi,
        # row + 1), written back transposed inside the matrix's edges: (d0, d2) and (d1, d3)
        # are neighbours in a row of C.
        row = row0 + 2 * t
        atomic = part_atomic[part] != 0
        for k in range(2):
            target = row + k
            first_value = c0 if k == 0 else c1
            second_value = c2 if k == 0 else c3
            if target < n_rows and in_lo:
                if atomic:
                    cuda.atomic.add(out, (target, j_lo), first_value)
                    if in_hi:
                        cuda.atomic.add(out, (target, j_hi), second_value)
                elif paired:
                    store_pair(out, target, j_lo, first_value, second_value)
                else:
                    out[target, j_lo] = first_value
                    if in_hi:
                        out[target, j_hi] = second_value
    return kernel


def _blocked16_spmm_tf32(row_window_offset, col_idx, values, n_rows, B, out, part_window,
                         part_first_block, part_n_blocks, part_atomic):
    """The 16x1 ablation (TC-GNN / DTC-SpMM granularity), without the swap: a block of 16 rows
    by 8 vectors is mma's left operand, 8 B rows by 8 output columns its right operand. Each warp
    owns 8 output columns of a 16-row window."""
    part = cuda.blockIdx.x
    w = part_window[part]
    warps = cuda.blockDim.x // 32
    warp = cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    g = lane >> 2
    t = lane & 3
    n_cols_out = B.shape[1]
    j0 = (cuda.blockIdx.y * warps + warp) * 8
    first = row_window_offset[w]
    n_vectors = row_window_offset[w + 1] - first
    row0 = w * 16
    c0 = float32(0.0)
    c1 = float32(0.0)
    c2 = float32(0.0)
    c3 = float32(0.0)
    first_block = part_first_block[part]
    for block in range(first_block, first_block + part_n_blocks[part]):
        block_start = block * BLOCK_WIDTH
        width = min(BLOCK_WIDTH, n_vectors - block_start)
        base = (first + block_start) * 16
        a0 = float32(0.0)
        a1 = float32(0.0)
        a2 = float32(0.0)
        a3 = float32(0.0)
        b0 = float32(0.0)
        b1 = float32(0.0)
        if t < width:  # A (rows g, g + 8; slot t) and B (slot t; column j0 + g)
            a0 = values[base + g * width + t]
            a1 = values[base + (g + 8) * width + t]
            if j0 + g < n_cols_out:
                b0 = B[col_idx[first + block_start + t], j0 + g]
        if t + 4 < width:
            a2 = values[base + g * width + t + 4]
            a3 = values[base + (g + 8) * width + t + 4]
            if j0 + g < n_cols_out:
                b1 = B[col_idx[first + block_start + t + 4], j0 + g]
        c0, c1, c2, c3 = mma_tf32_m16n8k8(to_tf32(a0), to_tf32(a1), to_tf32(a2), to_tf32(a3),
                                          to_tf32(b0), to_tf32(b1), c0, c1, c2, c3)
    # D is C itself here: d0 (g, 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1).
    atomic = part_atomic[part] != 0
    for k in range(4):
        row = row0 + g + (8 if k >= 2 else 0)
        column = j0 + 2 * t + (k & 1)
        if row < n_rows and column < n_cols_out:
            value = c0 if k == 0 else (c1 if k == 1 else (c2 if k == 2 else c3))
            if atomic:
                cuda.atomic.add(out, (row, column), value)
            else:
                out[row, column] = value


def mma_parts(row_window_offset, split):
    """The part list of the load-balanced grid: ``(window, first_block, n_blocks, atomic,
    split_windows)``.

    Windows of more than ``split`` blocks are cut into runs of ``split`` blocks, flagged atomic;
    every other window, empty ones included (their rows must still be written), is one part.
    ``split_windows`` lists the windows cut (ascending): only their rows are zeroed before the
    parts add into them.
    """
    offsets = np.asarray(row_window_offset, dtype=np.int64)
    blocks = -(-np.diff(offsets) // BLOCK_WIDTH)
    n_parts = np.maximum(1, -(-blocks // split))
    window = np.repeat(np.arange(blocks.size), n_parts)
    index_in_window = np.arange(window.size) - np.repeat(np.cumsum(n_parts) - n_parts, n_parts)
    first_block = index_in_window * split
    n_blocks = np.minimum(split, blocks[window] - first_block).clip(min=0)
    atomic = (n_parts[window] > 1).astype(np.int32)
    return window, first_block, n_blocks, atomic, np.flatnonzero(n_parts > 1)


#: Kernel sources by (precision, paired accesses) (plain functions: `cuda.compile_ptx` takes
#: these).
MEBCRS_SPMM_SOURCES = {(precision, paired): _make_mebcrs_spmm(precision == "fp16", paired)
                       for precision in ("tf32", "fp16") for paired in (False, True)}


def _csr_spmm(indptr, indices, data, B, out):
    """CUDA cores: one thread per output entry; a block's threadIdx.x runs along a row's
    columns, so loads coalesce. Blocks step over rows in the grid's x, whose limit (2^31 - 1)
    holds any row count; the y limit (65535) would stop at 262,140 rows."""
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if row >= out.shape[0] or col >= out.shape[1]:
        return
    # The output's dtype, but at least float32: half sums saturate (2048 + 1 rounds to 2048).
    # A bare 0.0 would make float32 sums float64; the added float32 zero folds away.
    acc = out.dtype.type(0) + float32(0)
    for p in range(indptr[row], indptr[row + 1]):
        acc += data[p] * B[indices[p], col]
    out[row, col] = acc


csr_spmm = cuda.jit(_csr_spmm)
_MMA_KERNELS = {precision: cuda.jit(source) for precision, source in MEBCRS_SPMM_SOURCES.items()}
_MMA_KERNELS["tf32-16x1", False] = cuda.jit(_blocked16_spmm_tf32)
#: Output columns one warp covers, by kernel: 16 with swap-and-transpose, 8 without.
_COLUMNS_PER_WARP = {"tf32": 16, "fp16": 16, "tf32-16x1": 8}


def _zero_flat(flat):
    # a grid-stride loop: consecutive threads store consecutive elements, so the stores
    # coalesce whatever the array's shape was (a (slots, 1) column wastes no lanes)
    for i in range(cuda.grid(1), flat.shape[0], cuda.gridsize(1)):
        flat[i] = 0


def _zero_windows(out, windows, window_rows):
    # one block per listed window: its rows, threadIdx.x along each row
    first_row = windows[cuda.blockIdx.x] * window_rows
    last_row = min(first_row + window_rows, out.shape[0])
    for row in range(first_row + cuda.threadIdx.y, last_row, cuda.blockDim.y):
        for col in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            out[row, col] = 0


_zero_flat = cuda.jit(_zero_flat)
_zero_windows = cuda.jit(_zero_windows)

#: Threads per block and the most blocks of `zero_contiguous` (beyond, each thread loops).
_ZERO_THREADS = 256
_ZERO_MAX_BLOCKS = 4096


def zero_contiguous(out):
    """Set the C-contiguous device array ``out``, of any shape, to 0."""
    if out.size == 0:
        return
    flat = out.reshape(out.size)
    blocks = min(_ZERO_MAX_BLOCKS, math.ceil(out.size / _ZERO_THREADS))
    _zero_flat[blocks, _ZERO_THREADS](flat)


def launch_mebcrs_spmm(A, B, out, warps, precision, parts):
    """Run a tensor-core kernel on device (or simulated) arrays: ``A`` is 8x1 ME-BCRS with k = 8
    for "tf32"/"fp16", a 16-row blocked array with k = 8 for "tf32-16x1" (the ablation). ``B``
    is float32 (or float16 for "fp16"), ``out`` float32; when both have pair-aligned rows the
    kernel reads and writes two columns per access.

    ``parts`` are `mma_parts`, on the device.
    """
    window, first_block, n_blocks, atomic, split_windows = parts
    n_cols = B.shape[1]
    if window.shape[0] == 0 or n_cols == 0:
        return
    if split_windows.shape[0]:  # the parts of split windows add into their rows
        window_rows = 16 if precision == "tf32-16x1" else WINDOW
        _zero_windows[split_windows.shape[0], (32, 8)](out, split_windows, window_rows)
    grid = (window.shape[0], math.ceil(n_cols / (_COLUMNS_PER_WARP[precision] * warps)))
    paired = precision != "tf32-16x1" and pairs_aligned(B) and pairs_aligned(out)
    kernel = _MMA_KERNELS[precision, paired]
    kernel[grid, 32 * warps](A.row_window_offset, A.col_idx, A.values, A.shape[0], B, out, window,
                             first_block, n_blocks, atomic)


def launch_csr_spmm(indptr, indices, data, B, out, threads_x=32, threads_y=4):
    """Run the CUDA-core CSR kernel."""
    n_rows, n_cols = out.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid = (math.ceil(n_rows / threads_y), math.ceil(n_cols / threads_x))
    csr_spmm[grid, (threads_x, threads_y)](indptr, indices, data, B, out)
