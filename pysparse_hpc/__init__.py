"""pysparse_hpc: fast sparse matrix multiplication for deep learning and scientific computing.

Formats
-------
csr_array      compressed sparse rows, the interchange format
mebcrs_array   FlashSparse's ME-BCRS: 8-row windows of 8x1 vectors, for tensor-core kernels
blocked_array  the same layout for any window height (16 for TC-GNN / DTC-SpMM)

Functions
---------
block_stats    windows, vectors, redundancy and bytes of the blocked formats
empty_cache    release the memory kept from freed large results (also cached_bytes)
spmm           sparse @ dense (CPU: Numba kernels)
sddmm          sampled dense-dense product on a sparse pattern (single and multi-head)
reorder        a permutation (Rabbit-Order-style, RCM, degree) that makes blocks denser
permute        P A P^T (also permute_rows, permute_columns, inverse_permutation, bandwidth)

Subpackages
-----------
nn             GNN layers (GCN, GAT, AGNN) and sparse ops with PyTorch autograd (imports torch
               on first use: ``pysparse_hpc.nn`` or ``import pysparse_hpc.nn``)
distributed    training over MPI: partitions, DistGraph with halo exchange, DataParallel,
               checkpoints (``import pysparse_hpc.distributed``; mpi4py optional for one-rank
               jobs)
precondition   ASDL-compatible gradient preconditioning: K-FAC, Shampoo, Jorge, diagonal
               Fisher, one process or over MPI (needs torch)
optim          Lion, and DistributedLion with its compressed modes over MPI (needs torch)
"""
from . import datasets, generators, io
from ._base import issparse, sparray
from ._blocked import blocked_array, mebcrs_array
from ._buffers import cached_bytes, empty_cache
from ._config import get_num_threads, set_num_threads
from ._csr import CooTriplets, csr_array
from ._reorder import (bandwidth, inverse_permutation, permute, permute_columns, permute_rows,
                       reorder)
from ._stats import BlockStats, block_stats
from .ops import sddmm, spmm

__version__ = "0.1.0"


def __getattr__(name):
    # nn needs torch; import it only when asked for, so the rest works without torch.
    if name == "nn":
        import importlib
        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BlockStats",
    "CooTriplets",
    "bandwidth",
    "block_stats",
    "blocked_array",
    "cached_bytes",
    "csr_array",
    "datasets",
    "empty_cache",
    "generators",
    "get_num_threads",
    "inverse_permutation",
    "io",
    "issparse",
    "mebcrs_array",
    "permute",
    "permute_columns",
    "permute_rows",
    "reorder",
    "sparray",
    "sddmm",
    "set_num_threads",
    "spmm",
]
