"""The library's communicator: the one module that imports mpi4py.

`Communicator` wraps a ``Dup()`` of ``MPI.COMM_WORLD`` (so the library's messages never match a
user's) with buffer-protocol collectives and point-to-point calls on NumPy arrays and CPU torch
tensors, and counts the messages and bytes each kind of traffic moves. Without mpi4py, or in a
script started without ``mpiexec``, it is a one-rank communicator whose collectives return their
input: every distributed code path is also the single-process one.

Byte counts are the payload the library hands to MPI, per rank: a point-to-point message counts
its buffer on both ends; a collective counts its buffer once sent and once received (what the
MPI library moves inside it depends on its algorithm); a broadcast counts ``size - 1`` messages
sent on the root and one received elsewhere; an object collective counts the pickled bytes
the same way. A one-rank communicator's collectives count nothing (nothing crosses); its
messages to itself count as messages where they go through MPI (`Communicator.Isend` and
`Irecv` need it; without MPI `Sendrecv` to itself is a copy that counts nothing).

MPI waits for ever in a collective that another rank never joins. With a timeout
(`Communicator.set_timeout`, ``init(timeout=...)`` or ``PYSPARSE_HPC_COMM_TIMEOUT``) a
watchdog thread ends the job instead, naming the rank, the call and where it waited.
"""
import contextlib
import copy
import hashlib
import math
import os
import pickle
import shutil
import sys
import threading
import time
import traceback
import weakref
from collections import defaultdict

import numpy as np

from .._sputils import is_real_number

__all__ = ["Communicator", "init", "launched_ranks", "mpiexec_path"]

#: Traffic kind of `DataParallel`'s flags (one byte per parameter tensor) that say which
#: parameters got a gradient on some rank; the gradients themselves are ``"allreduce"``.
PARTICIPATION_KIND = "gradient participation"
#: Kinds of traffic `Communicator.stats` reports (any other string is accepted too).
KINDS = ("halo", "reverse_halo", "allreduce", PARTICIPATION_KIND, "broadcast", "gather",
         "scatter", "allgather", "alltoall", "reduce_scatter", "sendrecv", "setup")

_OPS = ("sum", "max", "min", "land", "lor", "band", "bor")

# Environment variables through which launchers announce the job's size (MPICH's Hydra, Open
# MPI, PMIx launchers, Slurm's srun), read only to name mpi4py when it is missing.
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS",
                   "SLURM_NTASKS")
# ... and this process's rank, read only where no communicator exists yet.
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")

_WORLD = None
_WORLD_LOCK = threading.Lock()

#: The environment variable `init` reads the communication timeout from (seconds).
TIMEOUT_VARIABLE = "PYSPARSE_HPC_COMM_TIMEOUT"


def launched_ranks():
    """The number of ranks a launcher announced in the environment (1 when none did)."""
    for name in _SIZE_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return max(1, int(value))
    return 1


def launched_rank():
    """This process's rank as a launcher announced it in the environment (0 when none did):
    for what must be said once before a communicator exists."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def mpiexec_path():
    """The ``mpiexec`` beside the running Python (a virtual environment's mpich), else the one
    on the PATH; None when there is none."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpiexec")


def check_communicator(comm, needed=("rank", "size", "Allreduce"), name="comm"):
    """`comm` when it can stand for the library's `Communicator` (has the methods `needed`),
    else a ``TypeError`` saying what to pass; None is returned as it is.

    An mpi4py communicator is refused by name: it has the same method names but not the
    library's ``kind=`` traffic accounting, and would fail later, mid-step."""
    if comm is None:
        return None
    if type(comm).__module__.split(".")[0] == "mpi4py":
        raise TypeError(f"{name} is an mpi4py communicator ({type(comm).__name__}); pass "
                        f"pysparse_hpc.distributed.Communicator({name}), or "
                        f"pysparse_hpc.distributed.init() for every rank of the job")
    missing = [method for method in needed if not hasattr(comm, method)]
    if missing:
        raise TypeError(f"{name} must be a pysparse_hpc.distributed.Communicator, got "
                        f"{type(comm).__name__} (it has no {', '.join(missing)})")
    return comm


def _is_bfloat16(array):
    return str(getattr(array, "dtype", "")) == "torch.bfloat16"


def _as_buffer(array, name="buffer", written=False):
    """A C-contiguous NumPy view of ``array`` (NumPy array or CPU torch tensor), no copy;
    ``written``: the call writes into it, so it must not be read-only.

    NumPy has no bfloat16: a bfloat16 tensor is viewed as its int16 bit patterns, which moves
    it exactly but cannot be added (`_reduction_buffer`)."""
    if isinstance(array, np.ndarray):
        view = array
    elif hasattr(array, "detach") and hasattr(array, "numpy"):
        if array.device.type != "cpu":
            raise ValueError(f"{name} is on {array.device}; the communicator moves host memory "
                             "(copy it to the CPU first)")
        tensor = array.detach()
        if _is_bfloat16(tensor):
            import torch
            tensor = tensor.view(torch.int16)
        view = tensor.numpy()
    else:
        raise TypeError(f"{name} must be a NumPy array or a CPU torch tensor, got "
                        f"{type(array).__name__}")
    if not view.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    # Checked at every size: MPI refuses these only with more than one rank.
    if view.dtype.kind not in "biufc":
        raise TypeError(f"{name} has dtype {view.dtype}: the communicator moves numbers and "
                        f"bools only (pickle other objects with bcast or allgather)")
    if not view.dtype.isnative:
        raise ValueError(f"{name} is {view.dtype.str}, not in this machine's byte order; "
                         f"convert it first (array.astype(array.dtype.newbyteorder('=')))")
    if written and not view.flags.writeable:
        raise ValueError(f"{name} is read-only, and the result is written into it: pass a "
                         f"writable copy (array.copy())")
    return view


#: The reductions MPI defines for each kind of value: logical ones for bools, no bitwise or
#: logical ones for floats, sums for complex numbers.
_OPS_BY_KIND = {"b": ("land", "lor"), "i": _OPS, "u": _OPS, "f": ("sum", "max", "min"),
                "c": ("sum",)}


def check_rank(value, size, name="root"):
    """``value`` as an int when it names one of ``size`` ranks: a TypeError for what is not
    an integer, a ValueError for an integer out of range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a rank, an int in [0, {size}), got "
                        f"{type(value).__name__} {value!r}")
    if not 0 <= value < size:
        raise ValueError(f"{name} must be a rank in [0, {size}), got {value!r}")
    return int(value)


def _check_reduction(buffer, op, name="buffer"):
    """Refuse an ``op`` MPI does not define for ``buffer``'s dtype, at every size (one rank
    would return the buffer unchanged where two fail inside MPI)."""
    if not isinstance(op, str):
        if hasattr(op, "__array__") or hasattr(op, "__len__"):
            # mpi4py's Allreduce(sendbuf, recvbuf): the array landed here as the op, where
            # `op not in _OPS` failed on the array's ambiguous truth value.
            raise TypeError(f"op must be one of {_OPS}, got {type(op).__name__}: the "
                            f"reductions work in place on one {name} (Allreduce(buffer, "
                            f"op='sum')), not from a send buffer into a receive buffer as "
                            f"mpi4py's Allreduce(sendbuf, recvbuf); copy the values into the "
                            f"receiving array and reduce that")
        raise TypeError(f"op must be one of {_OPS}, got {op!r}")
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    kind = "f" if _is_bfloat16(buffer) else _as_buffer(buffer, name).dtype.kind
    if op not in _OPS_BY_KIND[kind]:
        raise TypeError(f"op {op!r} does not apply to {name} of dtype "
                        f"{getattr(buffer, 'dtype', '?')}: MPI reduces it with "
                        f"{', '.join(map(repr, _OPS_BY_KIND[kind]))} only")


def _reduction_buffer(array, name="buffer", written=True):
    """``(view, write_back)``: the NumPy view an MPI reduction adds, and what to call once it
    is complete (None when the view is ``array``'s own memory).

    MPI cannot add bfloat16, so a bfloat16 tensor is reduced as a float32 copy (twice its
    bytes cross) and the result rounded back once: the ranks' sum is that of their float32
    values, as exact as float32 addition, and the same on every rank."""
    view = _as_buffer(array, name, written)
    if not _is_bfloat16(array):
        return view, None
    target = array.detach()
    work = target.float()
    return work.numpy(), lambda: target.copy_(work)


class _Request:
    """A pending nonblocking call; ``wait()`` completes it (a no-op for a one-rank call),
    adds the time it blocked to its communicator's `Communicator.wait_seconds`, and writes a
    reduction's result back where it was computed in a copy (`_reduction_buffer`).

    A receive (``receive=(source, nbytes)``) checks that the message filled its buffer
    (`check_received`)."""

    __slots__ = ("_request", "_comm", "_kind", "_write_back", "_receive")

    def __init__(self, request=None, comm=None, kind=None, write_back=None, receive=None):
        self._request, self._comm, self._kind = request, comm, kind
        self._write_back, self._receive = write_back, receive

    def _complete(self):
        self._request = None
        if self._write_back is not None:
            self._write_back()
            self._write_back = None

    def _check_received(self, status, error=None):
        """`check_received` for this request, when it is a receive."""
        if self._receive is not None:
            check_received(self._comm, self._kind, *self._receive, status, error)

    def wait(self):
        if self._request is not None:
            from mpi4py import MPI
            start = time.perf_counter()
            status, error = MPI.Status(), None
            try:
                self._comm._watched(f"a wait for {self._kind!r}", self._request.Wait, status)
            except MPI.Exception as exc:
                error = exc
            self._comm._waited[self._kind] += time.perf_counter() - start
            self._check_received(status, error)
            if error is not None:
                raise error
            self._complete()

    @staticmethod
    def wait_all(requests):
        """Complete every request of ``requests`` (one MPI call)."""
        pending = [r for r in requests if r._request is not None]
        if pending:
            from mpi4py import MPI
            comm = pending[0]._comm
            start = time.perf_counter()
            statuses, error = [MPI.Status() for _ in pending], None
            try:
                comm._watched(f"a wait for {pending[0]._kind!r}", MPI.Request.Waitall,
                              [r._request for r in pending], statuses)
            except MPI.Exception as exc:
                error = exc
            comm._waited[pending[0]._kind] += time.perf_counter() - start
            for r, status in zip(pending, statuses):
                r._check_received(status, error)
            if error is not None:
                raise error
        for r in pending:
            r._complete()


def check_received(comm, kind, source, expected, status, error=None):
    """Raise a clear error if a message from ``source`` was not the ``expected`` bytes of its
    buffer (other errors are left to the caller, which raises ``error``): the library's
    messages have known sizes, and a peer that sent another dtype or row shape would otherwise
    leave part of the buffer unwritten (a shorter message) or fail with MPI's bare truncation
    error (a longer one)."""
    MPI = sys.modules["mpi4py.MPI"]   # imported, as a message was exchanged: no import cost
    code = MPI.SUCCESS if error is None else error.Get_error_class()
    if code == MPI.ERR_IN_STATUS:  # Waitall: each request's own error is in its status
        code = MPI.Get_error_class(status.Get_error())
    if code == MPI.ERR_TRUNCATE:
        received = "more"
    elif code == MPI.SUCCESS and status.Get_count(MPI.BYTE) != expected:
        received = status.Get_count(MPI.BYTE)
    else:
        return
    raise ValueError(f"rank {comm.rank} expected {expected} bytes from rank {source} in "
                     f"{kind!r} but received {received}: the ranks passed arrays of "
                     f"different dtypes or shapes")


def check_timeout(seconds, name="timeout"):
    """``seconds`` as a float (a finite number > 0), or None; else a clear error."""
    if seconds is None:
        return None
    if not is_real_number(seconds):
        raise TypeError(f"{name} must be a number of seconds or None, got "
                        f"{type(seconds).__name__}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a finite number of seconds > 0 (or None: wait for "
                         f"ever), got {seconds!r}")
    return float(seconds)


def _timeout_from_environment():
    """The timeout `TIMEOUT_VARIABLE` sets, or None when it is unset or empty."""
    value = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not value:
        return None
    try:
        return check_timeout(float(value), TIMEOUT_VARIABLE)
    except ValueError:
        raise ValueError(f"{TIMEOUT_VARIABLE} must be a number of seconds > 0, got "
                         f"{value!r}") from None


class _Watchdog(threading.Thread):
    """Ends the job when a thread of this rank has waited longer than ``timeout`` seconds in
    one blocking call of its communicator (`Communicator.set_timeout`).

    ``waiting`` maps a thread to ``(start, what)`` of the call it is blocked in; setting and
    removing an entry are single dictionary operations, atomic under the GIL, so the calls
    being watched take no lock. mpi4py releases the GIL while MPI waits, so this thread runs.

    Waits are measured on `clock`, the time this process was seen running: a gap between two
    of the watchdog's checks far past their interval means the process was stopped (SIGSTOP,
    a scheduler suspending the job), when no rank waited for another, and counts as one
    interval. Measured on the wall clock, a job suspended for longer than its timeout ended
    the moment it was resumed.
    """

    #: How many intervals a gap between two checks may last and still count whole (a loaded
    #: machine wakes the thread late).
    LONGEST_GAP = 2

    def __init__(self, comm, timeout):
        super().__init__(name="pysparse_hpc communication watchdog", daemon=True)
        self.comm, self.timeout = comm, timeout
        self.waiting = {}
        self._stopped = threading.Event()
        self._running, self._checked = 0.0, time.monotonic()
        self.start()

    def stop(self):
        self._stopped.set()

    def _interval(self):
        return min(1.0, self.timeout / 4)

    def clock(self):
        """Seconds this process was seen running (since the watchdog started)."""
        since = time.monotonic() - self._checked
        return self._running + min(since, self.LONGEST_GAP * self._interval())

    def run(self):
        while not self._stopped.wait(self._interval()):
            self._running, self._checked = self.clock(), time.monotonic()
            now = self._running
            for thread, (start, what) in list(self.waiting.items()):
                if now - start > self.timeout:
                    self._end_job(thread, what, now - start)

    def _end_job(self, thread, what, waited):
        comm = self.comm
        frame = sys._current_frames().get(thread)
        stack = [] if frame is None else traceback.extract_stack(frame)
        while stack and stack[-1].filename == __file__:  # the caller's frames, not ours
            stack.pop()
        where = "".join(traceback.format_list(stack))
        try:
            sys.stderr.write(
                f"pysparse_hpc: rank {comm.rank} of {comm.size} waited {waited:.1f} s in "
                f"{what}, beyond the communicator's timeout of {self.timeout:g} s: another "
                f"rank stopped, hangs, or called another collective. Ending the job. Where "
                f"rank {comm.rank} waited:\n{where}")
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            comm.Abort(1)


class _Guard:
    """A communicator's timeout and the watchdog thread that enforces it (None, None: off)."""

    __slots__ = ("timeout", "watchdog")

    def __init__(self):
        self.timeout, self.watchdog = None, None


def _free_context(mpi_comm):
    """Free an MPI communicator that `Communicator.duplicate` made (not after MPI ended)."""
    from mpi4py import MPI
    if not MPI.Is_finalized():
        mpi_comm.Free()


def _one_rank(timeout):
    """A one-rank `Communicator` with ``timeout`` (what an unpickled one-rank one becomes)."""
    comm = Communicator(None)
    if timeout is not None:
        comm.set_timeout(timeout)
    return comm


class Communicator:
    """A group of ranks and the collectives the library needs on it.

    Parameters
    ----------
    mpi_comm : mpi4py.MPI.Comm, optional
        Used as it is (`init` passes a ``Dup()`` of ``COMM_WORLD``). None makes a one-rank
        communicator that needs no MPI.

    Attributes
    ----------
    rank, size : int
    mpi : mpi4py.MPI.Comm or None
    timeout : float or None
        Seconds one blocking call may wait before the job is ended (`set_timeout`); None
        (the default) waits for ever, as MPI does.

    Notes
    -----
    Buffers are NumPy arrays or CPU torch tensors, C-contiguous; reductions work in place.
    Methods with lower-case names (`bcast`, `allgather`, `alltoall`, `gather`, `scatter`) pickle
    Python objects and are meant for set-up, never for per-step traffic.
    """

    def __init__(self, mpi_comm=None):
        # Checked here: a library Communicator passed again, or anything else, failed with
        # an AttributeError about Get_rank.
        if isinstance(mpi_comm, Communicator):
            raise TypeError("mpi_comm is already a pysparse_hpc Communicator: use it as it is")
        if mpi_comm is not None and not (hasattr(mpi_comm, "Get_rank")
                                         and hasattr(mpi_comm, "Get_size")):
            raise TypeError(f"mpi_comm must be an mpi4py communicator (MPI.COMM_WORLD, or one "
                            f"made from it) or None, got {type(mpi_comm).__name__}")
        self.mpi = mpi_comm
        self.rank = 0 if mpi_comm is None else mpi_comm.Get_rank()
        self.size = 1 if mpi_comm is None else mpi_comm.Get_size()
        self._counters = defaultdict(lambda: np.zeros(4, dtype=np.int64))
        self._waited = defaultdict(float)
        # The timeout and its watchdog, shared with this communicator's duplicates.
        self._guard = _Guard()

    def __copy__(self):
        # Shallow, as `duplicate` needs (the counters and the guard shared): not through
        # `__reduce__`, which builds a fresh communicator.
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def __deepcopy__(self, memo):
        # A communicator names a group of ranks, not data: a deep copy of what holds it (a
        # DistGraph, a DataParallel model) talks to the same ranks, as the original does.
        if self.__dict__.pop("_duplicated", False):
            # A context of its own (`duplicate`) is freed by its holder when that is released
            # (a DistGraph's plan collected, a DataParallel retired), which would leave the
            # copy on a freed context. Shared from now on, it is freed once nothing holds it.
            weakref.finalize(self, _free_context, self.mpi).atexit = False
        return self

    def __reduce__(self):
        """A one-rank communicator pickles as a fresh one (no MPI, the same timeout; its
        traffic statistics start afresh); one over several ranks cannot be sent to another
        process, which is not one of its ranks."""
        if self.size > 1:
            raise TypeError(f"a Communicator over {self.size} ranks cannot be pickled: "
                            "pickle what holds it on each rank without it (a state_dict) and "
                            "rebuild it there with that rank's communicator")
        return _one_rank, (self.timeout,)

    def duplicate(self):
        """A communicator over the same ranks in a context of its own (``MPI_Comm_dup``): its
        messages and collectives never match this one's, so two users of the ranks whose
        calls may interleave differently on different ranks (two `DataParallel` wrappers
        reducing during one backward, two graphs' halo exchanges) cannot take each other's.
        Its traffic counts in this communicator's `stats` and `wait_seconds`, and it is
        watched by this one's timeout. A collective call; `free` it when done.

        Returns
        -------
        Communicator
            A shallow copy (no MPI call) where this one has no MPI.
        """
        twin = copy.copy(self)  # shares the counters and the guard
        if self.mpi is not None:
            twin.mpi = self._watched("Dup", self.mpi.Dup)
            twin._duplicated = True
        return twin

    def free(self):
        """Release the MPI context of a communicator made by `duplicate` (a no-op for any
        other, and when MPI was finalized); it must not be used afterwards. One that a deep
        copy of its holder shares is released when it is collected instead."""
        if self.__dict__.pop("_duplicated", False):
            _free_context(self.mpi)

    # ---------------------------------------------------------------- timeout
    @property
    def timeout(self):
        return self._guard.timeout

    def set_timeout(self, seconds):
        """End the job when this rank waits longer than ``seconds`` in one blocking call.

        A collective waits for every rank. When one rank stopped (a hang, an endless loop, a
        lost process) or called another collective, the others would wait for ever; with a
        timeout, a watchdog thread prints which rank waited, in which call, for how long and
        where (its stack), and aborts the job with exit status 1, as torch.distributed's
        timeout does. Choose it longer than the longest legitimate wait: ranks waiting while
        rank 0 reads and partitions a large graph, or for a slow rank's step.

        Parameters
        ----------
        seconds : float or None
            A positive number; None switches the watchdog off (the default: wait for ever).

        Examples
        --------
        >>> from pysparse_hpc import distributed
        >>> comm = distributed.Communicator()
        >>> comm.set_timeout(600)
        >>> comm.timeout
        600.0
        >>> comm.set_timeout(None)
        """
        guard = self._guard
        guard.timeout = seconds = check_timeout(seconds)
        if seconds is None or self.size == 1:  # one rank never waits for another
            if guard.watchdog is not None:
                guard.watchdog.stop()
                guard.watchdog = None
        elif guard.watchdog is not None:
            guard.watchdog.timeout = seconds
        else:
            guard.watchdog = _Watchdog(self, seconds)

    def _watched(self, what, call, *args, **kwargs):
        """``call(*args, **kwargs)``, watched by the timeout's watchdog when there is one."""
        watchdog = self._guard.watchdog
        if watchdog is None:
            return call(*args, **kwargs)
        thread = threading.get_ident()
        watchdog.waiting[thread] = (watchdog.clock(), what)
        try:
            return call(*args, **kwargs)
        finally:
            watchdog.waiting.pop(thread, None)

    def __repr__(self):
        backend = "no MPI" if self.mpi is None else "MPI"
        return f"Communicator(rank={self.rank}, size={self.size}, {backend})"

    # ---------------------------------------------------------------- statistics
    def _count(self, kind, sent_messages, sent_bytes, received_messages, received_bytes):
        self._counters[kind] += (sent_messages, sent_bytes, received_messages, received_bytes)

    def stats(self):
        """Messages and bytes moved by this rank since the last `reset_stats`, by kind.

        Returns
        -------
        dict
            ``{kind: {"messages_sent", "bytes_sent", "messages_received", "bytes_received"}}``
            for every kind that moved anything (`KINDS` lists the library's).
        """
        names = ("messages_sent", "bytes_sent", "messages_received", "bytes_received")
        return {kind: dict(zip(names, (int(v) for v in counts)))
                for kind, counts in sorted(self._counters.items())}

    def wait_seconds(self):
        """Seconds this rank spent blocked waiting for nonblocking calls to complete, by kind:
        the communication that computation did not hide.

        Returns
        -------
        dict
            ``{kind: seconds}``, sorted by kind, since the last `reset_stats`.
        """
        return dict(sorted(self._waited.items()))

    def reset_stats(self):
        """Zero the counters of `stats` and `wait_seconds`."""
        self._counters.clear()
        self._waited.clear()

    # ---------------------------------------------------------------- buffer collectives
    def _op(self, op):
        if op not in _OPS:
            raise ValueError(f"op must be one of {_OPS}, got {op!r}")
        from mpi4py import MPI
        return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "land": MPI.LAND,
                "lor": MPI.LOR, "band": MPI.BAND, "bor": MPI.BOR}[op]

    def Allreduce(self, buffer, op="sum", kind="allreduce"):
        """Reduce ``buffer`` over all ranks, in place; returns ``buffer``. A bfloat16 tensor
        is reduced in float32 and rounded back (`_reduction_buffer`).

        Unlike mpi4py's ``Allreduce(sendbuf, recvbuf, op)`` there is no send buffer: the
        result overwrites ``buffer`` on every rank.

        Parameters
        ----------
        buffer : ndarray or CPU tensor
            C-contiguous, writable, of a numeric or bool dtype; the same size and dtype on
            every rank.
        op : {"sum", "max", "min", "land", "lor", "band", "bor"}
            A name, not an ``MPI.Op``: the logical ones for bools, no bitwise or logical ones
            for floats, ``"sum"`` alone for complex numbers.
        kind : str
            Traffic kind of `stats`.

        Returns
        -------
        buffer
            The same object, holding the reduction.

        Raises
        ------
        TypeError
            ``op`` is not a string or does not apply to the dtype; ``buffer`` is neither a
            NumPy array nor a CPU tensor, or holds no numbers.
        ValueError
            ``op`` names no reduction; ``buffer`` is on a GPU, not C-contiguous, read-only or
            not in native byte order. Checked on one rank too, where nothing else happens.
        """
        _check_reduction(buffer, op)
        if self.size == 1:
            _as_buffer(buffer, written=True)  # checked as on several ranks, no bfloat16 copy
            return buffer
        view, write_back = _reduction_buffer(buffer)
        from mpi4py import MPI
        self._watched(f"Allreduce ({kind!r})", self.mpi.Allreduce, MPI.IN_PLACE, view,
                      op=self._op(op))
        self._count(kind, 1, view.nbytes, 1, view.nbytes)
        if write_back is not None:
            write_back()
        return buffer

    def Iallreduce(self, buffer, op="sum", kind="allreduce"):
        """Start reducing ``buffer`` in place; returns a request to ``wait()`` on (a bfloat16
        tensor holds the result once waited on).

        Parameters
        ----------
        buffer, op, kind
            As for `Allreduce`; keep ``buffer`` alive until the request is waited on.

        Returns
        -------
        request
            Its ``wait()`` completes the reduction, its blocked time counted in
            `wait_seconds` under ``kind``; on one rank it is complete already.

        Raises
        ------
        TypeError, ValueError
            As for `Allreduce`, before anything is started.
        """
        _check_reduction(buffer, op)
        if self.size == 1:
            _as_buffer(buffer, written=True)
            return _Request()
        view, write_back = _reduction_buffer(buffer)
        from mpi4py import MPI
        request = self.mpi.Iallreduce(MPI.IN_PLACE, view, op=self._op(op))
        self._count(kind, 1, view.nbytes, 1, view.nbytes)
        return _Request(request, self, kind, write_back)

    def _check_root(self, root):
        return check_rank(root, self.size)

    def Bcast(self, buffer, root=0, kind="broadcast"):
        """Broadcast ``buffer`` from ``root`` in place; returns ``buffer``.

        Parameters
        ----------
        buffer : ndarray or CPU tensor
            C-contiguous, the same size and dtype on every rank; written on every rank but
            ``root``, so writable there. A bfloat16 tensor moves as its bits.
        root : int
        kind : str
            Traffic kind of `stats`.

        Returns
        -------
        buffer

        Raises
        ------
        TypeError, ValueError
            ``root`` is not a rank of the communicator; ``buffer`` cannot be moved (as for
            `Allreduce`) or, off ``root``, is read-only.
        """
        root = self._check_root(root)
        view = _as_buffer(buffer, written=self.rank != root)
        if self.size > 1:
            self._watched(f"Bcast ({kind!r})", self.mpi.Bcast, view, root=root)
            if self.rank == root:
                self._count(kind, self.size - 1, view.nbytes * (self.size - 1), 0, 0)
            else:
                self._count(kind, 0, 0, 1, view.nbytes)
        return buffer

    def _no_messages(self, what):
        """Refuse a point-to-point call of a one-rank communicator without MPI by name (it
        failed with an AttributeError of None)."""
        if self.mpi is None:
            raise RuntimeError(f"{what}: this one-rank communicator has no MPI, so it has no "
                               "messages to itself (Sendrecv with rank 0 copies); install "
                               "mpi4py for self-messages")

    def Isend(self, buffer, dest, tag, kind):
        """Start sending ``buffer`` to rank ``dest``; keep the buffer alive until waited on.

        Parameters
        ----------
        buffer : ndarray or CPU tensor
            C-contiguous; sent as its bytes, which the receiving buffer must match.
        dest : int
            A rank of the communicator (this one too, with MPI).
        tag : int
            Required, where mpi4py's defaults to 0.
        kind : str
            Traffic kind of `stats`; required.

        Returns
        -------
        request
            Its ``wait()`` completes the send, its blocked time counted in `wait_seconds`.

        Raises
        ------
        RuntimeError
            The communicator has one rank and no MPI, so no messages to itself.
        TypeError, ValueError
            ``dest`` is not a rank; ``buffer`` cannot be moved (as for `Allreduce`).
        """
        view = _as_buffer(buffer)
        self._no_messages("Isend")
        # Checked here, as Sendrecv does: MPI's "Invalid rank" came with its error stack.
        dest = check_rank(dest, self.size, "dest")
        self._count(kind, 1, view.nbytes, 0, 0)
        return _Request(self.mpi.Isend(_bytes_of(view), dest=dest, tag=tag), self, kind)

    def Irecv(self, buffer, source, tag, kind):
        """Start receiving into ``buffer`` from rank ``source``.

        Parameters
        ----------
        buffer : ndarray or CPU tensor
            C-contiguous and writable; received as bytes.
        source : int
            A rank of the communicator (no ``MPI.ANY_SOURCE``).
        tag : int
        kind : str
            Traffic kind of `stats`; required.

        Returns
        -------
        request
            Its ``wait()`` completes the receive, and raises a ``ValueError`` when the message
            was not exactly ``buffer``'s bytes (the sender's rows of another dtype or shape).

        Raises
        ------
        RuntimeError
            The communicator has one rank and no MPI, so no messages to itself.
        TypeError, ValueError
            ``source`` is not a rank; ``buffer`` cannot be moved (as for `Allreduce`).
        """
        view = _as_buffer(buffer, written=True)
        self._no_messages("Irecv")
        source = check_rank(source, self.size, "source")
        self._count(kind, 0, 0, 1, view.nbytes)
        # Posted as bytes: a message of another dtype whose size is no multiple of this one's
        # tripped MPICH's unpacking (an abort without a word) before the size was checked.
        return _Request(self.mpi.Irecv(_bytes_of(view), source=source, tag=tag), self, kind,
                        receive=(source, view.nbytes))

    def Sendrecv(self, sendbuf, dest, recvbuf, source, tag=0, kind="sendrecv"):
        """Send ``sendbuf`` to rank ``dest`` while receiving ``recvbuf`` from rank ``source``
        (one blocking exchange, deadlock-free between two partners); returns ``recvbuf``.

        The arguments' order is not mpi4py's, whose third is ``sendtag``.

        Parameters
        ----------
        sendbuf : ndarray or CPU tensor
            C-contiguous; sent as its bytes.
        dest : int
        recvbuf : ndarray or CPU tensor
            C-contiguous and writable; the message from ``source`` must fill it exactly.
        source : int
        tag : int
            The tag of both messages (mpi4py's ``sendtag`` and ``recvtag``).
        kind : str
            Traffic kind of `stats`.

        Returns
        -------
        recvbuf
            Holding the message (on a one-rank communicator without MPI, a copy of
            ``sendbuf``'s bytes).

        Raises
        ------
        ValueError
            The message received was not exactly ``recvbuf``'s bytes (the ranks passed other
            dtypes or shapes; without MPI, the two buffers differ in bytes).
        TypeError, ValueError
            ``dest`` or ``source`` is not a rank; a buffer cannot be moved (as for
            `Allreduce`).
        """
        send, recv = _as_buffer(sendbuf, "sendbuf"), _as_buffer(recvbuf, "recvbuf", True)
        if self.mpi is None:
            # One rank without MPI: the exchange with itself is a copy, as MPI's would be
            # (a one-rank communicator counts nothing).
            check_rank(dest, 1, "dest")
            check_rank(source, 1, "source")
            if send.nbytes != recv.nbytes:
                raise ValueError(f"rank 0 expected {recv.nbytes} bytes from rank 0 in "
                                 f"{kind!r} but received {send.nbytes}: sendbuf and recvbuf "
                                 f"differ in dtype or shape")
            recv.reshape(-1).view(np.uint8)[:] = send.reshape(-1).view(np.uint8)
            return recvbuf
        dest, source = check_rank(dest, self.size, "dest"), check_rank(source, self.size, "source")
        MPI = sys.modules["mpi4py.MPI"]
        status, error = MPI.Status(), None
        try:
            self._watched(f"Sendrecv ({kind!r}) with ranks {dest} and {source}",
                          self.mpi.Sendrecv, _bytes_of(send), dest=dest, sendtag=tag,
                          recvbuf=_bytes_of(recv), source=source, recvtag=tag, status=status)
        except MPI.Exception as exc:
            error = exc
        # A shorter message left the end of recvbuf unwritten without a word; a longer one
        # failed with MPI's bare truncation error
        check_received(self, kind, source, recv.nbytes, status, error)
        if error is not None:
            raise error
        self._count(kind, 1, send.nbytes, 1, recv.nbytes)
        return recvbuf

    def Barrier(self):
        """Wait until every rank has called it (collective; returns at once on one rank)."""
        if self.size > 1:
            self._watched("Barrier", self.mpi.Barrier)

    def ranks_on_this_node(self):
        """How many ranks of this communicator share this rank's node (its shared-memory
        group); 1 in one process. A collective: every rank calls it.

        Returns
        -------
        int
        """
        if self.size == 1:
            return 1
        from mpi4py import MPI
        local = self._watched("Split_type", self.mpi.Split_type, MPI.COMM_TYPE_SHARED)
        try:
            return local.Get_size()
        finally:
            local.Free()

    def _vector_layout(self, counts, total, name):
        """``(counts, displacements)`` as int lists after checking them against a buffer of
        ``total`` elements: one count per rank, none negative, summing to ``total``."""
        if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__"):
            raise TypeError(f"counts must be a sequence of {self.size} element counts, one per "
                            f"rank, got {type(counts).__name__} {counts!r}")
        counts = list(counts)
        if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in counts):
            raise TypeError(f"counts must be integers, got {counts}")
        counts = [int(c) for c in counts]
        if len(counts) != self.size or any(c < 0 for c in counts):
            raise ValueError(f"counts must hold {self.size} non-negative element counts, one "
                             f"per rank, got {counts}")
        if sum(counts) != total:
            raise ValueError(f"{name} has {total} elements but the counts sum to "
                             f"{sum(counts)}")
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        return counts, displacements

    def _vector_buffers(self, sendbuf, recvbuf, counts, gathering):
        """Views, layout and write-back (`_reduction_buffer`) of a vector collective
        (``gathering``: allgatherv, else reduce-scatter), checked on this rank."""
        if _is_bfloat16(sendbuf) != _is_bfloat16(recvbuf):
            raise TypeError(f"sendbuf holds {getattr(sendbuf, 'dtype', type(sendbuf).__name__)} "
                            f"but recvbuf {getattr(recvbuf, 'dtype', type(recvbuf).__name__)}")
        write_back = None
        if gathering or self.size == 1:
            send, recv = _as_buffer(sendbuf, "sendbuf"), _as_buffer(recvbuf, "recvbuf", True)
        else:
            send = _reduction_buffer(sendbuf, "sendbuf", written=False)[0]
            recv, write_back = _reduction_buffer(recvbuf, "recvbuf")
        send, recv = send.reshape(-1), recv.reshape(-1)
        if send.dtype != recv.dtype:
            raise TypeError(f"sendbuf holds {send.dtype} but recvbuf {recv.dtype}")
        whole, part = (recv, send) if gathering else (send, recv)
        counts, displacements = self._vector_layout(counts, whole.size,
                                                    "recvbuf" if gathering else "sendbuf")
        if part.size != counts[self.rank]:
            raise ValueError(f"{'sendbuf' if gathering else 'recvbuf'} of rank {self.rank} has "
                             f"{part.size} elements but counts[{self.rank}] is "
                             f"{counts[self.rank]}")
        return send, recv, counts, displacements, write_back

    def _start_allgatherv(self, sendbuf, recvbuf, counts, kind, blocking):
        send, recv, counts, displacements, _ = self._vector_buffers(sendbuf, recvbuf, counts,
                                                                    True)
        if self.size == 1:
            recv[:] = send
            return _Request()
        from mpi4py.util.dtlib import from_numpy_dtype
        spec = [recv, counts, displacements, from_numpy_dtype(recv.dtype)]
        own = send.nbytes
        others = recv.nbytes - own
        self._count(kind, self.size - 1, own * (self.size - 1), self.size - 1, others)
        if blocking:
            self._watched(f"Allgatherv ({kind!r})", self.mpi.Allgatherv, send, spec)
            return _Request()
        return _Request(self.mpi.Iallgatherv(send, spec), self, kind)

    def Allgatherv(self, sendbuf, recvbuf, counts, kind="allgather"):
        """Every rank's ``sendbuf``, concatenated in rank order, into every rank's ``recvbuf``.

        Parameters
        ----------
        sendbuf, recvbuf : ndarray or CPU tensor
            C-contiguous, same dtype; read and written as flat arrays (``recvbuf`` holds
            ``sum(counts)`` elements; rank q's block starts at ``sum(counts[:q])``).
        counts : sequence of int
            Elements each rank contributes; ``counts[rank] == sendbuf.size``.
        kind : str
            Traffic kind of `stats`. Counted as the payload that changes hands: this rank's
            block sent to ``size - 1`` ranks, and the other ranks' blocks received (what
            CAGNET's 1D algorithm moves), ``size - 1`` messages each way.

        Returns
        -------
        recvbuf

        Raises
        ------
        TypeError
            ``counts`` is not a sequence of integers; the buffers differ in dtype, or one
            cannot be moved (as for `Allreduce`).
        ValueError
            ``counts`` is not one count >= 0 per rank summing to ``recvbuf``'s size, or
            ``counts[rank]`` is not ``sendbuf``'s size; a buffer cannot be moved.
        """
        self._start_allgatherv(sendbuf, recvbuf, counts, kind, blocking=True)
        return recvbuf

    def Iallgatherv(self, sendbuf, recvbuf, counts, kind="allgather"):
        """Start `Allgatherv`; returns a request to ``wait()`` on (its blocked time counts in
        `wait_seconds` under ``kind``). Keep both buffers alive until it is waited on.

        Parameters
        ----------
        sendbuf, recvbuf, counts, kind
            As for `Allgatherv`.

        Returns
        -------
        request
            On one rank, complete already (``recvbuf`` holds ``sendbuf``).

        Raises
        ------
        TypeError, ValueError
            As for `Allgatherv`, before anything is started.
        """
        return self._start_allgatherv(sendbuf, recvbuf, counts, kind, blocking=False)

    def _start_reduce_scatter(self, sendbuf, recvbuf, counts, op, kind, blocking):
        send, recv, counts, _, write_back = self._vector_buffers(sendbuf, recvbuf, counts,
                                                                 False)
        _check_reduction(sendbuf, op, "sendbuf")
        mpi_op = self._op(op) if self.size > 1 else None
        if self.size == 1:
            recv[:] = send
            return _Request()
        own = recv.nbytes
        self._count(kind, self.size - 1, send.nbytes - own, self.size - 1,
                    own * (self.size - 1))
        if blocking:
            self._watched(f"Reduce_scatter ({kind!r})", self.mpi.Reduce_scatter, send, recv,
                          counts, op=mpi_op)
            if write_back is not None:
                write_back()
            return _Request()
        return _Request(self.mpi.Ireduce_scatter(send, recv, counts, op=mpi_op), self, kind,
                        write_back)

    def Reduce_scatter(self, sendbuf, recvbuf, counts, op="sum", kind="reduce_scatter"):
        """Reduce every rank's ``sendbuf`` element-wise and leave block q of the result on
        rank q, in its ``recvbuf``.

        Parameters
        ----------
        sendbuf, recvbuf : ndarray or CPU tensor
            C-contiguous, same dtype, read and written as flat arrays: ``sendbuf`` holds
            ``sum(counts)`` elements (rank q's block starts at ``sum(counts[:q])``),
            ``recvbuf`` this rank's ``counts[rank]``.
        counts : sequence of int
            Elements of each rank's block.
        op : {"sum", "max", "min", "land", "lor", "band", "bor"}
        kind : str
            Traffic kind of `stats`. Counted as the payload that changes hands: the blocks of
            the other ranks sent, and ``size - 1`` contributions to this rank's block
            received, ``size - 1`` messages each way.

        Returns
        -------
        recvbuf

        Raises
        ------
        TypeError
            ``counts`` is not a sequence of integers; the buffers differ in dtype, or one
            cannot be moved; ``op`` does not apply to the dtype (as for `Allreduce`).
        ValueError
            ``counts`` is not one count >= 0 per rank summing to ``sendbuf``'s size, or
            ``counts[rank]`` is not ``recvbuf``'s size; ``op`` names no reduction; a buffer
            cannot be moved.
        """
        self._start_reduce_scatter(sendbuf, recvbuf, counts, op, kind, blocking=True)
        return recvbuf

    def Ireduce_scatter(self, sendbuf, recvbuf, counts, op="sum", kind="reduce_scatter"):
        """Start `Reduce_scatter`; returns a request to ``wait()`` on (its blocked time counts
        in `wait_seconds` under ``kind``). Keep both buffers alive until it is waited on.

        Parameters
        ----------
        sendbuf, recvbuf, counts, op, kind
            As for `Reduce_scatter`.

        Returns
        -------
        request
            On one rank, complete already (``recvbuf`` holds ``sendbuf``).

        Raises
        ------
        TypeError, ValueError
            As for `Reduce_scatter`, before anything is started.
        """
        return self._start_reduce_scatter(sendbuf, recvbuf, counts, op, kind, blocking=False)

    # ---------------------------------------------------------------- object collectives
    # Pickled here, not by mpi4py, so that their bytes are counted as the buffers' are: the
    # set-up's pieces of the graph and the rows scatter_rows and gather_rows move went
    # uncounted. Every rank gets an unpickled copy, the root too, as from mpi4py.
    def bcast(self, obj, root=0, kind="broadcast"):
        """``obj`` of ``root`` on every rank (pickled; set-up only).

        Parameters
        ----------
        obj : object
            Read on ``root`` only; it must pickle there (an error pickling it is raised on
            ``root`` alone).
        root : int
        kind : str
            Traffic kind of `stats`, which counts the pickled bytes.

        Returns
        -------
        object
            An unpickled copy of ``root``'s ``obj``, on ``root`` too; on one rank ``obj``
            itself.

        Raises
        ------
        TypeError, ValueError
            ``root`` is not a rank of the communicator.
        """
        root = self._check_root(root)
        if self.size == 1:
            return obj
        data = _pickled(obj) if self.rank == root else None
        data = self._watched("bcast", self.mpi.bcast, data, root=root)
        if self.rank == root:
            self._count(kind, self.size - 1, len(data) * (self.size - 1), 0, 0)
        else:
            self._count(kind, 0, 0, 1, len(data))
        return pickle.loads(data)

    def allgather(self, obj, kind="allgather"):
        """The list of every rank's ``obj`` (pickled; set-up only).

        Parameters
        ----------
        obj : object
            This rank's; it must pickle (an error pickling it is raised on this rank alone).
        kind : str
            Traffic kind of `stats`, which counts the pickled bytes.

        Returns
        -------
        list
            Unpickled copies of every rank's ``obj``, in rank order; on one rank ``[obj]``.
        """
        if self.size == 1:
            return [obj]
        data = _pickled(obj)
        every = self._watched("allgather", self.mpi.allgather, data)
        others = sum(len(d) for q, d in enumerate(every) if q != self.rank)
        self._count(kind, self.size - 1, len(data) * (self.size - 1), self.size - 1, others)
        return [pickle.loads(d) for d in every]

    def gather(self, obj, root=0, kind="gather"):
        """The list of every rank's ``obj`` on ``root``, None elsewhere (pickled).

        Parameters
        ----------
        obj : object
            This rank's; it must pickle (an error pickling it is raised on this rank alone).
        root : int
        kind : str
            Traffic kind of `stats`, which counts the pickled bytes.

        Returns
        -------
        list or None
            On ``root``, unpickled copies of every rank's ``obj`` in rank order (on one rank
            ``[obj]``); None on the other ranks.

        Raises
        ------
        TypeError, ValueError
            ``root`` is not a rank of the communicator.
        """
        root = self._check_root(root)
        if self.size == 1:
            return [obj]
        data = _pickled(obj)
        every = self._watched("gather", self.mpi.gather, data, root=root)
        if self.rank != root:
            self._count(kind, 1, len(data), 0, 0)
            return None
        self._count(kind, 0, 0, self.size - 1,
                    sum(len(d) for q, d in enumerate(every) if q != root))
        return [pickle.loads(d) for d in every]

    def scatter(self, objs, root=0, kind="scatter"):
        """Element ``rank`` of ``root``'s list ``objs`` on each rank (pickled); None
        everywhere when ``objs`` is None, as in mpi4py.

        Parameters
        ----------
        objs : sequence or None
            On ``root``, one picklable object per rank; ignored on the other ranks.
        root : int
        kind : str
            Traffic kind of `stats`, which counts the pickled bytes.

        Returns
        -------
        object
            An unpickled copy of ``objs[rank]``; on one rank ``objs[0]`` itself.

        Raises
        ------
        TypeError, ValueError
            ``root`` is not a rank of the communicator; on ``root`` alone, ``objs`` is not a
            sequence of one item per rank.
        """
        root = self._check_root(root)
        if self.rank == root and objs is not None:
            objs = _one_per_rank(objs, self.size, "scatter")
        if self.size == 1:
            return None if objs is None else objs[0]
        pieces = None
        if self.rank == root and objs is not None:
            pieces = [_pickled(o) for o in objs]
        data = self._watched("scatter", self.mpi.scatter, pieces, root=root)
        if data is None:
            return None
        if self.rank == root:
            self._count(kind, self.size - 1,
                        sum(len(d) for q, d in enumerate(pieces) if q != root), 0, 0)
        else:
            self._count(kind, 0, 0, 1, len(data))
        return pickle.loads(data)

    def alltoall(self, objs, kind="alltoall"):
        """Element ``rank`` of every rank's list ``objs``, as a list indexed by sender.

        Parameters
        ----------
        objs : sequence
            One picklable object per rank: ``objs[q]`` goes to rank q.
        kind : str
            Traffic kind of `stats`, which counts the pickled bytes.

        Returns
        -------
        list
            Unpickled copies of what each rank sent this one, in rank order; on one rank
            ``list(objs)``.

        Raises
        ------
        TypeError, ValueError
            ``objs`` is not a sequence of one item per rank (raised on that rank alone).
        """
        objs = _one_per_rank(objs, self.size, "alltoall")
        if self.size == 1:
            return objs
        pieces = [_pickled(o) for o in objs]
        received = self._watched("alltoall", self.mpi.alltoall, pieces)
        self._count(kind, self.size - 1,
                    sum(len(d) for q, d in enumerate(pieces) if q != self.rank),
                    self.size - 1, sum(len(d) for q, d in enumerate(received) if q != self.rank))
        return [pickle.loads(d) for d in received]

    # ---------------------------------------------------------------- agreement and faults
    def raise_if_any(self, error):
        """Raise on every rank when any rank passes an exception (or None where all is well).

        A check that only some ranks can make (their own rows, their own file) goes through
        this, so every rank raises the same clear error instead of the others waiting forever
        in the next collective. The message names the failing ranks.

        Parameters
        ----------
        error : Exception or None
            This rank's failure; None where all is well. Every rank calls it (collective).

        Returns
        -------
        None
            When no rank passed an exception.

        Raises
        ------
        Exception
            On every rank when any rank passed one, marked as raised alike
            (`raised_on_every_rank`). Where one rank failed, that rank raises its own
            ``error`` and the others its class rebuilt from its message; where several did,
            every rank raises the lowest failing rank's, naming the ranks and the others'
            differing errors. A class that cannot be rebuilt from a message (one local to a
            function) becomes a ``RuntimeError`` naming it.
        """
        if self.size == 1:
            if error is not None:
                raise _alike(error)
            return
        # The class by name, not pickled: a class defined in a function does not pickle,
        # which would fail on the failing rank only. The notes go too: they say what the
        # failing rank was doing (the file, the step), which the other ranks cannot tell.
        reports = self.allgather(None if error is None else (
            type(error).__module__, type(error).__qualname__, str(error),
            [str(note) for note in getattr(error, "__notes__", ())]))
        failed = [(rank, report) for rank, report in enumerate(reports) if report is not None]
        if not failed:
            return
        if error is not None and len(failed) == 1:
            raise _alike(error)
        # Ranks that raised the same error are named together; each different error is told
        # too (only the first rank's was, under every failing rank's number).
        groups = {}
        for rank, (module, name, message, notes) in failed:
            groups.setdefault((module, name, message), []).append((rank, notes))
        ((module, name, message), first), *others = groups.items()
        for (other_module, other_name, other_message), ranks in others:
            qualified = other_name if other_module == "builtins" \
                else f"{other_module}.{other_name}"
            message += (f"; {_ranks_label([rank for rank, _ in ranks])} raised {qualified}: "
                        f"{other_message}")
        rebuilt = _rebuilt(module, name, _ranks_label([rank for rank, _ in first]), message)
        for note in first[0][1]:
            rebuilt.add_note(note)
        raise _alike(rebuilt)

    def check_alike(self, entries, problem, remedy):
        """Raise on every rank when the ranks' ``entries`` differ (collective; free on one rank).

        For what must be alike on every rank for their collectives to pair up (a model's
        layout, an optimizer's settings): one SHA-256 digest per rank is compared, and the
        entries travel only when the digests differ, to name the first difference.

        Parameters
        ----------
        entries : tuple of tuples
            Each a label and its values, e.g. ``("parameter 'weight'", (2, 3), "float32")``;
            their ``repr`` must be the same wherever they are equal.
        problem, remedy : str
            The error's first and last clauses: what differs, and what to do.

        Raises
        ------
        ValueError
            On every rank: "{problem}: rank 0 has {entry} where rank q has {entry}; {remedy}".
        """
        if self.size == 1:
            return
        entries = tuple(entries)
        digest = hashlib.sha256(repr(entries).encode()).hexdigest()
        digests = self.allgather(digest)
        if all(other == digests[0] for other in digests):
            return
        every = self.allgather(entries)
        rank = next(q for q, other in enumerate(digests) if other != digests[0])
        first, other = every[0], every[rank]
        differ = next((i for i, (a, b) in enumerate(zip(first, other)) if a != b),
                      min(len(first), len(other)))

        def told(held):
            return " ".join(map(str, held[differ])) if differ < len(held) else "nothing"
        raise _alike(ValueError(f"{problem}: rank 0 has {told(first)} where rank {rank} has "
                                f"{told(other)}; {remedy}"))

    def on_root(self, function, *args, root=0):
        """``function(*args)`` called on ``root`` alone, its result on every rank (collective).

        For work that only one rank may do (a directory to list, a file to write) and whose
        outcome every rank needs: what ``function`` raises there is raised on every rank
        instead, marked as raised alike (`raised_on_every_rank`), where a bare broadcast of
        the result would leave the other ranks waiting for it.

        Parameters
        ----------
        function : callable
            Called on ``root`` only; its result must pickle.
        *args
            Passed to ``function``.
        root : int, optional

        Returns
        -------
        object
            What ``function`` returned on ``root``.
        """
        root = self._check_root(root)
        outcome = own_error = None
        if self.rank == root:
            try:
                outcome = (True, function(*args))
            except Exception as error:  # noqa: BLE001 -- raised on every rank below
                own_error = error  # raised here as it is, with its traceback
                outcome = (False, error if self.size == 1 else _portable(error, root))
        if self.size > 1:
            outcome = self.bcast(outcome, root=root)
        succeeded, value = outcome
        if not succeeded:
            raise _alike(own_error if own_error is not None else value)
        return value

    def Abort(self, errorcode=1):
        """End the whole job now (every rank), with exit status ``errorcode``.

        It does not return: the process ends through ``os._exit`` even where MPI cannot abort
        it, without Python's clean-up (flush what must be written first).

        Parameters
        ----------
        errorcode : int, default 1
            The exit status of the job, and of this process.
        """
        try:
            if self.mpi is not None:
                self.mpi.Abort(errorcode)
        finally:
            # Reached where MPI refuses to abort (a `duplicate` freed since, whose timeout
            # watchdog still ends the job): the rank ends all the same instead of waiting on,
            # and the launcher ends the job of a rank that died.
            os._exit(errorcode)


def _bytes_of(view):
    """The bytes of a C-contiguous NumPy array, as MPI moves them (a uint8 view; a 0-d array's
    reshaped to 1-D first, as NumPy cannot change its itemsize)."""
    return view.view(np.uint8) if view.ndim else view.reshape(1).view(np.uint8)


def _pickled(obj):
    """``obj`` as the bytes the object collectives send."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _one_per_rank(objs, size, what):
    """``objs`` as a list of one item per rank; ValueError otherwise, as in mpi4py (a one-rank
    communicator took any length)."""
    try:
        objs = list(objs)
    except TypeError:
        raise TypeError(f"{what} needs a sequence of one item per rank ({size}), got "
                        f"{type(objs).__name__}") from None
    if len(objs) != size:
        raise ValueError(f"{what} needs one item per rank ({size}), got {len(objs)}")
    return objs


def _ranks_label(ranks):
    """``"rank 2"`` or ``"ranks 0, 2"``."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _rebuilt(module, name, ranks, message):
    """Another rank's exception, ``"{ranks}: {message}"`` in its class where that class can be
    found here and made from a message alone (most can; ``UnicodeDecodeError``,
    ``json.JSONDecodeError`` and a class local to a function cannot), else a RuntimeError
    that names the class."""
    kind = sys.modules.get(module)
    for part in name.split("."):
        kind = getattr(kind, part, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(f"{ranks}: {message}")
        except Exception:
            pass
    qualified = name if module == "builtins" else f"{module}.{name}"
    return RuntimeError(f"{ranks} raised {qualified}: {message}")


def _portable(error, rank):
    """`error` where it pickles (notes and all), else its class rebuilt by name with its
    message: the broadcast would fail on ``rank`` alone, and the others wait for ever."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 -- a local class, a required argument, ...
        return _rebuilt(type(error).__module__, type(error).__qualname__,
                        _ranks_label([rank]), str(error))
    return error


def _alike(error):
    error._raised_on_every_rank = True
    return error


def raised_on_every_rank(error):
    """Whether `error` was raised alike on every rank (by `Communicator.raise_if_any`, or
    inside `raising_alike`): a rank may then handle it and go on, since no other rank is left
    waiting in a collective. Any other error on one rank of several must end the job."""
    return getattr(error, "_raised_on_every_rank", False)


@contextlib.contextmanager
def raising_alike():
    """Mark the exceptions raised inside as raised alike on every rank: for checks whose
    outcome every rank computes from the same values (arguments, a broadcast decision)."""
    try:
        yield
    except Exception as error:
        raise _alike(error)


def _install_abort_hook(comm):
    """Make an uncaught exception on any rank end the whole job within seconds, with that
    rank's traceback, instead of leaving the other ranks blocked in a collective forever."""
    previous = sys.excepthook

    def abort_on_exception(kind, value, tb):
        try:
            # An interrupt goes on to the hook that was there before (the user's, or Python's,
            # which prints the traceback): printing it here too told it twice.
            told_by_previous = issubclass(kind, KeyboardInterrupt)
            message = "" if told_by_previous else "".join(
                traceback.format_exception(kind, value, tb))
            sys.stderr.write(f"pysparse_hpc: rank {comm.rank} of {comm.size} raised "
                             f"{kind.__name__}; ending the job\n{message}")
            sys.stderr.flush()
            sys.stdout.flush()
            if told_by_previous:
                previous(kind, value, tb)
        finally:
            comm.Abort(1)

    sys.excepthook = abort_on_exception
    threading.excepthook = lambda args: abort_on_exception(args.exc_type, args.exc_value,
                                                           args.exc_traceback)


def init(abort_on_exception=True, timeout=None):
    """The library's communicator over every rank of the job, made once per process.

    Under ``mpiexec`` it is a ``Dup()`` of ``MPI.COMM_WORLD``; in a script started without a
    launcher it is a one-rank communicator (MPI is initialised as a singleton when mpi4py is
    installed, and not needed when it is not), so the same script runs unchanged.

    Parameters
    ----------
    abort_on_exception : bool
        On jobs of several ranks, install a ``sys.excepthook`` and a ``threading.excepthook``
        that print the rank and its traceback and abort the communicator, so a rank that
        raises, in any of its threads, ends the job (with a non-zero status) instead of
        leaving the others waiting in a collective. Read on the first call only, which makes
        the communicator.
    timeout : float, optional
        Seconds a rank may wait in one blocking call before the job is ended
        (`Communicator.set_timeout`): a rank that hangs, or skips a collective, then ends the
        job too. Default: the environment variable ``PYSPARSE_HPC_COMM_TIMEOUT`` when set,
        else none (wait for ever). Given on a later call, it sets the existing communicator's.

    Returns
    -------
    Communicator

    Raises
    ------
    ImportError
        The job was launched with several ranks but mpi4py is not installed.

    Examples
    --------
    >>> from pysparse_hpc import distributed
    >>> comm = distributed.init()
    >>> comm.rank, comm.size
    (0, 1)
    """
    global _WORLD
    timeout = check_timeout(timeout)
    with _WORLD_LOCK:
        if _WORLD is not None:
            if timeout is not None:
                _WORLD.set_timeout(timeout)
            return _WORLD
        if timeout is None:
            timeout = _timeout_from_environment()
        try:
            from mpi4py import MPI
        except ImportError:
            ranks = launched_ranks()
            if ranks > 1:
                raise ImportError(f"this job was launched with {ranks} ranks but mpi4py is not "
                                  "installed; pip install mpi4py mpich (or the [mpi] extra "
                                  "of pysparse_hpc)") from None
            _WORLD = Communicator(None)
            _WORLD.set_timeout(timeout)
            return _WORLD
        world = Communicator(MPI.COMM_WORLD.Dup())
        if abort_on_exception and world.size > 1:
            _install_abort_hook(world)
        world.set_timeout(timeout)
        _WORLD = world
        return _WORLD
