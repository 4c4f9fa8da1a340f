"""One flat buffer per dtype: how the collectives move many tensors at once.

A single concatenation would promote every tensor to the widest dtype (one float64 parameter
sent a float32 model's gradients at 8 bytes each), so tensors are grouped by dtype, in the
order of first appearance, which is the same on every rank when their tensors are alike.
"""
import torch

__all__ = ["by_dtype", "flatten", "pieces", "copy_out"]


def by_dtype(tensors):
    """``{dtype: [tensor, ...]}`` of ``tensors``, each list in the given order."""
    groups = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor)
    return groups


def flatten(tensors, out=None):
    """``tensors`` (of one dtype) concatenated into one 1-D tensor, written into ``out`` when
    given (a buffer kept from step to step)."""
    return torch.cat([tensor.reshape(-1) for tensor in tensors], out=out)


def pieces(flat, tensors):
    """Views of ``flat`` shaped as each of ``tensors``, in order: what `flatten` put there."""
    start = 0
    for tensor in tensors:
        yield flat[start:start + tensor.numel()].view_as(tensor)
        start += tensor.numel()


def copy_out(flat, tensors):
    """Write ``flat``'s pieces back into ``tensors``, in place."""
    for tensor, piece in zip(tensors, pieces(flat, tensors)):
        tensor.copy_(piece)
