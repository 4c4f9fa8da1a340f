"""GNN layers on PyTorch autograd over pysparse_hpc's kernels.

Layers
------
GCNConv     graph convolution with cached operator reordering (``order="auto"``)
GATConv     multi-head graph attention, with a choice of what the forward keeps (``cache=``)
AGNNConv    attention-based propagation (cosine attention, one SDDMM + one SpMM)

Functions
---------
gcn_norm    D^-1/2 (A + I) D^-1/2
to_pyg_state_dict  a model's state dict in PyG's layout (GATConv's attention vectors)
functional  spmm, sddmm, edge_softmax, gat_attention with autograd

Every layer takes ``forward(x, adj)`` with ``adj`` a pysparse_hpc sparse array (CSR, ME-BCRS or
blocked) or a ``[2, E]`` edge_index tensor (converted once and cached), and runs on the CPU
kernels or, for tensors on a GPU, the CUDA backend. Importing this module imports torch.

What is built from a sparse array (normalization, transpose, dtype copies) is kept on it while
it holds the same arrays with the same values: rebinding one (``A.data = new``) or writing its
values in place starts afresh (a checksum of the values is compared on each use); a
`~pysparse_hpc.distributed.DistGraph` follows its local matrix. A backward pass through a product
whose sparse array changed after its forward pass raises, as torch does for its own tensors.
"""
from . import functional
from .agnn import AGNNConv
from .gat import GAT_CACHES, GATConv
from .gcn import ORDERS, GCNConv, choose_order
from .norm import gcn_norm
from .pyg import to_pyg_state_dict

__all__ = ["AGNNConv", "GATConv", "GAT_CACHES", "GCNConv", "ORDERS", "choose_order",
           "functional", "gcn_norm", "to_pyg_state_dict"]
