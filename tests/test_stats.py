"""block_stats against counts made by hand from the definitions."""
import numpy as np
import pytest

import pysparse_hpc as sph

from .conftest import random_scipy


def test_small_example_by_hand():
    dense = np.zeros((10, 6))
    dense[0, [0, 1]] = 1   # window 0 (rows 0-7): columns 0, 1, 5 -> 3 vectors
    dense[3, [1, 5]] = 1
    dense[9, 2] = 1        # window 1 (rows 8-9): column 2 -> 1 vector
    stats = sph.block_stats(sph.csr_array(dense.astype(np.float32)), window=8, block_width=2)
    assert (stats.n_windows, stats.n_empty_windows, stats.n_vectors, stats.nnz) == (2, 0, 4, 5)
    assert stats.n_blocks == 3                     # ceil(3/2) + ceil(1/2)
    assert stats.padded_vectors == 6
    assert stats.nnz_per_vector == pytest.approx(5 / 4)
    assert stats.redundancy == pytest.approx(4 * 8 / 5)
    idx, val = 4, 4                                # int32 indices, float32 values
    assert stats.bytes_csr == 11 * idx + 5 * (idx + val)
    assert stats.bytes_mebcrs == 3 * idx + 4 * (idx + 8 * val)
    assert stats.bytes_srbcrs == 3 * idx + 6 * (idx + 8 * val)
    assert stats.bytes_mask == 4
    assert "4 vectors" in str(stats) and stats.as_dict()["n_vectors"] == 4


@pytest.mark.parametrize("window", [8, 16])
def test_matches_built_format(rng, window):
    S = random_scipy(rng, (100, 80), 0.05, duplicates=True)
    A = sph.csr_array(S)
    stats = sph.block_stats(A, window=window)
    B = A.to_blocked(window=window)
    assert stats.n_vectors == B.n_vectors
    assert stats.nnz == B.nnz == A.canonical().nnz
    assert stats.bytes_mebcrs == B.values.nbytes + B.col_idx.nbytes + B.row_window_offset.nbytes
    assert stats.bytes_mask == B.vector_mask.nbytes
    assert sph.block_stats(B, window=window) == stats   # a blocked input is measured via CSR
    assert sph.block_stats(S, window=window) == stats   # scipy input works too


def test_8x1_has_less_redundancy_than_16x1(rng):
    A = sph.csr_array(random_scipy(rng, (200, 200), 0.02))
    assert sph.block_stats(A, 8).redundancy < sph.block_stats(A, 16).redundancy


def test_empty_matrix():
    stats = sph.block_stats(sph.csr_array((9, 4)))
    assert stats.n_vectors == 0 and stats.nnz_per_vector == 0.0 and stats.redundancy == 0.0
    assert stats.n_windows == 2 and stats.n_empty_windows == 2


@pytest.mark.parametrize("window", [8, 16])
def test_hypersparse_columns_are_counted_without_a_slot_per_column(rng, window):
    """Far more columns than entries: the counts of a 2**40-column matrix (which would need an
    8 TiB counter) equal those of the same entries in a narrow matrix and of the built format."""
    rows = np.array([0, 1, 2, 3, 9, 9, 17])
    cols = np.array([5, 2 ** 40, 5, 7, 2 ** 39, 5, 3])
    wide = sph.csr_array((np.ones(7), (rows, cols)), shape=(20, 2 ** 40 + 1))
    narrow_cols = np.unique(cols, return_inverse=True)[1].ravel()
    narrow = sph.csr_array((np.ones(7), (rows, narrow_cols)), shape=(20, 5))
    stats = sph.block_stats(wide, window=window)
    expected = sph.block_stats(narrow, window=window).as_dict()
    expected.update(n_cols=2 ** 40 + 1, bytes_csr=stats.bytes_csr)
    assert stats.as_dict() == expected
    assert stats.n_vectors == wide.to_blocked(window=window).n_vectors


def test_str_names_the_blocked_format_by_its_window_height():
    """ME-BCRS is the 8-row format: the bytes of 16-row windows are not labelled as its."""
    A = sph.csr_array(np.eye(20, dtype=np.float32))
    assert "ME-BCRS " in str(sph.block_stats(A, window=8))
    text = str(sph.block_stats(A, window=16))
    assert "ME-BCRS" not in text and "16x1 blocked " in text
