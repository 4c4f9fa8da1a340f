"""The CUDA backend of `spmm` and `sddmm`: device placement of the operands, choice of kernel.

Imported only when ``backend="cuda"`` is asked for (or chosen by ``"auto"`` for device data), so
the CPU path never touches the CUDA toolchain. The CUDA simulator counts as a GPU when it is
enabled (``NUMBA_ENABLE_CUDASIM=1`` before numba is imported).
"""
import math
import sys

import numpy as np

from ._blocked import blocked_array, unpack_vector_mask, value_positions
from ._config import cuda_split_blocks, cuda_warps_per_block
from ._dense import is_device_array
from ._sputils import as_numpy_dtype

__all__ = ["PRECISIONS", "pattern_spmm_cuda", "require_gpu", "spmm_cuda", "spmm_launcher",
           "sddmm_cuda", "sddmm_launcher"]

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


def _current_device_id(cuda):
    """The id of the device Numba launches on (None under the simulator, whose one device has
    none)."""
    return getattr(cuda.get_current_device(), "id", None)


def _cuda_device_index(array):
    """The CUDA device a torch tensor or CuPy array lives on, or None where the array does not
    say (Numba's device arrays belong to the context they were made in)."""
    device = getattr(array, "device", None)
    index = getattr(device, "index", None)  # torch
    if index is None:
        index = getattr(device, "id", None)  # CuPy
    return index if isinstance(index, int) else None


def _check_devices(cuda, operands):
    """Refuse operands the kernels cannot read, before anything is sent or launched.

    Parameters
    ----------
    cuda : module
        ``numba.cuda``.
    operands : iterable of (str, str, object)
        ``(name, device type, array)``: the device type as `DenseOperand` reports it ("cpu",
        "cuda", or another torch device type such as "mps" or "meta").

    Raises
    ------
    ValueError
        An operand in memory of another kind of device, or on a CUDA device other than the one
        Numba launches on: a kernel there would read another GPU's addresses (an illegal
        address, or slow peer reads), and A's arrays would be sent to the wrong device.
    """
    current = None
    for name, device, array in operands:
        if device == "cpu":
            continue
        if device != "cuda":
            raise ValueError(f"{name} lives on device {device!r}; backend='cuda' reads host "
                             f"memory or CUDA device memory: move {name} to the CPU or a "
                             "CUDA device")
        index = _cuda_device_index(array)
        if index is None:
            continue
        if current is None:
            current = _current_device_id(cuda)
        if current is not None and index != current:
            raise ValueError(
                f"{name} lives on CUDA device {index}, but Numba launches its kernels on device "
                f"{current}; call numba.cuda.select_device({index}) (or run under "
                f"`with numba.cuda.gpus[{index}]:`) first, or move {name} to device {current}")


def _numpy_dtype(array):
    """The NumPy dtype of a NumPy, Numba, CuPy or torch array (torch's are named alike); a
    TypeError that says what the kernels take for a dtype NumPy lacks (torch.bfloat16)."""
    name = str(array.dtype).replace("torch.", "")
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"device operands must hold float16, float32 or float64 values, got "
                        f"{array.dtype} (convert it on the device first)") from None


def _on_device(cuda, host_or_device, dtypes, name, why=""):
    """A device view of an operand: zero-copy for device data of one of ``dtypes``, a transfer
    (as ``dtypes[0]``) for host data. ``why`` opens the TypeError for device data of another
    dtype (where the needed dtype comes from)."""
    if is_device_array(host_or_device):
        view = (host_or_device if not hasattr(host_or_device, "__cuda_array_interface__")
                else cuda.as_cuda_array(host_or_device))
        if _numpy_dtype(view) not in dtypes:
            needed = " or ".join(str(dtype) for dtype in dtypes)
            raise TypeError(f"{name} on the device has dtype {view.dtype}; {why}this precision "
                            f"needs {needed} (convert it on the device first)")
        return view
    return cuda.to_device(_host_as(host_or_device, dtypes[0], name))


def overflow_threshold(dtype):
    """The smallest magnitude that rounds to infinity in the float ``dtype`` (round to nearest,
    ties to even): halfway between its largest finite value and the next power of two. Values
    below it round to finite ones."""
    info = np.finfo(dtype)
    return 2.0 ** info.maxexp - 2.0 ** (info.maxexp - info.nmant - 2)


#: `overflow_threshold` of float16: 65,520.
HALF_OVERFLOW = overflow_threshold(np.float16)

_SUGGESTION = {np.dtype(np.float16): "use precision='tf32' or 'fp32'",
               np.dtype(np.float32): "use precision='fp32' with dtype=float64"}


def _host_as(values, dtype, name):
    """Host ``values`` as a contiguous array of ``dtype``, refusing a narrowing cast to a float
    dtype that would turn finite values into infinities (the kernel would then give inf/NaN
    results where the input had none: float64 beyond float32's range for "tf32", anything
    from 65,520 up for "fp16"); values just above the largest finite one round down to it and
    are kept."""
    values = np.asarray(values)
    dtype = np.dtype(dtype)
    narrowing = dtype.kind == "f" and (values.dtype.kind != "f"
                                       or np.finfo(values.dtype).max > np.finfo(dtype).max)
    if narrowing and values.size:
        largest = float(np.nanmax(np.abs(np.where(np.isfinite(values), values, 0))))
        if largest >= overflow_threshold(dtype):
            raise ValueError(f"{name} is sent to the device as {dtype.name}, whose largest value "
                             f"is {float(np.finfo(dtype).max):g}, but {name} holds {largest:.6g}, "
                             f"which would round to infinity; {_SUGGESTION[dtype]}, or scale "
                             f"{name}")
    return np.ascontiguousarray(values, dtype=dtype)


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
    """A's arrays on the current device, transferred once per device."""
    device = _current_device_id(cuda)
    return [_cached(A, (name, device), getattr(A, name),
                    lambda name=name: cuda.to_device(getattr(A, name)))
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
    """``A @ B`` on the GPU; ``operand`` is the validated dense B (see `ops.spmm`). A 1-D B
    gives a matrix-vector product of shape (M,), as on the CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cuda = require_gpu()
    _check_devices(cuda, [("B", operand.device, operand.original)])
    B = operand.original if operand.device == "cuda" else operand.array
    if len(B.shape) not in (1, 2):
        raise ValueError(f"B must be 1-D or 2-D, got {len(B.shape)}-D with shape "
                         f"{tuple(B.shape)}")
    if B.shape[0] != A.shape[1]:
        raise ValueError(f"dimension mismatch: A has shape {A.shape} but B has {B.shape[0]} "
                         f"rows; expected B.shape[0] == {A.shape[1]}")
    if _numpy_dtype(B) not in (np.float16, np.float32, np.float64):
        raise TypeError(f"B must hold float16, float32 or float64 values on the GPU, got {B.dtype}")
    vector = len(B.shape) == 1
    if vector and operand.device == "cpu":
        B = B[:, None]
    dtype = (np.result_type(A.dtype, _numpy_dtype(B), np.float32) if precision == "fp32"
             else np.dtype(np.float32))
    launch = spmm_launcher(A, precision, dtype)
    why = (f"precision='fp32' computes in {dtype} (A holds {A.dtype}); " if precision == "fp32"
           else "")
    device_B = _on_device(cuda, B, launch.operand_dtypes, "B", why)
    if vector and operand.device == "cuda":
        device_B = _column_view(cuda, device_B)
    n_cols = 1 if vector else B.shape[1]
    result, device_out = _result(cuda, operand, (A.shape[0], n_cols), launch.result_dtype)
    launch(device_B, device_out)
    if operand.device == "cuda":
        # the (M, 1) result is contiguous: (M,) is a view of it
        return result.reshape(A.shape[0]) if vector else result
    host = device_out.copy_to_host()
    if vector:
        host = host.reshape(A.shape[0])
    return sys.modules["torch"].from_numpy(host) if operand.kind == "torch" else host


class _InterfaceView:
    """An interface for `cuda.as_cuda_array` that keeps the parent array alive with the view."""

    def __init__(self, parent, interface):
        self.parent = parent
        self.__cuda_array_interface__ = interface


def column_interface(interface, itemsize):
    """The CUDA array interface of ``array[:, None]`` from that of a 1-D ``array``.

    Parameters
    ----------
    interface : dict
        ``__cuda_array_interface__`` of a 1-D array (``strides`` None when contiguous).
    itemsize : int
        Bytes per element.

    Returns
    -------
    dict
        A version-3 interface of shape (n, 1) on the same data, no stream.
    """
    strides = interface.get("strides") or (itemsize,)
    return {"shape": (interface["shape"][0], 1), "strides": (strides[0], itemsize),
            "typestr": interface["typestr"], "version": 3, "data": interface["data"]}


def _column_view(cuda, view):
    """The 1-D device array ``view`` as an (n, 1) one on the same memory, in constant time."""
    if not hasattr(view, "__cuda_array_interface__"):  # the simulator's arrays: host memory
        return view.reshape(view.shape[0], 1)
    return cuda.as_cuda_array(_InterfaceView(view, column_interface(
        view.__cuda_array_interface__, view.dtype.itemsize)), sync=False)


def _c_contiguous(array):
    """Whether the device array ``array`` is C-contiguous (extents of 0 or 1 take any stride)."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:  # the simulator's arrays, which live on the host
        return array.is_c_contiguous()
    strides = interface.get("strides")
    if strides is None:
        return True
    from .kernels.cuda.sddmm import c_strides
    shape = interface["shape"]
    expected = c_strides(shape, np.dtype(interface["typestr"]).itemsize)
    return 0 in shape or all(n <= 1 or s == e for n, s, e in zip(shape, strides, expected))


def _check_launch_operand(array, name, shape, dtypes, contiguous=False):
    """The O(1) checks of a launcher's operand, before any kernel runs: the kernels trust their
    arrays, so a wrong extent reads or writes past an array's end on the GPU (or leaves part of
    the output unwritten), and host data would be copied over and back on every launch.

    ``shape`` holds None where any extent goes (the dense width).
    """
    if not is_device_array(array):
        raise TypeError(f"{name} must be a device array (numba.cuda.to_device, a CUDA tensor), "
                        f"got {type(array).__name__}")
    found = tuple(array.shape)
    if len(found) != len(shape) or any(e is not None and f != e for f, e in zip(found, shape)):
        wanted = tuple("any" if e is None else e for e in shape)
        raise ValueError(f"{name} has shape {found}, expected {wanted}".replace("'", ""))
    dtype = _numpy_dtype(array)
    if dtype not in dtypes:
        raise TypeError(f"{name} has dtype {dtype}, expected "
                        f"{' or '.join(np.dtype(d).name for d in dtypes)}")
    if contiguous and not _c_contiguous(array):
        raise ValueError(f"{name} must be C-contiguous (the kernels fill it as one flat array)")


class _SpmmLauncher:
    """``launch(device_B, device_out)`` runs one SpMM kernel on arrays already on the device:
    B (K, N) of one of `operand_dtypes`, out (M, N) of `result_dtype`, any strides. Shapes and
    dtypes are checked (in constant time) before the launch.

    Attributes
    ----------
    operand_dtypes : tuple of numpy.dtype
        The dtypes B may have on the device; host data is sent as the first.
    result_dtype : numpy.dtype
    """

    def __init__(self, run, operand_dtypes, result_dtype, shape):
        self._run = run
        self.operand_dtypes = operand_dtypes
        self.result_dtype = result_dtype
        self._shape = tuple(shape)

    def __call__(self, device_B, device_out):
        n_rows, n_cols = self._shape
        _check_launch_operand(device_B, "B", (n_cols, None), self.operand_dtypes)
        _check_launch_operand(device_out, "out", (n_rows, device_B.shape[1]),
                              (self.result_dtype,))
        self._run(device_B, device_out)


def _launcher_dtype(precision, dtype):
    """A launcher's ``dtype``, checked before any kernel is built: "fp32" computes in float32
    or float64; the tensor-core precisions accumulate in float32 whatever is asked (another
    dtype was ignored there, and built a kernel typed for it with "fp32")."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    dtype = as_numpy_dtype(dtype)
    allowed = (np.float32, np.float64) if precision == "fp32" else (np.float32,)
    if dtype not in allowed:
        raise TypeError(f"precision={precision!r} computes in "
                        f"{' or '.join(np.dtype(d).name for d in allowed)}, got dtype {dtype}")
    return dtype


def spmm_launcher(A, precision, dtype=np.float32):
    """The kernel of ``precision`` for A, with A's arrays on the device (kernel launches only).

    A's index arrays are sent once and kept with A; its values are sent on each call of this
    function, since they may change in place. "fp32" computes in ``dtype`` (float32 or
    float64); "tf32" and "fp16" read float32 (fp16: float16 or float32) B and give float32.
    The benchmark builds one launcher per matrix, so its timings hold the kernels alone.
    """
    dtype = _launcher_dtype(precision, dtype)
    cuda = require_gpu()
    from .kernels.cuda import spmm as kernels

    if precision in ("tf32", "fp16"):
        M = _mma_operand(A, precision, allow_window16=True)
        result_dtype = np.dtype(np.float32)  # the accumulators'
        # fp16 reads half values (host data travels as half; single device data is rounded as
        # it is read); tf32 reads single values.
        operand_dtypes = ((np.dtype(np.float16), result_dtype) if precision == "fp16"
                          else (result_dtype,))
        offsets, col_idx = _device_arrays(cuda, M, ("row_window_offset", "col_idx"))
        values = cuda.to_device(_host_as(M.values, operand_dtypes[0], "A's values"))
        device_M = _DeviceMebcrs(offsets, col_idx, values, M.shape)
        kernel = "tf32-16x1" if M.window == 16 else precision
        warps, parts = _warps_per_block(), _parts(cuda, kernels, M)
        return _SpmmLauncher(lambda B, out: kernels.launch_mebcrs_spmm(device_M, B, out, warps,
                                                                       kernel, parts),
                             operand_dtypes, result_dtype, M.shape)
    csr = _csr_operand(A)  # duplicates are fine: the kernel sums every stored entry
    indptr, indices = _device_arrays(cuda, csr, ("indptr", "indices"))
    data = cuda.to_device(_host_as(csr.data, dtype, "A's values"))
    return _SpmmLauncher(lambda B, out: kernels.launch_csr_spmm(indptr, indices, data, B, out),
                         (dtype,), dtype, csr.shape)


#: Warps in a thread block of at most 1,024 threads (every CUDA GPU's limit).
MAX_WARPS = 32


def _warps_per_block():
    """`cuda_warps_per_block`, refused above `MAX_WARPS`: the launch would fail on the GPU with
    an invalid configuration, naming neither the setting nor its limit."""
    warps = cuda_warps_per_block()
    if warps > MAX_WARPS:
        raise ValueError(f"PYSPARSE_HPC_CUDA_WARPS is {warps}, but a thread block holds at most "
                         f"{MAX_WARPS} warps (1,024 threads); set it to 1..{MAX_WARPS}")
    return warps


def _parts(cuda, kernels, M):
    """The load-balanced part list of M on the device, built once per split threshold."""
    split = cuda_split_blocks()

    def build():
        host = kernels.mma_parts(M.row_window_offset, split)
        return tuple(cuda.to_device(np.ascontiguousarray(a)) for a in host)
    return _cached(M, ("parts", split, _current_device_id(cuda)), M.row_window_offset, build)


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

    # The structure is converted once; the values are gathered from A's on every call, since
    # they may have changed in place (duplicates of a non-canonical A add up).
    def build():
        M = A.to_mebcrs(block_width=8)
        return M, _slot_map(M, A)
    M, slot_of_entry = _cached(A, "mebcrs8", A.indices, build)
    values = np.bincount(slot_of_entry, weights=A.data, minlength=M.values.size)
    from .ops import _with_values
    current = _with_values(M, values.astype(M.dtype))
    # Same structure arrays, so the device copies kept for M serve this array too.
    current.__dict__["_device_cache"] = M.__dict__.setdefault("_device_cache", {})
    return current


def _csr_operand(A):
    """A as CSR for the CUDA-core kernels: A itself, or for a blocked A its `tocsr` form.

    A blocked A's conversion is done once and kept with A, like `_mma_operand`'s: a fresh
    ``A.tocsr()`` on every call sent its index arrays to the device anew and left one more
    slot map in A's cache per call (memory that grew without bound in a training loop). The
    values are gathered from A's on every call, since they may have changed in place.
    """
    if not isinstance(A, blocked_array):
        return A.tocsr()

    def build():
        csr = A.tocsr()
        return csr, _slot_map(A, csr)
    csr, slot_of_entry = _cached(A, "csr", A.col_idx, build)
    from .ops import _with_values
    current = _with_values(csr, A.values[slot_of_entry])
    # Same structure arrays, so the device copies kept for csr serve this array too.
    current.__dict__["_device_cache"] = csr.__dict__.setdefault("_device_cache", {})
    return current


def sddmm_cuda(A, x_operand, y_operand, alpha, beta, precision):
    """`ops.sddmm` on the GPU, single- or multi-head (shapes already checked by `ops.sddmm`).

    Host operands give what the CPU gives: a sparse array of A's class (2-D X and Y) or an
    array (stored slots, heads) in A's storage order. Device operands give the values as a
    device array of X's kind, in the storage order of the array the kernel ran on: A's own, or
    for "tf32"/"fp16" with a CSR ``A`` that of ``A.to_mebcrs(8)``, for "fp32" with a blocked
    ``A`` that of ``A.tocsr()``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cuda = require_gpu()
    _check_devices(cuda, [("X", x_operand.device, x_operand.original),
                          ("Y", y_operand.device, y_operand.original)])
    X = x_operand.original if x_operand.device == "cuda" else x_operand.array
    Y = y_operand.original if y_operand.device == "cuda" else y_operand.array
    from .kernels.cuda import sddmm as kernels
    from .ops import _beyond_float32

    single = precision != "fp32" or np.result_type(
        A.dtype, np.float32, _numpy_dtype(X), _numpy_dtype(Y)) == np.float32
    if single and (alpha != 1.0 or beta != 0.0) and _beyond_float32(alpha, beta):
        # The kernels scale in the result's float32, which holds neither (the CPU combines in
        # float64 and rounds once; torch.sparse.sampled_addmm refuses such scalars too).
        raise ValueError(f"alpha={alpha} and beta={beta}: float32, the result's dtype on the "
                         "GPU, does not hold them (beyond its range, or below its smallest "
                         "normal number); pass float64 operands with precision='fp32', or "
                         "host operands with backend='cpu'")

    if precision == "fp32":
        dtype = np.result_type(A.dtype, np.float32, _numpy_dtype(X), _numpy_dtype(Y))
        why = (f"precision='fp32' computes in {dtype}, the promotion of A's {A.dtype}, X's "
               f"{X.dtype} and Y's {Y.dtype}; ")
        device_X = _on_device(cuda, X, (dtype,), "X", why)
        device_Y = _on_device(cuda, Y, (dtype,), "Y", why)
        stored = _csr_operand(A)
        device_rows, indices = _csr_sddmm_arrays(cuda, stored)
        result, device_out = _result(cuda, x_operand, (stored.nnz,) + X.shape[1:-1], dtype)
        kernels.launch_csr_sddmm(device_rows, indices, device_X, device_Y, device_out)
        stored_values = stored.data
    else:
        # fp16 reads half or single values (host data travels as half); both accumulate in fp32.
        dtype = np.dtype(np.float32)
        accepted = (np.dtype(np.float16), dtype) if precision == "fp16" else (dtype,)
        device_X = _on_device(cuda, X, accepted, "X")
        device_Y = _on_device(cuda, Y, accepted, "Y")
        stored = _mma_operand(A, precision)
        device_stored, tiles = _mebcrs_sddmm_arrays(cuda, stored, kernels)
        result, device_out = _result(cuda, x_operand, (stored.values.size,) + X.shape[1:-1],
                                     dtype)
        kernels.launch_mebcrs_sddmm(device_stored, device_X, device_Y, device_out, tiles,
                                    precision)
        stored_values = stored.values
    on_device = x_operand.device == "cuda"
    padded = isinstance(stored, blocked_array) and (on_device or stored is A)
    finite = math.isfinite(alpha) and math.isfinite(beta)
    if padded and on_device and not finite:
        raise ValueError(f"alpha={alpha} and beta={beta} with device operands and "
                         f"precision={precision!r}: the result keeps the blocked slots of "
                         f"{'A' if stored is A else 'the ME-BCRS operand'}, whose padding "
                         "would be inf * 0 = NaN; pass finite scalars, or host operands")
    # The stored values are added on the device where the result keeps the kernel's order; a
    # host result in another order gets A's own values added after the gather (a non-canonical
    # A's duplicates each keep their own).
    in_kernel_order = on_device or stored is A
    add_on_device = beta != 0 and in_kernel_order
    addend = cuda.to_device(stored_values.astype(dtype)) if add_on_device else None
    kernels.launch_scale_add(device_out, addend, dtype.type(alpha),
                             dtype.type(beta) if add_on_device else dtype.type(0))
    if on_device:
        return result
    values = device_out.copy_to_host()
    if not in_kernel_order:
        values = _in_storage_order(A, stored, values)
        if beta != 0:
            own = _stored_values(A).astype(dtype)
            with np.errstate(invalid="ignore"):   # inf * 0 gives NaN silently, as the kernels
                values += dtype.type(beta) * (own[:, None] if values.ndim == 2 else own)
    if isinstance(A, blocked_array) and not finite:
        # The format's padding slots stay 0 (as on the CPU), whichever side added beta A.
        present = unpack_vector_mask(A.vector_mask, A.n_vectors, A.window)
        values[value_positions(A.row_window_offset, A.window, A.block_width)[~present]] = 0
    if values.ndim == 2:
        from ._dense import wrap_like
        return wrap_like(x_operand, values)
    from .ops import _with_values
    return _with_values(A, values)


def _stored_values(S):
    return S.values if isinstance(S, blocked_array) else S.data


def _storage_keys(S):
    """``row * n_cols + col`` of every storage slot of S (-1 for a blocked array's padding)."""
    n_cols = np.int64(S.shape[1])
    if not isinstance(S, blocked_array):
        rows = np.repeat(np.arange(S.shape[0], dtype=np.int64), np.diff(S.indptr))
        return rows * n_cols + S.indices
    offsets = S.row_window_offset.astype(np.int64)
    positions = value_positions(offsets, S.window, S.block_width)
    present = unpack_vector_mask(S.vector_mask, positions.shape[0], S.window)
    window_of_vector = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    rows = window_of_vector[:, None] * S.window + np.arange(S.window)[None, :]
    keys = np.full(S.values.size, -1, dtype=np.int64)
    keys[positions[present]] = (rows * n_cols + S.col_idx.astype(np.int64)[:, None])[present]
    return keys


def _slot_map(source, target):
    """For every storage slot of ``target``, the slot of ``source`` that holds the same (row,
    column), or -1 for ``target``'s padding; ``source`` stores each position once."""
    source_keys = _storage_keys(source)
    order = np.argsort(source_keys, kind="stable")
    wanted = _storage_keys(target)
    found = order[np.searchsorted(source_keys[order], wanted).clip(max=max(order.size - 1, 0))]
    return np.where(wanted >= 0, found, -1)


def _in_storage_order(A, stored, values):
    """Kernel results ``values`` in ``stored``'s slots rearranged into A's (padding gets 0)."""
    blocked = isinstance(stored, blocked_array)
    source = stored.col_idx if blocked else stored.indices
    # One entry per form: a key holding id(source) added an entry whenever the form was
    # rebuilt, where this one replaces it.
    slot_in_stored = _cached(A, ("slots_in", blocked), source, lambda: _slot_map(stored, A))
    gathered = values[slot_in_stored.clip(min=0)]
    gathered[slot_in_stored < 0] = 0
    return gathered


def pattern_spmm_cuda(csr, values, B):
    """``A @ B`` for A = ``csr``'s pattern holding per-edge ``values`` on the GPU: (nnz,) with
    B (K, F), or (nnz, heads) with B (K, heads, F), one CUDA-core CSR product per head on
    strided views. ``values`` and B are torch CUDA tensors (the result is one too) or Numba
    device arrays (the result is a Numba device array)."""
    cuda = require_gpu()
    _check_devices(cuda, [(name, getattr(getattr(array, "device", None), "type", "cuda"), array)
                          for name, array in (("values", values), ("B", B))])
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


# --- SDDMM kernels alone (the GPU benchmark) ---------------------------------------------------

def _csr_sddmm_arrays(cuda, stored):
    """The entry -> row array and the column indices of CSR ``stored`` on the device, each
    sent once and kept with ``stored``."""
    key = ("entry_rows", _current_device_id(cuda))
    device_rows = _cached(stored, key, stored.indptr, lambda: cuda.to_device(
        np.repeat(np.arange(stored.shape[0], dtype=stored.index_dtype),
                  np.diff(stored.indptr))))
    indices, = _device_arrays(cuda, stored, ("indices",))
    return device_rows, indices


def _mebcrs_sddmm_arrays(cuda, stored, kernels):
    """The structure of ME-BCRS ``stored`` on the device as the tensor-core SDDMM reads it, and
    its warp tiles (`kernels.mma_tiles`) on the device; all sent once and kept with ``stored``."""
    offsets, col_idx, mask = _device_arrays(cuda, stored, ("row_window_offset", "col_idx",
                                                           "vector_mask"))

    def build():
        return tuple(cuda.to_device(a) for a in kernels.mma_tiles(stored.row_window_offset))
    tiles = _cached(stored, ("sddmm_tiles", _current_device_id(cuda)), stored.row_window_offset,
                    build)
    return _DeviceMebcrs(offsets, col_idx, None, stored.shape, vector_mask=mask), tiles


class _SddmmLauncher:
    """``launch(device_X, device_Y, device_out)`` runs the SDDMM kernel(s) of one precision on
    arrays already on the device: ``device_out`` gets ``(X @ Y.T)`` at the stored entries, in
    the storage order of `stored` (alpha 1, beta 0; tensor-core padding slots 0). Shapes,
    dtypes and the output's contiguity are checked (in constant time) before the launch.

    Attributes
    ----------
    operand_dtypes : tuple of numpy.dtype
        The dtypes X and Y may have on the device (the first is the one to send).
    result_dtype : numpy.dtype
        The dtype ``device_out`` must have.
    out_shape : tuple of int
        ``(slots,)`` for one head, ``(slots, heads)`` for several; slots are `stored`'s.
    stored : csr_array or blocked_array
        The array whose storage order the results follow: the ``A`` given to `sddmm_launcher`,
        ``A.to_mebcrs(8)`` for "tf32"/"fp16" with a CSR ``A``, ``A.tocsr()`` for "fp32" with a
        blocked ``A``.
    """

    def __init__(self, run, operand_dtypes, result_dtype, out_shape, source, stored):
        self._run = run
        self.operand_dtypes = operand_dtypes
        self.result_dtype = result_dtype
        self.out_shape = out_shape
        self._source = source
        self.stored = stored

    def __call__(self, device_X, device_Y, device_out):
        n_rows, n_cols = self.stored.shape
        per_slot = self.out_shape[1:]  # (heads,) or ()
        _check_launch_operand(device_X, "X", (n_rows,) + per_slot + (None,),
                              self.operand_dtypes)
        width = tuple(device_X.shape)[-1]
        _check_launch_operand(device_Y, "Y", (n_cols,) + per_slot + (width,),
                              self.operand_dtypes)
        _check_launch_operand(device_out, "out", self.out_shape, (self.result_dtype,),
                              contiguous=True)
        self._run(device_X, device_Y, device_out)

    def in_storage_order(self, values, like=None):
        """Host results ``values``, as ``device_out`` held them, in the storage order of
        ``like`` (default: the ``A`` given to `sddmm_launcher`); ``like`` holds the same
        entries as `stored`, each once. Padding slots of a blocked ``like`` get 0."""
        like = self._source if like is None else like
        if like is self.stored:
            return values
        return _in_storage_order(like, self.stored, values)


def sddmm_launcher(A, precision, heads=None, dtype=np.float32):
    """The SDDMM kernel(s) of ``precision`` for A, with A's structure on the device.

    What `sddmm` with ``alpha=1, beta=0`` runs on the GPU, without the operand transfers,
    checks and output allocation, so that a benchmark times the kernels alone. The structure
    arrays are sent once and kept with A (or with the ME-BCRS array converted from a CSR A,
    itself kept with A); A's values are not read.

    Parameters
    ----------
    A : csr_array or blocked_array
        The pattern. "tf32" and "fp16" need 8-row windows and ``block_width=8`` (a CSR A is
        converted once, as `sddmm` does); "fp32" runs on ``A.tocsr()``.
    precision : {"fp32", "tf32", "fp16"}
        "fp32": the CUDA-core CSR kernel in ``dtype``; "tf32" (``mma.m16n8k8``) and "fp16"
        (``mma.m16n8k16``): the tensor-core ME-BCRS kernel, accumulating in float32.
    heads : int, optional
        None: X (rows, F), Y (cols, F), output (slots,). An int: X (rows, heads, F), Y (cols,
        heads, F), output (slots, heads), one launch per head on strided views.
    dtype : {numpy.float32, numpy.float64}
        "fp32" only: the operands' and the result's dtype.

    Returns
    -------
    _SddmmLauncher
        Call it as ``launch(device_X, device_Y, device_out)`` with X and Y of one of its
        ``operand_dtypes`` ("fp16": float16, or float32 rounded as read; "tf32": float32) and
        ``device_out`` of ``result_dtype`` and ``out_shape``, C-contiguous; it holds the
        results in the storage order of ``launch.stored`` (`_SddmmLauncher.in_storage_order`
        maps them back to A's).

    Raises
    ------
    ValueError
        An unknown precision, a bad ``heads``, or a blocked A of another shape.
    TypeError
        A ``dtype`` the precision does not compute in.
    RuntimeError
        No GPU (and no simulator).
    """
    dtype = _launcher_dtype(precision, dtype)
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, (int, np.integer))
                              or heads < 1):
        raise ValueError(f"heads must be None or a positive integer, got {heads!r}")
    cuda = require_gpu()
    from .kernels.cuda import sddmm as kernels
    per_slot = () if heads is None else (int(heads),)
    if precision == "fp32":
        stored = _csr_operand(A)
        device_rows, indices = _csr_sddmm_arrays(cuda, stored)
        return _SddmmLauncher(
            lambda X, Y, out: kernels.launch_csr_sddmm(device_rows, indices, X, Y, out),
            (dtype,), dtype, (stored.nnz,) + per_slot, A, stored)
    result_dtype = np.dtype(np.float32)  # the accumulators'
    operand_dtypes = ((np.dtype(np.float16), result_dtype) if precision == "fp16"
                      else (result_dtype,))
    stored = _mma_operand(A, precision)
    device_stored, tiles = _mebcrs_sddmm_arrays(cuda, stored, kernels)
    return _SddmmLauncher(
        lambda X, Y, out: kernels.launch_mebcrs_sddmm(device_stored, X, Y, out, tiles,
                                                      precision),
        operand_dtypes, result_dtype, (stored.values.size,) + per_slot, A, stored)
