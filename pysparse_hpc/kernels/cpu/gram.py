"""The Gram matrix ``X^T X`` of a dense array that is mostly zeros, on the CPU
(`pysparse_hpc.precondition`'s Kronecker factors of bag-of-words inputs).

A dense product costs ``2 n d^2`` flops whatever ``X`` holds; summing each row's outer product
over its nonzeros costs the sum over rows of ``nnz(row)^2``: for Cora's dropped-out features
(2708 x 1433, 0.6 % nonzero) about 0.2 M updates against 11 G flops. Serial: the updates
scatter over the whole output, and a pass takes milliseconds. Inputs are trusted
(`pysparse_hpc.precondition._gram` checks them).
"""
import numpy as np
from numba import njit

_JIT = dict(cache=True, nogil=True)


@njit(**_JIT)
def has_fewer_nonzeros(x, limit):
    """Whether 2-D ``x`` holds fewer than ``limit`` nonzeros. Stops counting at ``limit``, so
    a dense input costs a pass over its first ``limit`` values only."""
    count = 0
    n, d = x.shape
    for i in range(n):
        for j in range(d):
            if x[i, j] != 0:
                count += 1
        if count >= limit:
            return False
    return True


@njit(**_JIT)
def sparse_rows_gram(x, out):
    """``out = x^T x`` (``out`` square, zeroed here), visiting only the nonzeros of each row
    of C-contiguous ``x``."""
    n, d = x.shape
    out[:] = 0
    columns = np.empty(d, dtype=np.int64)
    for i in range(n):
        count = 0
        for j in range(d):
            if x[i, j] != 0:
                columns[count] = j
                count += 1
        for a in range(count):
            ja = columns[a]
            value = x[i, ja]
            for b in range(count):
                jb = columns[b]
                out[ja, jb] += value * x[i, jb]
