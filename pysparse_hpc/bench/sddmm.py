"""The ``sddmm`` benchmark: ``(X @ Y.T)`` sampled at A's entries, float32, against torch and NumPy.

Ours runs on CSR (``sddmm(A, X, Y)``) and on ME-BCRS (``sddmm(M, X, Y)`` with
``M = A.to_mebcrs()``, converted once before timing and reported separately). The peers are
``torch.sparse.sampled_addmm(T, X, Y.T, beta=0, alpha=1)`` on a torch CSR tensor with the same
indices (same index dtype: torch accepts int32 and returns int64 indices), on as many threads
as ours, and plain NumPy:
``np.einsum('ij,ij->i', X[rows], Y[cols])`` with the row ids expanded from A's indptr once,
outside the timing (gathered in chunks of at most 2^26 floats, so the large graphs fit in
memory). Every result is checked against NumPy's before anything is timed. Each matrix runs
with the index dtype scipy picks (int32 where it fits) and again with int64. The project's
target, for ours on CSR: at least 3x torch.sparse.sampled_addmm (geometric mean over the rows
with scipy's index dtype).

``--bound`` also times what bounds ours, in the same rounds: the same kernel with the
per-entry sums left out (every load and multiply-add kept, each entry's vector of products
stored instead of summed; its results are not checked, they are not dot products) and our
SpMM ``A @ Y``, which reads the same Y row per stored entry. No kernel that reads the Y row
of every stored entry in CSR order can beat the first by much; the SpMM is a second opinion on
the same reads.

``--backend cuda`` runs the GPU benchmark instead (tensor-core and CUDA-core kernels against
torch's cuSPARSE SDDMM, kernel time only, ``--heads`` for multi-head operands):
see `pysparse_hpc.bench.sddmm_cuda`.
"""
import dataclasses
import functools
import sys

import numpy as np

from .. import _buffers
from ..kernels.cpu._registers import VECTOR_BYTES
from ..kernels.cpu.sddmm import csr_sddmm_unsummed, csr_sddmm_unsummed_serial
from ..ops import _launch, sddmm
from . import positive_int
from ._kernels import (KernelBench, Speedup, Target, add_kernel_arguments, check_close,
                       conversion_seconds, run_benchmark, steady_best_times, torch_csr)

__all__ = ["BENCH", "BOUND_BENCH", "HELP", "add_arguments", "measure", "numpy_sddmm", "prepare",
           "run", "unsummed_sddmm"]

HELP = "SDDMM (float32) on CSR and ME-BCRS, against torch.sparse.sampled_addmm and NumPy"

#: Most floats one NumPy gather (X[rows] or Y[cols]) may hold: 256 MB.
CHUNK_FLOATS = 1 << 26

BENCH = KernelBench(
    kernel="SDDMM",
    operation="dot(X[i], Y[j]) at every stored (i, j) of A, X and Y dense with F columns "
              "(standard normal)",
    width_name="F",
    contenders=(("csr", "ours-csr"), ("mebcrs", "ours-meb"), ("torch", "torch"),
                ("numpy", "numpy")),
    peers_note=("peers: torch.sparse.sampled_addmm(CSR tensor, X, Y.T, beta=0, alpha=1) with A's "
                "index dtype (torch accepts int32 on the CPU; its result has int64 indices) on the "
                "same threads as ours (torch.set_num_threads); NumPy einsum "
                "'ij,ij->i' over X[rows], Y[cols] (single-threaded, chunks of <= 2^26 floats)"),
    speedups=(Speedup("csr", "torch", "csr v torch"), Speedup("csr", "numpy", "csr v numpy"),
              Speedup("mebcrs", "torch", "meb v torch"),
              Speedup("best", "torch", "best v torch", plot=False),
              Speedup("best", "numpy", "best v numpy", plot=False)),
    targets=(Target("torch", 3.0, "torch.sparse.sampled_addmm"),),
)

#: `BENCH` with ``--bound``: ours without the sums ("no-sums") and our SpMM on the same rows.
BOUND_BENCH = dataclasses.replace(
    BENCH,
    contenders=BENCH.contenders + (("unsummed", "no-sums"), ("spmm", "our-spmm")),
    peers_note=(BENCH.peers_note + "; bound: no-sums = ours on CSR without the per-entry sums "
                "(same loads and FMAs, timing only), our-spmm = A @ Y (same Y row per entry)"),
    speedups=BENCH.speedups + (Speedup("unsummed", "torch", "nosum v torch"),
                               Speedup("spmm", "torch", "spmm v torch", plot=False),
                               Speedup("csr", "unsummed", "csr v nosum", plot=False)),
)


def add_arguments(parser):
    """Options of the ``sddmm`` command beyond the common ones."""
    add_kernel_arguments(parser, "F", "widths F of the dense operands X and Y")
    parser.add_argument("--bound", action="store_true",
                        help="also time ours without the per-entry sums and our SpMM A @ Y, "
                             "which read the same rows (what bounds the SDDMM)")
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: our Numba kernels against torch and NumPy (default); cuda: "
                             "our tensor-core kernels on a GPU against torch's cuSPARSE SDDMM "
                             "(R-MAT default 20:16:1 21:8:2), see pysparse_hpc.bench.sddmm_cuda")
    parser.add_argument("--flush-mb", type=float, metavar="MB",
                        help="with --backend cuda: MiB overwritten before each timed run to empty "
                             "the L2 cache (default: 8 times the L2, at least 256; 0: none)")
    parser.add_argument("--heads", type=positive_int, metavar="H",
                        help="with --backend cuda: attention heads, X (rows, H, F) and Y (cols, "
                             "H, F) (default: 1, 2-D X and Y)")


def unsummed_sddmm(A, X, Y):
    """``sddmm(A, X, Y)`` on the CPU without the per-entry sums: timing only.

    The same result allocation, partition, loads and multiply-adds as the 2-D float CSR path
    of `pysparse_hpc.sddmm` (contiguous X and Y of one dtype), but each stored entry's vector of
    products is stored, overlapping the next entry's, instead of summed (`dot_rows_unsummed`).
    Returns that scratch array, whose values mean nothing.

    Raises
    ------
    ValueError
        X and Y are not C-contiguous 2-D arrays of one float dtype with at least one column.
    """
    if not (X.ndim == Y.ndim == 2 and X.dtype == Y.dtype and X.dtype.kind == "f"
            and X.flags.c_contiguous and Y.flags.c_contiguous and X.shape[1] > 0):
        raise ValueError("unsummed_sddmm takes C-contiguous 2-D X and Y of one float dtype, "
                         "with at least one column")
    lanes = VECTOR_BYTES // X.itemsize
    out = _buffers.empty((A.nnz + lanes - 1,), X.dtype)
    flops = 2 * A.nnz * X.shape[1]
    _launch(csr_sddmm_unsummed, csr_sddmm_unsummed_serial, A, A.indptr, flops, A.indptr,
            A.indices, X, Y, X.dtype.type(0), out)
    return out


def numpy_sddmm(rows, cols, X, Y):
    """``np.einsum('ij,ij->i', X[rows], Y[cols])``, in chunks of at most `CHUNK_FLOATS` floats."""
    chunk = max(1, CHUNK_FLOATS // max(1, X.shape[1]))
    if rows.size <= chunk:
        return np.einsum("ij,ij->i", X[rows], Y[cols])
    result = np.empty(rows.size, dtype=np.result_type(X, Y))
    for start in range(0, rows.size, chunk):
        stop = min(start + chunk, rows.size)
        result[start:stop] = np.einsum("ij,ij->i", X[rows[start:stop]], Y[cols[start:stop]])
    return result


def prepare(A, torch, bound=False):
    """Operands of one float32 matrix for every width, and the seconds of its ME-BCRS conversion.

    ``bound``: `measure` also times `unsummed_sddmm` and ``A @ Y`` (``--bound``).
    """
    M, convert_s = conversion_seconds(A)
    rows = np.repeat(np.arange(A.shape[0], dtype=A.indices.dtype), np.diff(A.indptr))
    operands = {"A": A, "M": M, "T": torch_csr(torch, A), "rows": rows, "torch": torch,
                "bound": bound}
    return operands, convert_s


def measure(operands, width, repeat, what=""):
    """Check every SDDMM result against NumPy's, then best seconds by label
    (`steady_best_times`); with ``operands["bound"]`` also time the bound contenders.

    Raises
    ------
    Mismatch
        A result is not within the tolerance of NumPy's.
    """
    A, M, T, rows, torch = (operands[key] for key in ("A", "M", "T", "rows", "torch"))
    rng = np.random.default_rng(width)
    X = rng.standard_normal((A.shape[0], width), dtype=np.float32)
    Y = rng.standard_normal((A.shape[1], width), dtype=np.float32)
    X_torch, Y_torch = torch.from_numpy(X), torch.from_numpy(Y)  # share X's and Y's memory
    cols = A.indices
    functions = {
        "csr": lambda: sddmm(A, X, Y),
        "mebcrs": lambda: sddmm(M, X, Y),
        "torch": lambda: torch.sparse.sampled_addmm(T, X_torch, Y_torch.T, beta=0.0, alpha=1.0),
        "numpy": lambda: numpy_sddmm(rows, cols, X, Y),
    }
    if operands["bound"]:   # timing only: neither result is this SDDMM
        functions["unsummed"] = lambda: unsummed_sddmm(A, X, Y)
        functions["spmm"] = lambda: A @ Y
    reference = functions["numpy"]()
    # Each result as values in A's CSR order (A is canonical, so the orders agree).
    values = {
        "csr": lambda r: r.data,
        "mebcrs": lambda r: r.tocsr().data,
        "torch": lambda r: r.values().numpy(),
    }
    for label, extract in values.items():
        result = extract(functions[label]())
        check_close(f"{what}: {label} vs numpy", result, reference)
        del result
    del reference
    return steady_best_times(functions, repeat)


def run(args, out=None):
    """Run the benchmark over the matrices and widths and report; returns the exit status.

    ``out`` defaults to ``sys.stdout`` at the time of the call.
    """
    out = sys.stdout if out is None else out
    if args.backend == "cuda":
        from . import sddmm_cuda  # imports numba.cuda: only for GPU runs
        return sddmm_cuda.run(args, out=out)
    for option, value in (("--flush-mb", args.flush_mb), ("--heads", args.heads)):
        if value is not None:
            print(f"error: {option} applies to --backend cuda", file=sys.stderr)
            return 2
    bench = BOUND_BENCH if args.bound else BENCH
    return run_benchmark(args, bench, functools.partial(prepare, bound=args.bound), measure,
                         out=out)
