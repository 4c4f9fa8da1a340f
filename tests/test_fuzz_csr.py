"""csr_array against scipy.sparse on what differential fuzzing found, and a small seeded sweep.

The sweep builds every input from raw arrays (rows unsorted, repeated columns, explicit zeros,
NaN and infinities, int32 and int64 indices, empty dimensions) and hands scipy fresh copies:
scipy sorts and sums a shared non-canonical matrix in place, and sums duplicates inside
``astype``, both of which would change what it is compared against.
"""
import warnings

import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc import io as sph_io


def _with_duplicates():
    """Row 0 holds column 2 once and column 0 twice (1 + 4), unsorted: not canonical."""
    return (np.array([2.0, 1.0, 4.0, 5.0]), np.array([2, 0, 0, 1]), np.array([0, 3, 4]))


@pytest.mark.parametrize("stale", ["set by hand", "written in place"])
def test_a_kept_canonical_flag_that_lies_does_not_change_the_values(stale):
    # scipy lets the flag be set by hand and leaves it stale after a write into indices; its
    # toarray sums duplicates all the same. Ours let a duplicate overwrite its twin (4 for
    # 1 + 4 at (0, 0)), while A @ x, from the same arrays, summed them.
    data, indices, indptr = _with_duplicates()
    if stale == "set by hand":
        A = sph.csr_array((data, indices, indptr), shape=(2, 3))
        A.has_canonical_format = True
    else:
        A = sph.csr_array((data, np.array([0, 1, 2, 1]), indptr), shape=(2, 3))
        assert A.has_canonical_format
        A.indices[:] = indices                   # in place: the kept flag does not see it
        A.check_format(full_check=True)
        assert not A.has_canonical_format        # a full check reads it again
    S = scipy.sparse.csr_array((data.copy(), indices.copy(), indptr.copy()), shape=(2, 3))
    expected = S.toarray()
    np.testing.assert_array_equal(A.toarray(), expected)
    np.testing.assert_array_equal(A.toarray(), (A @ np.eye(3)))
    np.testing.assert_array_equal(A.T.toarray(), expected.T)
    if stale != "set by hand":   # canonical() takes a flag set by hand at its word, as scipy
        C = A.canonical()
        assert C is not A and C.has_canonical_format
        np.testing.assert_array_equal(C.indices, [0, 2, 1])
        np.testing.assert_array_equal(C.toarray(), expected)


def test_blocked_conversion_after_indices_written_in_place_and_checked():
    # The documented path after writing into indices: check_format(full_check=True), which
    # now forgets the kept flag. The conversion took canonical() on trust of the stale flag and
    # paired columns with the wrong values: the blocked layout needs sorted rows without
    # repeats.
    data, indices, indptr = _with_duplicates()
    A = sph.csr_array((data, np.array([0, 1, 2, 1]), indptr), shape=(2, 3))
    assert A.has_canonical_format
    A.indices[:] = indices
    A.check_format(full_check=True)
    expected = scipy.sparse.csr_array((data, indices.copy(), indptr.copy()), shape=(2, 3))
    for window in (8, 16):
        B = A.to_blocked(window=window, block_width=4)
        np.testing.assert_array_equal(B.toarray(), expected.toarray())
        assert B.nnz == 3
    assert sph.block_stats(A, window=8, block_width=4).nnz == 3


def test_opposite_infinities_summed_by_toarray_give_nan_without_a_warning():
    # canonical(), COO input and scipy all give NaN silently; toarray warned "invalid value".
    data, indices, indptr = np.array([np.inf, -np.inf, 1.0]), np.array([0, 0, 1]), [0, 3]
    A = sph.csr_array((data, indices, indptr), shape=(1, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dense = A.toarray()
    expected = scipy.sparse.csr_array((data, indices, indptr), shape=(1, 2)).toarray()
    np.testing.assert_array_equal(dense, expected)
    np.testing.assert_array_equal(A.canonical().data, [np.nan, 1.0])


# -- a small seeded sweep --------------------------------------------------------------------

_SHAPES = [(0, 0), (0, 3), (3, 0), (1, 1), (4, 5), (7, 3)]
_VALUES = [np.int8, np.int64, np.bool_, np.float16, np.float32, np.float64]


def _raw_input(rng, shape, value_dtype, index_dtype):
    """Raw CSR arrays with rows unsorted, repeated columns, explicit zeros and, for floats,
    a NaN or an infinity now and then."""
    n_rows, n_cols = shape
    nnz = int(rng.integers(0, 2 * n_rows * n_cols + 1)) if n_rows and n_cols else 0
    rows = np.sort(rng.integers(0, max(n_rows, 1), nnz))
    cols = rng.integers(0, max(n_cols, 1), nnz).astype(index_dtype)
    values = rng.integers(-3, 4, nnz).astype(value_dtype)      # zeros among them
    if np.dtype(value_dtype).kind == "f":
        values = (values * rng.standard_normal(nnz)).astype(value_dtype)
        if nnz and rng.random() < 0.3:
            values[rng.integers(nnz)] = rng.choice([np.nan, np.inf, -np.inf])
    indptr = np.zeros(n_rows + 1, dtype=index_dtype)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return values, cols, indptr, rows


def _scipy_values(values):
    """The values as scipy holds them (no float16 there; ours sums those in float32 too)."""
    return values.astype(np.float32 if values.dtype == np.float16 else np.float64)


def _product(indptr, cols, values, dense):
    """Raw ``A @ dense`` summed slot by slot, duplicates not merged first: scipy's product of
    the same arrays (its astype would merge them, changing inf - inf into a finite value)."""
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    out = np.zeros((indptr.size - 1, dense.shape[1]), dtype=dense.dtype)
    np.add.at(out, rows, values.astype(dense.dtype)[:, None] * dense[cols])
    return out


@pytest.mark.parametrize("seed", range(4))
def test_seeded_sweep_against_scipy(seed, tmp_path):
    rng = np.random.default_rng(seed)
    for shape in _SHAPES:
        value_dtype = _VALUES[rng.integers(len(_VALUES))]
        index_dtype = (np.int32, np.int64)[rng.integers(2)]
        values, cols, indptr, rows = _raw_input(rng, shape, value_dtype, index_dtype)
        dtype = values.dtype if values.dtype.kind == "f" else np.dtype(np.float64)

        def fresh():
            return scipy.sparse.csr_array((_scipy_values(values), cols.copy(), indptr.copy()),
                                          shape=shape)

        def close(ours, theirs):
            if dtype == np.float16:  # scipy summed in float32: ours rounds that once
                with np.errstate(over="ignore"):
                    theirs = np.asarray(theirs).astype(np.float16)
            np.testing.assert_allclose(np.asarray(ours, np.float64),
                                       np.asarray(theirs, np.float64),
                                       rtol=1e-3 if dtype == np.float16 else 1e-6, atol=1e-6)

        with np.errstate(over="ignore"):   # float16 sums beyond its range round to inf
            A = sph.csr_array((values, cols, indptr), shape=shape)
            assert A.dtype == dtype and A.shape == shape
            S = fresh()
            assert A.has_canonical_format == S.has_canonical_format
            assert A.has_sorted_indices == S.has_sorted_indices
            close(A.toarray(), S.toarray())
            canonical = fresh()
            canonical.sum_duplicates()
            C = A.canonical()
            np.testing.assert_array_equal(C.indptr, canonical.indptr)
            np.testing.assert_array_equal(C.indices, canonical.indices)
            close(C.data, canonical.data)
            close(A.T.toarray(), fresh().T.toarray())
            row, col, data = A.tocoo()
            np.testing.assert_array_equal(row, rows)
            np.testing.assert_array_equal(col, cols)
            # COO triplets (canonical, explicit zeros kept) and every scipy format
            B = sph.csr_array((values, (rows, cols)), shape=shape)
            np.testing.assert_array_equal(B.indices, canonical.indices)
            close(B.data, canonical.data)
            for fmt in ("csr", "csc", "coo", "lil", "dok"):
                close(sph.csr_array(fresh().asformat(fmt)).toarray(), S.toarray())
            # dense input: NaN stored, -0.0 and 0.0 not, as scipy
            dense = S.toarray()
            D = sph.csr_array(dense)
            Sd = scipy.sparse.csr_array(dense)
            np.testing.assert_array_equal(D.indices, Sd.indices)
            np.testing.assert_array_equal(D.indptr, Sd.indptr)
        for operand_dtype in (np.float32, np.float64):
            compute = np.result_type(A.dtype, operand_dtype, np.float32)
            for width in (None, 1, 5):
                X = rng.standard_normal((shape[1], width or 1)).astype(operand_dtype)
                with np.errstate(invalid="ignore"):
                    expected = _product(indptr, cols, values.astype(compute),
                                        X.astype(compute))
                got = A @ (X[:, 0] if width is None else X)
                assert got.dtype == compute
                np.testing.assert_allclose(got, expected[:, 0] if width is None else expected,
                                           rtol=1e-4, atol=1e-5)
            L = rng.standard_normal((2, shape[0])).astype(operand_dtype)
            with np.errstate(invalid="ignore"):
                expected = _product(A.T.indptr, A.T.indices, A.T.data.astype(compute),
                                    L.T.astype(compute)).T
            np.testing.assert_allclose(L @ A, expected, rtol=1e-4, atol=1e-5)
        path = tmp_path / f"a{seed}.npz"
        sph_io.save_npz(path, A)
        loaded = sph_io.load_npz(path)
        for name in ("data", "indices", "indptr"):
            np.testing.assert_array_equal(getattr(loaded, name), getattr(A, name))
            assert getattr(loaded, name).dtype == getattr(A, name).dtype
