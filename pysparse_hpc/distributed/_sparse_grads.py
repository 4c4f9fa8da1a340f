"""Summing sparse gradients over the ranks (``nn.Embedding(sparse=True)``'s).

Which parameters get sparse gradients is read from the model (an ``Embedding`` or
``EmbeddingBag`` built with ``sparse=True``), not from the gradients a backward left: a rank
whose batch never reached the table has no gradient at all, and every rank must still take
part in the same collectives.

The sum is formed densely (the whole table, plus one flag per row, in one allreduce) and made
sparse again over the rows some rank looked up: the layout one process's backward gives for
the whole batch, explicit zeros included, which is what optimizers for sparse gradients
(``torch.optim.SparseAdam``) expect.
"""
import torch
from torch import nn

__all__ = ["allreduce_sparse", "sparse_gradient_parameters"]


def sparse_gradient_parameters(model):
    """The ids of `model`'s parameters whose gradients are sparse tensors."""
    return {id(module.weight) for module in model.modules()
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse}


def allreduce_sparse(comm, param, kind="allreduce", produced=True):
    """The sum over the ranks of ``param.grad`` (sparse COO with one sparse dimension, or None
    where this rank has none), as a coalesced sparse tensor; None where no rank has one.
    ``produced=False`` contributes nothing from this rank, whatever ``param.grad`` holds."""
    grad = param.grad if produced else None
    rows = torch.zeros(param.shape[0], dtype=param.dtype)
    if grad is None:
        dense = torch.zeros_like(param)
    else:
        grad = grad.coalesce()
        dense = grad.to_dense()
        rows[grad.indices()[0]] = 1
    flat = torch.cat([dense.reshape(-1), rows, torch.ones(1, dtype=param.dtype)
                      if grad is not None else torch.zeros(1, dtype=param.dtype)])
    comm.Allreduce(flat, kind=kind)
    if flat[-1] == 0:
        return None
    dense = flat[:dense.numel()].view_as(dense)
    present = flat[dense.numel():-1].nonzero().T
    # nonzero() lists each row once, in order: coalesced by construction.
    return torch.sparse_coo_tensor(present, dense[present[0]], param.shape,
                                   check_invariants=False, is_coalesced=True)
