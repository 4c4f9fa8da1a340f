"""GCN layer (Kipf and Welling) with cached operator reordering.

``Y = Â X W + b`` can run as ``Â (X W)`` (transform first: the SpMM is F_out wide) or
``(Â X) W`` (propagate first: F_in wide, and ``Â X`` is kept for the weight gradient, so the
backward pass needs no SpMM for it). Per training step the SpMM width is what costs, which gives
the rule of Bazinska et al. (2023), `choose_order`. On top of it, when a layer sees the same
unchanged input (a first layer fed the raw features, or evaluation passes) with the same graph,
``Â X`` is computed once and reused: the layer is then a dense product, with no SpMM at all.
"""
import math
import threading
import weakref

import numpy as np
import torch

from .._blocked import blocked_array
from ..distributed.graph import DistGraph, comm_sum
from . import functional
from ._checks import check_channels, check_features, check_flag, warn_once_if_nan
from ._graph import (EdgeIndexCache, as_graph, cached_on, check_graph_for, checked_once,
                     values_token)
from .norm import gcn_norm

__all__ = ["GCNConv", "ORDERS", "choose_order"]

#: The values of ``GCNConv(order=...)``.
ORDERS = ("auto", "transform_first", "propagate_first")


def choose_order(in_channels, out_channels, input_requires_grad):
    """The cheaper order of ``Â X W`` per training step, by SpMM width.

    Transform first costs an SpMM of width ``out_channels`` forward and one backward (for the
    gradient of X W). Propagate first costs one of width ``in_channels`` forward, and a second
    backward only when X needs a gradient. So a first layer (X a constant) transforms first iff
    ``2 * out_channels < in_channels``, an inner layer iff ``out_channels < in_channels``.

    Returns
    -------
    {"transform_first", "propagate_first"}
    """
    spmms_if_propagating = 2 if input_requires_grad else 1
    if 2 * out_channels < spmms_if_propagating * in_channels:
        return "transform_first"
    return "propagate_first"


def glorot_(tensor):
    """Glorot (Xavier) uniform initialization over the last two dimensions, in place."""
    fan_in, fan_out = tensor.shape[-2], tensor.shape[-1]
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        return tensor.uniform_(-bound, bound)


def linear_without_init(in_features, out_features):
    """A bias-free ``torch.nn.Linear`` whose weight is left for the caller to initialize; no
    random numbers are drawn (seeded models draw only their own initialization)."""
    return torch.nn.utils.skip_init(torch.nn.Linear, in_features, out_features, bias=False)


def glorot_linear_(linear):
    """`glorot_` of a Linear's weight, drawn in the (in, out) layout of ``x @ W`` and stored
    transposed: the values a layer holding W as in x out draws from the same seed."""
    with torch.no_grad():
        weight = torch.empty(linear.in_features, linear.out_features,
                             dtype=linear.weight.dtype, device=linear.weight.device)
        linear.weight.copy_(glorot_(weight).T)


def dense_transform(linear, x):
    """``x @ W`` through ``linear`` (a call of the module: its hooks see the input and the
    output, as a preconditioner's do), in ``x``'s dtype; for an input of another dtype than
    the weight, the module is called with its parameters cast to it."""
    if x.dtype == linear.weight.dtype:
        # Under torch.autocast the module returns the autocast dtype (bfloat16), which the
        # sparse kernels do not take: back to x's dtype, as GCNConv of PyG then returns.
        return linear(x).to(x.dtype)
    # A call of F.linear would skip the module's hooks: K-FAC's curvature of the layer was
    # then never built, and its gradient left plain. functional_call swaps the module's
    # attributes for the call: two threads swapping at once could restore each other's cast
    # tensors in place of the parameters, so such calls take turns.
    cast = {name: param.to(x.dtype) for name, param in linear.named_parameters(recurse=False)}
    with _CAST_CALL_LOCK:
        return torch.func.functional_call(linear, cast, (x,)).to(x.dtype)


#: Held around `dense_transform`'s calls with cast parameters.
_CAST_CALL_LOCK = threading.Lock()


class _MemoToken:
    """What stands for a (graph, X) pair in `_InputMemo`'s keys: the graph's `values_token`
    and X's version counter and layout."""

    def __init__(self, graph, x):
        self.graph, self.state = graph, _InputMemo.state(x)


class _InputMemo:
    """``Â X`` for a (graph, X) pair, valid while both are the same, unchanged objects.

    Inputs met once are noted as candidates (weakly, so the fresh dropped-out features of each
    training step die with the step and do not push out the features an evaluation pass
    reuses); a candidate met again gets its ``Â X`` computed and kept. Both are keyed by X's
    identity and version counter, not its contents: a checksum of X would cost more than the
    SpMM it saves (Cora's 2708 x 1433 features against a 16-wide SpMM), so a write torch does
    not count (into a NumPy array sharing X's memory, or through ``x.data``) is not seen, as
    autograd does not see it either; `GCNConv.reset_cache` forgets the kept ``Â X``. Nothing
    of it is pickled or copied (a copy starts with an empty memo).
    """

    _MAX_CANDIDATES = 4

    def __init__(self):
        self.clear()

    def clear(self):
        # The kept key and its Â X in one tuple, replaced whole and read once: a layer called
        # from several threads must not pair one input's key with another's Â X.
        self._kept, self._candidates = None, []

    @property
    def value(self):
        """The kept ``Â X`` (None when nothing is kept)."""
        kept = self._kept
        return None if kept is None else kept[1]

    def __reduce__(self):
        # A fresh, empty one: an empty state would not do, pickle's protocols 0 and 1 skip
        # __setstate__ for it and left the copy without its attributes.
        return type(self), ()

    @staticmethod
    def usable(x):
        """Whether ``(graph, x)`` can be remembered: not under ``torch.inference_mode()``,
        whose tensors have no version counter and cannot be saved for a later backward."""
        return not (torch.is_inference_mode_enabled() or x.is_inference())

    @staticmethod
    def state(x):
        # The version counter moves on every in-place change, so a modified X is a new input.
        return (x._version, x.dtype, x.device, tuple(x.shape))

    @staticmethod
    def token(graph, x):
        """What stands for ``(graph, x)`` in the keys, made once per call (pass it to the
        other methods with ``x``)."""
        return _MemoToken(values_token(graph), x)

    @staticmethod
    def _matches(key, token, x):
        token_ref, x_ref, state = key
        return token_ref() is token.graph and x_ref() is x and state == token.state

    def seen(self, token, x):
        """Whether (the graph of ``token``, x) was met before (noted, or with its ``Â X``
        kept)."""
        kept = self._kept
        keys = self._candidates + ([kept[0]] if kept is not None else [])
        return any(self._matches(key, token, x) for key in keys)

    def get(self, token, x):
        kept = self._kept
        if kept is not None and self._matches(kept[0], token, x):
            return kept[1]
        return None

    def note(self, token, x):
        """Remember (the graph of ``token``, x) as met once."""
        alive = [key for key in self._candidates if key[0]() is not None and key[1]() is not None]
        alive.append((weakref.ref(token.graph), weakref.ref(x), token.state))
        self._candidates = alive[-self._MAX_CANDIDATES:]

    def remember(self, token, x, value):
        self._kept = ((weakref.ref(token.graph), weakref.ref(x), token.state), value)


class GCNConv(torch.nn.Module):
    """Graph convolution ``Y = D^-1/2 (A + I) D^-1/2 X W + b`` on pysparse_hpc kernels.

    Parameters
    ----------
    in_channels, out_channels : int
        The others are keyword-only: PyG's third positional argument is ``improved``, which
        this layer does not take, and its bias comes last.
    bias : bool
    cached : bool
        Use the first graph seen for every later call, whatever graph is passed (transductive
        training, as PyG's ``cached``). Without it the normalized graph is still built once
        per graph and kept on it, until the graph's arrays change (rebound, or values or
        pattern written in place). Either way, values written into the graph in place are
        followed (its normalized copy is rebuilt), where PyG's ``cached`` keeps the operator
        it normalized in the first call.
    order : {"auto", "transform_first", "propagate_first"}
        "auto" applies `choose_order` per call, and reuses ``Â X`` across calls when the
        input is the same unchanged tensor that needs no gradient (then the layer runs no SpMM).
        Unchanged as torch counts changes (its version counter): after writing into the
        features where torch does not count it (into a NumPy array sharing their memory, or
        through ``x.data``), call `reset_cache`. The other two force an order. All give the
        same result up to rounding. While the dense transform ``lin`` has forward hooks (a
        gradient preconditioner gathering curvature), calls run transform first, so the hooks
        see X and the gradient of X W; so do calls on sparse features (a torch sparse COO or
        CSR ``x``), whose SpMM would need a dense X.
    normalize : bool
        Apply `gcn_norm` (with self-loops where missing, as PyG); False uses ``adj`` as
        given.

    Attributes
    ----------
    lin : torch.nn.Linear
        The dense transform W, bias-free (``lin.weight`` is out x in, as PyG's); gradient
        preconditioners (`pysparse_hpc.precondition`) precondition it as a Linear.
    bias : torch.nn.Parameter or None

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> cora = sph.datasets.load("cora")
    >>> conv = sph.nn.GCNConv(cora.x.shape[1], 16)
    >>> conv(torch.from_numpy(cora.x), cora.adj).shape
    torch.Size([2708, 16])
    """

    def __init__(self, in_channels, out_channels, *, bias=True, cached=False, order="auto",
                 normalize=True):
        super().__init__()
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        in_channels = check_channels(in_channels, "in_channels")
        out_channels = check_channels(out_channels, "out_channels")
        # A string such as "False" is truthy and would silently ask for the opposite.
        bias = check_flag(bias, "bias")
        cached, normalize = check_flag(cached, "cached"), check_flag(normalize, "normalize")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.cached, self.order, self.normalize = cached, order, normalize
        # The dense transform is a Linear module, so that module hooks (gradient
        # preconditioning) see its input and output whichever operator order a call takes.
        self.lin = linear_without_init(in_channels, out_channels)
        self.bias = torch.nn.Parameter(torch.empty(out_channels)) if bias else None
        self._edge_cache = EdgeIndexCache()
        self._first_graph = None  # with cached=True: the graph every call uses
        self._propagated = _InputMemo()
        #: The order the last forward call used (for inspection and tests).
        self.last_order = None
        self.reset_parameters()

    def reset_parameters(self):
        glorot_linear_(self.lin)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self.reset_cache()

    def reset_cache(self):
        """Forget the cached graph and the propagated input."""
        self._first_graph = None
        self._propagated.clear()

    def _normalized_graph(self, graph, x):
        if self.cached:
            if self._first_graph is None:
                self._first_graph = graph
            graph = self._first_graph
            nodes = graph.n_local if isinstance(graph, DistGraph) else graph.shape[0]
            if x.shape[0] != nodes:
                # Else the product refuses "adj" of the kept size, not the one passed.
                raise ValueError(f"x has {x.shape[0]} rows but the graph this cached=True layer "
                                 f"keeps from its first call has {nodes} nodes; call "
                                 "reset_cache() to use another graph")
        if not self.normalize:
            return graph
        # Normalized in the features' precision: float64 features get float64 values even
        # on an unweighted (float32) graph.
        dtype = np.dtype(np.float64 if x.dtype == torch.float64 else np.float32)

        def build():
            normalized = gcn_norm(graph, dtype=dtype)
            if isinstance(graph, blocked_array):  # keep the kernel the caller chose
                normalized = normalized.to_blocked(graph.window, graph.block_width)
            return normalized
        return cached_on(graph, ("gcn_layer_norm", dtype.name), build, collective=True)

    def _memo_lookup(self, graph, token, x):
        """``(seen, kept)``: whether (graph, x) was met before, and its kept ``Â X`` or None.
        On a `DistGraph`, agreed by the ranks in one allreduce (met, or kept, on every rank):
        a rank whose features changed where its peers' did not (written in place on that
        rank) would otherwise take the other order, or skip the SpMM whose halo exchange its
        peers wait in."""
        seen = self._propagated.seen(token, x)
        kept = self._propagated.get(token, x)
        if isinstance(graph, DistGraph) and graph.comm.size > 1:
            missing = comm_sum(graph.comm, [int(not seen), int(kept is None)], "memo check")
            seen = seen and missing[0] == 0
            kept = kept if missing[1] == 0 else None
        return seen, kept

    def _order_for(self, x, seen):
        if x.layout != torch.strided:
            # Sparse features (torch's COO or CSR): the SpMM kernels multiply dense operands,
            # and X W is dense whatever X is.
            return "transform_first"
        if self.lin._forward_hooks or self.lin._forward_pre_hooks:
            # Something watches the transform (a preconditioner gathering curvature): let it
            # see X and the gradient of X W, the same statistics whatever order is set.
            return "transform_first"
        if self.order != "auto":
            return self.order
        if seen:
            return "propagate_first"  # the same input again: Â X is (or will be) kept
        return choose_order(self.in_channels, self.out_channels,
                            x.requires_grad and torch.is_grad_enabled())

    # Numba's dispatch cannot be traced: under torch.compile this runs eagerly (a graph
    # break). Each graph array's checksum is taken once per call (its lookups share it).
    @torch.compiler.disable
    @checked_once
    def forward(self, x, adj, num_nodes=None):
        """Apply the layer.

        Parameters
        ----------
        x : torch.Tensor, shape (n, in_channels)
            Dense, or a torch sparse COO or CSR tensor (multiplied by W first).
        adj : sparse array, shape (n, n), or torch.Tensor [2, E]
            The graph (row i: the edges into node i), or an edge_index (source, target),
            converted once per tensor.
        num_nodes : int, optional
            For an edge_index; defaults to ``x.shape[0]``.
        """
        check_features(x, self.in_channels)
        graph = as_graph(adj, num_nodes, self._edge_cache, default_num_nodes=x.shape[0])
        check_graph_for(graph, x)
        graph = self._normalized_graph(graph, x)
        # Â X can be kept for an input that needs no gradient, outside inference mode
        memo = (not (x.requires_grad and torch.is_grad_enabled()) and x.layout == torch.strided
                and self._propagated.usable(x))
        token = self._propagated.token(graph, x) if memo else None
        seen, propagated = self._memo_lookup(graph, token, x) if memo else (False, None)
        order = self._order_for(x, seen)
        self.last_order = order
        if order == "transform_first":
            out = functional.spmm(graph, dense_transform(self.lin, x))
            if memo and not self._propagated.seen(token, x):
                self._propagated.note(token, x)  # met again, it switches order
        else:
            if propagated is None:
                propagated = functional.spmm(graph, x)
                if memo:
                    self._propagated.remember(token, x, propagated.detach())
            out = dense_transform(self.lin, propagated)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        warn_once_if_nan(self, out)
        return out

    def extra_repr(self):
        # the options that change results are shown where they differ from the defaults
        return (f"{self.in_channels}, {self.out_channels}, order={self.order!r}, "
                f"cached={self.cached}" + ("" if self.normalize else ", normalize=False")
                + ("" if self.bias is not None else ", bias=False"))
