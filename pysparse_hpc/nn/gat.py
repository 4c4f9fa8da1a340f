"""Graph attention layer (Velickovic et al.) with a choice of what the forward pass keeps.

``H = X W`` (heads x F'), node scores ``s_src = H a_src`` and ``s_dst = H a_dst``, attention
``alpha_ij = softmax_j LeakyReLU(s_dst[i] + s_src[j])`` over the edges into i (self-loops
included), ``Y_i = sum_j alpha_ij H_j`` per head, then heads concatenated or averaged. The
attention is one fused pass (`functional.gat_attention`), the aggregation a multi-head SpMM
whose backward is an SDDMM for the attention and an SpMM with the cached transpose for H.
"""
import torch
from torch.utils.checkpoint import checkpoint

from . import functional
from ._checks import (check_channels, check_features, check_flag, check_negative_slope,
                      check_probability, warn_once_if_nan)
from ._graph import (EdgeIndexCache, as_graph, check_graph_for, checked_once,
                     warn_if_repeated_edges,
                     with_self_loops)
from .gcn import dense_transform, glorot_, glorot_linear_, linear_without_init

__all__ = ["GATConv", "GAT_CACHES"]

#: The values of ``GATConv(cache=...)``, from least to most kept by the forward pass.
GAT_CACHES = ("auto", "none", "H", "scores", "alpha")

# "auto" keeps the probabilities unless they (nnz x heads values, with the sign mask) would
# pass this many entries, then only the node scores.
_AUTO_ALPHA_LIMIT = 1 << 27


class GATConv(torch.nn.Module):
    """Multi-head graph attention on pysparse_hpc kernels.

    Parameters
    ----------
    in_channels, out_channels : int
        ``out_channels`` per head.
    heads : int
    concat : bool
        Concatenate the heads (output ``heads * out_channels`` wide) or average them.
    negative_slope : float
        Of the LeakyReLU on the edge scores.
    dropout : float
        Dropout on the attention probabilities during training.
    add_self_loops : bool
        Attend to the node itself too (the diagonal is added to the pattern where missing).
        The arguments up to here take PyG's positions; the others are keyword-only.
    cache : {"auto", "none", "H", "scores", "alpha"}
        What the forward pass keeps for backward:
        "none" only X (H, the scores and the attention are recomputed in backward);
        "H" also H = X W; "scores" also the node scores (the softmax is recomputed);
        "alpha" also the probabilities and the LeakyReLU sign mask (nothing recomputed).
        "auto" is "alpha" unless that is over 2**27 edge-head entries, then "scores".
        Results are identical whatever is kept; memory and time differ.
    bias : bool

    Attributes
    ----------
    lin : torch.nn.Linear
        The dense transform H = X W of all heads, bias-free (``lin.weight`` is
        ``heads * out_channels`` x ``in_channels``, as PyG's); gradient preconditioners
        (`pysparse_hpc.precondition`) precondition it as a Linear. ``bias`` keeps its plain
        gradient there, as do ``att_src`` and ``att_dst`` (heads x out_channels) under K-FAC
        and the diagonal Fisher; Shampoo and Jorge precondition those two as matrices. A
        state dict of PyG's ``GATConv`` of the same sizes loads as it is (its ``(1, heads,
        out_channels)`` attention vectors are taken without the leading axis), and
        `to_pyg_state_dict` gives one of ours that layout for PyG's.
    att_src, att_dst : torch.nn.Parameter
    bias : torch.nn.Parameter or None

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> cora = sph.datasets.load("cora")
    >>> conv = sph.nn.GATConv(cora.x.shape[1], 8, heads=8)
    >>> conv(torch.from_numpy(cora.x), cora.adj).shape
    torch.Size([2708, 64])
    """

    def __init__(self, in_channels, out_channels, heads=1, concat=True, negative_slope=0.2,
                 dropout=0.0, add_self_loops=True, *, cache="auto", bias=True):
        super().__init__()
        if cache not in GAT_CACHES:
            raise ValueError(f"cache must be one of {GAT_CACHES}, got {cache!r}")
        in_channels = check_channels(in_channels, "in_channels")
        out_channels = check_channels(out_channels, "out_channels")
        heads = check_channels(heads, "heads")
        dropout = check_probability(dropout, "dropout")
        negative_slope = check_negative_slope(negative_slope)
        # A string such as "False" is truthy and would silently ask for the opposite.
        concat, bias = check_flag(concat, "concat"), check_flag(bias, "bias")
        add_self_loops = check_flag(add_self_loops, "add_self_loops")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.dropout, self.negative_slope = concat, dropout, negative_slope
        self.cache, self.add_self_loops = cache, add_self_loops
        # A Linear module: module hooks (gradient preconditioning) see the transform.
        self.lin = linear_without_init(in_channels, heads * out_channels)
        self.att_src = torch.nn.Parameter(torch.empty(heads, out_channels))
        self.att_dst = torch.nn.Parameter(torch.empty(heads, out_channels))
        width = heads * out_channels if concat else out_channels
        self.bias = torch.nn.Parameter(torch.empty(width)) if bias else None
        self._edge_cache = EdgeIndexCache()
        self.reset_parameters()

    def reset_parameters(self):
        glorot_linear_(self.lin)
        glorot_(self.att_src)
        glorot_(self.att_dst)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # PyG's GATConv keeps the attention vectors as (1, heads, out_channels): its state
        # loads here as it is (same names and transform layout), the leading axis dropped.
        for name in ("att_src", "att_dst"):
            key = prefix + name
            value = state_dict.get(key)
            if (isinstance(value, torch.Tensor) and value.dim() == 3 and value.shape[0] == 1
                    and value.shape[1:] == getattr(self, name).shape):
                state_dict[key] = value[0]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def resolved_cache(self, graph):
        """The cache mode used on ``graph`` ("auto" resolved)."""
        if self.cache != "auto":
            return self.cache
        return "alpha" if graph.nnz * self.heads <= _AUTO_ALPHA_LIMIT else "scores"

    def _attend(self, graph, h, keep):
        """Attention and aggregation from H (n, heads, F'): (n, heads, F')."""
        # A product and a sum, as PyG's: einsum took 2-2.6x longer, forward and backward, from
        # 50 to 100,000 nodes, and under torch.autocast it returned bfloat16, which the
        # attention kernels do not take (elementwise products keep H's dtype).
        s_src = (h * self.att_src.to(h.dtype)).sum(-1)
        s_dst = (h * self.att_dst.to(h.dtype)).sum(-1)
        alpha = functional.gat_attention(graph, s_dst, s_src, self.negative_slope, keep=keep)
        if self.training and self.dropout > 0:
            # Masks keyed by global edge ids: the same on any number of ranks.
            alpha = functional.dropout(alpha, self.dropout,
                                       row_ids=functional.row_ids(graph, "edge"))
        return functional.spmm(graph, h, values=alpha)

    def _transform(self, x):
        return dense_transform(self.lin, x).view(-1, self.heads, self.out_channels)

    # Numba's dispatch cannot be traced: under torch.compile this runs eagerly (a graph
    # break). Each graph array's checksum is taken once per call (its lookups share it).
    @torch.compiler.disable
    @checked_once
    def forward(self, x, adj, num_nodes=None):
        """Apply the layer to ``x`` (n, in_channels) on ``adj`` (a sparse array, or an edge_index
        with ``num_nodes``, default ``x.shape[0]``)."""
        check_features(x, self.in_channels)
        graph = as_graph(adj, num_nodes, self._edge_cache, default_num_nodes=x.shape[0])
        warn_if_repeated_edges(graph, "GATConv", loops_replaced=self.add_self_loops)
        check_graph_for(graph, x)
        graph = with_self_loops(graph) if self.add_self_loops else functional.pattern(graph)
        cache = self.resolved_cache(graph)
        recompute = torch.is_grad_enabled() and cache in ("none", "H")
        if recompute and cache == "none":
            out = checkpoint(lambda x: self._attend(graph, self._transform(x), "scores"), x,
                             use_reentrant=False)
        elif recompute:
            out = checkpoint(lambda h: self._attend(graph, h, "scores"), self._transform(x),
                             use_reentrant=False)
        else:
            out = self._attend(graph, self._transform(x), "alpha" if cache == "alpha"
                               else "scores")
        out = (out.reshape(x.shape[0], self.heads * self.out_channels) if self.concat
               else out.mean(dim=1))
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        warn_once_if_nan(self, out)
        return out

    def extra_repr(self):
        # the options that change results are shown where they differ from the defaults
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, "
                f"concat={self.concat}, dropout={self.dropout}, cache={self.cache!r}"
                + ("" if self.negative_slope == 0.2 else
                   f", negative_slope={self.negative_slope}")
                + ("" if self.add_self_loops else ", add_self_loops=False")
                + ("" if self.bias is not None else ", bias=False"))
