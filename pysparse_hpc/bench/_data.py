"""Where the shared benchmark matrices live, which ones there are, and how to load them.

The data directory holds ``suitesparse/*.npz`` (scipy's ``save_npz`` layout) and the citation
graphs ``cora.npz``, ``citeseer.npz`` and ``pubmed_structure.npz`` (adjacency under the ``adj_``
key prefix). It is found, in order, from an explicit path, the ``PYSPARSE_HPC_DATA`` environment
variable, or ``../shared/data`` relative to the repository root (the directory holding the
``pysparse_hpc`` package in a source checkout).
"""
import os
from dataclasses import dataclass
from pathlib import Path

from ..io import load_npz

__all__ = ["DATA_ENV", "GRAPHS", "MatrixSpec", "data_dir", "find_matrices", "load_matrix"]

DATA_ENV = "PYSPARSE_HPC_DATA"

#: Citation graphs benchmarked by their adjacency: (name, file name).
GRAPHS = (("cora", "cora.npz"), ("citeseer", "citeseer.npz"), ("pubmed", "pubmed_structure.npz"))


@dataclass(frozen=True)
class MatrixSpec:
    """One benchmark matrix on disk.

    Attributes
    ----------
    name : str
        Short name: the SuiteSparse file stem, or ``cora``/``citeseer``/``pubmed``.
    path : pathlib.Path
    prefix : str
        Key prefix of the CSR arrays in the file (``""`` or ``"adj_"``).
    group : {"suitesparse", "graph"}
    """

    name: str
    path: Path
    prefix: str
    group: str


def default_data_dir():
    """``../shared/data`` relative to the repository root of this source tree."""
    repo_root = Path(__file__).resolve().parents[2]
    return repo_root.parent / "shared" / "data"


def data_dir(path=None):
    """Resolve the shared data directory.

    Parameters
    ----------
    path : str or path-like, optional
        Explicit directory; wins over ``PYSPARSE_HPC_DATA`` and the default.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    FileNotFoundError
        If the resolved directory does not exist (the message says how to point at it).
    """
    if path is not None:
        source, resolved = "the given path", Path(path)
    elif os.environ.get(DATA_ENV):
        source, resolved = f"${DATA_ENV}", Path(os.environ[DATA_ENV])
    else:
        source, resolved = "the default ../shared/data", default_data_dir()
    if not resolved.is_dir():
        raise FileNotFoundError(
            f"benchmark data directory {str(resolved)!r} (from {source}) does not exist; pass "
            f"--data DIR or set {DATA_ENV}")
    return resolved


def find_matrices(directory):
    """List the SuiteSparse matrices (sorted by name), then the citation graphs present.

    Parameters
    ----------
    directory : pathlib.Path
        A data directory as returned by `data_dir`.

    Returns
    -------
    specs : list of MatrixSpec
    missing : list of str
        Expected graph files that are absent.
    """
    directory = Path(directory)
    specs = [MatrixSpec(path.stem, path, "", "suitesparse")
             for path in sorted((directory / "suitesparse").glob("*.npz"),
                                key=lambda p: p.stem.lower())]
    missing = []
    for name, file_name in GRAPHS:
        path = directory / file_name
        if path.is_file():
            specs.append(MatrixSpec(name, path, "adj_", "graph"))
        else:
            missing.append(file_name)
    return specs, missing


def load_matrix(spec):
    """Load a matrix as a canonical `csr_array` with ``has_canonical_format`` already computed.

    Parameters
    ----------
    spec : MatrixSpec

    Returns
    -------
    csr_array
    """
    matrix = load_npz(spec.path, prefix=spec.prefix).canonical()
    # canonical() evaluated and cached the flag; check it so no timed call recomputes it.
    if not matrix.has_canonical_format:
        raise RuntimeError(f"{spec.name}: could not bring the matrix to canonical format")
    return matrix
