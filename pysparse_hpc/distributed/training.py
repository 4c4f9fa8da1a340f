"""Full-graph node classification over MPI: what ``python -m pysparse_hpc train`` runs.

Rank 0 reads the graph, partitions it and scatters each rank its rows (a rank never holds more
than its piece); every rank then builds the same model from the same seed and trains it with
`pysparse_hpc.nn.train.fit`, the loop the single-process demo uses. Started without ``mpiexec``
it is a one-rank run of the same code.
"""
import contextlib
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .. import datasets
from .._sputils import as_numpy_dtype, check_flag, check_integer, check_positive_integer
from ._comm import PARTICIPATION_KIND, check_communicator, init, raising_alike
from .graph import DistGraph, comm_sum
from ._metis import multi_constraint_available
from .partition import (PARTITION_METHODS, ROWS_AND_NNZ, Partition,
                        partition as make_partition)

__all__ = ["DistributedTrainResult", "default_settings", "train"]

_DTYPES = ("float32", "float64")
#: The communicator's kinds of the optimizers' own collectives: the preconditioners'
#: (`pysparse_hpc.precondition`) and `pysparse_hpc.optim.DistributedLion`'s.
_OPTIMIZER_KINDS = ("gradient allreduce", "curvature allreduce", "inverse broadcast",
                    "gradient broadcast", "kl clip allreduce", "lion votes",
                    "lion participation", "momentum sync")


@dataclass
class DistributedTrainResult:
    """What `train` measured (the same on every rank).

    Attributes
    ----------
    dataset, model, partition_method : str
    ranks : int
    test_accuracy, val_accuracy : float
        At the epoch of best validation accuracy.
    best_epoch, epochs : int
    losses : list of float
        Training loss of every epoch.
    seconds_per_epoch : float
        Each rank's median training step (with a preconditioner the mean,
        `pysparse_hpc.nn.train.TrainResult`), averaged over the ranks (every step ends in the
        gradient allreduce, so the ranks' steps differ only by how long each waited). A resumed
        run's include the steps before its checkpoint, as its losses do.
    seconds_total : float
        Wall time of this run's training (evaluation included; after the checkpoint, when
        resumed).
    halo_bytes_per_epoch : float
        Bytes all ranks received in halo and reverse-halo exchanges in an epoch (training and
        evaluation passes), the median epoch of those this run trained (after its checkpoint,
        when resumed). This and the other ``*_bytes_per_epoch`` are NaN when it trained none.
    cagnet_bytes_per_epoch : float
        What CAGNET's 1D scheme (every rank receives all of H for each product) would move for
        the same exchanges: ``(P - 1) * n`` rows of each exchanged width.
    halo_bytes_once : float
        The halo bytes of the run beyond ``halo_bytes_per_epoch`` in each epoch: the input
        rows of a product a model keeps (GCN's ``Â X`` on wide features), exchanged once,
        when it is first kept. Averaged in, they made the figure per epoch depend on the
        number of epochs. NaN when it trained none.
    allreduce_bytes_per_epoch : float
        Gradient and metric allreduce payload, all ranks together.
    partition_summary : str
    optimizer : str
        ``"adam"``, ``"sgd"`` or ``"lion"``: what applied the (preconditioned) gradients.
    compression : str
        Lion's (`pysparse_hpc.optim.DistributedLion`); ``"none"`` otherwise.
    optimizer_bytes_per_epoch : float
        The optimizer's own collectives, all ranks together: a preconditioner's gradient and
        curvature sums and broadcasts, or Lion's gradient allreduce or votes and momentum
        synchronisations (either replaces `DataParallel`'s allreduce).
    skipped_epochs : list of int
        Epochs whose step every rank skipped for a non-finite loss or gradient.
    diverged_epoch : int
        The first epoch after whose step the model's outputs were not all finite (-1: none);
        see `pysparse_hpc.nn.train.TrainResult`.
    preconditioner : str or None
        ``"kfac"``, ``"shampoo"``, ``"jorge"`` or None.
    damping : float or None
        The preconditioner's damping (None without one).
    kl_clip : float or None
        K-FAC's bound on each step (None: off).
    lr, weight_decay : float or None
        The optimizer's.
    resumed_after : int or None
        The epochs of the checkpoint the run resumed from (None: a run from the start).
    """

    dataset: str
    model: str
    partition_method: str
    ranks: int
    test_accuracy: float
    val_accuracy: float
    best_epoch: int
    epochs: int
    losses: list
    seconds_per_epoch: float
    seconds_total: float
    halo_bytes_per_epoch: float
    cagnet_bytes_per_epoch: float
    allreduce_bytes_per_epoch: float
    partition_summary: str
    optimizer: str = "adam"
    compression: str = "none"
    optimizer_bytes_per_epoch: float = 0.0
    skipped_epochs: list = field(default_factory=list)
    diverged_epoch: int = -1
    preconditioner: str = None
    damping: float = None
    kl_clip: float = None
    lr: float = None
    weight_decay: float = None
    resumed_after: int = None
    halo_bytes_once: float = float("nan")


_HALO_KINDS = ("halo", "reverse_halo")


def _bytes_received(stats, kinds):
    """The bytes this rank received in each traffic kind of ``kinds``, from
    `Communicator.stats` (0 for a kind with no traffic yet)."""
    return [stats.get(kind, {}).get("bytes_received", 0) for kind in kinds]


class _EpochTraffic:
    """This rank's halo bytes received and the plan's exchanged row bytes at the start of
    every epoch (the model's forward passes in training mode), read locally: no collective
    inside a forward pass."""

    def __init__(self, comm, graph, model):
        self._comm, self._graph = comm, graph
        self.at_epoch_starts = []
        self._handle = model.register_forward_pre_hook(self._before_forward)

    def counts(self):
        """(halo bytes received, exchanged row bytes) so far on this rank."""
        received = sum(_bytes_received(self._comm.stats(), _HALO_KINDS))
        return received, self._graph.plan.exchanged_row_bytes

    def _before_forward(self, module, args):
        if module.training:
            self.at_epoch_starts.append(self.counts())

    def per_epoch(self):
        """Stop counting; this rank's (halo bytes, row bytes) of each epoch, as two arrays."""
        self._handle.remove()
        marks = np.array(self.at_epoch_starts + [self.counts()], dtype=np.float64)
        return np.diff(marks[:, 0]), np.diff(marks[:, 1])


def _check_same_arguments(comm, used):
    """Raise on every rank when a rank's settings ``used`` differ from rank 0's.

    Ranks with another learning rate, seed or dtype trained replicas that silently drifted
    apart; with another model or number of epochs their collectives paired up wrongly, which
    ended in an error inside MPI or a hang. A collective call."""
    if comm.size == 1:
        return
    reference = comm.bcast(used)
    differ = [name for name in sorted(set(reference) | set(used))
              if reference.get(name) != used.get(name)]
    comm.raise_if_any(None if not differ else ValueError(
        f"train was called with other arguments on rank {comm.rank} than on rank 0 ("
        + ", ".join(f"{name}={used.get(name)!r} against {reference.get(name)!r}"
                    for name in differ)
        + "); every rank must call it with the same arguments"))


def _default_balance(method, balance):
    """``train``'s balance: the one asked for, else both rows and entries for METIS (where
    METIS's multi-constraint partitioning is available), else the method's default."""
    if balance is not None or method != "metis":
        return balance
    return ROWS_AND_NNZ if multi_constraint_available() else "rows"


def _dataset_name(dataset):
    """How a run's checkpoints name its dataset: a bundled one whatever its spelling."""
    if isinstance(dataset, datasets.Dataset):
        return dataset.name
    name = str(dataset)
    return name.lower() if name.lower() in datasets.available() else name


def _load(dataset, random_features, seed):
    if isinstance(dataset, datasets.Dataset):
        if random_features is not None:
            raise ValueError("random_features applies to a dataset name or file; this Dataset "
                             "already holds its features")
        return dataset
    name = str(dataset)
    if name.lower() in datasets.available():
        return datasets.load(name, random_features=random_features, seed=seed)
    if name.lower().endswith(".npz"):
        return datasets.load_file(name, random_features=random_features, seed=seed)
    raise ValueError(f"unknown dataset {name!r}: use one of {', '.join(datasets.available())} "
                     "or the path of an .npz graph file")


def train(dataset="cora", model="gcn", partition="metis", *, epochs=None, lr=None,
          weight_decay=None, seed=0, dtype="float32", random_features=None, comm=None,
          progress=True, description=None, balance=None, preconditioner=None,
          curvature_interval=None, optimizer="adam", compression="none", momentum_sync=None,
          checkpoint=None, checkpoint_every=None, resume=False, keep_checkpoints=3,
          damping=None, kl_clip=None):
    """Train a node classifier on a graph distributed over the communicator's ranks.

    Every rank calls it with the same arguments.

    Parameters
    ----------
    dataset : str or Dataset
        A bundled dataset's name, the path of an ``.npz`` graph file
        (`pysparse_hpc.datasets.load_file`), or a `Dataset` (read on rank 0 only).
    model : {"gcn", "gat", "agnn"}
        With its published architecture (`pysparse_hpc.nn.models`).
    partition : {"metis", "contiguous", "random"} or Partition
        How rank 0 splits the nodes (a `Partition` for ``comm.size`` parts is used as given).
    balance : {"rows", "nnz", "rows+nnz"} or float, optional
        What the partitioner balances (`pysparse_hpc.distributed.partition`): nodes, stored
        entries, both at once (METIS only), or entries + this much per row. Default: both
        ("rows+nnz") for METIS, where the installed pymetis exposes METIS's C functions (it
        evens out every phase of a step on graphs with skewed degrees, and costs nothing
        measurable on the others, see BENCHMARKS.md), else nodes; the method's own default
        for the others.
    epochs, lr, weight_decay : optional
        Default: the model's published settings.
    seed : int
        Of the weights and the dropout masks: the same seed gives the same training on any
        number of ranks, up to float rounding.
    dtype : {"float32", "float64"}
        Or the NumPy or torch dtype of that name.
    random_features : int, optional
        Replace the features with seeded random ones of this width (graphs without features).
    comm : Communicator, optional
        The ranks to train over. Default: `init`'s, every rank of the job.
    progress : bool
        A progress bar on rank 0.
    description : str, optional
        The progress bar's label. Default: the model, the graph and the number of ranks.
    preconditioner : {None, "kfac", "shampoo", "jorge"}
        Gradient preconditioning before ``optimizer`` (Adam or SGD) applies the gradients
        (`pysparse_hpc.nn.train.fit`), distributed KAISA-style over the ranks.
    curvature_interval : int, optional
        Steps between the preconditioner's curvature updates (default 10; refused without a
        preconditioner).
    damping : float, optional
        The preconditioner's; default: the one measured for it under ``optimizer``
        (`pysparse_hpc.nn.train.fit`).
    kl_clip : float, optional
        With ``preconditioner="kfac"``: KAISA's bound on each step (`pysparse_hpc.nn.train.fit`).
    optimizer : {"adam", "sgd", "lion"}
        SGD's and Lion's default ``lr`` and ``weight_decay`` are the model's Adam settings
        scaled (`default_settings`).
    compression, momentum_sync : str
        How Lion's ranks agree on the update (`pysparse_hpc.optim.DistributedLion`).
    checkpoint : str or path, optional
        A directory for checkpoints (`Checkpointer`, the last ``keep_checkpoints`` kept),
        saved after every ``checkpoint_every`` epochs and the last. It is tied to this run's
        settings (dataset, model, optimizer, seed, dtype, learning rate, ...): another run's
        directory is refused. One that already holds checkpoints needs ``resume``.
    checkpoint_every : int, optional
        Epochs between checkpoints (default 10; refused without ``checkpoint``).
    keep_checkpoints : int
        How many of the newest checkpoints the directory keeps.
    resume : bool
        Continue from the newest checkpoint that verifies (none: start from the beginning).
        ``epochs`` is the total: only the epochs left are trained, and a run already finished
        reports its result. On as many ranks as saved it, the partition is the saved one and
        the run continues bit for bit; on another number, the graph is partitioned anew.

    Returns
    -------
    DistributedTrainResult
    """
    import torch

    from ..nn import models
    from ..nn.train import (CHECKPOINT_EVERY, CURVATURE_INTERVAL, _check_kl_clip,
                            _check_schedule, default_damping, fit)
    from ..optim._modes import default_momentum_sync

    comm = init() if comm is None else check_communicator(comm)
    # Rank 0's: a Dataset is read there only (the other ranks may pass None), and a
    # fingerprint naming "None" on them refused the run's own checkpoints on resuming.
    dataset_name = comm.bcast(_dataset_name(dataset))
    # Every rank checks its arguments, and the ranks agree on the outcome: a check that
    # failed on one rank only was taken for one every rank had made alike (the command
    # line then returned on that rank and left the others waiting).
    error, used = None, None
    try:
        resume = check_flag(resume, "resume")   # the string "no" read as True
        progress = check_flag(progress, "progress")
        if not isinstance(model, str) or model not in models.MODELS:
            raise ValueError(f"model must be one of {tuple(models.MODELS)}, got {model!r}")
        if isinstance(dtype, (np.dtype, type)) or type(dtype).__module__ == "torch":
            # np.float32, np.dtype("float64"), torch.float64: read as its NumPy name
            dtype = as_numpy_dtype(dtype).name
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        seed = check_integer(seed, "seed")
        if not 0 <= seed < 2 ** 63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        if isinstance(partition, str) and partition not in PARTITION_METHODS:
            raise ValueError(f"partition must be one of {PARTITION_METHODS} or a Partition, got "
                             f"{partition!r}")

        model_class = models.MODELS[model]
        settings = default_settings(model, optimizer, preconditioner)
        overrides = dict(epochs=epochs, lr=lr, weight_decay=weight_decay)
        settings.update({k: v for k, v in overrides.items() if v is not None})
        _check_schedule(settings["epochs"], settings["lr"], settings["weight_decay"])
        # Before the checkpoint directory is taken and the graph read, as fit would only then.
        # Options of what is not asked for would go unused: refused, as fit and the CLI do.
        if checkpoint is None and checkpoint_every is not None:
            raise ValueError(f"checkpoint_every applies to checkpoints, got "
                             f"checkpoint_every={checkpoint_every!r} with checkpoint=None")
        checkpoint_every = (CHECKPOINT_EVERY if checkpoint_every is None else
                            check_positive_integer(checkpoint_every, "checkpoint_every"))
        if preconditioner is not None:
            curvature_interval = (
                CURVATURE_INTERVAL if curvature_interval is None else
                check_positive_integer(curvature_interval, "curvature_interval"))
        elif curvature_interval is not None:
            raise ValueError(f"curvature_interval applies to a preconditioner, got "
                             f"curvature_interval={curvature_interval!r} with "
                             f"preconditioner=None")

        # The fingerprint holds the values the run uses, so that naming a default changes nothing.
        if preconditioner is not None and damping is None:
            damping = default_damping(preconditioner, optimizer)
        if optimizer == "lion" and momentum_sync is None:
            momentum_sync = default_momentum_sync(compression)
        fingerprint = dict(dataset=dataset_name, model=model,
                           optimizer=optimizer, preconditioner=preconditioner,
                           damping=damping, compression=compression,
                           momentum_sync=momentum_sync, dtype=dtype, seed=seed,
                           random_features=random_features, lr=settings["lr"],
                           weight_decay=settings["weight_decay"])
        if preconditioner is not None:  # which steps update the curvature
            fingerprint["curvature_interval"] = curvature_interval
        _check_kl_clip(preconditioner, kl_clip)
        if kl_clip is not None:   # absent when off, as in the checkpoints written before it
            fingerprint["kl_clip"] = kl_clip
        # What each rank uses itself (rank 0 alone reads the dataset and partitions it).
        used = dict(fingerprint, epochs=settings["epochs"], checkpoint_every=checkpoint_every,
                    checkpoint=checkpoint is not None, resume=resume)
        del used["dataset"], used["random_features"]
    except Exception as exc:  # noqa: BLE001 -- raised on every rank below
        error = exc
    comm.raise_if_any(error)
    _check_same_arguments(comm, used)
    # rank 0's view of the checkpoints; the checkpointer agrees on its own errors
    with raising_alike():
        checkpointer, state = _checkpoints(comm, checkpoint, resume, keep_checkpoints,
                                           fingerprint=fingerprint)
    try:
        piece = _distribute(comm, dataset, partition, balance, random_features, seed, state,
                            getattr(torch, dtype), show=progress and comm.rank == 0)
        graph, parts = piece.graph, piece.parts

        torch.manual_seed(seed)
        classifier = model_class(piece.num_features, out_channels=piece.num_classes,
                                 **model_class.architecture)
        if dtype == "float64":
            classifier = classifier.double()
        comm.reset_stats()
        traffic = _EpochTraffic(comm, graph, classifier)
        start = time.perf_counter()
        result = fit(classifier, piece.x, graph, piece.y, piece.masks, progress=progress,
                     description=description or f"{model} on {piece.name}, {comm.size} rank"
                     f"{'s' if comm.size > 1 else ''}", preconditioner=preconditioner,
                     curvature_interval=curvature_interval, optimizer=optimizer,
                     damping=damping, kl_clip=kl_clip, compression=compression,
                     momentum_sync=momentum_sync, checkpointer=checkpointer,
                     resume_from=state, **_checkpoint_options(checkpointer, checkpoint_every,
                                                              parts), **settings)
    except BaseException:
        if checkpointer is not None:  # free the directory for this process's next run
            checkpointer.abandon()
        raise
    halo_by_epoch, rows_by_epoch = traffic.per_epoch()
    if checkpointer is not None:
        checkpointer.close()
    seconds_total = time.perf_counter() - start
    stats = comm.stats()
    # The gradient allreduce's bytes include its participation flags (DataParallel's).
    kinds = ("allreduce", PARTICIPATION_KIND, *_OPTIMIZER_KINDS)
    received = np.array(_bytes_received(stats, kinds), dtype=np.float64)
    # Traffic counted in this run: the epochs it trained, not those before its checkpoint.
    # None trained (0 epochs, or resumed at or past them) measured no epoch's traffic: NaN,
    # where 0 bytes per epoch read as a halo exchange that moved nothing.
    n_epochs = settings["epochs"] - (0 if state is None else state.step)
    n_epochs = n_epochs if n_epochs > 0 else float("nan")
    # Halo bytes summed over the ranks, exchanged row bytes alike on every rank; an epoch's
    # figure is the median epoch's, the exchanges made once are counted apart.
    summed = comm_sum(comm, np.concatenate([received, halo_by_epoch]))
    received, halo_by_epoch = summed[:received.size], summed[received.size:]
    if halo_by_epoch.size:
        halo_per_epoch, rows_per_epoch = np.median(halo_by_epoch), np.median(rows_by_epoch)
        # (epochs that moved less than the median, as before a kept product exists, are
        # not negative bytes)
        halo_once = max(0.0, halo_by_epoch.sum() - halo_per_epoch * halo_by_epoch.size)
    else:
        halo_per_epoch = rows_per_epoch = halo_once = float("nan")
    seconds = comm_sum(comm, np.array([result.seconds_per_epoch]))  # mean over ranks
    return DistributedTrainResult(
        dataset=piece.name, model=model,
        partition_method=piece.method,
        ranks=comm.size, test_accuracy=result.test_accuracy, val_accuracy=result.val_accuracy,
        best_epoch=result.best_epoch, epochs=result.epochs, losses=result.losses,
        seconds_per_epoch=float(seconds[0]) / comm.size, seconds_total=seconds_total,
        halo_bytes_per_epoch=float(halo_per_epoch), halo_bytes_once=float(halo_once),
        cagnet_bytes_per_epoch=float(rows_per_epoch * (comm.size - 1) * graph.shape[0]),
        allreduce_bytes_per_epoch=float(received[0] + received[1]) / n_epochs,
        partition_summary=piece.summary,
        optimizer=optimizer, preconditioner=preconditioner, damping=result.damping,
        kl_clip=kl_clip, lr=settings["lr"], weight_decay=settings["weight_decay"],
        compression=compression,
        optimizer_bytes_per_epoch=float(received[2:].sum()) / n_epochs,
        skipped_epochs=result.skipped_epochs, diverged_epoch=result.diverged_epoch,
        resumed_after=None if state is None else state.step)


@dataclass
class _Piece:
    """This rank's part of a graph: its rows of the matrix and of the node arrays, and what
    rank 0 says of the whole (``parts``, the split, on rank 0 only)."""
    graph: DistGraph
    x: object
    y: object
    masks: list
    name: str
    num_features: int
    num_classes: int
    summary: str
    method: str
    parts: object = None


#: Seconds a stage of `train`'s set-up runs before `_said_if_slow` names it.
SETUP_NOTICE_DELAY = 1.0


@contextlib.contextmanager
def _said_if_slow(show, what):
    """Name the stage ``what`` on standard error once it has run `SETUP_NOTICE_DELAY`
    seconds: reading, partitioning and scattering a large graph went by in silence, for
    seconds, before the progress bar appeared."""
    if not show:
        yield
        return
    timer = threading.Timer(SETUP_NOTICE_DELAY, print, [f"pysparse_hpc: {what} ..."],
                            dict(file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _distribute(comm, dataset, partition, balance, random_features, seed, state, torch_dtype,
                show=False):
    """Rank 0 reads ``dataset`` and splits it (the saved split when ``state`` was saved by as
    many ranks: the run then continues bit for bit); every rank receives its `_Piece`. Rank 0
    keeps only its own piece. ``show``: name the stages that take a while."""
    import torch

    from ..nn.train import normalize_features

    saved_owner = None
    if state is not None and state.ranks_saved == comm.size:
        saved_owner = state.shared.get("partition")
    error, data, parts = None, None, None
    if comm.rank == 0:
        try:
            with _said_if_slow(show, f"reading {_dataset_name(dataset)}"):
                data = _load(dataset, random_features, seed)
            if saved_owner is not None:
                saved_method = state.shared.get("partition_method", "given")
                parts = Partition.from_owner(data.adj, saved_owner, comm.size,
                                             method=saved_method)
                if isinstance(partition, str) and partition != saved_method:
                    # Kept for a bit-exact resume; the user asked for another one, say so.
                    warnings.warn(f"resuming on the {saved_method} partition the checkpoint was "
                                  f"saved with; partition={partition!r} is not used (a resume "
                                  f"on another number of ranks partitions with it)",
                                  UserWarning, stacklevel=3)
            elif isinstance(partition, str):
                with _said_if_slow(show and comm.size > 1,
                                   f"partitioning {data.name} for {comm.size} ranks "
                                   f"({partition})"):
                    parts = make_partition(data.adj, comm.size, partition, seed=seed,
                                           balance=_default_balance(partition, balance))
            elif isinstance(partition, Partition):
                parts = partition
            else:   # read here, on rank 0: the other ranks may pass None
                raise TypeError(f"partition must be one of {PARTITION_METHODS} or a Partition, "
                                f"got {type(partition).__name__} (for an owner array, pass "
                                f"Partition.from_owner(adj, owner))")
        except Exception as exc:  # noqa: BLE001 -- raised on every rank below
            error = exc
    comm.raise_if_any(error)
    with _said_if_slow(show, "sending each rank its part of the graph" if comm.size > 1
                       else "setting up the graph"):
        graph = DistGraph.scatter(None if data is None else data.adj, parts, comm)
        header = None if data is None else (data.name, data.num_features, data.num_classes,
                                            repr(parts), getattr(parts, "method", "given"))
        name, num_features, num_classes, summary, method = comm.bcast(header)

        def owned_rows(read):
            """This rank's rows of ``read(data)``, a node array that rank 0 holds."""
            return torch.from_numpy(graph.scatter_rows(None if data is None else read(data)))

        # Normalized in the training's precision (float32 arithmetic would cap float64 runs),
        # row by row, so on each rank's own rows: alike bit for bit, and the root no longer
        # holds a normalized copy of every row beside the features.
        numpy_dtype = np.float64 if torch_dtype == torch.float64 else np.float32
        features = graph.scatter_rows(None if data is None else data.x)
        return _Piece(graph=graph,
                      x=torch.from_numpy(normalize_features(features, numpy_dtype)),
                      y=owned_rows(lambda d: d.y),
                      masks=[owned_rows(lambda d, split=split: getattr(d, f"{split}_mask"))
                             for split in ("train", "val", "test")],
                      name=name, num_features=num_features, num_classes=num_classes,
                      summary=summary, method=method, parts=parts)


def default_settings(model, optimizer="adam", preconditioner=None):
    """``train``'s default ``epochs``, ``lr`` and ``weight_decay``.

    The model's published Adam settings (``models.MODELS[model].training``); Lion's learning
    rate and decay scaled by `pysparse_hpc.nn.train.LION_SCALING`, SGD's learning rate by
    `pysparse_hpc.nn.train.SGD_LR_SCALING` of the preconditioner it applies.
    """
    from ..nn import models
    from ..nn.train import LION_SCALING, OPTIMIZERS, PRECONDITIONERS, SGD_LR_SCALING

    if not isinstance(model, str) or model not in models.MODELS:
        raise ValueError(f"model must be one of {tuple(models.MODELS)}, got {model!r}")
    # A misspelt name got Adam's settings here, and `train` met the error only after reading
    # and partitioning the graph.
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if preconditioner is not None and (not isinstance(preconditioner, str)
                                       or preconditioner not in PRECONDITIONERS):
        raise ValueError(f"preconditioner must be None or one of {tuple(PRECONDITIONERS)}, got "
                         f"{preconditioner!r}")
    settings = dict(models.MODELS[model].training)
    if optimizer == "lion":
        return {k: v * LION_SCALING.get(k, 1) for k, v in settings.items()}
    if optimizer == "sgd":
        settings["lr"] *= SGD_LR_SCALING.get(preconditioner, SGD_LR_SCALING[None])
    return settings


def _checkpoint_options(checkpointer, every, parts):
    """`fit`'s checkpoint options: none without a checkpointer; with one, the interval and
    the partition, kept so that a resume on as many ranks continues bit for bit."""
    if checkpointer is None:
        return {}
    extras = None if parts is None else dict(partition=parts.owner,
                                             partition_method=parts.method)
    return dict(checkpoint_every=every, checkpoint_extras=extras)


def _checkpoints(comm, directory, resume, keep, fingerprint):
    """The run's `Checkpointer` (None without a directory) and the checkpoint to resume from
    (None for a run from the start)."""
    if directory is None:
        if resume:
            raise ValueError("resume=True needs a checkpoint directory, got checkpoint=None")
        return None, None
    from .checkpoint import Checkpointer

    checkpointer = Checkpointer(directory, comm, keep=keep, fingerprint=fingerprint)
    latest = comm.on_root(checkpointer.latest)  # rank 0's view, so all ranks decide alike
    if not resume:
        if latest is not None:
            checkpointer.close()
            raise ValueError(f"{directory} holds checkpoints (the newest after {latest} "
                             "epochs): resume from them (resume=True, --resume) or use "
                             "another directory")
        return checkpointer, None
    from ..nn.train import _Saved

    try:
        state = checkpointer.load()
        # Before the partition is read from it: a plain Checkpointer's directory (no
        # fingerprint to refuse it) is named as such, not met with an AttributeError.
        _Saved.check(state)
    except FileNotFoundError:  # nothing saved yet: a run from the start
        return checkpointer, None
    except BaseException:
        checkpointer.release()
        raise
    return checkpointer, state
