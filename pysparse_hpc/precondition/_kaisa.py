"""KAISA's distribution of a gradient maker over the ranks of a communicator.

This module owns the collectives a maker needs when each rank holds part of the batch (or of a
distributed graph): summing tensors over the ranks in one flat buffer per dtype (the gradients
once per step, the new curvature on curvature steps), the greedy assignment of every module's
inversion to one owner rank (largest cost first, to the least loaded rank), and the broadcast
of what the owners computed. KAISA's two ends of its memory/communication trade-off are the
``strategy`` of the natural-gradient makers:

- ``"inverse"``: owners invert and broadcast the inverses; every rank preconditions every
  module (more memory, one broadcast per inversion);
- ``"gradient"``: owners invert and precondition their own modules and broadcast the
  preconditioned gradients (inverses stay on their owner; one broadcast per step).

The sums are plain sums: a loss divided by the global ``data_size`` on every rank gives, summed,
the one-process gradient and curvature.
"""
import torch

from ..distributed._flat import by_dtype, copy_out, flatten

__all__ = ["STRATEGIES", "allreduce_sum", "assign_owners", "broadcast_from_owners"]

STRATEGIES = ("inverse", "gradient")


def allreduce_sum(comm, tensors, kind):
    """Sum ``tensors`` (CPU, the same shapes in the same order on every rank) over the ranks, in
    place, through one flat buffer per dtype."""
    for group in by_dtype(tensors).values():
        flat = flatten(group)
        comm.Allreduce(flat, kind=kind)
        copy_out(flat, group)


def assign_owners(costs, size):
    """Name -> owner rank: the costliest first, each to the rank with the least cost so far
    (ties to the lower rank), as KAISA's greedy placement."""
    load = [0.0] * size
    owners = {}
    for name in sorted(costs, key=lambda n: (-costs[n], list(costs).index(n))):
        rank = min(range(size), key=lambda r: (load[r], r))
        owners[name] = rank
        load[rank] += costs[name]
    return {name: owners[name] for name in costs}


def broadcast_from_owners(comm, owners, tensors_of, store, kind):
    """For every rank in turn, its owned names' tensors to every other rank.

    ``tensors_of(name)`` gives the owner's dict of key -> tensor (any keys: the layout travels
    first); ``store(name, entries)`` receives them on the other ranks.
    """
    for root in range(comm.size):
        names = [name for name, owner in owners.items() if owner == root]
        if not names:
            continue
        if comm.rank == root:
            payload = [(name, key, tensor) for name in names
                       for key, tensor in tensors_of(name).items()]
            layout = [(name, key, tuple(t.shape), t.dtype) for name, key, t in payload]
        layout = comm.bcast(layout if comm.rank == root else None, root=root)
        if comm.rank == root:
            tensors = [tensor.contiguous() for _, _, tensor in payload]
        else:
            tensors = [torch.empty(shape, dtype=dtype) for _, _, shape, dtype in layout]
        for group in by_dtype(tensors).values():
            flat = (flatten(group) if comm.rank == root
                    else torch.empty(sum(t.numel() for t in group), dtype=group[0].dtype))
            comm.Bcast(flat, root=root, kind=kind)
            if comm.rank != root:
                copy_out(flat, group)
        if comm.rank != root:
            entries = {}
            for (name, key, _, _), tensor in zip(layout, tensors):
                entries.setdefault(name, {})[key] = tensor
            for name in names:
                store(name, entries.get(name, {}))
