"""Two-layer node classifiers with the published hyper-parameters (the demo, examples and the
benchmark share them, so ours and PyG's run the same model).

Feature dropout is `pysparse_hpc.nn.functional.dropout` unless ``fast_dropout=False``: torch's
on the CPU costs more than both GCN layers together on Cora (a Bernoulli draw per feature), ours
hashes the mask and stores none. GAT's attention dropout is `GATConv`'s, always ours (its masks
keyed by edge). The option exists so the benchmark can show what each part gains.
Ours keys the masks by global node id, so a model on a `pysparse_hpc.distributed.DistGraph`
drops the same features whatever the number of ranks (torch's draws depend on the shapes).
"""
import torch
import torch.nn.functional as F

from .._sputils import check_flag
from . import functional
from ._checks import check_channels, check_probability
from .agnn import AGNNConv
from .gat import GATConv
from .gcn import GCNConv

__all__ = ["GCN", "GAT", "AGNN", "MODELS"]


def _check_options(dropout, flags, **sizes):
    """Refuse, when the model is built, what its layers would take or refuse only later: a
    width of 0 (``torch.nn.Linear`` builds it, and the model then ignores its input) or a
    negative one (refused by torch without the argument's name), a dropout rate outside
    [0, 1] (refused only by the first training step, never in evaluation), and a switch
    (name -> value in ``flags``) that is no bool (the string "False" is truthy)."""
    for name, value in sizes.items():
        check_channels(value, name)
    check_probability(dropout, "dropout", one=True)
    for name, value in flags.items():
        check_flag(value, name)


def _feature_dropout(model, x, adj):
    """Dropout of node features ``x`` of graph ``adj`` with ``model``'s rate and mode: ours,
    keyed by global node id, or torch's where ``model.fast_dropout`` is False."""
    if not model.fast_dropout:
        return F.dropout(x, model.dropout, model.training)
    # an edge_index's rows are the nodes themselves, as a sparse array's are
    ids = None if isinstance(adj, torch.Tensor) else functional.row_ids(adj, "node")
    return functional.dropout(x, model.dropout, model.training, ids)


class GCN(torch.nn.Module):
    """Kipf and Welling's GCN: dropout, GCNConv, ReLU, dropout, GCNConv.

    ``layer_options`` go to both `GCNConv` layers (``order=``, ``cached=``). With
    ``input_dropout=False`` the first layer sees the same features every epoch, so
    ``order="auto"`` propagates them once for all of training.

    Parameters
    ----------
    in_channels, hidden, out_channels : int
        Widths of the input features, of the hidden layer and of the output (the classes).
    dropout : float, default 0.5
        Rate of the feature dropout, in [0, 1].
    input_dropout : bool, default True
        Drop the input features too, not only the hidden ones.
    fast_dropout : bool, default True
        The library's dropout on the features (`pysparse_hpc.nn.functional.dropout`, masks
        keyed by global node id); False: torch's.
    **layer_options
        Passed to each `GCNConv` (``order=``, ``cached=``, ...).

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> from pysparse_hpc.nn.models import GCN
    >>> cora = sph.datasets.load("cora")
    >>> model = GCN(cora.x.shape[1], out_channels=cora.num_classes, **GCN.architecture)
    >>> model.eval()(torch.from_numpy(cora.x), cora.adj).shape
    torch.Size([2708, 7])
    """

    #: Kipf and Welling's settings for the citation graphs: the model's keyword arguments
    #: and `pysparse_hpc.nn.train.fit`'s.
    architecture = dict(hidden=16, dropout=0.5)
    training = dict(epochs=200, lr=0.01, weight_decay=5e-4)

    def __init__(self, in_channels, hidden, out_channels, dropout=0.5, input_dropout=True,
                 fast_dropout=True, **layer_options):
        super().__init__()
        _check_options(dropout, dict(input_dropout=input_dropout, fast_dropout=fast_dropout),
                       in_channels=in_channels, hidden=hidden, out_channels=out_channels)
        self.dropout, self.input_dropout = dropout, input_dropout
        self.fast_dropout = fast_dropout
        self.conv1 = GCNConv(in_channels, hidden, **layer_options)
        self.conv2 = GCNConv(hidden, out_channels, **layer_options)

    def forward(self, x, adj):
        """The logits of every node: ``x`` its features, ``adj`` a sparse array, a
        `pysparse_hpc.distributed.DistGraph` or an edge_index, as the layers take."""
        if self.input_dropout:
            x = _feature_dropout(self, x, adj)
        x = F.relu(self.conv1(x, adj))
        x = _feature_dropout(self, x, adj)
        return self.conv2(x, adj)

    def reset_parameters(self):
        """Draw the weights afresh, as a new model would (PyG's models offer the same)."""
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def param_groups(self, weight_decay):
        """Weight decay on the first layer only, as in Kipf and Welling's code."""
        return [dict(params=self.conv1.parameters(), weight_decay=weight_decay),
                dict(params=self.conv2.parameters(), weight_decay=0.0)]


class GAT(torch.nn.Module):
    """Velickovic et al.'s GAT for Cora: 8 heads x 8 hidden, ELU, one output head, dropout 0.6
    on the inputs and the attention.

    ``fast_dropout=False`` gives torch's dropout on the features; the attention dropout is
    `GATConv`'s own, the library's, either way.

    Parameters
    ----------
    in_channels, hidden, out_channels : int
        Widths of the input features, of each hidden head and of the output (the classes).
    heads : int, default 8
        Attention heads of the first layer, concatenated (the second has one).
    dropout : float, default 0.6
        Rate of the feature dropout and of `GATConv`'s attention dropout, in [0, 1].
    fast_dropout : bool, default True
        The library's dropout on the features (`pysparse_hpc.nn.functional.dropout`, masks
        keyed by global node id); False: torch's.
    **layer_options
        Passed to each `GATConv` (``order=``, ``cached=``, ...).

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> from pysparse_hpc.nn.models import GAT
    >>> cora = sph.datasets.load("cora")
    >>> model = GAT(cora.x.shape[1], out_channels=cora.num_classes, **GAT.architecture)
    >>> model.eval()(torch.from_numpy(cora.x), cora.adj).shape
    torch.Size([2708, 7])
    """

    architecture = dict(hidden=8, heads=8, dropout=0.6)
    training = dict(epochs=200, lr=0.005, weight_decay=5e-4)

    def __init__(self, in_channels, hidden, out_channels, heads=8, dropout=0.6, fast_dropout=True,
                 **layer_options):
        super().__init__()
        _check_options(dropout, dict(fast_dropout=fast_dropout), in_channels=in_channels,
                       hidden=hidden, out_channels=out_channels)
        self.dropout = dropout
        self.fast_dropout = fast_dropout
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=dropout, **layer_options)
        self.conv2 = GATConv(hidden * heads, out_channels, heads=1, concat=False,
                             dropout=dropout, **layer_options)

    def forward(self, x, adj):
        """The logits of every node: ``x`` its features, ``adj`` a sparse array, a
        `pysparse_hpc.distributed.DistGraph` or an edge_index, as the layers take."""
        x = _feature_dropout(self, x, adj)
        x = F.elu(self.conv1(x, adj))
        x = _feature_dropout(self, x, adj)
        return self.conv2(x, adj)

    def reset_parameters(self):
        """Draw the weights afresh, as a new model would."""
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def param_groups(self, weight_decay):
        """Weight decay on every parameter, as in the authors' code."""
        return [dict(params=self.parameters(), weight_decay=weight_decay)]


class AGNN(torch.nn.Module):
    """Thekumparampil et al.'s AGNN: linear, ReLU, two AGNN propagations, linear.

    The first propagation's temperature is fixed at 1, the second's learned, as in the paper.

    Parameters
    ----------
    in_channels, hidden, out_channels : int
        Widths of the input features, of the hidden layer and of the output (the classes).
    dropout : float, default 0.5
        Rate of the feature dropout, in [0, 1].
    fast_dropout : bool, default True
        The library's dropout on the features (`pysparse_hpc.nn.functional.dropout`, masks
        keyed by global node id); False: torch's.
    **layer_options
        Passed to each `AGNNConv` (``order=``, ``cached=``, ...).

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> from pysparse_hpc.nn.models import AGNN
    >>> cora = sph.datasets.load("cora")
    >>> model = AGNN(cora.x.shape[1], out_channels=cora.num_classes, **AGNN.architecture)
    >>> model.eval()(torch.from_numpy(cora.x), cora.adj).shape
    torch.Size([2708, 7])
    """

    architecture = dict(hidden=16, dropout=0.5)
    training = dict(epochs=200, lr=0.01, weight_decay=5e-4)

    def __init__(self, in_channels, hidden, out_channels, dropout=0.5, fast_dropout=True,
                 **layer_options):
        super().__init__()
        _check_options(dropout, dict(fast_dropout=fast_dropout), in_channels=in_channels,
                       hidden=hidden, out_channels=out_channels)
        self.dropout = dropout
        self.fast_dropout = fast_dropout
        self.lin1 = torch.nn.Linear(in_channels, hidden)
        self.prop1 = AGNNConv(requires_grad=False, **layer_options)
        self.prop2 = AGNNConv(requires_grad=True, **layer_options)
        self.lin2 = torch.nn.Linear(hidden, out_channels)

    def forward(self, x, adj):
        """The logits of every node: ``x`` its features, ``adj`` a sparse array, a
        `pysparse_hpc.distributed.DistGraph` or an edge_index, as the layers take."""
        x = _feature_dropout(self, x, adj)
        x = F.relu(self.lin1(x))
        x = self.prop1(x, adj)
        x = self.prop2(x, adj)
        x = _feature_dropout(self, x, adj)
        return self.lin2(x)

    def reset_parameters(self):
        """Draw the weights afresh and set both temperatures back to 1, as a new model."""
        for module in (self.lin1, self.prop1, self.prop2, self.lin2):
            module.reset_parameters()

    def param_groups(self, weight_decay):
        """Weight decay on every parameter, as in the authors' code."""
        return [dict(params=self.parameters(), weight_decay=weight_decay)]


#: Name -> model class, for command lines.
MODELS = {"gcn": GCN, "gat": GAT, "agnn": AGNN}
