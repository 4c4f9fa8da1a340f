"""Result buffers: large outputs reuse the memory of results that have been freed.

A fresh allocation is not free once results reach tens of megabytes. glibc serves requests
above 32 MiB with new pages from the kernel, which zeroes each page when it is first written;
measured on a 2-core machine with huge pages, a 112 MiB float32 result took about 15 ms to
fault in, more than the 13 ms SpMM that fills it (luxembourg_osm at N=256). Smaller requests
come back from glibc's heap already resident, so only large buffers are kept here.

A large result is a view of a pooled buffer through a small owner object (the array's
``base``). When the last array or tensor sharing that memory is collected, the owner's
finalizer puts the buffer back on an idle list, and the next request of the same rounded size
takes it instead of fresh pages. Idle buffers are capped by ``PYSPARSE_HPC_BUFFER_CACHE_MB``
(default 1024; 0 turns reuse off); `empty_cache` hands them all back to the system. A forked
child starts with an empty pool of its own.
"""
import operator
import os
import threading
import weakref
from collections import OrderedDict, deque

import numpy as np

from ._config import buffer_cache_bytes

__all__ = ["cached_bytes", "empty", "empty_cache"]

# Below this glibc reuses freed memory itself (its largest dynamic mmap threshold on 64 bits).
MIN_POOLED_BYTES = 32 << 20
# Sizes are rounded up to whole huge pages, so results of nearly equal size share buffers.
_GRANULE = 2 << 20
# Cache-line alignment: a row that starts on a line is written without splitting stores.
_ALIGNMENT = 64

# Re-entrant: a garbage collection inside the locked code below runs finalizers (``__del__``,
# weakref callbacks) on the same thread, as may a signal handler, and one that calls back in
# (``empty_cache()`` in a ``__del__``, a large product in a finalizer) would wait forever on a
# plain lock. `_busy` keeps such a call off the half-changed idle list instead.
_lock = threading.RLock()
_busy = False            # the lock's holder is changing the pool (read and set under the lock)
_release_pending = False  # empty_cache called back in while busy: done when the change ends
_idle = OrderedDict()   # id(raw) -> raw uint8 buffer, oldest first
_idle_bytes = 0
# Buffers freed while the lock was held: by another thread, or by a garbage collection that
# ran inside this module's own locked code. Taken into `_idle` at the next locked call.
_returned = deque()


class _BufferOwner:
    """The ``base`` of a pooled result: exposes the buffer to NumPy and keeps it alive."""

    __slots__ = ("__array_interface__", "_raw", "__weakref__")

    def __init__(self, raw, shape, dtype):
        self._raw = raw
        # not raw.ctypes, which imports a module on each use: that fails in a __del__ run
        # late in interpreter shutdown, where numpy.empty still works
        address = raw.__array_interface__["data"][0]
        address += -address % _ALIGNMENT
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "version": 3,
                                    "data": (address, False)}

    def __reduce_ex__(self, protocol):
        # A copy would share (shallow) or point at (pickled) this buffer without the finalizer
        # that knows when it is free: the pool would hand the memory out under it.
        raise TypeError("a pooled result's buffer owner cannot be copied or pickled; copy or "
                        "pickle the array instead")


def _rounded(nbytes):
    return -(-nbytes // _GRANULE) * _GRANULE


def _keep_returned():
    """Move freed buffers into the idle list, dropping the oldest past the cap (lock held)."""
    global _idle_bytes
    limit = buffer_cache_bytes()
    while _returned:
        raw = _returned.popleft()
        if raw.nbytes <= limit:
            _idle[id(raw)] = raw
            _idle_bytes += raw.nbytes
    while _idle_bytes > limit:
        _, oldest = _idle.popitem(last=False)
        _idle_bytes -= oldest.nbytes


def _release():
    """Drop every idle and returned buffer (lock held, not busy)."""
    global _idle_bytes, _release_pending
    _release_pending = False
    _returned.clear()
    _idle.clear()
    _idle_bytes = 0


def _end_change():
    """Close a change begun by setting `_busy` (lock held): run a release asked for meanwhile."""
    global _busy
    _busy = False
    if _release_pending:
        _release()


def _take_idle(capacity):
    global _idle_bytes, _busy
    with _lock:
        if _busy:
            # called back in from a collection inside this thread's own change of the idle
            # list: fresh memory, which still returns here once freed
            return None
        _busy = True
        try:
            _keep_returned()
            for key, raw in _idle.items():
                if raw.nbytes == capacity:
                    del _idle[key]
                    _idle_bytes -= raw.nbytes
                    return raw
            return None
        finally:
            _end_change()


def _keep_returned_unless_busy():
    """`_keep_returned`, unless this thread is already inside a change (lock held)."""
    global _busy
    if not _busy:
        _busy = True
        try:
            _keep_returned()
        finally:
            _end_change()


def _give_back(raw):
    """Finalizer of an owner: keep its buffer for reuse.

    It may run inside a garbage collection at any allocation, including one in this module's
    locked code, so it never waits for the lock: when the lock is taken the buffer is queued
    (an atomic append) for the next call to move in.
    """
    _returned.append(raw)
    if _lock.acquire(blocking=False):
        try:
            _keep_returned_unless_busy()
        finally:
            _lock.release()


def _after_fork_in_child():
    """A fresh lock and an empty pool in a forked child.

    Another thread of the parent may have held the lock at the fork, and no thread of the
    child would ever release it; its idle buffers are the parent's pages, shared copy-on-write,
    so reusing one would copy each page anyway.
    """
    global _lock, _idle_bytes, _busy, _release_pending
    _lock = threading.RLock()
    _busy = _release_pending = False
    _idle.clear()
    _returned.clear()
    _idle_bytes = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _allocated(shape, dtype):
    """``numpy.empty(shape, dtype)``; where memory runs out, once more after the idle buffers
    are released: the pool kept up to the cap of freed results (of other sizes, never
    reused) while the allocation that needed their memory failed."""
    try:
        return np.empty(shape, dtype=dtype)
    except MemoryError:
        if not cached_bytes():
            raise
        empty_cache()
        return np.empty(shape, dtype=dtype)


def empty(shape, dtype):
    """An uninitialised C-contiguous array, like `numpy.empty`; large ones reuse freed results.

    Parameters
    ----------
    shape : tuple of int
    dtype : numpy.dtype
        Any dtype `numpy.empty` takes; one holding Python objects is never pooled (its
        elements must start as None, not as a freed result's bytes).

    Returns
    -------
    numpy.ndarray
        Owns its memory when smaller than `MIN_POOLED_BYTES`, larger than the cap on idle
        buffers (or reuse is off) or for object dtypes; otherwise a 64-byte-aligned view
        whose buffer returns to the pool once nothing refers to it.
    """
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize
    for extent in shape:   # not np.prod: this runs on every call, small ones included
        nbytes *= extent
    # A buffer above the cap could never be kept once freed: no owner, no finalizer for it.
    if (nbytes < MIN_POOLED_BYTES or _rounded(nbytes + _ALIGNMENT) > buffer_cache_bytes()
            or dtype.hasobject):
        return _allocated(shape, dtype)
    # operator.index: a float extent is refused as numpy.empty refuses it, not truncated
    shape = tuple(operator.index(extent) for extent in shape)
    if min(shape, default=0) < 0:   # two negative extents multiply to a positive size
        return np.empty(shape, dtype=dtype)   # numpy.empty's own error
    if dtype.subdtype is not None:   # as numpy.empty: (3,) of (float64, (2,)) is (3, 2) float64
        dtype, extra = dtype.subdtype
        shape += extra
    capacity = _rounded(nbytes + _ALIGNMENT)
    raw = _take_idle(capacity)
    if raw is None:
        raw = _allocated(capacity, np.uint8)
    owner = _BufferOwner(raw, shape, dtype)
    finalizer = weakref.finalize(owner, _give_back, raw)
    finalizer.atexit = False   # nothing to keep at exit
    array = np.asarray(owner)
    if array.dtype is not dtype:
        # the typestr says only "|V16" for a record, and nothing of a dtype's metadata
        array = array.view(dtype)
    return array


def cached_bytes():
    """Bytes held in idle buffers, ready for the next large result.

    Examples
    --------
    >>> import pysparse_hpc as sph
    >>> sph.empty_cache()
    >>> sph.cached_bytes()
    0
    """
    with _lock:
        _keep_returned_unless_busy()
        return _idle_bytes


def empty_cache():
    """Release the idle result buffers to the system (like ``torch.cuda.empty_cache``).

    Results still in use are not affected; their memory is kept for reuse when they are freed,
    up to ``PYSPARSE_HPC_BUFFER_CACHE_MB``. Called from a finalizer that a garbage collection
    runs while this thread is inside the pool's own code, it releases them once that code ends.
    """
    global _release_pending
    with _lock:
        if _busy:
            _release_pending = True
        else:
            _release()
