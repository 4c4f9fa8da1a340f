"""csr_array against scipy.sparse as the oracle."""
import re

import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st

import pysparse_hpc as sph

from .conftest import random_scipy, run_isolated
from .reference import assert_same_csr


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok", "bsr"])
@pytest.mark.parametrize("kind", [scipy.sparse.csr_array, scipy.sparse.csr_matrix])
def test_from_any_scipy_format(rng, fmt, kind):
    S = kind(random_scipy(rng, (13, 9), 0.3))
    A = sph.csr_array(S.asformat(fmt))
    assert_same_csr(A.canonical(), scipy.sparse.csr_array(S))
    assert A.format == "csr" and A.ndim == 2 and A.shape == (13, 9)


def test_from_dense_list_and_ndarray():
    dense = [[0, 1.5, 0], [2, 0, 0]]
    A = sph.csr_array(dense)
    np.testing.assert_array_equal(A.toarray(), np.array(dense))
    assert A.nnz == 2 and A.dtype == np.float64 and A.has_canonical_format


def test_from_torch_tensor():
    torch = pytest.importorskip("torch")
    t = torch.tensor([[0.0, 1.0], [3.0, 0.0]], dtype=torch.float32)
    A = sph.csr_array(t)
    assert A.dtype == np.float32
    np.testing.assert_array_equal(A.toarray(), t.numpy())
    # A lazily negated view (torch's negative bit), which numpy() refuses, reads as its values.
    z = torch.tensor([[1 + 2j, 0j], [0j, 3 - 1j]], dtype=torch.complex64)
    np.testing.assert_array_equal(sph.csr_array(z.conj().imag).toarray(), [[-2, 0], [0, 1]])
    # bfloat16, which NumPy lacks, is refused by name with the way out (was NumPy's "Got
    # unsupported ScalarType BFloat16"), as for a dense operand of @.
    with pytest.raises(TypeError, match="torch.bfloat16 .* \\(convert with .float\\(\\)\\)"):
        sph.csr_array(t.bfloat16())


def test_from_raw_csr_shares_arrays_unless_copy():
    data = np.array([1.0, 2.0])
    indices, indptr = np.array([1, 0], np.int32), np.array([0, 1, 2], np.int32)
    A = sph.csr_array((data, indices, indptr), shape=(2, 3))
    assert np.shares_memory(A.data, data)
    B = sph.csr_array((data, indices, indptr), shape=(2, 3), copy=True)
    assert not np.shares_memory(B.data, data)
    assert A.shape == (2, 3)
    assert sph.csr_array((data, indices, indptr)).shape == (2, 2)  # inferred from max index


def test_coo_sums_duplicates_keeps_explicit_zeros():
    row = np.array([1, 0, 1, 1, 0])
    col = np.array([2, 1, 2, 0, 0])
    data = np.array([1.0, 0.0, 2.0, 4.0, 5.0])
    A = sph.csr_array((data, (row, col)), shape=(2, 3))
    assert A.has_canonical_format
    np.testing.assert_array_equal(A.indptr, [0, 2, 4])
    np.testing.assert_array_equal(A.indices, [0, 1, 0, 2])
    np.testing.assert_array_equal(A.data, [5.0, 0.0, 4.0, 3.0])  # explicit zero kept


def test_empty_shapes():
    for shape in [(0, 0), (0, 5), (5, 0), (3, 4)]:
        A = sph.csr_array(shape)
        assert A.shape == shape and A.nnz == 0
        np.testing.assert_array_equal(A.toarray(), np.zeros(shape))
        assert A.T.shape == shape[::-1]


def test_index_dtype_rule_and_override():
    A = sph.csr_array(np.eye(3))
    assert A.index_dtype == np.int32
    data, indices, indptr = np.ones(2), np.array([0, 1], np.int64), np.array([0, 1, 2], np.int64)
    assert sph.csr_array((data, indices, indptr)).index_dtype == np.int64  # int64 input is kept
    B = sph.csr_array(np.eye(3), index_dtype=np.int64)
    assert B.indices.dtype == B.indptr.dtype == np.int64
    assert sph.csr_array(B, index_dtype=np.int32).index_dtype == np.int32
    with pytest.raises(TypeError, match="index_dtype"):
        sph.csr_array(np.eye(3), index_dtype=np.int16)


def test_int_and_bool_values_become_float64():
    assert sph.csr_array(np.eye(2, dtype=np.int64)).dtype == np.float64
    assert sph.csr_array(np.eye(2, dtype=bool)).dtype == np.float64
    assert sph.csr_array(np.eye(2, dtype=np.int64), dtype=np.float32).dtype == np.float32


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_canonicalization_matches_scipy(rng, index_dtype):
    S = random_scipy(rng, (40, 30), 0.2, duplicates=True)
    A = sph.csr_array(S, index_dtype=index_dtype)
    assert not A.has_canonical_format
    expected = S.copy()
    expected.sum_duplicates()
    canonical = A.canonical()
    assert not A.has_canonical_format  # canonical() leaves the original alone
    assert_same_csr(canonical, expected, rtol=1e-12)
    assert canonical.index_dtype == index_dtype
    A.sum_duplicates()
    assert A.has_canonical_format
    assert_same_csr(A, expected, rtol=1e-12)


def test_sort_indices_keeps_duplicates(rng):
    S = random_scipy(rng, (20, 10), 0.3, duplicates=True)
    A = sph.csr_array(S)
    A.sort_indices()
    assert A.has_sorted_indices and A.nnz == S.nnz
    expected = S.copy()
    expected.sort_indices()
    np.testing.assert_array_equal(A.indices, expected.indices)
    np.testing.assert_allclose(A.toarray(), S.toarray())


def test_scipy_canonicalizing_its_input_later_does_not_corrupt_us(rng):
    S = random_scipy(rng, (20, 12), 0.3, duplicates=True)
    A = sph.csr_array(S)
    dense = A.toarray()
    abs(S)                 # scipy sums S's duplicates in place here
    S.sum_duplicates()
    A.check_format(full_check=True)
    np.testing.assert_array_equal(A.toarray(), dense)
    C = random_scipy(rng, (20, 12), 0.3)
    assert np.shares_memory(sph.csr_array(C).indices, C.indices)  # canonical input is shared


@pytest.mark.parametrize("copy", [False, True])
def test_scipy_input_with_strided_arrays_is_made_contiguous(copy):
    """A canonical scipy matrix keeps the strided views it was built from; the Cython kernels
    take C-contiguous buffers only, so every operation must still work on the result."""
    data = np.arange(1.0, 9.0)
    indices = np.array([0, 0, 2, 2, 1, 1, 0, 0], dtype=np.int32)
    S = scipy.sparse.csr_array((data[::2], indices[::2], np.arange(5, dtype=np.int32)),
                               shape=(4, 4))
    assert S.has_canonical_format and not S.indices.flags.c_contiguous
    A = sph.csr_array(S, copy=copy)
    for array in (A.data, A.indices, A.indptr):
        assert array.flags.c_contiguous
    expected = S.toarray()
    np.testing.assert_array_equal(A.toarray(), expected)
    np.testing.assert_array_equal(A.T.toarray(), expected.T)
    np.testing.assert_array_equal(A.to_mebcrs().toarray(), expected)
    np.testing.assert_array_equal(np.ones((2, 4)) @ A, np.ones((2, 4)) @ expected)
    np.testing.assert_array_equal(
        sph.sddmm(A, np.ones((4, 2)), np.ones((4, 2))).toarray(), 2.0 * (expected != 0))
    assert A.has_sorted_indices
    assert not np.shares_memory(A.data, data)  # a strided view cannot be shared as is


@pytest.mark.parametrize("indices, indptr, message", [
    ([0, 1, 10**6], [0, 1, 2, 3], "column 1000000, out of range for 3 columns"),
    ([0, 1, -5], [0, 1, 2, 3], "negative column"),
    ([0, 1, 2], [0, 3, 1, 3], "indptr must be non-decreasing"),
])
def test_malformed_scipy_input_is_refused(indices, indptr, message):
    # scipy builds these without a full check; our kernels would read out of bounds.
    S = scipy.sparse.csr_array((np.ones(3), np.array(indices), np.array(indptr)), shape=(3, 3))
    with pytest.raises(ValueError, match=message):
        sph.csr_array(S)


@pytest.mark.parametrize("build, message", [
    ("scipy.sparse.csc_matrix((np.ones(2), np.array([0, 99]), np.array([0, 1, 2])), (2, 2))",
     "CSC input is not a valid sparse matrix: indices must be < 2"),
    ("scipy.sparse.csc_array((np.ones(2), np.array([0, -5]), np.array([0, 1, 2])), (2, 2))",
     "CSC input is not a valid sparse matrix: indices must be >= 0"),
    ("scipy.sparse.bsr_array((np.ones((2, 1, 1)), np.array([0, 7]), np.array([0, 1, 2])), "
     "(2, 2))", "BSR input is not a valid sparse matrix"),
    ("scipy.sparse.coo_matrix(np.eye(2)); S.row[1] = 10**6", r"COO input's row\[1\] is 1000000, "
     "out of range for 2 rows"),
    ("scipy.sparse.coo_array(np.eye(2)); S.col[0] = -1", r"COO input's col\[0\] is -1"),
])
def test_scipy_input_out_of_range_is_refused_before_scipy_converts_it(build, message):
    """scipy converts a CSC, BSR or COO matrix to CSR trusting its indices: one out of range
    was written outside the result (accepted with memory corrupted, or a segfault). Run in a
    child process, so that a crash fails this test rather than the test run."""
    code = ("import numpy as np, scipy.sparse, pysparse_hpc as sph\n"
            f"S = {build}\n"
            "try:\n    sph.csr_array(S)\nexcept ValueError as exc:\n    print(exc)\n"
            "else:\n    print('accepted')\n")
    output = run_isolated(code)
    assert re.search(message, output), output


def test_inplace_ops_do_not_touch_caller_arrays(rng):
    S = random_scipy(rng, (20, 10), 0.3, duplicates=True)
    data, indices, indptr = S.data.copy(), S.indices.copy(), S.indptr.copy()
    A = sph.csr_array((data, indices, indptr), shape=S.shape)
    A.sum_duplicates()
    np.testing.assert_array_equal(data, S.data)
    np.testing.assert_array_equal(indices, S.indices)
    np.testing.assert_array_equal(indptr, S.indptr)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_transpose_matches_scipy(rng, index_dtype):
    S = random_scipy(rng, (17, 23), 0.2)
    A = sph.csr_array(S, index_dtype=index_dtype)
    assert_same_csr(A.T, S.T.tocsr())
    assert A.T.index_dtype == index_dtype
    assert_same_csr(A.transpose(axes=(1, 0)).T, S)
    with pytest.raises(ValueError, match="axes"):
        A.transpose(axes=(0, 1))


def test_transpose_of_noncanonical_sums_correctly(rng):
    S = random_scipy(rng, (15, 12), 0.3, duplicates=True)
    A = sph.csr_array(S)
    np.testing.assert_allclose(A.T.toarray(), S.toarray().T)
    assert A.T.has_sorted_indices


def test_float16_storage(rng):
    S = random_scipy(rng, (10, 10), 0.3)
    A = sph.csr_array(S, dtype=np.float16)
    assert A.dtype == np.float16
    np.testing.assert_array_equal(A.data, S.data.astype(np.float16))
    assert A.to_scipy().dtype == np.float32  # scipy has no float16
    np.testing.assert_array_equal(A.T.data, A.to_scipy().T.tocsr().data.astype(np.float16))


def test_float16_duplicates_summed_in_float32():
    values = np.array([2048.0, 1.0, 1.0], dtype=np.float16)  # fp16 running sum would stay 2048
    A = sph.csr_array((values, (np.zeros(3, int), np.zeros(3, int))), shape=(1, 1))
    assert A.dtype == np.float16 and A.data[0] == np.float16(2050.0)


def test_astype_copy_and_tocoo(rng):
    S = random_scipy(rng, (8, 6), 0.4)
    A = sph.csr_array(S)
    B = A.astype(np.float32)
    assert B.dtype == np.float32 and A.dtype == np.float64
    C = A.copy()
    C.data[:] = 0
    assert np.any(A.data != 0)
    row, col, data = A.tocoo()
    coo = S.tocoo()
    np.testing.assert_array_equal(row, coo.row)
    np.testing.assert_array_equal(col, coo.col)
    np.testing.assert_array_equal(data, coo.data)
    assert A.astype(np.float64, copy=False) is A


def test_nan_and_inf_are_stored_and_propagate():
    dense = np.array([[np.nan, 0.0], [np.inf, -np.inf]])
    A = sph.csr_array(dense)
    assert A.nnz == 3
    np.testing.assert_array_equal(A.toarray(), dense)
    np.testing.assert_array_equal(A.to_mebcrs().tocsr().toarray(), dense)
    np.testing.assert_array_equal(A.T.toarray(), dense.T)


def test_repr_and_len():
    A = sph.csr_array(np.eye(3, dtype=np.float32))
    text = repr(A)
    assert "csr_array" in text and "(3, 3)" in text and "float32" in text and "3 stored" in text
    with pytest.raises(TypeError, match="ambiguous"):
        len(A)


def test_check_format_detects_corruption():
    A = sph.csr_array(np.eye(4))
    A.check_format(full_check=True)
    A.indices = A.indices.copy()
    A.indices[2] = 7
    A.check_format(full_check=False)  # O(1) checks cannot see it
    with pytest.raises(ValueError, match="out of range"):
        A.check_format(full_check=True)


matrices = st.tuples(st.integers(0, 20), st.integers(0, 20), st.floats(0, 0.6),
                     st.booleans(), st.sampled_from([np.int32, np.int64]), st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(matrices)
def test_hypothesis_roundtrip_vs_scipy(params):
    n_rows, n_cols, density, duplicates, index_dtype, seed = params
    rng = np.random.default_rng(seed)
    S = random_scipy(rng, (n_rows, n_cols), density, duplicates=duplicates)
    A = sph.csr_array(S, index_dtype=index_dtype)
    expected = S.copy()
    expected.sum_duplicates()
    rtol = 1e-12 if duplicates else 0.0  # duplicates may be summed in another order than scipy
    assert_same_csr(A.canonical(), expected, rtol)
    np.testing.assert_allclose(A.toarray(), S.toarray())
    np.testing.assert_allclose(A.T.toarray(), S.toarray().T)
    coo = S.tocoo()
    B = sph.csr_array((coo.data, (coo.row, coo.col)), shape=S.shape, index_dtype=index_dtype)
    assert_same_csr(B, expected, rtol)


def test_to_scipy_shares_or_copies():
    """Shared arrays (scipy's own convention) or, with copy=True, arrays scipy's in-place
    methods may rewrite without touching ours."""
    canonical = sph.csr_array((np.array([1.0, 2.0]), np.array([0, 1]), np.array([0, 2, 2])),
                              shape=(2, 2))
    shared = canonical.to_scipy()
    assert np.shares_memory(shared.indices, canonical.indices)
    # A non-canonical array is copied: scipy sums its duplicates in place inside abs().
    A = sph.csr_array((np.array([1.0, 2.0, 3.0]), np.array([1, 0, 1]), np.array([0, 3, 3])),
                      shape=(2, 2))
    before = A.toarray()
    abs(A.to_scipy())
    np.testing.assert_array_equal(A.indices, [1, 0, 1])
    copied = A.to_scipy(copy=True)
    copied.sum_duplicates()
    copied.eliminate_zeros()
    np.testing.assert_array_equal(A.indptr, [0, 3, 3])
    np.testing.assert_array_equal(A.toarray(), before)
    np.testing.assert_array_equal(copied.toarray(), before)
    blocked = A.to_mebcrs()
    assert not np.shares_memory(blocked.to_scipy(copy=True).data, blocked.values)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
def test_from_torch_sparse_tensors_of_every_layout(rng):
    """A torch sparse tensor failed as a dense one, with torch's advice to densify it first.
    Every layout is read as its CSR form's arrays would be: duplicates summed, explicit
    zeros kept, the index dtype kept (torch's int64 unless asked otherwise), the values
    shared where torch's CSR holds them as they are."""
    torch = pytest.importorskip("torch")
    dense = random_scipy(rng, (16, 12), 0.3).toarray().astype(np.float32)
    tensor = torch.from_numpy(dense)
    for layout in ("coo", "csr", "csc", "bsr", "bsc"):
        sparse = (tensor.to_sparse_bsr((4, 4)) if layout == "bsr" else
                  tensor.to_sparse_bsc((4, 4)) if layout == "bsc" else
                  getattr(tensor, f"to_sparse_{layout}")())
        A = sph.csr_array(sparse)
        assert (A.dtype, A.index_dtype, A.shape) == (np.float32, np.int64, (16, 12)), layout
        assert A.has_canonical_format, layout
        np.testing.assert_array_equal(A.toarray(), dense, err_msg=layout)
    csr = tensor.to_sparse_csr()
    assert np.shares_memory(sph.csr_array(csr).data, csr.values().numpy())
    assert not np.shares_memory(sph.csr_array(csr, copy=True).data, csr.values().numpy())
    assert sph.csr_array(csr, dtype=np.float64, index_dtype=np.int32).index_dtype == np.int32
    small = torch.sparse_csr_tensor(csr.crow_indices().int(), csr.col_indices().int(),
                                    csr.values(), csr.shape)
    assert sph.csr_array(small).index_dtype == np.int32
    # an uncoalesced COO tensor: its duplicates summed, an explicit zero kept
    repeated = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1], [1, 1, 0]]),
                                       torch.tensor([1.0, 2.0, 0.0]), (2, 3))
    A = sph.csr_array(repeated)
    assert A.nnz == 2 and A.toarray().tolist() == [[0, 3, 0], [0, 0, 0]]
    bad = [(torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1, 3), (2, 2, 3)),
            ValueError, r"expected a 2-D sparse tensor of scalar values, got shape \(2, 2, 3\) "
                        r"\(2 sparse and 1 dense dimensions\)"),
           (csr, ValueError, r"shape \(16, 16\) does not match the tensor's shape \(16, 12\)"),
           (csr.to(torch.bfloat16), TypeError, "torch.bfloat16"),
           (repeated.requires_grad_(), TypeError, "requires grad")]
    for tensor_in, error, message in bad:
        with pytest.raises(error, match=message):
            sph.csr_array(tensor_in, shape=(16, 16) if tensor_in is csr else None)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_to_torch_gives_the_entries_and_shares_what_it_can(rng):
    """``to_torch`` inverts ``csr_array(tensor)``: a CSR tensor sharing a canonical array's
    arrays (unless asked to copy), a coalesced COO one; a non-canonical array goes over in
    canonical form, since torch's kernels take each row's columns as sorted and distinct."""
    torch = pytest.importorskip("torch")
    A = sph.csr_array(random_scipy(rng, (9, 7), 0.4))
    csr, coo = A.to_torch(), A.to_torch("coo")
    assert (csr.layout, coo.layout, coo.is_coalesced()) == (torch.sparse_csr,
                                                            torch.sparse_coo, True)
    for tensor in (csr, coo, A.to_torch(copy=True)):
        np.testing.assert_array_equal(tensor.to_dense().numpy(), A.toarray())
        assert tuple(tensor.shape) == A.shape
    assert np.shares_memory(csr.values().numpy(), A.data)
    assert np.shares_memory(csr.col_indices().numpy(), A.indices)
    assert not np.shares_memory(A.to_torch(copy=True).values().numpy(), A.data)
    assert_same_csr(sph.csr_array(csr), A)
    assert_same_csr(sph.csr_array(coo, index_dtype=A.index_dtype), A)
    # repeated and unsorted columns: torch's product adds a repeated one once
    repeated = sph.csr_array((np.array([1.0, 2.0, 3.0]), np.array([1, 1, 0]),
                              np.array([0, 2, 3])), shape=(2, 2))
    assert not repeated.has_canonical_format
    for layout in ("csr", "coo"):
        tensor = repeated.to_torch(layout)
        np.testing.assert_array_equal((tensor @ torch.ones(2, 1, dtype=torch.float64))
                                      .numpy().ravel(), [3.0, 3.0])
    assert repeated.indices.tolist() == [1, 1, 0]   # left as it was
    blocked = sph.mebcrs_array(A)
    np.testing.assert_array_equal(blocked.to_torch().to_dense().numpy(), A.toarray())
    with pytest.raises(ValueError, match="layout must be 'csr' or 'coo', got 'csc'"):
        A.to_torch("csc")


def test_torch_tensors_as_raw_and_coo_arrays():
    """Tensors among raw arrays are read as a dense tensor is: by their values. One that
    carries torch's negative bit raised torch's RuntimeError from numpy(), bfloat16 torch's
    own TypeError, and a (2, nnz) index tensor, what a COO tensor's ``indices()`` gives, was
    not recognised as (row, col). One that requires grad is refused while gradients are on
    (its gradient was dropped without a word: learnable edge weights never trained) and read
    by its values under ``torch.no_grad()``."""
    torch = pytest.importorskip("torch")
    expected = np.array([[1.0, 0.0], [0.0, 2.0]])
    values = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    indices, indptr = torch.tensor([0, 1]), torch.tensor([0, 1, 2])
    for make in (lambda: sph.csr_array((values, indices, indptr)),
                 lambda: sph.csr_array((values, (indices, indices))),
                 lambda: sph.csr_array(torch.diag(values)),
                 lambda: sph.mebcrs_array((torch.ones(8, requires_grad=True), torch.tensor([1]),
                                           torch.tensor([0, 1]), None), shape=(1, 2))):
        with pytest.raises(TypeError, match=r"requires grad.*functional\.spmm\(A, X, "
                                            r"values=\.\.\.\).*tensor\.detach\(\)"):
            make()
    with torch.no_grad():
        A = sph.csr_array((values, indices, indptr))
        B = sph.csr_array((values, (indices, indices)))
        np.testing.assert_array_equal(sph.csr_array(torch.diag(values)).toarray(), expected)
    np.testing.assert_array_equal(A.toarray(), expected)
    assert A.dtype == np.float64
    np.testing.assert_array_equal(B.toarray(), expected)
    C = sph.csr_array((values.detach(), torch.stack([indices, indices])), shape=(2, 2))
    np.testing.assert_array_equal(C.toarray(), expected)
    negated = torch.tensor([1.0 - 1.0j, 1.0 - 2.0j]).conj().imag   # [1, 2] with the neg bit
    assert negated.is_neg()
    np.testing.assert_array_equal(sph.csr_array((negated, indices, indptr)).toarray(),
                                  expected)
    with pytest.raises(TypeError, match="bfloat16.*convert with .float"):
        sph.csr_array((values.to(torch.bfloat16), indices, indptr))
    with pytest.raises(TypeError, match="dense.*tensor"):
        sph.csr_array((values.detach().to_sparse(), indices, indptr))
    blocked = sph.mebcrs_array((torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0]),
                                torch.tensor([1]), torch.tensor([0, 1]), None), shape=(1, 2))
    np.testing.assert_array_equal(blocked.toarray(), [[0.0, 1.0]])


def test_raw_tensors_are_shared_unless_copy():
    """Plain CPU tensors among raw arrays keep the sharing rule of NumPy arrays."""
    torch = pytest.importorskip("torch")
    values = torch.tensor([1.0, 2.0], dtype=torch.float64)
    A = sph.csr_array((values, torch.tensor([0, 1]), torch.tensor([0, 1, 2])))
    assert np.shares_memory(A.data, values.numpy())
    B = sph.csr_array((values, torch.tensor([0, 1]), torch.tensor([0, 1, 2])), copy=True)
    assert not np.shares_memory(B.data, values.numpy())


def test_tocoo_builds_the_array_again():
    """`tocoo`'s triplets were read as (data, indices, indptr): refused, naming a float row
    pointer."""
    A = sph.csr_array(np.array([[0.0, 1.5, 0.0], [2.0, 0.0, 0.0]]), index_dtype=np.int64)
    again = sph.csr_array(A.tocoo(), shape=A.shape)
    np.testing.assert_array_equal(again.toarray(), A.toarray())
    assert again.index_dtype == np.int64
    assert sph.csr_array(A.tocoo()).shape == (2, 2)   # inferred, as scipy's COO input is
