"""The ``convergence`` benchmark: epochs and seconds to a target validation accuracy, with and
without gradient preconditioning.

Workloads (float32, the shared thread count):

- ``cora``, ``citeseer``: the library's two-layer GCN (16 hidden, dropout 0.5, weight decay
  5e-4 on the first layer) on the bundled graphs with their features and Kipf and Welling's
  split, full batch (one step per epoch), 200 epochs;
- ``pubmed``: the same GCN on the shared PubMed structure with its real labels and split, but
  seeded standard-normal features 500 wide (the file has no feature matrix), so the accuracy
  is what the graph structure alone allows; 100 epochs;
- ``digits``: scikit-learn's handwritten digits (8x8, 10 classes, standardised), split once
  60/20/20 into training, validation and test, a 64-128-64-10 ReLU MLP, batches of 64 (full
  batches only, reshuffled every epoch), 40 epochs.

Methods, each over a small learning-rate grid (`lr_grid`): Adam; SGD with momentum 0.9;
K-FAC as Martens and Grosse (and ASDL's examples) run it, its preconditioned gradient applied
by SGD with momentum 0.9 over SGD's grid, damping 0.03 (``fit(optimizer="sgd",
preconditioner="kfac")``); and ``kfac-adam``, Shampoo and Jorge through the gradient makers as
``pysparse_hpc.nn.train.fit`` runs them by default, with Adam applying the preconditioned
gradients and the damping of ``train.PRECONDITIONERS``. The optimizers and makers are
``fit``'s own. Every
preconditioner updates its curvature and inverses (or roots) every 10 steps, K-FAC with the
empirical Fisher. Every run of a seed starts from the same weights; the data split never
changes with the seed.

Measured per run, after every epoch: the mean training loss of its steps, the validation and
test accuracy (model in eval mode), and the seconds spent in training steps so far (forward,
backward, preconditioning, optimizer step; the evaluation is not counted).

Definitions:

- the target ``T`` of a workload is Adam's best validation accuracy over its grid: for every
  Adam learning rate the lower median over the seeds of the runs' best validation accuracy,
  and of those the largest; the lower target is ``0.99 T``;
- a run reaches a target at the first epoch (counted from 1) whose validation accuracy is at
  least the target; its seconds to the target are the training seconds up to that epoch's end.
  A grid point's epochs (seconds) to a target are the lower median over its seeds (an observed
  value: at least half the seeds reach the target by then), a seed that never reaches it
  counting as infinite; its best validation accuracy and test accuracy at that epoch are
  lower medians as well;
- each method's headline learning rate is the one of its grid reaching ``T`` in the fewest
  epochs (ties and none reached: fewest epochs to ``0.99 T``, then the higher validation
  accuracy);
- milliseconds per step: training seconds over training steps (the mean, so curvature steps
  are spread over the others), lower median over seeds; every method first runs two untimed
  epochs, so compilation and cold caches are not counted.

The project's targets: K-FAC reaches Adam's best validation accuracy on Cora in at most half
Adam's epochs (each at its headline learning rate; the same comparison at ``0.99 T`` is printed
beside it, and where K-FAC reaches neither, the epochs of both to K-FAC's own best accuracy);
Jorge's step at least 3x cheaper than Shampoo's at equal accuracy: the geometric mean over the
workloads of Shampoo's milliseconds per step over Jorge's, each the median over all the
method's runs (a step's work does not depend on the learning rate), and Jorge's best
validation accuracy over its grid within one point of Shampoo's on every workload.
"""
import csv
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from tqdm import tqdm

from . import counted, geometric_mean, positive_float, positive_int, write_outputs

__all__ = ["HELP", "METHODS", "WORKLOADS", "GridPoint", "Problem", "Run", "add_arguments",
           "load_problem", "lr_grid", "measure", "run", "summarize", "train_run", "verdict"]

HELP = "epochs and seconds to a target validation accuracy: Adam, SGD, K-FAC, Shampoo, Jorge"

WORKLOADS = ("cora", "citeseer", "pubmed", "digits")
METHODS = ("adam", "sgd", "kfac", "kfac-adam", "shampoo", "jorge")
PRECONDITIONED = ("kfac", "kfac-adam", "shampoo", "jorge")
#: Methods whose updates SGD with momentum applies (over SGD's grid); Adam applies the others'.
SGD_APPLIED = ("sgd", "kfac")
#: The ``train.PRECONDITIONERS`` entry of a method whose name is not one.
_FIT_NAMES = {"kfac-adam": "kfac"}

#: Learning rates per method; SGD's depend on the model (row-normalised graph features give
#: small gradients: the GCN needs far larger steps than the MLP on standardised inputs).
_ADAM_GRID = (3e-3, 1e-2, 3e-2)
_SGD_GRIDS = {"gcn": (0.1, 0.3, 1.0), "mlp": (0.01, 0.03, 0.1)}
#: Steps between curvature and preconditioner updates (``fit``'s default).
CURVATURE_INTERVAL = 10
#: Epochs per run and seeds per workload unless ``--epochs`` / ``--seeds`` say otherwise.
DEFAULT_EPOCHS = {"cora": 200, "citeseer": 200, "pubmed": 100, "digits": 40}
DEFAULT_SEEDS = {"cora": 3, "citeseer": 1, "pubmed": 1, "digits": 3}
#: Methods left out unless ``--method`` names them: CiteSeer's 3703 input features make every
#: Shampoo or Jorge refresh a 3703 x 3703 eigendecomposition or a handful of products of that
#: size (seconds on one thread, every 10 steps), and a K-FAC step 10x Adam's, so K-FAC runs
#: there once (SGD-applied).
DEFAULT_SKIPPED = {"citeseer": ("kfac-adam", "shampoo", "jorge")}
#: Epochs of the untimed run of each method before a workload's measured runs.
WARMUP_EPOCHS = 2
PUBMED_FEATURES = 500
DIGITS_BATCH = 64
DIGITS_HIDDEN = (128, 64)

LOWER_TARGET = 0.99
KFAC_EPOCH_RATIO = 0.5
KFAC_WORKLOAD = "cora"
JORGE_TARGET = 3.0
#: Jorge's best validation accuracy may trail Shampoo's by this much and still count as equal.
EQUAL_ACCURACY = 0.01


def lr_grid(method, kind):
    """The learning rates of ``method`` on a model of ``kind`` ("gcn" or "mlp")."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return _SGD_GRIDS[kind] if method in SGD_APPLIED else _ADAM_GRID


@dataclass
class Problem:
    """A model to train and the data to train and judge it on.

    Attributes
    ----------
    name, kind : str
        The workload and its model ("gcn": full batch over a graph, "mlp": minibatches).
    make_model : callable
        ``make_model()`` builds the model (seed torch first for the same weights).
    x, y : torch.Tensor
        Features (all nodes or examples) and int64 labels.
    masks : tuple of torch.Tensor
        Training, validation and test rows (boolean).
    adj : object or None
        The graph the GCN takes, None for the MLP.
    batch_size : int or None
        Rows per step of the MLP (None: full batch).
    weight_decay : float
    epochs, seeds : int
        Defaults of this workload.
    default_methods : tuple of str
        The methods run unless others are asked for.
    note : str
        How the data were made.
    """

    name: str
    kind: str
    make_model: object
    x: object
    y: object
    masks: tuple
    adj: object = None
    batch_size: int = None
    weight_decay: float = 0.0
    epochs: int = 200
    seeds: int = 1
    default_methods: tuple = METHODS
    note: str = ""

    @property
    def data_size(self):
        """Examples one training loss sums over (the preconditioners' ``data_size``)."""
        return self.batch_size if self.batch_size else int(self.masks[0].sum())

    def inputs(self, x):
        return (x,) if self.adj is None else (x, self.adj)

    def batches(self, generator):
        """``(inputs, labels)`` of every training step of one epoch."""
        train = self.masks[0]
        if self.batch_size is None:
            return [(self.inputs(self.x), (train, self.y))]
        import torch
        rows = torch.nonzero(train).flatten()
        order = rows[torch.randperm(rows.numel(), generator=generator)]
        cuts = range(0, order.numel() - self.batch_size + 1, self.batch_size)
        return [(self.inputs(self.x[order[s:s + self.batch_size]]),
                 (None, self.y[order[s:s + self.batch_size]])) for s in cuts]

    def accuracies(self, model):
        """Validation and test accuracy of ``model`` (eval mode, no gradients)."""
        import torch
        model.eval()
        with torch.no_grad():
            predicted = model(*self.inputs(self.x)).argmax(dim=1)
        correct = predicted == self.y
        return tuple(float(correct[mask].float().mean()) for mask in self.masks[1:])


def _gcn_problem(name, data, x, epochs_seeds, note=""):
    from ..nn import models, train

    _, y, *masks = train.node_tensors(data)

    def make_model():
        return models.GCN(x.shape[1], out_channels=data.num_classes, **models.GCN.architecture)
    return Problem(name, "gcn", make_model, x, y, tuple(masks), adj=data.adj,
                   weight_decay=models.GCN.training["weight_decay"], note=note,
                   epochs=epochs_seeds[0], seeds=epochs_seeds[1])


def _digits_problem(epochs_seeds):
    import torch
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the digits workload needs scikit-learn: pip install scikit-learn "
                          "(or pysparse_hpc[bench])") from None
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_train, n_val = int(0.6 * len(y)), int(0.2 * len(y))
    masks = [torch.zeros(len(y), dtype=torch.bool) for _ in range(3)]
    masks[0][order[:n_train]] = True
    masks[1][order[n_train:n_train + n_val]] = True
    masks[2][order[n_train + n_val:]] = True
    mean, std = x[masks[0]].mean(0), x[masks[0]].std(0).clamp_min(1e-3)
    x = (x - mean) / std
    sizes = (x.shape[1],) + DIGITS_HIDDEN

    def make_model():
        layers = []
        for width_in, width_out in zip(sizes, sizes[1:]):
            layers += [torch.nn.Linear(width_in, width_out), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], 10))
    return Problem("digits", "mlp", make_model, x, y, tuple(masks), batch_size=DIGITS_BATCH,
                   epochs=epochs_seeds[0], seeds=epochs_seeds[1],
                   note=f"scikit-learn digits, {n_train}/{n_val}/{len(y) - n_train - n_val} "
                        "split")


def load_problem(name, data_dir=None, epochs=None, seeds=None):
    """The `Problem` of a workload in `WORKLOADS`.

    Parameters
    ----------
    name : str
    data_dir : path-like, optional
        The shared data directory (PubMed's structure); default: the bench's.
    epochs, seeds : int, optional
        Override the workload's defaults (`DEFAULT_EPOCHS`, `DEFAULT_SEEDS`).

    Raises
    ------
    ValueError
        An unknown workload.
    FileNotFoundError
        PubMed's structure is not in ``data_dir``.
    ImportError
        scikit-learn is missing (``digits``).
    """
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {name!r}")
    epochs_seeds = (epochs or DEFAULT_EPOCHS[name], seeds or DEFAULT_SEEDS[name])
    if name == "digits":
        return _digits_problem(epochs_seeds)
    problem = _graph_problem(name, data_dir, epochs_seeds)
    problem.default_methods = tuple(m for m in METHODS if m not in DEFAULT_SKIPPED.get(name, ()))
    return problem


def _graph_problem(name, data_dir, epochs_seeds):
    from .. import datasets
    if name == "pubmed":
        import torch
        from ._data import find_graph
        path = find_graph("pubmed", data_dir).path
        data = datasets.load_file(path, random_features=PUBMED_FEATURES, seed=0, name="pubmed")
        return _gcn_problem(name, data, torch.from_numpy(data.x), epochs_seeds,
                            note=f"real structure, labels and split; standard-normal features "
                                 f"({PUBMED_FEATURES} wide, seed 0)")
    from ..nn.train import node_tensors
    data = datasets.load(name)
    return _gcn_problem(name, data, node_tensors(data)[0], epochs_seeds)


@dataclass
class Run:
    """One training run: per-epoch curves of one method, learning rate and seed.

    Attributes
    ----------
    workload, method : str
    lr : float
    seed : int
    losses, val_accuracy, test_accuracy, seconds : list of float
        After every epoch: mean training loss of its steps, accuracies, training seconds so far.
    steps : int
        Training steps run.
    """

    workload: str
    method: str
    lr: float
    seed: int
    losses: list = field(default_factory=list)
    val_accuracy: list = field(default_factory=list)
    test_accuracy: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    steps: int = 0

    @property
    def best_epoch(self):
        """Index of the first epoch with the best validation accuracy."""
        return int(np.argmax(self.val_accuracy))

    @property
    def best_val(self):
        return self.val_accuracy[self.best_epoch]

    @property
    def test_at_best(self):
        return self.test_accuracy[self.best_epoch]

    @property
    def ms_per_step(self):
        return 1e3 * self.seconds[-1] / self.steps if self.steps else math.nan

    def epochs_to(self, target):
        """Epochs (from 1) until the validation accuracy first reaches ``target``; inf if
        never."""
        reached = np.flatnonzero(np.asarray(self.val_accuracy) >= target - 1e-12)
        return int(reached[0]) + 1 if reached.size else math.inf

    def seconds_to(self, target):
        """Training seconds until the validation accuracy first reaches ``target``; inf if
        never."""
        epochs = self.epochs_to(target)
        return self.seconds[epochs - 1] if epochs != math.inf else math.inf


def _optimizer(method, model, lr, weight_decay):
    """``fit``'s optimizer for ``method``: SGD with momentum or Adam."""
    from ..nn import train
    return train._optimizer("sgd" if method in SGD_APPLIED else "adam",
                            train.param_groups(model, weight_decay), lr, None, "none", None,
                            None)


def _maker(method, model, data_size, damping=None, kl_clip=None, optimizer=None):
    """``fit``'s gradient maker for ``method`` (None for Adam and SGD), with the damping
    ``fit`` takes under the optimizer applying it (K-FAC's 0.03 under SGD, as chosen on
    Cora's seeds 0-2 among 0.01, 0.03 and 0.1 and checked on seeds 3-9, BENCHMARKS.md);
    ``damping``: in place of it; ``kl_clip``: K-FAC's bound on each step at ``optimizer``'s
    learning rate (the other methods ignore it)."""
    if method not in PRECONDITIONED:
        return None
    from ..nn import train
    name = _FIT_NAMES.get(method, method)
    return train._preconditioner(name, model, None, data_size, CURVATURE_INTERVAL,
                                 "sgd" if method in SGD_APPLIED else "adam", damping,
                                 kl_clip if name == "kfac" else None, optimizer)


def _step(model, maker, optimizer, inputs, labels, loss_fn):
    """One training step; returns the loss tensor."""
    mask, y = labels
    optimizer.zero_grad()
    if maker is None:
        logits = model(*inputs)
        loss = loss_fn(logits if mask is None else logits[mask], y if mask is None else y[mask])
        loss.backward()
    else:
        placeholder = maker.setup_model_call(model, *inputs)
        if mask is None:
            maker.setup_loss_call(loss_fn, placeholder, y)
        else:
            maker.setup_loss_call(loss_fn, placeholder[mask], y[mask])
        _, loss = maker.forward_and_backward()
    optimizer.step()
    return loss


def train_run(problem, method, lr, seed, epochs=None, damping=None, kl_clip=None):
    """Train ``problem``'s model with ``method`` at learning rate ``lr`` from seed ``seed``.

    Parameters
    ----------
    problem : Problem
    method : str
        One of `METHODS`.
    lr : float
    seed : int
        Seeds the weights, the dropout masks and the batch order.
    epochs : int, optional
        Default: the problem's.
    damping : float, optional
        The preconditioners' damping; default: ``fit``'s under the optimizer applying it.
    kl_clip : float, optional
        K-FAC's bound on each step (``fit``'s ``kl_clip``); default: off.

    Returns
    -------
    Run
    """
    import torch

    from ..nn import train
    torch.manual_seed(seed)
    model = problem.make_model()
    optimizer = _optimizer(method, model, lr, problem.weight_decay)
    maker = _maker(method, model, problem.data_size, damping, kl_clip, optimizer)
    loss_fn = partial(train._summed_cross_entropy, count=float(problem.data_size))
    generator = torch.Generator().manual_seed(seed)
    result = Run(problem.name, method, lr, seed)
    elapsed = 0.0
    for _ in range(epochs or problem.epochs):
        model.train()
        losses = []
        for inputs, labels in problem.batches(generator):
            start = time.perf_counter()
            loss = _step(model, maker, optimizer, inputs, labels, loss_fn)
            elapsed += time.perf_counter() - start
            losses.append(float(loss.detach()))
        result.steps += len(losses)
        result.losses.append(statistics.fmean(losses))
        result.seconds.append(elapsed)
        val, test = problem.accuracies(model)
        result.val_accuracy.append(val)
        result.test_accuracy.append(test)
    return result


def measure(problem, methods=METHODS, epochs=None, seeds=None, progress=None, damping=None,
            kl_clip=None):
    """Every run of ``problem``: each method, learning rate of its grid and seed.

    Parameters
    ----------
    problem : Problem
    methods : sequence of str
        Must include "adam" for the targets.
    epochs, seeds : int, optional
        Default: the problem's.
    progress : tqdm, optional
        Advanced by one per run.
    damping : float, optional
        The preconditioners' damping; default: ``fit``'s.
    kl_clip : float, optional
        K-FAC's bound on each step; default: off.

    Returns
    -------
    list of Run
    """
    for method in methods:   # untimed: kernels compile and caches fill before any clock runs
        train_run(problem, method, lr_grid(method, problem.kind)[0], 0, WARMUP_EPOCHS, damping,
                  kl_clip)
    runs = []
    for seed in range(seeds or problem.seeds):
        for method in methods:
            for lr in lr_grid(method, problem.kind):
                runs.append(train_run(problem, method, lr, seed, epochs, damping, kl_clip))
                if progress is not None:
                    progress.update()
    return runs


@dataclass(frozen=True)
class GridPoint:
    """One method and learning rate on one workload, medians over its seeds.

    ``epochs_to_target`` and the like are inf where the median seed does not reach it.
    """

    workload: str
    method: str
    lr: float
    seeds: int
    best_val: float
    test_at_best: float
    epochs_to_target: float
    seconds_to_target: float
    epochs_to_lower: float
    seconds_to_lower: float
    ms_per_step: float

    @property
    def speed_key(self):
        """Orders the grid: fewest epochs to the target, then to the lower one, then the best
        validation accuracy."""
        return (self.epochs_to_target, self.epochs_to_lower, -self.best_val)


@dataclass
class Study:
    """What `summarize` finds on one workload, and the runs it comes from."""

    workload: str
    target: float
    lower_target: float
    grid: list
    headline: dict
    runs: list = field(default_factory=list, repr=False)

    def best_accuracy(self, method):
        """``method``'s best validation accuracy over its grid (lower median over seeds)."""
        return max(p.best_val for p in self.grid if p.method == method)

    def step_ms(self, method):
        """Median milliseconds per step over all of ``method``'s runs (the learning rate does
        not change the work of a step; all the runs average out the machine's noise)."""
        return float(statistics.median(r.ms_per_step for r in self.runs if r.method == method))

    def fastest(self, method, level):
        """``(epochs, lr)``: the fewest epochs (lower median over seeds) in which a learning
        rate of ``method`` reaches validation accuracy ``level``; ``(inf, None)`` if none
        does."""
        by_lr = {}
        for r in self.runs:
            if r.method == method:
                by_lr.setdefault(r.lr, []).append(r.epochs_to(level))
        return min(((statistics.median_low(epochs), lr) for lr, epochs in by_lr.items()),
                   default=(math.inf, None))


def summarize(runs):
    """The `Study` of every workload in ``runs`` (which must include Adam's runs), in order.

    Returns
    -------
    list of Study
    """
    by_workload = {}
    for r in runs:
        by_workload.setdefault(r.workload, []).append(r)
    studies = []
    for workload, group in by_workload.items():
        points = {}
        for r in group:
            points.setdefault((r.method, r.lr), []).append(r)
        adam = [statistics.median_low(r.best_val for r in same)
                for (method, _), same in points.items() if method == "adam"]
        if not adam:
            raise ValueError(f"{workload}: no Adam run, so no target")
        target = max(adam)
        lower = LOWER_TARGET * target
        grid = [_grid_point(workload, method, lr, same, target, lower)
                for (method, lr), same in points.items()]
        headline = {}
        for point in grid:
            if point.method not in headline or point.speed_key < headline[point.method].speed_key:
                headline[point.method] = point
        studies.append(Study(workload, target, lower, grid, headline, group))
    return studies


def _grid_point(workload, method, lr, runs, target, lower):
    def median(values):
        return float(statistics.median_low(values))
    return GridPoint(workload, method, lr, len(runs), median(r.best_val for r in runs),
                     median(r.test_at_best for r in runs),
                     median(r.epochs_to(target) for r in runs),
                     median(r.seconds_to(target) for r in runs),
                     median(r.epochs_to(lower) for r in runs),
                     median(r.seconds_to(lower) for r in runs),
                     median(r.ms_per_step for r in runs))


def _count(value, digits=0):
    return "-" if math.isinf(value) else f"{value:.{digits}f}"


def format_table(studies, grid=False):
    """The headline row of every method per workload (``grid=True``: every learning rate)."""
    lines = [f"{'workload':<10}{'method':<11}{'lr':>7}{'best val':>10}{'test':>8}"
             f"{'ep->T':>7}{'s->T':>8}{'ep->.99T':>9}{'s->.99T':>9}{'ms/step':>9}"]
    for study in studies:
        lines.append(f"{study.workload}: target T = {100 * study.target:.1f}% (Adam's best), "
                     f".99T = {100 * study.lower_target:.1f}%")
        points = study.grid if grid else list(study.headline.values())
        for p in points:
            lines.append(f"{'':<10}{p.method:<11}{p.lr:>7g}{100 * p.best_val:>9.1f}%"
                         f"{100 * p.test_at_best:>7.1f}%{_count(p.epochs_to_target):>7}"
                         f"{_count(p.seconds_to_target, 2):>8}{_count(p.epochs_to_lower):>9}"
                         f"{_count(p.seconds_to_lower, 2):>9}{p.ms_per_step:>9.2f}")
    return "\n".join(lines)


def _kfac_lines(study):
    adam, kfac = study.headline.get("adam"), study.headline.get("kfac")
    if kfac is None:
        return [f"target: K-FAC in <= {KFAC_EPOCH_RATIO:g}x Adam's epochs to T on "
                f"{study.workload}: not measured (run with --method kfac)"]
    lines = []
    for label, attribute, level in (("T", "epochs_to_target", study.target),
                                    (".99T", "epochs_to_lower", study.lower_target)):
        mine, peer = getattr(kfac, attribute), getattr(adam, attribute)
        prefix = ("target" if label == "T" else "  same at .99T") + \
            f": K-FAC reaches {label} = {100 * level:.1f}% on {study.workload} in <= " \
            f"{KFAC_EPOCH_RATIO:g}x Adam's epochs: "
        if math.isinf(mine):
            lines.append(prefix + f"K-FAC never does (best val {100 * kfac.best_val:.1f}% at "
                         f"lr {kfac.lr:g}; Adam in {_count(peer)} epochs at lr {adam.lr:g}), "
                         "NOT MET")
            continue
        ratio = mine / peer
        lines.append(prefix + f"{mine:.0f} epochs (lr {kfac.lr:g}) against Adam's {peer:.0f} "
                     f"(lr {adam.lr:g}), {ratio:.2f}x, "
                     f"{'MET' if ratio <= KFAC_EPOCH_RATIO else 'NOT MET'}")
    if math.isinf(kfac.epochs_to_target):
        lines.append(_kfac_limit(study))
    return lines


def _kfac_limit(study):
    """What K-FAC does reach, against Adam: the epochs of each to K-FAC's best accuracy."""
    level = study.best_accuracy("kfac")
    (mine, mine_lr), (peer, peer_lr) = (study.fastest(m, level) for m in ("kfac", "adam"))
    text = (f"  limit: K-FAC's best validation accuracy is {100 * level:.1f}%; to reach it K-FAC "
            f"takes {_count(mine)} epochs (lr {mine_lr:g})")
    if math.isinf(peer):
        return text + ", Adam never does"
    return text + f", Adam {peer:.0f} (lr {peer_lr:g}): {mine / peer:.2f}x"


def _jorge_lines(studies):
    both = [s for s in studies if "shampoo" in s.headline and "jorge" in s.headline]
    if not both:
        return [f"target: Jorge's step >= {JORGE_TARGET:g}x cheaper than Shampoo's: not "
                "measured (run with --method shampoo --method jorge)"]
    ratios = [s.step_ms("shampoo") / s.step_ms("jorge") for s in both]
    accuracies = [(s.best_accuracy("jorge"), s.best_accuracy("shampoo")) for s in both]
    equal = [jorge >= shampoo - EQUAL_ACCURACY for jorge, shampoo in accuracies]
    mean = geometric_mean(ratios)
    details = ", ".join(f"{s.workload} {r:.2f}x (val {100 * j:.1f}% vs {100 * sh:.1f}%)"
                        for s, r, (j, sh) in zip(both, ratios, accuracies))
    met = mean >= JORGE_TARGET and all(equal)
    why = "" if all(equal) else "; accuracy not equal on " + ", ".join(
        s.workload for s, same in zip(both, equal) if not same)
    return [f"target: Jorge's step >= {JORGE_TARGET:g}x cheaper than Shampoo's at equal "
            f"accuracy (geo-mean of {len(both)}): {mean:.2f}x [{details}]{why}, "
            f"{'MET' if met else 'NOT MET'}"]


def verdict(studies):
    """The lines judging the project's targets (MET / NOT MET with the figures)."""
    cora = [s for s in studies if s.workload == KFAC_WORKLOAD]
    lines = (_kfac_lines(cora[0]) if cora else
             [f"target: K-FAC in <= {KFAC_EPOCH_RATIO:g}x Adam's epochs on {KFAC_WORKLOAD}: "
              f"not measured (run with --workload {KFAC_WORKLOAD})"])
    return lines + _jorge_lines(studies)


CSV_COLUMNS = ("workload", "method", "lr", "seeds", "headline", "target", "lower_target",
               "best_val", "test_at_best", "epochs_to_target", "seconds_to_target",
               "epochs_to_lower", "seconds_to_lower", "ms_per_step", "threads")


def write_csv(studies, path, threads, runs):
    """Every grid point (``inf``: target not reached)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for study in studies:
            for p in study.grid:
                writer.writerow([p.workload, p.method, p.lr, p.seeds,
                                 int(study.headline[p.method] is p), f"{study.target:.4f}",
                                 f"{study.lower_target:.4f}", f"{p.best_val:.4f}",
                                 f"{p.test_at_best:.4f}", p.epochs_to_target,
                                 f"{p.seconds_to_target:.3f}", p.epochs_to_lower,
                                 f"{p.seconds_to_lower:.3f}", f"{p.ms_per_step:.4f}", threads])


def write_plot(studies, path, threads, runs):
    """Per workload: training loss against epochs and against seconds, and validation accuracy
    against epochs, of every method at its headline learning rate (seed 0)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 3.4 * len(studies)))
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(studies), 3, squeeze=False)
    for row, study in zip(panels, studies):
        for method, point in study.headline.items():
            curve = next(r for r in runs if r.workload == study.workload and r.method == method
                         and r.lr == point.lr and r.seed == 0)
            epochs = range(1, len(curve.losses) + 1)
            label = f"{method} (lr {point.lr:g})"
            row[0].plot(epochs, curve.losses, label=label)
            row[1].plot(curve.seconds, curve.losses, label=label)
            row[2].plot(epochs, [100 * v for v in curve.val_accuracy], label=label)
        for axes, xlabel in zip(row, ("epoch", "training seconds", "epoch")):
            axes.set_xlabel(xlabel)
        for axes in row[:2]:
            axes.set_yscale("log")
            axes.set_ylabel("training loss")
        row[2].axhline(100 * study.target, color="grey", linestyle="--", linewidth=0.8)
        row[2].axhline(100 * study.lower_target, color="grey", linestyle=":", linewidth=0.8)
        row[2].set_ylim(max(0.0, 100 * study.target - 25), 100)
        row[2].set_ylabel("validation accuracy (%)")
        row[0].set_title(f"{study.workload}: loss against epochs")
        row[1].set_title(f"{study.workload}: loss against seconds")
        row[2].set_title(f"{study.workload}: validation (T dashed, .99T dotted)")
        row[2].legend(fontsize=7)
    figure.suptitle(f"Convergence at each method's headline learning rate, seed 0, {threads} "
                    "threads")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def add_arguments(parser):
    parser.add_argument("--workload", action="append", choices=WORKLOADS,
                        help="workload to run (repeatable; default: all)")
    parser.add_argument("--method", action="append", choices=METHODS,
                        help="method to run (repeatable; default: all, except Shampoo and "
                             "Jorge on citeseer; Adam always runs, it sets the target)")
    parser.add_argument("--epochs", type=positive_int, metavar="N",
                        help="epochs of every run (default: " + ", ".join(
                            f"{epochs} on {name}" for name, epochs in DEFAULT_EPOCHS.items())
                        + ")")
    parser.add_argument("--seeds", type=positive_int, metavar="N",
                        help="seeds of every grid point (default: " + ", ".join(
                            f"{seeds} on {name}" for name, seeds in DEFAULT_SEEDS.items())
                        + ")")
    parser.add_argument("--grid", action="store_true",
                        help="also print every learning rate's row")
    parser.add_argument("--damping", type=positive_float, metavar="D",
                        help="damping of K-FAC, Shampoo and Jorge (default: 0.03 for "
                             "kfac, applied by SGD; the training command's, "
                             "pysparse_hpc.nn.train.PRECONDITIONERS, for the others)")
    parser.add_argument("--kl-clip", type=positive_float, metavar="C",
                        help="bound each K-FAC step (kfac, kfac-adam) by KAISA's KL clipping "
                             "at C (default: off)")


def run(args, out=None):
    """Run the benchmark and report (to ``out``, default standard output); returns the exit
    status."""
    out = sys.stdout if out is None else out
    import torch
    torch.set_num_threads(args.threads)
    try:
        problems = [load_problem(name, args.data_dir, args.epochs, args.seeds)
                    for name in args.workload or WORKLOADS]
    except (FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    methods = {p.name: ["adam"] + [m for m in (args.method or p.default_methods) if m != "adam"]
               for p in problems}
    running = {m for names in methods.values() for m in names}
    # An option that no selected method reads would read, in the report, as if it had been
    # applied.
    for option, value, readers in (("--damping", args.damping, PRECONDITIONED),
                                   ("--kl-clip", args.kl_clip, ("kfac", "kfac-adam"))):
        if value is not None and not running & set(readers):
            print(f"error: {option} applies to {', '.join(readers)}, none of which runs "
                  f"(methods: {', '.join(sorted(running))})", file=sys.stderr)
            return 2
    total = sum(p.seeds * sum(len(lr_grid(m, p.kind)) for m in methods[p.name])
                for p in problems)
    runs = []
    with tqdm(total=total, desc="convergence", unit="run") as progress:
        for problem in problems:
            progress.set_postfix_str(problem.name)
            runs += measure(problem, methods[problem.name], progress=progress,
                            damping=args.damping, kl_clip=args.kl_clip)
    studies = summarize(runs)
    print(f"Convergence to a target validation accuracy, {counted(args.threads, 'thread')}; "
          "medians over seeds; each method at its headline learning rate (fewest epochs to T)",
          file=out)
    for problem in problems:
        print(f"  {problem.name}: {problem.epochs} epochs, {problem.seeds} seed(s), "
              f"{', '.join(methods[problem.name])}"
              + (f"; preconditioner damping {args.damping:g}" if args.damping else "")
              + (f"; K-FAC KL clip {args.kl_clip:g}" if args.kl_clip else "")
              + (f"; {problem.note}" if problem.note else ""), file=out)
    print(format_table(studies, grid=args.grid), file=out)
    for line in verdict(studies):
        print(line, file=out)
    write_outputs(args, out, studies, write_csv, write_plot, args.threads, runs)
    return 0
