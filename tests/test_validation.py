"""Bad input: a clear TypeError/ValueError that says what was found, and nothing modified."""
import numpy as np
import pytest

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
    ("23", TypeError, "tuple of two integers"),
    (5, TypeError, "tuple of two integers"),
])
def test_bad_shape(shape, error, message):
    with pytest.raises(error, match=message):
        sph.csr_array(raw(), shape=shape)


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
