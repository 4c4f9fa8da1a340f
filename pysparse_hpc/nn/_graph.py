"""Graphs as the GNN layers see them: validated, converted once, with the transpose kept.

Everything built from an adjacency (its canonical CSR pattern, the transpose the backward pass
multiplies by, a copy in another dtype) is cached on the adjacency object itself, so a training
loop that passes the same graph every epoch builds each piece once. Rebinding an array of one
(``A.data = new``) or writing into one in place (its values or its pattern) drops its cache
(`cached_on`), so what is built always follows the arrays a product with it reads.
"""
import contextlib
import functools
import sys
import threading
import warnings
import weakref

import numpy as np

from .._base import sparray
from .._blocked import blocked_array
from .._csr import csr_array, read_canonical
from .._sputils import check_integer, described_sparse, get_index_dtype
from .._cy import convert as _convert
from ..kernels.cpu import diagonal as _diagonal
from ..kernels.cpu.checksum import checksum
from ..distributed.graph import DistGraph, comm_sum

__all__ = ["EdgeIndexCache", "ValuesToken", "as_graph", "cached_on", "check_graph_for",
           "checked_once", "edge_ids", "graphs_unchanged", "kept_tensor", "pattern",
           "rows_without_loop", "transpose", "values_token", "with_dtype", "with_self_loops",
           "with_unit_loops"]


_scope = threading.local()


@contextlib.contextmanager
def graphs_unchanged():
    """Inside, each array's checksum is taken once (`cached_on`): for one call of the
    library's own code, during which no graph is written (a layer's forward, a backward),
    where several lookups read the same graph. Nested uses share the outermost."""
    if getattr(_scope, "sums", None) is not None:
        yield
        return
    _scope.sums = {}
    try:
        yield
    finally:
        _scope.sums = None


def checked_once(function):
    """``function`` run inside `graphs_unchanged`."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        with graphs_unchanged():
            return function(*args, **kwargs)
    return run


def _checksum(array):
    sums = getattr(_scope, "sums", None)
    if sums is None:
        return checksum(array)
    # By identity, the array kept alive meanwhile so that its id is not reused.
    kept = sums.get(id(array))
    if kept is None or kept[0] is not array:
        kept = sums[id(array)] = (array, checksum(array))
    return kept[1]


def cached_on(owner, key, build, collective=False):
    """``build()`` once per ``key``, kept on ``owner`` (a sparse array or a `DistGraph`) while
    ``owner`` holds the same array objects with the same contents: rebinding one (``A.data =
    new``, ``graph.local = new``) or writing into one in place (``A.data *= 2``,
    ``graph.local.data *= 2``, ``A.indices[k] = j``; noticed by a checksum of the arrays, one
    pass over them per call) drops everything built.

    ``collective=True`` (a call every rank makes, for what depends on every rank's values or
    is built by communicating: a `DistGraph`'s normalization) makes the ranks agree, in one
    allreduce, to build again when any of them has to: a rank whose values did not change
    would otherwise keep a result built from its peers' old values, or leave them waiting
    in the build's exchanges."""
    arrays = _tracked_arrays(owner)
    # The index arrays too: a kept transpose of an edited pattern would give the gradient of
    # another product, where scipy's products simply read the new pattern.
    values = tuple(_checksum(array) for array in arrays if isinstance(array, np.ndarray))
    cache = owner.__dict__.get("_nn_cache")
    if cache is None or len(cache["arrays"]) != len(arrays) or any(
            old is not new for old, new in zip(cache["arrays"], arrays)) \
            or cache["values"] != values:
        cache = owner.__dict__["_nn_cache"] = {"arrays": arrays, "values": values, "built": {}}
    built = cache["built"]
    if collective and isinstance(owner, DistGraph) and owner.comm.size > 1:
        if comm_sum(owner.comm, int(key not in built), "cache check"):
            built.pop(key, None)
    if key not in built:
        built[key] = build()
    return built[key]


def _tracked_arrays(owner):
    """The objects whose identity (and, for arrays, contents) a cache on ``owner``
    follows: a sparse array's NumPy arrays; a `DistGraph`'s local matrix and its arrays (the
    graph's values live there)."""
    if isinstance(owner, DistGraph):
        return [owner.local] + _tracked_arrays(owner.local)
    return [value for value in owner.__dict__.values() if isinstance(value, np.ndarray)]


def kept_tensor(build):
    """``build`` of a tensor kept on a graph, made outside inference mode even when called
    there: a later training step saves it for backward, which an inference tensor cannot be."""
    def run():
        with sys.modules["torch"].inference_mode(False):
            return build()
    return run


def values_token(adj):
    """An object that stands for ``adj``'s current arrays and their contents: the same one
    while they stay the same, a new one once an array is rebound or written into in place
    (`cached_on`). On a `DistGraph`, a collective call: every rank gets a new one when any
    rank's arrays changed, so what is decided by it (recomputing a product) is decided alike."""
    return cached_on(adj, "values_token", ValuesToken, collective=True)


class ValuesToken:
    """What `values_token` returns: only its identity means anything (weakly referable, so
    keys holding it do not keep it alive)."""

    __slots__ = ("__weakref__",)

    def __reduce__(self):
        # A fresh token (only identity means anything); pickle's protocols 0 and 1 cannot
        # copy a class with slots otherwise.
        return ValuesToken, ()


def pattern(adj):
    """The canonical CSR form of ``adj`` (sorted, no duplicates): per-edge values, attention
    scores and SDDMM results are aligned with its storage order. A `DistGraph` is its own
    pattern (its local matrix is canonical)."""
    if isinstance(adj, DistGraph):
        return adj
    # A csr_array's canonical flag is set once and kept: writing into its index arrays in
    # place (followed by the caches here) leaves it stale, so it is read from the arrays,
    # once per content.
    if isinstance(adj, csr_array) and cached_on(adj, "canonical", lambda: read_canonical(adj)):
        return adj

    def build():
        csr = adj.tocsr()
        if read_canonical(csr):
            return csr
        # A fresh array over the same arrays reads their order itself, whatever flag csr has
        fresh = csr_array((csr.data, csr.indices, csr.indptr), shape=csr.shape)
        return fresh.canonical()
    return cached_on(adj, "pattern", build)


def with_dtype(adj, dtype):
    """``adj`` with values in ``dtype`` (a NumPy float dtype); the cast is made once."""
    dtype = np.dtype(dtype)
    if adj.dtype == dtype:
        return adj
    return cached_on(adj, ("astype", dtype.name), lambda: adj.astype(dtype))


class Transpose:
    """The transpose of a canonical CSR pattern and where its entries come from.

    Attributes
    ----------
    matrix : csr_array
        ``A.T`` with A's values (A itself when A is symmetric, values included).
    order : numpy.ndarray of int64
        ``matrix`` stores A's entry ``order[q]`` at position q, so per-edge values ``v``
        (aligned with A) become ``v[order]`` for the transpose.
    symmetric : bool
    """

    def __init__(self, matrix, order, symmetric):
        self.matrix, self.order, self.symmetric = matrix, order, symmetric
        self._torch_order = {}

    def torch_order(self, device):
        """``order`` as a torch index tensor on ``device`` (made once per device)."""
        key = str(device)
        if key not in self._torch_order:
            torch = sys.modules["torch"]
            self._torch_order[key] = kept_tensor(
                lambda: torch.from_numpy(self.order).to(device))()
        return self._torch_order[key]


def transpose(adj):
    """The `Transpose` of ``pattern(adj)``, built once and kept on ``adj``."""
    csr = pattern(adj)

    def build():
        # The counting-sort transpose moves values without arithmetic, so entry numbers sent
        # through it as float64 (exact below 2**53) come back as the permutation.
        positions = np.arange(csr.nnz, dtype=np.float64)
        indptr, indices, moved = _convert.csr_transpose(csr.shape[1], csr.indptr, csr.indices,
                                                        positions)
        order = moved.astype(np.int64)
        symmetric = (csr.shape[0] == csr.shape[1] and np.array_equal(indptr, csr.indptr)
                     and np.array_equal(indices, csr.indices)
                     and np.array_equal(csr.data[order], csr.data))
        if symmetric:
            return Transpose(csr, order, True)
        matrix = csr_array.__new__(csr_array)
        matrix._set_arrays(csr.data[order], indices, indptr, (csr.shape[1], csr.shape[0]), True)
        return Transpose(matrix, order, False)
    return cached_on(csr, "transpose", build)


def transposed_like(adj):
    """``adj.T`` in ``adj``'s own format (a blocked ``adj`` gets a blocked transpose)."""
    def build():
        matrix = transpose(adj).matrix
        if isinstance(adj, blocked_array):
            return matrix.to_blocked(adj.window, adj.block_width)
        return matrix
    if isinstance(adj, blocked_array):
        return cached_on(adj, "transposed_like", build)
    return build()


def _torch():
    return sys.modules["torch"]


def _check_not_torch_sparse(adj):
    """A torch sparse adjacency would otherwise fail the edge_index checks with a message
    about its dtype, which does not say what to pass instead."""
    torch = _torch()
    if adj.layout != torch.strided:
        raise TypeError(f"adj is a torch sparse tensor (layout {adj.layout}), which the layers "
                        "do not take: convert it with pysparse_hpc.csr_array(adj), its values "
                        "kept (A[i, j] weighs the edge j -> i), or pass the edge_index "
                        "adj.to_sparse_coo().coalesce().indices().flip(0)")


def _from_edge_index(edge_index, num_nodes):
    """A CSR adjacency with ``A[i, j] = 1`` for every edge ``j -> i`` (PyG's source-to-target
    flow: ``edge_index[0]`` holds sources, ``edge_index[1]`` targets). Repeated edges add up."""
    torch = _torch()
    _check_not_torch_sparse(edge_index)
    if (edge_index.is_floating_point() and edge_index.ndim == 2
            and edge_index.shape[0] == edge_index.shape[1] != 2):
        # A dense adjacency matrix read as an edge_index was told only its dtype.
        raise TypeError(f"adj is a dense {tuple(edge_index.shape)} {edge_index.dtype} tensor, "
                        f"which the layers do not take: pass a sparse array "
                        f"(pysparse_hpc.csr_array(A) of the dense matrix) or a [2, E] "
                        f"edge_index of int64 node ids")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"edge_index must hold int64 or int32 node ids, got {edge_index.dtype}")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if num_nodes is None:
        raise ValueError("an edge_index needs num_nodes (the number of rows of x)")
    if edge_index.device.type == "meta":   # torch's own error named no edge_index
        raise ValueError("edge_index is on the 'meta' device and holds no node ids; pass a "
                         "CPU or CUDA tensor")
    ids = edge_index.detach().cpu().numpy()
    if ids.size:
        low, high = int(ids.min()), int(ids.max())
        if low < 0:
            raise ValueError(f"edge_index holds a negative node id ({low})")
        if high >= num_nodes:
            raise ValueError(f"edge_index holds node id {high}, out of range for "
                             f"num_nodes={num_nodes}")
    sources, targets = ids[0], ids[1]
    values = np.ones(sources.size, dtype=np.float32)
    # int32 indices where they fit, as scipy's and the bundled graphs' (an edge_index is
    # int64): the SpMM then reads half the index bytes.
    index_dtype = get_index_dtype(maxval=max(num_nodes, sources.size))
    adj = csr_array((values, (targets, sources)), shape=(num_nodes, num_nodes),
                    index_dtype=index_dtype).canonical()
    #: Edges listed more than once (beyond their first copy), for `warn_if_repeated_edges`;
    #: of them, the copies of self-loops.
    adj.repeated_edges = sources.size - adj.nnz
    loops = sources[sources == targets]
    adj.repeated_loops = loops.size - np.unique(loops).size
    return adj


def warn_if_repeated_edges(graph, layer, loops_replaced=False):
    """An attention layer reads the graph's pattern, where an edge listed twice in an
    edge_index is one edge; PyG's attention counts every copy. Say so, at the user's line
    that called the layer (shown once per line and message by Python's default filter).

    ``loops_replaced``: the layer adds self-loops, where PyG's removes every listed one and
    adds one per node, so repeated self-loops count once there too and are no difference."""
    from ._checks import user_stacklevel   # imports torch, which this module leaves out
    repeated = getattr(graph, "repeated_edges", 0)
    if loops_replaced:
        repeated -= getattr(graph, "repeated_loops", 0)
    if repeated:
        warnings.warn(f"{layer}: the edge_index repeats edges ({repeated} copies beyond the "
                      "first of each); attention counts each edge once (PyG counts every "
                      "copy): coalesce the edge_index (torch_geometric.utils.coalesce) for "
                      "the same result", RuntimeWarning, stacklevel=user_stacklevel())


class EdgeIndexCache:
    """Remembers the CSR adjacency built from the last ``edge_index`` tensor seen.

    The tensor is held weakly and its version counter recorded, so modifying it in place or
    passing another tensor rebuilds the adjacency, and nothing keeps the tensor alive. A
    checksum of a CPU tensor's contents is compared too: writes the version counter does not
    count (into a NumPy array sharing its memory, as ``torch.from_numpy`` gives, or through
    ``.data``) rebuild it as well. A tensor made under ``torch.inference_mode()`` has no
    version counter: it is converted on every call. Nothing of the cache is pickled or copied.
    """

    def __init__(self):
        # One tuple (tensor reference, version, num_nodes, shape, checksum, adjacency),
        # replaced whole and read once per call: a layer called from several threads at once
        # (a thread pool serving a model) would otherwise match one tensor's key and return
        # the adjacency another thread stored meanwhile (the checksum releases the GIL).
        self._entry = None

    def __reduce__(self):
        # A fresh, empty one: an empty state would not do, pickle's protocols 0 and 1 skip
        # __setstate__ for it and left the copy without its attributes.
        return type(self), ()

    @staticmethod
    def _checksum(edge_index):
        # 2 x E integers, a small part of the conversion this saves (a device tensor would
        # have to come to the host for it: there only the version counter is followed).
        if edge_index.device.type != "cpu":
            return None
        return checksum(edge_index.detach().numpy())

    def get(self, edge_index, num_nodes):
        if edge_index.is_inference():
            return _from_edge_index(edge_index, num_nodes)
        key = (edge_index._version, num_nodes, tuple(edge_index.shape))
        entry = self._entry
        if (entry is not None and entry[0]() is edge_index and entry[1:4] == key
                and entry[4] == self._checksum(edge_index)):
            return entry[5]
        contents = self._checksum(edge_index)
        adj = _from_edge_index(edge_index, num_nodes)
        self._entry = (weakref.ref(edge_index),) + key + (contents, adj)
        return adj


def edge_ids(csr):
    """``row * n_columns + column`` of every stored entry of a canonical CSR pattern (for a
    `DistGraph`, in global node ids): keys that name an edge whatever rank holds it. Made once
    and kept on the pattern."""
    def build():
        if isinstance(csr, DistGraph):
            local = csr.local
            rows = np.repeat(csr.owned, np.diff(local.indptr))
            return rows * csr.shape[1] + csr.column_ids[local.indices]
        rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), np.diff(csr.indptr))
        return rows * csr.shape[1] + csr.indices.astype(np.int64)
    return cached_on(csr, "edge_ids", build)


def as_graph(adj, num_nodes=None, edge_cache=None, default_num_nodes=None):
    """A pysparse_hpc sparse array for ``adj``: a sparse array is returned as it is; a torch
    ``[2, E]`` edge_index is converted (through ``edge_cache`` when given, so once) with
    ``num_nodes`` nodes, else ``default_num_nodes`` (a layer's number of input rows)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(num_nodes, torch.Tensor) and num_nodes.ndim >= 1:
        # PyG's layers take edge weights (GCNConv) or attributes (GATConv) third: a port
        # of such a call would otherwise be told only that num_nodes is not an integer.
        raise TypeError(f"num_nodes must be an integer, got a tensor of shape "
                        f"{list(num_nodes.shape)}: the layers take no "
                        "per-edge weights or attributes argument (PyG's edge_weight): put the "
                        "weights in a sparse array, pysparse_hpc.csr_array((weight, "
                        "(edge_index[1], edge_index[0])), shape=(n, n)), and pass it as adj")
    if num_nodes is not None:
        num_nodes = check_integer(num_nodes, "num_nodes")
        if num_nodes < 0:
            raise ValueError(f"num_nodes must be non-negative, got {num_nodes}")
    if isinstance(adj, DistGraph):
        if num_nodes is not None and adj.n_local != num_nodes:
            raise ValueError(f"rank {adj.comm.rank} owns {adj.n_local} nodes of the distributed "
                             f"graph but num_nodes={num_nodes}")
        return adj
    if isinstance(adj, sparray):
        if num_nodes is not None and adj.shape[0] != num_nodes:
            raise ValueError(f"adj has {adj.shape[0]} rows but num_nodes={num_nodes}")
        return adj
    if torch is not None and isinstance(adj, torch.Tensor):
        _check_not_torch_sparse(adj)
        num_nodes = default_num_nodes if num_nodes is None else num_nodes
        if edge_cache is not None:
            return edge_cache.get(adj, num_nodes)
        return _from_edge_index(adj, num_nodes)
    raise TypeError("adj must be a pysparse_hpc sparse array or a [2, E] edge_index tensor, got "
                    f"{described_sparse(adj)}")


def check_graph_for(adj, x, name="x"):
    """A layer's adjacency must be square and have one row per row of ``x`` (for a `DistGraph`,
    one per owned node)."""
    if isinstance(adj, DistGraph):
        if x.shape[0] != adj.n_local:
            raise ValueError(f"{name} has {x.shape[0]} rows but rank {adj.comm.rank} owns "
                             f"{adj.n_local} nodes of the distributed graph (pass the owned rows:"
                             " graph.local_rows(x) or graph.scatter_rows(x))")
        return
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"adj must be square (nodes x nodes), got shape {adj.shape}")
    if x.shape[0] != adj.shape[0]:
        raise ValueError(f"adj has {adj.shape[0]} nodes but {name} has {x.shape[0]} rows")


def with_self_loops(adj):
    """``pattern(adj)`` with a stored diagonal: existing diagonal entries keep their values,
    missing ones are added with value 1 (what attention layers need: every node attends to
    itself). Built once and kept on ``adj``; a `DistGraph` gets them in its local matrix (a
    collective call)."""
    if isinstance(adj, DistGraph):
        return cached_on(adj, "with_self_loops", lambda: adj.with_local(
            _with_diagonal(adj.local, adj.n_local)), collective=True)
    return _with_diagonal(pattern(adj), adj.shape[0])


def rows_without_loop(indptr, indices, n_diagonal):
    """A uint8 mask of the rows ``i < n_diagonal`` of a canonical CSR matrix that store no
    ``(i, i)``: where a self-loop is added (PyG's ``add_remaining_self_loops``)."""
    missing = np.empty(n_diagonal, dtype=np.uint8)
    _diagonal.missing_diagonal(indptr, indices, missing)
    return missing


def with_unit_loops(indptr, indices, data, shape, missing, dtype, sums=None):
    """New ``(indptr, indices, data)`` of a canonical CSR matrix of ``shape`` with ``(i, i) = 1``
    inserted in the rows that `rows_without_loop` marks in ``missing``, the values in ``dtype``.
    The index dtype is kept unless the entries outgrow it (scipy's rule). ``sums`` (float64,
    one per row), where given, gets each new row's sum."""
    added = np.cumsum(missing, dtype=np.int64)
    n_added = int(added[-1]) if added.size else 0
    n_entries = indices.size + n_added
    index_dtype = get_index_dtype((indices,), maxval=max(shape + (n_entries,)))
    new_indptr = indptr.astype(np.int64)
    new_indptr[1:added.size + 1] += added
    new_indptr[added.size + 1:] += n_added
    new_indptr = new_indptr.astype(index_dtype, copy=False)
    new_indices = np.empty(n_entries, dtype=index_dtype)
    new_data = np.empty(n_entries, dtype=dtype)
    written, one = new_data, np.ones(1, dtype=dtype)
    if data.dtype == np.float16 and new_data.dtype == np.float16:
        # The same bits either way; Numba's kernels take no float16, so they move them as
        # integers (no sums are asked of them).
        data, written, one = (array.view(np.uint16) for array in (data, new_data, one))
    elif data.dtype == np.float16:
        data = data.astype(np.float32)
    _diagonal.insert_diagonal(indptr, indices, data, new_indptr, new_indices, written, one[0],
                              np.empty(0) if sums is None else sums)
    return new_indptr, new_indices, new_data


def _with_diagonal(csr, n_diagonal):
    """``csr`` (canonical) with stored entries (i, i) for i < n_diagonal, added as 1 where
    missing; kept on ``csr``."""

    def build():
        missing = rows_without_loop(csr.indptr, csr.indices, n_diagonal)
        if not missing.any():
            return csr
        indptr, indices, data = with_unit_loops(csr.indptr, csr.indices, csr.data, csr.shape,
                                                missing, csr.dtype)
        result = csr_array((data, indices, indptr), shape=csr.shape)
        result.has_canonical_format = True
        return result
    return cached_on(csr, "with_self_loops", build)
