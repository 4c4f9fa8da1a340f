"""Graph normalization for GCN: ``D^-1/2 (A + I) D^-1/2``, self-loops added where missing."""
import warnings

import numpy as np
import scipy.sparse

from .._csr import csr_array
from .._sputils import as_numpy_dtype, get_index_dtype
from ..distributed.graph import DistGraph
from ._checks import check_flag, user_stacklevel
from ._graph import as_graph, cached_on, nodes_without_loop

__all__ = ["gcn_norm"]


def gcn_norm(adj, add_self_loops=True, num_nodes=None, dtype=None):
    """Kipf and Welling's symmetric normalization ``D^-1/2 (A + I) D^-1/2``.

    As PyG's ``gcn_norm``, the identity is added where ``A`` has no stored diagonal entry: a
    node that already has a self-loop keeps its weight (``add_remaining_self_loops``), so a
    graph whose loops are stored reads the same as one whose loops are added.

    Parameters
    ----------
    adj : sparse array, DistGraph or torch.Tensor
        A square pysparse_hpc sparse array, a `DistGraph` (the degrees of halo nodes come from
        their owners in one halo exchange; a collective call, made once per graph), or a
        ``[2, E]`` edge_index (source, target) with ``num_nodes``. Row i holds the edges into
        node i (PyG's source-to-target flow).
    add_self_loops : bool
        Add a self-loop of weight 1 to every node without a stored diagonal entry.
    num_nodes : int, optional
        Needed with an edge_index.
    dtype : {None, float32, float64}
        The values' dtype (a NumPy dtype, its name, or torch's float32 or float64). None:
        float32 unless ``adj`` holds float64. The degrees and scales are computed in float64
        either way, so float64 gives the normalization of an unweighted or float32 graph
        without a float32 rounding (what float64 features need).

    Returns
    -------
    csr_array or DistGraph
        Canonical. ``D`` is the row sums of ``A`` with its loops; rows that sum to 0 (isolated nodes
        without self-loops) stay zero, and so do rows whose sum is negative (possible with
        negative weights), with a ``RuntimeWarning``. A NaN weight makes its row's sum NaN,
        and the row and column of that node NaN, as the formula (and PyG) does.

    Examples
    --------
    >>> import numpy as np, pysparse_hpc as sph
    >>> A = sph.csr_array(np.array([[0.0, 1.0], [1.0, 0.0]]))
    >>> sph.nn.gcn_norm(A).toarray()
    array([[0.5, 0.5],
           [0.5, 0.5]])
    """
    # A string such as "False" is truthy and would silently ask for the opposite.
    add_self_loops = check_flag(add_self_loops, "add_self_loops")
    adj = as_graph(adj, num_nodes)
    dtype = _values_dtype(adj, dtype)
    if isinstance(adj, DistGraph):
        return cached_on(adj, ("gcn_norm", add_self_loops, dtype),
                         lambda: _gcn_norm_distributed(adj, add_self_loops, dtype),
                         collective=True)
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"adj must be square, got shape {adj.shape}")
    matrix = scipy.sparse.csr_array(adj.tocsr().to_scipy().astype(np.float64))
    matrix.sum_duplicates()
    if add_self_loops:
        rows, cols = _coordinates(matrix.indptr, matrix.indices)
        # In A's index dtype: scipy keeps int64 coordinates' dtype, and the SpMM would then
        # read twice the index bytes of A's int32.
        missing = nodes_without_loop(rows, cols, adj.shape[0]).astype(matrix.indices.dtype)
        if missing.size:
            # The loops join A's entries as coordinates: scipy's sum A + I drops the entries
            # that are 0, and an edge stored with weight 0 must stay, as in PyG (0 * inf is
            # NaN) and in the DistGraph's normalization.
            matrix = scipy.sparse.csr_array(scipy.sparse.coo_array(
                (np.concatenate([matrix.data, np.ones(missing.size)]),
                 (np.concatenate([rows.astype(missing.dtype), missing]),
                  np.concatenate([cols, missing]))), shape=matrix.shape))
            matrix.sum_duplicates()
        del rows, cols
    degree = np.asarray(matrix.sum(axis=1)).ravel()
    _warn_if_negative(degree)
    scale = _inverse_sqrt(degree)
    # In place, a factor at a time: the int64 row of every entry and the product of both
    # gathers doubled the peak over PyG's.
    matrix.data *= np.repeat(scale, np.diff(matrix.indptr))
    matrix.data *= scale[matrix.indices]
    return csr_array(matrix.astype(dtype, copy=False))


def _inverse_sqrt(degree):
    """``D^-1/2``: ``degree ** -0.5`` where the degree is positive, 0 where it is 0 or negative
    (no real root: `_warn_if_negative`), and NaN where it is NaN. A NaN weight then reaches
    every entry of its node's row and column, as in the dense formula and PyG; zeroing the
    scale as for a negative degree hid it from the neighbors, whose outputs came out finite
    and wrong."""
    positive = degree > 0
    scale = np.where(positive, 1.0 / np.sqrt(np.where(positive, degree, 1.0)), 0.0)
    scale[np.isnan(degree)] = np.nan
    return scale


def _coordinates(indptr, indices):
    return np.repeat(np.arange(indptr.size - 1), np.diff(indptr)), indices


def _warn_if_negative(degree):
    negative = np.flatnonzero(degree < 0)
    if negative.size:
        warnings.warn(f"gcn_norm: {negative.size} rows of A + I sum to a negative degree (the "
                      f"first: row {negative[0]}, {degree[negative[0]]:g}); D^-1/2 is not real "
                      f"there, and their rows and columns are set to zero", RuntimeWarning,
                      # at the user's line, also when reached through a layer or a DistGraph's
                      # cached build (a fixed level pointed into the library there)
                      stacklevel=user_stacklevel())


def _values_dtype(adj, dtype):
    if dtype is None:
        held = adj.local.dtype if isinstance(adj, DistGraph) else adj.dtype
        return np.dtype(np.float64 if held == np.float64 else np.float32)
    try:
        chosen = as_numpy_dtype(dtype)   # torch's float32 / float64 too
    except TypeError:
        chosen = None
    if chosen not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return chosen


def _gcn_norm_distributed(graph, add_self_loops, dtype):
    """`gcn_norm` of a `DistGraph`: a row's degree is known to its owner (rows are whole on
    one rank); the halo columns' degrees travel in one halo exchange."""
    if hasattr(graph.comm, "check_alike"):
        # Every rank builds when any must: another dtype or loop rule on one rank would
        # normalize its rows otherwise, silently.
        graph.comm.check_alike((("add_self_loops", add_self_loops),
                                ("dtype", np.dtype(dtype).name)),
                               "gcn_norm was called with other arguments on different ranks",
                               "pass the same add_self_loops and dtype on every rank")
    local = graph.local
    rows, cols, data = local.tocoo()
    data = data.astype(np.float64)
    if add_self_loops:
        # owned node i is local column i; halo columns come after the owned ones
        missing = nodes_without_loop(rows, cols, graph.n_local)
        rows, cols = np.concatenate([rows, missing]), np.concatenate([cols, missing])
        data = np.concatenate([data, np.ones(missing.size)])
    # The local matrix's index dtype (int32 where it fits), not the int64 of the coordinates.
    index_dtype = get_index_dtype((local.indices,), maxval=max(local.shape + (rows.size,)))
    matrix = csr_array((data, (rows, cols)), shape=local.shape,
                       index_dtype=index_dtype).canonical()
    degree = np.bincount(np.repeat(np.arange(graph.n_local), np.diff(matrix.indptr)),
                         weights=matrix.data, minlength=graph.n_local)
    _warn_if_negative(degree)
    degree = np.concatenate([degree, graph.halo_exchange(np.ascontiguousarray(degree))])
    scale = _inverse_sqrt(degree)
    entry_rows = np.repeat(np.arange(graph.n_local), np.diff(matrix.indptr))
    values = matrix.data * scale[entry_rows] * scale[matrix.indices]
    normalized = csr_array((values.astype(dtype), matrix.indices, matrix.indptr),
                           shape=local.shape)
    normalized.has_canonical_format = True
    return graph.with_local(normalized)
