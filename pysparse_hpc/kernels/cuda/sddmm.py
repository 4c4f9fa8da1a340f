"""SDDMM on the GPU: dot products of X's and Y's rows at A's stored entries.

CUDA cores (CSR): one thread per stored entry; the entry's row comes from a precomputed
entry -> row array, so threads need no search.

Tensor cores (ME-BCRS, tf32 ``mma.m16n8k8`` or fp16 ``mma.m16n8k16``, fp32 accumulation): the
products of a window's 8 rows with 16 of its vectors form one 16x8 tile D = Y_v X_w^T,
accumulated over the feature axis 8 (tf32) or 16 (fp16) at a time (A operand: Y rows of the 16
vectors, B operand: X rows of the window). Each lane writes its four dot products where the
vector mask says the entry is stored; the caller zeroes the output first, so padding slots stay
0. One warp per tile of 16 vectors of a window (`mma_tiles`): the grid lists only tiles that
hold vectors, so a skewed graph's long windows add blocks only where they have work.

Multi-head operands run one launch per head on strided views (``X[:, h]``, built from the CUDA
array interface in constant time), so the kernels stay 2-D.
"""
import math

import numpy as np
from numba import cuda, float32

from ._mma import SIMULATED, mma_f16_m16n8k16, mma_tf32_m16n8k8, pack_half2, to_tf32
from .spmm import BLOCK_WIDTH, WINDOW, zero_contiguous

__all__ = ["MEBCRS_SDDMM_SOURCES", "csr_sddmm", "scale_add", "launch_csr_sddmm",
           "launch_mebcrs_sddmm", "launch_scale_add", "mma_tiles"]

VECTORS_PER_WARP = 16


def _csr_sddmm(rows, indices, X, Y, out):
    p = cuda.grid(1)
    if p >= out.shape[0]:
        return
    x = X[rows[p]]
    y = Y[indices[p]]
    acc = out.dtype.type(0)  # a bare 0.0 would make float32 sums float64
    for f in range(X.shape[1]):
        acc += x[f] * y[f]
    out[p] = acc


def _make_mebcrs_sddmm(half):
    """The tensor-core SDDMM source for fp16 (``half``: ``mma.m16n8k16``, 16 features a step)
    or tf32 inputs (``mma.m16n8k8``, 8 features a step); ``half`` is a closure constant.

    Features past X's width (the K remainder) load as 0, so any width works.
    """
    step = 16 if half else 8

    def kernel(row_window_offset, col_idx, vector_mask, tile_window, tile_first_slot, n_rows, X,
               Y, out):
        tile = cuda.blockIdx.x
        w = tile_window[tile]
        lane = cuda.threadIdx.x % 32
        g = lane >> 2
        t = lane & 3
        first = row_window_offset[w]
        n_vectors = row_window_offset[w + 1] - first
        first_slot = tile_first_slot[tile]  # the warp's 16 vectors in the window (>= 1 exists)
        n_features = X.shape[1]
        v_lo = first_slot + g  # A rows g and g + 8: two vectors of this lane
        v_hi = v_lo + 8
        lo = v_lo < n_vectors
        hi = v_hi < n_vectors
        src_lo = col_idx[first + v_lo] if lo else 0
        src_hi = col_idx[first + v_hi] if hi else 0
        x_row = w * WINDOW + g  # B column g: a window row
        on = x_row < n_rows
        zero = float32(0.0)
        c0 = zero
        c1 = zero
        c2 = zero
        c3 = zero
        for f0 in range(0, n_features, step):
            if half:
                # This lane's features: f, f + 1 (registers a0, a1, b0) and f + 8, f + 9
                # (a2, a3, b1).
                f = f0 + 2 * t
                in0 = f < n_features
                in1 = f + 1 < n_features
                in8 = f + 8 < n_features
                in9 = f + 9 < n_features
                c0, c1, c2, c3 = mma_f16_m16n8k16(
                    pack_half2(Y[src_lo, f] if lo and in0 else zero,
                               Y[src_lo, f + 1] if lo and in1 else zero),
                    pack_half2(Y[src_hi, f] if hi and in0 else zero,
                               Y[src_hi, f + 1] if hi and in1 else zero),
                    pack_half2(Y[src_lo, f + 8] if lo and in8 else zero,
                               Y[src_lo, f + 9] if lo and in9 else zero),
                    pack_half2(Y[src_hi, f + 8] if hi and in8 else zero,
                               Y[src_hi, f + 9] if hi and in9 else zero),
                    pack_half2(X[x_row, f] if on and in0 else zero,
                               X[x_row, f + 1] if on and in1 else zero),
                    pack_half2(X[x_row, f + 8] if on and in8 else zero,
                               X[x_row, f + 9] if on and in9 else zero),
                    c0, c1, c2, c3)
            else:
                # This lane's features: f (registers a0, a1, b0) and f + 4 (a2, a3, b1).
                f = f0 + t
                in0 = f < n_features
                in4 = f + 4 < n_features
                c0, c1, c2, c3 = mma_tf32_m16n8k8(
                    to_tf32(Y[src_lo, f] if lo and in0 else zero),
                    to_tf32(Y[src_hi, f] if hi and in0 else zero),
                    to_tf32(Y[src_lo, f + 4] if lo and in4 else zero),
                    to_tf32(Y[src_hi, f + 4] if hi and in4 else zero),
                    to_tf32(X[x_row, f] if on and in0 else zero),
                    to_tf32(X[x_row, f + 4] if on and in4 else zero),
                    c0, c1, c2, c3)
        # d0 (v_lo, row 2t), d1 (v_lo, 2t + 1), d2 (v_hi, 2t), d3 (v_hi, 2t + 1).
        for k in range(4):
            slot = v_lo if k < 2 else v_hi
            r = 2 * t + (k & 1)
            if slot < n_vectors and vector_mask[first + slot] & (1 << r):
                block_start = (slot // BLOCK_WIDTH) * BLOCK_WIDTH
                width = min(BLOCK_WIDTH, n_vectors - block_start)
                value = c0 if k == 0 else (c1 if k == 1 else (c2 if k == 2 else c3))
                out[(first + block_start) * WINDOW + r * width + (slot - block_start)] = value
    return kernel


#: Kernel sources by precision (plain functions: `cuda.compile_ptx` takes these).
MEBCRS_SDDMM_SOURCES = {"tf32": _make_mebcrs_sddmm(half=False),
                        "fp16": _make_mebcrs_sddmm(half=True)}


def _scale_add(out, addend, alpha, beta):
    """out[k, h] = alpha * out[k, h] + beta * addend[k] (beta == 0 leaves ``addend`` unread)."""
    i = cuda.grid(1)
    if i < out.shape[0] * out.shape[1]:
        k = i // out.shape[1]
        h = i - k * out.shape[1]
        if beta == 0:
            out[k, h] = alpha * out[k, h]
        else:
            out[k, h] = alpha * out[k, h] + beta * addend[k]


scale_add = cuda.jit(_scale_add)
csr_sddmm = cuda.jit(_csr_sddmm)
_MMA_KERNELS = {precision: cuda.jit(source) for precision, source in MEBCRS_SDDMM_SOURCES.items()}


def _by_head(X, Y, out):
    """``(X, Y, out)`` per head: the operands themselves when 2-D, else strided views of head h
    of X (n, heads, F), Y and out (slots, heads)."""
    if len(X.shape) == 2:
        return [(X, Y, out)]
    return [(_head_view(X, h), _head_view(Y, h), _head_view(out, h)) for h in range(X.shape[1])]


def head_interface(interface, h):
    """The CUDA array interface of ``array[:, h]`` from that of ``array`` (axis 1 dropped).

    Parameters
    ----------
    interface : dict
        ``__cuda_array_interface__`` of an array of 2 or more dimensions with explicit strides.
    h : int
        Index along axis 1.

    Returns
    -------
    dict
        A version-3 interface: the same data offset by ``h`` steps of axis 1, no stream.
    """
    shape, strides = interface["shape"], interface["strides"]
    return {"shape": (shape[0],) + tuple(shape[2:]), "strides": (strides[0],) + tuple(strides[2:]),
            "typestr": interface["typestr"], "version": 3,
            "data": (interface["data"][0] + h * strides[1], interface["data"][1])}


class _HeadView:
    """An interface for `cuda.as_cuda_array` that keeps the parent array alive with the view."""

    def __init__(self, parent, interface):
        self.parent = parent
        self.__cuda_array_interface__ = interface


def _head_view(array, h):
    """``array[:, h]`` on the device. Numba's own slicing of a device array walks every
    contiguous run of a strided view in Python (one per row: millions per GAT backward), so
    the view is built from the array interface instead, in constant time."""
    if SIMULATED:
        return array[:, h]
    interface = dict(array.__cuda_array_interface__)
    if interface.get("strides") is None:  # C-contiguous: the strides are implied
        interface["strides"] = c_strides(interface["shape"], array.dtype.itemsize)
    return cuda.as_cuda_array(_HeadView(array, head_interface(interface, h)), sync=False)


def c_strides(shape, itemsize):
    """Byte strides of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _as_columns(out):
    """The contiguous result, (slots,) or (slots, heads), as a 2-D array."""
    return out.reshape((out.shape[0], out.size // max(1, out.shape[0])))


def launch_csr_sddmm(rows, indices, X, Y, out, threads=128):
    """Run the CUDA-core kernel (``rows[k]`` is the row of stored entry k); X (n, F) and Y give
    out (nnz,), X (n, heads, F) and Y give out (nnz, heads)."""
    if out.shape[0] == 0:
        return
    for head_X, head_Y, head_out in _by_head(X, Y, out):
        csr_sddmm[math.ceil(out.shape[0] / threads), threads](rows, indices, head_X, head_Y,
                                                              head_out)


def mma_tiles(row_window_offset):
    """The warp tiles of the tensor-core SDDMM: ``(window, first_slot)``, one entry per run of
    at most `VECTORS_PER_WARP` vectors of a window, windows in order.

    Empty windows get no tile (their rows have no stored slot to write). A grid of one block per
    tile stays one-dimensional (x allows 2**31 - 1 blocks) and holds only blocks with work,
    where a (window, widest window / 16) grid would launch windows x (widest / 16) blocks, most
    of them idle on a skewed graph, and fail once a window had over 65,535 tiles (the limit of
    the grid's y).

    Parameters
    ----------
    row_window_offset : array_like of int
        The ME-BCRS window offsets (vectors), length n_windows + 1.

    Returns
    -------
    window, first_slot : numpy.ndarray of int64
        For tile k, its window and the index of its first vector within that window.
    """
    offsets = np.asarray(row_window_offset, dtype=np.int64)
    counts = -(-np.diff(offsets) // VECTORS_PER_WARP)
    window = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    index_in_window = (np.arange(window.size, dtype=np.int64)
                       - np.repeat(np.cumsum(counts) - counts, counts))
    return window, index_in_window * VECTORS_PER_WARP


def launch_mebcrs_sddmm(A, X, Y, out, tiles, precision):
    """Run the tensor-core kernel of ``precision`` ("tf32" or "fp16") on ME-BCRS ``A``; ``out``
    is the contiguous values layout, (slots,) or (slots, heads), zeroed here first. ``tiles``
    are `mma_tiles` of A, on the device."""
    if out.shape[0] == 0:
        return
    zero_contiguous(out)
    tile_window, tile_first_slot = tiles
    if tile_window.shape[0] == 0:  # no stored entry: the padding zeros are the result
        return
    for head_X, head_Y, head_out in _by_head(X, Y, out):
        _MMA_KERNELS[precision][tile_window.shape[0], 32](
            A.row_window_offset, A.col_idx, A.vector_mask, tile_window, tile_first_slot,
            A.shape[0], head_X, head_Y, head_out)


def launch_scale_add(out, addend, alpha, beta, threads=128):
    """Apply ``alpha`` and ``beta`` to a contiguous result, (slots,) or (slots, heads); the
    stored values ``addend`` (slots,) are shared by every head. With ``beta == 0`` ``addend``
    is not read and may be None."""
    if out.size == 0 or (alpha == 1.0 and beta == 0.0):
        # out.size, not out.shape[0]: (slots, 0 heads) would launch an empty grid, which the
        # driver refuses (the simulator does not)
        return
    if beta == 0:
        # The kernel is typed for a 1-D addend whichever branch runs: a (slots, heads) one
        # fails to compile on a real target. Any 1-D array of out's dtype serves.
        addend = out.reshape(out.size)
    scale_add[math.ceil(out.size / threads), threads](_as_columns(out), addend, alpha, beta)
