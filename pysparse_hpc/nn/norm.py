"""Graph normalization for GCN: ``D^-1/2 (A + I) D^-1/2``, self-loops added where missing."""
import warnings

import numpy as np

from .._csr import csr_array, read_canonical
from ..distributed.graph import DistGraph
from ..kernels.cpu import diagonal as _diagonal
from ._checks import check_flag, float_dtype, user_stacklevel
from ._graph import as_graph, cached_on, rows_without_loop, with_unit_loops

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
    indptr, indices, data = _canonical_arrays(adj.tocsr())
    n_nodes = adj.shape[0]
    missing = rows_without_loop(indptr, indices, n_nodes if add_self_loops else 0)
    # One new copy with the loops inserted at their place, its rows summed on the way:
    # appending the loops as coordinates and sorting again took twice PyG's peak memory. An
    # edge stored with weight 0 stays, as in PyG (0 * inf is NaN) and in the DistGraph's
    # normalization, where scipy's sum A + I would drop it.
    degree = np.empty(n_nodes)
    indptr, indices, data = with_unit_loops(indptr, indices, data, adj.shape, missing,
                                            _working_dtype(data, dtype), degree)
    _warn_if_negative(degree)
    _diagonal.scale_symmetric(indptr, indices, data, _inverse_sqrt(degree))
    normalized = csr_array((data.astype(dtype, copy=False), indices, indptr), shape=adj.shape)
    normalized.has_canonical_format = True
    return normalized


def _working_dtype(data, dtype):
    """The dtype the normalization writes its values in: ``dtype`` where neither it nor the
    values are float64. The degrees and scales are float64 and each value is rounded once,
    so a float32 copy gives the bits of a float64 one rounded at the end."""
    return np.dtype(np.float64 if np.float64 in (data.dtype, dtype) else np.float32)


def _canonical_arrays(csr):
    """``(indptr, indices, data)`` of ``csr`` summed and sorted where it is not canonical
    (duplicates summed in float64, as the degrees are)."""
    if read_canonical(csr):
        return csr.indptr, csr.indices, csr.data
    merged = csr_array((csr.data.astype(np.float64), csr.indices.copy(), csr.indptr.copy()),
                       shape=csr.shape)
    merged.sum_duplicates()
    return merged.indptr, merged.indices, merged.data


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
    return float_dtype(dtype)   # torch's float32 / float64 too


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
    indptr, indices, data = _canonical_arrays(local)
    # owned node i is local column i; halo columns come after the owned ones
    missing = rows_without_loop(indptr, indices, graph.n_local if add_self_loops else 0)
    degree = np.empty(graph.n_local)
    indptr, indices, data = with_unit_loops(indptr, indices, data, local.shape, missing,
                                            _working_dtype(data, dtype), degree)
    _warn_if_negative(degree)
    degree = np.concatenate([degree, graph.halo_exchange(degree)])
    _diagonal.scale_symmetric(indptr, indices, data, _inverse_sqrt(degree))
    normalized = csr_array((data.astype(dtype, copy=False), indices, indptr), shape=local.shape)
    normalized.has_canonical_format = True
    return graph.with_local(normalized)
