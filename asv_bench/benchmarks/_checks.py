"""Checks that ``setup`` runs once on the benchmarked operations before asv times them.

A benchmark that times a wrong result is worse than none: each ``setup`` compares ours with the
peer (or with the plain definition) on the same operands and raises AssertionError, which asv
reports as a failed benchmark, rather than timing it.
"""
import numpy as np


def dense(result):
    """A NumPy array of a dense NumPy or torch result."""
    if hasattr(result, "detach"):
        return result.detach().numpy()
    return np.asarray(result)


def check_same_csr(what, got, expected):
    """AssertionError naming ``what`` unless the CSR arrays ``got`` and ``expected`` (ours or
    scipy's, canonical) have the same shape, structure and values, compared without densifying
    (the largest shared matrices would not fit)."""
    same = got.shape == expected.shape and all(
        np.array_equal(getattr(got, name), getattr(expected, name))
        for name in ("indptr", "indices", "data"))
    if not same:
        raise AssertionError(f"{what}: not the same CSR array as the reference")


def check_close(what, got, expected, rtol=1e-4):
    """AssertionError naming ``what`` unless ``got`` equals ``expected`` within ``rtol`` of the
    largest expected magnitude (float32 sums of a few hundred terms, in another order)."""
    got, expected = dense(got), dense(expected)
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {expected.shape}")
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-30)
    error = float(np.abs(got - expected).max(initial=0.0)) / scale
    if not error <= rtol:  # NaN fails too
        raise AssertionError(f"{what}: differs from the reference by {error:.3g} of its largest "
                             f"value (allowed {rtol:g})")
