"""The training runs of ``python -m pysparse_hpc.bench distributed``, one job per rank count.

The benchmark process starts this module as ``python -m pysparse_hpc.bench._distributed_worker
CONFIG.json RESULT.json``, under ``mpiexec -n P`` for P > 1 and as a plain process for P = 1,
with the thread count of every rank fixed through the environment (a configuration with
``"mode": "rates"`` measures the single-thread kernel rates of the projection instead, in a
process of its own). It owns:

- the training loop it times: forward, cross-entropy summed over the rank's training nodes and
  divided by the global count, backward with the gradient allreduce of
  `pysparse_hpc.distributed.DataParallel` (P > 1), Adam step; every timed step starts after a
  barrier, its time is the slowest rank's, and the communicator's byte counters and blocked
  seconds are read before and after it, so configurations timed in turns keep their own
  figures (and every rank's compute, its step time less its blocked time, step by step);
- the CAGNET-1D peer (`CagnetGCN`, `CagnetOperator`, `_CagnetSpMM`): the library's GCN weights
  and dropout, but every distributed SpMM gathers all of H on every rank (an allgatherv of the
  owned rows, then the local rows times all n columns) and its backward sums each rank's
  ``A_local^T dY`` for all n nodes at their owners (a reduce-scatter). It is the baseline of
  the comparison, not library API.

P = 1 trains the library's model on the whole graph (the single-process run the distributed
ones are judged against). For P > 1 rank 0 builds the graph, partitions it with the
configuration's ``"method"`` (a name of `pysparse_hpc.bench.distributed.RUN_METHODS`: METIS
balancing nodes, "metis", stored entries, "metis-nnz", or entries + c per node with the
configuration's ``"work_ratios"`` c of the graph, "metis-work", ...) and scatters the rows; ours
and the CAGNET peer are then built from the same seed, draw the same dropout masks (keyed by
global node id, reseeded before every step) and must give the same losses in the warm-up
steps before any step is timed. Rank 0 writes the results as JSON.
"""
import dataclasses
import statistics
import sys
import time

import numpy as np
import scipy.sparse
import torch
import torch.nn.functional as F

from .._csr import csr_array
from .._sputils import get_index_dtype
from ..distributed._comm import PARTICIPATION_KIND
from ..distributed.graph import DistGraph, comm_sum
from ..nn import _backend, _graph, functional
from ..nn.gcn import choose_order
from ..nn.models import GCN
from ..nn.norm import gcn_norm
from ._worker import finish, start

__all__ = ["CagnetGCN", "CagnetOperator", "LossMismatch", "cagnet_spmm", "main"]

#: Kinds of traffic in a training step, as `Communicator.stats` names them (the CAGNET peer
#: books its allgatherv as "halo" and its reduce-scatter as "reverse_halo", so that the two
#: schemes are compared kind for kind).
STEP_KINDS = ("halo", "reverse_halo", "allreduce")
#: The communicator's kinds counted under each of `STEP_KINDS` (`DataParallel` books its flags
#: of which parameters have a gradient apart from the gradients).
_COUNTED_AS = {"halo": ("halo",), "reverse_halo": ("reverse_halo",),
               "allreduce": ("allreduce", PARTICIPATION_KIND)}

#: Relative tolerance of the loss comparison between the CAGNET peer and ours (float32, the
#: same products summed in another order).
LOSS_RTOL = 1e-5


# --- the CAGNET-1D peer --------------------------------------------------------------------

class CagnetOperator:
    """This rank's rows of the GCN-normalized adjacency over all n columns, for CAGNET's 1D
    SpMM.

    The columns are numbered in the order an allgatherv of the owned rows delivers them: rank
    0's owned nodes (ascending), then rank 1's, and so on.

    Parameters
    ----------
    graph : DistGraph
        The unnormalized graph; its `gcn_norm` (cached on it, so the same values our layers
        use) gives the entries.
    """

    def __init__(self, graph):
        normalized = gcn_norm(graph)
        comm = graph.comm
        owned_by_rank = comm.allgather(graph.owned)
        n = graph.shape[0]
        position = np.empty(n, dtype=np.int64)
        position[np.concatenate(owned_by_rank)] = np.arange(n, dtype=np.int64)
        local = normalized.local
        # The peer's indices in the dtype scipy picks for its size (int32 where they fit, as
        # ours are): the positions are int64, which it kept, and every product of the peer
        # then moved twice our index bytes.
        index_dtype = get_index_dtype(maxval=max(n, local.nnz))
        columns = position[graph.column_ids[local.indices]].astype(index_dtype)
        # Copies: sorting the new column order in place must not reorder the values of the
        # normalized graph that our layers keep using.
        rows = scipy.sparse.csr_array((np.array(local.data), columns,
                                       np.array(local.indptr, dtype=index_dtype)),
                                      shape=(graph.n_local, n))
        rows.sort_indices()
        self.comm, self.n_nodes, self.owned = comm, n, graph.owned
        self.rows = csr_array(rows)
        self.rows_per_rank = [int(ids.size) for ids in owned_by_rank]

    def allgather(self, owned_rows):
        """All n rows of a (n_local, w) tensor, in gathered order (blocked time counted as
        "halo" in `Communicator.wait_seconds`)."""
        width = owned_rows.shape[1]
        gathered = torch.empty((self.n_nodes, width), dtype=owned_rows.dtype)
        self.comm.Iallgatherv(owned_rows.contiguous(), gathered,
                              [rows * width for rows in self.rows_per_rank], kind="halo").wait()
        return gathered

    def reduce_scatter(self, all_rows):
        """Each rank's owned rows of the sum over ranks of a (n, w) tensor."""
        width = all_rows.shape[1]
        owned = torch.empty((self.rows.shape[0], width), dtype=all_rows.dtype)
        self.comm.Ireduce_scatter(all_rows.contiguous(), owned,
                                  [rows * width for rows in self.rows_per_rank],
                                  kind="reverse_halo").wait()
        return owned


class _CagnetSpMM(torch.autograd.Function):
    """``Y_p = Â[R_p, :] H`` with all of H gathered on every rank; backward:
    ``dH = sum_p Â[R_p, :]^T dY_p``, reduced and scattered to the owners."""

    @staticmethod
    def forward(ctx, owned_rows, operator):
        ctx.operator = operator
        return _backend.spmm_fixed(operator.rows, operator.allgather(owned_rows.detach()))

    @staticmethod
    def backward(ctx, grad_y):
        if not ctx.needs_input_grad[0]:
            return None, None
        operator = ctx.operator
        # The transpose is kept on the operator's matrix: built once, like our layers'.
        contribution = _backend.spmm_fixed(_graph.transposed_like(operator.rows),
                                           grad_y.contiguous())
        return operator.reduce_scatter(contribution), None


def cagnet_spmm(operator, owned_rows):
    """CAGNET-1D's ``Â H`` for this rank's rows, differentiable in ``owned_rows``."""
    return _CagnetSpMM.apply(owned_rows, operator)


class CagnetGCN(torch.nn.Module):
    """The library's `GCN` (its parameters, dropout and operator order) with every SpMM done
    the CAGNET-1D way through ``operator``.

    Parameters
    ----------
    gcn : pysparse_hpc.nn.models.GCN
        Its parameters are this module's.
    operator : CagnetOperator
    """

    def __init__(self, gcn, operator):
        super().__init__()
        self.gcn, self.operator = gcn, operator
        #: The operator order of each layer in the last forward call.
        self.last_orders = []

    def _layer(self, layer, x):
        needs_grad = x.requires_grad and torch.is_grad_enabled()
        order = choose_order(layer.in_channels, layer.out_channels, needs_grad)
        self.last_orders.append(order)
        if order == "transform_first":
            out = cagnet_spmm(self.operator, layer.lin(x))
        else:
            out = layer.lin(cagnet_spmm(self.operator, x))
        return out + layer.bias

    def forward(self, x):
        gcn, ids = self.gcn, self.operator.owned
        self.last_orders = []
        if gcn.input_dropout:
            x = functional.dropout(x, gcn.dropout, self.training, ids)
        x = F.relu(self._layer(gcn.conv1, x))
        x = functional.dropout(x, gcn.dropout, self.training, ids)
        return self._layer(gcn.conv2, x)

    def param_groups(self, weight_decay):
        """The wrapped GCN's groups (weight decay on the first layer only)."""
        return self.gcn.param_groups(weight_decay)


# --- timing --------------------------------------------------------------------------------

class _Run:
    """One configuration's training step and what its timed steps measured on this rank."""

    def __init__(self, label, module, forward, data, comm, hyper):
        self.label, self.module, self.comm = label, module, comm
        wrapped = module
        if comm.size > 1:
            from ..distributed.data_parallel import DataParallel
            # Every rank's loss is already divided by the global count: sum, do not average.
            wrapped = DataParallel(module, comm, average=False)
        self._forward = lambda x: forward(wrapped, x)
        self._optimizer = torch.optim.Adam(module.param_groups(hyper["weight_decay"]),
                                           lr=hyper["lr"])
        self._data = data
        self.losses, self.seconds, self.blocked = [], [], []
        self.waited = {kind: 0.0 for kind in STEP_KINDS}
        self.received = {kind: 0 for kind in STEP_KINDS}
        self.sent = {kind: 0 for kind in STEP_KINDS}

    def step(self, seed):
        """One training step with dropout masks from ``seed``; returns this rank's loss."""
        x, y, train_mask, n_train = self._data
        torch.manual_seed(seed)
        self.module.train()
        self._optimizer.zero_grad()
        logits = self._forward(x)
        loss = F.cross_entropy(logits[train_mask], y[train_mask], reduction="sum") / n_train
        loss.backward()
        self._optimizer.step()
        return float(loss)

    def timed_step(self, seed):
        """`step` after a barrier, with its time, blocked seconds and bytes recorded."""
        comm = self.comm
        comm.Barrier()
        waited, stats = comm.wait_seconds(), comm.stats()
        start = time.perf_counter()
        loss = self.step(seed)
        self.seconds.append(time.perf_counter() - start)
        self.losses.append(loss)
        waited_after, stats_after = comm.wait_seconds(), comm.stats()
        blocked = 0.0
        for kind in STEP_KINDS:
            for booked in _COUNTED_AS[kind]:
                delta = waited_after.get(booked, 0.0) - waited.get(booked, 0.0)
                self.waited[kind] += delta
                blocked += delta
                for totals, key in ((self.received, "bytes_received"),
                                    (self.sent, "bytes_sent")):
                    totals[kind] += (stats_after.get(booked, {}).get(key, 0)
                                     - stats.get(booked, {}).get(key, 0))
        self.blocked.append(blocked)
        return loss


def _summary(run, comm, epochs, warmup_losses):
    """The figures of ``run`` over all ranks (on rank 0; None elsewhere)."""
    mine = dict(seconds=run.seconds, waited=run.waited, received=run.received, sent=run.sent,
                blocked=run.blocked)
    losses = comm_sum(comm, np.array(warmup_losses + run.losses, dtype=np.float64))
    everyone = comm.gather(mine)
    if everyone is None:
        return None
    step_seconds = np.max([r["seconds"] for r in everyone], axis=0)  # the slowest rank
    exposed = [sum(r["waited"].values()) / epochs for r in everyone]
    return dict(
        config=run.label,
        epoch_seconds=float(statistics.median(step_seconds)),
        step_seconds=step_seconds.tolist(),
        exposed_seconds=float(max(exposed)),
        exposed_per_rank=exposed,
        # Per rank, median over the steps: its own work (step less blocked), its blocked time.
        compute_per_rank=[float(statistics.median(np.subtract(r["seconds"], r["blocked"])))
                          for r in everyone],
        blocked_per_rank=[float(statistics.median(r["blocked"])) for r in everyone],
        exposed_by_kind={kind: max(r["waited"][kind] for r in everyone) / epochs
                         for kind in STEP_KINDS},
        bytes_received={kind: sum(r["received"][kind] for r in everyone) / epochs
                        for kind in STEP_KINDS},
        bytes_sent={kind: sum(r["sent"][kind] for r in everyone) / epochs
                    for kind in STEP_KINDS},
        losses=losses.tolist(),
    )


def _relative_difference(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30))) if a.size else 0.0


class LossMismatch(RuntimeError):
    """The CAGNET peer's losses differ from ours: the comparison would be meaningless."""


def _distribute(case, comm, seed, method, work_ratio=None):
    """``(graph, x, y, train_mask, n_train, header)`` on every rank: rank 0 partitions
    ``case`` with ``method`` (`pysparse_hpc.bench.distributed.partition_graph`; "metis-work"
    with ``work_ratio``, its c) and scatters the rows (``case`` is None on the other
    ranks)."""
    from .distributed import partition_graph
    parts = (partition_graph(case.adj, comm.size, method, seed=seed, work_ratio=work_ratio)
             if comm.rank == 0 else None)
    graph = DistGraph.scatter(None if case is None else case.adj, parts, comm)

    def rows(tensor_of):
        return torch.from_numpy(np.ascontiguousarray(graph.scatter_rows(
            None if case is None else tensor_of(case).numpy())))

    x, y, train_mask = rows(lambda c: c.x), rows(lambda c: c.y), rows(lambda c: c.train_mask)
    n_train = comm_sum(comm, float(train_mask.sum()))
    header = comm.bcast(None if case is None else (case.x.shape[1], case.num_classes))
    return graph, x, y, train_mask, n_train, header


def _rank_figures(graph):
    """Rows, halo rows and normalized-adjacency entries of every rank (rank 0's list)."""
    mine = (graph.n_local, graph.n_halo, gcn_norm(graph).local.nnz)
    everyone = graph.comm.gather(mine)
    if everyone is None:
        return None
    return dict(owned_rows=[r[0] for r in everyone], halo_rows=[r[1] for r in everyone],
                owned_nnz=[r[2] for r in everyone])


def _run_graph(name, config, comm):
    """Every hidden width's runs on graph ``name``: a list of result dicts (rank 0)."""
    from .distributed import build_case
    seed, warmup, epochs = config["seed"], config["warmup"], config["epochs"]
    case = build_case(name, config["data_dir"], config["quick"]) if comm.rank == 0 else None
    if comm.size == 1:
        graph, data = case.adj, (case.x, case.y, case.train_mask, float(case.train_mask.sum()))
        in_channels, classes = case.x.shape[1], case.num_classes
        figures = dict(owned_rows=[case.nodes], halo_rows=[0],
                       owned_nnz=[gcn_norm(case.adj).nnz])
    else:
        work_ratio = (config.get("work_ratios") or {}).get(name)
        graph, x, y, train_mask, n_train, (in_channels, classes) = _distribute(
            case, comm, seed, config.get("method") or "metis", work_ratio)
        data = (x, y, train_mask, n_train)
        figures = _rank_figures(graph)
    info = comm.bcast(None if case is None else dict(graph=name, nodes=case.nodes,
                                                     edges=case.edges))
    del case
    work_ratio = (config.get("work_ratios") or {}).get(name) if comm.size > 1 else None
    results = []
    for hidden in config["hidden"]:
        def make_gcn():
            torch.manual_seed(seed)
            return GCN(in_channels, hidden=hidden, out_channels=classes)
        hyper = GCN.training
        ours = make_gcn()
        runs = [_Run("single" if comm.size == 1 else "ours", ours, lambda m, x: m(x, graph),
                     data, comm, hyper)]
        if comm.size > 1 and config["cagnet"]:
            cagnet = CagnetGCN(make_gcn(), CagnetOperator(graph))
            runs.append(_Run("cagnet", cagnet, lambda m, x: m(x), data, comm, hyper))
        warmup_losses = {run.label: [run.step(seed * 100_003 + s) for s in range(warmup)]
                         for run in runs}
        orders = [ours.conv1.last_order, ours.conv2.last_order]
        _check_peer(runs, warmup_losses, orders, comm)
        for s in range(warmup, warmup + epochs):
            for run in runs:
                run.timed_step(seed * 100_003 + s)
        for run in runs:
            summary = _summary(run, comm, epochs, warmup_losses[run.label])
            if summary is not None:
                summary.update(info, hidden=hidden, ranks=comm.size, orders=orders,
                               warmup=warmup, epochs=epochs,
                               method=config.get("method") if comm.size > 1 else None,
                               work_ratio=work_ratio, **figures)
                results.append(summary)
        if len(runs) > 1 and comm.rank == 0:
            ours_losses, peer = results[-2]["losses"], results[-1]
            peer["loss_rel_diff_vs_ours"] = _relative_difference(peer["losses"], ours_losses)
        del runs, ours
    return results


def _check_peer(runs, warmup_losses, orders, comm):
    """Raise `LossMismatch` on every rank unless the CAGNET peer's warm-up losses equal ours
    and it used our operator orders."""
    if len(runs) < 2:
        return
    ours = comm_sum(comm, np.array(warmup_losses["ours"], dtype=np.float64))
    peer = comm_sum(comm, np.array(warmup_losses["cagnet"], dtype=np.float64))
    if runs[1].module.last_orders != orders:
        raise LossMismatch(f"the CAGNET peer used the orders {runs[1].module.last_orders}, "
                           f"ours {orders}")
    if not np.allclose(peer, ours, rtol=LOSS_RTOL, atol=0.0):
        raise LossMismatch(f"the CAGNET peer's warm-up losses {peer.tolist()} differ from ours "
                           f"{ours.tolist()} (relative tolerance {LOSS_RTOL:g})")


def _measure_rates(config):
    """The single-thread kernel rates of every configured graph and hidden width, as dicts."""
    from .distributed import build_case, measure_rates
    rates = []
    for name in config["graphs"]:
        case = build_case(name, config["data_dir"], config["quick"])
        rates += [dataclasses.asdict(measure_rates(case, hidden, config["repeat"]))
                  for hidden in config["hidden"]]
    return rates


def main(argv=None):
    """Run the configured jobs on this rank; rank 0 writes the result file. Returns the exit
    status (1 when the CAGNET peer disagrees with ours)."""
    argv = sys.argv[1:] if argv is None else argv
    started = start(argv, "pysparse_hpc.bench._distributed_worker")
    if started is None:
        return 2
    config, comm = started
    result = dict(ranks=comm.size, threads_per_rank=config["threads_per_rank"], cases=[],
                  rates=[], error=None)
    status = 0
    try:
        if config.get("mode") == "rates":
            result["rates"] = _measure_rates(config)
        else:
            for name in config["graphs"]:
                result["cases"] += _run_graph(name, config, comm) or []
    except LossMismatch as exc:  # raised on every rank alike
        result["error"], status = str(exc), 1
    finish(argv, comm, result)
    return status


if __name__ == "__main__":
    sys.exit(main())
