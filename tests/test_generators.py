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
