"""The ``precondition`` benchmark: time per training step of our gradient makers against ASDL's.

Workloads (float32, the shared thread count, SGD applying the gradients):

- ``mlp``: a 784-256-128-10 ReLU MLP, batch 128;
- ``cnn``: Conv2d(3, 8, 3) - ReLU - Conv2d(8, 16, 3, stride 2) - ReLU - 4x4 average pooling -
  Linear(256, 10), batch 64 of 3x16x16 images;
- ``gcn``: the library's two-layer GCN on Cora (full batch, the loss on the 140 training nodes
  through the placeholder's mask), whose ``conv.lin`` Linear modules ASDL hooks as well;
- ``gcn-pubmed``: the same GCN on the shared PubMed structure (19,717 nodes, its labels and 60
  training nodes) with seeded standard-normal features 500 wide, the file having no feature
  matrix: only the time is meaningful.

Methods, each run by ours and by ASDL (``asdfghjkl``) on the same model, data and
configuration: K-FAC with the empirical Fisher, curvature and inverses every step
(``kfac/1``) and every 10 steps (``kfac/10``); Shampoo with ASDL's defaults (statistics and
roots every step, no blocks, no grafting). Jorge (ours only) runs with Shampoo's configuration,
so that the two compare. Plain SGD gives the overhead. Runs are interleaved, ``--repeat``
rounds, medians. Before timing, one K-FAC step of each library from the same weights must give
the same preconditioned gradients (`kfac_difference`, at most `KFAC_AGREEMENT` relative), else
the command stops with status 1. Shampoo is not checked so: ASDL adds the damping into its
statistics, ours to the eigenvalues of the roots (docs/precondition.rst), so the updates differ
by design, and so does the work: ASDL refreshes each root by a power iteration and coupled
Newton iterations in float32, ours by an eigendecomposition, and ASDL splits a convolution's
weight into four factors (8th roots) where ours takes two (4th roots). The Shampoo ratio is
that of each library run as its users run it, not of one algorithm.

The project's targets (geometric mean over the workloads): K-FAC at least 2x faster per step
than ASDL's (both intervals), Shampoo at least 5x; Jorge's step at least 3x cheaper than our
Shampoo's.

``--distributed`` measures instead our makers over MPI (KAISA), at P = 1 (one process on
``--threads`` threads) and P = 2 (``mpiexec -n 2``, ``threads // 2`` threads per rank, the same
total), both subprocesses running `pysparse_hpc.bench._precondition_worker`: the ``mlp``
workload with the batch of 128 split over the ranks, and ``gcn`` on Cora partitioned by METIS
(`pysparse_hpc.distributed.DistGraph`). Methods: SGD (`DataParallel`'s gradient allreduce),
K-FAC with curvature and inverses every step and every 10 steps, Shampoo and Jorge with
statistics and roots every 10 steps, each under both strategies (``"inverse"``: owners
broadcast the inverses or roots; ``"gradient"``: owners precondition their modules and
broadcast the gradients). Per configuration: milliseconds per step (the mean over the timed
steps of the slowest rank's time, median over ``--repeat`` rounds of the two jobs) and the
bytes received per step by all ranks together, by kind (`Communicator.stats`): gradient
allreduce, curvature allreduce, inverse broadcast, gradient broadcast and, for the GCN, the halo
exchanges; and the largest relative difference of the P = 2 losses from the P = 1 ones.
"""
import csv
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field

from tqdm import tqdm

from . import counted, geometric_mean, timeout_seconds, write_outputs

__all__ = ["DISTRIBUTED_METHODS", "DISTRIBUTED_WORKLOADS", "Disagreement", "DistributedResult",
           "HELP", "KFAC_AGREEMENT", "METHODS", "StepResult", "WORKLOADS", "add_arguments",
           "distributed_heading", "kfac_difference", "measure", "measure_distributed", "run"]

HELP = "gradient preconditioning (K-FAC, Shampoo, Jorge) step time against ASDL's"

WORKLOADS = ("mlp", "cnn", "gcn", "gcn-pubmed")
PUBMED_FEATURES = 500
#: (method, curvature interval); ASDL runs all but jorge.
METHODS = (("sgd", 1), ("kfac", 1), ("kfac", 10), ("shampoo", 1), ("jorge", 1))
TARGETS = {"kfac": 2.0, "shampoo": 5.0}
JORGE_TARGET = 3.0

#: ``--distributed``: its workloads, (method, interval) pairs and rank counts.
DISTRIBUTED_WORKLOADS = ("mlp", "gcn")
DISTRIBUTED_METHODS = (("sgd", 1), ("kfac", 1), ("kfac", 10), ("shampoo", 10), ("jorge", 10))
DISTRIBUTED_RANKS = (1, 2)
DISTRIBUTED_WORKER = "pysparse_hpc.bench._precondition_worker"
STRATEGIES = ("inverse", "gradient")
#: Seconds a ``--distributed`` job may run unless ``--timeout`` says otherwise.
DISTRIBUTED_TIMEOUT = 900


@dataclass(frozen=True)
class StepResult:
    """Milliseconds per step of one workload and method (NaN where a side did not run);
    for K-FAC, the checked difference from ASDL's update (`kfac_difference`)."""
    workload: str
    method: str
    interval: int
    ours_ms: float
    asdl_ms: float
    difference: float = math.nan

    @property
    def speedup(self):
        return self.asdl_ms / self.ours_ms


#: The largest relative difference of our K-FAC's update from ASDL's (float32, the same Fisher,
#: damping and intervals) that counts as the same update; they agree to about 1e-5.
KFAC_AGREEMENT = 1e-3


class Disagreement(RuntimeError):
    """Our K-FAC's update is not ASDL's: their times would not compare, so none is taken."""


def add_arguments(parser):
    parser.add_argument("--workload", action="append", choices=WORKLOADS,
                        help="workload to run (repeatable; default: all; with --distributed: "
                             "mlp and gcn)")
    parser.add_argument("--steps", type=int, default=10, metavar="N",
                        help="timed steps per run (at least 1; default 10; runs with an "
                             "interval of 10 take 2N)")
    parser.add_argument("--distributed", action="store_true",
                        help="instead of the comparison with ASDL, time our makers over MPI "
                             "at P=1 and P=2 with bytes per step (needs mpiexec)")
    # None, not the default: given without --distributed it must be refused, not ignored
    parser.add_argument("--timeout", type=timeout_seconds, metavar="S",
                        help="--distributed: seconds before a job is stopped (default "
                             f"{DISTRIBUTED_TIMEOUT})")


def _asdl():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import asdl
    except ImportError:
        return None
    return asdl


def _workload(name, data_dir=None):
    """``(make_model, inputs, target, mask)``; ``make_model()`` gives the same weights.
    ``data_dir``: the shared data (PubMed's structure), default the bench's."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(0)
    if name == "mlp":
        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                 nn.Linear(128, 10))
        return make, (torch.randn(128, 784, generator=generator),), \
            torch.randint(0, 10, (128,), generator=generator), None
    if name == "cnn":
        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10))
        return make, (torch.randn(64, 3, 16, 16, generator=generator),), \
            torch.randint(0, 10, (64,), generator=generator), None
    graph, x, y, train_mask = _graph_workload(name, data_dir)

    def make():
        from ..nn import models
        torch.manual_seed(0)
        return models.GCN(x.shape[1], out_channels=graph.num_classes, hidden=16)
    return make, (x, graph.adj), y, train_mask


def _graph_workload(name, data_dir):
    """``(dataset, x, y, train_mask)`` of a GCN workload."""
    import torch

    from .. import datasets
    from ..nn import train
    if name == "gcn":
        cora = datasets.load("cora")
        x, y, train_mask, *_ = train.node_tensors(cora)
        return cora, x, y, train_mask
    from ._data import find_graph
    path = find_graph("pubmed", data_dir).path
    pubmed = datasets.load_file(path, random_features=PUBMED_FEATURES, seed=0, name="pubmed")
    _, y, train_mask, *_ = train.node_tensors(pubmed)
    return pubmed, torch.from_numpy(pubmed.x), y, train_mask


def _maker(library, method, interval, model, data_size, **distribution):
    """A gradient maker of ``library`` (our package or the asdl module), or None for SGD;
    ``distribution``: ours' ``comm`` and ``strategy``."""
    if method == "sgd":
        return None
    if method == "kfac":
        config = library.PreconditioningConfig(data_size=data_size, damping=1e-3,
                                               curvature_upd_interval=interval,
                                               preconditioner_upd_interval=interval)
        return library.KfacGradientMaker(model, config, fisher_type="fisher_emp", **distribution)
    # One process needs no data_size here (ASDL's Shampoo takes none); ranks divide their
    # summed losses by it.
    counted = dict(data_size=data_size) if distribution.get("comm") is not None else {}
    config = library.PreconditioningConfig(damping=1e-4, curvature_upd_interval=interval,
                                           preconditioner_upd_interval=interval, **counted)
    if method == "shampoo":
        return library.ShampooGradientMaker(model, config, **distribution)
    return library.JorgeGradientMaker(model, config, grafting=None, **distribution)


def _gradients(maker, model, inputs, target, mask):
    """One forward and backward: the plain gradients, or ``maker``'s preconditioned ones."""
    import torch.nn.functional as F

    if maker is None:
        output = model(*inputs)
        if mask is not None:
            output, labels = output[mask], target[mask]
        else:
            labels = target
        F.cross_entropy(output, labels).backward()
    else:
        placeholder = maker.setup_model_call(model, *inputs)
        if mask is not None:
            maker.setup_loss_call(F.cross_entropy, placeholder[mask], target[mask])
        else:
            maker.setup_loss_call(F.cross_entropy, placeholder, target)
        maker.forward_and_backward()


def kfac_difference(workload_parts, data_size, asdl):
    """The largest relative difference (per parameter, in norm) between our K-FAC's
    preconditioned gradients and ASDL's after one step of each (curvature and inverses built
    in it) from the same weights: the two must compute the same update for their times to
    compare."""
    from .. import precondition as ours

    make, inputs, target, mask = workload_parts
    gradients = []
    for library in (ours, asdl):
        model = make()
        _gradients(_maker(library, "kfac", 1, model, data_size), model, inputs, target, mask)
        gradients.append([p.grad for p in model.parameters()])
    return max(float((a - b).norm() / b.norm().clamp_min(1e-30))
               for a, b in zip(*gradients))


def _ms_per_step(maker, model, inputs, target, mask, warmup, steps):
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        _gradients(maker, model, inputs, target, mask)
        optimizer.step()

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def measure(workload, repeat, steps, asdl, progress=None, data_dir=None):
    """The `StepResult` of every method on ``workload``.

    Parameters
    ----------
    workload : str
        One of `WORKLOADS`.
    repeat, steps : int
        Interleaved rounds, and timed steps per run (twice as many with an interval of 10).
    asdl : module or None
        ASDL's ``asdl`` module; None times ours only.
    progress : tqdm, optional
        Advanced by one per round.
    data_dir : path-like, optional
        The shared data (``gcn-pubmed``); default: the bench's.

    Returns
    -------
    list of StepResult
    """
    from .. import precondition as ours

    parts = _workload(workload, data_dir)
    make, inputs, target, mask = parts
    data_size = int(mask.sum()) if mask is not None else target.shape[0]
    sides = [("ours", ours)] + ([("asdl", asdl)] if asdl is not None else [])
    times = {}
    agreement = math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # ASDL's non-full backward hooks
        if asdl is not None:
            agreement = kfac_difference(parts, data_size, asdl)
            if not agreement <= KFAC_AGREEMENT:
                raise Disagreement(f"{workload}: our K-FAC's preconditioned gradients differ "
                                   f"from ASDL's by {agreement:.3g} (relative, at most "
                                   f"{KFAC_AGREEMENT:g} expected): nothing timed")
        for _ in range(repeat):
            for method, interval in METHODS:
                for side, library in sides:
                    if side == "asdl" and method in ("jorge", "sgd"):   # no peer to time
                        continue
                    model = make()
                    maker = _maker(library, method, interval, model, data_size)
                    n = steps * (2 if interval > 1 else 1)
                    times.setdefault((method, interval, side), []).append(_ms_per_step(
                        maker, model, inputs, target, mask, 2 * interval, n))
            if progress is not None:
                progress.update()
    median = {key: statistics.median(value) for key, value in times.items()}
    return [StepResult(workload, method, interval, median[(method, interval, "ours")],
                       median.get((method, interval, "asdl"), math.nan),
                       agreement if method == "kfac" else math.nan)
            for method, interval in METHODS]


def format_table(results):
    lines = [f"{'workload':<12}{'method':<10}{'ours ms':>10}{'ASDL ms':>10}{'ASDL/ours':>11}"
             f"{'vs SGD':>9}"]
    sgd = {r.workload: r.ours_ms for r in results if r.method == "sgd"}
    for r in results:
        label = r.method if r.method in ("sgd", "shampoo", "jorge") else f"{r.method}/{r.interval}"
        ratio = f"{r.speedup:>10.2f}x" if not math.isnan(r.speedup) else f"{'':>11}"
        lines.append(f"{r.workload:<12}{label:<10}{r.ours_ms:>10.2f}"
                     f"{r.asdl_ms:>10.2f}{ratio}"
                     f"{r.ours_ms / sgd[r.workload]:>8.1f}x")
    return "\n".join(lines)


def verdict(results):
    lines = []
    for method, target in TARGETS.items():
        ratios = [r.speedup for r in results if r.method == method and not math.isnan(r.speedup)]
        if not ratios:
            lines.append(f"target: {method} >= {target:g}x ASDL per step: not measured (needs "
                         "ASDL: pip install asdfghjkl)")
            continue
        mean = geometric_mean(ratios)
        lines.append(f"target: {method} >= {target:g}x ASDL per step (geo-mean of "
                     f"{len(ratios)}): {mean:.2f}x, {'MET' if mean >= target else 'NOT MET'}")
    shampoo = {r.workload: r.ours_ms for r in results if r.method == "shampoo"}
    cheaper = [shampoo[r.workload] / r.ours_ms for r in results if r.method == "jorge"]
    mean = geometric_mean(cheaper)
    lines.append(f"target: Jorge's step >= {JORGE_TARGET:g}x cheaper than our Shampoo's "
                 f"(geo-mean): {mean:.2f}x, {'MET' if mean >= JORGE_TARGET else 'NOT MET'}")
    return lines


def write_csv(results, path, threads, repeat):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["workload", "method", "interval", "ours_ms", "asdl_ms", "threads",
                         "repeat"])
        for r in results:
            writer.writerow([r.workload, r.method, r.interval, f"{r.ours_ms:.4f}",
                             f"{r.asdl_ms:.4f}", threads, repeat])


def write_plot(results, path, threads, repeat):
    """Step time against ASDL's per workload and method (log scale)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    shown = [r for r in results if r.method != "sgd"]
    figure = Figure(figsize=(max(6.0, 0.6 * len(shown)), 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = range(len(shown))
    axes.bar([p - 0.2 for p in positions], [r.ours_ms for r in shown], 0.4, label="ours")
    axes.bar([p + 0.2 for p in positions], [r.asdl_ms for r in shown], 0.4, label="ASDL")
    # Each workload's plain SGD step: the floor no preconditioned step goes below.
    sgd = {r.workload: r.ours_ms for r in results if r.method == "sgd"}
    for n, workload in enumerate(w for w in dict.fromkeys(r.workload for r in shown)
                                 if w in sgd):
        where = [i for i, r in enumerate(shown) if r.workload == workload]
        axes.hlines(sgd[workload], where[0] - 0.45, where[-1] + 0.45, colors="black",
                    linestyles="--", linewidth=0.8, label=None if n else "SGD step")
    labels = [f"{r.workload} {r.method}" + (f"/{r.interval}" if r.method == "kfac" else "")
              for r in shown]
    axes.set_xticks(list(positions), labels, fontsize=7, rotation=30, ha="right")
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axes.set_ylabel("ms per training step")
    axes.set_title(f"Preconditioned SGD step, ours vs ASDL ({threads} "
                   f"thread{'s' if threads != 1 else ''}, median of {repeat})")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def run(args, out=None):
    """Run the benchmark and report (to ``out``, default standard output); returns the exit
    status."""
    out = sys.stdout if out is None else out
    if args.steps < 1:
        print(f"error: --steps must be at least 1, got {args.steps}", file=sys.stderr)
        return 2
    if args.distributed:
        return run_distributed(args, out)
    if args.timeout is not None:
        # The comparison with ASDL runs in this process: there is no job to stop.
        print("error: --timeout applies to the MPI jobs of --distributed only, and "
              "--distributed was not given", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(args.threads)
    asdl = _asdl()
    if asdl is None:
        print("note: ASDL is not installed (pip install asdfghjkl); only ours is timed",
              file=sys.stderr)
    workloads = args.workload or list(WORKLOADS)
    results = []
    with tqdm(total=len(workloads) * args.repeat, desc="precondition", unit="round") as progress:
        for workload in workloads:
            progress.set_postfix_str(workload)
            try:
                results += measure(workload, args.repeat, args.steps, asdl, progress,
                                   args.data_dir)
            except FileNotFoundError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            except Disagreement as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
    print(f"Preconditioned SGD steps, {counted(args.threads, 'thread')}, median of {args.repeat} "
          f"interleaved rounds of {args.steps} steps (kfac/10: {2 * args.steps})", file=out)
    differences = {r.workload: r.difference for r in results
                   if r.method == "kfac" and not math.isnan(r.difference)}
    if differences:
        print("K-FAC's update checked against ASDL's before timing (largest relative "
              "difference): " + ", ".join(f"{w} {d:.1e}" for w, d in differences.items()),
              file=out)
    print(format_table(results), file=out)
    for line in verdict(results):
        print(line, file=out)
    write_outputs(args, out, results, write_csv, write_plot, args.threads, args.repeat)
    return 0


# --- distributed (KAISA) -------------------------------------------------------------------

@dataclass
class DistributedResult:
    """One configuration of a ``--distributed`` job.

    Attributes
    ----------
    workload, method : str
    interval : int
    strategy : str or None
        None for SGD and at P = 1 (nothing is shared).
    ranks, threads_per_rank : int
    ms_per_step : float
        Mean of the slowest rank's step times, median over the rounds.
    bytes_per_step : dict
        Bytes received per step by all ranks together, by
        `pysparse_hpc.bench._precondition_worker.KIND_COLUMNS`.
    losses : list of float
        Per timed step, summed over the ranks.
    loss_rel_diff : float
        Largest relative difference of ``losses`` from the P = 1 run's (NaN at P = 1).
    """

    workload: str
    method: str
    interval: int
    strategy: object
    ranks: int
    threads_per_rank: int
    ms_per_step: float
    bytes_per_step: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    loss_rel_diff: float = math.nan

    @property
    def label(self):
        return self.method if self.method in ("sgd", "shampoo", "jorge") and self.interval == 1 \
            else f"{self.method}/{self.interval}"

    @property
    def total_bytes(self):
        return sum(self.bytes_per_step.values())


def _distributed_results(job):
    return [DistributedResult(c["workload"], c["method"], c["interval"], c["strategy"],
                              job["ranks"], job["threads_per_rank"], c["ms_per_step"],
                              c["bytes_per_step"], c["losses"]) for c in job["cases"]]


def _merge_rounds(rounds):
    """One result per configuration: the first round's, with the median time of all."""
    merged = {}
    for results in rounds:
        for r in results:
            key = (r.workload, r.method, r.interval, r.strategy, r.ranks)
            merged.setdefault(key, (r, []))[1].append(r.ms_per_step)
    out = []
    for first, times in merged.values():
        first.ms_per_step = statistics.median(times)
        out.append(first)
    return out


def _compare_losses(results):
    """Set every P > 1 result's `loss_rel_diff` against the P = 1 run of its method."""
    single = {(r.workload, r.method, r.interval): r.losses for r in results if r.ranks == 1}
    for r in results:
        reference = single.get((r.workload, r.method, r.interval))
        if r.ranks > 1 and reference:
            r.loss_rel_diff = max(abs(a - b) / max(abs(b), 1e-30)
                                  for a, b in zip(r.losses, reference))


def measure_distributed(workloads, steps, rounds, threads, timeout, mpiexec, progress=None,
                        methods=DISTRIBUTED_METHODS):
    """Run the ``--distributed`` jobs: P = 1 on ``threads`` threads, then P = 2 on
    ``threads // 2`` per rank, ``rounds`` times in turns.

    Parameters
    ----------
    workloads : sequence of str
        Among `DISTRIBUTED_WORKLOADS`.
    steps, rounds, threads, timeout : int
    mpiexec : str
        The launcher (`pysparse_hpc.distributed._comm.mpiexec_path`).
    progress : tqdm, optional
        Advanced by one per job.
    methods : sequence of (str, int)
        (method, interval) pairs.

    Returns
    -------
    list of DistributedResult
    """
    from .distributed import launch
    config = dict(workloads=list(workloads), methods=[list(m) for m in methods],
                  steps=steps)
    rounds_by_ranks = {ranks: [] for ranks in DISTRIBUTED_RANKS}
    for _ in range(rounds):
        for ranks in DISTRIBUTED_RANKS:
            job = launch(ranks, max(1, threads // ranks), config, timeout, mpiexec,
                         worker=DISTRIBUTED_WORKER)
            rounds_by_ranks[ranks].append(_distributed_results(job))
            if progress is not None:
                progress.update()
    results = [r for ranks in DISTRIBUTED_RANKS for r in _merge_rounds(rounds_by_ranks[ranks])]
    _compare_losses(results)
    return results


def _megabytes(count):
    return f"{count / 1e6:.3f}" if count else "0"


def format_distributed_table(results):
    """ms per step (and against P = 1) and MB received per step by kind."""
    from ._precondition_worker import KIND_COLUMNS
    heads = {"gradient allreduce": "grad AR", "curvature allreduce": "curv AR",
             "inverse broadcast": "inv bc", "gradient broadcast": "grad bc", "halo": "halo"}
    lines = [f"{'workload':<9}{'method':<11}{'strategy':<10}{'P':>2}{'ms/step':>9}"
             f"{'vs P=1':>8}" + "".join(f"{heads[k]:>9}" for k in KIND_COLUMNS)
             + f"{'MB total':>10}{'loss diff':>11}"]
    single = {(r.workload, r.method, r.interval): r.ms_per_step for r in results
              if r.ranks == 1}
    for r in results:
        versus = r.ms_per_step / single.get((r.workload, r.method, r.interval), math.nan)
        diff = "" if math.isnan(r.loss_rel_diff) else f"{r.loss_rel_diff:.1e}"
        lines.append(f"{r.workload:<9}{r.label:<11}{r.strategy or '-':<10}{r.ranks:>2}"
                     f"{r.ms_per_step:>9.2f}{versus:>7.2f}x"
                     + "".join(f"{_megabytes(r.bytes_per_step.get(k, 0)):>9}"
                               for k in KIND_COLUMNS)
                     + f"{_megabytes(r.total_bytes):>10}{diff:>11}")
    return "\n".join(lines)


def write_distributed_csv(results, path, threads, repeat):
    from ._precondition_worker import KIND_COLUMNS
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["workload", "method", "interval", "strategy", "ranks",
                         "threads_per_rank", "ms_per_step"]
                        + [f"{k.replace(' ', '_')}_bytes" for k in KIND_COLUMNS]
                        + ["loss_rel_diff", "rounds"])
        for r in results:
            writer.writerow([r.workload, r.method, r.interval, r.strategy or "", r.ranks,
                             r.threads_per_rank, f"{r.ms_per_step:.4f}"]
                            + [f"{r.bytes_per_step.get(k, 0):.0f}" for k in KIND_COLUMNS]
                            + [f"{r.loss_rel_diff:.3e}", repeat])


def write_distributed_plot(results, path, threads, repeat):
    """ms per step of every configuration, P = 1 beside P = 2 under each strategy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure

    configurations = list(dict.fromkeys((r.workload, r.label) for r in results))
    series = {}
    for r in results:
        # SGD shares no preconditioner: its P > 1 step stands under both strategies.
        strategies = [r.strategy] if r.strategy else ([None] if r.ranks == 1 else STRATEGIES)
        for strategy in strategies:
            name = "P=1" if r.ranks == 1 else f"P={r.ranks} {strategy}"
            series.setdefault(name, {})[(r.workload, r.label)] = r.ms_per_step
    figure = Figure(figsize=(max(6.0, 0.9 * len(configurations)), 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    width = 0.8 / len(series)
    for i, (name, times) in enumerate(series.items()):
        axes.bar([p + (i - (len(series) - 1) / 2) * width for p in range(len(configurations))],
                 [times.get(c, math.nan) for c in configurations], width, label=name)
    axes.set_xticks(range(len(configurations)), [f"{w}\n{m}" for w, m in configurations],
                    fontsize=7)
    axes.set_yscale("log")
    axes.set_ylabel("ms per training step")
    axes.set_title(f"Preconditioned steps over MPI ({threads} threads in all, median of "
                   f"{repeat})")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def distributed_heading(threads, repeat, steps):
    """The first line of the ``--distributed`` report: the threads each job ran on, and how
    the figures were taken.

    A P = 2 job runs ``threads // 2`` threads per rank, at least one: with an odd ``threads``
    its total differs from the P = 1 job's, and the line says so rather than claiming equal
    resources for its "vs P=1" column.
    """
    ranks = max(DISTRIBUTED_RANKS)
    per_rank = max(1, threads // ranks)
    total = ranks * per_rank
    if total == threads:
        resources = f"{threads} threads in all (P={ranks}: {per_rank} per rank)"
    else:
        resources = (f"P=1 on {threads} thread{'s' * (threads != 1)}, P={ranks} on {ranks} x "
                     f"{per_rank} = {total} (not the same total: 'vs P=1' compares unequal "
                     f"resources; give --threads a multiple of {ranks})")
    return (f"Preconditioned SGD steps over MPI, {resources}, median of {repeat} round(s) of "
            f"{steps} timed steps ({2 * steps} with an interval of 10); MB received per step "
            "by all ranks")


def run_distributed(args, out):
    """``--distributed``: the P = 1 and P = 2 jobs, their table and outputs."""
    from .distributed import RunError, find_mpiexec
    workloads = args.workload or list(DISTRIBUTED_WORKLOADS)
    unknown = [w for w in workloads if w not in DISTRIBUTED_WORKLOADS]
    mpiexec = find_mpiexec()
    if unknown or mpiexec is None:
        print("error: " + (f"--distributed runs {', '.join(DISTRIBUTED_WORKLOADS)}, not "
                           f"{', '.join(unknown)}" if unknown else
                           "--distributed needs mpiexec (pip install mpi4py mpich)"),
              file=sys.stderr)
        return 2
    total = args.repeat * len(DISTRIBUTED_RANKS)
    try:
        with tqdm(total=total, desc="precondition --distributed", unit="job") as progress:
            timeout = DISTRIBUTED_TIMEOUT if args.timeout is None else args.timeout
            results = measure_distributed(workloads, args.steps, args.repeat, args.threads,
                                          timeout, mpiexec, progress)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(distributed_heading(args.threads, args.repeat, args.steps), file=out)
    print(format_distributed_table(results), file=out)
    write_outputs(args, out, results, write_distributed_csv, write_distributed_plot,
                  args.threads, args.repeat)
    return 0
