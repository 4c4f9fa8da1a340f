"""``sddmm --backend cuda``: the tensor-core SDDMM on a GPU against torch, kernel time only.

Computes ``(X @ Y.T)`` at A's stored entries (``torch.sparse.sampled_addmm(T, X, Y.T, beta=0,
alpha=1)``), X and Y standard normal with F columns. Contenders, each checked against NumPy in
float64 before it is timed:

- ours-tf32 / ours-fp16: the ME-BCRS tensor-core kernels (tf32 ``mma.m16n8k8``, fp16
  ``mma.m16n8k16``); fp16 reads X and Y in half precision; both accumulate and write float32,
  one value per ME-BCRS slot (padding slots 0), zeroed by the launch;
- ours-csr: our CUDA-core CSR kernel in float32, one thread per stored entry;
- torch-fp32 / torch-fp16: ``torch.sparse.sampled_addmm`` on a CUDA CSR tensor (cuSPARSE's
  SDDMM) with int64 indices and float32 / float16 X, Y and values; a dtype torch refuses (torch
  2.11 has no float16 ``sampled_addmm``) is noted and not measured, and without a CUDA build of
  torch both are reported as not measured.

``--heads H`` (H > 1): X (rows, H, F) and Y (cols, H, F), as multi-head attention has them;
ours runs the multi-head path (one launch per head on strided views, results (slots, H)); torch
runs once on a batched CSR tensor of shape (H, rows, cols) holding A's pattern H times, with X
and Y laid out (H, rows, F) and (H, cols, F) before timing (torch's batched layout; its CUDA
``sampled_addmm`` takes batches, so one call does every head). GFLOP/s count 2 nnz F H
operations.

Timing, as for ``spmm --backend cuda`` (`pysparse_hpc.bench.spmm_cuda`, whose timer this
reuses): each contender runs once untimed, then ``--repeat`` times between two CUDA events on
the default stream; the median is kept. Before every timed run a buffer several times the size
of the L2 cache is overwritten, so no run finds its inputs in L2, and the GPU is still busy when
the launch is queued, so the host's launch cost stays outside the events. Operands are on the
device and outputs allocated before timing (torch allocates its result inside its call, as a
user's call would); the conversion to ME-BCRS is timed separately. Under the CUDA simulator the
harness runs end to end but its times are the Python simulation's wall clock.

No target is set for the GPU SDDMM: the geometric means of ours-tf32 over torch-fp32, ours-fp16
over torch-fp16 and ours-tf32 over ours-csr are reported as they are.
"""
import dataclasses
import math
import sys
import time
import warnings

import numpy as np
from tqdm import tqdm

from ._kernels import (DEFAULT_WIDTHS, KernelBench, KernelResult, Mismatch, Speedup,
                       format_table, load_case, write_plot)
from .sddmm import numpy_sddmm
from .spmm_cuda import GpuTarget, _device_name, _write_csv, gpu_verdicts, start

__all__ = ["BENCH", "DEFAULT_GPU_SDDMM_WIDTHS", "GPU_SDDMM_REPORTS", "HeadsResult", "measure",
           "prepare", "run"]

#: Feature widths F of the GPU run: those of the CPU ``sddmm`` benchmark.
DEFAULT_GPU_SDDMM_WIDTHS = DEFAULT_WIDTHS

#: Tolerance of the agreement checks, by contender:
#: ``|ours - exact| <= tol * ||X[i]|| ||Y[j]|| + 1e-6`` (the norms bound ``sum |X[i, f] Y[j, f]|``,
#: to which the rounding of tf32 / fp16 inputs is proportional).
TOLERANCE = {"tf32": 4e-3, "fp16": 4e-3, "csr": 1e-5, "torch": 1e-5, "torch16": 4e-3}

#: torch's contenders and the dtype of their X, Y and values.
_TORCH_DTYPES = (("torch", "float32"), ("torch16", "float16"))

BENCH = KernelBench(
    kernel="SDDMM on the GPU",
    operation="dot(X[i], Y[j]) at every stored (i, j) of A, X and Y dense with F columns "
              "(standard normal); results in float32 (torch-fp16: float16)",
    width_name="F",
    contenders=(("tf32", "ours-tf32"), ("fp16", "ours-fp16"), ("csr", "ours-csr"),
                ("torch", "torch-fp32"), ("torch16", "torch-fp16")),
    peers_note=("peers: torch.sparse.sampled_addmm(CUDA CSR tensor, X, Y.T, beta=0, alpha=1) "
                "(cuSPARSE), int64 indices, float32 and float16 X, Y and values"),
    speedups=(Speedup("tf32", "torch", "tf32 v torch32"),
              Speedup("fp16", "torch16", "fp16 v torch16"),
              Speedup("tf32", "csr", "tf32 v csr")),
    targets=(),
    timing="median time",
)

#: The geometric means reported under the table; no target is set for the GPU SDDMM.
GPU_SDDMM_REPORTS = (
    GpuTarget("tf32", "torch", None, None, "ours-tf32 over torch-fp32"),
    GpuTarget("fp16", "torch16", None, None, "ours-fp16 over torch-fp16"),
    GpuTarget("tf32", "csr", None, None, "ours-tf32 over ours-csr"),
)


@dataclasses.dataclass
class HeadsResult(KernelResult):
    """A `KernelResult` of ``heads`` SDDMMs per run: 2 nnz F heads operations."""

    heads: int = 1

    def gflops(self, label):
        """2 nnz F heads floating-point operations per second, in units of 1e9."""
        return self.heads * super().gflops(label)


# --- operands --------------------------------------------------------------------------------

def prepare(A, cuda, torch, heads=1):
    """Launchers of our contenders for one matrix (structure sent once), torch's CSR tensors,
    and the seconds of the ME-BCRS conversion.

    Parameters
    ----------
    A : csr_array
        Canonical, float32.
    cuda : module
        ``numba.cuda``.
    torch : module or None
        torch with a CUDA device, or None (its contenders are not measured).
    heads : int
        1: 2-D X and Y; more: X (rows, heads, F), Y (cols, heads, F).

    Returns
    -------
    operands : dict
    convert_s : float
        Seconds of ``A.to_mebcrs(block_width=8)`` on the host.
    """
    from .._cuda_backend import HALF_OVERFLOW, sddmm_launcher
    start = time.perf_counter()
    M = A.to_mebcrs(block_width=8)
    convert_s = time.perf_counter() - start
    per_head = None if heads == 1 else heads
    launchers = {"tf32": sddmm_launcher(M, "tf32", per_head),
                 "fp16": sddmm_launcher(M, "fp16", per_head),
                 "csr": sddmm_launcher(A, "fp32", per_head)}
    # torch-fp16's CSR tensor holds A's values in half (beta = 0 leaves them unread, but
    # infinities there are not what a user would pass): left out beyond float16's range.
    values_half_ok = A.nnz == 0 or float(np.abs(A.data).max()) < HALF_OVERFLOW
    tensors = {}
    if torch is not None:
        kinds = _TORCH_DTYPES[:2 if values_half_ok else 1]
        indptr = torch.from_numpy(A.indptr.astype(np.int64))
        indices = torch.from_numpy(A.indices.astype(np.int64))
        size = A.shape if heads == 1 else (heads,) + A.shape
        for label, dtype in kinds:
            values = torch.from_numpy(A.data).to(getattr(torch, dtype))
            if heads > 1:  # the same pattern in every batch
                indptr_b, indices_b, values = (t.expand(heads, -1).contiguous()
                                               for t in (indptr, indices, values))
            else:
                indptr_b, indices_b = indptr, indices
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
                tensors[label] = torch.sparse_csr_tensor(indptr_b, indices_b, values, size=size,
                                                         check_invariants=False).cuda()
    rows = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
    return {"A": A, "rows": rows, "launchers": launchers, "tensors": tensors, "cuda": cuda,
            "torch": torch, "heads": heads, "values_half_ok": values_half_ok}, convert_s


def _reference(A, rows, X, Y):
    """The exact products in float64, (nnz,) or (nnz, heads), and the bound of each one's
    rounding error scale, ``||X[i]|| ||Y[j]||`` per stored (i, j) (and head)."""
    cols = A.indices
    if X.ndim == 2:
        exact = numpy_sddmm(rows, cols, X.astype(np.float64), Y.astype(np.float64))
    else:
        exact = np.stack([numpy_sddmm(rows, cols, X[:, h].astype(np.float64),
                                      Y[:, h].astype(np.float64)) for h in range(X.shape[1])],
                         axis=1)
    x_norms, y_norms = (np.sqrt(np.einsum("...f,...f->...", M, M, dtype=np.float64))
                        for M in (X, Y))  # no float64 copy of X and Y
    return exact, x_norms[rows] * y_norms[cols]


def measure(operands, width, repeat, timer, what, notes):
    """Check every contender against NumPy in float64, then median seconds by label (NaN: not
    run). A torch call that raises is noted in ``notes`` and not run; so are the fp16
    contenders when X or Y do not fit in float16.

    Parameters
    ----------
    operands : dict
        From `prepare`.
    width : int
        F, the columns of X and Y (per head).
    repeat : int
        Timed runs per contender.
    timer : spmm_cuda._Timer
    what : str
        The case, for messages (``"cora F=128"``).
    notes : list of str
        Appended to.

    Returns
    -------
    dict of str to float

    Raises
    ------
    Mismatch
        A result is not within `TOLERANCE` of the exact products.
    """
    from .._cuda_backend import _host_as
    A, rows, cuda, torch, heads = (operands[key] for key in ("A", "rows", "cuda", "torch",
                                                             "heads"))
    shape = (width,) if heads == 1 else (heads, width)
    rng = np.random.default_rng(width)
    X = rng.standard_normal((A.shape[0],) + shape, dtype=np.float32)
    Y = rng.standard_normal((A.shape[1],) + shape, dtype=np.float32)
    exact, scale = _reference(A, rows, X, Y)
    device = {np.dtype(np.float32): (cuda.to_device(X), cuda.to_device(Y))}
    try:  # the fp16 contenders read X and Y in half
        device[np.dtype(np.float16)] = (cuda.to_device(_host_as(X, np.float16, "X")),
                                        cuda.to_device(_host_as(Y, np.float16, "Y")))
    except ValueError as exc:
        notes.append(f"{what}: {exc}: no fp16 contenders")
    contenders = {}  # label -> (run, result as host values in A's CSR order)
    for label, launch in operands["launchers"].items():
        if launch.operand_dtypes[0] not in device:
            continue
        X_label, Y_label = device[launch.operand_dtypes[0]]
        out = cuda.device_array(launch.out_shape, dtype=launch.result_dtype)
        contenders[label] = (
            lambda launch=launch, X_label=X_label, Y_label=Y_label, out=out:
                launch(X_label, Y_label, out),
            lambda result, launch=launch, out=out:
                launch.in_storage_order(out.copy_to_host(), like=A))
    for label, T in operands["tensors"].items():
        if label == "torch16" and np.dtype(np.float16) not in device:
            continue
        dtype = T.values().dtype
        if heads == 1:
            X_t, Y_t = (torch.from_numpy(M).to(dtype).cuda() for M in (X, Y))
        else:  # torch's batched layout: (heads, rows, F)
            X_t, Y_t = (torch.from_numpy(np.ascontiguousarray(M.transpose(1, 0, 2)))
                        .to(dtype).cuda() for M in (X, Y))
        contenders[label] = (
            lambda T=T, X_t=X_t, Y_t=Y_t: torch.sparse.sampled_addmm(
                T, X_t, Y_t.transpose(-2, -1), beta=0.0, alpha=1.0),
            lambda result: result.values().float().cpu().numpy().T)
    seconds = {label: math.nan for label, _ in BENCH.contenders}
    headings = dict(BENCH.contenders)
    for label, (function, fetch) in contenders.items():
        try:
            result = function()
            cuda.synchronize()
        except RuntimeError as exc:  # e.g. torch without this dtype (NotImplementedError)
            if label not in operands["tensors"]:
                raise
            note = f"{headings[label]} not measured: torch raised {type(exc).__name__}: {exc}"
            if note not in notes:
                notes.append(note)
            continue
        got = fetch(result)
        del result
        error = np.abs(got - exact)
        bad = ~(error <= TOLERANCE[label] * scale + 1e-6)  # NaN counts as bad
        if bad.any():
            raise Mismatch(f"{what}: {headings[label]}: {int(bad.sum())} of {bad.size} values "
                           f"differ (max |diff| {float(np.nanmax(error)):.3g})")
        seconds[label] = timer.median_seconds(function, repeat)
    return seconds


# --- command ---------------------------------------------------------------------------------

def run(args, out=None):
    """Run the GPU SDDMM benchmark and report; returns the exit status.

    Parameters
    ----------
    args : argparse.Namespace
        The ``sddmm`` command's options (``--heads``, ``--flush-mb``, ``--n``, the matrices,
        ``--repeat``, ``--csv``, ``--plot``).
    out : file, optional
        Where the report goes (default: ``sys.stdout`` at the time of the call).

    Returns
    -------
    int
        0, 1 after a wrong result, 2 after a usage error or without a GPU.
    """
    out = sys.stdout if out is None else out
    if getattr(args, "bound", False):
        print("error: --bound applies to --backend cpu", file=sys.stderr)
        return 2
    heads = getattr(args, "heads", None) or 1
    started = start(args)
    if isinstance(started, int):
        return started
    cuda, cases, torch, timer, flush_bytes = started
    widths = list(dict.fromkeys(args.n or DEFAULT_GPU_SDDMM_WIDTHS))
    bench = (BENCH if heads == 1 else
             dataclasses.replace(BENCH, timing=f"median time; x{heads} heads"))
    results, notes = [], []
    with tqdm(total=len(cases) * len(widths), desc="sddmm gpu", unit="case") as progress:
        for case in cases:
            A = load_case(case, progress, notes)
            operands, convert_s = prepare(A, cuda, torch, heads)
            if torch is not None and not operands["values_half_ok"]:
                notes.append(f"{case.name}: values beyond float16's range (largest "
                             f"{float(np.abs(A.data).max()):.4g}): no torch-fp16 contender")
            notes.append(f"{case.name}: A.to_mebcrs(8) {convert_s * 1e3:.1f} ms (host, not timed "
                         "with the kernels)")
            for width in widths:
                progress.set_postfix_str(f"{case.name} F={width}")
                try:
                    seconds = measure(operands, width, args.repeat, timer,
                                      f"{case.name} F={width}", notes)
                except Mismatch as exc:
                    progress.close()
                    print(f"error: wrong result, benchmark aborted: {exc}", file=sys.stderr)
                    return 1
                results.append(HeadsResult(case.name, case.group, A.shape, A.nnz,
                                           str(A.index_dtype), width, convert_s, seconds,
                                           heads=heads))
                progress.update()
            del A, operands
    layout = ("X (rows, F), Y (cols, F)" if heads == 1 else
              f"{heads} heads: X (rows, {heads}, F), Y (cols, {heads}, F); torch on a batched "
              f"CSR tensor ({heads}, rows, cols); GFLOP/s count 2 nnz F {heads}")
    print(f"{BENCH.kernel}: {BENCH.operation}; {layout}; device: {_device_name(cuda)}; median "
          f"of {args.repeat} timed runs after one untimed run; L2 flushed before each run "
          f"({flush_bytes / 2**20:.3g} MiB overwritten); data: {args.data_dir}", file=out)
    print(BENCH.peers_note if torch is not None else
          "peers: torch not measured (torch is missing or has no CUDA device)", file=out)
    for note in notes:
        print(note, file=out)
    print(format_table(bench, results), file=out)
    for line in gpu_verdicts(results, simulated=timer.simulated, targets=GPU_SDDMM_REPORTS,
                             width_name="F"):
        print(line, file=out)
    if args.csv:
        _write_csv(results, args.csv, _device_name(cuda), args.repeat, bench=BENCH, heads=heads)
        print(f"wrote {args.csv}", file=out)
    if args.plot:
        write_plot(bench, results, args.plot, None, args.repeat,
                   title=f"{BENCH.kernel} ({_device_name(cuda)}, {heads} head"
                         f"{'' if heads == 1 else 's'}), speedups, median of {args.repeat} runs")
        print(f"wrote {args.plot}", file=out)
    return 0
