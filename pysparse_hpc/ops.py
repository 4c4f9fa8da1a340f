"""Public sparse operations: validate and convert the operands, pick the kernel, run it.

Dtypes: the computation runs in numpy's promotion of the operands' dtypes, except that float16
(a storage format) is computed and returned in float32. Mixed float32/float64 operands therefore
give float64 results; integer, boolean and complex operands are rejected with a TypeError.
"""
import contextlib
import functools
import math
import sys

import numpy as np

from . import _buffers
from ._base import sparray
from ._blocked import blocked_array, unpack_vector_mask, value_positions
from ._config import get_num_threads, parallel_launch, parallel_min_flops, spmm_tile
from ._dense import as_dense, is_torch_tensor, wrap_like
from ._sputils import described_sparse, is_real_number
from .kernels.cpu import sddmm as _cpu_sddmm
from .kernels.cpu import spmm as _cpu_spmm

__all__ = ["spmm", "sddmm"]

_BACKENDS = ("auto", "cpu", "cuda")
_PRECISIONS = ("fp32", "tf32", "fp16")   # the CUDA backend's, checked there too
# Parts per thread: several, so a part that hits a dense region does not leave a thread idle.
_PARTS_PER_THREAD = 8


@functools.lru_cache(maxsize=64)   # np.result_type costs about 1 us, a small SpMM 20 us
def _compute_dtype(*dtypes):
    dtype = np.result_type(*dtypes)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _check_precision(precision):
    """Refuse a precision that no backend has, before the CPU's "applies to the CUDA backend"
    could describe it as one the GPU takes."""
    if not isinstance(precision, str):
        raise TypeError(f"precision must be one of {_PRECISIONS}, got "
                        f"{type(precision).__name__} {precision!r}")
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")


def _check_sparse(A):
    if not isinstance(A, sparray):
        raise TypeError(f"A must be a pysparse_hpc sparse array, got {described_sparse(A)}")
    A._check_for_kernels()
    return A


def _resolve_backend(backend, operands):
    # a str first: an array's `in` compares element-wise ("truth value is ambiguous")
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    on_device = [op for op in operands if op.device != "cpu"]
    if backend == "auto":
        backend = "cuda" if on_device else "cpu"
    if backend == "cpu" and on_device:
        raise ValueError(
            f"an operand lives on the GPU ({type(on_device[0].original).__name__} on "
            f"'{on_device[0].device}') but backend='cpu'; move it to host memory or use "
            "backend='cuda'")
    return backend


def _launch(parallel_kernel, serial_kernel, owner, offsets, flops, *args):
    """Run a kernel over the rows (windows) of ``offsets``: in parallel over a nonzero-balanced
    partition, or serially when one thread suffices or the work is too small to share."""
    # The flop test first: it is cheap, and small products are where call overhead shows.
    threads = 1 if flops < parallel_min_flops() else get_num_threads()
    if threads == 1:
        serial_kernel(*args, _NO_PARTS)
        return
    n_parts = _PARTS_PER_THREAD * threads
    # The partition depends only on the structure: keep it on the array for the next call.
    cached = getattr(owner, "_partition", None)
    if cached is None or cached[0] is not offsets or cached[1] != n_parts:
        cached = (offsets, n_parts, _cpu_spmm.balanced_parts(offsets, n_parts))
        owner._partition = cached
    with parallel_launch():
        parallel_kernel(*args, cached[2])


_NO_PARTS = np.zeros(2, dtype=np.int64)  # the serial drivers take (and ignore) a partition


def _check_out(out, like, shape, dtype):
    """``out`` must match the result exactly: same kind as ``like``, shape, dtype, contiguous."""
    if not (isinstance(out, np.ndarray) or is_torch_tensor(out)):
        # A list would be converted to a temporary array and the result written there.
        raise TypeError(f"out must be a NumPy array or a torch tensor, got {type(out).__name__}")
    if isinstance(out, np.ndarray) and not out.dtype.isnative:
        raise TypeError(f"out must be in the machine's byte order, got dtype {out.dtype}")
    if is_torch_tensor(out) and out.is_neg():
        # its memory holds -out: the result would go to a resolved copy and be lost
        raise ValueError("out is a lazily negated view (torch's negative bit); pass a tensor "
                         "without it")
    operand = as_dense(out, "out")
    if operand.kind != like.kind or operand.device != like.device:
        raise TypeError(f"out must be a {like.kind} array like B, got {type(out).__name__}")
    array = operand.array
    if array.shape != shape:
        raise ValueError(f"out has shape {array.shape}, expected {shape}")
    if array.dtype != dtype:
        raise TypeError(f"out has dtype {array.dtype}, expected the result dtype {dtype}")
    if not array.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not array.flags.writeable:
        raise ValueError("out must be writable")
    return array


def _check_out_apart(out, A, B):
    """``out`` must share no memory with ``B`` or the arrays of ``A`` the product reads: the
    kernels write a row of ``out`` while later rows still read B's rows and A's values (and
    its structure)."""
    if np.may_share_memory(out, B):
        raise ValueError("out overlaps B; the product would read rows it has already written")
    if isinstance(A, blocked_array):
        arrays = (("values", A.values), ("col_idx", A.col_idx),
                  ("row_window_offset", A.row_window_offset), ("vector_mask", A.vector_mask))
    else:
        arrays = (("data", A.data), ("indices", A.indices), ("indptr", A.indptr))
    for name, array in arrays:
        if np.may_share_memory(out, array):
            raise ValueError(
                f"out overlaps A.{name}; the product would read entries it has already "
                "written (pass a separate out array, or copy A first)")


def spmm(A, B, *, out=None, backend="auto", precision="fp32"):
    """Sparse times dense: ``A @ B``.

    Parameters
    ----------
    A : csr_array, mebcrs_array or blocked_array, shape (M, K)
    B : numpy.ndarray or torch.Tensor, shape (K, N) or (K,)
        Real floating values. Torch CPU tensors are read in place, whatever their strides. A 1-D
        ``B`` gives a matrix-vector product of shape (M,), as in scipy.
    out : numpy.ndarray or torch.Tensor, optional
        Where to write the result: same kind as ``B``, the result's shape and dtype,
        C-contiguous, sharing no memory with ``B`` or ``A``'s arrays. Checked before anything
        is written.
    backend : {"auto", "cpu", "cuda"}
        "auto" runs where the operands live. "cuda" takes host data (copied over and back) or
        device data (torch CUDA tensors, CuPy and Numba device arrays, read in place) and needs
        a GPU or the enabled CUDA simulator.
    precision : {"fp32", "tf32", "fp16"}
        GPU only: "fp32" runs the CUDA-core CSR kernel; "tf32" and "fp16" the tensor-core ME-BCRS
        kernels (tf32 or fp16 inputs rounded from float32, fp32 accumulation; a CSR ``A`` is
        converted once and the result kept; a 16-row blocked ``A`` with ``precision="tf32"``
        runs the 16x1 ablation kernel). On the tensor-core path a NaN or infinity in B
        reaches every row of the windows that read that row of B (padding multiplies it by 0).

    Returns
    -------
    numpy.ndarray or torch.Tensor
        Same kind as ``B``; dtype per the module's promotion rule (tf32 and fp16: float32).

    Raises
    ------
    TypeError
        ``A`` is not a pysparse_hpc sparse array; ``B`` or ``out`` has the wrong type or dtype.
    ValueError
        Shapes do not match, ``B`` is not 1-D or 2-D, ``out`` is not contiguous or overlaps ``B``
        or ``A``, or an operand on the GPU meets ``backend="cpu"``.

    Examples
    --------
    >>> import numpy as np
    >>> import pysparse_hpc as sph
    >>> A = sph.csr_array(np.array([[1.0, 0.0], [2.0, 3.0]]))
    >>> sph.spmm(A, np.ones((2, 3)))
    array([[1., 1., 1.],
           [5., 5., 5.]])
    """
    A = _check_sparse(A)
    _check_precision(precision)
    dense = as_dense(B, "B", "use A @ B or pysparse_hpc.nn.functional.spmm for a gradient")
    if _resolve_backend(backend, [dense]) == "cuda":
        if out is not None:
            raise NotImplementedError("out= is not supported by the CUDA backend yet")
        from ._cuda_backend import spmm_cuda
        return spmm_cuda(A, dense, precision)
    if precision != "fp32":
        raise ValueError(f"precision={precision!r} applies to the CUDA backend; the CPU computes "
                         "in the operands' own precision (leave precision='fp32')")
    B = dense.array
    if B.ndim not in (1, 2):
        raise ValueError(f"B must be 1-D or 2-D, got {B.ndim}-D with shape {B.shape}")
    if B.shape[0] != A.shape[1]:
        raise ValueError(
            f"dimension mismatch: A has shape {A.shape} but B has {B.shape[0]} rows; "
            f"expected B.shape[0] == {A.shape[1]}")
    vector = B.ndim == 1
    dtype = _compute_dtype(A.dtype, B.dtype)
    result_shape = (A.shape[0],) if vector else (A.shape[0], B.shape[1])
    result = (_buffers.empty(result_shape, dtype) if out is None
              else _check_out(out, dense, result_shape, dtype))
    csr = None if isinstance(A, blocked_array) else A.tocsr()
    if out is not None:
        _check_out_apart(result, A if csr is None else csr, B)
    matrix = B[:, None] if vector else B
    matrix = matrix.astype(dtype, copy=False)
    result_2d = result[:, None] if vector else result
    flops = 2 * A.nnz * matrix.shape[1]
    if csr is None:
        _launch(_cpu_spmm.blocked_spmm, _cpu_spmm.blocked_spmm_serial, A, A.row_window_offset,
                flops, A.row_window_offset, A.col_idx, A.values.astype(dtype, copy=False),
                A.vector_mask, A.window, A.block_width, matrix, result_2d)
    else:
        _launch(_cpu_spmm.csr_spmm, _cpu_spmm.csr_spmm_serial, csr, csr.indptr, flops,
                csr.indptr, csr.indices, csr.data.astype(dtype, copy=False), matrix, result_2d,
                spmm_tile())
    return out if out is not None else wrap_like(dense, result)


# float32's range: from its smallest normal number up to what rounds to its largest one.
_FLOAT32_TINY = 2.0 ** -126
_FLOAT32_OVERFLOW = (2.0 - 2.0 ** -24) * 2.0 ** 127


def _beyond_float32(alpha, beta):
    """Whether float32 would not hold alpha or beta to its precision: a finite value that it
    rounds to inf, or to a subnormal or 0 (0, the infinities and NaN it holds)."""
    alpha, beta = abs(alpha), abs(beta)
    return (_FLOAT32_TINY > alpha > 0.0 or _FLOAT32_OVERFLOW <= alpha < math.inf
            or _FLOAT32_TINY > beta > 0.0 or _FLOAT32_OVERFLOW <= beta < math.inf)


def _real_item(value):
    """A 0-d NumPy array or torch tensor of real numbers as its Python number (NumPy, and
    torch's Scalar arguments, take them as scalars); anything else unchanged."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "fiu":
        return value.item()
    if (is_torch_tensor(value) and value.ndim == 0 and not value.dtype.is_complex
            and value.dtype is not sys.modules["torch"].bool and not value.requires_grad):
        return value.item()
    return value


def _check_scalar(value, name):
    if type(value) is float:   # the defaults, and most calls: 4 us of checks on a 1 us kernel
        return value
    if is_torch_tensor(value) and value.requires_grad:
        raise TypeError(f"{name} is a tensor that requires grad, but sddmm's scalars are "
                        "constants: multiply the result by it to differentiate in it")
    value = _real_item(value)
    if not is_real_number(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int past float64's range
        raise ValueError(f"{name} must fit in a float64, got {value!r}") from None


def sddmm(A, X, Y, *, alpha=1.0, beta=0.0, backend="auto", precision="fp32"):
    """Sampled dense-dense product on A's pattern: ``alpha * (X @ Y.T)[i, j] + beta * A[i, j]``.

    Computed only at A's stored entries (torch's ``sampled_addmm(A, X, Y.T, beta, alpha)``),
    one result per stored slot: a CSR ``A`` with duplicates (two slots for one position) gets
    the product in each, so the summed dense view counts it once per slot. Call
    ``A.canonical()`` first for one value per position (the blocked formats are built from the
    canonical pattern already).

    Parameters
    ----------
    A : csr_array, mebcrs_array or blocked_array, shape (M, K)
        The pattern (and, when ``beta != 0``, the values added).
    X : numpy.ndarray or torch.Tensor, shape (M, F) or (M, heads, F)
    Y : numpy.ndarray or torch.Tensor, shape (K, F) or (K, heads, F)
        Same kind (on the CPU: a NumPy X with a NumPy Y, a tensor with a tensor; the GPU
        backend also takes host operands beside device ones) and number of dimensions as
        ``X``. The 3-D form computes one SDDMM per head (multi-head attention).
    alpha, beta : float
        A Python or NumPy number, or a 0-d array or tensor of one (constants: a tensor that
        requires grad is refused). With ``beta == 0`` A's values are not read (a NaN there
        does not propagate). An infinite one leaves a blocked result's padding slots 0; with
        device operands whose result keeps blocked slots (the tensor-core path,
        "tf32"/"fp16"; "fp32" runs on ``A.tocsr()``, which has none) it is refused: the
        padding would be ``inf * 0``. On the CPU, a float32 result with a scalar that float32
        does not hold (beyond its range, or below its smallest normal number) is combined in
        float64 and rounded once, so ``alpha=1e39`` scales small products to finite values;
        the CUDA backend, which scales in float32, refuses such scalars.
    backend : {"auto", "cpu", "cuda"}
        As for `spmm`. With device operands the CUDA backend returns the values as a device
        array of X's kind, in the storage order of the array the kernel ran on (A's own; for
        "tf32"/"fp16" with a CSR ``A`` that of ``A.to_mebcrs(8)``, for "fp32" with a blocked
        ``A`` that of ``A.tocsr()``); with host operands it returns what the CPU returns.
    precision : {"fp32", "tf32", "fp16"}
        GPU only: "fp32" runs the CUDA-core CSR kernel in the operands' precision; "tf32"
        (``mma.m16n8k8``) and "fp16" (``mma.m16n8k16``; half device operands are read as they
        are) the tensor-core ME-BCRS kernel, accumulating in float32 (a CSR ``A`` is converted
        once and the result kept).

    Returns
    -------
    sparse array or numpy.ndarray or torch.Tensor
        2-D X and Y: a sparse array of A's class and pattern holding the results (it shares A's
        index arrays). 3-D: an array of the kind of X, shape (stored slots, heads), aligned with
        A's storage: ``A.data`` order for CSR, ``A.values`` order (padding slots 0) for blocked.

    Examples
    --------
    >>> import numpy as np
    >>> import pysparse_hpc as sph
    >>> A = sph.csr_array(np.array([[1.0, 0.0], [0.0, 1.0]]))
    >>> sph.sddmm(A, np.ones((2, 3)), np.full((2, 3), 2.0)).toarray()
    array([[6., 0.],
           [0., 6.]])
    """
    A = _check_sparse(A)
    _check_precision(precision)
    alpha = _check_scalar(alpha, "alpha")
    beta = _check_scalar(beta, "beta")
    hint = "use pysparse_hpc.nn.functional.sddmm for a gradient"
    x_operand, y_operand = as_dense(X, "X", hint), as_dense(Y, "Y", hint)
    on_gpu = _resolve_backend(backend, [x_operand, y_operand]) == "cuda"
    if not on_gpu and x_operand.kind != y_operand.kind:
        # Documented as one kind: a 3-D result took X's kind whatever Y was. (The GPU
        # backend takes host operands beside device ones, and returns X's kind.)
        raise TypeError(f"X and Y must be of one kind, got a {x_operand.kind} X and a "
                        f"{y_operand.kind} Y; convert one of them")
    X, Y = ((x_operand.original, y_operand.original) if on_gpu
            else (x_operand.array, y_operand.array))
    _check_sddmm_shapes(A, tuple(X.shape), tuple(Y.shape))
    if on_gpu:
        from ._cuda_backend import sddmm_cuda
        return sddmm_cuda(A, x_operand, y_operand, alpha, beta, precision)
    if precision != "fp32":
        raise ValueError(f"precision={precision!r} applies to the CUDA backend; the CPU computes "
                         "in the operands' own precision (leave precision='fp32')")
    multi_head = X.ndim == 3
    dtype = _compute_dtype(A.dtype, X.dtype, Y.dtype)
    X = X.astype(dtype, copy=False)
    Y = Y.astype(dtype, copy=False)
    slots_shape = (A.values.size if isinstance(A, blocked_array) else A.nnz,) + X.shape[1:-1]
    result = _buffers.empty(slots_shape, dtype)
    flops = 2 * A.nnz * (X.shape[1] * X.shape[2] if multi_head else X.shape[1])
    zero = dtype.type(0)
    if isinstance(A, blocked_array):
        stored_values = A.values
        _launch(_cpu_sddmm.blocked_sddmm, _cpu_sddmm.blocked_sddmm_serial, A, A.row_window_offset,
                flops, A.row_window_offset, A.col_idx, A.vector_mask, A.window, A.block_width, X,
                Y, zero, result)
    else:
        A = A.tocsr()
        stored_values = A.data
        _launch(_cpu_sddmm.csr_sddmm, _cpu_sddmm.csr_sddmm_serial, A, A.indptr, flops, A.indptr,
                A.indices, X, Y, zero, result)
    # alpha and beta in one vectorized pass (padding slots hold 0 in both terms).
    blocked = isinstance(A, blocked_array)
    # a blocked A's padding slots meet an infinite alpha or beta as inf * 0: zeroed below
    with np.errstate(invalid="ignore") if blocked else contextlib.nullcontext():
        if ((alpha != 1.0 or beta != 0.0) and dtype.type is np.float32
                and _beyond_float32(alpha, beta)):
            # float32 would turn alpha = 1e39 into inf (or 1e-40 into a subnormal) while
            # alpha * dot is a float32: combine in float64 and round the result once
            combined = result.astype(np.float64)
            combined *= alpha
            if beta != 0.0:
                addend = stored_values.astype(np.float64)
                combined += beta * (addend[:, None] if multi_head else addend)
            result[...] = combined
        else:
            if alpha != 1.0:
                result *= dtype.type(alpha)
            if beta != 0.0:
                addend = stored_values.astype(dtype, copy=False)
                result += dtype.type(beta) * (addend[:, None] if multi_head else addend)
    if blocked and not (math.isfinite(alpha) and math.isfinite(beta)):
        # inf * 0 is NaN: the padding slots must stay 0 (the format's rule, which the kernels
        # and the tensor-core path rely on)
        present = unpack_vector_mask(A.vector_mask, A.n_vectors, A.window)
        result[value_positions(A.row_window_offset, A.window, A.block_width)[~present]] = 0
    if multi_head:
        return wrap_like(x_operand, result)
    return _with_values(A, result)


def _check_sddmm_shapes(A, x_shape, y_shape):
    if len(x_shape) != len(y_shape) or len(x_shape) not in (2, 3):
        raise ValueError(
            f"X and Y must both be 2-D (n, F) or both 3-D (n, heads, F); got {len(x_shape)}-D "
            f"and {len(y_shape)}-D")
    if x_shape[0] != A.shape[0] or y_shape[0] != A.shape[1]:
        raise ValueError(
            f"dimension mismatch: A has shape {A.shape}, so X needs {A.shape[0]} rows and Y "
            f"{A.shape[1]}; got {x_shape[0]} and {y_shape[0]}")
    if x_shape[1:] != y_shape[1:]:
        what = "widths" if len(x_shape) == 2 else "(heads, width)"
        raise ValueError(f"X and Y {what} differ: {x_shape[1:]} and {y_shape[1:]}")


def _with_values(A, values):
    """A sparse array of A's class and pattern (index arrays shared) holding ``values``."""
    result = type(A).__new__(type(A))
    if isinstance(A, blocked_array):
        result._set_arrays(values, A.col_idx, A.row_window_offset, A.vector_mask, A.shape,
                           A.window, A.block_width)
        result._nnz = A._nnz
    else:
        result._set_arrays(values, A.indices, A.indptr, A.shape, A._canonical)
    return result


def pattern_spmm(csr, values, B):
    """``A @ B`` where A is ``csr``'s pattern holding ``values`` instead of its own data.

    The kernel behind attention: ``values`` (nnz,) with B (K, F), or ``values`` (nnz, heads)
    with B (K, heads, F) for one matrix per head. NumPy in and out, already validated by the
    caller (`pysparse_hpc.nn.functional`), in floating dtypes; computed and returned in their
    promotion, float16 in float32 (as `spmm`: the kernels have no half-precision code).
    """
    dtype = _compute_dtype(values.dtype, B.dtype)
    values = values.astype(dtype, copy=False)
    B = B.astype(dtype, copy=False)
    out = _buffers.empty((csr.shape[0],) + B.shape[1:], dtype)
    flops = 2 * csr.nnz * int(np.prod(B.shape[1:]))
    if values.ndim == 1:
        _launch(_cpu_spmm.csr_spmm, _cpu_spmm.csr_spmm_serial, csr, csr.indptr, flops,
                csr.indptr, csr.indices, values, B, out, spmm_tile())
    else:
        _launch(_cpu_spmm.csr_spmm_heads, _cpu_spmm.csr_spmm_heads_serial, csr, csr.indptr,
                flops, csr.indptr, csr.indices, values, B, out)
    return out
