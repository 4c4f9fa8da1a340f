"""Blocked row-window formats: ME-BCRS (8x1 vectors) and its taller-window relatives (16x1).

One class, `blocked_array`, parameterized by the window height; `mebcrs_array` is its 8-row
case, the format FlashSparse's swap-and-transpose MMA consumes.
"""
import operator

import numpy as np

from ._base import sparray
from ._config import get_num_threads
from ._csr import csr_array, host_values
from ._cy import blocked as _blocked
from .kernels.cpu import blocked_check as _blocked_check
from ._sputils import (
    as_index_array,
    as_value_array,
    check_index_dtype,
    check_index_dtype_holds,
    check_integer,
    check_shape,
    get_index_dtype,
    moved_view,
    value_dtype_for,
)

__all__ = ["blocked_array", "mebcrs_array", "blocked_from_csr"]


#: Tallest window: a vector's row mask is built in one 64-bit register during conversion.
MAX_WINDOW = 64


def _mask_bytes(window):
    return (window + 7) // 8


class blocked_array(sparray):
    """Row-window blocked sparse array of ``window`` x 1 vectors (ME-BCRS generalized).

    Rows are grouped into windows of ``window`` consecutive rows (the last one may be partial;
    padded rows are never stored). In each window every distinct column with at least one stored
    entry is one *vector*: ``window`` values, one per row, zero where that row has no entry.

    Parameters
    ----------
    arg : sparse array, array_like or tuple
        Anything `csr_array` accepts (converted through CSR), another blocked array, or raw arrays
        ``(values, col_idx, row_window_offset, vector_mask)`` together with ``shape`` (a 3-tuple
        is read as CSR). With ``vector_mask=None`` the stored entries are the nonzero values, the
        FlashSparse convention (explicit zeros are then dropped, and a vector of zeros with
        them).
    shape : tuple of two ints, optional
        Required for raw arrays.
    dtype : dtype, optional
        float16, float32 or float64.
    copy : bool, default False
        Copy raw input arrays even when they could be shared.
    window : int, default 8
        Rows per window (the vector height), 1 to 64: 8 for ME-BCRS, 16 for TC-GNN/DTC-SpMM.
    block_width : int, default 8
        Vectors per block, the MMA reduction extent of the kernel that will read it.
    index_dtype : {None, numpy.int32, numpy.int64}, optional
        Index dtype of the result (default: the CSR's when converting, scipy's rule for raw
        arrays: int32 unless an input index array is int64 or a size needs int64).

    Attributes
    ----------
    row_window_offset : ndarray (index dtype), shape (n_windows + 1,)
        Prefix sum of the number of vectors per window (vectors, not blocks: nothing is padded).
    col_idx : ndarray (index dtype), shape (n_vectors,)
        Column of each vector, strictly ascending within its window.
    values : ndarray, shape (n_vectors * window,)
        Vector values stored block by block. A block is ``block_width`` consecutive vectors of one
        window, stored row-major ``[window][block_width]``; the last block of a window, with
        ``r = n_vectors_in_window % block_width`` vectors, is stored compactly as ``[window][r]``.
    vector_mask : ndarray of uint8, shape (n_vectors * ceil(window / 8),)
        Bit ``r`` of vector ``v`` (byte ``v * ceil(window/8) + r // 8``, bit ``r % 8``) is set when
        row ``r`` of the vector holds a stored entry. It tells explicit zeros from padding, so
        the round trip to CSR is exact and SDDMM writes only the sparsity pattern.

    Notes
    -----
    The vector mask is not part of FlashSparse's ME-BCRS (which stores a pattern of ones);
    `block_stats` reports the format's bytes without it and the mask's bytes separately.
    """

    format = "blocked"
    _format_name = "blocked_array"
    _array_names = ("values", "col_idx", "row_window_offset", "vector_mask")

    def __init__(self, arg, shape=None, dtype=None, copy=False, *, window=8, block_width=8,
                 index_dtype=None):
        window, block_width = _check_geometry(window, block_width)
        if isinstance(arg, blocked_array) and index_dtype is None and (
                arg.window, arg.block_width) == (window, block_width):
            if shape is not None and check_shape(shape) != arg.shape:
                raise ValueError(f"shape {check_shape(shape)} does not match the input's shape "
                                 f"{arg.shape}")
            source = arg.astype(value_dtype_for(arg.dtype, dtype), copy=copy)
            self._set_arrays(source.values, source.col_idx, source.row_window_offset,
                             source.vector_mask, source.shape, window, block_width)
        elif isinstance(arg, tuple) and len(arg) == 4:
            self._init_from_raw(arg, shape, dtype, copy, window, block_width, index_dtype)
        else:
            csr = csr_array(arg, shape=shape, dtype=dtype, index_dtype=index_dtype)
            source = blocked_from_csr(csr, window, block_width)
            self._set_arrays(source.values, source.col_idx, source.row_window_offset,
                             source.vector_mask, source.shape, window, block_width)

    def _set_arrays(self, values, col_idx, row_window_offset, vector_mask, shape, window,
                    block_width):
        self.values = values
        self.col_idx = col_idx
        self.row_window_offset = row_window_offset
        self.vector_mask = vector_mask
        self._shape = shape
        self._window = window
        self._block_width = block_width
        self._nnz = None
        self._remember_checked()

    def _init_from_raw(self, arg, shape, dtype, copy, window, block_width, index_dtype):
        requested_index_dtype = check_index_dtype(index_dtype)
        if shape is None:
            raise ValueError("shape is required when building a blocked array from raw arrays")
        shape = check_shape(shape)
        arg = tuple(host_values(a) for a in arg)
        values = as_value_array(arg[0], "values", dtype)
        col_idx = as_index_array(arg[1], "col_idx")
        row_window_offset = as_index_array(arg[2], "row_window_offset")
        vector_mask = None if arg[3] is None else np.ascontiguousarray(arg[3])
        if vector_mask is not None and vector_mask.dtype != np.uint8:
            raise TypeError(f"vector_mask must be a uint8 array, got dtype {vector_mask.dtype}")
        if vector_mask is not None and vector_mask.ndim != 1:
            raise ValueError(f"vector_mask must be 1-D, got shape {vector_mask.shape}")
        _check_blocked_arrays(values, col_idx, row_window_offset, vector_mask, shape, window,
                              block_width, full_check=True)
        if vector_mask is None:
            vector_mask = _mask_of_values(values, row_window_offset, col_idx.size, window,
                                          block_width)
            holding = vector_mask.reshape(col_idx.size, _mask_bytes(window)).any(axis=1)
            if not holding.all():
                # A vector of zeros (a stored zero, a zero edge weight, in FlashSparse's
                # arrays) holds no entry by this convention: it goes, as the zeros do.
                table = values[value_positions(row_window_offset, window, block_width)]
                values, col_idx, row_window_offset = _without_vectors(
                    table, holding, col_idx, row_window_offset, window, block_width)
                vector_mask = vector_mask.reshape(holding.size, -1)[holding].ravel()
            # The mask made from the values gets the checks a given one gets: nonzero values
            # in the padding rows past the matrix would mark rows the kernels then write.
            _check_vector_mask(values, col_idx, row_window_offset, vector_mask, shape[0],
                               window, block_width,
                               mask_name="the nonzero values (vector_mask=None)")
        elif copy:
            vector_mask = vector_mask.copy()
        # The entries size tocsr's row pointer, in the index dtype: up to ``window`` of them a
        # vector, so a dtype sized by the vectors and the shape alone could wrap it (int32 past
        # 2**31 - 1 entries: a negative nnz, or rows written out of place).
        nnz = int(np.bitwise_count(vector_mask).sum(dtype=np.int64))
        largest = max(shape + (col_idx.size, nnz))
        index_dtype = requested_index_dtype or get_index_dtype((col_idx, row_window_offset),
                                                               maxval=largest)
        check_index_dtype_holds(index_dtype, largest)
        self._set_arrays(values.copy() if copy else values,
                         col_idx.astype(index_dtype, copy=copy),
                         row_window_offset.astype(index_dtype, copy=copy),
                         vector_mask, shape, window, block_width)
        self._nnz = nnz

    # -- geometry -------------------------------------------------------------------------
    @property
    def window(self):
        """Rows per window, the height of a vector."""
        return self._window

    @property
    def block_width(self):
        """Vectors per block (the MMA reduction extent k of the kernel)."""
        return self._block_width

    @property
    def n_windows(self):
        """Number of row windows, ``ceil(rows / window)``."""
        return self.row_window_offset.size - 1

    @property
    def n_vectors(self):
        """Number of stored vectors."""
        return self.col_idx.size

    @property
    def nnz(self):
        """Number of stored entries (set mask bits), explicit zeros included."""
        if self._nnz is None:
            self._nnz = int(np.bitwise_count(self.vector_mask).sum(dtype=np.int64))
        return self._nnz

    @property
    def nbytes(self):
        """Bytes held by the four arrays (the mask included)."""
        return sum(a.nbytes for a in (self.values, self.col_idx, self.row_window_offset,
                                      self.vector_mask))

    def _values_array(self):
        return self.values

    def _index_array(self):
        return self.col_idx

    def window_vectors(self, window_id):
        """Columns and values of one window: ``(col_idx, dense)``, dense of shape (window, n)."""
        window_id = _check_window_id(window_id, self.n_windows)
        first = int(self.row_window_offset[window_id])
        stop = int(self.row_window_offset[window_id + 1])
        dense = np.zeros((self.window, stop - first), dtype=self.dtype)
        for start in range(0, stop - first, self.block_width):
            block = self.get_block(window_id, start // self.block_width)
            dense[:, start:start + self.block_width] = block
        return self.col_idx[first:stop], dense

    def get_block(self, window_id, block_id):
        """The stored block ``block_id`` of window ``window_id`` as a (window, width) view."""
        window_id = _check_window_id(window_id, self.n_windows)
        first = int(self.row_window_offset[window_id])
        stop = int(self.row_window_offset[window_id + 1])
        n_blocks = -(-(stop - first) // self.block_width)
        # Checked as the window is: a float passed the range test and failed in the slicing.
        block_id = check_integer(block_id, "block")
        if not 0 <= block_id < n_blocks:
            raise IndexError(f"block {block_id} out of range: window {window_id} has {n_blocks} "
                             "blocks")
        start = first + block_id * self.block_width
        width = min(self.block_width, stop - start)
        values = self.values[start * self.window:(start + width) * self.window]
        return values.reshape(self.window, width)

    # -- validation -----------------------------------------------------------------------
    def check_format(self, full_check=False):
        """Check the blocked arrays for consistency (O(1) checks; O(storage) ones on request)."""
        _check_blocked_arrays(self.values, self.col_idx, self.row_window_offset, self.vector_mask,
                              self.shape, self.window, self.block_width, full_check)
        if full_check:
            self._remember_checked()

    # -- conversions ----------------------------------------------------------------------
    def tocsr(self, copy=False):
        """Return the canonical `csr_array` holding exactly the stored entries."""
        n_rows = self.shape[0]
        threads = get_num_threads()
        counts = _blocked.blocked_row_counts(self.row_window_offset, self.vector_mask, n_rows,
                                             self.window, threads)
        indptr = np.zeros(n_rows + 1, dtype=self.index_dtype)
        np.cumsum(counts, out=indptr[1:])
        indices, data = _blocked.blocked_to_csr(
            self.row_window_offset, self.col_idx, moved_view(self.values), self.vector_mask,
            n_rows, self.window, self.block_width, indptr, threads)
        result = csr_array.__new__(csr_array)
        result._set_arrays(data.view(self.dtype), indices, indptr, self.shape, True)
        return result

    def astype(self, dtype, copy=True):
        """Return the array with values cast to ``dtype`` (float16, float32 or float64)."""
        dtype = value_dtype_for(self.dtype, dtype)
        if dtype == self.dtype and not copy:
            return self
        result = type(self).__new__(type(self))
        result._set_arrays(self.values.astype(dtype, copy=True), self.col_idx.copy(),
                           self.row_window_offset.copy(), self.vector_mask.copy(), self.shape,
                           self.window, self.block_width)
        return result

    def transpose(self, axes=None, copy=False):
        """Return the transpose, blocked with the same window and block width."""
        return blocked_from_csr(self.tocsr().transpose(axes), self.window, self.block_width)

    def to_blocked(self, window=8, block_width=8):
        """Re-block with another window height or block width (through CSR)."""
        window, block_width = _check_geometry(window, block_width)
        if (window, block_width) == (self.window, self.block_width):
            return self
        return blocked_from_csr(self.tocsr(), window, block_width)

    def _repr_details(self):
        return (f", window {self.window}, block width {self.block_width}, "
                f"{self.n_vectors} vectors in {self.n_windows} windows")


class mebcrs_array(blocked_array):
    """ME-BCRS: FlashSparse's memory-efficient blocked CRS, 8-row windows of 8x1 vectors.

    The 8-row case of `blocked_array` (see there for the layout and attributes). Build it with
    ``csr.to_mebcrs(block_width=...)`` or ``mebcrs_array(anything_csr_accepts)``; convert back
    with `tocsr`.

    Parameters
    ----------
    arg, shape, dtype, copy, index_dtype
        As for `blocked_array`.
    block_width : int, default 8
        8 for the GPU SpMM, fp16 and tf32 alike (mma m16n8k8); 4 gives FlashSparse's tf32
        layout (mma m16n8k4), which only the CPU kernels take.

    Examples
    --------
    >>> import numpy as np
    >>> import pysparse_hpc as sph
    >>> A = sph.csr_array(np.eye(10))
    >>> B = A.to_mebcrs(block_width=4)
    >>> B.n_windows, B.n_vectors, B.window
    (2, 10, 8)
    >>> np.array_equal(B.tocsr().toarray(), A.toarray())
    True
    """

    format = "mebcrs"
    _format_name = "mebcrs_array"

    def __init__(self, arg, shape=None, dtype=None, copy=False, *, block_width=8,
                 index_dtype=None):
        super().__init__(arg, shape=shape, dtype=dtype, copy=copy, window=8,
                         block_width=block_width, index_dtype=index_dtype)


def blocked_from_csr(csr, window, block_width):
    """Convert a `csr_array` to the blocked format (ME-BCRS when ``window == 8``)."""
    window, block_width = _check_geometry(window, block_width)
    # The arrays are trusted as checked when the array was built, or when an index array was
    # last rebound, as scipy's conversions trust theirs: the O(nnz) checks at every conversion
    # would cost 2-9 % of it (documented in the known limitations: after writing into them in
    # place, call check_format(full_check=True)).
    csr._check_for_kernels()
    csr = csr.canonical()
    indices, n_cols, used = csr.indices, csr.shape[1], None
    if n_cols > _blocked.key_column_limit(window):
        # The conversion's 64-bit sort keys (column << row bits | row) would overflow for the
        # widest columns (2**60 and up in 8-row windows). Renumbering the columns that hold
        # entries (at most nnz of them) keeps their order, so the windows come out the same,
        # and col_idx maps back; O(nnz log nnz) on shapes too wide for anything else.
        used, renumbered = np.unique(indices, return_inverse=True)
        indices, n_cols = renumbered.astype(indices.dtype, copy=False).ravel(), used.size
    row_window_offset, col_idx, values, vector_mask = _blocked.csr_to_blocked(
        csr.indptr, indices, moved_view(csr.data), window, block_width, get_num_threads(),
        n_cols)
    if used is not None:
        col_idx = used[col_idx]
    cls = mebcrs_array if window == 8 else blocked_array
    result = cls.__new__(cls)
    result._set_arrays(values.view(csr.dtype), col_idx, row_window_offset, vector_mask,
                       csr.shape, window, block_width)
    result._nnz = csr.nnz
    return result


_INT32_MAX = np.iinfo(np.int32).max


def _check_geometry(window, block_width):
    for name, value in (("window", window), ("block_width", block_width)):
        value = check_integer(value, name)
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
        if value > _INT32_MAX:  # sizes are products of it: beyond, they overflow
            raise ValueError(f"{name} must be at most {_INT32_MAX}, got {value}")
    if operator.index(window) > MAX_WINDOW:
        raise ValueError(f"window must be at most {MAX_WINDOW} rows, got {window}")
    return operator.index(window), operator.index(block_width)


def _check_window_id(window_id, n_windows):
    window_id = check_integer(window_id, "window")
    if not 0 <= window_id < n_windows:
        raise IndexError(f"window {window_id} out of range for {n_windows} windows")
    return window_id


def value_positions(row_window_offset, window, block_width):
    """``positions[v, r]``: where row ``r`` of vector ``v`` sits in ``values``, shape
    (n_vectors, window)."""
    offsets = np.asarray(row_window_offset, dtype=np.int64)
    vectors_per_window = np.diff(offsets)
    vector = np.arange(offsets[-1])
    first = np.repeat(offsets[:-1], vectors_per_window)
    stop = np.repeat(offsets[1:], vectors_per_window)
    block_start = first + (vector - first) // block_width * block_width
    width = np.minimum(block_width, stop - block_start)
    rows = np.arange(window)
    return (block_start[:, None] * window + rows[None, :] * width[:, None]
            + (vector - block_start)[:, None])


def _without_vectors(table, kept, col_idx, row_window_offset, window, block_width):
    """The blocked arrays without the vectors where ``kept`` is False, their values repacked.

    ``table`` holds the values by vector, ``values[value_positions(...)]``.
    """
    vectors_per_window = np.diff(row_window_offset.astype(np.int64))
    window_of_vector = np.repeat(np.arange(vectors_per_window.size), vectors_per_window)
    kept_per_window = np.bincount(window_of_vector[kept], minlength=vectors_per_window.size)
    offsets = np.zeros(row_window_offset.size, dtype=row_window_offset.dtype)
    np.cumsum(kept_per_window, out=offsets[1:])
    values = np.empty(int(kept.sum()) * window, dtype=table.dtype)
    values[value_positions(offsets, window, block_width)] = table[kept]
    return values, col_idx[kept], offsets


def _value_bits(values):
    """``values`` as unsigned integers of their width, and the mask of the bits other than the
    sign: a value is zero (+0.0 or -0.0) where those bits are all 0."""
    bits = np.dtype(f"u{values.dtype.itemsize}")
    return (np.ascontiguousarray(values).view(bits),
            bits.type((1 << (8 * bits.itemsize - 1)) - 1))


def _mask_of_values(values, row_window_offset, n_vectors, window, block_width):
    """The vector mask of FlashSparse's convention: a bit for every nonzero value."""
    vector_mask = np.zeros(n_vectors * _mask_bytes(window), dtype=np.uint8)
    _blocked_check.mask_of_values(*_value_bits(values), row_window_offset, window,
                                  block_width, _mask_bytes(window), vector_mask)
    return vector_mask


def _unpack_rows(vector_mask, n_vectors, window):
    # The row length is known from the window: reshape(n_vectors, -1) cannot infer it when
    # there are no vectors (an empty mask), and sddmm unpacks those too.
    bits = np.unpackbits(vector_mask.reshape(n_vectors, _mask_bytes(window)), axis=1,
                         bitorder="little")
    return bits.astype(bool)


def unpack_vector_mask(vector_mask, n_vectors, window):
    """``present[v, r]``: whether row ``r`` of vector ``v`` holds a stored entry, shape
    (n_vectors, window) (the counterpart of `value_positions`)."""
    return _unpack_rows(vector_mask, n_vectors, window)[:, :window]


def _check_blocked_arrays(values, col_idx, row_window_offset, vector_mask, shape, window,
                          block_width, full_check, mask_name="vector_mask"):
    n_rows, n_cols = shape
    n_windows = -(-n_rows // window)
    if row_window_offset.size != n_windows + 1:
        raise ValueError(
            f"row_window_offset has length {row_window_offset.size}, expected "
            f"ceil(rows / window) + 1 = {n_windows + 1}"
        )
    if row_window_offset[0] != 0:
        raise ValueError(f"row_window_offset[0] is {row_window_offset[0]}, expected 0")
    if row_window_offset[-1] != col_idx.size:
        raise ValueError(
            f"row_window_offset[-1] is {row_window_offset[-1]}, expected the number of "
            f"vectors len(col_idx) = {col_idx.size}"
        )
    if values.size != col_idx.size * window:
        raise ValueError(
            f"values has length {values.size}, expected n_vectors * window = "
            f"{col_idx.size * window}"
        )
    if vector_mask is not None and vector_mask.size != col_idx.size * _mask_bytes(window):
        raise ValueError(
            f"vector_mask has length {vector_mask.size}, expected n_vectors * ceil(window / 8) = "
            f"{col_idx.size * _mask_bytes(window)}"
        )
    if not full_check:
        return
    # Comparisons, not np.diff: a difference of unsigned indices wraps instead of going
    # negative, and a decreasing pair would pass as a huge step.
    if np.any(row_window_offset[1:] < row_window_offset[:-1]):
        raise ValueError("row_window_offset must be non-decreasing")
    if col_idx.size:
        if col_idx.min() < 0 or col_idx.max() >= n_cols:
            raise ValueError(
                f"col_idx holds columns in [{col_idx.min()}, {col_idx.max()}], expected "
                f"0 <= col < {n_cols}"
            )
        # Non-decreasing from 0 to len(col_idx): every offset fits in int64 (np.repeat
        # refuses uint64 counts).
        counts = np.diff(row_window_offset.astype(np.int64))
        same_window = np.repeat(np.arange(n_windows), counts)
        ascending = col_idx[1:] > col_idx[:-1]
        if np.any(~ascending & (same_window[1:] == same_window[:-1])):
            raise ValueError("col_idx must be strictly ascending within each window")
    if vector_mask is not None:
        _check_vector_mask(values, col_idx, row_window_offset, vector_mask, n_rows, window,
                           block_width, mask_name)


def _check_vector_mask(values, col_idx, row_window_offset, vector_mask, n_rows, window,
                       block_width, mask_name):
    """The checks of a vector mask against arrays whose structure passed the others, in one
    pass over them (`pysparse_hpc.kernels.cpu.blocked_check`); each problem is named in the
    same order whichever window shows it."""
    if not col_idx.size:
        return
    n_windows = row_window_offset.size - 1
    last_rows = n_rows - (n_windows - 1) * window
    problems = np.empty(n_windows, dtype=np.uint8)
    _blocked_check.mask_problems(*_value_bits(values), row_window_offset,
                                 np.ascontiguousarray(vector_mask), window, block_width,
                                 _mask_bytes(window), last_rows, problems)
    found = int(np.bitwise_or.reduce(problems))
    if found & _blocked_check.EMPTY_VECTOR:
        raise ValueError("every vector must hold at least one stored entry; by "
                         f"{mask_name}, one holds none")
    if found & _blocked_check.BEYOND_WINDOW:
        raise ValueError(f"by {mask_name}, entries lie beyond the window height {window}")
    if found & _blocked_check.BEYOND_MATRIX:
        raise ValueError(
            f"by {mask_name}, entries lie in rows beyond the matrix: the last window has "
            f"{last_rows} rows"
        )
    if found & _blocked_check.NONZERO_PADDING:
        raise ValueError("values must be 0 wherever vector_mask marks no stored entry")
