"""Shared fixtures: the real matrices beside the repository, random sparse inputs."""
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("PYSPARSE_HPC_DATA", REPO_ROOT.parent / "shared" / "data"))
SUITESPARSE_FILES = sorted((DATA_DIR / "suitesparse").glob("*.npz"))
GRAPH_FILES = [DATA_DIR / f"{name}.npz" for name in ("cora", "citeseer", "pubmed_structure")]

requires_data = pytest.mark.skipif(
    not SUITESPARSE_FILES,
    reason=f"shared matrices not found in {DATA_DIR} (set PYSPARSE_HPC_DATA to their folder)",
)


@pytest.fixture(params=[p.stem for p in SUITESPARSE_FILES] or ["<no shared data>"])
def suitesparse_path(request):
    if not SUITESPARSE_FILES:
        pytest.skip(f"shared matrices not found in {DATA_DIR}")
    return DATA_DIR / "suitesparse" / f"{request.param}.npz"


@pytest.fixture
def empty_pool():
    """The result pool empty before and after the test (its tests use it)."""
    import gc

    import pysparse_hpc as sph
    sph.empty_cache()
    yield
    gc.collect()
    sph.empty_cache()


@pytest.fixture
def pooled(monkeypatch):
    """Every result, however small, goes through the pool (whose real threshold is 32 MiB)."""
    from pysparse_hpc import _buffers
    monkeypatch.setattr(_buffers, "MIN_POOLED_BYTES", 1)


def run_child(code, timeout=120, memory=None):
    """Run ``code`` in a fresh interpreter, so that a crash (a segfault), a hang or, with
    ``memory`` (bytes of address space), a huge allocation fails the test, not pytest;
    returns the finished process (``stdout``, ``stderr``)."""
    import subprocess
    import sys
    import textwrap

    prelude = (f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))\n"
               if memory else "")
    try:
        result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not finish in {timeout} s (hung or deadlocked)")
    assert result.returncode == 0, (f"exit status {result.returncode}\n{result.stdout}\n"
                                    f"{result.stderr}")
    return result


def run_isolated(code):
    """`run_child`'s standard output."""
    return run_child(code).stdout


def processes_holding(marker, part):
    """PIDs of this machine's processes whose ``/proc/PID/{part}`` (``"environ"`` or
    ``"cmdline"``) holds the bytes ``marker``: a job's processes, in whatever process group."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/{part}", "rb") as file:
                    if marker in file.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def random_scipy(rng, shape, density, dtype=np.float64, duplicates=False):
    """A random scipy CSR array; with ``duplicates`` it is non-canonical (unsorted, repeated)."""
    n_rows, n_cols = shape
    nnz = int(round(density * n_rows * n_cols)) if n_rows and n_cols else 0
    rows = rng.integers(0, max(n_rows, 1), nnz)
    cols = rng.integers(0, max(n_cols, 1), nnz)
    data = rng.standard_normal(nnz).astype(dtype)
    if duplicates and nnz:
        rows = np.concatenate([rows, rows[: nnz // 3]])
        cols = np.concatenate([cols, cols[: nnz // 3]])
        data = np.concatenate([data, data[: nnz // 3]])
        order = rng.permutation(rows.size)
        rows, cols, data = rows[order], cols[order], data[order]
        # Build CSR arrays by hand so scipy does not canonicalize them.
        indptr = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
        by_row = np.argsort(rows, kind="stable")
        return scipy.sparse.csr_array((data[by_row], cols[by_row], indptr), shape=shape)
    return scipy.sparse.csr_array(scipy.sparse.coo_array((data, (rows, cols)), shape=shape))


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(params=["serial", "parallel"])
def kernel_mode(request, monkeypatch):
    """Run a test once through the serial drivers and once through the parallel ones.

    The work threshold decides which one runs; tests use small inputs, so without this only
    the serial path would be exercised.
    """
    from pysparse_hpc import _config
    threshold = 0 if request.param == "parallel" else 1 << 62
    monkeypatch.setattr(_config, "_PARALLEL_MIN_FLOPS", threshold)
    return request.param
