"""CUDA kernels under the simulator, against NumPy/scipy in float64 (tiny inputs: the simulator
runs every CUDA thread as a Python thread). Run with NUMBA_ENABLE_CUDASIM=1 set before numba is
imported; `tests/test_cuda.py` does that in a subprocess."""
import csv

import numpy as np
import pytest
from numba import config

if not config.ENABLE_CUDASIM:
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 (run through tests/test_cuda.py)",
                allow_module_level=True)

from numba import cuda  # noqa: E402

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc.kernels.cuda import spmm as cuda_spmm  # noqa: E402
from pysparse_hpc.kernels.cuda._mma import (  # noqa: E402
    LAYOUT_M16N8K8_F16,
    LAYOUT_M16N8K8_TF32,
    LAYOUT_M16N8K16_F16,
    mma_f16_m16n8k8,
    mma_f16_m16n8k16,
    mma_tf32_m16n8k8,
    pack_half2,
    tf32_round,
    to_tf32,
)

from ..conftest import random_scipy  # noqa: E402

pytestmark = pytest.mark.cuda

A_POS, B_POS, C_POS = (LAYOUT_M16N8K8_TF32[k] for k in ("a", "b", "c"))


def tile_product(a_positions):
    """One warp multiplies A (16x8) by B (8x8), loading A's registers from ``a_positions``."""
    @cuda.jit
    def kernel(A, B, D, a_pos, b_pos, c_pos):
        lane = cuda.threadIdx.x
        a = [to_tf32(A[a_pos[lane, k, 0], a_pos[lane, k, 1]]) for k in range(4)]
        b = [to_tf32(B[b_pos[lane, k, 0], b_pos[lane, k, 1]]) for k in range(2)]
        d = mma_tf32_m16n8k8(a[0], a[1], a[2], a[3], b[0], b[1], np.float32(0), np.float32(0),
                             np.float32(0), np.float32(0))
        for k in range(4):
            D[c_pos[lane, k, 0], c_pos[lane, k, 1]] = d[k]

    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 8)).astype(np.float32)
    B = rng.standard_normal((8, 8)).astype(np.float32)
    D = np.zeros((16, 8), np.float32)
    kernel[1, 32](A, B, D, a_positions, B_POS, C_POS)
    expected = tf32_round(A).astype(np.float64) @ tf32_round(B).astype(np.float64)
    return D, expected


def test_emulated_mma_matches_numpy():
    D, expected = tile_product(A_POS)
    np.testing.assert_allclose(D, expected, rtol=1e-6, atol=1e-6)


def test_a_wrong_fragment_layout_is_caught():
    swapped = A_POS.copy()
    swapped[:, [1, 2]] = swapped[:, [2, 1]]  # a1 <-> a2: rows g+8 and columns t+4 mixed up
    D, expected = tile_product(swapped)
    relative = np.abs(D - expected).max() / np.abs(expected).max()
    assert relative > 0.1


def half_tile_product(a_positions):
    """The fp16 MMA of one warp, A's registers loaded from ``a_positions`` (pairs per register)."""
    b_pos, c_pos = LAYOUT_M16N8K8_F16["b"], LAYOUT_M16N8K8_F16["c"]

    @cuda.jit
    def kernel(A, B, D, a_pos, b_pos, c_pos):
        lane = cuda.threadIdx.x
        a = [A[a_pos[lane, k, 0], a_pos[lane, k, 1]] for k in range(4)]
        b = [B[b_pos[lane, k, 0], b_pos[lane, k, 1]] for k in range(2)]
        d = mma_f16_m16n8k8(pack_half2(a[0], a[1]), pack_half2(a[2], a[3]), pack_half2(b[0], b[1]),
                            np.float32(0), np.float32(0), np.float32(0), np.float32(0))
        for k in range(4):
            D[c_pos[lane, k, 0], c_pos[lane, k, 1]] = d[k]

    rng = np.random.default_rng(1)
    A = rng.standard_normal((16, 8)).astype(np.float32)
    B = rng.standard_normal((8, 8)).astype(np.float32)
    D = np.zeros((16, 8), np.float32)
    kernel[1, 32](A, B, D, a_positions, b_pos, c_pos)
    halves = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    return D, halves


def test_emulated_f16_mma_and_a_wrong_layout():
    D, expected = half_tile_product(LAYOUT_M16N8K8_F16["a"])
    np.testing.assert_allclose(D, expected, rtol=1e-6, atol=1e-6)
    swapped = LAYOUT_M16N8K8_F16["a"].copy()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]  # the two halves of a0 in the wrong order
    D, expected = half_tile_product(swapped)
    assert np.abs(D - expected).max() / np.abs(expected).max() > 0.1


def k16_tile_product(a_positions):
    """The fp16 m16n8k16 MMA of one warp (the SDDMM's), A's registers from ``a_positions``."""
    b_pos, c_pos = LAYOUT_M16N8K16_F16["b"], LAYOUT_M16N8K16_F16["c"]

    @cuda.jit
    def kernel(A, B, D, a_pos, b_pos, c_pos):
        lane = cuda.threadIdx.x
        a = [A[a_pos[lane, k, 0], a_pos[lane, k, 1]] for k in range(8)]
        b = [B[b_pos[lane, k, 0], b_pos[lane, k, 1]] for k in range(4)]
        d = mma_f16_m16n8k16(pack_half2(a[0], a[1]), pack_half2(a[2], a[3]),
                             pack_half2(a[4], a[5]), pack_half2(a[6], a[7]),
                             pack_half2(b[0], b[1]), pack_half2(b[2], b[3]),
                             np.float32(0), np.float32(0), np.float32(0), np.float32(0))
        for k in range(4):
            D[c_pos[lane, k, 0], c_pos[lane, k, 1]] = d[k]

    rng = np.random.default_rng(2)
    A = rng.standard_normal((16, 16)).astype(np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.zeros((16, 8), np.float32)
    kernel[1, 32](A, B, D, a_positions, b_pos, c_pos)
    halves = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    return D, halves


def test_emulated_f16_k16_mma_and_a_wrong_layout():
    D, expected = k16_tile_product(LAYOUT_M16N8K16_F16["a"])
    np.testing.assert_allclose(D, expected, rtol=1e-6, atol=1e-6)
    swapped = LAYOUT_M16N8K16_F16["a"].copy()
    swapped[:, [2, 3, 4, 5]] = swapped[:, [4, 5, 2, 3]]  # a1 <-> a2: rows g+8 and k+8 mixed up
    D, expected = k16_tile_product(swapped)
    assert np.abs(D - expected).max() / np.abs(expected).max() > 0.1


@pytest.mark.parametrize("split", [32, 1])
def test_blocked16_ablation_kernel(split):
    """The 16x1 (no swap) tf32 kernel, on a 16-row blocked array, split windows included."""
    rng = np.random.default_rng(split)
    S = random_scipy(rng, (37, 29), 0.3)
    W = sph.csr_array(S, dtype=np.float32).to_blocked(window=16, block_width=8)
    B = rng.standard_normal((29, 21)).astype(np.float32)
    out = np.full((37, 21), np.nan, np.float32)
    parts = cuda_spmm.mma_parts(W.row_window_offset, split)
    cuda_spmm.launch_mebcrs_spmm(W, B, out, 1, "tf32-16x1", parts)
    expected = S @ B.astype(np.float64)
    scale = np.abs(S) @ np.abs(B.astype(np.float64)) + 1e-30
    assert np.all(np.abs(out - expected) <= 2e-3 * scale + 1e-6)
    through_api = sph.spmm(W, B, backend="cuda", precision="tf32")
    np.testing.assert_allclose(through_api, out, rtol=1e-5, atol=1e-5)


def test_mma_parts():
    offsets = np.array([0, 3, 3, 40, 60])  # blocks per window: 1, 0, 5, 3
    window, first, count, atomic, split = cuda_spmm.mma_parts(offsets, 2)
    np.testing.assert_array_equal(window, [0, 1, 2, 2, 2, 3, 3])
    np.testing.assert_array_equal(first, [0, 0, 0, 2, 4, 0, 2])
    np.testing.assert_array_equal(count, [1, 0, 2, 2, 1, 2, 1])
    np.testing.assert_array_equal(atomic, [0, 0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(split, [2, 3])


def test_tf32_rounding():
    x = np.array([1.0, 1 + 2**-11, 1 + 2**-10, np.inf, -3.14159265], np.float32)
    rounded = tf32_round(x)
    assert rounded[0] == 1.0 and rounded[2] == np.float32(1 + 2**-10) and np.isinf(rounded[3])
    assert rounded[1] == np.float32(1 + 2**-10)  # a tie rounds away from zero (cvt.rna)
    assert abs(rounded[4] - x[4]) <= 2**-10 * 4


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("shape,n,warps,split", [((20, 13), 40, 1, 32), ((9, 30), 16, 2, 1),
                                                 ((24, 24), 7, 1, 1), ((17, 40), 20, 1, 2)])
def test_mebcrs_spmm_tensor_cores(shape, n, warps, split, precision):
    """split=1 puts every window of more than one block on several thread blocks (atomics)."""
    rng = np.random.default_rng(sum(shape) + n)
    S = random_scipy(rng, shape, 0.3)
    dense = S.toarray()
    dense[8:16] = 0  # an empty window
    M = sph.csr_array(dense, dtype=np.float32).to_mebcrs(block_width=8)
    B = rng.standard_normal((shape[1], n)).astype(np.float32)
    out = np.full((shape[0], n), np.nan, np.float32)
    parts = cuda_spmm.mma_parts(M.row_window_offset, split)
    cuda_spmm.launch_mebcrs_spmm(M, B, out, warps, precision, parts)
    expected = dense @ B.astype(np.float64)
    scale = np.abs(dense) @ np.abs(B.astype(np.float64)) + 1e-30
    assert np.all(np.abs(out - expected) <= 2e-3 * scale + 1e-6)  # 10 mantissa bits, fp32 sums


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_mebcrs_spmm_single_accesses_and_half_operands(precision):
    """B whose rows start half a pair off alignment runs the kernel with single accesses; fp16
    also reads half B (and half values) as they are."""
    from pysparse_hpc.kernels.cuda._pairs import pairs_aligned
    rng = np.random.default_rng(13)
    S = random_scipy(rng, (13, 10), 0.3)
    M = sph.csr_array(S, dtype=np.float32).to_mebcrs(block_width=8)
    wide = rng.standard_normal((10, 17)).astype(np.float32)
    B = cuda.to_device(wide)[:, 1:]  # 16 columns, 4 bytes off
    assert not pairs_aligned(B) and pairs_aligned(cuda.to_device(wide[:, 1:].copy()))
    operands = [(B, wide[:, 1:].astype(np.float64))]
    if precision == "fp16":
        half = wide[:, 1:].astype(np.float16)
        operands.append((half, half.astype(np.float64)))
    parts = cuda_spmm.mma_parts(M.row_window_offset, 32)
    for operand, exact in operands:
        out = np.full((13, 16), np.nan, np.float32)
        cuda_spmm.launch_mebcrs_spmm(M, operand, out, 1, precision, parts)
        expected = S @ exact
        scale = np.abs(S) @ np.abs(exact) + 1e-30
        assert np.all(np.abs(out - expected) <= 2e-3 * scale + 1e-6)


def test_pairs_aligned():
    from pysparse_hpc.kernels.cuda._pairs import pairs_aligned
    base = np.zeros((6, 8), np.float32)
    assert pairs_aligned(base) and pairs_aligned(base[::2]) and pairs_aligned(base[:, 2:6])
    assert not pairs_aligned(base[:, 1:5])  # rows start off a pair
    assert not pairs_aligned(base[:, :7])  # an odd width leaves a lone last column
    assert not pairs_aligned(base[:, ::2])  # columns not adjacent
    assert not pairs_aligned(np.zeros((6, 7), np.float32)[:, :6])  # rows 7 elements apart
    assert pairs_aligned(np.zeros((1, 6), np.float32)) and not pairs_aligned(np.zeros(6))


def test_zero_contiguous_any_shape(monkeypatch):
    """The grid-stride fill zeroes every element of a contiguous array of any shape, with more
    elements than one pass of its grid covers."""
    for shape in [(37, 1), (5, 3), (2, 3, 4), (0, 4), (9,)]:
        array = cuda.to_device(np.full(shape, 7.0, np.float32))
        cuda_spmm.zero_contiguous(array)
        np.testing.assert_array_equal(array.copy_to_host(), np.zeros(shape, np.float32))
    monkeypatch.setattr(cuda_spmm, "_ZERO_MAX_BLOCKS", 2)  # 8 threads for 45 elements
    monkeypatch.setattr(cuda_spmm, "_ZERO_THREADS", 4)
    array = cuda.to_device(np.ones((15, 3)))
    cuda_spmm.zero_contiguous(array)
    np.testing.assert_array_equal(array.copy_to_host(), np.zeros((15, 3)))


def test_csr_spmm_cuda_cores():
    rng = np.random.default_rng(3)
    S = random_scipy(rng, (11, 9), 0.3, duplicates=True)
    A = sph.csr_array(S)
    B = rng.standard_normal((9, 5))
    out = np.zeros((11, 5))
    cuda_spmm.launch_csr_spmm(A.indptr, A.indices, A.data, B, out, threads_x=4, threads_y=2)
    np.testing.assert_allclose(out, S @ B, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("precision", ["tf32", "fp16", "fp32"])
def test_spmm_backend_cuda_host_and_device(precision, monkeypatch):
    from pysparse_hpc import _config
    monkeypatch.setattr(_config, "_CUDA_WARPS", 1)  # several column tiles on a tiny input
    monkeypatch.setattr(_config, "_CUDA_SPLIT_BLOCKS", 1)  # split windows, atomic combine
    rng = np.random.default_rng(7)
    S = random_scipy(rng, (19, 12), 0.3, duplicates=True)
    A = sph.csr_array(S, dtype=np.float32)
    B = rng.standard_normal((12, 35)).astype(np.float32)
    expected = S @ B.astype(np.float64)
    rtol = 1e-5 if precision == "fp32" else 2e-3
    scale = np.abs(S) @ np.abs(B.astype(np.float64)) + 1e-30
    for operand in (A, A.to_mebcrs(8)):
        host = sph.spmm(operand, B, backend="cuda", precision=precision)
        assert isinstance(host, np.ndarray) and host.shape == (19, 35)
        assert np.all(np.abs(host - expected) <= rtol * scale + 1e-6)
    device = sph.spmm(A, cuda.to_device(B), precision=precision)  # "auto" follows the data
    assert not isinstance(device, np.ndarray)
    assert np.all(np.abs(device.copy_to_host() - expected) <= rtol * scale + 1e-6)
    if precision == "fp16":  # half B on the device is read as it is; the result is float32
        half = sph.spmm(A, cuda.to_device(B.astype(np.float16)), precision=precision)
        assert half.dtype == np.float32
        np.testing.assert_allclose(half.copy_to_host(), device.copy_to_host(), rtol=1e-6,
                                   atol=1e-6)


def test_cuda_backend_reads_values_changed_in_place():
    """The ME-BCRS form kept on a CSR A keeps its structure only: A's values are read anew."""
    rng = np.random.default_rng(17)
    A = sph.csr_array(random_scipy(rng, (9, 6), 0.4), dtype=np.float32)
    B = rng.standard_normal((6, 4)).astype(np.float32)
    first = sph.spmm(A, B, backend="cuda", precision="tf32")
    A.data *= 2
    np.testing.assert_allclose(sph.spmm(A, B, backend="cuda", precision="tf32"), 2 * first,
                               rtol=1e-6, atol=1e-6)
    values = sph.sddmm(A, np.zeros((9, 3)), np.zeros((6, 3)), beta=1.0, backend="cuda",
                       precision="tf32")
    np.testing.assert_allclose(values.data, A.data, rtol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_spmm_backend_cuda_takes_a_vector(precision):
    """A 1-D B gives the matrix-vector product (M,), as on the CPU (the CUDA backend refused
    it): host NumPy, torch CPU, and device vectors, contiguous or a strided column."""
    import torch
    rng = np.random.default_rng(23)
    S = random_scipy(rng, (11, 9), 0.4)
    A = sph.csr_array(S, dtype=np.float32)
    matrix = rng.standard_normal((9, 3)).astype(np.float32)
    b = np.ascontiguousarray(matrix[:, 1])
    expected = S @ b.astype(np.float64)
    rtol = 1e-5 if precision == "fp32" else 2e-3
    scale = np.abs(S) @ np.abs(b.astype(np.float64)) + 1e-6
    results = [sph.spmm(A, b, backend="cuda", precision=precision),
               sph.spmm(A, matrix[:, 1], backend="cuda", precision=precision),
               sph.spmm(A, torch.from_numpy(b), backend="cuda", precision=precision)]
    assert isinstance(results[2], torch.Tensor)
    for device_b in (cuda.to_device(b), cuda.to_device(matrix)[:, 1]):
        results.append(sph.spmm(A, device_b, precision=precision).copy_to_host())
    for got in results:
        assert tuple(got.shape) == (11,) and got.dtype in (np.float32, torch.float32)
        assert np.all(np.abs(np.asarray(got) - expected) <= rtol * scale)


def test_spmm_backend_cuda_bad_input():
    A = sph.csr_array(np.eye(10, dtype=np.float32))
    B = np.ones((10, 3), np.float32)
    with pytest.raises(ValueError, match="precision must be one of"):
        sph.spmm(A, B, backend="cuda", precision="bf16")
    with pytest.raises(ValueError, match="block_width=8"):
        sph.spmm(A.to_mebcrs(4), B, backend="cuda", precision="tf32")
    with pytest.raises(ValueError, match="dimension mismatch"):
        sph.spmm(A, cuda.to_device(np.ones((4, 3), np.float32)), backend="cuda")
    with pytest.raises(TypeError, match="float32"):
        sph.spmm(A, cuda.to_device(np.ones((10, 3), np.float64)), backend="cuda", precision="tf32")
    with pytest.raises(ValueError, match="B must be 1-D or 2-D, got 3-D"):
        sph.spmm(A, np.ones((10, 3, 2), np.float32), backend="cuda")
    # a float64 A makes "fp32" compute in float64: the error says so, not only "needs float64"
    with pytest.raises(TypeError, match="computes in float64 .A holds float64.*needs float64"):
        sph.spmm(A.astype(np.float64), cuda.to_device(B), backend="cuda")


SDDMM_TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3}


@pytest.mark.parametrize("precision", ["tf32", "fp16", "fp32"])
@pytest.mark.parametrize("shape,width", [((20, 30), 12), ((9, 40), 19)])
def test_sddmm_backend_cuda(precision, shape, width):
    """Host operands give a sparse array of A's pattern; padding slots stay 0 (tensor-core
    paths). Widths 12 and 19 leave a remainder of the feature step (8 for tf32, 16 for fp16)."""
    rng = np.random.default_rng(width)
    S = random_scipy(rng, shape, 0.35)
    dense = S.toarray()
    dense[dense.nonzero()[0][:3], dense.nonzero()[1][:3]] = 0.0  # explicit zeros are entries
    A = sph.csr_array(S, dtype=np.float32)
    X = rng.standard_normal((shape[0], width)).astype(np.float32)
    Y = rng.standard_normal((shape[1], width)).astype(np.float32)
    rows = np.repeat(np.arange(shape[0]), np.diff(S.indptr))
    expected = 0.5 * np.einsum("ij,ij->i", X[rows].astype(np.float64), Y[S.indices]) - S.data
    tolerance = SDDMM_TOLERANCE[precision]
    for operand in (A, A.to_mebcrs(8)):
        result = sph.sddmm(operand, X, Y, alpha=0.5, beta=-1.0, backend="cuda",
                           precision=precision)
        back = result.tocsr()
        np.testing.assert_array_equal(back.indices, S.indices)
        np.testing.assert_allclose(back.data, expected, rtol=tolerance, atol=tolerance * width)
        if isinstance(result, sph.blocked_array):
            assert result.nnz == S.nnz and np.count_nonzero(result.values) <= S.nnz
        assert type(result) is type(operand)
    M = A.to_mebcrs(8)
    device = sph.sddmm(M, cuda.to_device(X), cuda.to_device(Y), precision=precision)
    host = sph.sddmm(M, X, Y, backend="cuda", precision=precision)
    # Device values come in the order of the form the kernel ran on: CSR for fp32, ME-BCRS for
    # the tensor cores.
    in_kernel_order = host.tocsr().data if precision == "fp32" else host.values
    np.testing.assert_allclose(device.copy_to_host(), in_kernel_order, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["tf32", "fp16", "fp32"])
def test_multi_head_sddmm_backend_cuda(precision):
    """(n, heads, F) operands give (slots, heads) in A's storage order, as on the CPU: for a
    CSR A with duplicate entries (each adds its own value) and for ME-BCRS (padding 0)."""
    rng = np.random.default_rng(4)
    S = random_scipy(rng, (11, 13), 0.3, duplicates=True)
    A = sph.csr_array(S, dtype=np.float32)
    assert not A.has_canonical_format
    X = rng.standard_normal((11, 2, 9)).astype(np.float32)
    Y = rng.standard_normal((13, 2, 9)).astype(np.float32)
    tolerance = SDDMM_TOLERANCE[precision]
    for operand in (A, A.to_mebcrs(8)):
        expected = sph.sddmm(operand, X, Y, alpha=2.0, beta=0.5)
        got = sph.sddmm(operand, X, Y, alpha=2.0, beta=0.5, backend="cuda", precision=precision)
        assert isinstance(got, np.ndarray) and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * 9)
    if precision == "fp16":  # half-precision device operands are read as they are
        got = sph.sddmm(A.to_mebcrs(8), cuda.to_device(X.astype(np.float16)),
                        cuda.to_device(Y.astype(np.float16)), precision="fp16")
        np.testing.assert_allclose(got.copy_to_host(), sph.sddmm(A.to_mebcrs(8), X, Y),
                                   rtol=tolerance, atol=tolerance * 9)


def test_sddmm_backend_cuda_bad_input():
    A = sph.csr_array(np.eye(10, dtype=np.float32))
    X = np.ones((10, 4), np.float32)
    with pytest.raises(ValueError, match="precision must be one of"):
        sph.sddmm(A, X, X, backend="cuda", precision="bf16")
    with pytest.raises(ValueError, match="must both be 2-D"):
        sph.sddmm(A, np.ones((10, 2, 4)), X, backend="cuda")
    with pytest.raises(ValueError, match=r"\(heads, width\) differ"):
        sph.sddmm(A, np.ones((10, 2, 4)), np.ones((10, 3, 4)), backend="cuda")
    with pytest.raises(ValueError, match="widths differ"):
        sph.sddmm(A, X, np.ones((10, 3), np.float32), backend="cuda")
    with pytest.raises(ValueError, match="8-row windows"):
        sph.sddmm(A.to_blocked(16), X, X, backend="cuda", precision="tf32")
    with pytest.raises(TypeError, match="float16 or float32"):
        sph.sddmm(A, cuda.to_device(np.ones((10, 4))), X, backend="cuda", precision="fp16")


@pytest.mark.parametrize("heads", [None, 3])
def test_pattern_spmm_cuda_with_per_edge_values(heads):
    """The GPU path of attention's SpMM: per-edge values (per head on strided views)."""
    from pysparse_hpc import ops
    from pysparse_hpc._cuda_backend import pattern_spmm_cuda
    rng = np.random.default_rng(11)
    A = sph.csr_array(random_scipy(rng, (10, 8), 0.35))
    shape = (A.nnz,) if heads is None else (A.nnz, heads)
    values = rng.standard_normal(shape)
    B = rng.standard_normal((8, 4) if heads is None else (8, heads, 4))
    out = pattern_spmm_cuda(A, cuda.to_device(values), cuda.to_device(B))
    np.testing.assert_allclose(out.copy_to_host(), ops.pattern_spmm(A, values, B), rtol=1e-12,
                               atol=1e-12)


def test_gpu_spmm_benchmark_end_to_end(tmp_path, capsys):
    """``bench spmm --backend cuda`` on a tiny R-MAT graph: every contender of ours runs and is
    checked, the table, verdicts, CSV and plot come out; cuSPARSE (no CUDA torch here) is
    reported as not measured."""
    from pysparse_hpc.bench.__main__ import main
    from pysparse_hpc.bench.spmm_cuda import BENCH
    pytest.importorskip("matplotlib")
    table, plot = tmp_path / "gpu.csv", tmp_path / "gpu.png"
    status = main(["spmm", "--backend", "cuda", "--rmat", "5:2", "--matrix", "rmat-s5-e2",
                   "--n", "16", "--repeat", "1", "--flush-mb", "0.004", "--csv", str(table),
                   "--plot", str(plot)])
    printed = capsys.readouterr().out
    assert status == 0
    assert "device: CUDA simulator" in printed and "cuSPARSE not measured" in printed
    assert "not judged (simulator times)" in printed and "rmat-s5-e2" in printed
    with open(table, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1
    values = rows[0]
    for label in ("tf32", "fp16", "tc16x1", "csr"):
        assert float(values[f"{label}_s"]) > 0
    assert values["cusparse_s"] == "nan" and len(BENCH.contenders) == 6
    assert plot.stat().st_size > 0


def test_fp16_refuses_values_beyond_half_range_and_leaves_operands_untouched():
    """A's values or host B beyond float16's range (65,504) would become infinities: fp16
    raises a ValueError naming the largest value, and neither operand is changed."""
    rng = np.random.default_rng(21)
    S = random_scipy(rng, (20, 16), 0.3)
    big = sph.csr_array(S * 1e5, dtype=np.float32)
    small = sph.csr_array(S, dtype=np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float32)
    data_before, B_before = big.data.copy(), B.copy()
    with pytest.raises(ValueError, match="float16.*tf32"):
        sph.spmm(big, B, backend="cuda", precision="fp16")
    with pytest.raises(ValueError, match="but B holds [0-9]"):
        sph.spmm(small, B * np.float32(1e5), backend="cuda", precision="fp16")
    np.testing.assert_array_equal(big.data, data_before)
    np.testing.assert_array_equal(B, B_before)
    X = rng.standard_normal((20, 8)).astype(np.float32) * np.float32(1e5)
    with pytest.raises(ValueError, match="X holds"):
        sph.sddmm(small, X, B, backend="cuda", precision="fp16")
    # within range, and with tf32, the same matrices run
    assert np.all(np.isfinite(sph.spmm(big, B, backend="cuda", precision="tf32")))


class _ArrayOnGpu1:
    """What a CuPy array on CUDA device 1 shows: the array interface, and its device's id."""

    def __init__(self, shape):
        self.shape = shape
        self.dtype = np.dtype(np.float32)
        self.device = type("Device", (), {"id": 1})()
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": "<f4", "data": (0, False), "version": 3, "strides": None}


def test_operands_on_another_device_are_refused(monkeypatch):
    """An array on a CUDA device other than Numba's, and a torch tensor on a non-CUDA device
    ("meta" here; "mps" alike) given to the attention SpMM, get a ValueError naming the
    operand, before anything is sent or launched."""
    import torch

    from pysparse_hpc import _cuda_backend
    A = sph.csr_array(np.eye(4, dtype=np.float32))
    meta = torch.empty((4, 3), device="meta")
    with pytest.raises(ValueError, match="values lives on device 'meta'"):
        _cuda_backend.pattern_spmm_cuda(A, torch.empty(4, device="meta"), meta)
    monkeypatch.setattr(_cuda_backend, "_current_device_id", lambda cuda: 0)
    with pytest.raises(ValueError, match=r"B lives on CUDA device 1, .* on device 0"):
        sph.spmm(A, _ArrayOnGpu1((4, 3)), backend="cuda")
    with pytest.raises(ValueError, match=r"Y lives on CUDA device 1"):
        sph.sddmm(A, np.ones((4, 3), np.float32), _ArrayOnGpu1((4, 3)), backend="cuda")


def test_fp16_keeps_values_that_round_to_the_largest_half():
    """Host values in (65,504, 65,520) round to 65,504, a finite half: fp16 runs on them (65,520
    and up round to infinity and are refused)."""
    def diagonal(first):
        return sph.csr_array(np.diag(np.array([first, 1.0, 2.0], np.float32)))
    B = np.ones((3, 2), np.float32)
    got = sph.spmm(diagonal(65519.0), B, backend="cuda", precision="fp16")
    np.testing.assert_array_equal(got, np.float32([[65504.0] * 2, [1.0] * 2, [2.0] * 2]))
    with pytest.raises(ValueError, match="round to infinity"):
        sph.spmm(diagonal(65520.0), B, backend="cuda", precision="fp16")


def test_float64_values_beyond_float32_are_refused_not_turned_into_infinities():
    """"tf32" reads single values: float64 host values from 2**128 - 2**103 up round to
    infinity in the cast (NumPy only warns) and gave inf/NaN products. They are refused, as
    fp16's overflow is; just below, they round to float32's largest value."""
    from pysparse_hpc._cuda_backend import _host_as, overflow_threshold, spmm_launcher
    assert overflow_threshold(np.float32) == 2.0 ** 128 - 2.0 ** 103
    below = np.array([2.0 ** 128 - 2.0 ** 103 - 2.0 ** 102])
    assert _host_as(below, np.float32, "B")[0] == np.finfo(np.float32).max
    A = sph.csr_array(np.eye(3, dtype=np.float32))
    B = np.ones((3, 2))
    B[0, 0] = 2.0 ** 127
    np.testing.assert_array_equal(sph.spmm(A, B, backend="cuda", precision="tf32"), B)
    B[0, 0] = -(2.0 ** 128 - 2.0 ** 103)
    with pytest.raises(ValueError, match="B is sent to the device as float32.*round to "
                                         "infinity; use precision='fp32' with dtype=float64"):
        sph.spmm(A, B, backend="cuda", precision="tf32")
    big = sph.csr_array(np.diag([1e39, 1.0, 2.0]))
    with pytest.raises(ValueError, match="A's values is sent to the device as float32"):
        sph.spmm(big, np.ones((3, 2), np.float32), backend="cuda", precision="tf32")
    with pytest.raises(ValueError, match="A's values is sent to the device as float32"):
        spmm_launcher(big, "fp32", np.float32)


def test_more_warps_than_a_thread_block_holds_are_refused(monkeypatch):
    """Over 32 warps (1,024 threads) a launch fails on every GPU (the simulator would run it):
    the tensor-core SpMM refuses the setting by name first."""
    from pysparse_hpc import _config
    A = sph.csr_array(np.eye(4, dtype=np.float32))
    B = np.ones((4, 3), np.float32)
    monkeypatch.setattr(_config, "_CUDA_WARPS", 32)
    np.testing.assert_array_equal(sph.spmm(A, B, backend="cuda", precision="tf32"), B)
    monkeypatch.setattr(_config, "_CUDA_WARPS", 33)
    with pytest.raises(ValueError, match="PYSPARSE_HPC_CUDA_WARPS is 33.*at most 32 warps"):
        sph.spmm(A, B, backend="cuda", precision="tf32")


def test_a_dtype_numpy_lacks_gets_a_clear_type_error():
    """torch.bfloat16 (CUDA tensors of it reach the backend as they are) is named, with what
    the kernels take, rather than NumPy's "data type not understood"."""
    import torch

    from pysparse_hpc._cuda_backend import _numpy_dtype
    assert _numpy_dtype(torch.zeros(2, dtype=torch.float16)) == np.float16
    with pytest.raises(TypeError, match="float16, float32 or float64 values, got torch.bfloat16"):
        _numpy_dtype(torch.zeros(2, dtype=torch.bfloat16))


@pytest.mark.parametrize("shape", [(2, 5), (5,)])
def test_a_device_array_on_the_left_of_matmul_stays_on_the_device(shape, rng):
    """``device_array @ A`` was copied to the host (np.asarray) and multiplied on the CPU,
    where ``A @ device_array`` runs on the GPU and returns a device array."""
    A = sph.csr_array(random_scipy(rng, (5, 3), 0.5, dtype=np.float32))
    left = rng.standard_normal(shape).astype(np.float32)
    product = cuda.to_device(left) @ A
    assert sph._dense.is_device_array(product)
    np.testing.assert_allclose(product.copy_to_host(), left @ A.toarray(), rtol=1e-5,
                               atol=1e-6)
