"""Randomised and edge-case checks of the CUDA kernels and launchers under the simulator, against
float64 NumPy/scipy (tiny inputs: the simulator runs every CUDA thread as a Python thread). Run
with NUMBA_ENABLE_CUDASIM=1 set before numba is imported; `tests/test_cuda.py` does that in a
subprocess."""
import numpy as np
import pytest
import scipy.sparse as sp
from numba import config

if not config.ENABLE_CUDASIM:
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 (run through tests/test_cuda.py)",
                allow_module_level=True)

from numba import cuda  # noqa: E402
from numba.cuda.simulator import kernel as simulated_kernel  # noqa: E402

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc import _config  # noqa: E402
from pysparse_hpc._cuda_backend import (  # noqa: E402
    _c_contiguous,
    pattern_spmm_cuda,
    sddmm_launcher,
    spmm_launcher,
)
from pysparse_hpc.kernels.cuda._mma import (  # noqa: E402
    LAYOUT_M16N8K8_F16,
    LAYOUT_M16N8K8_TF32,
    LAYOUT_M16N8K16_F16,
)

pytestmark = pytest.mark.cuda

# Relative to sum |a| |b| (tf32 and fp16 keep 10 mantissa bits of each operand, fp32 sums).
TOLERANCE = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 2e-3}
#: The dtypes each precision reads on the device (a float32 A: "fp32" computes in B's).
ON_DEVICE = {"fp32": (np.float32, np.float64), "tf32": (np.float32,),
             "fp16": (np.float16, np.float32)}


def _ptx_positions(rule, n_registers):
    """(32, n, 2) positions from the PTX ISA's per-element formulas ``rule(i, g, t)``."""
    return np.array([[rule(i, lane >> 2, lane & 3) for i in range(n_registers)]
                     for lane in range(32)])


def test_fragment_layouts_follow_the_ptx_isa():
    """The layout tables against the PTX ISA's formulas, written here independently (element
    i of a lane, groupID g, threadID_in_group t)."""
    tf32 = LAYOUT_M16N8K8_TF32
    np.testing.assert_array_equal(
        tf32["a"], _ptx_positions(lambda i, g, t: (g + 8 * (i % 2), t + 4 * (i // 2)), 4))
    np.testing.assert_array_equal(
        tf32["b"], _ptx_positions(lambda i, g, t: (t + 4 * i, g), 2))
    accumulator = _ptx_positions(lambda i, g, t: (g + 8 * (i // 2), 2 * t + i % 2), 4)
    for layout in (LAYOUT_M16N8K8_TF32, LAYOUT_M16N8K8_F16, LAYOUT_M16N8K16_F16):
        np.testing.assert_array_equal(layout["c"], accumulator)
    np.testing.assert_array_equal(
        LAYOUT_M16N8K8_F16["a"], _ptx_positions(lambda i, g, t: (g + 8 * (i // 2), 2 * t + i % 2),
                                                4))
    np.testing.assert_array_equal(
        LAYOUT_M16N8K8_F16["b"], _ptx_positions(lambda i, g, t: (2 * t + i, g), 2))
    np.testing.assert_array_equal(
        LAYOUT_M16N8K16_F16["a"],
        _ptx_positions(lambda i, g, t: (g + 8 * ((i // 2) % 2), 2 * t + i % 2 + 8 * (i // 4)), 8))
    np.testing.assert_array_equal(
        LAYOUT_M16N8K16_F16["b"], _ptx_positions(lambda i, g, t: (2 * t + i % 2 + 8 * (i // 2), g),
                                                 4))


def test_half_per_edge_spmm_accumulates_in_float32():
    """The CUDA-core kernel behind attention's SpMM summed half operands in a half accumulator,
    which stops growing at 2,048 (2048 + 1 rounds back to 2048): 3,000 unit products gave 2,048
    where the CPU gives 3,000."""
    n = 3000
    A = sph.csr_array(sp.csr_array((np.ones(n), (np.zeros(n, np.int64), np.arange(n))),
                                   shape=(2, n)))
    values = np.ones(n, np.float16)
    B = np.ones((n, 1), np.float16)
    got = pattern_spmm_cuda(A, cuda.to_device(values), cuda.to_device(B)).copy_to_host()
    np.testing.assert_array_equal(got.astype(np.float64), [[3000.0], [0.0]])


def _random_csr(rng, shape, density, duplicates=False):
    n_rows, n_cols = shape
    nnz = int(round(density * n_rows * n_cols))
    rows = rng.integers(0, max(n_rows, 1), nnz)
    cols = rng.integers(0, max(n_cols, 1), nnz)
    if n_rows > 8:
        keep = rows // 8 != 1  # an empty window
        rows, cols = rows[keep], cols[keep]
    data = rng.standard_normal(rows.size)
    if duplicates:  # scipy keeps repeated (i, j) built from COO
        rows, cols, data = np.r_[rows, rows[:3]], np.r_[cols, cols[:3]], np.r_[data, data[:3]]
    return sp.coo_array((data, (rows, cols)), shape=shape).tocsr()


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_spmm_against_float64(seed, monkeypatch):
    """Rows and widths off every multiple of 8 and 16, empty rows and windows, duplicates, host
    and device B of each float dtype, the 16x1 ablation, split windows."""
    rng = np.random.default_rng(100 + seed)
    monkeypatch.setattr(_config, "_CUDA_WARPS", int(rng.integers(1, 3)))
    monkeypatch.setattr(_config, "_CUDA_SPLIT_BLOCKS", int(rng.choice([1, 32])))
    for case in range(6):
        shape = (int(rng.choice([1, 7, 9, 17, 25])), int(rng.choice([1, 5, 13, 20])))
        n = int(rng.choice([1, 7, 9, 17, 33]))
        S = _random_csr(rng, shape, float(rng.choice([0.0, 0.15, 0.5])), bool(case % 2))
        precision = ("fp32", "tf32", "fp16")[case % 3]
        dtype = (np.float16, np.float32, np.float64)[int(rng.integers(3))]
        A = sph.csr_array(S, dtype=np.float32)
        form = (A, A.to_mebcrs(8), A.to_blocked(window=16, block_width=8))[int(rng.integers(3))]
        if isinstance(form, sph.blocked_array) and form.window == 16:
            precision = "tf32"  # the ablation's one precision
        B = rng.standard_normal((shape[1], n)).astype(dtype)
        on_device = dtype in ON_DEVICE[precision] and rng.random() < 0.7
        operand = cuda.to_device(B) if on_device else B
        got = sph.spmm(form, operand, backend="cuda", precision=precision)
        got = got.copy_to_host() if on_device else got
        exact = (B.astype(np.float16) if precision == "fp16" else B).astype(np.float64)
        dense = S.toarray()
        expected = dense @ exact
        scale = np.abs(dense) @ np.abs(exact)
        assert got.shape == expected.shape
        assert np.all(np.abs(got - expected) <= TOLERANCE[precision] * scale + 1e-6), (
            seed, case, shape, n, precision, dtype)


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_sddmm_against_float64(seed):
    """Feature widths off the steps (8 for tf32, 16 for fp16), one and several heads, alpha and
    beta, CSR (with duplicates) and ME-BCRS, host and device operands."""
    rng = np.random.default_rng(200 + seed)
    for case in range(6):
        shape = (int(rng.choice([1, 7, 9, 17])), int(rng.choice([1, 6, 19])))
        S = _random_csr(rng, shape, float(rng.choice([0.0, 0.2, 0.5])), bool(case % 2))
        precision = ("fp32", "tf32", "fp16")[case % 3]
        width = int(rng.choice([1, 7, 9, 17]))
        heads = () if rng.random() < 0.5 else (2,)
        X = rng.standard_normal((shape[0],) + heads + (width,)).astype(np.float32)
        Y = rng.standard_normal((shape[1],) + heads + (width,)).astype(np.float32)
        alpha, beta = float(rng.choice([1.0, -0.5])), float(rng.choice([0.0, 2.0]))
        A = sph.csr_array(S, dtype=np.float32)
        form = A if rng.random() < 0.5 else A.to_mebcrs(8)
        reference = sph.sddmm(form, X.astype(np.float64), Y.astype(np.float64), alpha=alpha,
                              beta=beta)
        bound = sph.sddmm(form, np.abs(X).astype(np.float64), np.abs(Y).astype(np.float64),
                          alpha=abs(alpha))
        got = sph.sddmm(form, X, Y, alpha=alpha, beta=beta, backend="cuda", precision=precision)
        if not heads:
            take = (lambda r: r.values) if isinstance(form, sph.blocked_array) else (
                lambda r: r.data)
            reference, bound, got = take(reference), take(bound), take(got)
        assert got.shape == reference.shape
        assert np.all(np.abs(got - reference) <= TOLERANCE[precision] * bound + 1e-6), (
            seed, case, shape, width, heads, precision)


@pytest.mark.parametrize("scalars", [dict(alpha=1e39), dict(beta=1e-40), dict(alpha=-1e39)])
def test_sddmm_scalars_float32_does_not_hold_are_refused(scalars, launches):
    """The kernels scale in float32, which turned alpha = 1e39 into inf everywhere; float64
    operands, which hold it, still work."""
    A = sph.csr_array(sp.random(9, 6, density=0.5, random_state=3, format="csr"),
                      dtype=np.float32)
    X, Y = np.ones((9, 4), np.float32), np.ones((6, 4), np.float32)
    for precision in ("fp32", "tf32", "fp16"):
        with pytest.raises(ValueError, match="float32, the result's dtype on the GPU"):
            sph.sddmm(A, X, Y, backend="cuda", precision=precision, **scalars)
    assert not launches  # refused before any kernel ran
    got = sph.sddmm(A.astype(np.float64), X.astype(np.float64), Y.astype(np.float64),
                    backend="cuda", **scalars)
    expected = sph.sddmm(A.astype(np.float64), X.astype(np.float64), Y.astype(np.float64),
                         **scalars)
    np.testing.assert_allclose(got.data, expected.data, rtol=1e-12)


@pytest.fixture
def launches(monkeypatch):
    """Every kernel launch's (name, grid, block, host array arguments)."""
    seen = []
    call = simulated_kernel.FakeCUDAKernel.__call__

    def recording(self, *args):
        if not self._device:
            grid, block = simulated_kernel.normalize_kernel_dimensions(self.grid_dim,
                                                                       self.block_dim)
            host = [k for k, a in enumerate(args) if isinstance(a, np.ndarray) and a.ndim]
            seen.append((self.fn.__name__, grid, block, host))
        return call(self, *args)
    monkeypatch.setattr(simulated_kernel.FakeCUDAKernel, "__call__", recording)
    return seen


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_degenerate_shapes_launch_nothing_empty(precision, launches):
    """Empty matrices, an empty B width, features or heads: right results, and no launch with
    a zero extent (the driver refuses one; the simulator runs it) or host arrays (implicit
    copies on a GPU)."""
    for shape in [(0, 5), (5, 0), (0, 0), (9, 4)]:
        dense = np.zeros(shape, np.float32)
        if shape == (9, 4):
            dense[8, 3] = 2.0  # one entry in a last, one-row window
        for form in (sph.csr_array(dense), sph.csr_array(dense).to_mebcrs(8)):
            for n in (0, 3):
                B = np.ones((shape[1], n), np.float32)
                got = sph.spmm(form, cuda.to_device(B), precision=precision).copy_to_host()
                np.testing.assert_array_equal(got, dense @ B)
            for per_row in [(0,), (3,), (2, 0), (0, 3)]:
                X = cuda.to_device(np.ones((shape[0],) + per_row, np.float32))
                Y = cuda.to_device(np.ones((shape[1],) + per_row, np.float32))
                got = sph.sddmm(form, X, Y, beta=1.0, precision=precision)
                got = got.copy_to_host()
                blocked = form if isinstance(form, sph.blocked_array) else form.to_mebcrs(8)
                stored = form.nnz if precision == "fp32" else blocked.values.size
                assert got.shape == (stored,) + per_row[:-1]
    bad = [launch for launch in launches if min(launch[1]) < 1 or launch[3]]
    assert launches and not bad


def _device(shape, dtype=np.float32):
    return cuda.to_device(np.ones(shape, dtype))


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_spmm_launcher_refuses_wrong_operands(precision):
    """The launcher ran its kernel on whatever it got: a narrow or short out was left partly
    unwritten, a wide one or a short B read past B's end (an illegal address on a GPU)."""
    A = sph.csr_array(np.eye(11, 9, dtype=np.float32))
    launch = spmm_launcher(A, precision)
    B, out = _device((9, 5)), _device((11, 5))
    launch(B, out)
    np.testing.assert_array_equal(out.copy_to_host(), np.eye(11, 9) @ np.ones((9, 5)))
    for wrong_out in [(11, 4), (11, 6), (10, 5), (11,)]:
        with pytest.raises(ValueError, match=r"out has shape .*, expected \(11, 5\)"):
            launch(B, _device(wrong_out))
    for wrong_B in [(8, 5), (9,)]:
        with pytest.raises(ValueError, match=r"B has shape .*, expected \(9, any\)"):
            launch(_device(wrong_B), out)
    with pytest.raises(TypeError, match="B has dtype float64, expected float"):
        launch(_device((9, 5), np.float64), out)
    with pytest.raises(TypeError, match="out has dtype float64, expected float32"):
        launch(B, _device((11, 5), np.float64))
    with pytest.raises(TypeError, match="B must be a device array"):
        launch(np.ones((9, 5), np.float32), out)
    strided = _device((11, 10))[:, ::2]  # any strides serve for SpMM
    launch(B, strided)
    np.testing.assert_array_equal(strided.copy_to_host(), out.copy_to_host())


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("heads", [None, 2])
def test_sddmm_launcher_refuses_wrong_operands(precision, heads):
    """Rows of X or Y short of A's (reads past their end), another width or head count (reads
    past the end, or writes past out's for a head out does not hold), a short out (entries
    left unwritten) and a strided one (which the tensor-core launch cannot zero) are refused."""
    A = sph.csr_array(np.eye(11, 9, dtype=np.float32))
    launch = sddmm_launcher(A, precision, heads)
    per_slot = launch.out_shape[1:]
    X, Y = _device((11,) + per_slot + (4,)), _device((9,) + per_slot + (4,))
    out = cuda.device_array(launch.out_shape, np.float32)
    launch(X, Y, out)
    assert np.all(launch.in_storage_order(out.copy_to_host(), like=A) == 4.0)
    slots = launch.out_shape[0]
    with pytest.raises(ValueError, match="X has shape"):
        launch(_device((10,) + per_slot + (4,)), Y, out)
    with pytest.raises(ValueError, match="Y has shape"):
        launch(X, _device((8,) + per_slot + (4,)), out)
    with pytest.raises(ValueError, match="Y has shape"):
        launch(X, _device((9,) + per_slot + (3,)), out)
    with pytest.raises(ValueError, match="X has shape"):
        launch(_device((11, 3, 4)), _device((9, 3, 4)), out)
    with pytest.raises(ValueError, match="out has shape"):
        launch(X, Y, _device((slots - 1,) + per_slot))
    with pytest.raises(TypeError, match="X has dtype float64"):
        launch(_device((11,) + per_slot + (4,), np.float64), Y, out)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        launch(X, Y, _device((slots,) + per_slot + (2,))[..., 0])


def test_contiguity_from_the_cuda_array_interface():
    """`_c_contiguous` reads a real device array's interface: strides None, or C strides
    (any stride where an extent is 1, as torch reports), and not a strided view."""
    class Device:
        def __init__(self, shape, strides):
            self.__cuda_array_interface__ = {"shape": shape, "strides": strides,
                                             "typestr": "<f4", "data": (0, False), "version": 3}
    assert _c_contiguous(Device((5, 3), None)) and _c_contiguous(Device((5, 3), (12, 4)))
    assert _c_contiguous(Device((5, 1), (4, 99))) and _c_contiguous(Device((0, 3), (4, 8)))
    assert not _c_contiguous(Device((5, 3), (24, 8))) and not _c_contiguous(Device((5,), (8,)))
