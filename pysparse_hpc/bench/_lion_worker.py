"""The jobs of ``python -m pysparse_hpc.bench lion``: training steps timed and counted, and
trainings to their test accuracy, for Adam, Lion and each of Lion's distributed modes.

The benchmark process starts this module as ``python -m pysparse_hpc.bench._lion_worker
CONFIG.json RESULT.json`` under ``mpiexec -n P`` (`pysparse_hpc.bench.distributed.launch`, one
thread per rank); `measure_steps` and `measure_accuracy` also run in one process on a one-rank
communicator. Workloads:

- ``mlp-digits``: a 64-1024-1024-10 ReLU MLP (`MLP_WIDTHS`, 1,126,410 parameters) on
  scikit-learn's digits (inputs / 16; a fixed stratified 80/20 split), data parallel: each
  global batch of `MLP_BATCH` rows (a permutation drawn from the seed and the epoch, the same on
  every rank) split into contiguous per-rank slices, each rank's loss the mean over its slice,
  gradients (or votes) averaged;
- ``gcn-cora``, ``gcn-citeseer``: the library's two-layer GCN full-graph on a partition of
  the graph (``config["partition"]``: METIS by default, or ``"random"``;
  `pysparse_hpc.distributed.DistGraph`), each rank's loss summed over its training
  nodes and divided by the global count (gradients summed). Accuracy comes from
  `pysparse_hpc.distributed.train`, the trainer users run.

A contender is ``[label, optimizer, compression, momentum_sync]``: Adam with `DataParallel`'s
fp32 gradient allreduce, or `pysparse_hpc.optim.DistributedLion` (``compression="none"``: the
fp32 allreduce). Step jobs build every contender's model from the same seed, warm each up, then
time them in turns (one step of each per round): a step starts after a barrier, and the
communicator's byte counters and blocked seconds are read before and after it. Blocking
collectives are timed too (`TimedCommunicator`), so a step's time less its blocked time is the
rank's own work. Rank 0 writes the results as JSON.
"""
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from ..distributed._comm import Communicator
from ..distributed.graph import comm_sum
from ._worker import finish, start

__all__ = ["MLP_BATCH", "MLP_WIDTHS", "TimedCommunicator", "digits_split", "main",
           "make_mlp", "measure_accuracy", "measure_steps"]

MLP_WIDTHS = (64, 1024, 1024, 10)
#: Rows of a global MLP batch (divisible by 2 and 3: equal slices at P = 2 and 3).
MLP_BATCH = 96
#: (lr, weight_decay) of the MLP: Adam's, and Lion's 10x smaller lr with decoupled decay.
MLP_SETTINGS = {"adam": (1e-3, 0.0), "lion": (1e-4, 0.1)}
#: How the GCNs' graphs are split when a job's config names no ``partition``.
DEFAULT_PARTITION = "metis"


class TimedCommunicator(Communicator):
    """A communicator on the same MPI group whose blocking calls add the seconds they take to
    `wait_seconds`, as waits on its nonblocking requests do.

    Parameters
    ----------
    comm : Communicator
        Its MPI communicator is shared (every rank must wrap the same one).
    """

    def __init__(self, comm):
        super().__init__(comm.mpi)

    def _blocking(self, kind, call, *args, **kwargs):
        if self.size == 1:
            return call(*args, **kwargs)
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self._waited[kind] += time.perf_counter() - start

    def Allreduce(self, buffer, op="sum", kind="allreduce"):
        return self._blocking(kind, super().Allreduce, buffer, op, kind)

    def Allgatherv(self, sendbuf, recvbuf, counts, kind="allgather"):
        return self._blocking(kind, super().Allgatherv, sendbuf, recvbuf, counts, kind)

    def Sendrecv(self, sendbuf, dest, recvbuf, source, tag=0, kind="sendrecv"):
        return self._blocking(kind, super().Sendrecv, sendbuf, dest, recvbuf, source, tag,
                              kind)

    def Bcast(self, buffer, root=0, kind="broadcast"):
        return self._blocking(kind, super().Bcast, buffer, root, kind)


# --- workloads -----------------------------------------------------------------------------

def digits_split():
    """``(x_train, y_train, x_test, y_test)`` of scikit-learn's digits as tensors: inputs
    scaled to [0, 1], a stratified 80/20 split with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.2, stratify=y,
                                                        random_state=0)
    return (torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train),
            torch.tensor(x_test, dtype=torch.float32), torch.tensor(y_test))


def make_mlp(seed):
    """The `MLP_WIDTHS` ReLU MLP, weights drawn from ``seed``."""
    torch.manual_seed(seed)
    layers = []
    for width_in, width_out in zip(MLP_WIDTHS[:-1], MLP_WIDTHS[1:]):
        layers += [torch.nn.Linear(width_in, width_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _rank_rows(rows, comm):
    """This rank's contiguous slice of ``rows`` (a global batch)."""
    return rows[comm.rank * len(rows) // comm.size:(comm.rank + 1) * len(rows) // comm.size]


def mlp_batches(n_rows, epoch, seed, comm):
    """This rank's row indices of every full global batch of ``epoch``."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n_rows, generator=generator)
    return [_rank_rows(order[start:start + MLP_BATCH], comm)
            for start in range(0, n_rows - MLP_BATCH + 1, MLP_BATCH)]


def _optimizer(contender, groups, comm, lr, weight_decay, average):
    _, name, compression, momentum_sync = contender
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr)
    from ..optim import DistributedLion
    return DistributedLion(groups, comm=comm, lr=lr, weight_decay=weight_decay,
                           compression=compression, momentum_sync=momentum_sync,
                           average=average)


def _data_parallel(contender, model, comm, average):
    """``model`` with Adam's gradient allreduce over ``comm`` (Lion agrees in its step)."""
    if contender[1] != "adam" or comm.size == 1:
        return model
    from ..distributed.data_parallel import DataParallel
    return DataParallel(model, comm, average=average)


class _MlpCase:
    """The MLP workload on this rank: its data and how a contender steps on it."""

    name = "mlp-digits"

    def __init__(self, comm):
        self.comm = comm
        self.x_train, self.y_train, self.x_test, self.y_test = digits_split()
        self.timing_batches = mlp_batches(len(self.y_train), 0, 0, comm)
        self.steps_per_epoch = len(self.timing_batches)

    def build(self, contender, seed):
        """``(model, trained, optimizer)`` of ``contender``, weights from ``seed``."""
        model = make_mlp(seed)
        lr, weight_decay = MLP_SETTINGS[contender[1]]
        groups = [dict(params=model.parameters(), weight_decay=weight_decay)]
        return (model, _data_parallel(contender, model, self.comm, True),
                _optimizer(contender, groups, self.comm, lr, weight_decay, True))

    def loss(self, trained, step):
        rows = self.timing_batches[step % len(self.timing_batches)]
        return F.cross_entropy(trained(self.x_train[rows]), self.y_train[rows])


class _GcnCase:
    """A GCN workload on this rank: its piece of the graph and how a contender steps on it."""

    steps_per_epoch = 1

    def __init__(self, name, comm, partition):
        from .gnn import load_graph
        self.name, self.comm = name, comm
        dataset = name.split("-", 1)[1]
        case = load_graph(dataset, None) if comm.rank == 0 else None
        if comm.size == 1:
            self.graph, self.x, self.y, self.mask = case.adj, case.x, case.y, case.train_mask
            self.n_train = float(self.mask.sum())
            self.features, self.classes = case.x.shape[1], case.num_classes
        else:
            from ._distributed_worker import _distribute
            (self.graph, self.x, self.y, self.mask, self.n_train,
             (self.features, self.classes)) = _distribute(case, comm, 0, partition)

    def build(self, contender, seed):
        from ..nn import models
        from ..nn.train import LION_SCALING
        settings = dict(models.GCN.training)
        if contender[1] == "lion":
            settings = {k: v * LION_SCALING.get(k, 1) for k, v in settings.items()}
        torch.manual_seed(seed)
        model = models.GCN(self.features, out_channels=self.classes,
                           **models.GCN.architecture)
        groups = model.param_groups(settings["weight_decay"])
        return (model, _data_parallel(contender, model, self.comm, False),
                _optimizer(contender, groups, self.comm, settings["lr"],
                           settings["weight_decay"], False))

    def loss(self, trained, step):
        logits = trained(self.x, self.graph)
        return F.cross_entropy(logits[self.mask], self.y[self.mask],
                               reduction="sum") / self.n_train


def _case(workload, comm, partition):
    if workload == "mlp-digits":
        return _MlpCase(comm)
    if workload in ("gcn-cora", "gcn-citeseer"):
        return _GcnCase(workload, comm, partition)
    raise ValueError(f"unknown workload {workload!r}")


# --- timed steps ---------------------------------------------------------------------------

class _Run:
    """One contender on one workload: its steps and what they measured on this rank."""

    def __init__(self, case, contender, comm):
        self.case, self.contender, self.comm = case, contender, comm
        self.model, self.trained, self.optimizer = case.build(contender, seed=0)
        self.seconds, self.blocked, self.optimizer_seconds = [], [], []
        self.bytes, self.messages = {}, {}
        self.syncs, self.timed = 0, 0

    def _waited(self):
        return sum(self.comm.wait_seconds().values())

    def step(self, step):
        """One training step; returns the seconds of the optimizer's own work in it (its
        ``step()`` less the time it blocked)."""
        torch.manual_seed(step)   # the same dropout masks for every contender
        self.model.train()
        self.optimizer.zero_grad()
        self.case.loss(self.trained, step).backward()
        waited, start = self._waited(), time.perf_counter()
        self.optimizer.step()
        return time.perf_counter() - start - (self._waited() - waited)

    def timed_step(self, step):
        self.comm.Barrier()
        stats, waited = self.comm.stats(), self._waited()
        syncs = getattr(self.optimizer, "momentum_syncs", 0)
        start = time.perf_counter()
        self.optimizer_seconds.append(self.step(step))
        self.seconds.append(time.perf_counter() - start)
        self.blocked.append(self._waited() - waited)
        for kind, counts in self.comm.stats().items():
            before = stats.get(kind, {})
            for total, field in ((self.bytes, "bytes_received"),
                                 (self.messages, "messages_received")):
                total[kind] = total.get(kind, 0) + counts[field] - before.get(field, 0)
        self.syncs += getattr(self.optimizer, "momentum_syncs", 0) - syncs
        self.timed += 1

    def summary(self):
        """This rank's figures: per-step seconds, blocked seconds and seconds of the
        optimizer's own work, bytes and messages received per step by kind."""
        return dict(seconds=self.seconds, blocked=self.blocked, optimizer=self.optimizer_seconds,
                    bytes={k: v / self.timed for k, v in self.bytes.items()},
                    messages={k: v / self.timed for k, v in self.messages.items()})


def measure_steps(config, comm):
    """Time ``config``'s contenders on each workload, in turns.

    Parameters
    ----------
    config : dict
        ``workloads`` (names), ``contenders`` (``[label, optimizer, compression,
        momentum_sync]`` lists), ``warmup`` (untimed steps of each), ``steps`` (timed rounds)
        and, optionally, ``partition`` (of the GCNs' graphs: ``"metis"``, the default, or
        ``"random"``).
    comm : Communicator
        Wrapped in a `TimedCommunicator`.

    Returns
    -------
    list of dict or None
        On rank 0, one dict per workload and contender: ``workload``, ``label``,
        ``contender``, ``ranks``, ``parameters`` (coordinates with a gradient),
        ``steps_per_epoch``, ``warmup``, ``steps``, ``syncs``
        (momentum synchronisations during the timed steps) and ``per_rank`` (each rank's
        `_Run.summary`); None on the other ranks.
    """
    comm = TimedCommunicator(comm)
    results = []
    for workload in config["workloads"]:
        case = _case(workload, comm, config.get("partition", DEFAULT_PARTITION))
        runs = [_Run(case, contender, comm) for contender in config["contenders"]]
        for run in runs:
            for step in range(config["warmup"]):
                run.step(step)
        for step in range(config["warmup"], config["warmup"] + config["steps"]):
            for run in runs:
                run.timed_step(step)
        for run in runs:
            everyone = comm.gather(run.summary())
            if everyone is not None:
                results.append(dict(
                    workload=workload, label=run.contender[0], contender=run.contender,
                    steps_per_epoch=case.steps_per_epoch, ranks=comm.size,
                    parameters=sum(p.numel() for p in run.model.parameters()),
                    warmup=config["warmup"], steps=config["steps"], syncs=run.syncs,
                    per_rank=everyone))
        del runs, case
    return results if comm.rank == 0 else None


# --- accuracy ------------------------------------------------------------------------------

def _mlp_accuracy(case, contender, seed, epochs):
    """Train the MLP ``epochs`` epochs; ``(test accuracy, momentum syncs, steps,
    parameters equal on every rank)``."""
    model, trained, optimizer = case.build(contender, seed)
    for epoch in range(epochs):
        model.train()
        for rows in mlp_batches(len(case.y_train), epoch, seed, case.comm):
            optimizer.zero_grad()
            F.cross_entropy(trained(case.x_train[rows]), case.y_train[rows]).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        correct = float((model(case.x_test).argmax(dim=1) == case.y_test).sum())
        checksum = float(sum(p.double().abs().sum() for p in model.parameters()))
    checksums = case.comm.allgather(checksum)
    return (correct / len(case.y_test), getattr(optimizer, "momentum_syncs", 0),
            getattr(optimizer, "steps_taken", 0), len(set(checksums)) == 1)


def _gcn_accuracy(workload, contender, seed, epochs, comm, partition):
    from ..distributed.training import train
    _, name, compression, momentum_sync = contender
    result = train(workload.split("-", 1)[1], "gcn", partition, epochs=epochs, seed=seed,
                   comm=comm, progress=False, optimizer=name,
                   compression="none" if name == "adam" else compression,
                   momentum_sync=momentum_sync)
    return result.test_accuracy, result.optimizer_bytes_per_epoch


def measure_accuracy(config, comm):
    """Train every contender of ``config`` on each workload from each seed.

    Parameters
    ----------
    config : dict
        ``workloads``, ``contenders`` and ``partition`` (as `measure_steps`), ``seeds`` (list
        of int), ``gcn_epochs`` (None: the published 200) and ``mlp_epochs``.
    comm : Communicator

    Returns
    -------
    list of dict
        One per workload, contender and seed: ``workload``, ``label``, ``seed``, ``ranks``,
        ``test_accuracy``; the MLP's also ``syncs``, ``steps`` and ``replicas_equal``, the
        GCNs' ``optimizer_bytes_per_epoch`` (all ranks together).
    """
    results = []
    for workload in config["workloads"]:
        case = _MlpCase(comm) if workload == "mlp-digits" else None
        for contender in config["contenders"]:
            for seed in config["seeds"]:
                entry = dict(workload=workload, label=contender[0], seed=seed, ranks=comm.size)
                if case is not None:
                    accuracy, syncs, steps, equal = _mlp_accuracy(case, contender, seed,
                                                                  config["mlp_epochs"])
                    entry.update(test_accuracy=accuracy, syncs=syncs, steps=steps,
                                 replicas_equal=equal)
                else:
                    accuracy, nbytes = _gcn_accuracy(workload, contender, seed,
                                                     config.get("gcn_epochs"), comm,
                                                     config.get("partition", DEFAULT_PARTITION))
                    entry.update(test_accuracy=accuracy, optimizer_bytes_per_epoch=nbytes)
                results.append(entry)
    return results


def main(argv=None):
    """Run the configured job (``"mode"``: ``"steps"`` or ``"accuracy"``) on this rank; rank 0
    writes the result file. Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    started = start(argv, "pysparse_hpc.bench._lion_worker")
    if started is None:
        return 2
    config, comm = started
    began = time.perf_counter()
    if config["mode"] == "steps":
        cases = measure_steps(config, comm)
    else:
        cases = measure_accuracy(config, comm)
    seconds = float(comm_sum(comm, np.array([time.perf_counter() - began]))[0]) / comm.size
    finish(argv, comm, dict(ranks=comm.size, threads_per_rank=config["threads_per_rank"],
                            cases=cases, seconds=seconds, error=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
