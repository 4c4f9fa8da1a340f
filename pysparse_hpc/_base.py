"""The base class of every sparse array: what all formats share, whatever their layout."""
import numbers
import sys
import weakref

import numpy as np
import scipy.sparse

from ._dense import as_dense, is_device_array, is_torch_tensor

__all__ = ["sparray", "issparse"]


def _ops():
    """`pysparse_hpc.ops`, which imports this module: looked up when first needed, not per call
    (an import statement in a method costs about a microsecond on every product)."""
    global _OPS
    if _OPS is None:
        from . import ops
        _OPS = ops
    return _OPS


_OPS = None


def _refusing(what):
    """A method of `sparray` that refuses ``what`` (whatever its operands) with `_refuse`'s
    advice."""
    def refuse(self, *operands):
        self._refuse(what)
    return refuse


class sparray:
    """Base class of the pysparse_hpc sparse arrays (2-D only).

    Subclasses own a storage layout and implement `tocsr`; everything that can be expressed
    through CSR (dense conversion, scipy conversion, matrix products) lives here once.

    An array holds a matrix for the kernels, not a value with arithmetic: ``==`` compares
    identity, as for other Python objects (scipy compares elementwise); compare contents
    through `to_scipy` or `toarray`.
    """

    format = None
    _format_name = "sparse"
    # Make numpy return NotImplemented from ``ndarray @ sparse`` so Python calls __rmatmul__.
    __array_ufunc__ = None

    # -- shape and dtype ------------------------------------------------------------------
    @property
    def shape(self):
        """Tuple ``(rows, cols)``."""
        return self._shape

    @property
    def ndim(self):
        """Always 2."""
        return 2

    @property
    def dtype(self):
        """The dtype of the stored values (float16, float32 or float64)."""
        return self._values_array().dtype

    @property
    def index_dtype(self):
        """The dtype of the index arrays (int32 or int64)."""
        return self._index_array().dtype

    @property
    def nnz(self):
        """Number of stored entries, explicit zeros included."""
        raise NotImplementedError

    @property
    def size(self):
        """Same as `nnz`, as in scipy.sparse."""
        return self.nnz

    def __len__(self):
        raise TypeError("sparse array length is ambiguous; use .shape[0] or .nnz (A.toarray() "
                        "for a dense array)")

    # -- conversions ----------------------------------------------------------------------
    def tocsr(self, copy=False):
        """Return the array as a `csr_array`."""
        raise NotImplementedError

    def toarray(self):
        """Return a dense ``numpy.ndarray`` of shape `shape` and dtype `dtype` (duplicates
        summed)."""
        return self.tocsr().toarray()

    def to_scipy(self, copy=False):
        """Return a ``scipy.sparse.csr_array`` with the same entries (float16 becomes float32).

        scipy.sparse does not support float16, so float16 values are widened exactly to float32.
        ``copy`` as for `csr_array.to_scipy` (a CSR array's own arrays may be shared).
        """
        return self.tocsr().to_scipy(copy=copy)

    def to_torch(self, layout="csr", copy=False):
        """Return a CPU torch sparse tensor with the same entries (see `csr_array.to_torch`;
        ``copy`` as there, for the CSR array this format converts to)."""
        return self.tocsr().to_torch(layout=layout, copy=copy)

    @property
    def T(self):
        """The transpose, see `transpose`."""
        return self.transpose()

    def transpose(self, axes=None, copy=False):
        """Return the transpose in the same format (``axes`` may only be None or (1, 0))."""
        raise NotImplementedError

    def astype(self, dtype, copy=True):
        """Return the array with values cast to ``dtype`` (float16, float32 or float64)."""
        raise NotImplementedError

    def copy(self):
        """Return a deep copy."""
        return self.astype(self.dtype, copy=True)

    def __getstate__(self):
        # What was built from the arrays (the GNN layers' caches, device copies, the record of
        # the checked index arrays) is left out of pickles and deep copies: rebuilt on use,
        # and partly unpicklable (weak references).
        return {key: value for key, value in self.__dict__.items()
                if key not in ("_nn_cache", "_device_cache", "_checked_index_arrays")}

    # -- the arrays the kernels index by --------------------------------------------------
    #: The names of the values array and of the index arrays (`_check_for_kernels`).
    _array_names = ()

    def _remember_checked(self):
        """Record the arrays as checked in full (built or checked by the library), by weak
        reference: one rebound since is checked again before the kernels use it."""
        self._checked_index_arrays = tuple(
            None if array is None else weakref.ref(array)
            for array in map(self.__dict__.get, self._array_names))

    def _rebound_arrays(self):
        """The names of the arrays rebound since they were last checked in full."""
        checked = self.__dict__.get("_checked_index_arrays")
        if checked is None:
            return self._array_names
        return [name for name, ref in zip(self._array_names, checked)
                if (None if ref is None else ref()) is not self.__dict__.get(name)]

    def _check_for_kernels(self):
        """The checks before a product or conversion indexes by the arrays, after one was
        rebound (``A.data = ...``): an integer ``data`` gave zeros, a shorter one was read past
        its end, ``A.indices`` out of range sent the kernels outside their operands. Values
        rebound take the O(1) checks (dtypes, lengths), index arrays the O(nnz) ones too; the
        arrays last checked take none (an identity test per array, not the checks' 3 us at
        every product). Writes into the arrays in place are not seen:
        ``check_format(full_check=True)`` after them."""
        rebound = self._rebound_arrays()
        if rebound:
            self.check_format(full_check=any(name != self._array_names[0] for name in rebound))
            self._remember_checked()

    # -- operators ------------------------------------------------------------------------
    def __matmul__(self, other):
        if issparse(other) or scipy.sparse.issparse(other):
            raise TypeError(f"sparse @ sparse products are not supported (the right operand "
                            f"is a {type(other).__name__}); convert both with to_scipy()")
        ndim = _operand_ndim(other)
        if ndim is not None and ndim not in (1, 2):
            # as for the left operand: a scalar is a value @ does not take (scipy's
            # ValueError), not a wrong type of an operand named B
            raise ValueError(_dimensions_message("right", ndim, other))
        if _tracks_gradient(other):
            # A @ W inside a model: the differentiable product, as torch.sparse.mm's
            if other.dim() not in (1, 2) or other.shape[0] != self.shape[1]:
                raise ValueError(f"dimension mismatch: A has shape {self.shape} and the right "
                                 f"operand of @ has shape {tuple(other.shape)}; expected a "
                                 f"1-D or 2-D operand with {self.shape[1]} rows")
            from .nn.functional import spmm
            right = _promoted(other, self.dtype)
            return spmm(self, right[:, None])[:, 0] if right.dim() == 1 else spmm(self, right)
        return _ops().spmm(self, other)

    def __rmatmul__(self, other):
        # (B @ A) = (A^T @ B^T)^T, so a dense-times-sparse product reuses the SpMM.
        if issparse(other) or scipy.sparse.issparse(other):
            raise TypeError(f"sparse @ sparse products are not supported (the left operand is "
                            f"a {type(other).__name__}); convert both with to_scipy()")
        # a device array stays on its device: np.asarray copied it to the host, and the
        # product ran on the CPU where A @ device_array runs on the GPU
        left = other if is_torch_tensor(other) or is_device_array(other) else np.asarray(other)
        if left.ndim not in (1, 2):
            raise ValueError(_dimensions_message("left", left.ndim, left))
        if left.shape[left.ndim - 1] != self.shape[0]:   # the simulator's shapes take no -1
            raise ValueError(f"dimension mismatch: the left operand of @ has shape "
                             f"{tuple(left.shape)} and A has shape {self.shape}; expected "
                             f"left.shape[-1] == A.shape[0] = {self.shape[0]}")
        if _tracks_gradient(left):
            from .nn._graph import transposed_like
            from .nn.functional import spmm
            left = _promoted(left, self.dtype)
            # A^T kept on A (and A again kept on it, for the backward), not made per call
            product = spmm(transposed_like(self), left[None, :].T if left.dim() == 1
                           else left.T).T
            return product[0] if left.dim() == 1 else product
        as_dense(left, "the left operand of @")  # its error names it, not the SpMM's B
        spmm = _ops().spmm
        if left.ndim == 1:
            return spmm(self.T, left)
        return spmm(self.T, left.T).T

    # -- what scipy.sparse has and these arrays do not -------------------------------------
    # The arrays hold a matrix for the kernels. Elementwise arithmetic, indexing and the
    # reductions are scipy.sparse's: without these, Python's own error ("unsupported operand
    # type(s)", "not subscriptable") would not say where to find them.
    def _refuse(self, what):
        raise TypeError(f"{type(self).__name__} does not support {what}: it holds a matrix for "
                        "the kernels (format conversions, A @ X, sddmm); convert with "
                        "A.to_scipy() for scipy.sparse's arithmetic, indexing and reductions")

    __add__ = __radd__ = _refusing("+")
    __sub__ = __rsub__ = _refusing("-")
    # np.dot(X, A) lands here too: NumPy takes A as a scalar object and multiplies by it
    __mul__ = __rmul__ = _refusing("elementwise * (for a matrix product use A @ X or X @ A; "
                                   "np.dot and np.matmul do not reach it)")
    __truediv__ = __rtruediv__ = _refusing("/")
    __pow__ = _refusing("**")
    __neg__ = _refusing("unary -")
    __abs__ = _refusing("abs()")
    __getitem__ = _refusing("indexing")
    __setitem__ = _refusing("item assignment")
    __iter__ = _refusing("iteration")

    def __getattr__(self, name):
        # Called only where the usual lookup failed: no cost to the attributes that exist.
        message = f"{type(self).__name__!r} object has no attribute {name!r}"
        if name in _SCIPY_ONLY:
            message += f"; scipy.sparse's is reached through A.to_scipy().{name}"
        raise AttributeError(message)

    def _repr_details(self):
        return ""

    def __repr__(self):
        rows, cols = self.shape
        return (f"<{self._format_name} of shape ({rows}, {cols}), dtype {self.dtype}, "
                f"index {self.index_dtype}, {self.nnz} stored entries{self._repr_details()}>")


#: Public attributes of scipy's CSR arrays, for `sparray.__getattr__`'s advice.
_SCIPY_ONLY = frozenset(name for name in dir(scipy.sparse.csr_array) if not name.startswith("_"))


def _operand_ndim(x):
    """The number of dimensions of a dense operand of @ (0 for a Python or NumPy scalar), or
    None for what is not one (its type is then refused by the product)."""
    if isinstance(x, numbers.Number):
        return 0
    if isinstance(x, (np.ndarray, np.generic)) or is_torch_tensor(x):
        return x.ndim
    return None


def _dimensions_message(side, ndim, operand):
    """Why an operand of @ with ``ndim`` dimensions is refused."""
    # No hint to use * instead: sparse arrays have no arithmetic operators.
    found = ("0-D: a scalar, which @ does not take (scale the stored values instead)"
             if ndim == 0 else f"{ndim}-D with shape {tuple(operand.shape)}")
    return f"the {side} operand of @ must be 1-D or 2-D, got {found}"


def _tracks_gradient(x):
    """Whether ``x`` is a torch tensor whose product must go through the autograd Functions:
    one that carries a gradient, or one a ``torch.func`` transform wraps (``vmap``'s batch,
    whose rules only those Functions define; the kernels' path cannot read its data)."""
    if not is_torch_tensor(x):
        return False
    torch = sys.modules["torch"]
    return ((x.requires_grad and torch.is_grad_enabled())
            or torch._C._functorch.is_functorch_wrapped_tensor(x))


def _promoted(tensor, sparse_dtype):
    """``tensor`` cast (differentiably) to the dtype of its product with a sparse array of
    ``sparse_dtype``: the promotion of both and float32, as the products without gradient."""
    torch = sys.modules["torch"]
    dtype = torch.promote_types(torch.promote_types(tensor.dtype, torch.float32),
                                torch.from_numpy(np.zeros(0, sparse_dtype)).dtype)
    return tensor.to(dtype)


def issparse(x):
    """True if ``x`` is a pysparse_hpc sparse array."""
    return isinstance(x, sparray)
