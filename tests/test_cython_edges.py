"""Edge cases of the typed CSR and blocked conversions: states and arguments the typed code
must refuse or handle rather than read or write out of place."""
import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc._cy import blocked as _blocked

from .conftest import run_isolated


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_transpose_takes_the_entries_indptr_spans(dtype, index_dtype):
    # scipy's eliminate_zeros compacts shared buffers in place (float16 values are copied to
    # float32, so only these share all three): the stale tail of indices was counted into the
    # transposed row pointer but never filled, so columns of uninitialized memory came back.
    S = scipy.sparse.random(300, 200, density=0.05, random_state=3, format="csr", dtype=dtype)
    S.data[::3] = 0
    A = sph.csr_array(S, index_dtype=index_dtype)
    shared = A.to_scipy()
    shared.eliminate_zeros()
    assert A.indptr[-1] < A.indices.size
    T = A.transpose()
    expected = shared.T.tocsr()
    expected.sort_indices()
    assert T.indptr[-1] == T.indices.size == expected.nnz
    np.testing.assert_array_equal(T.indptr, expected.indptr)
    np.testing.assert_array_equal(T.indices, expected.indices)
    np.testing.assert_array_equal(T.data, expected.data)


def test_transpose_refuses_a_row_pointer_past_the_entries():
    A = sph.csr_array(np.eye(4))
    from pysparse_hpc._cy.convert import csr_transpose

    with pytest.raises(ValueError, match="beyond the 3 indices"):
        csr_transpose(4, A.indptr, A.indices[:3].copy(), A.data[:3].copy())


@pytest.mark.parametrize("window", [0, -8])
def test_blocked_kernels_refuse_a_window_they_would_divide_by(window):
    # cdivision: n_windows = (rows + window - 1) // window was a SIGFPE for a zero window.
    out = run_isolated(f"""
        import numpy as np
        import pysparse_hpc as sph
        from pysparse_hpc._cy import blocked

        A = sph.csr_array(np.ones((10, 3)))
        calls = [
            lambda: blocked.csr_to_blocked(A.indptr, A.indices, A.data, {window}, 8, 1, 3),
            lambda: blocked.count_window_vectors(A.indptr, A.indices, 3, {window}),
        ]
        for call in calls:
            try:
                call()
            except ValueError as exc:
                assert "window must be in [1, 64]" in str(exc), exc
            else:
                raise AssertionError("not refused")
        print("refused")
    """)
    assert out.strip() == "refused"


def test_blocked_conversion_refuses_windows_taller_than_its_row_mask():
    # The row mask of a vector is built in a 64-bit register: rows from 64 on shifted past it
    # and set bits of other rows (65-row windows stored 246 mask bits for 210 entries).
    A = sph.csr_array(np.ones((70, 3)))
    with pytest.raises(ValueError, match=r"window must be in \[1, 64\], got 65"):
        _blocked.csr_to_blocked(A.indptr, A.indices, A.data, 65, 8, 1, 3)
    with pytest.raises(ValueError, match="block_width must be a positive integer"):
        _blocked.csr_to_blocked(A.indptr, A.indices, A.data, 8, 0, 1, 3)
    rwo, col_idx, values, mask = _blocked.csr_to_blocked(A.indptr, A.indices, A.data, 64, 8, 1,
                                                         3)
    assert int(np.unpackbits(mask).sum()) == A.nnz
