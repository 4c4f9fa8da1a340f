"""Input checks the layers share."""
import math
import os
import sys
import warnings

import numpy as np
import torch

from .._sputils import as_numpy_dtype, check_flag, check_positive_integer, is_real_number

__all__ = ["check_channels", "check_features", "check_flag", "check_negative_slope",
           "check_probability", "float_dtype", "user_stacklevel", "warn_once_if_nan"]

# Frames in these folders are the library's or torch's own (a Module's __call__), not the user's.
_LIBRARY_FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_FOLDER = os.path.dirname(os.path.abspath(torch.__file__))
_INTERNAL_PREFIXES = (_LIBRARY_FOLDER + os.sep, _TORCH_FOLDER + os.sep)


def user_stacklevel():
    """The ``stacklevel`` of a warning raised by the calling function that points it at the
    first frame outside this library and torch: the user's line that called the layer or
    model, whatever modules lie in between."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_PREFIXES):
        frame, level = frame.f_back, level + 1
    return level


def check_channels(value, name):
    """``value`` as a positive Python int: TypeError for anything that is not an integer (a
    float would otherwise pass as a size of torch's and be truncated or refused there
    without the argument's name), ValueError below 1."""
    return check_positive_integer(value, name)


def float_dtype(dtype):
    """NumPy's float32 or float64 for ``dtype`` (NumPy's or torch's, or a name); TypeError
    for any other."""
    try:
        chosen = as_numpy_dtype(dtype)
    except TypeError:
        chosen = None
    if chosen not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}")
    return chosen


def check_probability(value, name, one=False):
    """``value`` as a float in [0, 1) (``one``: [0, 1]): TypeError for a non-number (a bool
    included), ValueError outside the range."""
    if not is_real_number(value):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} ({value!r})")
    if not (0.0 <= value <= 1.0 if one else 0.0 <= value < 1.0):
        raise ValueError(f"{name} must be in [0, 1{']' if one else ')'}, got {value!r}")
    return float(value)


def check_negative_slope(value):
    """``value`` as a finite float: NaN or an infinity would make every output NaN."""
    if not is_real_number(value):
        raise TypeError(f"negative_slope must be a float, got {type(value).__name__} "
                        f"({value!r})")
    if not math.isfinite(value):
        raise ValueError(f"negative_slope must be a finite number, got {value!r}")
    return float(value)


def check_features(x, in_channels=None):
    """``x`` must be a 2-D float32/float64 tensor on the CPU or a CUDA device with
    ``in_channels`` columns (when given)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"x must be float32 or float64, got {x.dtype}")
    if x.device.type not in ("cpu", "cuda"):
        # Else refused deep in a kernel's dispatch, as if a GPU were asked for and missing.
        raise ValueError(f"x is on device {x.device.type!r}; the layers run on CPU or CUDA "
                         "tensors")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (nodes, features), got shape {tuple(x.shape)}")
    if in_channels is not None and x.shape[1] != in_channels:
        raise ValueError(f"x has {x.shape[1]} features, the layer expects {in_channels}")


def warn_once_if_nan(layer, out):
    """Warn (once per layer) when the layer's output holds NaN: it propagates, as in torch, but
    silently wrong accuracy is worse than a warning. The output is checked, not the input:
    it is narrower, and NaN in the features always reaches it."""
    if getattr(layer, "_warned_nan", False):
        return
    try:
        has_nan = bool(torch.isnan(out.detach()).any())
    except RuntimeError:  # under torch.func.vmap a tensor's values cannot steer Python
        return
    if has_nan:
        layer._warned_nan = True
        warnings.warn(f"{type(layer).__name__} produced NaN: the input features (or the "
                      "weights) hold NaN, and it propagates to every node that reads them",
                      RuntimeWarning, stacklevel=user_stacklevel())
