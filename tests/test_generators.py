"""The random graph generators (their reordering uses are tested in test_reorder.py)."""
import numpy as np
import pytest

from pysparse_hpc.generators import planted_partition, rmat


def test_rmat_properties():
    # Every drawn edge weighs 1 and duplicates are summed: the weights add up to the draws.
    directed = rmat(8, 4, seed=7)
    assert directed.data.sum() == 4 * 2**8 and directed.has_canonical_format
    loops = directed.toarray().diagonal().sum()
    A = rmat(8, 4, seed=7, symmetric=True, self_loops=False)
    dense = A.toarray()
    np.testing.assert_array_equal(dense, dense.T)
    assert not np.any(np.diag(dense)) and A.data.sum() == 2 * (4 * 2**8 - loops)
    np.testing.assert_array_equal(dense, rmat(8, 4, seed=7, symmetric=True,
                                              self_loops=False).toarray())
    # Skewed: the heaviest row holds many times the mean.
    degrees = np.diff(rmat(12, 8, seed=1).indptr)
    assert degrees.max() > 20 * degrees.mean()


def test_generators_refuse_flags_that_are_not_bools():
    # "no" is truthy: rmat(symmetric="no") gave the symmetric graph.
    for kwargs in ({"symmetric": "no"}, {"self_loops": None}):
        name = next(iter(kwargs))
        with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
            rmat(3, **kwargs)
    with pytest.raises(TypeError, match="shuffle must be a bool, got str 'yes'"):
        planted_partition(2, 3, shuffle="yes")
    assert rmat(3, symmetric=np.bool_(True), seed=1).nnz == rmat(3, symmetric=True, seed=1).nnz


def test_rmat_names_probabilities_that_are_not_numbers():
    # NumPy's "could not convert string to float: 'abcd'" named no argument, and strings of
    # digits were read as numbers.
    for bad in ("abcd", ("0.25",) * 4):
        with pytest.raises(TypeError, match="probabilities must be 4 numbers, got"):
            rmat(3, probabilities=bad)
    with pytest.raises(ValueError, match="probabilities must be 4 non-negative numbers"):
        rmat(3, probabilities=(0.5, 0.5, 0.0))


def test_generators_refuse_graphs_beyond_memory_before_drawing(monkeypatch):
    # NumPy refused rmat(40, 2**30) with "Maximum allowed dimension exceeded", naming nothing,
    # and planted_partition with a huge degree with "lam value too large"; sizes below that
    # but beyond memory were drawn until the process was killed.
    from pysparse_hpc import _sputils
    with pytest.raises(MemoryError, match=r"rmat\(scale=40, edge_factor=1073741824\) draws"):
        rmat(40, 2 ** 30)
    with pytest.raises(MemoryError, match="internal_degree=1e.300"):
        planted_partition(10, 10, internal_degree=1e300)
    monkeypatch.setattr(_sputils, "physical_memory", lambda: 2 ** 30)
    with pytest.raises(MemoryError, match=r"about 6.71e\+07 entries, which need about 3 GiB, "
                                          r"more than this machine's 1.0 GiB"):
        rmat(22, 16)
    with pytest.raises(MemoryError, match="planted_partition"):
        planted_partition(1000, 10000)
    assert rmat(10, 16).shape == (1024, 1024)   # what fits is drawn as before
