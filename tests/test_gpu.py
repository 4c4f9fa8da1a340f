"""On a real GPU only: every CUDA path against scipy, with NumPy, Numba and torch operands.

Skipped without a CUDA device (the simulator does not count here: tests/test_cuda.py covers it).
"""
import numpy as np
import pytest
from numba import config, cuda

import pysparse_hpc as sph

from .conftest import DATA_DIR, random_scipy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(config.ENABLE_CUDASIM or not cuda.is_available(),
                       reason="needs a real CUDA device"),
]

TOLERANCE = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 2e-3}


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("shape,n", [((1000, 700), 64), ((333, 1000), 130), ((64, 64), 16)])
def test_spmm_on_device(precision, shape, n):
    rng = np.random.default_rng(n)
    S = random_scipy(rng, shape, 0.02)
    A = sph.csr_array(S, dtype=np.float32)
    B = rng.standard_normal((shape[1], n)).astype(np.float32)
    expected = S @ B.astype(np.float64)
    scale = np.abs(S) @ np.abs(B.astype(np.float64)) + 1e-30
    for operand in (A, A.to_mebcrs(8)):
        host = sph.spmm(operand, B, backend="cuda", precision=precision)
        assert np.all(np.abs(host - expected) <= TOLERANCE[precision] * scale + 1e-6)
        device = sph.spmm(operand, cuda.to_device(B), precision=precision)
        np.testing.assert_allclose(device.copy_to_host(), host, rtol=1e-6, atol=1e-6)


def test_csr_kernel_past_the_grid_y_limit():
    """300,000 rows: more row blocks (4 rows each) than a grid's y dimension holds (65,535); the
    simulator does not enforce launch limits."""
    n_rows = 300_000
    rng = np.random.default_rng(9)
    S = random_scipy(rng, (n_rows, 50), 4 / 50)
    B = rng.standard_normal((50, 8)).astype(np.float32)
    got = sph.spmm(sph.csr_array(S, dtype=np.float32), B, backend="cuda", precision="fp32")
    np.testing.assert_allclose(got, S @ B.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_tensor_core_sddmm_past_the_grid_y_limit(precision):
    """One window of 1,100,000 vectors: 68,750 warp tiles, more than a grid's y dimension holds
    (65,535); the tile grid runs along x."""
    import scipy.sparse as sp
    n_cols = 1_100_000
    rng = np.random.default_rng(12)
    S = sp.csr_matrix((np.ones(n_cols), (np.zeros(n_cols, np.int64), np.arange(n_cols))),
                      shape=(3, n_cols))
    X = rng.standard_normal((3, 8)).astype(np.float32)
    Y = rng.standard_normal((n_cols, 8)).astype(np.float32)
    got = sph.sddmm(sph.csr_array(S, dtype=np.float32), X, Y, backend="cuda",
                    precision=precision)
    expected = Y.astype(np.float64) @ X[0].astype(np.float64)
    np.testing.assert_allclose(got.data, expected, rtol=5e-3, atol=5e-3 * 8)


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_fp16_refuses_values_beyond_half_range(precision):
    """Values above 65504 become infinities in float16: fp16 refuses them, tf32 is exact."""
    S = random_scipy(np.random.default_rng(3), (64, 64), 0.1) * 1e5
    B = np.ones((64, 16), dtype=np.float32)
    A = sph.csr_array(S, dtype=np.float32)
    if precision == "fp16":
        with pytest.raises(ValueError, match="float16"):
            sph.spmm(A, B, backend="cuda", precision=precision)
    else:
        got = sph.spmm(A, B, backend="cuda", precision=precision)
        assert np.all(np.isfinite(got))


def test_torch_cuda_tensors_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    rng = np.random.default_rng(0)
    S = random_scipy(rng, (500, 400), 0.02)
    A = sph.csr_array(S, dtype=np.float32)
    B = torch.randn(400, 48, device="cuda")
    result = sph.spmm(A, B, precision="tf32")
    assert isinstance(result, torch.Tensor) and result.device.type == "cuda"
    expected = S @ B.cpu().numpy().astype(np.float64)
    np.testing.assert_allclose(result.cpu().numpy(), expected, rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("heads", [None, 3])
def test_sddmm_on_device(precision, heads):
    rng = np.random.default_rng(5)
    S = random_scipy(rng, (700, 500), 0.02)
    A = sph.csr_array(S, dtype=np.float32)
    shape = (64,) if heads is None else (heads, 37)  # 37: a remainder of every feature step
    X = rng.standard_normal((700,) + shape).astype(np.float32)
    Y = rng.standard_normal((500,) + shape).astype(np.float32)
    cpu = sph.sddmm(A, X, Y, beta=0.5)
    gpu = sph.sddmm(A, X, Y, beta=0.5, backend="cuda", precision=precision)
    if heads is None:
        cpu, gpu = cpu.data, gpu.data
    np.testing.assert_allclose(gpu, cpu, rtol=TOLERANCE[precision],
                               atol=TOLERANCE[precision] * 8)


def test_half_operands_on_device():
    rng = np.random.default_rng(6)
    S = random_scipy(rng, (600, 450), 0.02)
    M = sph.csr_array(S, dtype=np.float32).to_mebcrs(8)
    B = rng.standard_normal((450, 96)).astype(np.float16)
    got = sph.spmm(M, cuda.to_device(B), precision="fp16").copy_to_host()
    expected = S @ B.astype(np.float64)
    scale = np.abs(S) @ np.abs(B.astype(np.float64)) + 1e-30
    assert got.dtype == np.float32 and np.all(np.abs(got - expected) <= 2e-3 * scale + 1e-6)


def test_gpu_benchmark_on_cora(tmp_path, capsys):
    """The GPU benchmark on one shared matrix: every contender runs and the targets are judged
    (cuSPARSE needs a CUDA build of torch)."""
    from pysparse_hpc.bench.__main__ import main
    if not (DATA_DIR / "cora.npz").exists():
        pytest.skip("shared data not present")
    status = main(["spmm", "--backend", "cuda", "--data", str(DATA_DIR), "--matrix", "cora",
                   "--no-rmat", "--n", "128", "--repeat", "5", "--csv", str(tmp_path / "g.csv")])
    printed = capsys.readouterr().out
    assert status == 0 and "ours-tf32" in printed
    assert "8x1 (ours-tf32) faster than 16x1 (all rows, geometric mean of 1)" in printed


@pytest.mark.parametrize("layer", ["gcn", "gat", "agnn"])
def test_gnn_layers_on_cuda_tensors_match_the_cpu(layer):
    """Forward and backward of each layer with CUDA tensors, against the same layer on the CPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from pysparse_hpc import nn
    cora = sph.datasets.load("cora")
    torch.manual_seed(0)
    module = {"gcn": lambda: nn.GCNConv(1433, 16), "gat": lambda: nn.GATConv(1433, 8, heads=4),
              "agnn": lambda: nn.AGNNConv()}[layer]().eval()
    results = []
    for device in ("cpu", "cuda"):
        module.to(device)
        x = torch.from_numpy(cora.x).to(device).requires_grad_(True)
        out = module(x, cora.adj)
        assert out.device.type == device
        out.square().sum().backward()
        results.append((out.detach().cpu(), x.grad.cpu()))
        module.zero_grad()
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_gnn_benchmark_on_the_gpu(tmp_path, capsys):
    """The GNN training benchmark with ``--device cuda`` on Cora: ours and PyG's GCN and GAT on
    the GPU, both checks passed (against PyG, and against our model on the CPU), the GPU named,
    and the CPU targets reported as not judged."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from pysparse_hpc.bench.__main__ import main
    table = tmp_path / "gnn.csv"
    # Cora ships with the package: any existing directory serves as --data.
    status = main(["gnn", "--device", "cuda", "--data", str(tmp_path), "--graph", "cora",
                   "--model", "gcn", "--model", "gat", "--hidden", "16", "--repeat", "3",
                   "--csv", str(table)])
    printed = capsys.readouterr().out
    assert status == 0
    assert torch.cuda.get_device_name() in printed
    assert "not judged on the GPU" in printed
    assert not any(line.startswith("target:") for line in printed.splitlines())
    rows = table.read_text().splitlines()
    # header + GCN (PyG, ours, two orders, no input dropout) + GAT (PyG, ours, cache none and H)
    assert len(rows) == 1 + 5 + 4
    assert rows[0].endswith(",device")


def test_gpu_sddmm_benchmark_on_cora(tmp_path, capsys):
    """The GPU SDDMM benchmark on one shared matrix with 4 heads: every contender of ours runs
    and passes its check, the means are reported without a target (torch needs a CUDA build;
    a dtype it refuses is noted)."""
    from pysparse_hpc.bench.__main__ import main
    if not (DATA_DIR / "cora.npz").exists():
        pytest.skip("shared data not present")
    status = main(["sddmm", "--backend", "cuda", "--data", str(DATA_DIR), "--matrix", "cora",
                   "--no-rmat", "--n", "64", "--heads", "4", "--repeat", "3"])
    printed = capsys.readouterr().out
    assert status == 0
    for name in ("ours-tf32", "ours-fp16", "ours-csr", "torch-fp32", "torch-fp16"):
        assert name in printed
    assert "4 heads: X (rows, 4, F)" in printed
    assert "ours-tf32 over ours-csr (all rows, geometric mean of 1)" in printed
    assert "reported, no target" in printed
