"""The ``reorder`` benchmark: what each ordering costs and what it buys the ME-BCRS SpMM.

For every matrix (the shared ones and generated graphs with planted communities whose node ids
were shuffled) and every method of `pysparse_hpc.reorder`, plus scipy's
``reverse_cuthill_mckee`` as the peer: the time to compute the order (ours includes
symmetrizing the pattern, as scipy's does; scipy's runs on one thread, ours on the library's
threads, and the header and the verdict say so), the bandwidth, the 8x1 and 16x1 vectors of the
reordered matrix, and the CPU ME-BCRS SpMM time on it (``permute(A, perm).to_mebcrs() @ X[perm]``
against ``A.to_mebcrs() @ X``; the permuting and conversion are not timed). Every reordered
product is checked against the original one, un-permuted. The break-even column says after
how many SpMM calls the ordering has paid for itself. A planted graph also gets a row for its
planted order (community by community, untimed): the best a community ordering can do there.

Every matrix runs with the index dtype scipy picks for it (int32 where it fits, as a user's
scipy matrix has it): all the rows above. RCM and scipy's RCM are timed again on the same matrix
with int64 indices, a second case reported beside the first and not judged.

The project's targets: RCM no slower than scipy's (geometric mean); rabbit at most 1 s per
million stored entries; on the shuffled planted-community graphs rabbit cuts 8x1 vectors by at
least 1.3x and speeds up the ME-BCRS SpMM by at least 1.2x. Where even the planted order cuts
less than 1.3x (communities too weak), the verdict says the target is out of reach and how
much of the planted order's cut rabbit reaches. Matrices where an ordering does not pay are
listed, not hidden.
"""
import argparse
import csv
import dataclasses
import gc
import math
import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from .._reorder import bandwidth, inverse_permutation, permute, reorder
from .._stats import block_stats
from . import best_times, counted, geometric_mean, positive_width, shown_ratio
from ._data import index_variants, scipy_index_dtype
from ._kernels import (MatrixCase, _warm_up_runtime, check_close, keep_requested, shared_cases,
                       steady_best_times)

__all__ = ["HELP", "PLANTED", "ReorderResult", "add_arguments", "measure", "run"]

HELP = "orderings (rabbit, rcm, degree) against scipy's RCM: time, block density, SpMM gain"

#: Generated graphs: (communities, community size, internal degree, external degree). The last
#: one has weak communities (as many edges leave a community as stay in it).
PLANTED = ((3125, 32, 8, 2), (6250, 16, 8, 2), (3125, 32, 4, 4))

#: Methods in table order; ``scipy-rcm`` is the peer.
METHODS = ("none", "degree", "rcm", "rabbit")
PEER = "scipy-rcm"
#: On a planted graph, the order that groups its communities: the ceiling of what a community
#: ordering can achieve there (not a method; it is given, not computed).
PLANTED_ORDER = "planted"

RABBIT_SECONDS_PER_MILLION = 1.0
PLANTED_VECTOR_CUT = 1.3
PLANTED_SPMM_SPEEDUP = 1.2


@dataclass(frozen=True)
class ReorderResult:
    """One ordering of one matrix.

    Attributes
    ----------
    name, group, method : str
        ``group`` is ``suitesparse``, ``graph`` or ``planted``; ``method`` a `reorder` method
        or ``scipy-rcm``.
    n, nnz : int
    seconds : float
        Best time to compute the order.
    bandwidth, vectors8, vectors16 : int
        Of the reordered matrix.
    spmm_seconds : float
        ME-BCRS SpMM on the reordered matrix (NaN for the peer, whose order is not multiplied,
        and for the int64 case, whose orders are the same).
    index_dtype : str
        Of the matrix ours and scipy's ordered: ``"int32"`` or ``"int64"``.
    """

    name: str
    group: str
    method: str
    n: int
    nnz: int
    seconds: float
    bandwidth: int
    vectors8: int
    vectors16: int
    spmm_seconds: float
    index_dtype: str = "int32"

    @property
    def judged(self):
        """Whether this row has the index dtype scipy picks for the matrix (the targets' rows)."""
        return self.index_dtype == scipy_index_dtype((self.n, self.n), self.nnz).name


#: Timed again with int64 indices (the second index dtype): ours and the peer.
SECOND_CASE = ("rcm", PEER)


def add_arguments(parser):
    """Options of the ``reorder`` command beyond the common ones."""
    parser.add_argument("--matrix", action="append", metavar="NAME",
                        help="benchmark only this matrix (repeatable; a shared name or a planted "
                             "one such as planted-c32-i8-e2; default: all)")
    parser.add_argument("--n", type=positive_width, default=128, metavar="N",
                        help="width of the dense operand of the SpMM (default: 128)")
    planted = parser.add_mutually_exclusive_group()
    default = " ".join(":".join(map(str, spec)) for spec in PLANTED)
    planted.add_argument("--planted", type=_planted_spec, nargs="+", metavar="C:S:IN:OUT",
                         help="planted-community graphs to generate: C communities of S nodes, "
                              f"expected degree IN inside and OUT anywhere (default: {default})")
    planted.add_argument("--no-planted", action="store_true",
                         help="skip the generated planted-community graphs")


#: The largest planted graph ``--planted`` makes (C x S nodes).
MAX_PLANTED_NODES = 1 << 26
#: The most stored entries a ``--planted`` graph may expect (nodes x expected degree).
MAX_PLANTED_ENTRIES = 1 << 32


def _planted_spec(text):
    """``C:S:IN:OUT`` -> (communities, size, internal degree, external degree)."""
    parts = text.split(":")
    try:
        values = [int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3])]
    except (ValueError, IndexError):
        values = None
    if (values is None or len(parts) != 4 or values[0] < 1 or values[1] < 1
            or not all(0 <= v < math.inf for v in values[2:])):
        raise argparse.ArgumentTypeError(
            f"expected C:S:IN:OUT (C, S >= 1 integers, IN, OUT finite and >= 0), got {text!r}")
    if values[0] * values[1] > MAX_PLANTED_NODES:
        raise argparse.ArgumentTypeError(
            f"{text!r} asks for {values[0] * values[1]} nodes; at most {MAX_PLANTED_NODES}")
    degree = values[2] + values[3]
    if values[0] * values[1] * degree > MAX_PLANTED_ENTRIES:
        # The generator draws every edge at once: a larger graph fails at that allocation (or
        # in numpy's Poisson draw), after the matrices before it were measured.
        raise argparse.ArgumentTypeError(
            f"{text!r} asks for about {values[0] * values[1] * degree:.3g} stored entries (C x S "
            f"x (IN + OUT)); at most {MAX_PLANTED_ENTRIES}")
    values[2:] = [int(v) if float(v).is_integer() else v for v in values[2:]]
    return tuple(values)


@dataclass(frozen=True)
class PlantedCase(MatrixCase):
    """A generated planted-community graph; ``planted_order()`` numbers it community by community
    (call it after ``load()``)."""

    planted_order: object = None


def _planted_case(n_communities, size, internal, external):
    labels = {}

    def load():
        from ..generators import planted_partition
        A, labels["of"] = planted_partition(n_communities, size, internal, external, seed=1,
                                            shuffle=True)
        return A

    def planted_order():
        return np.argsort(labels.pop("of"), kind="stable")

    return PlantedCase(f"planted-c{size}-i{internal}-e{external}", "planted", load,
                       f"{n_communities} communities of {size} nodes, expected degree "
                       f"{internal} inside + {external} anywhere, node ids shuffled",
                       planted_order)


def _select_cases(args, err):
    cases = shared_cases(args.data_dir, err)
    if not args.no_planted:
        planted = [_planted_case(*spec) for spec in dict.fromkeys(args.planted or PLANTED)]
        names = [case.name for case in planted]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # the name holds the community size and degrees, not the count
            print(f"error: --planted: two graphs would both be named {twice[0]} (the same "
                  f"community size and degrees); measure them in separate runs", file=err)
            return None
        cases += planted
        # graphs generated on request (--planted given) are run whatever --matrix names
        requested = {case.name for case in planted} if args.planted else set()
        return keep_requested(cases, args, err, requested)
    return keep_requested(cases, args, err)


def measure(case, A, width, repeat, second=None):
    """All orderings of one matrix: list of `ReorderResult` (the peer last).

    A `PlantedCase` also gets a row for its planted order (``PLANTED_ORDER``, no time).

    Parameters
    ----------
    case : MatrixCase
    A : csr_array
        With the index dtype scipy picks for it (`index_variants`).
    width : int
        Columns of the SpMM's dense operand.
    repeat : int
    second : csr_array, optional
        The same matrix with int64 indices: `SECOND_CASE` is timed again on it and appended
        (same orders, checked; no SpMM).

    Returns
    -------
    list of ReorderResult

    Raises
    ------
    Mismatch
        A reordered product, un-permuted, differs from the original one.
    RuntimeError
        An ordering of ``second`` differs from the same ordering of ``A``.
    """
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    scipy_A = A.to_scipy()
    orderers = {method: (lambda method=method: reorder(A, method)) for method in METHODS}
    orderers[PEER] = lambda: reverse_cuthill_mckee(scipy_A)
    seconds = best_times(orderers, repeat)
    perms = {label: np.asarray(orderer(), dtype=np.int64) for label, orderer in orderers.items()}
    methods = METHODS
    if getattr(case, "planted_order", None) is not None:
        perms = {PLANTED_ORDER: np.asarray(case.planted_order(), dtype=np.int64), **perms}
        seconds[PLANTED_ORDER] = math.nan
        methods = METHODS + (PLANTED_ORDER,)

    X = np.random.default_rng(width).standard_normal((A.shape[1], width), dtype=np.float32)
    reference = scipy_A @ X
    reordered = {label: permute(A, perm) for label, perm in perms.items()}
    products = {}
    for method in methods:
        perm = perms[method]
        M = reordered[method].to_mebcrs()
        X_perm = X[perm]
        check_close(f"{case.name} {method}: ME-BCRS SpMM un-permuted vs original",
                    (M @ X_perm)[inverse_permutation(perm)], reference)
        products[method] = lambda M=M, X_perm=X_perm: M @ X_perm
    spmm_seconds = steady_best_times(products, repeat)

    results = []
    index_dtype = str(A.index_dtype)
    for label in methods + (PEER,):
        B = reordered[label]
        results.append(ReorderResult(
            case.name, case.group, label, A.shape[0], A.nnz, seconds[label], bandwidth(B),
            block_stats(B, window=8).n_vectors, block_stats(B, window=16).n_vectors,
            spmm_seconds.get(label, math.nan), index_dtype))
    if second is not None:
        results += _measure_second(case, second, perms, results, repeat)
    return results


def _measure_second(case, A, perms, first_rows, repeat):
    """`SECOND_CASE` timed on ``A`` (int64 indices); its orders must equal ``perms``."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    scipy_A = A.to_scipy()
    orderers = {"rcm": lambda: reorder(A, "rcm"),
                PEER: lambda: reverse_cuthill_mckee(scipy_A)}
    seconds = best_times(orderers, repeat)
    by_method = {row.method: row for row in first_rows}
    results = []
    for label in SECOND_CASE:
        if not np.array_equal(np.asarray(orderers[label](), dtype=np.int64), perms[label]):
            raise RuntimeError(f"{case.name}: {label} orders the {A.index_dtype} matrix "
                               "differently from the first index dtype's")
        results.append(dataclasses.replace(by_method[label], seconds=seconds[label],
                                           spmm_seconds=math.nan,
                                           index_dtype=str(A.index_dtype)))
    return results


# --- report --------------------------------------------------------------------------------

def _by_method(results, judged=True):
    """{matrix name: {method: result}} in input order, of the rows with scipy's index dtype
    (``judged=False``: of the second index dtype's rows)."""
    table = {}
    for result in results:
        if result.judged == judged:
            table.setdefault(result.name, {})[result.method] = result
    return table


def _derived(row, baseline, peer):
    """Vector cut, SpMM speedup, break-even calls and time ratio to scipy's RCM of one row."""
    cut = baseline.vectors8 / row.vectors8 if row.vectors8 else math.nan
    speedup = baseline.spmm_seconds / row.spmm_seconds
    saved = baseline.spmm_seconds - row.spmm_seconds
    # inf: the ordering never pays; NaN: its SpMM was not timed (the peer, the int64 rows),
    # or the row is the baseline itself, which has nothing to pay back: the table shows "-"
    # there and the CSV must not write "never"
    if row.method == "none" or math.isnan(saved):
        break_even = math.nan
    else:
        break_even = row.seconds / saved if saved > 0 else math.inf
    versus_peer = peer.seconds / row.seconds if row.method == "rcm" else math.nan
    return cut, speedup, break_even, versus_peer


def format_table(results):
    """The report table, one line per matrix and method."""
    heading = (f"{'matrix':<22} {'method':<9} {'index':<5} {'ms':>8} {'s/M nnz':>7} {'v scipy':>7} "
               f"{'bandwidth':>9} {'vec8':>8} {'vec16':>8} {'nnz/v8':>6} {'cut8':>5} "
               f"{'spmm ms':>8} {'speedup':>7} {'break-even':>10}")
    lines = [heading, "-" * len(heading)]
    second = _by_method(results, judged=False)
    for name, rows in _by_method(results).items():
        baseline = rows["none"]
        cases = [(row, rows[PEER]) for row in rows.values()]
        cases += [(row, second[name][PEER]) for row in second.get(name, {}).values()]
        for row, peer in cases:
            method = row.method
            cut, speedup, break_even, versus_peer = _derived(row, baseline, peer)
            spmm = "-" if math.isnan(row.spmm_seconds) else f"{row.spmm_seconds * 1e3:8.2f}"
            gain = "-" if math.isnan(speedup) else f"{speedup:6.2f}x"
            if math.isnan(row.spmm_seconds) or math.isnan(row.seconds) or method == "none":
                even = "-"
            elif math.isinf(break_even):
                even = "never"
            else:
                even = f"{break_even:.1f} calls"
            timed = not math.isnan(row.seconds)
            lines.append(
                f"{name:<22} {method:<9} {row.index_dtype:<5} "
                f"{f'{row.seconds * 1e3:8.2f}' if timed else '-':>8} "
                f"{f'{row.seconds / row.nnz * 1e6:7.3f}' if timed and row.nnz else '-':>7} "
                f"{'-' if math.isnan(versus_peer) else f'{versus_peer:6.2f}x':>7} "
                f"{row.bandwidth:>9} {row.vectors8:>8} {row.vectors16:>8} "
                f"{row.nnz / max(row.vectors8, 1):6.2f} "
                f"{'-' if math.isnan(cut) else f'{cut:5.2f}':>5} {spmm:>8} {gain:>7} "
                f"{even:>10}")
    return "\n".join(lines)


def verdicts(results, threads=None):
    """Lines saying whether each target is met, and where reordering does not pay.

    ``threads``: ours' thread count, named in the RCM line beside scipy's single thread.
    """
    table = _by_method(results)
    lines = []
    rcm_ratios = {name: rows[PEER].seconds / rows["rcm"].seconds for name, rows in table.items()}
    mean = geometric_mean(rcm_ratios.values())
    slower = sorted(name for name, ratio in rcm_ratios.items() if ratio < 1)
    picked = "/".join(dict.fromkeys(rows["rcm"].index_dtype for rows in table.values()))
    threads_note = ("" if threads is None else f" (ours on {threads} thread"
                    f"{'s' if threads != 1 else ''}, scipy's single-threaded)")
    lines.append(f"target: RCM no slower than scipy's ({picked} indices as scipy picks them): "
                 f"geo-mean {shown_ratio(mean, mean >= 1, 1.0)}x scipy's speed{threads_note} -> "
                 f"{'MET' if mean >= 1 else 'NOT MET'}"
                 + (f" (slower on {', '.join(slower)})" if slower else ""))
    second = _by_method(results, judged=False)
    if second:
        ratios = [rows[PEER].seconds / rows["rcm"].seconds for rows in second.values()]
        dtypes = "/".join(dict.fromkeys(rows["rcm"].index_dtype for rows in second.values()))
        lines.append(f"with {dtypes} indices (second case, not judged): RCM geo-mean "
                     f"{geometric_mean(ratios):.2f}x scipy's speed ({len(ratios)} matrices)")
    per_million = {name: rows["rabbit"].seconds / rows["rabbit"].nnz * 1e6
                   for name, rows in table.items() if rows["rabbit"].nnz}
    if per_million:
        worst = max(per_million, key=per_million.get)
        met = per_million[worst] <= RABBIT_SECONDS_PER_MILLION
        shown = shown_ratio(per_million[worst], met, RABBIT_SECONDS_PER_MILLION, at_most=True,
                            digits=3)
        lines.append(f"target: rabbit <= {RABBIT_SECONDS_PER_MILLION:g} s per 1M nnz: worst "
                     f"{shown} s on {worst} -> {'MET' if met else 'NOT MET'}")
    for name, rows in table.items():
        if rows["none"].group == "planted":
            lines.append(_planted_verdict(name, rows))
    for method in ("rabbit", "rcm"):
        losing = [f"{name} ({_derived(rows[method], rows['none'], rows[PEER])[1]:.2f}x)"
                  for name, rows in table.items()
                  if rows[method].spmm_seconds >= rows["none"].spmm_seconds]
        lines.append(f"{method} does not speed up the ME-BCRS SpMM on: "
                     f"{', '.join(losing) if losing else 'none'}")
    return lines


def _planted_verdict(name, rows):
    """Whether rabbit meets the planted-graph target, measured against what the planted order
    itself achieves: where even that cuts fewer vectors than the target, no community ordering
    can meet it."""
    if not rows["none"].nnz:
        # No vectors to cut: a ratio would be 0/0, and the SpMM times are of an empty product.
        return f"target: {name}: not judged (no stored entries)"
    cut, speedup, _, _ = _derived(rows["rabbit"], rows["none"], rows[PEER])
    cut_met, speedup_met = cut >= PLANTED_VECTOR_CUT, speedup >= PLANTED_SPMM_SPEEDUP
    line = (f"target: {name}: rabbit cuts 8x1 vectors "
            f"{shown_ratio(cut, cut_met, PLANTED_VECTOR_CUT)}x (>= {PLANTED_VECTOR_CUT}) and "
            f"speeds up ME-BCRS SpMM {shown_ratio(speedup, speedup_met, PLANTED_SPMM_SPEEDUP)}x "
            f"(>= {PLANTED_SPMM_SPEEDUP}) -> ")
    met = cut_met and speedup_met
    planted = rows.get(PLANTED_ORDER)
    if planted is None:
        return line + ("MET" if met else "NOT MET")
    ceiling, _, _, _ = _derived(planted, rows["none"], rows[PEER])
    shown = shown_ratio(ceiling, ceiling >= PLANTED_VECTOR_CUT, PLANTED_VECTOR_CUT)
    reached = f"; the planted order cuts {shown}x, rabbit reaches {cut / ceiling:.0%} of it"
    if not met and ceiling < PLANTED_VECTOR_CUT:
        return line + f"OUT OF REACH (weak communities{reached})"
    return line + ("MET" if met else "NOT MET") + f" ({reached[2:]})"


def write_csv(results, path, threads, repeat, width):
    """One row per matrix and method, with the derived columns."""
    table = _by_method(results)
    second = _by_method(results, judged=False)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["matrix", "group", "method", "index_dtype", "n", "nnz", "seconds",
                         "bandwidth",
                         "vectors8", "vectors16", "spmm_seconds", "vector_cut", "spmm_speedup",
                         "break_even_calls", "threads", "repeat", "width"])
        for name, rows in table.items():
            for row in list(rows.values()) + list(second.get(name, {}).values()):
                cut, speedup, break_even, _ = _derived(row, rows["none"], rows[PEER])
                writer.writerow([row.name, row.group, row.method, row.index_dtype, row.n, row.nnz,
                                 f"{row.seconds:.6g}", row.bandwidth, row.vectors8,
                                 row.vectors16, f"{row.spmm_seconds:.6g}", f"{cut:.4f}",
                                 f"{speedup:.4f}", f"{break_even:.4g}", threads, repeat, width])


def write_plot(results, path, threads, repeat, width):
    """Two bar charts per matrix and method: 8x1 vector cut and ME-BCRS SpMM speedup."""
    # A figure of its own, not pyplot's: the caller's backend and open figures stay as they were
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure

    table = _by_method(results)
    names = list(table)
    methods = [m for m in METHODS + (PLANTED_ORDER,) if m != "none"
               and any(m in table[n] for n in names)]
    positions = np.arange(len(names))
    bar = 0.8 / len(methods)
    figure = Figure(figsize=(max(8, 0.7 * len(names)), 7))
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 1, sharex=True)
    for k, method in enumerate(methods):
        derived = [_derived(table[n][method], table[n]["none"], table[n][PEER])
                   if method in table[n] else (math.nan, math.nan) for n in names]
        for axis, values in zip(axes, ([d[0] for d in derived], [d[1] for d in derived])):
            axis.bar(positions + (k - (len(methods) - 1) / 2) * bar, values, bar, label=method)
    for axis, label in zip(axes, ("8x1 vectors: original / reordered",
                                  f"ME-BCRS SpMM speedup (N={width})")):
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_ylabel(label)
        axis.legend(fontsize=8)
    axes[1].set_xticks(positions, names, rotation=45, ha="right")
    dtypes = "/".join(dict.fromkeys(row.index_dtype for rows in table.values()
                                    for row in rows.values()))
    axes[0].set_title(f"Reordering gains ({dtypes} indices, {counted(threads, 'thread')}; "
                      f"scipy's RCM single-threaded; best of {repeat})")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def run(args, out=None):
    """Run the benchmark over the matrices and report; returns the exit status."""
    out = sys.stdout if out is None else out
    from ._kernels import Mismatch

    cases = _select_cases(args, sys.stderr)
    if cases is None:
        return 2
    _warm_up_runtime()
    results, notes = [], []
    with tqdm(total=len(cases), desc="reorder", unit="matrix") as progress:
        for case in cases:
            progress.set_postfix_str(case.name)
            A = case.load()
            if A.shape[0] != A.shape[1]:  # an ordering permutes rows and columns alike
                print(f"note: {case.name} is not square ({A.shape[0]} x {A.shape[1]}), "
                      "skipped: an ordering needs a square matrix", file=sys.stderr)
                del A
                progress.update()
                continue
            if case.note:
                notes.append(f"{case.name}: {case.note}: {A.shape[0]} nodes, {A.nnz} stored "
                             "entries")
            variants = [matrix for _, matrix in index_variants(A)]
            del A
            try:
                results += measure(case, variants[0], args.n, args.repeat,
                                   second=variants[1] if len(variants) > 1 else None)
            except Mismatch as exc:
                progress.close()
                print(f"error: wrong result, benchmark aborted: {exc}", file=sys.stderr)
                return 1
            del variants
            gc.collect()
            progress.update()
    if not results:
        print("error: no square matrix to order among those selected", file=sys.stderr)
        return 2
    print(f"reorder: orderings of each matrix, then C = permute(A, perm).to_mebcrs() @ X[perm] "
          f"with X {args.n} columns (float32, {counted(args.threads, 'thread')}); best of "
          f"{args.repeat}; data: {args.data_dir}", file=out)
    # scipy's RCM has no threads while ours tries its starts on the library's: say so, since
    # 'v scipy' compares the two as their users run them, not at equal threads.
    print(f"peer: scipy.sparse.csgraph.reverse_cuthill_mckee (symmetrizes, as ours does; "
          f"single-threaded, ours on {args.threads} thread{'s' if args.threads != 1 else ''}); "
          "'v scipy' = scipy RCM time / ours; cut8 = original 8x1 vectors / reordered; "
          "break-even = ordering time / SpMM time saved per call", file=out)
    print("index: the index dtype ours and scipy ordered: the one scipy picks (int32 where it "
          "fits; judged), then rcm and scipy-rcm again with int64 indices (not judged)",
          file=out)
    for note in notes:
        print(note, file=out)
    print(format_table(results), file=out)
    for line in verdicts(results, args.threads):
        print(line, file=out)
    if args.csv:
        write_csv(results, args.csv, args.threads, args.repeat, args.n)
        print(f"wrote {args.csv}", file=out)
    if args.plot:
        write_plot(results, args.plot, args.threads, args.repeat, args.n)
        print(f"wrote {args.plot}", file=out)
    return 0
