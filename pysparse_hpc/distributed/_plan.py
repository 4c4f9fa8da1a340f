"""Halo plans: which rows of a row-partitioned graph each rank keeps, receives and sends.

Pure NumPy on the global CSR arrays and an owner per node, so every rank's plan can be built and
checked in one process. Rank p keeps the rows it owns, in ascending global id, and numbers the
columns they reference as: its own nodes first (local id = position among its owned nodes),
then its **halo** (nodes of other ranks that its rows reference), grouped by owner and ascending
within each owner. Halo rows from rank q therefore land in one contiguous slice, and q sends
them in that order: its send list for p is p's halo slice from q, in q's local row ids.
"""
from dataclasses import dataclass

import numpy as np

__all__ = ["LocalPiece", "local_pieces", "send_lists"]


@dataclass(frozen=True)
class LocalPiece:
    """What one rank holds of the graph.

    Attributes
    ----------
    rank : int
    owned : ndarray of int64
        Global ids of the rank's rows, ascending.
    halo : ndarray of int64
        Global ids of its halo columns, grouped by owner (ascending), ascending within a group.
    recv_counts : ndarray of int64, shape (nparts,)
        Halo rows owned by each rank (0 for itself).
    indptr, indices, data : ndarray
        The owned rows as canonical CSR over the local columns (``len(owned) + len(halo)``).
    """

    rank: int
    owned: np.ndarray
    halo: np.ndarray
    recv_counts: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray

    @property
    def recv_offsets(self):
        """Where each owner's halo rows start in ``halo`` (length nparts + 1)."""
        return np.concatenate([[0], np.cumsum(self.recv_counts)])

    def halo_from(self, rank):
        """Global ids of the halo rows owned by ``rank``."""
        offsets = self.recv_offsets
        return self.halo[offsets[rank]:offsets[rank + 1]]


def _row_entries(indptr, rows):
    """Positions of the stored entries of ``rows`` (in that order) and each row's length."""
    starts = indptr[rows].astype(np.int64)
    lengths = indptr[rows + 1].astype(np.int64) - starts
    total = int(lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if rows.size else np.zeros(0, np.int64)
    positions = np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)
    return positions, lengths


def local_pieces(indptr, indices, data, owner, nparts, ranks=None):
    """The `LocalPiece` of each rank of ``ranks`` (default: every rank).

    Parameters
    ----------
    indptr, indices, data : ndarray
        A canonical CSR matrix, n x n.
    owner : ndarray of int64, shape (n,)
        Owner rank of every node, in ``[0, nparts)`` (validated by the caller).
    nparts : int
    ranks : iterable of int, optional

    Returns
    -------
    list of LocalPiece
    """
    n = owner.size
    owner = owner.astype(np.int64, copy=False)
    by_owner = np.argsort(owner, kind="stable")  # owned ids of each rank, ascending
    bounds = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=nparts))])
    pieces = []
    for rank in (range(nparts) if ranks is None else ranks):
        owned = by_owner[bounds[rank]:bounds[rank + 1]].astype(np.int64)
        positions, lengths = _row_entries(indptr, owned)
        cols = indices[positions].astype(np.int64)
        col_owner = owner[cols]
        is_own = col_owner == rank
        keys = col_owner[~is_own] * n + cols[~is_own]
        halo_keys = np.unique(keys)
        halo = halo_keys % n if n else halo_keys
        recv_counts = np.bincount(halo_keys // max(n, 1), minlength=nparts).astype(np.int64)
        local_cols = np.empty(cols.size, dtype=np.int64)
        local_cols[is_own] = np.searchsorted(owned, cols[is_own])
        local_cols[~is_own] = owned.size + np.searchsorted(halo_keys, keys)
        local_rows = np.repeat(np.arange(owned.size, dtype=np.int64), lengths)
        order = np.lexsort((local_cols, local_rows))
        local_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        pieces.append(LocalPiece(rank, owned, halo, recv_counts, local_indptr,
                                 local_cols[order], data[positions][order]))
    return pieces


def send_lists(pieces):
    """Every rank's send lists from all ranks' pieces (the one-process form of the exchange
    that `DistGraph` makes with ``alltoall``): ``lists[p][q]`` holds the local row ids rank p
    sends to rank q, in the order q stores them."""
    return [[np.searchsorted(sender.owned, receiver.halo_from(sender.rank))
             for receiver in pieces] for sender in pieces]
