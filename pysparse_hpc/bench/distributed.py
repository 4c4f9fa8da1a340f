"""The ``distributed`` benchmark: full-graph GCN training over MPI, measured, planned, projected.

Three parts, each printed as tables and judged against the project's targets (MET / NOT MET
with the measured figure):

1. **Real runs** at P = 1 and P = 2 (``--run-ranks``). P = 1 is one process on ``--threads``
   threads training the library's 2-layer GCN on the whole graph; P = ``R`` is ``mpiexec -n R``
   with ``threads // R`` threads per rank (the same total), the graph partitioned on rank 0
   and scattered, one job per partitioner of ``--run-methods`` (default: METIS balancing node
   counts, "metis", and METIS balancing node counts and stored entries at once with two
   constraints, "metis-rows+nnz"; also available: "metis-nnz", METIS balancing stored
   entries, and "metis-work", METIS balancing the measured work: each node weighs its stored
   entries + c, c = t_row / t_entry_step from the kernel rates below, one job per hidden
   width since c depends on it). All are subprocesses running
   `pysparse_hpc.bench._distributed_worker`, which writes its results as JSON. At P > 1 two
   configurations are timed in turns from the same seed: ours (halo exchange overlapped with
   the owned-column product, `DataParallel` gradient allreduce) and the
   CAGNET-1D peer (every SpMM gathers all of H on every rank; its backward reduce-scatters
   ``A_local^T dY``; ``--cagnet-methods`` picks the partitions it runs on), whose losses must
   equal ours before anything is timed. Per configuration: the epoch (median of the timed
   training steps, the slowest rank's time of each), the **exposed communication** (seconds
   blocked waiting for nonblocking exchanges and allreduces, `Communicator.wait_seconds`, per
   epoch, the largest over ranks: the communication that the computation did not hide, and
   with it any wait for a slower rank), per rank the compute (median over the timed steps of
   the step's time less its blocked time) beside the blocked time, which separates load
   imbalance from the network, and the bytes received per epoch by all ranks together (halo,
   reverse halo, gradient allreduce). Targets, judged on the graphs of at least 1M stored
   edges, per partitioner: at P = 2 an epoch takes at most 1.25x the single-process epoch at
   the same total threads, and exposed communication is at most 20 % of the epoch.
2. **Exact plans** for P = 2, 4, ..., ``--max-ranks`` (powers of two): METIS balancing nodes
   ("metis"), stored entries ("metis-nnz", vertex weights = entries + 1) or work
   ("metis-work", vertex weights = entries + c, one plan per hidden width) or both nodes and
   entries ("metis-rows+nnz", two constraints), contiguous blocks
   after the library's rabbit or RCM reordering, contiguous blocks of the order given
   (``--methods contiguous``), random partitions (`pysparse_hpc.distributed.partition`), and
   on the planted-community graph its own communities dealt out in blocks ("planted"):
   halo volume against CAGNET-1D's ``(P - 1) n`` rows, messages per rank (peers, max and
   mean), balance (rows and stored entries), edge cut. Target: METIS's volume at most 10 % of
   CAGNET-1D's at P = 8 on PubMed and the planted-community graph (judged on "metis"; the
   other METIS figures and the planted split's are printed beside it). The **mixing sweep**
   (``--mixing``) plans METIS and the planted split at P = 8 on planted graphs of the same
   size and degree with fewer or more edges outside the communities: what the target needs
   of the graph.
3. **Projection** of the epoch time and parallel efficiency to large P from the exact plans,
   kernel rates measured here on one thread and an alpha-beta network model, for a 25 GB/s
   and a 100 GB/s network with 2 us latency (`NETWORKS`); CAGNET-1D is projected on the METIS
   rows, so that it differs from ours only in what it moves.

The projection model (also printed with the results):

- Rates: measured in the same run by a worker process of one thread, on the whole graph: the
  time of our SpMM ``Â H`` at every width the GCN multiplies (per stored entry of
  ``Â = D^-1/2 (A + I) D^-1/2``; the backward products are charged the forward rate, ``Â``
  being symmetric), and the time ``T1`` of a whole training step (median of ``--repeat``).
  Everything in a step that is not an SpMM (the dense transforms, dropout, ReLU, loss, Adam)
  is charged per row: ``t_row = (T1 - SpMM time) / n``. So the model reproduces ``T1`` at
  P = 1. Rates are assumed not to change with the size of a rank's piece
  (caches would make small pieces faster), and a rank runs one thread.
- Compute at P: the largest over ranks of ``nnz_p * sum_calls t_entry(width) + rows_p *
  t_row``, where ``nnz_p`` counts ``Â``'s entries in the rank's rows and the calls are the
  step's SpMMs (forward and backward, widths from the GCN's operator order).
- Communication: every halo exchange costs the largest over ranks of ``alpha * peers_p +
  bytes_received_p / beta`` (float32 rows of the exchanged width); the forward exchange
  receives the halo, the reverse exchange of the backward pass receives back the rows the
  rank sent. CAGNET-1D's allgatherv receives the ``n - rows_p`` rows of the other ranks from
  ``P - 1`` peers, its reduce-scatter ``P - 1`` contributions of the rank's own rows. The
  gradient allreduce is a ring: ``2 (P - 1) / P * bytes / beta + 2 log2(P) * alpha``.
- No overlap: the epoch is compute + exchanges + allreduce (ours overlaps the owned-column
  product with the exchange, so this is pessimistic for it), and no contention (every rank
  gets the full link bandwidth ``beta``).
- Efficiency: ``T1 / (P * T_P)``.
- Work ratio of "metis-work": ``c = t_row / t_entry_step``, ``t_entry_step`` = the SpMM time
  of a step per stored entry of ``Â`` (all its SpMMs), so a node's model compute is
  ``t_entry_step * (entries + c)``: METIS balancing these weights balances the model's compute.

The machine this was written on has 2 cores: P = 2 runs one thread per rank on each core, so
it measures the algorithm's overheads at equal resources; timings are noisy (``--rounds``
repeats the jobs in turns and keeps each configuration's fastest epoch, and the load average
around every job is printed). What holds at larger P is what the exact plans count.
"""
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..distributed._comm import mpiexec_path as find_mpiexec
from ..distributed._jobs import stop_job
from . import best_times, counted, gnn, positive_int, positive_width, timeout_seconds

__all__ = ["GRAPHS", "HELP", "METHODS", "NETWORKS", "Network", "PARTITIONERS", "Plan",
           "Projection", "RUN_METHODS", "Rates", "RunResult", "add_arguments",
           "allreduce_seconds", "build_case", "exchange_seconds", "find_mpiexec", "make_plans",
           "measure_rates", "partition_graph", "project", "project_cagnet", "run", "schedule",
           "send_side"]

HELP = ("full-graph GCN training over MPI: P=1/2 runs against CAGNET-1D, exact partition plans "
        "to P=1024, alpha-beta projection")

#: Graphs the command knows, and those it runs by default.
GRAPHS = ("cora", "citeseer", "pubmed", "generated", "rmat")
DEFAULT_GRAPHS = ("pubmed", "generated", "rmat")

#: Partitioners of the plans: METIS balancing nodes, stored entries, the measured work
#: (entries + c per node, c = `Rates.work_ratio`) or nodes and entries at once (two
#: constraints), contiguous blocks after a reordering (or of the given order), random, and
#: for a generated graph its planted communities in contiguous blocks of communities (the
#: split its generator knows to be best; other graphs have no plan of it).
METHODS = ("metis", "metis-nnz", "metis-work", "metis-rows+nnz", "rabbit", "rcm", "contiguous",
           "random", "planted")
DEFAULT_METHODS = ("metis", "metis-nnz", "metis-work", "metis-rows+nnz", "rabbit", "rcm",
                   "random", "planted")
PLANTED = "planted"
#: The METIS partitioners, whose volumes the plan verdicts print.
METIS_METHODS = ("metis", "metis-nnz", "metis-work", "metis-rows+nnz")
#: The balance of "metis-work": replaced by the measured work ratio c of the graph and hidden
#: width (`partition_graph`'s ``work_ratio``).
WORK = "work"
#: The methods that partition the graph as given, and their `partition` arguments
#: ``(method, balance)``; "rabbit" and "rcm" are "contiguous" after that reordering.
PARTITIONERS = {"metis": ("metis", "rows"), "metis-nnz": ("metis", "nnz"),
                "metis-work": ("metis", WORK), "metis-rows+nnz": ("metis", "rows+nnz"),
                "contiguous": ("contiguous", "nnz"),
                "random": ("random", "rows")}
#: Methods whose partition depends on the hidden width (through c): one plan and one real
#: job per width.
PER_WIDTH = ("metis-work",)
REORDERINGS = ("rabbit", "rcm")
#: Partitioners the real runs can use (the graph as given, partitioned on rank 0), and those
#: they run by default.
RUN_METHODS = tuple(PARTITIONERS)
DEFAULT_RUN_METHODS = ("metis", "metis-rows+nnz")
#: The partitioner of CAGNET-1D's rows in the projection and of the volume target.
RUN_METHOD = "metis"
#: The label of CAGNET-1D in the projection.
CAGNET = "cagnet-1d"

#: Hidden widths run by default.
HIDDEN = (16, 64)

#: R-MAT: Graph500 quadrant probabilities, symmetrized, no self loops, unit weights
#: (65,536 nodes, about 1.18M stored entries), random 128-wide features and 10 classes.
RMAT = dict(scale=16, edge_factor=10, seed=1)
RMAT_FEATURES, RMAT_CLASSES, RMAT_SPLIT = 128, 10, (200, 500, 1000)
#: ``--quick``: small versions of the generated graphs, for tests.
QUICK_GENERATED = dict(n_communities=200, community_size=32, internal_degree=8.0,
                       external_degree=4.0, seed=1, shuffle=True)
QUICK_RMAT = dict(scale=12, edge_factor=8, seed=1)
#: ``--mixing``: the expected edges per node that go anywhere (outside the community) in the
#: planted graphs of the mixing sweep, each at the generated graph's expected degree (12).
DEFAULT_MIXING = (4.0, 2.0, 1.0, 0.5)
MIXING_METHODS = ("metis", PLANTED)

#: Bytes of one exchanged value (float32).
VALUE_BYTES = 4


@dataclass(frozen=True)
class Network:
    """An alpha-beta network: ``alpha`` seconds per message, ``beta`` bytes per second."""

    name: str
    alpha: float
    beta: float


#: Latency of every network of the projection (seconds per message).
ALPHA = 2e-6
#: The networks of the projection.
NETWORKS = (Network("25GB/s", ALPHA, 25e9), Network("100GB/s", ALPHA, 100e9))

#: Targets: P=2 epoch over the single-process epoch, exposed share of the epoch (judged on
#: graphs of at least `TARGET_MIN_EDGES` stored entries), METIS volume over CAGNET-1D's.
TARGET_EPOCH_RATIO = 1.25
TARGET_EXPOSED = 0.20
TARGET_MIN_EDGES = 1_000_000
TARGET_VOLUME, TARGET_VOLUME_RANKS, TARGET_VOLUME_GRAPHS = 0.10, 8, ("pubmed", "generated")

WORKER = "pysparse_hpc.bench._distributed_worker"

#: Columns of ``--csv``; each section fills its own.
CSV_COLUMNS = ("section", "graph", "method", "ranks", "hidden", "config", "network",
               "threads_per_rank", "epoch_ms", "vs_single", "exposed_ms", "exposed_fraction",
               "halo_bytes", "reverse_halo_bytes", "allreduce_bytes", "bytes_per_epoch",
               "nodes", "nnz", "volume_rows", "cagnet_volume_rows", "volume_fraction",
               "max_halo_rows", "peers_max", "peers_mean", "row_balance", "nnz_balance",
               "edge_cut", "partition_seconds", "alpha_us", "beta_gbps", "compute_ms",
               "exchange_ms", "allreduce_ms", "single_ms", "efficiency", "rank_rows",
               "rank_nnz", "rank_compute_ms", "rank_blocked_ms", "work_ratio")


#: The most ranks a benchmark job starts per core: a few oversubscribe usefully (three ranks
#: on two cores), far more only take turns and can exhaust the machine.
MAX_RANKS_PER_CORE = 8
#: The largest P the partitions are planned for (``--max-ranks``): each doubling plans anew.
MAX_PLANNED_RANKS = 4096


def check_ranks(values, option, error=ValueError):
    """Raise ``error`` naming ``option`` when a job of ``values`` ranks would put more than
    `MAX_RANKS_PER_CORE` on each of this machine's cores."""
    cores = os.cpu_count() or 1
    limit = MAX_RANKS_PER_CORE * cores
    for ranks in values:
        if ranks > limit:
            raise error(f"{option}: {ranks} ranks on {cores} cores; at most {limit} "
                        f"({MAX_RANKS_PER_CORE} per core)")


class UsageError(ValueError):
    """Bad command-line input: the command exits with status 2."""


# --- graphs --------------------------------------------------------------------------------

def _unit_weights(adj):
    from .._csr import csr_array
    return csr_array((np.ones(adj.nnz, dtype=np.float32), adj.indices, adj.indptr),
                     shape=adj.shape)


def build_case(name, data_dir, quick=False):
    """The `pysparse_hpc.bench.gnn.GraphCase` of a name in `GRAPHS`.

    Cora and CiteSeer come with their features and split, PubMed is the shared structure with
    random 500-wide features (as in the ``gnn`` benchmark), ``generated`` the planted-community
    graph of the ``gnn`` benchmark (over 1M stored entries, node ids shuffled) and ``rmat`` an
    R-MAT graph (`RMAT`), both with random 128-wide features and random labels. ``quick``
    makes the generated graphs small (`QUICK_GENERATED`, `QUICK_RMAT`).

    Raises
    ------
    FileNotFoundError
        PubMed's structure is not in ``data_dir``.
    """
    from ..generators import planted_partition, rmat
    if name == "generated" and quick:
        adj, communities = planted_partition(**QUICK_GENERATED)
        note = (f"planted_partition({QUICK_GENERATED['n_communities']} x "
                f"{QUICK_GENERATED['community_size']}, ids shuffled) (--quick), random features")
        return replace(gnn._random_node_data(name, adj, gnn.GENERATED_FEATURES,
                                             gnn.GENERATED_CLASSES, gnn.GENERATED_SPLIT, 1, note),
                       communities=communities)
    if name == "rmat":
        settings = QUICK_RMAT if quick else RMAT
        adj = _unit_weights(rmat(**settings, symmetric=True, self_loops=False))
        note = (f"R-MAT scale {settings['scale']}, edge factor {settings['edge_factor']}, "
                f"Graph500 probabilities, symmetrized, no self loops, unit weights"
                f"{' (--quick)' if quick else ''}, random features ({RMAT_FEATURES} wide) and "
                f"labels ({RMAT_CLASSES} classes)")
        return gnn._random_node_data(name, adj, RMAT_FEATURES, RMAT_CLASSES, RMAT_SPLIT, 2, note)
    return gnn.load_graph(name, data_dir)


def _hat_row_lengths(adj):
    """Stored entries of every row of ``A + I`` (what the GCN's SpMM multiplies)."""
    indptr, indices = np.asarray(adj.indptr), np.asarray(adj.indices)
    lengths = np.diff(indptr).astype(np.int64)
    rows = np.repeat(np.arange(adj.shape[0]), lengths)
    has_diagonal = np.zeros(adj.shape[0], dtype=bool)
    has_diagonal[rows[indices == rows]] = True
    return lengths + ~has_diagonal


# --- exact plans ---------------------------------------------------------------------------

@dataclass
class Plan:
    """The exact communication plan of one partition, with per-rank figures for the model.

    Attributes
    ----------
    graph, method : str
    ranks, nodes, nnz : int
    volume : int
        Halo rows received per exchange, all ranks (`Partition.communication_volume`).
    cagnet_volume : int
        ``(P - 1) n``: CAGNET-1D's rows per exchange.
    max_halo, peers_max : int
    peers_mean, row_balance, nnz_balance : float
    edge_cut : int
    seconds : float
        Time to partition (the reordering excluded).
    owned_rows, owned_nnz_hat, halo_rows, peers, sent_rows, send_peers : ndarray
        Per rank: rows, entries of ``A + I`` in its rows, halo rows, ranks it receives from,
        rows it sends (what it receives back in the reverse exchange), ranks it sends to.
    hidden : int
        The hidden width whose work ratio weighed the nodes ("metis-work"); 0: any width.
    work_ratio : float or None
        "metis-work"'s c (METIS vertex weights: stored entries + c).
    """

    graph: str
    method: str
    ranks: int
    nodes: int
    nnz: int
    volume: int
    cagnet_volume: int
    max_halo: int
    peers_max: int
    peers_mean: float
    row_balance: float
    nnz_balance: float
    edge_cut: int
    seconds: float
    owned_rows: np.ndarray = field(repr=False)
    owned_nnz_hat: np.ndarray = field(repr=False)
    halo_rows: np.ndarray = field(repr=False)
    peers: np.ndarray = field(repr=False)
    sent_rows: np.ndarray = field(repr=False)
    send_peers: np.ndarray = field(repr=False)
    hidden: int = 0
    work_ratio: object = None

    @property
    def label(self):
        """The method, and for a per-width plan its hidden width."""
        return f"{self.method} h{self.hidden}" if self.hidden else self.method

    def fits(self, hidden):
        """Whether this plan belongs to the projection at ``hidden``."""
        return self.hidden in (0, hidden)

    @property
    def fraction(self):
        """`volume` / `cagnet_volume`."""
        return self.volume / self.cagnet_volume if self.cagnet_volume else 0.0


def send_side(indptr, indices, owner, nparts):
    """Rows each part sends per halo exchange and the parts it sends them to.

    The mirror of `Partition.halo_sizes` and `Partition.peers` (which count what a part
    receives): part q sends node j to part p when j is in p's halo. ``sent.sum()`` equals the
    communication volume.

    Parameters
    ----------
    indptr, indices : ndarray
        A square CSR pattern.
    owner : ndarray of int64
        Part of every node, in ``[0, nparts)``.
    nparts : int

    Returns
    -------
    sent_rows, send_peers : ndarray of int64, shape (nparts,)
    """
    from ..distributed.partition import _unique
    n = owner.size
    row_owner = np.repeat(owner, np.diff(indptr))
    crossing = row_owner != owner[indices]
    # One key per (receiving part, halo node), as the partition's own figures count them.
    keys = _unique(row_owner[crossing] * np.int64(n) + indices[crossing].astype(np.int64))
    receiver = keys // n if n else keys
    sender = owner[keys - receiver * n] if n else keys
    sent_rows = np.bincount(sender, minlength=nparts).astype(np.int64)
    pairs = _unique(sender * np.int64(nparts) + receiver)
    send_peers = np.bincount(pairs // nparts, minlength=nparts).astype(np.int64)
    return sent_rows, send_peers


def _plan_of(name, part, indptr, indices, hat_lengths, seconds, hidden=0, work_ratio=None):
    sent_rows, send_peers = send_side(indptr, indices, part.owner, part.nparts)
    owned_nnz_hat = np.bincount(part.owner, weights=hat_lengths,
                                minlength=part.nparts).astype(np.int64)
    return Plan(graph=name, method=part.method, ranks=part.nparts, nodes=part.n_nodes,
                nnz=part.nnz, volume=part.communication_volume,
                cagnet_volume=part.cagnet_volume, max_halo=int(part.halo_sizes.max()),
                peers_max=int(part.peers.max()), peers_mean=float(part.peers.mean()),
                row_balance=part.row_balance, nnz_balance=part.nnz_balance,
                edge_cut=part.edge_cut, seconds=seconds, owned_rows=part.owned_rows,
                owned_nnz_hat=owned_nnz_hat, halo_rows=part.halo_sizes, peers=part.peers,
                sent_rows=sent_rows, send_peers=send_peers, hidden=hidden,
                work_ratio=work_ratio)


def partition_graph(adj, nparts, method, seed=0, work_ratio=None):
    """`pysparse_hpc.distributed.partition` of ``adj`` for a method of `PARTITIONERS`, its
    `Partition.method` set to that name ("metis-nnz": METIS with ``balance="nnz"``,
    "metis-rows+nnz": with ``balance="rows+nnz"``, "metis-work": METIS with
    ``balance=work_ratio``, the c of `Rates.work_ratio`).

    Raises
    ------
    ValueError
        "metis-work" without a ``work_ratio``.
    """
    from ..distributed.partition import partition
    kind, balance = PARTITIONERS[method]
    if balance == WORK:
        if work_ratio is None:
            raise ValueError(f"method {method!r} needs the work ratio c (t_row / t_entry of a "
                             "step's SpMMs)")
        balance = float(work_ratio)
    part = partition(adj, nparts, kind, seed=seed, balance=balance)
    part.method = method
    return part


def make_plans(name, adj, methods, ranks, progress=None, seed=0, work_ratios=None,
               communities=None):
    """The `Plan` of every (method, P) on one graph, and of every (method, hidden width, P)
    for the methods of `PER_WIDTH`.

    Parameters
    ----------
    name : str
    adj : sparse array, shape (n, n)
    methods : sequence of str
        Names of `METHODS`; "rabbit" and "rcm" reorder once, then split into contiguous blocks
        (balanced by stored entries), the others are `partition_graph`'s.
    ranks : sequence of int
    progress : tqdm, optional
        Advanced once per plan.
    seed : int
    work_ratios : dict of int to float, optional
        This graph's c per hidden width (`Rates.work_ratio`); needed by "metis-work", which
        plans each width with its own c.
    communities : ndarray of int, optional
        The planted community of every node (`GraphCase.communities`); "planted" makes no
        plans without it.

    Returns
    -------
    list of Plan

    Raises
    ------
    ValueError
        "metis-work" is asked for without ``work_ratios``.
    """
    if any(m in PER_WIDTH for m in methods) and not work_ratios:
        raise ValueError(f"the methods {', '.join(PER_WIDTH)} need the work ratios c per "
                         "hidden width")
    hat_lengths = _hat_row_lengths(adj)
    plans = []
    for method in methods:
        if method == PLANTED:
            if communities is not None:
                plans += _planted_plans(name, adj, communities, ranks, progress, hat_lengths)
            continue
        widths = sorted(work_ratios.items()) if method in PER_WIDTH else [(0, None)]
        for hidden, ratio in widths:
            plans += _method_plans(name, adj, method, ranks, progress, seed, hat_lengths,
                                   hidden, ratio)
    return plans


def planted_owner(communities, nparts):
    """Owner of every node when the planted communities (numbered 0, 1, ...) are dealt to
    ``nparts`` ranks in contiguous blocks of communities (equal-sized communities: balanced
    rows)."""
    communities = np.asarray(communities, dtype=np.int64)
    count = int(communities.max()) + 1 if communities.size else 1
    return communities * nparts // count


def _planted_plans(name, adj, communities, ranks, progress, hat_lengths):
    """`make_plans` of "planted"."""
    from ..distributed.partition import Partition
    csr = adj.tocsr()
    indptr, indices = np.asarray(csr.indptr), np.asarray(csr.indices)
    plans = []
    for nparts in ranks:
        part = Partition(adj, planted_owner(communities, nparts), nparts, method=PLANTED)
        plans.append(_plan_of(name, part, indptr, indices, hat_lengths, 0.0))
        if progress is not None:
            progress.update()
    return plans


def mixing_plans(external_degrees, quick=False, seed=0):
    """The METIS and planted plans at P = `TARGET_VOLUME_RANKS` of planted graphs like
    "generated" (same size and expected degree, ids shuffled) with each of
    ``external_degrees`` of a node's expected edges going anywhere instead of inside its
    community: how the halo volume target depends on how much of the graph no split can keep
    local.

    Returns
    -------
    list of (float, list of Plan)
        Per external degree, its plans (graph name ``generated ext=D``).
    """
    from ..generators import planted_partition
    settings = dict(QUICK_GENERATED if quick else gnn.GENERATED)
    degree = settings["internal_degree"] + settings["external_degree"]
    sweep = []
    for external in external_degrees:
        adj, communities = planted_partition(**dict(settings, internal_degree=degree - external,
                                                    external_degree=external))
        sweep.append((external, make_plans(f"generated ext={external:g}", adj, MIXING_METHODS,
                                           [TARGET_VOLUME_RANKS], seed=seed,
                                           communities=communities)))
    return sweep


def mixing_lines(sweep):
    """The mixing sweep: one line per external degree, METIS's and the planted split's halo
    volume against the target."""
    lines = [f"{'graph':<20} {'external share':>14} {'stored edges':>12} "
             f"{'METIS % CAGNET':>14} {'planted %':>9} {'target':>8}"]
    lines.append("-" * len(lines[0]))
    degree = gnn.GENERATED["internal_degree"] + gnn.GENERATED["external_degree"]
    for external, plans in sweep:
        by_method = {p.method: p for p in plans}
        metis, planted = by_method["metis"], by_method[PLANTED]
        lines.append(f"{metis.graph:<20} {external / degree:>14.3f} {metis.nnz:>12} "
                     f"{100 * metis.fraction:>13.2f}% {100 * planted.fraction:>8.2f}% "
                     f"{_verdict(metis.fraction <= TARGET_VOLUME):>8}")
    return lines


def _method_plans(name, adj, method, ranks, progress, seed, hat_lengths, hidden, ratio):
    """`make_plans` of one method (and for a per-width method, one hidden width)."""
    import time

    import pysparse_hpc as sph
    label = f"{method} h{hidden}" if hidden else method
    matrix, lengths = adj, hat_lengths
    if method in REORDERINGS:
        if progress is not None:
            progress.set_postfix_str(f"{name}: {method} reordering")
        perm = sph.reorder(adj, method)
        matrix, lengths = sph.permute(adj, perm), hat_lengths[perm]
    csr = matrix.tocsr()
    indptr, indices = np.asarray(csr.indptr), np.asarray(csr.indices)
    plans = []
    for nparts in ranks:
        if progress is not None:
            progress.set_postfix_str(f"{name}: {label} P={nparts}")
        start = time.perf_counter()
        part = partition_graph(matrix, nparts, "contiguous" if method in REORDERINGS
                               else method, seed=seed, work_ratio=ratio)
        seconds = time.perf_counter() - start
        part.method = method
        plans.append(_plan_of(name, part, indptr, indices, lengths, seconds, hidden, ratio))
        if progress is not None:
            progress.update()
    return plans


# --- kernel rates and the projection -------------------------------------------------------

def schedule(in_channels, hidden, classes):
    """SpMM widths of one GCN training step, ``(forward, backward)``, in the operator order
    the library's GCN picks (`pysparse_hpc.nn.gcn.choose_order`)."""
    from ..nn.gcn import choose_order
    first = choose_order(in_channels, hidden, False)  # the features need no gradient
    width1 = hidden if first == "transform_first" else in_channels
    second = choose_order(hidden, classes, True)
    width2 = classes if second == "transform_first" else hidden
    backward = [width2] + ([width1] if first == "transform_first" else [])
    return [width1, width2], backward


@dataclass
class Rates:
    """Single-thread kernel rates on one graph and hidden width.

    Attributes
    ----------
    graph : str
    hidden, nodes, nnz_hat : int
        ``nnz_hat``: stored entries of ``Â`` (self loops included).
    forward, backward : list of int
        SpMM widths of a training step (`schedule`).
    spmm_seconds : dict of int to float
        Our SpMM ``Â H`` on the whole graph at each width (median).
    step_seconds : float
        ``T1``: one training step on the whole graph, one thread (median).
    parameter_bytes : int
        Bytes of the gradient allreduce.
    """

    graph: str
    hidden: int
    nodes: int
    nnz_hat: int
    forward: list
    backward: list
    spmm_seconds: dict
    step_seconds: float
    parameter_bytes: int

    def entry_seconds(self, width):
        """Seconds per stored entry of an SpMM of ``width`` columns."""
        return self.spmm_seconds[width] / self.nnz_hat

    @property
    def spmm_total(self):
        """Seconds of the SpMMs of one step on the whole graph."""
        return sum(self.spmm_seconds[w] for w in self.forward + self.backward)

    @property
    def row_seconds(self):
        """``t_row``: the rest of a step per row (dense transforms, elementwise, Adam)."""
        return max(self.step_seconds - self.spmm_total, 0.0) / self.nodes

    @property
    def step_entry_seconds(self):
        """``t_entry_step``: seconds per stored entry of ``Â`` of all of a step's SpMMs."""
        return self.spmm_total / self.nnz_hat if self.nnz_hat else 0.0

    @property
    def work_ratio(self):
        """``c = t_row / t_entry_step``: a row's dense work in stored entries' SpMM work, the
        per-node weight beyond its entries that evens out the model's compute ("metis-work":
        METIS vertex weights = stored entries + c)."""
        per_entry = self.step_entry_seconds
        return self.row_seconds / per_entry if per_entry > 0 else 0.0

    def compute_seconds(self, owned_rows, owned_nnz_hat):
        """Compute time of a step on a rank owning these rows and entries (arrays work)."""
        per_entry = sum(self.entry_seconds(w) for w in self.forward + self.backward)
        return owned_nnz_hat * per_entry + owned_rows * self.row_seconds


def measure_rates(case, hidden, repeat):
    """`Rates` of ``case`` at ``hidden``, measured on one thread (library and torch), then the
    thread counts are restored."""
    import torch

    from .. import _config
    from ..nn import _backend
    from ..nn.models import GCN
    from ..nn.norm import gcn_norm
    threads, torch_threads = _config.get_num_threads(), torch.get_num_threads()
    _config.set_num_threads(1)
    torch.set_num_threads(1)
    try:
        a_hat = gcn_norm(case.adj)
        forward, backward = schedule(case.x.shape[1], hidden, case.num_classes)
        generator = torch.Generator().manual_seed(0)
        operands = {w: torch.rand((case.nodes, w), generator=generator)
                    for w in sorted(set(forward + backward))}
        spmm = best_times({w: (lambda h=h: _backend.spmm_fixed(a_hat, h))
                           for w, h in operands.items()}, repeat, warmup=1,
                          statistic=statistics.median)
        torch.manual_seed(0)
        model = GCN(case.x.shape[1], hidden=hidden, out_channels=case.num_classes)
        step = gnn.training_step(model, case.x, case.adj, case, GCN.training)
        step_seconds = best_times({"step": step}, repeat, warmup=2,
                                  statistic=statistics.median)["step"]
        parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    finally:
        _config.set_num_threads(threads)
        torch.set_num_threads(torch_threads)
    return Rates(case.name, hidden, case.nodes, int(a_hat.nnz), forward, backward, spmm,
                 step_seconds, int(parameter_bytes))


def exchange_seconds(peers, rows, width, network):
    """An exchange's time: the largest over ranks of ``alpha * peers + bytes / beta``, where a
    rank receives ``rows`` float32 rows of ``width`` values from ``peers`` ranks."""
    peers, rows = np.asarray(peers, dtype=np.float64), np.asarray(rows, dtype=np.float64)
    if peers.size == 0:
        return 0.0
    return float(np.max(network.alpha * peers + rows * width * VALUE_BYTES / network.beta))


def allreduce_seconds(nbytes, ranks, network):
    """A ring allreduce of ``nbytes``: ``2 (P - 1) / P * nbytes / beta + 2 log2(P) alpha``
    (0 on one rank)."""
    if ranks <= 1:
        return 0.0
    return (2.0 * (ranks - 1) / ranks * nbytes / network.beta
            + 2.0 * math.log2(ranks) * network.alpha)


@dataclass(frozen=True)
class Projection:
    """Projected epoch of one (graph, hidden, method, network, P); times in seconds."""

    graph: str
    hidden: int
    method: str
    network: Network
    ranks: int
    compute: float
    exchanges: float
    allreduce: float
    single: float
    work_ratio: object = None

    @property
    def epoch(self):
        return self.compute + self.exchanges + self.allreduce

    @property
    def efficiency(self):
        """``T1 / (P * T_P)``."""
        return self.single / (self.ranks * self.epoch)


def project(plan, rates, network):
    """The `Projection` of ours (halo exchange) on ``plan``'s partition."""
    compute = float(np.max(rates.compute_seconds(plan.owned_rows, plan.owned_nnz_hat)))
    exchanges = (sum(exchange_seconds(plan.peers, plan.halo_rows, w, network)
                     for w in rates.forward)
                 + sum(exchange_seconds(plan.send_peers, plan.sent_rows, w, network)
                       for w in rates.backward))
    return Projection(plan.graph, rates.hidden, plan.method, network, plan.ranks, compute,
                      exchanges, allreduce_seconds(rates.parameter_bytes, plan.ranks, network),
                      rates.step_seconds, plan.work_ratio)


def project_cagnet(plan, rates, network):
    """The `Projection` of CAGNET-1D with ``plan``'s rows (its volume ignores the partition):
    the allgatherv receives the other ranks' rows, the reduce-scatter ``P - 1`` contributions
    of the rank's own."""
    ranks = plan.ranks
    compute = float(np.max(rates.compute_seconds(plan.owned_rows, plan.owned_nnz_hat)))
    peers = np.full(ranks, ranks - 1)
    exchanges = (sum(exchange_seconds(peers, plan.nodes - plan.owned_rows, w, network)
                     for w in rates.forward)
                 + sum(exchange_seconds(peers, (ranks - 1) * plan.owned_rows, w, network)
                       for w in rates.backward))
    return Projection(plan.graph, rates.hidden, CAGNET, network, ranks, compute, exchanges,
                      allreduce_seconds(rates.parameter_bytes, ranks, network),
                      rates.step_seconds)


# --- real runs -----------------------------------------------------------------------------

class RunError(RuntimeError):
    """A training job failed, timed out, or its CAGNET peer disagreed with ours."""


def launch(ranks, threads_per_rank, config, timeout, mpiexec=None, worker=WORKER):
    """Run the worker module ``worker`` (default: this benchmark's) on ``ranks`` ranks (a plain
    process for 1) and return its result dict.

    Raises
    ------
    RunError
        The job timed out, exited with an error, or wrote no result.
    """
    repo_root = str(Path(__file__).resolve().parents[2])
    threads = str(threads_per_rank)
    env = dict(os.environ, PYSPARSE_HPC_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
               MKL_NUM_THREADS=threads, NUMBA_NUM_THREADS=threads,
               PYTHONPATH=os.pathsep.join([repo_root] + [p for p in [os.environ.get(
                   "PYTHONPATH")] if p]))
    with tempfile.TemporaryDirectory(prefix="pysparse_hpc_dist_") as folder:
        config_path, result_path = Path(folder, "config.json"), Path(folder, "result.json")
        config_path.write_text(json.dumps(dict(config, threads_per_rank=threads_per_rank)))
        command = [sys.executable, "-m", worker, str(config_path), str(result_path)]
        if ranks > 1:
            command = [mpiexec, "-n", str(ranks)] + command
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env, start_new_session=True)
        try:
            _, errors = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_job(process)
            raise RunError(f"the P={ranks} job did not finish within {timeout} s (--timeout); "
                           "it was stopped") from None
        except BaseException:  # interrupted or terminated: the job must not outlive us
            stop_job(process)
            raise
        result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if result is not None and result.get("error"):
        raise RunError(f"the P={ranks} job stopped: {result['error']}")
    if process.returncode != 0 or result is None:
        tail = "\n".join(errors.strip().splitlines()[-15:])
        raise RunError(f"the P={ranks} job ({' '.join(command[:4])} ...) exited with status "
                       f"{process.returncode}:\n{tail}")
    return result


@dataclass
class RunResult:
    """One configuration of one real run (figures per epoch, all ranks together where
    summed).

    Attributes
    ----------
    graph : str
    nodes, edges, hidden, ranks, threads_per_rank : int
    config : {"single", "ours", "cagnet"}
    epoch : float
        Median seconds of a timed step (the slowest rank's).
    exposed : float
        Seconds blocked in waits per epoch, the largest over ranks.
    exposed_by_kind, bytes_received : dict
    losses : list of float
    orders : list of str
    owned_rows, halo_rows, owned_nnz : list of int
        Per rank.
    loss_rel_diff_vs_ours : float or None
    epochs : int
    exposed_per_rank : list of float
        Seconds blocked per epoch on each rank (a rank that waits for a busier one blocks
        longer).
    method : str
        The partitioner of a P > 1 run (a name of `RUN_METHODS`); "" at P = 1.
    rank_compute, rank_blocked : list of float
        Per rank, the median over the timed steps of the step's seconds less its blocked
        seconds (the rank's own work), and of its blocked seconds.
    work_ratio : float or None
        The c of a "metis-work" partition (METIS vertex weights = stored entries + c).
    """

    graph: str
    nodes: int
    edges: int
    hidden: int
    ranks: int
    threads_per_rank: int
    config: str
    epoch: float
    exposed: float
    exposed_by_kind: dict
    bytes_received: dict
    losses: list
    orders: list
    owned_rows: list
    halo_rows: list
    owned_nnz: list
    loss_rel_diff_vs_ours: object
    epochs: int
    exposed_per_rank: list = field(default_factory=list)
    method: str = ""
    rank_compute: list = field(default_factory=list)
    rank_blocked: list = field(default_factory=list)
    work_ratio: object = None

    @property
    def key(self):
        return self.graph, self.hidden

    @property
    def nnz_balance(self):
        """max / mean of the entries of Â per rank."""
        total = sum(self.owned_nnz)
        return max(self.owned_nnz) * len(self.owned_nnz) / total if total else 1.0

    @property
    def bytes_per_epoch(self):
        return sum(self.bytes_received.values())

    @property
    def exposed_fraction(self):
        return self.exposed / self.epoch if self.epoch else 0.0


def _run_results(result):
    return [RunResult(graph=c["graph"], nodes=c["nodes"], edges=c["edges"], hidden=c["hidden"],
                      ranks=c["ranks"], threads_per_rank=result["threads_per_rank"],
                      config=c["config"], epoch=c["epoch_seconds"], exposed=c["exposed_seconds"],
                      exposed_by_kind=c["exposed_by_kind"], bytes_received=c["bytes_received"],
                      losses=c["losses"], orders=c["orders"], owned_rows=c["owned_rows"],
                      halo_rows=c["halo_rows"], owned_nnz=c["owned_nnz"],
                      loss_rel_diff_vs_ours=c.get("loss_rel_diff_vs_ours"), epochs=c["epochs"],
                      exposed_per_rank=c["exposed_per_rank"], method=c.get("method") or "",
                      rank_compute=c.get("compute_per_rank", []),
                      rank_blocked=c.get("blocked_per_rank", []),
                      work_ratio=c.get("work_ratio"))
            for c in result["cases"]]


def _job_config(args, graphs, method=None, cagnet=False, hidden=None, work_ratios=None):
    return dict(graphs=list(graphs), hidden=list(args.hidden if hidden is None else hidden),
                epochs=args.epochs, warmup=args.warmup, seed=args.seed,
                data_dir=str(args.data_dir), quick=args.quick, repeat=args.repeat,
                method=method, cagnet=cagnet, work_ratios=work_ratios)


def single_thread_rates(args, graphs):
    """`Rates` of every graph and hidden width, measured by a worker process of one thread (so
    no idle thread pool of this process competes with it)."""
    with tqdm(total=1, desc="kernel rates (1 thread)", unit="job") as progress:
        result = launch(1, 1, dict(_job_config(args, graphs), mode="rates"), args.timeout)
        progress.update()
    return [Rates(**dict(r, spmm_seconds={int(w): s for w, s in r["spmm_seconds"].items()}))
            for r in result["rates"]]


def _load_average():
    """The 1-minute load average (NaN where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return math.nan


def real_runs(args, graphs, run_methods=DEFAULT_RUN_METHODS, cagnet_methods=None,
              progress_out=None, work_ratios=None):
    """The P=1 job and one P=``--run-ranks`` job per partitioner of ``run_methods`` (the
    CAGNET-1D peer beside ours in those of ``cagnet_methods``, default all; "metis-work": one
    job per hidden width, each partitioned with its graph's c at that width from
    ``work_ratios``, a dict of (graph, hidden) to c), ``--rounds`` times in turns: a list of
    `RunResult` (each configuration's fastest) and, per job, ``(label, load average before,
    load average after)`` (other work on the machine shows there)."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise UsageError("the real runs need mpiexec (next to this Python or on PATH): "
                         "pip install mpi4py mpich, or pass --skip-runs")
    run_methods = list(run_methods)
    cagnet_methods = run_methods if cagnet_methods is None else list(cagnet_methods)
    per_rank = max(1, args.threads // args.run_ranks)
    jobs = [(1, args.threads, _job_config(args, graphs))]
    for method in run_methods:
        cagnet = method in cagnet_methods
        if method not in PER_WIDTH:
            jobs.append((args.run_ranks, per_rank, _job_config(args, graphs, method, cagnet)))
            continue
        if work_ratios is None:
            raise UsageError(f"the run method {method!r} needs the measured work ratios")
        for hidden in args.hidden:
            ratios = {graph: work_ratios[graph, hidden] for graph in graphs}
            jobs.append((args.run_ranks, per_rank, _job_config(args, graphs, method, cagnet,
                                                               [hidden], ratios)))
    best, loads = {}, []
    with tqdm(total=len(jobs) * args.rounds, desc="runs", unit="job",
              file=progress_out) as progress:
        for _ in range(args.rounds):
            for ranks, threads, config in jobs:
                label = f"P={ranks}" + (f" {config['method']}" if ranks > 1 else "")
                if config["work_ratios"]:
                    label += f" h{config['hidden'][0]}"
                progress.set_postfix_str(f"{label}, {threads} thread{'s' * (threads > 1)} "
                                         "per rank")
                before = _load_average()
                for r in _run_results(launch(ranks, threads, config, args.timeout, mpiexec)):
                    # Rounds only repeat the measurement: keep each configuration's fastest.
                    key = (r.graph, r.hidden, r.ranks, r.method, r.config)
                    if key not in best or r.epoch < best[key].epoch:
                        best[key] = r
                loads.append((label, before, _load_average()))
                progress.update()
    configs = ("single", "ours", "cagnet")
    results = sorted(best.values(), key=lambda r: (
        graphs.index(r.graph), args.hidden.index(r.hidden), r.ranks,
        run_methods.index(r.method) if r.method in run_methods else -1,
        configs.index(r.config)))
    return results, loads


# --- report --------------------------------------------------------------------------------

def _verdict(met):
    return "MET" if met else "NOT MET"


def _megabytes(nbytes):
    return nbytes / 1e6


def _singles(runs):
    return {r.key: r for r in runs if r.config == "single"}


def format_runs(runs):
    """The real runs' table: one line per (graph, hidden, configuration)."""
    single = _singles(runs)
    heading = (f"{'graph':<10} {'nodes':>7} {'edges':>8} {'hidden':>6} {'P':>2} "
               f"{'partition':<14} {'run':<7} {'thr':>3} {'ms/epoch':>9} {'vs P=1':>7} "
               f"{'exposed ms':>10} {'exp %':>6} "
               f"{'halo MB':>8} {'rev MB':>7} {'allred MB':>9} {'MB/epoch':>9}")
    lines = [heading, "-" * len(heading)]
    previous = None
    for r in runs:
        if previous is not None and r.key != previous:
            lines.append("")
        previous = r.key
        base = single.get(r.key)
        ratio = f"{r.epoch / base.epoch:>6.2f}x" if base else f"{'-':>7}"
        lines.append(
            f"{r.graph:<10} {r.nodes:>7} {r.edges:>8} {r.hidden:>6} {r.ranks:>2} "
            f"{r.method or '-':<14} {r.config:<7} {r.threads_per_rank:>3} "
            f"{r.epoch * 1e3:>9.2f} {ratio} {r.exposed * 1e3:>10.2f} "
            f"{100 * r.exposed_fraction:>5.1f}% "
            f"{_megabytes(r.bytes_received['halo']):>8.2f} "
            f"{_megabytes(r.bytes_received['reverse_halo']):>7.2f} "
            f"{_megabytes(r.bytes_received['allreduce']):>9.3f} "
            f"{_megabytes(r.bytes_per_epoch):>9.2f}")
    return "\n".join(lines)


#: Relative tolerance of the P > 1 losses against P = 1's (float32 sums in another order,
#: over the warm-up and timed steps of Adam).
LOSS_RTOL = 1e-5


def _label(r):
    """``graph hH`` and, at P > 1, the partitioner."""
    return f"{r.graph} h{r.hidden}" + (f" {r.method}" if r.method else "")


def run_ratio_lines(runs):
    """The c each "metis-work" run partitioned with."""
    return [f"work ratio: {_label(r)}: partitioned with c = {r.work_ratio:.1f} (METIS vertex "
            f"weights = stored entries + c)" for r in runs
            if r.config == "ours" and r.work_ratio is not None]


def run_checks(runs, schedules):
    """Lines checking the runs: CAGNET's losses against ours, P>1 against P=1 (every
    partitioner), and the bytes measured against the plan's count. ``schedules`` maps (graph,
    hidden) to the step's (forward, backward) SpMM widths."""
    lines = []
    single = _singles(runs)
    for r in runs:
        if r.config == "cagnet":
            lines.append(f"check: {_label(r)}: CAGNET-1D losses equal ours over "
                         f"{len(r.losses)} steps, max relative difference "
                         f"{r.loss_rel_diff_vs_ours:.2e}")
        if r.config == "single":
            continue
        base = single.get(r.key)
        if r.config == "ours" and base is not None:
            difference = float(np.max(np.abs(np.subtract(r.losses, base.losses))
                                      / np.abs(base.losses)))
            lines.append(f"check: {_label(r)}: P={r.ranks} losses vs P=1 over {len(r.losses)} "
                         f"steps, max relative difference {difference:.2e} (same dropout "
                         f"masks; float sums in another order): "
                         f"{'equal' if difference <= LOSS_RTOL else 'DIFFERENT'} (rtol "
                         f"{LOSS_RTOL:g})")
        forward, backward = schedules[r.key]
        rows = (r.ranks - 1) * r.nodes if r.config == "cagnet" else sum(r.halo_rows)
        for kind, widths in (("halo", forward), ("reverse_halo", backward)):
            if r.config == "cagnet" and kind == "reverse_halo":
                rows_back = sum((r.ranks - 1) * k for k in r.owned_rows)
            else:
                rows_back = rows
            planned = rows_back * sum(widths) * VALUE_BYTES
            measured = r.bytes_received[kind]
            lines.append(f"check: {_label(r)} {r.config}: {kind} bytes per epoch "
                         f"measured {measured:.0f}, plan {planned:.0f} ({rows_back} rows x "
                         f"widths {'+'.join(map(str, widths))} x {VALUE_BYTES} B): "
                         f"{'equal' if math.isclose(measured, planned) else 'DIFFERENT'}")
    return lines


def _per_rank_ms(values):
    return "/".join(f"{1e3 * seconds:.1f}" for seconds in values)


def _limit(r, base):
    """What keeps run ``r`` (ours, P > 1) from the targets: load imbalance (the busiest rank
    hardly waits, the others wait for it), communication (it waits too) or compute."""
    exposed = list(r.exposed_per_rank) or [r.exposed]
    if len(r.rank_compute) == len(exposed):
        busiest = int(np.argmax(r.rank_compute))  # the rank with the most work of its own
    else:
        busiest = int(np.argmin(exposed))  # no per-rank compute: the one that waits least
    waits = exposed[busiest]
    if r.exposed_fraction > TARGET_EXPOSED and waits <= TARGET_EXPOSED * r.epoch:
        verdict = (f"load imbalance: the busiest rank is blocked {1e3 * waits:.1f} ms "
                   f"({100 * waits / r.epoch:.0f}%), the others wait for it")
    elif r.exposed_fraction > TARGET_EXPOSED:
        verdict = "communication: every rank is blocked for longer than the target"
    else:
        verdict = (f"compute: {1e3 * (r.epoch - waits):.1f} ms outside waits on the busiest "
                   f"rank vs the P=1 epoch of {1e3 * base.epoch:.1f} ms")
    kinds = ", ".join(f"{kind} {1e3 * seconds:.1f}" for kind, seconds in
                      r.exposed_by_kind.items())
    compute = (f"compute per rank {_per_rank_ms(r.rank_compute)} ms, " if r.rank_compute
               else "")
    return (f"limit: {_label(r)}: {verdict}; epoch {1e3 * r.epoch:.1f} ms, {compute}blocked "
            f"per rank {_per_rank_ms(exposed)} ms (largest by kind, ms: {kinds}); entries of Â "
            f"per rank {'/'.join(map(str, r.owned_nnz))} (balance {r.nnz_balance:.3f}); "
            f"{_megabytes(r.bytes_per_epoch):.1f} MB per epoch; halo {sum(r.halo_rows)} rows = "
            f"{100 * sum(r.halo_rows) / r.nodes:.0f}% of n")


def _threads_compared(run, single):
    """How the threads of ``run`` (P > 1) compare with the single process's: "at the same
    total threads (2)", or both totals where they differ (``threads // P`` per rank, at least
    one, does not always add up to ``--threads``)."""
    total = run.ranks * run.threads_per_rank
    if total == single.threads_per_rank:
        return f"at the same total threads ({total})"
    return (f"on {total} threads in all ({run.ranks} x {run.threads_per_rank}) against its "
            f"{single.threads_per_rank}, NOT the same total")


def run_verdicts(runs):
    """The two targets of the real runs, per partitioner, judged on graphs of at least
    `TARGET_MIN_EDGES`, with the limit named where one is missed."""
    single = _singles(runs)
    judged = [r for r in runs if r.config == "ours" and r.edges >= TARGET_MIN_EDGES
              and r.key in single]
    if not judged:
        return [f"targets of the real runs: not judged (no run on a graph of >= "
                f"{TARGET_MIN_EDGES:,} stored edges)"]
    peers = {(r.key, r.method): r for r in runs if r.config == "cagnet"}
    lines = []
    for method in dict.fromkeys(r.method for r in judged):
        mine = [r for r in judged if r.method == method]
        ratios = [(r, r.epoch / single[r.key].epoch) for r in mine]
        cases = ", ".join(f"{r.graph} h{r.hidden} {ratio:.2f}x "
                          f"{_verdict(ratio <= TARGET_EPOCH_RATIO)}" for r, ratio in ratios)
        where = f"graphs >= 1M edges, {method} partition" if method else "graphs >= 1M edges"
        lines.append(
            f"target: P={mine[0].ranks} epoch <= {TARGET_EPOCH_RATIO:g}x the single-process "
            f"epoch {_threads_compared(mine[0], single[mine[0].key])}, {where}: {cases}: "
            f"{_verdict(all(ratio <= TARGET_EPOCH_RATIO for _, ratio in ratios))}")
        lines.append(
            f"target: exposed communication <= {100 * TARGET_EXPOSED:.0f}% of the P="
            f"{mine[0].ranks} epoch, {where}: "
            + ", ".join(f"{r.graph} h{r.hidden} {100 * r.exposed_fraction:.1f}% "
                        f"{_verdict(r.exposed_fraction <= TARGET_EXPOSED)}" for r in mine)
            + f": {_verdict(all(r.exposed_fraction <= TARGET_EXPOSED for r in mine))}")
        lines += [_limit(r, single[r.key]) for r, ratio in ratios
                  if ratio > TARGET_EPOCH_RATIO or r.exposed_fraction > TARGET_EXPOSED]
    for r in judged:
        peer = peers.get((r.key, r.method))
        if peer is not None:
            lines.append(f"ratio: {_label(r)}: CAGNET-1D epoch {1e3 * peer.epoch:.1f} "
                         f"ms = {peer.epoch / r.epoch:.2f}x ours ({100 * peer.exposed_fraction:.0f}"
                         f"% exposed, {_megabytes(peer.bytes_per_epoch):.1f} MB per epoch)")
    return lines


def rank_lines(runs):
    """Per P > 1 run: every rank's compute (its step time less its blocked time, median over
    the timed steps) beside its blocked time, entries of Â, rows and halo rows; a rank that
    computes less waits longer: that is imbalance, what the busiest rank waits is the
    network's."""
    lines = []
    for r in runs:
        if r.ranks < 2 or not r.rank_compute:
            continue
        mean = sum(r.rank_compute) / len(r.rank_compute)
        imbalance = max(r.rank_compute) / mean if mean else 1.0
        lines.append(
            f"ranks: {_label(r)} {r.config}: compute {_per_rank_ms(r.rank_compute)} ms "
            f"(max/mean {imbalance:.2f}), blocked {_per_rank_ms(r.rank_blocked)} ms (medians "
            f"over the steps); entries of Â {'/'.join(map(str, r.owned_nnz))} (balance "
            f"{r.nnz_balance:.3f}), rows {'/'.join(map(str, r.owned_rows))}, halo rows "
            f"{'/'.join(map(str, r.halo_rows))}")
    return lines


def partition_comparison(runs):
    """Per graph and hidden width with ours run on several partitions: each partition's epoch
    (and over the first partition's), exposed share, balance and bytes."""
    single = _singles(runs)
    lines = []
    for key in dict.fromkeys(r.key for r in runs):
        mine = [r for r in runs if r.key == key and r.config == "ours"]
        if len(mine) < 2:
            continue
        first, base = mine[0], single.get(key)
        parts = []
        for r in mine:
            text = f"{r.method} {1e3 * r.epoch:.2f} ms"
            if base is not None:
                text += f" = {r.epoch / base.epoch:.2f}x P=1"
            if r is not first:
                text += f" = {r.epoch / first.epoch:.2f}x {first.method}'s"
            parts.append(f"{text} ({100 * r.exposed_fraction:.1f}% exposed, entries balance "
                         f"{r.nnz_balance:.3f}, halo {sum(r.halo_rows)} rows, "
                         f"{_megabytes(r.bytes_per_epoch):.1f} MB)")
        lines.append(f"partitions: {key[0]} h{key[1]} ours: " + "; ".join(parts))
    return lines


def model_check_lines(runs, rates, plans):
    """The distributed runs against one thread and against the model: measured efficiency
    ``T1 / (P T_P)`` (T1 from the single-thread rates job) and the model's compute for the
    run's partition at its P beside the measured epoch less the busiest rank's blocked
    time."""
    lines = []
    by_key = {(r.graph, r.hidden): r for r in rates}
    by_plan = {(p.graph, p.method, p.ranks, p.hidden): p for p in plans}
    for r in runs:
        rate = by_key.get(r.key)
        if r.config != "ours" or rate is None:
            continue
        text = (f"measured: {_label(r)}: T1 (one thread, one process) "
                f"{1e3 * rate.step_seconds:.1f} ms, P={r.ranks} epoch {1e3 * r.epoch:.1f} ms: "
                f"efficiency T1 / (P T_P) = {100 * rate.step_seconds / (r.ranks * r.epoch):.0f}%")
        plan = by_plan.get((r.graph, r.method, r.ranks, 0)) or by_plan.get(
            (r.graph, r.method, r.ranks, r.hidden))
        if plan is not None:
            compute = float(np.max(rate.compute_seconds(plan.owned_rows, plan.owned_nnz_hat)))
            least = min(r.exposed_per_rank, default=r.exposed)
            text += (f"; model compute at P={r.ranks} {1e3 * compute:.1f} ms vs measured epoch "
                     f"less the busiest rank's blocked time {1e3 * (r.epoch - least):.1f} ms")
            if r.rank_compute:
                text += f", measured busiest rank's compute {1e3 * max(r.rank_compute):.1f} ms"
        lines.append(text)
    return lines


def format_plans(plans):
    """The exact plans: one line per (graph, method, P)."""
    heading = (f"{'graph':<10} {'method':<18} {'P':>5} {'volume rows':>12} {'% CAGNET':>9} "
               f"{'max halo':>9} {'peers max':>9} {'mean':>7} {'bal rows':>8} {'bal nnz':>8} "
               f"{'cut %':>6} {'part s':>7}")
    lines = [heading, "-" * len(heading)]
    previous = None
    for p in plans:
        if previous is not None and (p.graph, p.label) != previous:
            lines.append("")
        previous = p.graph, p.label
        cut = 100 * p.edge_cut / p.nnz if p.nnz else 0.0
        lines.append(f"{p.graph:<10} {p.label:<18} {p.ranks:>5} {p.volume:>12} "
                     f"{100 * p.fraction:>8.2f}% {p.max_halo:>9} {p.peers_max:>9} "
                     f"{p.peers_mean:>7.1f} {p.row_balance:>8.3f} {p.nnz_balance:>8.3f} "
                     f"{cut:>5.1f}% {p.seconds:>7.2f}")
    return "\n".join(lines)


def _planted_line(metis, planted):
    """METIS's volume against the planted communities' on the same graph and P."""
    limit = ("METIS does better than the generator's own communities, so no split along them "
             "meets the target: the limit is the graph's edges outside its communities"
             if metis.volume <= planted.volume else
             "METIS does worse than the generator's own communities")
    return (f"  planted communities in blocks at P={planted.ranks} on {planted.graph}: "
            f"{planted.volume} rows = {100 * planted.fraction:.2f}% of CAGNET-1D's; {limit}")


def plan_verdicts(plans):
    """The volume target at P = `TARGET_VOLUME_RANKS`, judged on "metis" (METIS's figure on
    other graphs, and METIS balanced by entries beside it, without a verdict)."""
    lines = []
    planted = {p.graph: p for p in plans
               if p.method == PLANTED and p.ranks == TARGET_VOLUME_RANKS}
    for p in plans:
        if p.method not in METIS_METHODS or p.ranks != TARGET_VOLUME_RANKS:
            continue
        figure = (f"METIS halo volume at P={p.ranks} on {p.graph}: {p.volume} rows = "
                  f"{100 * p.fraction:.2f}% of CAGNET-1D's {p.cagnet_volume}")
        if p.method == "metis-nnz":
            lines.append(f"METIS balanced by entries (metis-nnz): halo volume at P={p.ranks} on "
                         f"{p.graph}: {p.volume} rows = {100 * p.fraction:.2f}% of CAGNET-1D's "
                         f"(entries balance {p.nnz_balance:.3f}, rows {p.row_balance:.3f})")
        elif p.method == "metis-work":
            lines.append(f"METIS balanced by work (metis-work h{p.hidden}, c {p.work_ratio:.1f}):"
                         f" halo volume at P={p.ranks} on {p.graph}: {p.volume} rows = "
                         f"{100 * p.fraction:.2f}% of CAGNET-1D's (entries balance "
                         f"{p.nnz_balance:.3f}, rows {p.row_balance:.3f})")
        elif p.method == "metis-rows+nnz":
            lines.append(f"METIS balanced by rows and entries (metis-rows+nnz): halo volume at "
                         f"P={p.ranks} on {p.graph}: {p.volume} rows = "
                         f"{100 * p.fraction:.2f}% of CAGNET-1D's (entries balance "
                         f"{p.nnz_balance:.3f}, rows {p.row_balance:.3f})")
        elif p.graph in TARGET_VOLUME_GRAPHS:
            lines.append(f"target: {figure} (<= {100 * TARGET_VOLUME:.0f}%): "
                         f"{_verdict(p.fraction <= TARGET_VOLUME)}")
            if p.graph in planted:
                lines.append(_planted_line(p, planted[p.graph]))
        else:
            lines.append(f"{figure} (no target on this graph)")
    if not any(line.startswith(("target", "METIS halo")) for line in lines):
        lines.append(f"target: METIS halo volume at P={TARGET_VOLUME_RANKS}: not judged (no "
                     "METIS plan at that P)")
    return lines


def format_rates(rates):
    lines = []
    for r in rates:
        spmm = ", ".join(f"width {w}: {1e9 * r.entry_seconds(w):.2f} ns/entry "
                         f"({1e3 * s:.2f} ms)" for w, s in sorted(r.spmm_seconds.items()))
        lines.append(f"rates: {r.graph} h{r.hidden}, 1 thread: step T1 {1e3 * r.step_seconds:.1f}"
                     f" ms; SpMM ({r.nnz_hat} entries of Â) {spmm}; SpMMs per step forward "
                     f"{r.forward} backward {r.backward} = {1e3 * r.spmm_total:.1f} ms; t_row "
                     f"{1e6 * r.row_seconds:.3f} us per row; allreduce {r.parameter_bytes} B")
    return lines


def work_ratio_lines(rates):
    """The c of "metis-work" per graph and hidden width, and where it comes from."""
    return [f"work ratio: {r.graph} h{r.hidden}: c = t_row / t_entry_step = "
            f"{1e6 * r.row_seconds:.3f} us / {1e9 * r.step_entry_seconds:.2f} ns = "
            f"{r.work_ratio:.1f} (metis-work: METIS vertex weights = stored entries + c)"
            for r in rates]


def format_projection(projections, ranks):
    """Per (graph, hidden, network): one line per method, cells ``ms/efficiency`` by P."""
    lines = []
    groups = list(dict.fromkeys((p.graph, p.hidden, p.network) for p in projections))
    for graph, hidden, network in groups:
        cells = {(p.method, p.ranks): p for p in projections
                 if (p.graph, p.hidden, p.network) == (graph, hidden, network)}
        methods = list(dict.fromkeys(m for m, _ in cells))
        single = next(iter(cells.values())).single
        lines.append(f"{graph} h{hidden}, network {network.name} (alpha {1e6 * network.alpha:g} "
                     f"us, beta {network.beta / 1e9:g} GB/s), T1 = {1e3 * single:.1f} ms; "
                     "cells: projected ms per epoch / efficiency")
        header = f"  {'method':<14}" + "".join(f" {'P=' + str(P):>13}" for P in ranks)
        lines.append(header)
        for method in methods:
            row = f"  {method:<14}"
            for P in ranks:
                p = cells.get((method, P))
                row += (f" {1e3 * p.epoch:>7.2f}/{100 * p.efficiency:>4.0f}%" if p
                        else f" {'-':>13}")
            lines.append(row)
    return lines


#: Rank counts the projection summary names.
SUMMARY_RANKS = (8, 64, 1024)


def projection_summary(projections):
    """Per (graph, hidden, network) and a few P: the efficiency of ours on METIS (balancing
    rows, entries and work), of CAGNET-1D on METIS's rows, and of the best partitioner."""
    lines = []
    groups = list(dict.fromkeys((p.graph, p.hidden, p.network.name) for p in projections))
    for graph, hidden, network in groups:
        chosen = [p for p in projections
                  if (p.graph, p.hidden, p.network.name) == (graph, hidden, network)]
        parts = []
        for P in SUMMARY_RANKS:
            at = {p.method: p for p in chosen if p.ranks == P}
            if not at:
                continue
            best = max((p for p in at.values() if p.method != CAGNET),
                       key=lambda p: p.efficiency)
            text = f"P={P}"
            for method in METIS_METHODS:
                if method in at:
                    text += f" {method} {100 * at[method].efficiency:.0f}%"
            if CAGNET in at:
                text += f" vs CAGNET-1D on its rows {100 * at[CAGNET].efficiency:.0f}%"
            parts.append(f"{text}, best {best.method} {100 * best.efficiency:.0f}% "
                         f"({1e3 * best.epoch:.2f} ms)")
        if parts:
            lines.append(f"projection: {graph} h{hidden} {network}: " + "; ".join(parts))
    return lines


MODEL_LINES = (
    "model: per step, compute = max over ranks (nnz(Â rows) x sum over the step's SpMMs of "
    "t_entry(width) + rows x t_row), rates from one thread on the whole graph (t_row: the rest "
    "of T1 per row); every exchange = max over ranks (alpha x peers + bytes received / beta), "
    "forward halo and backward reverse halo, float32; CAGNET-1D: allgatherv of the other "
    "ranks' rows and reduce-scatter of P-1 contributions, P-1 peers; gradient allreduce: ring "
    "2 (P-1)/P bytes / beta + 2 log2(P) alpha; no overlap, no contention; efficiency = "
    "T1 / (P T_P).",
)


def _ratio_text(ratio):
    # Every digit: a partition rebuilt from the CSV's c must be the one that was measured, and
    # METIS's weights round (entries + c) scaled, so four decimals could move a node.
    return "" if ratio is None else repr(float(ratio))


def write_csv(path, runs, plans, projections, sweep=()):
    """All figures, one row per run, plan, projection and plan of the mixing sweep (section
    "mixing"; `CSV_COLUMNS`)."""
    single = _singles(runs)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, restval="")
        writer.writeheader()
        for r in runs:
            base = single.get(r.key)
            writer.writerow(dict(
                section="run", graph=r.graph, method=r.method,
                ranks=r.ranks, hidden=r.hidden, config=r.config,
                threads_per_rank=r.threads_per_rank, epoch_ms=f"{1e3 * r.epoch:.4f}",
                vs_single=f"{r.epoch / base.epoch:.4f}" if base else "",
                exposed_ms=f"{1e3 * r.exposed:.4f}",
                exposed_fraction=f"{r.exposed_fraction:.4f}",
                halo_bytes=f"{r.bytes_received['halo']:.0f}",
                reverse_halo_bytes=f"{r.bytes_received['reverse_halo']:.0f}",
                allreduce_bytes=f"{r.bytes_received['allreduce']:.0f}",
                bytes_per_epoch=f"{r.bytes_per_epoch:.0f}", nodes=r.nodes, nnz=r.edges,
                nnz_balance=f"{r.nnz_balance:.4f}", max_halo_rows=max(r.halo_rows),
                rank_rows="/".join(map(str, r.owned_rows)),
                rank_nnz="/".join(map(str, r.owned_nnz)),
                rank_compute_ms="/".join(f"{1e3 * t:.4f}" for t in r.rank_compute),
                rank_blocked_ms="/".join(f"{1e3 * t:.4f}" for t in r.rank_blocked),
                work_ratio=_ratio_text(r.work_ratio)))
        mixing = [(p, "mixing") for _, sweep_plans in sweep for p in sweep_plans]
        for p, section in [(p, "plan") for p in plans] + mixing:
            writer.writerow(dict(
                section=section, graph=p.graph, method=p.method, ranks=p.ranks, nodes=p.nodes,
                nnz=p.nnz, volume_rows=p.volume, cagnet_volume_rows=p.cagnet_volume,
                volume_fraction=f"{p.fraction:.6f}", max_halo_rows=p.max_halo,
                peers_max=p.peers_max, peers_mean=f"{p.peers_mean:.4f}",
                row_balance=f"{p.row_balance:.4f}", nnz_balance=f"{p.nnz_balance:.4f}",
                edge_cut=p.edge_cut, partition_seconds=f"{p.seconds:.4f}",
                hidden=p.hidden or "", work_ratio=_ratio_text(p.work_ratio)))
        for p in projections:
            writer.writerow(dict(
                section="projection", graph=p.graph, method=p.method, ranks=p.ranks,
                hidden=p.hidden, network=p.network.name, alpha_us=f"{1e6 * p.network.alpha:g}",
                beta_gbps=f"{p.network.beta / 1e9:g}", compute_ms=f"{1e3 * p.compute:.5f}",
                exchange_ms=f"{1e3 * p.exchanges:.5f}", allreduce_ms=f"{1e3 * p.allreduce:.5f}",
                epoch_ms=f"{1e3 * p.epoch:.5f}", single_ms=f"{1e3 * p.single:.5f}",
                efficiency=f"{p.efficiency:.5f}", work_ratio=_ratio_text(p.work_ratio)))


def write_plot(path, plans, projections, hidden):
    """Per graph: projected epoch time and efficiency vs P (one line per method x network, at
    ``hidden``) and halo volume over CAGNET-1D's vs P."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(p.graph for p in plans))
    methods = list(dict.fromkeys([p.method for p in plans] + [CAGNET]))
    colours = {m: plt.get_cmap("tab10")(k) for k, m in enumerate(methods)}
    colours[CAGNET] = "black"
    styles = ["--", "-", ":", "-."]
    networks = list(dict.fromkeys(p.network.name for p in projections))
    figure, axes = plt.subplots(len(graphs), 3, figsize=(15, 3.8 * len(graphs)), squeeze=False)
    for row, graph in zip(axes, graphs):
        time_axis, efficiency_axis, volume_axis = row
        for method in methods:
            for k, network in enumerate(networks):
                chosen = sorted((p for p in projections if p.graph == graph and p.hidden == hidden
                                 and p.method == method and p.network.name == network),
                                key=lambda p: p.ranks)
                if not chosen:
                    continue
                ranks = [p.ranks for p in chosen]
                label = f"{method}{' (METIS rows)' if method == CAGNET else ''}, {network}"
                style = dict(color=colours[method], linestyle=styles[k % len(styles)],
                             marker=".", label=label)
                time_axis.plot(ranks, [1e3 * p.epoch for p in chosen], **style)
                efficiency_axis.plot(ranks, [100 * p.efficiency for p in chosen], **style)
            chosen = sorted((p for p in plans if p.graph == graph and p.method == method
                             and p.fits(hidden)), key=lambda p: p.ranks)
            if chosen:
                volume_axis.plot([p.ranks for p in chosen], [100 * p.fraction for p in chosen],
                                 color=colours[method], marker=".", label=method)
        single = next((p.single for p in projections if p.graph == graph
                       and p.hidden == hidden), None)
        if single is not None:
            time_axis.axhline(1e3 * single, color="grey", linewidth=0.8,
                              label="T1 (1 thread, measured)")
        volume_axis.axhline(100, color=colours[CAGNET], label=CAGNET)
        if graph in TARGET_VOLUME_GRAPHS:
            volume_axis.plot([TARGET_VOLUME_RANKS], [100 * TARGET_VOLUME], marker="v",
                             color="red", linestyle="none", label="target at P=8")
        for axis in row:
            axis.set_xscale("log", base=2)
            axis.set_xlabel("ranks P")
            axis.grid(True, which="major", alpha=0.3)
        time_axis.set_yscale("log")
        time_axis.set_ylabel("projected ms per epoch")
        time_axis.set_title(f"{graph}, hidden {hidden}: epoch time")
        efficiency_axis.set_ylabel("parallel efficiency %")
        efficiency_axis.set_ylim(0, 105)
        efficiency_axis.set_title(f"{graph}: efficiency T1 / (P T_P)")
        volume_axis.set_yscale("log")
        volume_axis.set_ylabel("halo rows, % of CAGNET-1D's (P-1) n")
        volume_axis.set_title(f"{graph}: exact halo volume")
        volume_axis.legend(fontsize=7, loc="lower left")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    figure.suptitle("Full-graph GCN over MPI: exact plans and alpha-beta projection "
                    f"(alpha {1e6 * ALPHA:g} us; dashed/solid: networks {', '.join(networks)})",
                    fontsize=10)
    # Room below the panels for the shared legend.
    figure.tight_layout(rect=(0, 0.03 + 0.022 * math.ceil(len(labels) / 6), 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


# --- command line --------------------------------------------------------------------------

def _names(text, known, what):
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise UsageError(f"unknown {what} {', '.join(map(repr, unknown)) or repr(text)}; "
                         f"expected a comma-separated list of {', '.join(known)}")
    return list(dict.fromkeys(names))


def add_arguments(parser):
    """Options of the ``distributed`` command beyond the common ones."""
    parser.add_argument("--graphs", default=",".join(DEFAULT_GRAPHS), metavar="A,B",
                        help=f"graphs, comma-separated, of {', '.join(GRAPHS)} (default: "
                             f"{','.join(DEFAULT_GRAPHS)})")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS), metavar="A,B",
                        help=f"partitioners of the plans, comma-separated, of "
                             f"{', '.join(METHODS)} (default: {','.join(DEFAULT_METHODS)}); "
                             "rabbit/rcm: contiguous blocks after that reordering; "
                             "metis-work: one plan per hidden width")
    parser.add_argument("--hidden", action="append", type=positive_width, metavar="H",
                        help=f"hidden width of the GCN (repeatable; default: "
                             f"{' '.join(map(str, HIDDEN))})")
    parser.add_argument("--max-ranks", type=int, default=1024, metavar="P",
                        help="plans and projection for P = 2, 4, ... up to P (default: 1024)")
    parser.add_argument("--run-ranks", type=int, metavar="P",
                        help="ranks of the distributed real run (default: 2; the threads are "
                             "split among them)")
    parser.add_argument("--run-methods", metavar="A,B",
                        help=f"partitioners of the distributed real runs, one job each, of "
                             f"{', '.join(RUN_METHODS)} (default: "
                             f"{','.join(DEFAULT_RUN_METHODS)}; metis-nnz: METIS balancing "
                             "stored entries; metis-work: entries + c per node, c = t_row / "
                             "t_entry_step measured per graph and hidden width, one job per "
                             "width; metis-rows+nnz: nodes and entries at once)")
    parser.add_argument("--cagnet-methods", default=None, metavar="A,B",
                        help="the run methods whose jobs also time the CAGNET-1D peer, or "
                             "'none' (default: all of --run-methods)")
    parser.add_argument("--epochs", type=positive_int, default=20, metavar="N",
                        help="timed training steps per real run (default: 20)")
    parser.add_argument("--warmup", type=positive_int, default=3, metavar="N",
                        help="untimed steps first, in which CAGNET's losses are checked against "
                             "ours (default: 3)")
    parser.add_argument("--rounds", type=positive_int, metavar="N",
                        help="run the P=1 and P>1 jobs N times in turns and keep each "
                             "configuration's fastest epoch (a shared machine; default: 1)")
    parser.add_argument("--timeout", type=timeout_seconds, default=1200, metavar="S",
                        help="seconds a training job may take before it is stopped "
                             "(default: 1200)")
    parser.add_argument("--skip-runs", "--plans-only", dest="skip_runs", action="store_true",
                        help="only the plans and the projection (no MPI jobs)")
    parser.add_argument("--quick", action="store_true",
                        help="small generated graphs (for tests)")
    parser.add_argument("--mixing", default=",".join(f"{d:g}" for d in DEFAULT_MIXING),
                        metavar="D,D",
                        help="external degrees of the mixing sweep's planted graphs (edges per "
                             "node going anywhere, of 12), comma-separated, or 'none' (default:"
                             f" {','.join(f'{d:g}' for d in DEFAULT_MIXING)})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights, dropout, METIS and random partitions")


def _external_degrees(text):
    """``--mixing``'s degrees, or `UsageError`."""
    if text.strip() == "none":
        return []
    degree = gnn.GENERATED["internal_degree"] + gnn.GENERATED["external_degree"]
    try:
        degrees = [float(d) for d in text.split(",")]
    except ValueError:
        raise UsageError(f"--mixing must be comma-separated numbers or 'none', got {text!r}") \
            from None
    bad = [d for d in degrees if not 0 <= d <= degree]
    if bad:
        raise UsageError(f"--mixing degrees must lie in [0, {degree:g}], got "
                         f"{', '.join(f'{d:g}' for d in bad)}")
    return list(dict.fromkeys(degrees))


def _check_arguments(args):
    """Validated selections, or `UsageError`."""
    graphs = _names(args.graphs, GRAPHS, "graph")
    methods = _names(args.methods, METHODS, "partition method")
    if args.skip_runs:
        # The report would read as if they had been applied.
        given = [option for option, value in (("--run-ranks", args.run_ranks),
                                              ("--run-methods", args.run_methods),
                                              ("--cagnet-methods", args.cagnet_methods),
                                              ("--rounds", args.rounds)) if value is not None]
        if given:
            verb = "is an option" if len(given) == 1 else "are options"
            raise UsageError(f"{', '.join(given)} {verb} of the real runs, which --skip-runs "
                             "leaves out")
    args.run_ranks = 2 if args.run_ranks is None else args.run_ranks
    args.rounds = 1 if args.rounds is None else args.rounds
    if args.run_methods is None:
        args.run_methods = ",".join(DEFAULT_RUN_METHODS)
    args.run_methods = _names(args.run_methods, RUN_METHODS, "run method")
    if args.cagnet_methods is None:
        args.cagnet_methods = list(args.run_methods)
    elif args.cagnet_methods.strip() == "none":
        args.cagnet_methods = []
    else:
        args.cagnet_methods = _names(args.cagnet_methods, args.run_methods, "CAGNET method")
    if not 2 <= args.max_ranks <= MAX_PLANNED_RANKS:
        raise UsageError(f"--max-ranks must be in [2, {MAX_PLANNED_RANKS}], got "
                         f"{args.max_ranks}")
    if args.run_ranks < 2:
        raise UsageError(f"--run-ranks must be at least 2, got {args.run_ranks}")
    check_ranks([args.run_ranks], "--run-ranks", UsageError)
    if not 0 <= args.seed < 2 ** 63:
        raise UsageError(f"--seed must be in [0, 2**63), got {args.seed}")
    args.mixing = _external_degrees(args.mixing)
    ranks = [2 ** k for k in range(1, int(math.log2(args.max_ranks)) + 1)]
    return graphs, methods, ranks


def run(args, out=None):
    """Run the benchmark and report (on ``out``, default standard output); returns the exit
    status."""
    out = sys.stdout if out is None else out
    try:
        graphs, methods, ranks = _check_arguments(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.skip_runs and find_mpiexec() is None:
        print("error: the real runs need mpiexec (next to this Python or on PATH): pip install "
              "mpi4py mpich, or pass --skip-runs", file=sys.stderr)
        return 2
    args.hidden = list(dict.fromkeys(args.hidden or HIDDEN))
    cases, notes = {}, []
    try:
        for name in graphs:
            cases[name] = build_case(name, args.data_dir, args.quick)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, case in cases.items():
        notes.append(f"graph {name}: {case.nodes} nodes, {case.edges} stored edges"
                     + (f": {case.note}" if case.note else ""))

    # The rates first: "metis-work" weighs every node by its entries + c, c from the rates.
    try:
        rates = single_thread_rates(args, graphs)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    work_ratios = {(r.graph, r.hidden): r.work_ratio for r in rates}

    plans = []
    count = sum(len(args.hidden) if m in PER_WIDTH else 1 for m in methods if m != PLANTED)
    count += (PLANTED in methods) * sum(c.communities is not None for c in cases.values())
    with tqdm(total=len(graphs) * count * len(ranks), desc="plans", unit="plan") as progress:
        for name, case in cases.items():
            plans += make_plans(name, case.adj, methods, ranks, progress, seed=args.seed,
                                work_ratios={h: work_ratios[name, h] for h in args.hidden},
                                communities=case.communities)
    sweep = mixing_plans(args.mixing, args.quick, args.seed) if args.mixing else []

    runs, loads = [], []
    if not args.skip_runs:
        try:
            runs, loads = real_runs(args, graphs, args.run_methods, args.cagnet_methods,
                                    work_ratios=work_ratios)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except RunError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1

    projections = []
    for r in rates:
        for network in NETWORKS:
            graph_plans = [p for p in plans if p.graph == r.graph and p.fits(r.hidden)]
            projections += [project(p, r, network) for p in graph_plans]
            projections += [project_cagnet(p, r, network) for p in graph_plans
                            if p.method == RUN_METHOD]

    print(f"distributed: full-graph training of the library's 2-layer GCN (float32, Adam, "
          f"dropout 0.5) with a 1D row partition; {os.cpu_count()} cores here; data: "
          f"{args.data_dir}", file=out)
    for line in notes:
        print(line, file=out)
    if runs:
        per_rank = max(1, args.threads // args.run_ranks)
        rounds = f", the fastest of {args.rounds} job rounds" if args.rounds > 1 else ""
        print(f"\n== real runs: P=1 one process, {counted(args.threads, 'thread')}; "
              f"P={args.run_ranks} mpiexec -n {args.run_ranks}, {counted(per_rank, 'thread')} "
              f"per rank, one job per partition ({', '.join(args.run_methods)}; metis-nnz: "
              "METIS balancing stored entries; metis-work: METIS balancing entries + c per "
              "node, c = t_row / t_entry_step of the graph and hidden width, one job per width; "
              "metis-rows+nnz: METIS balancing nodes and entries at once); "
              f"epoch = median of {args.epochs} timed steps (each after a barrier, the slowest "
              f"rank's time) after {args.warmup} warm-up steps{rounds}; exposed = seconds "
              "blocked in waits on exchanges and the gradient allreduce (largest rank); MB = bytes "
              "received per epoch, all ranks; ours: halo exchange; cagnet: CAGNET-1D "
              "allgatherv + reduce-scatter, same model, seed and dropout", file=out)
        print(format_runs(runs), file=out)
        for line in run_ratio_lines(runs):
            print(line, file=out)
        schedules = {(r.graph, r.hidden): (r.forward, r.backward) for r in rates}
        for line in (run_checks(runs, schedules) + rank_lines(runs) + run_verdicts(runs)
                     + partition_comparison(runs) + model_check_lines(runs, rates, plans)):
            print(line, file=out)
        print("machine: 1-minute load average before/after each job (the job itself adds "
              "about its thread count): " + ", ".join(
                  f"{label} {before:.1f}/{after:.1f}" for label, before, after in loads),
              file=out)
        if os.cpu_count() and os.cpu_count() <= args.run_ranks:
            print(f"caveat: {os.cpu_count()} cores: P={args.run_ranks} puts one single-thread "
                  f"rank on each core and the P=1 run's {args.threads} threads share the same "
                  "cores; anything else running on the machine distorts both (a 2-thread "
                  "process most: its threads wait for each other), so these timings are "
                  "noisy", file=out)
    print(f"\n== exact plans (halo rows per exchange; CAGNET-1D moves (P-1) n): "
          f"{', '.join(methods)}", file=out)
    print(format_plans(plans), file=out)
    for line in plan_verdicts(plans):
        print(line, file=out)
    if sweep:
        print(f"\n== mixing sweep: planted graphs like generated (expected degree "
              f"{gnn.GENERATED['internal_degree'] + gnn.GENERATED['external_degree']:g}, "
              f"ids shuffled) with another share of edges going anywhere; halo volume at "
              f"P={TARGET_VOLUME_RANKS} against the target (<= {100 * TARGET_VOLUME:.0f}% of "
              f"CAGNET-1D's)", file=out)
        for line in mixing_lines(sweep):
            print(line, file=out)
    print("\n== projection (alpha-beta): " + ", ".join(
        f"{n.name}: alpha {1e6 * n.alpha:g} us, beta {n.beta / 1e9:g} GB/s" for n in NETWORKS),
        file=out)
    for line in MODEL_LINES + tuple(format_rates(rates)) + tuple(work_ratio_lines(rates)):
        print(line, file=out)
    for line in format_projection(projections, ranks) + projection_summary(projections):
        print(line, file=out)
    if args.csv:
        write_csv(args.csv, runs, plans, projections, sweep)
        print(f"wrote {args.csv}", file=out)
    if args.plot:
        write_plot(args.plot, plans, projections, args.hidden[0])
        print(f"wrote {args.plot}", file=out)
    return 0
