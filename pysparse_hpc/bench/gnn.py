"""The ``gnn`` benchmark: training epochs of our GCN, GAT and AGNN against PyTorch Geometric.

For every graph (Cora and CiteSeer with their features and split; PubMed's structure and a
generated planted-community graph of over a million stored edges, both with random features
and labels), every hidden width and every model, the time of one full-batch training epoch:
forward, cross-entropy on the training nodes, backward and an Adam step, the median of
``--repeat`` steps after two warm-up steps (the configurations of a case take turns, one step
each per round, so a passing disturbance costs each of them one sample, not one of them all).
Our models (`pysparse_hpc.nn.models`, defaults: GCN ``order="auto"``, GAT ``cache="auto"``,
our dropout) run against PyG's models of the same architecture (``GCNConv(cached=True)``,
``GATConv``, ``AGNNConv``, same dropout positions, torch's dropout) on an ``edge_index``,
torch on as many threads as our kernels. ``--pyg-input adj_t`` gives PyG's models the
transposed adjacency as a torch sparse CSR tensor instead (PyG's sparse path, which its
documentation recommends for speed and memory), with the same checks.

Next to the full model, each model has a headline row "ours, torch dropout" (variant
``torch_dropout``): our layers with ``torch.nn.functional.dropout`` in place of our hashed
dropout, as a user who swaps PyG's conv layers for ours and keeps torch's dropout runs them,
so the kernels and operator order or caching alone. Ablation rows show where the rest of the
gain comes from: GCN with a forced order and without input dropout (the first layer reuses
``Â X``); GAT with each ``cache=`` mode. For GAT the hidden width is that of the first layer:
8 heads of ``hidden / 8``.

Each (graph, model) is checked once before timing: our model, given PyG's weights, must give
PyG's output in evaluation mode; its output must be finite; and our GCN layer must agree with
itself in both orders. With ``--accuracy`` both libraries' GCN and GAT are also trained on
Cora with the models' published settings over several seeds, to show equal accuracy.

The project's targets (geometric mean over graphs and hidden widths): GCN at least 1.5x and
GAT at least 1.3x faster per epoch than PyG. AGNN has no target; its mean is reported. With
torch's dropout (the headline rows) the targets are the same factors on the large graphs only:
the geometric mean over PubMed and the generated graph at hidden 16, 64 and 256
(`TORCH_DROPOUT_TARGETS`; the citation graphs' rows do not count, and a run without both large
graphs or all three widths is not judged). Cases where ours is slower than PyG are listed, not
hidden, for the full model and for the headline rows.

GPU mode (``--device cuda``): both libraries' models, the features, labels and masks, and PyG's
``edge_index`` are on the GPU; our adjacency stays a pysparse_hpc sparse array, which our
layers send to the GPU themselves (index arrays once, kept on the array). Default graphs are
PubMed and the generated graph (``--graph`` still chooses). Every step ends with
``torch.cuda.synchronize()`` inside the timed region, so each clock starts with the GPU idle
and stops once the step's queued work is done. Besides the check against PyG (run on the GPU),
each (graph, model) is checked once against the CPU: our model on the GPU, given the weights of
the same model on the CPU, must give its output and its parameters' gradients of the training
loss (evaluation mode, relative tolerance `DEVICE_RTOL`). Ablation rows that would only rerun
the defaults on CUDA tensors are left out, with a printed note saying why (`CUDA_SKIPPED`).
After warm-up, one more step of ours per (graph, model) counts what it sends to the GPU through
``numba.cuda.to_device`` (0 when the graph stays on the GPU between epochs); the count is
printed. The header names the GPU and the torch and CUDA versions. The targets above are CPU
targets: the GPU run reports the geometric means without judging them; on CUDA tensors our
dropout is torch's, so the GPU run has no separate "ours, torch dropout" row or line.
``--threads`` applies only to the CPU side of the CPU check. Without a CUDA device ``--device
cuda`` stops with an error (status 2) before loading anything.
"""
import csv
import functools
import gc
import importlib.util
import math
import statistics
import sys
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from . import best_times, counted, geometric_mean, positive_int, positive_width
from ._data import find_graph, load_matrix

__all__ = ["CUDA_GRAPHS", "DEVICES", "GRAPHS", "HELP", "TORCH_DROPOUT", "TORCH_DROPOUT_TARGETS",
           "EpochResult", "GraphCase", "Variant", "add_arguments", "check_against_cpu",
           "format_table", "host_uploads", "load_graph", "measure", "median_step_seconds", "run",
           "to_device", "torch_dropout_verdict", "training_step", "variants", "verdicts",
           "warm_up"]

HELP = "GCN, GAT and AGNN training epochs against PyTorch Geometric, with ablations"

#: Seeds of the ``--accuracy`` runs unless ``--seeds`` says otherwise.
ACCURACY_SEEDS = 5
#: Graphs in table order.
GRAPHS = ("cora", "citeseer", "pubmed", "generated")
#: The values of ``--device``.
DEVICES = ("cpu", "cuda")
#: Graphs measured by default with ``--device cuda``: the two large ones (an epoch on Cora or
#: CiteSeer is too small to keep a GPU busy).
CUDA_GRAPHS = ("pubmed", "generated")
#: Hidden widths measured by default (for GAT: all heads together).
HIDDEN = (16, 64, 256)
#: Models in table order (keys of `pysparse_hpc.nn.models.MODELS`).
MODEL_NAMES = ("gcn", "gat", "agnn")
#: Heads of the first GAT layer; ``hidden`` must be a multiple of it.
GAT_HEADS = 8

#: Target speedups over PyG per epoch (geometric mean over graphs and hidden widths).
TARGETS = {"gcn": 1.5, "gat": 1.3}

#: Untimed training steps before the timed ones (kernel compilation, caches, allocator).
WARMUP_STEPS = 2

#: The variant label of PyG's model, the peer of every row.
PEER = "pyg"
#: The variant label of our model with its defaults.
OURS = "ours"
#: The variant label of our layers with torch's dropout (a headline next to `OURS`: what a user
#: who swaps PyG's conv layers for ours and keeps ``torch.nn.functional.dropout`` gets).
TORCH_DROPOUT = "torch_dropout"
#: Labels in the table where they differ from the variant label (the CSV keeps the latter).
TABLE_LABELS = {TORCH_DROPOUT: "ours, torch dropout"}

#: Graphs of the torch's-dropout targets: only their rows count (the large graphs, where an
#: epoch is more than torch's dropout of the input).
LARGE_GRAPHS = ("pubmed", "generated")
#: Target speedups over PyG per epoch of our layers with torch's dropout (`TORCH_DROPOUT`):
#: geometric mean over `LARGE_GRAPHS` at every width of `HIDDEN`.
TORCH_DROPOUT_TARGETS = {"gcn": 1.5, "gat": 1.3}

#: PubMed: the shared structure with random features and labels.
PUBMED_FEATURES, PUBMED_CLASSES, PUBMED_SPLIT = 500, 3, (60, 500, 1000)

#: The generated graph: planted_partition arguments (100,000 nodes, expected degree 12, node
#: ids shuffled), random features and labels.
GENERATED = dict(n_communities=3125, community_size=32, internal_degree=8.0,
                 external_degree=4.0, seed=1, shuffle=True)
GENERATED_FEATURES, GENERATED_CLASSES, GENERATED_SPLIT = 128, 10, (200, 500, 1000)
GENERATED_MIN_EDGES = 1_000_000

#: Tolerance of the output checks (float32, sums in different orders).
RTOL, ATOL = 1e-3, 1e-4
#: Relative tolerance of the GPU-against-CPU check of our models (float32; the absolute
#: tolerance is this times the largest magnitude of the CPU's tensor).
DEVICE_RTOL = 1e-4

INSTALL_HINT = 'pip install -e ".[bench]"'


@dataclass(frozen=True)
class Variant:
    """One of our model configurations.

    Attributes
    ----------
    name : str
        Label in the CSV and, unless `TABLE_LABELS` gives another, in the table (``ours`` is the
        model with its defaults).
    description : str
        What differs from the defaults, for the legend.
    options : dict
        Keyword arguments of the model class (``fast_dropout``, layer options).
    """

    name: str
    description: str
    options: dict


_HEADLINE = ("headline: our layers with torch's dropout, as users who keep their own dropout run "
             "them ({})")

#: Our configurations per model: the defaults, our layers with torch's dropout, the ablations.
VARIANTS = {
    "gcn": (
        Variant(OURS, "defaults: order='auto', our dropout", {}),
        Variant(TORCH_DROPOUT, _HEADLINE.format("the kernel and ordering gain alone"),
                {"fast_dropout": False}),
        Variant("transform_first", "order forced to Â (X W)", {"order": "transform_first"}),
        Variant("propagate_first", "order forced to (Â X) W", {"order": "propagate_first"}),
        Variant("no_input_dropout", "no dropout on the input, so the first layer reuses Â X "
                "(not PyG's model: an upper bound)", {"input_dropout": False}),
    ),
    "gat": (
        Variant(OURS, "defaults: cache='auto', our dropout", {}),
        Variant(TORCH_DROPOUT, _HEADLINE.format("the kernel and caching gain alone"),
                {"fast_dropout": False}),
        Variant("cache=none", "backward recomputes H, the scores and the attention",
                {"cache": "none"}),
        Variant("cache=H", "backward recomputes the scores and the attention", {"cache": "H"}),
        Variant("cache=scores", "backward recomputes the softmax", {"cache": "scores"}),
        Variant("cache=alpha", "backward recomputes nothing", {"cache": "alpha"}),
    ),
    "agnn": (
        Variant(OURS, "defaults: our dropout", {}),
        Variant(TORCH_DROPOUT, _HEADLINE.format("the kernel gain alone"),
                {"fast_dropout": False}),
    ),
}


_SAME_DROPOUT = ("our dropout falls back to torch's dropout for CUDA tensors "
                 "(pysparse_hpc.nn.functional.dropout), so on the GPU this row would be the "
                 "defaults again, and 'ours' runs torch's dropout too")
_SAME_ATTENTION = ("on CUDA tensors GAT's attention is torch operations differentiated by torch "
                   "(functional.gat_attention ignores keep=), so cache='scores' and 'alpha' "
                   "would be the defaults again; cache='none' and 'H' (recomputation through "
                   "torch.utils.checkpoint) stay")

#: Our configurations left out with ``--device cuda``: (model, variant) -> why.
CUDA_SKIPPED = {
    ("gcn", TORCH_DROPOUT): _SAME_DROPOUT,
    ("gat", TORCH_DROPOUT): _SAME_DROPOUT,
    ("agnn", TORCH_DROPOUT): _SAME_DROPOUT,
    ("gat", "cache=scores"): _SAME_ATTENTION,
    ("gat", "cache=alpha"): _SAME_ATTENTION,
}


def variants(model, device="cpu"):
    """Our configurations of ``model`` measured on ``device`` ("cpu" or "cuda"), in `VARIANTS`
    order: all of them on the CPU, those not in `CUDA_SKIPPED` on the GPU.

    Returns
    -------
    tuple of Variant
    """
    if device == "cpu":
        return VARIANTS[model]
    return tuple(v for v in VARIANTS[model] if (model, v.name) not in CUDA_SKIPPED)


@dataclass(frozen=True)
class GraphCase:
    """A graph with everything a training step needs.

    Attributes
    ----------
    name : str
    adj : csr_array
        Symmetric adjacency, unit weights (what our models take).
    x : torch.Tensor, shape (nodes, features)
        Row-normalized features.
    y : torch.Tensor of int64
    train_mask, val_mask, test_mask : torch.Tensor of bool
    num_classes : int
    note : str
        How the features and labels were made, empty for real ones.
    communities : ndarray of int64, optional
        A generated graph's planted community of every node (what its generator knows to be
        the best split); None for other graphs.
    """

    name: str
    adj: object
    x: object
    y: object
    train_mask: object
    val_mask: object
    test_mask: object
    num_classes: int
    note: str = ""
    communities: object = None

    @property
    def nodes(self):
        return self.adj.shape[0]

    @property
    def edges(self):
        """Stored adjacency entries (each undirected edge twice, no self loops)."""
        return self.adj.nnz

    @property
    def masks(self):
        return self.train_mask, self.val_mask, self.test_mask


@dataclass(frozen=True)
class EpochResult:
    """Seconds per training epoch of one model configuration.

    Attributes
    ----------
    graph : str
    nodes, edges, hidden : int
    model : str
        ``gcn``, ``gat`` or ``agnn``.
    variant : str
        ``pyg`` (the peer), ``ours`` or an ablation label.
    seconds : float
        Median seconds of one training step.
    """

    graph: str
    nodes: int
    edges: int
    hidden: int
    model: str
    variant: str
    seconds: float

    @property
    def key(self):
        """The (graph, hidden, model) this row is compared within."""
        return self.graph, self.hidden, self.model


class Mismatch(RuntimeError):
    """A model's output is wrong; the benchmark stops."""


# --- command line --------------------------------------------------------------------------

def add_arguments(parser):
    """Options of the ``gnn`` command beyond the common ones."""
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="where both libraries' models and tensors run (default: cpu); cuda "
                             "needs a CUDA device and a CUDA build of torch, and ignores --threads"
                             " except for the CPU side of its CPU check")
    parser.add_argument("--graph", action="append", choices=GRAPHS, metavar="NAME",
                        help=f"benchmark only this graph (repeatable; one of {', '.join(GRAPHS)}; "
                             f"default: all, with --device cuda {' and '.join(CUDA_GRAPHS)})")
    parser.add_argument("--hidden", action="append", type=positive_width, metavar="H",
                        help="hidden width (repeatable; for GAT all 8 heads together, so a "
                             f"multiple of {GAT_HEADS}; default: "
                             f"{' '.join(map(str, HIDDEN))})")
    parser.add_argument("--model", action="append", choices=MODEL_NAMES, metavar="NAME",
                        help=f"benchmark only this model (repeatable; one of "
                             f"{', '.join(MODEL_NAMES)}; default: all)")
    parser.add_argument("--pyg-input", choices=PYG_INPUTS, default="edge_index",
                        help="the graph PyG's models take: an edge_index, or the transposed "
                             "adjacency as a torch sparse CSR tensor (default: edge_index)")
    parser.add_argument("--accuracy", action="store_true",
                        help="also train ours and PyG's GCN and GAT on Cora with the models' "
                             "published settings and compare mean test accuracy")
    # None, not the default: given without --accuracy it must be refused, not ignored
    parser.add_argument("--seeds", type=positive_int, metavar="N",
                        help=f"seeds of the --accuracy runs (default: {ACCURACY_SEEDS})")
    parser.add_argument("--epochs", type=positive_int, metavar="N",
                        help="epochs of the --accuracy runs (default: the models' own, 200)")


def _unique(values, default):
    """``values`` in order without repeats, or ``default`` when not given."""
    return tuple(dict.fromkeys(values)) if values else tuple(default)


def _selection(args, err):
    """(graphs, hidden widths, models) to run, or None after an error message."""
    given = [f"--{name}" for name in ("seeds", "epochs") if getattr(args, name) is not None]
    if given and not args.accuracy:
        # Only the accuracy runs train for epochs over seeds; the timed epochs take --repeat.
        print(f"error: {' and '.join(given)} set the --accuracy runs, and --accuracy was not "
              "given: add --accuracy, or use --repeat for the timed epochs", file=err)
        return None
    graphs = _unique(args.graph, GRAPHS if args.device == "cpu" else CUDA_GRAPHS)
    hidden = _unique(args.hidden, HIDDEN)
    models = _unique(args.model, MODEL_NAMES)
    if "gat" in models:
        bad = [h for h in hidden if h % GAT_HEADS]
        if bad:
            print(f"error: GAT's hidden width is {GAT_HEADS} heads together, so --hidden must be "
                  f"a multiple of {GAT_HEADS}; got {', '.join(map(str, bad))} (or leave out "
                  "gat with --model)", file=err)
            return None
    return graphs, hidden, models


def _import_libraries(err):
    """(torch, torch_geometric.nn), or None after a message saying what to install."""
    missing = [name for name in ("torch", "torch_geometric")
               if importlib.util.find_spec(name) is None]
    if missing:
        print(f"error: the gnn benchmark needs {' and '.join(missing)} (it compares with "
              f"PyTorch Geometric); install them with {INSTALL_HINT} (torch: the CPU build, "
              "see the README)", file=err)
        return None
    import torch
    import torch_geometric.nn
    return torch, torch_geometric.nn


def cuda_unavailable(torch):
    """Why ``--device cuda`` cannot run here (one sentence), or None when it can.

    Parameters
    ----------
    torch : module

    Returns
    -------
    str or None
    """
    if not torch.cuda.is_available():
        build = ("a CPU-only build" if torch.version.cuda is None
                 else f"built for CUDA {torch.version.cuda}")
        return f"torch finds no CUDA device (torch {torch.__version__}, {build})"
    from numba import cuda
    if not cuda.is_available():
        return "numba.cuda finds no CUDA device, and our GPU kernels need it"
    return None


def device_description(torch):
    """The GPU and the versions the GPU run depends on, for the header."""
    import torch_geometric
    index = torch.cuda.current_device()
    return (f"device: {torch.cuda.get_device_name(index)} (cuda:{index}); torch "
            f"{torch.__version__} built for CUDA {torch.version.cuda}; torch_geometric "
            f"{torch_geometric.__version__}")


# --- graphs --------------------------------------------------------------------------------

def _random_split(rng, n, sizes):
    """Disjoint random boolean masks of the given sizes (train, val, test)."""
    order = rng.permutation(n)
    masks, start = [], 0
    for size in sizes:
        mask = np.zeros(n, dtype=bool)
        mask[order[start:start + size]] = True
        masks.append(mask)
        start += size
    return masks


def _random_node_data(name, adj, width, classes, split, seed, note):
    """A `GraphCase` on ``adj`` with uniform random features (rows summing to 1) and random
    labels and split, seeded."""
    import torch

    from ..nn.train import normalize_features
    rng = np.random.default_rng(seed)
    n = adj.shape[0]
    x = normalize_features(rng.random((n, width), dtype=np.float32))
    y = rng.integers(0, classes, n)
    masks = _random_split(rng, n, split)
    return GraphCase(name, adj, torch.from_numpy(x), torch.from_numpy(y),
                     *(torch.from_numpy(m) for m in masks), classes, note)


def load_graph(name, data_dir):
    """The `GraphCase` of a name in `GRAPHS`.

    Raises
    ------
    FileNotFoundError
        PubMed's structure is not in ``data_dir``.
    """
    if name in ("cora", "citeseer"):
        from .. import datasets
        from ..nn.train import node_tensors
        dataset = datasets.load(name)
        return GraphCase(name, dataset.adj, *node_tensors(dataset), dataset.num_classes)
    if name == "pubmed":
        # scipy's index dtype (int32 here), as Cora's and CiteSeer's and a user's scipy matrix
        # have it: the file stores int64, on which our kernels move twice the index bytes.
        adj = load_matrix(find_graph("pubmed", data_dir), index_dtype="scipy").astype(
            np.float32, copy=False)
        note = (f"shared structure with random features ({PUBMED_FEATURES} wide) and random "
                f"labels ({PUBMED_CLASSES} classes, random {'/'.join(map(str, PUBMED_SPLIT))} "
                "split): only the timing is meaningful")
        return _random_node_data(name, adj, PUBMED_FEATURES, PUBMED_CLASSES, PUBMED_SPLIT, 0,
                                 note)
    from ..generators import planted_partition
    adj, communities = planted_partition(**GENERATED)
    if adj.nnz < GENERATED_MIN_EDGES:
        raise RuntimeError(f"the generated graph has {adj.nnz} stored edges, fewer than "
                           f"{GENERATED_MIN_EDGES}")
    note = (f"planted_partition({GENERATED['n_communities']} communities of "
            f"{GENERATED['community_size']} nodes, expected degree "
            f"{GENERATED['internal_degree']:g} inside + {GENERATED['external_degree']:g} anywhere,"
            f" ids shuffled) with random features ({GENERATED_FEATURES} wide) and random labels "
            f"({GENERATED_CLASSES} classes): only the timing is meaningful")
    return replace(
        _random_node_data(name, adj, GENERATED_FEATURES, GENERATED_CLASSES, GENERATED_SPLIT, 1,
                          note), communities=communities)


#: The forms of the graph PyG's models can be given (``--pyg-input``).
PYG_INPUTS = ("edge_index", "adj_t")


def pyg_input_of(adj, form):
    """The graph PyG's models take, in ``form`` (one of `PYG_INPUTS`): `edge_index_of`, or
    ``adj_t``, the transposed adjacency (row = target) as a torch sparse CSR tensor."""
    edge_index = edge_index_of(adj)
    if form == "edge_index":
        return edge_index
    import warnings

    from torch_geometric.utils import to_torch_csr_tensor
    with warnings.catch_warnings():
        # torch's notes that its CSR tensors are in beta and that it does not check their
        # invariants: ours are canonical
        warnings.filterwarnings("ignore", message="Sparse invariant checks")
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return to_torch_csr_tensor(edge_index.flip(0), size=adj.shape)


def edge_index_of(adj):
    """PyG's ``edge_index`` of ``adj``: row 0 the sources (our column indices), row 1 the
    targets (our row indices), int64."""
    import torch
    targets = np.repeat(np.arange(adj.shape[0], dtype=np.int64), np.diff(adj.indptr))
    sources = adj.indices.astype(np.int64)
    return torch.from_numpy(np.stack([sources, targets]))


def to_device(case, device):
    """``case`` with its features, labels and masks on ``device``.

    The adjacency stays the same sparse array: our layers take it as it is with tensors on any
    device, and the GPU path sends what it needs of it to the GPU itself, keeping it on the
    array.

    Parameters
    ----------
    case : GraphCase
    device : torch.device or str

    Returns
    -------
    GraphCase
    """
    return replace(case, x=case.x.to(device), y=case.y.to(device),
                   train_mask=case.train_mask.to(device), val_mask=case.val_mask.to(device),
                   test_mask=case.test_mask.to(device))


# --- models --------------------------------------------------------------------------------

@functools.cache
def peer_classes():
    """PyG's models of our architectures, by model name (built on first use: torch and PyG are
    optional dependencies)."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import AGNNConv, GATConv, GCNConv

    class PygGCN(torch.nn.Module):
        """Dropout, GCNConv, ReLU, dropout, GCNConv (PyG's gcn.py example)."""

        def __init__(self, in_channels, hidden, out_channels, dropout=0.5):
            super().__init__()
            self.dropout = dropout
            self.conv1 = GCNConv(in_channels, hidden, cached=True)
            self.conv2 = GCNConv(hidden, out_channels, cached=True)

        def forward(self, x, edge_index):
            x = F.dropout(x, self.dropout, self.training)
            x = F.relu(self.conv1(x, edge_index))
            x = F.dropout(x, self.dropout, self.training)
            return self.conv2(x, edge_index)

        def param_groups(self, weight_decay):
            return [dict(params=self.conv1.parameters(), weight_decay=weight_decay),
                    dict(params=self.conv2.parameters(), weight_decay=0.0)]

    class PygGAT(torch.nn.Module):
        """Dropout, GATConv (heads concatenated), ELU, dropout, GATConv (one head)."""

        def __init__(self, in_channels, hidden, out_channels, heads=8, dropout=0.6):
            super().__init__()
            self.dropout = dropout
            self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=dropout)
            self.conv2 = GATConv(hidden * heads, out_channels, heads=1, concat=False,
                                 dropout=dropout)

        def forward(self, x, edge_index):
            x = F.dropout(x, self.dropout, self.training)
            x = F.elu(self.conv1(x, edge_index))
            x = F.dropout(x, self.dropout, self.training)
            return self.conv2(x, edge_index)

        def param_groups(self, weight_decay):
            return [dict(params=self.parameters(), weight_decay=weight_decay)]

    class PygAGNN(torch.nn.Module):
        """Dropout, linear, ReLU, two AGNN propagations, dropout, linear."""

        def __init__(self, in_channels, hidden, out_channels, dropout=0.5):
            super().__init__()
            self.dropout = dropout
            self.lin1 = torch.nn.Linear(in_channels, hidden)
            self.prop1 = AGNNConv(requires_grad=False)
            self.prop2 = AGNNConv(requires_grad=True)
            self.lin2 = torch.nn.Linear(hidden, out_channels)

        def forward(self, x, edge_index):
            x = F.dropout(x, self.dropout, self.training)
            x = F.relu(self.lin1(x))
            x = self.prop2(self.prop1(x, edge_index), edge_index)
            x = F.dropout(x, self.dropout, self.training)
            return self.lin2(x)

        def param_groups(self, weight_decay):
            return [dict(params=self.parameters(), weight_decay=weight_decay)]

    return {"gcn": PygGCN, "gat": PygGAT, "agnn": PygAGNN}


def _width_arguments(model, hidden):
    """Keyword arguments giving a model of ``hidden`` total hidden width."""
    if model == "gat":
        return dict(hidden=hidden // GAT_HEADS, heads=GAT_HEADS)
    return dict(hidden=hidden)


def build_model(model, variant, in_channels, hidden, out_channels):
    """PyG's model (``variant`` `PEER`) or ours in a configuration of `VARIANTS`."""
    from ..nn.models import MODELS
    widths = _width_arguments(model, hidden)
    if variant == PEER:
        return peer_classes()[model](in_channels, out_channels=out_channels, **widths)
    options = next(v.options for v in VARIANTS[model] if v.name == variant)
    return MODELS[model](in_channels, out_channels=out_channels, **widths, **options)


def _copy_peer_weights(model, peer, ours):
    """Give our model PyG's weights (same architecture, our layouts)."""
    import torch
    with torch.no_grad():
        if model == "agnn":
            ours.lin1.load_state_dict(peer.lin1.state_dict())
            ours.lin2.load_state_dict(peer.lin2.state_dict())
            ours.prop2.beta.copy_(peer.prop2.beta)
            return
        for mine, theirs in ((ours.conv1, peer.conv1), (ours.conv2, peer.conv2)):
            mine.lin.weight.copy_(theirs.lin.weight)
            mine.bias.copy_(theirs.bias)
            if model == "gat":
                mine.att_src.copy_(theirs.att_src.reshape(mine.att_src.shape))
                mine.att_dst.copy_(theirs.att_dst.reshape(mine.att_dst.shape))


def _check_close(what, result, reference, rtol=RTOL, atol=ATOL, scale=None):
    """Raise `Mismatch` unless ``result`` is finite and close to ``reference`` (same device):
    within ``rtol`` relative and ``atol`` times ``scale`` (default: the largest magnitude of
    ``reference``)."""
    import torch
    if not bool(torch.isfinite(result).all()):
        raise Mismatch(f"{what}: output is not finite")
    if scale is None:
        scale = float(reference.abs().max()) or 1.0
    if not torch.allclose(result, reference, rtol=rtol, atol=atol * scale):
        worst = float((result - reference).abs().max())
        raise Mismatch(f"{what}: outputs differ (max |diff| {worst:.3g}, tolerance rtol={rtol:g}, "
                       f"atol={atol * scale:.3g})")


def check_model(case, model, hidden, edge_index):
    """One cheap check of our model on ``case`` (evaluation mode, no gradient), on the device of
    ``case``'s tensors (``edge_index``, PyG's graph in either of `PYG_INPUTS`, must be there
    too).

    Our model given PyG's weights gives PyG's output, and is finite; for GCN, our layer gives
    the same result in both orders.

    Raises
    ------
    Mismatch
    """
    import torch

    from ..nn.gcn import GCNConv
    device = case.x.device
    peer = build_model(model, PEER, case.x.shape[1], hidden, case.num_classes).eval()
    ours = build_model(model, OURS, case.x.shape[1], hidden, case.num_classes).eval()
    _copy_peer_weights(model, peer, ours)
    peer.to(device)
    ours.to(device)
    with torch.no_grad():
        _check_close(f"{case.name} {model} h{hidden}: ours with PyG's weights vs PyG",
                     ours(case.x, case.adj), peer(case.x, edge_index))
        if model == "gcn":
            transform_first = GCNConv(case.x.shape[1], hidden, order="transform_first")
            propagate_first = GCNConv(case.x.shape[1], hidden, order="propagate_first")
            propagate_first.load_state_dict(transform_first.state_dict())
            transform_first.to(device)
            propagate_first.to(device)
            _check_close(f"{case.name} GCNConv h{hidden}: propagate_first vs transform_first",
                         propagate_first(case.x, case.adj), transform_first(case.x, case.adj))


def check_against_cpu(case, cpu_case, model, hidden):
    """Our model on ``case``'s device against the same model on the CPU (`DEVICE_RTOL`).

    Both copies have the same weights and run in evaluation mode (no dropout); each computes
    its output and the gradients of the training loss (cross-entropy on the training nodes)
    with respect to its parameters, and the device's must equal the CPU's. The absolute
    tolerance of the output is `DEVICE_RTOL` times its largest magnitude; that of every
    gradient `DEVICE_RTOL` times the largest magnitude of all the CPU's gradients, so a
    gradient that is zero in exact arithmetic is not judged on its rounding noise (GAT's
    ``att_dst``: a row's softmax ignores a shift shared by all its scores, which ``s_dst`` is
    wherever the row's LeakyReLU inputs share a sign).

    Parameters
    ----------
    case : GraphCase
        Tensors on the device under test.
    cpu_case : GraphCase
        The same graph with its tensors on the CPU.
    model : str
    hidden : int

    Raises
    ------
    Mismatch
    """
    import torch.nn.functional as F
    widths = (cpu_case.x.shape[1], hidden, cpu_case.num_classes)
    reference = build_model(model, OURS, *widths).eval()
    moved = build_model(model, OURS, *widths).eval()
    moved.load_state_dict(reference.state_dict())
    moved.to(case.x.device)
    results = []
    for network, data in ((reference, cpu_case), (moved, case)):
        out = network(data.x, data.adj)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        grads = {name: None if p.grad is None else p.grad.cpu()
                 for name, p in network.named_parameters()}
        results.append((out.detach().cpu(), grads))
    (cpu_out, cpu_grads), (device_out, device_grads) = results
    what = f"{case.name} {model} h{hidden}: ours on {case.x.device} vs ours on the CPU"
    _check_close(f"{what}, output", device_out, cpu_out, DEVICE_RTOL, DEVICE_RTOL)
    scale = max((float(g.abs().max()) for g in cpu_grads.values()
                 if g is not None and g.numel()), default=0.0) or 1.0
    for name, expected in cpu_grads.items():
        got = device_grads[name]
        if (got is None) != (expected is None):
            raise Mismatch(f"{what}, gradient of {name}: present on one side only")
        if expected is not None:
            _check_close(f"{what}, gradient of {name}", got, expected, DEVICE_RTOL, DEVICE_RTOL,
                         scale)


# --- timing --------------------------------------------------------------------------------

def training_step(network, x, graph, case, hyper):
    """A zero-argument callable running one training step of ``network(x, graph)`` with its
    own Adam optimizer (the model's ``param_groups``, learning rate and weight decay)."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.Adam(network.param_groups(hyper["weight_decay"]), lr=hyper["lr"])
    network.train()

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(network(x, graph)[case.train_mask], case.y[case.train_mask])
        loss.backward()
        optimizer.step()
    return step


def _then(step, synchronize):
    """``step`` followed by ``synchronize()``, as one zero-argument callable."""
    def run():
        step()
        synchronize()
    return run


def median_step_seconds(steps, repeat, synchronize=None):
    """Median seconds of each training step over ``repeat`` timed calls, after `WARMUP_STEPS`
    untimed ones. The calls are interleaved (one of each step per round), so a passing
    disturbance on the machine costs each step one sample, which the median drops, instead of
    all samples of one step.

    Parameters
    ----------
    steps : dict of str to callable
    repeat : int
    synchronize : callable, optional
        Waits until the device has done all its queued work (``torch.cuda.synchronize``). It is
        called once before the first step and after every step, warm-up ones included, inside
        the timed region: so the device is idle whenever a clock starts, and a clock stops
        only once the step's work on the device is done, not when its launches are queued.

    Returns
    -------
    dict of str to float
    """
    if synchronize is not None:
        steps = {label: _then(step, synchronize) for label, step in steps.items()}
        synchronize()
    return best_times(steps, repeat, warmup=WARMUP_STEPS, statistic=statistics.median)


def _synchronizer(device):
    """``torch.cuda.synchronize`` for a CUDA device, None for the CPU."""
    if device.type != "cuda":
        return None
    import torch
    return torch.cuda.synchronize


def warm_up(case, model, hidden):
    """Untimed training steps of our model on a graph new to it: the first steps compile or
    load the kernels, build the graph's caches (transpose, self loops; on the GPU the device
    copies of the graph's arrays) and grow the heap, and take a few steps to settle, more than
    each variant's own warm-up allows for.

    Returns
    -------
    callable
        The warmed training step (on ``case``'s device), for `host_uploads`.
    """
    from ..nn.models import MODELS
    network = build_model(model, OURS, case.x.shape[1], hidden, case.num_classes)
    network.to(case.x.device)
    step = training_step(network, case.x, case.adj, case, MODELS[model].training)
    for _ in range(WARMUP_STEPS + 1):
        step()
    return step


def host_uploads(step):
    """What one call of ``step`` sends from the host to the GPU through
    ``numba.cuda.to_device`` (how our GPU backend uploads arrays), counted by wrapping that
    function for the call.

    After warm-up a step that finds the graph on the GPU sends nothing; anything counted is
    sent again on every epoch, and the timings include it.

    Parameters
    ----------
    step : callable

    Returns
    -------
    (int, int)
        Calls and bytes.
    """
    from numba import cuda
    original, sizes = cuda.to_device, []

    def counting(obj, *args, **kwargs):
        sizes.append(int(getattr(obj, "nbytes", 0)))
        return original(obj, *args, **kwargs)
    cuda.to_device = counting
    try:
        step()
    finally:
        cuda.to_device = original
    return len(sizes), sum(sizes)


def measure(case, model, hidden, edge_index, repeat):
    """PyG's model and each of our configurations on one (graph, hidden, model), on the device
    of ``case``'s tensors (``edge_index``, PyG's graph in either of `PYG_INPUTS`, must be
    there too; on a GPU, the configurations of
    `variants` for it, each step timed with `median_step_seconds`'s ``synchronize``).

    Returns
    -------
    list of EpochResult
        The peer first, then `VARIANTS` order.
    """
    from ..nn.models import MODELS
    hyper = MODELS[model].training
    device = case.x.device
    steps = {}
    for variant in (PEER, *(v.name for v in variants(model, device.type))):
        network = build_model(model, variant, case.x.shape[1], hidden, case.num_classes)
        network.to(device)
        graph = edge_index if variant == PEER else case.adj
        steps[variant] = training_step(network, case.x, graph, case, hyper)
    seconds = median_step_seconds(steps, repeat, _synchronizer(device))
    del steps
    gc.collect()
    return [EpochResult(case.name, case.nodes, case.edges, hidden, model, variant, value)
            for variant, value in seconds.items()]


# --- accuracy ------------------------------------------------------------------------------

def accuracy_comparison(seeds, epochs, device="cpu"):
    """Train ours and PyG's GCN and GAT on Cora with the published settings, one line each.

    Parameters
    ----------
    seeds, epochs : int
        ``epochs`` None: the models' own.
    device : str, default "cpu"
        Where both libraries train ("cpu" or "cuda").

    Returns
    -------
    list of str
    """
    import torch

    from ..nn.models import MODELS
    from ..nn.train import fit
    cora = to_device(load_graph("cora", None), device)
    edge_index = edge_index_of(cora.adj).to(device)
    lines = []
    runs = [(model, side) for model in ("gcn", "gat") for side in (PEER, OURS)]
    accuracies = {}
    with tqdm(total=len(runs) * seeds, desc="accuracy", unit="run") as progress:
        for model, side in runs:
            ours = MODELS[model]
            settings = dict(ours.training, **({"epochs": epochs} if epochs else {}))
            for seed in range(seeds):
                torch.manual_seed(seed)
                cls = peer_classes()[model] if side == PEER else ours
                network = cls(cora.x.shape[1], out_channels=cora.num_classes, **ours.architecture)
                network.to(device)
                result = fit(network, cora.x, edge_index if side == PEER else cora.adj, cora.y,
                             cora.masks, **settings, progress=False)
                accuracies.setdefault((model, side), []).append(result.test_accuracy)
                progress.update()
    for model in ("gcn", "gat"):
        cells = []
        for side, label in ((OURS, "ours"), (PEER, "PyG")):
            values = np.array(accuracies[(model, side)]) * 100
            cells.append(f"{label} {values.mean():.1f}% +- {values.std():.1f}")
        gap = (np.mean(accuracies[(model, OURS)]) - np.mean(accuracies[(model, PEER)])) * 100
        lines.append(f"accuracy: {model.upper()} on Cora, mean test accuracy over {seeds} seeds "
                     f"({epochs or MODELS[model].training['epochs']} epochs): "
                     f"{', '.join(cells)} (difference {gap:+.1f} points)")
    return lines


# --- report --------------------------------------------------------------------------------

def _peer_seconds(results):
    """{(graph, hidden, model): PyG's seconds}."""
    return {r.key: r.seconds for r in results if r.variant == PEER}


def speedup(result, peer_seconds):
    """PyG's time over this row's time (above 1: faster than PyG)."""
    return peer_seconds[result.key] / result.seconds


def format_table(results):
    """One line per (graph, hidden, model, variant): ms per epoch and speedup over PyG; the
    variants labelled as in `TABLE_LABELS` (our layers with torch's dropout: "ours, torch
    dropout")."""
    peer = _peer_seconds(results)
    heading = (f"{'graph':<10} {'nodes':>7} {'edges':>8} {'hidden':>6} {'model':<5} "
               f"{'variant':<19} {'ms/epoch':>9} {'vs PyG':>7}")
    lines = [heading, "-" * len(heading)]
    previous = None
    for r in results:
        if previous is not None and r.key != previous:
            lines.append("")
        previous = r.key
        lines.append(f"{r.graph:<10} {r.nodes:>7} {r.edges:>8} {r.hidden:>6} {r.model:<5} "
                     f"{TABLE_LABELS.get(r.variant, r.variant):<19} {r.seconds * 1e3:>9.2f} "
                     f"{speedup(r, peer):>6.2f}x")
    return "\n".join(lines)


def _mean_speedup(results, model, variant=OURS):
    """(geometric mean of the speedups of ``variant`` of ``model``, number of rows)."""
    peer = _peer_seconds(results)
    values = [speedup(r, peer) for r in results if r.model == model and r.variant == variant]
    return geometric_mean(values), len(values)


def _judged(mean, target):
    """``"1.62x MET"`` or ``"1.49x NOT MET"``; a miss that would round up to the target is
    rounded down instead, so that 1.496 does not read as a 1.50 that failed."""
    met = mean >= target
    shown = mean
    if not met and round(mean, 2) >= target:
        shown = math.floor(mean * 100) / 100
    return f"{shown:.2f}x {'MET' if met else 'NOT MET'}"


def torch_dropout_verdict(results, model):
    """The target line of our layers with torch's dropout (`TORCH_DROPOUT`) for ``model``.

    Only the rows of `LARGE_GRAPHS` at the widths of `HIDDEN` count; the line says so. A run
    without both graphs, or without one of those widths on them, is not judged.

    Parameters
    ----------
    results : list of EpochResult
        CPU results.
    model : str
        A key of `TORCH_DROPOUT_TARGETS`.

    Returns
    -------
    str
    """
    target = TORCH_DROPOUT_TARGETS[model]
    widths = ", ".join(map(str, HIDDEN))
    head = (f"target, torch's dropout: {model.upper()} ours, torch dropout >= {target:g}x faster "
            f"than PyG per epoch with torch's dropout (geo-mean over "
            f"{' and '.join(LARGE_GRAPHS)} at hidden {widths} only; other graphs' rows do not "
            "count")
    peer = _peer_seconds(results)
    rows = {r.key: r for r in results if r.model == model and r.variant == TORCH_DROPOUT
            and r.graph in LARGE_GRAPHS and r.hidden in HIDDEN and r.key in peer}
    present = {graph for graph, _, _ in rows}
    if present != set(LARGE_GRAPHS):
        missing = [graph for graph in LARGE_GRAPHS if graph not in present]
        return (f"{head}): not judged: needs {' and '.join(LARGE_GRAPHS)} (this run has no "
                f"{' or '.join(missing)} rows)")
    missing = [f"{graph} h{hidden}" for graph in LARGE_GRAPHS for hidden in HIDDEN
               if (graph, hidden, model) not in rows]
    if missing:
        return (f"{head}): not judged: needs hidden {widths} on both (missing: "
                f"{', '.join(missing)})")
    mean = geometric_mean(speedup(r, peer) for r in rows.values())
    return f"{head}; {len(rows)} cases): {_judged(mean, target)}"


def verdicts(results, device="cpu"):
    """Target lines, per-variant means and the cases where ours is slower than PyG.

    On the CPU each model's line of the full model is followed by the headline of our layers
    with torch's dropout (`TORCH_DROPOUT`: its geometric mean over all rows, next to the full
    model's) and, for a model of `TORCH_DROPOUT_TARGETS`, its target line
    (`torch_dropout_verdict`: the large graphs only).

    Parameters
    ----------
    results : list of EpochResult
    device : {"cpu", "cuda"}
        The targets are judged on the CPU only; on the GPU the means are reported, with the CPU
        targets named as not judged (and no torch's-dropout lines: on CUDA tensors our dropout
        is torch's, so the GPU run has no such rows).

    Returns
    -------
    list of str
    """
    lines = []
    models = list(dict.fromkeys(r.model for r in results))
    on_cpu = device == "cpu"
    for model in models:
        mean, count = _mean_speedup(results, model)
        scope = f"geo-mean over graphs and hidden sizes, {count} cases"
        if not on_cpu:
            target = (f"CPU target >= {TARGETS[model]:g}x, not judged on the GPU"
                      if model in TARGETS else "no target")
            lines.append(f"GPU: {model.upper()} {mean:.2f}x PyG's speed per epoch on the same GPU "
                         f"({scope}; {target})")
            continue
        if model in TARGETS:
            lines.append(f"target: {model.upper()} >= {TARGETS[model]:g}x faster than PyG per "
                         f"epoch ({scope}): {_judged(mean, TARGETS[model])}")
        else:
            lines.append(f"{model.upper()} (no target): {mean:.2f}x PyG's speed per epoch "
                         f"({scope})")
        headline, count = _mean_speedup(results, model, TORCH_DROPOUT)
        if count:
            lines.append(f"headline: {model.upper()} ours, torch dropout (our layers, torch's "
                         f"dropout): {headline:.2f}x PyG's speed per epoch (geo-mean over graphs "
                         f"and hidden sizes, {count} cases); full model (our dropout) {mean:.2f}x")
        if model in TORCH_DROPOUT_TARGETS:
            lines.append(torch_dropout_verdict(results, model))
    for model in models:
        means = [f"{variant.name} {_mean_speedup(results, model, variant.name)[0]:.2f}x"
                 for variant in variants(model, device)]
        lines.append(f"ratio: {model.upper()} variants vs PyG (geo-mean): {', '.join(means)}")
    peer = _peer_seconds(results)
    slower = [f"{r.graph} h{r.hidden} {r.model} ({speedup(r, peer):.2f}x)" for r in results
              if r.variant == OURS and speedup(r, peer) < 1]
    lines.append(f"ours (defaults) slower than PyG on: {', '.join(slower) if slower else 'none'}")
    if on_cpu:
        slower = [f"{r.graph} h{r.hidden} {r.model} ({speedup(r, peer):.2f}x)" for r in results
                  if r.variant == TORCH_DROPOUT and speedup(r, peer) < 1]
        lines.append("ours, torch dropout slower than PyG on: "
                     f"{', '.join(slower) if slower else 'none'}")
    return lines


def write_csv(results, path, threads, gpu=None):
    """One row per (graph, hidden, model, variant); the last column is the number of threads,
    or with ``gpu`` (the GPU's name) a ``device`` column holding that name."""
    peer = _peer_seconds(results)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["graph", "nodes", "edges", "hidden", "model", "variant",
                         "ms_per_epoch", "speedup_vs_pyg", "threads" if gpu is None else "device"])
        for r in results:
            writer.writerow([r.graph, r.nodes, r.edges, r.hidden, r.model, r.variant,
                             f"{r.seconds * 1e3:.4f}", f"{speedup(r, peer):.4f}",
                             threads if gpu is None else gpu])


def write_plot(results, path, threads, repeat, gpu=None):
    """Grouped bars of our models' speedup over PyG per (graph, hidden): the full model, and
    hatched beside it the headline "ours, torch dropout" where measured, with the targets (on
    the CPU; with ``gpu``, the GPU's name, the title names it and no target is drawn)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peer = _peer_seconds(results)
    measured = {(r.key, r.variant): speedup(r, peer) for r in results
                if r.variant in (OURS, TORCH_DROPOUT)}
    groups = list(dict.fromkeys((r.graph, r.hidden) for r in results))
    models = list(dict.fromkeys(r.model for r in results))
    series = [(model, variant) for model in models for variant in (OURS, TORCH_DROPOUT)
              if any(key[2] == model and v == variant for key, v in measured)]
    positions = np.arange(len(groups))
    bar = 0.8 / max(1, len(series))
    figure, axis = plt.subplots(figsize=(max(6, 0.9 * len(groups)) + 2.5, 4.5))
    colors = {}
    for k, (model, variant) in enumerate(series):
        values = [measured.get(((graph, hidden, model), variant), math.nan)
                  for graph, hidden in groups]
        headline = variant == TORCH_DROPOUT
        bars = axis.bar(positions + (k - (len(series) - 1) / 2) * bar, values, bar,
                        color=colors.get(model), hatch="//" if headline else None,
                        alpha=0.6 if headline else 1.0,
                        label=f"{model.upper()}, {TABLE_LABELS[variant]}" if headline
                        else model.upper())
        colors.setdefault(model, bars.patches[0].get_facecolor()[:3])
        targets = TORCH_DROPOUT_TARGETS if headline else TARGETS
        if model in targets and gpu is None and (not headline or targets[model]
                                                 != TARGETS.get(model)):
            axis.axhline(targets[model], color=colors[model], linestyle="--", linewidth=1,
                         label=f"{model.upper()} target {targets[model]:g}x")
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks(positions, [f"{graph}\nh{hidden}" for graph, hidden in groups])
    axis.set_ylabel("speedup over PyG per epoch")
    where = counted(threads, 'thread') if gpu is None else gpu
    axis.set_title(f"Training epoch, ours vs PyTorch Geometric ({where}, median of {repeat})")
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # off the bars
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _legend(device="cpu", pyg_input="edge_index"):
    """Header lines explaining the variant labels (those measured on ``device``)."""
    given = ("edge_index" if pyg_input == "edge_index"
             else "a torch sparse CSR adj_t (transposed adjacency)")
    lines = [f"variant {PEER}: PyTorch Geometric's model on {given} (torch's dropout)"]
    for model in MODEL_NAMES:
        lines += [f"variant {model} {_legend_label(v.name)}: {v.description}"
                  for v in variants(model, device)]
    return lines


def _legend_label(name):
    """A variant's table label, with its CSV label where they differ."""
    label = TABLE_LABELS.get(name, name)
    return label if label == name else f"{label} ({name} in the CSV)"


def _left_out(models):
    """Lines naming the configurations of ``models`` left out on the GPU, grouped by reason."""
    reasons = {}
    for model in models:
        for variant in VARIANTS[model]:
            reason = CUDA_SKIPPED.get((model, variant.name))
            if reason is not None:
                reasons.setdefault(reason, []).append(f"{model} {variant.name}")
    return [f"left out on the GPU: {', '.join(names)}: {reason}"
            for reason, names in reasons.items()]


def _upload_line(uploads):
    """The line reporting `host_uploads` per (graph, model): ((graph, model, calls, bytes))."""
    cells = [f"{graph} {model} {calls} ({size / 1e6:.2f} MB)"
             for graph, model, calls, size in uploads]
    return ("uploads: arrays ours sends from the host to the GPU per training step after warm-up "
            f"(numba.cuda.to_device calls): {', '.join(cells)}; above 0, they are sent again every "
            "epoch and the times include them")


def run(args, out=None):
    """Run the benchmark over the selected cases and report; returns the exit status.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed command line (with the common options' ``threads`` and ``data_dir``).
    out : file, default sys.stdout
        Where the report goes (errors and progress go to stderr).

    Returns
    -------
    int
        0; 1 when a check fails (wrong result); 2 for a usage error, a missing library or
        data file, or ``--device cuda`` without a CUDA device.
    """
    out = sys.stdout if out is None else out
    selection = _selection(args, sys.stderr)
    if selection is None:
        return 2
    libraries = _import_libraries(sys.stderr)
    if libraries is None:
        return 2
    torch, _ = libraries
    on_gpu = args.device == "cuda"
    if on_gpu:
        reason = cuda_unavailable(torch)
        if reason is not None:
            print(f"error: --device cuda: {reason}; run it on a machine with an NVIDIA GPU and a "
                  "CUDA build of torch, or use --device cpu", file=sys.stderr)
            return 2
    device = torch.device(args.device)
    # Ours and PyG run on the same number of threads (on the GPU: the CPU side of the check).
    torch.set_num_threads(args.threads)
    graphs, hidden_sizes, models = selection
    results, notes, uploads = [], [], []
    with tqdm(total=len(graphs) * len(hidden_sizes) * len(models), desc="gnn",
              unit="case") as progress:
        for name in graphs:
            progress.set_postfix_str(f"loading {name}")
            try:
                cpu_case = load_graph(name, args.data_dir)
            except FileNotFoundError as exc:
                progress.close()
                print(f"error: {exc}", file=sys.stderr)
                return 2
            if cpu_case.note:
                notes.append(f"{name}: {cpu_case.nodes} nodes, {cpu_case.edges} stored edges: "
                             f"{cpu_case.note}")
            case = to_device(cpu_case, device) if on_gpu else cpu_case
            edge_index = pyg_input_of(case.adj, args.pyg_input).to(device)
            for model in models:
                try:
                    progress.set_postfix_str(f"{name} {model} check and warm-up")
                    check_model(case, model, hidden_sizes[0], edge_index)
                    if on_gpu:
                        check_against_cpu(case, cpu_case, model, hidden_sizes[0])
                except Mismatch as exc:
                    progress.close()
                    print(f"error: wrong result, benchmark aborted: {exc}", file=sys.stderr)
                    return 1
                step = warm_up(case, model, hidden_sizes[0])
                if on_gpu:
                    uploads.append((name, model, *host_uploads(step)))
                del step
                for hidden in hidden_sizes:
                    progress.set_postfix_str(f"{name} {model} h{hidden}")
                    results += measure(case, model, hidden, edge_index, args.repeat)
                    progress.update()
            del case, cpu_case, edge_index
            gc.collect()
    gpu = torch.cuda.get_device_name() if on_gpu else None
    if on_gpu:
        print(f"gnn: one full-batch training epoch (forward, cross-entropy, backward, Adam step), "
              f"median of {args.repeat} steps taken in turns after {WARMUP_STEPS} warm-up steps; "
              "float32 on the GPU, every step ending in torch.cuda.synchronize() inside the timed "
              "region (each clock starts with the GPU idle and stops when the step's GPU work is "
              f"done); --threads does not apply ({counted(args.threads, 'thread')} only for the "
              f"CPU side of the CPU check); data: {args.data_dir}", file=out)
        print(device_description(torch), file=out)
    else:
        print(f"gnn: one full-batch training epoch (forward, cross-entropy, backward, Adam step), "
              f"median of {args.repeat} steps taken in turns after {WARMUP_STEPS} warm-up steps; "
              f"float32, {counted(args.threads, 'thread')} for ours and torch; data: "
              f"{args.data_dir}", file=out)
    print("peer: PyTorch Geometric (GCNConv(cached=True), GATConv, AGNNConv) with the same "
          "architecture and dropout positions; 'vs PyG' = PyG's time / this row's time; GAT "
          f"hidden = {GAT_HEADS} heads x hidden/{GAT_HEADS}; outputs checked against PyG's "
          "with the same weights", file=out)
    if on_gpu:
        print("on the GPU: models, features, labels, masks and PyG's edge_index on the GPU; ours "
              "takes the pysparse_hpc csr_array itself (our CUDA backend copies its arrays to the "
              "GPU and keeps the copies it caches on the array: see 'uploads'); the check "
              "against PyG ran on the GPU, and ours on the GPU was checked against ours on the "
              "CPU (output and parameter gradients of the training loss, same weights, "
              f"evaluation mode, rtol {DEVICE_RTOL:g})", file=out)
    for line in (_legend(args.device, args.pyg_input) + (_left_out(models) if on_gpu else [])
                 + notes):
        print(line, file=out)
    if on_gpu:
        print(_upload_line(uploads), file=out)
    print(format_table(results), file=out)
    for line in verdicts(results, args.device):
        print(line, file=out)
    if args.accuracy:
        seeds = ACCURACY_SEEDS if args.seeds is None else args.seeds
        for line in accuracy_comparison(seeds, args.epochs, args.device):
            print(line, file=out)
    if args.csv:
        write_csv(results, args.csv, args.threads, gpu)
        print(f"wrote {args.csv}", file=out)
    if args.plot:
        write_plot(results, args.plot, args.threads, args.repeat, gpu)
        print(f"wrote {args.plot}", file=out)
    return 0
