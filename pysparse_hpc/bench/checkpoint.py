"""The ``checkpoint`` benchmark: what saving a checkpoint costs training, and its throughput.

States (float32 parameters with Adam's two moments and step counts, and torch's RNG state):

- ``gcn``: the library's two-layer GCN for Cora (1433-16-7), well under 1 MB;
- ``mlp``: a 784-2048-2048-10 MLP, about 70 MB;
- ``large``: ``--megabytes`` of 16 MB tensors (a third parameters, two thirds moments).

Each round, interleaved so that the machine's drifting load affects every measurement alike:
a synchronous save (``Checkpointer.save(blocking=True)``: written, fsync'd and committed on
return); an asynchronous save, then ``--steps`` training-like steps (float32 matrix products)
while its files are written; once they are, the next asynchronous save, timed until
``save()`` returns: the training stall of a save in a training loop (the gather that commits
the previous save, and the in-memory copy); the same steps without a save; ``torch.save`` of
the same state to a new file on the same disk (flushed and fsync'd, as ours is; the previous
round's file is deleted before the clock starts, as ours deletes its old checkpoints in the
background, outside the timed calls); our verified ``load()``;
``torch.load(weights_only=True)``. Ours hashes on the ``--threads`` threads torch runs on.
Every measurement starts with no background work left. A warm-up round first (it allocates
the staging buffer), then ``--repeat`` rounds, medians.

The project's target: the training stall of an asynchronous save at most 1/5 of the
synchronous save of the same state. Throughputs are reported against torch's, measured in the
same run.
"""
import csv
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from tqdm import tqdm

from .._sputils import physical_memory
from . import counted, positive_int, write_outputs

__all__ = ["HELP", "STATES", "TARGET_STALL", "CheckpointResult", "add_arguments", "make_state",
           "measure", "run"]

HELP = "checkpoint saving: the training stall of an asynchronous save, throughput vs torch.save"

STATES = ("gcn", "mlp", "large")
TARGET_STALL = 0.2
#: Size of the ``large`` state unless ``--megabytes`` says otherwise.
LARGE_MEGABYTES = 200
_STEP_SIZE = 512   # the training-like step: a 512 x 512 float32 matrix product
_FIELDS = ("sync_save", "async_stall", "steps_alone", "steps_during_save",
           "torch_save", "load", "torch_load")


@dataclass(frozen=True)
class CheckpointResult:
    """Median seconds of each measurement for one state."""
    state: str
    megabytes: float
    sync_save: float
    async_stall: float
    steps_alone: float
    steps_during_save: float
    torch_save: float
    load: float
    torch_load: float

    @property
    def stall_ratio(self):
        """The asynchronous save's stall as a fraction of the synchronous save."""
        return self.async_stall / self.sync_save

    @property
    def step_slowdown(self):
        """Time of the training steps run during the write over the same steps alone."""
        return self.steps_during_save / self.steps_alone

    @property
    def save_ratio(self):
        """Our save throughput over ``torch.save``'s."""
        return self.torch_save / self.sync_save

    @property
    def load_ratio(self):
        """Our (verified) load throughput over ``torch.load``'s."""
        return self.torch_load / self.load


def add_arguments(parser):
    parser.add_argument("--state", action="append", choices=STATES,
                        help="state to save (repeatable; default: all)")
    # None, not the default: given without the large state it must be refused, not ignored
    parser.add_argument("--megabytes", type=positive_int, metavar="MB",
                        help=f"size of the large state (default: {LARGE_MEGABYTES})")
    parser.add_argument("--steps", type=positive_int, default=5, metavar="N",
                        help="training-like steps run during each asynchronous save (default: 5)")
    parser.add_argument("--dir", metavar="DIR",
                        help="directory on the disk to measure (default: the system's temporary "
                             "directory); a temporary folder in it is removed afterwards")


def make_state(name, megabytes=200):
    """A training state: ``{"model": state_dict, "optimizer": state_dict, "rng": tensor}``."""
    import torch

    torch.manual_seed(0)
    if name == "large":
        count = max(1, round(megabytes * 1e6 / 3 / (16 << 20)))
        elements = max(1, round(megabytes * 1e6 / 3 / 4 / count))
        model = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(elements))
                                       for _ in range(count))
    elif name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                                    torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                    torch.nn.Linear(2048, 10))
    elif name == "gcn":
        from ..nn.models import GCN
        model = GCN(1433, 16, 7)
    else:
        raise ValueError(f"state must be one of {STATES}, got {name!r}")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()   # Adam's moments exist from the first step on
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state()}


def _state_bytes(state):
    import torch
    total = 0
    stack = [state]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return total


def _torch_save(state, path):
    import torch
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


def measure(name, megabytes=200, repeat=5, steps=5, directory=None, progress=None,
            threads=None):
    """Median times of saving and loading the state ``name`` (see the module docstring).

    Parameters
    ----------
    name : str
        One of `STATES`.
    megabytes : int, default 200
        Size of the ``large`` state.
    repeat, steps : int
        Timed rounds (after one warm-up round), and training-like steps per asynchronous save.
    directory : path-like, optional
        Where the temporary folder of the files goes (default: the system's).
    progress : tqdm, optional
        Advanced by one per round.
    threads : int, optional
        Threads our checkpointer hashes with in blocking saves and loads: those torch runs on
        (the command passes ``--threads``); default the checkpointer's own (the CPUs).

    Returns
    -------
    CheckpointResult
    """
    import torch

    from ..distributed import Checkpointer, Communicator

    state = make_state(name, megabytes)
    a, b = torch.randn(_STEP_SIZE, _STEP_SIZE), torch.randn(_STEP_SIZE, _STEP_SIZE)
    c = torch.empty(_STEP_SIZE, _STEP_SIZE)

    def train_steps():
        start = time.perf_counter()
        for _ in range(steps):
            torch.mm(a, b, out=c)
        return time.perf_counter() - start

    samples = {f: [] for f in _FIELDS}

    def settle():   # no background work (writes, deletions) in the next measurement
        while checkpoints.writing:
            time.sleep(0.001)
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-", dir=directory) as root:
        checkpoints = Checkpointer(os.path.join(root, "checkpoints"), comm=Communicator(None),
                                   keep=1, threads=threads)
        torch_path = os.path.join(root, "torch.pt")
        step = 0
        for round_ in range(repeat + 1):   # round 0 warms up: staging buffer, page cache
            times = {}
            settle()
            start = time.perf_counter()
            checkpoints.save(step, state, blocking=True)
            times["sync_save"] = time.perf_counter() - start
            settle()
            checkpoints.save(step + 1, state)
            times["steps_during_save"] = train_steps()
            settle()
            start = time.perf_counter()
            checkpoints.save(step + 2, state)
            times["async_stall"] = time.perf_counter() - start
            checkpoints.wait()
            settle()
            times["steps_alone"] = train_steps()
            step += 3
            # A new file, as each of our saves writes a new directory: truncating the last
            # round's file would charge torch.save the freeing of its blocks, which ours does
            # in the background and never inside a timed call.
            if os.path.exists(torch_path):
                os.remove(torch_path)
            start = time.perf_counter()
            _torch_save(state, torch_path)
            times["torch_save"] = time.perf_counter() - start
            settle()
            start = time.perf_counter()
            loaded = checkpoints.load()
            times["load"] = time.perf_counter() - start
            del loaded
            start = time.perf_counter()
            loaded = torch.load(torch_path, weights_only=True)
            times["torch_load"] = time.perf_counter() - start
            del loaded
            if round_:
                for f in _FIELDS:
                    samples[f].append(times[f])
            if progress is not None:
                progress.update()
        checkpoints.close()
    return CheckpointResult(name, _state_bytes(state) / 1e6,
                            **{f: statistics.median(v) for f, v in samples.items()})


def format_table(results):
    lines = [f"{'state':<7}{'MB':>8}{'sync s':>9}{'async stall s':>14}{'stall/sync':>11}"
             f"{'steps slowdown':>15}{'save MB/s':>10}{'torch':>8}{'ratio':>7}"
             f"{'load MB/s':>10}{'torch':>8}{'ratio':>7}"]
    for r in results:
        mb = r.megabytes
        lines.append(f"{r.state:<7}{mb:>8.1f}{r.sync_save:>9.3f}{r.async_stall:>14.4f}"
                     f"{r.stall_ratio:>11.3f}{r.step_slowdown:>14.2f}x"
                     f"{mb / r.sync_save:>10.0f}{mb / r.torch_save:>8.0f}{r.save_ratio:>6.2f}x"
                     f"{mb / r.load:>10.0f}{mb / r.torch_load:>8.0f}{r.load_ratio:>6.2f}x")
    return "\n".join(lines)


def verdict(results):
    worst = max(results, key=lambda r: r.stall_ratio)
    state = "MET" if worst.stall_ratio <= TARGET_STALL else "NOT MET"
    return [f"target: an asynchronous save stalls training at most "
            f"1/{1 / TARGET_STALL:g} of a synchronous save: worst {worst.stall_ratio:.3f} "
            f"({worst.state}), {state}"]


def write_csv(results, path, threads, repeat):
    fields = _FIELDS
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["state", "megabytes", *(f"{f}_seconds" for f in fields), "stall_ratio",
                         "save_ratio", "load_ratio", "threads", "repeat"])
        for r in results:
            writer.writerow([r.state, f"{r.megabytes:.3f}",
                             *(f"{getattr(r, f):.6f}" for f in fields),
                             f"{r.stall_ratio:.4f}", f"{r.save_ratio:.4f}", f"{r.load_ratio:.4f}",
                             threads, repeat])


def write_plot(results, path, threads, repeat):
    """Per state: synchronous save, asynchronous stall, torch.save, load, torch.load (log)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    bars = (("sync_save", "sync save"), ("async_stall", "async stall"),
            ("torch_save", "torch.save"), ("load", "load"), ("torch_load", "torch.load"))
    figure = Figure(figsize=(max(6.0, 2.5 * len(results)), 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    width = 0.8 / len(bars)
    for i, (attribute, label) in enumerate(bars):
        axes.bar([p + (i - (len(bars) - 1) / 2) * width for p in range(len(results))],
                 [getattr(r, attribute) for r in results], width, label=label)
    axes.set_xticks(range(len(results)), [f"{r.state}\n{r.megabytes:.1f} MB" for r in results])
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axes.set_ylabel("seconds")
    axes.set_title(f"checkpoint save and load ({threads} threads, median of {repeat})")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _large_state_problem(megabytes, directory):
    """Why a large state of ``megabytes`` cannot be measured here (None when it can): it is
    held in memory and written to ``directory``; found now, not after the allocations have
    slowed the machine to a crawl or the disk has filled mid-run."""
    size = megabytes * 1e6
    memory = physical_memory()
    if memory is not None:
        if size > memory:
            return (f"a {megabytes} MB state does not fit in this machine's "
                    f"{memory / 1e6:.0f} MB of memory")
    free = shutil.disk_usage(directory).free
    if size > free:
        return f"a {megabytes} MB state does not fit in the {free / 1e6:.0f} MB free in {directory}"
    return None


def run(args, out=None):
    """Run the benchmark and report (to ``out``, default standard output); returns the exit
    status."""
    out = sys.stdout if out is None else out
    if args.dir is not None and not os.path.isdir(args.dir):
        print(f"error: --dir: {args.dir} is not a directory", file=sys.stderr)
        return 2
    if args.dir is not None:
        try:  # the rounds write their checkpoints there: fail now, not mid-run
            with tempfile.TemporaryDirectory(dir=args.dir):
                pass
        except OSError as exc:
            print(f"error: --dir: cannot write in {args.dir} ({exc.strerror or exc})",
                  file=sys.stderr)
            return 2
    states = args.state or list(STATES)
    if args.megabytes is not None and "large" not in states:
        # The other states have the sizes of their models.
        print(f"error: --megabytes sizes the large state, and the states run are "
              f"{', '.join(dict.fromkeys(states))}: add --state large, or leave out --megabytes",
              file=sys.stderr)
        return 2
    megabytes = LARGE_MEGABYTES if args.megabytes is None else args.megabytes
    if "large" in states:
        problem = _large_state_problem(megabytes, args.dir or tempfile.gettempdir())
        if problem:
            print(f"error: --megabytes: {problem}", file=sys.stderr)
            return 2
    import torch
    torch.set_num_threads(args.threads)
    results = []
    with tqdm(total=len(states) * (args.repeat + 1), desc="checkpoint", unit="round") as progress:
        for name in states:
            progress.set_postfix_str(name)
            results.append(measure(name, megabytes, args.repeat, args.steps, args.dir,
                                   progress, threads=args.threads))
    where = args.dir or tempfile.gettempdir()
    print(f"Checkpoints in {where}, {counted(args.threads, 'thread')}, median of {args.repeat} "
          f"interleaved rounds; {args.steps} steps of a {_STEP_SIZE}x{_STEP_SIZE} product "
          "during each asynchronous save", file=out)
    print(format_table(results), file=out)
    for line in verdict(results):
        print(line, file=out)
    write_outputs(args, out, results, write_csv, write_plot, args.threads, args.repeat)
    return 0
