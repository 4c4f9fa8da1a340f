"""A @ B for every format against scipy in float64."""
import numpy as np
import pytest

import pysparse_hpc as sph

from .conftest import random_scipy


@pytest.mark.parametrize("convert", [
    lambda A: A, lambda A: A.to_mebcrs(), lambda A: A.to_mebcrs(4), lambda A: A.to_blocked(16),
], ids=["csr", "mebcrs8", "mebcrs4", "blocked16"])
@pytest.mark.parametrize("n", [1, 7, 16, 33])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_matches_scipy(rng, convert, n, index_dtype):
    S = random_scipy(rng, (45, 37), 0.15, duplicates=True)
    A = convert(sph.csr_array(S, index_dtype=index_dtype))
    B = rng.standard_normal((37, n))
    np.testing.assert_allclose(A @ B, S @ B, rtol=1e-12, atol=1e-12)
    v = rng.standard_normal(37)
    np.testing.assert_allclose(A @ v, S @ v, rtol=1e-12, atol=1e-12)
    assert (A @ v).shape == (45,)


def test_dtypes_and_empty(rng):
    S = random_scipy(rng, (20, 10), 0.3)
    A = sph.csr_array(S, dtype=np.float32)
    B = rng.standard_normal((10, 4)).astype(np.float32)
    assert (A @ B).dtype == np.float32
    assert (A @ B.astype(np.float64)).dtype == np.float64
    H = A.astype(np.float16)
    assert (H.to_mebcrs() @ B.astype(np.float16)).dtype == np.float32  # fp16 computed in fp32
    rounded = S.copy()
    rounded.data = rounded.data.astype(np.float16).astype(np.float32)  # scipy has no float16
    np.testing.assert_allclose(H @ B, rounded @ B, rtol=1e-5, atol=1e-5)
    Z = sph.csr_array((5, 10))
    np.testing.assert_array_equal(Z @ B, np.zeros((5, 4)))
    np.testing.assert_array_equal(Z.to_mebcrs() @ B, np.zeros((5, 4)))


def test_padding_does_not_turn_inf_into_nan():
    dense = np.array([[1.0, 0.0], [0.0, 1.0]])
    B = np.array([[np.inf], [2.0]])
    expected = np.array([[np.inf], [2.0]])  # row 1 never touches B[0]
    for A in (sph.csr_array(dense), sph.csr_array(dense).to_mebcrs()):
        np.testing.assert_array_equal(A @ B, expected)


def test_rmatmul(rng):
    S = random_scipy(rng, (12, 9), 0.3)
    A = sph.csr_array(S)
    X = rng.standard_normal((4, 12))
    np.testing.assert_allclose(X @ A, X @ S.toarray(), rtol=1e-12, atol=1e-12)
