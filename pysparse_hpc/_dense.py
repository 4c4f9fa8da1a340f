"""Dense operands: NumPy arrays and torch tensors in, the same kind out, without copies.

A torch CPU tensor is viewed as a NumPy array (shared memory, any strides) for the kernels, and
results are handed back as tensors that share the kernel's output buffer.
"""
import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["DenseOperand", "as_dense", "is_device_array", "wrap_like"]

_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class DenseOperand:
    """A validated dense operand.

    Attributes
    ----------
    array : numpy.ndarray
        Host view of the data (None for device data, which only the CUDA backend reads).
    kind : {"numpy", "torch"}
    device : {"cpu", "cuda"}
    original : object
        What the caller passed.
    """

    array: np.ndarray
    kind: str
    device: str
    original: object


def _torch():
    return sys.modules.get("torch")


def is_torch_tensor(x):
    """True for a torch.Tensor, without importing torch when the caller never did."""
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_device_array(x):
    """Device memory: anything with ``__cuda_array_interface__``, or a simulated Numba device
    array (the CUDA simulator's arrays live on the host and do not expose the interface)."""
    return (hasattr(x, "__cuda_array_interface__")
            or type(x).__module__.startswith("numba.cuda.simulator"))


def as_dense(x, name, gradient_hint=None):
    """Validate a dense operand: real floating values, NumPy or torch; returns `DenseOperand`.

    Raises TypeError for other types or dtypes (integers, complex, ...), and for a tensor
    that requires grad under grad mode (``gradient_hint`` says what differentiates instead).
    Device data (a CUDA tensor, or anything with ``__cuda_array_interface__``) is reported as
    ``device="cuda"``; a tensor on another device (``meta``, ``mps``, ...) raises ValueError.
    """
    if isinstance(x, np.ndarray):   # the common case first
        array = np.asarray(x)
        kind = "numpy"
    elif is_torch_tensor(x):
        if x.is_sparse or x.layout != _torch().strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}")
        if x.requires_grad:
            if _torch().is_grad_enabled():
                # a silent detach would drop this product's gradient from the model's
                raise TypeError(
                    f"{name} requires grad, and the kernels' functions do not differentiate: "
                    f"{gradient_hint + ', or ' if gradient_hint else ''}pass {name}.detach()")
            x = x.detach()
        if x.device.type != "cpu":
            if x.device.type != "cuda":   # else the CUDA backend would say it finds no GPU
                raise ValueError(f"{name} is on device '{x.device}'; the kernels take CPU or "
                                 f"CUDA tensors (move it with .cpu())")
            return DenseOperand(None, "torch", x.device.type, x)
        if x.dtype == _torch().bfloat16:  # NumPy has no bfloat16: say so before numpy() does
            raise TypeError(f"{name} must hold float16, float32 or float64 values, got "
                            f"torch.bfloat16 (convert with .float())")
        try:
            array = x.numpy()
        except RuntimeError:
            if not (x.is_neg() or x.is_conj()):
                raise
            # A lazily negated or conjugated view (``z.conj().imag`` is one), which numpy()
            # refuses: read its values from a copy (`ops.spmm` refuses such an ``out``).
            # Asked only after numpy() fails: the two queries cost 0.4 us on every call.
            array = x.resolve_neg().resolve_conj().numpy()
        kind = "torch"
    elif is_device_array(x):
        return DenseOperand(None, type(x).__module__.split(".")[0], "cuda", x)
    elif isinstance(x, (list, tuple)):
        array = np.asarray(x)
        kind = "numpy"
    else:
        raise TypeError(f"{name} must be a NumPy array or a torch tensor, got {type(x).__name__}")
    if not array.dtype.isnative and array.dtype.kind == "f":
        array = array.astype(array.dtype.newbyteorder("="))  # big-endian data from a file
    if array.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must hold float16, float32 or float64 values, got dtype {array.dtype}")
    return DenseOperand(array, kind, "cpu", x)


def wrap_like(operand, result):
    """Hand a NumPy result back as the operand's kind (a torch tensor sharing its memory)."""
    if operand.kind == "torch":
        return _torch().from_numpy(result)
    return result
