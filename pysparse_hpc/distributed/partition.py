"""Row partitions of a graph for distributed training, and what they cost in communication.

A 1D row partition gives every node (a row of the adjacency and of the node features) one owner
rank. Rank ``p`` computes the rows it owns and receives, per exchange, the rows of the nodes
its rows reference but other ranks own: its halo. This module owns the partitioners
(`partition`: METIS through the optional ``pymetis``, with one or two balance constraints,
contiguous blocks balanced by stored entries, and balanced random) and `Partition`, which holds
the owner of every node and the figures that decide the cost of a distributed layer: edge cut,
halo sizes and communication volume, peers (messages per exchange) and load balance, beside the
volume that CAGNET's 1D algorithm (every rank receives all of H) would move. The communication
plan itself is built elsewhere, from a `Partition`.

Convention: row ``i`` of the adjacency holds the edges into node ``i``; a stored entry
``(i, j)`` means that whoever owns ``i`` needs the row of node ``j``. Only the pattern matters
(values, explicit zeros and duplicates are not inspected, except that duplicates count as
stored entries in `Partition.owned_nnz` and `Partition.edge_cut`).
"""
import hashlib
from typing import NamedTuple

import numpy as np
import scipy.sparse

from .._base import sparray
from .._csr import csr_array
from .._sputils import as_index_array, check_integer
from .._reorder import _symmetric_graph
from ._metis import import_pymetis, part_graph

__all__ = ["PARTITION_METHODS", "Partition", "partition"]

#: Names `partition` accepts.
PARTITION_METHODS = ("metis", "contiguous", "random")

_MAX_SEED = 2**63
#: The most parts: one per rank, and an MPI communicator's size is a C int. Every figure holds
#: arrays of ``nparts`` entries, so a larger count (a garbage owner array's largest entry, say)
#: would only fail to allocate terabytes.
_MAX_PARTS = 2**31 - 1


# -- validation -----------------------------------------------------------------------------

def _as_pattern(adj):
    """``(indptr, indices, n)`` of square sparse ``adj``; the arrays are the input's own."""
    if isinstance(adj, sparray):
        csr = adj.tocsr()
        # The arrays can be rewritten in place after construction (or shared with scipy,
        # whose eliminate_zeros shortens them): a column out of range or an indptr past the
        # indices crashed METIS and gave NumPy's IndexError, or a silent figure, elsewhere.
        csr._check_arrays(full_check=True, problem="adj is not a valid sparse matrix")
    elif scipy.sparse.issparse(adj):
        if adj.ndim != 2:
            raise ValueError(f"adj must be 2-D, got {adj.ndim}-D with shape {adj.shape}")
        if adj.format == "coo":
            return _coo_pattern(adj)
        # scipy builds a compressed matrix from raw arrays without checking its indices, and
        # its own conversions trust them (tocsr writes out of bounds for a CSC row index out
        # of range), as do the pattern's kernels. Checked before any conversion; O(nnz), as
        # reading the pattern is.
        if adj.format in ("csr", "csc", "bsr"):
            try:
                adj.check_format(full_check=True)
            except ValueError as exc:
                raise ValueError(f"adj is not a valid sparse matrix: {exc}") from None
        csr = adj.tocsr()
    else:
        raise TypeError(
            f"adj must be a sparse array (pysparse_hpc or scipy.sparse), got "
            f"{type(adj).__module__}.{type(adj).__qualname__}")
    n_rows, n_cols = (int(size) for size in csr.shape)
    if n_rows != n_cols:
        raise ValueError(
            f"partitioning needs a square adjacency (a graph), got shape ({n_rows}, {n_cols})")
    return np.asarray(csr.indptr), np.asarray(csr.indices), n_rows


def _coo_pattern(coo):
    """`_as_pattern` of a scipy COO array, its duplicates kept as stored entries (scipy's
    ``tocsr`` would sum them, and the figures would differ from the CSR of the same
    entries)."""
    n_rows, n_cols = (int(size) for size in coo.shape)
    if n_rows != n_cols:
        raise ValueError(
            f"partitioning needs a square adjacency (a graph), got shape ({n_rows}, {n_cols})")
    # scipy lets coords be replaced without a check: index arrays shorter than the others
    # paired the wrong rows and columns, and float ones were truncated, both silently.
    try:
        coo.nnz
    except ValueError as exc:
        raise ValueError(f"adj is not a valid sparse matrix: {exc}") from None
    for name, ids in (("row", coo.row), ("column", coo.col)):
        if np.asarray(ids).dtype.kind not in "iu":
            raise ValueError(f"adj is not a valid sparse matrix: its {name} indices have dtype "
                             f"{np.asarray(ids).dtype}; expected integers")
    rows, cols = np.asarray(coo.row, dtype=np.int64), np.asarray(coo.col, dtype=np.int64)
    for name, ids in (("row", rows), ("column", cols)):
        if ids.size and (ids.min() < 0 or ids.max() >= n_rows):
            raise ValueError(f"adj is not a valid sparse matrix: a {name} index is outside "
                             f"[0, {n_rows})")
    order = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))])
    return indptr.astype(np.int64), cols[order], n_rows


_DIGEST_CHUNK = 1 << 20   # entries hashed at a time: the int64 keys of a chunk, not the graph


def graph_digest(indptr, indices, n):
    """A SHA-256 of the set of stored entries ``(i, j)`` of a CSR pattern: the same for any
    storage of one graph (unsorted, with duplicates, int32 or int64 indices).

    The sorted unique keys ``i * n + j`` are hashed. A canonical pattern (the common case)
    already lists them in order and is hashed chunk by chunk, with no array of the graph's
    size made; any other is sorted whole first."""
    indptr = np.asarray(indptr, dtype=np.int64)
    digest = hashlib.sha256(np.int64(n).tobytes())
    last_key = -1
    for first, stop in _entry_chunks(indptr, _DIGEST_CHUNK):
        keys = _entry_keys(indptr, indices, n, first, stop)
        if keys.size and (keys[0] <= last_key or not bool((keys[1:] > keys[:-1]).all())):
            keys = np.unique(_entry_keys(indptr, indices, n, 0, n))
            digest = hashlib.sha256(np.int64(n).tobytes())
            digest.update(keys.view(np.uint8).data)
            return digest.hexdigest()
        digest.update(keys.view(np.uint8).data)
        last_key = keys[-1] if keys.size else last_key
    return digest.hexdigest()


def _entry_chunks(indptr, entries):
    """``(first_row, stop_row)`` ranges of about ``entries`` stored entries each (a longer
    row is a chunk of its own)."""
    n = indptr.size - 1
    first = 0
    while first < n:
        stop = int(np.searchsorted(indptr, indptr[first] + entries, side="right")) - 1
        stop = min(max(stop, first + 1), n)
        yield first, stop
        first = stop


def _entry_keys(indptr, indices, n, first, stop):
    """``i * n + j`` of the entries of rows ``first`` to ``stop - 1``, as int64."""
    rows = np.repeat(np.arange(first, stop, dtype=np.int64), np.diff(indptr[first:stop + 1]))
    return rows * max(n, 1) + np.asarray(indices[indptr[first]:indptr[stop]], dtype=np.int64)


def _check_nparts(nparts):
    # A float or a string is a wrong type (TypeError, as everywhere in the library), whose
    # message says what is expected.
    try:
        nparts = check_integer(nparts, "nparts")
    except TypeError as exc:
        raise TypeError(f"{exc}; expected a positive integer") from None
    if nparts < 1:
        raise ValueError(f"nparts must be a positive integer, got {nparts}")
    if nparts > _MAX_PARTS:
        raise ValueError(f"nparts must be at most 2**31 - 1 (the largest number of MPI "
                         f"ranks), got {nparts}")
    return nparts


def _check_seed(seed):
    seed = check_integer(seed, "seed")
    if not 0 <= seed < _MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    return seed


def _check_owner(owner, n, nparts, name="owner", parts="nparts"):
    """``(owner, nparts)``: owner as a fresh int64 array after checking it against the graph.

    ``name`` is the argument as the caller's user knows it, ``parts`` what ``nparts`` is to
    them (`DistGraph` checks its ``partition`` against the communicator's size)."""
    array = as_index_array(owner, name)
    if array.size != n:
        raise ValueError(
            f"partition has {array.size} owners but the graph has {n} nodes; expected one owner "
            "per node")
    if nparts is None and n and array.max() >= _MAX_PARTS:
        # The default nparts would be beyond any communicator (or int64, for uint64 owners).
        bad = int(np.flatnonzero(array >= _MAX_PARTS)[0])
        raise ValueError(f"{name}[{bad}] is {array[bad]}, beyond any number of parts; "
                         f"expected part numbers 0 <= {name} < 2**31 - 1")
    if nparts is None:
        nparts = int(array.max()) + 1 if n else 1
        nparts = max(nparts, 1)  # all owners negative: the range check below reports it
    else:
        nparts = _check_nparts(nparts)
    if n:
        lowest, highest = array.min(), array.max()
        if lowest < 0 or highest >= nparts:
            bad = int(np.flatnonzero((array < 0) | (array >= nparts))[0])
            raise ValueError(
                f"{name}[{bad}] is {array[bad]}, outside [0, {nparts}); expected part numbers "
                f"0 <= {name} < {parts} = {nparts}")
    return array.astype(np.int64, copy=True), nparts


# -- partition quality ----------------------------------------------------------------------

class _Quality(NamedTuple):
    """The figures of `Partition`, as `_quality` computes them."""

    owned_rows: np.ndarray
    owned_nnz: np.ndarray
    halo_sizes: np.ndarray
    peers: np.ndarray
    edge_cut: int


def _unique(values):
    """Sorted distinct values of a 1-D array (a sort and a mask: several times faster than
    ``np.unique`` on large int64 arrays)."""
    values = np.sort(values)
    if values.size < 2:
        return values
    keep = np.empty(values.size, dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _quality(indptr, indices, owner, nparts):
    """Rows, stored entries, halo sizes and peers per part, and the edge cut.

    Trusts its input: ``indptr``/``indices`` of a square CSR pattern with ``n = owner.size``
    rows, ``owner`` int64 with values in ``[0, nparts)``. Vectorized: a few passes over the
    stored entries and two sorts of the crossing ones, never a loop over nodes or parts.
    """
    n = owner.size
    counts = np.diff(indptr).astype(np.int64, copy=False)
    owned_rows = np.bincount(owner, minlength=nparts).astype(np.int64, copy=False)
    row_owner = np.repeat(owner, counts)
    owned_nnz = np.bincount(row_owner, minlength=nparts).astype(np.int64, copy=False)
    crossing = row_owner != owner[indices]
    edge_cut = int(np.count_nonzero(crossing))
    # One key per (receiving part, halo node): distinct ones are the halo entries.
    keys = _unique(row_owner[crossing] * np.int64(n) + indices[crossing].astype(np.int64))
    receiver = keys // n if n else keys
    halo_sizes = np.bincount(receiver, minlength=nparts).astype(np.int64, copy=False)
    # One key per (receiving part, sending part): distinct ones are the messages.
    sender = owner[keys - receiver * n] if n else keys
    pairs = _unique(receiver * np.int64(nparts) + sender)
    peers = np.bincount(pairs // nparts, minlength=nparts).astype(np.int64, copy=False)
    return _Quality(owned_rows, owned_nnz, halo_sizes, peers, edge_cut)


def _balance(counts):
    """max / mean of ``counts`` (1.0 when the mean is 0)."""
    total = int(counts.sum())
    if total == 0:
        return 1.0
    return float(counts.max()) * counts.size / total


def _read_only(array):
    array.flags.writeable = False
    return array


class Partition:
    """A row partition of a graph: the owner of every node and what it costs.

    Build one with `partition` or, from an owner array computed elsewhere, with
    `Partition.from_owner` (the constructor takes the same arguments). All figures are
    computed once, at construction, from the adjacency pattern; a stored entry ``(i, j)``
    means the owner of node ``i`` needs node ``j``'s row.

    Parameters
    ----------
    adj : sparse array or matrix, shape (n, n)
        The adjacency the partition is for (pysparse_hpc or scipy.sparse).
    owner : array_like of int, shape (n,)
        ``owner[i]`` is the part (rank) that owns node ``i``, in ``[0, nparts)``.
    nparts : int, optional
        Number of parts, at most ``2**31 - 1`` (the most MPI ranks); ``owner.max() + 1`` by
        default (1 for an empty graph). Parts that own no node are allowed.
    method : str, default "given"
        A label recorded in `method` (`partition` passes its method).

    Attributes
    ----------
    owner : ndarray of int64, shape (n,)
        Owner of every node (a read-only copy).
    nparts : int
        Number of parts.
    method : str
        How the partition was made.
    n_nodes : int
        Number of nodes ``n``.
    nnz : int
        Stored entries of the adjacency, duplicates included.
    owned_rows : ndarray of int64, shape (nparts,)
        Nodes (rows) owned by each part.
    owned_nnz : ndarray of int64, shape (nparts,)
        Stored entries in the rows each part owns.
    halo_sizes : ndarray of int64, shape (nparts,)
        ``|halo_p|``: distinct nodes ``j`` owned by another part that some stored entry
        ``(i, j)`` with ``owner[i] == p`` references. The rows part ``p`` receives per exchange.
    communication_volume : int
        ``halo_sizes.sum()``: node rows received per exchange, all parts together (multiply
        by the feature width for words).
    edge_cut : int
        Stored entries ``(i, j)`` with ``owner[i] != owner[j]`` (diagonal entries never count).
    peers : ndarray of int64, shape (nparts,)
        Distinct other parts each part receives halo rows from: its messages per exchange.
    row_balance, nnz_balance : float
        max / mean of `owned_rows` and `owned_nnz`; 1.0 is perfect (and the value when the
        mean is 0).
    cagnet_volume : int
        ``(nparts - 1) * n``: the node rows CAGNET's 1D algorithm, where every rank receives
        all of H, moves per exchange. ``communication_volume`` never exceeds it.

    All arrays are read-only.

    See Also
    --------
    partition

    Examples
    --------
    >>> import numpy as np
    >>> import scipy.sparse
    >>> from pysparse_hpc.distributed.partition import Partition
    >>> path = scipy.sparse.diags_array([np.ones(3), np.ones(3)], offsets=[-1, 1], shape=(4, 4))
    >>> part = Partition.from_owner(path, [0, 0, 1, 1])
    >>> part.edge_cut, part.halo_sizes.tolist(), part.communication_volume
    (2, [1, 1], 2)
    >>> part.rows_of(1)
    array([2, 3])
    """

    def __init__(self, adj, owner, nparts=None, method="given"):
        if not isinstance(method, str):
            raise TypeError(f"method must be a str, got {type(method).__name__}")
        indptr, indices, n = _as_pattern(adj)
        self._setup(indptr, indices, n, owner, nparts, method)

    @classmethod
    def _from_pattern(cls, indptr, indices, n, owner, nparts, method):
        """The constructor's path, for a pattern `_as_pattern` has checked already."""
        result = cls.__new__(cls)
        result._setup(indptr, indices, n, owner, nparts, method)
        return result

    def _setup(self, indptr, indices, n, owner, nparts, method):
        owner, nparts = _check_owner(owner, n, nparts)
        # Which graph this is for: a DistGraph refuses the partition of another graph (the
        # partition of a reordered copy, say), whose figures would describe that graph.
        self._graph_digest = graph_digest(indptr, indices, n)
        quality = _quality(indptr, indices, owner, nparts)
        self.owner = _read_only(owner)
        self.nparts = nparts
        self.method = method
        self.n_nodes = n
        self.nnz = int(indptr[-1]) if indptr.size else 0
        self.owned_rows = _read_only(quality.owned_rows)
        self.owned_nnz = _read_only(quality.owned_nnz)
        self.halo_sizes = _read_only(quality.halo_sizes)
        self.peers = _read_only(quality.peers)
        self.edge_cut = quality.edge_cut
        self.communication_volume = int(quality.halo_sizes.sum())
        self.row_balance = _balance(quality.owned_rows)
        self.nnz_balance = _balance(quality.owned_nnz)
        self.cagnet_volume = (nparts - 1) * n
        self._order = None

    def __setstate__(self, state):
        # Unpickled arrays come back writeable (a Partition that rank 0 made and sent to the
        # others with comm.bcast, say); the figures describe the owners they were computed
        # from, so they stay read-only there too.
        self.__dict__.update(state)
        for name in ("owner", "owned_rows", "owned_nnz", "halo_sizes", "peers"):
            _read_only(getattr(self, name))

    @classmethod
    def from_owner(cls, adj, owner, nparts=None, method="given"):
        """Validate an owner array for ``adj`` and compute the partition's figures.

        Parameters
        ----------
        adj : sparse array or matrix, shape (n, n)
            Square adjacency, pysparse_hpc or scipy.sparse.
        owner : array_like of int, shape (n,)
            ``owner[i]`` is the part that owns node ``i``.
        nparts : int, optional
            Number of parts, at least ``owner.max() + 1``; that is the default (1 when
            ``n == 0``). At most ``2**31 - 1``.
        method : str, default "given"
            Recorded in `method`.

        Returns
        -------
        Partition

        Raises
        ------
        TypeError
            If ``adj`` is not sparse, ``owner`` does not hold integers or ``nparts`` is not an
            integer (floats and bools are refused).
        ValueError
            If ``adj`` is not square, ``owner`` is not 1-D or its length is not ``n``, an owner
            lies outside ``[0, nparts)``, or ``nparts`` is outside ``[1, 2**31 - 1]``.
        """
        return cls(adj, owner, nparts=nparts, method=method)

    @property
    def communication_fraction(self):
        """`communication_volume` / `cagnet_volume` (0.0 when the latter is 0)."""
        if self.cagnet_volume == 0:
            return 0.0
        return self.communication_volume / self.cagnet_volume

    def rows_of(self, rank):
        """Sorted global ids of the nodes ``rank`` owns.

        Parameters
        ----------
        rank : int
            A part, in ``[0, nparts)``.

        Returns
        -------
        ndarray of int64
            A new array, ascending.

        Raises
        ------
        TypeError
            If ``rank`` is not an integer.
        ValueError
            If ``rank`` is outside ``[0, nparts)``.
        """
        rank = check_integer(rank, "rank")
        if not 0 <= rank < self.nparts:
            raise ValueError(f"rank {rank} is outside [0, {self.nparts})")
        if self._order is None:
            # Sorted by owner, then (stable) by node id: each part's rows form one slice.
            self._order = np.argsort(self.owner, kind="stable").astype(np.int64, copy=False)
            self._starts = np.zeros(self.nparts + 1, dtype=np.int64)
            np.cumsum(self.owned_rows, out=self._starts[1:])
        return self._order[self._starts[rank]:self._starts[rank + 1]].copy()

    def _volume_text(self):
        if self.cagnet_volume == 0:
            return f"volume {self.communication_volume} rows"
        return (f"volume {self.communication_volume} rows = "
                f"{100.0 * self.communication_fraction:.1f}% of CAGNET 1D's {self.cagnet_volume}")

    def _cut_text(self):
        share = f" ({100.0 * self.edge_cut / self.nnz:.1f}%)" if self.nnz else ""
        return f"edge cut {self.edge_cut} of {self.nnz} entries{share}"

    def __repr__(self):
        return (f"<Partition {self.method}: {self.n_nodes} nodes in {self.nparts} parts, "
                f"{self._cut_text()}, {self._volume_text()}, balance rows "
                f"{self.row_balance:.3f} nnz {self.nnz_balance:.3f}>")

    def summary(self):
        """A few lines of text: method, sizes, edge cut, volume against CAGNET 1D, peers,
        balance."""
        max_peers = int(self.peers.max()) if self.nparts else 0
        mean_peers = float(self.peers.mean()) if self.nparts else 0.0
        return "\n".join([
            f"Partition of {self.n_nodes} nodes, {self.nnz} stored entries, into "
            f"{self.nparts} parts ({self.method})",
            f"  {self._cut_text()}",
            f"  communication {self._volume_text()} per exchange; largest halo "
            f"{int(self.halo_sizes.max())} rows",
            f"  peers per part: max {max_peers}, mean {mean_peers:.2f}",
            f"  balance (max/mean): rows {self.row_balance:.3f}, nnz {self.nnz_balance:.3f}",
        ])


# -- partitioners ---------------------------------------------------------------------------

#: The largest numeric balance: node weights stay integers whose sums over a billion nodes fit
#: int64 (METIS and the contiguous split add them up).
_MAX_ROW_WORK = 1e9
#: METIS takes integer weights: ``c`` is scaled by the smallest ``q`` up to this (and up to what
#: keeps the weights' sum within a 32-bit METIS's int) whose ``q c`` rounds to within
#: `_WEIGHT_TOLERANCE` of itself.
_MAX_WEIGHT_SCALE = 1000
_WEIGHT_TOLERANCE = 0.01


def _node_weights(indptr, balance):
    """What each node weighs for ``balance``, one column per balance constraint: 1 ("rows"),
    its stored entries + 1 ("nnz"), its stored entries + ``balance`` (a number ``c``), or both
    1 and its entries + 1 ("rows+nnz"). METIS takes integers: with ``c``, each node weighs
    ``rint(q (entries + c))``, the same proportions with ``c`` within 1 % (`_work_scale`)."""
    ones = np.ones(indptr.size - 1, dtype=np.int64)
    if balance == "rows":
        return ones[:, None]
    entries = np.diff(indptr).astype(np.int64)
    if balance == ROWS_AND_NNZ:
        return np.stack([ones, entries + 1], axis=1)
    per_row = 1.0 if balance == "nnz" else float(balance)
    scale = _work_scale(per_row, float(entries.sum()) + per_row * entries.size)
    return np.rint(entries * scale + per_row * scale).astype(np.int64)[:, None]


def _work_scale(per_row, total):
    """The smallest integer ``q`` for which ``q c`` (``c = per_row``) rounds to an integer
    within 1 % of it, so that ``rint(q (entries + c))`` weighs nodes as ``entries + c`` does.

    Rounded to integers as they were, a ``c`` of 0.4 weighed an isolated node 0 (METIS then
    piled such nodes into one part) and 1.5 weighed it 2. ``q`` is 1 for an integer ``c`` and
    from ``c = 50`` on (the weights, and the partitions, are those of before), at most
    `_MAX_WEIGHT_SCALE`, and small enough that the weights' sum ``total q`` fits a 32-bit int
    where ``total`` does.
    """
    largest = max(1, min(_MAX_WEIGHT_SCALE, int((2**31 - 1) // max(total, 1.0))))
    for scale in range(1, largest + 1):
        scaled = per_row * scale
        if abs(scaled - round(scaled)) <= _WEIGHT_TOLERANCE * scaled:
            return scale
    return largest


def _contiguous_owner(indptr, n, nparts, balance="nnz"):
    """Consecutive blocks of rows of about equal weight (`_node_weights`); no empty part when
    ``nparts <= n``, node ``i`` in part ``i`` otherwise."""
    if nparts >= n:
        return np.arange(n, dtype=np.int64)
    weights = _node_weights(indptr, balance)[:, 0]
    ends = np.cumsum(weights)
    total = max(int(ends[-1]), 1)
    # A row belongs to the part whose share [p W / P, (p + 1) W / P) holds its midpoint: row
    # i starts part p when (2 end_i - w_i) / (2 W) >= p / P. Both sides are correctly rounded
    # quotients, so ties fall alike while the weights stay below 2**53; the integer products
    # (2 end_i - w_i) P they replace overflowed int64 past 4.6e18 (large numeric balances).
    midpoints = (2 * ends - weights) / (2.0 * total)
    bounds = np.searchsorted(midpoints, np.arange(1, nparts) / nparts)
    # A row heavier than a share would leave parts empty: move boundaries just enough that
    # every part gets at least one row (boundary b_p in [p, n - P + p], strictly increasing).
    steps = np.arange(1, nparts, dtype=np.int64)
    shifted = np.clip(np.maximum.accumulate(bounds - steps), 0, n - nparts)
    bounds = shifted + steps
    sizes = np.diff(np.concatenate(([0], bounds, [n])))
    return np.repeat(np.arange(nparts, dtype=np.int64), sizes)


def _metis_owner(indptr, indices, n, nparts, seed, balance="rows"):
    import_pymetis()  # asked for METIS: say so even where the special cases need none
    if nparts == 1:
        return np.zeros(n, dtype=np.int64)
    if nparts >= n:
        return np.arange(n, dtype=np.int64)
    pattern = csr_array.__new__(csr_array)
    pattern._set_arrays(np.ones(indices.size, dtype=np.float32), indices,
                        indptr.astype(indices.dtype, copy=False), (n, n), None)
    xadj, adjncy = _symmetric_graph(pattern)
    if adjncy.size == 0:
        # No edges between distinct nodes: every balanced split cuts nothing.
        return _contiguous_owner(indptr, n, nparts, "nnz" if balance == ROWS_AND_NNZ else balance)
    weights = None if balance == "rows" else _node_weights(indptr, balance)
    return part_graph(xadj, adjncy, weights, nparts, seed)


#: What `partition` can balance, and each method's default.
#: "rows+nnz" is METIS's two-constraint partitioning: equal node counts and equal entries.
ROWS_AND_NNZ = "rows+nnz"
BALANCES = ("rows", "nnz", ROWS_AND_NNZ)
_DEFAULT_BALANCE = {"metis": "rows", "contiguous": "nnz", "random": "rows"}


def check_balance(balance, method="metis"):
    """The balance `partition` uses with ``method``: ``balance`` itself, or the method's
    default for None.

    Raises the ValueError `partition` would raise for an unknown ``method`` or a ``balance``
    it does not take, so that a command line can refuse its options before reading a graph.
    """
    if not isinstance(method, str) or method not in PARTITION_METHODS:
        raise ValueError(
            f"unknown method {method!r}; expected one of {', '.join(PARTITION_METHODS)}")
    balance = _DEFAULT_BALANCE[method] if balance is None else balance
    numeric = isinstance(balance, (int, float, np.integer, np.floating)) and not isinstance(
        balance, (bool, np.bool_))
    # Compared, not converted: NaN fails the comparison, and an int too large for a float is
    # out of range rather than a casting error.
    if numeric and not 0 <= balance <= _MAX_ROW_WORK:
        why = (" (a larger one is 'rows' in effect, and the summed weights would overflow)"
               if balance > _MAX_ROW_WORK else "")
        raise ValueError(f"a numeric balance (work per row, in stored entries) must be finite "
                         f"and in [0, {_MAX_ROW_WORK:.0e}], got {balance!r}{why}")
    allowed = {"random": "'rows'", "contiguous": "'rows', 'nnz' or a number >= 0"}.get(
        method, "'rows', 'nnz', 'rows+nnz' or a number >= 0")
    # Names are compared as str only: an array's == is elementwise, with no truth value.
    named = balance if isinstance(balance, str) else None
    if ((not numeric and named not in BALANCES) or (method == "random" and named != "rows")
            or (method == "contiguous" and named == ROWS_AND_NNZ)):
        raise ValueError(f"balance must be {allowed} for method {method!r}, got "
                         f"{balance!r}")
    return balance


def partition(adj, nparts, method="metis", seed=0, balance=None):
    """Split the nodes of a graph into ``nparts`` parts, one per rank, and rate the split.

    Parameters
    ----------
    adj : sparse array or matrix, shape (n, n)
        The adjacency: a pysparse_hpc sparse array (`csr_array`, `mebcrs_array`,
        `blocked_array`) or a scipy.sparse array/matrix. Row ``i`` holds the edges into node
        ``i``. Only the pattern matters; explicit duplicates and self loops are fine.
    nparts : int
        Number of parts, from 1 to ``2**31 - 1`` (the most MPI ranks). It may exceed ``n``;
        some parts are then empty.
    method : {"metis", "contiguous", "random"}, default "metis"
        - ``"metis"``: METIS's multilevel k-way partitioning (recursive bisection for
          ``nparts <= 8``, as pymetis does, and for fewer than 3 nodes per part, where k-way
          can put every node in one part) of the undirected graph, the pattern of
          ``A + A^T`` without the diagonal, through the optional ``pymetis`` package.
          Minimises the edge cut with balanced node counts: the standard for GNN training
          (BNS-GCN, DistDGL). Deterministic for a given ``seed``. Special cases, which never
          call METIS: ``nparts == 1`` puts every node in part 0; ``nparts >= n`` gives node
          ``i`` part ``i`` (METIS misbehaves there, and one node per part is the only balanced
          choice); a graph with no edges between distinct nodes gets the ``"contiguous"``
          split (any balanced split cuts nothing). METIS may leave a part empty on small or
          disconnected graphs.
        - ``"contiguous"``: consecutive blocks of node ids in the order given, with boundaries
          that give each block about the same weight, a row weighing its stored entries + 1
          (so empty rows count too). Every part gets at least one row when ``nparts <= n``;
          otherwise node ``i`` goes to part ``i``. Deterministic, no dependency. Best after
          the library's own reordering, which numbers neighbours close together so that the
          blocks have small halos::

              perm = pysparse_hpc.reorder(A, method="rabbit")   # or "rcm"
              B = pysparse_hpc.permute(A, perm)
              part = partition(B, P, "contiguous")

          Node ids then refer to ``B``: node features follow as ``X[perm]`` (and results come
          back with ``Y[pysparse_hpc.inverse_permutation(perm)]``).
        - ``"random"``: a balanced random assignment (part sizes differ by at most one),
          ``default_rng(seed).permutation(arange(n) % nparts)``. The worst case, for
          benchmarks.
    seed : int, default 0
        Seed of METIS or of the random assignment, in ``[0, 2**63)``; "contiguous" ignores it.
        METIS reads its seed as a 32-bit C int, so seeds equal modulo ``2**32`` give one
        partition, and METIS itself gives seeds 0 and 1 the same one: sweep seeds from 1.
    balance : {"rows", "nnz", "rows+nnz"} or float, optional
        What the parts hold equal amounts of: nodes ("rows", METIS's and random's default),
        stored entries with each node weighing its entries + 1 ("nnz", the contiguous default;
        METIS then gets these as vertex weights), or work: a number ``c`` weighs each node as
        its entries + ``c``, the time of a row's dense work (feature transforms, dropout,
        activations) in units of one stored entry's share of the step's SpMMs. Equal nodes
        even out the dense work, equal entries the SpMMs; on graphs with skewed degrees
        (R-MAT, power laws) either alone leaves one part slower than the other, and the
        measured ratio (about 30-60 for a 2-layer GCN on a CPU, see BENCHMARKS.md) balances
        the step's total. "rows+nnz" (METIS only) balances both at once, each within METIS's
        tolerance, with METIS's multi-constraint partitioning: every phase of a step, the
        entry-bound products and the row-bound dense work, is then even, which one weight per
        node cannot promise; it usually cuts more edges than "rows". "random" balances rows
        only.

    Returns
    -------
    Partition
        The owner of every node with the edge cut, halo sizes, communication volume, peers and
        balance (built through `Partition.from_owner`).

    Raises
    ------
    TypeError
        If ``adj`` is not a sparse array or matrix, or ``nparts`` or ``seed`` is not an
        integer (bools refused).
    ValueError
        If ``adj`` is not square or not a valid sparse matrix, ``nparts`` is outside
        ``[1, 2**31 - 1]``, ``seed`` is negative, or ``method`` or ``balance`` is unknown.
    ModuleNotFoundError
        If ``method="metis"`` and ``pymetis`` is not installed.
    ImportError
        If ``method="metis"`` and ``pymetis`` is installed but fails to import.
    RuntimeError
        If METIS fails, or ``balance="rows+nnz"`` and the installed pymetis does not expose
        METIS's C functions.

    See Also
    --------
    Partition, pysparse_hpc.reorder, pysparse_hpc.permute

    Examples
    --------
    >>> import pysparse_hpc as sph
    >>> from pysparse_hpc.distributed.partition import partition
    >>> A = sph.datasets.load("cora").adj
    >>> metis = partition(A, 4, "metis")
    >>> worst = partition(A, 4, "random")
    >>> metis.communication_volume < worst.communication_volume / 3
    True
    >>> metis.owner.shape
    (2708,)
    """
    balance = check_balance(balance, method)
    indptr, indices, n = _as_pattern(adj)
    nparts = _check_nparts(nparts)
    seed = _check_seed(seed)
    if method == "metis":
        owner = _metis_owner(indptr, indices, n, nparts, seed, balance)
    elif method == "contiguous":
        owner = _contiguous_owner(indptr, n, nparts, balance)
    else:
        owner = np.random.default_rng(seed).permutation(np.arange(n, dtype=np.int64) % nparts)
    return Partition._from_pattern(indptr, indices, n, owner, nparts, method)
