"""The distributed runs of ``python -m pysparse_hpc.bench precondition --distributed``.

The benchmark process starts this module as ``python -m pysparse_hpc.bench._precondition_worker
CONFIG.json RESULT.json``, under ``mpiexec -n P`` for P > 1 and as a plain process for P = 1,
with the thread count of every rank fixed through the environment
(`pysparse_hpc.bench.distributed.launch`). It owns the distributed training step it times:

- ``mlp``: the 784-256-128-10 MLP of the ASDL comparison on its batch of 128, each rank
  holding a contiguous slice of ``128 / P`` rows;
- ``gcn``: the library's GCN on Cora, the graph partitioned by METIS on rank 0 and scattered
  (`pysparse_hpc.distributed.DistGraph`) for P > 1, the whole graph for P = 1.

Every rank's loss is its rows' cross-entropy summed and divided by the global count, so the
sums over ranks are the one-process gradient and curvature. A gradient maker gets the
communicator (KAISA: gradients and curvature summed over the ranks, each module inverted by one
owner, inverses or preconditioned gradients broadcast by ``strategy``); plain SGD sums the
gradients with `pysparse_hpc.distributed.DataParallel`. Every timed step starts after a
barrier and is reseeded (the GCN's dropout masks are keyed by global node id, so P ranks draw
the one-process masks); its time is the slowest rank's, and the communicator's byte counters
are read before and after it. Rank 0 writes the results as JSON.
"""
import statistics
import sys
import time
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from .. import precondition
from ..distributed._comm import PARTICIPATION_KIND
from ..distributed.graph import comm_sum
from ._worker import finish, start
from .precondition import _maker, _workload

__all__ = ["KIND_COLUMNS", "STRATEGIES", "main", "measure_configurations"]

STRATEGIES = ("inverse", "gradient")

#: Columns of the byte counts: each gathers the `Communicator.stats` kinds listed (plain SGD's
#: `DataParallel` books its gradient sum as "allreduce", and its participation flags apart).
KIND_COLUMNS = {
    "gradient allreduce": ("gradient allreduce", "allreduce", PARTICIPATION_KIND),
    "curvature allreduce": ("curvature allreduce",),
    "inverse broadcast": ("inverse broadcast",),
    "gradient broadcast": ("gradient broadcast",),
    "halo": ("halo", "reverse_halo"),
}

_MLP_BATCH = 128


def _summed_cross_entropy(logits, labels, reduction="mean", count=1.0):
    total = F.cross_entropy(logits, labels, reduction="sum")
    return total if reduction == "sum" else total / count


def _mlp_case(comm):
    """``(make_model, inputs, labels, mask, count)`` of this rank's slice of the batch."""
    make, (x,), y, _ = _workload("mlp")
    rows = slice(comm.rank * _MLP_BATCH // comm.size, (comm.rank + 1) * _MLP_BATCH // comm.size)
    return make, (x[rows],), y[rows], None, float(_MLP_BATCH)


def _gcn_case(comm, data_dir):
    """The same for the GCN on Cora: the whole graph on one rank, a METIS part otherwise."""
    from ..nn import models
    from ._distributed_worker import _distribute
    from .gnn import load_graph
    case = load_graph("cora", data_dir) if comm.rank == 0 else None
    if comm.size == 1:
        graph, x, y, train_mask = case.adj, case.x, case.y, case.train_mask
        n_train, (features, classes) = float(train_mask.sum()), (x.shape[1], case.num_classes)
    else:
        graph, x, y, train_mask, n_train, (features, classes) = _distribute(case, comm, 0,
                                                                            "metis")

    def make():
        torch.manual_seed(0)
        return models.GCN(features, out_channels=classes, **models.GCN.architecture)
    return make, (x, graph), y, train_mask, n_train


class _Configuration:
    """One method, interval and strategy on one workload: its step and what it measured."""

    def __init__(self, case, method, interval, strategy, comm):
        make, self.inputs, self.labels, self.mask, count = case
        self.model, self.comm = make(), comm
        self.maker = _maker(precondition, method, interval, self.model, int(count), comm=comm,
                            strategy=strategy)
        self.trained = self.model
        if self.maker is None and comm.size > 1:
            from ..distributed.data_parallel import DataParallel
            self.trained = DataParallel(self.model, comm, average=False)
        self.loss_fn = partial(_summed_cross_entropy, count=count)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.seconds, self.losses = [], []
        self.bytes = {column: 0 for column in KIND_COLUMNS}

    def _labelled(self, output):
        if self.mask is None:
            return output, self.labels
        return output[self.mask], self.labels[self.mask]

    def step(self, seed):
        """One training step; returns this rank's loss."""
        torch.manual_seed(seed)
        self.optimizer.zero_grad()
        if self.maker is None:
            loss = self.loss_fn(*self._labelled(self.trained(*self.inputs)))
            loss.backward()
        else:
            placeholder = self.maker.setup_model_call(self.model, *self.inputs)
            self.maker.setup_loss_call(self.loss_fn, *self._labelled(placeholder))
            _, loss = self.maker.forward_and_backward()
        self.optimizer.step()
        return float(loss.detach())

    def timed_step(self, seed):
        """`step` after a barrier, its seconds, loss and bytes received by kind recorded."""
        self.comm.Barrier()
        before = self.comm.stats()
        start = time.perf_counter()
        loss = self.step(seed)
        self.seconds.append(time.perf_counter() - start)
        self.losses.append(loss)
        after = self.comm.stats()
        for column, kinds in KIND_COLUMNS.items():
            self.bytes[column] += sum(after.get(kind, {}).get("bytes_received", 0)
                                      - before.get(kind, {}).get("bytes_received", 0)
                                      for kind in kinds)


def _summary(configuration, comm, steps):
    """Figures over all ranks (rank 0; None elsewhere)."""
    losses = comm_sum(comm, np.array(configuration.losses, dtype=np.float64))
    everyone = comm.gather(dict(seconds=configuration.seconds, bytes=configuration.bytes))
    if everyone is None:
        return None
    slowest = np.max([rank["seconds"] for rank in everyone], axis=0)
    return dict(ms_per_step=1e3 * float(np.mean(slowest)),
                ms_median=1e3 * float(statistics.median(slowest)),
                bytes_per_step={column: sum(rank["bytes"][column] for rank in everyone) / steps
                                for column in KIND_COLUMNS},
                losses=losses.tolist())


def _cases(config, comm):
    for workload in config["workloads"]:
        if workload == "mlp":
            yield workload, _mlp_case(comm)
        elif workload == "gcn":
            yield workload, _gcn_case(comm, config.get("data_dir"))
        else:
            raise ValueError(f"unknown distributed workload {workload!r}")


def measure_configurations(config, comm):
    """Time every workload, method and strategy of ``config`` on ``comm``'s ranks.

    Parameters
    ----------
    config : dict
        ``workloads`` (names among "mlp" and "gcn"), ``methods`` (``[method, interval]``
        pairs), ``steps`` (timed steps of an interval-1 method; twice as many with a longer
        interval), optionally ``data_dir`` (unused: Cora is bundled) and ``strategies``
        (default both; one rank runs the first only, there being nothing to share).
    comm : pysparse_hpc.distributed.Communicator

    Returns
    -------
    list of dict or None
        On rank 0, one dict per configuration: ``workload``, ``method``, ``interval``,
        ``strategy`` (None for SGD and on one rank), ``ranks``, ``ms_per_step`` (mean of the
        slowest rank's step times), ``ms_median``, ``bytes_per_step`` (received by all ranks
        together, by `KIND_COLUMNS`), ``losses`` (summed over ranks); None on the others.
    """
    strategies = tuple(config.get("strategies") or STRATEGIES)
    results = []
    for workload, case in _cases(config, comm):
        for method, interval in config["methods"]:
            shared = method != "sgd" and comm.size > 1
            for strategy in (strategies if shared else strategies[:1]):
                configuration = _Configuration(case, method, interval, strategy, comm)
                warmup = 2 * interval
                for s in range(warmup):
                    configuration.step(s)
                steps = config["steps"] * (2 if interval > 1 else 1)
                for s in range(warmup, warmup + steps):
                    configuration.timed_step(s)
                summary = _summary(configuration, comm, steps)
                if summary is not None:
                    summary.update(workload=workload, method=method, interval=interval,
                                   strategy=strategy if shared else None, ranks=comm.size)
                    results.append(summary)
    return results if comm.rank == 0 else None


def main(argv=None):
    """Run the configured measurements on this rank; rank 0 writes the result file. Returns
    the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    started = start(argv, "pysparse_hpc.bench._precondition_worker")
    if started is None:
        return 2
    config, comm = started
    results = measure_configurations(config, comm)
    finish(argv, comm, dict(ranks=comm.size, threads_per_rank=config["threads_per_rank"],
                            cases=results, error=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
