"""The ``convert`` benchmark: CSR -> blocked formats and back, against scipy's CSR -> CSC.

Owns the measurement of one matrix, the report table, the CSV and the ratio plot. The peer is
``scipy.sparse.csr_array.tocsc`` on the same arrays: like CSR -> ME-BCRS it is one linear
reshuffle of every stored entry, and the project's target is CSR -> ME-BCRS in at most twice
its time (geometric mean over the shared matrices).
"""
import csv
import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from . import best_times, geometric_mean
from ._data import find_matrices, load_matrix

__all__ = ["HELP", "TARGET_RATIO", "ConvertResult", "add_arguments", "measure", "run"]

HELP = "CSR -> ME-BCRS / 16-row blocked and back, against scipy's tocsc"

#: Target of the spec: CSR -> ME-BCRS time / scipy tocsc time, geometric mean.
TARGET_RATIO = 2.0

#: Our conversions (label, table heading), each compared with scipy's tocsc.
OURS = (("to_mebcrs", "to_mebcrs"), ("to_blocked16", "to_blk16"), ("tocsr", "tocsr"))
PEER = "scipy_tocsc"


@dataclass(frozen=True)
class ConvertResult:
    """Best times of one matrix.

    Attributes
    ----------
    name, group : str
        Matrix name and ``"suitesparse"`` or ``"graph"``.
    shape : tuple of int
    nnz : int
    index_dtype, value_dtype : str
    seconds : dict of str to float
        Best time by label: ``to_mebcrs``, ``to_blocked16``, ``tocsr`` and ``scipy_tocsc``.
    """

    name: str
    group: str
    shape: tuple
    nnz: int
    index_dtype: str
    value_dtype: str
    seconds: dict

    def ratio(self, label):
        """Time of ``label`` over scipy's tocsc."""
        return self.seconds[label] / self.seconds[PEER]


def add_arguments(parser):
    """Options of the ``convert`` command beyond the common ones."""
    parser.add_argument("--matrix", action="append", metavar="NAME",
                        help="benchmark only this matrix (repeatable; default: all)")


def _same_csr(a, b):
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


def measure(spec, repeat):
    """Time the conversions of one matrix (best of ``repeat`` after one warm-up).

    The round trips are checked for exactness first, outside the timed region.

    Parameters
    ----------
    spec : MatrixSpec
    repeat : int

    Returns
    -------
    ConvertResult
    """
    A = load_matrix(spec)
    S = A.to_scipy()
    M = A.to_mebcrs()
    for blocked in (M, A.to_blocked(window=16)):
        if not _same_csr(blocked.tocsr(), A):
            raise RuntimeError(
                f"{spec.name}: window {blocked.window} round trip to CSR is not exact")
    seconds = best_times({
        "to_mebcrs": A.to_mebcrs,
        "to_blocked16": lambda: A.to_blocked(window=16),
        "tocsr": M.tocsr,
        PEER: S.tocsc,
    }, repeat)
    return ConvertResult(spec.name, spec.group, A.shape, A.nnz, str(A.index_dtype),
                         str(A.dtype), seconds)


def format_table(results):
    """The per-matrix table of times (ms) and ratios to scipy's tocsc, with geometric means."""
    times = "".join(f"{heading:>11}" for _, heading in OURS) + f"{'sp_tocsc':>11}"
    ratios = "".join(f"{heading + '/sp':>14}" for _, heading in OURS)
    header = f"{'matrix':<16}{'rows':>8}{'nnz':>9}{times}  |{ratios}"
    lines = [f"{'':<33}{'times in ms (best)':^44}  |{'ours / scipy tocsc':^42}", header,
             "-" * len(header)]
    for r in results:
        cells = "".join(f"{r.seconds[label] * 1e3:>11.3f}" for label, _ in OURS + ((PEER, ""),))
        cells += "  |" + "".join(f"{r.ratio(label):>14.2f}" for label, _ in OURS)
        lines.append(f"{r.name:<16}{r.shape[0]:>8}{r.nnz:>9}{cells}")
    lines.append("-" * len(header))
    means = "".join(f"{geometric_mean(r.ratio(label) for r in results):>14.2f}"
                    for label, _ in OURS)
    lines.append(f"{'geometric mean':<77}  |{means}")
    return "\n".join(lines)


def verdict(results):
    """One line: is CSR -> ME-BCRS within `TARGET_RATIO` of scipy's tocsc (geometric mean)?"""
    mean = geometric_mean(r.ratio("to_mebcrs") for r in results)
    status = "MET" if mean <= TARGET_RATIO else "NOT MET"
    return (f"target CSR -> ME-BCRS <= {TARGET_RATIO:g}x scipy tocsc (geometric mean): {status} "
            f"({mean:.2f}x)")


def write_csv(results, path, threads, repeat):
    """One row per matrix: sizes, dtypes, best seconds and ratios."""
    fields = (["matrix", "group", "rows", "cols", "nnz", "index_dtype", "value_dtype", "threads",
               "repeat"] + [f"{label}_s" for label, _ in OURS + ((PEER, ""),)]
              + [f"{label}_over_scipy_tocsc" for label, _ in OURS])
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for r in results:
            writer.writerow([r.name, r.group, r.shape[0], r.shape[1], r.nnz, r.index_dtype,
                             r.value_dtype, threads, repeat]
                            + [f"{r.seconds[label]:.6e}" for label, _ in OURS + ((PEER, ""),)]
                            + [f"{r.ratio(label):.4f}" for label, _ in OURS])


def write_plot(results, path, threads, repeat):
    """Grouped bars of the ratios per matrix (log scale) with a line at the target."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    figure = Figure(figsize=(max(6.0, 0.75 * len(results) + 2.0), 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = np.arange(len(results))
    width = 0.8 / len(OURS)
    for k, (label, _) in enumerate(OURS):
        axes.bar(positions + (k - (len(OURS) - 1) / 2) * width,
                 [r.ratio(label) for r in results], width,
                 label=f"{label} (geomean {geometric_mean(r.ratio(label) for r in results):.2f}x)")
    axes.axhline(TARGET_RATIO, color="red", linestyle="--",
                 label=f"{TARGET_RATIO:g}x target (CSR -> ME-BCRS)")
    axes.axhline(1.0, color="gray", linewidth=0.8)
    axes.set_yscale("log")
    # Plain numbers on both major and minor ticks: a ratio reads "3", not "3 x 10^0".
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axes.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    axes.set_xticks(positions, [r.name for r in results], rotation=45, ha="right")
    axes.set_ylabel("time / scipy csr.tocsc() time")
    axes.set_title(f"Conversion time relative to scipy tocsc ({threads} threads, best of {repeat})")
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=120)


def run(args, out=sys.stdout):
    """Run the benchmark over the shared matrices and report; returns the exit status."""
    specs, missing = find_matrices(args.data_dir)
    for file_name in missing:
        print(f"note: {file_name} not found in {args.data_dir}, skipped", file=sys.stderr)
    if args.matrix:
        unknown = sorted(set(args.matrix) - {spec.name for spec in specs})
        if unknown:
            print(f"error: unknown matrices {unknown}; available: {[s.name for s in specs]}",
                  file=sys.stderr)
            return 2
        specs = [spec for spec in specs if spec.name in args.matrix]
    if not specs:
        print(f"error: no matrices found in {args.data_dir}", file=sys.stderr)
        return 2
    results = []
    with tqdm(specs, desc="convert", unit="matrix") as progress:
        for spec in progress:
            progress.set_postfix_str(spec.name)
            results.append(measure(spec, args.repeat))
    print(f"CSR conversions, {args.threads} threads (scipy's tocsc is single-threaded), best of "
          f"{args.repeat} after 1 warm-up; data: {args.data_dir}", file=out)
    print(format_table(results), file=out)
    print(verdict(results), file=out)
    if args.csv:
        write_csv(results, args.csv, args.threads, args.repeat)
        print(f"wrote {args.csv}", file=out)
    if args.plot:
        write_plot(results, args.plot, args.threads, args.repeat)
        print(f"wrote {args.plot}", file=out)
    return 0
