"""Files: the shared .npz layout, Matrix Market, and what happens with bad files."""
import errno
import io
import os
import zipfile

import numpy as np
import pytest
import scipy.io
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc.io import load_npz, read_matrix_market, save_npz, write_matrix_market

from .conftest import DATA_DIR, random_scipy
from .reference import assert_same_csr


def test_load_shared_suitesparse(suitesparse_path):
    A = load_npz(suitesparse_path)
    S = scipy.sparse.load_npz(suitesparse_path)
    assert_same_csr(A, S)
    assert A.index_dtype == np.int64  # the file stores int64 indptr; scipy's rule keeps it
    assert load_npz(suitesparse_path, index_dtype=np.int32).index_dtype == np.int32


def test_load_graph_layout():
    path = DATA_DIR / "pubmed_structure.npz"
    if not path.exists():
        pytest.skip(f"{path} not present")
    adj = load_npz(path)          # falls back to the adj_ prefix
    assert adj.shape == (19717, 19717) and adj.nnz == 88648
    feats = load_npz(path, prefix="partial_feat_")
    assert feats.shape == (1060, 500)


def test_save_load_round_trip(tmp_path, rng):
    A = sph.csr_array(random_scipy(rng, (30, 20), 0.2), dtype=np.float32)
    save_npz(tmp_path / "a.npz", A)
    B = load_npz(tmp_path / "a.npz")
    assert_same_csr(B, A.to_scipy())
    assert B.dtype == np.float32
    assert_same_csr(A, scipy.sparse.load_npz(tmp_path / "a.npz"))  # readable by scipy
    assert isinstance(scipy.sparse.load_npz(tmp_path / "a.npz"), scipy.sparse.sparray)


def test_matrix_market_round_trip(tmp_path, rng):
    S = random_scipy(rng, (25, 17), 0.2)
    A = sph.csr_array(S)
    write_matrix_market(tmp_path / "a.mtx", A, comment="test matrix")
    B = read_matrix_market(tmp_path / "a.mtx")
    np.testing.assert_allclose(B.toarray(), S.toarray(), rtol=1e-15)
    assert B.has_canonical_format


def test_matrix_market_symmetric_and_pattern(tmp_path):
    (tmp_path / "s.mtx").write_text(
        "%%MatrixMarket matrix coordinate pattern symmetric\n3 3 2\n2 1\n3 3\n")
    A = read_matrix_market(tmp_path / "s.mtx")
    np.testing.assert_array_equal(A.toarray(), [[0, 1, 0], [1, 0, 0], [0, 0, 1]])


def test_matrix_market_writer_refuses_what_scipy_would_lose(tmp_path):
    upper = sph.csr_array(np.triu(np.ones((3, 3))))
    for symmetry in ("symmetric", "skew-symmetric"):
        # scipy would write one triangle and read back a mirrored matrix
        with pytest.raises(ValueError, match=f"symmetry='{symmetry}' but the matrix is not"):
            write_matrix_market(tmp_path / "a.mtx", upper, symmetry=symmetry)
    skew = sph.csr_array(np.array([[0.0, 2.0], [-2.0, 0.0]]))
    write_matrix_market(tmp_path / "k.mtx", skew, symmetry="skew-symmetric")
    np.testing.assert_array_equal(read_matrix_market(tmp_path / "k.mtx").toarray(),
                                  skew.toarray())
    with pytest.raises(FileNotFoundError, match="no directory"):   # scipy writes nothing
        write_matrix_market(tmp_path / "missing" / "a.mtx", upper)


def test_matrix_market_keeps_explicit_zeros_in_the_pattern(tmp_path):
    """scipy's symmetry detection ignores stored zeros: a zero at (0, 1) without its mirror was
    lost with the upper triangle, one at (1, 0) came back mirrored; a declared symmetry was
    accepted the same way. The pattern is the graph the orderings and formats count."""
    def with_zero_at(row, col):
        rows, cols = [0, 1, row], [0, 1, col]
        return sph.csr_array((np.array([1.0, 1.0, 0.0]), (np.array(rows), np.array(cols))),
                             shape=(2, 2))
    for A in (with_zero_at(0, 1), with_zero_at(1, 0)):
        write_matrix_market(tmp_path / "z.mtx", A)
        assert "general" in (tmp_path / "z.mtx").read_text().splitlines()[0]
        back = read_matrix_market(tmp_path / "z.mtx")
        assert back.nnz == 3
        np.testing.assert_array_equal(back.indices, A.canonical().indices)
        with pytest.raises(ValueError, match="symmetry='symmetric' but the matrix is not"):
            write_matrix_market(tmp_path / "z.mtx", A, symmetry="symmetric")
    # Mirrored stored zeros are symmetric, and come back as stored.
    both = sph.csr_array((np.array([1.0, 0.0, 0.0]), (np.array([0, 0, 1]), np.array([0, 1, 0]))),
                         shape=(2, 2))
    write_matrix_market(tmp_path / "b.mtx", both)
    assert "symmetric" in (tmp_path / "b.mtx").read_text().splitlines()[0]
    assert read_matrix_market(tmp_path / "b.mtx").nnz == 3
    # A skew-symmetric matrix cannot store its diagonal: a stored zero there makes it general.
    skew = sph.csr_array((np.array([0.0, 2.0, -2.0]), (np.array([0, 0, 1]), np.array([0, 1, 0]))),
                         shape=(2, 2))
    write_matrix_market(tmp_path / "k.mtx", skew)
    assert "general" in (tmp_path / "k.mtx").read_text().splitlines()[0]
    assert read_matrix_market(tmp_path / "k.mtx").nnz == 3
    with pytest.raises(ValueError, match="not skew-symmetric"):
        write_matrix_market(tmp_path / "k.mtx", skew, symmetry="skew-symmetric")
    # Without stored zeros, detection is scipy's.
    for dense, kind in (([[1.0, 2.0], [2.0, 1.0]], "symmetric"),
                        ([[0.0, 2.0], [-2.0, 0.0]], "skew-symmetric"),
                        ([[1.0, 2.0], [3.0, 1.0]], "general")):
        write_matrix_market(tmp_path / "d.mtx", sph.csr_array(np.array(dense)))
        assert (tmp_path / "d.mtx").read_text().splitlines()[0].endswith(f"real {kind}")
        np.testing.assert_array_equal(read_matrix_market(tmp_path / "d.mtx").toarray(), dense)


def test_npz_files_written_by_scipy(tmp_path):
    """scipy stores the format as bytes; a COO file is refused by its format, a shape that is
    not two integers by its values."""
    matrix = scipy.sparse.csr_array(np.array([[0.0, 2.0], [3.0, 0.0]]))
    scipy.sparse.save_npz(tmp_path / "csr.npz", matrix)
    np.testing.assert_array_equal(load_npz(tmp_path / "csr.npz").toarray(), matrix.toarray())
    scipy.sparse.save_npz(tmp_path / "coo.npz", scipy.sparse.coo_array(matrix))
    with pytest.raises(ValueError, match="stores format 'coo'; only 'csr' is supported"):
        load_npz(tmp_path / "coo.npz")
    np.savez(tmp_path / "shape.npz", indptr=np.array([0, 1]), indices=np.array([0]),
             data=np.ones(1), shape=np.array([1.5, 2.7]))
    with pytest.raises(ValueError, match="expected two integers"):
        load_npz(tmp_path / "shape.npz")


def test_matrix_market_hermitian_and_nan_symmetry(tmp_path):
    """Real values: "hermitian" is "symmetric", checked as such; a NaN mirrored by a NaN is
    symmetric."""
    with pytest.raises(ValueError, match="symmetry='hermitian' but the matrix is not"):
        write_matrix_market(tmp_path / "h.mtx", sph.csr_array(np.array([[1.0, 2.0], [3.0, 4.0]])),
                            symmetry="hermitian")
    with pytest.raises(ValueError, match="symmetry must be one of"):
        write_matrix_market(tmp_path / "h.mtx", sph.csr_array(np.eye(2)), symmetry="upper")
    for symmetry, dense in (("hermitian", [[1.0, 2.0], [2.0, 4.0]]),
                            ("symmetric", [[np.nan, 2.0], [2.0, 1.0]])):
        write_matrix_market(tmp_path / "s.mtx", sph.csr_array(np.array(dense)), symmetry=symmetry)
        np.testing.assert_array_equal(read_matrix_market(tmp_path / "s.mtx").toarray(), dense)
        # the format defines hermitian for complex fields only: "real hermitian" was written
        assert scipy.io.mminfo(tmp_path / "s.mtx")[4:] == ("real", "symmetric")
    with pytest.raises(TypeError, match="comment must be a string, got int"):
        write_matrix_market(tmp_path / "c.mtx", sph.csr_array(np.eye(2)), comment=5)
    with pytest.raises(ValueError, match="not skew-symmetric"):  # its diagonal is not written
        write_matrix_market(tmp_path / "k.mtx",
                            sph.csr_array(np.array([[np.nan, 2.0], [-2.0, 0.0]])),
                            symmetry="skew-symmetric")


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_npz(tmp_path / "nope.npz")
    with pytest.raises(FileNotFoundError):
        read_matrix_market(tmp_path / "nope.mtx")
    (tmp_path / "bad.npz").write_bytes(b"this is not a zip archive")
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_npz(tmp_path / "bad.npz")
    np.savez(tmp_path / "keys.npz", foo=np.arange(3))
    with pytest.raises(ValueError, match="missing keys"):
        load_npz(tmp_path / "keys.npz")
    np.savez(tmp_path / "inconsistent.npz", indptr=np.array([0, 5]), indices=np.array([0]),
             data=np.array([1.0]), shape=np.array([1, 1]))
    with pytest.raises(ValueError, match="indptr\\[-1\\] is 5"):
        load_npz(tmp_path / "inconsistent.npz")
    (tmp_path / "bad.mtx").write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1\n")
    with pytest.raises(ValueError, match="not a valid Matrix Market file"):
        read_matrix_market(tmp_path / "bad.mtx")
    with pytest.raises(IsADirectoryError):
        load_npz(tmp_path)
    with pytest.raises(TypeError, match="pysparse_hpc sparse array"):
        save_npz(tmp_path / "x.npz", np.eye(2))
    # scipy's arrays share our class names: said whose, and how to convert
    for write in (save_npz, write_matrix_market):
        with pytest.raises(TypeError, match=r"got scipy.sparse's csr_array \(wrap it with "
                                            r"pysparse_hpc.csr_array\)"):
            write(tmp_path / "x.npz", scipy.sparse.csr_array(np.eye(2)))


def _npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _zip(path, members):
    with zipfile.ZipFile(path, "w") as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)


def test_damaged_or_foreign_members_are_value_errors(tmp_path):
    good = {"indptr.npy": _npy_bytes(np.array([0, 2])),
            "indices.npy": _npy_bytes(np.array([0, 1], dtype=np.int32)),
            "data.npy": _npy_bytes(np.array([1.0, 2.0])),
            "shape.npy": _npy_bytes(np.array([1, 2]))}
    _zip(tmp_path / "ok.npz", good)
    assert load_npz(tmp_path / "ok.npz").toarray().tolist() == [[1.0, 2.0]]
    # A .npy header cut short (NumPy's parse of it raised a tokenizer error).
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (2,"
    header += b" " * (117 - len(header)) + b"\n"
    garbled = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 16
    _zip(tmp_path / "garbled.npz", dict(good, **{"data.npy": garbled}))
    with pytest.raises(ValueError, match="garbled.npz' has a corrupt member 'data'"):
        load_npz(tmp_path / "garbled.npz")
    # Members that are not .npy at all come back from NumPy as raw bytes.
    _zip(tmp_path / "foreign.npz", dict(good, **{"format.npy": b"csr"}))
    with pytest.raises(ValueError, match="member 'format' that is not a NumPy array"):
        load_npz(tmp_path / "foreign.npz")
    _zip(tmp_path / "foreign2.npz", dict(good, **{"indptr.npy": b"0 2"}))
    with pytest.raises(ValueError, match="member 'indptr' that is not a NumPy array"):
        load_npz(tmp_path / "foreign2.npz")
    with pytest.raises(TypeError, match="prefix must be a string"):
        load_npz(tmp_path / "ok.npz", prefix=1)
    _zip(tmp_path / "huge.npz",
         dict(good, **{"shape.npy": _npy_bytes(np.array([1, 2**64 - 1], dtype=np.uint64))}))
    with pytest.raises(ValueError, match="beyond int64 indices"):
        load_npz(tmp_path / "huge.npz")


def _fail_half_way(real_writer):
    """A writer that leaves half a file behind and then fails, as on a full disk."""
    def writer(target, *args, **kwargs):
        buffer = io.BytesIO()
        real_writer(buffer, *args, **kwargs)
        content = buffer.getvalue()
        with open(target, "wb") as file:
            file.write(content[:len(content) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    return writer


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch, rng):
    old = sph.csr_array(random_scipy(rng, (6, 5), 0.5))
    new = sph.csr_array(random_scipy(rng, (30, 30), 0.3))
    save_npz(tmp_path / "a.npz", old)
    write_matrix_market(tmp_path / "a.mtx", old)
    monkeypatch.setattr(np, "savez_compressed", _fail_half_way(np.savez_compressed))
    monkeypatch.setattr(scipy.io, "mmwrite", _fail_half_way(scipy.io.mmwrite))
    for name in ("a", "b"):
        with pytest.raises(OSError, match="No space left"):
            save_npz(tmp_path / f"{name}.npz", new)
        with pytest.raises(OSError, match="No space left"):
            write_matrix_market(tmp_path / f"{name}.mtx", new)
    # The earlier files are intact and nothing else was left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mtx", "a.npz"]
    assert_same_csr(load_npz(tmp_path / "a.npz"), old)
    np.testing.assert_array_equal(read_matrix_market(tmp_path / "a.mtx").toarray(),
                                  old.toarray())


def test_writes_append_the_extension_and_keep_the_umask(tmp_path):
    A = sph.csr_array(np.array([[1.0, 0.0], [2.0, 3.0]]))
    save_npz(tmp_path / "m", A)
    write_matrix_market(tmp_path / "m", A)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mtx", "m.npz"]
    (tmp_path / "plain").write_bytes(b"")  # the permissions an ordinary open() gives
    mode = (tmp_path / "plain").stat().st_mode
    assert (tmp_path / "m.npz").stat().st_mode == (tmp_path / "m.mtx").stat().st_mode == mode
    np.testing.assert_array_equal(load_npz(tmp_path / "m.npz").toarray(), A.toarray())
    np.testing.assert_array_equal(read_matrix_market(tmp_path / "m.mtx").toarray(), A.toarray())
    for name in ("m.npz", "m.mtx"):  # an overwritten file keeps its permissions
        os.chmod(tmp_path / name, 0o600)
    save_npz(tmp_path / "m", A)
    write_matrix_market(tmp_path / "m", A)
    assert [(tmp_path / name).stat().st_mode & 0o777 for name in ("m.npz", "m.mtx")] == [0o600] * 2
    buffer = io.BytesIO()
    save_npz(buffer, A)
    buffer.seek(0)
    assert np.load(buffer)["data"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(FileNotFoundError, match="no directory"):
        save_npz(tmp_path / "missing" / "m.npz", A)


def test_a_bad_index_dtype_is_blamed_on_the_argument_not_the_file(tmp_path):
    path = tmp_path / "a.npz"
    save_npz(path, sph.csr_array(np.eye(3)))
    with pytest.raises(TypeError, match="index_dtype must be int32 or int64") as info:
        load_npz(path, index_dtype=np.int16)
    assert "invalid CSR matrix" not in str(info.value)
    torch = pytest.importorskip("torch")
    assert load_npz(str(path), index_dtype=torch.int64).index_dtype == np.int64


def test_load_npz_reads_an_open_binary_file_as_scipy_does(tmp_path):
    """save_npz wrote to a file object but load_npz took paths only (a TypeError from
    os.fspath), where scipy.sparse.load_npz reads either."""
    import io
    A = sph.csr_array(np.array([[1.0, 0.0], [2.0, 3.0]]))
    buffer = io.BytesIO(b"header")
    buffer.seek(0, 2)
    save_npz(buffer, A)
    buffer.seek(len(b"header"))   # read from where the archive starts, as NumPy does
    B = load_npz(buffer)
    np.testing.assert_array_equal(B.toarray(), A.toarray())
    buffer.seek(len(b"header"))
    np.testing.assert_array_equal(scipy.sparse.load_npz(buffer).toarray(), A.toarray())
    with open(tmp_path / "a.npz", "wb") as handle:
        save_npz(handle, A)
    with open(tmp_path / "a.npz", "rb") as handle:
        assert load_npz(handle).nnz == 3 and not handle.closed
        handle.seek(0)
        with pytest.raises(ValueError, match="has no CSR matrix under prefix 'feat_'"):
            load_npz(handle, prefix="feat_")
    with pytest.raises(ValueError, match="'<BytesIO>' is not a readable .npz archive"):
        load_npz(io.BytesIO(b"not a zip"))


def test_matrix_market_refuses_rows_beyond_memory_before_reading(tmp_path):
    """A three-line file declaring 3e9 rows had the process killed (or NumPy's MemoryError,
    naming neither the file nor the rows) while converting to CSR: the row pointer is not in
    the file. It is refused first, naming both."""
    path = tmp_path / "huge.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n"
                    "10000000000000 2 1\n9999999999999 2 5\n")
    with pytest.raises(MemoryError, match=r"huge.mtx' declares 10000000000000 rows, whose row "
                                          r"pointers need about 1\.49e\+05 GiB"):
        read_matrix_market(path)


def test_save_npz_takes_a_bool_for_compressed(tmp_path):
    """A string such as "no" is truthy: it wrote a compressed file."""
    A = sph.csr_array(np.eye(3))
    with pytest.raises(TypeError, match="compressed must be a bool, got str 'no'"):
        save_npz(tmp_path / "a.npz", A, compressed="no")
    assert not (tmp_path / "a.npz").exists()
    save_npz(tmp_path / "a.npz", A, compressed=np.False_)
    assert_same_csr(load_npz(tmp_path / "a.npz"), A.to_scipy())


def test_matrix_market_from_file_objects(tmp_path):
    """File objects are read from their position, as by scipy's mmread (a raw TypeError from
    os.fspath before); the messages name the object, not the copy the checks read."""
    A = sph.csr_array(np.array([[0.0, 1.5], [-2.0, 0.0]]))
    binary = io.BytesIO(b"prefix")
    binary.seek(6)
    write_matrix_market(binary, A)
    binary.seek(6)
    np.testing.assert_array_equal(read_matrix_market(binary).toarray(), A.toarray())
    text = io.StringIO(binary.getvalue()[6:].decode())
    np.testing.assert_array_equal(read_matrix_market(text).toarray(), A.toarray())
    bad = io.BytesIO(b"%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1-2\n")
    with pytest.raises(ValueError, match=r"^'<BytesIO object>' is not a valid Matrix Market "
                                         r"file: b'1-2'"):
        read_matrix_market(bad)
    path = tmp_path / "named.mtx"
    path.write_bytes(b"%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n")
    with open(path, "rb") as named, pytest.raises(ValueError, match=f"^{str(path)!r} .*"
                                                                    f"declares 2 entries"):
        read_matrix_market(named)

    class Odd:
        def read(self, size=-1):
            return 5
    with pytest.raises(TypeError, match="read\\(\\) gives bytes or str, got int"):
        read_matrix_market(Odd())


def test_a_file_object_is_copied_no_further_than_its_header_allows(tmp_path):
    """The stream was copied whole before any check: ``gzip.open`` of a bomb filled the disk.
    A MemoryError named the temporary copy instead of the file object."""
    import gzip
    blank = gzip.compress(b"\n" * (16 << 20))
    path = tmp_path / "bomb.mtx.gz"
    path.write_bytes(gzip.compress(b"%%MatrixMarket matrix coordinate real general\n"
                                   b"2 2 1\n1 1 5\n") + blank * 8)
    with gzip.open(path, "rb") as stream, pytest.raises(
            ValueError, match=f"^{str(path)!r} is not a valid Matrix Market file: it runs past "
                              f"69206208 bytes, more than the 1 entries its header declares"):
        read_matrix_market(stream)
    dense = io.BytesIO(b"%%MatrixMarket matrix array real general\n1000000 1000000\n1\n")
    with pytest.raises(MemoryError, match=r"^'<BytesIO object>' declares a dense 1000000 x "
                                          r"1000000 array"):
        read_matrix_market(dense)


def test_a_single_array_file_is_named_as_not_an_npz_archive(tmp_path):
    """An .npy file with a zip archive after it passes as a zip file (its directory is at the
    end), while np.load goes by the first bytes and returns the array: named, not read."""
    import io
    import zipfile
    tail = io.BytesIO()
    with zipfile.ZipFile(tail, "w") as archive:
        archive.writestr("data.npy", b"")
    path = tmp_path / "dense.npz"
    with open(path, "wb") as handle:
        np.save(handle, np.eye(3))
        handle.write(tail.getvalue())
    assert zipfile.is_zipfile(path)
    with pytest.raises(ValueError, match="holds a single array, not an .npz archive"):
        load_npz(path)


def test_a_path_of_the_wrong_type_is_named():
    """os.fspath's "expected str, bytes or os.PathLike object, not int" named no argument."""
    import pysparse_hpc as sph
    from pysparse_hpc.distributed import Checkpointer
    A = sph.csr_array(np.eye(2))
    for call, message in (
            (lambda: save_npz(3, A), r"path must be a path \(str, bytes or os.PathLike\) or an "
                                     r"open file, got int 3"),
            (lambda: load_npz(3), "path must be a path"),
            (lambda: read_matrix_market(None), "path must be a path .* got NoneType None"),
            (lambda: sph.datasets.load_file(3), r"path must be a path \(str, bytes or "
                                                r"os.PathLike\), got int 3"),
            (lambda: Checkpointer(None), "directory must be a path .* got NoneType None")):
        with pytest.raises(TypeError, match=message):
            call()
