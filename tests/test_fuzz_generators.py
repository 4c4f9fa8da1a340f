"""Differential fuzzing of the generators, the dataset loader and `block_stats`.

The generators are checked on seeded sweeps against their documented contract (shape, dtype,
symmetry, self-loops, determinism) and, loosely, against their model's statistics; the loader
against the raw arrays of the bundled files and on hostile ``.npz`` files; `block_stats` against
a brute-force count of the distinct columns of every row window. The cases that once crashed
or reached NumPy's allocator with a size from an argument or a file run in a child process.
"""
import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc import datasets
from pysparse_hpc._blocked import MAX_WINDOW
from pysparse_hpc.generators import planted_partition, rmat

from .conftest import run_child

_CHILD_MEMORY = 3 * 2 ** 30


# --- generators -------------------------------------------------------------------------------

def test_rmat_sweep_keeps_its_contract():
    rng = np.random.default_rng(11)
    for _ in range(40):
        scale, edge_factor = int(rng.integers(1, 8)), int(rng.integers(0, 6))
        probabilities = tuple(rng.dirichlet(np.ones(4)))
        symmetric, self_loops = bool(rng.integers(2)), bool(rng.integers(2))
        dtype = (np.float16, np.float32, np.float64, np.int32)[rng.integers(4)]
        seed = int(rng.integers(0, 2 ** 63))
        kwargs = dict(probabilities=probabilities, seed=seed, dtype=dtype, symmetric=symmetric,
                      self_loops=self_loops)
        A = rmat(scale, edge_factor, **kwargs)
        n = 2 ** scale
        assert A.shape == (n, n) and A.has_canonical_format and A.index_dtype == np.int32
        assert A.dtype == (dtype if dtype != np.int32 else np.float64)
        dense = A.toarray().astype(np.float64)
        drawn = edge_factor * n * (2 if symmetric else 1)
        assert dense.sum() == drawn if self_loops else dense.sum() <= drawn
        if symmetric:
            np.testing.assert_array_equal(dense, dense.T)
        if not self_loops:
            assert not np.any(np.diag(dense))
        again = rmat(scale, edge_factor, **kwargs)
        for name in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(A, name), getattr(again, name))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rmat_quadrants_follow_their_probabilities(seed):
    # Two nodes: each of the 2 * 20000 edges lands in the quadrant it drew, up to the random
    # relabelling, which swaps (0, 0) with (1, 1) and (0, 1) with (1, 0) or keeps them all.
    probabilities = np.random.default_rng(seed).dirichlet(np.ones(4))
    A = rmat(1, 20000, tuple(probabilities), seed=seed, dtype=np.float64).toarray()
    edges = 40000
    observed = sorted([A[0, 0], A[1, 1]]) + sorted([A[0, 1], A[1, 0]])
    expected = (sorted(probabilities[[0, 3]] * edges) + sorted(probabilities[[1, 2]] * edges))
    # Binomial standard deviation at most 100 here; 8 of them never flake.
    np.testing.assert_allclose(observed, expected, atol=800)


def test_planted_partition_sweep_and_degrees():
    rng = np.random.default_rng(12)
    for _ in range(25):
        k, size = int(rng.integers(1, 6)), int(rng.integers(1, 30))
        internal, external = float(rng.uniform(0, 10)), float(rng.uniform(0, 4))
        seed, shuffle = int(rng.integers(0, 1000)), bool(rng.integers(2))
        A, labels = planted_partition(k, size, internal, external, seed=seed, shuffle=shuffle)
        dense = A.toarray()
        assert A.shape == (k * size,) * 2 and A.has_canonical_format
        assert labels.dtype == np.int64 and np.all(A.data == 1)
        np.testing.assert_array_equal(dense, dense.T)
        assert not np.any(np.diag(dense))
        np.testing.assert_array_equal(np.bincount(labels, minlength=k), np.full(k, size))
        again, again_labels = planted_partition(k, size, internal, external, seed=seed,
                                                shuffle=shuffle)
        np.testing.assert_array_equal(dense, again.toarray())
        np.testing.assert_array_equal(labels, again_labels)
    A, labels = planted_partition(8, 500, 10.0, 3.0, seed=3)
    degrees = np.diff(A.indptr)
    inside = np.mean(labels[np.repeat(np.arange(4000), degrees)] == labels[A.indices])
    assert 12.0 < degrees.mean() <= 13.0             # 13 less coinciding draws
    assert abs(inside - (10 + 3 / 8) / 13) < 0.03    # about 0.80


def test_rmat_refuses_a_node_count_beyond_memory_before_drawing():
    # The memory check counted edges only: rmat(40, edge_factor=0) draws none and went on to
    # ask NumPy for a relabelling permutation of 8 TiB ("Unable to allocate", naming no
    # argument; under overcommit, smaller scales were killed while filling it).
    run_child("""
        import pytest
        from pysparse_hpc.generators import rmat
        with pytest.raises(MemoryError, match=r"rmat\\(scale=40, edge_factor=0\\) draws about 0 "
                                              r"entries on 1.1e\\+12 nodes"):
            rmat(40, 0)
    """, timeout=60, memory=_CHILD_MEMORY)


def test_rmat_counts_nodes_against_memory():
    run_child("""
        import pytest
        from pysparse_hpc import _sputils, generators
        _sputils.physical_memory = lambda: 2 ** 30
        with pytest.raises(MemoryError, match="entries on 1.34e.08 nodes, which need about 2 GiB"):
            generators.rmat(27, 0)
        assert generators.rmat(10, 0).nnz == 0
    """, timeout=60, memory=_CHILD_MEMORY)


def test_generators_refuse_integers_past_float_range():
    # float() of the entry count raised OverflowError ("int too large to convert to float").
    with pytest.raises(MemoryError, match=r"rmat\(scale=3, edge_factor=1000"):
        rmat(3, 10 ** 400)
    with pytest.raises(MemoryError, match=r"planted_partition\(1000"):
        planted_partition(10 ** 400, 1)
    with pytest.raises(ValueError, match="external_degree must be a finite number, got an "
                                         "integer of 1329 bits"):
        planted_partition(2, 3, 1.0, 10 ** 400)


def test_rmat_names_ragged_probabilities():
    # NumPy's "inhomogeneous shape" ValueError named no argument.
    with pytest.raises(TypeError, match="probabilities must be 4 numbers, got tuple"):
        rmat(3, probabilities=(0.25, (0.25,), 0.25, 0.25))


@pytest.mark.parametrize("kwargs,error", [
    (dict(scale=np.True_), TypeError), (dict(scale=3.0), TypeError), (dict(scale=0), ValueError),
    (dict(scale=41), ValueError), (dict(edge_factor=-1), ValueError),
    (dict(edge_factor=np.float64(2)), TypeError), (dict(seed=-1), ValueError),
    (dict(seed=1.0), TypeError), (dict(probabilities=(np.nan, 0.5, 0.25, 0.25)), ValueError),
    (dict(probabilities=(np.inf, 0, 0, 0)), ValueError),
    (dict(probabilities=(1.5, -0.5, 0, 0)), ValueError), (dict(dtype=np.complex64), TypeError),
])
def test_rmat_argument_checks(kwargs, error):
    arguments = dict(scale=3)
    arguments.update(kwargs)
    with pytest.raises(error):
        rmat(**arguments)


@pytest.mark.parametrize("args,error", [
    ((np.True_, 3), TypeError), ((2, 0), ValueError), ((2, 3, np.nan), ValueError),
    ((2, 3, 1.0, -np.inf), ValueError), ((2, 3, -1.0), ValueError), ((2, 3, True), TypeError),
    ((2, 3, "3"), TypeError),
])
def test_planted_partition_argument_checks(args, error):
    with pytest.raises(error):
        planted_partition(*args)


# --- datasets ---------------------------------------------------------------------------------

def _bundled_arrays(name):
    with np.load(datasets._loader.resources.files(datasets.__name__) / "data" / f"{name}.npz") \
            as bundled:
        return dict(bundled)


@pytest.mark.parametrize("name", datasets.available())
def test_load_matches_the_raw_arrays(name):
    raw = _bundled_arrays(name)
    data = datasets.load(name)

    def matrix(prefix):
        return scipy.sparse.csr_array((raw[f"{prefix}data"], raw[f"{prefix}indices"],
                                       raw[f"{prefix}indptr"]), shape=tuple(raw[f"{prefix}shape"]))
    assert (abs(matrix("adj_") - data.adj.to_scipy())).max() == 0
    np.testing.assert_array_equal(data.x, matrix("feat_").toarray())
    np.testing.assert_array_equal(data.y, raw["labels"])
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(data, f"{split}_mask"), raw[f"{split}_mask"])
    assert data.num_classes == int(raw["num_classes"])


def _graph(path, **changes):
    arrays = dict(adj_indptr=np.array([0, 1, 2, 3, 4]), adj_indices=np.array([1, 0, 3, 2]),
                  adj_data=np.ones(4, np.float32), adj_shape=np.array([4, 4]),
                  feat_indptr=np.array([0, 1, 2, 3, 4]), feat_indices=np.array([0, 1, 2, 0]),
                  feat_data=np.ones(4, np.float32), feat_shape=np.array([4, 3]),
                  labels=np.array([0, 1, 0, 1]), train_mask=np.array([1, 1, 0, 0], bool),
                  val_mask=np.array([0, 0, 1, 0], bool), test_mask=np.array([0, 0, 0, 1], bool),
                  num_classes=np.array(2))
    arrays.update(changes)
    np.savez(path, allow_pickle=True, **{k: v for k, v in arrays.items() if v is not None})
    return path


@pytest.mark.parametrize("changes,error,match", [
    (dict(labels=None), ValueError, "lacks labels"),
    (dict(labels=np.array([0.0, 1, 0, 1])), ValueError, "labels must be a 1-D integer"),
    (dict(labels=np.array([0, 1, 0, 1], object)), ValueError, "corrupt member 'labels'"),
    (dict(labels=np.array([0, 1, 0])), ValueError, "labels has 3 entries"),
    (dict(labels=np.array([0, 1, 0, 2])), ValueError, "labels of the masked nodes"),
    (dict(train_mask=np.array([1, 1, 0, 0])), ValueError, "train_mask must be a 1-D bool"),
    (dict(val_mask=np.array([0, 0, 1], bool)), ValueError, "val_mask has 3 entries"),
    (dict(num_classes=np.array(2.0)), ValueError, "num_classes must be an integer"),
    (dict(feat_data=np.array([1, np.nan, 1, 1], np.float32)), ValueError, "NaN or infinite"),
    (dict(feat_data=np.array([1, 1, 1, 1], object)), ValueError, "corrupt member 'feat_data'"),
    (dict(feat_indices=np.array([0, 1, 2, 3])), ValueError, "column 3, out of range"),
    (dict(feat_data=np.ones(3, np.float32)), ValueError, "data has length 3"),
    (dict(adj_indices=np.array([1, 0, 3, -1])), ValueError, "negative column"),
    (dict(adj_data=np.array([1, 1e300, 1, 1])), ValueError, "NaN or infinite weights"),
    (dict(adj_shape=np.array([2 ** 40, 2 ** 40])), ValueError, "indptr has length 5"),
    (dict(adj_shape=np.array([4, 5])), ValueError, "4 x 5; a graph's is square"),
    # NumPy counts timedelta64 among its integers: int() of one raised a TypeError that named
    # neither the file nor the key.
    (dict(labels=np.array([0, 1, 0, 1], "m8[s]")), ValueError,
     r"labels must be a 1-D integer array, got 1-D timedelta64\[s\]"),
    (dict(num_classes=np.array(2, "m8[s]")), ValueError, "num_classes must be an integer >= 1"),
])
def test_load_file_refuses_hostile_files(tmp_path, changes, error, match):
    path = _graph(tmp_path / "g.npz", **changes)
    with pytest.raises(error, match=match):
        datasets.load_file(path)


def test_load_file_refuses_dense_features_beyond_memory_up_front(tmp_path):
    # A few bytes of sparse features may declare any width: the dense array was left to
    # NumPy's allocator ("Unable to allocate 16.0 TiB", naming neither the file nor the key),
    # or, under overcommit, filled until the process was killed. Random features likewise.
    path = _graph(tmp_path / "wide.npz", feat_shape=np.array([4, 2 ** 40]))
    run_child(f"""
        import pytest
        from pysparse_hpc import datasets
        with pytest.raises(MemoryError, match=r"wide.npz': dense features of 4 x 1099511627776 "
                                              r"\\(feat_shape\\) need about"):
            datasets.load_file({str(path)!r})
        with pytest.raises(MemoryError, match=r"\\(random_features\\) need about"):
            datasets.load_file({str(path)!r}, random_features=2 ** 40)
    """, timeout=60, memory=_CHILD_MEMORY)


# --- block_stats ------------------------------------------------------------------------------

def _brute_force(scipy_csr, window, block_width):
    """The statistics counted from the definitions on a dense pattern: a vector is a column
    with a stored entry (explicit zeros included) in a window."""
    S = scipy_csr.copy()
    S.sum_duplicates()
    pattern = scipy.sparse.csr_array((np.ones(S.nnz), S.indices, S.indptr),
                                     shape=S.shape).toarray() != 0
    n_windows = -(-S.shape[0] // window)
    vectors = np.array([np.count_nonzero(pattern[w * window:(w + 1) * window].any(axis=0))
                        for w in range(n_windows)], dtype=np.int64)
    blocks = -(-vectors // block_width)
    return dict(n_rows=S.shape[0], n_cols=S.shape[1], nnz=S.nnz, n_windows=n_windows,
                n_empty_windows=int(np.count_nonzero(vectors == 0)),
                n_vectors=int(vectors.sum()), n_blocks=int(blocks.sum()),
                padded_vectors=int(blocks.sum()) * block_width)


def test_block_stats_matches_a_brute_force_count():
    rng = np.random.default_rng(13)
    for _ in range(120):
        n_rows, n_cols = int(rng.integers(0, 60)), int(rng.integers(0, 40))
        nnz = int(rng.choice([0, 0.02, 0.2, 1.0]) * n_rows * n_cols)
        rows, cols = rng.integers(0, max(n_rows, 1), nnz), rng.integers(0, max(n_cols, 1), nnz)
        data = np.where(rng.random(nnz) < 0.2, 0.0, 1.0)        # explicit zeros too
        # Unsorted rows with repeated columns, int32 or int64 indices: not canonical.
        order = np.lexsort((rng.random(nnz), rows))
        indptr = np.zeros(n_rows + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
        index_dtype = (np.int32, np.int64)[rng.integers(2)]
        A = sph.csr_array((data[order], cols[order].astype(index_dtype),
                           indptr.astype(index_dtype)), shape=(n_rows, n_cols))
        S = scipy.sparse.csr_array((data[order], cols[order], indptr), shape=(n_rows, n_cols))
        window = int(rng.choice([1, 3, 8, 16, 64, int(rng.integers(1, MAX_WINDOW + 1))]))
        block_width = int(rng.choice([1, 2, 8, 2 ** 31 - 1]))
        stats = sph.block_stats(A, window=window, block_width=block_width)
        expected = _brute_force(S, window, block_width)
        assert {key: getattr(stats, key) for key in expected} == expected
        if stats.n_vectors:
            assert stats.nnz_per_vector == pytest.approx(stats.nnz / stats.n_vectors)
            assert stats.redundancy == pytest.approx(stats.n_vectors * window / stats.nnz)


@pytest.mark.parametrize("window,error", [
    (0, ValueError), (MAX_WINDOW + 1, ValueError), (True, TypeError), (8.0, TypeError),
    (np.array(8), TypeError), (None, TypeError),
])
def test_block_stats_refuses_bad_windows(window, error):
    with pytest.raises(error, match="window"):
        sph.block_stats(sph.csr_array(np.eye(4)), window=window)


@pytest.mark.parametrize("column", [100, -5])
def test_block_stats_checks_columns_written_in_place(column):
    # The canonical flag, kept from construction, does not see a column written out of range
    # afterwards; the counting kernel indexed its per-column counter with it: a wrong count
    # for 100, memory corrupted ("free(): invalid pointer", an abort) for -5.
    run_child(f"""
        import numpy as np
        import pytest
        import pysparse_hpc as sph
        A = sph.csr_array(np.eye(4, dtype=np.float32))
        assert A.has_canonical_format
        A.indices[0] = {column}
        with pytest.raises(ValueError, match="A's arrays do not agree: indices holds"):
            sph.block_stats(A)
        print("refused")
    """, timeout=60)
