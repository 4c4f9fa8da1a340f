"""On a real GPU only: every CUDA path against scipy, with NumPy, Numba and torch operands.

Skipped without a CUDA device (the simulator does not count here: tests/test_cuda.py covers it).
"""
import numpy as np
import pytest
from numba import config, cuda

import pysparse_hpc as sph

from .conftest import random_scipy

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


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_sddmm_on_device(precision):
    rng = np.random.default_rng(5)
    S = random_scipy(rng, (700, 500), 0.02)
    A = sph.csr_array(S, dtype=np.float32)
    X = rng.standard_normal((700, 64)).astype(np.float32)
    Y = rng.standard_normal((500, 64)).astype(np.float32)
    cpu = sph.sddmm(A, X, Y)
    gpu = sph.sddmm(A, X, Y, backend="cuda", precision=precision)
    np.testing.assert_allclose(gpu.data, cpu.data, rtol=TOLERANCE[precision],
                               atol=TOLERANCE[precision] * 8)


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
