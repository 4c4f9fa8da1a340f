"""Random sparse matrices and graphs with known structure, for tests and benchmarks.

Each generator is deterministic for a given ``seed`` and returns a canonical `csr_array`.
"""
import numpy as np

from ._csr import csr_array

__all__ = ["rmat"]


def rmat(scale, edge_factor=16, probabilities=(0.57, 0.19, 0.19, 0.05), seed=0,
         dtype=np.float32, symmetric=False, self_loops=True):
    """A power-law graph from the recursive matrix (R-MAT / Graph500) model.

    Each edge picks one quadrant of the adjacency ``scale`` times with the given probabilities,
    so a few rows get very many entries and most get few, like real web and social graphs.
    Duplicate edges are merged (their weights summed).

    Parameters
    ----------
    scale : int
        ``2**scale`` nodes.
    edge_factor : int, default 16
        Edges drawn per node (before duplicates merge), as in Graph500.
    probabilities : tuple of 4 floats, default (0.57, 0.19, 0.19, 0.05)
        Quadrant probabilities (a, b, c, d); Graph500's defaults.
    seed : int, default 0
    dtype : dtype, default float32
        Value dtype; every drawn edge has weight 1.
    symmetric : bool, default False
        Add the transpose (an undirected graph).
    self_loops : bool, default True
        Keep edges (i, i).

    Returns
    -------
    csr_array
        Shape ``(2**scale, 2**scale)``.

    Examples
    --------
    >>> from pysparse_hpc.generators import rmat
    >>> A = rmat(10, edge_factor=8, seed=1)
    >>> A.shape
    (1024, 1024)
    """
    if not 1 <= int(scale) <= 40:
        raise ValueError(f"scale must be in [1, 40], got {scale}")
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.shape != (4,) or np.any(probabilities < 0) or not np.isclose(probabilities.sum(), 1):
        raise ValueError(f"probabilities must be 4 non-negative numbers summing to 1, got {probabilities}")
    n = 1 << int(scale)
    n_edges = int(edge_factor) * n
    rng = np.random.default_rng(seed)
    rows = np.zeros(n_edges, dtype=np.int64)
    cols = np.zeros(n_edges, dtype=np.int64)
    cumulative = np.cumsum(probabilities)
    for level in range(int(scale)):
        quadrant = np.searchsorted(cumulative, rng.random(n_edges), side="right")
        bit = np.int64(1) << level
        rows |= np.where(quadrant >= 2, bit, 0)
        cols |= np.where(quadrant % 2 == 1, bit, 0)
    # Shuffle node ids so the heavy rows are not all at the top (as Graph500 does).
    relabel = rng.permutation(n)
    rows, cols = relabel[rows], relabel[cols]
    if symmetric:
        rows, cols = np.concatenate([rows, cols]), np.concatenate([cols, rows])
    if not self_loops:
        keep = rows != cols
        rows, cols = rows[keep], cols[keep]
    return csr_array((np.ones(rows.size, dtype=dtype), (rows, cols)), shape=(n, n))
