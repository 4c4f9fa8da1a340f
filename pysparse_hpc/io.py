"""Reading and writing sparse matrices: the ``.npz`` layout of scipy (and of the bundled data)
and Matrix Market.

Missing files raise FileNotFoundError; files that exist but cannot be read as a matrix raise
ValueError naming the file and what was wrong.
"""
import os
import zipfile

import numpy as np
import scipy.io

from ._base import sparray
from ._csr import csr_array

__all__ = ["load_npz", "save_npz", "read_matrix_market", "write_matrix_market"]

_CSR_KEYS = ("indptr", "indices", "data", "shape")


def _existing_path(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"expected a file, got a directory: {path!r}")
    return path


def load_npz(path, prefix=None, index_dtype=None):
    """Load a CSR matrix stored as ``.npz`` arrays.

    Reads the layout of ``scipy.sparse.save_npz`` (keys ``indptr``, ``indices``, ``data``,
    ``shape``, optional ``format``), which the bundled SuiteSparse files use, and the graph files'
    layout where the same keys carry a prefix (``adj_indptr``, ... for the adjacency).

    Parameters
    ----------
    path : str or path-like
    prefix : str, optional
        Key prefix, e.g. ``"adj_"`` or ``"feat_"``. By default the plain keys are used if present,
        else ``"adj_"``.
    index_dtype : {None, numpy.int32, numpy.int64}, optional
        Index dtype of the result; by default scipy's rule applied to the stored arrays.

    Returns
    -------
    csr_array
        Fully validated (the file is untrusted input).
    """
    path = _existing_path(path)
    if not zipfile.is_zipfile(path):  # np.load would guess it holds pickled objects
        raise ValueError(f"{path!r} is not a readable .npz archive: not a zip file")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path!r} is not a readable .npz archive: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path!r} holds a single array, not an .npz archive of CSR arrays")
    with archive:
        keys = set(archive.files)
        if prefix is None:
            prefix = "" if "indptr" in keys or "format" in keys else "adj_"
        try:
            stored_format = (archive[prefix + "format"] if prefix + "format" in keys
                             else np.str_("csr"))
        except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{path!r} has a corrupt member: {exc}") from None
        # scipy stores the format as a bytes scalar, NumPy's savez a str one.
        fmt = stored_format.item() if stored_format.size == 1 else stored_format.tolist()
        fmt = fmt.decode("ascii", "replace") if isinstance(fmt, bytes) else str(fmt)
        if fmt != "csr":
            raise ValueError(f"{path!r} stores format {fmt!r}; only 'csr' is supported "
                             f"(scipy converts it: save_npz(path, load_npz(path).tocsr()))")
        missing = [prefix + key for key in _CSR_KEYS if prefix + key not in keys]
        if missing:
            raise ValueError(
                f"{path!r} has no CSR matrix under prefix {prefix!r}: missing keys {missing}; "
                f"found {sorted(keys)}")
        try:
            arrays = {key: archive[prefix + key] for key in _CSR_KEYS}
        except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{path!r} has a corrupt member: {exc}") from None
    shape = np.asarray(arrays["shape"]).ravel()
    if shape.dtype.kind not in "iu" or shape.size != 2:
        raise ValueError(f"{path!r} stores shape {shape.tolist()}; expected two integers")
    shape = tuple(int(n) for n in shape)
    try:
        return csr_array((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape,
                         index_dtype=index_dtype)
    except (ValueError, TypeError) as exc:
        where = f" under prefix {prefix!r}" if prefix else ""
        raise type(exc)(f"{path!r} holds an invalid CSR matrix{where}: {exc}") from None


def save_npz(path, A, compressed=True):
    """Save a sparse array in scipy's ``.npz`` CSR layout (readable by `load_npz` and by
    ``scipy.sparse.load_npz``, which returns a ``csr_array``).

    The values keep their dtype, so `load_npz` gives back the same array. scipy reads float16
    values but most of its operations refuse them: save ``A.astype(np.float32)`` for scipy.
    """
    if not isinstance(A, sparray):
        raise TypeError(f"expected a pysparse_hpc sparse array, got {type(A).__name__}")
    csr = A.tocsr()
    save = np.savez_compressed if compressed else np.savez
    # _is_array: scipy's mark of a sparse array (not a matrix) since scipy 1.11
    save(path, format=np.str_("csr"), shape=np.asarray(csr.shape, dtype=np.int64),
         indptr=csr.indptr, indices=csr.indices, data=csr.data, _is_array=np.True_)


def read_matrix_market(path):
    """Read a Matrix Market file (coordinate or array, real/integer/pattern, any symmetry).

    Symmetric files are expanded to both triangles; pattern files get the value 1.0.

    Returns
    -------
    csr_array
        Canonical (duplicates summed, as the format prescribes).
    """
    path = _existing_path(path)
    try:
        matrix = scipy.io.mmread(path)
    except (ValueError, TypeError, IndexError, OverflowError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path!r} is not a valid Matrix Market file: {exc}") from None
    if np.iscomplexobj(matrix):
        raise TypeError(f"{path!r} holds complex values; only real matrices are supported")
    if isinstance(matrix, np.ndarray):
        return csr_array(matrix)
    return csr_array(matrix).canonical()


_SYMMETRIES = (None, "general", "symmetric", "skew-symmetric", "hermitian")


def _has_symmetry(coo, symmetry):
    """Whether real ``coo`` equals its transpose (negated for "skew-symmetric"), entry for
    entry: NaN matches NaN where the triangle written stands for both (not on the diagonal of
    a skew-symmetric matrix, which is not written and must be 0)."""
    if coo.shape[0] != coo.shape[1]:
        return False
    sign = -1.0 if symmetry == "skew-symmetric" else 1.0

    def canonical(matrix):
        matrix = scipy.sparse.csr_array(matrix)
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        return matrix
    matrix, transposed = canonical(coo), canonical(coo.T * sign)
    return (np.array_equal(matrix.indptr, transposed.indptr)
            and np.array_equal(matrix.indices, transposed.indices)
            and np.array_equal(matrix.data, transposed.data, equal_nan=sign > 0))


def write_matrix_market(path, A, comment="", symmetry=None):
    """Write a sparse array as a Matrix Market coordinate file.

    Parameters
    ----------
    path : str or path-like
    A : sparse array
    comment : str, optional
        Written as comment lines under the header.
    symmetry : {None, "general", "symmetric", "skew-symmetric", "hermitian"}, optional
        None detects symmetry (as scipy does); "general" always writes every entry. A declared
        symmetry is checked first (the values are real: "hermitian" is "symmetric"), since
        only one triangle is written.
    """
    if not isinstance(A, sparray):
        raise TypeError(f"expected a pysparse_hpc sparse array, got {type(A).__name__}")
    if symmetry not in _SYMMETRIES:
        raise ValueError(f"symmetry must be one of {_SYMMETRIES}, got {symmetry!r}")
    coo = A.to_scipy().tocoo()
    # scipy writes one triangle for a declared symmetry without checking it: the other
    # triangle would be lost, or come back mirrored.
    if symmetry not in (None, "general") and not _has_symmetry(coo, symmetry):
        raise ValueError(f"symmetry={symmetry!r} but the matrix is not {symmetry}; "
                         f"use symmetry=None to detect it or 'general'")
    # and it returns without writing when the directory is missing.
    directory = os.path.dirname(os.fspath(path))
    if directory and not os.path.isdir(directory):
        raise FileNotFoundError(f"no directory {directory!r} to write {os.fspath(path)!r} in")
    scipy.io.mmwrite(path, coo, comment=comment, symmetry=symmetry)
