"""asv benchmarks of the CSR <-> blocked conversions, with scipy's CSR -> CSC as the peer.

Matrices come from the shared data directory: ``$PYSPARSE_HPC_DATA`` if set, else
``../shared/data`` relative to the repository root. When it (or a matrix) is missing, ``setup``
raises NotImplementedError and asv skips the benchmark. Each matrix has the index dtype scipy
picks for it (int32 where it fits, as ``scipy.sparse.load_npz`` gives it), ours and the peers
alike. Threads follow the library's setting (``PYSPARSE_HPC_NUM_THREADS``); scipy's ``tocsc``
is single-threaded.
"""
import os
from pathlib import Path

from pysparse_hpc.bench._data import scipy_index_dtype
from pysparse_hpc.io import load_npz

from ._checks import check_same_csr

#: Benchmark matrices by name: (file relative to the data directory, key prefix).
MATRICES = {
    "bcsstk13": ("suitesparse/bcsstk13.npz", ""),  # FEM stiffness, dense rows
    "wiki-Vote": ("suitesparse/wiki-Vote.npz", ""),  # social graph, skewed degrees
    "wing": ("suitesparse/wing.npz", ""),  # the largest shared matrix, a 3D mesh
    "pubmed": ("pubmed_structure.npz", "adj_"),  # citation graph adjacency
}

#: Blocked formats by name: (window height, block width).
FORMATS = {
    "mebcrs8": (8, 8),  # ME-BCRS of the GPU's m16n8k8 SpMM (fp16 and tf32)
    "mebcrs4": (8, 4),  # FlashSparse's tf32 layout (m16n8k4)
    "blocked16": (16, 8),  # TC-GNN / DTC-SpMM row windows
}


def data_dir():
    """The shared data directory, or None when it does not exist."""
    env = os.environ.get("PYSPARSE_HPC_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return path if path.is_dir() else None


def load_matrix(name):
    """Canonical csr_array of a benchmark matrix with the index dtype scipy picks for it (int32
    where it fits); NotImplementedError (asv: skip) if absent."""
    directory = data_dir()
    if directory is None:
        raise NotImplementedError("shared data directory not found; set PYSPARSE_HPC_DATA")
    file_name, prefix = MATRICES[name]
    path = directory / file_name
    if not path.is_file():
        raise NotImplementedError(f"matrix file {file_name} not found in the data directory")
    matrix = load_npz(path, prefix=prefix)
    # The files store int64 indices; scipy.sparse.load_npz gives int32 where they fit, which
    # is what scipy's and torch's users run on, so every side gets that dtype.
    index_dtype = scipy_index_dtype(matrix.shape, matrix.nnz)
    if matrix.index_dtype != index_dtype:
        matrix = type(matrix)(matrix, index_dtype=index_dtype)
    matrix = matrix.canonical()
    if not matrix.has_canonical_format:  # computed and cached here, not in the timed code
        raise RuntimeError(f"{name} is not canonical")
    return matrix


class Convert:
    """CSR -> blocked, blocked -> CSR, and scipy's CSR -> CSC on the same matrix."""

    params = [list(MATRICES), list(FORMATS)]
    param_names = ["matrix", "format"]

    def setup(self, matrix, fmt):
        self.csr = load_matrix(matrix)
        self.window, self.block_width = FORMATS[fmt]
        self.blocked = self.csr.to_blocked(self.window, self.block_width)
        self.scipy_csr = self.csr.to_scipy()
        check_same_csr(f"{fmt} -> CSR on {matrix}", self.blocked.tocsr(), self.scipy_csr)

    def time_to_blocked(self, matrix, fmt):
        self.csr.to_blocked(self.window, self.block_width)

    def time_tocsr(self, matrix, fmt):
        self.blocked.tocsr()

    def time_scipy_tocsc(self, matrix, fmt):
        # The peer: independent of ``fmt``, repeated per format so each row has its baseline.
        self.scipy_csr.tocsc()

    def peakmem_to_blocked(self, matrix, fmt):
        self.csr.to_blocked(self.window, self.block_width)
