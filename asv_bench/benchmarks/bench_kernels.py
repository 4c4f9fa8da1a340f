"""asv benchmarks of SpMM and SDDMM in float32, on CSR and ME-BCRS, with scipy and torch as peers.

Matrices come from the shared data directory (see ``bench_convert``); when it, a matrix or torch
is missing, ``setup`` raises NotImplementedError and asv skips the benchmark. Threads follow the
library's setting (``PYSPARSE_HPC_NUM_THREADS``) and torch is given the same number; scipy is
single-threaded. ``setup`` calls every function once, so the Numba kernels are compiled (or
loaded from their cache) before anything is timed.
"""
import warnings

import numpy as np

from pysparse_hpc import get_num_threads, sddmm

from ._checks import check_close
from .bench_convert import load_matrix

#: Benchmark matrices (keys of ``bench_convert.MATRICES``): a FEM matrix with dense rows, a
#: skewed social graph and a citation graph.
KERNEL_MATRICES = ["bcsstk13", "wiki-Vote", "pubmed"]

#: Formats of our operand: CSR as loaded, or ME-BCRS (8-row windows, 8 vectors per block).
KERNEL_FORMATS = ["csr", "mebcrs"]

#: Dense widths: N of B for SpMM, F of X and Y for SDDMM.
WIDTHS = [32, 128]


def import_torch():
    """torch with the library's thread count; NotImplementedError (asv: skip) if absent."""
    try:
        import torch
    except ImportError:
        raise NotImplementedError("torch is not installed") from None
    torch.set_num_threads(get_num_threads())
    return torch


def float32_operands(matrix, fmt):
    """(float32 CSR, our operand in ``fmt``, torch CSR tensor with the CSR's index dtype,
    torch)."""
    torch = import_torch()
    csr = load_matrix(matrix).astype(np.float32, copy=False)
    ours = csr.to_mebcrs() if fmt == "mebcrs" else csr
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        # The same index arrays as ours and scipy's (int32 where scipy picks it): torch keeps
        # the dtype it is given, and its CPU kernels take int32.
        tensor = torch.sparse_csr_tensor(torch.from_numpy(csr.indptr),
                                         torch.from_numpy(csr.indices),
                                         torch.from_numpy(csr.data), size=csr.shape,
                                         check_invariants=False)
    return csr, ours, tensor, torch


class SpMM:
    """``A @ B`` with B dense (K, N), ours on ``format`` against scipy and torch.sparse.mm."""

    params = [KERNEL_MATRICES, WIDTHS, KERNEL_FORMATS]
    param_names = ["matrix", "N", "format"]

    def setup(self, matrix, n, fmt):
        csr, self.ours, self.tensor, self.torch = float32_operands(matrix, fmt)
        self.scipy_csr = csr.to_scipy()
        self.B = np.random.default_rng(0).standard_normal((csr.shape[1], n), dtype=np.float32)
        self.B_torch = self.torch.from_numpy(self.B)
        # compiles the kernel, and checks ours and torch's against scipy's before any timing
        expected = self.scipy_csr @ self.B
        check_close(f"SpMM on {matrix} ({fmt})", self.ours @ self.B, expected)
        check_close(f"torch.sparse.mm on {matrix}",
                    self.torch.sparse.mm(self.tensor, self.B_torch), expected)

    def time_spmm(self, matrix, n, fmt):
        self.ours @ self.B

    def time_scipy(self, matrix, n, fmt):
        # A peer: independent of ``fmt``, repeated per format so each row has its baseline.
        self.scipy_csr @ self.B

    def time_torch_sparse_mm(self, matrix, n, fmt):
        self.torch.sparse.mm(self.tensor, self.B_torch)


class SDDMM:
    """``dot(X[i], Y[j])`` at A's stored (i, j), ours on ``format`` against torch sampled_addmm."""

    params = [KERNEL_MATRICES, WIDTHS, KERNEL_FORMATS]
    param_names = ["matrix", "F", "format"]

    def setup(self, matrix, f, fmt):
        csr, self.ours, self.tensor, self.torch = float32_operands(matrix, fmt)
        rng = np.random.default_rng(0)
        self.X = rng.standard_normal((csr.shape[0], f), dtype=np.float32)
        self.Y = rng.standard_normal((csr.shape[1], f), dtype=np.float32)
        self.X_torch, self.Y_torch = self.torch.from_numpy(self.X), self.torch.from_numpy(self.Y)
        # compiles the kernel, and checks ours against torch's before any timing
        # (the stored values in CSR order: a dense (n, n) PubMed would take 1.5 GB)
        expected = self.torch.sparse.sampled_addmm(self.tensor, self.X_torch, self.Y_torch.T,
                                                   beta=0.0, alpha=1.0).values()
        check_close(f"SDDMM on {matrix} ({fmt})", sddmm(self.ours, self.X, self.Y).tocsr().data,
                    expected)

    def time_sddmm(self, matrix, f, fmt):
        sddmm(self.ours, self.X, self.Y)

    def time_torch_sampled_addmm(self, matrix, f, fmt):
        # The peer: independent of ``fmt``, repeated per format so each row has its baseline.
        self.torch.sparse.sampled_addmm(self.tensor, self.X_torch, self.Y_torch.T, beta=0.0,
                                        alpha=1.0)
