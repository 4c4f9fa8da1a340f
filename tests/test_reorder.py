"""Graph reordering: valid permutations, exact permuting, the plain references, quality checks."""
import sys

import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import reverse_cuthill_mckee

import pysparse_hpc as sph
from pysparse_hpc.generators import planted_partition
from pysparse_hpc.io import load_npz

from .conftest import GRAPH_FILES, SUITESPARSE_FILES, random_scipy, requires_data, run_isolated
from .reference import reference_rabbit, reference_rcm, symmetric_neighbours

METHODS = ["rabbit", "rcm", "degree", "none"]
SHARED_FILES = SUITESPARSE_FILES + [path for path in GRAPH_FILES if path.is_file()]


def load_shared(path):
    return load_npz(path, prefix="" if path.parent.name == "suitesparse" else "adj_")


def assert_permutation(perm, n):
    assert perm.dtype == np.int64 and perm.shape == (n,)
    assert np.array_equal(np.sort(perm), np.arange(n))


def assert_identical_csr(a, b):
    """Same shape, index arrays and values, bit for bit (explicit zeros and dtypes included)."""
    assert a.shape == b.shape and a.dtype == b.dtype and a.index_dtype == b.index_dtype
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.data.view(np.uint8), b.data.view(np.uint8))


def disjoint_cliques(n_cliques, size, rng):
    """Cliques of ``size`` nodes, node ids shuffled; returns the matrix and each node's clique."""
    labels = np.repeat(np.arange(n_cliques), size)
    dense = (labels[:, None] == labels[None, :]).astype(np.float32)
    np.fill_diagonal(dense, 0)
    shuffle = rng.permutation(labels.size)
    return sph.csr_array(dense[shuffle][:, shuffle]), labels[shuffle]


# -- every method returns a deterministic permutation ---------------------------------------

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n, density", [(0, 0.0), (1, 0.0), (1, 1.0), (7, 0.0), (50, 0.05),
                                        (200, 0.02)])
def test_valid_permutation_on_edge_cases(rng, method, n, density):
    S = random_scipy(rng, (n, n), density, duplicates=True)
    perm = sph.reorder(S, method=method)
    assert_permutation(perm, n)
    np.testing.assert_array_equal(sph.reorder(S, method=method), perm)


@requires_data
@pytest.mark.parametrize("path", SHARED_FILES, ids=lambda p: p.stem)
def test_valid_permutations_on_shared_matrices(path):
    A = load_shared(path)
    for method in METHODS:
        assert_permutation(sph.reorder(A, method=method), A.shape[0])


@pytest.mark.parametrize("method", ["rabbit", "rcm", "degree"])
def test_uses_the_symmetrized_pattern_only(rng, method):
    S = random_scipy(rng, (120, 120), 0.03)
    directed = sph.reorder(S, method=method)
    np.testing.assert_array_equal(sph.reorder(S.T, method=method), directed)
    pattern = scipy.sparse.csr_array((np.ones(S.nnz) * 7.0, S.indices, S.indptr), shape=S.shape)
    np.testing.assert_array_equal(sph.reorder(pattern + pattern.T, method=method), directed)
    with_diagonal = S + scipy.sparse.eye_array(120)
    np.testing.assert_array_equal(sph.reorder(with_diagonal, method=method), directed)
    int64 = sph.csr_array(S, index_dtype=np.int64)
    np.testing.assert_array_equal(sph.reorder(int64, method=method), directed)
    np.testing.assert_array_equal(sph.reorder(int64.to_mebcrs(), method=method), directed)


# -- the Cython orderings equal the plain references ----------------------------------------

@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 70), density=st.floats(0.0, 0.15), seed=st.integers(0, 2**32 - 1))
def test_orders_match_plain_references(n, density, seed):
    S = random_scipy(np.random.default_rng(seed), (n, n), density)
    neighbours = symmetric_neighbours(S)
    np.testing.assert_array_equal(sph.reorder(S, "rcm"), reference_rcm(neighbours))
    np.testing.assert_array_equal(sph.reorder(S, "rabbit"), reference_rabbit(neighbours))


def test_orders_match_plain_references_on_cora():
    A = sph.datasets.load("cora").adj
    neighbours = symmetric_neighbours(A.to_scipy())
    np.testing.assert_array_equal(sph.reorder(A, "rcm"), reference_rcm(neighbours))
    np.testing.assert_array_equal(sph.reorder(A, "rabbit"), reference_rabbit(neighbours))


def grid_graph(rows, cols):
    """The rows x cols grid: symmetric starts tie on bandwidth, so tie-breaks are exercised."""
    index = np.arange(rows * cols).reshape(rows, cols)
    edges = np.concatenate([np.stack([index[:, :-1].ravel(), index[:, 1:].ravel()], 1),
                            np.stack([index[:-1, :].ravel(), index[1:, :].ravel()], 1)])
    n = rows * cols
    A = scipy.sparse.coo_array((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return sph.csr_array((A + A.T).tocsr())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rcm_does_not_depend_on_the_thread_count(threads):
    # Components of 1024 vertices and more try their starts in parallel; the winner (smallest
    # bandwidth, earliest start on a tie) must not depend on which thread finishes first.
    from pysparse_hpc._cy.reorder import rcm_order
    from pysparse_hpc._reorder import _symmetric_graph

    for A in [grid_graph(36, 40), sph.datasets.load("cora").adj]:
        indptr, indices = _symmetric_graph(A)
        np.testing.assert_array_equal(rcm_order(indptr, indices, threads),
                                      reference_rcm(symmetric_neighbours(A.to_scipy())))


def _rcm_peak_bytes(A, threads):
    """The peak of memory allocated by RCM of ``A`` on ``threads`` threads (`tracemalloc`),
    after checking that its order is the one-thread order."""
    import tracemalloc

    from pysparse_hpc._cy.reorder import rcm_order
    from pysparse_hpc._reorder import _symmetric_graph

    indptr, indices = _symmetric_graph(A)
    expected = rcm_order(indptr, indices, 1)
    tracemalloc.start()
    try:
        np.testing.assert_array_equal(rcm_order(indptr, indices, threads), expected)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_rcm_thread_buffers_do_not_grow_past_the_starts():
    # Each thread holds up to 9 bytes a vertex (its visited flags, and an order buffer as long
    # as the largest component searched in parallel); a component has at most 10 starts, so
    # threads past 10 only cost memory (64 threads took 1.1 kB a vertex, an out-of-memory on
    # many cores).
    n = 4096
    assert _rcm_peak_bytes(grid_graph(64, n // 64), 64) < 300 * n


def test_rcm_thread_buffers_are_sized_by_the_largest_parallel_component():
    # A small grid among many isolated vertices, then grids of growing sizes: the threads'
    # order buffers follow the largest component that takes the parallel path, not the graph
    # (sized by the graph, 10 threads held 203 bytes a vertex here; now about 43), and they
    # grow from one component to the next without changing the order.
    from pysparse_hpc._cy.reorder import rcm_order
    from pysparse_hpc._reorder import _symmetric_graph

    isolated = 200_000
    grid = grid_graph(32, 40).to_scipy()
    A = sph.csr_array(scipy.sparse.block_diag(
        [grid, scipy.sparse.csr_array((isolated, isolated))], format="csr"))
    assert _rcm_peak_bytes(A, 10) < 60 * A.shape[0]

    growing = sph.csr_array(scipy.sparse.block_diag(
        [grid_graph(rows, 40).to_scipy() for rows in (26, 40, 30, 52)], format="csr"))
    indptr, indices = _symmetric_graph(growing)
    reference = reference_rcm(symmetric_neighbours(growing.to_scipy()))
    for threads in (2, 3, 10):
        np.testing.assert_array_equal(rcm_order(indptr, indices, threads), reference)


def test_degree_order_is_descending_and_stable(rng):
    S = random_scipy(rng, (300, 300), 0.01)
    perm = sph.reorder(S, "degree")
    pattern = (abs(S) + abs(S.T)).tocsr()
    pattern.setdiag(0)
    pattern.eliminate_zeros()
    degree = np.diff(pattern.indptr)
    np.testing.assert_array_equal(perm, np.lexsort((np.arange(300), -degree)))


# -- quality --------------------------------------------------------------------------------

def test_rcm_recovers_a_shuffled_path(rng):
    n = 500
    path = scipy.sparse.diags_array([np.ones(n - 1), np.ones(n - 1)], offsets=[-1, 1])
    shuffle = rng.permutation(n)
    shuffled = sph.permute(sph.csr_array(path), shuffle)
    assert sph.bandwidth(shuffled) > 100
    assert sph.bandwidth(sph.permute(shuffled, sph.reorder(shuffled, "rcm"))) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_rabbit_frees_the_collapsed_lists_it_has_read():
    """Each merged vertex leaves a list of its collapsed edges for its parent, read once. Kept
    to the end, they held every edge again at each level of the merge forest: 150 bytes per
    entry of a random graph, against RCM's 20 (the graph's symmetric pattern and a few arrays
    per vertex). The peak is read from the resident set's high-water mark in a process of its
    own, reset just before the call."""
    out = run_isolated("""
import gc
import numpy as np
import pysparse_hpc as sph

def kilobytes(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))

rng = np.random.default_rng(0)
n, edges = 200_000, 2_000_000
rows, cols = rng.integers(0, n, edges), rng.integers(0, n, edges)
A = sph.csr_array((np.ones(edges), (rows, cols)), shape=(n, n), index_dtype=np.int32)
del rows, cols
sph.reorder(sph.csr_array(np.eye(4)), method="rabbit")   # imports, first calls
gc.collect()
before = kilobytes("VmRSS")
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")
order = sph.reorder(A, method="rabbit")
print((kilobytes("VmHWM") - before) * 1024 / A.nnz, np.array_equal(np.sort(order), np.arange(n)))
""")
    bytes_per_entry, permutation = out.split()
    assert permutation == "True"
    assert float(bytes_per_entry) < 90, bytes_per_entry


def test_rabbit_puts_each_clique_together(rng):
    A, clique = disjoint_cliques(30, 8, rng)
    perm = sph.reorder(A, "rabbit")
    runs = clique[perm].reshape(30, 8)
    assert np.all(runs == runs[:, :1])      # every window of 8 is one whole clique
    assert sph.block_stats(sph.permute(A, perm)).n_vectors == 30 * 8


@requires_data
@pytest.mark.parametrize("path", SHARED_FILES, ids=lambda p: p.stem)
def test_rcm_bandwidth_no_worse_than_scipy(path):
    A = load_shared(path)
    ours = sph.bandwidth(sph.permute(A, sph.reorder(A, "rcm")))
    scipy_perm = reverse_cuthill_mckee(A.to_scipy().tocsr())
    theirs = sph.bandwidth(sph.permute(A, scipy_perm.astype(np.int64)))
    assert ours <= theirs


def test_rabbit_recovers_planted_communities():
    planted, _ = planted_partition(200, 32, internal_degree=8, external_degree=2, seed=3)
    shuffled, _ = planted_partition(200, 32, internal_degree=8, external_degree=2, seed=3,
                                    shuffle=True)
    rabbit = sph.permute(shuffled, sph.reorder(shuffled, "rabbit"))
    planted_vectors = sph.block_stats(planted).n_vectors
    shuffled_vectors = sph.block_stats(shuffled).n_vectors
    rabbit_vectors = sph.block_stats(rabbit).n_vectors
    assert rabbit_vectors <= 1.3 * planted_vectors
    assert shuffled_vectors >= 1.3 * rabbit_vectors


# -- permute ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_permute_then_unpermute_is_exact(rng, dtype, index_dtype):
    S = random_scipy(rng, (90, 90), 0.05, dtype=np.float64)
    S.data[::7] = 0.0                                   # explicit zeros survive
    A = sph.csr_array(S, dtype=dtype, index_dtype=index_dtype)
    perm = sph.reorder(A, "rabbit")
    B = sph.permute(A, perm)
    assert B.has_canonical_format
    np.testing.assert_array_equal(B.toarray(), A.toarray()[perm][:, perm])
    assert_identical_csr(sph.permute(B, sph.inverse_permutation(perm)), A)


def test_permute_keeps_duplicates_and_does_not_touch_input(rng):
    S = random_scipy(rng, (40, 40), 0.1, duplicates=True)
    A = sph.csr_array(S)
    before = (A.indptr.copy(), A.indices.copy(), A.data.copy())
    perm = rng.permutation(40)
    B = sph.permute(A, perm)
    assert B.nnz == A.nnz and B.has_sorted_indices
    np.testing.assert_allclose(B.toarray(), S.toarray()[perm][:, perm])
    for kept, array in zip(before, (A.indptr, A.indices, A.data)):
        np.testing.assert_array_equal(kept, array)


@pytest.mark.parametrize("fmt", ["csr", "mebcrs"])
def test_spmm_commutes_with_permutation(rng, fmt):
    A = sph.csr_array(random_scipy(rng, (150, 150), 0.04, dtype=np.float32))
    X = rng.standard_normal((150, 16)).astype(np.float32)
    perm = sph.reorder(A, "rabbit")
    B = sph.permute(A, perm)
    B = B.to_mebcrs() if fmt == "mebcrs" else B
    np.testing.assert_allclose(B @ X[perm], (A @ X)[perm], rtol=1e-5, atol=1e-5)
    inverse = sph.inverse_permutation(perm)
    np.testing.assert_allclose((B @ X[perm])[inverse], A @ X, rtol=1e-5, atol=1e-5)


def test_rows_only_and_columns_only(rng):
    S = random_scipy(rng, (30, 45), 0.1)
    rows, cols = rng.permutation(30), rng.permutation(45)
    np.testing.assert_array_equal(sph.permute_rows(S, rows).toarray(), S.toarray()[rows])
    C = sph.permute_columns(S, cols)
    assert C.has_canonical_format
    np.testing.assert_array_equal(C.toarray(), S.toarray()[:, cols])


def test_inverse_permutation():
    perm = np.array([3, 0, 2, 1])
    inverse = sph.inverse_permutation(perm)
    np.testing.assert_array_equal(perm[inverse], np.arange(4))
    np.testing.assert_array_equal(inverse[perm], np.arange(4))
    assert sph.inverse_permutation(np.array([], dtype=np.int32)).dtype == np.int64
    # A torch tensor, as permute takes it (its length was read from its size method)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(sph.inverse_permutation(torch.from_numpy(perm)), inverse)


def test_bandwidth():
    assert sph.bandwidth(sph.csr_array((5, 5))) == 0
    assert sph.bandwidth(scipy.sparse.csr_array(np.eye(5, k=-3))) == 3


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_reorder_does_not_touch_its_input(rng, method):
    S = random_scipy(rng, (60, 60), 0.08, duplicates=True)   # non-canonical: would be sorted
    A = sph.csr_array(S)
    kept = [array.copy() for array in (S.indptr, S.indices, S.data, A.indptr, A.indices, A.data)]
    sph.reorder(S, method)
    sph.reorder(A, method)
    for before, after in zip(kept, (S.indptr, S.indices, S.data, A.indptr, A.indices, A.data)):
        np.testing.assert_array_equal(before, after)
    assert not S.has_canonical_format


def test_reorder_rejects_bad_input(rng):
    S = random_scipy(rng, (10, 12), 0.2)
    with pytest.raises(ValueError, match="square"):
        sph.reorder(S)
    with pytest.raises(ValueError, match="unknown method 'metis'"):
        sph.reorder(S[:10, :10], method="metis")
    with pytest.raises(TypeError, match="sparse"):
        sph.reorder("graph")
    # A wrong shape or wrong arrays is a ValueError, by csr_array's rule, in every function
    # that takes a graph
    with pytest.raises(ValueError, match="A is not a valid matrix: expected a 2-D array"):
        sph.reorder(np.arange(5.0))
    inconsistent = (np.array([1.0, 2.0]), np.array([0]), np.array([0, 1]))
    for function in (sph.reorder, sph.bandwidth, lambda A: sph.permute(A, [0]),
                     lambda A: sph.permute_rows(A, [0]), lambda A: sph.permute_columns(A, [0])):
        with pytest.raises(ValueError, match="A is not a valid matrix: data has length 2"):
            function(inconsistent)
    unchecked = scipy.sparse.csr_matrix((np.ones(3), np.array([1, 0, 500]),
                                         np.array([0, 1, 2, 3])), shape=(3, 3))
    with pytest.raises(ValueError, match="A is not a valid sparse matrix"):
        sph.reorder(unchecked)


def test_reorder_names_the_method_type():
    A = sph.csr_array(np.eye(3, k=1))
    # An array of names was compared element by element: "truth value ... is ambiguous"
    with pytest.raises(TypeError, match="method must be a string"):
        sph.reorder(A, method=np.array(["rcm", "degree"]))
    with pytest.raises(TypeError, match="method must be a string"):
        sph.reorder(A, method=None)
    np.testing.assert_array_equal(sph.reorder(A, method=np.str_("rcm")), sph.reorder(A, "rcm"))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_reorder_says_what_to_pass_for_an_edge_index_or_a_torch_sparse_tensor():
    edge_index = np.array([[0, 1, 1, 2], [1, 0, 2, 1]])
    with pytest.raises(ValueError, match="edge_index .* not taken"):
        sph.reorder(edge_index)
    with pytest.raises(ValueError, match="permute_rows/permute_columns"):
        sph.reorder(np.ones((2, 4)))                     # a rectangular matrix, as before
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="edge_index .* not taken"):
        sph.reorder(torch.from_numpy(edge_index))
    adjacency = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    for layout in (adjacency.to_sparse_coo(), adjacency.to_sparse_csr()):
        # NumPy's refusal advised to_dense(): for a large graph, more memory than any machine
        with pytest.raises(TypeError, match=r"torch sparse tensor .*csr_array\(\(values"):
            sph.reorder(layout)


def test_explicit_zeros_are_edges():
    """As documented: a stored zero is an edge, as in `bandwidth` and the blocked formats."""
    rows, cols = np.array([0, 1, 1, 2, 2, 3, 0]), np.array([1, 0, 2, 1, 3, 2, 3])
    zero, one = (scipy.sparse.csr_array((np.r_[np.ones(6), value], (rows, cols)), shape=(4, 4))
                 for value in (0.0, 1.0))
    assert zero.nnz == 7
    for method in ("rabbit", "rcm", "degree"):
        np.testing.assert_array_equal(sph.reorder(zero, method), sph.reorder(one, method))


def test_empty_permutations_of_an_empty_graph():
    """``[]`` (a float64 array to NumPy) is the permutation of no nodes."""
    assert sph.permute(sph.csr_array((0, 0)), []).shape == (0, 0)
    assert sph.permute_rows(sph.csr_array((0, 3)), []).shape == (0, 3)
    assert sph.inverse_permutation([]).dtype == np.int64


@pytest.mark.parametrize("perm, error, message", [
    (np.arange(9), ValueError, "length 9, expected 10"),
    (np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 8]), ValueError, "holds 8 2 times"),
    (np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 10]), ValueError, r"outside \[0, 10\)"),
    (np.array([-1, 1, 2, 3, 4, 5, 6, 7, 8, 9]), ValueError, r"outside \[0, 10\)"),
    (np.arange(10.0), TypeError, "integers"),
    (np.arange(10).reshape(2, 5), ValueError, "1-D"),
])
def test_permute_rejects_bad_permutations(rng, perm, error, message):
    A = sph.csr_array(random_scipy(rng, (10, 10), 0.2))
    with pytest.raises(error, match=message):
        sph.permute(A, perm)
    with pytest.raises(error, match=message):
        sph.permute_rows(A, perm)
    with pytest.raises(error, match=message):
        sph.permute_columns(A, perm)


def test_permute_rejects_non_square_and_checks_each_side(rng):
    S = random_scipy(rng, (10, 12), 0.2)
    with pytest.raises(ValueError, match="square"):
        sph.permute(S, np.arange(10))
    with pytest.raises(ValueError, match="expected 12"):
        sph.permute_columns(S, np.arange(10))
    with pytest.raises(ValueError, match="expected 10"):
        sph.permute_rows(S, np.arange(12))
    with pytest.raises(ValueError, match="holds 1 2 times"):
        sph.inverse_permutation([0, 1, 1])


# -- the planted-community generator --------------------------------------------------------

def test_planted_partition_structure():
    A, labels = planted_partition(50, 20, internal_degree=8, external_degree=1, seed=0)
    S = A.to_scipy()
    assert A.shape == (1000, 1000) and A.has_canonical_format
    assert (abs(S - S.T)).nnz == 0 and S.diagonal().sum() == 0 and np.all(S.data == 1)
    np.testing.assert_array_equal(labels, np.arange(1000) // 20)
    coo = S.tocoo()
    inside = np.mean(labels[coo.row] == labels[coo.col])
    assert 0.8 < inside < 0.95                          # about 8 of 9 edges inside
    assert 6.5 < A.nnz / 1000 < 9.0                     # 9 less coinciding draws
    assert A.index_dtype == np.int32

    B, shuffled_labels = planted_partition(50, 20, internal_degree=8, external_degree=1, seed=0,
                                           shuffle=True)
    coo = B.to_scipy().tocoo()
    assert B.nnz == A.nnz
    assert np.mean(shuffled_labels[coo.row] == shuffled_labels[coo.col]) == inside
    assert not np.array_equal(shuffled_labels, labels)


def test_planted_partition_rejects_bad_input():
    with pytest.raises(ValueError, match=">= 1"):
        planted_partition(0, 10)
    with pytest.raises(ValueError, match="non-negative"):
        planted_partition(2, 10, internal_degree=-1)
    with pytest.raises(ValueError, match="internal_degree must be a finite number"):
        planted_partition(2, 10, internal_degree=float("nan"))
    with pytest.raises(TypeError, match="community_size must be an integer, got float"):
        planted_partition(2, 10.5)


def test_rmat_takes_integers_only():
    from pysparse_hpc.generators import rmat
    for bad, name in (({"scale": 2.7}, "scale"), ({"scale": "3"}, "scale"),
                      ({"scale": 3, "edge_factor": 1.9}, "edge_factor")):
        with pytest.raises(TypeError, match=f"{name} must be an integer"):
            rmat(**bad)
    with pytest.raises(ValueError, match="edge_factor must be >= 0, got -1"):
        rmat(3, edge_factor=-1)


def test_generators_take_torch_dtypes_and_check_the_dtype_first():
    torch = pytest.importorskip("torch")
    from pysparse_hpc.generators import rmat
    assert rmat(3, 2, dtype=torch.float64).dtype == np.float64
    assert planted_partition(2, 4, dtype=torch.float32)[0].dtype == np.float32
    # NumPy's "Cannot interpret ... as a data type", after the graph was drawn, named nothing
    with pytest.raises(TypeError, match="dtype torch.bfloat16 has no NumPy equivalent"):
        rmat(3, 2, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="dtype 'junk' is not understood"):
        planted_partition(2, 4, dtype="junk")


def test_rmat_uses_int32_indices_when_they_fit():
    from pysparse_hpc.generators import rmat
    A = rmat(8, 4, seed=3)
    assert A.index_dtype == np.int32 and A.indices.dtype == np.int32
    assert rmat(8, 4, seed=3, symmetric=True).index_dtype == np.int32


def test_rmat_quadrant_probabilities_that_sum_to_just_under_one():
    # Accepted as summing to 1; a draw above the sum once fell into no quadrant and was read
    # as quadrant c, giving edges the model forbids.
    from pysparse_hpc.generators import rmat
    A = rmat(1, edge_factor=2**20, probabilities=(0.0, 0.0, 0.0, 1 - 5e-6), seed=0)
    assert A.nnz == 1 and A.indices[0] == np.flatnonzero(np.diff(A.indptr))[0]


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (1.5, TypeError), (None, TypeError),
                                         (True, TypeError)])
def test_generators_check_their_seed(seed, error):
    from pysparse_hpc.generators import rmat
    with pytest.raises(error, match="seed must be"):
        rmat(3, seed=seed)
    with pytest.raises(error, match="seed must be"):
        planted_partition(2, 3, seed=seed)
    assert rmat(3, seed=np.int64(2)).nnz == rmat(3, seed=2).nnz


# -- states the typed orderings must not be handed ------------------------------------------

def test_reorder_does_not_trust_a_canonical_flag_set_by_hand():
    # Unsorted rows merged as if sorted gave an asymmetric pattern, and RCM's neighbour sort
    # wrote past its lists (a segfault, or a garbage permutation).
    out = run_isolated("""
        import numpy as np
        import pysparse_hpc as sph

        rng = np.random.default_rng(0)
        n = 30
        for _ in range(300):
            rows = np.sort(rng.integers(0, n, 200))
            cols = rng.integers(0, n, 200)
            indptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
            A = sph.csr_array((np.ones(200), cols, indptr), shape=(n, n))
            expected = {m: sph.reorder(A, m) for m in ("rcm", "rabbit", "degree")}
            A.has_canonical_format = True
            for method, perm in expected.items():
                assert np.array_equal(sph.reorder(A, method), perm), method
        print("same")
    """)
    assert out.strip() == "same"


def test_reorder_refuses_arrays_that_scipy_compacted_under_it():
    # to_scipy() shares a canonical array's buffers; scipy's eliminate_zeros compacts them in
    # place and lowers indptr[-1], leaving len(indices) longer than the entries.
    out = run_isolated("""
        import numpy as np
        import scipy.sparse
        import pysparse_hpc as sph

        S = scipy.sparse.random(2000, 2000, density=0.01, random_state=1, format="csr")
        S.data[::2] = 0
        A = sph.csr_array(S)
        A.to_scipy().eliminate_zeros()
        assert A.indptr[-1] < A.indices.size
        for call in (lambda: sph.reorder(A, "rcm"), lambda: sph.reorder(A, "rabbit"),
                     lambda: sph.reorder(A, "degree"), lambda: sph.bandwidth(A),
                     lambda: sph.permute(A, np.arange(2000))):
            try:
                call()
            except ValueError as exc:
                assert "do not agree" in str(exc), exc
            else:
                raise AssertionError("not refused")
        print("refused")
    """)
    assert out.strip() == "refused"


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_rcm_order_refuses_an_asymmetric_pattern(index_dtype):
    # Vertex 0 is listed by every row but lists one vertex itself: the neighbour sort wrote
    # n - 2 entries past its list (heap corruption) and left others uninitialized.
    out = run_isolated(f"""
        import numpy as np
        from pysparse_hpc._cy.reorder import rcm_order

        n = 5000
        indptr = np.arange(n + 1, dtype=np.int64)
        indices = np.zeros(n, dtype=np.{index_dtype})
        indices[0] = 1
        try:
            rcm_order(indptr, indices, 1)
        except ValueError as exc:
            assert "not symmetric" in str(exc), exc
            print("refused")
    """)
    assert out.strip() == "refused"
