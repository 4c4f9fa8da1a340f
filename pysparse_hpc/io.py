"""Reading and writing sparse matrices: the ``.npz`` layout of scipy (and of the bundled data)
and Matrix Market.

Missing files raise FileNotFoundError; files that exist but cannot be read as a matrix raise
ValueError naming the file and what was wrong.
"""
import contextlib
import math
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
from ._config import get_num_threads, parallel_launch
from ._csr import csr_array
from ._sputils import (as_path, check_flag, check_index_dtype, described_sparse,
                       refuse_beyond_memory)
from .kernels.cpu import mm_tokens

__all__ = ["load_npz", "save_npz", "read_matrix_market", "write_matrix_market"]

_CSR_KEYS = ("indptr", "indices", "data", "shape")


def _existing_path(path, file_objects=True):
    """``path`` as a str naming an existing regular file.

    A bytes path is decoded (scipy's reader would look for the file named ``"b'...'"``). A
    FIFO would block the reader forever waiting for a writer, and a device such as
    ``/dev/zero`` never ends: both are refused here with a ValueError.
    """
    path = as_path(path, "path", file_objects)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {path!r}") from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"expected a file, got a directory: {path!r}")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path!r} is not a regular file (a FIFO, socket or device); "
                         f"only files are read")
    return path


# What reading a damaged member of an archive raises: zip and deflate errors, and NumPy's parse
# of a garbled .npy header (which tokenizes it as a Python literal).
_CORRUPT_MEMBER_ERRORS = (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error,
                          tokenize.TokenError, SyntaxError,
                          # an encrypted member, a compression method zipfile lacks
                          RuntimeError, NotImplementedError)


def _npz_source(path):
    """``(source, name)``: what `_open_npz` reads, an existing file's path or an open binary
    file (scipy's ``load_npz`` takes either), and the name the messages give it."""
    if hasattr(path, "read") and hasattr(path, "seek"):
        name = getattr(path, "name", None)
        return path, name if isinstance(name, str) else f"<{type(path).__name__}>"
    path = _existing_path(path)
    return path, path


def _open_npz(path, name=None):
    """``np.load`` of an existing ``.npz`` archive (a path, or an open binary file read from
    where it stands), with a ValueError naming it (``name``, default ``path``) for anything
    else."""
    name = path if name is None else name
    start = path.tell() if hasattr(path, "seek") else None
    if not zipfile.is_zipfile(path):  # np.load would guess it holds pickled objects
        raise ValueError(f"{name!r} is not a readable .npz archive: not a zip file")
    if start is not None:
        path.seek(start)  # is_zipfile read the end of the file; np.load reads from here
    try:
        archive = np.load(path, allow_pickle=False)
    except _CORRUPT_MEMBER_ERRORS as exc:
        raise ValueError(f"{name!r} is not a readable .npz archive: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{name!r} holds a single array, not an .npz archive of CSR arrays")
    names = archive.zip.namelist()
    if len(names) != len(set(names)):
        # NumPy reads the last of two members of one name; other zip tools show the first.
        repeated = sorted({entry for entry in names if names.count(entry) > 1})
        archive.close()
        raise ValueError(f"{name!r} is not a readable .npz archive: it holds two members named "
                         f"{repeated[0]!r}")
    return archive


def _declared_array(archive, key):
    """``(shape, dtype, data bytes the member holds)`` from the ``.npy`` header of member
    ``key``, read without reading the data; None where there is no such header to read (NumPy's
    own reading then says what is wrong)."""
    names = archive.zip.namelist()
    name = key + ".npy" if key + ".npy" in names else key
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    try:
        info = archive.zip.getinfo(name)
        with archive.zip.open(info) as member:
            read_header = readers.get(np.lib.format.read_magic(member))
            if read_header is None:
                return None
            shape, _, dtype = read_header(member)
            return shape, dtype, info.file_size - member.tell()
    except (KeyError, *_CORRUPT_MEMBER_ERRORS):
        return None


def _declared_size(archive, key, path):
    """The bytes the ``.npy`` header of member ``key`` declares, checked against the bytes
    the member holds and against memory; None where there is no such header to read (NumPy's
    own reading then says what is wrong) or it declares objects (refused when read).

    NumPy allocates the array the header declares before it reads the data, so a small file
    declaring terabytes failed with NumPy's MemoryError naming neither file nor key, and a
    deflated member of a size beyond memory was inflated until the process was killed.
    """
    declared = _declared_array(archive, key)
    if declared is None or declared[1].hasobject:
        return None
    shape, dtype, held = declared
    needed = math.prod(shape) * dtype.itemsize
    if needed != held:
        # NumPy writes the data right after the header, no more: bytes past it were put
        # there by another tool, and a reader that stops at the header's size hides them.
        raise ValueError(f"{path!r} has a corrupt member {key!r}: its header declares "
                         f"{shape} {dtype} ({needed} bytes) but the member holds {held}")
    refuse_beyond_memory(float(needed), f"{path!r}: member {key!r} of shape {shape} "
                                        f"{dtype} would")
    return needed


def _refuse_members_beyond_memory(archive, keys, path):
    """Check every member's header (`_declared_size`), then refuse members that each fit in
    memory but together do not, before any is read: a 39 MB file declaring 8 GiB in two
    members inflated the first for 9 s, then failed in NumPy, naming nothing."""
    total = sum(_declared_size(archive, key, path) or 0 for key in keys)
    refuse_beyond_memory(float(total), f"{path!r}: its members {keys} would")


def _read_member(archive, key, path, checked=False):
    """The array stored under ``key``; a ValueError naming the file and the key if the member
    is damaged, holds objects (pickles are refused) or is not a ``.npy`` array at all (NumPy
    then hands back its raw bytes). Its header is checked first (`_declared_size`), unless
    ``checked`` says the caller did.
    """
    if not checked:
        _declared_size(archive, key, path)
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
    path : str, path-like or binary file object
        A file object is read from its current position, as by ``scipy.sparse.load_npz``.
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
    source, path = _npz_source(path)
    with _open_npz(source, path) as archive:
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
        _refuse_members_beyond_memory(archive, [prefix + key for key in _CSR_KEYS], path)
        arrays = {key: _read_member(archive, prefix + key, path, checked=True)
                  for key in _CSR_KEYS}
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
    path = as_path(path, "path", file_objects=True)
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
    save = np.savez_compressed if check_flag(compressed, "compressed") else np.savez
    with _written_whole(path, ".npz") as destination:
        # _is_array: scipy's mark of a sparse array (not a matrix) since scipy 1.11
        save(destination, format=np.str_("csr"), shape=np.asarray(csr.shape, dtype=np.int64),
             indptr=csr.indptr, indices=csr.indices, data=csr.data, _is_array=np.True_)


# What scipy's reader raises for a file it cannot parse (and gzip, bz2 for a damaged stream).
_MM_PARSE_ERRORS = (ValueError, TypeError, IndexError, OverflowError, UnicodeDecodeError,
                    EOFError, zlib.error)

# Bytes that may appear in the entries of each field, besides the whitespace that separates
# them: scipy's parser stops a number at the first byte it does not take and skips the rest of
# the line, so "1,5" was read as 1, an integer "2.5" as 2, and "1 1 5 7" (a complex entry in a
# file declared real) as 5; a NUL byte there crashed it.
_MM_WHITESPACE = b" \t\r\n"
_MM_FLOAT_BYTES = b"0123456789+-.eEnNaAiIfFtTyY"   # with nan, inf and infinity
_MM_TOKEN_BYTES = {"pattern": b"0123456789+-", "integer": b"0123456789+-",
                   "real": _MM_FLOAT_BYTES, "double": _MM_FLOAT_BYTES}
_MM_VALUE_TOKENS = {"pattern": 0, "integer": 1, "real": 1, "double": 1}
# The entries are checked in chunks of whole lines of about a megabyte; a line that long is
# refused.
_MM_CHUNK_BYTES = 1 << 20
# The entries are checked a batch of chunks at a time.
_MM_BATCH_BYTES = 8 << 20
# The banner and comments may take this much before the size line.
_MM_HEADER_BYTES = 64 << 20
# The grammar each field's numbers are checked against, whole: the bytes alone let "1-2"
# through as 1, "2.5.7" as 2.5 and, as a column index, "2-1" put the value -1 in column 2.
_MM_GRAMMAR = {"pattern": mm_tokens.INTEGER, "integer": mm_tokens.INTEGER,
               "real": mm_tokens.REAL, "double": mm_tokens.REAL}


def _open_mm(path):
    """The file's bytes, decompressed where scipy decompresses them (by the name's suffix)."""
    if path.endswith(".gz"):
        import gzip
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        import bz2
        return bz2.open(path, "rb")
    return open(path, "rb")


def _mm_expected_tokens(rows, cols, entries, fmt, field, symmetry):
    """How many whitespace-separated numbers follow the size line of a valid file."""
    if fmt == "coordinate":
        return entries * (2 + _MM_VALUE_TOKENS[field])
    if symmetry == "general":
        return rows * cols
    # One triangle, with the diagonal except where it is zero by definition.
    return rows * (rows - 1) // 2 if symmetry == "skew-symmetric" else rows * (rows + 1) // 2


def _check_mm_body(path, info):
    """Refuse, before scipy's reader allocates for the declared size, a body that holds a byte
    no number of the field has, a token that is not a number of it, or not exactly the
    numbers the header declares.

    One pass over the file, in chunks of whole lines split among the threads: 0.067 s for
    64 MB of entries on one thread (0.042 s on two), where scipy's parse takes 0.09 s; the
    price of reading "1-2" as an error rather than as 1.
    """
    fmt, field = info[3], info[4]
    expected = _mm_expected_tokens(*info)
    classes = mm_tokens.byte_classes(_MM_WHITESPACE, _MM_TOKEN_BYTES[field])
    tokens, offset = 0, 0
    with _open_mm(path) as stream:
        stream.readline()                                   # the banner
        line = stream.readline()
        while line and (not line.strip() or line.lstrip().startswith(b"%")):
            line = stream.readline()                        # comments and blank lines
        for chunk in _mm_whole_lines(stream, path):
            # One launch a few megabytes: a thread that waits at each launch's end for one
            # the machine has descheduled loses less often. A small file keeps one thread.
            threads = get_num_threads() if len(chunk) >= _MM_CHUNK_BYTES // 4 else 1
            with parallel_launch():
                found, wrong = mm_tokens.scan_entries(chunk, classes, _MM_GRAMMAR[field],
                                                      threads)
            if wrong is not None:
                kind, start, stop = wrong
                if kind == mm_tokens.BAD_BYTE:
                    raise ValueError(_mm_bad_byte(path, chunk, start, offset))
                raise ValueError(f"{path!r} is not a valid Matrix Market file: "
                                 f"{chunk[start:min(stop, start + 40)]!r} at byte "
                                 f"{offset + start} of the entries is not a number of its "
                                 f"{field} field")
            tokens += found
            offset += len(chunk)
            if tokens > expected:
                break
            if offset > _MM_CHUNK_BYTES + 64 * expected:
                # A number and its separator take a few dozen bytes: gigabytes of blank lines
                # (a decompression bomb of a few kilobytes) were read to the end.
                raise ValueError(f"{path!r} is not a valid Matrix Market file: its entries run "
                                 f"past {_MM_CHUNK_BYTES + 64 * expected} bytes, more than "
                                 f"{expected} numbers take")
    if tokens != expected:
        what = (f"{info[2]} entries of {2 + _MM_VALUE_TOKENS[field]} numbers"
                if fmt == "coordinate" else f"{expected} values")
        raise ValueError(f"{path!r} is not a valid Matrix Market file: its header declares "
                         f"{what} ({expected} numbers) but the file holds "
                         f"{'more' if tokens > expected else tokens}")


def _mm_whole_lines(stream, path):
    """The rest of ``stream`` in chunks of whole lines (no number cut in two) of about
    `_MM_BATCH_BYTES`; a line of `_MM_CHUNK_BYTES` or more is a ValueError."""
    batch, held, offset = [], 0, 0
    while True:
        piece = stream.read(_MM_CHUNK_BYTES)
        if piece and not piece.endswith(b"\n"):
            # An entry's line is short; one of a megabyte is no Matrix Market line (a
            # decompression bomb's, say).
            rest = stream.readline(_MM_CHUNK_BYTES)
            if len(rest) == _MM_CHUNK_BYTES and not rest.endswith(b"\n"):
                raise ValueError(f"{path!r} is not a valid Matrix Market file: a line of its "
                                 f"entries, at byte {offset + held + len(piece)}, is longer "
                                 f"than {_MM_CHUNK_BYTES} bytes")
            piece += rest
        if piece:
            batch.append(piece)
            held += len(piece)
        if batch and (not piece or held >= _MM_BATCH_BYTES):
            yield b"".join(batch) if len(batch) > 1 else batch[0]
            batch, offset, held = [], offset + held, 0
        if not piece:
            return


def _mm_bad_byte(path, chunk, position, offset):
    """The message for a byte that belongs to no number of the file's field."""
    byte = chunk[position:position + 1]
    line_end = chunk.find(b"\n", position)
    line = chunk[chunk.rfind(b"\n", 0, position) + 1:line_end if line_end >= 0 else None]
    return (f"{path!r} is not a valid Matrix Market file: {byte!r} at byte {offset + position} "
            f"of the entries (in {line[:80].decode('ascii', 'replace')!r}) belongs to no "
            f"number of its field")


def _check_mm_header(path):
    """Refuse a header scipy's reader would hold whole in memory: a line of a megabyte or more
    (a few megabytes of gzip hold a gigabyte-long comment, which took 15 s and ended in a bare
    ``std::bad_alloc``, or the process killed), or comments that run past 64 MiB. The
    ValueError says what is wrong; `_mm_info` names the file."""
    read = 0
    with _open_mm(path) as stream:
        while True:
            line = stream.readline(_MM_CHUNK_BYTES)
            read += len(line)
            if len(line) == _MM_CHUNK_BYTES and not line.endswith(b"\n"):
                raise ValueError(f"a line of its header, at byte {read - len(line)}, is longer "
                                 f"than {_MM_CHUNK_BYTES} bytes")
            stripped = line.strip()
            if not line or (stripped and not stripped.startswith(b"%")):
                return                      # the size line (or none: scipy says what is wrong)
            if read > _MM_HEADER_BYTES:
                raise ValueError(f"its header's comments run past {_MM_HEADER_BYTES} bytes")


def _mm_info(path):
    """scipy's reading of the header, checked against what the rest of the reader relies on."""
    try:
        _check_mm_header(path)
        rows, cols, entries, fmt, field, symmetry = scipy.io.mminfo(path)
    except _MM_PARSE_ERRORS as exc:
        raise ValueError(f"{path!r} is not a valid Matrix Market file: {exc}") from None
    except OSError as exc:
        if exc.errno is not None:          # a failing disk, not a damaged gzip or bz2 stream
            raise
        raise ValueError(f"{path!r} is not a valid Matrix Market file: {exc}") from None
    if field == "complex":
        raise TypeError(f"{path!r} holds complex values; only real matrices are supported")
    if field not in _MM_TOKEN_BYTES:
        raise ValueError(f"{path!r} is not a valid Matrix Market file: field {field!r}")
    if field == "pattern" and symmetry in ("skew-symmetric", "hermitian"):
        # A pattern's entries are 1: mirrored as -1 (skew), they were not.
        raise ValueError(f"{path!r} is not a valid Matrix Market file: a pattern file is "
                         f"general or symmetric, not {symmetry}")
    if symmetry != "general" and rows != cols:
        raise ValueError(f"{path!r} is not a valid Matrix Market file: a {symmetry} matrix "
                         f"must be square, the header declares {rows} x {cols}")
    return rows, cols, entries, fmt, field, symmetry


def read_matrix_market(path):
    """Read a Matrix Market file (coordinate or array, real/integer/pattern, any symmetry).

    Symmetric files are expanded to both triangles; pattern files get the value 1.0. A name
    ending in ``.gz`` or ``.bz2`` is decompressed, as by ``scipy.io.mmread``.

    Parameters
    ----------
    path : str, bytes, path-like or file object
        A file object (binary or text) is read from its current position, as by
        ``scipy.io.mmread``, and not decompressed.

    Returns
    -------
    csr_array
        Canonical (duplicates summed, as the format prescribes), float64 values.

    Raises
    ------
    FileNotFoundError
        No such file.
    TypeError
        The file holds complex values.
    ValueError
        Anything else that is not a valid Matrix Market file, named: a bad header, a
        symmetric matrix that is not square, an entry out of range, a value the field does
        not allow (``1,5`` or ``1-2`` in a real field, ``2.5`` in an integer one, checked
        whole: scipy reads a number up to its first byte it cannot take), a line of more than
        a megabyte or comments past 64 MiB (a decompression bomb's), more or fewer numbers
        than the header declares, a non-zero diagonal entry in a skew-symmetric file
        (entries there that sum to zero are kept as stored zeros), an entry stored with its
        mirror in a symmetric, skew-symmetric or hermitian file (which holds one triangle:
        both would be read doubled), a pattern file declared skew-symmetric or hermitian
        (its entries are 1), a path that is not a regular file.
    MemoryError
        The file declares more rows than this machine's memory can index (the CSR row
        pointer), found before reading it.
    """
    if hasattr(path, "read"):
        return _read_matrix_market_stream(path)
    path = _existing_path(path)
    info = _mm_info(path)
    _refuse_dense_beyond_memory(path, info)
    _check_mm_body(path, info)
    rows, cols, _, fmt, _, symmetry = info
    if fmt == "coordinate":
        # The entries are in the file (counted above); the row pointer is not: a three-line
        # file declaring 3e9 rows had the process killed while converting to CSR. scipy's
        # conversion holds two arrays of rows + 1 indices.
        refuse_beyond_memory(2.0 * 8 * (rows + 1),
                             f"{path!r} declares {rows} rows, whose row pointers")
    if fmt == "array" and rows == 0:
        # scipy's reader divides by the row count (a crash, SIGFPE) for an empty array file.
        return csr_array((np.zeros(0), np.zeros(0, np.int32), np.zeros(1, np.int32)),
                         shape=(0, cols))
    try:
        matrix = scipy.io.mmread(path)
    except _MM_PARSE_ERRORS as exc:
        raise ValueError(f"{path!r} is not a valid Matrix Market file: {exc}") from None
    if isinstance(matrix, np.ndarray):
        return csr_array(matrix)
    if symmetry != "general":
        _refuse_both_triangles(path, matrix, info[2], symmetry)
    diagonal = matrix.row == matrix.col if symmetry == "skew-symmetric" else None
    if diagonal is not None and diagonal.any() and np.any(np.bincount(
            matrix.row[diagonal], weights=matrix.data[diagonal], minlength=rows) != 0):
        # Its diagonal is zero by definition (entries there may only cancel out); scipy kept
        # them, and a matrix that is not skew-symmetric.
        raise ValueError(f"{path!r} is not a valid Matrix Market file: a skew-symmetric "
                         f"matrix with a non-zero diagonal entry")
    return csr_array(matrix).canonical()


def _refuse_dense_beyond_memory(path, info):
    """Refuse an array file whose dense values exceed memory, before they are scanned: a few
    megabytes of gzip declaring 20000 x 20000 zeros were scanned for 7 s, then scipy asked
    NumPy for the 3 GiB array."""
    if info[3] == "array":
        refuse_beyond_memory(8.0 * info[0] * info[1],
                             f"{path!r} declares a dense {info[0]} x {info[1]} array, which would")


def _read_matrix_market_stream(stream):
    """`read_matrix_market` of a file object's text: through a temporary file, since the
    checks and scipy's reader each read the text from its start; the messages name the file
    object, not the copy.

    The copy stops where the header's size says the text must end (as the checks of a file
    stop): copied whole, a decompressing stream (``gzip.open`` of a bomb) filled the disk
    before any check ran.
    """
    import tempfile

    shown = repr(getattr(stream, "name", None) or f"<{type(stream).__name__} object>")
    with tempfile.TemporaryDirectory() as folder:
        copy = os.path.join(folder, "matrix.mtx")
        try:
            with open(copy, "wb") as target:
                head = _MM_HEADER_BYTES + _MM_CHUNK_BYTES
                written, more = _copy_text(stream, target, head, shown)
                if more:
                    target.flush()
                    info = _mm_info(copy)    # the header is whole by now, or refused
                    _refuse_dense_beyond_memory(copy, info)
                    limit = head + _MM_CHUNK_BYTES + 64 * _mm_expected_tokens(*info)
                    if _copy_text(stream, target, limit - written, shown)[1]:
                        raise ValueError(f"{copy!r} is not a valid Matrix Market file: it runs "
                                         f"past {limit} bytes, more than the {info[2]} "
                                         f"entries its header declares take")
            return read_matrix_market(copy)
        except (ValueError, TypeError, MemoryError) as exc:
            raise type(exc)(str(exc).replace(repr(copy), shown)) from None


def _copy_text(stream, target, budget, shown):
    """Copy at most ``budget`` bytes of ``stream`` (binary, or text encoded as UTF-8) to
    ``target``; ``(bytes copied, whether the stream holds more)``."""
    written = 0
    while True:
        data = stream.read(min(_MM_CHUNK_BYTES, budget - written + 1))
        if isinstance(data, str):      # a text stream: the format is ASCII
            data = data.encode("utf-8", "surrogateescape")
        elif not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"expected a path or a file object whose read() gives bytes or "
                            f"str, got {type(data).__name__} from {shown}")
        if not data:
            return written, False
        if written + len(data) > budget:
            target.write(data[:budget - written])
            return budget, True
        target.write(data)
        written += len(data)


def _refuse_both_triangles(path, matrix, stored, symmetry):
    """Refuse a file that stores an entry and its mirror (a full matrix under a symmetric
    header, a common fault of writers): scipy mirrors every entry off the diagonal, and both
    were read doubled. ``stored`` entries come first in scipy's result, their mirrors after.
    A file that stores the upper triangle, or some entries in each, is read as meant."""
    rows, cols = matrix.row[:stored], matrix.col[:stored]
    lower, upper = rows > cols, rows < cols
    if not (lower.any() and upper.any()):
        return    # one triangle, as the format has it: no entry can have its mirror stored
    rows, cols = rows.astype(np.int64), cols.astype(np.int64)
    n = np.int64(max(matrix.shape[0], 1))
    both = np.intersect1d(rows[lower] * n + cols[lower], cols[upper] * n + rows[upper])
    if both.size:
        row, col = divmod(int(both[0]), int(n))
        raise ValueError(f"{path!r} is not a valid Matrix Market file: a {symmetry} file holds "
                         f"one triangle, and it stores both entry ({row + 1}, {col + 1}) and "
                         f"its mirror ({col + 1}, {row + 1}), which would each be counted twice")


_SYMMETRIES = (None, "general", "symmetric", "skew-symmetric", "hermitian")


def _has_symmetry(coo, symmetry):
    """Whether real ``coo`` equals its transpose (negated for "skew-symmetric"), entry for
    entry and stored entry for stored entry: an explicit zero is part of the pattern (the
    orderings and the blocked formats count it), so one without its mirror makes the matrix
    general, and a skew-symmetric matrix stores nothing on its diagonal, which the file does
    not hold. NaN matches NaN where the triangle written stands for both."""
    if coo.shape[0] != coo.shape[1]:
        return False
    sign = -1.0 if symmetry == "skew-symmetric" else 1.0
    if sign < 0 and np.any(coo.row == coo.col):
        return False

    def canonical(matrix):
        matrix = scipy.sparse.csr_array(matrix)
        matrix.sum_duplicates()
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
        None detects symmetry, explicit zeros counted as stored entries (scipy's detection
        ignores them, which lost a zero without its mirror or added one); "general" always
        writes every entry. A declared symmetry is checked first (the values are real:
        "hermitian" is "symmetric", and written so), since only one triangle is written.
    """
    _check_sparray(A)
    if not isinstance(comment, str):   # scipy's writer failed in its compiled header code
        raise TypeError(f"comment must be a string, got {type(comment).__name__}")
    if symmetry not in _SYMMETRIES:
        raise ValueError(f"symmetry must be one of {_SYMMETRIES}, got {symmetry!r}")
    coo = A.to_scipy().tocoo()
    # Duplicates summed: entries on the diagonal of a skew-symmetric matrix that cancel out
    # would otherwise be written one by one, as a diagonal no reader accepts.
    coo.sum_duplicates()
    # scipy writes one triangle for a declared symmetry without checking it: the other
    # triangle would be lost, or come back mirrored.
    if symmetry not in (None, "general") and not _has_symmetry(coo, symmetry):
        if symmetry == "skew-symmetric" and np.any(coo.row == coo.col):
            why = (" (it stores entries on its diagonal, explicit zeros included, which a "
                   "skew-symmetric file cannot hold)")
        elif np.any(coo.data == 0):
            why = " (its explicit zeros count as stored entries)"
        else:
            why = ""
        raise ValueError(f"symmetry={symmetry!r} but the matrix is not {symmetry}{why}; "
                         f"use symmetry=None to detect it or 'general'")
    if symmetry is None:
        # Detected here: scipy's detection ignores explicit zeros, so a stored zero without
        # its mirror was dropped with the upper triangle, or came back mirrored.
        symmetry = next((kind for kind in ("symmetric", "skew-symmetric")
                         if _has_symmetry(coo, kind)), "general")
    elif symmetry == "hermitian":
        # The format defines hermitian for complex fields only; real values are symmetric
        symmetry = "symmetric"
    # A missing directory is refused here: scipy returns without writing.
    with _written_whole(path, ".mtx") as destination:
        scipy.io.mmwrite(destination, coo, comment=comment, symmetry=symmetry)
