"""The ``lion`` benchmark: Lion's compressed distributed modes against the fp32 allreduce and
Adam over MPI, measured, counted and projected to slower links; and our ``Lion.step`` against
PyPI's ``lion-pytorch``.

**Contenders** (``--modes``), on every workload and number of ranks (``--ranks``, default 2
and 3; 1 thread per rank): ``adam``, Adam with `DataParallel`'s fp32 gradient allreduce;
``none``, `DistributedLion` allreducing the fp32 gradients (Lion under data parallelism);
``signs``, ``votes``, ``int8``, ``1bit``, its compressed modes with Lion Cub's growing momentum
synchronisation (the default); ``signs/local``, Distributed Lion as published (sign bits
allgathered, momenta never synchronised). ``MODE/SYNC`` picks another ``momentum_sync``.

**Workloads** (``--workload``; `pysparse_hpc.bench._lion_worker`): ``mlp-digits``, a
64-1024-1024-10 MLP (1.1M parameters) data parallel on scikit-learn's digits (global batch 96
split over the ranks, losses and updates averaged); ``gcn-cora`` and ``gcn-citeseer``, the
library's GCN full-graph on a METIS partition (23k and 59k parameters; ``--partition random``
splits the nodes at random instead, so that every rank's training nodes are alike: Distributed
Lion's local momenta assume that).

**Steps**: one ``mpiexec -n P`` job per P. Every contender's model is built from the same seed
and warmed up, then the contenders step in turns, ``--repeat`` rounds; a step starts after a
barrier. Per step and rank the job reads the communicator's counters (`Communicator.stats`) and
the seconds it blocked in communication, blocking collectives included. Reported: the measured
step (median over the steps of the slowest rank's), the **compute** (the largest over ranks of
the median step less its blocked seconds) and the **bytes per step** per rank, by kind: the
optimizer's own (Adam's and ``none``'s gradient allreduce, the modes' votes), its momentum
synchronisations, and the GCN's halo exchanges. Counter convention: a collective's payload is
counted once sent and once received on each rank (an allreduce of n bytes counts n); an
allgather counts the blocks of the P - 1 other ranks. The counted bytes are checked against
`pysparse_hpc.optim.bytes_per_step` and the momentum syncs against the growing schedule; a
mismatch is printed as ``BYTE CHECK FAILED``. Bytes per step add the momentum syncs amortised
over the whole training (the schedule replayed over its steps): the timed steps come early,
where the growing schedule still syncs every step.

**Projection** to links of 1, 10 and 100 Gb/s (``--latency-us``, default 50, 10 and 2 us:
MPI over TCP on commodity 1 GbE, TCP on 10 GbE, RDMA on 100 Gb/s InfiniBand or RoCE): the
measured compute plus an alpha-beta cost of each collective as MPI runs it, from the counted
bytes: allreduce (Adam, ``none``, ``votes``, ``int8``, momentum syncs) a ring,
``2 (P - 1) / P n / beta + 2 log2(P) alpha`` per call
(`pysparse_hpc.bench.distributed.allreduce_seconds`); allgather (``signs``) ``(P - 1) block /
beta + ceil(log2 P) alpha``; the 1-bit allreduce its serial exchanges of ``ceil(d / 8)`` bytes
(``log2`` of the largest power of two <= P, plus a fold-in and a fold-out when P is not a
power of two), ``alpha + block / beta`` each; the GCN's halo exchanges ``alpha`` per message
plus the bytes / beta, the largest over ranks
(`pysparse_hpc.bench.distributed.exchange_seconds`). No overlap, no contention.

**Accuracy** (skipped with ``--skip-accuracy``): at P = ``--accuracy-ranks`` (default 2), each
contender from ``--seeds`` seeds, the mean test accuracy: the GCNs through
`pysparse_hpc.distributed.train` with the published 200 epochs (``--epochs`` overrides), the
MLP 20 epochs (Adam lr 1e-3; Lion lr 1e-4, decoupled decay 0.1).

**Peer**: our single-process ``Lion.step`` and ``lion_pytorch.Lion.step`` on copies of the MLP's
parameters with the same gradient, 1 thread, calls interleaved (`best_times`, ``--repeat``),
the ratio and the largest difference of the parameters afterwards.

Targets: the packed vote sums (``votes``) move at least 30x fewer bytes per step than the fp32
allreduce; every compressed mode ends no more than 1 point of test accuracy below uncompressed
Lion; on the MLP, some compressed mode's projected 1 Gb/s step is at least 5x shorter than
Lion's fp32 allreduce step, at every P.
"""
import csv
import math
import statistics
import sys
from dataclasses import dataclass, field

from tqdm import tqdm

from ..optim import COMPRESSIONS, MOMENTUM_SYNC, bytes_per_step
from ..optim._votes import vote_digits
from . import best_times, positive_int, timeout_seconds, write_outputs
from .distributed import (VALUE_BYTES, Network, RunError, allreduce_seconds, check_ranks,
                          exchange_seconds, find_mpiexec, launch)

__all__ = ["AccuracyResult", "CONTENDERS", "HELP", "LINK_GBPS", "PeerResult", "Projection",
           "Report", "StepResult", "WORKLOADS", "accuracy_verdict", "add_arguments",
           "bytes_verdict", "check_bytes", "communication_seconds", "links", "momentum_syncs",
           "parse_contender", "project", "projection_verdict", "run", "step_results",
           "time_peer"]

HELP = ("Lion's compressed distributed modes against the fp32 allreduce and Adam: bytes, step "
        "time, 1/10/100 Gb/s projection, accuracy; Lion.step against lion-pytorch")

WORKLOADS = ("gcn-cora", "gcn-citeseer", "mlp-digits")
CONTENDERS = ("adam", "none", "signs", "votes", "int8", "1bit", "signs/local")
RANKS = (2, 3)
#: Seeds and ranks of the accuracy runs unless ``--seeds`` and ``--accuracy-ranks`` say
#: otherwise.
ACCURACY_SEEDS, ACCURACY_RANKS = 3, 2
#: How the GCN workloads' graphs are split (the first is the default).
GCN_PARTITIONS = ("metis", "random")
#: Link speeds of the projection (Gb/s) and their default latencies (us): MPI over TCP on
#: commodity Ethernet at 1 and 10 Gb/s, RDMA (InfiniBand, RoCE) at 100 Gb/s.
LINK_GBPS = (1, 10, 100)
LATENCY_US = (50.0, 10.0, 2.0)
MLP_EPOCHS = 20
WARMUP = 3
#: `DistributedLion`'s ``sync_doubling`` default (Lion Cub's k).
SYNC_DOUBLING = 16
FP32, PACKED, MLP = "none", "votes", "mlp-digits"
TARGET_BYTES_RATIO, TARGET_POINTS, TARGET_SPEEDUP = 30.0, 1.0, 5.0
WORKER = "pysparse_hpc.bench._lion_worker"


class UsageError(ValueError):
    """Bad command-line input: the command exits with status 2."""


# --- contenders and schedules --------------------------------------------------------------

def parse_contender(label):
    """``[label, optimizer, compression, momentum_sync]`` of a ``--modes`` label: ``adam``, a
    compression of `pysparse_hpc.optim.COMPRESSIONS`, or ``compression/momentum_sync``.

    Raises
    ------
    UsageError
        An unknown compression or synchronisation.
    """
    if label == "adam":
        return [label, "adam", "none", None]
    compression, _, sync = label.partition("/")
    if compression not in COMPRESSIONS or (sync and sync not in MOMENTUM_SYNC):
        raise UsageError(f"unknown mode {label!r}: use adam, one of {', '.join(COMPRESSIONS)}, "
                         f"or MODE/SYNC with SYNC one of {', '.join(MOMENTUM_SYNC)}")
    if compression == FP32 and sync not in ("", "local"):
        raise UsageError(f"{label!r}: the fp32 allreduce keeps the momenta equal (only "
                         "none/local)")
    return [label, "lion", compression, sync or None]


def _sync_of(contender):
    """The momentum synchronisation `DistributedLion` runs for ``contender``."""
    _, optimizer, compression, sync = contender
    if optimizer == "adam" or compression == FP32:
        return "local"
    return sync or "growing"


def compression_of(label):
    """The compression a ``--modes`` label runs (``"adam"`` for Adam): ``votes/always`` votes
    as ``votes`` does, and ``none/local`` is the fp32 allreduce as ``none`` is, so the targets
    judge them by it, not by their label."""
    return label if label == "adam" else label.partition("/")[0]


def _is_fp32(label):
    return compression_of(label) == FP32


def _is_compressed(label):
    return compression_of(label) not in (FP32, "adam")


def fp32_references(items, key):
    """Uncompressed Lion's item (anything with a ``label``) per ``key(item)``: the one labelled
    ``none``, else another label of the fp32 allreduce (``none/local``, the same updates)."""
    found = {}
    for item in items:
        if _is_fp32(item.label) and (key(item) not in found or item.label == FP32):
            found[key(item)] = item
    return found


def momentum_syncs(momentum_sync, steps, doubling=SYNC_DOUBLING):
    """Momentum synchronisations of `DistributedLion` in its first ``steps`` steps on more
    than one rank: every step (``"always"``), none (``"local"``), or after steps 1, 2, ...
    at gaps ``floor(2 ** (j / doubling))`` after the j-th (``"growing"``)."""
    if momentum_sync == "always":
        return steps
    if momentum_sync != "growing":
        return 0
    syncs, next_sync = 0, 1
    for step in range(1, steps + 1):
        if step >= next_sync:
            syncs += 1
            next_sync = step + math.floor(2.0 ** (syncs / doubling))
    return syncs


def links(latencies_us=LATENCY_US):
    """The projection's `Network` of each of `LINK_GBPS` (beta in bytes per second)."""
    return [Network(f"{gbps}Gb/s", latency / 1e6, gbps * 1e9 / 8)
            for gbps, latency in zip(LINK_GBPS, latencies_us)]


# --- step results --------------------------------------------------------------------------

def _optimizer_kinds():
    from ..optim.distributed_lion import GRADIENT_KIND, MOMENTUM_KIND, VOTE_KIND
    # Adam's gradients go through DataParallel, which books them as plain "allreduce".
    return ("allreduce", GRADIENT_KIND, VOTE_KIND), MOMENTUM_KIND


@dataclass
class StepResult:
    """One contender on one workload and number of ranks (seconds, bytes per step).

    Attributes
    ----------
    workload : str
    contender : list
        ``[label, optimizer, compression, momentum_sync]``.
    ranks, parameters : int
    step : float
        Median over the timed steps of the slowest rank's step.
    compute : float
        The largest over ranks of the median of (step - blocked seconds).
    blocked : float
        The largest over ranks of the median blocked seconds.
    optimizer_compute : float
        The largest over ranks of the median seconds of the optimizer's ``step()`` less its
        blocked seconds (packing, counting, the update; Adam's allreduce runs in backward).
    optimizer_bytes, momentum_bytes, other_bytes, other_messages : list of float
        Per rank, received per timed step: the optimizer's own collective, its momentum
        syncs, everything else (halo exchanges).
    optimizer_calls : float
        The optimizer's collectives per step (rank 0): Adam's allreduce buckets.
    window_syncs : int
        Momentum syncs during the timed steps.
    warmup, timed : int
    training_steps : int
        Steps of the training the momentum syncs are amortised over.
    mismatches : list of str
        Byte-check failures (`check_bytes`).
    """

    workload: str
    contender: list
    ranks: int
    parameters: int
    step: float
    compute: float
    blocked: float
    optimizer_compute: float
    optimizer_bytes: list
    momentum_bytes: list
    other_bytes: list
    other_messages: list
    optimizer_calls: float
    window_syncs: int
    warmup: int
    timed: int
    training_steps: int
    mismatches: list = field(default_factory=list)

    @property
    def label(self):
        return self.contender[0]

    @property
    def compression(self):
        return self.contender[2]

    @property
    def sync(self):
        return _sync_of(self.contender)

    @property
    def sync_label(self):
        """The momentum synchronisation as the tables show it ("-": the momenta are equal)."""
        return "-" if self.contender[1] == "adam" or self.compression == FP32 else self.sync

    @property
    def syncs_per_step(self):
        """Momentum syncs per step over the whole training (none on one rank)."""
        if self.ranks == 1 or not self.training_steps:
            return 0.0
        return momentum_syncs(self.sync, self.training_steps) / self.training_steps

    @property
    def vote_bytes(self):
        """The optimizer's bytes per step, the largest over ranks, momentum syncs left out."""
        return max(self.optimizer_bytes)

    @property
    def sync_bytes(self):
        """Bytes of one momentum sync per rank (an fp32 allreduce of every coordinate)."""
        return 0 if self.ranks == 1 else VALUE_BYTES * self.parameters

    @property
    def bytes_per_step(self):
        """`vote_bytes` plus the momentum syncs amortised over the training."""
        return self.vote_bytes + self.syncs_per_step * self.sync_bytes


def _median_of_slowest(per_rank):
    return statistics.median(max(times) for times in zip(*per_rank))


def _largest_median(per_rank):
    return max(statistics.median(times) for times in per_rank)


def step_results(job, epochs=None):
    """The `StepResult` of every case of a steps job's result dict.

    Parameters
    ----------
    job : dict
        What `pysparse_hpc.bench._lion_worker.measure_steps` returned, as ``{"cases": ...}``.
    epochs : int, optional
        Training epochs the momentum syncs are amortised over (default: the GCNs' 200, the
        MLP's `MLP_EPOCHS`).
    """
    optimizer_kinds, momentum_kind = _optimizer_kinds()
    results = []
    for case in job["cases"]:
        ranks = case["per_rank"]
        seconds = [r["seconds"] for r in ranks]
        compute = [[s - b for s, b in zip(r["seconds"], r["blocked"])] for r in ranks]
        others = [{k: v for k, v in r["bytes"].items()
                   if k not in optimizer_kinds + (momentum_kind,)} for r in ranks]
        epochs_of = epochs or (MLP_EPOCHS if case["workload"] == MLP else 200)
        result = StepResult(
            workload=case["workload"], contender=case["contender"], ranks=case["ranks"],
            parameters=case["parameters"], step=_median_of_slowest(seconds),
            compute=_largest_median(compute),
            blocked=_largest_median([r["blocked"] for r in ranks]),
            optimizer_compute=_largest_median([r["optimizer"] for r in ranks]),
            optimizer_bytes=[sum(r["bytes"].get(k, 0) for k in optimizer_kinds) for r in ranks],
            momentum_bytes=[r["bytes"].get(momentum_kind, 0) for r in ranks],
            other_bytes=[sum(o.values()) for o in others],
            other_messages=[sum(r["messages"].get(k, 0) for k in o) for r, o in
                            zip(ranks, others)],
            optimizer_calls=sum(ranks[0]["messages"].get(k, 0) for k in optimizer_kinds),
            window_syncs=case["syncs"], warmup=case["warmup"], timed=case["steps"],
            training_steps=epochs_of * case.get("steps_per_epoch", 1))
        result.mismatches = check_bytes(result)
        results.append(result)
    return results


def check_bytes(result):
    """What the counters say against `bytes_per_step` and the momentum schedule: a list of
    failures (empty when everything matches)."""
    failures = []
    compression = result.compression
    for rank, counted in enumerate(result.optimizer_bytes):
        expected = bytes_per_step(compression, result.parameters, result.ranks, rank)
        if counted != expected:
            failures.append(f"rank {rank}: {counted:.0f} optimizer bytes per step counted, "
                            f"bytes_per_step says {expected}")
    syncs = 0 if result.ranks == 1 else (
        momentum_syncs(result.sync, result.warmup + result.timed)
        - momentum_syncs(result.sync, result.warmup))
    if result.window_syncs != syncs:
        failures.append(f"{result.window_syncs} momentum syncs in the timed steps, the "
                        f"{result.sync} schedule has {syncs}")
    for rank, counted in enumerate(result.momentum_bytes):
        expected = result.window_syncs * result.sync_bytes / result.timed
        if not math.isclose(counted, expected, rel_tol=1e-9, abs_tol=1e-6):
            failures.append(f"rank {rank}: {counted:.0f} momentum bytes per step counted, "
                            f"{expected:.0f} expected")
    return failures


# --- projection ----------------------------------------------------------------------------

def _allgather_seconds(block, ranks, network):
    """An allgather of one ``block`` of bytes per rank: ``(P - 1) block / beta + ceil(log2 P)
    alpha`` (ring bandwidth, recursive-doubling latency)."""
    return (ranks - 1) * block / network.beta + math.ceil(math.log2(ranks)) * network.alpha


def _one_bit_seconds(block, ranks, network):
    """The 1-bit allreduce's serial exchanges of ``block`` bytes."""
    paired = 1 << (ranks.bit_length() - 1)
    exchanges = paired.bit_length() - 1 + (2 if ranks > paired else 0)
    return exchanges * (network.alpha + block / network.beta)


def communication_seconds(result, network):
    """Projected seconds per step of ``result``'s communication on ``network``: the
    optimizer's collective, its momentum syncs amortised over the training, and the halo
    exchanges, from the counted bytes."""
    ranks = result.ranks
    if ranks == 1:
        return 0.0
    if result.compression == "signs":
        seconds = _allgather_seconds(result.vote_bytes / (ranks - 1), ranks, network)
    elif result.compression == "1bit":
        seconds = _one_bit_seconds(-(-result.parameters // 8), ranks, network)
    else:
        calls = max(result.optimizer_calls, 1.0)
        seconds = calls * allreduce_seconds(result.vote_bytes / calls, ranks, network)
    seconds += result.syncs_per_step * allreduce_seconds(result.sync_bytes, ranks, network)
    if any(result.other_bytes):
        seconds += exchange_seconds(result.other_messages,
                                    [b / VALUE_BYTES for b in result.other_bytes], 1, network)
    return seconds


@dataclass(frozen=True)
class Projection:
    """A `StepResult`'s step projected on one link (seconds): compute, then communication
    split into its latency (alpha) and transfer (bytes / beta) parts."""

    result: StepResult
    network: Network
    latency: float
    transfer: float

    @property
    def label(self):
        return self.result.label

    @property
    def step(self):
        return self.result.compute + self.latency + self.transfer

    @property
    def limit(self):
        """What dominates the step: ``"compute"``, ``"latency"`` or ``"bytes"``."""
        parts = {"compute": self.result.compute, "latency": self.latency,
                 "bytes": self.transfer}
        return max(parts, key=parts.get)


def project(result, network):
    """The `Projection` of ``result`` on ``network``."""
    latency = communication_seconds(result, Network(network.name, network.alpha, math.inf))
    transfer = communication_seconds(result, Network(network.name, 0.0, network.beta))
    return Projection(result, network, latency, transfer)


# --- accuracy and peer ---------------------------------------------------------------------

@dataclass
class AccuracyResult:
    """Test accuracies of one contender on one workload, one per seed."""

    workload: str
    label: str
    ranks: int
    accuracies: list
    replicas_equal: bool = True

    @property
    def mean(self):
        return statistics.fmean(self.accuracies)


def accuracy_results(job):
    """One `AccuracyResult` per workload and contender of an accuracy job's result dict."""
    grouped = {}
    for case in job["cases"]:
        key = (case["workload"], case["label"], case["ranks"])
        entry = grouped.setdefault(key, AccuracyResult(*key, []))
        entry.accuracies.append(case["test_accuracy"])
        entry.replicas_equal &= case.get("replicas_equal", True)
    return list(grouped.values())


@dataclass(frozen=True)
class PeerResult:
    """Seconds of one ``step()`` of ours and of ``lion-pytorch``'s on the same parameters."""

    parameters: int
    ours: float
    theirs: float
    max_difference: float

    @property
    def speedup(self):
        return self.theirs / self.ours


#: The largest parameter difference from lion-pytorch's after one step, as a fraction of the
#: learning rate, that `time_peer` takes for the same update.
PEER_TOLERANCE = 1e-3


def time_peer(repeat):
    """Our `Lion.step` against ``lion_pytorch.Lion.step`` on copies of the MLP's parameters
    with a fixed gradient, 1 thread; None when ``lion-pytorch`` is not installed.

    Raises
    ------
    RunError
        One step of each, before the timing, left different parameters."""
    try:
        from lion_pytorch import Lion as PeerLion
    except ImportError:
        return None
    import torch

    from ..optim import Lion
    from ._lion_worker import make_mlp
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ours, theirs = make_mlp(0), make_mlp(0)
        generator = torch.Generator().manual_seed(0)
        for mine, peer in zip(ours.parameters(), theirs.parameters()):
            mine.grad = torch.randn(mine.shape, generator=generator)
            peer.grad = mine.grad.clone()
        settings = dict(lr=1e-4, weight_decay=0.1)
        optimizers = {"ours": Lion(ours.parameters(), **settings),
                      "theirs": PeerLion(theirs.parameters(), **settings)}

        def difference():
            with torch.no_grad():
                return max(float((a - b).abs().max())
                           for a, b in zip(ours.parameters(), theirs.parameters()))

        for optimizer in optimizers.values():  # the same update first, or no time compares
            optimizer.step()
        # The same bits here; a rounding apart on another CPU's arithmetic is still the same
        # update, a fraction of one step (lr) is not.
        if not difference() <= PEER_TOLERANCE * settings["lr"]:
            raise RunError(f"our Lion.step differs from lion-pytorch's by {difference():.3g} "
                           "after one step on the same parameters: not timed")
        seconds = best_times({k: o.step for k, o in optimizers.items()}, repeat)
        max_difference = difference()
    finally:
        torch.set_num_threads(threads)
    return PeerResult(sum(p.numel() for p in ours.parameters()), seconds["ours"],
                      seconds["theirs"], max_difference)


# --- verdicts ------------------------------------------------------------------------------

def _state(met):
    return "MET" if met else "NOT MET"


def _ratios(results, compression):
    """fp32 allreduce bytes over those of each mode of ``compression`` (whatever its momentum
    synchronisation), per (workload, ranks, label): ``(votes only, with the momentum syncs
    amortised)``."""
    fp32 = fp32_references(results, lambda r: (r.workload, r.ranks))
    return {(r.workload, r.ranks, r.label): (fp32[key].vote_bytes / r.vote_bytes,
                                             fp32[key].vote_bytes / r.bytes_per_step)
            for r in results
            if compression_of(r.label) == compression and not _is_fp32(r.label)
            and (key := (r.workload, r.ranks)) in fp32 and r.vote_bytes}


def _by_ranks(ratios, separator=": "):
    """``"P=2: 20.0x, P=3: 16.0x"``: the smallest votes-only ratio at each P."""
    return ", ".join(f"P={p}{separator}"
                     f"{min(v[0] for (_, q, _), v in ratios.items() if q == p):.1f}x"
                     for p in sorted({p for _, p, _ in ratios}))


def bytes_verdict(results):
    """Lines judging the packed votes' bytes against the fp32 allreduce's."""
    ratios = _ratios(results, PACKED)
    if not ratios:
        return [f"target: {PACKED} >= {TARGET_BYTES_RATIO:g}x fewer bytes than the fp32 "
                f"allreduce: not measured (run the modes {FP32} and {PACKED} at P > 1)"]
    worst = min(ratios.items(), key=lambda item: item[1][0])
    met = worst[1][0] >= TARGET_BYTES_RATIO
    labels = sorted({label for _, _, label in ratios})
    mode = PACKED if labels == [PACKED] else ", ".join(labels)
    lines = [f"target: packed votes ({mode}) send >= {TARGET_BYTES_RATIO:g}x fewer bytes per "
             f"step than the fp32 allreduce: {_by_ranks(ratios)} (momentum syncs amortised: "
             f"{worst[1][1]:.1f}x on {worst[0][0]} P={worst[0][1]}), {_state(met)}"]
    if not met:
        ranks = worst[0][1]
        bits = 64 / vote_digits(ranks)
        lines.append(f"  limit: bytes -- a vote count takes P + 1 values, log2(P + 1) = "
                     f"{math.log2(ranks + 1):.2f} bits per coordinate at P={ranks} in any "
                     f"format an integer SUM allreduce adds (packed here in {bits:.2f}), so "
                     f"at most {32 / math.log2(ranks + 1):.1f}x against 32 fp32 bits")
    others = {compression_of(r.label) for r in results
              if _is_compressed(r.label) and compression_of(r.label) != PACKED}
    for compression in sorted(others):
        for label in sorted({label for _, _, label in _ratios(results, compression)}):
            found = {k: v for k, v in _ratios(results, compression).items() if k[2] == label}
            lines.append(f"  {label}: " + _by_ranks(found, " "))
    return lines


def paired_difference(result, reference):
    """Mean of ``result``'s accuracy minus ``reference``'s, seed by seed (the same seeds in
    the same order), and the half-width of its 95 % confidence interval (Student's t; 0 for a
    single seed).

    Pairing removes what a seed does to every mode alike (the weights, the dropout masks), so
    the interval is that of the mode's own effect."""
    differences = [a - b for a, b in zip(result.accuracies, reference.accuracies)]
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return mean, 0.0
    from scipy.stats import t
    spread = statistics.stdev(differences) / math.sqrt(len(differences))
    return mean, float(t.ppf(0.975, len(differences) - 1)) * spread


def _lion_results(accuracies):
    """Uncompressed Lion's `AccuracyResult` per (workload, ranks): what the modes compare to."""
    return fp32_references(accuracies, lambda a: (a.workload, a.ranks))


def accuracy_verdict(accuracies):
    """Lines judging every compressed mode's mean accuracy against uncompressed Lion's."""
    lion = _lion_results(accuracies)
    drops = [(100 * (a.mean - lion[(a.workload, a.ranks)].mean), a) for a in accuracies
             if _is_compressed(a.label) and (a.workload, a.ranks) in lion]
    if not drops:
        return [f"target: compressed modes within {TARGET_POINTS:g} point of Lion's accuracy: "
                "not measured (needs the accuracy runs of none and a compressed mode)"]
    failed = [(d, a) for d, a in drops if d < -TARGET_POINTS]
    worst = {}
    for d, a in drops:
        if a.workload not in worst or d < worst[a.workload][0]:
            worst[a.workload] = (d, a.label)
    summary = ", ".join(f"{w} worst {label} {d:+.1f}" for w, (d, label) in worst.items())
    lines = [f"target: every compressed mode ends no more than {TARGET_POINTS:g} point below "
             f"uncompressed Lion (mean test accuracy): {summary}, {_state(not failed)}"]
    if failed:
        intervals = {id(a): paired_difference(a, lion[(a.workload, a.ranks)])
                     for _, a in failed}
        lines.append("  below: " + ", ".join(
            f"{a.label} on {a.workload} {d:+.1f} points (95 % CI "
            f"{100 * (intervals[id(a)][0] - intervals[id(a)][1]):+.1f} to "
            f"{100 * (intervals[id(a)][0] + intervals[id(a)][1]):+.1f})" for d, a in failed))
        resolved = ", ".join(f"{a.label} on {a.workload}" for _, a in failed
                             if sum(intervals[id(a)]) < -TARGET_POINTS / 100)
        lines.append(f"  paired by seed, the shortfall is beyond {TARGET_POINTS:g} point with "
                     f"95 % confidence for: {resolved or 'none'}; the others are within the "
                     "seeds' resolution")
    return lines


def projection_verdict(projections, link_name):
    """Lines judging, on the MLP, the compressed modes' projected ``link_name`` step against
    Lion's fp32 allreduce step."""
    mlp = [p for p in projections if p.result.workload == MLP and p.network.name == link_name]
    fp32 = fp32_references([p for p in mlp if p.result.ranks > 1],
                           lambda p: p.result.ranks)
    head = (f"target: on {MLP}, a compressed mode's projected {link_name} step >= "
            f"{TARGET_SPEEDUP:g}x shorter than Lion's fp32 allreduce step")
    details, best_of = [], {}
    for ranks, reference in sorted(fp32.items()):
        modes = [p for p in mlp if p.result.ranks == ranks
                 and _is_compressed(p.result.label)]
        if not modes:
            continue
        best = best_of[ranks] = min(modes, key=lambda p: p.step)
        details.append(f"  P={ranks}: fp32 allreduce {1e3 * reference.step:.1f} ms; " + ", ".join(
            f"{p.result.label} {reference.step / p.step:.2f}x" for p in modes))
        if reference.step / best.step < TARGET_SPEEDUP:
            details.append(_projection_limit(reference, best))
    if not best_of:
        return [head + ": not measured (needs the MLP with none and a compressed mode at P > 1)"]
    speedups = {ranks: fp32[ranks].step / best.step for ranks, best in best_of.items()}
    summary = ", ".join(f"P={ranks} {best_of[ranks].result.label} {speedup:.2f}x"
                        for ranks, speedup in speedups.items())
    met = min(speedups.values()) >= TARGET_SPEEDUP
    return [f"{head}: best {summary}, {_state(met)}"] + details


def _projection_limit(reference, best):
    """Why ``best`` is not `TARGET_SPEEDUP` times shorter than ``reference``."""
    result = best.result
    return (f"  limit at P={result.ranks} ({result.label}): {best.limit} -- compute "
            f"{1e3 * result.compute:.1f} ms (optimizer {1e3 * result.optimizer_compute:.1f} ms, "
            f"fp32 Lion's {1e3 * reference.result.optimizer_compute:.1f} ms), latency "
            f"{1e3 * best.latency:.2f} ms, transfer {1e3 * best.transfer:.2f} ms; free "
            f"communication would give {reference.step / result.compute:.2f}x, and a mode "
            f"that sends nothing at fp32 Lion's compute "
            f"{reference.step / reference.result.compute:.2f}x")


# --- report --------------------------------------------------------------------------------

@dataclass
class Report:
    """Everything one run measured."""

    steps: list
    projections: list
    accuracies: list
    peer: object
    networks: list


def _size(nbytes):
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def _mode_width(labels):
    """Width of the tables' mode column: 12, or more so that a long ``MODE/SYNC`` label
    (``votes/growing``) keeps a space before the next column instead of running into it."""
    return max([12] + [len(label) + 1 for label in labels])


def format_steps(results):
    """Bytes and measured times per workload, P and contender."""
    width = _mode_width(r.label for r in results)
    fp32 = {key: r.vote_bytes
            for key, r in fp32_references(results, lambda r: (r.workload, r.ranks)).items()}
    lines = [f"{'workload':<13}{'P':>2}  {'mode':<{width}}{'momentum':<9}{'bytes/step':>12}"
             f"{'fp32/it':>9}{'+syncs':>12}{'fp32/it':>9}{'step ms':>9}{'compute':>9}"
             f"{'optim':>8}{'blocked':>9}"]
    for r in results:
        reference = fp32.get((r.workload, r.ranks))
        ratios = [f"{reference / nbytes:.1f}x" if reference and nbytes else "-"
                  for nbytes in (r.vote_bytes, r.bytes_per_step)]
        lines.append(f"{r.workload:<13}{r.ranks:>2}  {r.label:<{width}}{r.sync_label:<9}"
                     f"{_size(r.vote_bytes):>12}{ratios[0]:>9}{_size(r.bytes_per_step):>12}"
                     f"{ratios[1]:>9}{1e3 * r.step:>9.2f}{1e3 * r.compute:>9.2f}"
                     f"{1e3 * r.optimizer_compute:>8.2f}{1e3 * r.blocked:>9.2f}")
    return "\n".join(lines)


def format_projection(projections, networks):
    """Projected ms per step on each link, with the speedup over Lion's fp32 allreduce and
    over Adam on the slowest link."""
    by_key = {(p.result.workload, p.result.ranks, p.result.label, p.network.name): p
              for p in projections}
    slowest = networks[0].name
    fp32 = fp32_references([p for p in projections if p.network.name == slowest],
                           lambda p: (p.result.workload, p.result.ranks))
    width = _mode_width(p.label for p in projections)
    lines = [f"{'workload':<13}{'P':>2}  {'mode':<{width}}"
             + "".join(f"{n.name + ' ms':>12}" for n in networks)
             + f"{'vs fp32':>9}{'vs Adam':>9}  limit@{slowest}"]
    for r in [p.result for p in projections if p.network.name == slowest]:
        if r.ranks == 1:
            continue
        mine = by_key[(r.workload, r.ranks, r.label, slowest)]
        versus = [fp32.get((r.workload, r.ranks)),
                  by_key.get((r.workload, r.ranks, "adam", slowest))]
        ratios = "".join(f"{v.step / mine.step:>8.2f}x" if v else f"{'-':>9}" for v in versus)
        lines.append(f"{r.workload:<13}{r.ranks:>2}  {r.label:<{width}}"
                     + "".join(f"{1e3 * by_key[(r.workload, r.ranks, r.label, n.name)].step:>12.2f}"
                               for n in networks) + f"{ratios}  {mine.limit}")
    return "\n".join(lines)


def format_accuracy(accuracies):
    """Mean test accuracy per workload and contender, against Lion's and Adam's."""
    reference = {(a.workload, a.ranks, a.label): a.mean for a in accuracies}
    lion = _lion_results(accuracies)
    width = _mode_width(a.label for a in accuracies)
    lines = [f"{'workload':<13}{'P':>2}  {'mode':<{width}}{'mean %':>8}{'vs Lion':>9}{'95% CI':>14}"
             f"{'vs Adam':>9}  per seed"]
    for a in accuracies:
        fp32 = lion.get((a.workload, a.ranks))
        versus = [None if fp32 is None else fp32.mean, reference.get((a.workload, a.ranks, "adam"))]
        diffs = [f"{100 * (a.mean - v):>+9.1f}" if v is not None else f"{'-':>9}"
                 for v in versus]
        interval = f"{'-':>14}"
        if (a.workload, a.ranks) in lion and not _is_fp32(a.label):
            mean, half = paired_difference(a, lion[(a.workload, a.ranks)])
            interval = f"{100 * (mean - half):>+7.1f}..{100 * (mean + half):+.1f}".rjust(14)
        note = "" if a.replicas_equal else "  REPLICAS DIFFER"
        lines.append(f"{a.workload:<13}{a.ranks:>2}  {a.label:<{width}}{100 * a.mean:>8.1f}"
                     f"{diffs[0]}"
                     f"{interval}{diffs[1]}  " + " ".join(f"{100 * x:.1f}" for x in a.accuracies)
                     + note)
    return "\n".join(lines)


def format_peer(peer):
    if peer is None:
        return "Lion.step peer: lion-pytorch is not installed (pip install lion-pytorch)"
    return (f"Lion.step on the MLP's {peer.parameters:,} parameters, 1 thread: ours "
            f"{1e3 * peer.ours:.2f} ms, lion-pytorch {1e3 * peer.theirs:.2f} ms, "
            f"lion-pytorch/ours {peer.speedup:.2f}x; largest parameter difference after the "
            f"same steps {peer.max_difference:.1e}")


def byte_check_lines(results):
    failures = [f"BYTE CHECK FAILED {r.workload} P={r.ranks} {r.label}: {m}"
                for r in results for m in r.mismatches]
    checked = sum(1 for r in results if r.ranks > 1)
    return failures or [f"byte check: the counted bytes of all {checked} multi-rank "
                        "configurations equal bytes_per_step, and the momentum syncs the "
                        "schedule"]


# --- outputs -------------------------------------------------------------------------------

CSV_COLUMNS = ("section", "workload", "ranks", "mode", "momentum_sync", "parameters",
               "bytes_per_step", "bytes_with_syncs", "step_ms", "compute_ms", "optimizer_ms",
               "blocked_ms", "network", "alpha_us", "projected_ms", "latency_ms", "transfer_ms",
               "mean_accuracy", "accuracies", "ours_ms", "theirs_ms")


def write_csv(report, path, *_):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_COLUMNS)
        writer.writeheader()
        for r in report.steps:
            writer.writerow(dict(section="steps", workload=r.workload, ranks=r.ranks,
                                 mode=r.label, momentum_sync=r.sync_label,
                                 parameters=r.parameters,
                                 bytes_per_step=f"{r.vote_bytes:.0f}",
                                 bytes_with_syncs=f"{r.bytes_per_step:.0f}",
                                 step_ms=f"{1e3 * r.step:.4f}",
                                 compute_ms=f"{1e3 * r.compute:.4f}",
                                 optimizer_ms=f"{1e3 * r.optimizer_compute:.4f}",
                                 blocked_ms=f"{1e3 * r.blocked:.4f}"))
        for p in report.projections:
            writer.writerow(dict(section="projection", workload=p.result.workload,
                                 ranks=p.result.ranks, mode=p.result.label,
                                 network=p.network.name, alpha_us=f"{1e6 * p.network.alpha:g}",
                                 projected_ms=f"{1e3 * p.step:.4f}",
                                 compute_ms=f"{1e3 * p.result.compute:.4f}",
                                 latency_ms=f"{1e3 * p.latency:.4f}",
                                 transfer_ms=f"{1e3 * p.transfer:.4f}"))
        for a in report.accuracies:
            writer.writerow(dict(section="accuracy", workload=a.workload, ranks=a.ranks,
                                 mode=a.label, mean_accuracy=f"{a.mean:.5f}",
                                 accuracies=" ".join(f"{x:.5f}" for x in a.accuracies)))
        if report.peer is not None:
            writer.writerow(dict(section="peer", parameters=report.peer.parameters,
                                 ours_ms=f"{1e3 * report.peer.ours:.4f}",
                                 theirs_ms=f"{1e3 * report.peer.theirs:.4f}"))


def _grouped_bars(axes, groups, series, width=0.8):
    """Bars of ``series`` (name -> list of values, one per group), side by side per group."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    step = width / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * step
        axes.bar([g + offset for g in range(len(groups))], values, step, label=name,
                 hatch="//" if "only" in name else None)
    axes.set_xticks(range(len(groups)), groups, fontsize=7, rotation=30)
    axes.set_yscale("log")
    low, high = axes.get_ylim()
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    if high < 10 * low:  # within a decade: label the minor ticks too
        axes.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    else:  # 1, 2 and 5 of each decade; more would pile up
        axes.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axes.yaxis.set_minor_formatter(NullFormatter())
    axes.tick_params(axis="y", which="both", labelsize=6)
    axes.legend(fontsize=6)


def write_plot(report, path, *_):
    """Per workload: bytes per step of every mode (one bar per P), and the projected step on
    each link (one panel per P), log scales."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure

    workloads = list(dict.fromkeys(r.workload for r in report.steps))
    ranks = sorted({r.ranks for r in report.steps if r.ranks > 1})
    figure = Figure(figsize=(4.2 * (1 + len(ranks)), 3.3 * len(workloads)))
    FigureCanvasAgg(figure)
    for row, workload in enumerate(workloads):
        mine = [r for r in report.steps if r.workload == workload and r.ranks > 1]
        labels = list(dict.fromkeys(r.label for r in mine))
        value = {(r.label, r.ranks): r for r in mine}
        axes = figure.add_subplot(len(workloads), 1 + len(ranks), row * (1 + len(ranks)) + 1)
        bars = {}
        for p in ranks:
            for name, figure_of in ((f"P={p}", "bytes_per_step"),
                                    (f"P={p} votes only", "vote_bytes")):
                bars[name] = [getattr(value[(m, p)], figure_of) if (m, p) in value else 0
                              for m in labels]
        _grouped_bars(axes, labels, bars)
        axes.set_ylabel("bytes per step and rank")
        axes.set_title(f"{workload}: bytes per step (syncs amortised; hatched: without)",
                       fontsize=8)
        projected = {(p.result.label, p.result.ranks, p.network.name): p.step
                     for p in report.projections if p.result.workload == workload}
        for column, p in enumerate(ranks, start=2):
            axes = figure.add_subplot(len(workloads), 1 + len(ranks),
                                      row * (1 + len(ranks)) + column)
            _grouped_bars(axes, labels, {n.name: [1e3 * projected.get((m, p, n.name), 0)
                                                  for m in labels] for n in report.networks})
            axes.set_ylabel("projected ms per step")
            axes.set_title(f"{workload}, P={p}: projected step", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


# --- command line --------------------------------------------------------------------------

def add_arguments(parser):
    parser.add_argument("--ranks", type=positive_int, nargs="+", default=list(RANKS),
                        metavar="P", help="ranks of the step jobs (default: 2 3)")
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, metavar="NAME",
                        help=f"workloads (default: all of {', '.join(WORKLOADS)})")
    parser.add_argument("--modes", nargs="+", default=list(CONTENDERS), metavar="MODE",
                        help="contenders: adam, a compression, or MODE/SYNC (default: "
                             f"{' '.join(CONTENDERS)})")
    # --seeds and --accuracy-ranks default to None: given with --skip-accuracy they must be
    # refused, not ignored (see _check_arguments)
    parser.add_argument("--seeds", type=positive_int, metavar="N",
                        help=f"seeds of every accuracy run (default: {ACCURACY_SEEDS})")
    parser.add_argument("--epochs", type=positive_int, metavar="N",
                        help="training epochs of every workload (default: the GCN's published "
                             f"200, the MLP's {MLP_EPOCHS})")
    parser.add_argument("--partition", choices=GCN_PARTITIONS, default=GCN_PARTITIONS[0],
                        help="how the GCN workloads' graphs are split over the ranks: metis "
                             "(communities, the trainer's default) or random (every rank's "
                             "training nodes alike; default: metis)")
    parser.add_argument("--accuracy-ranks", type=positive_int, metavar="P",
                        help=f"ranks of the accuracy runs (default: {ACCURACY_RANKS})")
    parser.add_argument("--latency-us", type=float, nargs="+", default=list(LATENCY_US),
                        metavar="US", help="link latency of the projection, one for all links "
                        "or one per link of " + ", ".join(f"{g} Gb/s" for g in LINK_GBPS)
                        + f" (default: {' '.join(f'{x:g}' for x in LATENCY_US)})")
    parser.add_argument("--skip-accuracy", action="store_true",
                        help="measure steps and the projection only")
    parser.add_argument("--timeout", type=timeout_seconds, default=1800, metavar="S",
                        help="seconds before a job is stopped (default: 1800)")


def _check_arguments(args):
    """``(contenders, workloads, latencies)``; raises `UsageError`."""
    contenders = [parse_contender(label) for label in dict.fromkeys(args.modes)]
    latencies = list(args.latency_us)
    if len(latencies) == 1:
        latencies *= len(LINK_GBPS)
    if len(latencies) != len(LINK_GBPS) or any(not 0 <= x < math.inf for x in latencies):
        raise UsageError(f"--latency-us takes 1 or {len(LINK_GBPS)} finite non-negative "
                         f"values, got {args.latency_us}")
    twice = sorted({p for p in args.ranks if list(args.ranks).count(p) > 1})
    if twice:
        # Each P is one job: a repeated one ran again and printed every row twice.
        raise UsageError(f"--ranks lists {', '.join(f'P={p}' for p in twice)} more than once")
    given = [option for option, dest in (("--seeds", "seeds"),
                                         ("--accuracy-ranks", "accuracy_ranks"))
             if getattr(args, dest) is not None]
    if given and args.skip_accuracy:
        raise UsageError(f"{' and '.join(given)} set the accuracy runs, which --skip-accuracy "
                         "leaves out: give one or the other")
    if args.seeds is None:
        args.seeds = ACCURACY_SEEDS
    if args.accuracy_ranks is None:
        args.accuracy_ranks = ACCURACY_RANKS
    # Only the jobs that run need their ranks (and mpiexec).
    ranks = list(args.ranks) + ([] if args.skip_accuracy else [args.accuracy_ranks])
    check_ranks(ranks, "--ranks/--accuracy-ranks", UsageError)
    if any(p > 1 for p in ranks) and find_mpiexec() is None:
        raise UsageError("more than one rank needs mpiexec (pip install mpi4py mpich)")
    return contenders, list(args.workload or WORKLOADS), latencies


def _jobs(args, contenders, workloads):
    """``(ranks, config)`` of every job to launch: one steps job per P, one accuracy job per
    workload."""
    jobs = [(p, dict(mode="steps", workloads=workloads, contenders=contenders,
                     warmup=WARMUP, steps=args.repeat, partition=args.partition))
            for p in args.ranks]
    if not args.skip_accuracy:
        jobs += [(args.accuracy_ranks, dict(mode="accuracy", workloads=[w],
                                            contenders=contenders,
                                            partition=args.partition,
                                            seeds=list(range(args.seeds)),
                                            gcn_epochs=args.epochs,
                                            mlp_epochs=args.epochs or MLP_EPOCHS))
                 for w in workloads]
    return jobs


def measure(args, contenders, workloads, networks):
    """Run the jobs and the peer; the `Report`. Raises `RunError` when a job fails."""
    mpiexec = find_mpiexec()
    peer = time_peer(args.repeat)  # first: a wrong Lion.step stops the command before the jobs
    steps, accuracies = [], []
    jobs = _jobs(args, contenders, workloads)
    with tqdm(total=len(jobs), desc="lion", unit="job") as progress:
        for ranks, config in jobs:
            progress.set_postfix_str(f"{config['mode']} P={ranks}")
            job = launch(ranks, 1, config, args.timeout, mpiexec, worker=WORKER)
            if config["mode"] == "steps":
                steps += step_results(job, args.epochs)
            else:
                accuracies += accuracy_results(job)
            progress.update()
    projections = [project(r, n) for r in steps for n in networks]
    return Report(steps, projections, accuracies, peer, networks)


def report_lines(report, args):
    """The printed report: tables, byte check and verdicts."""
    networks = report.networks
    lines = [f"Lion over MPI, 1 thread per rank, {args.repeat} timed steps per contender in "
             f"turns after {WARMUP} warm-up steps; bytes received per step and rank (max over "
             "ranks), '+syncs' with the momentum syncs amortised over the training",
             format_steps(report.steps), *byte_check_lines(report.steps), "",
             "Projection: measured compute + alpha-beta communication from the counted bytes ("
             + ", ".join(f"{n.name}: alpha {1e6 * n.alpha:g} us" for n in networks)
             + "); 'vs' columns: projected fp32-allreduce Lion (Adam) step / this step at "
             f"{networks[0].name}", format_projection(report.projections, networks), ""]
    if report.accuracies:
        graphs = (f", the GCNs' graphs on a {args.partition} partition"
                  if any(a.workload.startswith("gcn") for a in report.accuracies) else "")
        lines += [f"Test accuracy, mean of {args.seeds} seed(s){graphs}, points against "
                  "uncompressed Lion and Adam", format_accuracy(report.accuracies), ""]
    lines += [format_peer(report.peer), ""]
    lines += bytes_verdict(report.steps)
    if report.accuracies:
        lines += accuracy_verdict(report.accuracies)
    lines += projection_verdict(report.projections, networks[0].name)
    return lines


def run(args, out=None):
    """Run the benchmark and report (to ``out``, default standard output); returns the exit
    status."""
    out = sys.stdout if out is None else out
    try:
        contenders, workloads, latencies = _check_arguments(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        report = measure(args, contenders, workloads, links(latencies))
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in report_lines(report, args):
        print(line, file=out)
    write_outputs(args, out, report, write_csv, write_plot)
    return 1 if any(r.mismatches for r in report.steps) else 0
