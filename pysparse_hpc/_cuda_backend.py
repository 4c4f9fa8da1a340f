"""The CUDA backend of `spmm` and `sddmm`: device placement of the operands, choice of kernel.

Imported only when ``backend="cuda"`` is asked for (or chosen by ``"auto"`` for device data), so
the CPU path never touches the CUDA toolchain. The CUDA simulator counts as a GPU when it is
enabled (``NUMBA_ENABLE_CUDASIM=1`` before numba is imported).
"""
import sys

import numpy as np

from ._blocked import blocked_array
from ._config import cuda_split_blocks, cuda_warps_per_block
from ._dense import is_device_array

__all__ = ["PRECISIONS", "pattern_spmm_cuda", "require_gpu", "spmm_cuda", "sddmm_cuda"]

#: "fp32": CUDA-core CSR kernel; "tf32" and "fp16": tensor-core ME-BCRS kernels with tf32 or
#: fp16 inputs, both accumulating in fp32.
PRECISIONS = ("fp32", "tf32", "fp16")


def require_gpu():
    """The ``numba.cuda`` module, or a RuntimeError that says what is missing."""
    from numba import cuda
    if not cuda.is_available():
        raise RuntimeError(
            "backend='cuda' needs a CUDA GPU, and numba.cuda finds none (no NVIDIA driver or "
            "device). Use backend='cpu', or set NUMBA_ENABLE_CUDASIM=1 before numba is imported "
            "to run the CUDA kernels on the simulator (slow; for testing).")
    return cuda


def _numpy_dtype(array):
    """The NumPy dtype of a NumPy, Numba, CuPy or torch array (torch's are named alike)."""
    return np.dtype(str(array.dtype).replace("torch.", ""))


def _on_device(cuda, host_or_device, dtype, name):
    """A device view of an operand: zero-copy for device data, a transfer for host data."""
    if is_device_array(host_or_device):
        view = (host_or_device if not hasattr(host_or_device, "__cuda_array_interface__")
                else cuda.as_cuda_array(host_or_device))
        if _numpy_dtype(view) != dtype:
            raise TypeError(f"{name} on the device has dtype {view.dtype}; this precision needs "
                            f"{dtype} (convert it on the device first)")
        return view
    return cuda.to_device(np.ascontiguousarray(host_or_device, dtype=dtype))


def _cached(owner, key, source, build):
    """``build()`` once per ``source`` array, kept on ``owner``: a sparse array's structure never
    changes in place, and an operation that replaces an array invalidates by identity."""
    cache = owner.__dict__.setdefault("_device_cache", {})
    entry = cache.get(key)
    if entry is None or entry[0] is not source:
        entry = (source, build())
        cache[key] = entry
    return entry[1]


def _device_arrays(cuda, A, names):
    """A's arrays on the device, transferred once."""
    return [_cached(A, name, getattr(A, name), lambda name=name: cuda.to_device(getattr(A, name)))
            for name in names]


def _empty_like_kind(cuda, operand, shape, dtype):
    """An output of the kind of ``operand``: a torch/CuPy array on its device, else Numba's."""
    original = operand.original
    if operand.kind == "torch" and operand.device == "cuda":
        torch = sys.modules["torch"]
        result = torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name),
                             device=original.device)
        return result, cuda.as_cuda_array(result)
    if operand.kind == "cupy":
        cupy = sys.modules["cupy"]
        result = cupy.empty(shape, dtype=dtype)
        return result, cuda.as_cuda_array(result)
    result = cuda.device_array(shape, dtype=dtype)
    return result, result


def spmm_cuda(A, operand, precision):
    """``A @ B`` on the GPU; ``operand`` is the validated dense B (see `ops.spmm`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cuda = require_gpu()
    from .kernels.cuda import spmm as kernels

    B = operand.original if operand.device == "cuda" else operand.array
    if len(B.shape) != 2:
        raise ValueError(f"the CUDA backend takes a 2-D B, got shape {tuple(B.shape)}")
    if B.shape[0] != A.shape[1]:
        raise ValueError(f"dimension mismatch: A has shape {A.shape} but B has {B.shape[0]} "
                         f"rows; expected B.shape[0] == {A.shape[1]}")
    if _numpy_dtype(B) not in (np.float32, np.float64):
        raise TypeError(f"B must hold float32 or float64 values on the GPU, got {B.dtype}")
    if precision in ("tf32", "fp16"):
        M = _mma_operand(A, precision, allow_window16=True)
        dtype = np.dtype(np.float32)
        offsets, col_idx = _device_arrays(cuda, M, ("row_window_offset", "col_idx"))
        values = _cached(M, "values_float32", M.values,
                         lambda: cuda.to_device(M.values.astype(np.float32)))
        device_B = _on_device(cuda, B, dtype, "B")
        result, device_out = _result(cuda, operand, (A.shape[0], B.shape[1]), dtype)
        kernel = "tf32-16x1" if M.window == 16 else precision
        kernels.launch_mebcrs_spmm(_DeviceMebcrs(offsets, col_idx, values, M.shape), device_B,
                                   device_out, cuda_warps_per_block(), kernel,
                                   _parts(cuda, kernels, M))
    else:
        csr = A.tocsr()  # duplicates are fine: the kernel sums every stored entry
        dtype = np.result_type(csr.dtype, _numpy_dtype(B), np.float32)
        indptr, indices = _device_arrays(cuda, csr, ("indptr", "indices"))
        device_B = _on_device(cuda, B, dtype, "B")
        result, device_out = _result(cuda, operand, (A.shape[0], B.shape[1]), dtype)
        kernels.launch_csr_spmm(indptr, indices, cuda.to_device(csr.data.astype(dtype)), device_B,
                                device_out)
    if operand.device == "cuda":
        return result
    host = device_out.copy_to_host()
    return sys.modules["torch"].from_numpy(host) if operand.kind == "torch" else host


def _parts(cuda, kernels, M):
    """The load-balanced part list of M on the device, built once per split threshold."""
    split = cuda_split_blocks()

    def build():
        host = kernels.mma_parts(M.row_window_offset, split)
        return tuple(cuda.to_device(np.ascontiguousarray(a)) for a in host) + (
            bool(host[3].any()),)
    return _cached(M, ("parts", split), M.row_window_offset, build)


class _DeviceMebcrs:
    """The arrays the tensor-core kernels read, on the device."""

    def __init__(self, row_window_offset, col_idx, values, shape, vector_mask=None):
        self.row_window_offset, self.col_idx, self.values, self.shape = (
            row_window_offset, col_idx, values, shape)
        self.vector_mask = vector_mask


def _result(cuda, operand, shape, dtype):
    if operand.device == "cuda":
        return _empty_like_kind(cuda, operand, shape, dtype)
    device_out = cuda.device_array(shape, dtype=dtype)
    return None, device_out


def _mma_operand(A, precision, allow_window16=False):
    """The 8x1, k = 8 ME-BCRS array the tensor-core kernels need (a CSR input is converted
    once and the result kept on it). A 16-row, k = 8 blocked array runs the 16x1 tf32 ablation."""
    if isinstance(A, blocked_array):
        if allow_window16 and (A.window, A.block_width, precision) == (16, 8, "tf32"):
            return A
        if (A.window, A.block_width) != (8, 8):
            raise ValueError(
                f"precision={precision!r} needs ME-BCRS with 8-row windows and block_width=8, "
                f"got window {A.window} and block_width {A.block_width}; convert with "
                "A.tocsr().to_mebcrs(8)")
        return A
    return _cached(A, "mebcrs8", A.indices, lambda: A.to_mebcrs(block_width=8))


def sddmm_cuda(A, x_operand, y_operand, alpha, beta, precision):
    """`ops.sddmm` on the GPU, single-head. Host operands give a sparse array of A's class;
    device operands give the values as a device array of X's kind, in the storage order of the
    array the kernel ran on (A's own; for tf32 with a CSR ``A``, that of ``A.to_mebcrs(8)``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp16":
        raise NotImplementedError("precision='fp16' SDDMM (mma m16n8k16) is not available yet; "
                                  "use 'tf32' or 'fp32'")
    cuda = require_gpu()
    from .kernels.cuda import sddmm as kernels

    X = x_operand.original if x_operand.device == "cuda" else x_operand.array
    Y = y_operand.original if y_operand.device == "cuda" else y_operand.array
    if len(X.shape) != 2 or len(Y.shape) != 2:
        raise NotImplementedError("multi-head SDDMM on the CUDA backend is not available yet; "
                                  "pass 2-D X and Y (one head at a time)")
    if X.shape[0] != A.shape[0] or Y.shape[0] != A.shape[1]:
        raise ValueError(
            f"dimension mismatch: A has shape {A.shape}, so X needs {A.shape[0]} rows and Y "
            f"{A.shape[1]}; got {X.shape[0]} and {Y.shape[0]}")
    if X.shape[1] != Y.shape[1]:
        raise ValueError(f"X and Y widths differ: {X.shape[1]} and {Y.shape[1]}")
    dtype = np.dtype(np.float32) if precision == "tf32" else np.result_type(
        A.dtype, np.float32, _numpy_dtype(X), _numpy_dtype(Y))
    device_X = _on_device(cuda, X, dtype, "X")
    device_Y = _on_device(cuda, Y, dtype, "Y")
    if precision == "tf32":
        stored = _mma_operand(A, precision)
        offsets, col_idx, mask = _device_arrays(cuda, stored, ("row_window_offset", "col_idx",
                                                               "vector_mask"))
        result, device_out = _result(cuda, x_operand, (stored.values.size,), dtype)
        widest = int(np.diff(stored.row_window_offset).max(initial=0))
        kernels.launch_mebcrs_sddmm_tf32(_DeviceMebcrs(offsets, col_idx, None, stored.shape,
                                                       vector_mask=mask),
                                         device_X, device_Y, device_out, widest)
    else:
        stored = A.tocsr()
        device_rows = _cached(stored, "entry_rows", stored.indptr, lambda: cuda.to_device(
            np.repeat(np.arange(stored.shape[0], dtype=stored.index_dtype),
                      np.diff(stored.indptr))))
        indices, = _device_arrays(cuda, stored, ("indices",))
        result, device_out = _result(cuda, x_operand, (stored.nnz,), dtype)
        kernels.launch_csr_sddmm(device_rows, indices, device_X, device_Y, device_out)
    # A's values are read only for beta != 0.
    addend = device_out if beta == 0 else cuda.to_device(
        (stored.values if precision == "tf32" else stored.data).astype(dtype))
    kernels.launch_scale_add(device_out, addend, dtype.type(alpha), dtype.type(beta))
    if x_operand.device == "cuda":
        return result
    from .ops import _with_values
    result = _with_values(stored, device_out.copy_to_host())
    # The kernel may have run on A's other form (CSR for fp32, ME-BCRS for tf32): hand back A's.
    if isinstance(A, blocked_array) and not isinstance(result, blocked_array):
        return result.to_blocked(A.window, A.block_width)
    return result.tocsr() if not isinstance(A, blocked_array) else result


def pattern_spmm_cuda(csr, values, B):
    """``A @ B`` for A = ``csr``'s pattern holding per-edge ``values`` on the GPU: (nnz,) with
    B (K, F), or (nnz, heads) with B (K, heads, F), one CUDA-core CSR product per head on
    strided views. ``values`` and B are torch CUDA tensors (the result is one too) or Numba
    device arrays (the result is a Numba device array)."""
    cuda = require_gpu()
    from .kernels.cuda import spmm as kernels
    torch = sys.modules.get("torch")
    indptr, indices = _device_arrays(cuda, csr, ("indptr", "indices"))
    shape = (csr.shape[0],) + tuple(B.shape[1:])
    if torch is not None and isinstance(B, torch.Tensor):
        out = torch.empty(shape, dtype=B.dtype, device=B.device)
        view = cuda.as_cuda_array
    else:
        out = cuda.device_array(shape, dtype=B.dtype)
        view = lambda array: array  # noqa: E731 - already a device array
    if values.ndim == 1:
        kernels.launch_csr_spmm(indptr, indices, view(values), view(B), view(out))
        return out
    for h in range(values.shape[1]):
        kernels.launch_csr_spmm(indptr, indices, view(values[:, h]), view(B[:, h]),
                                view(out[:, h]))
    return out
