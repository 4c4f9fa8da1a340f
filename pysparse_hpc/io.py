"""Reading and writing sparse matrices: the ``.npz`` layout of scipy (and of the bundled data)
and Matrix Market.

Missing files raise FileNotFoundError; files that exist but cannot be read as a matrix raise
ValueError naming the file and what was wrong.
"""
import contextlib
import os
import secrets
import stat
import tokenize
import zipfile
import zlib

import numpy as np
import scipy.io
import scipy.sparse

from ._base import sparray
from ._csr import csr_array
from ._sputils import check_index_dtype, described_sparse

__all__ = ["load_npz", "save_npz", "read_matrix_market", "write_matrix_market"]

_CSR_KEYS = ("indptr", "indices", "data", "shape")


def _existing_path(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"expected a file, got a directory: {path!r}")
    return path


# What reading a damaged member of an archive raises: zip and deflate errors, and NumPy's parse
# of a garbled .npy header (which tokenizes it as a Python literal).
_CORRUPT_MEMBER_ERRORS = (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error,
                          tokenize.TokenError, SyntaxError)


def _open_npz(path):
    """``np.load`` of an existing ``.npz`` archive, with a ValueError for anything else."""
    if not zipfile.is_zipfile(path):  # np.load would guess it holds pickled objects
        raise ValueError(f"{path!r} is not a readable .npz archive: not a zip file")
    try:
        archive = np.load(path, allow_pickle=False)
    except _CORRUPT_MEMBER_ERRORS as exc:
        raise ValueError(f"{path!r} is not a readable .npz archive: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path!r} holds a single array, not an .npz archive of CSR arrays")
    return archive


def _read_member(archive, key, path):
    """The array stored under ``key``; a ValueError naming the file and the key if the member
    is damaged, holds objects (pickles are refused) or is not a ``.npy`` array at all (NumPy
    then hands back its raw bytes)."""
    try:
        array = archive[key]
    except _CORRUPT_MEMBER_ERRORS as exc:
        raise ValueError(f"{path!r} has a corrupt member {key!r}: {exc}") from None
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{path!r} has a member {key!r} that is not a NumPy array")
    return array


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
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string, got {type(prefix).__name__}")
    # Checked here: the csr_array below would report a bad argument as a fault of the file.
    index_dtype = check_index_dtype(index_dtype)
    path = _existing_path(path)
    with _open_npz(path) as archive:
        keys = set(archive.files)
        if prefix is None:
            prefix = "" if "indptr" in keys or "format" in keys else "adj_"
        stored_format = (_read_member(archive, prefix + "format", path)
                         if prefix + "format" in keys else np.str_("csr"))
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
        arrays = {key: _read_member(archive, prefix + key, path) for key in _CSR_KEYS}
    shape = np.asarray(arrays["shape"]).ravel()
    if shape.dtype.kind not in "iu" or shape.size != 2:
        raise ValueError(f"{path!r} stores shape {shape.tolist()}; expected two integers")
    shape = tuple(int(n) for n in shape)
    # An unsigned shape can hold sizes no int64 index reaches (2**64 - 1 read as a size).
    if max(shape) > np.iinfo(np.int64).max:
        raise ValueError(f"{path!r} stores shape {shape}; a dimension is beyond int64 indices")
    try:
        return csr_array((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape,
                         index_dtype=index_dtype)
    except (ValueError, TypeError) as exc:
        where = f" under prefix {prefix!r}" if prefix else ""
        raise type(exc)(f"{path!r} holds an invalid CSR matrix{where}: {exc}") from None


@contextlib.contextmanager
def _written_whole(path, extension):
    """Where to write ``path`` so that it appears under its name only once complete.

    Yields the name of a temporary file beside the target (ending in ``extension``, so the
    writer appends nothing), renamed over the target on success and removed on any failure (a
    full disk, an interrupt): neither a half-written file nor a damaged earlier version is
    left where a reader, or a restart, would take it for good (after an error of the writer or
    of the process; surviving a power cut would also take an fsync, which is left out for
    speed). An existing target's permissions carry over to its replacement; hard links to it
    keep the old file. ``extension`` is appended to a target without it, as NumPy and scipy
    do. An open file object is yielded as it is.
    """
    if hasattr(path, "write"):
        yield path
        return
    path = os.fspath(path)
    if not path.endswith(extension):
        path += extension
    # Through a symbolic link, as opening the path would: the rename replaces the file it
    # points to, not the link.
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no directory {os.path.dirname(path)!r} to write {path!r} in")
    if os.path.isdir(target):
        raise IsADirectoryError(f"cannot write {path!r}: it is a directory")
    temporary = os.path.join(
        directory, f".{os.path.basename(target)}.{secrets.token_hex(6)}.tmp{extension}")
    try:
        yield temporary
        if not os.path.isfile(temporary):  # scipy's writer can return without writing
            raise OSError(f"could not write {path!r}")
        with contextlib.suppress(FileNotFoundError):
            # The temporary has the umask's mode: a private file must not become readable.
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _check_sparray(A):
    if not isinstance(A, sparray):
        raise TypeError(f"expected a pysparse_hpc sparse array, got {described_sparse(A)}")


def save_npz(path, A, compressed=True):
    """Save a sparse array in scipy's ``.npz`` CSR layout (readable by `load_npz` and by
    ``scipy.sparse.load_npz``, which returns a ``csr_array``).

    The values keep their dtype, so `load_npz` gives back the same array. scipy reads float16
    values but most of its operations refuse them: save ``A.astype(np.float32)`` for scipy.

    Parameters
    ----------
    path : str, path-like or binary file object
        ``.npz`` is appended to a name without it, as `numpy.savez` and scipy do. The file
        appears only once completely written: a failure leaves no partial file, and an
        existing file is replaced only on success.
    A : pysparse_hpc sparse array
    compressed : bool, default True
        Deflate the arrays (`numpy.savez_compressed`).

    Raises
    ------
    TypeError
        If ``A`` is not a pysparse_hpc sparse array.
    FileNotFoundError
        If the directory of ``path`` does not exist.
    """
    _check_sparray(A)
    csr = A.tocsr()
    save = np.savez_compressed if compressed else np.savez
    with _written_whole(path, ".npz") as destination:
        # _is_array: scipy's mark of a sparse array (not a matrix) since scipy 1.11
        save(destination, format=np.str_("csr"), shape=np.asarray(csr.shape, dtype=np.int64),
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
    path : str, path-like or binary file object
        ``.mtx`` is appended to a name without it, as scipy does. As with `save_npz`, the
        file appears only once completely written.
    A : sparse array
    comment : str, optional
        Written as comment lines under the header.
    symmetry : {None, "general", "symmetric", "skew-symmetric", "hermitian"}, optional
        None detects symmetry (as scipy does); "general" always writes every entry. A declared
        symmetry is checked first (the values are real: "hermitian" is "symmetric"), since
        only one triangle is written.
    """
    _check_sparray(A)
    if symmetry not in _SYMMETRIES:
        raise ValueError(f"symmetry must be one of {_SYMMETRIES}, got {symmetry!r}")
    coo = A.to_scipy().tocoo()
    # scipy writes one triangle for a declared symmetry without checking it: the other
    # triangle would be lost, or come back mirrored.
    if symmetry not in (None, "general") and not _has_symmetry(coo, symmetry):
        raise ValueError(f"symmetry={symmetry!r} but the matrix is not {symmetry}; "
                         f"use symmetry=None to detect it or 'general'")
    # A missing directory is refused here: scipy returns without writing.
    with _written_whole(path, ".mtx") as destination:
        scipy.io.mmwrite(destination, coo, comment=comment, symmetry=symmetry)
