"""Tunables of the library, in one place; environment variables override the defaults.

``PYSPARSE_HPC_NUM_THREADS`` (else ``NUMBA_NUM_THREADS``, else all cores): threads used by the
Cython conversions and the Numba kernels, whichever thread of the process calls them; at most
Numba's pool (``NUMBA_NUM_THREADS``, a larger value is lowered to it with a warning). Change it
at run time with `set_num_threads`. OpenMP's own default (``OMP_NUM_THREADS``, which torch
reads) is left as it was (`_start_numba_pool`).

``PYSPARSE_HPC_PARALLEL_MIN_FLOPS`` (default 2**17): kernels with less work than this run on
one thread: a parallel launch costs about 2 microseconds while the pool is warm and 6-16 after
it has slept, more than such work takes. Measured on 2 cores, a Cora-sized SpMM at N=32 (about
2**19.4 flops) already runs 1.7x faster on two threads, and GNN training epochs were no slower
than with the earlier 2**20.

``PYSPARSE_HPC_SPMM_TILE`` (default 4096): output columns the CPU SpMM handles at a time when
B is not C-contiguous (a transposed or column-sliced B; a C-contiguous B is summed in
register-sized chunks instead). Tiles keep pieces of the output row and of the gathered B rows
in cache for very wide B; measured on a 2-core machine, tiles of 64-256 columns were 1.3-2.8x
slower than whole rows at widths up to 3703 (each tile re-reads the row's indices and breaks the
streaming reads of B), so the default only tiles beyond 4096 columns.

``PYSPARSE_HPC_BUFFER_CACHE_MB`` (default 1024): idle memory, in MiB, kept from freed results
of at least 32 MiB so that the next result of that size reuses it instead of fresh pages, which
the system zeroes on first write (about as long as a memory-bound SpMM takes to fill them). 0
turns reuse off; `pysparse_hpc.empty_cache` releases what is kept.

``PYSPARSE_HPC_CUDA_WARPS`` (default 4): warps per thread block of the tensor-core SpMM; each
warp owns 16 output columns of a row window (FlashSparse's 4 warps x 16 columns).

``PYSPARSE_HPC_CUDA_SPLIT_BLOCKS`` (default 32): windows with more blocks than this are split
across thread blocks that combine with atomics (FlashSparse's threshold), so the long windows of
power-law graphs do not hold up the grid.

``PYSPARSE_HPC_SPMM_TILE``, ``PYSPARSE_HPC_CUDA_WARPS`` and ``PYSPARSE_HPC_CUDA_SPLIT_BLOCKS``
must be at least 1; like a value that is not an integer, a smaller one stops the import with
the variable's name.
"""
import contextlib
import ctypes
import os
import threading
import warnings

import numba

from ._sputils import check_integer


def _openmp_runtime():
    """The GNU OpenMP runtime Numba's OpenMP threading layer runs on, or None."""
    try:
        return ctypes.CDLL("libgomp.so.1")
    except OSError:
        return None


#: The runtime and its thread count before anything here starts Numba's pool.
_OPENMP = _openmp_runtime()
_OPENMP_THREADS = None if _OPENMP is None else _OPENMP.omp_get_max_threads()

__all__ = ["get_num_threads", "set_num_threads", "parallel_launch", "parallel_min_flops",
           "spmm_tile", "buffer_cache_bytes", "cuda_warps_per_block", "cuda_split_blocks"]


def environment_value(name):
    """Environment variable ``name`` stripped of blanks, or None when it is unset or set to
    nothing (``VAR= command``), which means its default."""
    return os.environ.get(name, "").strip() or None


def _initial_threads():
    value = environment_value("PYSPARSE_HPC_NUM_THREADS")
    if value is None:
        return numba.get_num_threads()
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"PYSPARSE_HPC_NUM_THREADS must be a positive integer, got {value!r}")
    pool = numba.config.NUMBA_NUM_THREADS
    if threads > pool:
        warnings.warn(f"PYSPARSE_HPC_NUM_THREADS={threads} is more than the kernels' thread "
                      f"pool (NUMBA_NUM_THREADS={pool}, all cores unless set); using {pool}",
                      RuntimeWarning, stacklevel=2)
        threads = pool
    return threads


def _env_int(name, default, minimum=None):
    """The integer in environment variable ``name``, else ``default``.

    Parameters
    ----------
    name : str
    default : int
    minimum : int, optional
        The smallest value that means something. A smaller one is refused rather than raised
        to it: ``PYSPARSE_HPC_CUDA_WARPS=0`` ran one warp per block without a word.

    Raises
    ------
    ValueError
        When the value is not an integer, or is below ``minimum``.
    """
    value = environment_value(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


#: The largest count the kernels take (they receive it as a 64-bit integer). A tile or a split
#: threshold above it means the same as this one: whole rows, windows never split.
_LARGEST_COUNT = 2**63 - 1


_PARALLEL_MIN_FLOPS = _env_int("PYSPARSE_HPC_PARALLEL_MIN_FLOPS", 1 << 17)


_SPMM_TILE = _env_int("PYSPARSE_HPC_SPMM_TILE", 4096, minimum=1)


def spmm_tile():
    """Output columns per tile of the CPU SpMM on strided B (at least 1)."""
    return min(max(1, _SPMM_TILE), _LARGEST_COUNT)


_BUFFER_CACHE_BYTES = _env_int("PYSPARSE_HPC_BUFFER_CACHE_MB", 1024) << 20


def buffer_cache_bytes():
    """Most bytes of idle result buffers kept for reuse (0: none)."""
    return max(0, _BUFFER_CACHE_BYTES)


_CUDA_WARPS = _env_int("PYSPARSE_HPC_CUDA_WARPS", 4, minimum=1)


def cuda_warps_per_block():
    """Warps per thread block of the tensor-core SpMM (at least 1)."""
    return max(1, _CUDA_WARPS)


_CUDA_SPLIT_BLOCKS = _env_int("PYSPARSE_HPC_CUDA_SPLIT_BLOCKS", 32, minimum=1)


def cuda_split_blocks():
    """Blocks above which a window is split across thread blocks (at least 1)."""
    return min(max(1, _CUDA_SPLIT_BLOCKS), _LARGEST_COUNT)


def parallel_min_flops():
    """Work (floating-point operations) below which kernels run serially."""
    return _PARALLEL_MIN_FLOPS


#: The process's thread count (`set_num_threads`), and the one this thread last gave Numba.
_num_threads = None
_applied = threading.local()


def get_num_threads():
    """Threads the library's parallel kernels use, in whichever thread calls it.

    Numba keeps its thread count per thread, and a thread it has not seen starts on the whole
    pool: a count set at start-up or with `set_num_threads` in one thread would not reach a
    thread started by the caller (a thread pool, a data loader). So the process's count is
    handed to Numba here, once per thread and again after each `set_num_threads` that changes
    it; a ``numba.set_num_threads`` of the thread's own in between is kept. The kernels' drivers
    and the Cython conversions read it through this function just before they run.
    """
    threads = _num_threads   # read once: another thread may set it meanwhile
    if getattr(_applied, "threads", None) != threads:
        numba.set_num_threads(threads)
        _applied.threads = threads
    return numba.get_num_threads()


#: Held around a parallel kernel while Numba's threading layer may be ``workqueue`` (its
#: fallback where neither OpenMP nor TBB loads), which aborts the whole process when two threads
#: launch parallel kernels at once; OpenMP's and TBB's layers take concurrent launches.
_WORKQUEUE_LOCK = threading.Lock()
_layer_takes_threads = False


def parallel_launch():
    """The context to run a parallel Numba kernel in: a lock while Numba's threading layer is
    ``workqueue`` or not chosen yet (before the first parallel kernel has run), nothing once
    the layer is one that takes launches from several threads at once.

    Under ``workqueue`` the kernels called from several threads (a thread pool serving one
    model) run one at a time, each on the process's threads, instead of aborting.
    """
    global _layer_takes_threads
    if _layer_takes_threads:
        return contextlib.nullcontext()
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet, so no layer is chosen
        return _WORKQUEUE_LOCK
    if layer == "workqueue":
        return _WORKQUEUE_LOCK
    _layer_takes_threads = True
    return contextlib.nullcontext()


def set_num_threads(n):
    """Set the threads of every parallel kernel (Numba and Cython/OpenMP alike), in every
    thread of the process (see `get_num_threads`).

    ``n`` may not exceed ``numba.config.NUMBA_NUM_THREADS`` (the pool size fixed at start-up).
    """
    n = check_integer(n, "number of threads")
    if not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(
            f"number of threads must be in [1, {numba.config.NUMBA_NUM_THREADS}], got {n}")
    if n > 1 and _forked:
        raise RuntimeError(
            "this process was forked from one that had started the kernels' OpenMP threads, "
            "which GNU OpenMP cannot run again in a child (Numba ends such a child, and the "
            "conversions wait for ever): its kernels run on one thread. Start child processes "
            "with the 'spawn' or 'forkserver' method to run them on several")
    _use_num_threads(n)


def _use_num_threads(n):
    """``n`` threads for the process, and for Numba in the calling thread now."""
    global _num_threads
    numba.set_num_threads(n)
    _num_threads = n
    _applied.threads = n


def _start_numba_pool(threads):
    """`set_num_threads` without its checks, then the process's OpenMP thread count as it was
    before Numba's pool started (`_OPENMP_THREADS`).

    Numba's OpenMP layer sets the runtime's default thread count to its pool size when the pool
    starts. Every other user of the same runtime (torch, whose CPU builds may share the
    system's libgomp) then runs on every core whatever ``OMP_NUM_THREADS`` says: each of two
    ranks of an ``mpiexec`` job on two cores ran torch on two threads, beside a rank waiting
    in MPI and polling its core, and a Cholesky inversion took 60x longer. Numba's kernels and
    the Cython conversions pass their thread counts explicitly and do not read the default."""
    _use_num_threads(threads)
    if _OPENMP is not None and _OPENMP.omp_get_max_threads() != _OPENMP_THREADS:
        _OPENMP.omp_set_num_threads(_OPENMP_THREADS)


#: Whether this process is a child forked from one that had imported the library.
_forked = False


def _after_fork_in_child():
    """One thread for the kernels, and a fresh launch lock, in a forked child.

    The parent started Numba's pool at import (and the conversions' OpenMP threads when they
    ran): a child forked from it that runs a parallel Numba kernel is ended by Numba under GNU
    OpenMP, and a parallel conversion waits for ever on threads that were not forked. Torch
    puts its data-loader workers on one thread for the same reason. Another thread of the
    parent may have held the lock at the fork, and no thread of the child would release it.
    """
    global _forked, _num_threads, _applied, _WORKQUEUE_LOCK
    _forked = True
    _num_threads = 1
    _applied = threading.local()   # the forking thread's record is the parent's count
    _WORKQUEUE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _start_pool_at_import():
    """`_start_numba_pool` with the thread count of the environment; a threading layer that
    cannot load is named by the variable that chose it."""
    try:
        _start_numba_pool(_initial_threads())
    except ValueError as exc:
        layer = environment_value("NUMBA_THREADING_LAYER")
        if layer is None or "threading layer" not in str(exc):
            raise
        raise ValueError(f"NUMBA_THREADING_LAYER={layer}: {exc} (unset it, or install the "
                         f"layer)") from None


_start_pool_at_import()
