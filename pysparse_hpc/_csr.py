"""`csr_array`: compressed sparse rows, the format every other format converts through."""
import numbers
import operator
import sys
from typing import NamedTuple

import numpy as np
import scipy.sparse

from ._base import sparray
from ._cy import convert as _convert
from ._dense import is_torch_tensor
from ._sputils import (
    VALUE_DTYPES,
    _native_contiguous,
    as_index_array,
    as_value_array,
    check_index_dtype,
    check_index_dtype_holds,
    check_shape,
    get_index_dtype,
    moved_view,
    upcast_for_sum,
    value_dtype_for,
)

__all__ = ["csr_array", "CooTriplets", "as_csr", "host_values", "read_canonical"]

_INT64_MAX = int(np.iinfo(np.int64).max)


class CooTriplets(NamedTuple):
    """Coordinate view of a sparse array: entry ``k`` is ``data[k]`` at ``(row[k], col[k])``."""

    row: np.ndarray
    col: np.ndarray
    data: np.ndarray


class csr_array(sparray):
    """Compressed Sparse Row array, in the spirit of ``scipy.sparse.csr_array``.

    Parameters
    ----------
    arg : array_like, sparse array or tuple
        One of

        - a pysparse_hpc sparse array or any scipy.sparse matrix/array (any format);
        - a dense 2-D array (anything ``numpy.asarray`` accepts, e.g. a CPU torch tensor);
        - a 2-D torch sparse tensor of any layout (COO, CSR, CSC, BSR, BSC; on any device):
          as its CSR form's ``(values, col_indices, crow_indices)``, so with torch's int64
          indices unless ``index_dtype`` asks otherwise, duplicates summed as ``coalesce()``
          sums them;
        - ``(data, indices, indptr)``: raw CSR arrays, fully validated;
        - ``(data, (row, col))``: COO triplets, converted to canonical CSR (sorted, duplicates
          summed, explicit zeros kept);
        - ``(M, N)``: an empty array of that shape.
    shape : tuple of two ints, optional
        Inferred from the input when omitted (from ``indptr`` and the largest index for raw
        arrays).
    dtype : dtype, optional
        float16, float32 or float64. By default floating values keep their dtype and boolean or
        integer values become float64.
    copy : bool, default False
        Copy the input arrays even when they could be shared. A non-canonical scipy input is
        always copied: scipy sums its duplicates in place later, which would corrupt a sharer.
    index_dtype : {None, numpy.int32, numpy.int64}, optional
        Force the index dtype. By default scipy's rule applies: int32 unless an int64 input or a
        dimension/nnz beyond ``2**31 - 1`` asks for int64.

    Attributes
    ----------
    data, indices, indptr : ndarray
        The CSR arrays. ``indices`` and ``indptr`` share one index dtype.
    has_canonical_format : bool
        Rows sorted by column with no duplicates (computed on first access, then cached).

    Notes
    -----
    NaN and infinity are legal values; they are stored and propagated like any other value.
    The caller's arrays are never modified: `sum_duplicates` and `sort_indices` replace this
    array's buffers instead of writing into (possibly shared) input buffers.

    Examples
    --------
    >>> import numpy as np
    >>> import pysparse_hpc as sph
    >>> A = sph.csr_array((np.array([1.0, 2.0, 3.0]), (np.array([0, 1, 1]), np.array([2, 0, 0]))),
    ...                   shape=(2, 3))
    >>> A.toarray()
    array([[0., 0., 1.],
           [5., 0., 0.]])
    """

    format = "csr"
    _format_name = "csr_array"
    _array_names = ("data", "indices", "indptr")

    def __init__(self, arg, shape=None, dtype=None, copy=False, *, index_dtype=None):
        index_dtype = check_index_dtype(index_dtype)
        if shape is not None:
            shape = check_shape(shape)

        if isinstance(arg, sparray):
            self._init_from_csr(arg.tocsr(), shape, dtype, copy, index_dtype)
        elif scipy.sparse.issparse(arg):
            self._init_from_scipy(arg, shape, dtype, copy, index_dtype)
        elif isinstance(arg, tuple):
            self._init_from_tuple(arg, shape, dtype, copy, index_dtype)
        elif isinstance(arg, (str, bytes, dict, set)) or arg is None:
            raise TypeError(
                f"cannot build a csr_array from {type(arg).__name__}; expected a sparse array, a "
                "dense 2-D array, (data, indices, indptr), (data, (row, col)) or a shape (M, N)"
            )
        elif is_torch_tensor(arg) and arg.layout != sys.modules["torch"].strided:
            self._init_from_torch_sparse(arg, shape, dtype, copy, index_dtype)
        else:
            self._init_from_dense(arg, shape, dtype, index_dtype)

    # -- construction ---------------------------------------------------------------------
    def _set_arrays(self, data, indices, indptr, shape, canonical):
        self.data = data
        self.indices = indices
        self.indptr = indptr
        self._shape = shape
        self._canonical = canonical
        self._remember_checked()

    def _init_from_csr(self, other, shape, dtype, copy, index_dtype):
        if shape is not None and shape != other.shape:
            raise ValueError(f"shape {shape} does not match the input's shape {other.shape}")
        index_dtype = index_dtype or other.index_dtype
        check_index_dtype_holds(index_dtype, max(other.shape + (other.nnz,)))
        data = other.data.astype(value_dtype_for(other.dtype, dtype), copy=copy)
        self._set_arrays(
            data,
            other.indices.astype(index_dtype, copy=copy),
            other.indptr.astype(index_dtype, copy=copy),
            other.shape,
            other._canonical,
        )

    def _init_from_scipy(self, matrix, shape, dtype, copy, index_dtype):
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D sparse input, got {matrix.ndim}-D with shape "
                             f"{matrix.shape}")
        if shape is not None and shape != tuple(matrix.shape):
            raise ValueError(
                f"shape {shape} does not match the input's shape {tuple(matrix.shape)}")
        value_dtype = value_dtype_for(matrix.dtype, dtype)
        _check_scipy_indices(matrix)
        csr = matrix.tocsr()  # scipy's COO -> CSR sums duplicates; CSR input is kept as is
        # scipy canonicalizes a non-canonical matrix in place whenever an operation needs it
        # (abs, matmul, ...), rewriting indptr under any array that shares it: share scipy's
        # arrays only when they are canonical already, otherwise take a copy.
        copy = copy or not csr.has_canonical_format
        index_dtype = index_dtype or get_index_dtype((csr.indptr, csr.indices),
                                                     maxval=max(csr.shape + (csr.nnz,)))
        check_index_dtype_holds(index_dtype, max(csr.shape + (csr.nnz,)))
        shape = tuple(int(n) for n in csr.shape)
        # scipy builds a matrix from arrays without checking its indices: a column out of
        # range would send the kernels outside their operands. O(nnz), as the copy is. Check
        # in scipy's dtype, before a cast to a narrower index dtype could wrap a column
        # (2**32 + 1 -> 1) into range.
        _check_csr_arrays(csr.data, csr.indices, csr.indptr, shape, full_check=True)
        # scipy keeps strided views it was built from (S = csr_array((data[::2], ...))); the
        # Cython kernels take C-contiguous buffers only, so such arrays are copied.
        self._set_arrays(
            _contiguous(csr.data, value_dtype, copy),
            _contiguous(csr.indices, index_dtype, copy),
            _contiguous(csr.indptr, index_dtype, copy),
            shape,
            None,
        )
        self.check_format()

    def _init_from_tuple(self, arg, shape, dtype, copy, index_dtype):
        if isinstance(arg, CooTriplets):
            # read as (data, indices, indptr), its values were refused as a row pointer
            arg = (arg.data, (arg.row, arg.col))
        arg = tuple(host_values(a) for a in arg)
        if len(arg) == 2 and all(_is_int(a) or isinstance(a, numbers.Number) for a in arg):
            # Two numbers are a shape: (3, 3.0) is refused by check_shape for its float
            # ("cannot interpret a tuple of length 2" said nothing of it).
            empty_shape = check_shape(arg)
            if shape is not None and shape != empty_shape:
                raise ValueError(f"shape {shape} does not match the requested shape {empty_shape}")
            if index_dtype:
                check_index_dtype_holds(index_dtype, max(empty_shape))
            else:
                index_dtype = get_index_dtype(maxval=max(empty_shape))
            self._set_arrays(
                np.empty(0, dtype=value_dtype_for(np.float64, dtype)),
                np.empty(0, dtype=index_dtype),
                np.zeros(empty_shape[0] + 1, dtype=index_dtype),
                empty_shape,
                True,
            )
        elif len(arg) == 2 and (isinstance(arg[1], (tuple, list)) or (
                isinstance(arg[1], np.ndarray) and arg[1].ndim == 2)):  # scipy's (data, ij)
            if len(arg[1]) != 2:
                raise ValueError(
                    f"COO input needs (data, (row, col)); got {len(arg[1])} index arrays")
            self._init_from_coo(arg[0], host_values(arg[1][0]), host_values(arg[1][1]), shape,
                                dtype, index_dtype)
        elif len(arg) == 3:
            self._init_from_raw_csr(*arg, shape=shape, dtype=dtype, copy=copy,
                                    index_dtype=index_dtype)
        else:
            raise TypeError(
                f"cannot interpret a tuple of length {len(arg)}; expected (data, indices, indptr), "
                "(data, (row, col)) or a shape (M, N)"
            )

    def _init_from_raw_csr(self, data, indices, indptr, shape, dtype, copy, index_dtype):
        data = as_value_array(data, "data", dtype)
        indices = as_index_array(indices, "indices")
        indptr = as_index_array(indptr, "indptr")
        if indptr.size == 0:
            raise ValueError("indptr has length 0, expected rows+1 >= 1")
        if shape is None:
            shape = (indptr.size - 1, _inferred_extent(indices, "indices"))
        index_dtype = index_dtype or get_index_dtype((indices, indptr),
                                                     maxval=max(shape + (indices.size,)))
        check_index_dtype_holds(index_dtype, max(shape + (indices.size,)))
        # Validate in the caller's dtype, before a cast could wrap out-of-range values.
        _check_csr_arrays(data, indices, indptr, shape, full_check=True)
        self._set_arrays(
            data.copy() if copy else data,
            indices.astype(index_dtype, copy=copy),
            indptr.astype(index_dtype, copy=copy),
            shape,
            None,
        )

    def _init_from_coo(self, data, row, col, shape, dtype, index_dtype):
        data = as_value_array(data, "data", dtype)
        row = as_index_array(row, "row")
        col = as_index_array(col, "col")
        if not (data.size == row.size == col.size):
            raise ValueError(
                f"COO arrays differ in length: data {data.size}, row {row.size}, col {col.size}"
            )
        for name, coords in (("row", row), ("col", col)):
            if coords.size and coords.min() < 0:
                raise ValueError(f"{name} holds a negative index ({coords.min()})")
        if shape is None:
            shape = (_inferred_extent(row, "row"), _inferred_extent(col, "col"))
        for axis, (name, coords) in enumerate((("row", row), ("col", col))):
            if coords.size and coords.max() >= shape[axis]:
                raise ValueError(
                    f"{name} index {coords.max()} out of range for shape {shape}: "
                    f"expected 0 <= {name} < {shape[axis]}"
                )
        index_dtype = index_dtype or get_index_dtype((row, col), maxval=max(shape + (data.size,)))
        check_index_dtype_holds(index_dtype, max(shape + (data.size,)))
        indptr, indices, summed = _convert.coo_to_csr(
            # copied only where the dtype or layout differs (the kernel only reads them): two
            # copies of the coordinates were a third of the peak on 20M entries
            shape[0], np.ascontiguousarray(row, dtype=index_dtype),
            np.ascontiguousarray(col, dtype=index_dtype),
            np.ascontiguousarray(upcast_for_sum(data)), True,
        )
        self._set_arrays(summed.astype(data.dtype, copy=False), indices, indptr, shape, True)

    def _init_from_torch_sparse(self, tensor, shape, dtype, copy, index_dtype):
        torch = sys.modules["torch"]
        if tensor.ndim != 2 or tensor.dense_dim() != 0:
            raise ValueError(f"expected a 2-D sparse tensor of scalar values, got shape "
                             f"{tuple(tensor.shape)} ({tensor.sparse_dim()} sparse and "
                             f"{tensor.dense_dim()} dense dimensions)")
        tensor_shape = tuple(int(n) for n in tensor.shape)
        if shape is not None and shape != tensor_shape:
            raise ValueError(f"shape {shape} does not match the tensor's shape {tensor_shape}")
        _refuse_meta(tensor)
        _refuse_gradient(tensor)
        tensor = tensor.detach()
        if tensor.layout in (torch.sparse_bsr, torch.sparse_bsc):
            tensor = tensor.to_sparse_coo()   # torch converts blocks to CSR only through COO
        if tensor.layout != torch.sparse_csr:
            tensor = tensor.to_sparse_csr()   # from COO, duplicates summed
        # As its arrays passed as (data, indices, indptr): their index dtype kept (torch's
        # int64, unless the tensor was made with int32 indices), the values shared
        self._init_from_raw_csr(host_values(tensor.values()), host_values(tensor.col_indices()),
                                host_values(tensor.crow_indices()), tensor_shape, dtype, copy,
                                index_dtype)

    def _init_from_dense(self, arg, shape, dtype, index_dtype):
        if is_torch_tensor(arg):
            _refuse_meta(arg)
            _refuse_gradient(arg)
            # The values, not the autograd graph NumPy cannot take, nor a lazy negation
            # (``z.conj().imag``) numpy() refuses; both resolve to the tensor itself otherwise.
            arg = arg.detach().cpu().resolve_neg().resolve_conj()
            if str(arg.dtype) == "torch.bfloat16":  # NumPy has none: say so before it fails
                raise TypeError("values of dtype torch.bfloat16 are not supported; expected "
                                "float16, float32 or float64 (convert with .float())")
        try:
            dense = np.asarray(arg)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"cannot convert {type(arg).__name__} to a dense array: {exc}") from None
        value_dtype = value_dtype_for(dense.dtype, dtype)
        if dense.ndim != 2:
            raise ValueError(f"expected a 2-D array, got {dense.ndim}-D with shape {dense.shape}")
        dense_shape = tuple(int(n) for n in dense.shape)
        if shape is not None and shape != dense_shape:
            raise ValueError(f"shape {shape} does not match the dense input's shape {dense_shape}")
        row, col = np.nonzero(dense)  # NaN counts as nonzero, so it is stored and propagates
        index_dtype = index_dtype or get_index_dtype(maxval=max(dense_shape + (row.size,)))
        check_index_dtype_holds(index_dtype, max(dense_shape + (row.size,)))
        indptr = np.zeros(dense_shape[0] + 1, dtype=index_dtype)
        np.cumsum(np.bincount(row, minlength=dense_shape[0]), out=indptr[1:])
        self._set_arrays(dense[row, col].astype(value_dtype), col.astype(index_dtype), indptr,
                         dense_shape, True)

    # -- attributes -----------------------------------------------------------------------
    def _values_array(self):
        return self.data

    def _index_array(self):
        return self.indices

    @property
    def nnz(self):
        """Number of stored entries, duplicates and explicit zeros included."""
        return int(self.indptr[-1])

    @property
    def has_canonical_format(self):
        """True if every row is sorted by column and holds no duplicate column."""
        if self._canonical is None:
            self._canonical = read_canonical(self)
        return self._canonical

    @has_canonical_format.setter
    def has_canonical_format(self, value):
        self._canonical = bool(value)

    @property
    def has_sorted_indices(self):
        """True if every row is sorted by column (duplicates allowed)."""
        return self.has_canonical_format or _convert.csr_index_order(self.indptr, self.indices) >= 1

    # -- validation and canonical form ----------------------------------------------------
    def check_format(self, full_check=False):
        """Check the CSR arrays for consistency, raising ValueError/TypeError on a problem.

        Parameters
        ----------
        full_check : bool, default False
            Also run the O(nnz) checks: ``indptr`` non-decreasing and ``0 <= indices < cols``.
            The O(1) checks (dtypes, lengths, ``indptr[0] == 0``, ``indptr[-1] == nnz``) always run.
            A full check also forgets the kept `has_canonical_format`, read again from the
            arrays when next asked (a write into ``indices`` in place leaves it stale).
        """
        self._check_arrays(full_check)
        if full_check:
            self._canonical = None
            self._remember_checked()

    def _check_arrays(self, full_check, problem=None):
        """`check_format`'s checks, the kept canonical flag left as it is: for the library's
        own callers about to index by the arrays, to which reading the order again would add a
        pass over the indices (a tenth of a conversion to the blocked formats). ``problem``,
        when given, leads the ValueError's message (``"{problem}: {what is wrong}"``)."""
        for name in ("data", "indices", "indptr"):
            array = getattr(self, name)
            if not isinstance(array, np.ndarray):
                raise TypeError(f"{name} must be a NumPy array, got {type(array).__name__} "
                                f"(assigned after construction?)")
            if not (array.dtype.isnative and array.flags.c_contiguous):
                # An array assigned after construction (a view, a file's byte order), made
                # what the kernels and conversions read, as scipy's check_format makes it
                # native: the values are the same.
                setattr(self, name, _native_contiguous(array))
        if self.data.dtype not in VALUE_DTYPES:
            raise TypeError(f"data has dtype {self.data.dtype}; csr_array holds float16, "
                            f"float32 or float64 values (assigned after construction?)")
        try:
            _check_csr_arrays(self.data, self.indices, self.indptr, self.shape, full_check)
        except ValueError as exc:
            if problem is None:
                raise
            raise ValueError(f"{problem}: {exc}") from None
        index_dtype = self.indices.dtype
        if index_dtype != self.indptr.dtype or index_dtype not in (np.int32, np.int64):
            raise TypeError(
                f"indices ({self.indices.dtype}) and indptr ({self.indptr.dtype}) must share one "
                "index dtype, int32 or int64"
            )

    def sum_duplicates(self):
        """Sort every row and merge duplicate entries by summing them, in place.

        Explicit zeros are kept. float16 duplicates are summed in float32 and rounded once.
        """
        if self.has_canonical_format:
            return
        self._sort_rows(sum_duplicates=True)
        self._canonical = True

    def sort_indices(self):
        """Sort every row by column in place, keeping duplicates (see `sum_duplicates`)."""
        if not self.has_sorted_indices:
            self._sort_rows(sum_duplicates=False)

    def _sort_rows(self, sum_duplicates):
        indptr, indices, data = _convert.csr_sort_rows(
            self.indptr, self.indices, np.ascontiguousarray(upcast_for_sum(self.data)),
            sum_duplicates,
        )
        self.indptr, self.indices = indptr, indices
        self.data = data.astype(self.dtype, copy=False)
        self._remember_checked()

    def canonical(self):
        """This array if it is canonical, else a canonical copy (this array is not modified).

        As `has_canonical_format` says, which is kept once read (as scipy's): after writing
        into ``indices`` in place, call ``check_format(full_check=True)``, which reads it
        again.
        """
        if self.has_canonical_format:
            return self
        result = self.copy()
        result.sum_duplicates()
        return result

    # -- conversions ----------------------------------------------------------------------
    def tocsr(self, copy=False):
        """Return self, or a copy when ``copy``."""
        return self.copy() if copy else self

    def astype(self, dtype, copy=True):
        """Return the array with values cast to ``dtype`` (float16, float32 or float64)."""
        dtype = value_dtype_for(self.dtype, dtype)
        if dtype == self.dtype and not copy:
            return self
        result = csr_array.__new__(csr_array)
        result._set_arrays(self.data.astype(dtype, copy=True), self.indices.copy(),
                           self.indptr.copy(), self.shape, self._canonical)
        return result

    def transpose(self, axes=None, copy=False):
        """Return the transpose as a new `csr_array` (a stable counting sort, O(nnz + cols)).

        The result's rows are always sorted; it is canonical if this array has no duplicates.
        """
        if axes is not None and (not isinstance(axes, (tuple, list)) or tuple(axes) != (1, 0)):
            raise ValueError(f"axes must be None or (1, 0) for a 2-D array, got {axes!r}")
        if self.shape[1] == np.iinfo(np.int64).max:
            # Its indptr would have 2**63 entries: the count overflowed into a "negative
            # dimension" inside the conversion. NumPy's own word for such a size, as scipy's.
            raise ValueError(f"Maximum allowed dimension exceeded: the transpose of a "
                             f"{self.shape[0]} x {self.shape[1]} array would have "
                             f"{self.shape[1]} rows, one too many for an int64 indptr")
        indptr, indices, data = _convert.csr_transpose(
            self.shape[1], self.indptr, self.indices, moved_view(self.data))
        result = csr_array.__new__(csr_array)
        result._set_arrays(data.view(self.dtype), indices, indptr,
                           (self.shape[1], self.shape[0]), True if self._canonical else None)
        return result

    def tocoo(self):
        """Return the entries as `CooTriplets` ``(row, col, data)`` in CSR order (copies).

        ``csr_array(A.tocoo(), shape=A.shape)`` builds the array again; scipy takes them as
        ``scipy.sparse.coo_array((t.data, (t.row, t.col)), shape=A.shape)``.
        """
        row = np.repeat(np.arange(self.shape[0], dtype=self.index_dtype), np.diff(self.indptr))
        return CooTriplets(row, self.indices.copy(), self.data.copy())

    def toarray(self):
        """Return a dense ndarray; duplicate entries are summed (float16 in float32, rounded
        once)."""
        row, col, data = self.tocoo()
        # From the arrays, not the kept flag: one set by hand, or left stale by a write into
        # ``indices``, would let a duplicate overwrite its twin (scipy sums them regardless).
        # The pass costs less than the dense zeros.
        if read_canonical(self):
            dense = np.zeros(self.shape, dtype=self.dtype)
            dense[row, col] = data
            return dense
        dense = np.zeros(self.shape, dtype=upcast_for_sum(data).dtype)
        # inf + -inf is NaN without a warning, as in sum_duplicates and scipy
        with np.errstate(invalid="ignore"):
            np.add.at(dense, (row, col), upcast_for_sum(data))
        return dense.astype(self.dtype, copy=False)

    def to_scipy(self, copy=False):
        """Return a ``scipy.sparse.csr_array`` of the same entries (float16 becomes float32).

        Parameters
        ----------
        copy : bool, default False
            False shares this array's ``indptr``, ``indices`` and ``data`` (no copy, as
            scipy's own conversions do) when the array is canonical. scipy's in-place methods
            (``eliminate_zeros``, ``prune``) rewrite shared arrays and so this array's too:
            take ``copy=True`` before calling them. A non-canonical array (unsorted or
            repeated indices) is always copied: scipy sums duplicates and sorts in place
            inside operations that look read-only (``abs``, ``-S``, ``S * 2``).
        """
        data = self.data.astype(np.float32) if self.dtype == np.float16 else self.data
        if copy or not self.has_canonical_format:
            return scipy.sparse.csr_array((data.copy(), self.indices.copy(), self.indptr.copy()),
                                          shape=self.shape)
        return scipy.sparse.csr_array((data, self.indices, self.indptr), shape=self.shape)

    def to_torch(self, layout="csr", copy=False):
        """Return a CPU torch sparse tensor of the same entries, the inverse of
        ``csr_array(tensor)``.

        Parameters
        ----------
        layout : {"csr", "coo"}
            ``torch.sparse_csr`` (with this array's index dtype) or a coalesced
            ``torch.sparse_coo`` (int64 indices, as torch requires).
        copy : bool, default False
            False shares ``data``, ``indices`` and ``indptr`` with the CSR tensor where this
            array is canonical, as `to_scipy` does. A non-canonical array is always copied:
            torch's sparse tensors hold each row's columns sorted and distinct, and its
            kernels read them so (a repeated column is added once).

        Returns
        -------
        torch.Tensor

        Raises
        ------
        ValueError
            For another ``layout``.
        """
        import torch

        if layout not in ("csr", "coo"):
            raise ValueError(f"layout must be 'csr' or 'coo', got {layout!r}")
        source = self if self.has_canonical_format else self.canonical()
        shared = source is self and not copy

        def tensor(array):
            return torch.from_numpy(array if shared else array.copy())

        # Canonical CSR meets torch's invariants: said so, torch's check (and its warning
        # that it checks nothing unless told) is skipped.
        if layout == "csr":
            return torch.sparse_csr_tensor(tensor(source.indptr), tensor(source.indices),
                                           tensor(source.data), size=self.shape,
                                           check_invariants=False)
        row = np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(source.indptr))
        indices = torch.from_numpy(np.stack([row, source.indices.astype(np.int64)]))
        return torch.sparse_coo_tensor(indices, tensor(source.data), size=self.shape,
                                       is_coalesced=True, check_invariants=False)

    def to_blocked(self, window=8, block_width=8):
        """Convert to a blocked row-window format of ``window`` x 1 vectors.

        ``window=8`` gives a `mebcrs_array`; other heights (16 for the TC-GNN/DTC-SpMM
        granularity) give a `blocked_array`. See `blocked_array` for the layout.
        """
        from ._blocked import blocked_from_csr
        return blocked_from_csr(self, window, block_width)

    def to_mebcrs(self, block_width=8):
        """Convert to ME-BCRS (8-row windows, 8x1 vectors, ``block_width`` vectors per block).

        ``block_width`` is the MMA reduction extent: 8 for the GPU kernels, fp16 (m16n8k8) and
        tf32 (m16n8k8) alike; 4 gives FlashSparse's tf32 layout (m16n8k4), which the CPU
        kernels take and the GPU ones do not.
        """
        return self.to_blocked(window=8, block_width=block_width)

    def _repr_details(self):
        return "" if self._canonical is None else f", canonical={self._canonical}"


def as_csr(A):
    """``A`` as a `csr_array`: itself when it is one, other formats converted, anything else
    (scipy sparse, dense) through the `csr_array` constructor."""
    return A.tocsr() if isinstance(A, sparray) else csr_array(A)


def _check_scipy_indices(matrix):
    """Refuse a scipy CSC, BSR or COO matrix whose indices are out of range before scipy
    converts it: its constructors from raw arrays do not check them, and its conversions trust
    them (a CSC row index out of range was written outside the CSR it converted to: memory
    corrupted, or a segfault). CSR input is checked after, without a conversion."""
    if matrix.format in ("csc", "bsr"):
        try:
            matrix.check_format(full_check=True)
        except ValueError as exc:
            raise ValueError(f"the scipy {matrix.format.upper()} input is not a valid sparse "
                             f"matrix: {exc}") from None
    elif matrix.format == "coo":
        for name, coordinates, extent in (("row", matrix.row, matrix.shape[0]),
                                          ("col", matrix.col, matrix.shape[1])):
            if coordinates.size and (coordinates.min() < 0 or coordinates.max() >= extent):
                bad = int(np.flatnonzero((coordinates < 0) | (coordinates >= extent))[0])
                raise ValueError(f"the scipy COO input's {name}[{bad}] is "
                                 f"{int(coordinates[bad])}, out of range for {extent} "
                                 f"{'rows' if name == 'row' else 'columns'}")


def read_canonical(csr):
    """Whether every row of ``csr`` is sorted by column without repeats, read from its arrays:
    not the kept ``has_canonical_format``, which a write into the index arrays in place (or a
    flag set by hand) leaves stale."""
    return _convert.csr_index_order(csr.indptr, csr.indices) == 2


def _refuse_meta(tensor):
    """A ValueError for a meta tensor, whose ``.cpu()`` raises torch's NotImplementedError
    ("Cannot copy out of meta tensor")."""
    if tensor.device.type == "meta":
        raise ValueError("a tensor on the 'meta' device holds no values to build an array "
                         "from; pass a CPU or CUDA tensor")


def host_values(x):
    """A torch tensor given as a raw array, as NumPy sees the values of a dense one: detached,
    on the host, with a lazy negation or conjugation resolved (numpy() refuses all three,
    with torch's RuntimeError); a CPU tensor without them is shared, as a NumPy array is.
    Anything else, and a 0-d tensor (a dimension of a shape), is returned as it is.

    Raises
    ------
    TypeError
        For a sparse tensor or bfloat16 values, which NumPy cannot hold.
    """
    if not is_torch_tensor(x) or x.ndim == 0:
        return x
    if x.layout != sys.modules["torch"].strided:
        raise TypeError(f"a raw array must be a dense (strided) tensor, got layout {x.layout}; "
                        "pass its index and value arrays instead")
    if str(x.dtype) == "torch.bfloat16":  # NumPy has none: say so before torch does
        raise TypeError("values of dtype torch.bfloat16 are not supported; expected float16, "
                        "float32 or float64 (convert with .float())")
    _refuse_meta(x)
    _refuse_gradient(x)
    return x.detach().cpu().resolve_neg().resolve_conj().numpy()


def _refuse_gradient(x):
    """Refuse a tensor whose gradient an array built from it would drop without a word (the
    arrays hold NumPy arrays): learnable edge weights never trained."""
    if x.requires_grad and sys.modules["torch"].is_grad_enabled():
        raise TypeError("the tensor requires grad, and a sparse array holds its values as NumPy "
                        "arrays, without their gradient: for learnable values keep them apart "
                        "and pass them to pysparse_hpc.nn.functional.spmm(A, X, values=...); "
                        "for constant ones pass tensor.detach()")


def _contiguous(array, dtype, copy):
    """``array`` as a C-contiguous ndarray of ``dtype``: a copy when ``copy``, otherwise
    ``array`` itself when it already is one (a single copy either way)."""
    if copy:
        return np.array(array, dtype=dtype, order="C")
    return np.ascontiguousarray(array, dtype=dtype)


def _inferred_extent(coords, name):
    """The dimension that ``coords`` imply when no shape is given: the largest index + 1, at
    least 0 (a negative index is refused later, by the range checks).

    An unsigned index of 2**63 - 1 or more is refused here: it would imply a dimension beyond
    int64, pass the range checks against it, and wrap negative in the cast to int64 indices.
    """
    extent = max(int(coords.max()) + 1, 0) if coords.size else 0
    if extent > _INT64_MAX:
        raise ValueError(f"{name} holds index {extent - 1}, beyond the largest that int64 "
                         f"indices hold in a shape (2**63 - 2); expected {name} < 2**63 - 1")
    return extent


def _is_int(value):
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _check_csr_arrays(data, indices, indptr, shape, full_check):
    """Consistency checks of raw CSR arrays; messages give found vs expected."""
    n_rows, n_cols = shape
    if indptr.ndim != 1 or indices.ndim != 1 or data.ndim != 1:
        raise ValueError("data, indices and indptr must all be 1-D")
    if indptr.size != n_rows + 1:
        raise ValueError(f"indptr has length {indptr.size}, expected rows+1 = {n_rows + 1}")
    if data.size != indices.size:
        raise ValueError(
            f"data has length {data.size} but indices has length {indices.size}; expected equal"
        )
    if indptr[0] != 0:
        raise ValueError(f"indptr[0] is {indptr[0]}, expected 0")
    if indptr[-1] != indices.size:
        raise ValueError(
            f"indptr[-1] is {indptr[-1]}, expected the number of stored entries {indices.size}"
        )
    if not full_check:
        return
    if n_rows and np.any(indptr[1:] < indptr[:-1]):
        row = int(np.flatnonzero(indptr[1:] < indptr[:-1])[0])
        raise ValueError(
            f"indptr must be non-decreasing; indptr[{row + 1}] = {indptr[row + 1]} < "
            f"indptr[{row}] = {indptr[row]}"
        )
    if indices.size:
        lowest, highest = indices.min(), indices.max()
        if lowest < 0:
            raise ValueError(f"indices holds a negative column ({lowest}); expected 0 <= index")
        if highest >= n_cols:
            raise ValueError(
                f"indices holds column {highest}, out of range for {n_cols} columns; "
                f"expected index < {n_cols}"
            )
