"""The ``precondition`` benchmark: time per training step of our gradient makers against ASDL's.

Workloads (float32, the shared thread count, SGD applying the gradients):

- ``mlp``: a 784-256-128-10 ReLU MLP, batch 128;
- ``cnn``: Conv2d(3, 8, 3) - ReLU - Conv2d(8, 16, 3, stride 2) - ReLU - 4x4 average pooling -
  Linear(256, 10), batch 64 of 3x16x16 images;
- ``gcn``: the library's two-layer GCN on Cora (full batch, the loss on the 140 training nodes
  through the placeholder's mask), whose ``conv.lin`` Linear modules ASDL hooks as well.

Methods, each run by ours and by ASDL (``asdfghjkl``) on the same model, data and
configuration: K-FAC with the empirical Fisher, curvature and inverses every step
(``kfac/1``) and every 10 steps (``kfac/10``); Shampoo with ASDL's defaults (statistics and
roots every step, no blocks, no grafting). Jorge (ours only) runs with Shampoo's configuration,
so that the two compare. Plain SGD gives the overhead. Runs are interleaved, ``--repeat``
rounds, medians.

The project's targets (geometric mean over the workloads): K-FAC at least 2x faster per step
than ASDL's (both intervals), Shampoo at least 5x; Jorge's step at least 3x cheaper than our
Shampoo's.
"""
import csv
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

from tqdm import tqdm

from . import geometric_mean, write_outputs

__all__ = ["HELP", "WORKLOADS", "METHODS", "StepResult", "add_arguments", "measure", "run"]

HELP = "gradient preconditioning (K-FAC, Shampoo, Jorge) step time against ASDL's"

WORKLOADS = ("mlp", "cnn", "gcn")
#: (method, curvature interval); ASDL runs all but jorge.
METHODS = (("sgd", 1), ("kfac", 1), ("kfac", 10), ("shampoo", 1), ("jorge", 1))
TARGETS = {"kfac": 2.0, "shampoo": 5.0}
JORGE_TARGET = 3.0


@dataclass(frozen=True)
class StepResult:
    """Milliseconds per step of one workload and method (NaN where a side did not run)."""
    workload: str
    method: str
    interval: int
    ours_ms: float
    asdl_ms: float

    @property
    def speedup(self):
        return self.asdl_ms / self.ours_ms


def add_arguments(parser):
    parser.add_argument("--workload", action="append", choices=WORKLOADS,
                        help="workload to run (repeatable; default: all)")
    parser.add_argument("--steps", type=int, default=10, metavar="N",
                        help="timed steps per run (at least 1; default 10; runs with an "
                             "interval of 10 take 2N)")


def _asdl():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import asdl
    except ImportError:
        return None
    return asdl


def _workload(name):
    """``(make_model, inputs, target, mask)``; ``make_model()`` gives the same weights."""
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
    from .. import datasets
    from ..nn import models, train
    cora = datasets.load("cora")
    x, y, train_mask, *_ = train.node_tensors(cora)

    def make():
        torch.manual_seed(0)
        return models.GCN(x.shape[1], out_channels=cora.num_classes, hidden=16)
    return make, (x, cora.adj), y, train_mask


def _maker(library, method, interval, model, data_size):
    """A gradient maker of ``library`` (our package or the asdl module), or None for SGD."""
    if method == "sgd":
        return None
    if method == "kfac":
        config = library.PreconditioningConfig(data_size=data_size, damping=1e-3,
                                               curvature_upd_interval=interval,
                                               preconditioner_upd_interval=interval)
        return library.KfacGradientMaker(model, config, fisher_type="fisher_emp")
    config = library.PreconditioningConfig(damping=1e-4)
    if method == "shampoo":
        return library.ShampooGradientMaker(model, config)
    return library.JorgeGradientMaker(model, config, grafting=None)


def _ms_per_step(maker, model, inputs, target, mask, warmup, steps):
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
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
        optimizer.step()

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def measure(workload, repeat, steps, asdl, progress=None):
    """The `StepResult` of every method on ``workload``."""
    from .. import precondition as ours

    make, inputs, target, mask = _workload(workload)
    data_size = int(mask.sum()) if mask is not None else target.shape[0]
    sides = [("ours", ours)] + ([("asdl", asdl)] if asdl is not None else [])
    times = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # ASDL's non-full backward hooks
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
                       median.get((method, interval, "asdl"), math.nan))
            for method, interval in METHODS]


def format_table(results):
    lines = [f"{'workload':<10}{'method':<10}{'ours ms':>10}{'ASDL ms':>10}{'ASDL/ours':>11}"
             f"{'vs SGD':>9}"]
    sgd = {r.workload: r.ours_ms for r in results if r.method == "sgd"}
    for r in results:
        label = r.method if r.method in ("sgd", "shampoo", "jorge") else f"{r.method}/{r.interval}"
        ratio = f"{r.speedup:>10.2f}x" if not math.isnan(r.speedup) else f"{'':>11}"
        lines.append(f"{r.workload:<10}{label:<10}{r.ours_ms:>10.2f}"
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
    labels = [f"{r.workload}\n{r.method}" + (f"/{r.interval}" if r.method == "kfac" else "")
              for r in shown]
    axes.set_xticks(list(positions), labels, fontsize=7)
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axes.set_ylabel("ms per training step")
    axes.set_title(f"Preconditioned SGD step, ours vs ASDL ({threads} threads, median of "
                   f"{repeat})")
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
            results += measure(workload, args.repeat, args.steps, asdl, progress)
    print(f"Preconditioned SGD steps, {args.threads} threads, median of {args.repeat} "
          f"interleaved rounds of {args.steps} steps (kfac/10: {2 * args.steps})", file=out)
    print(format_table(results), file=out)
    for line in verdict(results):
        print(line, file=out)
    write_outputs(args, out, results, write_csv, write_plot, args.threads, args.repeat)
    return 0
