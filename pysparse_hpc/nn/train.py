"""Full-batch node classification: train, select the epoch by validation accuracy, test.

Shared by ``python -m pysparse_hpc demo``, ``train``, the examples and the GNN benchmark, so
every model (ours and PyG's, in one process or over MPI) is trained and timed the same way.

On a `pysparse_hpc.distributed.DistGraph` each rank holds its nodes' features, labels and masks;
the loss is summed over the rank's training nodes and divided by the global number of training
nodes, and the replicated weights' gradients are summed over the ranks (`DataParallel`), so the
update equals the single-process one up to float rounding; accuracies are counted globally.
"""
import contextlib
import time
from functools import partial
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .._compiling import compile_messages
from ..distributed.graph import DistGraph, comm_sum

__all__ = ["TrainResult", "fit", "node_tensors", "normalize_features"]


@dataclass
class TrainResult:
    """What `fit` measured.

    Attributes
    ----------
    test_accuracy, val_accuracy : float
        At the epoch of best validation accuracy (ties: lower validation loss).
    best_epoch : int
    seconds_per_epoch : float
        Median time of one training step (forward, backward, optimizer step), evaluation
        excluded; with a preconditioner the mean, which spreads its curvature steps over the
        others.
    epochs : int
    losses : list of float
        The training loss of every epoch (over all ranks on a distributed graph).
    """

    test_accuracy: float
    val_accuracy: float
    best_epoch: int
    seconds_per_epoch: float
    epochs: int
    losses: list = field(default_factory=list)


def normalize_features(x):
    """Rows scaled to sum 1 (Kipf and Welling's preprocessing); all-zero rows stay zero."""
    x = np.asarray(x, dtype=np.float32)
    sums = x.sum(axis=1, keepdims=True)
    return np.divide(x, sums, out=np.zeros_like(x), where=sums != 0)


def node_tensors(data, dtype=torch.float32):
    """``(x, y, train_mask, val_mask, test_mask)`` of a `pysparse_hpc.datasets.Dataset` as
    tensors, features row-normalized."""
    x = torch.from_numpy(normalize_features(data.x)).to(dtype)
    masks = [torch.from_numpy(np.asarray(m, dtype=bool)) for m in
             (data.train_mask, data.val_mask, data.test_mask)]
    return (x, torch.from_numpy(np.asarray(data.y, dtype=np.int64)), *masks)


class _Totals:
    """Sums over the ranks of a distributed graph (plain values in one process)."""

    def __init__(self, graph):
        self.comm = None if graph is None else graph.comm

    def __call__(self, *values):
        if self.comm is None or self.comm.size == 1:
            return values if len(values) > 1 else values[0]
        summed = comm_sum(self.comm, np.array(values, dtype=np.float64))
        return tuple(summed) if len(values) > 1 else summed[0]


def _check_node_tensors(graph, x, y, masks):
    rows = x.shape[0] if graph is None else graph.n_local
    named = [("x", x), ("y", y)] + list(zip(("train_mask", "val_mask", "test_mask"), masks))
    for name, tensor in named:
        if tensor.shape[0] != rows:
            where = "" if graph is None else f" (rank {graph.comm.rank} owns {rows} nodes)"
            raise ValueError(f"{name} has {tensor.shape[0]} rows, expected {rows}{where}")


#: ``fit(preconditioner=...)``: name -> (maker class name, its damping). Dampings measured on
#: Cora's GCN and GAT (BENCHMARKS.md); the makers' own default, ASDL's 1e-7, is too small here.
PRECONDITIONERS = {"kfac": ("KfacGradientMaker", 1e-2), "shampoo": ("ShampooGradientMaker", 1e-3),
                   "jorge": ("JorgeGradientMaker", 1e-3)}


def fit(model, x, adj, y, masks, *, epochs=200, lr=0.01, weight_decay=5e-4, progress=True,
        description="training", preconditioner=None, curvature_interval=10):
    """Train ``model(x, adj)`` with Adam and cross-entropy on the training nodes.

    Parameters
    ----------
    model : torch.nn.Module
        Called as ``model(x, adj)``; a ``param_groups(weight_decay)`` method, when present,
        sets per-layer weight decay.
    x : torch.Tensor
        Node features (on a `DistGraph`, this rank's owned rows).
    adj : object
        Whatever the model takes as its graph. A `DistGraph` trains over its ranks (every rank
        calls `fit` with its own rows); only rank 0 shows a progress bar.
    y : torch.Tensor of int64
    masks : (train, val, test) boolean tensors
    epochs : int
    lr, weight_decay : float
    progress : bool
        Show a progress bar (tqdm) with the loss and validation accuracy.
    preconditioner : {None, "kfac", "shampoo", "jorge"}
        Precondition the gradients with that `pysparse_hpc.precondition` maker (ASDL's loop,
        ``data_size`` the training nodes of all ranks, the damping of `PRECONDITIONERS`)
        before Adam applies them, as Izadi et al. train GCNs with K-FAC. On a `DistGraph` the
        maker sums the gradients and the curvature over the ranks (KAISA) in place of
        `DataParallel`.
    curvature_interval : int
        With a preconditioner: steps between curvature (and inverse or root) updates.

    Returns
    -------
    TrainResult
    """
    from tqdm.auto import tqdm

    graph = adj if isinstance(adj, DistGraph) else None
    if graph is None:
        _check_node_tensors(graph, x, y, masks)
    else:  # a rank's own rows: agree first, so every rank raises instead of some waiting
        try:
            _check_node_tensors(graph, x, y, masks)
            error = None
        except ValueError as exc:
            error = exc
        graph.comm.raise_if_any(error)
    total = _Totals(graph)
    train_mask, val_mask, test_mask = masks
    n_train, n_val, n_test = total(*(float(m.sum()) for m in masks))
    if n_train == 0:
        raise ValueError("the training mask selects no node")
    n_val, n_test = max(n_val, 1.0), max(n_test, 1.0)  # empty splits report accuracy 0
    groups = (model.param_groups(weight_decay) if hasattr(model, "param_groups")
              else [dict(params=model.parameters(), weight_decay=weight_decay)])
    optimizer = torch.optim.Adam(groups, lr=lr)
    trained = model
    maker = None
    if preconditioner is not None:
        maker = _preconditioner(preconditioner, model, graph, n_train, curvature_interval)
    elif graph is not None and graph.comm.size > 1:
        from ..distributed.data_parallel import DataParallel
        # Every rank's loss is already divided by the global count: sum, do not average.
        trained = DataParallel(model, graph.comm, average=False)
    show = progress and (graph is None or graph.comm.rank == 0)
    bar = tqdm(range(epochs), desc=description, disable=not show, leave=False, mininterval=0.5)
    best = (-1.0, float("inf"), 0.0, -1)  # val accuracy, val loss, test accuracy, epoch
    step_seconds, losses = [], []
    # A first run stops in the first epoch while kernels compile: the bar's output says why.
    with compile_messages(tqdm.write) if show else contextlib.nullcontext():
        for epoch in bar:
            model.train()
            start = time.perf_counter()
            optimizer.zero_grad()
            if maker is None:
                logits = trained(x, adj)
                loss = (F.cross_entropy(logits[train_mask], y[train_mask], reduction="sum")
                        / n_train)
                loss.backward()
            else:
                placeholder = maker.setup_model_call(model, x, adj)
                maker.setup_loss_call(partial(_summed_cross_entropy, count=n_train),
                                      placeholder[train_mask], y[train_mask])
                _, loss = maker.forward_and_backward()
            optimizer.step()
            step_seconds.append(time.perf_counter() - start)
            losses.append(total(loss.item()))
            model.eval()
            with torch.no_grad():
                logits = model(x, adj)
                val_loss, val_correct, test_correct = total(
                    float(F.cross_entropy(logits[val_mask], y[val_mask], reduction="sum")),
                    _correct(logits, y, val_mask), _correct(logits, y, test_mask))
                val_loss, val_accuracy = val_loss / n_val, val_correct / n_val
                if (val_accuracy, -val_loss) > (best[0], -best[1]):
                    best = (val_accuracy, val_loss, test_correct / n_test, epoch)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{val_accuracy:.3f}", refresh=False)
    bar.close()
    return TrainResult(test_accuracy=best[2], val_accuracy=best[0], best_epoch=best[3],
                       seconds_per_epoch=float((np.median if maker is None else np.mean)(
                           step_seconds)) if step_seconds
                       else float("nan"), epochs=epochs, losses=losses)


def _summed_cross_entropy(logits, labels, reduction="mean", count=1.0):
    """Cross-entropy summed over the rows and divided by ``count`` (all ranks' training
    nodes); ``reduction="sum"`` (the preconditioners' curvature pass) leaves the sum."""
    total = F.cross_entropy(logits, labels, reduction="sum")
    return total if reduction == "sum" else total / count


def _preconditioner(name, model, graph, n_train, curvature_interval):
    from .. import precondition

    if name not in PRECONDITIONERS:
        raise ValueError(f"preconditioner must be None or one of {tuple(PRECONDITIONERS)}, got "
                         f"{name!r}")
    if isinstance(curvature_interval, bool) or not isinstance(curvature_interval, int) \
            or curvature_interval < 1:
        raise ValueError(f"curvature_interval must be a positive int, got {curvature_interval!r}")
    maker_name, damping = PRECONDITIONERS[name]
    config = precondition.PreconditioningConfig(
        data_size=int(n_train), damping=damping, curvature_upd_interval=curvature_interval,
        preconditioner_upd_interval=curvature_interval)
    options = dict(fisher_type="emp") if name == "kfac" else {}
    return getattr(precondition, maker_name)(
        model, config, comm=None if graph is None else graph.comm, **options)


def _correct(logits, y, mask):
    return float((logits[mask].argmax(dim=1) == y[mask]).sum())
