"""Checkpoints of (distributed) training: asynchronous, atomic, verified, reloadable at another
number of ranks.

This module owns the checkpoint directory: its layout, the file format of the state files, the
manifest that commits a checkpoint, keeping the last few, and choosing (with every rank's
agreement) the newest checkpoint that verifies on load.

Layout::

    DIR/CHECKPOINTS                 marks DIR as a checkpoint directory (and holds the run's
                                    fingerprint)
    DIR/step-000000010/
        rank-00000.ckpt ...         each rank's own state (``shard``)
        nodes-00000.ckpt ...        each rank's per-node rows and their global node ids
        shared.ckpt                 replicated state, written once by rank 0
        manifest.json               written last, by rank 0: the size of every file and the
                                    SHA-256 of each of its 16 MiB blocks

A checkpoint exists once its manifest does. Every file is written under a temporary name in
its directory, flushed, fsync'd, renamed over its final name, and the directory fsync'd, so a
crash leaves either the old file or the new one, never a mixture.

A state file is ``MAGIC``, the length of a JSON header (little-endian uint64), the header, and
a payload of raw array bytes (each array at a 64-byte aligned offset). The header describes the
nested state (dicts, lists, tuples, plain values) with every tensor and array as a dtype, a
shape and a byte range of the payload: loading runs no pickle, so a checkpoint from elsewhere
cannot run code, and arrays come back bit for bit.
"""
import datetime
import hashlib
import json
import mmap
import operator
import os
import queue
import random
import re
import shutil
import struct
import sys
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Checkpoint", "Checkpointer", "gather_node_rows", "restore_rng_states", "rng_states"]

MAGIC = b"PSHCKPT1"
FORMAT = "pysparse_hpc checkpoint"
VERSION = 1
MARKER = "CHECKPOINTS"
MANIFEST = "manifest.json"
SHARED = "shared.ckpt"
_ALIGN = 64
# Each file is hashed in blocks of this many bytes, one SHA-256 each, so that several threads
# can hash (and verify) one file, and a damaged file says where.
_BLOCK = 16 << 20
_STEP_DIR = re.compile(r"^step-(\d+)$")
_PLAIN = (type(None), bool, int, float, str)


def _step_name(step):
    return f"step-{step:09d}"


def _shard_name(rank):
    return f"rank-{rank:05d}.ckpt"


def _nodes_name(rank):
    return f"nodes-{rank:05d}.ckpt"


class _Damaged(Exception):
    """A checkpoint file that is missing, truncated, corrupt or unreadable (load falls back to
    an older checkpoint), as opposed to a usage error (raised)."""


# ---------------------------------------------------------------------------- encoding
class _Encoder:
    """Walks a nested state, builds its JSON header tree and lays out its arrays.

    Arrays are only referenced here (``leaves``: ``(source, offset, nbytes)``); `stage` copies
    them into one buffer, `segments` hands them out as they are.
    """

    def __init__(self):
        self.leaves = []
        self.size = 0
        self._active = set()

    def _leaf(self, source, nbytes):
        offset = -(-self.size // _ALIGN) * _ALIGN
        self.leaves.append((source, offset, nbytes))
        self.size = offset + nbytes
        return offset

    def encode(self, value, path):
        kind = type(value)
        if kind in _PLAIN:
            return value
        torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(value, path, torch)
        if isinstance(value, np.ndarray):
            return self._array(value, path, "ndarray")
        if isinstance(value, np.generic):
            return self._array(np.asarray(value), path, "npscalar")
        if kind is bytes:
            return {"$t": "bytes", "at": self._leaf(np.frombuffer(value, np.uint8), len(value)),
                    "n": len(value)}
        if torch is not None and isinstance(value, torch.dtype):
            return {"$t": "torch.dtype", "v": str(value).removeprefix("torch.")}
        if torch is not None and isinstance(value, torch.Size):
            return {"$t": "torch.Size", "v": list(value)}
        if torch is not None and isinstance(value, torch.device):
            return {"$t": "torch.device", "v": str(value)}
        if isinstance(value, (dict, list, tuple)):
            if id(value) in self._active:
                raise TypeError(f"{path} contains itself; a checkpoint holds trees, not cycles")
            self._active.add(id(value))
            try:
                return self._container(value, path)
            finally:
                self._active.discard(id(value))
        raise TypeError(f"{path} is a {kind.__module__}.{kind.__qualname__}, which a checkpoint "
                        "cannot hold (it holds torch tensors, NumPy arrays and scalars, dicts, "
                        "lists, tuples, None, bool, int, float, str and bytes)")

    def _container(self, value, path):
        if isinstance(value, list):
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"$t": "tuple", "v": [self.encode(v, f"{path}[{i}]")
                                         for i, v in enumerate(value)]}
        keys, values = [], []
        for key, item in value.items():
            if type(key) not in _PLAIN and not isinstance(key, tuple):
                raise TypeError(f"{path} has a key of type {type(key).__name__} ({key!r}); "
                                "keys must be None, bool, int, float, str or tuples of them")
            keys.append(self.encode(key, f"{path} key {key!r}"))
            values.append(self.encode(item, f"{path}[{key!r}]"))
        node = {"$t": "odict" if isinstance(value, OrderedDict) else "dict", "k": keys,
                "v": values}
        metadata = getattr(value, "_metadata", None)  # torch state_dict()'s module versions
        if node["$t"] == "odict" and isinstance(metadata, dict):
            node["meta"] = self.encode(metadata, f"{path}._metadata")
        return node

    def _array(self, array, path, tag):
        if array.dtype.hasobject:
            raise TypeError(f"{path} is a NumPy array of dtype {array.dtype}, which holds Python "
                            "objects; a checkpoint holds arrays of plain numbers, bytes and "
                            "strings")
        return {"$t": tag, "dtype": np.lib.format.dtype_to_descr(array.dtype),
                "shape": list(array.shape), "at": self._leaf(array, array.nbytes),
                "n": array.nbytes}

    def _tensor(self, tensor, path, torch):
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.device.type == "meta":
            raise TypeError(f"{path} is a {tensor.layout} tensor on {tensor.device}"
                            f"{' (quantized)' if tensor.is_quantized else ''}; a checkpoint "
                            "holds dense tensors with data (convert it with .to_dense() "
                            "or .dequantize())")
        nbytes = tensor.numel() * tensor.element_size()
        return {"$t": "tensor", "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape), "at": self._leaf(tensor, nbytes), "n": nbytes,
                "grad": bool(tensor.requires_grad),
                "param": isinstance(tensor, torch.nn.Parameter)}

    def stage(self, buffer):
        """Copy every array into ``buffer`` (uint8, at least `size` bytes) at its offset."""
        for source, offset, nbytes in self.leaves:
            target = buffer[offset:offset + nbytes]
            if not isinstance(source, np.ndarray) and source.device.type == "cpu":
                try:
                    source = source.detach().numpy()
                except (TypeError, RuntimeError):  # bfloat16 and the like, conj/neg views
                    pass
            if isinstance(source, np.ndarray):
                # NumPy's single-threaded copy is the faster one where training's threads
                # compete for the cores.
                np.copyto(target.view(source.dtype).reshape(source.shape), source)
            else:
                import torch
                view = torch.from_numpy(target).view(source.dtype).view(source.shape)
                with torch.no_grad():
                    view.copy_(source.detach())  # copies from any device, resolves conj/neg

    def segments(self):
        """The payload as a sequence of uint8 arrays (padding and each array, contiguous, on
        the CPU), without copying arrays that already are."""
        position = 0
        for source, offset, nbytes in self.leaves:
            if offset > position:
                yield np.zeros(offset - position, np.uint8)
            if isinstance(source, np.ndarray):
                yield np.ascontiguousarray(source).reshape(-1).view(np.uint8)
            else:
                tensor = source.detach().cpu().resolve_conj().resolve_neg().contiguous()
                yield tensor.reshape(-1).view(_torch().uint8).numpy()
            position = offset + nbytes


def _torch():
    import torch
    return torch


def _prefix(tree, payload_bytes):
    """The file's bytes before the payload: magic, header length, header, padding."""
    header = json.dumps({"format": FORMAT, "version": VERSION, "payload": payload_bytes,
                         "tree": tree}, separators=(",", ":")).encode()
    start = len(MAGIC) + 8 + len(header)
    padding = -(-start // _ALIGN) * _ALIGN - start
    return MAGIC + struct.pack("<Q", len(header)) + header + b" " * padding


def _decode(node, payload):
    if isinstance(node, list):
        return [_decode(v, payload) for v in node]
    if not isinstance(node, dict):
        return node
    tag = node["$t"]
    if tag in ("dict", "odict"):
        pairs = [(_decode(k, payload), _decode(v, payload)) for k, v in zip(node["k"], node["v"])]
        if tag == "dict":
            return dict(pairs)
        result = OrderedDict(pairs)
        if "meta" in node:
            result._metadata = _decode(node["meta"], payload)
        return result
    if tag == "tuple":
        return tuple(_decode(v, payload) for v in node["v"])
    if tag in ("ndarray", "npscalar", "bytes", "tensor"):
        at, n = node["at"], node["n"]
        if not 0 <= at <= at + n <= payload.size:
            raise _Damaged(f"an array's bytes {at}..{at + n} lie outside the payload")
        raw = payload[at:at + n]
        if tag == "bytes":
            return raw.tobytes()
        if tag == "tensor":
            torch = _torch()
            dtype = getattr(torch, node["dtype"])
            tensor = torch.from_numpy(raw).view(dtype).view(node["shape"])
            if node["param"]:
                return torch.nn.Parameter(tensor, requires_grad=node["grad"])
            return tensor.requires_grad_(node["grad"])
        array = raw.view(np.lib.format.descr_to_dtype(_tuples(node["dtype"])))
        array = array.reshape(node["shape"])
        return array[()] if tag == "npscalar" else array
    torch = _torch()
    if tag == "torch.dtype":
        return getattr(torch, node["v"])
    if tag == "torch.Size":
        return torch.Size(node["v"])
    if tag == "torch.device":
        return torch.device(node["v"])
    raise _Damaged(f"unknown entry {tag!r} in the header")


def _tuples(descr):
    """A NumPy dtype descriptor read back from JSON (which turned its tuples into lists)."""
    if isinstance(descr, list):
        return [tuple(_tuples(part) if isinstance(part, list) else part for part in field_)
                for field_ in descr]
    return descr


# ---------------------------------------------------------------------------- files
def _fsync_directory(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms that cannot open a directory have nothing to fsync
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _blocks(chunks):
    """The bytes of ``chunks`` as blocks (lists of uint8 views) of at most `_BLOCK` bytes."""
    block, filled = [], 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while len(view):
            piece = view[:_BLOCK - filled]
            block.append(piece)
            filled += len(piece)
            view = view[len(piece):]
            if filled == _BLOCK:
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


def _write_atomic(path, chunks, threads=1):
    """Write the byte chunks to ``path`` atomically and durably.

    Returns ``{"bytes": size, "sha256": [[block bytes, hex digest], ...]}``, one SHA-256 per
    block of up to `_BLOCK` bytes (hashed by ``threads`` threads while the file is written, or
    in this thread as it writes).
    """
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    pool = _pool(threads)
    blocks, size = [], 0
    try:
        with open(temporary, "wb") as handle:
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
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    _fsync_directory(directory)
    return {"bytes": size, "sha256": blocks}


def _write_json(path, obj):
    return _write_atomic(path, [json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n"])


def _read_verified(path, entry, threads=1):
    """The bytes of ``path`` (a uint8 array) after checking them against its manifest
    ``entry`` (`_write_atomic`'s record); raises `_Damaged` naming what is wrong."""
    name = os.path.basename(path)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise _Damaged(f"{name} is missing") from None
    except OSError as exc:
        raise _Damaged(f"{name} cannot be read ({exc})") from None
    if size != entry["bytes"]:
        raise _Damaged(f"{name} has {size} bytes but the manifest says {entry['bytes']} "
                       f"({'truncated' if size < entry['bytes'] else 'grown'})")
    try:
        with open(path, "rb") as handle:
            # A private (copy-on-write) mapping: the page cache is read in place, not copied,
            # and the arrays built on it are the caller's to modify.
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:
        raise _Damaged(f"{name} cannot be read ({exc})") from None
    buffer = np.frombuffer(mapped, np.uint8)
    if buffer.size != size:
        raise _Damaged(f"{name} changed size while it was read")
    pool = _pool(threads)
    digests, position = [], 0
    for length, _ in entry["sha256"]:
        view = memoryview(buffer)[position:position + length]
        digests.append(pool.submit(_digest, [view]) if pool else _digest([view]))
        position += length
    if position != size:
        raise _Damaged(f"{name}: its manifest's blocks cover {position} of {size} bytes")
    for index, ((length, expected), digest) in enumerate(zip(entry["sha256"], digests)):
        if (digest if isinstance(digest, str) else digest.result()) != expected:
            start = sum(b[0] for b in entry["sha256"][:index])
            raise _Damaged(f"{name} does not match its SHA-256 checksum in the manifest "
                           f"(corrupt in bytes {start}..{start + length})")
    return buffer


def _parse(buffer, name):
    """The state held by a verified file's bytes."""
    try:
        if buffer[:len(MAGIC)].tobytes() != MAGIC:
            raise _Damaged(f"{name} is not a checkpoint file (wrong magic bytes)")
        (length,) = struct.unpack("<Q", buffer[len(MAGIC):len(MAGIC) + 8].tobytes())
        start = len(MAGIC) + 8
        header = json.loads(buffer[start:start + length].tobytes())
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise _Damaged(f"{name} has format {header.get('format')!r} version "
                           f"{header.get('version')!r}, not {FORMAT!r} version {VERSION}")
        begin = -(-(start + length) // _ALIGN) * _ALIGN
        payload = buffer[begin:begin + header["payload"]]
        if payload.size != header["payload"]:
            raise _Damaged(f"{name} holds a shorter payload than its header says")
        return _decode(header["tree"], payload)
    except _Damaged:
        raise
    except Exception as exc:  # a file that passed its checksum but was written wrong
        raise _Damaged(f"{name} cannot be decoded ({type(exc).__name__}: {exc})") from None


def _manifest_checksum(manifest):
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _read_manifest(step_dir):
    path = os.path.join(step_dir, MANIFEST)
    try:
        with open(path, "rb") as handle:
            manifest = json.loads(handle.read())
    except FileNotFoundError:
        raise _Damaged(f"{MANIFEST} is missing (an interrupted save)") from None
    except (OSError, ValueError) as exc:
        raise _Damaged(f"{MANIFEST} cannot be read ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("checksum") != _manifest_checksum(
            manifest):
        raise _Damaged(f"{MANIFEST} does not match its own checksum (corrupt)")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise _Damaged(f"{MANIFEST} is of format {manifest.get('format')!r} version "
                       f"{manifest.get('version')!r}")
    return manifest


# ---------------------------------------------------------------------------- node rows
def _as_ids(ids, name):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise TypeError(f"{name} must be a 1-D array of integer node ids, got "
                        f"{ids.ndim}-D {ids.dtype}")
    return ids.astype(np.int64, copy=False)


def _check_nodes(nodes):
    """``nodes`` with its ids as int64, after checking its shape; raises TypeError/ValueError."""
    if not isinstance(nodes, dict) or "node_ids" not in nodes:
        raise TypeError("nodes must be a dict holding 'node_ids' (the global ids of this "
                        "rank's nodes) and arrays with one row per node")
    ids = _as_ids(nodes["node_ids"], "nodes['node_ids']")
    if np.unique(ids).size != ids.size:
        raise ValueError("nodes['node_ids'] holds repeated ids")
    checked = {"node_ids": ids}
    torch = sys.modules.get("torch")
    for name, rows in nodes.items():
        if name == "node_ids":
            continue
        if not isinstance(name, str):
            raise TypeError(f"nodes keys must be strings, got {name!r}")
        is_tensor = torch is not None and isinstance(rows, torch.Tensor)
        if not (is_tensor or isinstance(rows, np.ndarray)):
            raise TypeError(f"nodes[{name!r}] must be a NumPy array or a tensor, got "
                            f"{type(rows).__name__}")
        if rows.ndim < 1 or rows.shape[0] != ids.size:
            raise ValueError(f"nodes[{name!r}] has shape {tuple(rows.shape)} but there are "
                             f"{ids.size} node ids: it needs one row per node")
        checked[name] = rows
    return checked


def gather_node_rows(node_ids, parts):
    """The rows of ``node_ids`` from per-node arrays split over several parts.

    Parameters
    ----------
    node_ids : array_like of int
        Global ids of the rows wanted, in the order wanted.
    parts : sequence of dict
        Each ``{"node_ids": ids, name: rows, ...}`` (the per-node state one rank saved); None
        entries are skipped. Every part holds the same names, with the same dtype and row
        shape.

    Returns
    -------
    dict
        ``{"node_ids": node_ids as int64, name: rows}``: NumPy arrays or tensors as saved.

    Raises
    ------
    ValueError
        An id is in no part, or in more than one.
    """
    ids = _as_ids(node_ids, "node_ids")
    parts = [p for p in parts if p is not None]
    torch = sys.modules.get("torch")
    found = np.zeros(ids.size, bool)
    names = None
    result = {"node_ids": ids}
    for index, part in enumerate(parts):
        part_names = sorted(k for k in part if k != "node_ids")
        if names is None:
            names = part_names
        elif part_names != names:
            raise ValueError(f"the parts hold different per-node arrays: {names} and "
                             f"{part_names}")
        part_ids = _as_ids(part["node_ids"], "node_ids of a part")
        order = np.argsort(part_ids, kind="stable")
        ordered = part_ids[order]
        where = np.minimum(np.searchsorted(ordered, ids), max(ordered.size - 1, 0))
        hit = ordered[where] == ids if ordered.size else np.zeros(ids.size, bool)
        if (hit & found).any():
            raise ValueError(f"node {ids[hit & found][0]} is held by more than one part")
        found |= hit
        source, target = order[where[hit]], np.flatnonzero(hit)
        for name in names:
            rows = part[name]
            tensor = torch is not None and isinstance(rows, torch.Tensor)
            if name not in result:
                shape = (ids.size,) + tuple(rows.shape[1:])
                result[name] = (torch.empty(shape, dtype=rows.dtype) if tensor
                                else np.empty(shape, rows.dtype))
            out = result[name]
            if tuple(out.shape[1:]) != tuple(rows.shape[1:]) or out.dtype != rows.dtype:
                raise ValueError(f"per-node array {name!r} has rows of shape "
                                 f"{tuple(rows.shape[1:])} {rows.dtype} in part {index} but "
                                 f"{tuple(out.shape[1:])} {out.dtype} before")
            if tensor:
                out[torch.from_numpy(target)] = rows[torch.from_numpy(source)]
            else:
                out[target] = rows[source]
    if not found.all():
        missing = ids[~found]
        raise ValueError(f"{missing.size} of the {ids.size} node ids are in no part, e.g. "
                         f"{missing[:5].tolist()}")
    return result


# ---------------------------------------------------------------------------- RNG states
def rng_states():
    """The states of Python's, NumPy's and torch's global random generators (torch's CUDA
    generators too when CUDA is in use), to save in a checkpoint.

    Returns
    -------
    dict
        ``{"python": ..., "numpy": ..., "torch": ..., "cuda": [...]}`` (``torch`` and ``cuda``
        only where torch is installed and CUDA initialised).
    """
    states = {"python": random.getstate(), "numpy": np.random.get_state()}
    try:
        import torch
    except ImportError:
        return states
    states["torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states):
    """Set the global random generators to ``states`` (what `rng_states` returned)."""
    if "python" in states:
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    if "torch" in states or "cuda" in states:
        import torch
        if "torch" in states:
            torch.set_rng_state(states["torch"])
        if "cuda" in states:
            torch.cuda.set_rng_state_all(states["cuda"])


# ---------------------------------------------------------------------------- checkpointer
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
        ``files`` (bytes and SHA-256 of each), ``nodes`` (count and id range per rank).
    path : str
        The checkpoint's directory.
    """
    step: int
    shard: Any
    shared: Any
    nodes: Any
    ranks_saved: int
    meta: dict = field(repr=False)
    path: str = ""


def _serve(jobs):
    """The background thread: runs ``(function, args, done)`` jobs in order (``function``
    keeps its own errors), setting ``done`` after each."""
    while True:
        job = jobs.get()
        if job is None:
            return
        function, args, done = job
        try:
            function(*args)
        except BaseException:  # an uncaught error would end the job; the function reports
            pass
        finally:
            done.set()


class _Pending:
    """One save whose files are being written: its job's done event (``thread``), and what
    the job left."""

    __slots__ = ("step", "thread", "records", "error", "commit")

    def __init__(self, step, commit=None):
        self.step, self.thread, self.records, self.error = step, None, {}, None
        self.commit = commit  # (step, records) of the previous save, for rank 0 to commit


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


def _fingerprint_mismatch(directory, saved, given, where):
    """A ValueError naming the keys whose values differ, or None when they agree."""
    if given is None or saved is None or saved == given:
        return None
    absent = _Absent()
    keys = sorted(set(saved) | set(given))
    differing = [f"{k!r} (saved {saved.get(k, absent)!r}, given {given.get(k, absent)!r})"
                 for k in keys if saved.get(k, absent) != given.get(k, absent)]
    return ValueError(f"{directory} holds checkpoints of another run ({where}): the fingerprint "
                      f"differs in {', '.join(differing)}")


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
        Number of newest checkpoints kept; older ones are deleted once a newer one is
        committed. None keeps all.
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
    tensors (dense, any dtype and device; loaded on the CPU), NumPy arrays and scalars (not of
    object dtype), None, bool, int, float, str and bytes. Saving copies its arrays into a
    staging buffer kept for the next save, so a checkpointer holds about one state's bytes
    between saves (`close` frees it); a tensor or array saved twice is loaded as two copies.

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
        if comm is None:
            from ._comm import init
            comm = init()
        self.comm = comm
        self.directory = os.path.abspath(os.fspath(directory))
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
        self.threads = max(1, int(threads))
        self._pending = None
        self._pruning = None
        self._worker = self._queue = None
        self._staging = None
        self._damaged = set()  # steps load() found damaged: never counted among the kept
        error = self._prepare_directory() if comm.rank == 0 else None
        error = comm.bcast(error)
        if error is not None:
            raise error
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
        else:  # already failing: let the write finish, but raise the first error
            self._join()

    # ------------------------------------------------------------ directory
    def _prepare_directory(self):
        """Check or create the directory (rank 0); returns an exception or None."""
        path = self.directory
        try:
            if os.path.exists(path) and not os.path.isdir(path):
                return NotADirectoryError(f"checkpoint directory {path} is a file, not a "
                                          "directory")
            marker = os.path.join(path, MARKER)
            if os.path.isdir(path) and not os.path.isfile(marker):
                entries = sorted(os.listdir(path))
                if entries:
                    shown = ", ".join(repr(e) for e in entries[:5])
                    return ValueError(f"{path} is not a checkpoint directory (it has no "
                                      f"{MARKER} file and holds {shown}"
                                      f"{', ...' if len(entries) > 5 else ''}); give an empty "
                                      "or a new directory")
            if not os.path.isfile(marker):
                os.makedirs(path, exist_ok=True)
                _write_json(marker, {"format": FORMAT, "version": VERSION,
                                     "fingerprint": self.fingerprint})
                _fsync_directory(os.path.dirname(path))
                return None
            try:
                with open(marker) as handle:
                    saved = json.load(handle)
            except (OSError, ValueError) as exc:
                return ValueError(f"{marker} cannot be read ({exc}): is {path} a checkpoint "
                                  "directory?")
            if not isinstance(saved, dict) or saved.get("format") != FORMAT:
                return ValueError(f"{marker} is not a {FORMAT} marker: is {path} a checkpoint "
                                  "directory?")
            return _fingerprint_mismatch(path, saved.get("fingerprint"), self.fingerprint,
                                         f"{MARKER} file")
        except OSError as exc:
            return exc

    def _step_dirs(self):
        """``{step: path}`` of every step directory, committed or not."""
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return {}
        found = {}
        for entry in entries:
            match = _STEP_DIR.match(entry)
            if match and os.path.isdir(os.path.join(self.directory, entry)):
                found[int(match.group(1))] = os.path.join(self.directory, entry)
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
            A negative step, steps that differ between ranks, malformed ``nodes``.
        FileExistsError
            The step is already committed.
        """
        previous = self._collect()
        try:
            step, encoders = self._prepare_save(step, shard, shared, nodes)
        except BaseException:
            if previous is not None:
                self._commit_now(previous)
            raise
        pending = _Pending(step, previous if self.comm.rank == 0 else None)
        step_dir = os.path.join(self.directory, _step_name(step))
        if blocking:
            self._write(pending, step_dir, {name: (enc, None) for name, enc in encoders.items()},
                        self.threads)
            self._pending = pending
            self.wait()
            return
        total = sum(-(-enc.size // _ALIGN) * _ALIGN for enc in encoders.values())
        if self._staging is None or self._staging.size < total:
            self._staging = None  # free the old one before allocating its successor
            self._staging = np.empty(total, np.uint8)
        jobs, offset = {}, 0
        for name, encoder in encoders.items():
            region = self._staging[offset:offset + encoder.size]
            encoder.stage(region)
            encoder.leaves = None  # the copy is taken: let the caller's arrays go
            jobs[name] = (encoder, region)
            offset += -(-encoder.size // _ALIGN) * _ALIGN
        self._pending = pending
        pending.thread = self._background(self._write, pending, step_dir, jobs)

    def _prepare_save(self, step, shard, shared, nodes):
        """Check the arguments and encode the state on every rank; ``(step, encoders)``."""
        error = None
        encoders = {}
        try:
            step = _check_step(step)
            encoders[_shard_name(self.comm.rank)] = self._encode(shard, "shard")
            if nodes is not None:
                encoders[_nodes_name(self.comm.rank)] = self._encode(_check_nodes(nodes),
                                                                     "nodes")
            if self.comm.rank == 0 and shared is not None:
                encoders[SHARED] = self._encode(shared, "shared")
            if self.comm.rank == 0:
                self._clear_step(step)
        except Exception as exc:  # raised below on every rank, not just here
            error = exc
        self.comm.raise_if_any(error)
        steps = self.comm.allgather(step)
        if len(set(steps)) > 1:
            raise ValueError(f"save() was called with different steps on different ranks: "
                             f"{steps}")
        return step, encoders

    @staticmethod
    def _encode(state, root):
        encoder = _Encoder()
        encoder.tree = encoder.encode(state, root)
        return encoder

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
        else:
            shutil.rmtree(step_dir)
        _fsync_directory(self.directory)

    def _write(self, pending, step_dir, jobs, threads=1):
        """Write this rank's files (background thread, or the caller's with blocking=True).

        On rank 0 it first commits the previous save (`save` gathered its records). Never
        calls MPI; any error is kept for `wait` to raise on every rank.
        """
        if pending.commit is not None:
            try:
                self._commit(*pending.commit)
                self._delete(self._retire(pending.commit[0], busy=pending.step))
            except BaseException as exc:
                if hasattr(exc, "add_note"):
                    exc.add_note(f"while committing checkpoint step {pending.commit[0]} in "
                                 f"{self.directory}")
                pending.error = exc
                return
        try:
            os.makedirs(step_dir, exist_ok=True)
            for name, (encoder, staged) in jobs.items():
                chunks = [np.frombuffer(_prefix(encoder.tree, encoder.size), np.uint8)]
                chunks += [staged] if staged is not None else list(encoder.segments())
                pending.records[name] = _write_atomic(os.path.join(step_dir, name), chunks,
                                                      threads)
        except BaseException as exc:  # an uncaught error in a thread would end the job
            pending.error = exc

    @property
    def writing(self):
        """Whether a background thread still writes a save's files or deletes old checkpoints
        (the next `wait`, `save` or `load` would wait for it)."""
        pending, pruning = self._pending, self._pruning
        return (pending is not None and pending.thread is not None
                and not pending.thread.is_set() or pruning is not None and not pruning.is_set())

    def _join(self):
        self._join_pruning()
        pending, self._pending = self._pending, None
        if pending is not None and pending.thread is not None:
            pending.thread.wait()
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
        collected = self._collect()
        if collected is None:
            return None
        error = None
        if self.comm.rank == 0:
            try:
                self._commit(*collected)
            except Exception as exc:
                error = exc
        error = self.comm.bcast(error)
        if error is not None:  # every rank holds rank 0's error
            raise error
        if self.comm.rank == 0:
            self._start_pruning(collected[0])
        return collected[0]

    def _collect(self):
        """Wait for the pending save's files (collective): raise what failed on any rank, else
        ``(step, every rank's file records)`` (the records on rank 0 only); None if no save
        is pending."""
        pending = self._join()
        if pending is None:
            return None
        error = pending.error
        if error is not None and hasattr(error, "add_note"):
            error.add_note(f"while saving checkpoint step {pending.step} to {self.directory} "
                           f"on rank {self.comm.rank}")
        self.comm.raise_if_any(error)
        return pending.step, self.comm.gather(pending.records)

    def _commit_now(self, collected):
        """Commit a collected save here and now (rank 0; others have nothing to do), when the
        save that was to commit it fails."""
        if self.comm.rank != 0:
            return
        try:
            self._commit(*collected)
        except Exception as exc:
            warnings.warn(f"could not commit checkpoint step {collected[0]} in "
                          f"{self.directory}: {exc}", stacklevel=3)
            return
        self._start_pruning(collected[0])

    def _commit(self, step, records):
        """Write the manifest (rank 0): the checkpoint exists from here on."""
        step_dir = os.path.join(self.directory, _step_name(step))
        files, nodes = {}, []
        for rank, record in enumerate(records):
            files.update(record)
            nodes.append(_nodes_name(rank) in record)
        manifest = {"format": FORMAT, "version": VERSION, "step": step, "ranks": len(records),
                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "fingerprint": self.fingerprint, "files": files,
                    "has_shared": SHARED in files, "has_nodes": nodes}
        manifest["checksum"] = _manifest_checksum(manifest)
        _write_json(os.path.join(step_dir, MANIFEST), manifest)
        _fsync_directory(self.directory)

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
                # The manifest goes first: a half-deleted checkpoint is no checkpoint.
                if os.path.exists(manifest):
                    os.unlink(manifest)
                    _fsync_directory(path)
            except OSError as exc:
                warnings.warn(f"could not delete old checkpoint {path}: {exc}", stacklevel=3)
            self._damaged.discard(step)
        return doomed

    def _delete(self, doomed):
        for _, path in doomed:
            try:
                shutil.rmtree(path)
            except OSError as exc:
                warnings.warn(f"could not delete old checkpoint {path}: {exc}", stacklevel=2)
        if doomed:
            _fsync_directory(self.directory)

    def _join_pruning(self):
        if self._pruning is not None:
            self._pruning.wait()
            self._pruning = None

    def _background(self, function, *args):
        """Run ``function(*args)`` in this checkpointer's background thread, after the work
        queued before; returns an event set when it is done. One long-lived thread, not one
        per save: starting a thread waits for it to be scheduled, a stall on busy cores."""
        if self._worker is None or not self._worker.is_alive():
            self._queue = queue.SimpleQueue()
            self._worker = threading.Thread(target=_serve, args=(self._queue,),
                                            name="checkpoint-writer", daemon=True)
            self._worker.start()
        done = threading.Event()
        self._queue.put((function, args, done))
        return done

    def _doomed(self, newest):
        """``[(step, path)]`` of what the ``keep`` newest good checkpoints make obsolete."""
        dirs = self._step_dirs()
        committed = sorted(s for s, p in dirs.items() if os.path.isfile(os.path.join(p, MANIFEST)))
        good = [s for s in committed if s not in self._damaged]
        doomed = [s for s in dirs if s < newest and s not in committed]  # failed saves
        if self.keep is not None and len(good) > self.keep:
            oldest_kept = good[-self.keep]
            doomed += [s for s in committed if s < oldest_kept]
        return [(step, dirs[step]) for step in sorted(doomed)]

    def close(self):
        """Commit the pending save (collective), and free the staging buffer and the
        background thread."""
        try:
            self.wait()
        finally:
            self._join_pruning()
            self._staging = None
            if self._worker is not None:
                self._queue.put(None)
                self._worker = self._queue = None

    # ------------------------------------------------------------ loading
    def load(self, step=None, node_ids=None):
        """Load the newest checkpoint that verifies on every rank, or ``step`` (collective).

        Every file read is checked against the sizes and SHA-256 checksums of its manifest. A
        newest checkpoint that is torn (no manifest), truncated, corrupt or missing a file on
        any rank is reported with a warning and the next older one tried, the same one on
        every rank.

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
        if step is not None:
            step = _check_step(step)
        if node_ids is not None:
            node_ids = _as_ids(node_ids, "node_ids")
        comm = self.comm
        dirs = comm.bcast(self._step_dirs() if comm.rank == 0 else None)
        candidates = sorted(dirs, reverse=True)
        if step is not None:
            if step not in dirs:
                raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}")
            candidates = [step]
        if not candidates:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        problems = []
        for candidate in candidates:
            problem, error, result = None, None, None
            try:
                result = self._read(candidate, dirs[candidate], node_ids)
            except _Damaged as exc:
                problem = str(exc)
            except Exception as exc:
                error = exc
            comm.raise_if_any(error)
            reports = comm.allgather(problem)
            bad = [(rank, p) for rank, p in enumerate(reports) if p is not None]
            if not bad:
                for damaged, what in problems:
                    warnings.warn(f"checkpoint step {damaged} in {self.directory} is damaged: "
                                  f"{what}; loading step {candidate} instead", stacklevel=2)
                return result
            problems.append((candidate, "; ".join(p if comm.size == 1 else f"rank {r}: {p}"
                                                  for r, p in bad)))
            if os.path.isfile(os.path.join(dirs[candidate], MANIFEST)):
                self._damaged.add(candidate)
        raise ValueError(f"no usable checkpoint in {self.directory}: "
                         + "; ".join(f"step {s}: {what}" for s, what in problems))

    def _read(self, step, step_dir, node_ids):
        manifest = _read_manifest(step_dir)
        mismatch = _fingerprint_mismatch(self.directory, manifest.get("fingerprint"),
                                         self.fingerprint, f"step {step}")
        if mismatch is not None:
            raise mismatch
        ranks, files = manifest["ranks"], manifest["files"]

        def state(name):
            if name not in files:
                raise _Damaged(f"{name} is not in the manifest")
            path = os.path.join(step_dir, name)
            return _parse(_read_verified(path, files[name], self.threads), name)

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
