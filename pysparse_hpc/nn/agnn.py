"""Attention-based propagation (AGNN, Thekumparampil et al.), as in FlashSparse's end-to-end runs.

``P = softmax over each row of beta * cos(X_i, X_j)`` on the graph's pattern (one SDDMM of the
row-normalized features with themselves), then ``Y = P @ X`` (one SpMM with per-edge values).
"""
import torch

from . import functional
from ._checks import check_features, check_flag, warn_once_if_nan
from ._graph import (EdgeIndexCache, as_graph, check_graph_for, checked_once,
                     warn_if_repeated_edges,
                     with_self_loops)

__all__ = ["AGNNConv"]


class AGNNConv(torch.nn.Module):
    """AGNN propagation layer (no weight matrix; one temperature ``beta``).

    Parameters
    ----------
    requires_grad : bool
        Learn ``beta`` (initialized to 1); otherwise it stays 1.
    add_self_loops : bool
        Attend to the node itself too.

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> cora = sph.datasets.load("cora")
    >>> sph.nn.AGNNConv()(torch.from_numpy(cora.x), cora.adj).shape
    torch.Size([2708, 1433])
    """

    def __init__(self, requires_grad=True, add_self_loops=True):
        super().__init__()
        # A string such as "False" is truthy and would silently ask for the opposite.
        requires_grad = check_flag(requires_grad, "requires_grad")
        add_self_loops = check_flag(add_self_loops, "add_self_loops")
        self.requires_grad, self.add_self_loops = requires_grad, add_self_loops
        if requires_grad:
            self.beta = torch.nn.Parameter(torch.ones(1))
        else:
            self.register_buffer("beta", torch.ones(1))
        self._edge_cache = EdgeIndexCache()

    def reset_parameters(self):
        with torch.no_grad():
            self.beta.fill_(1.0)

    # Numba's dispatch cannot be traced: under torch.compile this runs eagerly (a graph
    # break). Each graph array's checksum is taken once per call (its lookups share it).
    @torch.compiler.disable
    @checked_once
    def forward(self, x, adj, num_nodes=None):
        """Propagate ``x`` (n, F), dense, over ``adj`` (a sparse array, or an edge_index with
        ``num_nodes``, default ``x.shape[0]``)."""
        check_features(x)
        if x.layout != torch.strided:
            # Else torch's normalize fails on it with a message about its reductions. The
            # output P @ X is as large as a dense X, so densifying it costs nothing more.
            raise TypeError(f"AGNNConv takes dense features, got a torch sparse x (layout "
                            f"{x.layout}): pass x.to_dense()")
        graph = as_graph(adj, num_nodes, self._edge_cache, default_num_nodes=x.shape[0])
        # PyG's AGNNConv, like its GATConv, replaces the listed self-loops when it adds them
        warn_if_repeated_edges(graph, "AGNNConv", loops_replaced=self.add_self_loops)
        check_graph_for(graph, x)
        graph = with_self_loops(graph) if self.add_self_loops else functional.pattern(graph)
        unit = torch.nn.functional.normalize(x, p=2.0, dim=-1)
        cosine = functional.sddmm(graph, unit, unit)
        alpha = functional.edge_softmax(graph, self.beta.to(x.dtype) * cosine)
        out = functional.spmm(graph, x, values=alpha)
        warn_once_if_nan(self, out)
        return out

    def extra_repr(self):
        return (f"requires_grad={self.requires_grad}"
                + ("" if self.add_self_loops else ", add_self_loops=False"))
