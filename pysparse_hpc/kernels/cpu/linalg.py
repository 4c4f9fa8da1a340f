"""Dense linear algebra torch lacks, on the CPU, for `pysparse_hpc.precondition`'s roots.

* `pivoted_cholesky`: Cholesky factorisation with diagonal pivoting of a positive
  semi-definite matrix, stopping at its numerical rank (LAPACK's ``?pstrf``). Jorge's refresh
  uses it to find the rank of a gradient's Gram matrix: a layer's gradient over a batch of
  ``b`` examples has rank at most ``b``, and a ``256 x 784`` gradient over 128 examples
  refreshes its ``784``-side root from 128 columns instead of 256. torch has no pivoted
  Cholesky, and SciPy's LAPACK would start a BLAS thread pool of its own beside torch's.
  Left-looking: each new column is the pivot's row of the matrix less a combination of the
  earlier columns, an update contiguous in memory that vectorises (measured on one core:
  0.3 ms for a 256 x 256 matrix of rank 128, 5 ms for 512 x 512 of full rank, against 3 ms
  and 16-24 ms right-looking).
* `symmetrize_`: ``A <- (A + A^T) / 2`` in place, tile by tile. ``A.add(A.T)`` walks one
  operand across rows, out of cache once ``A`` outgrows it: 5.3 ms against 1.4-1.7 ms for
  a 1433 x 1433 float32 root (a GCN's input side on Cora), with the same bits.

Inputs are trusted (the callers pass finite, square, C-contiguous arrays).
"""
import numpy as np
from numba import njit

_JIT = dict(cache=True, nogil=True)


@njit(**_JIT)
def pivoted_cholesky(gram, tol, max_rank, factor_rows):
    """Factor ``gram = C C^T`` with ``C`` of ``rank`` columns, choosing the largest remaining
    diagonal as the next pivot and stopping once it is at most ``tol``.

    ``C`` is lower triangular up to the pivot order; its rows stay in ``gram``'s order.

    Parameters
    ----------
    gram : ndarray of float32 or float64, shape (n, n)
        Symmetric positive semi-definite, C-contiguous; only read.
    tol : float
        The largest remaining diagonal (of the Schur complement) that counts as zero.
    max_rank : int
        Stop after this many columns.
    factor_rows : ndarray, shape (>= max_rank, n), gram's dtype, C-contiguous
        Output: row ``j`` holds column ``j`` of ``C``.

    Returns
    -------
    int
        ``rank``, the number of columns of ``C``; ``max_rank + 1`` when the matrix has more
        than ``max_rank`` (``factor_rows`` then holds the first ``max_rank``).
    """
    n = gram.shape[0]
    remaining = np.empty(n, dtype=gram.dtype)
    for i in range(n):
        remaining[i] = gram[i, i]
    pivoted = np.zeros(n, dtype=np.bool_)
    column = np.empty(n, dtype=gram.dtype)
    for j in range(max_rank):
        pivot = -1
        largest = tol
        for i in range(n):
            if not pivoted[i] and remaining[i] > largest:
                largest = remaining[i]
                pivot = i
        if pivot < 0:
            return j
        pivoted[pivot] = True
        for i in range(n):
            column[i] = gram[pivot, i]
        for k in range(j):
            weight = factor_rows[k, pivot]
            for i in range(n):
                column[i] -= weight * factor_rows[k, i]
        root = np.sqrt(column[pivot])
        for i in range(n):
            # Rows pivoted before this column are zero in it (C is triangular in pivot order).
            value = column[i] / root if not pivoted[i] else 0.0
            factor_rows[j, i] = value
            remaining[i] -= value * value
        factor_rows[j, pivot] = root
    for i in range(n):
        if not pivoted[i] and remaining[i] > tol:
            return max_rank + 1
    return max_rank


#: The tile's side: 64 x 64 float32 tiles (16 KB each, two at a time) stay in the L1/L2
#: caches; measured best of 16-128 on 1433 x 1433 and 2000 x 2000 matrices.
SYMMETRIZE_TILE = 64


@njit(**_JIT)
def symmetrize_(a):
    """``a <- (a + a^T) / 2`` in place (``a`` square, C-contiguous); the diagonal is kept."""
    n = a.shape[0]
    tile = SYMMETRIZE_TILE
    for row_start in range(0, n, tile):
        row_stop = min(row_start + tile, n)
        for col_start in range(0, row_start + 1, tile):
            col_stop = min(col_start + tile, n)
            for i in range(row_start, row_stop):
                for j in range(col_start, min(col_stop, i)):
                    value = (a[i, j] + a[j, i]) * 0.5
                    a[i, j] = value
                    a[j, i] = value
