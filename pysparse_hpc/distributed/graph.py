"""`DistGraph`: a square sparse matrix (a graph's adjacency) distributed by rows over ranks.

Each rank keeps its owned rows as one CSR matrix over local columns (its own nodes, then its
halo: the other ranks' nodes its rows reference, see `_plan`) and the communication plan, built
once: which rows it receives from whom, which of its rows it sends to whom. The halo exchange
(forward) and the reverse exchange (backward: gradients of halo rows sent back and summed at
their owners) are nonblocking, so a product over the local columns can run while they travel.
The `pysparse_hpc.nn` ops and layers take a `DistGraph` wherever they take a sparse array.
"""
import hashlib
import weakref

import numpy as np

from .._base import sparray
from .._csr import csr_array
from .._sputils import get_index_dtype
from . import _plan
from ._comm import _alike, _as_buffer, _is_bfloat16, _Request, check_communicator, init
from .partition import Partition, _check_owner, graph_digest

__all__ = ["DistGraph", "HaloPlan"]

#: What a graph needs of its communicator (set-up collectives, then the halo exchange).
_GRAPH_COMM_METHODS = ("rank", "size", "Allreduce", "Isend", "Irecv", "bcast", "scatter",
                       "alltoall", "allgather", "raise_if_any")

# Tags of a graph's halo messages cycle through this range (the MPI standard guarantees tags
# up to 32767): each exchange takes the next one. The graph's own MPI context (`_setup`) keeps
# its messages from any other graph's.
_TAG_BASE, _TAG_SPAN = 1000, 30000

# The tag of `DistGraph.scatter_rows`'s messages, outside the halo exchanges' range.
_ROWS_TAG = _TAG_BASE - 1


def _owner_array(partition, csr, nparts_expected):
    """The validated owner array of ``partition``, a `Partition` of the graph or an integer
    array of owners; ``csr`` is the graph (a canonical CSR array)."""
    n = csr.shape[0]
    if isinstance(partition, Partition):
        if partition.nparts != nparts_expected:
            raise ValueError(
                f"the partition is for {partition.nparts} ranks but the communicator has "
                f"{nparts_expected}; partition the graph for {nparts_expected} parts")
        made_for = getattr(partition, "_graph_digest", None)
        if made_for is not None and (partition.n_nodes != n or made_for != graph_digest(
                csr.indptr, csr.indices, n)):
            raise ValueError(
                f"the partition was made for another graph ({partition.n_nodes} nodes, "
                f"{partition.nnz} stored entries) than this one ({n} nodes, {csr.nnz} "
                f"entries, or the same counts with other edges: a reordered copy?); partition "
                f"this graph, or pass the owner array (partition.owner) to use it as it is")
        partition = partition.owner
    elif partition is None:
        raise TypeError("a partition is required: a Partition (see partition()) or an array "
                        "of each node's owner rank")
    owner, _ = _check_owner(partition, n, nparts_expected, name="partition",
                            parts="the communicator's size")
    return owner


def _square_pattern(adj):
    """The canonical CSR form of a square sparse array (scipy input is wrapped)."""
    if not isinstance(adj, sparray):
        if hasattr(adj, "tocsr"):
            adj = csr_array(adj)
        else:
            raise TypeError(f"adj must be a pysparse_hpc or scipy sparse array, got "
                            f"{type(adj).__name__}")
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"adj must be square (nodes x nodes), got shape {adj.shape}")
    csr = adj.tocsr()
    return csr if csr.has_canonical_format else csr.canonical()


class _Pending:
    """A started exchange: ``wait()`` completes it and returns what it received."""

    __slots__ = ("_requests", "_keep", "_finish")

    def __init__(self, requests, keep, finish):
        self._requests, self._keep, self._finish = requests, keep, finish

    def wait(self):
        _Request.wait_all(self._requests)
        self._keep = None  # the send buffers may go once the sends are complete
        return self._finish()


class HaloPlan:
    """One rank's communication plan: the rows it receives and sends in a halo exchange.

    Parameters
    ----------
    comm : Communicator
        The ranks of the exchange (`DistGraph` passes a duplicate of its own).
    owned, halo : ndarray of int64
        As the attributes below.
    recv_counts : sequence of int
        Halo rows received from each rank, one count per rank, in the order of ``halo``.
    send_index : dict of int to ndarray of int64
        Local row ids sent to each peer; peers with none are dropped.

    Attributes
    ----------
    comm : Communicator
    owned : ndarray of int64
        Global ids of the owned rows, ascending (local row i is node ``owned[i]``).
    halo : ndarray of int64
        Global ids of the halo rows, grouped by owner.
    recv_offsets : ndarray of int64, shape (nparts + 1,)
        Halo rows from rank q are ``halo[recv_offsets[q]:recv_offsets[q + 1]]``.
    send_index : dict of int to ndarray of int64
        Local row ids sent to each peer that needs any, in the order the peer stores them.
    """

    def __init__(self, comm, owned, halo, recv_counts, send_index):
        self.comm, self.owned, self.halo = comm, owned, halo
        self.recv_offsets = np.concatenate([[0], np.cumsum(recv_counts)]).astype(np.int64)
        self.send_index = {q: idx for q, idx in send_index.items() if idx.size}
        self.recv_peers = [q for q in range(comm.size) if recv_counts[q]]
        self._tag = 0
        #: Bytes per row of every exchange made (forward and reverse), for comparisons with
        #: schemes that move whole feature matrices.
        self.exchanged_row_bytes = 0

    @property
    def n_local(self):
        return self.owned.size

    @property
    def n_halo(self):
        return self.halo.size

    def _next_tag(self):
        tag = _TAG_BASE + self._tag
        self._tag = (self._tag + 1) % _TAG_SPAN
        return tag

    def start_exchange(self, local):
        """Send the owned rows the peers need, receive the halo rows: a `_Pending` whose
        ``wait()`` returns the (n_halo, ...) halo array (a new NumPy array).

        Parameters
        ----------
        local : ndarray or CPU tensor, shape (n_local, ...)
            The owned rows (copied first where not C-contiguous); every rank must pass one
            dtype and row shape.

        Returns
        -------
        _Pending
            Its ``wait()`` returns the halo rows, of ``local``'s dtype, and raises a
            ``ValueError`` where a peer's rows were another number of bytes (another dtype
            or row shape).

        Raises
        ------
        TypeError
            ``local`` is bfloat16, neither a NumPy array nor a CPU tensor, or holds no
            numbers.
        ValueError
            ``local`` does not have ``n_local`` rows, or is on a GPU.
        """
        local = _rows_buffer(local, "local rows")
        if local.shape[0] != self.n_local:
            raise ValueError(f"expected the {self.n_local} owned rows of this rank, got "
                             f"{local.shape[0]}")
        halo = np.empty((self.n_halo,) + local.shape[1:], dtype=local.dtype)
        self.exchanged_row_bytes += local.dtype.itemsize * int(np.prod(local.shape[1:]))
        tag, comm = self._next_tag(), self.comm
        offsets = self.recv_offsets
        requests = [comm.Irecv(halo[offsets[q]:offsets[q + 1]], q, tag, "halo")
                    for q in self.recv_peers]
        outgoing = [local[index] for index in self.send_index.values()]
        requests += [comm.Isend(buffer, q, tag, "halo")
                     for q, buffer in zip(self.send_index, outgoing)]
        return _Pending(requests, outgoing, lambda: halo)

    def start_reverse_exchange(self, halo_values):
        """Send each halo row's value back to its owner: a `_Pending` whose ``wait()``
        returns a function ``add_into(local)`` that adds the received values into the owned
        rows (in place; the sum over peers is taken in rank order, so it is reproducible).
        ``local`` must be (n_local, ...) of ``halo_values``'s row shape and dtype.

        Parameters
        ----------
        halo_values : ndarray or CPU tensor, shape (n_halo, ...)
            A value per halo row (a gradient), in the order of ``halo``; copied first where
            not C-contiguous.

        Returns
        -------
        _Pending
            Its ``wait()`` returns ``add_into``, which returns ``local`` and raises a
            ``TypeError`` or ``ValueError`` for a ``local`` of another dtype or shape.

        Raises
        ------
        TypeError, ValueError
            As for `start_exchange`, with ``n_halo`` rows.
        """
        halo_values = _rows_buffer(halo_values, "halo rows")
        if halo_values.shape[0] != self.n_halo:
            raise ValueError(f"expected the {self.n_halo} halo rows of this rank, got "
                             f"{halo_values.shape[0]}")
        row_shape = halo_values.shape[1:]
        self.exchanged_row_bytes += halo_values.dtype.itemsize * int(np.prod(row_shape))
        tag, comm = self._next_tag(), self.comm
        offsets = self.recv_offsets
        incoming = {q: np.empty((index.size,) + row_shape, dtype=halo_values.dtype)
                    for q, index in self.send_index.items()}
        requests = [comm.Irecv(buffer, q, tag, "reverse_halo") for q, buffer in incoming.items()]
        requests += [comm.Isend(halo_values[offsets[q]:offsets[q + 1]], q, tag, "reverse_halo")
                     for q in self.recv_peers]

        def add_into(local):
            _check_add_target(local, (self.n_local,) + row_shape, halo_values.dtype)
            for q, buffer in incoming.items():
                _add_rows(local, self.send_index[q], buffer)
            return local
        return _Pending(requests, halo_values, lambda: add_into)


def _rows_buffer(rows, name):
    """``rows`` as `_as_buffer` views them; the exchanged rows are NumPy arrays, which have no
    bfloat16 (the communicator would move its bits as int16)."""
    if _is_bfloat16(rows):
        raise TypeError(f"{name} are bfloat16, which the halo exchange's NumPy arrays cannot "
                        "hold; convert them to float32")
    # Copied where they are strided (a column slice, a transpose): whether a view is
    # contiguous depends on how many rows a rank owns (a slice of one row is), so refusing
    # it failed on some ranks only, and left their peers waiting for their messages.
    if isinstance(rows, np.ndarray) and not rows.flags.c_contiguous:
        rows = np.ascontiguousarray(rows)
    elif hasattr(rows, "is_contiguous") and not rows.is_contiguous():
        rows = rows.contiguous()
    rows = _as_buffer(rows, name)
    if rows.ndim == 0:
        raise ValueError(f"{name} must have one row per node, got a 0-d array")
    return rows


def _check_add_target(target, shape, dtype):
    """Refuse owned rows that the received rows cannot be added into, on every rank: the
    addition itself fails (a torch dtype) or casts (NumPy) only on the ranks that received
    something, and never on one rank."""
    if not hasattr(target, "shape") or not hasattr(target, "dtype"):
        raise TypeError(f"the owned rows must be a NumPy array or a CPU torch tensor, got "
                        f"{type(target).__name__}")
    if tuple(target.shape) != shape:
        raise ValueError(f"the owned rows must have shape {shape} (the owned nodes and the "
                         f"sent rows' shape), got {tuple(target.shape)}")
    if isinstance(target, np.ndarray):
        same = target.dtype == dtype
    else:
        import torch
        same = target.dtype == torch.from_numpy(np.empty(0, dtype)).dtype
    if not same:
        raise TypeError(f"the owned rows are {target.dtype} but the rows sent back are "
                        f"{dtype}; add into rows of the sent rows' dtype")


def _add_rows(target, index, rows):
    """``target[index] += rows`` for distinct ``index`` (NumPy arrays or torch tensors)."""
    if isinstance(target, np.ndarray):
        target[index] += rows
    else:
        import torch
        target.index_add_(0, torch.from_numpy(index), torch.from_numpy(rows))


class DistGraph:
    """A square sparse matrix distributed by rows: each rank holds the rows it owns.

    Build it with every rank passing the same global graph and partition
    (``DistGraph(adj, partition, comm)``), or with only the root holding them
    (`DistGraph.scatter`), so the other ranks never hold more than their own piece.

    Parameters
    ----------
    adj : sparse array, shape (n, n)
        The whole graph (pysparse_hpc or scipy sparse); row i holds the edges into node i.
        Only the root's is read by `scatter`.
    partition : Partition or array of int, shape (n,)
        The owner rank of every node, for ``comm.size`` ranks.
    comm : Communicator, optional
        Default: `pysparse_hpc.distributed.init()`.

    Attributes
    ----------
    comm : Communicator
    shape : (int, int)
        The global shape (n, n).
    nnz : int
        Stored entries of the whole graph.
    owned : ndarray of int64
        Global ids of this rank's rows, ascending: local row i is node ``owned[i]``.
    halo : ndarray of int64
        Global ids of the halo nodes (other ranks' nodes this rank's rows reference).
    local : csr_array, shape (n_local, n_local + n_halo)
        The owned rows over local columns: the owned nodes, then the halo. Per-edge tensors
        (attention, SDDMM results) on a `DistGraph` are aligned with its storage order.
    column_ids : ndarray of int64
        The global id of every local column (``owned`` then ``halo``).

    Examples
    --------
    >>> import pysparse_hpc as sph
    >>> from pysparse_hpc import distributed
    >>> cora = sph.datasets.load("cora")
    >>> comm = distributed.init()
    >>> graph = distributed.DistGraph(cora.adj, distributed.partition(cora.adj, comm.size,
    ...                               "contiguous"), comm)
    >>> graph.n_local, graph.n_halo
    (2708, 0)
    """

    def __init__(self, adj, partition, comm=None):
        comm = init() if comm is None else check_communicator(comm, _GRAPH_COMM_METHODS)
        error, piece = None, None
        try:
            csr = _square_pattern(adj)
            owner = _owner_array(partition, csr, comm.size)
            piece = _plan.local_pieces(csr.indptr, csr.indices, csr.data, owner, comm.size,
                                       [comm.rank])[0]
            # A hash, not a weighted sum: two different partitions (or graphs) with one sum
            # passed, and the product was silently wrong.
            digest = hashlib.sha256()
            for array, dtype in ((owner, np.int64), (csr.indptr, np.int64),
                                 (csr.indices, np.int64), (csr.data, np.float64)):
                # One dtype per array: the same graph held with int32 or int64 indices agrees.
                digest.update(np.ascontiguousarray(array, dtype=dtype).view(np.uint8).data)
            fingerprint = (csr.shape[0], csr.nnz, digest.hexdigest()[:16])
        except Exception as exc:  # noqa: BLE001 -- re-raised on every rank below
            error, fingerprint = exc, None
        comm.raise_if_any(error)
        prints = comm.allgather(fingerprint)
        if any(p != prints[0] for p in prints):
            comm.raise_if_any(ValueError(
                "the ranks passed different graphs or partitions (nodes, entries, checksum of "
                f"the graph and owners by rank: {prints}); pass the same ones on every rank, "
                "or use "
                "DistGraph.scatter"))
        self._setup(comm, csr.shape[0], piece, owner if comm.rank == 0 else None)

    @classmethod
    def scatter(cls, adj=None, partition=None, comm=None, root=0):
        """Build the graph from the root's copy: the root partitions the rows and sends each
        rank its piece, so a rank holds O(n/P + nnz/P) of the graph.

        Parameters
        ----------
        adj, partition
            As for `DistGraph`, read on ``root`` only (pass None elsewhere).
        comm : Communicator, optional
        root : int

        Returns
        -------
        DistGraph
        """
        comm = init() if comm is None else check_communicator(comm, _GRAPH_COMM_METHODS)
        error, pieces, header, owner = None, None, None, None
        if comm.rank == root:
            try:
                csr = _square_pattern(adj)
                owner = _owner_array(partition, csr, comm.size)
                pieces = _plan.local_pieces(csr.indptr, csr.indices, csr.data, owner,
                                            comm.size)
                header = csr.shape[0]
            except Exception as exc:  # noqa: BLE001 -- re-raised on every rank below
                error = exc
        comm.raise_if_any(error)
        n = comm.bcast(header, root=root)
        piece = comm.scatter(pieces, root=root)
        graph = cls.__new__(cls)
        graph._setup(comm, n, piece, owner if comm.rank == root else None, root=root)
        return graph

    def _setup(self, comm, n, piece, owner_on_root, root=0):
        needs = [piece.halo_from(q) for q in range(comm.size)]
        wanted = comm.alltoall(needs)  # wanted[q]: the ids rank q needs from this rank
        send_index = {q: np.searchsorted(piece.owned, ids).astype(np.int64)
                      for q, ids in enumerate(wanted) if q != comm.rank}
        # The exchanges run in a context of their own: two graphs' exchanges made in another
        # order on different ranks (numbered alike from the same tag) took each other's rows.
        exchanging = comm.duplicate() if hasattr(comm, "duplicate") else comm
        self.plan = HaloPlan(exchanging, piece.owned, piece.halo, piece.recv_counts,
                             send_index)
        if exchanging is not comm:
            weakref.finalize(self.plan, exchanging.free).atexit = False
        self.comm, self.shape = comm, (n, n)
        # The rank that holds the whole owner array (the root of a scatter, else rank 0).
        self._root, self._owner_on_root = root, owner_on_root
        shape = (piece.owned.size, piece.owned.size + piece.halo.size)
        # scipy's index dtype (int32 where it fits), as for the one-process matrices, so that
        # both run the same compiled kernels and the local products read half the index bytes.
        index_dtype = get_index_dtype(maxval=max(shape[1], piece.indices.size))
        local = csr_array((piece.data, piece.indices.astype(index_dtype, copy=False),
                           piece.indptr.astype(index_dtype, copy=False)), shape=shape)
        local.has_canonical_format = True
        self._set_local(local, None)

    def _set_local(self, local, nnz):
        self.local = local
        self.nnz = int(comm_sum(self.comm, local.nnz, "setup")) if nnz is None else nnz

    def with_local(self, local, nnz=None):
        """A `DistGraph` on the same rows and plan with another local matrix (new values, or
        entries added among the same columns: a normalized graph, self-loops).

        Collective unless ``nnz`` (the new global number of stored entries) is given: every
        rank must call it at the same point.

        Parameters
        ----------
        local : csr_array, shape (n_local, n_local + n_halo)
            The new owned rows, over the same local columns (the owned nodes, then the halo).
        nnz : int, optional
            Taken as it is; None sums ``local.nnz`` over the ranks.

        Returns
        -------
        DistGraph
            Sharing this graph's plan and communicator; this graph is unchanged.

        Raises
        ------
        ValueError
            ``local`` has another shape.
        """
        if local.shape != self.local.shape:
            raise ValueError(f"the local matrix must keep shape {self.local.shape}, got "
                             f"{local.shape}")
        graph = DistGraph.__new__(DistGraph)
        graph.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_nn_cache"})
        graph._set_local(local, nnz)
        return graph

    # ---------------------------------------------------------------- properties
    @property
    def owned(self):
        return self.plan.owned

    @property
    def halo(self):
        return self.plan.halo

    @property
    def n_local(self):
        """Rows this rank owns."""
        return self.plan.n_local

    @property
    def n_halo(self):
        """Rows this rank receives in a halo exchange."""
        return self.plan.n_halo

    @property
    def column_ids(self):
        return np.concatenate([self.plan.owned, self.plan.halo])

    @property
    def dtype(self):
        return self.local.dtype

    @property
    def local_nnz(self):
        return self.local.nnz

    def __repr__(self):
        return (f"<DistGraph {self.shape[0]}x{self.shape[1]} with {self.nnz} stored entries on "
                f"{self.comm.size} ranks; rank {self.comm.rank}: {self.n_local} rows, "
                f"{self.local_nnz} entries, {self.n_halo} halo rows from "
                f"{len(self.plan.recv_peers)} peers>")

    # ---------------------------------------------------------------- exchanges
    def start_halo_exchange(self, local_rows):
        """Start the halo exchange of ``local_rows`` (n_local, ...) (a NumPy array or CPU
        tensor); ``.wait()`` on the result returns the (n_halo, ...) NumPy halo array.

        Parameters
        ----------
        local_rows : ndarray or CPU tensor, shape (n_local, ...)
            Every rank must pass one dtype and row shape.

        Returns
        -------
        _Pending
            See `HaloPlan.start_exchange`.

        Raises
        ------
        TypeError, ValueError
            As `HaloPlan.start_exchange`.
        """
        return self.plan.start_exchange(local_rows)

    def halo_exchange(self, local_rows):
        """The halo rows of ``local_rows`` (blocking `start_halo_exchange`).

        Parameters
        ----------
        local_rows : ndarray or CPU tensor, shape (n_local, ...)
            Every rank must pass one dtype and row shape.

        Returns
        -------
        ndarray, shape (n_halo, ...)
            A new NumPy array of ``local_rows``'s dtype, in the order of `halo`.

        Raises
        ------
        TypeError, ValueError
            As `HaloPlan.start_exchange`; also a ``ValueError`` where a peer's rows were
            another number of bytes (another dtype or row shape).
        """
        return self.plan.start_exchange(local_rows).wait()

    def start_reverse_exchange(self, halo_rows):
        """Send values of the halo rows back to their owners; ``.wait()`` returns
        ``add_into(local)``, which adds what this rank received into its owned rows.

        Parameters
        ----------
        halo_rows : ndarray or CPU tensor, shape (n_halo, ...)

        Returns
        -------
        _Pending
            See `HaloPlan.start_reverse_exchange`.

        Raises
        ------
        TypeError, ValueError
            As `HaloPlan.start_reverse_exchange`.
        """
        return self.plan.start_reverse_exchange(halo_rows)

    # ---------------------------------------------------------------- data placement
    def local_rows(self, array):
        """The owned rows ``array[owned]`` of a global array (NumPy, torch, anything indexable
        by an integer array) that every rank holds.

        Parameters
        ----------
        array : array_like or tensor, shape (n, ...)
            A list is read as a NumPy array.

        Returns
        -------
        ndarray or tensor, shape (n_local, ...)
            New rows, in the order of `owned` (a tensor through ``index_select``).

        Raises
        ------
        ValueError
            ``array`` does not have one row per node.
        """
        if not hasattr(array, "shape"):
            array = np.asarray(array)  # a list: NumPy's rows
        if array.ndim == 0 or array.shape[0] != self.shape[0]:
            raise ValueError(f"expected a global array with {self.shape[0]} rows, got shape "
                             f"{tuple(array.shape)}")
        if hasattr(array, "index_select"):  # torch
            import torch
            return array.index_select(0, torch.from_numpy(self.owned))
        return array[self.owned]

    def scatter_rows(self, array=None, root=None):
        """Each rank's owned rows of ``array``, a global NumPy array held by ``root`` only
        (default: the root the graph was scattered from, else 0).

        Collective: every rank calls it.

        Parameters
        ----------
        array : array_like, shape (n, ...), optional
            Read on ``root`` only (pass None elsewhere).
        root : int, optional

        Returns
        -------
        ndarray, shape (n_local, ...)
            This rank's rows, in the order of `owned`.

        Raises
        ------
        ValueError
            On every rank, when ``root``'s ``array`` does not have one row per node.
        TypeError, ValueError
            ``root`` is not a rank of the communicator.
        """
        root = self._root if root is None else root
        comm = self.comm
        owners = self._owners_on(root)
        error, layout = None, None
        if comm.rank == root:
            try:
                array = np.asarray(array)
                if array.ndim == 0 or array.shape[0] != self.shape[0]:
                    raise ValueError(f"expected a global array with {self.shape[0]} rows, got "
                                     f"shape {array.shape}")
                layout = (array.dtype, array.shape[1:])
            except Exception as exc:  # noqa: BLE001 -- re-raised on every rank below
                error = exc
        comm.raise_if_any(error)
        if comm.size == 1:
            return array[owners[0]]
        dtype, row_shape = comm.bcast(layout, root=root, kind="scatter")
        if dtype.kind not in "biufc" or not dtype.isnative:
            # Rows the communicator cannot move as bytes (objects, strings, another byte
            # order) go pickled.
            return comm.scatter(None if owners is None else [array[ids] for ids in owners],
                                root=root)
        # Each rank's rows as one message, taken and sent one rank at a time: the pickled
        # list of every rank's rows held the features 3-4 times over on the root.
        if comm.rank != root:
            rows = np.empty((self.n_local,) + tuple(row_shape), dtype=dtype)
            comm.Irecv(rows, root, _ROWS_TAG, "scatter").wait()
            return rows
        for q, ids in enumerate(owners):
            if q != root:
                comm.Isend(np.ascontiguousarray(array[ids]), q, _ROWS_TAG, "scatter").wait()
        return array[owners[root]]

    def gather_rows(self, local, root=None):
        """The global array of every rank's owned rows, in node order, on ``root`` (None on
        the other ranks; default: as `scatter_rows`, the root the graph was scattered from,
        else 0, so rows go back where they came from). ``local`` is a NumPy array or a
        tensor (a GPU one is copied to the host) of ``n_local`` rows.

        Every rank must pass rows of one dtype and row shape; a rank whose rows are wrong
        makes every rank raise (the others waited in the gather for ever, and the root cast
        other ranks' rows to its own dtype).

        Parameters
        ----------
        local : ndarray or tensor, shape (n_local, ...)
            This rank's rows, in the order of `owned`.
        root : int, optional

        Returns
        -------
        ndarray, shape (n, ...) or None
            On ``root``, every node's row, of ``local``'s dtype; None on the other ranks.

        Raises
        ------
        TypeError
            On every rank, when some rank's rows are bfloat16.
        ValueError
            On every rank, when some rank does not pass its ``n_local`` rows, or the ranks'
            dtypes or row shapes differ.
        """
        root = self._root if root is None else root
        comm = self.comm
        error, layout = None, None
        try:
            if _is_bfloat16(local):
                raise TypeError("the local rows are bfloat16, which the gathered NumPy array "
                                "cannot hold; convert them to float32")
            local = np.asarray(local.detach().cpu().numpy() if hasattr(local, "detach")
                               else local)
            if local.ndim == 0 or local.shape[0] != self.n_local:
                raise ValueError(f"expected the {self.n_local} owned rows of this rank, got "
                                 f"shape {local.shape}")
            layout = (local.shape[1:], local.dtype.str)
        except Exception as exc:  # noqa: BLE001 -- re-raised on every rank below
            error = exc
        comm.raise_if_any(error)
        layouts = comm.allgather(layout)
        if any(other != layouts[0] for other in layouts):
            found = "; ".join(f"rank {q}: row shape {shape}, dtype {np.dtype(dtype)}"
                              for q, (shape, dtype) in enumerate(layouts))
            raise _alike(ValueError(f"the ranks' rows differ ({found}); gather rows of one "
                                    f"dtype and row shape"))
        pieces = comm.gather((self.owned, local), root=root)
        if pieces is None:
            return None
        result = np.empty((self.shape[0],) + local.shape[1:], dtype=local.dtype)
        for ids, rows in pieces:
            result[ids] = rows
        return result

    def _owners_on(self, root):
        """Owned ids of every rank, on ``root`` (None elsewhere): from the owner array where
        ``root`` holds it, else gathered (collective)."""
        if root == self._root:
            if self.comm.rank != root:
                return None
            order = np.argsort(self._owner_on_root, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(np.bincount(self._owner_on_root,
                                                                minlength=self.comm.size))])
            return [order[bounds[q]:bounds[q + 1]] for q in range(self.comm.size)]
        return self.comm.gather(self.owned, root=root)

    def allreduce_sum(self, value):
        """Sum of a number (or NumPy array) over the ranks, on every rank.

        Collective; see `comm_sum`.

        Parameters
        ----------
        value : number, array_like or tensor
            Real numbers (ints, floats or bools), of one shape on every rank.

        Returns
        -------
        int, float or ndarray
            A Python number for a number, else a new array of ``value``'s shape: float when
            any rank passed floats (float64), else an exact integer (int64).

        Raises
        ------
        TypeError
            ``value`` does not hold real numbers.
        OverflowError
            On every rank, when the sum of an integer array leaves int64.
        """
        return comm_sum(self.comm, value)


def comm_sum(comm, value, kind="allreduce"):
    """Sum over the ranks of ``comm`` of a number or array (float64 or int64 arithmetic):
    a number comes back as a Python number, anything with a shape (an array, a list, a
    tensor of several values) as a new NumPy array of that shape.

    Each rank may pass integers or floats whatever the others pass (a rank with nothing to
    count often holds the int 0 where the others hold floats): the sum is a float when any
    rank passed one, else an exact integer (an integer array whose sum leaves int64 raises
    an OverflowError on every rank). The ranks must pass the same shape."""
    is_array = isinstance(value, np.ndarray)
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        # A torch tensor, through its own conversion (NumPy's asks torch's __array__ for a
        # copy keyword it does not take, with a DeprecationWarning).
        value = value.detach().cpu().numpy()
    values = np.asarray(value)
    # Floating by the value's dtype, not its Python type: a NumPy float32 scalar or a torch
    # scalar is no Python float, and was summed as an int64 (0.5 became 0).
    if values.dtype.kind not in "biuf":
        raise TypeError(f"the sum over the ranks adds real numbers, got "
                        f"{type(value).__name__} of dtype {values.dtype}")
    floating = values.dtype.kind == "f"
    flat = values.reshape(-1)
    # One float64 buffer on every rank, whatever this rank's values are: a rank reducing
    # int64 while another reduced float64 added the bits of one to those of the other (both
    # 8 bytes, so MPI cannot tell). Two counters follow the values: ranks that passed floats,
    # and ranks whose integers are too large to be summed exactly in float64.
    exact_below = 2.0 ** 53 / comm.size  # P such terms, and every partial sum, are exact
    buffer = np.zeros(flat.size + 2, dtype=np.float64)
    if floating:
        buffer[:-2] = flat
        buffer[-2] = 1
    else:
        # Rounded where too large, and then flagged: a uint64 past 2**63 cast to int64 here
        # was counted as a negative number.
        buffer[:-2] = flat
        buffer[-1] = bool(flat.size) and float(np.abs(buffer[:-2]).max()) > exact_below
    comm.Allreduce(buffer, kind=kind)
    if buffer[-2]:
        total = buffer[:-2]
    elif buffer[-1]:
        # Every rank passed integers (no float was counted), some too large for float64:
        # agreed by every rank from the same counters, so all take this second reduction.
        # It adds the high and the low 32 bits apart, whose sums fit int64, and is exact
        # (an int64 sum wrapped past 2**63 without a word).
        if flat.dtype.kind == "u":
            wide = flat.astype(np.uint64)
            high = (wide >> np.uint64(32)).astype(np.int64)
            low = (wide & np.uint64(0xFFFFFFFF)).astype(np.int64)
        else:
            wide = flat.astype(np.int64)
            high, low = wide >> 32, wide & 0xFFFFFFFF
        halves = comm.Allreduce(np.concatenate([high, low]), kind=kind)
        exact = [(top << 32) + bottom for top, bottom in zip(halves[:flat.size].tolist(),
                                                             halves[flat.size:].tolist())]
        if not (is_array or values.shape != ()):
            return exact[0]
        if any(not -2 ** 63 <= value < 2 ** 63 for value in exact):
            raise _alike(OverflowError(
                f"the sum over the ranks of an integer array leaves int64 (its largest "
                f"element: {max(exact, key=abs)}); pass floats or smaller integers"))
        total = np.array(exact, dtype=np.int64)
    else:
        total = buffer[:-2].astype(np.int64)
    if is_array or values.shape != ():
        return total.reshape(values.shape)
    return total[0].item()
