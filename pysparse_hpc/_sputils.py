"""Validation and dtype rules shared by every sparse format, and the scalar checks the rest
of the package shares.

Public entry points call these to turn user input into trusted arrays and numbers; private
kernels never validate. Messages say what was found and what was expected.
"""
import math
import numbers
import operator
import os
import sys

import numpy as np

__all__ = [
    "VALUE_DTYPES",
    "check_shape",
    "get_index_dtype",
    "as_numpy_dtype",
    "check_index_dtype",
    "as_index_array",
    "as_value_array",
    "check_index_dtype_holds",
    "value_dtype_for",
    "upcast_for_sum",
    "is_real_number",
    "check_real_number",
    "check_integer",
    "check_seed",
    "described_sparse",
    "physical_memory",
    "memory_limit",
    "refuse_beyond_memory",
]

#: Value dtypes a sparse array may hold. Integer and boolean input is converted to float64.
VALUE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_INT32_MAX = np.iinfo(np.int32).max


_INT64_MAX = int(np.iinfo(np.int64).max)


def check_shape(shape):
    """Return ``shape`` as a tuple of two non-negative Python ints.

    Raises
    ------
    TypeError
        If ``shape`` is not a sequence of integers (floats such as ``3.0`` and booleans
        included).
    ValueError
        If it does not have two entries or an entry is negative or beyond int64.
    """
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
        raise TypeError(f"shape must be a tuple of two integers, got {shape!r}")
    if len(shape) != 2:
        raise ValueError(
            f"shape must have 2 entries (rows, cols), got {len(shape)}: {tuple(shape)!r}")
    dims = []
    for dim in shape:
        try:
            if isinstance(dim, (bool, np.bool_)):
                # operator.index takes a bool: (True, 3) would give shape (1, 3) silently
                raise TypeError
            dims.append(operator.index(dim))
        except TypeError:
            raise TypeError(
                f"shape entries must be integers, got {type(dim).__name__} {dim!r} in "
                f"{tuple(shape)!r}"
            ) from None
    if dims[0] < 0 or dims[1] < 0:
        raise ValueError(f"shape entries must be non-negative, got {tuple(dims)!r}")
    if max(dims) > _INT64_MAX:  # no index array could address it
        raise ValueError(f"shape entries must be at most 2**63 - 1 (int64 indices), got "
                         f"{tuple(dims)!r}")
    return tuple(dims)


def get_index_dtype(arrays=(), maxval=0):
    """Index dtype by scipy's rule: int32 unless an int64 input or ``maxval`` needs int64."""
    for array in arrays:
        if np.dtype(array.dtype) == np.int64:
            return np.dtype(np.int64)
        if not np.can_cast(array.dtype, np.int32) and array.size:
            if array.min() < np.iinfo(np.int32).min or array.max() > _INT32_MAX:
                return np.dtype(np.int64)
    return np.dtype(np.int64) if maxval > _INT32_MAX else np.dtype(np.int32)


def as_numpy_dtype(dtype, name="dtype"):
    """``dtype`` as a NumPy dtype; torch's dtypes with a NumPy twin (``torch.float32``, ...)
    are taken too, as the tensors the package accepts carry them.

    Raises
    ------
    TypeError
        Naming ``name``, for anything NumPy does not read as a dtype (its own message names
        no argument).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        try:
            return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
        except (TypeError, RuntimeError):   # bfloat16, complex32, quantized: no NumPy twin
            raise TypeError(f"{name} {dtype} has no NumPy equivalent") from None
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{name} {dtype!r} is not understood: {exc}") from None


def check_index_dtype(index_dtype):
    """A requested ``index_dtype`` as NumPy's int32 or int64 (None stays None); TypeError
    otherwise. Checked before any input is read, so that a bad argument is not reported as a
    fault of the input."""
    if index_dtype is None:
        return None
    index_dtype = as_numpy_dtype(index_dtype, "index_dtype")
    if index_dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"index_dtype must be int32 or int64, got {index_dtype}")
    return index_dtype


def check_index_dtype_holds(index_dtype, maxval):
    """Refuse an index dtype that cannot hold ``maxval`` (the largest dimension or number of
    entries): a requested int32 would wrap larger indices."""
    if np.dtype(index_dtype) == np.int32 and maxval > _INT32_MAX:
        raise ValueError(f"index_dtype int32 cannot hold {maxval} (the largest dimension or "
                         f"number of entries); use int64 or leave index_dtype unset")


def _native_contiguous(array):
    """``array`` in the machine's byte order and C-contiguous (no copy when it already is):
    what the kernels read."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array)


def as_index_array(array, name):
    """A 1-D integer ndarray of ``array``'s values, native and contiguous (no copy when it
    already is).

    Raises TypeError for non-integer dtypes (booleans and floats included; an empty float array,
    NumPy's type of ``[]``, is taken as no indices) and ValueError for the wrong number of
    dimensions.
    """
    array = np.asarray(array)
    if array.size == 0 and array.dtype == np.float64:
        array = array.astype(np.int32)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {array.ndim}-D with shape {array.shape}")
    return _native_contiguous(array)


def value_dtype_for(dtype, requested=None):
    """The value dtype an array of ``dtype`` is stored with, or ``requested`` when given.

    float16/32/64 are kept; booleans and integers become float64; complex, object, string and
    other dtypes raise TypeError.
    """
    if requested is not None:
        requested = as_numpy_dtype(requested)
        if requested not in VALUE_DTYPES:
            raise TypeError(
                f"dtype {requested} is not supported; expected one of float16, float32, float64"
            )
        _check_convertible(_native(np.dtype(dtype)))
        return requested
    dtype = _native(np.dtype(dtype))
    _check_convertible(dtype)
    if dtype in VALUE_DTYPES:
        return dtype
    return np.dtype(np.float64)


def _native(dtype):
    """``dtype`` in the machine's byte order (big-endian data from a file is converted)."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def _check_convertible(dtype):
    if dtype in VALUE_DTYPES or dtype.kind in "biu":
        return
    kinds = {"c": "complex", "O": "object", "U": "string", "S": "bytes", "V": "structured",
             "M": "datetime", "m": "timedelta", "f": "extended-precision float"}
    raise TypeError(
        f"values of dtype {dtype} ({kinds.get(dtype.kind, dtype.kind)}) are not supported; "
        "expected float16, float32 or float64 (booleans and integers are converted to float64)"
    )


def as_value_array(array, name, dtype=None):
    """A 1-D value ndarray of a supported dtype (converted per `value_dtype_for`)."""
    array = np.asarray(array)
    target = value_dtype_for(array.dtype, dtype)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {array.ndim}-D with shape {array.shape}")
    return np.ascontiguousarray(array.astype(target, copy=False))


def upcast_for_sum(data):
    """float16 values are summed in float32 and rounded once; other dtypes are summed as is."""
    return data.astype(np.float32) if data.dtype == np.float16 else data


def moved_view(data):
    """View float16 values as uint16 so typed kernels that only move values copy them exactly."""
    return data.view(np.uint16) if data.dtype == np.float16 else data


def is_real_number(value):
    """Whether ``value`` is a real number (Python's or NumPy's), a bool not counted, nor a
    NumPy timedelta (registered as an integer, its unit dropped by ``float()``)."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and not isinstance(value, np.timedelta64))


def check_real_number(name, value, positive=True):
    """Raise TypeError unless ``value`` is a real number, ValueError unless it is finite (and
    > 0 where ``positive``)."""
    if not is_real_number(value):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} ({value!r})")
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"{name} must be a finite number{' > 0' if positive else ''}, "
                         f"got {value}")


def check_flag(value, name):
    """``value`` as a bool; TypeError naming ``name`` for anything else (a string such as
    ``"no"`` is truthy and would silently ask for the opposite)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_seed(seed):
    """``seed`` as a non-negative Python int (NumPy's own errors for a bad seed do not name
    the argument); TypeError or ValueError naming ``seed`` otherwise."""
    seed = check_integer(seed, "seed")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return seed


def check_integer(value, name):
    """``value`` as a Python int; TypeError for bools, floats and anything else that is not an
    integer (a float would otherwise be truncated silently). A 0-d integer tensor of torch
    (``x.shape[0]`` of a traced shape, ``t.sum()``) is taken, as NumPy takes it."""
    torch = sys.modules.get("torch")
    if (torch is not None and isinstance(value, torch.Tensor) and value.ndim == 0
            and not value.is_floating_point() and not value.is_complex()
            and value.dtype != torch.bool):
        return int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    return int(value)


def check_positive_integer(value, name):
    """``value`` as a Python int >= 1: `check_integer`'s TypeError for what is not an
    integer, ValueError below 1."""
    value = check_integer(value, name)
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def as_path(value, name, file_objects=False):
    """``value`` (a str, bytes or os.PathLike) as a str path; a TypeError naming ``name``
    for anything else, where os.fspath's "expected str, bytes or os.PathLike object, not int"
    named no argument. ``file_objects``: the caller also takes an open file (said so)."""
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        also = " or an open file" if file_objects else ""
        raise TypeError(f"{name} must be a path (str, bytes or os.PathLike){also}, got "
                        f"{type(value).__name__} {value!r}") from None


def described_sparse(value):
    """``value``'s type for an error that asked for a pysparse_hpc sparse array: scipy's classes
    share the package's names, so a bare "got csr_array" would read as a contradiction."""
    name = type(value).__name__
    if type(value).__module__.startswith("scipy.sparse"):
        return f"scipy.sparse's {name} (wrap it with pysparse_hpc.csr_array)"
    if hasattr(value, "tocsr"):
        return f"{name} (wrap it with pysparse_hpc.csr_array)"
    return name


def physical_memory():
    """This machine's memory in bytes, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _read_int(path):
    """The integer a one-line file holds (None where it is missing, unreadable or "max")."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cgroup_room():
    """Bytes this process's memory cgroup lets it allocate beyond its use now, or None where
    no limit is set or none can be read: v2 ``memory.max`` less ``memory.current``, v1
    ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``, the use counted without the
    page cache the kernel reclaims (``inactive_file``: the cache of a file just read would
    otherwise count against reading it)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            files, cache, root = ("memory.max", "memory.current"), "inactive_file", \
                "/sys/fs/cgroup"
        elif "memory" in controllers.split(","):
            files, cache, root = ("memory.limit_in_bytes", "memory.usage_in_bytes"), \
                "total_inactive_file", "/sys/fs/cgroup/memory"
        else:
            continue
        # The group's own directory, or the mount's root where a namespace shows it as "/".
        for directory in (root + path.rstrip("/"), root):
            limit, used = (_read_int(os.path.join(directory, name)) for name in files)
            if limit is not None and used is not None:
                reclaimable = _stat_value(os.path.join(directory, "memory.stat"), cache)
                return max(limit - max(used - reclaimable, 0), 0)
    return None


def _stat_value(path, key):
    """The value of ``key`` in a ``memory.stat`` file (0 where it is missing)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _address_space_room():
    """Bytes the address-space limit (``ulimit -v``, RLIMIT_AS) leaves this process, or None
    where none is set."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as handle:
            size = next(int(line.split()[1]) * 1024 for line in handle
                        if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(soft - size, 0)


def memory_limit():
    """``(bytes, what)``: the most this process can allocate, the smallest of this machine's
    memory, its memory cgroup's room (a container's limit) and its address-space limit's room;
    ``(None, None)`` where none is known."""
    limits = []
    memory = physical_memory()
    if memory is not None:
        limits.append((memory, f"this machine's {memory / 2**30:.1f} GiB"))
    room = _cgroup_room()
    if room is not None:
        limits.append((room, f"the {room / 2**30:.3g} GiB its memory cgroup (a container's "
                             f"limit) leaves"))
    room = _address_space_room()
    if room is not None:
        limits.append((room, f"the {room / 2**30:.3g} GiB its address-space limit (ulimit -v) "
                             f"leaves"))
    return min(limits, key=lambda limit: limit[0]) if limits else (None, None)


def refuse_beyond_memory(needed, description):
    """Raise ``MemoryError("{description} need about ... GiB[, more than ...]")`` when
    ``needed`` bytes (a float; inf for a size past float's range) cannot be allocated: beyond
    int64, or beyond `memory_limit` (this machine's memory, a container's limit or an
    address-space limit, whichever is the smallest). Found before the allocation, not by
    NumPy's error, which names a shape but not the argument or file, nor by a process killed
    while filling an overcommitted array."""
    memory, what = memory_limit()
    if needed >= 2.0 ** 63 or (memory is not None and needed > memory):
        available = "" if memory is None else f", more than {what}"
        raise MemoryError(f"{description} need about {needed / 2**30:.3g} GiB{available}")
