"""The ``spmm`` and ``sddmm`` benchmark commands run end to end on a tiny case."""
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse

from .conftest import DATA_DIR, REPO_ROOT

pytest.importorskip("torch")

requires_cora = pytest.mark.skipif(not (DATA_DIR / "cora.npz").exists(),
                                   reason="shared data not present")


def run(args):
    return subprocess.run([sys.executable, "-m", "pysparse_hpc.bench", *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO_ROOT)


def run_on_cora(command, table, *options, widths=("16",)):
    """``command`` on Cora alone, one round per width, its CSV written to ``table``."""
    return run([command, "--data", str(DATA_DIR), "--matrix", "cora", "--no-rmat", "--n",
                *widths, "--repeat", "1", "--csv", str(table), *options])


@requires_cora
@pytest.mark.parametrize("command", ["spmm", "sddmm"])
def test_kernel_benchmark_cli(command, tmp_path):
    table = tmp_path / f"{command}.csv"
    result = run_on_cora(command, table)
    assert result.returncode == 0, result.stderr
    assert "geometric mean" in result.stdout
    assert "target " in result.stdout and "MET" in result.stdout
    lines = table.read_text().splitlines()
    assert len(lines) == 3  # header + one (matrix, width) row per index dtype
    assert lines[1].startswith("cora,graph,2708,2708,10556,16,int32,")
    assert lines[2].startswith("cora,graph,2708,2708,10556,16,int64,")
    out = result.stdout
    # both index dtypes in the table, a mean of each, the targets judged on the int32 rows
    assert " int32 " in out and " int64 " in out
    assert "geometric mean, int32 (1)" in out and "geometric mean, int64 (1)" in out
    targets = [line for line in out.splitlines() if line.startswith("target ")]
    assert targets and all("int32 indices" in line for line in targets)
    assert "with int64 indices (second case, not judged)" in out


@requires_cora
def test_sddmm_benchmark_bound(tmp_path):
    table = tmp_path / "sddmm.csv"
    result = run_on_cora("sddmm", table, "--bound")
    assert result.returncode == 0, result.stderr
    assert "no-sums" in result.stdout and "nosum v torch" in result.stdout
    header, row, row64 = table.read_text().splitlines()
    columns = dict(zip(header.split(","), row.split(",")))
    assert columns["index_dtype"] == "int32"
    assert dict(zip(header.split(","), row64.split(",")))["index_dtype"] == "int64"
    assert float(columns["unsummed_s"]) > 0 and float(columns["spmm_s"]) > 0
    assert float(columns["speedup_csr_vs_unsummed"]) > 0


@requires_cora
def test_kernel_benchmark_cli_rows_per_width(tmp_path):
    table = tmp_path / "spmm.csv"
    result = run_on_cora("spmm", table, widths=("8", "16"))
    assert result.returncode == 0, result.stderr
    # header + cora at N=8 and N=16, with int32 then int64 indices
    rows = table.read_text().splitlines()[1:]
    assert [row.split(",")[5:7] for row in rows] == [["8", "int32"], ["16", "int32"],
                                                     ["8", "int64"], ["16", "int64"]]


@requires_cora
def test_kernel_benchmark_cli_small_rmat(tmp_path):
    table = tmp_path / "sddmm.csv"
    result = run(["sddmm", "--data", str(DATA_DIR), "--matrix", "rmat-s8-e4", "--rmat", "8:4:3",
                  "--n", "4", "--repeat", "1", "--csv", str(table)])
    assert result.returncode == 0, result.stderr
    assert "rmat-s8-e4: R-MAT scale 8, edge factor 4, seed 3: 256 rows" in result.stdout
    assert len(table.read_text().splitlines()) == 3  # int32 and int64


@pytest.mark.parametrize("args, message", [
    (["spmm", "--matrix", "no-such-matrix", "--no-rmat"], "unknown matrices"),
    (["sddmm", "--rmat", "18"], "SCALE:EDGE_FACTOR"),
    (["spmm", "--rmat", "10:4", "--no-rmat"], "not allowed with"),
    (["spmm", "--n", "0"], "positive integer"),
    (["spmm", "--flush-mb", "8", "--no-rmat"], "applies to --backend cuda"),
    (["spmm", "--backend", "cuda", "--flush-mb", "-1"], "--flush-mb must be in [0, 1048576]"),
    (["spmm", "--backend", "tpu"], "invalid choice"),
    (["sddmm", "--flush-mb", "8", "--no-rmat"], "--flush-mb applies to --backend cuda"),
    (["sddmm", "--heads", "2", "--no-rmat"], "--heads applies to --backend cuda"),
    (["sddmm", "--heads", "0"], "positive integer"),
    (["sddmm", "--backend", "cuda", "--flush-mb", "-1"], "--flush-mb must be in [0, 1048576]"),
    (["sddmm", "--backend", "cuda", "--bound", "--no-rmat"], "--bound applies to --backend cpu"),
])
def test_kernel_benchmark_cli_bad_arguments(args, message):
    if "unknown matrices" in message and not DATA_DIR.is_dir():
        pytest.skip("shared data not present")
    result = run([*args, "--data", str(DATA_DIR)] if DATA_DIR.is_dir() else args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def _small_matrix():
    from pysparse_hpc.generators import rmat
    return rmat(7, 4, seed=5)


@pytest.mark.parametrize("command", ["spmm", "sddmm"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_kernel_benchmark_measures(command, index_dtype):
    import torch

    from pysparse_hpc import csr_array
    from pysparse_hpc.bench import sddmm, spmm
    module = {"spmm": spmm, "sddmm": sddmm}[command]
    A = csr_array(_small_matrix(), index_dtype=index_dtype).canonical()
    operands, convert_s = module.prepare(A, torch)
    assert convert_s > 0
    # the peers run on the same index dtype as ours (torch accepts int32 on the CPU)
    assert operands["T"].crow_indices().dtype == getattr(torch, np.dtype(index_dtype).name)
    assert operands["M"].col_idx.dtype == index_dtype
    if command == "spmm":
        assert operands["S"].indices.dtype == index_dtype
    seconds = module.measure(operands, 8, 2, "small")
    assert set(seconds) == {label for label, _ in module.BENCH.contenders}
    assert all(s > 0 for s in seconds.values())


def test_index_variants_follow_scipy():
    """scipy's pick first (int32 where it fits, as scipy.sparse.csr_array makes it), then
    int64; the values are shared, not copied."""
    from pysparse_hpc import csr_array
    from pysparse_hpc.bench._data import index_variants, scipy_index_dtype

    A = csr_array(_small_matrix(), index_dtype=np.int64).canonical()
    # what scipy makes of the same int64 arrays where it picks (csr_array keeps int64 as given)
    S = scipy.sparse.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)
    assert scipy_index_dtype(A.shape, A.nnz) == S.indices.dtype == np.int32
    assert scipy_index_dtype((2 ** 31, 4), 8) == np.int64
    variants = index_variants(A)
    assert [label for label, _ in variants] == ["int32", "int64"]
    assert [M.index_dtype for _, M in variants] == [np.int32, np.int64]
    assert variants[1][1] is A and variants[0][1].data is A.data
    assert all(M.has_canonical_format for _, M in variants)


def test_kernel_verdicts_are_judged_on_scipys_index_dtype():
    from pysparse_hpc.bench import spmm
    from pysparse_hpc.bench._kernels import KernelResult, format_table, verdicts

    def result(index_dtype, scipy_over_ours):
        seconds = {"csr": 1.0, "mebcrs": 2.0, "torch": 2.0, "scipy": scipy_over_ours}
        return KernelResult("m", "g", (4, 4), 8, index_dtype, 32, 0.0, seconds)

    results = [result("int32", 5.0), result("int64", 1.0)]
    lines = verdicts(spmm.BENCH, results)
    scipy_line = next(line for line in lines if "scipy, ours on CSR" in line)
    assert "(geometric mean of 1, int32 indices)" in scipy_line
    assert scipy_line.endswith(": MET (5.00x)")  # the int64 row's 1.00x is not judged
    assert lines[-1] == ("with int64 indices (second case, not judged), ours on CSR (geometric "
                         "mean of 1): 2.00x torch.sparse.mm, 1.00x scipy")
    table = format_table(spmm.BENCH, results)
    assert "index" in table and "geometric mean, int64 (1)" in table
    # one index dtype (the GPU benchmarks): the table keeps its old layout
    assert "index" not in format_table(spmm.BENCH, results[:1]).splitlines()[1]


def test_sddmm_bound_measures():
    import torch

    from pysparse_hpc.bench import sddmm
    operands, _ = sddmm.prepare(_small_matrix(), torch, bound=True)
    seconds = sddmm.measure(operands, 8, 1, "small")
    assert set(seconds) == {label for label, _ in sddmm.BOUND_BENCH.contenders}
    assert {"unsummed", "spmm"} <= set(seconds)
    A = operands["A"]
    X = np.ones((A.shape[0], 4), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        sddmm.unsummed_sddmm(A, np.asfortranarray(X), X[:A.shape[1]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unsummed_sddmm_makes_every_product(dtype):
    """The bound's kernel forms each entry's lane-wise products as the SDDMM does and only
    leaves them unsummed: lane 0 of entry p's vector survives at out[p] (later entries
    overwrite the rest), the last entry's whole vector after it."""
    from pysparse_hpc import csr_array
    from pysparse_hpc.kernels.cpu._registers import MAX_VECTORS, VECTOR_BYTES
    from pysparse_hpc.kernels.cpu.sddmm import csr_sddmm_unsummed_serial

    rng = np.random.default_rng(3)
    A = csr_array(scipy.sparse.random(23, 31, density=0.2, random_state=4, format="csr"))
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    lanes = VECTOR_BYTES // np.dtype(dtype).itemsize
    chunk = MAX_VECTORS * lanes
    for width in (1, lanes - 1, lanes + 1, chunk, 2 * chunk + 3):
        X = rng.standard_normal((23, width)).astype(dtype)
        Y = rng.standard_normal((31, width)).astype(dtype)
        out = np.full(A.nnz + lanes - 1, np.nan, dtype)
        csr_sddmm_unsummed_serial(A.indptr, A.indices, X, Y, dtype(0), out, None)
        # Wider rows go a chunk at a time and each chunk overwrites the last: the last remains.
        last = (width - 1) // chunk * chunk
        products = np.zeros((A.nnz, chunk), dtype)
        products[:, :width - last] = X[rows, last:] * Y[A.indices, last:]
        by_lane = products.reshape(A.nnz, -1, lanes).sum(axis=1)
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out[:A.nnz - 1], by_lane[:-1, 0], rtol=rtol, atol=rtol)
        np.testing.assert_allclose(out[A.nnz - 1:], by_lane[-1], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("command, message", [("spmm", "small: mebcrs vs scipy"),
                                              ("sddmm", "small: csr vs numpy")])
def test_kernel_benchmark_rejects_a_wrong_result(command, message):
    import torch

    from pysparse_hpc import csr_array
    from pysparse_hpc.bench import sddmm, spmm
    from pysparse_hpc.bench._kernels import Mismatch
    module = {"spmm": spmm, "sddmm": sddmm}[command]
    A = _small_matrix()
    operands, _ = module.prepare(A, torch)
    if command == "spmm":  # ME-BCRS of another matrix: its product disagrees with scipy's
        doubled = csr_array((2 * A.data, A.indices, A.indptr), shape=A.shape)
        operands["M"] = doubled.to_mebcrs()
    else:  # a wrong NumPy reference: the first check (ours on CSR) fails
        operands["rows"] = operands["rows"][::-1].copy()
    with pytest.raises(Mismatch, match=message):
        module.measure(operands, 8, 1, "small")


def test_kernel_benchmark_aborts_on_a_wrong_result(tmp_path, capsys):
    from argparse import Namespace

    from pysparse_hpc._config import get_num_threads
    from pysparse_hpc.bench import spmm
    from pysparse_hpc.bench._kernels import Mismatch, run_benchmark

    def wrong(operands, width, repeat, what):
        raise Mismatch(f"{what}: csr vs scipy: 3 of 64 values differ")

    args = Namespace(data_dir=tmp_path, matrix=None, n=[4], rmat=[(6, 4, 1)], no_rmat=False,
                     repeat=1, threads=get_num_threads(), csv=None, plot=None)
    assert run_benchmark(args, spmm.BENCH, spmm.prepare, wrong) == 1
    captured = capsys.readouterr()
    assert "benchmark aborted: rmat-s6-e4 int32 N=4: csr vs scipy" in captured.err
    assert "geometric mean" not in captured.out


def test_a_near_miss_never_reads_as_the_target():
    from pysparse_hpc.bench import spmm
    from pysparse_hpc.bench._kernels import KernelResult, verdicts

    def result(scipy_over_ours):
        seconds = {"csr": 1.0, "mebcrs": 2.0, "torch": 2.0, "scipy": scipy_over_ours}
        return KernelResult("m", "g", (4, 4), 8, "int32", 32, 0.0, seconds)

    lines = verdicts(spmm.BENCH, [result(3.996)])
    scipy_line = next(line for line in lines if "scipy, ours on CSR" in line)
    assert scipy_line.endswith("NOT MET (3.99x)")
    lines = verdicts(spmm.BENCH, [result(4.004)])
    assert next(line for line in lines if "scipy, ours on CSR" in line).endswith("MET (4.00x)")
    lines = verdicts(spmm.BENCH, [result(3.596)])   # far from the target: rounded as usual
    assert next(line for line in lines if "scipy, ours on CSR" in line).endswith("MET (3.60x)")


def test_gpu_benchmark_without_a_gpu_says_so():
    from numba import cuda
    if cuda.is_available():
        pytest.skip("a GPU is present")
    result = run(["spmm", "--backend", "cuda", "--no-rmat"])
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


def test_gpu_benchmark_verdicts():
    from pysparse_hpc.bench._kernels import KernelResult
    from pysparse_hpc.bench.spmm_cuda import gpu_verdicts

    def result(width, cusparse, tc16x1=2.0):
        seconds = {"tf32": 1.0, "fp16": 0.5, "tc16x1": tc16x1, "csr": 3.0, "cusparse": cusparse,
                   "cusparse16": 0.999}
        return KernelResult("m", "g", (4, 4), 8, "int32", width, 0.0, seconds)

    lines = gpu_verdicts([result(128, 1.6), result(256, 1.0)])
    assert lines[0].endswith("(N = 128, geometric mean of 1): MET (1.60x)")
    assert lines[1].endswith("NOT MET (1.99x)")  # 1.998 does not read as 2.00
    assert lines[2].endswith("(all rows, geometric mean of 2): MET (2.00x)")
    lines = gpu_verdicts([result(128, float("nan"), tc16x1=1.0)])
    assert "NOT MEASURED" in lines[0] and lines[2].endswith("NOT MET (1.00x)")  # not faster
    assert "NOT MEASURED" in gpu_verdicts([result(256, 2.0)])[0]  # no row at N = 128
    # a matrix without an fp16 pair (values beyond float16's range) is left out and counted
    lines = gpu_verdicts([result(128, 1.6), result(128, float("nan"))])
    assert lines[0].endswith("(N = 128, geometric mean of 1; 1 rows without this pair, see the "
                             "notes): MET (1.60x)")
    assert all("not judged" in line for line in gpu_verdicts([result(128, 2.0)], simulated=True))


def test_gpu_sddmm_benchmark_without_a_gpu_says_so():
    from numba import cuda
    if cuda.is_available():
        pytest.skip("a GPU is present")
    result = run(["sddmm", "--backend", "cuda", "--no-rmat", "--heads", "2"])
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


def test_gpu_sddmm_benchmark_reports_without_a_target():
    """The GPU SDDMM has no target: its geometric means are reported, never judged."""
    from pysparse_hpc.bench.sddmm_cuda import GPU_SDDMM_REPORTS, HeadsResult
    from pysparse_hpc.bench.spmm_cuda import gpu_verdicts

    def result(width, torch, torch16=float("nan"), heads=1):
        seconds = {"tf32": 1.0, "fp16": 0.5, "csr": 3.0, "torch": torch, "torch16": torch16}
        return HeadsResult("m", "g", (4, 4), 8, "int32", width, 0.0, seconds, heads=heads)

    lines = gpu_verdicts([result(32, 2.0), result(128, 8.0)], targets=GPU_SDDMM_REPORTS,
                         width_name="F")
    assert lines[0] == ("ours-tf32 over torch-fp32 (all rows, geometric mean of 2): 4.00x, "
                        "reported, no target")
    assert lines[1] == ("ours-fp16 over torch-fp16 (all rows): NOT MEASURED (no rows at that "
                        "width, or a contender did not run)")
    assert lines[2].endswith("geometric mean of 2): 3.00x, reported, no target")
    assert not any("target " in line.split(":")[0] or "MET" in line for line in lines)
    lines = gpu_verdicts([result(32, 2.0, 1.0), result(64, 2.0)], targets=GPU_SDDMM_REPORTS)
    assert lines[1] == ("ours-fp16 over torch-fp16 (all rows, geometric mean of 1; 1 rows "
                        "without this pair, see the notes): 2.00x, reported, no target")
    assert all(line.endswith("not reported (simulator times)") for line in gpu_verdicts(
        [result(32, 2.0)], simulated=True, targets=GPU_SDDMM_REPORTS))
    # H heads do H SDDMMs per run
    assert result(32, 2.0, heads=4).gflops("tf32") == 4 * result(32, 2.0).gflops("tf32")


def test_at_most_targets_never_read_as_met_on_a_near_miss():
    # convert (<= 2x scipy's tocsc) and firstrun (cold <= 1.3x warm): 2.004 is not a 2.00 that
    # failed, nor 1.3004 a 1.30; a ratio met or far from the target is rounded as usual.
    from pysparse_hpc.bench import shown_ratio
    from pysparse_hpc.bench.convert import PEER, ConvertResult, verdict
    from pysparse_hpc.bench.firstrun import FirstRunResult
    from pysparse_hpc.bench.firstrun import verdict as firstrun_verdict

    def result(ratio):
        seconds = {"to_mebcrs": ratio, "to_blocked16": 1.0, "tocsr": 1.0, PEER: 1.0}
        return ConvertResult("m", "graph", (4, 4), 8, "int32", "float32", seconds)

    assert verdict([result(2.004)])[0].endswith("NOT MET (2.01x)")
    assert verdict([result(1.996)])[0].endswith(": MET (2.00x)")
    assert verdict([result(2.5)])[0].endswith("NOT MET (2.50x)")
    assert firstrun_verdict([FirstRunResult("demo", 13.004, 10.0)])[0].endswith(
        "1.31x, NOT MET")
    assert firstrun_verdict([FirstRunResult("demo", 12.996, 10.0)])[0].endswith("1.30x, MET")
    assert shown_ratio(3.996, False, 4.0) == "3.99" and shown_ratio(4.0, True, 4.0) == "4.00"
    assert shown_ratio(float("nan"), False, 4.0) == "nan"


def test_kernel_benchmark_progress_counts_the_cases_that_run(tmp_path, monkeypatch):
    # A matrix scipy stores with int64 indices (nnz beyond int32) runs one index dtype, not
    # two: the bar must still end full. Such a matrix is too large for a test, so the one
    # R-MAT graph here is given one variant.
    from pysparse_hpc.bench import _kernels
    from pysparse_hpc.bench.__main__ import main

    bars = []

    class Recorded(_kernels.tqdm):
        def close(self):
            bars.append((self.n, self.total))
            super().close()

    real = _kernels.index_variants
    monkeypatch.setattr(_kernels, "tqdm", Recorded)
    monkeypatch.setattr(_kernels, "index_variants", lambda A: real(A)[-1:])
    assert main(["spmm", "--data", str(tmp_path), "--rmat", "6:4", "--n", "4", "8",
                 "--repeat", "1"]) == 0
    assert set(bars) == {(2, 2)}  # (close may run twice: once more on leaving the block)


def _repeat_help(command):
    from pysparse_hpc.bench.__main__ import build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions if action.dest == "command")
    sub = commands.choices[command]
    return next(action for action in sub._actions if action.dest == "repeat").help


def test_repeat_help_names_the_statistic_each_command_keeps():
    # gnn, checkpoint and precondition keep the median, convert and reorder the best; a shared
    # help of "best kept, except by gnn" misreported the others.
    import argparse

    for command in ("gnn", "checkpoint", "precondition"):
        assert "the median is kept" in _repeat_help(command)
        assert "best is kept" not in _repeat_help(command)
    for command in ("convert", "reorder"):
        assert "the best is kept" in _repeat_help(command)
    assert "--backend cuda: the median" in _repeat_help("spmm")
    # commands that do not use --repeat do not list it
    for command in ("firstrun", "convergence"):
        assert _repeat_help(command) == argparse.SUPPRESS


@pytest.mark.parametrize("command, option, reason", [
    ("firstrun", ["--repeat", "3"], "--repeat does not apply to firstrun: it times --rounds"),
    ("firstrun", ["--data", "{data}"], "--data does not apply to firstrun"),
    ("convergence", ["--repeat", "2"], "--repeat does not apply to convergence"),
    ("checkpoint", ["--data", "{data}"], "--data does not apply to checkpoint"),
    ("lion", ["--data", "{data}"], "--data does not apply to lion"),
    ("lion", ["--threads", "1"], "--threads does not apply to lion: every MPI rank"),
    # refused as unused before its value is checked against the pool ("must be in [1, 1]")
    ("lion", ["--threads", "100000"], "--threads does not apply to lion: every MPI rank"),
    ("checkpoint", ["--data", "/no/such/directory"], "--data does not apply to checkpoint"),
])
def test_shared_options_a_command_ignores_are_refused(command, option, reason, tmp_path,
                                                      monkeypatch, capsys):
    # An option that silently does nothing reads as if it had been applied.
    import importlib

    from pysparse_hpc.bench.__main__ import main

    module = importlib.import_module(f"pysparse_hpc.bench.{command}")
    monkeypatch.setattr(module, "run", lambda args, out=None: 0)  # nothing is measured
    with pytest.raises(SystemExit) as exc:
        main([command] + [part.format(data=tmp_path) for part in option])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert reason in err and f"python -m pysparse_hpc.bench {command}: error:" in err
    # without the option the command runs, with the default --repeat
    seen = {}
    monkeypatch.setattr(module, "run", lambda args, out=None: seen.setdefault("args", args) and 0)
    assert main([command]) == 0 and seen["args"].repeat == 10


def test_output_files_are_checked_before_measuring(tmp_path, monkeypatch, capsys):
    # The plot must not overwrite the table, and a file that cannot be replaced must be
    # refused at once, not after the measurements.
    import os

    from pysparse_hpc.bench import convert
    from pysparse_hpc.bench.__main__ import main

    monkeypatch.setattr(convert, "run", lambda args, out=None: 0)
    same = str(tmp_path / "out.png")
    with pytest.raises(SystemExit):
        main(["convert", "--csv", same, "--plot", same])
    assert "--csv and --plot name the same file" in capsys.readouterr().err
    locked = tmp_path / "locked.csv"
    locked.write_text("kept\n")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: (
        False if str(path) == str(locked) and mode == os.W_OK else real_access(path, mode)))
    with pytest.raises(SystemExit):
        main(["convert", "--csv", str(locked)])
    assert f"--csv: {locked} exists and is not writable" in capsys.readouterr().err
    assert main(["convert", "--csv", str(tmp_path / "new.csv")]) == 0


@pytest.mark.parametrize("data, message", [
    ("", "benchmark data directory is an empty path"),
    ("{file}", "is a file, not a directory"),
])
def test_data_option_names_what_is_wrong(data, message, tmp_path, monkeypatch, capsys):
    # An empty --data was the working directory; a file was reported as missing.
    from pysparse_hpc.bench import convert
    from pysparse_hpc.bench.__main__ import main

    monkeypatch.setattr(convert, "run", lambda args, out=None: 0)
    (tmp_path / "a.npz").write_bytes(b"")
    with pytest.raises(SystemExit):
        main(["convert", "--data", data.format(file=tmp_path / "a.npz")])
    assert message in capsys.readouterr().err


def test_shared_setting_errors_name_the_command(capsys):
    from pysparse_hpc.bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["convert", "--threads", "1000000"])
    assert "python -m pysparse_hpc.bench convert: error: --threads:" in capsys.readouterr().err


@pytest.mark.parametrize("outcome, message", [
    ("fails", "error: the product job failed (exit status 1):\nboom"),
    ("times out", "error: the product job ran past its 600 s limit"),
    ("prints nothing", "error: the product job printed no time"),
])
def test_firstrun_reports_a_failed_job_without_a_traceback(outcome, message, monkeypatch,
                                                           capsys):
    import subprocess

    from pysparse_hpc.bench import firstrun
    from pysparse_hpc.bench.__main__ import main

    def fake_run(command, **kwargs):
        if outcome == "times out":
            raise subprocess.TimeoutExpired(command, kwargs["timeout"])
        return subprocess.CompletedProcess(command, 1 if outcome == "fails" else 0, stdout="",
                                           stderr="boom")

    monkeypatch.setattr(firstrun.subprocess, "run", fake_run)
    assert main(["firstrun", "--job", "product", "--rounds", "1"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@requires_cora
def test_matrix_does_not_drop_the_rmat_graphs_asked_for():
    """``--matrix cora --rmat 8:4`` ran Cora alone: the graph generated on request was
    dropped silently because --matrix did not name it."""
    import argparse
    from pysparse_hpc.bench import _kernels
    args = argparse.Namespace(data_dir=DATA_DIR, matrix=["cora"], no_rmat=False,
                              rmat=[(8, 4, 1)])
    assert [case.name for case in _kernels.select_cases(args)] == ["cora", "rmat-s8-e4"]
    args.rmat = None   # the default R-MAT graphs are filtered by --matrix as before
    assert [case.name for case in _kernels.select_cases(args)] == ["cora"]
