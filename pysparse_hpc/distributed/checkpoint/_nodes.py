"""Per-node state: checked on save, gathered by global node id on load (so that a checkpoint
saved by P ranks loads under another number of ranks)."""
import sys

import numpy as np


def as_ids(ids, name):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise TypeError(f"{name} must be a 1-D array of integer node ids, got "
                        f"{ids.ndim}-D {ids.dtype}")
    if ids.dtype == np.uint64 and ids.size and ids.max() > np.iinfo(np.int64).max:
        # The cast below would wrap them round to negative ids, silently.
        raise ValueError(f"{name} holds ids beyond int64 (up to {int(ids.max())})")
    return ids.astype(np.int64, copy=False)


def check_nodes(nodes):
    """``nodes`` with its ids as int64, after checking its shape; raises TypeError/ValueError."""
    if not isinstance(nodes, dict) or "node_ids" not in nodes:
        raise TypeError("nodes must be a dict holding 'node_ids' (the global ids of this "
                        "rank's nodes) and arrays with one row per node")
    ids = as_ids(nodes["node_ids"], "nodes['node_ids']")
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


def node_id_extent(nodes):
    """What checking the ids over the ranks needs: None without per-node state, else
    ``(number of ids, smallest id, largest id)`` of a `check_nodes` result (the last two None
    without ids)."""
    if nodes is None:
        return None
    ids = nodes["node_ids"]
    if not ids.size:
        return 0, None, None
    return int(ids.size), int(ids.min()), int(ids.max())


def _arrays_layout(nodes):
    """What every rank's per-node state must share for `gather_node_rows`: each array's name,
    dtype and row shape (entries for `Communicator.check_alike`)."""
    if nodes is None:
        return (("no per-node state",),)
    return tuple((f"per-node array {name!r}", str(rows.dtype), "rows", tuple(rows.shape[1:]))
                 for name, rows in sorted(nodes.items()) if name != "node_ids") \
        or (("per-node node_ids only",),)


def check_parts_agree(comm, nodes, extents):
    """Raise the same ValueError on every rank where the per-node state the ranks save could
    not be gathered by node id later (`gather_node_rows`): unlike names, dtypes or row shapes,
    per-node state on some ranks only, or an id on more than one rank.

    ``extents`` is every rank's `node_id_extent` (allgathered). The ids are checked by counting
    each over the ranks: a bitmap of the ids allreduced (one byte per id up to the largest)
    where the ids are dense, else rank 0 gathers them.
    """
    comm.check_alike(_arrays_layout(nodes), "the ranks save unlike per-node state, which "
                     "load() could not gather by node id",
                     "save the same names, dtypes and row shapes on every rank")
    total = sum(extent[0] for extent in extents if extent is not None)
    if total == 0:
        return
    smallest = min(extent[1] for extent in extents if extent[0])
    largest = max(extent[2] for extent in extents if extent[0])
    ids = nodes["node_ids"]
    if smallest >= 0 and largest < 4 * total + 4096:
        counts = np.zeros(largest + 1, np.uint8 if comm.size < 256 else np.uint32)
        counts[ids] = 1
        comm.Allreduce(counts, kind="setup")
        shared = np.flatnonzero(counts > 1)[:5]
    else:   # sparse ids: a bitmap would be mostly zeros
        parts = comm.gather(ids, root=0)
        shared = None
        if comm.rank == 0:
            every = np.concatenate(parts)
            unique, seen = np.unique(every, return_counts=True)
            shared = unique[seen > 1][:5]
        shared = comm.bcast(shared, root=0)
    if shared.size:
        from .._comm import raising_alike   # as the checkpointer: _comm only when distributed
        with raising_alike():   # every rank holds the same counts
            raise ValueError(f"node {', '.join(map(str, shared.tolist()))} "
                             f"{'is' if shared.size == 1 else 'are'} saved by more than one "
                             f"rank; each node's rows must be saved by one rank (its owner), "
                             f"so that load() can gather them by node id")


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
        ``{"node_ids": node_ids as int64, name: rows}``: NumPy arrays or tensors as saved
        (tensors new leaves, Parameters where the parts' are, with their ``requires_grad``).

    Raises
    ------
    ValueError
        An id is in no part, or in more than one.
    """
    ids = as_ids(node_ids, "node_ids")
    parts = [p for p in parts if p is not None]
    torch = sys.modules.get("torch")
    found = np.zeros(ids.size, bool)
    names = None
    kinds = {}  # name: (a Parameter, requires_grad) of the tensors gathered, as saved
    result = {"node_ids": ids}
    for index, part in enumerate(parts):
        part_names = sorted(k for k in part if k != "node_ids")
        if names is None:
            names = part_names
        elif part_names != names:
            raise ValueError(f"the parts hold different per-node arrays: {names} and "
                             f"{part_names}")
        part_ids = as_ids(part["node_ids"], "node_ids of a part")
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
                # Outside autograd: rows saved with requires_grad would make the result a
                # non-leaf with a grad_fn, which no optimizer takes; it is made a leaf below.
                with torch.no_grad():
                    out[torch.from_numpy(target)] = rows[torch.from_numpy(source)]
                kinds[name] = (isinstance(rows, torch.nn.Parameter), rows.requires_grad)
            else:
                out[target] = rows[source]
    if not found.all():
        missing = ids[~found]
        raise ValueError(f"{missing.size} of the {ids.size} node ids are in no part, e.g. "
                         f"{missing[:5].tolist()}")
    for name, (parameter, grad) in kinds.items():
        result[name] = (torch.nn.Parameter(result[name], requires_grad=grad) if parameter
                        else result[name].requires_grad_(grad))
    return result
