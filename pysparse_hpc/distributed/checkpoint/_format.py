"""The file format of a checkpoint's state files.

A state file is `MAGIC`, the length of a JSON header (little-endian uint64), the header, and a
payload of raw array bytes (each array at an `ALIGN`-byte aligned offset). The header describes
the nested state (dicts, lists, tuples, plain values) with every tensor and array as a dtype, a
shape and a byte range of the payload: decoding runs no pickle, so a checkpoint from elsewhere
cannot run code, and arrays come back bit for bit.
"""
import json
import math
import re
import struct
import sys
from collections import OrderedDict

import numpy as np

MAGIC = b"PSHCKPT1"
FORMAT = "pysparse_hpc checkpoint"
VERSION = 1
ALIGN = 64
PLAIN = (type(None), bool, int, float, str)
#: What a dtype's name looks like: another torch's dtype is unreadable here, anything else is
#: damage.
_DTYPE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: The containers a checkpoint holds, exactly (their subclasses would load as these).
_CONTAINERS = (dict, OrderedDict, list, tuple)


class Damaged(Exception):
    """A checkpoint file that is missing, truncated, corrupt or unreadable (load falls back to
    an older checkpoint), as opposed to a usage error (raised)."""


class Unreadable(ValueError):
    """A whole checkpoint file (its checksums verified) that this environment cannot read: a
    torch dtype this torch lacks, torch missing. Raised, not fallen back from: an older
    checkpoint would be passed over for a fault of the reader, not of the file."""


class Encoder:
    """Walks a nested state, builds its JSON header tree and lays out its arrays.

    Arrays are only referenced here (``leaves``: ``(source, offset, nbytes)``); `stage` copies
    them into one buffer, `segments` hands them out as they are.
    """

    def __init__(self):
        self.leaves = []
        self.size = 0
        self._active = set()

    def _leaf(self, source, nbytes):
        offset = -(-self.size // ALIGN) * ALIGN
        self.leaves.append((source, offset, nbytes))
        self.size = offset + nbytes
        return offset

    def encode(self, value, path):
        kind = type(value)
        if kind in PLAIN:
            return value
        torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(value, path, torch)
        if isinstance(value, np.ndarray):
            if type(value) is not np.ndarray and not isinstance(value, np.memmap):
                # It would load as a plain ndarray: a masked array without its mask, a matrix
                # that multiplies element-wise.
                raise TypeError(f"{path} is a {kind.__module__}.{kind.__qualname__}, a NumPy "
                                "array subclass, which a checkpoint cannot hold (it would load "
                                "as a plain ndarray); save its arrays as plain ndarrays (for "
                                "a masked array, its .data and .mask)")
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
            if kind not in _CONTAINERS:
                # It would load as the plain container: a namedtuple without its field names,
                # a defaultdict without its default.
                plain = next(base for base in (dict, list, tuple) if isinstance(value, base))
                advice = {tuple: "a tuple, or a namedtuple's ._asdict()",
                          dict: "a dict (dict(value))", list: "a list (list(value))"}[plain]
                raise TypeError(f"{path} is a {kind.__module__}.{kind.__qualname__}, a "
                                f"subclass of {plain.__name__}, which a checkpoint cannot hold "
                                f"(it would load as a plain {plain.__name__}); save it as "
                                f"{advice}")
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
            if type(key) not in PLAIN and not isinstance(key, tuple):
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
        # A nested tensor has the strided layout but no single shape: its copy would fail
        # with torch's internal error, not this one naming its path.
        if (tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested
                or tensor.device.type == "meta"):
            kind = " (quantized)" if tensor.is_quantized else " (nested)" if tensor.is_nested \
                else ""
            raise TypeError(f"{path} is a {tensor.layout} tensor on {tensor.device}{kind}; a "
                            "checkpoint holds dense tensors with data (convert it with "
                            ".to_dense(), .dequantize() or .unbind())")
        nbytes = tensor.numel() * tensor.element_size()
        return {"$t": "tensor", "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape), "at": self._leaf(tensor, nbytes), "n": nbytes,
                "grad": bool(tensor.requires_grad),
                "param": isinstance(tensor, torch.nn.Parameter)}

    def stage(self, buffer):
        """Copy every array into ``buffer`` (uint8, at least `size` bytes) at its offset, and
        zeros into the alignment padding between them (the buffer is reused: the files of an
        asynchronous save are then byte for byte those of a blocking one)."""
        position = 0
        for source, offset, nbytes in self.leaves:
            buffer[position:offset] = 0
            position = offset + nbytes
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


def prefix(tree, payload_bytes):
    """The file's bytes before the payload: magic, header length, header, padding."""
    header = json.dumps({"format": FORMAT, "version": VERSION, "payload": payload_bytes,
                         "tree": tree}, separators=(",", ":")).encode()
    start = len(MAGIC) + 8 + len(header)
    padding = -(-start // ALIGN) * ALIGN - start
    return MAGIC + struct.pack("<Q", len(header)) + header + b" " * padding


class _Payload:
    """The payload and the end of the last array read from it. `Encoder` lays the arrays out
    in the order `decode` meets them, each at an `ALIGN`-aligned offset past the one before:
    a header whose ranges overlap (arrays that would share memory, one payload read as many
    copies) or go backwards was not written by it."""

    def __init__(self, payload):
        self.bytes, self.end = payload, 0

    def take(self, node):
        at, n = node["at"], node["n"]
        if type(at) is not int or type(n) is not int or at % ALIGN or n < 0:
            raise Damaged(f"an array's byte range {at!r}..+{n!r} is not an aligned range")
        if at < self.end or at + n > self.bytes.size:
            raise Damaged(f"an array's bytes {at}..{at + n} overlap another's or lie outside "
                          "the payload")
        self.end = at + n
        return self.bytes[at:at + n]


def _shape(node, itemsize, n):
    """The node's shape, checked against its ``n`` bytes (Python ints: no overflow)."""
    shape = node["shape"]
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
        raise Damaged(f"an array's shape {shape!r} is not a list of sizes")
    if math.prod(shape) * itemsize != n:
        raise Damaged(f"an array of shape {shape} and {itemsize}-byte items does not fill its "
                      f"{n} bytes")
    return shape


def _hashable(key):
    try:
        hash(key)
    except TypeError:
        return False
    return True


def decode(node, payload):
    """The value of header ``node`` (a `_Payload` holds the arrays' bytes)."""
    if isinstance(node, list):
        return [decode(v, payload) for v in node]
    if not isinstance(node, dict):
        if type(node) not in PLAIN:
            raise Damaged(f"the header holds {node!r}")
        return node
    tag = node["$t"]
    if tag in ("dict", "odict"):
        keys, values = node["k"], node["v"]
        if not isinstance(keys, list) or not isinstance(values, list) \
                or len(keys) != len(values):
            raise Damaged("a dict's keys and values do not pair up")
        result = {} if tag == "dict" else OrderedDict()
        for key, value in zip(keys, values):
            key = decode(key, payload)
            if not _hashable(key) or key in result:
                raise Damaged(f"a dict has the key {key!r} twice, or one it cannot hold")
            result[key] = decode(value, payload)
        if tag == "odict" and "meta" in node:
            result._metadata = decode(node["meta"], payload)
        return result
    if tag == "tuple":
        return tuple(decode(v, payload) for v in node["v"])
    if tag in ("ndarray", "npscalar", "bytes", "tensor"):
        raw = payload.take(node)
        if tag == "bytes":
            return raw.tobytes()
        if tag == "tensor":
            torch = _torch_to_read()
            dtype = _torch_dtype(torch, node["dtype"])
            if dtype in _quantized(torch):
                raise Damaged(f"a tensor of the quantized dtype {dtype}, which a checkpoint "
                              "does not hold")
            shape = _shape(node, torch.empty((), dtype=dtype).element_size(), raw.size)
            tensor = torch.from_numpy(raw).view(dtype).view(shape)
            if type(node["grad"]) is not bool or type(node["param"]) is not bool:
                raise Damaged("a tensor's grad and param flags are not bools")
            if node["param"]:
                return torch.nn.Parameter(tensor, requires_grad=node["grad"])
            return tensor.requires_grad_(node["grad"])
        dtype = np.lib.format.descr_to_dtype(_tuples(node["dtype"]))
        if dtype.hasobject:
            raise Damaged(f"an array of dtype {dtype}, which holds Python objects")
        shape = _shape(node, dtype.itemsize, raw.size)
        if tag == "npscalar" and shape:
            raise Damaged(f"a NumPy scalar of shape {shape}")
        array = raw.view(dtype).reshape(shape)
        code_points = raw.view(">u4" if dtype.byteorder == ">" else "<u4") \
            if dtype.kind == "U" and raw.size else None
        if code_points is not None and code_points.max() > 0x10FFFF:
            raise Damaged("a string array holds a code point past Unicode's")
        return array[()] if tag == "npscalar" else array
    torch = _torch_to_read()
    if tag == "torch.dtype":
        return _torch_dtype(torch, node["v"])
    if tag == "torch.Size":
        sizes = node["v"]
        if not isinstance(sizes, list) or any(type(d) is not int or not 0 <= d < 2 ** 63
                                              for d in sizes):
            raise Damaged(f"a torch.Size of {sizes!r}")
        return torch.Size(sizes)
    if tag == "torch.device":
        return torch.device(node["v"])
    raise Damaged(f"unknown entry {tag!r} in the header")


def _quantized(torch):
    return {getattr(torch, name) for name in ("qint8", "quint8", "qint32", "quint4x2",
                                              "quint2x4") if hasattr(torch, name)}


def _torch_to_read():
    try:
        return _torch()
    except ImportError:
        raise Unreadable("holds torch values, and torch cannot be imported here") from None


def _torch_dtype(torch, name):
    # From the module's names as they are: getattr would import a lazy submodule of that name.
    dtype = torch.__dict__.get(name) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        if not isinstance(name, str) or not _DTYPE_NAME.match(name) or name in torch.__dict__:
            raise Damaged(f"a tensor's dtype {name!r} is no torch dtype's name")
        raise Unreadable(f"holds a tensor of dtype torch.{name}, which torch "
                         f"{torch.__version__} here does not have (it was saved by another "
                         "version)")
    return dtype


def _tuples(descr):
    """A NumPy dtype descriptor read back from JSON, which turned its tuples into lists: a
    structured one's fields ``(name, dtype[, shape])``, titled names ``(title, name)`` and
    sub-array shapes."""
    if not isinstance(descr, list):
        return descr
    return [(tuple(name) if isinstance(name, list) else name, _tuples(dtype),
             *(tuple(shape) for shape in subarray))
            for name, dtype, *subarray in descr]


def parse(buffer, name):
    """The state held by a verified file's bytes."""
    try:
        if buffer[:len(MAGIC)].tobytes() != MAGIC:
            raise Damaged(f"{name} is not a checkpoint file (wrong magic bytes)")
        (length,) = struct.unpack("<Q", buffer[len(MAGIC):len(MAGIC) + 8].tobytes())
        start = len(MAGIC) + 8
        # Strictly UTF-8, as written: json.loads would guess UTF-16 from bytes.
        header = json.loads(buffer[start:start + length].tobytes().decode("utf-8"))
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise Damaged(f"{name} has format {header.get('format')!r} version "
                          f"{header.get('version')!r}, not {FORMAT!r} version {VERSION}")
        begin = -(-(start + length) // ALIGN) * ALIGN
        size = header["payload"]
        if type(size) is not int or size < 0 or begin + size != buffer.size:
            raise Damaged(f"{name} has {buffer.size - begin} bytes of payload where its header "
                          f"says {size!r}")
        return decode(header["tree"], _Payload(buffer[begin:]))
    except Damaged as exc:
        if str(exc).startswith(name):
            raise
        raise Damaged(f"{name}: {exc}") from None
    except Unreadable as exc:
        raise Unreadable(f"{name} {exc}") from None
    except MemoryError:
        raise  # no room to decode here: no fault of the file
    except Exception as exc:  # a file that passed its checksum but was written wrong
        raise Damaged(f"{name} cannot be decoded ({type(exc).__name__}: {exc})") from None
