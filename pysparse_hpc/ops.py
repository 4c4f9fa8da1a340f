"""Public sparse operations: validate and convert the operands, pick the kernel, run it."""
import numba
import numpy as np

from ._base import sparray
from ._blocked import blocked_array
from .kernels.cpu import spmm as _cpu_spmm

__all__ = ["spmm"]


def _compute_dtype(*dtypes):
    """numpy promotion of the operands, with float16 computed (and returned) in float32."""
    dtype = np.result_type(*dtypes)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def spmm(A, B):
    """Sparse times dense: ``A @ B``.

    Parameters
    ----------
    A : csr_array, mebcrs_array or blocked_array, shape (M, K)
    B : array_like, shape (K, N) or (K,)
        Real floating values (float16, float32 or float64). A 1-D ``B`` gives a matrix-vector
        product of shape (M,), as in scipy.

    Returns
    -------
    ndarray, shape (M, N) or (M,)
        dtype follows numpy promotion of ``A.dtype`` and ``B.dtype``; float16 operands are
        computed and returned in float32.

    Raises
    ------
    TypeError
        If ``A`` is not a pysparse_hpc sparse array or ``B`` is not real floating point.
    ValueError
        If the inner dimensions differ or ``B`` is not 1-D or 2-D.
    """
    if not isinstance(A, sparray):
        raise TypeError(f"A must be a pysparse_hpc sparse array, got {type(A).__name__}")
    B = np.asarray(B)
    if B.dtype.kind != "f" or B.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"B must hold float16, float32 or float64 values, got dtype {B.dtype}")
    if B.ndim not in (1, 2):
        raise ValueError(f"B must be 1-D or 2-D, got {B.ndim}-D with shape {B.shape}")
    if B.shape[0] != A.shape[1]:
        raise ValueError(
            f"dimension mismatch: A has shape {A.shape} but B has {B.shape[0]} rows; "
            f"expected B.shape[0] == {A.shape[1]}"
        )
    vector = B.ndim == 1
    dtype = _compute_dtype(A.dtype, B.dtype)
    dense = np.ascontiguousarray((B[:, None] if vector else B), dtype=dtype)
    out = np.empty((A.shape[0], dense.shape[1]), dtype=dtype)
    n_parts = 4 * numba.get_num_threads()
    if isinstance(A, blocked_array):
        window_bounds = _cpu_spmm.balanced_parts(A.row_window_offset, n_parts)
        _cpu_spmm.blocked_spmm(A.row_window_offset, A.col_idx, A.values.astype(dtype, copy=False),
                               A.vector_mask, A.window, A.block_width, dense, out, window_bounds)
    else:
        csr = A.tocsr()
        row_bounds = _cpu_spmm.balanced_parts(csr.indptr, n_parts)
        _cpu_spmm.csr_spmm(csr.indptr, csr.indices, csr.data.astype(dtype, copy=False), dense, out,
                           row_bounds)
    return out[:, 0] if vector else out
