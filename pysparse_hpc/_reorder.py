"""Graph reordering: permutations that put related rows of a square matrix next to each other.

A blocked format pays per 8x1 (or 16x1) vector; numbering rows with similar column sets
consecutively fills those vectors and lets neighbours' rows of a dense operand share cache.
This module owns the public entry points: `reorder` computes a permutation, `permute`,
`permute_rows` and `permute_columns` apply one, `inverse_permutation` undoes one and
`bandwidth` measures the result. The orderings themselves are typed Cython
(``pysparse_hpc._cy.reorder`` and ``pysparse_hpc._cy.rabbit``).

Convention (scipy's, as in ``scipy.sparse.csgraph.reverse_cuthill_mckee``): ``perm[new] = old``.
The reordered matrix is ``A[perm][:, perm]``, dense node features go along as ``X[perm]``, and
a result computed in the new order returns to the original one as ``Y[inverse_permutation(perm)]``.
"""
import sys

import numpy as np
import scipy.sparse

from ._base import sparray
from ._config import get_num_threads
from ._csr import as_csr, csr_array, read_canonical
from ._cy import convert as _convert
from ._cy import rabbit as _rabbit
from ._cy import reorder as _reorder
from ._dense import is_torch_tensor
from ._sputils import as_index_array, upcast_for_sum

__all__ = [
    "REORDER_METHODS",
    "bandwidth",
    "inverse_permutation",
    "permute",
    "permute_columns",
    "permute_rows",
    "reorder",
]

#: Names `reorder` accepts.
REORDER_METHODS = ("rabbit", "rcm", "degree", "none")


def _as_csr(A):
    """`as_csr`, with errors that say they are about ``A``."""
    if is_torch_tensor(A) and A.layout != sys.modules["torch"].strided:
        # NumPy's refusal suggested to_dense(), which for a graph can need terabytes
        raise TypeError(
            f"A is a torch sparse tensor (layout {A.layout}), which is not taken: convert it "
            "with pysparse_hpc.csr_array((values, (rows, cols)), shape=A.shape) from "
            "A.to_sparse_coo().coalesce()'s values() and indices()")
    try:
        csr = as_csr(A)
    except TypeError as exc:
        raise TypeError(f"A must be a sparse array or matrix: {exc}") from None
    except ValueError as exc:  # the right type, a wrong shape or value: csr_array's rule
        what = "sparse matrix" if scipy.sparse.issparse(A) else "matrix"
        raise ValueError(f"A is not a valid {what}: {exc}") from None
    # The checks again, the O(nnz) ones included: arrays shared with scipy (to_scipy without a
    # copy) are rewritten under this array by scipy's eliminate_zeros, leaving indptr[-1] short
    # of len(indices), and a column written in place out of range (which the canonical flag
    # does not see) sent the typed code past its buffers (a segfault). Vectorized passes:
    # about 2% of an ordering, 10% of the cheapest caller (bandwidth).
    csr._check_arrays(full_check=True, problem="A's arrays do not agree")
    return csr


def _looks_like_edge_index(A):
    """Whether ``A`` is a dense ``[2, E]`` array of integers: most likely an edge_index."""
    shape = getattr(A, "shape", None)
    return (not scipy.sparse.issparse(A) and not isinstance(A, sparray) and shape is not None
            and len(shape) == 2 and shape[0] == 2 and "int" in str(getattr(A, "dtype", "")))


def _check_square(A, what, given=None):
    if A.shape[0] != A.shape[1]:
        hint = ("permute the rows and columns of a rectangular matrix separately with "
                "permute_rows/permute_columns")
        if _looks_like_edge_index(given):
            hint = ("if it is an edge_index (source and target ids), which is not taken, build "
                    "the adjacency with pysparse_hpc.csr_array((np.ones(E), (edge_index[1], "
                    "edge_index[0])), shape=(n, n))")
        raise ValueError(f"{what} needs a square matrix (a graph), got shape {A.shape}; {hint}")


def _symmetric_graph(A):
    """Adjacency of the undirected graph of square ``A``: pattern of A + A^T, no self loops."""
    # The canonical flag is not taken on trust here (one pass over the indices): it can be set
    # by hand and the arrays rewritten under it, and the merge below, given an unsorted row,
    # returns an asymmetric pattern that the orderings cannot take.
    if not read_canonical(A):
        A = A.copy()
        A.has_canonical_format = False
        A.sum_duplicates()
    transposed = A.transpose()  # rows sorted, so the merge below needs no sorting
    return _reorder.symmetric_pattern(A.indptr, A.indices, transposed.indptr, transposed.indices)


def reorder(A, method="rabbit"):
    """A symmetric permutation of square ``A`` meant to make its blocked formats denser.

    It does where the graph has structure its ids hide (shuffled communities); on a matrix
    already in a good order (a mesh, a road network) it can make the blocks sparser: compare
    `block_stats` before and after (see the guide's "When it pays").

    Parameters
    ----------
    A : sparse array or matrix
        Square: a graph's adjacency or a structurally meaningful operator (a dense 2-D array
        is converted, its nonzeros being the pattern). Only the pattern of
        ``A + A^T`` without the diagonal is used: every stored entry is an edge whatever its
        value, an explicit zero included (as `bandwidth` and the blocked formats count it; scipy's
        ``eliminate_zeros`` drops them beforehand), and directed graphs work as their undirected
        version. An edge_index is not taken: build the adjacency from it first.
    method : {"rabbit", "rcm", "degree", "none"}, default "rabbit"
        - ``"rabbit"``: community ordering after Rabbit Order (Arai et al., IPDPS 2016):
          vertices, in ascending degree, join the neighbouring community of largest modularity
          gain; each community's merge tree is then numbered depth first. Groups rows that
          share neighbours, which is what fills 8x1 vectors on graphs with communities.
        - ``"rcm"``: reverse Cuthill-McKee. Each connected component keeps the smallest
          bandwidth among a few starts: both ends of a George-Liu pseudo-diameter and eight
          lowest-degree vertices spread over the graph, tried on the library's threads (the
          result does not depend on their number). Shrinks the bandwidth; best for meshes
          and other geometric matrices.
        - ``"degree"``: descending degree, ties by index. Cheap; rarely denser blocks.
        - ``"none"``: the identity.

    Returns
    -------
    perm : ndarray of int64, shape (n,)
        ``perm[new] = old``: the reordered matrix is ``permute(A, perm)`` (``A[perm][:, perm]``).
        Every method is deterministic for a given pattern.

    Raises
    ------
    ValueError
        If ``A`` is not square, is not 2-D or has inconsistent arrays, or ``method`` is
        unknown.
    TypeError
        If ``A`` is neither a sparse array or matrix nor convertible to a `csr_array` (a torch
        sparse tensor is not), or ``method`` is not a string.

    See Also
    --------
    permute, inverse_permutation, block_stats

    Examples
    --------
    >>> import pysparse_hpc as sph
    >>> A = sph.datasets.load("cora").adj
    >>> perm = sph.reorder(A, method="rabbit")
    >>> B = sph.permute(A, perm)
    >>> before, after = sph.block_stats(A), sph.block_stats(B)
    >>> after.n_vectors < before.n_vectors
    True
    """
    # A non-string (an array of names) would reach the comparisons below as an array
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, one of {', '.join(REORDER_METHODS)}; got "
                        f"{type(method).__name__} ({method!r})")
    if method not in REORDER_METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(REORDER_METHODS)}")
    given = A
    A = _as_csr(A)
    _check_square(A, "reordering", given)
    if method == "none":
        return np.arange(A.shape[0], dtype=np.int64)
    indptr, indices = _symmetric_graph(A)
    if method == "degree":
        return _reorder.degree_order(indptr)
    if method == "rcm":
        return _reorder.rcm_order(indptr, indices, get_num_threads())
    ascending = _reorder.degree_order(indptr, descending=False)
    return _rabbit.rabbit_order(indptr, indices, ascending)


def _check_permutation(perm, n, name="perm"):
    """``perm`` as a trusted int64 array, after checking it is a permutation of ``range(n)``."""
    array = as_index_array(perm, name)
    if array.size != n:
        raise ValueError(f"{name} has length {array.size}, expected {n}")
    if n == 0:
        return np.empty(0, dtype=np.int64)
    lowest, highest = array.min(), array.max()
    if lowest < 0 or highest >= n:
        bad = array[(array < 0) | (array >= n)][0]
        raise ValueError(
            f"{name} holds {bad}, outside [0, {n}); expected a permutation of range({n})")
    array = array.astype(np.int64, copy=False)
    counts = np.bincount(array, minlength=n)
    if counts.max() > 1:
        repeated = int(np.flatnonzero(counts > 1)[0])
        raise ValueError(
            f"{name} holds {repeated} {int(counts[repeated])} times; expected a permutation of "
            f"range({n}) with every index exactly once")
    return np.ascontiguousarray(array)


def inverse_permutation(perm):
    """The inverse of a permutation: ``inverse[perm[i]] = i``.

    Parameters
    ----------
    perm : array_like of int
        A permutation of ``range(n)``.

    Returns
    -------
    ndarray of int64
        Takes results computed in the reordered numbering back to the original one:
        ``Y_original = Y_reordered[inverse_permutation(perm)]``.

    Raises
    ------
    TypeError, ValueError
        If ``perm`` is not a 1-D integer permutation (length, range and repeats are checked).

    Examples
    --------
    >>> import numpy as np
    >>> from pysparse_hpc import inverse_permutation
    >>> inverse_permutation(np.array([2, 0, 1]))
    array([1, 2, 0])
    """
    # Its length from the checked array: np.size of a torch tensor is its ``size`` method.
    array = as_index_array(perm, "perm")
    return _inverse(_check_permutation(array, array.size))


def _inverse(perm):
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(perm.size, dtype=np.int64)
    return inverse


def _permuted(A, row_perm, col_perm):
    """Rows gathered by ``row_perm`` and columns renumbered by the inverse of ``col_perm``.

    Rows come out sorted by column (a row keeps its entries, duplicates included); a
    canonical input gives a canonical output.
    """
    col_inverse = None if col_perm is None else _inverse(col_perm)
    indptr, indices, data = _convert.csr_permute(
        A.indptr, A.indices, np.ascontiguousarray(upcast_for_sum(A.data)), row_perm, col_inverse)
    result = csr_array.__new__(csr_array)
    result._set_arrays(data.astype(A.dtype, copy=False), indices, indptr, A.shape,
                       True if A._canonical else None)
    return result


def permute(A, perm):
    """``P A P^T``: rows and columns of square ``A`` renumbered by one permutation.

    Parameters
    ----------
    A : sparse array or matrix
        Square.
    perm : array_like of int
        ``perm[new] = old``, as returned by `reorder`.

    Returns
    -------
    csr_array
        ``A[perm][:, perm]``, rows sorted; canonical when ``A`` is. ``A`` is not modified.
        Dense rows that go with it (node features) permute as ``X[perm]``, and then
        ``permute(A, perm) @ X[perm] == (A @ X)[perm]``.

    Raises
    ------
    ValueError
        If ``A`` is not square or ``perm`` is not a permutation of ``range(n)``.

    Examples
    --------
    >>> import numpy as np
    >>> import pysparse_hpc as sph
    >>> A = sph.csr_array(np.array([[0., 1., 0.], [0., 0., 2.], [3., 0., 0.]]))
    >>> sph.permute(A, [2, 0, 1]).toarray()
    array([[0., 3., 0.],
           [0., 0., 1.],
           [2., 0., 0.]])
    """
    A = _as_csr(A)
    _check_square(A, "permute")
    perm = _check_permutation(perm, A.shape[0])
    return _permuted(A, perm, perm)


def permute_rows(A, perm):
    """``P A``: the rows of ``A`` in the order ``perm`` (``A[perm]``); any shape.

    Parameters
    ----------
    A : sparse array or matrix
        Any shape.
    perm : array_like of int
        One entry per row, ``perm[new] = old``.

    Returns
    -------
    csr_array
        ``A[perm]``; see `permute`.

    Raises
    ------
    TypeError, ValueError
        If ``perm`` is not a 1-D integer permutation of ``range(A.shape[0])``.
    """
    A = _as_csr(A)
    return _permuted(A, _check_permutation(perm, A.shape[0]), None)


def permute_columns(A, perm):
    """``A P^T``: the columns of ``A`` in the order ``perm`` (``A[:, perm]``); any shape.

    Parameters
    ----------
    A : sparse array or matrix
        Any shape.
    perm : array_like of int
        One entry per column, ``perm[new] = old``.

    Returns
    -------
    csr_array
        ``A[:, perm]`` with sorted rows; see `permute`.

    Raises
    ------
    TypeError, ValueError
        If ``perm`` is not a 1-D integer permutation of ``range(A.shape[1])``.
    """
    A = _as_csr(A)
    return _permuted(A, None, _check_permutation(perm, A.shape[1]))


def bandwidth(A):
    """The largest ``|i - j|`` over the stored entries ``(i, j)`` of ``A`` (0 when empty).

    Parameters
    ----------
    A : sparse array or matrix
        Any shape. Explicit zeros count: this measures the pattern, which is what `reorder`
        changes.

    Returns
    -------
    int

    Examples
    --------
    >>> import numpy as np
    >>> import pysparse_hpc as sph
    >>> sph.bandwidth(sph.csr_array(np.eye(4) + np.eye(4, k=2)))
    2
    """
    A = _as_csr(A)
    if A.nnz == 0:
        return 0
    rows = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
    return int(np.abs(rows - A.indices).max())
