"""The ``read`` benchmark: reading sparse matrix files, against scipy's readers.

Owns the files it writes (a random matrix plus its transpose, so that it is symmetric, saved
as a symmetric and as a general Matrix Market file and as a compressed ``.npz``), the timing
of each reader and the report. The peers are what scipy's users call:
``scipy.io.mmread(path).tocsr()`` and ``scipy.sparse.load_npz(path)``. There is no target:
ours checks what scipy's readers take on trust (every Matrix Market number whole, no entry
stored with its mirror; an ``.npz`` member's declared size, and the whole CSR structure:
indices in range, row pointers in order), and this measures the price.
"""
import csv
import os
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import scipy.io
import scipy.sparse

from . import best_times, counted, positive_float, positive_int, write_outputs

__all__ = ["HELP", "ReadResult", "add_arguments", "measure", "run"]

HELP = "reading Matrix Market and .npz files, against scipy's readers"


@dataclass(frozen=True)
class ReadResult:
    """Best times of one file.

    Attributes
    ----------
    name : str
        ``"mtx symmetric"``, ``"mtx general"`` or ``"npz"``.
    megabytes : float
        The file's size.
    stored : int
        Entries of the matrix read (both triangles).
    seconds, peer_seconds : float
        Best time of ours and of scipy's reader.
    """

    name: str
    megabytes: float
    stored: int
    seconds: float
    peer_seconds: float

    @property
    def ratio(self):
        """Our time over scipy's."""
        return self.seconds / self.peer_seconds


def add_arguments(parser):
    """Options of the ``read`` command beyond the common ones."""
    parser.add_argument("--rows", type=positive_int, default=20000, metavar="N",
                        help="rows of the matrix written (default: 20000, a 64 MB symmetric "
                             "file with the default density)")
    parser.add_argument("--density", type=positive_float, default=0.005, metavar="D",
                        help="density of the random matrix before it is symmetrized "
                             "(default: 0.005)")
    parser.add_argument("--dir", metavar="DIR",
                        help="write the files here (default: a temporary directory, removed "
                             "after)")


def _write_files(directory, rows, density):
    """The files of one symmetric matrix, by name, and the matrix as scipy holds it."""
    random = scipy.sparse.random(rows, rows, density=density, format="coo",
                                 random_state=0)
    matrix = (random + random.T).tocsr()
    paths = {"mtx symmetric": os.path.join(directory, "symmetric.mtx"),
             "mtx general": os.path.join(directory, "general.mtx"),
             "npz": os.path.join(directory, "matrix.npz")}
    scipy.io.mmwrite(paths["mtx symmetric"], matrix.tocoo(), symmetry="symmetric")
    scipy.io.mmwrite(paths["mtx general"], matrix.tocoo(), symmetry="general")
    scipy.sparse.save_npz(paths["npz"], matrix)
    return paths, matrix


def _same(ours, theirs):
    theirs = theirs.tocsr()
    theirs.sum_duplicates()
    return (ours.shape == theirs.shape and np.array_equal(ours.indptr, theirs.indptr)
            and np.array_equal(ours.indices, theirs.indices)
            and np.array_equal(ours.data, theirs.data))


def measure(paths, matrix, repeat):
    """Time our reader and scipy's on each file (best of ``repeat`` after one warm-up), once
    each result has been checked equal to the matrix written.

    Returns
    -------
    list of ReadResult
    """
    from ..io import load_npz, read_matrix_market
    from ._kernels import Mismatch

    results = []
    for name, path in paths.items():
        if name == "npz":
            ours, peer = (lambda: load_npz(path)), (lambda: scipy.sparse.load_npz(path))
        else:
            ours, peer = (lambda: read_matrix_market(path)), (lambda: scipy.io.mmread(path).tocsr())
        for reader, label in ((ours, "ours"), (peer, "scipy")):
            if not _same(reader(), matrix):
                raise Mismatch(f"{name}: {label} read a matrix other than the one written")
        seconds = best_times({"ours": ours, "scipy": peer}, repeat)
        results.append(ReadResult(name, os.path.getsize(path) / 1e6, matrix.nnz,
                                  seconds["ours"], seconds["scipy"]))
    return results


def format_table(results):
    """Times (ms) and the ratio to scipy, one row per file."""
    header = f"{'file':<15}{'MB':>8}{'stored':>11}{'ours ms':>10}{'scipy ms':>10}{'ours/scipy':>12}"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.name:<15}{r.megabytes:>8.1f}{r.stored:>11}{r.seconds * 1e3:>10.1f}"
                     f"{r.peer_seconds * 1e3:>10.1f}{r.ratio:>12.2f}")
    return "\n".join(lines)


def write_csv(results, path, threads, repeat):
    """One row per file: size, best seconds of both readers and their ratio."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "megabytes", "stored", "threads", "repeat", "ours_s",
                         "scipy_s", "ours_over_scipy"])
        for r in results:
            writer.writerow([r.name, f"{r.megabytes:.3f}", r.stored, threads, repeat,
                             f"{r.seconds:.6g}", f"{r.peer_seconds:.6g}", f"{r.ratio:.4f}"])


def write_plot(results, path, threads, repeat):
    """Bars of our time over scipy's, per file."""
    # A figure of its own, not pyplot's: the caller's backend and open figures stay as they were
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    axis.bar([r.name for r in results], [r.ratio for r in results])
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_ylabel("our time / scipy's")
    axis.set_title(f"Reading files ({counted(threads, 'thread')} ours; best of {repeat})")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def run(args, out=None):
    """Write the files, time the readers and report; returns the exit status."""
    out = sys.stdout if out is None else out
    from ._kernels import Mismatch

    if args.dir is not None and not os.path.isdir(args.dir):
        print(f"error: --dir {args.dir!r} is not a directory", file=sys.stderr)
        return 2
    if args.density > 1:
        print(f"error: --density is at most 1, got {args.density}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        print(f"writing a {args.rows} x {args.rows} symmetric matrix ...", file=sys.stderr)
        paths, matrix = _write_files(directory, args.rows, args.density)
        try:
            results = measure(paths, matrix, args.repeat)
        except Mismatch as exc:
            print(f"error: wrong result, benchmark aborted: {exc}", file=sys.stderr)
            return 1
    print(f"read: pysparse_hpc.io.read_matrix_market against scipy.io.mmread(path).tocsr(), "
          f"pysparse_hpc.io.load_npz against scipy.sparse.load_npz; ours on "
          f"{counted(args.threads, 'thread')} (scipy's Matrix Market parser on its own "
          f"threads, all cores); best of {args.repeat}", file=out)
    print(format_table(results), file=out)
    print("no target: ours checks every Matrix Market number whole and that no entry is "
          "stored with its mirror; each .npz member's declared size and the CSR structure",
          file=out)
    write_outputs(args, out, results, write_csv, write_plot, args.threads, args.repeat)
    return 0
