"""spmm / A @ B for every format against scipy in float64."""
import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st

import pysparse_hpc as sph
from pysparse_hpc.io import load_npz
from pysparse_hpc.kernels.cpu._registers import MAX_VECTORS, VECTOR_BYTES

from .conftest import random_scipy

FORMATS = {
    "csr": lambda A: A,
    "mebcrs8": lambda A: A.to_mebcrs(),
    "mebcrs4": lambda A: A.to_mebcrs(4),
    "blocked16": lambda A: A.to_blocked(16),
}


def tolerance(dtype):
    """(rtol, atol) for results compared with a float64 reference of unit-scale data."""
    return {np.float64: (1e-12, 1e-12), np.float32: (2e-5, 2e-5)}[np.dtype(dtype).type]


@pytest.fixture(autouse=True)
def _both_kernel_modes(kernel_mode):
    """Every test here runs through the serial and the parallel kernel drivers."""


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 7, 16, 33, 128])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_matches_scipy(rng, fmt, n, index_dtype):
    S = random_scipy(rng, (45, 37), 0.15, duplicates=True)
    A = FORMATS[fmt](sph.csr_array(S, index_dtype=index_dtype))
    B = rng.standard_normal((37, n))
    np.testing.assert_allclose(A @ B, S @ B, rtol=1e-12, atol=1e-12)
    v = rng.standard_normal(37)
    np.testing.assert_allclose(A @ v, S @ v, rtol=1e-12, atol=1e-12)
    assert (A @ v).shape == (45,)


@pytest.mark.parametrize("fmt", ["csr", "mebcrs8", "blocked16"])
def test_float32_and_float16(rng, fmt):
    S = random_scipy(rng, (60, 50), 0.2)
    A = FORMATS[fmt](sph.csr_array(S, dtype=np.float32))
    B = rng.standard_normal((50, 20)).astype(np.float32)
    result = A @ B
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, S @ B.astype(np.float64), *tolerance(np.float32))
    assert (A @ B.astype(np.float64)).dtype == np.float64   # numpy promotion
    H = FORMATS[fmt](sph.csr_array(S, dtype=np.float16))
    assert (H @ B.astype(np.float16)).dtype == np.float32   # fp16 storage, fp32 compute
    rounded = S.copy()
    rounded.data = rounded.data.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(H @ B, rounded @ B, rtol=1e-5, atol=1e-5)


def register_widths(dtype):
    """Widths at the edges of a vector and of a register chunk of the CPU kernels for dtype."""
    lanes = VECTOR_BYTES // np.dtype(dtype).itemsize
    chunk = MAX_VECTORS * lanes
    return sorted({1, lanes - 1, lanes, lanes + 1, chunk - 1, chunk, chunk + 1, 2 * chunk + 3})


def with_an_empty_row(S, row):
    """``S`` (scipy CSR) with no stored entry left in ``row``."""
    keep = np.ones(S.shape[0])
    keep[row] = 0
    S = (scipy.sparse.diags(keep) @ S).tocsr()
    S.eliminate_zeros()
    return S


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_register_chunk_edges(rng, dtype):
    """Contiguous B (rows summed in registers, a masked last vector) and column-major B (the
    strided kernel) agree with scipy at every vector and chunk edge; nothing is written past
    the end of ``out``."""
    S = with_an_empty_row(random_scipy(rng, (40, 30), 0.2, duplicates=True), 3)
    A = sph.csr_array(S, dtype=dtype)
    for n in register_widths(dtype):
        B = rng.standard_normal((30, n)).astype(dtype)
        expected = S @ B.astype(np.float64)
        buffer = np.full(40 * n + 64, 7.0, dtype=dtype)
        out = buffer[:40 * n].reshape(40, n)
        sph.spmm(A, B, out=out)
        np.testing.assert_allclose(out, expected, *tolerance(dtype))
        np.testing.assert_array_equal(buffer[40 * n:], 7.0)
        np.testing.assert_allclose(A @ np.asfortranarray(B), expected, *tolerance(dtype))


def test_strided_values_take_the_strided_kernel(rng):
    """Per-edge values that are a strided view (a column of a table, a torch tensor's
    ``.numpy()``) are read through their strides, not as if contiguous."""
    from pysparse_hpc import ops
    S = random_scipy(rng, (30, 20), 0.2)
    table = rng.standard_normal((S.nnz, 3))
    B = rng.standard_normal((20, 5))
    expected = scipy.sparse.csr_array((table[:, 1], S.indices, S.indptr), shape=S.shape) @ B
    result = ops.pattern_spmm(sph.csr_array(S), table[:, 1], B)
    np.testing.assert_allclose(result, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_multi_head_values(rng, dtype):
    """One matrix per head sharing the pattern (``values`` (nnz, heads), B (K, heads, F)):
    each head equals its own SpMM, with contiguous operands (registers) and strided ones."""
    from pysparse_hpc import ops
    S = with_an_empty_row(random_scipy(rng, (25, 20), 0.2), 4)
    A = sph.csr_array(S, dtype=dtype)
    heads = 3
    for width in register_widths(dtype)[:6]:
        values = rng.standard_normal((S.nnz, heads)).astype(dtype)
        B = rng.standard_normal((20, heads, width)).astype(dtype)
        expected = np.stack([
            scipy.sparse.csr_array((values[:, h].astype(np.float64), S.indices, S.indptr),
                                   shape=S.shape) @ B[:, h].astype(np.float64)
            for h in range(heads)], axis=1)
        strided_B = np.swapaxes(np.swapaxes(B, 0, 2).copy(), 0, 2)  # same values, other strides
        for v, b in [(values, B), (np.asfortranarray(values), B), (values, strided_B)]:
            np.testing.assert_allclose(ops.pattern_spmm(A, v, b), expected, *tolerance(dtype))


def test_half_values_are_computed_in_float32(rng):
    """The per-edge-value product promotes as `spmm` does: float16 values and B are computed
    in float32 (there are no half-precision kernels), single- and multi-head."""
    from pysparse_hpc import ops
    S = random_scipy(rng, (20, 15), 0.2)
    A = sph.csr_array(S)
    for values_shape, B_shape in (((S.nnz,), (15, 4)), ((S.nnz, 2), (15, 2, 4))):
        values = rng.standard_normal(values_shape).astype(np.float16)
        B = rng.standard_normal(B_shape).astype(np.float16)
        result = ops.pattern_spmm(A, values, B)
        assert result.dtype == np.float32
        expected = ops.pattern_spmm(A, values.astype(np.float32), B.astype(np.float32))
        np.testing.assert_array_equal(result, expected)


def test_column_tiles(rng, monkeypatch):
    """For B with strides (the strided kernel), tiles narrower than B, including a ragged last
    tile, give the same result."""
    from pysparse_hpc import _config
    S = random_scipy(rng, (40, 30), 0.2, duplicates=True)
    B = np.asfortranarray(rng.standard_normal((30, 37)))
    for tile in (1, 8, 16, 37, 64):
        monkeypatch.setattr(_config, "_SPMM_TILE", tile)
        np.testing.assert_allclose(sph.csr_array(S) @ B, S @ B, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_and_nnz_zero(fmt):
    B = np.ones((10, 4))
    for shape in [(5, 10), (0, 10)]:
        Z = FORMATS[fmt](sph.csr_array(shape))
        np.testing.assert_array_equal(Z @ B, np.zeros((shape[0], 4)))
    E = FORMATS[fmt](sph.csr_array((3, 0)))
    np.testing.assert_array_equal(E @ np.ones((0, 2)), np.zeros((3, 2)))


def test_padding_does_not_turn_inf_into_nan():
    dense = np.array([[1.0, 0.0], [0.0, 1.0]])
    B = np.array([[np.inf], [2.0]])
    expected = np.array([[np.inf], [2.0]])  # row 1 never touches B[0]
    for fmt in FORMATS:
        np.testing.assert_array_equal(FORMATS[fmt](sph.csr_array(dense)) @ B, expected)


def test_nan_propagates():
    A = sph.csr_array(np.array([[np.nan, 1.0], [0.0, 1.0]]))
    result = A.to_mebcrs() @ np.ones((2, 1))
    assert np.isnan(result[0, 0]) and result[1, 0] == 1.0


def test_rmatmul(rng):
    S = random_scipy(rng, (12, 9), 0.3)
    X = rng.standard_normal((4, 12))
    np.testing.assert_allclose(X @ sph.csr_array(S), X @ S.toarray(), rtol=1e-12, atol=1e-12)


def test_non_contiguous_and_out(rng):
    S = random_scipy(rng, (30, 20), 0.2)
    A = sph.csr_array(S)
    wide = rng.standard_normal((20, 10))
    view = wide[:, ::2]                         # strided, used in place
    np.testing.assert_allclose(A @ view, S @ view, rtol=1e-12)
    np.testing.assert_allclose(A @ wide.T.copy().T, S @ wide, rtol=1e-12)  # Fortran order
    out = np.full((30, 5), np.nan)
    returned = sph.spmm(A, view, out=out)
    assert returned is out
    np.testing.assert_allclose(out, S @ view, rtol=1e-12)


def test_out_validation_writes_nothing(rng):
    A = sph.csr_array(random_scipy(rng, (6, 4), 0.5))
    B = np.ones((4, 3))
    square = sph.csr_array(random_scipy(rng, (4, 4), 0.5))
    with pytest.raises(ValueError, match="overlaps"):
        sph.spmm(square, B, out=B)
    for bad, error, message in [
        (np.zeros((6, 2)), ValueError, "shape"),
        (np.zeros((6, 3), dtype=np.float32), TypeError, "dtype"),
        (np.zeros((3, 6)).T, ValueError, "C-contiguous"),
    ]:
        before = bad.copy()
        with pytest.raises(error, match=message):
            sph.spmm(A, B, out=bad)
        np.testing.assert_array_equal(bad, before)


def test_out_sharing_A_values_is_refused():
    """An out in A's value buffer would be written row by row while later rows still read
    those values: a wrong result, refused as out=B is, before anything is written."""
    A = sph.csr_array((np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 0, 1, 1]),
                       np.array([0, 1, 4])), shape=(2, 2))
    with pytest.raises(ValueError, match="out overlaps A.data"):
        sph.spmm(A, np.array([[1.0, 10.0], [100.0, 1000.0]]), out=A.data.reshape(2, 2))
    np.testing.assert_array_equal(A.data, [1.0, 2.0, 3.0, 4.0])
    blocked = A.to_mebcrs()                     # 2 vectors of 8 rows: 16 values
    values = blocked.values.copy()
    with pytest.raises(ValueError, match="out overlaps A.values"):
        sph.spmm(blocked, np.ones((2, 8)), out=blocked.values.reshape(2, 8))
    np.testing.assert_array_equal(blocked.values, values)


def test_torch_operands_zero_copy(rng):
    torch = pytest.importorskip("torch")
    S = random_scipy(rng, (25, 18), 0.2)
    A = sph.csr_array(S, dtype=np.float32)
    B = torch.randn(18, 12)
    result = A @ B
    assert isinstance(result, torch.Tensor) and result.dtype == torch.float32
    np.testing.assert_allclose(result.numpy(), S @ B.numpy().astype(np.float64),
                               *tolerance(np.float32))
    strided = torch.randn(12, 18).T             # a non-contiguous view
    np.testing.assert_allclose((A.to_mebcrs() @ strided).numpy(), S @ strided.numpy(),
                               *tolerance(np.float32))
    vec = torch.randn(18)
    assert (A @ vec).shape == (25,)
    out = torch.empty(25, 12)
    assert sph.spmm(A, B, out=out) is out
    with pytest.raises(TypeError, match="torch"):
        sph.spmm(A, B, out=np.empty((25, 12), np.float32))
    grad = torch.randn(18, 2, requires_grad=True)
    assert (A @ grad).shape == (25, 2)


def test_lazily_negated_tensors(rng):
    """A real tensor with torch's negative bit (``z.conj().imag``), which ``numpy()`` refuses,
    is read by its values; as ``out`` (memory holding -out) it is refused before anything is
    written."""
    torch = pytest.importorskip("torch")
    S = random_scipy(rng, (6, 5), 0.5)
    A = sph.csr_array(S)
    z = torch.randn(5, 3, dtype=torch.complex128)
    B = z.conj().imag
    assert B.is_neg()
    np.testing.assert_allclose((A @ B).numpy(), S @ -z.imag.numpy(), rtol=1e-12, atol=1e-12)
    X = torch.randn(6, 3, dtype=torch.complex128).conj().imag
    np.testing.assert_allclose(sph.sddmm(A, X, B).toarray(),
                               sph.sddmm(A, X.resolve_neg(), B.resolve_neg()).toarray())
    storage = torch.zeros(6, 3, dtype=torch.complex128)
    out = storage.conj().imag
    with pytest.raises(ValueError, match="out is a lazily negated view"):
        sph.spmm(A, B.resolve_neg(), out=out)
    assert not storage.imag.any()


def test_a_tensor_on_another_device_is_named(rng):
    """Only CPU and CUDA tensors are read: one on another device (here ``meta``) is refused
    by name, not sent to the CUDA backend to report a missing GPU."""
    torch = pytest.importorskip("torch")
    A = sph.csr_array(random_scipy(rng, (6, 5), 0.5))
    with pytest.raises(ValueError, match="B is on device 'meta'"):
        sph.spmm(A, torch.empty(5, 3, device="meta"))
    with pytest.raises(ValueError, match="Y is on device 'meta'"):
        sph.sddmm(A, torch.ones(6, 3), torch.empty(5, 3, device="meta"))


def test_products_with_a_tensor_that_requires_grad_carry_its_gradient(rng):
    """``A @ W`` inside a model differentiates (as torch.sparse.mm); the kernels' functions,
    which cannot, refuse such a tensor instead of dropping its gradient silently."""
    torch = pytest.importorskip("torch")
    A = sph.csr_array(random_scipy(rng, (6, 5), 0.5))
    dense = torch.from_numpy(A.toarray())
    for shape, product, reference in (
            ((5, 3), lambda W: A @ W, lambda W: dense @ W),
            ((5,), lambda W: A @ W, lambda W: dense @ W),
            ((2, 6), lambda W: W @ A, lambda W: W @ dense),
            ((6,), lambda W: W @ A, lambda W: W @ dense)):
        W = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        got = product(W)
        torch.testing.assert_close(got, reference(W.detach()))
        (got.sum() + W.sum()).backward()
        expected = W.detach().clone().requires_grad_()
        (reference(expected).sum() + expected.sum()).backward()
        torch.testing.assert_close(W.grad, expected.grad)
    W = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match="requires grad.*pysparse_hpc.nn.functional"):
        sph.spmm(A, W)
    with pytest.raises(TypeError, match="requires grad.*nn.functional.sddmm for a gradient"):
        sph.sddmm(A, torch.randn(6, 2, requires_grad=True), torch.randn(5, 2))
    with pytest.raises(TypeError, match="out requires grad.* pass out.detach"):
        sph.spmm(A, W.detach(), out=torch.zeros(6, 3, dtype=torch.float64, requires_grad=True))
    with torch.no_grad():
        assert not (A @ W).requires_grad and sph.spmm(A, W).shape == (6, 3)


def test_a_product_with_gradient_has_the_dtype_of_one_without(rng):
    """``A @ W`` promotes as it does without gradient (A's dtype, W's and float32), whether W
    requires grad or not; a shape error names the operands of @."""
    torch = pytest.importorskip("torch")
    A64 = sph.csr_array(random_scipy(rng, (6, 5), 0.5))
    for A in (A64, A64.astype(np.float32), A64.astype(np.float16)):
        for dtype in (torch.float16, torch.float32, torch.float64):
            plain = torch.ones(5, 3, dtype=dtype)
            W = plain.clone().requires_grad_()
            assert (A @ W).dtype == (A @ plain).dtype, (A.dtype, dtype)
            (A @ W).sum().backward()
            assert W.grad.dtype == dtype
            left = torch.ones(2, 6, dtype=dtype)
            assert (left.clone().requires_grad_() @ A).dtype == (left @ A).dtype
    with pytest.raises(ValueError, match=r"A has shape \(6, 5\) and the right operand of @"):
        A64 @ torch.ones(4, 3, requires_grad=True)


def test_backend_argument(rng):
    A = sph.csr_array(random_scipy(rng, (5, 4), 0.5))
    B = np.ones((4, 2))
    np.testing.assert_allclose(sph.spmm(A, B, backend="cpu"), sph.spmm(A, B))
    with pytest.raises(ValueError, match="backend must be one of"):
        sph.spmm(A, B, backend="gpu")
    with pytest.raises(ValueError, match="CUDA backend"):
        sph.spmm(A, B, precision="tf32")  # precision chooses GPU kernels only


def test_backend_cuda_without_a_gpu_says_so(rng):
    from numba import cuda
    if cuda.is_available():
        pytest.skip("a GPU (or the simulator) is available here")
    A = sph.csr_array(random_scipy(rng, (5, 4), 0.5))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        sph.spmm(A, np.ones((4, 2)), backend="cuda")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        sph.sddmm(A, np.ones((5, 2)), np.ones((4, 2)), backend="cuda")


def test_gpu_operand_with_cpu_backend_is_refused(rng):
    class DeviceArray:
        """Anything exposing __cuda_array_interface__ is device memory."""
        __cuda_array_interface__ = {"shape": (4, 2), "typestr": "<f4", "data": (0, False),
                                    "version": 3}
    A = sph.csr_array(random_scipy(rng, (5, 4), 0.5))
    with pytest.raises(ValueError, match="GPU"):
        sph.spmm(A, DeviceArray(), backend="cpu")


def test_results_do_not_depend_on_thread_count(rng):
    from pysparse_hpc._config import get_num_threads, set_num_threads
    S = random_scipy(rng, (300, 200), 0.05)
    A = sph.csr_array(S)
    B = rng.standard_normal((200, 9))
    original = get_num_threads()
    try:
        results = []
        for threads in sorted({1, original}):
            set_num_threads(threads)
            results.append((A @ B, A.to_mebcrs() @ B))
    finally:
        set_num_threads(original)
    # Each output row is summed by one thread in a fixed order: identical bits.
    for csr_result, blocked_result in results[1:]:
        np.testing.assert_array_equal(csr_result, results[0][0])
        np.testing.assert_array_equal(blocked_result, results[0][1])


def test_the_thread_count_holds_in_every_thread(rng, kernel_mode):
    """Numba keeps a thread count per thread, and one it has not seen starts on the whole pool:
    the library's count must reach the threads a caller runs products in (a thread pool
    here), including a change made after such a thread has run."""
    import numba
    from concurrent.futures import ThreadPoolExecutor
    from pysparse_hpc._config import get_num_threads, set_num_threads
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs a pool of two threads or more")
    S = random_scipy(rng, (60, 40), 0.1)
    A, B = sph.csr_array(S), rng.standard_normal((40, 3))

    def product():
        result = A @ B                  # the parallel driver, in the kernel_mode "parallel"
        return numba.get_num_threads(), get_num_threads(), np.allclose(result, S @ B)

    original = get_num_threads()
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:   # one worker thread, reused
            seen = []
            for threads in (1, 2, 1):
                set_num_threads(threads)
                seen.append(pool.submit(product).result())
    finally:
        set_num_threads(original)
    for threads, (kernels, library, correct) in zip((1, 2, 1), seen):
        assert library == threads and correct
        if kernel_mode == "parallel":
            assert kernels == threads


@pytest.mark.parametrize("fmt", ["csr", "mebcrs8", "blocked16"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_every_shared_matrix(suitesparse_path, fmt, index_dtype, rng):
    S = scipy.sparse.load_npz(suitesparse_path).tocsr().astype(np.float64)
    A = FORMATS[fmt](load_npz(suitesparse_path, index_dtype=index_dtype).astype(np.float64))
    B = rng.standard_normal((S.shape[1], 16))
    expected = S @ B
    scale = np.abs(S) @ np.abs(B)               # bounds the rounding error of each entry
    assert np.all(np.abs(A @ B - expected) <= 1e-12 * scale + 1e-300)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.floats(0, 0.5), st.booleans(),
       st.sampled_from(list(FORMATS)), st.integers(1, 20), st.integers(0, 2**31))
def test_hypothesis(n_rows, n_cols, density, duplicates, fmt, n, seed):
    rng = np.random.default_rng(seed)
    S = random_scipy(rng, (n_rows, n_cols), density, duplicates=duplicates)
    A = FORMATS[fmt](sph.csr_array(S))
    B = rng.standard_normal((n_cols, n))
    np.testing.assert_allclose(A @ B, S @ B, rtol=1e-12, atol=1e-12)


def test_a_left_product_names_the_operands_as_written(rng):
    A = sph.csr_array(random_scipy(rng, (2, 3), 0.5))
    with pytest.raises(ValueError, match=r"left operand of @ has shape \(2, 3\) and A has "
                                         r"shape \(2, 3\); expected left.shape\[-1\] == "
                                         r"A.shape\[0\] = 2"):
        np.ones((2, 3)) @ A
