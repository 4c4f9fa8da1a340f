"""spmm, sddmm and @ fuzzed from the dense side: operand layouts, dtypes, scalars and options,
against float64 NumPy/scipy references."""
import warnings

import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph

from .conftest import random_scipy

torch = pytest.importorskip("torch")

FORMATS = {
    "csr": lambda A: A,
    "mebcrs8": lambda A: A.to_mebcrs(),
    "blocked16x3": lambda A: A.to_blocked(16, 3),
}


def _layout(rng, array, kind):
    """``array`` (C order) as the dense operand layout ``kind``, with the same values."""
    if kind == "C":
        return array
    if kind == "F":
        return np.asfortranarray(array)
    if kind == "slice":   # every other column of a wider array
        wide = np.repeat(array, 2, axis=-1)
        return wide[..., ::2]
    if kind == "reversed":   # negative row stride
        return np.ascontiguousarray(array[::-1])[::-1]
    if kind == "readonly":
        array = array.copy()
        array.flags.writeable = False
        return array
    if kind == "torch_transposed":   # a torch tensor with column-major strides
        return torch.from_numpy(np.ascontiguousarray(array.T)).T
    raise AssertionError(kind)


def _plain(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _tolerance(dtype):
    return 1e-10 if dtype == np.float64 else 2e-4


def _result_dtype(*dtypes):
    dtype = np.result_type(*dtypes)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


LAYOUTS = ["C", "F", "slice", "reversed", "readonly", "torch_transposed"]


@pytest.mark.parametrize("seed", range(3))
def test_products_match_scipy_whatever_the_dense_layout(kernel_mode, seed):
    rng = np.random.default_rng(seed)
    for trial in range(18):
        n_rows, n_cols = (int(n) for n in rng.integers(0, 30, 2))
        S = random_scipy(rng, (n_rows, n_cols), rng.uniform(0, 0.5), duplicates=trial % 2 == 1)
        fmt = list(FORMATS)[trial % len(FORMATS)]
        A = FORMATS[fmt](sph.csr_array(S, index_dtype=[np.int32, np.int64][trial % 2]))
        A = A.astype([np.float64, np.float32][trial % 3 == 0])
        # per stored entry in float64, as the kernels sum duplicates in the compute dtype
        reference = A.tocsr().to_scipy().astype(np.float64)
        dense_dtype = [np.float64, np.float32, np.float16][int(rng.integers(3))]
        dtype = _result_dtype(A.dtype, dense_dtype)
        layout = LAYOUTS[int(rng.integers(len(LAYOUTS)))]

        width = int(rng.choice([0, 1, 3, 16, 37]))
        B = _layout(rng, rng.standard_normal((n_cols, width)).astype(dense_dtype), layout)
        product = A @ B
        assert isinstance(product, torch.Tensor) == isinstance(B, torch.Tensor)
        assert _plain(product).dtype == dtype
        np.testing.assert_allclose(_plain(product), reference @ _plain(B).astype(np.float64),
                                   rtol=_tolerance(dtype), atol=_tolerance(dtype) * 10)
        v = rng.standard_normal(2 * n_cols).astype(dense_dtype)[::2]   # a strided vector
        np.testing.assert_allclose(A @ v, reference @ v.astype(np.float64),
                                   rtol=_tolerance(dtype), atol=_tolerance(dtype) * 10)

        X = _layout(rng, rng.standard_normal((n_rows, width)).astype(dense_dtype), layout)
        Y = _layout(rng, rng.standard_normal((n_cols, width)).astype(dense_dtype), layout)
        alpha, beta = [(1.0, 0.0), (-2.5, 0.5), (0.0, 1.0)][trial % 3]
        csr = A.tocsr()
        rows = np.repeat(np.arange(n_rows), np.diff(csr.indptr))
        dots = np.einsum("kf,kf->k", _plain(X).astype(np.float64)[rows],
                         _plain(Y).astype(np.float64)[csr.indices])
        expected = alpha * dots + beta * csr.data.astype(np.float64)
        expected = scipy.sparse.csr_array((expected, csr.indices, csr.indptr), shape=A.shape)
        result = sph.sddmm(A, X, Y, alpha=alpha, beta=beta)
        assert result.dtype == dtype
        np.testing.assert_allclose(result.toarray(), expected.toarray(),
                                   rtol=_tolerance(dtype), atol=_tolerance(dtype) * 10)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("alpha, beta", [(1e39, 0.0), (-1e39, 0.0), (1.0, 1e39),
                                         (1e-40, 0.0), (1e39, 1e-40)])
def test_sddmm_scalars_beyond_float32_range_scale_the_float32_result(fmt, alpha, beta):
    # alpha = 1e39 became float32 inf, so every product came out inf though alpha * dot
    # (about 1e34 here) is a float32; 1e-40 became a subnormal with three digits left
    S = scipy.sparse.csr_array(np.array([[5e-4, 0.0, 2.5e-4], [0.0, 7.5e-4, 0.0]]))
    A = FORMATS[fmt](sph.csr_array(S).astype(np.float32))
    x = np.float32(1e-5 if abs(alpha) >= 1 else 1e5)   # alpha * dot a normal float32
    X = np.full((2, 4), x, dtype=np.float32)
    Y = np.full((3, 4), 0.5, dtype=np.float32)
    dots = 4 * np.float64(x) * 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing overflows: no warning either
        result = sph.sddmm(A, X, Y, alpha=alpha, beta=beta)
    assert result.dtype == np.float32
    expected = alpha * dots * (S.toarray() != 0) + beta * S.toarray()
    np.testing.assert_allclose(result.toarray(), expected, rtol=1e-6)
    if fmt != "csr":   # the padding slots stay 0
        assert np.count_nonzero(result.values) == S.nnz


def test_sddmm_multi_head_scalars_beyond_float32_range():
    S = scipy.sparse.csr_array(np.array([[5e-4, 0.0], [2.5e-4, 7.5e-4]]))
    A = sph.csr_array(S).astype(np.float32)
    X = np.full((2, 3, 4), 1e-5, dtype=np.float32)
    Y = np.full((2, 3, 4), 0.5, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = sph.sddmm(A, X, Y, alpha=1e39, beta=-1e39)
    expected = 1e39 * 4 * np.float64(np.float32(1e-5)) * 0.5 - 1e39 * S.data[:, None]
    np.testing.assert_allclose(result, np.broadcast_to(expected, (3, 3)), rtol=1e-6)


@pytest.mark.parametrize("backend", [np.array(["cpu"]), np.array(["cuda", "cpu"]),
                                     np.array([]), ("cpu",)])
def test_a_backend_that_is_not_a_string_is_refused_by_name(rng, backend):
    # a one-element array passed for "cpu", a longer one failed on "truth value ambiguous"
    A = sph.csr_array(random_scipy(rng, (5, 4), 0.5))
    with pytest.raises(ValueError, match="backend must be one of"):
        sph.spmm(A, np.ones((4, 2)), backend=backend)
    with pytest.raises(ValueError, match="backend must be one of"):
        sph.sddmm(A, np.ones((5, 2)), np.ones((4, 2)), backend=backend)


@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_a_timedelta_scalar_is_refused(rng, name):
    # numpy counts timedelta64 as an integer: float() of 3 seconds was taken as 3.0
    A = sph.csr_array(random_scipy(rng, (5, 4), 0.5))
    with pytest.raises(TypeError, match=f"{name} must be a real number"):
        sph.sddmm(A, np.ones((5, 2)), np.ones((4, 2)), **{name: np.timedelta64(3, "s")})


@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_zero_dim_scalars_are_scalars(rng, name):
    """A 0-d array or tensor is a scalar to NumPy and to torch's Scalar arguments; it was
    refused. A tensor that requires grad is refused by name: the scalars are constants."""
    torch = pytest.importorskip("torch")
    A = sph.csr_array(random_scipy(rng, (5, 4), 0.5))
    X, Y = rng.standard_normal((5, 2)), rng.standard_normal((4, 2))
    expected = sph.sddmm(A, X, Y, **{name: 2.5}).data
    for scalar in (np.array(2.5), torch.tensor(2.5), np.array(2.5, np.float32)):
        np.testing.assert_array_equal(sph.sddmm(A, X, Y, **{name: scalar}).data, expected)
    for bad in (np.array(True), np.array([2.5]), torch.tensor(1 + 2j), np.array(1 + 0j)):
        with pytest.raises(TypeError, match=f"{name} must be a real number"):
            sph.sddmm(A, X, Y, **{name: bad})
    with pytest.raises(TypeError, match=f"{name} is a tensor that requires grad"):
        sph.sddmm(A, X, Y, **{name: torch.tensor(2.5, requires_grad=True)})
