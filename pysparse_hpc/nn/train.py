"""Full-batch node classification: train, select the epoch by validation accuracy, test.

Shared by ``python -m pysparse_hpc demo``, ``train``, the examples and the GNN benchmark, so
every model (ours and PyG's, in one process or over MPI) is trained and timed the same way.

On a `pysparse_hpc.distributed.DistGraph` each rank holds its nodes' features, labels and masks;
the loss is summed over the rank's training nodes and divided by the global number of training
nodes, and the replicated weights' gradients are summed over the ranks (`DataParallel`), so the
update equals the single-process one up to float rounding; accuracies are counted globally.
"""
import contextlib
import copy
import sys
import time
import warnings
from functools import partial
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .._compiling import compile_messages
from .._sputils import check_flag, check_positive_integer, check_real_number
from ..distributed.graph import DistGraph, comm_sum
from ._checks import float_dtype

__all__ = ["TrainResult", "default_damping", "fit", "node_tensors", "normalize_features",
           "param_groups"]


@dataclass
class TrainResult:
    """What `fit` measured.

    Attributes
    ----------
    test_accuracy, val_accuracy : float
        At the epoch of best validation accuracy (ties: lower validation loss); without
        validation nodes, at the last epoch, whose validation accuracy is then NaN (none was
        measured), as the test accuracy is without test nodes. NaN when no epoch ran. The
        model holds that epoch's weights after ``fit(restore_best=True)``; by default it
        holds the last epoch's.
    best_epoch : int
        That epoch (-1 when no epoch ran).
    seconds_per_epoch : float
        Median time of one training step (forward, backward, optimizer step), evaluation
        excluded; with a preconditioner the mean, which spreads its curvature steps over the
        others.
    epochs : int
    losses : list of float
        The training loss of every epoch (over all ranks on a distributed graph).
    skipped_epochs : list of int
        Epochs whose step was skipped because a loss or gradient was not finite on some rank.
    damping : float or None
        The preconditioner's damping (None without one).
    diverged_epoch : int
        The first epoch after whose step the model's outputs were not all finite (its
        weights overflowed: a learning rate far too high); such epochs are never selected as
        the best. -1 when every evaluated model was finite.
    """

    test_accuracy: float
    val_accuracy: float
    best_epoch: int
    seconds_per_epoch: float
    epochs: int
    losses: list = field(default_factory=list)
    skipped_epochs: list = field(default_factory=list)
    damping: float = None
    diverged_epoch: int = -1


def param_groups(model, weight_decay):
    """The optimizer's parameter groups: the model's own ``param_groups(weight_decay)`` (per
    layer weight decay) where it has one, else all parameters with ``weight_decay``."""
    if hasattr(model, "param_groups"):
        return model.param_groups(weight_decay)
    return [dict(params=model.parameters(), weight_decay=weight_decay)]


def normalize_features(x, dtype=np.float32):
    """Rows scaled to unit L1 norm: Kipf and Welling's preprocessing (rows summing to 1) on
    non-negative features; all-zero rows stay zero.

    Parameters
    ----------
    x : array_like, 2-D
        Node features.
    dtype : {np.float32, np.float64, torch.float32, torch.float64}
        Of the result, and of the arithmetic.

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    TypeError
        For a dtype other than float32 and float64.
    """
    x = np.asarray(x, dtype=float_dtype(dtype))
    # The absolute values: a signed row (random or learned features) can sum to nearly zero,
    # and dividing by its plain sum blew its entries up by orders of magnitude.
    sums = np.abs(x).sum(axis=1, keepdims=True)
    return np.divide(x, sums, out=np.zeros_like(x), where=sums != 0)


def node_tensors(data, dtype=torch.float32):
    """``(x, y, train_mask, val_mask, test_mask)`` of a `pysparse_hpc.datasets.Dataset` as
    tensors, features row-normalized (`normalize_features`) in ``dtype``.

    Parameters
    ----------
    data : pysparse_hpc.datasets.Dataset
    dtype : {torch.float32, torch.float64, np.float32, np.float64}
        Of the features (the labels are int64, the masks bool).

    Returns
    -------
    tuple of torch.Tensor

    Raises
    ------
    TypeError
        For a dtype other than float32 and float64.
    """
    # Checked here: torch.int64 truncated the normalized features to zeros and ones, and a
    # NumPy dtype failed inside torch's conversion.
    x = torch.from_numpy(normalize_features(data.x, float_dtype(dtype)))
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
    # An integer 0/1 mask would index rows 0 and 1 over and over; float labels or one-hot
    # rows would broadcast in the accuracy: both ran and reported nonsense.
    # A NumPy x failed inside the model on an attribute, and a NumPy int64 y was refused as
    # "got 1-D int64": name the type that is wrong.
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of node features, got {type(x).__name__}")
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a 1-D int64 torch.Tensor of class ids, got "
                        f"{type(y).__name__}")
    if y.dtype != torch.int64 or y.dim() != 1:
        raise TypeError(f"y must be a 1-D int64 tensor of class ids, got {y.dim()}-D "
                        f"{y.dtype}")
    if len(masks) != 3:
        raise ValueError(f"masks must be (train, val, test), got {len(masks)} of them")
    for name, mask in zip(("train_mask", "val_mask", "test_mask"), masks):
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 1:
            found = (f"{mask.dim()}-D {mask.dtype}" if isinstance(mask, torch.Tensor)
                     else type(mask).__name__)
            raise TypeError(f"{name} must be a 1-D bool tensor, got {found}")
    rows = x.shape[0] if graph is None else graph.n_local
    named = [("x", x), ("y", y)] + list(zip(("train_mask", "val_mask", "test_mask"), masks))
    for name, tensor in named:
        if tensor.shape[0] != rows:
            where = "" if graph is None else f" (rank {graph.comm.rank} owns {rows} nodes)"
            raise ValueError(f"{name} has {tensor.shape[0]} rows, expected {rows}{where}")
    labelled = masks[0] | masks[1] | masks[2]
    if bool(labelled.any()) and int(y[labelled].min()) < 0:
        raise ValueError(f"y holds the class id {int(y[labelled].min())} on a node of the "
                         f"masks; expected ids >= 0 (unlabelled nodes stay out of the masks)")


#: ``fit(preconditioner=...)``: name -> (maker class name, its damping when Adam applies the
#: preconditioned gradients). Dampings measured on Cora's GCN and GAT (BENCHMARKS.md); the
#: makers' own default, ASDL's 1e-7, is too small here.
PRECONDITIONERS = {"kfac": ("KfacGradientMaker", 1e-2), "shampoo": ("ShampooGradientMaker", 1e-3),
                   "jorge": ("JorgeGradientMaker", 1e-3)}
#: The damping where SGD applies a preconditioner's direction, if it differs from Adam's:
#: K-FAC's chosen on Cora's GCN (seeds 0-2 among 0.01, 0.03, 0.1, checked on seeds 3-9,
#: BENCHMARKS.md). Adam rescales each coordinate of the direction, which changes what a
#: damping does.
SGD_DAMPINGS = {"kfac": 3e-2}

OPTIMIZERS = ("adam", "sgd", "lion")

#: ``fit(optimizer="sgd")``: heavy-ball momentum, as Martens and Grosse apply K-FAC's direction.
SGD_MOMENTUM = 0.9

#: `fit`'s default steps between a preconditioner's curvature (and inverse or root) updates.
CURVATURE_INTERVAL = 10

#: `fit`'s default epochs between checkpoints.
CHECKPOINT_EVERY = 10

#: ``train(optimizer="sgd")`` scales the model's Adam learning rate by this factor, keyed by
#: the preconditioner SGD applies (None: SGD alone). On Cora's GCN (Adam's lr 0.01), K-FAC
#: applied by SGD is fastest at lr 0.3 among 0.1, 0.3 and 1, and plain SGD ends best at 0.3
#: too (BENCHMARKS.md). Shampoo's grafted step diverges at 30x on GAT and ends above Adam at
#: 10x (docs/precondition.rst). Jorge's direction gains nothing over SGD alone at 30x-300x.
SGD_LR_SCALING = {None: 30.0, "kfac": 30.0, "shampoo": 10.0, "jorge": 30.0}

#: ``train(optimizer="lion")`` scales the model's Adam settings by these factors. Chen et al.
#: advise a 3-10x smaller lr and a 3-10x larger (decoupled) decay; on Cora's GCN, within the
#: published 200 epochs, 0.1-0.3x of Adam's lr ends 4-15 points below Adam's test accuracy
#: and 1x about 1.5 below, with the decay mattering little between 20x and 1000x.
LION_SCALING = dict(lr=1.0, weight_decay=200.0)


def fit(model, x, adj, y, masks, *, epochs=200, lr=0.01, weight_decay=5e-4, progress=True,
        description="training", preconditioner=None, curvature_interval=None, optimizer="adam",
        compression="none", momentum_sync=None, skip_nonfinite=True, checkpointer=None,
        checkpoint_every=None, resume_from=None, checkpoint_extras=None, damping=None,
        kl_clip=None, restore_best=False):
    """Train ``model(x, adj)`` with Adam (or SGD, or Lion) and cross-entropy on the training
    nodes.

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
        Class id of every row of ``x``.
    masks : (train, val, test) boolean tensors
        1-D, one entry per row of ``x``; the training mask selects at least one node (of
        any rank). An empty validation mask selects the last epoch's model; without test
        nodes the test accuracy is NaN.
    epochs : int
        Passes over the graph, one optimizer step each (the total, with ``resume_from``).
    lr, weight_decay : float
        The optimizer's learning rate and weight decay (`param_groups` may set the decay per
        layer).
    progress : bool
        Show a progress bar (tqdm) with the loss and validation accuracy.
    description : str
        The progress bar's label.
    preconditioner : {None, "kfac", "shampoo", "jorge"}
        Precondition the gradients with that `pysparse_hpc.precondition` maker (ASDL's loop,
        ``data_size`` the training nodes of all ranks) before ``optimizer`` applies them:
        Adam, as Izadi et al. train GCNs with K-FAC, or SGD with momentum, as Martens and
        Grosse apply K-FAC's direction (on Cora's GCN the faster of the two, BENCHMARKS.md).
        On a `DistGraph` the maker sums the gradients and the curvature over the ranks (KAISA)
        in place of `DataParallel`.
    curvature_interval : int, optional
        With a preconditioner: steps between curvature (and inverse or root) updates.
        Default: `CURVATURE_INTERVAL`.
    optimizer : {"adam", "sgd", "lion"}
        SGD (momentum `SGD_MOMENTUM`) and Lion take ``lr`` and ``weight_decay`` as given:
        scale Adam's by `SGD_LR_SCALING` or `LION_SCALING`. Lion takes no preconditioner.
    compression, momentum_sync : str, optional
        With Lion: how the ranks agree on the update and keep their momenta
        (`pysparse_hpc.optim.DistributedLion`, its defaults); ``"none"`` allreduces the
        gradients.
    skip_nonfinite : bool
        Skip the step of an epoch whose loss or gradients are not finite on any rank (all
        ranks agree through one allreduced flag, so the replicas never diverge), and say so
        once per epoch (`TrainResult.skipped_epochs`). False steps anyway.
    checkpointer : pysparse_hpc.distributed.Checkpointer, optional
        Save a checkpoint (asynchronously) after every ``checkpoint_every`` epochs and after
        the last; its step is the number of epochs done. The model, the optimizer (each rank's
        own state in its shard, rank 0's in the shared state), the preconditioner, the RNG
        states and the progress so far (losses, best epoch) are saved, with
        ``checkpoint_extras`` in the shared state.
    checkpoint_every : int, optional
        Epochs between checkpoints, with ``checkpointer``. Default: `CHECKPOINT_EVERY`.
    resume_from : pysparse_hpc.distributed.Checkpoint, optional
        A checkpoint of this training (`Checkpointer.load`): training continues after its
        epochs, bit for bit as the uninterrupted run on as many ranks as saved it; on another
        number of ranks from rank 0's optimizer state and RNG states. ``epochs`` is the total:
        a checkpoint at or past it trains nothing and returns the result it recorded.
    checkpoint_extras : dict, optional
        Entries added to each checkpoint's shared state (``Checkpoint.shared``), beside
        fit's own (``model``, ``progress``, ``optimizer``, ``rng``, ``preconditioner`` and
        ``best_model``, which they may not take).
    damping : float, optional
        The preconditioner's damping. Default: the one measured for it and the optimizer
        applying it (`default_damping`).
    kl_clip : float, optional
        With ``preconditioner="kfac"``: bound every step's predicted change of the model's
        output distribution (KAISA's KL clipping, `KfacGradientMaker` ``kl_clip``), at the
        optimizer's current learning rate. Default: off.
    restore_best : bool
        Leave the model with the weights of the epoch `TrainResult` reports (the best
        validation accuracy), kept in memory (and in the checkpoints) as training goes. By
        default the model keeps the last epoch's weights, which need not score the reported
        accuracies. Either way the model is left in evaluation mode.

    Returns
    -------
    TrainResult

    Raises
    ------
    ValueError
        For a class id in ``y`` (on a node of the masks) that the model's output has no
        column for, at the first forward pass, before any step; for a model with no
        parameter to train; for an option of a preconditioner, an optimizer or checkpoints
        given without it (``curvature_interval`` or ``damping`` without ``preconditioner``,
        ``checkpoint_every`` or ``checkpoint_extras`` without ``checkpointer``, ...), which
        would go unused.
    """
    from tqdm.auto import tqdm

    progress = check_flag(progress, "progress")
    skip_nonfinite = check_flag(skip_nonfinite, "skip_nonfinite")
    restore_best = check_flag(restore_best, "restore_best")
    _check_fit_objects(model, checkpointer, resume_from)

    graph = adj if isinstance(adj, DistGraph) else None
    if graph is None:
        _check_node_tensors(graph, x, y, masks)
    else:  # a rank's own rows: agree first, so every rank raises instead of some waiting
        try:
            _check_node_tensors(graph, x, y, masks)
            error = None
        except (TypeError, ValueError) as exc:
            error = exc
        graph.comm.raise_if_any(error)
    total = _Totals(graph)
    train_mask, val_mask, test_mask = masks
    n_train, n_val, n_test = total(*(float(m.sum()) for m in masks))
    if n_train == 0:
        raise ValueError("the training mask selects no node")
    select_last = n_val == 0   # no validation to select by: the last epoch is the model
    checkpoint_every = _checkpoint_every(checkpointer, checkpoint_every, checkpoint_extras)
    _check_schedule(epochs, lr, weight_decay)
    _check_kl_clip(preconditioner, kl_clip)
    step_optimizer = _optimizer(optimizer, param_groups(model, weight_decay), lr, graph,
                                compression, momentum_sync, preconditioner)
    trained = model
    maker = None
    if preconditioner is not None:
        maker = _preconditioner(preconditioner, model, graph, n_train, curvature_interval,
                                optimizer, damping, kl_clip, step_optimizer)
    elif damping is not None or curvature_interval is not None:
        name, value = (("damping", damping) if damping is not None else
                       ("curvature_interval", curvature_interval))
        raise ValueError(f"{name} applies to a preconditioner, got {name}={value!r} with "
                         f"preconditioner=None; expected one of {tuple(PRECONDITIONERS)}")
    elif graph is not None and graph.comm.size > 1 and optimizer != "lion":
        from ..distributed.data_parallel import DataParallel
        # Every rank's loss is already divided by the global count: sum, do not average.
        trained = DataParallel(model, graph.comm, average=False)
    params = [p for p in model.parameters() if p.requires_grad]
    run = _Progress()
    saved = _Saved(model, step_optimizer, maker, run, restore_best)
    if resume_from is not None:
        saved.restore(resume_from)
        if run.epochs_done > epochs and (graph is None or graph.comm.rank == 0):
            # Nothing is trained, and the model is of more epochs than asked for: say so
            # (once, not once per rank), as the result then reports its own count.
            warnings.warn(f"the checkpoint holds {run.epochs_done} epochs, more than the "
                          f"{epochs} asked for: nothing is trained, and the result is that "
                          f"of its {run.epochs_done} epochs", UserWarning, stacklevel=2)
    if not params:
        raise ValueError("the model has no parameter that requires grad: nothing to train")
    labelled = masks[0] | masks[1] | masks[2]

    def first_forward(module, args, logits):
        # once: a hook left behind by an error would run (a collective) on later calls
        check_classes.remove()
        _check_classes(graph, y, labelled, logits)
    show = progress and (graph is None or graph.comm.rank == 0)
    bar = tqdm(range(run.epochs_done, epochs), desc=description, disable=not show, leave=False,
               mininterval=0.5, initial=run.epochs_done, total=epochs)
    best, step_seconds, losses, skipped = run.best, run.step_seconds, run.losses, run.skipped
    check_classes = model.register_forward_hook(first_forward)
    # A first run stops in the first epoch while kernels compile: the bar's output says why.
    try:
        with compile_messages(_write_under_bar) if show else contextlib.nullcontext():
            for epoch in bar:
                model.train()
                start = time.perf_counter()
                step_optimizer.zero_grad()
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
                failed = _nonfinite_ranks(graph, loss, params) if skip_nonfinite else []
                if failed:
                    skipped.append(epoch)
                    _say(show, graph, f"epoch {epoch + 1}: non-finite loss or gradient on rank"
                         f"{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}; "
                         "step skipped on every rank")
                else:
                    step_optimizer.step()
                step_seconds.append(time.perf_counter() - start)
                losses.append(total(loss.item()))
                model.eval()
                with torch.no_grad():
                    logits = model(x, adj)
                    val_loss, val_correct, test_correct, nonfinite = total(
                        float(F.cross_entropy(logits[val_mask], y[val_mask], reduction="sum")),
                        _correct(logits, y, val_mask), _correct(logits, y, test_mask),
                        float((~torch.isfinite(logits)).sum()))
                    # No validation nodes: no accuracy (NaN), where 0 read as a model wrong on
                    # every node.
                    val_loss, val_accuracy = _ratio(val_loss, n_val), _ratio(val_correct, n_val)
                    if nonfinite:
                        # NaN outputs predict class 0 everywhere: an accuracy, but not a model's
                        if run.diverged < 0:
                            run.diverged = epoch
                    elif select_last or (val_accuracy, -val_loss) > (best[0], -best[1]):
                        best = (val_accuracy, val_loss, _ratio(test_correct, n_test), epoch)
                        saved.keep_best()
                bar.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{val_accuracy:.3f}", refresh=False)
                run.best, run.epochs_done = best, epoch + 1
                if checkpointer is not None and (run.epochs_done % checkpoint_every == 0
                                                 or run.epochs_done == epochs):
                    saved.save(checkpointer, checkpoint_extras)
    finally:
        # an error or an interrupt before the first forward ended leaves no hook behind
        check_classes.remove()
        bar.close()
    saved.restore_best()
    if checkpointer is not None:
        checkpointer.wait()  # the last checkpoint is durable before fit returns
    if best[3] < 0:   # no epoch ran: no accuracy was measured
        best = (float("nan"), float("inf"), float("nan"), -1)
    return TrainResult(test_accuracy=best[2], val_accuracy=best[0], best_epoch=best[3],
                       seconds_per_epoch=float((np.median if maker is None else np.mean)(
                           step_seconds)) if step_seconds
                       else float("nan"), epochs=run.epochs_done, losses=losses,
                       skipped_epochs=skipped,
                       damping=None if maker is None else maker.config.damping,
                       diverged_epoch=run.diverged)


def _check_classes(graph, y, labelled, logits):
    """At `fit`'s first forward pass: refuse, before anything is learnt, class ids that
    ``logits`` has no column for. cross_entropy raised a bare IndexError for one on
    a training node, after the first step for one on a validation node, and never for one on
    a test node, which counted as wrong."""
    error = None
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        found = (f"{logits.dim()}-D" if isinstance(logits, torch.Tensor)
                 else type(logits).__name__)
        error = TypeError(f"the model must return (nodes, classes) logits, got {found}")
    elif logits.shape[0] != y.shape[0]:
        # torch's mask indexing said only that a mask's shape did not match.
        error = ValueError(f"the model returned logits for {logits.shape[0]} nodes, expected "
                           f"{y.shape[0]} (one per row of x)")
    elif bool(labelled.any()) and int(y[labelled].max()) >= logits.shape[1]:
        error = ValueError(f"y holds the class id {int(y[labelled].max())} on a node of the "
                           f"masks, but the model's output has {logits.shape[1]} classes")
    if graph is None:
        if error is not None:
            raise error
    else:  # the forward of every rank reaches this hook: agree, so every rank raises
        graph.comm.raise_if_any(error)


@dataclass
class _Progress:
    """Where `fit` is: what a checkpoint needs besides the model and the optimizer."""
    epochs_done: int = 0
    best: tuple = (-1.0, float("inf"), 0.0, -1)  # val accuracy, val loss, test accuracy, epoch
    step_seconds: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    diverged: int = -1


#: The per-epoch lists of `_Progress` and the dtypes they are saved in.
_PER_EPOCH = {"step_seconds": np.float64, "losses": np.float64, "skipped": np.int64}


class _Saved:
    """What a checkpoint of `fit` holds, and restoring it.

    Replicated state (the model, the progress), rank 0's own state and the preconditioner's
    state gathered from its owner ranks go to the shared part, each rank's own state (the
    optimizer's and preconditioner's, which compressed Lion and KAISA's owners keep per rank,
    and the RNG states) to its shard: the same number of ranks resumes from its shards, bit
    for bit; another number from the shared part. One process's shard is empty: the shared
    part holds all its state.
    """

    def __init__(self, model, optimizer, maker, progress, restore_best=False):
        self.model, self.optimizer, self.maker, self.progress = model, optimizer, maker, progress
        #: Whether the best epoch's model state is kept (``fit(restore_best=True)``), and it.
        self.keeps_best = restore_best
        self.best_model = None

    def keep_best(self):
        """Copy the model's state as the best epoch's, where it is kept."""
        if self.keeps_best:
            self.best_model = {name: value.detach().clone()
                               for name, value in self.model.state_dict().items()}

    def restore_best(self):
        """Load the best epoch's state into the model (where it is kept and an epoch was
        selected)."""
        if self.best_model is not None:
            self.model.load_state_dict(self.best_model)

    def _own(self):
        from ..distributed.checkpoint import rng_states
        own = {"optimizer": self.optimizer.state_dict(), "rng": rng_states()}
        if self.maker is not None:
            own["preconditioner"] = self.maker.state_dict()
        return own

    def save(self, checkpointer, extras):
        own = self._own()
        shared = dict(extras or {}, model=self.model.state_dict(),
                      progress=self._progress_saved(), **own)
        if self.keeps_best:
            shared["best_model"] = self.best_model
        if self.maker is not None:  # a collective: KAISA's owners hold parts of it
            shared["preconditioner"] = self.maker.consolidated_state_dict()
        # One process's own state is all in the shared part: an empty shard writes it once.
        checkpointer.save(self.progress.epochs_done, own if checkpointer.comm.size > 1 else {},
                          shared=shared if checkpointer.comm.rank == 0 else None)

    def _progress_saved(self):
        # The per-epoch lists as one array each: as lists they were one entry of the
        # checkpoint's tree per epoch, so every save cost more than the last.
        progress = dict(vars(self.progress))
        for name, dtype in _PER_EPOCH.items():
            progress[name] = np.asarray(progress[name], dtype=dtype)
        return progress

    @staticmethod
    def check(checkpoint):
        """Refuse a checkpoint `fit` did not write (a plain `Checkpointer`'s), naming what it
        lacks; before anything reads it."""
        missing = {"model", "progress", "optimizer", "rng"} - set(checkpoint.shared or {})
        if missing:
            raise ValueError(f"checkpoint {checkpoint.path} is not one of fit's: it lacks "
                             f"{sorted(missing)}")

    def restore(self, checkpoint):
        from ..distributed.checkpoint import restore_rng_states
        self.check(checkpoint)
        shared = checkpoint.shared
        try:
            self.model.load_state_dict(shared["model"])
        except RuntimeError as exc:
            raise ValueError(f"checkpoint {checkpoint.path} holds another model: {exc}") \
                from None
        # The shard is None when another number of ranks saved it, {} when one process did.
        own = checkpoint.shard or shared
        # Copies: torch's optimizers keep the loaded tensors as their state and update them in
        # place, so training went on to change the checkpoint, and a second resume from the
        # same Checkpoint started from a later state.
        self.optimizer.load_state_dict(copy.deepcopy(own["optimizer"]))
        if self.maker is not None:
            if "preconditioner" not in own:
                raise ValueError(f"checkpoint {checkpoint.path} has no preconditioner state")
            self.maker.load_state_dict(copy.deepcopy(own["preconditioner"]))
        restore_rng_states(own["rng"])
        for name, value in shared["progress"].items():
            if isinstance(value, np.ndarray):   # a per-epoch list, as saved
                value = value.tolist()
            setattr(self.progress, name, tuple(value) if name == "best" else list(value)
                    if isinstance(value, (list, tuple)) else value)
        if self.keeps_best:
            if "best_model" not in shared and self.progress.best[3] >= 0:
                raise ValueError(f"checkpoint {checkpoint.path} was saved without "
                                 f"restore_best: it lacks the best epoch's weights")
            self.best_model = shared.get("best_model")


def _optimizer(name, groups, lr, graph, compression, momentum_sync, preconditioner):
    """The torch optimizer of `fit`: Adam, SGD, Lion, or Lion agreed over a graph's ranks."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    if name != "lion":
        if compression != "none" or momentum_sync is not None:
            raise ValueError(f"compression and momentum_sync apply to optimizer='lion', got "
                             f"compression={compression!r}, momentum_sync={momentum_sync!r} "
                             f"with optimizer={name!r}")
        if name == "sgd":
            return torch.optim.SGD(groups, lr=lr, momentum=SGD_MOMENTUM)
        return torch.optim.Adam(groups, lr=lr)
    from .. import optim

    if preconditioner is not None:
        raise ValueError("a preconditioner feeds Adam or SGD; optimizer='lion' takes none")
    if graph is None and compression == "none" and momentum_sync in (None, "local"):
        return optim.Lion(groups, lr=lr)
    from ..distributed import init
    # The loss of every rank is already divided by the global count: sum the gradients.
    return optim.DistributedLion(groups, comm=init() if graph is None else graph.comm, lr=lr,
                                 compression=compression, momentum_sync=momentum_sync,
                                 average=False)


def _nonfinite_ranks(graph, loss, params):
    """The ranks (all of them agreeing) where ``loss`` or a gradient is not finite."""
    bad = not bool(torch.isfinite(loss.detach()).all()) or any(
        p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in params)
    if graph is None or graph.comm.size == 1:
        return [0] if bad else []
    flags = np.zeros(graph.comm.size, dtype=np.int32)
    flags[graph.comm.rank] = bad
    graph.comm.Allreduce(flags, "sum", kind="nonfinite check")
    return np.flatnonzero(flags).tolist()


def _write_under_bar(message):
    """Print a line above the progress bar, on standard error as the bar itself: tqdm's
    default, standard output, mixed the notices into a run's results."""
    from tqdm.auto import tqdm
    tqdm.write(message, file=sys.stderr)


def _say(show, graph, message):
    """``message`` once per job: under the progress bar where one shows, else as a warning on
    rank 0 (the message names the ranks it is about)."""
    if show:
        _write_under_bar(message)
    elif graph is None or graph.comm.rank == 0:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _summed_cross_entropy(logits, labels, reduction="mean", count=1.0):
    """Cross-entropy summed over the rows and divided by ``count`` (all ranks' training
    nodes); ``reduction="sum"`` (the preconditioners' curvature pass) leaves the sum."""
    total = F.cross_entropy(logits, labels, reduction="sum")
    return total if reduction == "sum" else total / count


def default_damping(preconditioner, optimizer="adam"):
    """The damping `fit` gives ``preconditioner`` when ``optimizer`` applies its gradients:
    the one in `SGD_DAMPINGS` under SGD, where there is one, else the one in
    `PRECONDITIONERS`."""
    if preconditioner not in PRECONDITIONERS:
        raise ValueError(f"preconditioner must be one of {tuple(PRECONDITIONERS)}, got "
                         f"{preconditioner!r}")
    adam_damping = PRECONDITIONERS[preconditioner][1]
    if optimizer == "sgd":
        return SGD_DAMPINGS.get(preconditioner, adam_damping)
    return adam_damping


# The keys of the shared state of fit's checkpoints: checkpoint_extras may not use them.
_CHECKPOINT_KEYS = ("model", "progress", "optimizer", "rng", "preconditioner", "best_model")


def _check_fit_objects(model, checkpointer, resume_from):
    """Refuse, before anything trains, objects of the wrong kind: a path given as the
    checkpointer failed at the first save (after ``checkpoint_every`` epochs), and a model or
    a checkpoint of the wrong kind with an AttributeError naming neither."""
    from ..distributed.checkpoint import Checkpoint, Checkpointer
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if checkpointer is not None and not isinstance(checkpointer, Checkpointer):
        raise TypeError(f"checkpointer must be a pysparse_hpc.distributed.Checkpointer or None, "
                        f"got {type(checkpointer).__name__} (make one with Checkpointer(path))")
    if resume_from is not None and not isinstance(resume_from, Checkpoint):
        raise TypeError(f"resume_from must be a Checkpoint (from Checkpointer.load()) or None, "
                        f"got {type(resume_from).__name__}")


def _checkpoint_every(checkpointer, every, extras):
    """The epochs between checkpoints (default `CHECKPOINT_EVERY`), checked with
    ``checkpoint_extras``: both are refused without a checkpointer, where they went unused."""
    if checkpointer is None:
        given = [f"{name}={value!r}" for name, value in (("checkpoint_every", every),
                                                         ("checkpoint_extras", extras))
                 if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} "
                             f"to checkpoints, got checkpointer=None; pass a Checkpointer to "
                             f"save them")
    _check_extras(extras)
    if every is None:
        return CHECKPOINT_EVERY
    return check_positive_integer(every, "checkpoint_every")


def _check_extras(extras):
    """Refuse ``checkpoint_extras`` that are not a dict, or that take one of fit's own keys:
    the model's or optimizer's state silently replaced the entry of the same name."""
    if extras is None:
        return
    if not isinstance(extras, dict):
        raise TypeError(f"checkpoint_extras must be a dict or None, got "
                        f"{type(extras).__name__}")
    taken = [key for key in _CHECKPOINT_KEYS if key in extras]
    if taken:
        raise ValueError(f"checkpoint_extras may not use fit's own keys {_CHECKPOINT_KEYS}, got "
                         f"{taken}")


def _check_schedule(epochs, lr, weight_decay):
    """Raise ``ValueError`` (``TypeError`` for a non-number) unless ``epochs`` is an int >= 0,
    ``lr`` a finite number > 0 and ``weight_decay`` a finite number >= 0: checked before
    anything trains, so that a bad value is one clear error on every rank alike rather than
    the optimizer's, raised on some ranks while others wait."""
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)):
        raise TypeError(f"epochs must be an int, got {type(epochs).__name__}")
    if epochs < 0:
        raise ValueError(f"epochs must be at least 0, got {epochs}")
    check_real_number("lr", lr)
    check_real_number("weight_decay", weight_decay, positive=False)
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay}")


def _check_kl_clip(preconditioner, kl_clip):
    """Raise ``ValueError`` where `kl_clip` is set without K-FAC, and as `KfacGradientMaker`
    does where it is not a number > 0 (None: off, always valid)."""
    if kl_clip is None:
        return
    if preconditioner != "kfac":
        raise ValueError(f"kl_clip applies to preconditioner='kfac', got {preconditioner!r}")
    check_real_number("kl_clip", kl_clip)


def _preconditioner(name, model, graph, n_train, curvature_interval, optimizer, damping,
                    kl_clip=None, step_optimizer=None):
    """``fit``'s gradient maker; with `kl_clip` (K-FAC only), clipped at the learning rate
    of `step_optimizer`'s first parameter group."""
    from .. import precondition
    from ..distributed import Communicator

    if name not in PRECONDITIONERS:
        raise ValueError(f"preconditioner must be None or one of {tuple(PRECONDITIONERS)}, got "
                         f"{name!r}")
    curvature_interval = (CURVATURE_INTERVAL if curvature_interval is None else
                          check_positive_integer(curvature_interval, "curvature_interval"))
    maker_name = PRECONDITIONERS[name][0]
    if damping is None:
        damping = default_damping(name, optimizer)
    config = precondition.PreconditioningConfig(
        data_size=int(n_train), damping=damping, curvature_upd_interval=curvature_interval,
        preconditioner_upd_interval=curvature_interval)
    options = dict(fisher_type="emp") if name == "kfac" else {}
    if kl_clip is not None:   # checked by the caller (`_check_kl_clip`)
        options.update(kl_clip=kl_clip, lr=lambda: step_optimizer.param_groups[0]["lr"])
    # Without a DistGraph this process holds the whole graph: a one-rank communicator says
    # so, where None would warn of a forgotten comm= on a job of several ranks.
    return getattr(precondition, maker_name)(
        model, config, comm=Communicator() if graph is None else graph.comm, **options)


def _ratio(total, count):
    """``total / count`` over a split's nodes; NaN for an empty split, which has no accuracy
    (0 read as a model that got every node wrong)."""
    return total / count if count else float("nan")


def _correct(logits, y, mask):
    return float((logits[mask].argmax(dim=1) == y[mask]).sum())
