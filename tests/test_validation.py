"""Bad input: a clear TypeError/ValueError that says what was found, and nothing modified."""
import re

import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph


def raw(indptr=(0, 1, 3), indices=(1, 0, 2), data=(1.0, 2.0, 3.0)):
    return np.array(data), np.array(indices), np.array(indptr)


@pytest.mark.parametrize("indptr,message", [
    ((0, 1), "indptr has length 2, expected rows\\+1 = 3"),
    ((0, 3, 1, 3), "non-decreasing"),
    ((1, 2, 3), "indptr\\[0\\] is 1, expected 0"),
    ((0, 1, 2), "indptr\\[-1\\] is 2, expected the number of stored entries 3"),
])
def test_bad_indptr(indptr, message):
    data, indices, _ = raw()
    shape = (len(indptr) - 1, 3) if "non-decreasing" in message else (2, 3)
    with pytest.raises(ValueError, match=message):
        sph.csr_array((data, indices, np.array(indptr)), shape=shape)


@pytest.mark.parametrize("indices,message", [
    ((1, 0, 5), "column 5, out of range for 3 columns"),
    ((1, -1, 2), "negative column"),
])
def test_bad_indices(indices, message):
    data, _, indptr = raw()
    with pytest.raises(ValueError, match=message):
        sph.csr_array((data, np.array(indices), indptr), shape=(2, 3))


def test_length_mismatch():
    data, indices, indptr = raw()
    with pytest.raises(ValueError, match="data has length 2 but indices has length 3"):
        sph.csr_array((data[:2], indices, indptr), shape=(2, 3))
    with pytest.raises(ValueError, match="differ in length"):
        sph.csr_array((np.ones(3), (np.array([0, 1]), np.array([0, 1, 2]))))


@pytest.mark.parametrize("shape,error,message", [
    ((-1, 3), ValueError, "non-negative"),
    ((2.0, 3), TypeError, "integers, got float"),
    (("2", 3), TypeError, "integers, got str"),
    ((2, 3, 4), ValueError, "2 entries"),
    ((1, 2 ** 64 - 1), ValueError, r"at most 2\*\*63 - 1"),
    ("23", TypeError, "tuple of two integers"),
    (5, TypeError, "tuple of two integers"),
])
def test_bad_shape(shape, error, message):
    with pytest.raises(error, match=message):
        sph.csr_array(raw(), shape=shape)


def test_a_bool_is_not_a_dimension():
    # operator.index takes True as 1: (True, 3) built a 1 x 3 array without a word
    with pytest.raises(TypeError, match="integers, got bool True"):
        sph.csr_array((True, 3))
    with pytest.raises(TypeError, match="integers, got bool"):
        sph.csr_array(raw(), shape=(np.bool_(True), 3))


def test_torch_dtypes_are_taken_where_dtypes_are():
    torch = pytest.importorskip("torch")
    A = sph.csr_array(np.eye(3), dtype=torch.float32, index_dtype=torch.int64)
    assert A.dtype == np.float32 and A.index_dtype == np.int64
    assert A.astype(torch.float16).dtype == np.float16
    assert sph.blocked_array(np.eye(3), dtype=torch.float64).dtype == np.float64
    with pytest.raises(TypeError, match="dtype torch.bfloat16 has no NumPy equivalent"):
        sph.csr_array(np.eye(3), dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="index_dtype must be int32 or int64, got int16"):
        sph.csr_array(np.eye(3), index_dtype=torch.int16)


def test_shape_too_small_for_coo():
    with pytest.raises(ValueError, match="row index 4 out of range"):
        sph.csr_array((np.ones(2), (np.array([0, 4]), np.array([0, 1]))), shape=(3, 3))
    with pytest.raises(ValueError, match="negative"):
        sph.csr_array((np.ones(2), (np.array([0, -1]), np.array([0, 1]))), shape=(3, 3))


def test_dimensionality():
    with pytest.raises(ValueError, match="expected a 2-D array, got 3-D"):
        sph.csr_array(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="expected a 2-D array, got 1-D"):
        sph.csr_array(np.zeros(4))
    with pytest.raises(ValueError, match="1-D"):
        sph.csr_array((np.ones((2, 2)), np.array([0, 1]), np.array([0, 1, 2])))


@pytest.mark.parametrize("values,fragment", [
    (np.array([[1 + 2j, 0]]), "complex"),
    (np.array([["a", "b"]]), "string"),
    (np.array([[object(), None]], dtype=object), "object"),
])
def test_unsupported_value_dtypes(values, fragment):
    with pytest.raises(TypeError, match=fragment):
        sph.csr_array(values)


def test_unsupported_dtype_requests_and_index_types():
    with pytest.raises(TypeError, match="not supported"):
        sph.csr_array(np.eye(2), dtype=np.complex64)
    with pytest.raises(TypeError, match="not supported"):
        sph.csr_array(np.eye(2), dtype=np.int32)
    with pytest.raises(TypeError, match="indices must hold integers, got dtype float64"):
        sph.csr_array((np.ones(1), np.array([0.0]), np.array([0, 1])))
    with pytest.raises(TypeError, match="cannot build a csr_array from str"):
        sph.csr_array("not a matrix")
    with pytest.raises(TypeError, match="tuple of length 5"):
        sph.csr_array((1, 2, 3, 4, 5))
    with pytest.raises(TypeError, match="from NoneType"):
        sph.csr_array(None)
    import scipy.sparse
    with pytest.raises(TypeError, match="complex"):
        sph.csr_array(scipy.sparse.csr_array(np.eye(2) * 1j))


def test_shape_mismatch_with_input():
    with pytest.raises(ValueError, match="does not match"):
        sph.csr_array(np.eye(3), shape=(3, 4))
    import scipy.sparse
    with pytest.raises(ValueError, match="does not match"):
        sph.csr_array(scipy.sparse.eye_array(3), shape=(2, 2))


def test_failed_construction_leaves_inputs_untouched():
    data, indices, indptr = raw(indices=(1, 0, 7))
    copies = [a.copy() for a in (data, indices, indptr)]
    with pytest.raises(ValueError):
        sph.csr_array((data, indices, indptr), shape=(2, 3))
    for before, after in zip(copies, (data, indices, indptr)):
        np.testing.assert_array_equal(before, after)


def test_int64_indices_out_of_int32_range_are_caught_before_cast():
    # A column of 2**32 would wrap to 0 if cast to int32 before the range check.
    with pytest.raises(ValueError, match="out of range"):
        sph.csr_array((np.ones(1), np.array([2**32], np.int64), np.array([0, 1])), shape=(1, 5))


@pytest.mark.parametrize("column, message", [
    (2**32 + 1, "column 4294967297, out of range for 3 columns"),
    (-2**32 + 2, "negative column"),
])
def test_scipy_int64_columns_are_checked_before_an_int32_cast(column, message):
    # Cast to the requested int32 first, 2**32 + 1 would wrap to 1 (and -2**32 + 2 to 2), in
    # range, and the matrix would be accepted with a wrong column.
    S = scipy.sparse.csr_array((np.array([7.0]), np.array([column], np.int64),
                                np.array([0, 1], np.int64)), shape=(1, 3))
    with pytest.raises(ValueError, match=message):
        sph.csr_array(S, index_dtype=np.int32)


@pytest.mark.parametrize("make, message", [
    (lambda big: (np.ones(1), np.array([big], np.uint64), np.array([0, 1])), "indices holds"),
    (lambda big: (np.ones(1), (np.array([0], np.uint64), np.array([big], np.uint64))),
     "col holds"),
    (lambda big: (np.ones(1), (np.array([big], np.uint64), np.array([0], np.uint64))),
     "row holds"),
])
@pytest.mark.parametrize("big", [2**63, 2**64 - 1])
def test_unsigned_indices_beyond_int64_are_refused_without_a_shape(make, message, big):
    """Without a shape, an unsigned index of 2**63 or more implied a shape beyond int64 that
    passed its own range check, then wrapped to a negative column in the cast to int64 (a row
    failed with an OverflowError from the conversion)."""
    with pytest.raises(ValueError, match=f"{message} index {big}, beyond the largest"):
        sph.csr_array(make(big))


def test_a_requested_int32_index_dtype_must_hold_the_indices():
    """int32 requested for indices beyond its range would wrap them (past the range check)."""
    big = 2 ** 31 + 1
    for make in (
            lambda: sph.csr_array((np.ones(1), np.array([big]), np.array([0, 1])),
                                  shape=(1, big + 1), index_dtype=np.int32),
            lambda: sph.csr_array((np.ones(2), (np.array([0, big]), np.array([0, 1]))),
                                  shape=(big + 1, 2), index_dtype=np.int32),
            lambda: sph.csr_array(scipy.sparse.csr_array(
                (np.ones(1), np.array([big]), np.array([0, 1])), shape=(1, big + 1)),
                index_dtype=np.int32),
            # An empty array of that shape: its indptr and any entry added later by a
            # conversion would hold the dimension (this one was accepted with int32).
            lambda: sph.csr_array((3, big + 1), index_dtype=np.int32),
            lambda: sph.csr_array((big + 1, 3), index_dtype="int32")):
        with pytest.raises(ValueError, match="index_dtype int32 cannot hold 2147483650"):
            make()
    assert sph.csr_array((3, 5), index_dtype=np.int32).indptr.dtype == np.int32


def test_raw_arrays_as_scipy_takes_them():
    """Strided, big-endian and empty-list arrays and a 2 x nnz coordinate array are taken as
    scipy takes them, and every operation works on the result."""
    data = np.repeat([1.0, 2.0, 3.0, 4.0], 2)[::2]
    indices, indptr = np.repeat([1, 0, 1, 2], 2)[::2], np.repeat([0, 2, 2, 4], 2)[::2]
    strided = sph.csr_array((data, indices, indptr), shape=(3, 3))
    expected = scipy.sparse.csr_array((data, indices, indptr), shape=(3, 3)).toarray()
    for result in (strided, strided.T.T, strided.to_mebcrs(), strided.canonical()):
        np.testing.assert_array_equal(result.toarray(), expected)
    swapped = sph.csr_array((data.astype(">f8"), indices.astype(">i4"), indptr.astype(">i8")),
                            shape=(3, 3))
    np.testing.assert_array_equal(swapped.toarray(), expected)
    assert swapped.dtype == np.float64 and swapped.dtype.isnative
    np.testing.assert_array_equal(sph.csr_array(expected.astype(">f4")).toarray(), expected)
    np.testing.assert_array_equal(strided @ np.ones(3, ">f8"), expected.sum(1))
    coordinates = np.array([[0, 1], [1, 0]])
    np.testing.assert_array_equal(sph.csr_array((np.array([1.0, 2.0]), coordinates)).toarray(),
                                  [[0.0, 1.0], [2.0, 0.0]])
    assert sph.csr_array(([], ([], [])), shape=(2, 2)).nnz == 0
    assert sph.csr_array(([], [], [0, 0, 0]), shape=(2, 2)).nnz == 0


def test_float16_duplicates_are_summed_in_float32():
    A = sph.csr_array((np.array([60000, 60000, -60000], np.float16), np.zeros(3, np.int32),
                       np.array([0, 3])), shape=(1, 1))
    assert A.toarray().dtype == np.float16 and A.toarray()[0, 0] == 60000


def test_operator_operands_are_named():
    A = sph.csr_array(np.eye(2))
    with pytest.raises(TypeError, match="sparse @ sparse products are not supported"):
        A @ A
    with pytest.raises(TypeError, match="sparse @ sparse products are not supported"):
        scipy.sparse.csr_array(np.eye(2)) @ A
    with pytest.raises(TypeError, match="the left operand of @ must hold float16"):
        np.ones((2, 2), dtype=int) @ A
    # The message pointed scalars to *, which sparse arrays do not have either.
    with pytest.raises(ValueError, match="got 0-D: a scalar, which @ does not take"):
        2.0 @ A
    with pytest.raises(TypeError, match=r"does not support elementwise \*.*A\.to_scipy\(\)"):
        2.0 * A
    with pytest.raises(ValueError, match="got 3-D with shape \\(2, 2, 2\\)$"):
        np.ones((2, 2, 2)) @ A
    torch = pytest.importorskip("torch")
    product = torch.ones(3, 2, dtype=torch.float64) @ A
    assert isinstance(product, torch.Tensor) and product.shape == (3, 2)
    with pytest.raises(TypeError, match="got torch.bfloat16 \\(convert with .float\\(\\)\\)"):
        A @ torch.ones(2, 2, dtype=torch.bfloat16)
    # A tensor that requires grad gives its values where no gradient is recorded; elsewhere
    # it is refused, as its gradient would be dropped (test_csr).
    with torch.no_grad():
        np.testing.assert_array_equal(
            sph.csr_array(torch.eye(2, requires_grad=True)).toarray(), np.eye(2))
    with pytest.raises(ValueError, match="axes must be None or \\(1, 0\\)"):
        A.transpose(axes=5)
    with pytest.raises(TypeError, match="out must be a NumPy array or a torch tensor, got list"):
        sph.spmm(A, np.ones((2, 3)), out=[[0.0] * 3] * 2)
    with pytest.raises(TypeError, match="byte order"):
        sph.spmm(A, np.ones((2, 3)), out=np.zeros((2, 3), ">f8"))
    blocked = sph.csr_array(np.eye(16)).to_mebcrs()
    for window in (0.5, "a", True):
        with pytest.raises(TypeError, match="window must be an integer"):
            blocked.get_block(window, 0)
        # The block passed its range test as a float and failed in NumPy's slicing.
        with pytest.raises(TypeError, match="block must be an integer"):
            blocked.get_block(0, window if window != 0.5 else 0.0)
    for threads in (1.5, True, None):
        with pytest.raises(TypeError, match="number of threads must be an integer"):
            sph.set_num_threads(threads)


def test_spmm_bad_operands():
    A = sph.csr_array(np.eye(3))
    with pytest.raises(ValueError, match="dimension mismatch"):
        A @ np.ones((4, 2))
    with pytest.raises(TypeError, match="complex"):
        A @ np.ones((3, 2), dtype=np.complex128)
    with pytest.raises(TypeError, match="int64"):
        A @ np.ones((3, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        A @ np.ones((3, 2, 2))
    with pytest.raises(TypeError, match="sparse array"):
        sph.spmm(np.eye(3), np.ones((3, 2)))
    # scipy's classes share the names: "got csr_array" alone read as a contradiction
    with pytest.raises(TypeError, match="got scipy.sparse's csr_array"):
        sph.spmm(scipy.sparse.csr_array(np.eye(3)), np.ones((3, 2)))
    with pytest.raises(TypeError, match="got scipy.sparse's coo_array"):
        sph.sddmm(scipy.sparse.coo_array(np.eye(3)), np.ones((3, 2)), np.ones((3, 2)))


@pytest.mark.parametrize("value, status, expected", [
    ("64", 0, "PYSPARSE_HPC_NUM_THREADS=64 is more than the kernels' thread pool "
              "(NUMBA_NUM_THREADS=2, all cores unless set); using 2"),
    ("0", 1, "PYSPARSE_HPC_NUM_THREADS must be a positive integer, got '0'"),
    ("two", 1, "PYSPARSE_HPC_NUM_THREADS must be a positive integer, got 'two'")])
def test_the_thread_variable_is_checked_at_import(value, status, expected):
    """Beyond Numba's pool the variable is lowered to it with a warning (it was silently);
    zero, negative and non-integer values are refused by name."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYSPARSE_HPC_NUM_THREADS=value, NUMBA_NUM_THREADS="2")
    result = subprocess.run([sys.executable, "-c", "import pysparse_hpc as p; "
                             "print(p.get_num_threads())"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == status, result.stderr[-2000:]
    assert expected in result.stderr
    if status == 0:
        assert result.stdout.strip() == "2"


@pytest.mark.parametrize("variables, status, expected", [
    # set to nothing (``VAR= command``) is unset: the import failed
    ({"PYSPARSE_HPC_NUM_THREADS": "", "PYSPARSE_HPC_CUDA_WARPS": " "}, 0, "2 4"),
    ({"PYSPARSE_HPC_CUDA_WARPS": "x"}, 1, "PYSPARSE_HPC_CUDA_WARPS must be an integer, got 'x'")])
def test_empty_tunables_are_unset(variables, status, expected):
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_NUM_THREADS="2", **variables)
    result = subprocess.run([sys.executable, "-c", "import pysparse_hpc as p; "
                             "print(p.get_num_threads(), p._config.cuda_warps_per_block())"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == status, result.stderr[-2000:]
    assert expected in (result.stdout if status == 0 else result.stderr)


def test_zero_dim_integer_tensors_are_integers():
    """A 0-d integer tensor is taken where an int is (NumPy takes it through __index__); a
    float, bool or 1-element 1-d tensor is not."""
    torch = pytest.importorskip("torch")
    from pysparse_hpc._sputils import check_integer
    assert check_integer(torch.tensor(4), "n") == 4
    assert type(check_integer(torch.tensor(4, dtype=torch.int32), "n")) is int
    for bad in (torch.tensor(4.0), torch.tensor(True), torch.tensor([4])):
        with pytest.raises(TypeError, match="n must be an integer"):
            check_integer(bad, "n")
    assert sph.generators.rmat(torch.tensor(4), seed=0).shape == (16, 16)


@pytest.mark.parametrize("scalar", [2.0, 3, np.float64(2.0), np.array(2.0)])
def test_a_scalar_on_either_side_of_matmul_is_the_same_value_error(scalar):
    """``A @ 2.0`` was a TypeError naming a "B" the caller never wrote ("B must be a NumPy
    array or a torch tensor, got float") while ``2.0 @ A`` is a ValueError that says why; both
    sides now give scipy's error type and the same explanation."""
    A = sph.csr_array(np.eye(3))
    with pytest.raises(ValueError, match=r"the right operand of @ must be 1-D or 2-D, got 0-D: "
                                         r"a scalar"):
        A @ scalar
    with pytest.raises(ValueError, match=r"the left operand of @ must be 1-D or 2-D, got 0-D: "
                                         r"a scalar"):
        scalar @ A
    with pytest.raises(ValueError, match=r"the right operand of @ must be 1-D or 2-D, got 3-D"):
        A @ np.ones((3, 2, 2))


def test_a_scalar_tensor_on_the_right_of_matmul_is_a_value_error():
    torch = pytest.importorskip("torch")
    A = sph.csr_array(np.eye(3))
    for scalar in (torch.tensor(2.0), torch.tensor(2.0, requires_grad=True)):
        with pytest.raises(ValueError, match="right operand of @ must be 1-D or 2-D, got 0-D"):
            A @ scalar


@pytest.mark.parametrize("precision, error", [("fp64", ValueError), ("FP32", ValueError),
                                              (None, TypeError), (32, TypeError)])
def test_an_unknown_precision_is_named_as_such(precision, error):
    """An invalid precision was reported as one that "applies to the CUDA backend", which
    fp64 or None do not either."""
    A = sph.csr_array(np.eye(3))
    with pytest.raises(error, match=r"precision must be one of \('fp32', 'tf32', 'fp16'\)"):
        sph.spmm(A, np.ones((3, 2)), precision=precision)
    with pytest.raises(error, match=r"precision must be one of \('fp32', 'tf32', 'fp16'\)"):
        sph.sddmm(A, np.ones((3, 2)), np.ones((3, 2)), precision=precision)
    with pytest.raises(ValueError, match="applies to the CUDA backend"):
        sph.spmm(A, np.ones((3, 2)), precision="tf32")


def test_sddmm_operands_must_be_of_one_kind():
    """X and Y are documented as one kind; a torch X with a NumPy Y was taken, and a 3-D
    result came back as X's kind whatever Y was."""
    torch = pytest.importorskip("torch")
    A = sph.csr_array(np.eye(3))
    x = np.ones((3, 2, 4))
    for X, Y, message in ((torch.from_numpy(x), x, "a torch X and a numpy Y"),
                          (x, torch.from_numpy(x), "a numpy X and a torch Y")):
        with pytest.raises(TypeError, match=f"X and Y must be of one kind, got {message}"):
            sph.sddmm(A, X, Y)
    torch.testing.assert_close(sph.sddmm(A, torch.from_numpy(x), torch.from_numpy(x)),
                               torch.full((3, 2), 4.0, dtype=torch.float64))


def test_a_timedelta_is_not_a_real_number_anywhere():
    """NumPy registers timedelta64 as an integer type, and float() drops its unit: Lion took
    3 seconds as a learning rate of 3.0."""
    import torch

    from pysparse_hpc._sputils import is_real_number
    from pysparse_hpc.optim import Lion
    assert not is_real_number(np.timedelta64(3, "s")) and is_real_number(np.int64(3))
    with pytest.raises(TypeError, match="lr must be a number"):
        Lion([torch.nn.Parameter(torch.ones(2))], lr=np.timedelta64(3, "s"))


def torch_tensor_of(A):
    torch = pytest.importorskip("torch")
    return torch.as_tensor(A)


@pytest.mark.parametrize("convert", [lambda A: A, lambda A: A.to_mebcrs(),
                                     lambda A: A.to_blocked(window=16)])
def test_what_scipy_sparse_has_points_to_to_scipy(convert):
    """Arithmetic, indexing and scipy's methods, which the arrays do not have, say where they
    are: Python's own errors ("unsupported operand", "not subscriptable") did not."""
    A = convert(sph.csr_array(np.eye(3)))
    name = type(A).__name__
    dense = np.ones((3, 3))
    times = ("elementwise * (for a matrix product use A @ X or X @ A; np.dot and np.matmul do "
             "not reach it)")
    for what, operation in [("+", lambda: A + A), ("+", lambda: dense + A),
                            ("-", lambda: 1 - A), (times, lambda: A * 2),
                            (times, lambda: np.float32(2) * A),
                            (times, lambda: dense * A),
                            (times, lambda: np.dot(dense, A)),   # NumPy takes A as a scalar
                            ("/", lambda: A / 2), ("**", lambda: A ** 2),
                            ("unary -", lambda: -A), ("abs()", lambda: abs(A)),
                            ("indexing", lambda: A[0, 1]), ("indexing", lambda: A[1:]),
                            ("iteration", lambda: list(A))]:
        with pytest.raises(TypeError, match=f"^{name} does not support {re.escape(what)}: "
                                            r".*A\.to_scipy\(\)"):
            operation()
    with pytest.raises(TypeError, match="item assignment"):
        A[0, 0] = 1.0
    # torch asks for the length first, whose message says where a dense array is
    with pytest.raises(TypeError, match=r"A\.toarray\(\) for a dense array"):
        torch_tensor_of(A)
    with pytest.raises(AttributeError, match=r"no attribute 'multiply'; scipy.sparse's is "
                                             r"reached through A.to_scipy\(\).multiply$"):
        A.multiply(A)
    with pytest.raises(AttributeError, match="no attribute 'bogus'$"):
        A.bogus
    assert not hasattr(A, "todense") and hasattr(A, "toarray")
    # What the arrays do have is untouched: @ with a dense operand, conversions, to_scipy.
    assert np.array_equal(A @ dense, dense) and np.array_equal(dense @ A, dense)
    assert (A.to_scipy().multiply(A.to_scipy())).nnz == 3


def test_check_format_makes_assigned_arrays_what_the_kernels_read():
    """Arrays assigned after construction (as scipy users do) passed check_format even when a
    conversion then failed inside Cython (a strided or big-endian data array) or a product
    inside Numba (complex values). As scipy's check_format, it makes them native and
    contiguous, with the same values; values of another dtype are refused."""
    dense = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 4.0]])
    for data in (np.repeat(dense[dense != 0], 2)[::2], dense[dense != 0].astype(">f8")):
        A = sph.csr_array(dense)
        A.data = data
        A.check_format(full_check=True)
        assert A.data.flags.c_contiguous and A.data.dtype.isnative
        np.testing.assert_array_equal(A.to_mebcrs().toarray(), dense)
        np.testing.assert_array_equal(A.T.toarray(), dense.T)
    A = sph.csr_array(dense)
    A.indices = A.indices.astype(">i4")
    A.check_format(full_check=True)
    assert A.indices.dtype == np.int32 and A.indices.dtype.isnative
    np.testing.assert_array_equal(A.to_mebcrs().toarray(), dense)
    A = sph.csr_array(dense)
    A.data = A.data.astype(np.complex128)
    with pytest.raises(TypeError, match="data has dtype complex128; csr_array holds float16, "
                                        "float32 or float64 values"):
        A.check_format()
    A = sph.csr_array(dense)
    A.data = list(A.data)
    with pytest.raises(TypeError, match="data must be a NumPy array, got list"):
        A.check_format()


def test_a_meta_tensor_is_refused_with_a_value_error():
    """A tensor on the meta device (shapes only) failed with torch's NotImplementedError
    ("Cannot copy out of meta tensor"), given dense or as a raw array."""
    torch = pytest.importorskip("torch")
    meta = torch.ones(2, 2, device="meta")
    with pytest.raises(ValueError, match="a tensor on the 'meta' device holds no values"):
        sph.csr_array(meta)
    with pytest.raises(ValueError, match="a tensor on the 'meta' device holds no values"):
        sph.csr_array((torch.ones(1, device="meta"), np.array([0]), np.array([0, 1, 1])),
                      shape=(2, 2))


def test_the_transpose_of_the_widest_shape_is_refused_by_its_size():
    """The transpose of a (3, 2**63 - 1) array needs an indptr of 2**63 entries; the count
    overflowed inside the conversion and NumPy spoke of "negative dimensions"."""
    wide = sph.csr_array((3, 2**63 - 1))
    with pytest.raises(ValueError, match="Maximum allowed dimension exceeded: the transpose "
                                         "of a 3 x 9223372036854775807 array"):
        wide.T


# ---------------------------------------------------------------- boundaries, found by mutation
# Every index check was tested well past its limit and none at it: checks loosened from >= to
# > (an index equal to the dimension, which the kernels then read past the end) passed.
def test_an_index_equal_to_the_dimension_is_refused():
    with pytest.raises(ValueError, match="out of range|expected 0 <= "):
        sph.csr_array((np.ones(1), np.array([3]), np.array([0, 1])), shape=(1, 3))
    for rows, cols in (([3], [0]), ([0], [3])):
        with pytest.raises(ValueError):
            sph.csr_array((np.ones(1), (np.array(rows), np.array(cols))), shape=(3, 3))
    largest = sph.csr_array((np.ones(1), (np.array([2]), np.array([2]))), shape=(3, 3))
    assert largest.toarray()[2, 2] == 1.0   # the largest legal index goes through
    M = sph.csr_array(np.eye(3)).to_blocked(window=2, block_width=2)
    at_edge = M.col_idx.copy()
    at_edge[-1] = 3
    with pytest.raises(ValueError, match="expected 0 <= col < 3"):
        sph.blocked_array((M.values, at_edge, M.row_window_offset, M.vector_mask),
                          shape=(3, 3), window=2, block_width=2)


def test_a_repeated_column_in_a_window_is_refused():
    values = np.zeros(16)
    values[[0, 9]] = [1.0, 2.0]
    with pytest.raises(ValueError, match="strictly ascending within each window"):
        sph.mebcrs_array((values, np.array([1, 1]), np.array([0, 2]), None),
                         shape=(8, 5), block_width=1)


@pytest.mark.parametrize("shape", [(3, -1), (-2, 3)])
def test_either_negative_dimension_is_refused(shape):
    with pytest.raises(ValueError, match="non-negative"):
        sph.csr_array(shape)


def test_the_transpose_of_an_array_with_duplicates_does_not_claim_canonical_order():
    B = sph.csr_array((np.array([1.0, 2.0]), np.array([0, 0]), np.array([0, 2])), shape=(1, 1))
    for read_first in (False, True):
        if read_first:
            assert not B.has_canonical_format
        transposed = B.T
        assert not transposed.has_canonical_format
        assert transposed.canonical().nnz == 1 and transposed.canonical().toarray()[0, 0] == 3


def test_tocoo_returns_copies():
    A = sph.csr_array(np.array([[0.0, 2.0], [3.0, 0.0]]))
    triplets = A.tocoo()
    triplets.data[:] = 0
    triplets.col[:] = 0
    triplets.row[:] = 1
    np.testing.assert_array_equal(A.toarray(), [[0.0, 2.0], [3.0, 0.0]])


def test_a_scipy_coo_input_out_of_range_is_refused_before_scipy_converts_it():
    """scipy's COO constructor takes raw coordinates unchecked, and its conversion trusts
    them: the guard is all that stands between such input and memory written out of place."""
    for row, col, named in (([3], [0], r"row\[0\] is 3, out of range for 3 rows"),
                            ([0], [-1], r"col\[0\] is -1, out of range for 3 columns")):
        matrix = scipy.sparse.coo_matrix((np.ones(1), (np.array([0]), np.array([0]))),
                                         shape=(3, 3))
        matrix.row, matrix.col = np.array(row, np.int32), np.array(col, np.int32)
        with pytest.raises(ValueError, match=f"the scipy COO input's {named}"):
            sph.csr_array(matrix)


@pytest.mark.parametrize("call, error, message", [
    (lambda A: sph.spmm(A, np.ones((3, 2, 2))), ValueError, "B must be 1-D or 2-D, got 3-D"),
    (lambda A: sph.spmm(A, np.ones((4, 2))), ValueError,
     r"dimension mismatch: A has shape \(3, 3\) but B has 4 rows"),
    (lambda A: sph.spmm(A, np.ones((3, 2)), out=[[0.0] * 2] * 3), TypeError,
     "out must be a NumPy array or a torch tensor, got list"),
    (lambda A: sph.spmm(A, np.ones((3, 2)), out=np.zeros((3, 2), ">f8")), TypeError,
     "out must be in the machine's byte order"),
    (lambda A: sph.spmm(A, np.ones((3, 2)), precision=16), TypeError,
     "precision must be one of .*, got int 16"),
    (lambda A: sph.spmm(A, np.ones((3, 2)), precision="fp64"), ValueError,
     "precision must be one of .*, got 'fp64'"),
])
def test_spmm_names_each_bad_argument(call, error, message):
    A = sph.csr_array(np.eye(3))
    with pytest.raises(error, match=message):
        call(A)


def test_spmm_refuses_a_read_only_out_and_sddmm_operands_of_two_kinds():
    torch = pytest.importorskip("torch")
    A = sph.csr_array(np.eye(3))
    out = np.zeros((3, 2))
    out.setflags(write=False)
    with pytest.raises(ValueError, match="out must be writable"):
        sph.spmm(A, np.ones((3, 2)), out=out)
    with pytest.raises(TypeError, match="X and Y must be of one kind, got a numpy X and a "
                                        "torch Y"):
        sph.sddmm(A, np.ones((3, 2)), torch.ones(3, 2, dtype=torch.float64))


@pytest.mark.parametrize("rebind, error, message", [
    (lambda A: setattr(A, "indices", A.indices.astype(float)), TypeError,
     "must share one index dtype"),
    (lambda A: setattr(A, "data", A.data.reshape(-1, 1)), ValueError, "must all be 1-D"),
    (lambda A: setattr(A, "data", A.data.astype(np.int64)), TypeError,
     "data has dtype int64"),
    (lambda A: setattr(A, "data", A.data[:5].copy()), ValueError, "data has length 5"),
    (lambda A: setattr(A, "indices", A.indices + 40), ValueError,
     "indices holds column 4[0-9], out of range for 10 columns"),
])
@pytest.mark.parametrize("use", [lambda A, B: A @ B, lambda A, B: sph.sddmm(A, B, B),
                                 lambda A, B: A.to_mebcrs()])
def test_arrays_rebound_after_construction_are_checked_before_the_kernels(rebind, error,
                                                                          message, use):
    """A rebound array reached the kernels unchecked: an integer data gave zeros, a shorter
    one was read past its end, indices out of range sent the kernels outside their operands
    (values of 1e+34), a float index array failed inside Numba's compiler."""
    S = scipy.sparse.random(10, 10, density=0.3, format="csr", random_state=0,
                            dtype=np.float32)
    B = np.ones((10, 4), np.float32)
    A = sph.csr_array(S, copy=True)
    rebind(A)
    with pytest.raises(error, match=message):
        use(A, B)


def test_rebound_arrays_that_are_right_are_taken_and_checked_once():
    S = scipy.sparse.random(10, 10, density=0.3, format="csr", random_state=0)
    B = np.ones((10, 2))
    A = sph.csr_array(S, copy=True)
    A.data = A.data * 2                      # the nn docs' way of changing the weights
    np.testing.assert_allclose(A @ B, 2 * (S @ B))
    checks = []
    original = A._check_arrays
    A._check_arrays = lambda full_check, *args: checks.append(full_check) or original(
        full_check, *args)
    A.indices = A.indices.copy()             # rebound, in range: checked in full once
    for _ in range(3):
        A @ B
    A.data = A.data / 2                      # values rebound: the O(1) checks, once
    for _ in range(3):
        A @ B
    assert checks == [True, False]
    np.testing.assert_allclose(A @ B, S @ B)
    M = sph.csr_array(S).to_mebcrs()
    M.col_idx = M.col_idx + 40
    with pytest.raises(ValueError, match="col_idx holds columns in"):
        M @ B


def test_a_shape_with_a_float_is_named_as_a_shape():
    """(3, 3.0) fell through to "cannot interpret a tuple of length 2"."""
    for shape in ((3, 3.0), (2.0, 3.0)):
        with pytest.raises(TypeError, match="shape entries must be integers, got float"):
            sph.csr_array(shape)
    assert sph.csr_array((np.int64(2), np.array(3))).shape == (2, 3)


def test_vector_collective_counts_of_the_wrong_type_are_named():
    from pysparse_hpc.distributed import Communicator
    comm = Communicator()
    with pytest.raises(TypeError, match="counts must be a sequence of 1 element counts, one "
                                        "per rank, got int 2"):
        comm.Allgatherv(np.ones(2), np.ones(2), 2)
