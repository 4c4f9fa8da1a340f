"""``spmm --backend cuda``: the tensor-core SpMM on a GPU against cuSPARSE, kernel time only.

Contenders, each checked against scipy in float64 before it is timed:

- ours-tf32 / ours-fp16: the ME-BCRS tensor-core kernels (8x1 vectors, swap-and-transpose);
  fp16 reads B and the values in half precision; both accumulate and write float32;
- 16x1-tf32: the same computation on 16-row windows without the swap (TC-GNN / DTC-SpMM's
  granularity), the ablation;
- ours-csr: our CUDA-core CSR kernel in float32;
- cusp-fp32 / cusp-fp16: ``torch.sparse.mm`` on a CUDA CSR tensor (cuSPARSE) with float32 and
  float16 values and B (needs a CUDA build of torch; otherwise reported as not measured).

Timing: each contender runs once untimed, then ``--repeat`` times between two CUDA events on the
default stream; the median is kept. Before every timed run a buffer several times the size of
the L2 cache is overwritten, so no run finds its inputs in L2 (the effect of rotating inputs),
and the GPU is still busy when the launch is queued, so the host's launch cost stays outside
the events. Operands are on the device and our outputs allocated before timing; conversions
to ME-BCRS and 16x1 are timed separately. ``torch.sparse.mm`` runs as its users call it: it
allocates its result (from torch's caching allocator) and sets up cuSPARSE's descriptors and
workspace inside each timed call, a few microseconds that favour ours on the smallest
products. Under the CUDA simulator the harness runs end to end
but its times are the Python simulation's wall clock, meaningless as GPU figures.

Targets (issue "tensor cores"): at N = 128, geometric mean of ours-tf32 >= 1.5x cusp-fp32 and
of ours-fp16 >= 2x cusp-fp16; ours-tf32 faster than 16x1-tf32.
"""
import math
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from . import geometric_mean
from ._kernels import (KernelBench, KernelResult, Mismatch, Speedup, format_table, load_case,
                       select_cases, verdict, write_plot)

__all__ = ["BENCH", "DEFAULT_GPU_RMAT", "DEFAULT_GPU_WIDTHS", "GPU_TARGETS", "GpuTarget",
           "gpu_verdicts", "run", "start"]

#: Generated graphs of the GPU run, (scale, edge factor, seed): over 10M stored entries each.
DEFAULT_GPU_RMAT = ((20, 16, 1), (21, 8, 2))

#: Dense widths N of the GPU run.
DEFAULT_GPU_WIDTHS = (128, 256)

#: Tolerance of the agreement checks, by contender: |ours - exact| <= tol (|A| @ |B|) + 1e-6.
TOLERANCE = {"tf32": 4e-3, "fp16": 4e-3, "tc16x1": 4e-3, "csr": 1e-5, "cusparse": 1e-5,
             "cusparse16": 4e-3}

BENCH = KernelBench(
    kernel="SpMM on the GPU",
    operation="C = A @ B, B dense K x N (standard normal); results in float32 (cusp-fp16: float16)",
    width_name="N",
    contenders=(("tf32", "ours-tf32"), ("fp16", "ours-fp16"), ("tc16x1", "16x1-tf32"),
                ("csr", "ours-csr"), ("cusparse", "cusp-fp32"), ("cusparse16", "cusp-fp16")),
    peers_note=("peers: torch.sparse.mm(CUDA CSR tensor, B) (cuSPARSE), int64 indices, float32 "
                "and float16 values and B"),
    speedups=(Speedup("tf32", "cusparse", "tf32 v cusp32"),
              Speedup("fp16", "cusparse16", "fp16 v cusp16"),
              Speedup("tf32", "tc16x1", "8x1 v 16x1"), Speedup("tf32", "csr", "tf32 v csr"),
              Speedup("fp16", "tf32", "fp16 v tf32", plot=False)),
    targets=(),
    timing="median time",
)


@dataclass(frozen=True)
class GpuTarget:
    """Geometric mean of ``peer time / ours time`` at least ``factor`` (above it when
    ``strict``), over the rows at ``width`` (all rows for None). A ``factor`` of None sets no
    target: the mean is only reported."""

    ours: str
    peer: str
    factor: float
    width: object
    description: str
    strict: bool = False


GPU_TARGETS = (
    GpuTarget("tf32", "cusparse", 1.5, 128, "ours-tf32 >= 1.5x cuSPARSE fp32"),
    GpuTarget("fp16", "cusparse16", 2.0, 128, "ours-fp16 >= 2x cuSPARSE fp16"),
    GpuTarget("tf32", "tc16x1", 1.0, None, "8x1 (ours-tf32) faster than 16x1", strict=True),
)


def gpu_verdicts(results, simulated=False, targets=GPU_TARGETS, width_name="N"):
    """One line per entry of ``targets`` (`GpuTarget`): MET, NOT MET, the mean alone for an
    entry without a factor ("reported, no target"), or not measured (and why).

    Parameters
    ----------
    results : list of KernelResult
    simulated : bool
        Simulator times: nothing is judged or reported.
    targets : tuple of GpuTarget
        Default: the SpMM targets, `GPU_TARGETS`.
    width_name : str
        The dense width's letter in the lines (``"N"``, ``"F"``).

    Returns
    -------
    list of str
    """
    if simulated:
        return [f"target {target.description}: not judged (simulator times)"
                if target.factor is not None else
                f"{target.description}: not reported (simulator times)" for target in targets]
    lines = []
    for target in targets:
        prefix = "target " if target.factor is not None else ""
        rows = [r for r in results if target.width is None or r.width == target.width]
        where = f"{width_name} = {target.width}" if target.width is not None else "all rows"
        speedups = [r.speedup(target.ours, target.peer) for r in rows]
        measured = [v for v in speedups if not math.isnan(v)]
        if not measured:
            lines.append(f"{prefix}{target.description} ({where}): NOT MEASURED (no rows at "
                         f"that width, or a contender did not run)")
            continue
        mean = geometric_mean(measured)
        left_out = (f"; {len(rows) - len(measured)} rows without this pair, see the notes"
                    if len(measured) < len(rows) else "")
        if target.factor is None:
            outcome = f"{mean:.2f}x, reported, no target"
        else:
            met = mean > target.factor if target.strict else mean >= target.factor
            outcome = verdict(mean, met, target.factor)
        lines.append(f"{prefix}{target.description} ({where}, geometric mean of "
                     f"{len(measured)}{left_out}): {outcome}")
    return lines


# --- timing ----------------------------------------------------------------------------------

class _Timer:
    """Median kernel seconds of a callable: CUDA events around each run, the L2 flushed before.

    Under the simulator, events carry no time, so the wall clock is used instead.
    """

    def __init__(self, cuda, flush_bytes):
        self.cuda = cuda
        from ..kernels.cuda._mma import SIMULATED
        self.simulated = SIMULATED
        rows = flush_bytes // (4 * 16)
        self.flush_buffer = (cuda.device_array((rows, 16), dtype=np.float32) if rows else None)

    def flush(self):
        if self.flush_buffer is not None:
            from ..kernels.cuda.spmm import zero_contiguous
            zero_contiguous(self.flush_buffer)

    def median_seconds(self, function, repeat):
        cuda = self.cuda
        function()  # warm-up: compilation, lazy set-up
        cuda.synchronize()
        samples = []
        for _ in range(repeat):
            self.flush()
            if self.simulated:
                cuda.synchronize()
                start = time.perf_counter()
                function()
                cuda.synchronize()
                samples.append(time.perf_counter() - start)
                continue
            start, stop = cuda.event(), cuda.event()
            start.record()
            function()
            stop.record()
            stop.synchronize()
            samples.append(cuda.event_elapsed_time(start, stop) / 1e3)
        return statistics.median(samples)


def _l2_bytes(cuda):
    """The device's L2 size (64 MiB when the driver does not say)."""
    try:
        return int(cuda.get_current_device().L2_CACHE_SIZE)
    except Exception:  # the simulator and some drivers do not report it
        return 64 << 20


def _device_name(cuda):
    from ..kernels.cuda._mma import SIMULATED
    if SIMULATED:
        return "CUDA simulator (times are the simulation's wall clock, not GPU figures)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


# --- operands --------------------------------------------------------------------------------

def _torch_cuda():
    """torch with a usable CUDA device, or None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def prepare(A, cuda, torch):
    """Launchers of every contender for one matrix (index arrays sent once), the seconds of
    the ME-BCRS and 16x1 conversions, and the scipy matrix for the checks."""
    from .._cuda_backend import HALF_OVERFLOW, spmm_launcher
    start = time.perf_counter()
    M = A.to_mebcrs(block_width=8)
    convert_s = time.perf_counter() - start
    start = time.perf_counter()
    W = A.to_blocked(window=16, block_width=8)
    convert16_s = time.perf_counter() - start
    # A matrix with values beyond float16's range has no fp16 product; both fp16 contenders
    # are left out for it (ours refuses such values rather than return infinities).
    half_ok = A.nnz == 0 or float(np.abs(A.data).max()) < HALF_OVERFLOW
    launchers = {"tf32": spmm_launcher(M, "tf32"), "tc16x1": spmm_launcher(W, "tf32"),
                 "csr": spmm_launcher(A, "fp32")}
    if half_ok:
        launchers["fp16"] = spmm_launcher(M, "fp16")
    tensors = {}
    if torch is not None:
        kinds = (("cusparse", torch.float32), ("cusparse16", torch.float16))
        for label, dtype in kinds[:2 if half_ok else 1]:
            tensors[label] = torch.sparse_csr_tensor(
                torch.from_numpy(A.indptr.astype(np.int64)),
                torch.from_numpy(A.indices.astype(np.int64)),
                torch.from_numpy(A.data).to(dtype), size=A.shape).cuda()
    return {"A": A, "S": A.to_scipy(), "launchers": launchers, "tensors": tensors,
            "cuda": cuda, "torch": torch, "half_ok": half_ok}, convert_s, convert16_s


def measure(operands, width, repeat, timer, what, notes):
    """Check every contender against scipy, then median seconds by label (NaN: not run; a
    cuSPARSE call that fails is noted in ``notes`` and not run).

    Raises
    ------
    Mismatch
        A result is not within `TOLERANCE` of the exact product.
    """
    A, S, cuda, torch = (operands[key] for key in ("A", "S", "cuda", "torch"))
    B = np.random.default_rng(width).standard_normal((A.shape[1], width), dtype=np.float32)
    exact = S.astype(np.float64) @ B.astype(np.float64)
    scale = abs(S).astype(np.float64) @ np.abs(B.astype(np.float64))
    device_B = {np.dtype(np.float32): cuda.to_device(B),
                np.dtype(np.float16): cuda.to_device(B.astype(np.float16))}
    out = cuda.device_array((A.shape[0], width), dtype=np.float32)
    functions = {}
    for label, launch in operands["launchers"].items():
        B_label = device_B[launch.operand_dtypes[0]]
        functions[label] = (lambda launch=launch, B_label=B_label: launch(B_label, out))
    torch_B = {}
    for label, T in operands["tensors"].items():
        torch_B[label] = torch.from_numpy(B).to(T.dtype).cuda()
        functions[label] = (lambda T=T, label=label: torch.sparse.mm(T, torch_B[label]))
    seconds = {label: math.nan for label, _ in BENCH.contenders}
    for label, function in functions.items():
        try:
            result = function()
            cuda.synchronize()
        except RuntimeError as exc:  # e.g. a torch build whose cuSPARSE lacks this dtype
            if not label.startswith("cusparse"):
                raise
            notes.append(f"{what}: {label} failed, not measured: {exc}")
            continue
        host = (result.float().cpu().numpy() if label.startswith("cusparse")
                else out.copy_to_host())
        error = np.abs(host - exact)
        bad = error > TOLERANCE[label] * scale + 1e-6
        if bad.any():
            raise Mismatch(f"{what}: {label}: {int(bad.sum())} of {bad.size} values differ "
                           f"(max |diff| {float(error.max()):.3g})")
        del result
        seconds[label] = timer.median_seconds(function, repeat)
    return seconds


# --- command ---------------------------------------------------------------------------------

def start(args):
    """What both GPU benchmarks set up before their runs: the checked ``--flush-mb``, the GPU,
    the matrices (R-MAT default `DEFAULT_GPU_RMAT`), torch with CUDA (or None) and the timer.

    Returns
    -------
    tuple or int
        ``(cuda, cases, torch, timer, flush_bytes)``, or the exit status 2 after an error
        message (a bad option, no GPU, an unknown matrix).
    """
    from .._cuda_backend import require_gpu
    if args.flush_mb is not None and not 0 <= args.flush_mb <= 1 << 20:
        print(f"error: --flush-mb must be in [0, {1 << 20}] (MiB), got {args.flush_mb}",
              file=sys.stderr)
        return 2
    try:
        cuda = require_gpu()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.rmat is None:
        args.rmat = DEFAULT_GPU_RMAT
    cases = select_cases(args)
    if cases is None:
        return 2
    flush_bytes = (int(args.flush_mb * 2**20) if args.flush_mb is not None
                   else max(256 << 20, 8 * _l2_bytes(cuda)))
    return cuda, cases, _torch_cuda(), _Timer(cuda, flush_bytes), flush_bytes


def run(args, out=None):
    """Run the GPU benchmark and report; returns the exit status."""
    out = sys.stdout if out is None else out
    started = start(args)
    if isinstance(started, int):
        return started
    cuda, cases, torch, timer, flush_bytes = started
    widths = list(dict.fromkeys(args.n or DEFAULT_GPU_WIDTHS))
    results, notes = [], []
    with tqdm(total=len(cases) * len(widths), desc="spmm gpu", unit="case") as progress:
        for case in cases:
            A = load_case(case, progress, notes)
            operands, convert_s, convert16_s = prepare(A, cuda, torch)
            if not operands["half_ok"]:
                notes.append(f"{case.name}: values beyond float16's range (largest "
                             f"{float(np.abs(A.data).max()):.4g}): no fp16 contender")
            notes.append(f"{case.name}: A.to_mebcrs(8) {convert_s * 1e3:.1f} ms, "
                         f"A.to_blocked(16, 8) {convert16_s * 1e3:.1f} ms (host, not timed "
                         "with the kernels)")
            for width in widths:
                progress.set_postfix_str(f"{case.name} N={width}")
                try:
                    seconds = measure(operands, width, args.repeat, timer,
                                      f"{case.name} N={width}", notes)
                except Mismatch as exc:
                    progress.close()
                    print(f"error: wrong result, benchmark aborted: {exc}", file=sys.stderr)
                    return 1
                results.append(KernelResult(case.name, case.group, A.shape, A.nnz,
                                            str(A.index_dtype), width, convert_s, seconds))
                progress.update()
            del A, operands
    print(f"{BENCH.kernel}: {BENCH.operation}; device: {_device_name(cuda)}; median of "
          f"{args.repeat} timed runs after one untimed run; L2 flushed before each run "
          f"({flush_bytes / 2**20:.3g} MiB overwritten); data: {args.data_dir}", file=out)
    print(BENCH.peers_note if torch is not None else
          "peers: cuSPARSE not measured (torch is missing or has no CUDA device)", file=out)
    for note in notes:
        print(note, file=out)
    print(format_table(BENCH, results), file=out)
    for line in gpu_verdicts(results, simulated=timer.simulated):
        print(line, file=out)
    if args.csv:
        _write_csv(results, args.csv, _device_name(cuda), args.repeat)
        print(f"wrote {args.csv}", file=out)
    if args.plot:
        write_plot(BENCH, results, args.plot, None, args.repeat,
                   title=f"{BENCH.kernel} ({_device_name(cuda)}), speedups, median of "
                         f"{args.repeat} runs")
        print(f"wrote {args.plot}", file=out)
    return 0


def _write_csv(results, path, device, repeat, bench=BENCH, heads=None):
    """One row per (matrix, width): sizes, median seconds, GFLOP/s and speedups of ``bench``'s
    contenders; with ``heads``, a ``heads`` column after the width."""
    import csv
    labels = [label for label, _ in bench.contenders]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        heads_column = ["heads"] if heads is not None else []
        writer.writerow(["matrix", "group", "rows", "cols", "nnz", bench.width_name]
                        + heads_column + ["device", "repeat", "to_mebcrs_s"]
                        + [f"{label}_s" for label in labels]
                        + [f"{label}_gflops" for label in labels]
                        + [f"speedup_{s.ours}_vs_{s.peer}" for s in bench.speedups])
        for r in results:
            writer.writerow([r.name, r.group, r.shape[0], r.shape[1], r.nnz, r.width]
                            + ([heads] if heads is not None else [])
                            + [device, repeat, f"{r.convert_s:.6e}"]
                            + [f"{r.seconds[label]:.6e}" for label in labels]
                            + [f"{r.gflops(label):.4f}" for label in labels]
                            + [f"{r.speedup(s.ours, s.peer):.4f}" for s in bench.speedups])
