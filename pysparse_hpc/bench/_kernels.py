"""What the ``spmm`` and ``sddmm`` benchmarks share: matrices, torch operands, checks and reports.

A kernel benchmark times our kernel on CSR and on ME-BCRS against peers (scipy, torch, NumPy)
for every matrix and every dense width, in float32. The matrices are the shared ones (as
``convert`` uses) plus R-MAT power-law graphs generated in memory. Each command module supplies
a `KernelBench` (labels, speedups, targets), a ``prepare(A, torch)`` run once per matrix and a
``measure(operands, width, repeat, what)`` run once per width; `run_benchmark` does the rest.

Every matrix runs with two index dtypes, ours and the peers on the same arrays: first the one
scipy picks for it (int32 where the shape and nnz fit, as a user's scipy matrix has it), then
int64. The targets are judged on the first (`judged`); the second is reported beside it.
"""
import argparse
import csv
import gc
import math
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from . import best_times, counted, geometric_mean, positive_width
from ._data import (DataDirectoryMissing, find_matrices, index_variants, load_matrix,
                    scipy_index_dtype)

__all__ = ["DEFAULT_RMAT", "DEFAULT_WIDTHS", "KernelBench", "KernelResult", "MatrixCase",
           "Mismatch", "Speedup", "Target", "add_kernel_arguments", "check_close", "judged",
           "keep_requested", "load_case", "shared_cases", "conversion_seconds", "format_table",
           "import_torch", "run_benchmark", "steady_best_times", "torch_csr", "verdict",
           "verdicts", "write_csv", "write_plot"]

#: Dense widths (N for SpMM, F for SDDMM) measured by default.
DEFAULT_WIDTHS = (32, 128, 256)

#: Default R-MAT graphs: (scale, edge factor, seed). Both hold over 4.8M entries once
#: duplicate edges merge (2^18 and 2^19 nodes).
DEFAULT_RMAT = ((18, 20, 1), (19, 10, 2))

#: Tolerance of the agreement checks: |ours - reference| <= RTOL |reference| + ATOL max|reference|.
RTOL = 1e-4
ATOL = 1e-4


class Mismatch(RuntimeError):
    """A kernel's result disagrees with the reference; the benchmark stops."""


@dataclass(frozen=True)
class MatrixCase:
    """One benchmark matrix: a shared file or a generated R-MAT graph.

    Attributes
    ----------
    name : str
    group : {"suitesparse", "graph", "rmat"}
    load : callable
        Returns the matrix as a canonical float32 `csr_array`.
    note : str
        How it was made (R-MAT parameters), empty for files.
    """

    name: str
    group: str
    load: object
    note: str = ""


@dataclass(frozen=True)
class Speedup:
    """A speedup column: time of ``peer`` over time of ``ours``.

    ``ours`` is a contender label or ``"best"``: per row, the faster of CSR and ME-BCRS.
    """

    ours: str
    peer: str
    heading: str
    plot: bool = True


@dataclass(frozen=True)
class Target:
    """A goal of the spec: geometric mean of ``peer time / ours time`` at least ``factor``."""

    peer: str
    factor: float
    description: str


@dataclass(frozen=True)
class KernelBench:
    """What a kernel command measures and how it reports it.

    Attributes
    ----------
    kernel : str
        Name in headings (``"SpMM"``).
    operation : str
        One line saying what is computed.
    width_name : str
        The dense width's letter (``"N"``, ``"F"``).
    contenders : tuple of (label, heading)
        In table order; ``csr`` and ``mebcrs`` are ours.
    peers_note : str
        Header line about the peers (threads, what exactly runs).
    speedups : tuple of Speedup
    targets : tuple of Target
        Checked for ours on CSR, then again for the best of ours per row.
    timing : str
        The statistic of the times, as the table heading names it.
    """

    kernel: str
    operation: str
    width_name: str
    contenders: tuple
    peers_note: str
    speedups: tuple
    targets: tuple
    timing: str = "best time"


@dataclass
class KernelResult:
    """Best times of one matrix at one dense width.

    Attributes
    ----------
    name, group : str
    shape : tuple of int
    nnz : int
    index_dtype : str
    width : int
        N (SpMM) or F (SDDMM).
    convert_s : float
        Seconds of the one ``A.to_mebcrs()`` done before timing (same for every width).
    seconds : dict of str to float
        Best time per contender label.
    """

    name: str
    group: str
    shape: tuple
    nnz: int
    index_dtype: str
    width: int
    convert_s: float
    seconds: dict = field(default_factory=dict)

    def time(self, label):
        """Best seconds of ``label``; ``"best"`` is the faster of ours on CSR and ME-BCRS."""
        if label == "best":
            return min(self.seconds["csr"], self.seconds["mebcrs"])
        return self.seconds[label]

    def gflops(self, label):
        """2 nnz width floating-point operations per second, in units of 1e9."""
        return 2.0 * self.nnz * self.width / self.time(label) / 1e9

    def speedup(self, ours, peer):
        """Time of ``peer`` over time of ``ours`` (above 1: ours is faster)."""
        return self.time(peer) / self.time(ours)


def judged(result):
    """Whether ``result`` ran with the index dtype scipy picks for its matrix (int32 where the
    shape and nnz fit): the rows the targets are judged on.

    Parameters
    ----------
    result : KernelResult

    Returns
    -------
    bool
    """
    return result.index_dtype == scipy_index_dtype(result.shape, result.nnz).name


# --- command line --------------------------------------------------------------------------

#: The most edges ``--rmat`` generates (2^SCALE x EDGE_FACTOR): scale 30 at edge factor 4.
MAX_RMAT_EDGES = 1 << 32


def _rmat_spec(text):
    """``SCALE:EDGE_FACTOR[:SEED]`` -> (scale, edge_factor, seed); the seed defaults to 1."""
    parts = text.split(":")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3):
        raise argparse.ArgumentTypeError(
            f"expected SCALE:EDGE_FACTOR or SCALE:EDGE_FACTOR:SEED, got {text!r}")
    scale, edge_factor, seed = (values + [1])[:3]
    if not 1 <= scale <= 30 or edge_factor < 1 or seed < 0:
        raise argparse.ArgumentTypeError(
            f"R-MAT scale must be in [1, 30], edge factor >= 1 and seed >= 0; got {text!r}")
    if edge_factor << scale > MAX_RMAT_EDGES:
        # The generator holds every edge before merging: a larger graph fails at its first
        # allocation, after the matrices before it were measured.
        raise argparse.ArgumentTypeError(
            f"{text!r} asks for {edge_factor << scale} edges (2^SCALE x EDGE_FACTOR); at most "
            f"{MAX_RMAT_EDGES}")
    return scale, edge_factor, seed


def add_kernel_arguments(parser, width_name, width_help):
    """Options of a kernel command beyond the common ones."""
    parser.add_argument("--matrix", action="append", metavar="NAME",
                        help="benchmark only this matrix (repeatable; shared or R-MAT name, "
                             "e.g. rmat-s18-e20; default: all)")
    parser.add_argument("--n", type=positive_width, nargs="+", metavar=width_name,
                        help=f"{width_help} (default: {' '.join(map(str, DEFAULT_WIDTHS))})")
    rmat = parser.add_mutually_exclusive_group()
    default = " ".join(f"{s}:{e}:{r}" for s, e, r in DEFAULT_RMAT)
    rmat.add_argument("--rmat", type=_rmat_spec, nargs="+", metavar="SCALE:EF[:SEED]",
                      help="R-MAT graphs to generate in memory: 2^SCALE nodes, EF edges per node "
                           f"before duplicates merge, seed (default 1) (default: {default})")
    rmat.add_argument("--no-rmat", action="store_true", help="skip the R-MAT graphs")


def _shared_case(spec):
    return MatrixCase(spec.name, spec.group,
                      lambda: load_matrix(spec).astype(np.float32, copy=False))


def _rmat_case(scale, edge_factor, seed):
    def load():
        from ..generators import rmat  # imported when used: only R-MAT cases need it
        return rmat(scale, edge_factor, seed=seed).astype(np.float32, copy=False)
    return MatrixCase(f"rmat-s{scale}-e{edge_factor}", "rmat", load,
                      f"scale {scale}, edge factor {edge_factor}, seed {seed}")


def shared_cases(data_dir, err=None):
    """A `MatrixCase` per shared matrix found, after a note for each expected file missing.

    Without the data directory there are none, after a note: the generated matrices still run.
    """
    err = sys.stderr if err is None else err
    try:
        specs, missing = find_matrices(data_dir)
    except DataDirectoryMissing as exc:
        print(f"note: {exc}; only generated matrices run", file=err)
        return []
    for file_name in missing:
        print(f"note: {file_name} not found in {data_dir}, skipped", file=err)
    return [_shared_case(spec) for spec in specs]


def select_cases(args, err=None):
    """The matrices to run, in order (shared, then R-MAT), or None after an error message."""
    err = sys.stderr if err is None else err
    cases = shared_cases(args.data_dir, err)
    if not args.no_rmat:
        rmat_specs = args.rmat if args.rmat is not None else DEFAULT_RMAT
        pairs = [(scale, edge_factor) for scale, edge_factor, _ in rmat_specs]
        if len(set(pairs)) != len(pairs):
            print("error: --rmat lists a SCALE:EDGE_FACTOR pair twice", file=err)
            return None
        generated = [_rmat_case(*spec) for spec in rmat_specs]
        cases += generated
        # graphs generated on request (--rmat given) are run whatever --matrix names
        requested = {case.name for case in generated} if args.rmat is not None else set()
        return keep_requested(cases, args, err, requested)
    return keep_requested(cases, args, err)


def keep_requested(cases, args, err=None, requested=()):
    """The cases named by ``--matrix`` (all without it) and those named in ``requested`` (the
    graphs an option asked to generate, which ``--matrix`` does not drop), or None after an
    error message."""
    err = sys.stderr if err is None else err
    if args.matrix:
        unknown = sorted(set(args.matrix) - {case.name for case in cases})
        if unknown:
            print(f"error: unknown matrices {unknown}; available: {[c.name for c in cases]}",
                  file=err)
            return None
        cases = [case for case in cases
                 if case.name in args.matrix or case.name in requested]
    if not cases:
        print(f"error: no matrices found in {args.data_dir}", file=err)
        return None
    return cases


# --- operands and checks -------------------------------------------------------------------

def import_torch(err=None):
    """The torch module, or None after an error message (torch is an optional dependency)."""
    err = sys.stderr if err is None else err
    try:
        import torch
    except ImportError:
        print("error: this benchmark compares with torch; install it (pysparse_hpc[torch], the "
              "CPU build: see the README)", file=err)
        return None
    return torch


def torch_csr(torch, A, index_dtype=None):
    """A torch sparse CSR tensor with A's entries and float32 values (shared with A).

    Parameters
    ----------
    torch : module
    A : csr_array
    index_dtype : numpy dtype, optional
        Of the crow / column indices; by default A's own (int32 or int64), which is what
        ``torch.sparse_csr_tensor`` keeps from a user's scipy matrix. torch.sparse.mm and
        torch.sparse.sampled_addmm accept int32 indices on the CPU.

    Returns
    -------
    torch.Tensor
    """
    index_dtype = A.index_dtype if index_dtype is None else np.dtype(index_dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(A.indptr.astype(index_dtype, copy=False)),
            torch.from_numpy(A.indices.astype(index_dtype, copy=False)),
            torch.from_numpy(A.data), size=A.shape, check_invariants=False)


def check_close(what, result, reference):
    """Raise `Mismatch` unless ``result`` is within the benchmark tolerance of ``reference``.

    The absolute tolerance is `ATOL` times the largest reference magnitude, so it scales with
    the matrix values and the width of the dot products.
    """
    result = np.asarray(result)
    if result.shape != reference.shape:
        raise Mismatch(f"{what}: result shape {result.shape}, expected {reference.shape}")
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    atol = ATOL * (scale if scale > 0 else 1.0)
    if not np.allclose(result, reference, rtol=RTOL, atol=atol):
        with np.errstate(invalid="ignore"):
            worst = float(np.nanmax(np.abs(result.astype(np.float64) - reference)))
        bad = int(np.count_nonzero(~np.isclose(result, reference, rtol=RTOL, atol=atol)))
        raise Mismatch(f"{what}: {bad} of {reference.size} values differ (max |diff| {worst:.3g}; "
                       f"tolerance rtol={RTOL:g}, atol={atol:.3g})")


def steady_best_times(functions, repeat):
    """Best seconds of each callable over ``repeat`` rounds; each timed call follows a warm-up.

    Our kernels and torch run on two different OpenMP runtimes (torch ships its own), whose idle
    threads keep spinning for a while after a parallel region. A call made right after the
    other library's call competes with those spinning threads for the cores, which on a small
    machine can cost several times the kernel's own time. So every timed call directly follows
    an untimed call of the same function (`best_times` with ``repeat=1, warmup=1``), while the
    rounds still interleave the functions so that drifting load affects them alike.

    Parameters
    ----------
    functions : dict of str to callable
    repeat : int

    Returns
    -------
    dict of str to float
    """
    best = dict.fromkeys(functions, math.inf)
    for _ in range(repeat):
        for label, function in functions.items():
            best[label] = min(best[label], best_times({label: function}, 1, warmup=1)[label])
    return best


def conversion_seconds(A):
    """(ME-BCRS of ``A``, seconds of that one conversion)."""
    start = time.perf_counter()
    M = A.to_mebcrs()
    return M, time.perf_counter() - start


def _warm_up_runtime():
    """One tiny conversion, so the first matrix's timed conversion does not pay the thread
    pool's start-up."""
    from .._csr import csr_array
    csr_array(np.eye(64, dtype=np.float32)).to_mebcrs()


# --- report --------------------------------------------------------------------------------

def load_case(case, progress, notes):
    """Load ``case`` with the progress bar saying so; an R-MAT graph's size goes to ``notes``.

    Returns
    -------
    csr_array
    """
    progress.set_postfix_str(f"{case.name} (loading)")
    A = case.load()
    if case.note:
        notes.append(f"{case.name}: R-MAT {case.note}: {A.shape[0]} rows, {A.nnz} stored "
                     "entries after duplicates merge")
    return A


def _best_note():
    return "best = faster of ours on CSR and ME-BCRS per row, conversion not included"


def format_table(bench, results, index=None):
    """Per (matrix, width): GFLOP/s of every contender and the speedups, then geometric means.

    ``index``: show the index dtype of each row and a geometric mean per index dtype; by
    default only when the results hold more than one index dtype.
    """
    if index is None:
        index = len({r.index_dtype for r in results}) > 1
    w = bench.width_name
    # A space at least between headings, which may be longer than their numbers.
    columns = [max(10, len(heading) + 1) for _, heading in bench.contenders]
    rates = "".join(f"{heading:>{column}}" for (_, heading), column
                    in zip(bench.contenders, columns))
    spans = [max(13, len(s.heading) + 1) for s in bench.speedups]
    ratios = "".join(f"{s.heading:>{span}}" for s, span in zip(bench.speedups, spans))
    left = (f"{'matrix':<15}{'rows':>8}{'nnz':>9}" + (f"{'index':>6}" if index else "")
            + f"{w:>5}{'to_meb ms':>10}")
    header = f"{left}{rates}  |{ratios}"
    lines = [f"{'':<{len(left)}}{f'GFLOP/s (2 nnz {w} / {bench.timing})':^{len(rates)}}  |"
             f"{'speedup (peer time / our time)':^{len(ratios)}}", header, "-" * len(header)]
    previous = previous_case = None
    for r in results:
        first = r.name != previous
        first_case = (r.name, r.index_dtype) != previous_case
        previous, previous_case = r.name, (r.name, r.index_dtype)
        convert = f"{r.convert_s * 1e3:>10.2f}" if first_case else f"{'':>10}"
        names = (f"{r.name:<15}{r.shape[0]:>8}{r.nnz:>9}" if first else f"{'':<32}")
        if index:
            names += f"{r.index_dtype:>6}" if first_case else f"{'':>6}"
        cells = "".join(f"{r.gflops(label):>{column}.2f}" for (label, _), column
                        in zip(bench.contenders, columns))
        cells += "  |" + "".join(f"{r.speedup(s.ours, s.peer):>{span}.2f}"
                                 for s, span in zip(bench.speedups, spans))
        lines.append(f"{names}{r.width:>5}{convert}{cells}")
    lines.append("-" * len(header))
    widths = sorted({r.width for r in results})
    groups = []
    dtypes = list(dict.fromkeys(r.index_dtype for r in results)) if index else [None]
    for index_dtype in dtypes:
        subset = [r for r in results if index_dtype in (None, r.index_dtype)]
        title = "geometric mean" + (f", {index_dtype} ({len(subset)})" if index else "")
        groups.append((title, subset))
        if len(widths) > 1:
            groups += [(f"  {w}={width}", [r for r in subset if r.width == width])
                       for width in widths]
    for title, rows in groups:
        # rows where a pair did not run (NaN) are left out of its mean, not allowed to void it
        means = "".join(f"{_measured_mean(r.speedup(s.ours, s.peer) for r in rows):>{span}.2f}"
                        for s, span in zip(bench.speedups, spans))
        lines.append(f"{title:<{len(left) + len(rates)}}  |{means}")
    return "\n".join(lines)


def _measured_mean(speedups):
    """Geometric mean of the speedups that were measured (NaN where none was)."""
    measured = [v for v in speedups if not math.isnan(v)]
    return geometric_mean(measured) if measured else math.nan


def verdict(mean, met, factor):
    """``"MET (2.31x)"`` or ``"NOT MET (1.42x)"``. A miss that would round up to the target is
    rounded down instead, so that 3.996 does not read as a 4.00 that failed."""
    shown = mean
    if not met and round(mean, 2) >= factor:
        shown = math.floor(mean * 100) / 100
    return f"{'MET' if met else 'NOT MET'} ({shown:.2f}x)"


def verdicts(bench, results):
    """Target lines: ours on CSR, then the best of ours per row; honest MET / NOT MET.

    Judged on the rows with the index dtype scipy picks (`judged`: int32 where it fits); the
    rows with the other index dtype (int64) follow as reported means, not judged.
    """
    lines = []
    rows = [r for r in results if judged(r)]
    others = [r for r in results if not judged(r)]
    picked = "/".join(dict.fromkeys(r.index_dtype for r in rows))
    for ours, who in (("csr", "ours on CSR"), ("best", "best of ours per row")):
        for target in bench.targets:
            mean = geometric_mean(r.speedup(ours, target.peer) for r in rows)
            lines.append(f"target {bench.kernel} >= {target.factor:g}x {target.description}, "
                         f"{who} (geometric mean of {len(rows)}, {picked} indices): "
                         f"{verdict(mean, mean >= target.factor, target.factor)}")
    for index_dtype in dict.fromkeys(r.index_dtype for r in others):
        subset = [r for r in others if r.index_dtype == index_dtype]
        means = ", ".join(f"{geometric_mean(r.speedup('csr', t.peer) for r in subset):.2f}x "
                          f"{t.description}" for t in bench.targets)
        lines.append(f"with {index_dtype} indices (second case, not judged), ours on CSR "
                     f"(geometric mean of {len(subset)}): {means}")
    return lines


def write_csv(bench, results, path, threads, repeat):
    """One row per (matrix, width): sizes, best seconds, GFLOP/s and speedups."""
    labels = [label for label, _ in bench.contenders]
    w = bench.width_name
    fields = (["matrix", "group", "rows", "cols", "nnz", w, "index_dtype", "value_dtype",
               "threads", "repeat", "to_mebcrs_s"] + [f"{label}_s" for label in labels]
              + [f"{label}_gflops" for label in labels]
              + [f"speedup_{s.ours}_vs_{s.peer}" for s in bench.speedups])
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for r in results:
            writer.writerow([r.name, r.group, r.shape[0], r.shape[1], r.nnz, r.width,
                             r.index_dtype, "float32", threads, repeat, f"{r.convert_s:.6e}"]
                            + [f"{r.seconds[label]:.6e}" for label in labels]
                            + [f"{r.gflops(label):.4f}" for label in labels]
                            + [f"{r.speedup(s.ours, s.peer):.4f}" for s in bench.speedups])


def write_plot(bench, results, path, threads, repeat, title=None):
    """One panel per width: grouped bars of the speedups per matrix (log scale), target lines;
    ``title`` replaces the default one, which names the thread count.

    With more than one index dtype in ``results``, every speedup gets a bar per index dtype,
    the second dtype's (int64) hatched, and the legend names the dtype.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    widths = sorted({r.width for r in results})
    names = list(dict.fromkeys(r.name for r in results))
    dtypes = list(dict.fromkeys(r.index_dtype for r in results))
    series = [(s, index_dtype) for index_dtype in dtypes for s in bench.speedups if s.plot]
    figure = Figure(figsize=(max(9.0, 0.4 * len(series) * len(names) + 2.5) + 2.5,
                             2.2 + 2.8 * len(widths)), layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(widths), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    positions = np.arange(len(names))
    bar = 0.8 / len(series)
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
    shown = [s for s in bench.speedups if s.plot]
    for axes, width in zip(panels, widths):
        by_case = {(r.name, r.index_dtype): r for r in results if r.width == width}
        for k, (s, index_dtype) in enumerate(series):
            values = [by_case[n, index_dtype].speedup(s.ours, s.peer)
                      if (n, index_dtype) in by_case else np.nan for n in names]
            mean = geometric_mean(v for v in values if not math.isnan(v))
            second = index_dtype != dtypes[0]
            label = s.heading + (f" [{index_dtype}]" if len(dtypes) > 1 else "")
            axes.bar(positions + (k - (len(series) - 1) / 2) * bar, values, bar,
                     color=colors[shown.index(s) % len(colors)], hatch="//" if second else None,
                     edgecolor="white" if second else None, alpha=0.6 if second else 1.0,
                     label=f"{label} (geomean {mean:.2f}x)")
        for k, target in enumerate(bench.targets):
            axes.axhline(target.factor, color=("red", "darkred", "magenta")[k % 3],
                         linestyle="--", label=f"{target.factor:g}x target vs {target.peer}")
        axes.axhline(1.0, color="gray", linewidth=0.8)
        axes.set_yscale("log")
        # Plain numbers on both major and minor ticks: a speedup reads "3", not "3 x 10^0"; minor
        # ticks only at 2, 3 and 5 per decade so their labels do not overlap.
        axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        axes.yaxis.set_minor_locator(LogLocator(subs=(2.0, 3.0, 5.0)))
        axes.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        axes.set_ylabel(f"speedup, {bench.width_name}={width}")
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    panels[-1].set_xticks(positions, names, rotation=45, ha="right")
    indices = f", {' / '.join(dtypes)} indices" if len(dtypes) > 1 else ""
    panels[0].set_title(title or f"{bench.kernel} speedup of ours over the peers, float32"
                                 f"{indices} ({counted(threads, 'thread')}, best of {repeat} "
                                 "rounds)")
    figure.savefig(path, dpi=120)


# --- driver --------------------------------------------------------------------------------

def run_benchmark(args, bench, prepare, measure, out=None):
    """Measure every matrix at every width, print the report, write CSV / plot; exit status.

    ``prepare(A, torch)`` returns (operands, seconds of the ME-BCRS conversion) for one matrix;
    ``measure(operands, width, repeat, what)`` checks the results then returns best seconds by
    contender label, raising `Mismatch` on a wrong result.
    """
    out = sys.stdout if out is None else out
    torch = import_torch()
    if torch is None:
        return 2
    cases = select_cases(args)
    if cases is None:
        return 2
    torch.set_num_threads(args.threads)  # ours and torch run on the same number of threads
    _warm_up_runtime()
    widths = list(dict.fromkeys(args.n or DEFAULT_WIDTHS))
    results, notes = [], []
    total = 2 * len(cases) * len(widths)  # two index dtypes where scipy picks int32
    with tqdm(total=total, desc=bench.kernel.lower(), unit="case") as progress:
        for case in cases:
            A = load_case(case, progress, notes)
            variants = index_variants(A)
            del A
            if len(variants) < 2:  # scipy picks int64 for it: one case, not two
                progress.total -= (2 - len(variants)) * len(widths)
                progress.refresh()
            while variants:
                index_dtype, A = variants.pop(0)
                operands, convert_s = prepare(A, torch)
                for width in widths:
                    progress.set_postfix_str(f"{case.name} {index_dtype} "
                                             f"{bench.width_name}={width}")
                    what = f"{case.name} {index_dtype} {bench.width_name}={width}"
                    try:
                        seconds = measure(operands, width, args.repeat, what)
                    except Mismatch as exc:
                        progress.close()
                        print(f"error: wrong result, benchmark aborted: {exc}", file=sys.stderr)
                        return 1
                    results.append(KernelResult(case.name, case.group, A.shape, A.nnz,
                                                index_dtype, width, convert_s, seconds))
                    gc.collect()
                    progress.update()
                # the next case (R-MAT: hundreds of MB of operands) starts clean
                del A, operands
                gc.collect()
    print(f"{bench.kernel}: {bench.operation}; float32; ours: "
          f"{counted(args.threads, 'thread')}; best of {counted(args.repeat, 'round')}, each "
          f"timed call right after an untimed one; data: {args.data_dir}", file=out)
    print(bench.peers_note, file=out)
    print(f"to_meb ms: one A.to_mebcrs() before timing, not included in the ME-BCRS times; "
          f"{_best_note()}", file=out)
    print("index: the index dtype of A for ours and the peers alike: first the one scipy picks "
          "(int32 where it fits, as a user's scipy matrix has it; the targets are judged on "
          "these rows), then int64", file=out)
    for note in notes:
        print(note, file=out)
    print(format_table(bench, results, index=True), file=out)
    for line in verdicts(bench, results):
        print(line, file=out)
    if args.csv:
        write_csv(bench, results, args.csv, args.threads, args.repeat)
        print(f"wrote {args.csv}", file=out)
    if args.plot:
        write_plot(bench, results, args.plot, args.threads, args.repeat)
        print(f"wrote {args.plot}", file=out)
    return 0
