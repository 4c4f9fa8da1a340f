"""Atomic, durable, verified files: how a checkpoint's files and its manifest are written and
read back.

Every file is written under a temporary name in its directory, flushed, fsync'd, renamed over
its final name, and the directory fsync'd, so a crash leaves either the old file or the new
one, never a mixture. Each file is hashed in blocks of `BLOCK` bytes, one SHA-256 each, so that
several threads can hash (and verify) one file, and a damaged file says where.
"""
import errno
import hashlib
import json
import os
import stat
import threading

import numpy as np

from ._format import FORMAT, VERSION, Damaged

MANIFEST = "manifest.json"
BLOCK = 16 << 20
#: The most bytes a manifest is read to: one holds a file record per rank, each a hash per
#: `BLOCK`, about 100 bytes apiece (a 1 TB checkpoint on 4096 ranks: about 10 MB).
MANIFEST_LIMIT = 256 << 20


#: The file whose lock says which run writes a checkpoint directory.
LOCK = ".lock"

#: Flags that keep a file operation inside the directory and out of a wait: a symbolic link
#: in a file's place (planted, or made by a tool) is not followed, and a FIFO does not block.
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NO_WAIT = getattr(os, "O_NONBLOCK", 0)


def open_regular(path, limit=None):
    """``(fd, size)`` of ``path`` opened for reading, when it is a regular file (not a link,
    a FIFO or a device) of at most ``limit`` bytes; raises `Damaged` saying what it is
    instead, and ``FileNotFoundError`` where it is missing."""
    name = os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY | _NO_FOLLOW | _NO_WAIT)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Damaged(f"{name} is a symbolic link, which a checkpoint does not hold") \
                from None
        raise Damaged(f"{name} cannot be read ({exc})") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise Damaged(f"{name} is not a regular file")
        if limit is not None and status.st_size > limit:
            raise Damaged(f"{name} has {status.st_size} bytes, more than such a file holds "
                          f"({limit})")
    except BaseException:
        os.close(fd)
        raise
    return fd, status.st_size


def lock_directory(path):
    """Take the directory's write lock for this process: the open lock file, to keep open
    while the directory is written (closing it, or the process ending in any way, even
    killed, releases the lock); None where the platform has no ``flock``.

    Raises ``BlockingIOError`` naming the holder when another run (another process, or another
    open `Checkpointer` in this one) holds it: two runs writing one directory would each
    take the other's unfinished saves for abandoned ones and delete them.
    """
    try:
        import fcntl
    except ImportError:
        return None
    lock_path = os.path.join(path, LOCK)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _NO_FOLLOW, 0o666)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        # Written (the holder's name) and emptied: a link would have them write its target.
        raise OSError(exc.errno, f"{lock_path} is a symbolic link; the lock file must be a "
                      "plain file (remove the link)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{lock_path} is not a regular file (remove it)")
    handle = open(fd, "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        if holder.startswith(f"PID {os.getpid()} "):
            holder += ": this process, through another Checkpointer"
        raise BlockingIOError(f"{path} is being written by another run ({holder}); wait for "
                              "it to end, close() its Checkpointer, or use another "
                              "directory") from None
    except OSError:  # a file system without locks: nothing to guard with
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"PID {os.getpid()} on {os.uname().nodename}\n")
    handle.flush()
    return handle


def unlock_directory(handle, owner=None):
    """Release the lock `lock_directory` took (its open lock file). The holder's name is
    cleared first: a lock file that goes on naming a process after it let go (a run that
    failed, or was refused, and ended) reads as held by it.

    In a process forked from ``owner`` (the PID that took the lock) only this process's copy
    of the file is closed: the lock is the parent's, which still holds it and is named there.
    """
    if owner is not None and owner != os.getpid():
        handle.close()
        return
    try:
        handle.seek(0)
        handle.truncate()
        handle.flush()
    except OSError:  # the lock is released all the same
        pass
    finally:
        handle.close()


#: What ``fsync`` of a directory answers where the file system or platform cannot do it.
_NO_DIRECTORY_FSYNC = frozenset(getattr(errno, name) for name in (
    "EINVAL", "ENOTSUP", "EOPNOTSUPP", "EBADF") if hasattr(errno, name))


def fsync_directory(path):
    """Make the names just created, renamed or removed in directory ``path`` durable.

    Raises the ``OSError`` of a failed ``fsync`` (EIO, ENOSPC, ...): those names may not be on
    disk, and a commit that went on would report a checkpoint that a crash can still take
    back. A file system that cannot fsync a directory at all is passed over.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms that cannot open a directory have nothing to fsync
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_DIRECTORY_FSYNC:
            raise
    finally:
        os.close(fd)


def _blocks(chunks):
    """The bytes of ``chunks`` as blocks (lists of uint8 views) of at most `BLOCK` bytes."""
    block, filled = [], 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while len(view):
            piece = view[:BLOCK - filled]
            block.append(piece)
            filled += len(piece)
            view = view[len(piece):]
            if filled == BLOCK:
                yield block
                block, filled = [], 0
    if filled:
        yield block


def _digest(pieces):
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)   # releases the GIL: other threads go on
    return digest.hexdigest()


_POOL = None
_POOL_LOCK = threading.Lock()


def _forget_pool_in_child():
    """A forked child has the pool's object but none of its threads: work handed to it would
    wait for ever (a process that loaded a checkpoint, then forked a worker that loads one).
    The child makes its own pool; the lock may have been held by a thread that is not here."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def _pool(threads):
    """A shared thread pool for hashing blocks (None for one thread)."""
    global _POOL
    if threads <= 1:
        return None
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < threads:
            from concurrent.futures import ThreadPoolExecutor
            _POOL = ThreadPoolExecutor(threads, thread_name_prefix="checkpoint-hash")
        return _POOL


def write_atomic(path, chunks, threads=1):
    """Write the byte chunks to ``path`` atomically and durably.

    Returns ``{"bytes": size, "sha256": [[block bytes, hex digest], ...]}``, one SHA-256 per
    block of up to `BLOCK` bytes (hashed by ``threads`` threads while the file is written, or
    in this thread as it writes).
    """
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    pool = _pool(threads)
    blocks, size = [], 0
    if os.path.lexists(temporary):
        # What a killed process of this PID left, or a link put in its place: removed (a
        # link, not what it points to), then made afresh without following links.
        os.unlink(temporary)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o666)
    try:
        with open(fd, "wb") as handle:
            for block in _blocks(chunks):
                length = sum(len(piece) for piece in block)
                blocks.append([length, pool.submit(_digest, block) if pool else _digest(block)])
                for piece in block:
                    handle.write(piece)
                size += length
            handle.flush()
            os.fsync(handle.fileno())
            blocks = [[length, digest if isinstance(digest, str) else digest.result()]
                      for length, digest in blocks]
        os.replace(temporary, path)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:
            # A write or fsync that fails (no space left) names no file by itself.
            exc.add_note(f"while writing {path}")
        raise
    fsync_directory(directory)
    return {"bytes": size, "sha256": blocks}


def write_json(path, obj):
    return write_atomic(path, [json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n"])


def read_verified(path, entry, threads=1):
    """The bytes of ``path`` (a uint8 array) after checking them against its manifest
    ``entry`` (`write_atomic`'s record); raises `Damaged` naming what is wrong."""
    name = os.path.basename(path)
    try:
        fd, size = open_regular(path)
    except FileNotFoundError:
        raise Damaged(f"{name} is missing") from None
    try:
        return _read_verified(fd, size, name, entry, threads)
    finally:
        os.close(fd)


def _read_verified(fd, size, name, entry, threads):
    if size != entry["bytes"]:
        raise Damaged(f"{name} has {size} bytes but the manifest says {entry['bytes']} "
                      f"({'truncated' if size < entry['bytes'] else 'grown'})")
    # Read into memory, not mapped: the checksums then vouch for the bytes the tensors are
    # built on, and a file changed or truncated later (a copy over the run directory) can
    # neither change them nor end the process with SIGBUS, as pages of a mapping would. Block
    # by block: each block hashes in the pool while the next one is read.
    blocks = entry["sha256"]
    if sum(length for length, _ in blocks) != size:
        raise Damaged(f"{name}: its manifest's blocks cover "
                      f"{sum(length for length, _ in blocks)} of {size} bytes")
    buffer = np.empty(size, np.uint8)
    pool = _pool(threads)
    digests, position = [], 0
    try:
        with open(fd, "rb", closefd=False) as handle:
            for length, _ in blocks:
                view = memoryview(buffer)[position:position + length]
                filled = 0
                while filled < length:
                    count = handle.readinto(view[filled:])
                    if not count:
                        raise Damaged(f"{name} changed size while it was read")
                    filled += count
                digests.append(pool.submit(_digest, [view]) if pool else _digest([view]))
                position += length
            if handle.read(1):
                raise Damaged(f"{name} changed size while it was read")
    except OSError as exc:
        raise Damaged(f"{name} cannot be read ({exc})") from None
    for index, ((length, expected), digest) in enumerate(zip(entry["sha256"], digests)):
        if (digest if isinstance(digest, str) else digest.result()) != expected:
            start = sum(b[0] for b in entry["sha256"][:index])
            raise Damaged(f"{name} does not match its SHA-256 checksum in the manifest "
                          f"(corrupt in bytes {start}..{start + length})")
    return buffer


def manifest_checksum(manifest):
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_manifest(step_dir):
    path = os.path.join(step_dir, MANIFEST)
    try:
        # Not blocking, and only a regular file: a FIFO would wait for a writer for ever, and
        # a device (a link to /dev/zero) would be read until memory runs out.
        fd, _ = open_regular(path, MANIFEST_LIMIT)
        try:
            with open(fd, "rb", closefd=False) as handle:
                manifest = json.loads(handle.read().decode("utf-8"))
        finally:
            os.close(fd)
        corrupt = not isinstance(manifest, dict) or manifest.get(
            "checksum") != manifest_checksum(manifest)
    except FileNotFoundError:
        raise Damaged(f"{MANIFEST} is missing (an interrupted save)") from None
    except (OSError, ValueError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the parser goes (garbage, not a manifest).
        raise Damaged(f"{MANIFEST} cannot be read ({exc})") from None
    if corrupt:
        raise Damaged(f"{MANIFEST} does not match its own checksum (corrupt)")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise Damaged(f"{MANIFEST} is of format {manifest.get('format')!r} version "
                      f"{manifest.get('version')!r}")
    wrong = _manifest_fault(manifest)
    if wrong:
        raise Damaged(f"{MANIFEST} is not one this library writes: {wrong}")
    return manifest


def _is_int(value, low=0):
    return type(value) is int and value >= low


def _manifest_fault(manifest):
    """What in a manifest (its checksum verified) is not of the shape `Checkpointer` writes,
    or "": a manifest made or edited by hand would otherwise fail later with a bare
    KeyError or IndexError instead of being passed over as damaged."""
    if not _is_int(manifest.get("step")):
        return f"its step is {manifest.get('step')!r}"
    ranks = manifest.get("ranks")
    if not _is_int(ranks, 1):
        return f"its number of ranks is {ranks!r}"
    nodes = manifest.get("has_nodes")
    if (not isinstance(nodes, list) or len(nodes) != ranks
            or any(type(n) is not bool for n in nodes)):
        return f"has_nodes is {nodes!r}, not one bool for each of its {ranks} ranks"
    if type(manifest.get("has_shared")) is not bool:
        return f"has_shared is {manifest.get('has_shared')!r}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return f"its files are {files!r}"
    for name, entry in files.items():
        if not isinstance(entry, dict) or not _is_int(entry.get("bytes")):
            return f"its record of {name} is {entry!r}"
        blocks = entry.get("sha256")
        if not isinstance(blocks, list) or not all(
                isinstance(b, list) and len(b) == 2 and _is_int(b[0]) and isinstance(b[1], str)
                for b in blocks):
            return f"its record of {name} is {entry!r}"
    if "fingerprint" not in manifest:
        return "it has no fingerprint"  # one written without is null, not absent
    fingerprint = manifest["fingerprint"]
    if fingerprint is not None and not isinstance(fingerprint, dict):
        return f"its fingerprint is {fingerprint!r}, not a dict or null"
    return ""
