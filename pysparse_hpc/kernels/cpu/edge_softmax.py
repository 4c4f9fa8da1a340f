"""Softmax over each row's stored entries (attention), forward and backward, on the CPU.

Scores, probabilities and gradients are ``(nnz, heads)`` arrays aligned with a canonical CSR
pattern's storage. The GAT kernels fuse the score of each edge, ``LeakyReLU(s_dst[i] +
s_src[j])``, into the softmax, so the per-edge scores never exist as a separate array; they
record which edges were on the positive side of the LeakyReLU (``positive``), all the backward
pass needs from the forward besides the probabilities. Rows are independent: the drivers run
them under ``prange``. The work is O(nnz * heads), small next to the SpMM it feeds.
"""
import numpy as np
from numba import njit, prange

_JIT = dict(cache=True, nogil=True, fastmath=False)  # exp of large scores: keep IEEE semantics


@njit(inline="always", **_JIT)
def _normalize_row(alpha, start, stop, h):
    """``alpha[start:stop, h] = softmax(alpha[start:stop, h])`` in place (max subtracted)."""
    peak = -np.inf
    for p in range(start, stop):
        if alpha[p, h] > peak:
            peak = alpha[p, h]
        elif alpha[p, h] != alpha[p, h]:
            # NaN compares false with everything: without this a row of NaN would look like a
            # row of -inf and come out uniform, hiding the NaN that torch and PyG propagate.
            peak = alpha[p, h]
            break
    if peak == -np.inf:  # every score is -inf: no preference, spread evenly (as a limit would)
        for p in range(start, stop):
            alpha[p, h] = 1.0 / (stop - start)
        return
    total = 0.0
    for p in range(start, stop):
        value = np.exp(alpha[p, h] - peak)
        alpha[p, h] = value
        total += value
    for p in range(start, stop):
        alpha[p, h] /= total


@njit(inline="always", **_JIT)
def _row_dot(alpha, grad_alpha, start, stop, h):
    """``sum(alpha * grad_alpha)`` over one row's entries of head h: softmax's backward term."""
    dot = 0.0
    for p in range(start, stop):
        dot += alpha[p, h] * grad_alpha[p, h]
    return dot


@njit(parallel=True, **_JIT)
def softmax_rows(indptr, scores, alpha):
    """``alpha[p, h] = exp(scores[p, h]) / sum over row(p) of exp(scores[., h])``."""
    n_heads = scores.shape[1]
    for row in prange(indptr.size - 1):
        start, stop = indptr[row], indptr[row + 1]
        for h in range(n_heads):
            for p in range(start, stop):
                alpha[p, h] = scores[p, h]
            _normalize_row(alpha, start, stop, h)


@njit(parallel=True, **_JIT)
def gat_softmax_rows(indptr, indices, s_dst, s_src, negative_slope, alpha, positive):
    """GAT's attention: softmax over row i of ``LeakyReLU(s_dst[i, h] + s_src[j, h])``."""
    n_heads = s_dst.shape[1]
    for row in prange(indptr.size - 1):
        start, stop = indptr[row], indptr[row + 1]
        for h in range(n_heads):
            for p in range(start, stop):
                z = s_dst[row, h] + s_src[indices[p], h]
                positive[p, h] = z > 0
                alpha[p, h] = z if z > 0 else negative_slope * z
            _normalize_row(alpha, start, stop, h)


@njit(parallel=True, **_JIT)
def softmax_backward_rows(indptr, alpha, grad_alpha, grad_scores):
    """Softmax's backward per row: ``g_s = alpha * (g_alpha - sum(alpha * g_alpha))``."""
    n_heads = alpha.shape[1]
    for row in prange(indptr.size - 1):
        start, stop = indptr[row], indptr[row + 1]
        for h in range(n_heads):
            dot = _row_dot(alpha, grad_alpha, start, stop, h)
            for p in range(start, stop):
                grad_scores[p, h] = alpha[p, h] * (grad_alpha[p, h] - dot)


@njit(parallel=True, **_JIT)
def gat_softmax_backward_rows(indptr, alpha, grad_alpha, positive, negative_slope, grad_z,
                              grad_s_dst):
    """Backward through softmax and LeakyReLU: ``grad_z`` per edge (before the LeakyReLU) and
    its row sums, the gradient of ``s_dst``."""
    n_heads = alpha.shape[1]
    for row in prange(indptr.size - 1):
        start, stop = indptr[row], indptr[row + 1]
        for h in range(n_heads):
            dot = _row_dot(alpha, grad_alpha, start, stop, h)
            row_sum = 0.0
            for p in range(start, stop):
                g = alpha[p, h] * (grad_alpha[p, h] - dot)
                if not positive[p, h]:
                    g *= negative_slope
                grad_z[p, h] = g
                row_sum += g
            grad_s_dst[row, h] = row_sum


@njit(parallel=True, **_JIT)
def column_sums(t_indptr, t_order, values, out):
    """``out[j, h] = sum of values[p, h]`` over the entries p of column j, read through the
    transpose: ``t_order[t_indptr[j]:t_indptr[j + 1]]`` lists them (no write conflicts)."""
    n_heads = values.shape[1]
    for col in prange(t_indptr.size - 1):
        for h in range(n_heads):
            total = 0.0
            for q in range(t_indptr[col], t_indptr[col + 1]):
                total += values[t_order[q], h]
            out[col, h] = total
