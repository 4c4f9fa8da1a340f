"""The ``norm`` benchmark: GCN's normalization ``D^-1/2 (A + I) D^-1/2`` against PyG's.

Owns the graphs it normalizes, the timing, the peak-memory runs and the report. Ours is
`pysparse_hpc.nn.gcn_norm` on the graph as a float32 `csr_array` (scipy's index dtype), as
our layers take it; the peer is ``torch_geometric.nn.conv.gcn_conv.gcn_norm`` on the same
graph's int64 ``edge_index``, as PyG's ``GCNConv`` calls it. Both add the self-loops the
graph lacks (none of these graphs has any, so every loop is added) and give float32 weights;
the results are checked equal before anything is timed.

Graphs: Cora and CiteSeer (bundled), PubMed's structure from the shared data, and a random
graph of ``--edges`` uniform edges on a tenth as many nodes (the size where memory matters).

Peak memory: each library normalizes each graph in a fresh process, and reports how far its
resident set rose above where it was just before the call (Linux's high-water mark, reset
for the call); elsewhere it is not measured. No target: the figures say what a first call
costs (our layers keep the result on the graph, PyG's ``cached=True`` on the layer).
"""
import csv
import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

from . import best_times, counted, positive_int, write_outputs
from ._data import find_graph, load_matrix, scipy_index_dtype

__all__ = ["GRAPHS", "HELP", "NormResult", "add_arguments", "load", "measure", "peak_memory",
           "run"]

HELP = "GCN's normalization (gcn_norm) against PyG's: time and peak memory"

GRAPHS = ("cora", "citeseer", "pubmed", "random")
LIBRARIES = ("ours", "pyg")
#: Nodes of the random graph per edge.
NODES_PER_EDGE = 0.1
WORKER_TIMEOUT = 900


@dataclass(frozen=True)
class NormResult:
    """One graph's figures.

    Attributes
    ----------
    graph : str
    nodes, edges : int
        The graph's nodes and stored edges (before the loops are added).
    seconds, peer_seconds : float
        Best time of ours and of PyG's.
    peak_mb, peer_peak_mb : float or None
        Peak memory of the call above the process's memory before it (MB); None where not
        measured.
    """

    graph: str
    nodes: int
    edges: int
    seconds: float
    peer_seconds: float
    peak_mb: float = None
    peer_peak_mb: float = None

    @property
    def speedup(self):
        """PyG's time over ours."""
        return self.peer_seconds / self.seconds


def add_arguments(parser):
    """Options of the ``norm`` command beyond the common ones."""
    parser.add_argument("--graphs", nargs="+", choices=GRAPHS, default=list(GRAPHS),
                        metavar="GRAPH", help=f"graphs to normalize (default: all of "
                                              f"{', '.join(GRAPHS)})")
    parser.add_argument("--edges", type=positive_int, default=20_000_000, metavar="E",
                        help="edges of the random graph (default: 20,000,000)")
    parser.add_argument("--skip-memory", action="store_true",
                        help="time only: no fresh process per library and graph")


def load(name, data_dir, edges):
    """The graph ``name`` as ours takes it (a float32 `csr_array`) and as PyG's ``edge_index``.

    Raises
    ------
    FileNotFoundError
        PubMed's structure is not in ``data_dir``.
    """
    import torch

    from .. import datasets
    from .._csr import csr_array
    if name in ("cora", "citeseer"):
        adj = datasets.load(name).adj
    elif name == "pubmed":
        adj = load_matrix(find_graph("pubmed", data_dir), index_dtype="scipy")
    else:
        nodes = max(int(edges * NODES_PER_EDGE), 2)
        rng = np.random.default_rng(0)
        rows, cols = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges)
        apart = rows != cols   # no self-loops: every one is added
        # scipy's index dtype, as for the other graphs (int64 coordinates would keep int64)
        adj = csr_array((np.ones(int(apart.sum()), np.float32), (rows[apart], cols[apart])),
                        shape=(nodes, nodes),
                        index_dtype=scipy_index_dtype((nodes, nodes), int(apart.sum())))
        del rows, cols, apart
        adj = adj.canonical()
        adj.data[:] = 1.0   # an edge drawn twice is one edge, as in PyG's unweighted input
    adj = adj.astype(np.float32, copy=False).canonical()
    rows = np.repeat(np.arange(adj.shape[0]), np.diff(adj.indptr))
    # Row i holds the edges into node i: PyG's target is the row, its source the column.
    edge_index = torch.from_numpy(np.stack([adj.indices.astype(np.int64), rows]))
    return adj, edge_index


def _peer():
    from torch_geometric.nn.conv.gcn_conv import gcn_norm
    return gcn_norm


def _check_equal(ours, edge_index, weights, n):
    """Raise `Mismatch` unless PyG's weighted edges are our normalized matrix."""
    import scipy.sparse

    from ._kernels import Mismatch
    theirs = scipy.sparse.csr_array((weights.numpy(), (edge_index[1].numpy(),
                                                       edge_index[0].numpy())), shape=(n, n))
    theirs.sum_duplicates()
    same = (np.array_equal(ours.indptr, theirs.indptr)
            and np.array_equal(ours.indices, theirs.indices)
            and np.allclose(ours.data, theirs.data, rtol=1e-5, atol=0))
    if not same:
        raise Mismatch("gcn_norm: ours and PyG's give different normalized graphs")


def measure(adj, edge_index, repeat):
    """Best seconds of ours and of PyG's after checking their results equal:
    ``(ours, pyg)``."""
    from ..nn import gcn_norm
    peer = _peer()
    n = adj.shape[0]
    _check_equal(gcn_norm(adj), *peer(edge_index, num_nodes=n), n)
    seconds = best_times({"ours": lambda: gcn_norm(adj),
                          "pyg": lambda: peer(edge_index, num_nodes=n)}, repeat)
    return seconds["ours"], seconds["pyg"]


def peak_memory(graph, library, data_dir, edges, threads):
    """Peak megabytes one call adds, in a fresh process; None where it cannot be measured.

    Raises
    ------
    RuntimeError
        The process failed.
    """
    command = [sys.executable, "-m", "pysparse_hpc.bench._norm_worker", graph, library,
               str(data_dir or ""), str(edges), str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=WORKER_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"the {library} memory run on {graph} failed: "
                           f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]


def format_table(results):
    """Times (ms), PyG's time over ours, and peak memory (MB), one row per graph."""
    header = (f"{'graph':<10}{'nodes':>10}{'edges':>11}{'ours ms':>10}{'PyG ms':>10}"
              f"{'PyG/ours':>10}{'ours MB':>10}{'PyG MB':>10}{'ours/PyG mem':>14}")
    lines = [header, "-" * len(header)]
    for r in results:
        memory = ("n/a", "n/a", "n/a") if r.peak_mb is None else (
            f"{r.peak_mb:.1f}", f"{r.peer_peak_mb:.1f}",
            f"{r.peak_mb / r.peer_peak_mb:.2f}" if r.peer_peak_mb else "n/a")
        lines.append(f"{r.graph:<10}{r.nodes:>10}{r.edges:>11}{r.seconds * 1e3:>10.2f}"
                     f"{r.peer_seconds * 1e3:>10.2f}{r.speedup:>10.2f}{memory[0]:>10}"
                     f"{memory[1]:>10}{memory[2]:>14}")
    return "\n".join(lines)


def write_csv(results, path, threads, repeat):
    """One row per graph: sizes, best seconds of both, the speedup and the peaks."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["graph", "nodes", "edges", "threads", "repeat", "ours_s", "pyg_s",
                         "pyg_over_ours", "ours_peak_mb", "pyg_peak_mb"])
        for r in results:
            writer.writerow([r.graph, r.nodes, r.edges, threads, repeat, f"{r.seconds:.6g}",
                             f"{r.peer_seconds:.6g}", f"{r.speedup:.4f}",
                             "" if r.peak_mb is None else f"{r.peak_mb:.2f}",
                             "" if r.peer_peak_mb is None else f"{r.peer_peak_mb:.2f}"])


def write_plot(results, path, threads, repeat):
    """Bars of our time and our peak memory over PyG's, per graph."""
    # A figure of its own, not pyplot's: the caller's backend and open figures stay as they were
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional dependency
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    places = np.arange(len(results))
    axis.bar(places - 0.2, [1 / r.speedup for r in results], 0.4, label="time")
    axis.bar(places + 0.2, [r.peak_mb / r.peer_peak_mb if r.peak_mb and r.peer_peak_mb
                            else np.nan for r in results], 0.4, label="peak memory")
    axis.set_xticks(places, [r.graph for r in results])
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_ylabel("ours / PyG's")
    axis.set_title(f"gcn_norm against PyG ({counted(threads, 'thread')}; best of {repeat})")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def run(args, out=None):
    """Normalize each graph, time both libraries, measure their peaks and report; returns the
    exit status."""
    out = sys.stdout if out is None else out
    import torch

    from ._kernels import Mismatch
    torch.set_num_threads(args.threads)
    results = []
    for name in dict.fromkeys(args.graphs):
        try:
            adj, edge_index = load(name, args.data_dir, args.edges)
        except FileNotFoundError as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
            continue
        print(f"{name}: {adj.shape[0]} nodes, {adj.nnz} edges ...", file=sys.stderr)
        try:
            seconds, peer_seconds = measure(adj, edge_index, args.repeat)
        except Mismatch as exc:
            print(f"error: wrong result, benchmark aborted: {exc}", file=sys.stderr)
            return 1
        nodes, edges = adj.shape[0], adj.nnz
        del adj, edge_index   # out of the way of the memory runs
        peaks = (None, None) if args.skip_memory else tuple(
            peak_memory(name, library, args.data_dir, args.edges, args.threads)
            for library in LIBRARIES)
        results.append(NormResult(name, nodes, edges, seconds, peer_seconds, *peaks))
    if not results:
        print("error: no graph to normalize", file=sys.stderr)
        return 2
    print(f"norm: pysparse_hpc.nn.gcn_norm(csr_array) against torch_geometric's "
          f"gcn_norm(edge_index), self-loops added, float32; "
          f"{counted(args.threads, 'thread')}, best of {args.repeat}; peak memory of one call "
          f"in a fresh process", file=out)
    print(format_table(results), file=out)
    print("no target: the cost of a first call (the layers keep the result)", file=out)
    write_outputs(args, out, results, write_csv, write_plot, args.threads, args.repeat)
    return 0
