"""Dropout on the CPU with a counter-based generator: the mask is a pure function of
``(seed, element index)``, so it is the same for any number of threads and the backward pass
recomputes it instead of storing it.

Element i is kept when ``splitmix64(seed + i * golden) >= threshold`` with
``threshold = p * 2**64``; kept elements are scaled by ``1 / (1 - p)``.
"""
import numpy as np
from numba import njit, prange

_JIT = dict(cache=True, nogil=True)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit(inline="always", **_JIT)
def _splitmix64(seed, i):
    z = seed + np.uint64(i) * _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@njit(parallel=True, **_JIT)
def dropout(x, out, seed, threshold, scale):
    """``out = x * keep * scale`` over flat C-contiguous arrays; ``keep`` from (seed, index)."""
    # A dropped element is x * 0, not 0: NaN and inf stay NaN, as torch's x * mask leaves them.
    for i in prange(x.size):
        out[i] = x[i] * scale if _splitmix64(seed, i) >= threshold else x[i] * 0


@njit(parallel=True, **_JIT)
def dropout_rows(x, out, row_ids, seed, threshold, scale):
    """`dropout` over (rows, width) arrays with element (r, c) hashed at counter
    ``row_ids[r] * width + c``: the mask of a row follows its id (a global node or edge id),
    not its position, so the rows of one graph split over several arrays get the same masks as
    the whole. With ``row_ids = arange(rows)`` it equals `dropout`."""
    width = x.shape[1]
    for r in prange(x.shape[0]):
        base = np.uint64(row_ids[r]) * np.uint64(width)
        for c in range(width):
            keep = _splitmix64(seed, base + np.uint64(c)) >= threshold
            out[r, c] = x[r, c] * scale if keep else x[r, c] * 0  # NaN stays NaN, as torch
