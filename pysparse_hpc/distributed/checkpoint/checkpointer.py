"""`Checkpointer`: the checkpoint directory, saving in the background, committing, keeping the
last few, and loading the newest checkpoint that verifies on every rank."""
import atexit
import datetime
import json
import operator
import os
import queue
import re
import shutil
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._sputils import as_path, check_flag
from .._comm import _ranks_label
from . import _files
from ._files import MANIFEST
from ._format import ALIGN, FORMAT, VERSION, Damaged, Encoder, parse, prefix
from ._nodes import as_ids, check_nodes, check_parts_agree, gather_node_rows, node_id_extent

MARKER = "CHECKPOINTS"
SHARED = "shared.ckpt"
_STEP_DIR = re.compile(r"^step-([0-9]+)$")
_MARKER_TEMPORARY = re.compile(rf"^\.{MARKER}\.[0-9]+\.tmp$")  # `_files.write_atomic`'s name
#: How many times `Checkpointer.load` lists the directory again when every checkpoint it
#: listed failed while another run was committing (and pruning) checkpoints there.
_RELISTS = 8


def _step_name(step):
    return f"step-{step:09d}"


def _shard_name(rank):
    return f"rank-{rank:05d}.ckpt"


def _nodes_name(rank):
    return f"nodes-{rank:05d}.ckpt"


@dataclass
class Checkpoint:
    """A loaded checkpoint.

    Attributes
    ----------
    step : int
    shard : object
        This rank's own state as saved, or None when the checkpoint was saved by another
        number of ranks (its shards belong to a different split).
    shared : object
        The replicated state (None if none was saved).
    nodes : dict or None
        ``{"node_ids": ..., name: rows}``: with ``node_ids`` given to `Checkpointer.load`, the
        rows of those nodes gathered from every saving rank; without, this rank's own saved
        per-node state when the number of ranks is unchanged, else None.
    ranks_saved : int
        Number of ranks that saved it.
    meta : dict
        The manifest: ``step``, ``ranks``, ``created`` (UTC, ISO 8601), ``fingerprint``,
        ``files`` (bytes and block SHA-256s of each), ``has_shared``, ``has_nodes`` (one bool
        per saving rank) and the manifest's own ``checksum``.
    path : str
        The checkpoint's directory.
    skipped : list of (int, str)
        The newer checkpoints passed over as damaged, newest first: ``(step, what is wrong,
        naming the ranks)``, the same on every rank (rank 0 alone also warns).
    """
    step: int
    shard: Any
    shared: Any
    nodes: Any
    ranks_saved: int
    meta: dict = field(repr=False)
    path: str = ""
    skipped: list = field(default_factory=list)


def _serve(jobs):
    """The background thread: runs ``(function, args, done)`` jobs in order (``function``
    keeps its own errors), setting ``done`` after each."""
    while True:
        job = jobs.get()
        if job is None:
            return
        function, args, done = job
        # Held while waiting for the next job, the last job's bound method would keep its
        # checkpointer alive for ever, and with it the directory's lock and the staging buffer
        # of a checkpointer its owner dropped without closing.
        job = None
        try:
            function(*args)
        except BaseException:  # an uncaught error would end the job; the function reports
            pass
        finally:
            function = args = None
            done.set()


#: The checkpointers whose background thread has had work, for `_finish_at_exit`.
_STARTED = weakref.WeakSet()


@atexit.register
def _finish_at_exit():
    """Finish every checkpointer's background work as the interpreter ends.

    The writer is a daemon thread (a hung file system must not keep the process alive), which
    the interpreter stops where it is once the exit handlers have run: without this, a script
    that ends (or fails) without `Checkpointer.close` would lose the commit of the save before
    its last, which the last `save` had promised, and leave half-written files behind.
    """
    for checkpointer in list(_STARTED):
        # A forked child that ends through the exit handlers has a copy of the checkpointer
        # but not its thread: it would wait for ever for work only the parent does.
        if checkpointer._worker_pid == os.getpid():
            checkpointer._finish_at_exit()


class _Pending:
    """One save whose files are being written: its job's done event (``thread``), and what
    the job left.

    ``claim`` decides, under ``lock``, who finishes a save whose start was interrupted
    (Ctrl-C between queuing its job and returning): the writer, once it has started the job
    ("started"), or the caller of `save` ("cancelled": the job then does nothing)."""

    __slots__ = ("step", "thread", "records", "error", "commit", "lock", "claim")

    def __init__(self, step, commit=None):
        self.step, self.thread, self.records, self.error = step, None, {}, None
        self.commit = commit  # (step, records) of the previous save, for rank 0 to commit
        self.lock, self.claim = threading.Lock(), None

    def claim_for(self, who):
        """Claim the save for ``who`` ("started" or "cancelled") unless it is claimed already;
        whether ``who`` has it."""
        with self.lock:
            if self.claim is None:
                self.claim = who
            return self.claim == who


def _check_step(step):
    if isinstance(step, bool):
        raise TypeError(f"step must be a non-negative int, got {step!r}")
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError(f"step must be a non-negative int, got {type(step).__name__} "
                        f"{step!r}") from None
    if step < 0:
        raise ValueError(f"step must be a non-negative int, got {step}")
    return step


def _normalize_fingerprint(fingerprint):
    if fingerprint is None:
        return None
    if not isinstance(fingerprint, dict):
        raise TypeError(f"fingerprint must be a dict of JSON values, got "
                        f"{type(fingerprint).__name__}")
    try:
        return json.loads(json.dumps(fingerprint, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"fingerprint must be a dict of JSON values (str keys; str, numbers, "
                        f"bool, None, lists and dicts of them): {exc}") from None


class _Absent:
    def __repr__(self):
        return "<absent>"

    def __eq__(self, other):
        return isinstance(other, _Absent)


def _fingerprint_mismatch(directory, saved, given, where, holds="holds checkpoints of"):
    """A ValueError naming the keys whose values differ, or None when they agree."""
    if given is None or saved is None or saved == given:
        return None
    absent = _Absent()
    keys = sorted(set(saved) | set(given))
    differing = [f"{k!r} (saved {saved.get(k, absent)!r}, given {given.get(k, absent)!r})"
                 for k in keys if saved.get(k, absent) != given.get(k, absent)]
    return ValueError(f"{directory} {holds} another run ({where}): the fingerprint differs "
                      f"in {', '.join(differing)}")


class Checkpointer:
    """Save and load checkpoints of a (distributed) training run in one directory.

    Every rank of ``comm`` makes one with the same arguments; `save`, `wait` and `load` are
    collective (every rank calls them, in the same order). `save` copies the state in memory
    and returns; a background thread writes this rank's files while training goes on. The
    checkpoint is committed by the next `wait`, `save` or `load`: it waits for the files, then
    gathers every rank's file sizes and checksums to rank 0 in the calling thread (background
    threads never call MPI), and rank 0 writes the manifest: `wait` and `load` before they
    return, `save` in its background thread before the new save's files, so that a training
    loop that saves every few steps only stalls for the copy and the gather.

    Parameters
    ----------
    directory : str or os.PathLike
        Created if missing (with its parents). An existing directory must be empty or a
        checkpoint directory (holding the ``CHECKPOINTS`` file this class writes). On several
        ranks it must be on a file system every rank sees.
    comm : Communicator, optional
        Default: `pysparse_hpc.distributed.init()` (one rank without ``mpiexec``).
    keep : int or None
        Number of newest good checkpoints kept; older ones are deleted once a newer one is
        committed. A checkpoint of an earlier run counts when its manifest verifies and its
        files have their recorded sizes (their checksums are verified by `load`). None keeps
        all.
    fingerprint : dict, optional
        JSON values that identify the run (dataset, model, seed, ...), stored with the
        checkpoints; a directory or checkpoint whose fingerprint differs is refused with a
        ValueError naming the differing keys.
    threads : int, optional
        Threads that hash files during blocking saves and loads (default: the CPUs available,
        at most 8). The background writer of an asynchronous save hashes in its own thread, to
        leave the other cores to training.

    Notes
    -----
    A state is a tree of dicts (any plain keys), lists and tuples whose leaves are torch
    tensors (dense, any dtype and device; loaded on the CPU), NumPy arrays (plain or memory
    mapped, not of object dtype) and scalars, None, bool, int, float, str and bytes. Saving
    copies its arrays into a staging buffer kept for the next save, so a checkpointer holds
    about one state's bytes between saves (`close` frees it); a tensor or array saved twice is
    loaded as two copies. Loading reads the files into memory: what `load` returns shares
    nothing with them. A forked child cannot use its parent's checkpointer (a RuntimeError):
    it has neither the background thread nor the lock; it makes its own.

    As a context manager it calls `close` on leaving. When the block raises, the pending save's
    files are finished; in one process that save is then committed too (a failure to commit
    is a warning, and the block's exception propagates), while over several ranks it is left
    uncommitted (committing is collective and the other ranks may be elsewhere), and `load`
    then takes the save before it. A `save` or `wait` interrupted by Ctrl-C keeps the save
    before it: `save` commits it, `wait` leaves it for the next call; over several ranks, a
    save dropped by Ctrl-C on some ranks only is raised on every rank by the next `wait`,
    `save` or `close`, uncommitted. A process that
    ends without `close` (returning or failing) still finishes the background thread's work
    first, the commit of the save before the pending one included; the pending save itself is
    committed there in one process, and left uncommitted with a warning over several ranks.

    Examples
    --------
    >>> import tempfile, torch
    >>> from pysparse_hpc.distributed import Checkpointer
    >>> model = torch.nn.Linear(4, 2)
    >>> directory = tempfile.TemporaryDirectory()
    >>> checkpoints = Checkpointer(directory.name, keep=2)
    >>> checkpoints.save(10, {"model": model.state_dict()})   # returns at once
    >>> checkpoints.wait()                                      # durable and committed
    10
    >>> state = checkpoints.load()
    >>> state.step, torch.equal(state.shard["model"]["weight"], model.weight)
    (10, True)
    >>> checkpoints.close()
    >>> directory.cleanup()
    """

    def __init__(self, directory, comm=None, keep=3, fingerprint=None, threads=None):
        from .._comm import check_communicator, init
        self.comm = comm = init() if comm is None else check_communicator(
            comm, ("rank", "size", "on_root", "gather", "allgather", "raise_if_any"))
        self.directory = os.path.abspath(as_path(directory, "directory"))
        if keep is not None:
            if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)):
                raise TypeError(f"keep must be a positive int or None, got {keep!r}")
            if keep < 1:
                raise ValueError(f"keep must be at least 1 (or None to keep every checkpoint), "
                                 f"got {keep}")
            keep = int(keep)
        self.keep = keep
        self.fingerprint = _normalize_fingerprint(fingerprint)
        if threads is None:
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
            threads = min(8, len(cpus) if cpus else os.cpu_count() or 1)
        elif isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
            raise TypeError(f"threads must be a positive int or None, got {threads!r}")
        elif threads < 1:
            raise ValueError(f"threads must be at least 1 (or None: the CPUs available), "
                             f"got {threads}")
        self.threads = int(threads)
        self._pending = None
        self._uncommitted = None  # a collected save whose commit was interrupted
        self._pruning = None
        self._worker = self._queue = self._stop_worker = self._worker_pid = None
        self._staging = None
        self._damaged = set()  # steps found damaged: never counted among the kept
        self._sound = set()    # committed steps this run wrote or whose manifest it checked
        self._unlock = None    # the finalizer that releases `_lock`
        self._lock = None      # rank 0's open lock file, from the first save: this run writes
        self._wrote_marker = False  # rank 0 made the CHECKPOINTS file (taken back if unused)
        self._pid = os.getpid()  # a forked child's copy has neither its thread nor its lock
        # Rank 0 alone makes and checks the directory; its error is raised on every rank.
        comm.on_root(self._prepare_directory)
        seen = None if os.path.isdir(self.directory) else FileNotFoundError(
            f"rank {comm.rank} does not see the checkpoint directory {self.directory} that "
            "rank 0 made: it must be on a file system every rank sees")
        comm.raise_if_any(seen)

    def __repr__(self):
        return (f"Checkpointer({self.directory!r}, rank {self.comm.rank} of {self.comm.size}, "
                f"keep={self.keep})")

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
            return
        self.abandon()

    # ------------------------------------------------------------ directory
    def _prepare_directory(self):
        """Check or create the directory (rank 0); raises what makes it unusable."""
        path = self.directory
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotADirectoryError(f"checkpoint directory {path} is a file, not a directory")
        try:
            marker = os.path.join(path, MARKER)
            if os.path.isdir(path) and not os.path.isfile(marker):
                # A lock file alone is what a run that saved nothing leaves, and the temporary
                # marker what one killed while writing the marker leaves: empty otherwise.
                entries = sorted(entry for entry in os.listdir(path) if entry != _files.LOCK
                                 and not _MARKER_TEMPORARY.match(entry))
                if entries:
                    shown = ", ".join(repr(e) for e in entries[:5])
                    raise ValueError(f"{path} is not a checkpoint directory (it has no "
                                     f"{MARKER} file and holds {shown}"
                                     f"{', ...' if len(entries) > 5 else ''}); give an empty "
                                     "or a new directory")
            if not os.path.isfile(marker):
                os.makedirs(path, exist_ok=True)
                self._write_marker(marker)
                _files.fsync_directory(os.path.dirname(path))
                self._wrote_marker = True
                return
            try:
                # As large as a manifest may be: both hold the fingerprint.
                fd, _ = _files.open_regular(marker, _files.MANIFEST_LIMIT)
                with open(fd, "rb") as handle:
                    saved = json.loads(handle.read().decode("utf-8"))
            except (Damaged, OSError, ValueError, RecursionError) as exc:
                # RecursionError: JSON nested deeper than the parser goes (garbage).
                self._recover_marker(marker, f"cannot be read ({exc})")
                return
            if (isinstance(saved, dict) and "checksum" in saved
                    and saved["checksum"] != _files.manifest_checksum(saved)):
                # Markers before the checksum have none: they are read as they are.
                self._recover_marker(marker, "does not match its own checksum")
                return
            if not isinstance(saved, dict) or saved.get("format") != FORMAT:
                raise ValueError(f"{marker} is not a {FORMAT} marker: is {path} a checkpoint "
                                 "directory?")
            if not isinstance(saved.get("fingerprint"), (dict, type(None))):
                # Compared key by key below, it would fail with a bare AttributeError.
                raise ValueError(f"{marker} holds the fingerprint "
                                 f"{saved.get('fingerprint')!r}, not a dict or null: is {path} "
                                 "a checkpoint directory of this library?")
            if self._step_dirs():
                mismatch = _fingerprint_mismatch(path, saved.get("fingerprint"),
                                                 self.fingerprint, f"{MARKER} file")
                if mismatch is not None:
                    raise mismatch
                return
            # A run killed before its first save cannot take its marker back.
            mismatch = _fingerprint_mismatch(path, saved.get("fingerprint"), self.fingerprint,
                                             f"{MARKER} file", holds="was made by")
            if mismatch is not None:
                raise ValueError(
                    f"{mismatch}; it holds no checkpoint (that run may still be before its "
                    f"first save, or was killed there): delete {path} or give another "
                    "directory")
        except OSError as exc:  # the same type, saying what it was for
            raise type(exc)(exc.errno, f"cannot use {path} as a checkpoint directory: "
                            f"{exc.strerror or exc}") from exc

    def _write_marker(self, marker, fingerprint=None):
        if fingerprint is None:
            fingerprint = self.fingerprint
        record = {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint}
        record["checksum"] = _files.manifest_checksum(record)
        _files.write_json(marker, record)

    def _recover_marker(self, marker, problem):
        """Write a damaged ``CHECKPOINTS`` file again from the newest checkpoint whose
        manifest verifies, when that checkpoint is of this run's fingerprint (rank 0; raises
        what it finds wrong). Without it the directory, checkpoints and all, was refused."""
        for step, step_dir in sorted(self._step_dirs().items(), reverse=True):
            try:
                manifest = _files.read_manifest(step_dir)
            except Damaged:
                continue
            mismatch = _fingerprint_mismatch(self.directory, manifest.get("fingerprint"),
                                             self.fingerprint, f"step {step}'s {MANIFEST}")
            if mismatch is not None:
                raise ValueError(f"{marker} {problem}; {mismatch}")
            self._write_marker(marker, manifest.get("fingerprint"))
            warnings.warn(f"{marker} {problem}: written again from the manifest of step {step}, "
                          "which verifies and has this run's fingerprint", stacklevel=2)
            return
        raise ValueError(f"{marker} {problem}, and no checkpoint in {self.directory} verifies "
                         "to take its fingerprint from: is it a checkpoint directory?")

    def _restore_marker(self):
        """Write the ``CHECKPOINTS`` file again where it is gone (rank 0, the lock taken): a
        run that made it and failed before its first save takes it back, though another
        `Checkpointer` opened on the directory meanwhile, which now saves; without it, that
        run's checkpoints would lie in a directory refused as not a checkpoint directory."""
        marker = os.path.join(self.directory, MARKER)
        if not os.path.isfile(marker):
            self._write_marker(marker)
            # Ours now: taken back in turn if this run saves nothing after all.
            self._wrote_marker = True

    def _step_dirs(self):
        """``{step: path}`` of every step directory, committed or not."""
        try:
            # scandir: the entry's type comes with its name, where isdir took a stat each
            # (a save of a run that keeps every checkpoint scans them all).
            with os.scandir(self.directory) as entries:
                entries = list(entries)
        except FileNotFoundError:
            return {}
        found = {}
        for entry in entries:
            match = _STEP_DIR.match(entry.name)
            # Only the name this class gives the step: another spelling of it ("step-3", a
            # copy made by hand) would stand for the same step and hide the checkpoint.
            if (match and entry.name == _step_name(int(match.group(1)))
                    and entry.is_dir()):
                found[int(match.group(1))] = entry.path
        return found

    def steps(self):
        """Steps of the committed checkpoints (those with a manifest), oldest first.

        Local: reads the directory on this rank, no communication. A committed checkpoint may
        still fail verification in `load`.
        """
        return sorted(step for step, path in self._step_dirs().items()
                      if os.path.isfile(os.path.join(path, MANIFEST)))

    def latest(self):
        """The newest committed step, or None (local, like `steps`)."""
        steps = self.steps()
        return steps[-1] if steps else None

    # ------------------------------------------------------------ saving
    def save(self, step, shard, *, shared=None, nodes=None, blocking=False):
        """Save a checkpoint of ``step`` (collective).

        Waits for the previous save's files and has rank 0 commit it (in the background, before
        this save's files). Then copies the state in memory and starts writing this rank's
        files in a background thread; the state may change as soon as this returns. `wait`
        (or the next `save`, or `load`) commits it.

        Parameters
        ----------
        step : int
            Non-negative, the same on every rank, not a step already committed.
        shard : object
            This rank's own state (model and optimizer state, RNG states, partition, any
            extras): a tree as described in the class Notes.
        shared : object, optional
            Replicated state, the same on every rank: rank 0 writes it (other ranks' values are
            ignored, not even copied).
        nodes : dict, optional
            Per-node state of this rank's nodes: ``{"node_ids": global ids (int, 1-D), name:
            array or tensor with one row per node, ...}``, the same names on every rank.
            `load` can gather it by node id under another number of ranks.
        blocking : bool
            Write and commit before returning (no copy is made).

        Raises
        ------
        TypeError
            A value the checkpoint cannot hold (the message gives its path in the state), a
            step that is not an int.
        ValueError
            A negative step, steps that differ between ranks, malformed ``nodes``, per-node
            state that `load` could not gather by node id (names, dtypes or row shapes that
            differ between ranks, a node saved by two ranks: raised on every rank); a step
            older than a good checkpoint in the directory (or than the previous save): the
            checkpoints of a rolled-back run would mix with the newer ones of the run it left.
        FileExistsError
            The step is already committed, or is the previous save's (which is committed).
        MemoryError
            No room for the in-memory copy on some rank: raised on every rank, the save
            dropped and the previous one committed.
        """
        self._check_process()
        # Alike on every rank (an argument): before any collective. "no" read as True.
        blocking = check_flag(blocking, "blocking")
        previous = self._collect()
        try:
            step, encoders = self._prepare_save(step, shard, shared, nodes, previous)
            pending = _Pending(step, previous if self.comm.rank == 0 else None)
            step_dir = os.path.join(self.directory, _step_name(step))
        except BaseException:
            if previous is not None:
                self._commit_now(previous)
            raise
        try:
            if blocking:
                self._write(pending, step_dir,
                            {name: (enc, None) for name, enc in encoders.items()}, self.threads)
                self._pending = pending
                self.wait()
                return
            jobs, error = None, None
            try:
                jobs = self._stage(encoders)
            except Exception as exc:  # no memory for the copy, on some ranks only
                error = exc
            # Every rank raises, or none: a rank going on with the save would be a save ahead
            # of the failed one, and the next collective call would pair mismatched steps.
            self.comm.raise_if_any(error)
            # Pending (and its done event made) before its job is queued: an interrupt past
            # this point leaves a save that `wait` either collects or finds cancelled below.
            pending.thread = threading.Event()
            self._pending = pending
            self._background(self._write_unless_cancelled, pending, step_dir, jobs,
                             done=pending.thread)
        except BaseException as exc:
            # Interrupted (Ctrl-C, no memory for the copy) before the writer took over the
            # previous save, whose files are whole: commit it here rather than lose it. A
            # save the writer has started stays pending, and commits the previous one itself.
            if pending.claim_for("cancelled"):
                if pending.thread is not None:
                    pending.thread.set()
                if self._pending is pending and self.comm.size > 1:
                    # Other ranks may have this save pending: the next `wait`, `save` or
                    # `close` raises this on every rank, where their collectives would pair
                    # with the next save's on this rank.
                    pending.error = RuntimeError(
                        f"checkpoint step {step} was not saved: its save was interrupted "
                        f"({type(exc).__name__}) on rank {self.comm.rank} before its files "
                        "were written")
                elif self._pending is pending:
                    self._pending = None
                if previous is not None and pending.commit is not None:
                    self._commit_now(previous)
            raise

    def _stage(self, encoders):
        """Copy the encoded state into the staging buffer; ``{file name: (encoder, region)}``
        for the writer."""
        total = sum(-(-enc.size // ALIGN) * ALIGN for enc in encoders.values())
        if self._staging is None or self._staging.size < total:
            self._staging = None  # free the old one before allocating its successor
            try:
                self._staging = np.empty(total, np.uint8)
            except MemoryError:
                # NumPy's message names a shape of bytes, not the save or its way out
                raise MemoryError(f"an asynchronous save copies the state first, "
                                  f"{total / 2**30:.3g} GiB, for which there is no memory; "
                                  f"save(..., blocking=True) writes it without a copy") from None
        jobs, offset = {}, 0
        for name, encoder in encoders.items():
            region = self._staging[offset:offset + encoder.size]
            encoder.stage(region)
            encoder.leaves = None  # the copy is taken: let the caller's arrays go
            jobs[name] = (encoder, region)
            offset += -(-encoder.size // ALIGN) * ALIGN
        return jobs

    def _prepare_save(self, step, shard, shared, nodes, previous):
        """Check the arguments and encode the state on every rank; ``(step, encoders)``.
        ``previous`` is the collected save not yet committed, if any."""
        error = None
        encoders = {}
        try:
            step = _check_step(step)
            if previous is not None and previous[0] == step:
                # Its files lie in the step's directory with no manifest yet: clearing that
                # directory for this save would destroy both.
                raise FileExistsError(f"checkpoint step {step} already exists in "
                                      f"{self.directory} (the save just before this one)")
            encoders[_shard_name(self.comm.rank)] = self._encode(shard, "shard")
            if nodes is not None:
                nodes = check_nodes(nodes)
                encoders[_nodes_name(self.comm.rank)] = self._encode(nodes, "nodes")
            if self.comm.rank == 0 and shared is not None:
                encoders[SHARED] = self._encode(shared, "shared")
            if self.comm.rank == 0:
                if self._lock is None:  # one writer at a time; readers need no lock
                    self._lock = _files.lock_directory(self.directory)
                    # A checkpointer dropped without close() empties and closes the lock
                    # file too (not at exit: `_finish_at_exit` commits under the lock first).
                    self._unlock = weakref.finalize(self, _files.unlock_directory, self._lock,
                                                    os.getpid())
                    self._unlock.atexit = False
                    self._restore_marker()
                self._refuse_rollback(step, None if previous is None else previous[0])
                self._clear_step(step)
        except Exception as exc:  # raised below on every rank, not just here
            error = exc
        self.comm.raise_if_any(error)
        steps, extents = zip(*self.comm.allgather((step, node_id_extent(nodes))))
        if len(set(steps)) > 1:
            raise ValueError(f"save() was called with different steps on different ranks: "
                             f"{list(steps)}")
        if self.comm.size > 1:
            check_parts_agree(self.comm, nodes, extents)
        return step, encoders

    @staticmethod
    def _encode(state, root):
        encoder = Encoder()
        encoder.tree = encoder.encode(state, root)
        return encoder

    def _refuse_rollback(self, step, previous_step):
        """Raise where good checkpoints newer than ``step`` exist (rank 0): saving it would let
        pruning, which keeps the highest steps, delete the run's new checkpoints, and `load`
        return the newer one of the abandoned run."""
        # Only the directories of later steps are looked into: each save of a run that keeps
        # every checkpoint read the manifest of every one.
        newer = [s for s, path in self._step_dirs().items()
                 if s > step and s not in self._damaged
                 and os.path.isfile(os.path.join(path, MANIFEST))]
        if previous_step is not None and previous_step > step:
            newer.append(previous_step)
        if newer:
            raise ValueError(
                f"cannot save step {step} in {self.directory}: it holds the newer checkpoint"
                f"{'s' if len(newer) > 1 else ''} of step{'s' if len(newer) > 1 else ''} "
                f"{', '.join(map(str, sorted(newer)))} (a run rolled back to an older "
                f"checkpoint?). Delete their step-* directories to continue from here, or "
                f"save in another directory")

    def _clear_step(self, step):
        """Make room for saving ``step`` (rank 0): refuse a committed one, move a damaged one
        aside, remove the files of an interrupted save."""
        step_dir = os.path.join(self.directory, _step_name(step))
        if not os.path.isdir(step_dir):
            return
        self._join_pruning()  # it may be deleting this very directory
        if not os.path.isdir(step_dir):
            return
        if os.path.isfile(os.path.join(step_dir, MANIFEST)):
            if step not in self._damaged:
                raise FileExistsError(f"checkpoint step {step} already exists in "
                                      f"{self.directory}; delete {step_dir} to save it again")
            aside = f"{step_dir}.damaged"
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(step_dir, aside)
            self._damaged.discard(step)
        elif os.path.islink(step_dir):
            os.unlink(step_dir)
        else:
            shutil.rmtree(step_dir)
        _files.fsync_directory(self.directory)

    def _write_unless_cancelled(self, pending, step_dir, jobs):
        """`_write` in the background thread, unless `save` was interrupted before the job
        started (the caller then dropped the save and committed the previous one itself)."""
        if pending.claim_for("started"):
            self._write(pending, step_dir, jobs)

    def _write(self, pending, step_dir, jobs, threads=1):
        """Write this rank's files (background thread, or the caller's with blocking=True).

        On rank 0 it first commits the previous save (`save` gathered its records). Never
        calls MPI; any error is kept for `wait` to raise on every rank.
        """
        if pending.commit is not None:
            try:
                self._commit_noted(*pending.commit)
                committed, pending.commit = pending.commit[0], None
                self._delete(self._retire(committed, busy=pending.step))
            except BaseException as exc:
                if pending.commit is None and hasattr(exc, "add_note"):  # the pruning failed
                    exc.add_note(f"while deleting the checkpoints that step {committed} made "
                                 f"obsolete in {self.directory}")
                if hasattr(exc, "add_note"):
                    exc.add_note(f"so checkpoint step {pending.step}'s files were not written")
                pending.error = exc
                return
        try:
            try:
                # Not makedirs: a checkpoint directory deleted under the run must not come
                # back without its CHECKPOINTS file and lock, refused when the run resumes.
                os.mkdir(step_dir)
            except FileExistsError:  # made by another rank
                pass
            for name, (encoder, staged) in jobs.items():
                chunks = [np.frombuffer(prefix(encoder.tree, encoder.size), np.uint8)]
                chunks += [staged] if staged is not None else list(encoder.segments())
                path = os.path.join(step_dir, name)
                pending.records[name] = _files.write_atomic(path, chunks, threads)
        except BaseException as exc:  # an uncaught error in a thread would end the job
            pending.error = exc

    @property
    def writing(self):
        """Whether a background thread still writes a save's files or deletes old checkpoints
        (the next `wait`, `save` or `load` would wait for it)."""
        pending, pruning = self._pending, self._pruning
        return (pending is not None and pending.thread is not None
                and not pending.thread.is_set() or pruning is not None and not pruning.is_set())

    def _join(self, keep=False):
        """Wait for the pending save's files; the save, let go of unless ``keep``."""
        self._join_pruning()
        pending = self._pending
        if pending is not None and pending.thread is not None:
            pending.thread.wait()
        # Only now: a wait interrupted (Ctrl-C) leaves the save pending for the next one.
        if not keep:
            self._pending = None
        return pending

    def wait(self):
        """Wait until the pending save is durable and committed (collective), and the one before
        it too.

        Returns
        -------
        int or None
            The step committed, None if no save was pending.

        Raises
        ------
        Exception
            What failed while writing, on any rank (every rank raises it); the checkpoint is
            then not committed.
        """
        self._check_process()
        collected = self._collect()
        if collected is None:
            return None
        # Kept until committed: a commit interrupted (Ctrl-C) is taken up by the next call. A
        # commit that failed is raised once, as a failed write is, and not tried again.
        self._uncommitted = collected
        try:
            self.comm.on_root(self._commit_noted, *collected)
        except Exception:
            self._uncommitted = None
            raise
        self._uncommitted = None
        if self.comm.rank == 0:
            self._start_pruning(collected[0])
        return collected[0]

    def _collect(self):
        """Wait for the pending save's files (collective): raise what failed on any rank, else
        ``(step, every rank's file records)`` (the records on rank 0 only); None if no save
        is pending."""
        pending = self._join(keep=True)
        if pending is None:
            collected, self._uncommitted = self._uncommitted, None
            return collected
        error = pending.error
        if error is not None and hasattr(error, "add_note") and not getattr(
                error, "_noted", False):
            error.add_note(f"while saving checkpoint step {pending.step} to {self.directory} "
                           f"on rank {self.comm.rank}")
            error._noted = True
        try:
            self.comm.raise_if_any(error)
        except Exception:
            self._pending = None  # raised once
            raise
        # Let go of only once collected: a Ctrl-C in these collectives leaves it pending.
        collected = pending.step, self.comm.gather(pending.records)
        self._pending = None
        return collected

    def _commit_now(self, collected):
        """Commit a collected save here and now (rank 0; others have nothing to do), when the
        save that was to commit it fails."""
        if self.comm.rank != 0:
            return
        try:
            self._commit_noted(*collected)
        except Exception as exc:
            # The notes say whether the manifest was written (the checkpoint loads) or not.
            warnings.warn("; ".join([str(exc)] + getattr(exc, "__notes__", [])), stacklevel=3)
            return
        self._start_pruning(collected[0])

    def _commit_noted(self, step, records):
        """`_commit`, its error noting the step."""
        try:
            self._commit(step, records)
        except Exception as exc:
            # A bare "[Errno 28] No space left on device" would not say which save failed,
            # nor whether it has a manifest, without which its files are no checkpoint.
            if hasattr(exc, "add_note"):
                step_dir = os.path.join(self.directory, _step_name(step))
                if os.path.isfile(os.path.join(step_dir, MANIFEST)):
                    exc.add_note(f"while committing checkpoint step {step} in "
                                 f"{self.directory}: its {MANIFEST} is written, so it loads, "
                                 "but the directory could not be made durable (fsync): it "
                                 "may not survive a crash of the machine")
                else:
                    exc.add_note(f"while committing checkpoint step {step} in "
                                 f"{self.directory} (writing its {MANIFEST})")
            raise

    def _commit(self, step, records):
        """Write the manifest (rank 0): the checkpoint exists from here on."""
        step_dir = os.path.join(self.directory, _step_name(step))
        missing = [rank for rank, record in enumerate(records) if _shard_name(rank) not in record]
        if missing:  # a save whose writing was never started: no checkpoint to commit
            raise RuntimeError(f"checkpoint step {step} has no {_shard_name(missing[0])} "
                               f"written ({_ranks_label(missing)}); it is not committed")
        files, nodes = {}, []
        for rank, record in enumerate(records):
            files.update(record)
            nodes.append(_nodes_name(rank) in record)
        manifest = {"format": FORMAT, "version": VERSION, "step": step, "ranks": len(records),
                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "fingerprint": self.fingerprint, "files": files,
                    "has_shared": SHARED in files, "has_nodes": nodes}
        manifest["checksum"] = _files.manifest_checksum(manifest)
        _files.write_json(os.path.join(step_dir, MANIFEST), manifest)
        self._sound.add(step)
        _files.fsync_directory(self.directory)

    def _start_pruning(self, newest):
        """Retire what the ``keep`` newest good checkpoints make obsolete (rank 0): their
        manifests go now, their files in a background thread joined by the next call."""
        doomed = self._retire(newest)
        if doomed:
            self._pruning = self._background(self._delete, doomed)

    def _retire(self, newest, busy=None):
        """Delete the manifests of what ``newest`` makes obsolete (sparing step ``busy``, being
        written); returns their ``[(step, path)]``."""
        doomed = [(s, p) for s, p in self._doomed(newest) if s != busy]
        for step, path in doomed:
            manifest = os.path.join(path, MANIFEST)
            try:
                if os.path.islink(path):
                    # A step linked to a copy kept elsewhere: the link goes, the copy stays.
                    os.unlink(path)
                # The manifest goes first: a half-deleted checkpoint is no checkpoint.
                elif os.path.exists(manifest):
                    os.unlink(manifest)
                    _files.fsync_directory(path)
            except OSError as exc:
                warnings.warn(f"could not delete old checkpoint {path}: {exc}", stacklevel=3)
            self._damaged.discard(step)
            self._sound.discard(step)
        return doomed

    def _delete(self, doomed):
        for _, path in doomed:
            if os.path.islink(path) or not os.path.lexists(path):
                continue  # a link `_retire` could not remove; gone already
            try:
                shutil.rmtree(path)
            except OSError as exc:
                warnings.warn(f"could not delete old checkpoint {path}: {exc}", stacklevel=2)
        if doomed:
            try:
                _files.fsync_directory(self.directory)
            except OSError as exc:  # old checkpoints, not this run's new one: a warning
                warnings.warn(f"could not make the deletion of old checkpoints in "
                              f"{self.directory} durable: {exc}", stacklevel=2)

    def _join_pruning(self):
        if self._pruning is not None:
            self._pruning.wait()
            self._pruning = None

    def _background(self, function, *args, done=None):
        """Run ``function(*args)`` in this checkpointer's background thread, after the work
        queued before; returns an event (``done``, or a new one) set when it is done. One
        long-lived thread, not one per save: starting a thread waits for it to be scheduled,
        a stall on busy cores."""
        if self._worker is None or not self._worker.is_alive():
            jobs = queue.SimpleQueue()
            worker = threading.Thread(target=_serve, args=(jobs,), name="checkpoint-writer",
                                      daemon=True)
            worker.start()
            # Kept only once started (an interrupt inside `start` leaves no half-made worker
            # for `close` to stop). A checkpointer dropped without `close` ends its thread
            # when it is collected (not at exit: `_finish_at_exit` may still queue work then).
            stop = weakref.finalize(self, jobs.put, None)
            stop.atexit = False
            self._queue, self._worker, self._stop_worker = jobs, worker, stop
            self._worker_pid = os.getpid()
            _STARTED.add(self)
        if done is None:
            done = threading.Event()
        self._queue.put((function, args, done))
        return done

    def _doomed(self, newest):
        """``[(step, path)]`` of what the ``keep`` newest good checkpoints make obsolete."""
        dirs = self._step_dirs()
        # A step found sound is committed (its manifest goes only through `_retire`): only
        # the others' manifests are looked for, not every kept checkpoint's at every save.
        committed = sorted(s for s, p in dirs.items()
                           if s in self._sound or os.path.isfile(os.path.join(p, MANIFEST)))
        good = [s for s in committed if self._is_sound(s, dirs[s])]
        doomed = [s for s in dirs if s < newest and s not in committed]  # failed saves
        if self.keep is not None and len(good) > self.keep:
            oldest_kept = good[-self.keep]
            doomed += [s for s in committed if s < oldest_kept]
        return [(step, dirs[step]) for step in sorted(doomed)]

    def _is_sound(self, step, step_dir):
        """Whether committed ``step`` may count among the ``keep`` kept (rank 0): not found
        damaged, and, when an earlier run wrote it, its manifest verifies, is of this step,
        and every file it lists has its recorded size. Checked once per step. The files'
        checksums are left to `load`: reading every kept checkpoint at each save would cost
        more than the save, while a damaged manifest or a truncated file, counted as good,
        would have pruning delete a good older checkpoint and keep one that cannot load."""
        if step in self._damaged:
            return False
        if step in self._sound:
            return True
        try:
            manifest = _files.read_manifest(step_dir)
            if manifest["step"] != step:
                raise Damaged(f"{MANIFEST} is of step {manifest['step']}")
            for name, entry in manifest["files"].items():
                path = os.path.join(step_dir, name)
                if os.path.dirname(name) or os.path.getsize(path) != entry["bytes"]:
                    raise Damaged(f"{name} is not of its recorded size")
        except (Damaged, OSError):
            self._damaged.add(step)
            return False
        self._sound.add(step)
        return True

    def close(self):
        """Commit the pending save (collective), and free the staging buffer and the
        background thread."""
        self._check_process()
        try:
            self.wait()
        finally:
            self._join_pruning()
            self._staging = None
            if self._stop_worker is not None:
                self._stop_worker()
                self._worker = self._queue = self._stop_worker = None
            _STARTED.discard(self)
            self.release()

    def abandon(self):
        """End a failing run's use of the directory (no collective; what leaving a ``with``
        block by an exception does). In one process a pending save whose files are whole is
        committed first (no other rank to wait for; a failure to is a warning); over several
        ranks committing is collective and the others may not be here, so the background
        writer is only waited for. Then `release`."""
        self._check_process()
        try:
            self._settle_pending("")
        finally:
            self.release()

    def _settle_pending(self, when):
        """The pending save's end without the other ranks: in one process committed (a failure
        is a warning, ``when`` saying when it happened); over several ranks, where committing
        is collective, only its files waited for. Returns the uncommitted save there, or None.
        """
        if self.comm.size > 1:
            return self._join()
        try:
            self.wait()
        except Exception as exc:
            warnings.warn(f"could not commit the pending checkpoint in {self.directory}{when}: "
                          f"{exc}", stacklevel=4)
        return None

    def _finish_at_exit(self):
        """What the end of the interpreter does with a checkpointer still open: wait for the
        background thread (the files of the pending save, the commit of the save before it,
        the deletion of old checkpoints). In one process the pending save is then committed,
        as `abandon` does; over several ranks committing is collective, and MPI may be
        finalized by now, so it is left uncommitted, with a warning. Errors become warnings:
        nothing is left to raise them to."""
        try:
            pending = self._settle_pending(" at exit")
            if pending is not None:
                failed = "" if pending.error is None else f" (its write failed: {pending.error})"
                warnings.warn(f"checkpoint step {pending.step} in {self.directory} was not "
                              f"committed{failed}: the process ended without calling close() "
                              "or wait() on every rank", stacklevel=2)
        finally:
            self.release()  # which also waits for the deletion of old checkpoints

    def release(self):
        """Give up the directory's write lock without committing anything (no collective),
        once this process's background writer has finished: `abandon` and `close` end with
        it; the end of the process does it too, however it ends.

        A run that made the directory's ``CHECKPOINTS`` file and saved nothing (it failed
        before its first save: a mistyped dataset) removes that file here, so the corrected
        run, with another fingerprint, is not refused as another run's; not while another
        run holds the directory's lock (the file is that run's too then)."""
        self._check_process()
        _STARTED.discard(self)  # given up: the end of the process commits nothing here
        # The background writer finishes first (uncommitted): it would go on writing into a
        # directory given up, and the marker's check below would miss the step it creates.
        self._join()
        if self._wrote_marker and not self._step_dirs():
            self._wrote_marker = False
            self._take_back_marker()
        if self._lock is not None:
            self._unlock()  # `_files.unlock_directory`, once
            self._lock = self._unlock = None

    def _check_process(self):
        """Raise in a forked child: its copy of this checkpointer has no background thread
        (waiting for the pending save's files, or the deletion of old checkpoints, would hang
        for ever) and shares the parent's lock, under which both would write the directory."""
        if os.getpid() != self._pid:
            raise RuntimeError(f"this Checkpointer of {self.directory} belongs to process "
                               f"{self._pid}, not to this forked process {os.getpid()}: make a "
                               "new Checkpointer here")

    def _take_back_marker(self):
        try:
            lock = self._lock if self._lock is not None else _files.lock_directory(
                self.directory)
        except OSError:  # another run writes here now
            return
        try:
            os.remove(os.path.join(self.directory, MARKER))
            _files.fsync_directory(self.directory)
        except OSError:  # it stays; a run with the same fingerprint still takes it
            pass
        finally:
            if lock is not None and lock is not self._lock:
                _files.unlock_directory(lock)

    # ------------------------------------------------------------ loading
    def load(self, step=None, node_ids=None):
        """Load the newest checkpoint that verifies on every rank, or ``step`` (collective).

        Every file read is checked against the sizes and SHA-256 checksums of its manifest. A
        newest checkpoint that is torn (no manifest), truncated, corrupt or missing a file on
        any rank is reported with a warning (on rank 0, once per checkpoint passed over) and the
        next older one tried, the same one on every rank; `Checkpoint.skipped` lists those
        passed over.

        Parameters
        ----------
        step : int, optional
            Load this step or fail (no fallback). Default: the newest good one.
        node_ids : array_like of int, optional
            Global ids of the nodes this rank owns now: the per-node state saved under any
            number of ranks is gathered by id into `Checkpoint.nodes`, in this order.

        Returns
        -------
        Checkpoint

        Raises
        ------
        FileNotFoundError
            No committed checkpoint (or no such ``step``) in the directory.
        ValueError
            No checkpoint verifies; the fingerprint differs from this run's (naming the
            differing keys); some ``node_ids`` were not saved.
        """
        self.wait()
        self._join_pruning()
        comm = self.comm
        error = None
        try:
            if step is not None:
                step = _check_step(step)
            if node_ids is not None:
                node_ids = as_ids(node_ids, "node_ids")
        except Exception as exc:
            # Each rank passes its own node ids: raised on every rank, not on the one whose ids
            # are wrong while the others wait for it in the next collective.
            error = exc
        comm.raise_if_any(error)
        steps = comm.allgather(step)
        if len(set(steps)) > 1:
            # Each rank would load the step it was given, and resume a different state.
            raise ValueError(f"load() was called with different steps on different ranks: "
                             f"{steps}")
        dirs, committed = self._listing()
        candidates = sorted(dirs, reverse=True)
        if step is not None:
            if step not in dirs:
                raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}")
            candidates = [step]
        if not set(candidates) & set(committed):
            # Only interrupted saves (no manifest): a directory without checkpoints, not a
            # damaged one, so that a run resumed before its first checkpoint starts afresh.
            which = "" if step is None else f" of step {step}"
            torn = ", ".join(map(str, sorted(candidates)))
            raise FileNotFoundError(f"no committed checkpoint{which} in {self.directory}"
                                    + (f" (steps {torn} were never committed)" if torn else ""))
        problems = []
        for _ in range(_RELISTS + 1):
            for candidate in candidates:
                problem, error, result = None, None, None
                try:
                    result = self._read(candidate, dirs[candidate], node_ids)
                except Damaged as exc:
                    problem = str(exc)
                except Exception as exc:
                    error = exc
                comm.raise_if_any(error)
                reports = comm.allgather(problem)
                bad = [(rank, p) for rank, p in enumerate(reports) if p is not None]
                if not bad:
                    # Only the newer ones were passed over for it (a second listing may have
                    # found it newer than some tried before).
                    problems = sorted(((s, what) for s, what in problems if s > candidate),
                                      reverse=True)
                    for damaged, what in problems if comm.rank == 0 else ():
                        warnings.warn(f"checkpoint step {damaged} in {self.directory} is "
                                      f"damaged: {what}; loading step {candidate} instead",
                                      stacklevel=2)
                    result.skipped = problems
                    return result
                problems.append((candidate, "; ".join(p if comm.size == 1 else f"rank {r}: {p}"
                                                      for r, p in bad)))
                if os.path.isfile(os.path.join(dirs[candidate], MANIFEST)):
                    self._damaged.add(candidate)
            if step is not None:
                break
            # Every checkpoint listed failed. Loading takes no lock, so a run writing this
            # directory meanwhile may have committed newer ones and pruned those listed (their
            # files deleted as they were read): list again, and try what was committed since.
            # Rank 0's listing, so that every rank tries the same steps.
            before = set(committed)
            dirs, committed = self._listing()
            candidates = sorted(set(committed) - before, reverse=True)
            # A step committed when listed and not now was pruned, not damaged; one committed
            # since is tried again.
            problems = [(s, what) for s, what in problems
                        if not (s in before and s not in committed) and s not in candidates]
            if not candidates:
                break
        problems.sort(reverse=True)
        raise ValueError(f"no usable checkpoint in {self.directory}: "
                         + "; ".join(f"step {s}: {what}" for s, what in problems))

    def _listing(self):
        """Rank 0's ``(step directories, committed steps)``, on every rank (collective), so
        that every rank tries the same steps. What listing the directory raised there (it is
        unreadable, or gone) is raised on every rank: on rank 0 alone, the others would wait
        for it for ever."""
        return self.comm.on_root(lambda: (self._step_dirs(), self.steps()))

    def _read(self, step, step_dir, node_ids):
        manifest = _files.read_manifest(step_dir)
        if manifest["step"] != step:
            # A step directory renamed or copied under another name: its state is of the step
            # its manifest says, and resuming it as this one would repeat or skip steps.
            raise Damaged(f"{MANIFEST} is of step {manifest['step']}, not of step {step} as "
                          f"its directory {os.path.basename(step_dir)} says (renamed or "
                          "copied?)")
        mismatch = _fingerprint_mismatch(self.directory, manifest.get("fingerprint"),
                                         self.fingerprint, f"step {step}")
        if mismatch is not None:
            raise mismatch
        ranks, files = manifest["ranks"], manifest["files"]
        # The files recorded are those the flags say were saved, no more, no fewer: a shared or
        # per-node state whose flag was turned off would load as None, without a word.
        expected = {_shard_name(r) for r in range(ranks)}
        expected |= {_nodes_name(r) for r in range(ranks) if manifest["has_nodes"][r]}
        expected |= {SHARED} if manifest["has_shared"] else set()
        if set(files) != expected:
            raise Damaged(f"{MANIFEST} records the files {', '.join(sorted(files)) or 'none'}, "
                          f"not the {', '.join(sorted(expected))} its ranks, has_shared and "
                          "has_nodes say were saved (edited by hand?)")

        def state(name):
            if name not in files:
                raise Damaged(f"{name} is not in the manifest")
            path = os.path.join(step_dir, name)
            held = parse(_files.read_verified(path, files[name], self.threads), name)
            if name.startswith("nodes-"):
                # What `save` checked, checked again: gathering by node id, or a caller,
                # would otherwise fail on a file made elsewhere with a bare IndexError.
                try:
                    held = check_nodes(held)
                except (TypeError, ValueError) as exc:
                    raise Damaged(f"{name} does not hold per-node state: {exc}") from None
            return held

        same = ranks == self.comm.size
        shared = state(SHARED) if manifest["has_shared"] else None
        shard = state(_shard_name(self.comm.rank)) if same else None
        nodes = None
        if node_ids is not None:
            parts = [state(_nodes_name(r)) for r in range(ranks) if manifest["has_nodes"][r]]
            if not parts and node_ids.size:
                raise ValueError(f"checkpoint step {step} in {self.directory} holds no "
                                 "per-node state to gather node_ids from")
            try:
                nodes = gather_node_rows(node_ids, parts)
            except ValueError as exc:
                raise ValueError(f"checkpoint step {step} in {self.directory}: {exc}") from None
        elif same and manifest["has_nodes"][self.comm.rank]:
            nodes = state(_nodes_name(self.comm.rank))
        return Checkpoint(step=step, shard=shard, shared=shared, nodes=nodes, ranks_saved=ranks,
                          meta=manifest, path=step_dir)
