"""Hostile and unusual files, bytes paths, and round trips against scipy's readers and writers."""
import gzip
import os

import numpy as np
import pytest
import scipy.io
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc import datasets
from pysparse_hpc.generators import rmat
from pysparse_hpc.io import load_npz, read_matrix_market, save_npz, write_matrix_market

from .conftest import run_child

HEADER = "%%MatrixMarket matrix coordinate real general\n"


def _run_limited(code, timeout=30, memory=2 << 30):
    """`run_child`'s standard output, with a memory cap by default."""
    return run_child(code, timeout, memory).stdout


def _expect_value_error(path, match):
    """Child-process code that reads ``path`` and prints the ValueError (or MemoryError) it
    must raise."""
    return f"""
        from pysparse_hpc.io import read_matrix_market
        try:
            read_matrix_market({str(path)!r})
        except (ValueError, MemoryError) as exc:
            print(type(exc).__name__, exc)
        """


def _mm(tmp_path, text, name="a.mtx"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# --- special files ---------------------------------------------------------------------------

def test_a_fifo_or_device_is_refused_not_waited_on(tmp_path):
    # Opening a FIFO blocked until a writer came (forever); /dev/zero made the .npz reader
    # allocate without end.
    fifo = tmp_path / "pipe.mtx"
    os.mkfifo(fifo)
    out = _run_limited(f"""
        from pysparse_hpc.io import load_npz, read_matrix_market
        from pysparse_hpc.datasets import load_file
        for read in (load_npz, read_matrix_market, load_file):
            for path in ({str(fifo)!r}, "/dev/zero"):
                try:
                    read(path)
                except ValueError as exc:
                    print(exc)
        """, timeout=20)
    assert out.count("is not a regular file") == 6, out


def test_bytes_paths_read_and_write(tmp_path):
    # A bytes path was refused by the writers (str.endswith on bytes) and read by scipy as a
    # file named "b'...'" (FileNotFoundError for a file that exists).
    A = sph.csr_array(np.array([[1.0, 0.0], [2.0, 3.0]]))
    base = os.fsencode(tmp_path / "m")
    save_npz(base, A)
    write_matrix_market(base, A)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mtx", "m.npz"]
    np.testing.assert_array_equal(load_npz(base + b".npz").toarray(), A.toarray())
    np.testing.assert_array_equal(read_matrix_market(base + b".mtx").toarray(), A.toarray())


# --- Matrix Market: crashes of scipy's reader --------------------------------------------------

@pytest.mark.parametrize("text", [
    HEADER + "2 2 1\n1 1 5 \0\n",                                     # SIGSEGV
    "%%MatrixMarket matrix array real general\n1 1\n5\0\n",            # SIGSEGV
])
def test_a_nul_byte_is_an_error_not_a_crash(tmp_path, text):
    path = _mm(tmp_path, text)
    out = _run_limited(_expect_value_error(path, ""), timeout=20)
    assert "ValueError" in out and "belongs to no number" in out, out


@pytest.mark.parametrize("shape", [(0, 3), (0, 0)])
def test_an_empty_array_file_is_read_not_a_crash(tmp_path, shape):
    # scipy's reader divided by the row count: SIGFPE.
    path = _mm(tmp_path, "%%%%MatrixMarket matrix array real general\n%d %d\n" % shape)
    out = _run_limited(f"""
        from pysparse_hpc.io import read_matrix_market
        A = read_matrix_market({str(path)!r})
        print(A.shape, A.nnz)
        """, timeout=20)
    assert out.strip() == f"{shape} 0"
    path = _mm(tmp_path, "%%MatrixMarket matrix array real general\n0 3\n1\n", "long.mtx")
    with pytest.raises(ValueError, match="declares 0 values .* holds more"):
        read_matrix_market(path)


# --- Matrix Market: huge declared sizes ----------------------------------------------------------

@pytest.mark.parametrize("text,error,match", [
    (HEADER + "2 2 10000000000\n1 1 1\n", "ValueError", "declares 10000000000 entries"),
    # a dense array is refused by its size before its values are counted
    ("%%MatrixMarket matrix array real general\n100000 100000\n1\n", "MemoryError",
     "declares a dense 100000 x 100000 array, which would need about 74.5 GiB"),
])
def test_a_huge_declared_size_is_refused_before_allocating(tmp_path, text, error, match):
    # scipy allocated for the declared entries (37 GiB) from a header of a few bytes.
    path = _mm(tmp_path, text)
    out = _run_limited(_expect_value_error(path, match), timeout=20, memory=1 << 30)
    assert error in out and match in out, out


def test_a_gigabyte_comment_of_a_few_megabytes_of_gzip_is_refused(tmp_path):
    # scipy's header reader held the whole line: 15 s, then a bare std::bad_alloc under this
    # limit, the process killed without one. gzip reads concatenated members as one stream.
    line = gzip.compress(b"x" * (16 << 20), compresslevel=9)
    path = tmp_path / "bomb.mtx.gz"
    path.write_bytes(gzip.compress(HEADER.encode() + b"%") + line * 64
                     + gzip.compress(b"\n2 2 1\n1 1 5\n"))
    match = "a line of its header, at byte 46, is longer than 1048576 bytes"
    out = _run_limited(_expect_value_error(path, match), timeout=30, memory=768 << 20)
    assert "ValueError" in out and match in out, out


@pytest.mark.parametrize("text,match", [
    (HEADER + "%" + "x" * (2 << 20) + "\n2 2 1\n1 1 5\n", "a line of its header, at byte 46"),
    (HEADER + ("%" + "x" * 1023 + "\n") * (64 << 10) + "%\n2 2 1\n1 1 5\n",
     "its header's comments run past 67108864 bytes"),
])
def test_a_header_of_endless_comments_is_refused(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        read_matrix_market(_mm(tmp_path, text))
    # comments of an ordinary length, however many of them a real file has, are read
    ordinary = HEADER + "% a comment\n" * 1000 + "%" + "y" * 60000 + "\n2 2 1\n1 1 5\n"
    assert read_matrix_market(_mm(tmp_path, ordinary, "ordinary.mtx")).toarray()[0, 0] == 5


def test_the_memory_guard_heeds_an_address_space_limit(tmp_path):
    # It compared with this machine's memory only: under ``ulimit -v`` a 69-byte file
    # declaring 1e9 rows passed it, and NumPy's "Unable to allocate" named neither the file
    # nor what was too big.
    path = _mm(tmp_path, HEADER + "1000000000 3 1\n1 1 1\n")
    out = _run_limited(f"""
        from pysparse_hpc.io import read_matrix_market
        try:
            read_matrix_market({str(path)!r})
        except MemoryError as exc:
            print("MemoryError", exc)
        """, timeout=30, memory=2 << 30)
    assert "MemoryError" in out and "declares 1000000000 rows" in out, out
    assert "its address-space limit (ulimit -v) leaves" in out, out


def test_a_dense_array_file_is_refused_before_its_values_are_read(tmp_path, monkeypatch):
    # The array format had no guard: a few megabytes of gzip declaring 20000 x 20000 zeros
    # were scanned for 7 s, then NumPy was asked for the 3 GiB array.
    from pysparse_hpc import _sputils
    monkeypatch.setattr(_sputils, "physical_memory", lambda: 1 << 30)
    monkeypatch.setattr(_sputils, "_address_space_room", lambda: None)
    monkeypatch.setattr(_sputils, "_cgroup_room", lambda: None)
    path = tmp_path / "zeros.mtx.gz"
    with gzip.open(path, "wb", compresslevel=1) as handle:
        handle.write(b"%%MatrixMarket matrix array real general\n20000 20000\n")
        handle.write(b"0\n" * (1 << 20))     # the rest missing: never read
    with pytest.raises(MemoryError, match=r"declares a dense 20000 x 20000 array, which would "
                                          r"need about 2\.98 GiB, more than this machine's"):
        read_matrix_market(path)


def test_npz_members_that_fit_one_at_a_time_but_not_together_are_refused(
        tmp_path, monkeypatch):
    # Each member was checked alone: two of 0.6 GiB passed a 1 GiB machine, the first was
    # inflated, and the second failed in NumPy naming nothing.
    from pysparse_hpc import _sputils
    monkeypatch.setattr(_sputils, "physical_memory", lambda: 1 << 30)
    monkeypatch.setattr(_sputils, "_address_space_room", lambda: None)
    monkeypatch.setattr(_sputils, "_cgroup_room", lambda: None)
    n = 80 << 20                                             # 0.625 GiB of int64 or float64
    header = {"indices": np.lib.format.header_data_from_array_1_0(np.zeros(0, np.int64)),
              "data": np.lib.format.header_data_from_array_1_0(np.zeros(0))}
    path = tmp_path / "big.npz"
    import zipfile
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for key in ("indices", "data"):
            with archive.open(key + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array_header_1_0(member, dict(header[key], shape=(n,)))
                zeros = bytes(1 << 24)
                for _ in range(n * 8 // len(zeros)):
                    member.write(zeros)
        np.savez(tmp_path / "small.npz", indptr=np.array([0, n]), shape=np.array([1, n]))
        with zipfile.ZipFile(tmp_path / "small.npz") as small:
            for name in small.namelist():
                archive.writestr(name, small.read(name))
    with pytest.raises(MemoryError, match=r"its members \['indptr', 'indices', 'data', "
                                          r"'shape'\] would need about 1\.25 GiB"):
        load_npz(path)


def test_a_compressed_file_is_checked_too(tmp_path):
    gz = tmp_path / "a.mtx.gz"
    gz.write_bytes(gzip.compress((HEADER + "2 2 10000000000\n1 1 1\n").encode()))
    out = _run_limited(_expect_value_error(gz, ""), timeout=20, memory=1 << 30)
    assert "declares 10000000000 entries" in out, out
    gz.write_bytes(gzip.compress((HEADER + "2 2 1\n1 1 1,5\n").encode()))
    with pytest.raises(ValueError, match="b',' at byte 5"):
        read_matrix_market(gz)
    gz.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a valid Matrix Market file"):
        read_matrix_market(gz)
    S = scipy.sparse.random(9, 7, density=0.3, random_state=1, format="coo")
    scipy.io.mmwrite(tmp_path / "b.mtx", S)
    gz.write_bytes(gzip.compress((tmp_path / "b.mtx").read_bytes()))
    np.testing.assert_array_equal(read_matrix_market(gz).toarray(), S.toarray())


# --- Matrix Market: silently wrong matrices ------------------------------------------------------

@pytest.mark.parametrize("text,match", [
    (HEADER + "2 2 1\n1 1 1,5\n", r"b',' at byte 5 of the entries \(in '1 1 1,5'\)"),   # was 1
    (HEADER + "2 2 1\n1 1 0x10\n", "b'x'"),                                          # was 0
    (HEADER + "2 2 1\n1 1 5abc\n", "b'b'"),                                          # was 5
    ("%%MatrixMarket matrix coordinate integer general\n2 2 1\n1 1 2.5\n", "b'.'"),  # was 2
    ("%%MatrixMarket matrix coordinate integer general\n2 2 1\n1 1 5e3\n", "b'e'"),  # was 5
    (HEADER + "2 2 1\n1 1 5 7\n", "declares 1 entries of 3 numbers .* holds more"),  # was 5
    ("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 1 5\n", "holds more"),
    (HEADER + "2 2 2\n1 1 5\n", "declares 2 entries .* holds 3"),
    ("%%MatrixMarket matrix coordinate real symmetric\n2 3 1\n2 1 5\n",
     "a symmetric matrix must be square, the header declares 2 x 3"),
    ("%%MatrixMarket matrix array real symmetric\n2 3\n1\n2\n3\n", "must be square"),
    ("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n1 1 5\n",
     "skew-symmetric matrix with a non-zero diagonal entry"),
    # numbers whose bytes are all allowed, malformed whole: scipy reads up to the first byte
    # it cannot take (the value in the comment) and skips the rest of the line
    (HEADER + "2 2 1\n1 1 1-2\n", "b'1-2' at byte 4 of the entries is not a number"),  # 1
    ("%%MatrixMarket matrix coordinate integer general\n2 2 1\n1 1 5+3\n", "b'5\\+3'"),
    (HEADER + "2 2 1\n1 1 2.5.7\n", "b'2.5.7'"),                                      # 2.5
    (HEADER + "2 2 1\n1 1 1e5e3\n", "b'1e5e3'"),                                      # 1e5
    (HEADER + "2 2 1\n1 1 1e\n", "b'1e'"),                                            # 1
    (HEADER + "2 2 1\n1 1 1nan\n", "b'1nan'"),                                        # 1
    (HEADER + "2 2 1\n1 1 inf-3\n", "b'inf-3'"),                                      # inf
    (HEADER + "2 2 1\n1 1 .\n", "b'.'"),
    (HEADER + "2 2 1\n1 2-1 7\n", "b'2-1'"),                 # -1 in column 2, the 7 dropped
    ("%%MatrixMarket matrix array real general\n1 1\n5-3\n", "b'5-3'"),             # 5
    # a file that stores an entry and its mirror under a symmetric header: read doubled
    ("%%MatrixMarket matrix coordinate real symmetric\n2 2 3\n1 1 1\n2 1 2\n1 2 2\n",
     r"stores both entry \(2, 1\) and its mirror \(1, 2\)"),
    ("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 2\n1 2 -4\n2 1 4\n",
     "stores both entry"),
    (HEADER + "2 2 1\n1 1 " + "1" * (2 << 20) + "\n", "longer than 1048576 bytes"),
    (HEADER + "2 2 1\n1 1 5\n" + "\n" * (3 << 20), "run past 1048768 bytes"),  # read to the end
    ("%%MatrixMarket matrix coordinate pattern skew-symmetric\n2 2 1\n2 1\n",   # -1 above
     "a pattern file is general or symmetric, not skew-symmetric"),
])
def test_a_file_that_does_not_match_its_header_is_refused(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        read_matrix_market(_mm(tmp_path, text))


def test_lenient_but_valid_files_still_read(tmp_path):
    cases = [
        (HEADER + "% c\n\n  2   2   1 \n\n 1\t1   5e-1 \r\n\n", [[0.5, 0], [0, 0]]),
        ("%%MatrixMarket MATRIX Coordinate REAL General\n2 2 1\n2 2 -inf\n",
         [[0, 0], [0, -np.inf]]),
        (HEADER + "2 2 2\n1 2 NaN\n2 1 Infinity\n", [[0, np.nan], [np.inf, 0]]),
        ("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 3\n1 1 5\n1 1 -5\n2 1 3\n",
         [[0, -3], [3, 0]]),                       # diagonal entries that cancel out
        ("%%MatrixMarket matrix coordinate integer hermitian\n2 2 2\n2 1 -7\n1 1 4\n",
         [[4, -7], [-7, 0]]),
        ("%%MatrixMarket matrix array integer skew-symmetric\n3 3\n1\n2\n3\n",
         [[0, -1, -2], [1, 0, -3], [2, 3, 0]]),
        ("%%MatrixMarket matrix coordinate pattern symmetric\n2 2 1\n2 1", [[0, 1], [1, 0]]),
        (HEADER + "0 3 0\n", np.zeros((0, 3))),
        (HEADER + "3 0 0\n", np.zeros((3, 0))),
        (HEADER + "2 2 4\n1 1 1.\n1 2 .5\n2 1 -1E-3\n2 2 2e+01\n",
         [[1.0, 0.5], [-1e-3, 20.0]]),
        (HEADER + "2 2 2\n1 2 -Infinity\n2 1 -nan\n", [[0, -np.inf], [np.nan, 0]]),
        # one triangle, the upper one, or a part of each: mirrored as meant
        ("%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n1 2 5\n3 1 7\n",
         [[0, 5, 7], [5, 0, 0], [7, 0, 0]]),
    ]
    for text, expected in cases:
        A = read_matrix_market(_mm(tmp_path, text))
        assert A.dtype == np.float64 and A.has_canonical_format
        np.testing.assert_array_equal(A.toarray(), np.array(expected, dtype=float).reshape(A.shape))
        assert A.shape == np.shape(expected)


def test_a_skew_symmetric_write_merges_cancelling_diagonal_entries(tmp_path):
    # Duplicates were written one by one: a skew-symmetric file with diagonal entries.
    S = scipy.sparse.csr_array((np.array([3.0, -3.0, 2.0, -2.0]), np.array([0, 0, 1, 0]),
                                np.array([0, 3, 4])), shape=(2, 2))
    A = sph.csr_array(S)
    # Summed, (0, 0) is a stored zero: part of the pattern, which only a general file keeps.
    write_matrix_market(tmp_path / "k.mtx", A)
    lines = (tmp_path / "k.mtx").read_text().splitlines()
    assert "general" in lines[0] and len(lines) == 3 + 3, lines   # header, size, 3 entries
    back = read_matrix_market(tmp_path / "k.mtx")
    np.testing.assert_array_equal(back.toarray(), S.toarray())
    assert back.nnz == 3
    with pytest.raises(ValueError, match="stores entries on its diagonal, explicit zeros "
                                         "included, which a skew-symmetric file cannot hold"):
        write_matrix_market(tmp_path / "k.mtx", A, symmetry="skew-symmetric")
    # Without the stored zero it is skew-symmetric, written as one triangle.
    skew = sph.csr_array(np.array([[0.0, -2.0], [2.0, 0.0]]))
    for symmetry in (None, "skew-symmetric"):
        write_matrix_market(tmp_path / "k.mtx", skew, symmetry=symmetry)
        lines = (tmp_path / "k.mtx").read_text().splitlines()
        assert "skew-symmetric" in lines[0] and len(lines) == 3 + 1, lines
        np.testing.assert_array_equal(read_matrix_market(tmp_path / "k.mtx").toarray(),
                                      skew.toarray())


# --- round trips against scipy -------------------------------------------------------------------

def _random(rng, shape, dtype, canonical):
    m, n = shape
    nnz = int(rng.integers(0, m * n + 2)) if m * n else 0
    rows, cols = rng.integers(0, max(m, 1), nnz), rng.integers(0, max(n, 1), nnz)
    values = (rng.random(nnz) < 0.7 if dtype == np.bool_
              else rng.integers(-3, 4, nnz) if np.issubdtype(dtype, np.integer)
              else rng.standard_normal(nnz)).astype(dtype)
    if canonical:
        return scipy.sparse.csr_array(scipy.sparse.coo_array((values, (rows, cols)), shape=shape))
    order = np.lexsort((rng.random(nnz), rows))        # unsorted columns, duplicates kept
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m))])
    return scipy.sparse.csr_array((values[order], cols[order], indptr), shape=shape)


def test_round_trips_agree_with_scipy(tmp_path):
    rng = np.random.default_rng(7)
    shapes = [(0, 0), (0, 4), (4, 0), (1, 1), (1, 6), (6, 1), (5, 5), (4, 7)]
    dtypes = [np.float64, np.float32, np.bool_, np.int32, np.int64]
    npz, mtx = tmp_path / "a.npz", tmp_path / "a.mtx"
    for trial in range(60):
        shape = shapes[trial % len(shapes)]
        dtype = dtypes[trial % len(dtypes)]
        S = _random(rng, shape, dtype, canonical=bool(trial % 3))
        A = sph.csr_array(S)
        dense64 = scipy.sparse.csr_array((S.data.astype(np.float64), S.indices, S.indptr),
                                         shape=shape).toarray()
        # .npz: ours -> ours and scipy keeps the arrays; scipy -> ours gives the same values.
        save_npz(npz, A, compressed=bool(trial % 2))
        for B in (load_npz(npz), scipy.sparse.load_npz(npz)):
            assert B.shape == shape and B.dtype == A.dtype
            np.testing.assert_array_equal(B.indptr, A.indptr)
            np.testing.assert_array_equal(B.indices, A.indices)
            np.testing.assert_array_equal(B.data, A.data)
        scipy.sparse.save_npz(npz, S)
        np.testing.assert_array_equal(load_npz(npz).toarray(), A.toarray())
        # Matrix Market: every symmetry ours can write, read by ours and by scipy.
        for symmetry in (None, "general", "symmetric", "skew-symmetric", "hermitian"):
            try:
                write_matrix_market(mtx, A, symmetry=symmetry)
            except ValueError:
                assert symmetry not in (None, "general")
                continue
            B = read_matrix_market(mtx)
            assert B.shape == shape and B.dtype == np.float64 and B.has_canonical_format
            np.testing.assert_allclose(B.toarray(), dense64, rtol=1e-6, atol=1e-6)
            C = scipy.io.mmread(mtx)
            np.testing.assert_allclose(C.toarray() if hasattr(C, "toarray") else C, dense64,
                                       rtol=1e-6, atol=1e-6)
        if dtype != np.bool_:                 # scipy's writer cannot negate booleans
            scipy.io.mmwrite(mtx, S)
            np.testing.assert_allclose(read_matrix_market(mtx).toarray(), dense64,
                                       rtol=1e-6, atol=1e-6)


# --- .npz: members larger than they are, or than memory ----------------------------------------

def _npz_with_member(path, key, member_bytes, compression):
    """A scipy-layout ``.npz`` of a 5 x 5 matrix whose member ``key`` is ``member_bytes``."""
    import io
    import zipfile

    S = scipy.sparse.random_array((5, 5), density=0.4, random_state=0, format="csr")
    members = {"indptr": S.indptr, "indices": S.indices, "data": S.data,
               "shape": np.array(S.shape), "format": np.array("csr")}
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, array in members.items():
            if name == key:
                archive.writestr(f"{name}.npy", member_bytes)
            else:
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, array)
                archive.writestr(f"{name}.npy", buffer.getvalue())


@pytest.mark.parametrize("compression", [0, 8])   # stored, deflated
@pytest.mark.parametrize("count", [10**9, 10**12, 10**15])
def test_a_member_header_declaring_more_than_the_member_holds_is_refused(tmp_path, count,
                                                                         compression):
    """NumPy allocates what a member's header declares before reading: 4 TB declared by a
    small file failed with NumPy's MemoryError naming no file (4 GB: allocated, then EOF)."""
    import io

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i4", "fortran_order": False, "shape": (count,)})
    _npz_with_member(tmp_path / "a.npz", "indices", header.getvalue() + bytes(64), compression)
    with pytest.raises(ValueError, match=rf"a\.npz' has a corrupt member 'indices': its "
                                         rf"header declares \({count},\) int32 \({4 * count} "
                                         rf"bytes\) but the member holds 64"):
        load_npz(tmp_path / "a.npz")


@pytest.mark.parametrize("compression", [0, 8])   # stored, deflated
def test_a_member_holding_more_than_its_header_declares_is_refused(tmp_path, compression):
    """Bytes past the data NumPy wrote were read past without a word (the reader stops at
    the header's size), though another tool reading the member would see them."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.arange(4, dtype=np.int32))
    _npz_with_member(tmp_path / "a.npz", "indices", buffer.getvalue() + bytes(8), compression)
    with pytest.raises(ValueError, match=r"a\.npz' has a corrupt member 'indices': its header "
                                         r"declares \(4,\) int32 \(16 bytes\) but the member "
                                         r"holds 24"):
        load_npz(tmp_path / "a.npz")


def test_a_member_beyond_memory_is_refused_before_inflating(tmp_path, monkeypatch):
    """A deflated member of zeros packs megabytes into a few kilobytes: one beyond this
    machine's memory was inflated until the process was killed. Here the machine is made to
    have 4 MiB, and the member holds 16 MiB."""
    import io

    from pysparse_hpc import _sputils

    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.zeros(2**21, dtype=np.float64))
    _npz_with_member(tmp_path / "a.npz", "data", buffer.getvalue(), 8)
    assert os.path.getsize(tmp_path / "a.npz") < 2**16
    monkeypatch.setattr(_sputils, "physical_memory", lambda: 4 * 2**20)
    with pytest.raises(MemoryError, match=r"a\.npz': member 'data' of shape \(2097152,\) "
                                          r"float64 would need about 0\.0156 GiB, more than "
                                          r"this machine's"):
        load_npz(tmp_path / "a.npz")
    # With the machine's real memory the same member is read (and then refused, as a
    # matrix of 5 x 5 with 2**21 values, by the CSR checks).
    monkeypatch.undo()
    with pytest.raises(ValueError, match="data"):
        load_npz(tmp_path / "a.npz")


# --- datasets and generators ---------------------------------------------------------------------

def test_load_file_refuses_weights_beyond_float32(tmp_path):
    # A float64 weight of 1e300 (or duplicates summing past float32) became inf in the
    # float32 adjacency, past the check for infinite weights.
    arrays = dict(adj_indptr=np.array([0, 1, 2, 3, 4]), adj_indices=np.array([1, 0, 3, 2]),
                  adj_data=np.array([1e300, 1, 1, 1]), adj_shape=np.array([4, 4]),
                  labels=np.array([0, 1, 0, 1]), train_mask=np.array([1, 1, 0, 0], bool),
                  val_mask=np.array([0, 0, 1, 0], bool), test_mask=np.array([0, 0, 0, 1], bool),
                  num_classes=np.array(2))
    np.savez(tmp_path / "g.npz", **arrays)
    with pytest.raises(ValueError, match="infinite weights"):
        datasets.load_file(tmp_path / "g.npz", random_features=2)
    np.savez(tmp_path / "g.npz", **dict(arrays, adj_indptr=np.array([0, 2, 2, 3, 4]),
                                        adj_indices=np.array([1, 1, 3, 2]),
                                        adj_data=np.array([3e38, 3e38, 1, 1], np.float32)))
    with pytest.raises(ValueError, match="infinite weights"):
        datasets.load_file(tmp_path / "g.npz", random_features=2)


def test_rmat_refuses_boolean_probabilities():
    for bad in ((True, False, False, False), (True, 0, 0, 0), np.array([1, 0, 0, 0], bool)):
        with pytest.raises(TypeError, match="probabilities must be 4 numbers"):
            rmat(3, probabilities=bad)
    assert rmat(3, probabilities=np.array([1, 0, 0, 0])).nnz == 1


def test_an_archive_with_two_members_of_one_name_is_refused(tmp_path):
    """NumPy read the last of the two, where other zip tools show the first."""
    import io
    import warnings
    import zipfile

    path = tmp_path / "a.npz"
    S = scipy.sparse.random_array((5, 5), density=0.4, random_state=0, format="csr")
    members = {"indptr": S.indptr, "indices": S.indices, "data": S.data,
               "shape": np.array(S.shape), "format": np.array("csr")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # zipfile's warning of the duplicate name
        with zipfile.ZipFile(path, "w") as archive:
            for name, array in [*members.items(), ("data", S.data * 2)]:
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, array)
                archive.writestr(f"{name}.npy", buffer.getvalue())
    with pytest.raises(ValueError, match="two members named 'data.npy'"):
        load_npz(path)


@pytest.mark.parametrize("cgroup,files,room", [
    ("0::/job\n", {"/sys/fs/cgroup/job/memory.max": "8589934592\n",
                   "/sys/fs/cgroup/job/memory.current": "7516192768\n",
                   "/sys/fs/cgroup/job/memory.stat": "anon 1\ninactive_file 5368709120\n"},
     6 << 30),
    ("4:memory:/job\n0::/\n", {"/sys/fs/cgroup/memory/job/memory.limit_in_bytes": "4294967296",
                               "/sys/fs/cgroup/memory/job/memory.usage_in_bytes": "1073741824",
                               "/sys/fs/cgroup/memory/job/memory.stat":
                                   "total_inactive_file 0\n"}, 3 << 30),
    ("0::/\n", {"/sys/fs/cgroup/memory.max": "max\n", "/sys/fs/cgroup/memory.current": "5"},
     None),
    ("garbled line\n\xff::\n", {}, None),
])
def test_the_memory_cgroups_room_leaves_out_the_page_cache(monkeypatch, cgroup, files, room):
    # The use counted the cache of files read (5.7 of 7.4 GB here): a read of a file whose
    # cache filled the group was refused for want of memory the kernel would reclaim.
    import io as stdio

    from pysparse_hpc import _sputils
    contents = dict(files, **{"/proc/self/cgroup": cgroup})

    def fake_open(path, *args, **kwargs):
        if path not in contents:
            raise FileNotFoundError(path)
        return stdio.StringIO(contents[path])
    monkeypatch.setattr(_sputils, "open", fake_open, raising=False)
    assert _sputils._cgroup_room() == room
