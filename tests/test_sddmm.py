"""sddmm against a plain NumPy reference in float64."""
import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st

import pysparse_hpc as sph
from pysparse_hpc.io import load_npz

from .conftest import random_scipy
from .test_spmm import FORMATS, register_widths, tolerance, with_an_empty_row


def reference(S, X, Y, alpha=1.0, beta=0.0):
    """alpha * <X[i], Y[j]> + beta * A[i, j] at every stored entry, in CSR storage order."""
    S = S.tocsr()
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    dots = np.einsum("i...f,i...f->i...", X[rows], Y[S.indices])
    values = S.data if dots.ndim == 1 else S.data[:, None]
    return alpha * dots + beta * values


@pytest.fixture(autouse=True)
def _both_kernel_modes(kernel_mode):
    """Every test here runs through the serial and the parallel kernel drivers."""


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("width", [1, 7, 16, 33])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_single_head(rng, fmt, width, index_dtype):
    S = random_scipy(rng, (29, 41), 0.15)
    A = FORMATS[fmt](sph.csr_array(S, index_dtype=index_dtype))
    X, Y = rng.standard_normal((29, width)), rng.standard_normal((41, width))
    result = sph.sddmm(A, X, Y, alpha=0.5, beta=2.0)
    assert type(result) is type(A) and result.shape == A.shape
    back = result.tocsr()
    np.testing.assert_array_equal(back.indices, S.indices)            # A's pattern exactly
    np.testing.assert_allclose(back.data, reference(S, X, Y, 0.5, 2.0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_register_chunk_edges(rng, dtype):
    """Contiguous X and Y (X's row held in registers, chunks summed) and column-major ones
    (the strided kernel) agree with the reference at every vector and chunk edge."""
    S = with_an_empty_row(random_scipy(rng, (29, 41), 0.15), 2)
    A = sph.csr_array(S, dtype=dtype)
    for width in register_widths(dtype):
        X = rng.standard_normal((29, width)).astype(dtype)
        Y = rng.standard_normal((41, width)).astype(dtype)
        expected = reference(S, X.astype(np.float64), Y.astype(np.float64))
        rtol, atol = tolerance(dtype)
        atol *= np.sqrt(width)   # a float32 dot of unit-scale terms drifts like sqrt(width)
        np.testing.assert_allclose(sph.sddmm(A, X, Y).data, expected, rtol, atol)
        strided = sph.sddmm(A, np.asfortranarray(X), np.asfortranarray(Y))
        np.testing.assert_allclose(strided.data, expected, rtol, atol)


@pytest.mark.parametrize("fmt", FORMATS)
def test_multi_head(rng, fmt):
    S = random_scipy(rng, (23, 30), 0.2)
    A = FORMATS[fmt](sph.csr_array(S))
    X, Y = rng.standard_normal((23, 4, 6)), rng.standard_normal((30, 4, 6))
    values = sph.sddmm(A, X, Y, beta=1.0)
    expected = reference(S, X, Y, beta=1.0)
    if fmt == "csr":
        assert values.shape == (S.nnz, 4)
        np.testing.assert_allclose(values, expected, rtol=1e-12, atol=1e-12)
    else:
        assert values.shape == (A.values.size, 4)  # aligned with A.values, padding slots 0
        for head in range(4):
            per_head = sph.sddmm(A, X[:, head], Y[:, head], beta=1.0)
            np.testing.assert_allclose(values[:, head], per_head.values, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(per_head.tocsr().data, expected[:, head], rtol=1e-12,
                                       atol=1e-12)


def test_padding_stays_zero_and_explicit_zeros_get_values(rng):
    S = scipy.sparse.csr_array((np.array([0.0, 1.0]), np.array([0, 2]), np.array([0, 1, 2])),
                               shape=(2, 3))  # (0,0) is an explicit zero: it is in the pattern
    M = sph.csr_array(S).to_mebcrs()
    X = np.ones((2, 3))
    Y = np.full((3, 3), np.inf)                  # would make padding NaN/inf if it were touched
    result = sph.sddmm(M, X, Y)
    stored = np.zeros(M.values.size, dtype=bool)
    back = result.tocsr()
    assert back.nnz == 2 and np.all(np.isinf(back.data))
    # every slot outside the pattern is exactly 0
    from pysparse_hpc._blocked import value_positions, _unpack_rows
    positions = value_positions(M.row_window_offset, M.window, M.block_width)
    stored[positions[_unpack_rows(M.vector_mask, M.n_vectors, M.window)[:, :M.window]]] = True
    assert np.all(result.values[~stored] == 0)


def test_beta_zero_does_not_read_values():
    A = sph.csr_array(np.array([[np.nan, 1.0]]))
    result = sph.sddmm(A, np.ones((1, 2)), np.ones((2, 2)))
    np.testing.assert_array_equal(result.data, [2.0, 2.0])
    assert np.isnan(sph.sddmm(A, np.ones((1, 2)), np.ones((2, 2)), beta=1.0).data[0])


def test_duplicates_each_get_a_value(rng):
    S = random_scipy(rng, (15, 15), 0.3, duplicates=True)
    A = sph.csr_array(S)
    X, Y = rng.standard_normal((15, 5)), rng.standard_normal((15, 5))
    np.testing.assert_allclose(sph.sddmm(A, X, Y, beta=1.0).data, reference(S, X, Y, beta=1.0),
                               rtol=1e-12)


def test_dtypes_and_torch(rng):
    torch = pytest.importorskip("torch")
    S = random_scipy(rng, (20, 25), 0.2)
    A = sph.csr_array(S, dtype=np.float32)
    X, Y = torch.randn(20, 8), torch.randn(25, 8)
    result = sph.sddmm(A, X, Y)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result.data, reference(S, X.numpy().astype(np.float64),
                                                      Y.numpy().astype(np.float64)),
                               rtol=2e-5, atol=2e-5)
    heads = sph.sddmm(A.to_mebcrs(), torch.randn(20, 2, 8), torch.randn(25, 2, 8))
    assert isinstance(heads, torch.Tensor) and heads.shape[1] == 2
    half = sph.sddmm(A.astype(np.float16), X.numpy().astype(np.float16),
                     Y.numpy().astype(np.float16))
    assert half.dtype == np.float32


def test_zero_width(rng):
    """F = 0: every dot product is empty, so the result is ``beta * A`` on every stored entry."""
    S = random_scipy(rng, (30, 20), 0.2)
    A = sph.csr_array(S)
    result = sph.sddmm(A, np.ones((30, 0)), np.ones((20, 0)), alpha=2.0, beta=0.5)
    np.testing.assert_array_equal(result.tocsr().data, 0.5 * S.data)


def test_empty(rng):
    for fmt in FORMATS:
        Z = FORMATS[fmt](sph.csr_array((6, 4)))
        result = sph.sddmm(Z, np.ones((6, 3)), np.ones((4, 3)))
        assert result.nnz == 0 and result.shape == (6, 4)


@pytest.mark.parametrize("window", [8, 16, 64])
@pytest.mark.parametrize("alpha, beta", [(np.inf, 0.0), (1.0, np.inf), (np.nan, 0.0)])
def test_empty_blocked_with_non_finite_alpha_or_beta(window, alpha, beta):
    """A non-finite alpha or beta makes sddmm re-zero a blocked result's padding through the
    vector mask; with no vectors, that mask is empty and must still unpack."""
    A = sph.csr_array((16, 5)).to_blocked(window)
    result = sph.sddmm(A, np.ones((16, 3)), np.ones((5, 3)), alpha=alpha, beta=beta)
    assert type(result) is type(A) and result.nnz == 0 and result.shape == (16, 5)


@pytest.mark.parametrize("window", [8, 16, 64])
def test_an_empty_vector_mask_unpacks_for_the_cuda_backend(window):
    """The CUDA backend unpacks the mask of an empty blocked A too (padding, storage keys):
    checked here on the CPU, since the simulator run is slow."""
    from pysparse_hpc._blocked import unpack_vector_mask
    from pysparse_hpc._cuda_backend import _storage_keys
    A = sph.csr_array((16, 5)).to_blocked(window)
    assert unpack_vector_mask(A.vector_mask, A.n_vectors, window).shape == (0, window)
    assert _storage_keys(A).size == 0


def test_bad_input(rng):
    A = sph.csr_array(random_scipy(rng, (6, 5), 0.4))
    X, Y = np.ones((6, 3)), np.ones((5, 3))
    with pytest.raises(ValueError, match="widths differ"):
        sph.sddmm(A, X, np.ones((5, 4)))
    with pytest.raises(ValueError, match="dimension mismatch"):
        sph.sddmm(A, np.ones((5, 3)), Y)
    with pytest.raises(ValueError, match="both be 2-D"):
        sph.sddmm(A, X, np.ones((5, 1, 3)))
    with pytest.raises(ValueError, match="heads"):
        sph.sddmm(A, np.ones((6, 2, 3)), np.ones((5, 3, 3)))
    with pytest.raises(TypeError, match="int64"):
        sph.sddmm(A, X.astype(np.int64), Y)
    with pytest.raises(TypeError, match="complex"):
        sph.sddmm(A, X, Y.astype(np.complex128))
    with pytest.raises(TypeError, match="alpha"):
        sph.sddmm(A, X, Y, alpha="2")
    with pytest.raises(ValueError, match="beta must fit in a float64"):  # was OverflowError
        sph.sddmm(A, X, Y, beta=10 ** 400)
    with pytest.raises(TypeError, match="sparse array"):
        sph.sddmm(np.eye(6, 5), X, Y)


@pytest.mark.parametrize("fmt", ["csr", "mebcrs8"])
def test_every_shared_matrix(suitesparse_path, fmt, rng):
    S = scipy.sparse.load_npz(suitesparse_path).tocsr().astype(np.float64)
    A = FORMATS[fmt](load_npz(suitesparse_path).astype(np.float64))
    X, Y = rng.standard_normal((S.shape[0], 8)), rng.standard_normal((S.shape[1], 8))
    np.testing.assert_allclose(sph.sddmm(A, X, Y, beta=1.0).tocsr().data,
                               reference(S, X, Y, beta=1.0), rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.floats(0, 0.5), st.sampled_from(list(FORMATS)),
       st.integers(1, 12), st.integers(0, 2**31))
def test_hypothesis(n_rows, n_cols, density, fmt, width, seed):
    rng = np.random.default_rng(seed)
    S = random_scipy(rng, (n_rows, n_cols), density)
    A = FORMATS[fmt](sph.csr_array(S))
    X, Y = rng.standard_normal((n_rows, width)), rng.standard_normal((n_cols, width))
    np.testing.assert_allclose(sph.sddmm(A, X, Y, alpha=2.0, beta=-1.0).tocsr().data,
                               reference(S, X, Y, 2.0, -1.0), rtol=1e-12, atol=1e-12)
