"""Blocked formats (ME-BCRS 8x1 and 16x1) against the layout's definition and scipy."""
import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st

import pysparse_hpc as sph
from pysparse_hpc._blocked import value_positions
from pysparse_hpc.io import load_npz

from .conftest import random_scipy
from .reference import assert_same_csr, reference_blocked

GEOMETRIES = [(8, 8), (8, 4), (8, 3), (16, 8), (4, 2), (1, 1), (12, 5)]


def check_layout(blocked, S):
    """The four arrays equal the reference built from the definition, and the trip back is exact."""
    dense = S.toarray()
    stored = np.zeros(S.shape, dtype=bool)
    coo = S.tocoo()
    stored[coo.row, coo.col] = True
    offsets, col_idx, values, mask = reference_blocked(dense, stored, blocked.window,
                                                       blocked.block_width)
    np.testing.assert_array_equal(blocked.row_window_offset, offsets)
    np.testing.assert_array_equal(blocked.col_idx, col_idx)
    np.testing.assert_array_equal(blocked.values, values)
    np.testing.assert_array_equal(blocked.vector_mask, mask)
    assert blocked.nnz == S.nnz
    assert_same_csr(blocked.tocsr(), S)


@pytest.mark.parametrize("window,block_width", GEOMETRIES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (8, 8), (17, 9), (33, 40), (5, 70)])
def test_layout_matches_definition(rng, window, block_width, shape):
    S = random_scipy(rng, shape, 0.25)
    check_layout(sph.csr_array(S).to_blocked(window, block_width), S)


def test_mebcrs_is_the_8_row_case(rng):
    S = random_scipy(rng, (20, 20), 0.2)
    A = sph.csr_array(S)
    M = A.to_mebcrs(block_width=4)
    assert isinstance(M, sph.mebcrs_array) and M.format == "mebcrs"
    assert (M.window, M.block_width) == (8, 4)
    B = A.to_blocked(window=16)
    assert type(B) is sph.blocked_array and B.window == 16
    assert isinstance(sph.mebcrs_array(S), sph.mebcrs_array)
    assert_same_csr(sph.mebcrs_array(S).tocsr(), S)


def test_compact_last_block():
    # One window, 11 vectors, k = 4: blocks of 4, 4 and a compact last block of 3.
    dense = np.arange(1, 8 * 11 + 1, dtype=np.float64).reshape(8, 11)
    M = sph.csr_array(dense).to_mebcrs(block_width=4)
    assert M.values.size == 8 * 11  # nothing padded
    np.testing.assert_array_equal(M.get_block(0, 0), dense[:, 0:4])
    np.testing.assert_array_equal(M.get_block(0, 2), dense[:, 8:11])
    assert M.get_block(0, 2).shape == (8, 3)
    np.testing.assert_array_equal(M.values[-24:], dense[:, 8:11].ravel())
    cols, vectors = M.window_vectors(0)
    np.testing.assert_array_equal(cols, np.arange(11))
    np.testing.assert_array_equal(vectors, dense)
    with pytest.raises(IndexError):
        M.get_block(0, 3)
    with pytest.raises(IndexError):
        M.window_vectors(1)


def test_explicit_zeros_survive_the_round_trip():
    S = scipy.sparse.csr_array(
        (np.array([2.0, 0.0, 0.0]), np.array([0, 1, 3]), np.array([0, 2, 3])), shape=(2, 4))
    M = sph.csr_array(S).to_mebcrs()
    assert M.nnz == 3
    assert_same_csr(M.tocsr(), S)


def test_empty_rows_windows_and_nnz_zero(rng):
    dense = np.zeros((30, 12))
    dense[0, 3] = 1.0
    dense[29, 11] = 2.0  # windows 1 and 2 are empty
    M = sph.csr_array(dense).to_mebcrs()
    np.testing.assert_array_equal(M.row_window_offset, [0, 1, 1, 1, 2])
    np.testing.assert_array_equal(M.tocsr().toarray(), dense)
    for shape in [(0, 0), (0, 4), (4, 0), (9, 9)]:
        Z = sph.csr_array(shape).to_blocked(window=16)
        assert Z.nnz == 0 and Z.n_vectors == 0 and Z.tocsr().shape == shape


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_dtypes(rng, dtype, index_dtype):
    S = random_scipy(rng, (19, 13), 0.3)
    A = sph.csr_array(S, dtype=dtype, index_dtype=index_dtype)
    M = A.to_mebcrs()
    assert M.dtype == dtype and M.index_dtype == index_dtype
    assert M.row_window_offset.dtype == index_dtype
    back = M.tocsr()
    assert back.dtype == dtype and back.index_dtype == index_dtype
    np.testing.assert_array_equal(back.data, A.data)
    np.testing.assert_array_equal(back.indices, A.indices)


def test_noncanonical_input_is_canonicalized_without_touching_it(rng):
    S = random_scipy(rng, (25, 25), 0.2, duplicates=True)
    A = sph.csr_array(S)
    indices_before = A.indices.copy()
    M = A.to_mebcrs()
    np.testing.assert_array_equal(A.indices, indices_before)
    expected = S.copy()
    expected.sum_duplicates()
    assert_same_csr(M.tocsr(), expected, rtol=1e-12)


def test_raw_construction_and_validation():
    dense = np.array([[1.0, 0, 2], [0, 0, 3], [4, 0, 0]])
    M = sph.csr_array(dense).to_blocked(window=2, block_width=2)
    raw = (M.values, M.col_idx, M.row_window_offset, M.vector_mask)
    R = sph.blocked_array(raw, shape=(3, 3), window=2, block_width=2)
    np.testing.assert_array_equal(R.toarray(), dense)
    # Without a mask the nonzero values are the entries (FlashSparse's pattern convention).
    U = sph.blocked_array(raw[:3] + (None,), shape=(3, 3), window=2, block_width=2)
    np.testing.assert_array_equal(U.vector_mask, M.vector_mask)
    with pytest.raises(ValueError, match="shape is required"):
        sph.blocked_array(raw, window=2, block_width=2)
    with pytest.raises(ValueError, match="row_window_offset has length"):
        sph.blocked_array((M.values, M.col_idx, M.row_window_offset[:-1], M.vector_mask),
                          shape=(3, 3), window=2, block_width=2)
    bad_cols = M.col_idx.copy()
    bad_cols[0] = 9
    with pytest.raises(ValueError, match="col_idx"):
        sph.blocked_array((M.values, bad_cols, M.row_window_offset, M.vector_mask),
                          shape=(3, 3), window=2, block_width=2)
    bad_values = M.values.copy()
    bad_values[bad_values == 0] = 5.0  # a value where the mask says padding
    with pytest.raises(ValueError, match="vector_mask marks no stored entry"):
        sph.blocked_array((bad_values, M.col_idx, M.row_window_offset, M.vector_mask),
                          shape=(3, 3), window=2, block_width=2)
    with pytest.raises(TypeError, match="vector_mask"):
        sph.blocked_array(raw[:3] + (M.vector_mask.astype(np.int64),), shape=(3, 3), window=2,
                          block_width=2)
    M.check_format(full_check=True)


def mask_problems_reference(values, row_window_offset, vector_mask, n_rows, window,
                            block_width):
    """The problems the full check names, in its order, by NumPy on the layout's tables."""
    n_vectors = row_window_offset[-1]
    bits = np.unpackbits(vector_mask.reshape(n_vectors, -1), axis=1, bitorder="little")
    bits = bits.astype(bool)
    n_windows = row_window_offset.size - 1
    last_rows = n_rows - (n_windows - 1) * window
    last = slice(int(row_window_offset[-2]), int(row_window_offset[-1]))
    padding = values[value_positions(row_window_offset, window, block_width)][
        ~bits[:, :window]]
    return [name for name, found in (
        ("holds none", not bits.any(axis=1).all()),
        ("beyond the window height", bits[:, window:].any()),
        ("rows beyond the matrix", last_rows < window and bits[last, last_rows:].any()),
        ("marks no stored entry", np.any(padding != 0)))
        if found]


@pytest.mark.parametrize("seed", range(30))
def test_the_mask_check_names_what_a_plain_reference_finds(seed):
    """The full check of a vector mask against the values runs in one compiled pass; on
    arrays corrupted at random places (a mask bit cleared or set anywhere, including past the
    window and the matrix, a padding value set to a number, NaN or -0.0), it raises what the
    NumPy reference of the layout finds first, whichever window holds the problem."""
    rng = np.random.default_rng(seed)
    window, block_width = [(8, 8), (8, 3), (12, 5), (3, 2), (16, 4), (33, 4)][seed % 6]
    dtype = [np.float16, np.float32, np.float64][seed % 3]
    n_rows = int(rng.integers(1, 4 * window))
    S = random_scipy(rng, (n_rows, 9), 0.3)
    B = sph.csr_array(S).astype(dtype).to_blocked(window, block_width)
    if B.n_vectors == 0:
        return
    values, mask = B.values.copy(), B.vector_mask.copy()
    for _ in range(int(rng.integers(1, 3))):
        kind = rng.integers(4)
        if kind == 0:
            mask[rng.integers(mask.size)] ^= np.uint8(1 << rng.integers(8))
        elif kind == 1:
            mask[rng.integers(mask.size)] = 0
        else:
            values[rng.integers(values.size)] = rng.choice([5.0, np.nan, -0.0, 0.0])
    expected = mask_problems_reference(values, B.row_window_offset, mask, n_rows, window,
                                       block_width)
    arrays = (values, B.col_idx, B.row_window_offset, mask)
    if not expected:
        sph.blocked_array(arrays, shape=B.shape, window=window, block_width=block_width)
        return
    with pytest.raises(ValueError, match=expected[0]):
        sph.blocked_array(arrays, shape=B.shape, window=window, block_width=block_width)


def test_the_full_check_of_a_blocked_array_allocates_a_fraction_of_it():
    """The check built a table of every value's int64 position and gathered the values by it:
    5.2 times the arrays checked, at every load of a blocked array from raw arrays or a
    file. In one pass it keeps a flag per window (and the structure checks' arrays)."""
    import tracemalloc
    rng = np.random.default_rng(0)
    n, m = 20_000, 200_000
    A = sph.csr_array((rng.random(m).astype(np.float32),
                       (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n),
                      index_dtype=np.int32)
    B = A.to_mebcrs()
    held = sum(a.nbytes for a in (B.values, B.col_idx, B.row_window_offset, B.vector_mask))
    B.check_format(full_check=True)   # compiled or loaded
    tracemalloc.start()
    try:
        sph.mebcrs_array((B.values, B.col_idx, B.row_window_offset, B.vector_mask),
                         shape=B.shape)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * held, peak / held


def test_bad_geometry():
    A = sph.csr_array(np.eye(3))
    with pytest.raises(ValueError, match="window"):
        A.to_blocked(window=0)
    with pytest.raises(TypeError, match="block_width"):
        A.to_blocked(window=8, block_width=2.5)
    with pytest.raises(ValueError, match="at most 64"):
        A.to_blocked(window=65)
    with pytest.raises(TypeError, match="window must be an integer, got bool"):
        sph.block_stats(A, window=True)
    with pytest.raises(ValueError, match="block_width must be at most 2147483647"):
        sph.block_stats(A, block_width=2 ** 63)
    # A blocked array's to_blocked checks before it compares with its own geometry: 8.0 and
    # True equal 8 and 1, and were taken, where a csr_array refuses them.
    M = A.to_mebcrs(block_width=1)
    with pytest.raises(TypeError, match="window must be an integer, got float"):
        M.to_blocked(window=8.0, block_width=1)
    with pytest.raises(TypeError, match="block_width must be an integer, got bool"):
        M.to_blocked(window=8, block_width=True)
    # The mask's dtype is a TypeError, its shape a ValueError (csr_array's rule)
    mask = M.vector_mask
    with pytest.raises(ValueError, match=r"vector_mask must be 1-D, got shape \(3, 1\)"):
        sph.mebcrs_array((M.values, M.col_idx, M.row_window_offset, mask[:, None]),
                         shape=M.shape, block_width=1)
    with pytest.raises(TypeError, match="vector_mask must be a uint8 array, got dtype int8"):
        sph.mebcrs_array((M.values, M.col_idx, M.row_window_offset, mask.view(np.int8)),
                         shape=M.shape, block_width=1)


@pytest.mark.parametrize("window,block_width", [(33, 4), (64, 16), (64, 1)])
def test_tall_windows_with_multibyte_masks(rng, window, block_width):
    S = random_scipy(rng, (150, 40), 0.1)
    B = sph.csr_array(S).to_blocked(window, block_width)
    assert B.vector_mask.size == B.n_vectors * ((window + 7) // 8)
    check_layout(B, S)


def test_transpose_astype_copy_and_reblock(rng):
    S = random_scipy(rng, (21, 11), 0.3)
    M = sph.csr_array(S).to_mebcrs(block_width=4)
    T = M.T
    assert isinstance(T, sph.mebcrs_array) and T.shape == (11, 21) and T.block_width == 4
    np.testing.assert_array_equal(T.toarray(), S.toarray().T)
    H = M.astype(np.float16)
    assert H.dtype == np.float16 and isinstance(H, sph.mebcrs_array)
    C = M.copy()
    C.values[:] = 0
    assert np.any(M.values != 0)
    R = M.to_blocked(window=16, block_width=8)
    np.testing.assert_array_equal(R.toarray(), S.toarray())
    assert M.to_blocked(window=8, block_width=4) is M
    assert "mebcrs_array" in repr(M) and "window 8" in repr(M)
    assert M.nbytes == (M.values.nbytes + M.col_idx.nbytes + M.row_window_offset.nbytes
                        + M.vector_mask.nbytes)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.floats(0, 0.5), st.booleans(),
       st.sampled_from(GEOMETRIES), st.sampled_from([np.int32, np.int64]), st.integers(0, 2**31))
def test_hypothesis_round_trip(n_rows, n_cols, density, duplicates, geometry, index_dtype, seed):
    rng = np.random.default_rng(seed)
    S = random_scipy(rng, (n_rows, n_cols), density, duplicates=duplicates)
    window, block_width = geometry
    B = sph.csr_array(S, index_dtype=index_dtype).to_blocked(window, block_width)
    expected = S.copy()
    expected.sum_duplicates()
    check = (lambda blocked: check_layout(blocked, expected)) if not duplicates else None
    if check:
        check(B)
    assert_same_csr(B.tocsr(), expected, rtol=1e-12 if duplicates else 0.0)
    scipy_again = B.to_scipy()
    np.testing.assert_allclose(scipy_again.toarray(), S.toarray(), rtol=1e-12)


@pytest.mark.parametrize("window,block_width", [(8, 8), (8, 4), (16, 8)])
def test_every_shared_matrix_round_trips_exactly(suitesparse_path, window, block_width):
    S = scipy.sparse.load_npz(suitesparse_path).tocsr()
    A = load_npz(suitesparse_path)
    B = A.to_blocked(window, block_width)
    assert B.nnz == S.nnz  # explicit zeros (bayer10 keeps 23,332) included
    assert_same_csr(B.tocsr(), S)
    stats = sph.block_stats(A, window=window, block_width=block_width)
    assert stats.n_vectors == B.n_vectors and stats.n_windows == B.n_windows


def _blocked_arrays(M):
    return (M.row_window_offset, M.col_idx, M.values, M.vector_mask)


@pytest.mark.parametrize("window,block_width", [(8, 8), (8, 4), (16, 8), (1, 1), (33, 4),
                                                (64, 16)])
@pytest.mark.parametrize("shape", [(1, 1), (17, 9), (40, 33), (130, 300), (5, 700)])
def test_int32_and_int64_indices_give_the_same_arrays(rng, window, block_width, shape):
    """Every ordering path (counting sort up to 2 threads with 32-bit keys, parallel merge
    beyond, 64-bit keys where the columns are unknown) gives one result for both index
    dtypes, each with the input's index dtype."""
    from pysparse_hpc._cy import blocked as _blocked

    S = random_scipy(rng, shape, 0.2)
    A32 = sph.csr_array(S, index_dtype=np.int32).canonical()
    A64 = sph.csr_array(S, index_dtype=np.int64).canonical()
    reference = [np.asarray(a) for a in _blocked_arrays(A64.to_blocked(window, block_width))]
    for A in (A32, A64):
        for threads in (1, 2, 3):
            for n_cols in (A.shape[1], -1):
                arrays = _blocked.csr_to_blocked(A.indptr, A.indices, A.data, window,
                                                 block_width, threads, n_cols)
                for array, expected in zip(arrays, reference):
                    np.testing.assert_array_equal(array, expected)
                assert arrays[0].dtype == arrays[1].dtype == A.index_dtype
    M32 = A32.to_blocked(window, block_width)
    assert M32.index_dtype == np.int32
    check_layout(M32, S)


def test_the_counting_sort_is_kept_to_o_nnz_columns():
    """The counting sort zeroes and walks one counter per column: beyond 2 * nnz + 4096
    columns the merge orders the entries instead, in time and memory bounded by nnz."""
    from pysparse_hpc._cy import blocked as _blocked

    slack = _blocked.RADIX_SLACK_COLUMNS
    assert _blocked.ordering_path(2, 2 * 2 + slack, 2, 8, 1) == "radix"
    assert _blocked.ordering_path(2, 2 * 2 + slack + 1, 2, 8, 1) == "merge32"
    assert _blocked.ordering_path(2, 2**27, 2**26, 8, 1) == "radix"
    assert _blocked.ordering_path(2, 2**27, 2**26, 8, _blocked.RADIX_MAX_THREADS + 1) == "merge32"
    # 2 entries in 2**27 columns (1 GiB of counters for the counting sort) take the merge
    n_cols = 2**27
    A = sph.csr_array((np.array([1.0, 2.0]), np.array([0, n_cols - 1]), np.array([0, 1, 2])),
                      shape=(2, n_cols), index_dtype=np.int64)
    assert _blocked.ordering_path(2, n_cols, 2, 8, 1) == "merge32"
    np.testing.assert_array_equal(A.to_blocked(8, 8).col_idx, [0, n_cols - 1])


@pytest.mark.parametrize("window", [8, 16, 64])
def test_columns_beyond_the_64_bit_sort_keys(window):
    """The sort keys ``column << row_bits | row`` overflow int64 from column 2**(63 - row_bits)
    (2**60 for 8-row windows): the conversion renumbers the used columns instead, and the
    Cython pass refuses such a width rather than return garbage or a misleading MemoryError."""
    from pysparse_hpc._cy import blocked as _blocked

    n_cols = 2**60 + 10
    columns = [5, 2**60 + 3]
    A = sph.csr_array((np.array([1.0, 2.0]), np.array(columns), np.array([0, 1, 2])),
                      shape=(2, n_cols))
    B = A.to_blocked(window, 8)
    np.testing.assert_array_equal(B.col_idx, columns)
    B.check_format(full_check=True)
    assert_same_csr(B.tocsr(), A)
    limit = _blocked.key_column_limit(window)
    assert limit == 2**(63 - (window - 1).bit_length())
    for width in (n_cols, -1):
        with pytest.raises(ValueError, match=rf"at most 2\*\*\d+ = {limit} columns; renumber"):
            _blocked.csr_to_blocked(A.indptr, A.indices, A.data, window, 8, 1, width)
    # 2**61 + 1 columns shifted by 3 bits wrap to 8 in 64 bits: not a narrow (32-bit) width.
    assert _blocked.ordering_path(2, 2**61 + 1, 2, 8, 1) == "merge64"
    assert _blocked.ordering_path(2, 2**29, 2**28, 8, 1) == "radix"
    assert _blocked.ordering_path(2, 2**29 + 1, 2**28, 8, 1) == "merge64"


def test_int32_matches_int64_on_every_shared_matrix(suitesparse_path):
    A64 = load_npz(suitesparse_path, index_dtype=np.int64)
    A32 = load_npz(suitesparse_path, index_dtype=np.int32)
    M64, M32 = A64.to_mebcrs(), A32.to_mebcrs()
    assert M32.index_dtype == np.int32 and M64.index_dtype == np.int64
    for a, b in zip(_blocked_arrays(M32), _blocked_arrays(M64)):
        np.testing.assert_array_equal(a, b)
    assert_same_csr(M32.tocsr(), A64.to_scipy())


def test_raw_values_without_a_mask_get_the_mask_checks():
    """A mask made from the values is checked as a given one is: nonzeros in the padding
    rows past the matrix (which the kernels would write) are refused."""
    with pytest.raises(ValueError, match="by the nonzero values .* rows beyond the matrix"):
        sph.mebcrs_array((np.ones(8), np.array([1]), np.array([0, 1]), None), shape=(3, 4))
    values = np.zeros(8)
    values[:3] = 1
    built = sph.mebcrs_array((values, np.array([1]), np.array([0, 1]), None), shape=(3, 4))
    np.testing.assert_array_equal(built @ np.ones((4, 2)), np.ones((3, 2)))


@pytest.mark.parametrize("window, block_width", [(8, 8), (8, 3), (16, 8), (5, 2)])
def test_raw_values_without_a_mask_drop_vectors_of_zeros(window, block_width, rng):
    """With vector_mask=None the stored entries are the nonzero values, so a vector whose
    values are all zero (a stored zero, a zero edge weight) is dropped as the zeros are. It
    was refused, so such arrays could not be imported at all."""
    dense = rng.random((23, 9)) * (rng.random((23, 9)) < 0.3)
    dense[:, 8] = 0.0
    rows, cols = np.nonzero(dense)
    explicit_zeros = [0, 9, 20]                          # column 8's vectors: zeros only
    with_zeros = scipy.sparse.csr_array((np.r_[dense[rows, cols], np.zeros(3)],
                                         (np.r_[rows, explicit_zeros], np.r_[cols, 8, 8, 8])),
                                        shape=dense.shape)
    stored = sph.csr_array(with_zeros).to_blocked(window, block_width)
    by_vector = stored.values[value_positions(stored.row_window_offset, window, block_width)]
    assert np.any(~by_vector.any(axis=1)), "no vector of zeros to drop"
    before = [a.copy() for a in (stored.values, stored.col_idx, stored.row_window_offset)]
    for index_dtype in (np.int32, np.int64):
        built = sph.blocked_array((stored.values, stored.col_idx.astype(index_dtype),
                                   stored.row_window_offset.astype(index_dtype), None),
                                  shape=stored.shape, window=window, block_width=block_width)
        # the caller's arrays are read, not repacked in place
        for a, b in zip((stored.values, stored.col_idx, stored.row_window_offset), before):
            np.testing.assert_array_equal(a, b)
        expected = sph.csr_array(dense).to_blocked(window, block_width)
        assert built.index_dtype == index_dtype and built.nnz == expected.nnz
        for a, b in zip(_blocked_arrays(built), _blocked_arrays(expected)):
            np.testing.assert_array_equal(a, b)
    zeros_only = sph.mebcrs_array((np.zeros(8), np.array([1]), np.array([0, 1]), None),
                                  shape=(8, 4))
    assert zeros_only.n_vectors == 0 and zeros_only.nnz == 0
    np.testing.assert_array_equal(zeros_only.row_window_offset, [0, 0])


@pytest.mark.parametrize("seed", range(12))
def test_the_mask_read_from_the_values_marks_every_nonzero(seed):
    """Without a mask, a bit for every value other than +-0 (NaN included), read in one
    compiled pass: the same mask as the table of the values by vector, compared with 0."""
    rng = np.random.default_rng(seed)
    window, block_width = [(8, 8), (8, 3), (12, 5), (16, 4), (33, 4), (1, 1)][seed % 6]
    dtype = [np.float16, np.float32, np.float64][seed % 3]
    n_rows = int(rng.integers(1, 4 * window))
    B = sph.csr_array(random_scipy(rng, (n_rows, 11), 0.4)).astype(dtype).to_blocked(
        window, block_width)
    values = B.values.copy()
    table = value_positions(B.row_window_offset, window, block_width)
    mask = np.unpackbits(B.vector_mask.reshape(B.n_vectors, -1), axis=1,
                         bitorder="little")[:, :window].astype(bool)
    stored = table[mask]
    values[stored[rng.random(stored.size) < 0.2]] = -0.0    # entries that read as zeros
    values[stored[rng.random(stored.size) < 0.1]] = np.nan
    expected = values[table] != 0
    keep = expected.any(axis=1)
    built = sph.blocked_array((values, B.col_idx, B.row_window_offset, None), shape=B.shape,
                              window=window, block_width=block_width)
    got = np.unpackbits(built.vector_mask.reshape(built.n_vectors, -1), axis=1,
                        bitorder="little")[:, :window].astype(bool)
    np.testing.assert_array_equal(got, expected[keep])
    np.testing.assert_array_equal(built.col_idx, B.col_idx[keep])


def test_a_blocked_array_without_a_mask_is_read_without_a_table_of_its_values():
    """The mask read from the values took a table of every value's int64 position and the
    values gathered by it: 5 times the arrays, in FlashSparse's convention."""
    import tracemalloc
    rng = np.random.default_rng(0)
    n, m = 20_000, 200_000
    B = sph.csr_array((rng.random(m).astype(np.float32) + 0.5,
                       (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n),
                      index_dtype=np.int32).to_mebcrs()
    held = sum(a.nbytes for a in (B.values, B.col_idx, B.row_window_offset, B.vector_mask))
    raw = (B.values, B.col_idx, B.row_window_offset, None)
    sph.mebcrs_array(raw, shape=B.shape)   # compiled or loaded
    tracemalloc.start()
    try:
        built = sph.mebcrs_array(raw, shape=B.shape)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(built.vector_mask, B.vector_mask)
    assert peak < 0.5 * held, peak / held


@pytest.mark.parametrize("index_dtype", [np.uint32, np.uint64])
def test_raw_unsigned_indices_are_taken_and_checked(index_dtype):
    """Unsigned raw indices are taken as csr_array takes them (uint64 ones failed in NumPy's
    np.repeat), and their order is checked: a decreasing pair wrapped to a huge positive
    difference and passed, so unsorted columns came back as a CSR flagged canonical."""
    dense = np.zeros((16, 5))
    dense[[0, 3, 9], [1, 4, 2]] = [1.0, 2.0, 3.0]
    M = sph.csr_array(dense).to_mebcrs(block_width=1)
    for mask in (M.vector_mask, None):
        built = sph.mebcrs_array((M.values, M.col_idx.astype(index_dtype),
                                  M.row_window_offset.astype(index_dtype), mask),
                                 shape=(16, 5), block_width=1)
        np.testing.assert_array_equal(built.toarray(), dense)
    values = np.zeros(16)
    values[[0, 9]] = [1.0, 2.0]   # vector 0 at row 0, vector 1 at row 1 (one per block)
    with pytest.raises(ValueError, match="strictly ascending within each window"):
        sph.mebcrs_array((values, np.array([3, 1], index_dtype), np.array([0, 2]), None),
                         shape=(8, 5), block_width=1)
    values = np.zeros(24)
    values[[0, 8, 16]] = 1.0
    with pytest.raises(ValueError, match="row_window_offset must be non-decreasing"):
        sph.mebcrs_array((values, np.arange(3), np.array([0, 3, 2, 3], index_dtype), None),
                         shape=(24, 5), block_width=1)


@pytest.mark.parametrize("alpha, beta", [(np.inf, 0.0), (np.nan, 0.0), (1.0, np.inf)])
def test_sddmm_keeps_the_padding_zero_for_infinite_scalars(rng, alpha, beta):
    A = sph.csr_array(random_scipy(rng, (10, 9), 0.3)).to_mebcrs()
    x, y = rng.random((10, 3)), rng.random((9, 3))
    result = sph.sddmm(A, x, y, alpha=alpha, beta=beta)
    result.check_format(full_check=True)
    reference = sph.sddmm(A.tocsr(), x, y, alpha=alpha, beta=beta)
    np.testing.assert_array_equal(result.tocsr().toarray(), reference.toarray())


def test_raw_arrays_take_the_requested_index_dtype():
    """``index_dtype`` was ignored for raw arrays (int32 came back when int64 was asked for)
    and not even checked; it is honoured and validated as for CSR."""
    M = sph.csr_array(np.eye(10)).to_mebcrs()
    arrays = (M.values, M.col_idx, M.row_window_offset, M.vector_mask)
    wide = sph.mebcrs_array(arrays, shape=M.shape, index_dtype=np.int64)
    assert wide.index_dtype == np.int64 and wide.row_window_offset.dtype == np.int64
    assert wide.tocsr().index_dtype == np.int64
    np.testing.assert_array_equal(wide.toarray(), np.eye(10))
    narrow = sph.blocked_array((M.values, M.col_idx.astype(np.int64),
                                M.row_window_offset.astype(np.int64), None), shape=M.shape,
                               index_dtype=np.int32)
    assert narrow.index_dtype == np.int32 and narrow.row_window_offset.dtype == np.int32
    with pytest.raises(TypeError, match="index_dtype must be int32 or int64"):
        sph.mebcrs_array(arrays, shape=M.shape, index_dtype=np.float64)
    with pytest.raises(ValueError, match="index_dtype int32 cannot hold"):
        sph.mebcrs_array((np.zeros(0), np.zeros(0, np.int64), np.zeros(1, np.int64), None),
                         shape=(0, 2**31), index_dtype=np.int32)
