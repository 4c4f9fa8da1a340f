"""Random sparse matrices and graphs with known structure, for tests and benchmarks.

Each generator is deterministic for a given ``seed`` and returns a canonical `csr_array`.
"""
import math

import numpy as np

from ._csr import csr_array
from ._sputils import (as_numpy_dtype, check_flag, check_integer, check_real_number,
                       check_seed, get_index_dtype, refuse_beyond_memory, value_dtype_for)

__all__ = ["planted_partition", "rmat"]


def _value_dtype(dtype):
    """The values' dtype, resolved before the graph is drawn (a torch dtype taken as its NumPy
    twin; an unusable one refused up front, not by NumPy after the drawing)."""
    return value_dtype_for(as_numpy_dtype(dtype))


#: Bytes per entry that drawing a graph needs at least: the int64 coordinates, the draws and
#: temporaries of the drawing, and the sort into CSR (about 60 measured at its peak; the lower
#: figure refuses only what cannot fit).
_BYTES_PER_ENTRY = 48

#: Bytes per node at least, whatever the edges: rmat's int64 relabelling permutation and the
#: row pointer (about 20 measured). Counted apart, or rmat(40, edge_factor=0), which draws no
#: edge, asked NumPy for a permutation of 8 TiB.
_BYTES_PER_NODE = 16


def _check_fits(what, *factors, nodes=0):
    """Refuse up front a graph whose drawing cannot fit in memory: NumPy would fail with
    "Maximum allowed dimension exceeded" naming nothing, or, under memory overcommit, the
    process would be killed partway through the drawing. The entries are the product of
    ``factors``, taken here where a product past float's range is caught."""
    try:
        entries = float(math.prod(factors))
    except OverflowError:   # an integer argument past float's range
        entries = math.inf
    # Two lower bounds, so their maximum is one too: a graph is refused only if it cannot fit.
    needed = max(entries * _BYTES_PER_ENTRY, float(nodes) * _BYTES_PER_NODE)
    on_nodes = f" on {float(nodes):.3g} nodes" if needed > entries * _BYTES_PER_ENTRY else ""
    refuse_beyond_memory(needed, f"{what} draws about {entries:.3g} entries{on_nodes}, which")


def _holds_bool(values):
    if isinstance(values, np.ndarray):
        return values.dtype.kind == "b"
    try:
        return any(isinstance(value, (bool, np.bool_)) for value in values)
    except TypeError:
        return False


def _check_probabilities(probabilities):
    """The four quadrant probabilities as float64; TypeError naming the argument for what is not
    four numbers (NumPy's own conversion error names nothing), ValueError for bad values."""
    try:
        values = (np.asarray(probabilities) if not isinstance(probabilities, (str, bytes))
                  else None)
    except ValueError:   # ragged nesting: NumPy's "inhomogeneous shape" names no argument
        values = None
    # Booleans are refused, as everywhere in the library (True is no probability), also among
    # numbers, where NumPy's conversion hides them.
    if values is None or values.dtype.kind not in "iuf" or _holds_bool(probabilities):
        raise TypeError(f"probabilities must be 4 numbers, got {type(probabilities).__name__} "
                        f"{probabilities!r}")
    values = values.astype(np.float64)
    if values.shape != (4,) or np.any(values < 0) or not np.isclose(values.sum(), 1):
        raise ValueError(
            f"probabilities must be 4 non-negative numbers summing to 1, got {values}")
    return values


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
        Non-negative; the same seed gives the same graph.
    dtype : dtype, default float32
        Value dtype, float16, float32 or float64 (an integer or boolean dtype gives float64,
        as everywhere in the library); every drawn edge has weight 1.
    symmetric : bool, default False
        Add the transpose (an undirected graph).
    self_loops : bool, default True
        Keep edges (i, i).

    Returns
    -------
    csr_array
        Shape ``(2**scale, 2**scale)``, int32 indices unless the size needs int64.

    Raises
    ------
    MemoryError
        Before drawing, when the edges cannot fit in this machine's memory.

    Examples
    --------
    >>> from pysparse_hpc.generators import rmat
    >>> A = rmat(10, edge_factor=8, seed=1)
    >>> A.shape
    (1024, 1024)
    """
    scale = check_integer(scale, "scale")
    edge_factor = check_integer(edge_factor, "edge_factor")
    if not 1 <= scale <= 40:
        raise ValueError(f"scale must be in [1, 40], got {scale}")
    if edge_factor < 0:
        raise ValueError(f"edge_factor must be >= 0, got {edge_factor}")
    probabilities = _check_probabilities(probabilities)
    symmetric = check_flag(symmetric, "symmetric")
    self_loops = check_flag(self_loops, "self_loops")
    seed = check_seed(seed)
    dtype = _value_dtype(dtype)
    n = 1 << int(scale)
    n_edges = int(edge_factor) * n
    _check_fits(f"rmat(scale={scale}, edge_factor={edge_factor})",
                n_edges, 2 if symmetric else 1, nodes=n)
    rng = np.random.default_rng(seed)
    rows = np.zeros(n_edges, dtype=np.int64)
    cols = np.zeros(n_edges, dtype=np.int64)
    # Probabilities pass with a sum within rounding of 1; the last boundary is made infinite
    # so that a draw above a sum just under 1 still lands in quadrant d, not in a fifth
    # quadrant that the bit arithmetic below would read as quadrant c.
    cumulative = np.cumsum(probabilities)
    cumulative[-1] = np.inf
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
    # The library's index rule (int32 unless the size needs int64), not the int64 of the
    # coordinates built above: kernels and benchmarks should see the usual index width.
    index_dtype = get_index_dtype(maxval=max(n, rows.size))
    return csr_array((np.ones(rows.size, dtype=dtype), (rows, cols)), shape=(n, n),
                     index_dtype=index_dtype)


def planted_partition(n_communities, community_size, internal_degree=8.0, external_degree=2.0,
                      seed=0, dtype=np.float32, shuffle=False):
    """An undirected graph with planted communities (a stochastic block model).

    Every node draws about ``internal_degree / 2`` partners uniformly from its own community and
    about ``external_degree / 2`` uniformly from the whole graph; edges are symmetrized, merged
    and given weight 1, self loops dropped. Expected degree: ``internal_degree +
    external_degree`` (a little less where draws coincide).

    Parameters
    ----------
    n_communities, community_size : int
        ``n_communities * community_size`` nodes; in planted order community ``c`` holds nodes
        ``c * community_size`` to ``(c + 1) * community_size - 1``.
    internal_degree, external_degree : float, default 8.0 and 2.0
        Expected edges per node inside its community and to anywhere. A small ratio
        ``external_degree / internal_degree`` makes communities strong.
    seed : int, default 0
        Non-negative; the same seed gives the same graph.
    dtype : dtype, default float32
        Value dtype, as `rmat`'s.
    shuffle : bool, default False
        Number the nodes in a random order instead of community by community, the way real
        graphs come: this is what a reordering has to undo.

    Returns
    -------
    A : csr_array
        The adjacency, canonical.
    labels : ndarray of int64
        The community of every node.

    Raises
    ------
    MemoryError
        Before drawing, when the edges cannot fit in this machine's memory.

    Examples
    --------
    >>> from pysparse_hpc.generators import planted_partition
    >>> A, labels = planted_partition(4, 16, seed=1)
    >>> A.shape, labels[:3]
    ((64, 64), array([0, 0, 0]))
    """
    n_communities = check_integer(n_communities, "n_communities")
    community_size = check_integer(community_size, "community_size")
    if n_communities < 1 or community_size < 1:
        raise ValueError(f"n_communities and community_size must be >= 1, got {n_communities} and "
                         f"{community_size}")
    for name, degree in (("internal_degree", internal_degree),
                         ("external_degree", external_degree)):
        try:
            check_real_number(name, degree, positive=False)
        except OverflowError:   # an integer past float's range, which isfinite cannot take
            raise ValueError(f"{name} must be a finite number, got an integer of "
                             f"{degree.bit_length()} bits") from None
        if degree < 0:
            raise ValueError(f"{name} must be non-negative, got {degree}")
    shuffle = check_flag(shuffle, "shuffle")
    seed = check_seed(seed)
    dtype = _value_dtype(dtype)
    n = n_communities * community_size
    # About (internal + external) / 2 draws per node, each stored twice (symmetrized).
    _check_fits(f"planted_partition({n_communities}, {community_size}, internal_degree="
                f"{internal_degree}, external_degree={external_degree})",
                n, 1 + float(internal_degree) + float(external_degree))
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(n_communities, dtype=np.int64), community_size)
    rows, cols = [], []
    for degree, inside in ((internal_degree, True), (external_degree, False)):
        draws = rng.poisson(degree / 2, size=n)
        source = np.repeat(np.arange(n, dtype=np.int64), draws)
        if inside:
            target = labels[source] * community_size + rng.integers(0, community_size, source.size)
        else:
            target = rng.integers(0, n, source.size)
        rows.append(source)
        cols.append(target)
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    if shuffle:
        relabel = rng.permutation(n)
        rows, cols = relabel[rows], relabel[cols]
        labels = labels[np.argsort(relabel)]
    # int32 unless the node count or the number of entries before merging needs int64.
    index_dtype = get_index_dtype(maxval=max(n, 2 * rows.size))
    A = csr_array((np.ones(2 * rows.size, dtype=dtype),
                   (np.concatenate([rows, cols]), np.concatenate([cols, rows]))), shape=(n, n),
                  index_dtype=index_dtype)
    A.data[:] = 1
    return A, labels
