"""The ``spmm`` benchmark: sparse times dense ``C = A @ B`` in float32, against scipy and torch.

Ours runs on CSR (``A @ B``) and on ME-BCRS (``M @ B`` with ``M = A.to_mebcrs()``, converted once
before timing and reported separately). The peers are scipy's ``csr_array @ B`` (single-threaded)
and ``torch.sparse.mm`` on a torch CSR tensor with the same indices (same index dtype) and
float32 values, run on as many threads as ours. Every result is checked against scipy's before
anything is timed. Matrices: the shared ones and R-MAT power-law graphs generated in memory,
each with the index dtype scipy picks (int32 where it fits) and again with int64; widths:
``--n``. The project's targets, for ours on CSR (geometric mean over all matrices and widths,
scipy's index dtype): at least 1.5x torch.sparse.mm and at least 4x scipy.
"""
import sys

import numpy as np

from ._kernels import (KernelBench, Speedup, Target, add_kernel_arguments, check_close,
                       conversion_seconds, run_benchmark, steady_best_times, torch_csr)

__all__ = ["BENCH", "HELP", "add_arguments", "measure", "prepare", "run"]

HELP = "SpMM A @ B (float32) on CSR and ME-BCRS, against scipy and torch.sparse.mm"

BENCH = KernelBench(
    kernel="SpMM",
    operation="C = A @ B, B dense K x N (standard normal)",
    width_name="N",
    contenders=(("csr", "ours-csr"), ("mebcrs", "ours-meb"), ("scipy", "scipy"),
                ("torch", "torch")),
    peers_note=("peers: scipy csr_array @ B (single-threaded); torch.sparse.mm(CSR tensor, B) "
                "with A's index dtype (torch accepts int32 crow/col indices on the CPU) on the "
                "same threads as ours (torch.set_num_threads)"),
    speedups=(Speedup("csr", "torch", "csr v torch"), Speedup("csr", "scipy", "csr v scipy"),
              Speedup("mebcrs", "torch", "meb v torch"),
              Speedup("best", "torch", "best v torch", plot=False),
              Speedup("best", "scipy", "best v scipy", plot=False)),
    targets=(Target("torch", 1.5, "torch.sparse.mm"), Target("scipy", 4.0, "scipy")),
)


def add_arguments(parser):
    """Options of the ``spmm`` command beyond the common ones."""
    add_kernel_arguments(parser, "N", "widths N of the dense operand B (with --backend cuda: "
                                      "128 256)")
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: our Numba kernels against scipy and torch (default); cuda: "
                             "our tensor-core kernels on a GPU against cuSPARSE (R-MAT default "
                             "20:16:1 21:8:2), see pysparse_hpc.bench.spmm_cuda")
    parser.add_argument("--flush-mb", type=float, metavar="MB",
                        help="with --backend cuda: MiB overwritten before each timed run to empty "
                             "the L2 cache (default: 8 times the L2, at least 256; 0: none)")


def prepare(A, torch):
    """Operands of one float32 matrix for every width, and the seconds of its ME-BCRS conversion."""
    M, convert_s = conversion_seconds(A)
    return {"A": A, "M": M, "S": A.to_scipy(), "T": torch_csr(torch, A), "torch": torch}, convert_s


def measure(operands, width, repeat, what=""):
    """Check every product against scipy's, then best seconds by label (`steady_best_times`).

    Raises
    ------
    Mismatch
        A result is not within the tolerance of scipy's.
    """
    A, M, S, T, torch = (operands[key] for key in ("A", "M", "S", "T", "torch"))
    B = np.random.default_rng(width).standard_normal((A.shape[1], width), dtype=np.float32)
    B_torch = torch.from_numpy(B)  # shares B's memory
    functions = {
        "csr": lambda: A @ B,
        "mebcrs": lambda: M @ B,
        "scipy": lambda: S @ B,
        "torch": lambda: torch.sparse.mm(T, B_torch),
    }
    reference = functions["scipy"]()
    for label in ("csr", "mebcrs", "torch"):
        result = functions[label]()
        if label == "torch":
            result = result.numpy()
        check_close(f"{what}: {label} vs scipy", result, reference)
        del result
    del reference
    return steady_best_times(functions, repeat)


def run(args, out=None):
    """Run the benchmark over the matrices and widths and report; returns the exit status."""
    out = sys.stdout if out is None else out
    if args.backend == "cuda":
        from . import spmm_cuda  # imports numba.cuda: only for GPU runs
        return spmm_cuda.run(args, out=out)
    if args.flush_mb is not None:
        print("error: --flush-mb applies to --backend cuda", file=sys.stderr)
        return 2
    return run_benchmark(args, BENCH, prepare, measure, out=out)
