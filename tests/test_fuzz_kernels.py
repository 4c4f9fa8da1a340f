"""Fuzzed inputs of the blocked formats, the reorderings and the CPU kernels: random shapes,
geometries and thread counts against scipy, and the adversarial arrays that once crashed them
or came back wrong."""
import numba
import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc import _config, _sputils
from pysparse_hpc._blocked import value_positions

from .conftest import random_scipy, run_isolated


def _raw_blocked_arrays():
    """A 10 x 6 blocked array in 8-row windows, block width 2, as raw arrays: 4 vectors
    holding 13 entries (window 0: columns 1, 3, 4; window 1, two rows: column 0)."""
    col_idx = np.array([1, 3, 4, 0], dtype=np.int32)
    row_window_offset = np.array([0, 3, 4], dtype=np.int32)
    vector_mask = np.array([0b00000101, 0b11111111, 0b10000000, 0b00000011], dtype=np.uint8)
    present = np.unpackbits(vector_mask[:, None], axis=1, bitorder="little").astype(bool)
    values = np.zeros(4 * 8)
    values[value_positions(row_window_offset, 8, 2)[present]] = np.arange(1.0, 14.0)
    return values, col_idx, row_window_offset, vector_mask


@pytest.mark.parametrize("mask_given", [True, False])
def test_raw_blocked_index_dtype_holds_the_entries(monkeypatch, mask_given):
    # The index dtype was sized by the shape and the vectors, but tocsr's row pointer counts
    # entries, up to `window` a vector: past 2**31 - 1 of them (4 GiB of float16 values) an
    # int32 one wrapped. The int32 limit is lowered here to 12, below the 13 entries and above
    # every dimension and the 4 vectors.
    values, col_idx, row_window_offset, vector_mask = _raw_blocked_arrays()
    arrays = (values, col_idx, row_window_offset, vector_mask if mask_given else None)
    monkeypatch.setattr(_sputils, "_INT32_MAX", 12)
    B = sph.blocked_array(arrays, shape=(10, 6), window=8, block_width=2)
    assert B.index_dtype == np.int64 and B.nnz == 13
    C = B.tocsr()
    assert C.indptr.dtype == np.int64 and C.indptr[-1] == 13
    np.testing.assert_array_equal(np.sort(C.data), np.arange(1.0, 14.0))
    with pytest.raises(ValueError, match="int32 cannot hold 13"):
        sph.blocked_array(arrays, shape=(10, 6), window=8, block_width=2, index_dtype=np.int32)
    monkeypatch.setattr(_sputils, "_INT32_MAX", 13)
    B = sph.blocked_array(arrays, shape=(10, 6), window=8, block_width=2)
    assert B.index_dtype == np.int32   # not widened where the entries fit


def test_index_arrays_written_out_of_range_are_refused():
    # A csr_array's arrays can be written in place after they were checked (the canonical flag
    # does not see it). A column out of range sent the typed code of the orderings past their
    # buffers: segfaults and aborts. A decreasing indptr reached NumPy's "repeats may not
    # contain negative values" in bandwidth. (The conversions and the products trust the
    # arrays, as scipy's do: the known limitations say so.)
    out = run_isolated("""
        import numpy as np
        import pysparse_hpc as sph

        calls = {
            "rcm": lambda A: sph.reorder(A, "rcm"),
            "rabbit": lambda A: sph.reorder(A, "rabbit"),
            "degree": lambda A: sph.reorder(A, "degree"),
            "permute": lambda A: sph.permute(A, np.arange(20)[::-1]),
            "permute_columns": lambda A: sph.permute_columns(A, np.arange(20)[::-1]),
            "bandwidth": sph.bandwidth,
        }
        writes = {"indices": (0, 2**30, "out of range for 20 columns"),
                  "indices ": (0, -5, "negative column"),
                  "indptr": (3, 1, "indptr must be non-decreasing")}
        for array, (position, value, message) in writes.items():
            for name, call in calls.items():
                A = sph.csr_array(np.eye(20) + np.eye(20, k=1))
                getattr(A, array.strip())[position] = value
                try:
                    call(A)
                except ValueError as exc:
                    assert message in str(exc), (name, array, exc)
                else:
                    raise AssertionError(f"{name} took {array.strip()}[{position}] = {value}")
        print("refused")
    """)
    assert out.strip() == "refused"


@pytest.mark.parametrize("seed", range(3))
def test_random_round_trips_and_kernels_match_scipy(monkeypatch, seed):
    # CSR -> blocked -> CSR for random shapes (empty ones included), duplicates, explicit zeros,
    # dtypes, geometries and thread counts (each ordering path of the conversion), and SpMM and
    # SDDMM through both drivers against scipy.
    rng = np.random.default_rng(seed)
    threads = min(3, numba.config.NUMBA_NUM_THREADS)
    previous = sph.get_num_threads()
    try:
        for _ in range(12):
            shape = tuple(int(x) for x in rng.choice([0, 1, 7, 8, 9, 33, 70], 2))
            S = random_scipy(rng, shape, float(rng.choice([0.0, 0.1, 0.5])),
                             duplicates=bool(rng.random() < 0.3))
            if S.nnz:
                S.data[rng.random(S.nnz) < 0.2] = 0.0
            dtype = rng.choice([np.float16, np.float32, np.float64])
            A = sph.csr_array(S, dtype=dtype, index_dtype=rng.choice([np.int32, np.int64]))
            window = int(rng.choice([1, 3, 8, 16, 64]))
            sph.set_num_threads(int(rng.integers(1, threads + 1)))
            B = A.to_blocked(window, int(rng.choice([1, 3, 8])))
            C, canonical = B.tocsr(), A.canonical()
            for ours, theirs in ((C.indptr, canonical.indptr), (C.indices, canonical.indices),
                                 (C.data, canonical.data)):
                np.testing.assert_array_equal(ours, theirs)
            assert B.nnz == canonical.nnz and C.index_dtype == A.index_dtype
            reference = scipy.sparse.csr_array(canonical.astype(np.float64).to_scipy())
            stored = reference.copy()
            stored.data[:] = 1.0
            tolerance = 1e-3 if dtype != np.float64 else 1e-12
            X = rng.standard_normal((shape[1], 5))
            if rng.random() < 0.5:
                X = np.asfortranarray(X)
            P = rng.standard_normal((shape[0], 4))
            Q = rng.standard_normal((shape[1], 4))
            for parallel_min_flops in (0, 1 << 62):
                monkeypatch.setattr(_config, "_PARALLEL_MIN_FLOPS", parallel_min_flops)
                for op, pattern in ((A, canonical), (B, B)):
                    np.testing.assert_allclose(sph.spmm(op, X), reference @ X, rtol=tolerance,
                                               atol=tolerance)
                    # one product per stored slot: the canonical pattern (A's duplicates would
                    # get one each)
                    np.testing.assert_allclose(
                        sph.sddmm(pattern, P, Q, beta=0.5).tocsr().toarray(),
                        stored.toarray() * (P @ Q.T) + 0.5 * reference.toarray(),
                        rtol=tolerance, atol=tolerance)
    finally:
        sph.set_num_threads(previous)


def test_nan_and_inf_reach_only_the_rows_that_store_them(rng):
    # scipy's semantics: a NaN or infinity in B reaches the rows with a stored entry (an explicit
    # zero included: 0 * inf is NaN) in its row of B, not the blocked format's padding.
    S = random_scipy(rng, (37, 29), 0.2)
    S.data[::5] = 0.0
    A = sph.csr_array(S)
    B = np.where(rng.random((29, 6)) < 0.1, np.inf, 1.0)
    B[rng.random((29, 6)) < 0.1] = np.nan
    with np.errstate(invalid="ignore"):
        expected = S @ B
    for op in (A, A.to_mebcrs(block_width=3), A.to_blocked(16), A.to_blocked(64, 5)):
        np.testing.assert_array_equal(sph.spmm(op, B), expected)


@pytest.mark.parametrize("kind", ["random", "star", "components", "explicit_zeros"])
def test_orderings_are_permutations_independent_of_threads(rng, kind):
    n = 1100   # past the size from which RCM tries its starts on several threads
    if kind == "star":
        rows, cols = np.zeros(n - 1, dtype=np.int64), np.arange(1, n)
    elif kind == "components":
        rows = rng.integers(0, n, 3 * n)
        cols = np.minimum(rows // 7 * 7 + rng.integers(0, 7, rows.size), n - 1)
    else:
        rows, cols = rng.integers(0, n, 4 * n), rng.integers(0, n, 4 * n)
    data = np.zeros(rows.size) if kind == "explicit_zeros" else np.ones(rows.size)
    A = sph.csr_array((data, (rows, cols)), shape=(n, n))
    previous = sph.get_num_threads()
    try:
        for method in ("rabbit", "rcm", "degree"):
            orders = []
            for threads in sorted({1, min(4, numba.config.NUMBA_NUM_THREADS)}):
                sph.set_num_threads(threads)
                orders.append(sph.reorder(A, method))
            perm = orders[0]
            assert perm.dtype == np.int64
            np.testing.assert_array_equal(np.sort(perm), np.arange(n))
            for other in orders[1:]:
                np.testing.assert_array_equal(other, perm)
            dense = A.toarray()
            np.testing.assert_array_equal(sph.permute(A, perm).toarray(), dense[perm][:, perm])
    finally:
        sph.set_num_threads(previous)
