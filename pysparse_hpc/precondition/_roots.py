"""Matrix roots for the Kronecker-factored root makers (Shampoo, Jorge).

This module owns the numerical kernels those makers share, each on plain tensors with no
validation (the makers check their input):

* `block_bounds`: the split of one dimension into blocks of at most ``block_size``;
* `inverse_root`: ``(M + eps I)^(-1/p)`` of a symmetric positive semi-definite ``M`` by
  eigendecomposition, the damping added to the (clamped) eigenvalues, never to ``M``;
* `series_root_update`: Jorge's update of a stored inverse fourth root ``Lh ~ L^(-1/4)`` by
  matrix products only (see its docstring for the formula and the normalisation), and
  `series_root_update_factored`, the same update for statistics ``F F^T`` of low rank;
* `gram_factors`: thin factors of one gradient's two statistics, with as many columns as the
  gradient's rank;
* `symmetrized`: ``(M + M^T) / 2``, in place and by tiles on the CPU;
* `finite_norm`: a Euclidean norm that does not overflow where the tensor is finite.
"""
import math

import numpy as np
import torch

from ._maker import _all_finite

__all__ = ["block_bounds", "finite_norm", "gram_factors", "inverse_root", "series_root_update",
           "series_root_update_factored", "symmetrized", "SERIES_COEFFICIENTS"]

#: ``(1 + x)^(-1/4) = 1 - x/4 + (5/32) x^2 - (15/128) x^3 + ...``: the terms Jorge keeps.
SERIES_COEFFICIENTS = (1.0, -0.25, 5.0 / 32.0)


def block_bounds(dim, block_size=None):
    """``[(start, stop), ...]`` covering ``range(dim)`` in blocks of `block_size` (last shorter).

    Examples
    --------
    >>> from pysparse_hpc.precondition._roots import block_bounds
    >>> block_bounds(10, 4)
    [(0, 4), (4, 8), (8, 10)]
    >>> block_bounds(10)
    [(0, 10)]
    """
    if block_size is None or dim <= block_size:
        return [(0, dim)]
    return [(start, min(start + block_size, dim)) for start in range(0, dim, block_size)]


def inverse_root(matrix, damping, order=4, relative=False):
    """``(M + eps I)^(-1/order)`` by eigendecomposition; None when that fails or is not finite.

    Parameters
    ----------
    matrix : torch.Tensor
        Symmetric positive semi-definite ``n x n`` (finite; only its lower triangle is read).
    damping : float
        ``eps`` (> 0), added to the eigenvalues after negative rounding errors are clamped to 0.
    order : int
        The root: 4 for Shampoo's two-sided preconditioner.
    relative : bool
        True: ``eps = damping * lambda_max(M)`` (``damping`` when ``M`` is zero), the scale-free
        ridge of Google's Shampoo and ASDL (which, unlike this function, also adds it into
        ``M`` itself).

    Returns
    -------
    torch.Tensor or None
        ``V diag((max(lambda, 0) + eps)^(-1/order)) V^T``, in the dtype of `matrix`.
    """
    try:
        eigenvalues, eigenvectors = torch.linalg.eigh(matrix)
    except RuntimeError:  # torch.linalg.LinAlgError: the algorithm did not converge
        return None
    eigenvalues = eigenvalues.clamp(min=0)
    eps = damping
    if relative:
        largest = float(eigenvalues[-1])
        if largest > 0:
            eps = damping * largest
    powers = eigenvalues.add_(eps).pow_(-1.0 / order)
    root = torch.mm(eigenvectors * powers, eigenvectors.T)
    return root if _all_finite(root) else None


def series_root_update(root, statistics, decay, radius, symmetrize=True):
    """Jorge's update of ``Lh = L^(-1/4)`` for ``L <- decay L + M``, by matrix products only.

    ``decay L + M = decay L (I + X)`` with ``X = L^-1 M / decay = Lh^4 M / decay``, and
    ``(I + X)^(-1/4) = I - X/4 + (5/32) X^2 + O(X^3)``, so

        ``Lh <- decay^(-1/4) Lh (I - X/4 + (5/32) X^2)``

    which equals the exact root ``(decay L + M)^(-1/4)`` up to ``O(||X||^3)`` when ``L`` and
    ``M`` commute (in general the product ``Lh (I + X)^(-1/4)`` is the commuting
    approximation, as in the Jorge paper). For EMA statistics ``M = (1 - b) G G^T`` and
    ``decay = b``: ``X = ((1 - b) / b) Lh^4 G G^T``.

    Normalisation: the binomial series converges for a spectral radius of ``X`` below 1 and
    the truncated polynomial ``1 - x/4 + 5x^2/32`` stops decreasing at ``x = 0.8``. When
    ``||X||_F > radius``, ``X`` is scaled to Frobenius norm `radius` (which bounds the spectral
    radius: ``X`` is similar to the positive semi-definite ``Lh^2 M Lh^2 / decay`` when ``Lh``
    is symmetric). The prefactor ``decay^(-1/4)`` is kept, so the clipped update is, to the
    same order, the exact root update of ``decay L + (radius / ||X||_F) M``: the new
    statistics enter with a smaller weight; nothing else changes. Below `radius` the update is
    the unmodified series.

    Parameters
    ----------
    root : torch.Tensor
        The current ``Lh`` (``n x n``).
    statistics : torch.Tensor
        ``M`` (``n x n``, symmetric positive semi-definite).
    decay : float
        The factor of the old statistics (> 0).
    radius : float
        The largest Frobenius norm of ``X`` used (in (0, 1]).
    symmetrize : bool
        Return ``(Lh + Lh^T) / 2`` (the exact root is symmetric; the product is not).

    Returns
    -------
    (torch.Tensor or None, bool)
        The new ``Lh`` (None when ``X`` is not finite) and whether ``X`` was scaled down.
    """
    square = torch.mm(root, root)
    x = torch.mm(torch.mm(square, square), statistics)
    norm = finite_norm(x)
    if norm is None:
        return None, False
    scale = 1.0 / decay
    norm *= scale
    clipped = norm > radius
    if clipped:
        scale *= radius / norm
    if scale != 1.0:
        x.mul_(scale)
    y = torch.mm(root, x)
    new = torch.addmm(root, y, x, beta=1.0, alpha=SERIES_COEFFICIENTS[2])
    new.add_(y, alpha=SERIES_COEFFICIENTS[1])
    if decay != 1.0:
        new.mul_(decay ** -0.25)
    if symmetrize:
        new = symmetrized(new)
    return new, clipped


def series_root_update_factored(root, factor, decay, radius, symmetrize=True):
    """`series_root_update` for statistics ``M = F F^T`` given by their factor ``F``
    (``n x k``), in ``O(n^2 k)`` operations instead of ``O(n^3)``.

    With ``A = Lh^4 F`` (``n x k``) the series' matrix is ``X = s A F^T`` (``s`` the scale of
    the decay and the clipping), of rank ``k``, so every product stays thin:

        ``||X||_F^2 = s^2 tr((A^T A)(F^T F))``,
        ``Lh X = s B F^T`` and ``Lh X^2 = s^2 B (F^T A) F^T`` with ``B = Lh A``,
        ``Lh (I - X/4 + (5/32) X^2) = Lh + B (-s/4 I + (5/32) s^2 F^T A) F^T``.

    About ``12 n^2 k`` flops against the dense update's ``10 n^3``: a Shampoo factor of a
    layer with few outputs (a GNN layer's ``16 x 1433`` weight: ``n = 1433``, ``k = 16``)
    refreshes 50-100x faster. The result is the dense update's up to rounding (the products
    are associated differently).

    Parameters
    ----------
    root : torch.Tensor
        The current ``Lh`` (``n x n``).
    factor : torch.Tensor
        ``F`` (``n x k``).
    decay, radius, symmetrize
        As for `series_root_update`.

    Returns
    -------
    (torch.Tensor or None, bool)
        As `series_root_update`.
    """
    thin = factor
    for _ in range(4):
        thin = torch.mm(root, thin)                  # A = Lh^4 F
    square_norm = float((torch.mm(thin.T, thin) * torch.mm(factor.T, factor)).sum())
    if not math.isfinite(square_norm):
        return None, False
    norm = math.sqrt(max(square_norm, 0.0)) / decay
    scale = 1.0 / decay
    clipped = norm > radius
    if clipped:
        scale *= radius / norm
    core = torch.mm(factor.T, thin).mul_(SERIES_COEFFICIENTS[2] * scale * scale)
    core.diagonal().add_(SERIES_COEFFICIENTS[1] * scale)
    new = torch.addmm(root, torch.mm(torch.mm(root, thin), core), factor.T)
    if decay != 1.0:
        new.mul_(decay ** -0.25)
    if symmetrize:
        new = symmetrized(new)
    return new, clipped


def gram_factors(block, left, right, max_rank=None):
    """Factors ``(F_L, F_R)`` of the statistics of one gradient block ``G``, with
    ``F_L F_L^T = G G^T`` and ``F_R F_R^T = G^T G``, each of ``rank(G)`` columns.

    ``G`` itself gives factors of ``n`` and ``m`` columns (``F_L = G``, ``F_R = G^T``), but a
    gradient summed over a batch of ``b`` examples has rank at most ``b``: the ``256 x 784``
    weight of a layer over 128 examples has rank 128, and its ``784``-side root refreshes from
    128 columns instead of 256 (`series_root_update_factored` costs ``12 n^2 k``). The rank and
    a factor ``C`` of the smaller statistics ``S`` come from a Cholesky factorisation with
    pivoting of ``S`` (`pysparse_hpc.kernels.cpu.linalg`), stopped at LAPACK's
    default tolerance ``s eps max(diag S)``; an orthonormal basis ``Q`` of ``C``'s columns spans
    ``G``'s columns (or rows), so the other side's statistics are ``(G^T Q)(G^T Q)^T`` (or
    ``(G Q)(G Q)^T``). What is dropped is at most that tolerance, in the norm of ``S``.

    Parameters
    ----------
    block : torch.Tensor
        ``G`` (``m x n``).
    left, right : torch.Tensor or None
        ``G G^T`` and ``G^T G``, finite; only the smaller is read (the other may be None,
        as Jorge's training loop leaves it).
    max_rank : int, optional
        The largest rank worth factoring (the search stops there); default ``min(m, n) - 1``.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``(F_L, F_R)``; ``(G, G^T)`` themselves when the rank of ``G`` is above `max_rank`, or
        ``G`` is not a float32 or float64 tensor on the CPU.
    """
    rows, cols = block.shape
    smaller = left if rows <= cols else right
    side = smaller.shape[0]
    max_rank = side - 1 if max_rank is None else min(int(max_rank), side - 1)
    if (block.device.type != "cpu" or max_rank < 0
            or block.dtype not in (torch.float32, torch.float64)):
        return block, block.T
    from ..kernels.cpu.linalg import pivoted_cholesky
    gram = smaller.detach().contiguous().numpy()
    tolerance = side * float(torch.finfo(block.dtype).eps) * max(float(gram.diagonal().max()), 0.0)
    factor_rows = np.empty((max_rank, side), dtype=gram.dtype)
    rank = pivoted_cholesky(gram, tolerance, max_rank, factor_rows)
    if rank > max_rank:
        return block, block.T
    small_factor = torch.from_numpy(factor_rows[:rank]).T
    basis = torch.linalg.qr(small_factor).Q
    if rows <= cols:
        return small_factor, torch.mm(block.T, basis)
    return torch.mm(block, basis), small_factor


def symmetrized(matrix):
    """``(M + M^T) / 2`` of a square `matrix`, in place where it is a contiguous float32 or
    float64 CPU tensor (`pysparse_hpc.kernels.cpu.linalg.symmetrize_`: the same bits, 3x
    faster once the matrix outgrows the cache)."""
    if (matrix.device.type == "cpu" and matrix.dtype in (torch.float32, torch.float64)
            and matrix.is_contiguous() and not matrix.requires_grad):
        from ..kernels.cpu.linalg import symmetrize_
        symmetrize_(matrix.numpy())
        return matrix
    return matrix.add(matrix.T).mul_(0.5)


def finite_norm(tensor):
    """The Euclidean norm of `tensor` as a float, or None when it holds NaN or inf.

    A finite tensor whose sum of squares overflows (float32 entries above ~1e19) is rescaled
    by its largest magnitude first.
    """
    value = float(torch.linalg.vector_norm(tensor))
    if math.isfinite(value):
        return value
    if not bool(torch.isfinite(tensor).all()):
        return None
    largest = float(tensor.abs().max())
    return largest * float(torch.linalg.vector_norm(tensor / largest))
