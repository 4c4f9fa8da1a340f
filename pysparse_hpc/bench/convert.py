"""The ``convert`` benchmark: CSR -> blocked formats and back, against scipy's CSR -> CSC.

Owns the measurement of one matrix, the report table, the CSV and the ratio plot. The peer is
``scipy.sparse.csr_array.tocsc`` on the same arrays: like CSR -> ME-BCRS it is one linear
reshuffle of every stored entry, and the project's target is CSR -> ME-BCRS in at most twice
its time (geometric mean over the shared matrices).

Every matrix is measured twice, ours and scipy's on the same arrays each time: first with the
index dtype scipy picks for it (int32 where the shape and nnz fit, as a user's
``scipy.sparse.load_npz`` or ``csr_array(...)`` has it), then with int64 indices. The target is
judged on the first; the second is reported beside it.
"""
import csv
import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from . import best_times, counted, geometric_mean, shown_ratio, write_outputs
from ._data import find_matrices, index_variants, load_matrix, scipy_index_dtype

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
        ``index_dtype`` is ``"int32"`` or ``"int64"``, the dtype of the arrays both sides ran on.
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

    @property
    def judged(self):
        """Whether this row has the index dtype scipy picks for the matrix (the targets' rows)."""
        return self.index_dtype == scipy_index_dtype(self.shape, self.nnz).name


def add_arguments(parser):
    """Options of the ``convert`` command beyond the common ones."""
    parser.add_argument("--matrix", action="append", metavar="NAME",
                        help="benchmark only this matrix (repeatable; default: all)")


def _same_csr(a, b):
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


def measure(spec, repeat):
    """Time the conversions of one matrix with each index dtype (best of ``repeat`` after one
    warm-up).

    The round trips are checked for exactness first, outside the timed region, and the
    ME-BCRS arrays of the int64 case must equal the int32 case's.

    Parameters
    ----------
    spec : MatrixSpec
    repeat : int

    Returns
    -------
    list of ConvertResult
        One per index dtype, scipy's pick first (`index_variants`).
    """
    results = []
    first = None
    for index_dtype, A in index_variants(load_matrix(spec)):
        S = A.to_scipy()
        if S.indices.dtype != A.index_dtype:
            raise RuntimeError(f"{spec.name}: scipy's copy has {S.indices.dtype} indices, ours "
                               f"{A.index_dtype}")
        M = A.to_mebcrs()
        for blocked in (M, A.to_blocked(window=16)):
            if not _same_csr(blocked.tocsr(), A):
                raise RuntimeError(
                    f"{spec.name} ({index_dtype}): window {blocked.window} round trip to CSR "
                    "is not exact")
        if first is None:
            first = M
        elif not _same_blocked(M, first):
            raise RuntimeError(f"{spec.name}: ME-BCRS from {index_dtype} indices differs from "
                               "the first index dtype's")
        seconds = best_times({
            "to_mebcrs": A.to_mebcrs,
            "to_blocked16": lambda A=A: A.to_blocked(window=16),
            "tocsr": M.tocsr,
            PEER: S.tocsc,
        }, repeat)
        results.append(ConvertResult(spec.name, spec.group, A.shape, A.nnz, index_dtype,
                                     str(A.dtype), seconds))
        del A, S, M
    return results


def _same_blocked(a, b):
    return all(np.array_equal(getattr(a, key), getattr(b, key))
               for key in ("row_window_offset", "col_idx", "values", "vector_mask"))


def _index_dtypes(results):
    """The index dtypes present, in order of first appearance (scipy's pick first)."""
    return list(dict.fromkeys(r.index_dtype for r in results))


def format_table(results):
    """The per-matrix table of times (ms) and ratios to scipy's tocsc, one row per matrix and
    index dtype, with a geometric mean per index dtype."""
    times = "".join(f"{heading:>11}" for _, heading in OURS) + f"{'sp_tocsc':>11}"
    ratios = "".join(f"{heading + '/sp':>14}" for _, heading in OURS)
    left = f"{'matrix':<16}{'rows':>8}{'nnz':>9}{'index':>7}"
    header = f"{left}{times}  |{ratios}"
    lines = [f"{'':<{len(left)}}{'times in ms (best)':^{len(times)}}  |"
             f"{'ours / scipy tocsc':^{len(ratios)}}", header, "-" * len(header)]
    previous = None
    for r in results:
        names = f"{r.name:<16}{r.shape[0]:>8}{r.nnz:>9}" if r.name != previous else " " * 33
        previous = r.name
        cells = "".join(f"{r.seconds[label] * 1e3:>11.3f}" for label, _ in OURS + ((PEER, ""),))
        cells += "  |" + "".join(f"{r.ratio(label):>14.2f}" for label, _ in OURS)
        lines.append(f"{names}{r.index_dtype:>7}{cells}")
    lines.append("-" * len(header))
    for index_dtype in _index_dtypes(results):
        rows = [r for r in results if r.index_dtype == index_dtype]
        means = "".join(f"{geometric_mean(r.ratio(label) for r in rows):>14.2f}"
                        for label, _ in OURS)
        title = f"geometric mean, {index_dtype} ({len(rows)})"
        lines.append(f"{title:<{len(left) + len(times)}}  |{means}")
    return "\n".join(lines)


def verdict(results):
    """Lines: is CSR -> ME-BCRS within `TARGET_RATIO` of scipy's tocsc (geometric mean) on the
    rows with scipy's index dtype; then the same mean with int64 indices, not judged."""
    judged = [r for r in results if r.judged]
    mean = geometric_mean(r.ratio("to_mebcrs") for r in judged)
    met = mean <= TARGET_RATIO
    shown = shown_ratio(mean, met, TARGET_RATIO, at_most=True)
    picked = "/".join(_index_dtypes(judged))
    lines = [f"target CSR -> ME-BCRS <= {TARGET_RATIO:g}x scipy tocsc (geometric mean of "
             f"{len(judged)}, {picked} indices as scipy picks them): "
             f"{'MET' if met else 'NOT MET'} ({shown}x)"]
    for index_dtype in _index_dtypes(results):
        rows = [r for r in results if r.index_dtype == index_dtype and not r.judged]
        if rows:
            lines.append(f"with {index_dtype} indices (second case, not judged): CSR -> ME-BCRS "
                         f"{geometric_mean(r.ratio('to_mebcrs') for r in rows):.2f}x scipy "
                         f"tocsc (geometric mean of {len(rows)})")
    return lines


def write_csv(results, path, threads, repeat):
    """One row per matrix: sizes, then best seconds and ratios for each index dtype.

    ``index_dtype`` names the dtype scipy picks for the matrix, the one the target judges; the
    timing columns carry their dtype as a prefix (``int32_to_mebcrs_s``, ...), empty where the
    matrix has no such case (int32 for a matrix scipy stores with int64).
    """
    labels = [label for label, _ in OURS + ((PEER, ""),)]
    dtypes = ("int32", "int64")
    fields = ["matrix", "group", "rows", "cols", "nnz", "index_dtype", "value_dtype", "threads",
              "repeat"]
    for index_dtype in dtypes:
        fields += [f"{index_dtype}_{label}_s" for label in labels]
        fields += [f"{index_dtype}_{label}_over_scipy_tocsc" for label, _ in OURS]
    by_matrix = {}
    for r in results:
        by_matrix.setdefault(r.name, {})[r.index_dtype] = r
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for rows in by_matrix.values():
            judged = next((r for r in rows.values() if r.judged), next(iter(rows.values())))
            row = [judged.name, judged.group, judged.shape[0], judged.shape[1], judged.nnz,
                   judged.index_dtype, judged.value_dtype, threads, repeat]
            for index_dtype in dtypes:
                r = rows.get(index_dtype)
                if r is None:
                    row += [""] * (len(labels) + len(OURS))
                    continue
                row += [f"{r.seconds[label]:.6e}" for label in labels]
                row += [f"{r.ratio(label):.4f}" for label, _ in OURS]
            writer.writerow(row)


def write_plot(results, path, threads, repeat):
    """Grouped bars of the ratios per matrix (log scale) with a line at the target: every
    conversion with scipy's index dtype, and CSR -> ME-BCRS with int64 indices hatched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    judged = {r.name: r for r in results if r.judged}
    second = {r.name: r for r in results if not r.judged}
    names = list(judged)
    series = [(label, f"{label} ({judged[names[0]].index_dtype if names else ''})", judged, None)
              for label, _ in OURS]
    if second:
        series.insert(1, ("to_mebcrs", "to_mebcrs (int64)", second, "//"))
    figure = Figure(figsize=(max(6.0, 0.9 * len(names) + 2.0), 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = np.arange(len(names))
    width = 0.8 / len(series)
    colors = ("tab:blue", "tab:cyan", "tab:orange", "tab:green")
    for k, (label, legend, rows, hatch) in enumerate(series):
        values = [rows[n].ratio(label) if n in rows else np.nan for n in names]
        mean = geometric_mean(v for v in values if not np.isnan(v))
        axes.bar(positions + (k - (len(series) - 1) / 2) * width, values, width,
                 color=colors[k % len(colors)], hatch=hatch, edgecolor="white" if hatch else None,
                 label=f"{legend} (geomean {mean:.2f}x)")
    axes.axhline(TARGET_RATIO, color="red", linestyle="--",
                 label=f"{TARGET_RATIO:g}x target (CSR -> ME-BCRS, scipy's index dtype)")
    axes.axhline(1.0, color="gray", linewidth=0.8)
    axes.set_yscale("log")
    # Plain numbers on both major and minor ticks: a ratio reads "3", not "3 x 10^0".
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axes.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    axes.set_xticks(positions, names, rotation=45, ha="right")
    axes.set_ylabel("time / scipy csr.tocsc() time")
    axes.set_title(f"Conversion time relative to scipy tocsc on the same index dtype "
                   f"({counted(threads, 'thread')}, best of {repeat})")
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=120)


def run(args, out=None):
    """Run the benchmark over the shared matrices and report; returns the exit status."""
    out = sys.stdout if out is None else out
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
            results += measure(spec, args.repeat)
    print(f"CSR conversions, {counted(args.threads, 'thread')} (scipy's tocsc is "
          f"single-threaded), best of {args.repeat} after 1 warm-up; data: {args.data_dir}",
          file=out)
    print("index: the index dtype of the arrays ours and scipy's tocsc both ran on; first the one "
          "scipy picks (int32 where it fits, as scipy.sparse.load_npz gives it), then int64",
          file=out)
    print(format_table(results), file=out)
    for line in verdict(results):
        print(line, file=out)
    write_outputs(args, out, results, write_csv, write_plot, args.threads, args.repeat)
    return 0
