"""The ``firstrun`` benchmark: what a fresh install's first run spends compiling kernels.

Numba compiles each kernel the first time it meets a new combination of argument types and keeps
it in its on-disk cache. Each job runs in new Python processes that share one empty cache
directory (``NUMBA_CACHE_DIR``): first cold (every kernel compiles), then warm (every kernel
loads), as a user's first and second runs. Jobs:

- ``product``: the first ``A @ X`` in a script (Cora's adjacency, 1433 float32 columns), timed
  inside the process from after the imports and the data loading to after the product;
- ``demo``: ``python -m pysparse_hpc demo --no-progress``, wall time of the whole command.

``--rounds`` pairs (a new cache directory each), the fastest cold and warm run kept; the shared
``--repeat`` option does not apply. The project's target: the cold demo at most 1.3x the warm
one.
"""
import csv
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass

from tqdm import tqdm

from . import counted, positive_int, shown_ratio, write_outputs
from ._data import DATA_ENV

__all__ = ["HELP", "JOBS", "TARGET_RATIO", "FirstRunResult", "JobFailed", "add_arguments",
           "measure", "run"]

HELP = "first run of a fresh install: the first A @ X and the demo, cold cache against warm"

JOBS = ("product", "demo")
TARGET_RATIO = 1.3

_PRODUCT = textwrap.dedent("""
    import json, time
    import pysparse_hpc as ph
    data = ph.datasets.load("cora")
    start = time.perf_counter()
    data.adj @ data.x
    print(json.dumps({"seconds": time.perf_counter() - start}))
""")


@dataclass(frozen=True)
class FirstRunResult:
    """One job: the fastest cold and warm run (seconds)."""
    job: str
    cold: float
    warm: float

    @property
    def ratio(self):
        return self.cold / self.warm

    @property
    def first_run_cost(self):
        return self.cold - self.warm


def add_arguments(parser):
    parser.add_argument("--job", action="append", choices=JOBS,
                        help="job to measure (repeatable; default: both)")
    parser.add_argument("--rounds", type=positive_int, default=2, metavar="N",
                        help="cold/warm pairs, each with a new cache directory; the fastest of "
                             "each kind is kept (default: 2)")


def _environment(cache_dir, data_dir, threads):
    return dict(os.environ, NUMBA_CACHE_DIR=cache_dir, **{DATA_ENV: str(data_dir)},
                PYSPARSE_HPC_NUM_THREADS=str(threads))


class JobFailed(RuntimeError):
    """A job's process failed, timed out or printed no time: the command stops with status 1."""


#: Seconds a run of each job may take before it is stopped.
TIMEOUTS = {"product": 600, "demo": 1800}


def _run_once(job, environment):
    """Seconds of one run of ``job``.

    Raises
    ------
    JobFailed
        The process exited with an error, ran past `TIMEOUTS`, or (``product``) printed no
        time; the message holds the end of its standard error.
    """
    if job == "product":
        command = [sys.executable, "-c", _PRODUCT]
    else:
        command = [sys.executable, "-m", "pysparse_hpc", "demo", "--no-progress"]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=environment,
                              timeout=TIMEOUTS[job])
    except subprocess.TimeoutExpired:
        raise JobFailed(f"the {job} job ran past its {TIMEOUTS[job]} s limit") from None
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise JobFailed(f"the {job} job failed (exit status {done.returncode}):\n"
                        f"{done.stderr[-2000:]}")
    if job == "demo":
        return seconds
    try:
        return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    except (IndexError, KeyError, TypeError, ValueError):
        raise JobFailed(f"the product job printed no time; its output ends with:\n"
                        f"{(done.stdout + done.stderr)[-2000:]}") from None


def measure(job, rounds, data_dir, threads, progress=None):
    """Fastest cold and warm run of ``job`` over ``rounds`` pairs."""
    cold, warm = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache_dir:
            environment = _environment(cache_dir, data_dir, threads)
            cold.append(_run_once(job, environment))
            warm.append(_run_once(job, environment))
        if progress is not None:
            progress.update()
    return FirstRunResult(job, min(cold), min(warm))


def format_table(results):
    lines = [f"{'job':<10}{'cold s':>10}{'warm s':>10}{'cold/warm':>11}{'first-run cost s':>18}"]
    lines += [f"{r.job:<10}{r.cold:>10.2f}{r.warm:>10.2f}{r.ratio:>10.2f}x{r.first_run_cost:>18.2f}"
              for r in results]
    return "\n".join(lines)


def verdict(results):
    demo = [r for r in results if r.job == "demo"]
    if not demo:
        return ["target (cold demo <= 1.3x warm): not measured (run with --job demo)"]
    ratio = demo[0].ratio
    met = ratio <= TARGET_RATIO
    return [f"target: cold demo at most {TARGET_RATIO}x the warm one: "
            f"{shown_ratio(ratio, met, TARGET_RATIO, at_most=True)}x, "
            f"{'MET' if met else 'NOT MET'}"]


def write_csv(results, path, threads, rounds):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job", "cold_seconds", "warm_seconds", "ratio", "threads", "rounds"])
        for r in results:
            writer.writerow([r.job, f"{r.cold:.4f}", f"{r.warm:.4f}", f"{r.ratio:.4f}", threads,
                             rounds])


def write_plot(results, path, threads, rounds):
    """Cold and warm seconds side by side, one group per job (log scale: the jobs differ by
    orders of magnitude)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = range(len(results))
    for offset, kind in ((-0.2, "cold"), (0.2, "warm")):
        axes.bar([p + offset for p in positions], [getattr(r, kind) for r in results], 0.4,
                 label=kind)
    for p, r in zip(positions, results):
        axes.annotate(f"{r.ratio:.2f}x", (p, max(r.cold, r.warm)), ha="center",
                      va="bottom")
    axes.set_xticks(list(positions), [r.job for r in results])
    axes.set_yscale("log")
    axes.set_ylim(top=2 * max(max(r.cold, r.warm) for r in results))  # room for the ratios
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axes.set_ylabel("seconds")
    axes.set_title(f"first run (cold cache) against later runs\n{threads} threads, fastest of "
                   f"{rounds} pairs")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def run(args, out=None):
    """Run the benchmark and report (to ``out``, default standard output); returns the exit
    status."""
    out = sys.stdout if out is None else out
    jobs = args.job or list(JOBS)
    results = []
    with tqdm(total=len(jobs) * args.rounds, desc="firstrun", unit="pair") as progress:
        for job in jobs:
            progress.set_postfix_str(job)
            try:
                results.append(measure(job, args.rounds, args.data_dir, args.threads, progress))
            except JobFailed as exc:
                progress.close()
                print(f"error: {exc}", file=sys.stderr)
                return 1
    print(f"First run against later runs, {counted(args.threads, 'thread')}, fastest of "
          f"{args.rounds} cold/warm pairs (each pair with a new Numba cache directory)", file=out)
    print(format_table(results), file=out)
    for line in verdict(results):
        print(line, file=out)
    write_outputs(args, out, results, write_csv, write_plot, args.threads, args.rounds)
    return 0
