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

import numpy as np

from ..io import load_npz

__all__ = ["DATA_ENV", "GRAPHS", "INDEX_SECOND", "MatrixSpec", "data_dir", "find_graph",
           "find_matrices", "index_variants", "load_matrix", "scipy_index_dtype", "DataError",
           "DataDirectoryMissing"]

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


def data_dir(path=None, must_exist=True):
    """Resolve the shared data directory.

    Parameters
    ----------
    path : str or path-like, optional
        Explicit directory; wins over ``PYSPARSE_HPC_DATA`` and the default.
    must_exist : bool, default True
        With False, a missing *default* directory is returned as it is, so that commands which
        read no shared file run without it (`find_matrices` and `find_graph` report it when a
        file is needed). An explicit path or ``PYSPARSE_HPC_DATA`` must always exist: a typo
        there is an error at once.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    DataDirectoryMissing
        If the resolved directory does not exist (the message says how to point at it).
    """
    if path is not None:
        if isinstance(path, str) and not path:  # Path("") would be the working directory
            raise DataDirectoryMissing(f"benchmark data directory is an empty path; pass "
                                       f"--data DIR or set {DATA_ENV}")
        source, resolved = "the given path", Path(path)
    elif os.environ.get(DATA_ENV):
        source, resolved = f"${DATA_ENV}", Path(os.environ[DATA_ENV])
    else:
        source, resolved = "the default ../shared/data", default_data_dir()
        if not must_exist:
            return resolved
    _require_directory(resolved, f" (from {source})")
    return resolved


def _source_checkout():
    """Whether the package runs from a source checkout, beside which the default lies."""
    return (Path(__file__).resolve().parents[2] / "pyproject.toml").is_file()


def _require_directory(directory, source=""):
    if Path(directory) == default_data_dir() and not _source_checkout():
        # An installed package: its default names a folder beside site-packages
        source = (" (the default, ../shared/data beside a source checkout, which this "
                  "installed package is not)")
    if Path(directory).exists() and not Path(directory).is_dir():
        raise DataDirectoryMissing(
            f"benchmark data directory {str(directory)!r}{source} is a file, not a directory; "
            f"pass --data DIR or set {DATA_ENV}")
    if not Path(directory).is_dir():
        raise DataDirectoryMissing(
            f"benchmark data directory {str(directory)!r}{source} does not exist; pass "
            f"--data DIR or set {DATA_ENV}")


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

    Raises
    ------
    DataDirectoryMissing
        If ``directory`` does not exist.
    """
    directory = Path(directory)
    _require_directory(directory)
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


def find_graph(name, directory=None):
    """The `MatrixSpec` of one citation graph of `GRAPHS` in the data directory.

    Parameters
    ----------
    name : str
        ``"cora"``, ``"citeseer"`` or ``"pubmed"``.
    directory : path-like, optional
        The data directory; default `data_dir`'s resolution.

    Raises
    ------
    DataDirectoryMissing
        If the directory does not exist.
    FileNotFoundError
        If the graph's file is not in it.
    """
    directory = data_dir() if directory is None else Path(directory)
    specs, _ = find_matrices(directory)
    spec = next((spec for spec in specs if spec.name == name), None)
    if spec is None:
        raise FileNotFoundError(f"{dict(GRAPHS)[name]} not found in {directory}")
    return spec


class DataError(ValueError):
    """A file of the data directory that cannot be read: the command exits with status 2."""


class DataDirectoryMissing(DataError, FileNotFoundError):
    """The data directory does not exist (the message says how to point at one)."""


def load_matrix(spec, index_dtype=None):
    """Load a matrix as a canonical `csr_array` with ``has_canonical_format`` already computed.

    Parameters
    ----------
    spec : MatrixSpec
    index_dtype : {None, "scipy", numpy.int32, numpy.int64}, optional
        None keeps the stored dtypes' rule (int64 for the shared files, whose ``indptr`` is
        stored as int64); ``"scipy"`` gives the dtype scipy picks for the matrix
        (`scipy_index_dtype`: int32 where the shape and nnz fit), as a user's
        ``scipy.sparse.load_npz`` or ``csr_array(...)`` would have it.

    Returns
    -------
    csr_array
    """
    try:
        matrix = load_npz(spec.path, prefix=spec.prefix)
    except ValueError as exc:
        raise DataError(f"matrix {spec.name}: {exc}") from None
    if isinstance(index_dtype, str) and index_dtype == "scipy":
        index_dtype = scipy_index_dtype(matrix.shape, matrix.nnz)
    if index_dtype is not None and matrix.index_dtype != np.dtype(index_dtype):
        matrix = type(matrix)(matrix, index_dtype=index_dtype)
    matrix = matrix.canonical()
    # canonical() evaluated and cached the flag; check it so no timed call recomputes it.
    if not matrix.has_canonical_format:
        raise RuntimeError(f"{spec.name}: could not bring the matrix to canonical format")
    return matrix


#: The index dtype every benchmark reports as its second case, after scipy's pick.
INDEX_SECOND = "int64"


def scipy_index_dtype(shape, nnz):
    """The index dtype scipy gives a CSR matrix of this size: int32 where it fits, else int64.

    Where scipy chooses (``scipy.sparse.load_npz`` of the shared files, ``csr_matrix(...)``,
    dense input, ``random_array``, COO ``.tocsr()``) it picks int32 when every dimension and
    the number of stored entries fit (``get_index_dtype`` with the contents checked), which is
    what a user's matrix of the shared sizes has. (``csr_array`` keeps int64 arrays it is
    given as they are.)

    Parameters
    ----------
    shape : tuple of int
    nnz : int

    Returns
    -------
    numpy.dtype
        ``int32`` or ``int64``.
    """
    fits = max(tuple(shape) + (nnz,)) <= np.iinfo(np.int32).max
    return np.dtype(np.int32 if fits else np.int64)


def index_variants(A):
    """``A`` with scipy's index dtype first, then with int64 indices (`INDEX_SECOND`).

    Each is a canonical `csr_array` with ``has_canonical_format`` computed; ``A`` itself is
    returned where its dtype already matches, so the values are shared, not copied. A matrix
    for which scipy picks int64 has one variant.

    Parameters
    ----------
    A : csr_array
        Canonical.

    Returns
    -------
    list of (str, csr_array)
        ``[("int32", A32), ("int64", A64)]``: the first is the one the targets judge.
    """
    variants = []
    for dtype in (scipy_index_dtype(A.shape, A.nnz), np.dtype(INDEX_SECOND)):
        if any(label == dtype.name for label, _ in variants):
            continue
        matrix = A if A.index_dtype == dtype else type(A)(A, index_dtype=dtype).canonical()
        if not matrix.has_canonical_format:
            raise RuntimeError("index_variants takes a canonical matrix")
        variants.append((dtype.name, matrix))
    return variants
