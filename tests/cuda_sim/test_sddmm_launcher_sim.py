"""`sddmm_launcher` and ``bench sddmm --backend cuda`` under the simulator (tiny inputs). Run
with NUMBA_ENABLE_CUDASIM=1 set before numba is imported; `tests/test_cuda.py` does that in a
subprocess."""
import csv

import numpy as np
import pytest
from numba import config

if not config.ENABLE_CUDASIM:
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 (run through tests/test_cuda.py)",
                allow_module_level=True)

from numba import cuda  # noqa: E402

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc._cuda_backend import sddmm_launcher  # noqa: E402

from ..conftest import random_scipy  # noqa: E402

pytestmark = pytest.mark.cuda

TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3}


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("heads", [None, 2])
def test_sddmm_launcher_matches_the_cpu(precision, heads):
    """The kernels alone, on a CSR A and on its ME-BCRS form, against `sph.sddmm` on the CPU:
    the launcher's results mapped back to A's storage order (CSR order; ME-BCRS slots with
    padding 0) and to the other form's, and in the kernel's own order as `sddmm` gives device
    results."""
    rng = np.random.default_rng(7)
    S = random_scipy(rng, (12, 30), 0.3)  # two windows of 8 rows
    A = sph.csr_array(S, dtype=np.float32)
    M = A.to_mebcrs(8)
    shape = (12,) if heads is None else (heads, 12)  # 12: a remainder of every feature step
    X = rng.standard_normal((12,) + shape).astype(np.float32)
    Y = rng.standard_normal((30,) + shape).astype(np.float32)
    tolerance = TOLERANCE[precision]
    for operand in (A, M):
        launch = sddmm_launcher(operand, precision, heads)
        assert launch.out_shape[1:] == (() if heads is None else (heads,))
        send = launch.operand_dtypes[0]
        assert send == (np.float16 if precision == "fp16" else np.float32)
        out = cuda.device_array(launch.out_shape, dtype=launch.result_dtype)
        launch(cuda.to_device(X.astype(send)), cuda.to_device(Y.astype(send)), out)
        got = launch.in_storage_order(out.copy_to_host())
        expected = sph.sddmm(operand, X, Y)
        if heads is None:
            expected = expected.values if isinstance(operand, sph.blocked_array) else expected.data
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * 12)
        # in the other form's order too, and unmapped where the kernel ran on A itself
        other = M if operand is A else A
        in_other = launch.in_storage_order(out.copy_to_host(), like=other)
        want = sph.sddmm(other, X, Y)
        if heads is None:
            want = want.values if isinstance(other, sph.blocked_array) else want.data
        np.testing.assert_allclose(in_other, want, rtol=tolerance, atol=tolerance * 12)
    # sddmm's device results on M come in the launcher's order (M's slots; fp32: M.tocsr()'s)
    device = sph.sddmm(M, cuda.to_device(X), cuda.to_device(Y), precision=precision)
    np.testing.assert_allclose(out.copy_to_host(), device.copy_to_host(), rtol=1e-6, atol=1e-6)


def test_sddmm_launcher_bad_arguments():
    A = sph.csr_array(np.eye(10, dtype=np.float32))
    with pytest.raises(ValueError, match="precision must be one of"):
        sddmm_launcher(A, "bf16")
    with pytest.raises(ValueError, match="heads must be"):
        sddmm_launcher(A, "tf32", heads=0)
    with pytest.raises(ValueError, match="8-row windows"):
        sddmm_launcher(A.to_blocked(16), "tf32")


def test_sddmm_keeps_a_blocked_results_padding_zero_for_infinite_scalars():
    """inf * 0 in the padding slots: zeroed for host operands (as on the CPU), refused by
    name for device operands."""
    rng = np.random.default_rng(3)
    M = sph.csr_array(random_scipy(rng, (9, 6), 0.3), dtype=np.float32).to_mebcrs(8)
    X = rng.standard_normal((9, 4)).astype(np.float32)
    Y = rng.standard_normal((6, 4)).astype(np.float32)
    for scalars in (dict(alpha=np.inf), dict(beta=np.inf)):
        # fp32 gathers the CSR kernel's result into M's slots and adds beta M on the host
        got = sph.sddmm(M, X, Y, backend="cuda", **scalars)
        got.check_format(full_check=True)
        np.testing.assert_array_equal(got.values, sph.sddmm(M, X, Y, **scalars).values)
    sph.sddmm(M, X, Y, alpha=np.inf, backend="cuda", precision="tf32").check_format(
        full_check=True)   # the tensor-core kernel ran on M's own slots
    with pytest.raises(ValueError, match="blocked slots of A, whose padding would be inf"):
        sph.sddmm(M, cuda.to_device(X), cuda.to_device(Y), beta=np.inf, precision="tf32")
    with pytest.raises(ValueError, match="slots of the ME-BCRS operand, whose padding"):
        sph.sddmm(M.tocsr(), cuda.to_device(X), cuda.to_device(Y), beta=np.inf,
                  precision="tf32")
    # fp32 runs the CSR kernel on M.tocsr(): no padding slots, nothing to refuse
    sph.sddmm(M, cuda.to_device(X), cuda.to_device(Y), beta=np.inf)


@pytest.mark.parametrize("heads", ["1", "2"])
def test_gpu_sddmm_benchmark_end_to_end(heads, tmp_path, capsys):
    """``bench sddmm --backend cuda`` on a tiny R-MAT graph: every contender of ours runs and
    passes its check (a wrong result would end with status 1), the table, reported means, CSV
    and plot come out; torch (no CUDA torch here) is reported as not measured."""
    from pysparse_hpc.bench.__main__ import main
    from pysparse_hpc.bench.sddmm_cuda import BENCH
    pytest.importorskip("matplotlib")
    table, plot = tmp_path / "gpu.csv", tmp_path / "gpu.png"
    status = main(["sddmm", "--backend", "cuda", "--rmat", "5:2", "--matrix", "rmat-s5-e2",
                   "--n", "16", "--repeat", "1", "--flush-mb", "0.004", "--heads", heads,
                   "--csv", str(table), "--plot", str(plot)])
    printed = capsys.readouterr().out
    assert status == 0
    assert "device: CUDA simulator" in printed and "torch not measured" in printed
    assert "not reported (simulator times)" in printed and "rmat-s5-e2" in printed
    assert ("X (rows, F), Y (cols, F)" if heads == "1" else "2 heads: X (rows, 2, F)") in printed
    with open(table, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1
    values = rows[0]
    assert values["heads"] == heads and values["F"] == "16"
    for label in ("tf32", "fp16", "csr"):
        assert float(values[f"{label}_s"]) > 0
    assert values["torch_s"] == values["torch16_s"] == "nan" and len(BENCH.contenders) == 5
    assert plot.stat().st_size > 0


def test_mma_tiles():
    """One tile per 16 vectors of a window, none for an empty one, windows in order."""
    from pysparse_hpc.kernels.cuda.sddmm import mma_tiles
    window, first_slot = mma_tiles(np.array([0, 0, 40, 41, 41, 57]))  # 0, 40, 1, 0, 16 vectors
    np.testing.assert_array_equal(window, [1, 1, 1, 2, 4])
    np.testing.assert_array_equal(first_slot, [0, 16, 32, 0, 0])
    window, first_slot = mma_tiles(np.array([0, 0, 0]))
    assert window.shape == first_slot.shape == (0,)


class _GridRecorder:
    """Stands in for a kernel: records each launch configuration and runs the kernel."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.grids = []

    def __getitem__(self, config):
        self.grids.append(config[0])
        return self.kernel[config]


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_tensor_core_sddmm_launches_only_tiles_with_work(precision, monkeypatch):
    """A skewed pattern: a window of 40 vectors among an empty window and a one-vector one, and a
    final partial window. The grid holds one block per 16 vectors of a window, not windows x
    the widest window's tiles (idle blocks on skewed graphs, and over 65,535 tiles of one window
    beyond the grid's y limit); the results still match the CPU for 2-D and 2-head operands."""
    from pysparse_hpc.kernels.cuda import sddmm as kernels
    rng = np.random.default_rng(5)
    dense = np.zeros((27, 41))
    dense[0, :40] = rng.standard_normal(40)  # window 0: 40 vectors (3 tiles)
    dense[3, 7] = 1.5
    dense[17, 40] = -2.0  # window 1 empty, window 2: 1 vector
    dense[25, [2, 5]] = 0.5  # window 3 (rows 24..26): 2 vectors
    M = sph.csr_array(dense, dtype=np.float32).to_mebcrs(8)
    vectors = np.diff(M.row_window_offset)
    assert list(vectors) == [40, 0, 1, 2]
    recorder = _GridRecorder(kernels._MMA_KERNELS[precision])
    monkeypatch.setitem(kernels._MMA_KERNELS, precision, recorder)
    for shape in [(12,), (2, 5)]:
        X = rng.standard_normal((27,) + shape).astype(np.float32)
        Y = rng.standard_normal((41,) + shape).astype(np.float32)
        got = sph.sddmm(M, X, Y, alpha=0.5, beta=1.0, backend="cuda", precision=precision)
        want = sph.sddmm(M, X.astype(np.float64), Y.astype(np.float64), alpha=0.5, beta=1.0)
        if len(shape) == 1:
            got, want = got.values, want.values
        np.testing.assert_allclose(got, want, rtol=TOLERANCE[precision],
                                   atol=TOLERANCE[precision] * 12)
    tiles = int(np.sum(-(-vectors // 16)))  # 3 + 0 + 1 + 1
    assert len(recorder.grids) == 3  # one launch for 2-D operands, one per head for 2 heads
    for grid in recorder.grids:
        assert int(np.prod(grid)) == tiles


def test_a_blocked_operand_keeps_one_csr_form_across_calls():
    """"fp32" runs a blocked A's CSR form: converted once and kept, so repeated calls neither
    send the structure anew nor grow A's cache (each call added a slot map that was never
    dropped), and values changed in place are still read anew, by SpMM and SDDMM alike."""
    rng = np.random.default_rng(9)
    M = sph.csr_array(random_scipy(rng, (10, 7), 0.4), dtype=np.float32).to_mebcrs(8)
    X = rng.standard_normal((10, 3)).astype(np.float32)
    Y = rng.standard_normal((7, 3)).astype(np.float32)
    B = rng.standard_normal((7, 2)).astype(np.float32)
    sizes = []
    for call in range(4):
        got = sph.sddmm(M, X, Y, alpha=0.5, beta=1.0, backend="cuda")
        np.testing.assert_allclose(got.values, sph.sddmm(M, X, Y, alpha=0.5, beta=1.0).values,
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sph.spmm(M, B, backend="cuda"), sph.spmm(M, B), rtol=1e-5,
                                   atol=1e-5)
        sizes.append(len(M.__dict__["_device_cache"]))
        if call == 1:
            M.values *= 2  # seen by the next calls
    assert len(set(sizes)) == 1, sizes
