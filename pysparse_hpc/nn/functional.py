"""Sparse operations on torch tensors with autograd: SpMM, SDDMM and attention softmax.

The adjacency is a pysparse_hpc sparse array (CSR, ME-BCRS or blocked). Per-edge tensors
(``values``, SDDMM results, attention scores and probabilities) are aligned with the storage
order of its canonical CSR form, ``pattern(adj)``: row by row, columns ascending, duplicates
summed. What the backward passes need from the graph (the transpose, and where each of its
entries comes from) is built on first use and kept on the adjacency.

Gradients (docs/gnn.rst): for ``Y = A @ X``, ``dX = A^T @ dY`` and, for per-edge values
that require grad, ``dA_ij = <dY_i, X_j>`` (an SDDMM); for ``s = SDDMM(A; X, Y)``,
``dX = S @ Y`` and ``dY = S^T @ X`` with S holding ``ds`` on A's pattern.

A backward pass reads the adjacency again: one whose pattern (or, for `spmm` with its own values,
its values) was changed after the forward pass raises, as torch does for its own tensors.

Second derivatives (``create_graph=True``: gradient penalties, Hessian-vector products):
`spmm` with A's own values and `dropout` are linear, and their backward passes run through
the same operations, so they differentiate as often as asked (a GCN does). The other
operations are once-differentiable: differentiating their gradient raises a ``RuntimeError``
rather than silently dropping the second-order term.
"""
import functools

import numpy as np
import torch

from .._base import sparray
from .._sputils import as_index_array, described_sparse
from ..distributed.graph import DistGraph
from . import _backend, _distributed, _graph
from ._checks import check_negative_slope

__all__ = ["spmm", "sddmm", "edge_softmax", "gat_attention", "dropout", "pattern", "row_ids",
           "GAT_KEEP"]

#: What `gat_attention` keeps for the backward pass: the probabilities and the LeakyReLU sign
#: mask (nothing recomputed), or only its inputs (the softmax recomputed in backward).
GAT_KEEP = ("alpha", "scores")

_FLOAT_DTYPES = (torch.float32, torch.float64)


def _check_adj(adj):
    if not isinstance(adj, (sparray, DistGraph)):
        raise TypeError(f"adj must be a pysparse_hpc sparse array or DistGraph, got "
                        f"{described_sparse(adj)}")


def _check_tensor(t, name, ndims=(2,)):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {t.layout}")
    if t.ndim not in ndims:
        expected = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{name} must be {expected}, got shape {tuple(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        # a meta tensor was sent to the CUDA backend ("needs a CUDA GPU"), or through torch
        # operations that returned a meta result without running a kernel
        raise ValueError(f"{name} is on device '{t.device}'; the kernels take CPU or CUDA "
                         "tensors (move it with .cpu())")


def _check_same(reference, name_ref, other, name):
    if other.dtype != reference.dtype:
        raise TypeError(f"{name} has dtype {other.dtype} but {name_ref} has {reference.dtype}")
    if other.device != reference.device:
        raise ValueError(f"{name} is on {other.device} but {name_ref} is on {reference.device}")


def _check_edge_tensor(values, name, csr, heads=None):
    expected = (csr.nnz,) if heads is None else (csr.nnz, heads)
    if tuple(values.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} (one entry per stored edge of the "
                         f"canonical pattern{'' if heads is None else ', per head'}), got "
                         f"{tuple(values.shape)}")


def _public_operation(function):
    """A public operation: run eagerly under ``torch.compile`` (a graph break: Dynamo cannot
    trace the Numba dispatch of its kernels, and failed on a first call in a process), with
    each graph array's checksum taken once per call (`_graph.graphs_unchanged`)."""
    return torch.compiler.disable(_graph.checked_once(function))


def _vmap_slice_by_slice(function, info, in_dims, args):
    """A ``vmap`` rule for ``function``: applied to each slice of the batch, the results
    stacked along a new first dimension. The Numba kernels read plain tensors only, so the
    batch cannot reach them whole."""
    if info.batch_size == 0:
        # One slice of zeros, for the outputs' shapes and dtypes: an empty batch of each.
        zeros = [arg if dim is None else arg.new_zeros(arg.shape[:dim] + arg.shape[dim + 1:])
                 for arg, dim in zip(args, in_dims)]
        result = function.apply(*zeros)
        outputs = result if isinstance(result, tuple) else (result,)
        empty = tuple(out.new_empty((0, *out.shape)) if isinstance(out, torch.Tensor) else None
                      for out in outputs)
        dims = tuple(None if out is None else 0 for out in empty)
        return (empty, dims) if isinstance(result, tuple) else (empty[0], 0)
    results = []
    for index in range(info.batch_size):
        sliced = [arg if dim is None else arg.select(dim, index)
                  for arg, dim in zip(args, in_dims)]
        results.append(function.apply(*sliced))
    if not isinstance(results[0], tuple):
        return torch.stack(results), 0
    stacked = tuple(None if not isinstance(first, torch.Tensor)
                    else torch.stack([result[position] for result in results])
                    for position, first in enumerate(results[0]))
    return stacked, tuple(None if out is None else 0 for out in stacked)


class _OnceDifferentiableStep(torch.autograd.Function):
    """The numeric backward of a once-differentiable operation, run as the forward of this
    Function, whose own backward raises.

    Its inputs are the incoming gradients and the saved tensors themselves, so any second
    derivative through the operation reaches the error, whichever inputs are asked for. And a
    Function's forward gets plain tensors under the ``torch.func`` transforms, which is what
    the Numba kernels read."""

    @staticmethod
    def forward(name, compute, *tensors):
        return compute(*tensors)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.name = inputs[0]

    @staticmethod
    def vmap(info, in_dims, *args):
        return _vmap_slice_by_slice(_OnceDifferentiableStep, info, in_dims, args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"pysparse_hpc.nn.functional: cannot differentiate twice through "
                           f"{ctx.name}, which is once-differentiable: take the gradient without "
                           "create_graph=True (or a single torch.func.grad), or compute the "
                           "second derivative another way (finite differences of the gradient, "
                           "or a dense reference)")


def _once_differentiable(name):
    """``torch.autograd.function.once_differentiable`` that cannot be bypassed, for the backward
    of operation ``name``, written as ``backward(ctx, saved_tensors, *grad_outputs)``.

    Torch's hangs its error on fresh leaves, so ``torch.autograd.grad(..., inputs=[...])``
    never reaches it and returns a second derivative without this operation's term. Here the
    backward runs inside `_OnceDifferentiableStep`, on the incoming gradients and the saved
    tensors.
    """
    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grad_outputs):
            def compute(*tensors):
                with torch.no_grad(), _graph.graphs_unchanged():
                    _check_pattern_unchanged(ctx, name)
                    return backward(ctx, tensors[len(grad_outputs):],
                                    *tensors[:len(grad_outputs)])
            if not torch.is_grad_enabled():
                # No create_graph, and no torch.func transform (which differentiates with
                # create_graph): plain tensors that nothing will differentiate again.
                return compute(*grad_outputs, *ctx.saved_tensors)
            return _OnceDifferentiableStep.apply(name, compute, *grad_outputs,
                                                 *ctx.saved_tensors)
        return wrapper
    return decorate


def _pattern_state(csr):
    """``csr``'s index arrays, each with its checksum: what the backward pass of an operation on
    its pattern compares with what it then finds (`_check_pattern_unchanged`). The checksum is
    `_graph`'s, taken once per array in one call of the library's code, which the lookups of
    what is kept on ``csr`` (its transpose) share."""
    return tuple((array, _graph._checksum(array)) for array in (csr.indptr, csr.indices))


def _check_pattern_unchanged(ctx, name):
    """Raise when the pattern ``ctx.csr`` held at the forward pass has since been written in
    place or had an index array rebound: the backward pass reads it again (the row bounds, the
    transpose), and would return the gradient of an operation on another graph. Its values
    are not compared: the per-edge operations read only the pattern."""
    csr = ctx.csr
    for (array, total), now in zip(ctx.pattern_state, (csr.indptr, csr.indices)):
        if now is not array or _graph._checksum(now) != total:
            raise RuntimeError(f"the pattern of the sparse array of {name} was changed (its "
                               "indptr or indices written in place, or rebound) after the "
                               "forward pass and before this backward, which would then not "
                               "be the gradient of the output: change it before the forward "
                               "pass or after the backward")


class _SpMMFixed(torch.autograd.Function):
    """``Y = A @ X`` with A's own (constant) values."""

    @staticmethod
    def forward(x, adj):
        return _backend.spmm_fixed(adj, x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        # The backward reads adj's values again (through its transpose); the token tells it
        # whether they are still those the forward read, as torch's version counters do.
        adj = inputs[1]
        ctx.adj, ctx.adj_token = adj, _graph.values_token(adj)

    @staticmethod
    def vmap(info, in_dims, x, adj):
        # The batch joins the feature columns: one product, however large the batch.
        x = x.movedim(in_dims[0], 1)
        batched = _SpMMFixed.apply(x.reshape(x.shape[0], -1), adj)
        return batched.view(batched.shape[0], *x.shape[1:]), 1

    @staticmethod
    @_graph.checked_once   # the token and the transpose read the same arrays
    def backward(ctx, grad_y):
        if not ctx.needs_input_grad[0]:
            return None, None
        if _graph.values_token(ctx.adj) is not ctx.adj_token:
            raise RuntimeError("the sparse array of a product was changed (its values or "
                               "pattern written in place, or an array rebound) after the "
                               "forward pass and before this backward, which would then not "
                               "be the gradient of the output: change it before the forward "
                               "pass or after the backward")
        # Through this Function again, so a gradient of the gradient (create_graph=True: a
        # gradient penalty, a Hessian-vector product) is exact: the product is linear in X.
        return _SpMMFixed.apply(grad_y, _graph.transposed_like(ctx.adj)), None


def _spmm_transposed(csr, edge_values, dense):
    """``A^T @ dense`` where A has ``csr``'s pattern and ``edge_values`` in its entry order: the
    backward of both products, through the transpose kept on ``csr``."""
    transposed = _graph.transpose(csr)
    return _backend.spmm_values(transposed.matrix,
                                edge_values[transposed.torch_order(edge_values.device)], dense)


class _SpMMValues(torch.autograd.Function):
    """``Y = A @ X`` with per-edge ``values`` (nnz,) or (nnz, heads) on A's pattern."""

    @staticmethod
    def forward(values, x, csr):
        return _backend.spmm_values(csr, values, x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        values, x, csr = inputs
        ctx.csr, ctx.pattern_state = csr, _pattern_state(csr)
        ctx.save_for_backward(values, x)

    @staticmethod
    def vmap(info, in_dims, *args):
        return _vmap_slice_by_slice(_SpMMValues, info, in_dims, args)

    @staticmethod
    @_once_differentiable("spmm with per-edge values")
    def backward(ctx, saved, grad_y):
        values, x = saved
        grad_values = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_x = _spmm_transposed(ctx.csr, values.detach(), grad_y)
        if ctx.needs_input_grad[0]:
            grad_values = _backend.sddmm_values(ctx.csr, grad_y, x)
        return grad_values, grad_x, None


class _SDDMM(torch.autograd.Function):
    """``s_ij = <X_i, Y_j>`` on A's pattern."""

    @staticmethod
    def forward(x, y, csr):
        return _backend.sddmm_values(csr, x, y)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, csr = inputs
        ctx.csr, ctx.pattern_state = csr, _pattern_state(csr)
        ctx.save_for_backward(x, y)

    @staticmethod
    def vmap(info, in_dims, *args):
        return _vmap_slice_by_slice(_SDDMM, info, in_dims, args)

    @staticmethod
    @_once_differentiable("sddmm")
    def backward(ctx, saved, grad_s):
        x, y = saved
        grad_x = grad_y = None
        if ctx.needs_input_grad[0]:
            grad_x = _backend.spmm_values(ctx.csr, grad_s, y)
        if ctx.needs_input_grad[1]:
            grad_y = _spmm_transposed(ctx.csr, grad_s, x)
        return grad_x, grad_y, None


class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(scores, csr):
        return _backend.softmax_rows(csr, scores)

    @staticmethod
    def setup_context(ctx, inputs, output):
        csr = inputs[1]
        ctx.csr, ctx.pattern_state = csr, _pattern_state(csr)
        ctx.save_for_backward(output)

    @staticmethod
    def vmap(info, in_dims, *args):
        return _vmap_slice_by_slice(_EdgeSoftmax, info, in_dims, args)

    @staticmethod
    @_once_differentiable("edge_softmax")
    def backward(ctx, saved, grad_alpha):
        alpha, = saved
        return _backend.softmax_backward(ctx.csr, alpha, grad_alpha), None


class _GATAttention(torch.autograd.Function):
    """Returns the probabilities and the LeakyReLU sign mask (not differentiable), which
    the backward reads when ``keep == "alpha"``."""

    @staticmethod
    def forward(s_dst, s_src, csr, negative_slope, keep):
        alpha, positive = _backend.gat_softmax(csr, s_dst, s_src, negative_slope)
        return alpha, torch.from_numpy(positive)

    @staticmethod
    def setup_context(ctx, inputs, output):
        s_dst, s_src, csr, negative_slope, keep = inputs
        ctx.csr, ctx.negative_slope, ctx.keep = csr, negative_slope, keep
        ctx.pattern_state = _pattern_state(csr)
        ctx.mark_non_differentiable(output[1])
        if keep == "alpha":
            ctx.save_for_backward(*output)
        else:  # recompute both in backward from the (n, heads) node scores
            ctx.save_for_backward(s_dst, s_src)

    @staticmethod
    def vmap(info, in_dims, *args):
        return _vmap_slice_by_slice(_GATAttention, info, in_dims, args)

    @staticmethod
    @_once_differentiable("gat_attention")
    def backward(ctx, saved, grad_alpha, grad_positive):
        if ctx.keep == "alpha":
            alpha, positive = saved
            positive = positive.numpy()
        else:
            s_dst, s_src = saved
            alpha, positive = _backend.gat_softmax(ctx.csr, s_dst, s_src, ctx.negative_slope)
        grad_s_dst, grad_s_src = _backend.gat_softmax_backward(ctx.csr, alpha, positive,
                                                               grad_alpha, ctx.negative_slope)
        return grad_s_dst, grad_s_src, None, None, None


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(x, p, seed, row_ids):
        return _backend.dropout(x, p, seed, row_ids)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.p, ctx.seed, ctx.row_ids = inputs[1:]

    @staticmethod
    def vmap(info, in_dims, *args):
        # Each slice gets the mask of the one seed: the same randomness for the whole batch.
        return _vmap_slice_by_slice(_Dropout, info, in_dims, args)

    @staticmethod
    def backward(ctx, grad_out):
        # The same mask, through this Function again: differentiable as often as asked.
        return _Dropout.apply(grad_out, ctx.p, ctx.seed, ctx.row_ids), None, None, None


@_public_operation
def dropout(x, p=0.5, training=True, row_ids=None):
    """``torch.nn.functional.dropout`` with a faster CPU kernel that stores no mask.

    Each element is zeroed with probability ``p`` and the rest scaled by ``1 / (1 - p)``, as in
    torch; the mask is hashed from a seed drawn from torch's generator and the element's index,
    so ``torch.manual_seed`` makes it repeatable, and backward recomputes it. Tensors on other
    devices use torch's dropout.

    Parameters
    ----------
    x : torch.Tensor
    p : float
        In [0, 1]; 1 zeroes every element (``x * 0``, as torch).
    training : bool
        False returns ``x`` unchanged.
    row_ids : array of int64, shape (x.shape[0],), optional
        A global id for every row (node or edge): the mask of a row is then hashed from its id
        rather than its position, so the rows of a graph distributed over any number of ranks
        get the masks the whole graph gets in one process (`row_ids` gives them).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return x
    if p == 1.0:   # nothing is kept: torch's result, no mask to hash
        return x * 0.0
    if row_ids is not None and x.dim() == 0:
        raise ValueError("row_ids needs an x with rows, got a 0-d tensor")
    if not _backend.on_cpu(x) or x.dtype not in _FLOAT_DTYPES or x.dim() == 0:
        return torch.nn.functional.dropout(x, p, training=True)
    if row_ids is not None:
        row_ids = _as_row_ids(row_ids)
        if row_ids.shape != (x.shape[0],):
            raise ValueError(f"row_ids must have shape ({x.shape[0]},), one id per row of x, "
                             f"got {row_ids.shape}")
    # The seed comes from torch's generator, so torch.manual_seed makes runs repeatable.
    seed = int(torch.randint(0, 2 ** 62, (1,)))
    return _Dropout.apply(x, float(p), seed, row_ids)


def _as_row_ids(row_ids):
    """``row_ids`` as int64, refusing what a cast would change: float ids (truncated, so that
    0.2 and 0.7 shared a mask), booleans and unsigned ids beyond int64 (wrapped to negative)."""
    if isinstance(row_ids, torch.Tensor):
        row_ids = row_ids.detach().cpu().numpy()
    ids = np.asarray(row_ids)
    if ids.ndim == 1:   # else the shape check names the expected shape
        ids = as_index_array(ids, "row_ids")
        if ids.dtype == np.uint64 and ids.size and ids.max() > np.iinfo(np.int64).max:
            raise ValueError(f"row_ids holds ids beyond int64 (up to {int(ids.max())})")
    return np.ascontiguousarray(ids, dtype=np.int64)


def pattern(adj):
    """The canonical CSR form of ``adj`` (sorted, no duplicates): per-edge values, attention
    scores and SDDMM results are aligned with its storage order. A `DistGraph` is its own
    pattern (its local matrix is canonical). Built once and kept on ``adj``."""
    _check_adj(adj)
    return _graph.pattern(adj)


def row_ids(adj, kind="node"):
    """Global ids that key dropout masks on ``adj``'s rows, or None where positions are ids.

    Parameters
    ----------
    adj : sparse array or DistGraph
    kind : {"node", "edge"}
        "node": one id per row of a node-feature tensor (a `DistGraph`'s owned node ids; None
        for a sparse array, whose rows are the nodes). "edge": one id per stored entry of
        ``pattern(adj)``, ``row * n + column`` in global node ids, the same on any number of
        ranks.

    Returns
    -------
    numpy.ndarray of int64 or None
    """
    _check_adj(adj)
    if kind == "node":
        return adj.owned if isinstance(adj, DistGraph) else None
    if kind != "edge":
        raise ValueError(f"kind must be 'node' or 'edge', got {kind!r}")
    return _graph.edge_ids(pattern(adj))


@_public_operation
def spmm(adj, x, values=None):
    """Sparse times dense with autograd: ``adj @ x``.

    Parameters
    ----------
    adj : csr_array, mebcrs_array, blocked_array or DistGraph, shape (M, K)
        The sparse operand. Without ``values`` its own values are used (constants) and the
        product runs on adj's format (a blocked ``adj`` runs the blocked kernel, forward and
        backward); its transpose for the backward pass is built once and kept on it until
        its arrays change (`pysparse_hpc.nn`). With ``values`` only its pattern is read. A
        `~pysparse_hpc.distributed.DistGraph` takes this rank's rows of ``x`` and returns
        its rows of the product; the halo rows travel while the owned columns are multiplied
        (forward), and their gradient goes back to the owners (backward).
    x : torch.Tensor, shape (K, F), or (K, heads, F) with 2-D ``values``
        float32 or float64, on the CPU or a CUDA device.
    values : torch.Tensor, shape (nnz,) or (nnz, heads), optional
        Per-edge values aligned with ``pattern(adj)`` (e.g. attention probabilities), same
        dtype and device as ``x``; on a `DistGraph`, with its local matrix's entries.
        Gradients flow into them when they require grad.

    Returns
    -------
    torch.Tensor, shape (M, F) or (M, heads, F)

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> from pysparse_hpc.nn import functional as F
    >>> A = sph.csr_array([[0.0, 1.0], [1.0, 1.0]])
    >>> x = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    >>> F.spmm(A, x).sum().backward()
    >>> x.grad[:, 0]
    tensor([1., 2.], dtype=torch.float64)
    """
    _check_adj(adj)
    if isinstance(adj, DistGraph):
        return _spmm_distributed(adj, x, values)
    if values is None:
        _check_tensor(x, "x")
        if x.shape[0] != adj.shape[1]:
            raise ValueError(f"dimension mismatch: adj has shape {adj.shape} but x has "
                             f"{x.shape[0]} rows; expected {adj.shape[1]}")
        return _SpMMFixed.apply(x, adj)
    _check_tensor(values, "values", ndims=(1, 2))
    _check_tensor(x, "x", ndims=(values.ndim + 1,))
    _check_same(x, "x", values, "values")
    csr = pattern(adj)
    _check_edge_tensor(values, "values", csr, None if values.ndim == 1 else x.shape[1])
    if x.shape[0] != adj.shape[1]:
        raise ValueError(f"dimension mismatch: adj has shape {adj.shape} but x has "
                         f"{x.shape[0]} rows; expected {adj.shape[1]}")
    return _SpMMValues.apply(values, x, csr)


def _spmm_distributed(graph, x, values):
    if values is not None:  # first: x's expected shape is read from it
        _check_tensor(values, "values", ndims=(1, 2))
    _check_tensor(x, "x", ndims=(2,) if values is None else (values.ndim + 1,))
    _distributed.check_local_rows(graph, x, "x")
    if values is None:
        return _distributed.spmm_fixed(graph, x)
    return spmm(graph.local, _distributed.halo_rows(graph, x), values)


@_public_operation
def sddmm(adj, x, y):
    """Sampled dense-dense product with autograd: ``<x[i], y[j]>`` at adj's stored entries.

    Parameters
    ----------
    adj : csr_array, mebcrs_array, blocked_array or DistGraph, shape (M, K)
        Only the pattern is read. On a `~pysparse_hpc.distributed.DistGraph` ``x`` and ``y``
        are this rank's rows (y's halo rows come in one exchange) and the result follows its
        local matrix's entries.
    x : torch.Tensor, shape (M, F) or (M, heads, F)
    y : torch.Tensor, shape (K, F) or (K, heads, F)
        Same dtype, device and number of dimensions as ``x``.

    Returns
    -------
    torch.Tensor, shape (nnz,) or (nnz, heads)
        Aligned with ``pattern(adj)``.
    """
    _check_adj(adj)
    _check_tensor(x, "x", ndims=(2, 3))
    _check_tensor(y, "y", ndims=(x.ndim,))
    _check_same(x, "x", y, "y")
    if isinstance(adj, DistGraph):
        _distributed.check_local_rows(adj, x, "x")
        _distributed.check_local_rows(adj, y, "y")
        return sddmm(adj.local, x, _distributed.halo_rows(adj, y))
    if x.shape[0] != adj.shape[0] or y.shape[0] != adj.shape[1]:
        raise ValueError(f"dimension mismatch: adj has shape {adj.shape}, so x needs "
                         f"{adj.shape[0]} rows and y {adj.shape[1]}; got {x.shape[0]} and "
                         f"{y.shape[0]}")
    if x.shape[1:] != y.shape[1:]:
        raise ValueError(f"x and y differ past the first dimension: {tuple(x.shape[1:])} and "
                         f"{tuple(y.shape[1:])}")
    return _SDDMM.apply(x, y, pattern(adj))


@_public_operation
def edge_softmax(adj, scores):
    """Softmax over each row's stored entries, with autograd.

    Parameters
    ----------
    adj : sparse array
        Only the pattern is read.
    scores : torch.Tensor, shape (nnz,) or (nnz, heads)
        Aligned with ``pattern(adj)``.

    Returns
    -------
    torch.Tensor
        Same shape: for each row i (and head), the entries of row i sum to 1. A row whose
        scores are all ``-inf`` spreads evenly on the CPU, and is NaN on a GPU (as in torch
        and PyG).
    """
    _check_adj(adj)
    if isinstance(adj, DistGraph):  # a row's entries are all on its owner: no exchange
        adj = adj.local
    _check_tensor(scores, "scores", ndims=(1, 2))
    csr = pattern(adj)
    _check_edge_tensor(scores, "scores", csr, None if scores.ndim == 1 else scores.shape[1])
    two_d = scores if scores.ndim == 2 else scores[:, None]
    if _backend.on_cpu(scores):
        alpha = _EdgeSoftmax.apply(two_d, csr)
    else:
        alpha = _backend.torch_edge_softmax(csr, two_d)
    return alpha if scores.ndim == 2 else alpha[:, 0]


@_public_operation
def gat_attention(adj, s_dst, s_src, negative_slope=0.2, keep="alpha"):
    """GAT's attention probabilities: ``softmax_j LeakyReLU(s_dst[i] + s_src[j])`` per row i.

    One fused pass per row: the per-edge scores are never stored, and the backward pass gets
    the gradients of both node-score tensors.

    Parameters
    ----------
    adj : sparse array, shape (n, n)
        Only the pattern is read.
    s_dst, s_src : torch.Tensor, shape (n, heads)
        Per-node scores of the target (row) and source (column) ends of each edge.
    negative_slope : float
    keep : {"alpha", "scores"}
        What the forward keeps for backward: the probabilities and the LeakyReLU sign mask, or
        only the node scores (the softmax is recomputed; O(nnz * heads) less memory).

    Returns
    -------
    torch.Tensor, shape (nnz, heads)
        Aligned with ``pattern(adj)``. A row whose scores are all ``-inf`` (a node score of
        ``-inf``) spreads evenly on the CPU, and is NaN on a GPU, as in `edge_softmax`.
    """
    _check_adj(adj)
    if keep not in GAT_KEEP:
        raise ValueError(f"keep must be one of {GAT_KEEP}, got {keep!r}")
    negative_slope = check_negative_slope(negative_slope)   # as GATConv checks it
    _check_tensor(s_dst, "s_dst")
    _check_tensor(s_src, "s_src")
    _check_same(s_dst, "s_dst", s_src, "s_src")
    if isinstance(adj, DistGraph):
        _distributed.check_local_rows(adj, s_dst, "s_dst")
        _distributed.check_local_rows(adj, s_src, "s_src")
        if s_dst.shape != s_src.shape:
            raise ValueError(f"s_dst and s_src must have the same shape, got "
                             f"{tuple(s_dst.shape)} and {tuple(s_src.shape)}")
        return _gat_attention_csr(adj.local, s_dst, _distributed.halo_rows(adj, s_src),
                                  negative_slope, keep)
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"adj must be square, got shape {adj.shape}")
    if s_dst.shape != s_src.shape or s_dst.shape[0] != adj.shape[0]:
        raise ValueError(f"s_dst and s_src must both have shape ({adj.shape[0]}, heads), got "
                         f"{tuple(s_dst.shape)} and {tuple(s_src.shape)}")
    return _gat_attention_csr(pattern(adj), s_dst, s_src, negative_slope, keep)


def _gat_attention_csr(csr, s_dst, s_src, negative_slope, keep):
    """`gat_attention` on a canonical CSR pattern: s_dst per row, s_src per column."""
    if _backend.on_cpu(s_dst):
        return _GATAttention.apply(s_dst, s_src, csr, float(negative_slope), keep)[0]
    rows = _backend.edge_rows(csr, s_dst.device)
    cols = _backend.edge_cols(csr, s_dst.device)
    scores = torch.nn.functional.leaky_relu(s_dst[rows] + s_src[cols], negative_slope)
    return _backend.torch_edge_softmax(csr, scores)
