"""Autograd over a `pysparse_hpc.distributed.DistGraph`: the halo exchange and its reverse.

A rank's rows of ``A @ X`` need X's rows of its halo. `halo_rows` appends them to the owned rows
(forward: the halo exchange) and, in backward, sends the gradient of the halo rows back to their
owners, who add it to their own (the reverse exchange). With it every single-process op runs
unchanged on the rank's local matrix, whose columns are the owned nodes then the halo. The
fixed-value SpMM of GCN has its own Function that overlaps both exchanges with the product over
the owned columns. Both are linear, and each backward is a Function whose backward is the
forward one again, so gradients of gradients are exact on a distributed graph too.
"""
import torch

from . import _backend, _graph

__all__ = ["halo_rows", "spmm_fixed", "check_local_rows"]


def check_local_rows(graph, tensor, name):
    """``tensor`` must be a CPU tensor with one row per owned node of this rank."""
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} is on {tensor.device}; distributed graphs exchange host "
                         "memory, so their operands must be CPU tensors")
    if tensor.shape[0] != graph.n_local:
        raise ValueError(f"{name} has {tensor.shape[0]} rows but rank {graph.comm.rank} owns "
                         f"{graph.n_local} nodes of the distributed graph (pass the owned rows:"
                         " graph.local_rows(x) or graph.scatter_rows(x))")


def _local_array(tensor):
    return tensor.detach().contiguous().numpy()


class _HaloRows(torch.autograd.Function):
    """``[x; x_halo]``. Linear in x: its backward is `_HaloRowsAdjoint`, whose backward is this
    Function again, so a second derivative (a gradient penalty) is exact and not cut short."""

    @staticmethod
    def forward(x, graph):
        halo = torch.from_numpy(graph.halo_exchange(_local_array(x)))
        return torch.cat([x.detach(), halo])

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.graph = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return _HaloRowsAdjoint.apply(grad, ctx.graph), None


class _HaloRowsAdjoint(torch.autograd.Function):
    """The owned rows of ``grad`` with its halo rows sent back and summed into their owners'."""

    @staticmethod
    def forward(grad, graph):
        grad = grad.detach().contiguous()
        add_into = graph.start_reverse_exchange(grad[graph.n_local:].numpy()).wait()
        return add_into(grad[:graph.n_local].clone())

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.graph = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return _HaloRows.apply(grad, ctx.graph), None


def halo_rows(graph, x):
    """``[x; x_halo]``: this rank's rows of ``x`` followed by its halo rows, differentiable
    (the gradient of the halo rows is summed into their owners' rows)."""
    return _HaloRows.apply(x, graph)


def _split(graph, dtype):
    """The local matrix split into its owned columns and its halo columns, in ``dtype``."""
    def build():
        local = _graph.with_dtype(graph.local, dtype)
        rows, cols, data = local.tocoo()
        own = cols < graph.n_local
        from .._csr import csr_array
        n = graph.n_local
        owned_part = csr_array((data[own], (rows[own], cols[own])), shape=(n, n))
        halo_part = csr_array((data[~own], (rows[~own], cols[~own] - n)),
                              shape=(n, graph.n_halo))
        return owned_part, halo_part
    return _graph.cached_on(graph, ("split", str(dtype)), build)


class _SpMMOverlapped(torch.autograd.Function):
    """``A @ X`` with A's own values: the product over the owned columns runs while the halo
    rows travel. Linear in X: its backward is `_SpMMOverlappedAdjoint`, and that one's is this
    Function, so second derivatives are exact, as the one-process product's are."""

    @staticmethod
    def forward(x, graph, parts):
        owned_part, halo_part = parts
        x = x.detach().contiguous()
        pending = graph.start_halo_exchange(x.numpy())
        y = _backend.spmm_fixed(owned_part, x)
        halo = pending.wait()
        if graph.n_halo:
            y += _backend.spmm_fixed(halo_part, torch.from_numpy(halo))
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        # The parts are those of the first forward pass all the way down: the derivatives
        # are of the matrix that pass read.
        ctx.graph, ctx.parts = inputs[1:]

    @staticmethod
    def backward(ctx, grad_y):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _SpMMOverlappedAdjoint.apply(grad_y, ctx.graph, ctx.parts), None, None


class _SpMMOverlappedAdjoint(torch.autograd.Function):
    """``A^T dY`` summed on the owners: ``A_halo^T dY`` is sent first and ``A_owned^T dY``
    computed while it travels."""

    @staticmethod
    def forward(grad_y, graph, parts):
        owned_part, halo_part = parts
        grad_y = grad_y.detach().contiguous()
        grad_halo = (_backend.spmm_fixed(_graph.transposed_like(halo_part), grad_y)
                     if graph.n_halo else grad_y.new_empty((0,) + grad_y.shape[1:]))
        pending = graph.start_reverse_exchange(grad_halo.contiguous().numpy())
        grad_x = _backend.spmm_fixed(_graph.transposed_like(owned_part), grad_y)
        add_into = pending.wait()
        return add_into(grad_x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.graph, ctx.parts = inputs[1:]

    @staticmethod
    def backward(ctx, grad_x):
        return _SpMMOverlapped.apply(grad_x, ctx.graph, ctx.parts), None, None


def spmm_fixed(graph, x):
    """``A @ X`` on a distributed graph with its own values, differentiable in X."""
    return _SpMMOverlapped.apply(x, graph, _split(graph, _backend.numpy_dtype(x)))
