"""Graph partitioning against brute-force oracles on seeded random and hostile inputs.

Checked: every node has exactly one owner in ``[0, nparts)``; `Partition`'s figures (rows,
stored entries, halo sizes, peers, edge cut, balances) equal plain loops over the stored
entries, duplicates included; a fixed seed gives the same owners; `graph_digest` does not
depend on how a graph is stored; the local pieces of `local_pieces` put back together give the
matrix's entries (values, duplicates and explicit zeros) and their halos and `send_lists` equal
a brute-force computation. The graphs come in every input form (scipy CSR, CSC and COO,
pysparse_hpc arrays, int32 and int64 indices, unsorted rows, duplicates, self loops, isolated
nodes, non-symmetric patterns, empty and one-node graphs), with every method and balance.
Hostile inputs (arrays rewritten in place, inconsistent COO coordinates, bad counts and owner
arrays) must be refused with a ValueError or TypeError that names the problem; those that
crashed the interpreter run in a child process.
"""
import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc.distributed._plan import local_pieces, send_lists
from pysparse_hpc.distributed.partition import (Partition, _as_pattern, check_balance,
                                                graph_digest, partition)

from .conftest import run_child

BALANCES = {"metis": [None, "rows", "nnz", "rows+nnz", 0, 0.4, 3, 1e9],
            "contiguous": [None, "rows", "nnz", 0, 0.4, 3, 1e9],
            "random": [None, "rows"]}


# -- oracles ----------------------------------------------------------------------------------

def _brute_figures(rows, cols, owner, nparts):
    """Every figure of `Partition` by a loop over the stored entries ``(rows[k], cols[k])``."""
    owned_nnz = [0] * nparts
    halos = [set() for _ in range(nparts)]
    senders = [set() for _ in range(nparts)]
    cut = 0
    for i, j in zip(rows.tolist(), cols.tolist()):
        p = int(owner[i])
        owned_nnz[p] += 1
        if owner[j] != p:
            cut += 1
            halos[p].add(j)
            senders[p].add(int(owner[j]))
    owned_rows = np.bincount(owner, minlength=nparts).tolist()
    return dict(owned_rows=owned_rows, owned_nnz=owned_nnz,
                halo_sizes=[len(h) for h in halos], peers=[len(s) for s in senders],
                edge_cut=cut)


def _balance(counts):
    return 1.0 if sum(counts) == 0 else max(counts) * len(counts) / sum(counts)


def _assert_figures(part, rows, cols, n, nparts):
    owner = part.owner
    assert owner.shape == (n,) and owner.dtype == np.int64
    assert n == 0 or (owner.min() >= 0 and owner.max() < nparts)
    assert part.nparts == nparts and part.n_nodes == n and part.nnz == rows.size
    expected = _brute_figures(rows, cols, owner, nparts)
    for name in ("owned_rows", "owned_nnz", "halo_sizes", "peers"):
        assert getattr(part, name).tolist() == expected[name], name
    assert part.edge_cut == expected["edge_cut"]
    assert part.communication_volume == sum(expected["halo_sizes"])
    assert part.cagnet_volume == (nparts - 1) * n
    assert part.row_balance == pytest.approx(_balance(expected["owned_rows"]), rel=1e-12)
    assert part.nnz_balance == pytest.approx(_balance(expected["owned_nnz"]), rel=1e-12)
    for rank in range(min(nparts, 20)):
        np.testing.assert_array_equal(part.rows_of(rank), np.flatnonzero(owner == rank))


def _assert_pieces(indptr, indices, data, owner, nparts):
    """The pieces put back together are the matrix; halos and send lists by brute force."""
    n = owner.size
    pieces = local_pieces(indptr, indices, data, owner, nparts)
    assert [piece.rank for piece in pieces] == list(range(nparts))
    got = []
    for piece in pieces:
        assert piece.owned.tolist() == np.flatnonzero(owner == piece.rank).tolist()
        halo = {int(j) for i in piece.owned for j in indices[indptr[i]:indptr[i + 1]]
                if owner[j] != piece.rank}
        assert piece.halo.tolist() == sorted(halo, key=lambda j: (owner[j], j))
        assert piece.recv_counts.tolist() == np.bincount(
            owner[sorted(halo)], minlength=nparts).tolist()
        assert piece.recv_counts[piece.rank] == 0
        columns = np.concatenate([piece.owned, piece.halo])
        local_rows = np.repeat(piece.owned, np.diff(piece.indptr))
        for start, stop in zip(piece.indptr[:-1], piece.indptr[1:]):
            assert np.all(np.diff(piece.indices[start:stop]) >= 0)
        got += zip(local_rows.tolist(), columns[piece.indices].tolist(), piece.data.tolist())
    rows = np.repeat(np.arange(n), np.diff(indptr))
    assert sorted(got) == sorted(zip(rows.tolist(), np.asarray(indices).tolist(),
                                     np.asarray(data).tolist()))
    lists = send_lists(pieces)
    for sender in pieces:
        for receiver in pieces:
            expected = [int(np.searchsorted(sender.owned, j)) for j in receiver.halo
                        if owner[j] == sender.rank]
            assert lists[sender.rank][receiver.rank].tolist() == expected


# -- inputs -----------------------------------------------------------------------------------

def _random_entries(rng, n):
    """Rows, columns and values of a random graph of one of several shapes."""
    kind = int(rng.integers(0, 5))
    nnz = int(rng.choice([0.0, 0.03, 0.15, 0.4]) * n * n)
    rows, cols = rng.integers(0, max(n, 1), nnz), rng.integers(0, max(n, 1), nnz)
    if kind == 1 and nnz:      # duplicates
        rows, cols = np.tile(rows, 2)[:nnz + nnz // 2], np.tile(cols, 2)[:nnz + nnz // 2]
    elif kind == 2:            # self loops on every node
        rows, cols = np.append(rows, np.arange(n)), np.append(cols, np.arange(n))
    elif kind == 3:            # the first half of the nodes isolated
        keep = (rows >= n // 2) & (cols >= n // 2)
        rows, cols = rows[keep], cols[keep]
    values = rng.standard_normal(rows.size)
    values[rng.random(rows.size) < 0.2] = 0.0  # explicit zeros
    return rows.astype(np.int64), cols.astype(np.int64), values


def _as_input(rng, n, rows, cols, values, form, index_dtype):
    """The entries as ``form``, rows unsorted within and duplicates kept."""
    if form == "coo":
        return scipy.sparse.coo_array((values, (rows.astype(index_dtype),
                                                cols.astype(index_dtype))), shape=(n, n))
    shuffle = rng.permutation(rows.size)
    rows, cols, values = rows[shuffle], cols[shuffle], values[shuffle]
    by_row = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
    csr = scipy.sparse.csr_array((values[by_row], cols[by_row].astype(index_dtype),
                                  indptr.astype(index_dtype)), shape=(n, n))
    return {"csr": csr, "csc": csr.tocsc(), "csr_matrix": scipy.sparse.csr_matrix(csr),
            "pysparse_hpc": sph.csr_array(csr)}[form]


# -- the sweep --------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_seeded_sweep_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n = int(rng.choice([0, 1, 2, 3, 5, 8, 13, 24]))
        rows, cols, values = _random_entries(rng, n)
        form = str(rng.choice(["coo", "csr", "csc", "csr_matrix", "pysparse_hpc"]))
        adj = _as_input(rng, n, rows, cols, values, form, rng.choice([np.int32, np.int64]))
        nparts = int(rng.choice([1, 2, 3, 5, 9, 40]))
        method = str(rng.choice(["metis", "contiguous", "random"]))
        balance = BALANCES[method][int(rng.integers(0, len(BALANCES[method])))]
        part_seed = int(rng.choice([0, 1, 2**31 + 5, 2**63 - 1]))
        part = partition(adj, nparts, method=method, seed=part_seed, balance=balance)
        again = partition(adj, nparts, method=method, seed=part_seed, balance=balance)
        np.testing.assert_array_equal(again.owner, part.owner)
        _assert_figures(part, rows, cols, n, nparts)
        given = Partition.from_owner(adj, part.owner, nparts=nparts)
        assert given.edge_cut == part.edge_cut and given.halo_sizes.tolist() == \
            part.halo_sizes.tolist()
        canonical = sph.csr_array((values, (rows, cols)), shape=(n, n))
        assert graph_digest(*_as_pattern(adj)) == graph_digest(
            canonical.indptr, canonical.indices, n)
        _assert_pieces(canonical.indptr, canonical.indices, canonical.data, part.owner, nparts)


@pytest.mark.parametrize("seed", range(2))
def test_local_pieces_keep_duplicates_and_any_index_type(seed):
    """Non-canonical rows (duplicates, explicit zeros), int32 owners and indices, read-only
    and non-contiguous arrays: the pieces still hold exactly the stored entries."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        n, nparts = int(rng.integers(1, 20)), int(rng.integers(1, 6))
        nnz = int(rng.integers(0, 3 * n))
        rows = np.sort(rng.integers(0, n, nnz))
        rows = np.sort(np.concatenate([rows, rows[:nnz // 2]]))
        cols = rng.integers(0, n, rows.size)
        index_dtype = rng.choice([np.int32, np.int64])
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        indptr, indices = indptr.astype(index_dtype), cols.astype(index_dtype)
        data = np.repeat(np.where(rng.random(rows.size) < 0.3, 0.0,
                                  rng.standard_normal(rows.size)), 2)[::2]
        owner = rng.integers(0, nparts, n).astype(rng.choice([np.int32, np.int64]))
        for array in (indptr, indices, owner):
            array.flags.writeable = False
        _assert_pieces(indptr, indices, data, owner, nparts)


# -- hostile inputs ---------------------------------------------------------------------------

_REWRITTEN = """
import numpy as np, scipy.sparse
import pysparse_hpc as sph
from pysparse_hpc.distributed.partition import Partition, partition
S = scipy.sparse.random_array((12, 12), density=0.3, random_state=1, format="csr")
for change in ("negative column", "column past n", "indptr past nnz", "indptr decreasing"):
    for method in ("metis", "contiguous", "random", "from_owner"):
        A = sph.csr_array(S, copy=True)
        if change == "negative column":
            A.indices[0] = -1
        elif change == "column past n":
            A.indices[3] = 12
        elif change == "indptr past nnz":
            A.indptr[-1] += 5
        else:
            A.indptr[3] = A.indptr[5] + 1
        try:
            if method == "from_owner":
                Partition.from_owner(A, np.zeros(12, dtype=np.int64))
            else:
                partition(A, 3, method)
        except ValueError as exc:
            assert "adj is not a valid sparse matrix" in str(exc), (change, method, exc)
        else:
            raise AssertionError(f"{change} taken by {method}")
print("refused")
"""


def test_arrays_rewritten_in_place_are_refused():
    """A pysparse_hpc array's index arrays written in place after construction were taken
    unchecked: METIS aborted or segfaulted the process, the other methods raised NumPy's
    IndexError or broadcasting errors (or, with one part, gave figures of no graph)."""
    assert "refused" in run_child(_REWRITTEN, timeout=120).stdout


def test_inconsistent_coo_coordinates_are_refused():
    """scipy lets a COO array's coordinates be replaced unchecked: a row array shorter than
    the columns paired the wrong entries, and float coordinates were truncated, silently."""
    def coo():
        return scipy.sparse.random_array((12, 12), density=0.3, random_state=1, format="coo")
    short = coo()
    short.row = short.row[:-1]
    floats = coo()
    floats.coords = (floats.row.astype(float) + 0.7, floats.col)
    column = coo()
    column.coords = (column.row[:, None], column.col[:, None])
    for adj, message in ((short, "must have the same length"),
                         (floats, "row indices have dtype float64; expected integers"),
                         (column, "must be 1-D")):
        for method in ("metis", "contiguous", "random"):
            with pytest.raises(ValueError, match="adj is not a valid sparse matrix: .*"
                                                 + message):
                partition(adj, 2, method)
        with pytest.raises(ValueError, match=message):
            Partition.from_owner(adj, np.zeros(12, dtype=np.int64))


@pytest.mark.parametrize("nparts, error", [
    (True, TypeError), (np.bool_(True), TypeError), (2.0, TypeError), ("2", TypeError),
    (None, TypeError), (np.array([2]), TypeError), (0, ValueError), (-3, ValueError),
    (2**31, ValueError), (2**80, ValueError)])
def test_bad_numbers_of_parts(nparts, error):
    adj = scipy.sparse.csr_array(np.ones((4, 4)))
    for method in ("metis", "contiguous", "random"):
        with pytest.raises(error, match="nparts"):
            partition(adj, nparts, method)


def test_integer_like_numbers_of_parts_give_the_int_result():
    import torch
    adj = scipy.sparse.random_array((30, 30), density=0.1, random_state=2, format="csr")
    for method in ("metis", "contiguous", "random"):
        expected = partition(adj, 3, method, seed=4).owner
        for nparts in (np.int8(3), np.uint64(3), torch.tensor(3)):
            np.testing.assert_array_equal(partition(adj, nparts, method, seed=4).owner,
                                          expected)


@pytest.mark.parametrize("owner, nparts, error, message", [
    ([0] * 5, None, ValueError, "5 owners but the graph has 6 nodes"),
    ([0] * 7, None, ValueError, "7 owners but the graph has 6 nodes"),
    ([0, 0, -1, 0, 0, 0], None, ValueError, r"owner\[2\] is -1, outside \[0, 1\)"),
    ([0, 0, 0, 0, 0, 4], 3, ValueError, r"owner\[5\] is 4, outside \[0, 3\)"),
    ([0.0] * 6, None, TypeError, "must hold integers, got dtype float64"),
    ([True] * 6, None, TypeError, "must hold integers, got dtype bool"),
    ([[0] * 6], None, ValueError, "must be 1-D"),
    (0, None, ValueError, "must be 1-D"),
    ([2**70] + [0] * 5, None, TypeError, "must hold integers"),
    (np.array([2**64 - 1] + [0] * 5, dtype=np.uint64), None, ValueError, "beyond any number"),
    ([0] * 6, 2.0, TypeError, "nparts must be an integer"),
    ([0] * 6, True, TypeError, "nparts must be an integer"),
    ([0] * 6, 0, ValueError, "nparts must be a positive integer")])
def test_bad_owner_arrays(owner, nparts, error, message):
    adj = scipy.sparse.csr_array(np.eye(6))
    with pytest.raises(error, match=message):
        Partition(adj, owner, nparts=nparts)


def test_owner_arrays_of_any_layout():
    adj = scipy.sparse.random_array((10, 10), density=0.3, random_state=3, format="csr")
    owner = np.arange(10) % 3
    expected = Partition(adj, owner)
    strided = np.repeat(owner, 2)[::2]
    read_only = owner.astype(np.int8)
    read_only.flags.writeable = False
    for given in (strided, read_only, owner.astype(">i8"), owner.astype(np.uint16),
                  owner.tolist()):
        part = Partition(adj, given)
        np.testing.assert_array_equal(part.owner, owner)
        assert part.halo_sizes.tolist() == expected.halo_sizes.tolist()
    assert read_only.dtype == np.int8 and not read_only.flags.writeable


@pytest.mark.parametrize("adj", [np.eye(3), [[1, 0], [0, 1]], "graph", None])
def test_non_sparse_inputs_are_type_errors(adj):
    with pytest.raises(TypeError, match="adj must be a sparse array"):
        partition(adj, 2, "random")


def test_a_torch_edge_index_is_a_type_error():
    import torch
    with pytest.raises(TypeError, match="adj must be a sparse array"):
        partition(torch.tensor([[0, 1], [1, 0]]), 2, "contiguous")


@pytest.mark.parametrize("method", ["metis", "contiguous", "random"])
def test_tiny_graphs(method):
    for n in (0, 1):
        for nparts in (1, 2, 5):
            adj = scipy.sparse.csr_array(np.ones((n, n)))
            part = partition(adj, nparts, method)
            assert part.owner.tolist() == [0] * n and part.owned_rows.sum() == n
            assert part.edge_cut == 0 and part.communication_volume == 0


def test_check_balance_normalizes_and_refuses():
    assert [check_balance(None, m) for m in ("metis", "contiguous", "random")] == [
        "rows", "nnz", "rows"]
    assert check_balance(np.float32(2.5), "contiguous") == 2.5
    for balance, method in ((-1, "metis"), (float("nan"), "contiguous"), (1e10, "metis"),
                            (True, "metis"), ("nnz", "random"), ("rows+nnz", "contiguous"),
                            ("ROWS", "metis"), (np.array(3.0), "metis"), ("rows", "bogus")):
        with pytest.raises(ValueError):
            check_balance(balance, method)


def test_large_seeds_reach_a_32_bit_metis_as_a_c_int(monkeypatch):
    """METIS built with 32-bit indices (as pymetis may be elsewhere) holds its options in
    int32: a seed from 2**31 up raised NumPy's OverflowError in the two-weight path instead of
    reaching METIS, which reads its low 32 bits anyway."""
    import ctypes

    from pysparse_hpc.distributed import _metis

    seeds = []

    class FakeLibrary:
        idx = np.int32
        seed_option, numbering_option = 8, 17

        @staticmethod
        def set_default_options(options):
            view = ctypes.cast(options, ctypes.POINTER(ctypes.c_int32))
            for k in range(_metis._METIS_NOPTIONS):
                view[k] = -1

        @staticmethod
        def recursive(n, ncon, xadj, adjncy, vwgt, vsize, adjwgt, nparts, tpwgts, ubvec,
                      options, cut, owner):
            seeds.append(ctypes.cast(options, ctypes.POINTER(ctypes.c_int32))[8])
            count = ctypes.cast(n, ctypes.POINTER(ctypes.c_int32))[0]
            ctypes.memset(owner, 0, 4 * count)
            return _metis._METIS_OK

        kway = recursive

    monkeypatch.setattr(_metis, "_c_library", lambda pymetis: FakeLibrary)
    adj = scipy.sparse.random_array((20, 20), density=0.2, random_state=5, format="csr")
    for seed in (7, 2**31 + 7, 2**32 + 7, 2**63 - 1):
        part = partition(adj, 2, "metis", seed=seed, balance="rows+nnz")
        assert part.owner.tolist() == [0] * 20
    assert seeds == [7, -2**31 + 7, 7, -1]
