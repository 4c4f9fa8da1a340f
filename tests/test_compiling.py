"""The first run: compile messages, the cached-only probe, the helper process that compiles a
job's kernels ahead, and what starting Numba's pool leaves of OpenMP's thread count. Each test
runs in a fresh process with an empty Numba cache directory, so that kernels really compile
(serial, small ones: a few seconds)."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from pysparse_hpc._compiling import CompileAhead


def _run_fresh(code, cache_dir, timeout=300):
    environment = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=environment)
    assert done.returncode == 0, done.stderr
    return done


_SMALL_PRODUCT = """
    import numpy as np
    import pysparse_hpc as ph
    A = ph.csr_array(np.eye(5, dtype=np.float32))
    X = np.ones((5, 3), dtype=np.float32)
"""


def test_a_slow_compile_is_announced_once(tmp_path):
    code = _SMALL_PRODUCT + """
    from pysparse_hpc._compiling import compile_messages
    with compile_messages(delay=0.0):
        A @ X
        A @ X
    """
    first = _run_fresh(code, tmp_path)
    assert first.stderr.count("pysparse_hpc: compiling csr_spmm_serial") == 1, first.stderr
    again = _run_fresh(code, tmp_path)   # loaded from the cache: nothing to announce
    assert "compiling" not in again.stderr, again.stderr


def test_messages_stop_with_the_context(tmp_path):
    code = _SMALL_PRODUCT + """
    from pysparse_hpc._compiling import compile_messages
    with compile_messages(delay=0.0):
        pass
    A @ X
    """
    assert "compiling" not in _run_fresh(code, tmp_path).stderr


def test_runs_cached_stops_before_compiling(tmp_path):
    code = _SMALL_PRODUCT + """
    from pysparse_hpc._compiling import runs_cached
    from pysparse_hpc.kernels.cpu import spmm
    product = lambda: A @ X
    assert runs_cached(product) is False
    assert spmm.csr_spmm_serial.signatures == []   # stopped before compiling anything
    assert runs_cached(product) is False
    assert np.array_equal(A @ X, X)
    assert runs_cached(product) is True
    """
    _run_fresh(code, tmp_path)
    # A new process finds the kernel in the on-disk cache.
    _run_fresh(_SMALL_PRODUCT + """
    from pysparse_hpc._compiling import runs_cached
    assert runs_cached(lambda: A @ X) is True
    """, tmp_path)


def test_compile_ahead_fills_the_cache_for_the_job(tmp_path):
    code = """
    from pysparse_hpc._compiling import compile_ahead, runs_cached, _gnn_epochs
    ahead = compile_ahead("gnn", "cora", "gcn")
    assert ahead is not None
    assert ahead.wait() == 0
    assert runs_cached(_gnn_epochs, "cora", "gcn")
    assert compile_ahead("gnn", "cora", "gcn") is None   # all cached: no helper
    """
    _run_fresh(code, tmp_path)


def test_a_failed_helper_is_reported_not_raised():
    lines = []
    helper = CompileAhead("gnn", ["no-such-dataset", "gcn"])
    assert helper.wait(lines.append) != 0
    assert any("failed" in line and "no-such-dataset" in line for line in lines), lines


def test_firstrun_benchmark_times_a_cold_and_a_warm_product(tmp_path, capsys):
    from pysparse_hpc.bench.__main__ import main
    path = tmp_path / "firstrun.csv"
    assert main(["firstrun", "--job", "product", "--rounds", "1", "--csv", str(path)]) == 0
    report = capsys.readouterr().out
    assert "product" in report and "not measured" in report
    row = path.read_text().splitlines()[1].split(",")
    cold, warm = float(row[1]), float(row[2])
    assert cold > warm > 0   # the cold run compiles the kernel, the warm one loads it


def test_firstrun_verdict():
    from pysparse_hpc.bench.firstrun import FirstRunResult, verdict
    assert verdict([FirstRunResult("demo", 12.0, 10.0)])[0].endswith("1.20x, MET")
    assert verdict([FirstRunResult("demo", 14.0, 10.0)])[0].endswith("1.40x, NOT MET")


def test_benchmark_output_paths_are_checked_before_measuring(capsys):
    from pysparse_hpc.bench.__main__ import main
    for option in ("--csv", "--plot"):
        with pytest.raises(SystemExit) as stop:
            main(["firstrun", option, "/no/such/directory/out.file"])
        assert stop.value.code == 2
        assert f"{option}: the directory of /no/such/directory/out.file does not exist" in \
            capsys.readouterr().err
    cases = [("--csv", "", "an empty file name"), ("--csv", ".", ". is a directory"),
             ("--plot", "plot.txt", "needs a file extension matplotlib writes")]
    if importlib.util.find_spec("matplotlib") is None:
        cases.pop()
    for option, path, message in cases:
        with pytest.raises(SystemExit) as stop:
            main(["firstrun", option, path])
        assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("torch_first", [True, False])
def test_importing_leaves_the_openmp_thread_count_to_the_user(torch_first):
    """Starting Numba's OpenMP pool must not raise the OpenMP default the user set: torch on
    the same runtime would then run every core per process, whatever OMP_NUM_THREADS says
    (under mpiexec, beside ranks polling in MPI: a Cholesky 60x slower). The library's own
    kernels keep their threads."""
    pytest.importorskip("torch")
    first, second = ("torch", "pysparse_hpc") if torch_first else ("pysparse_hpc", "torch")
    code = textwrap.dedent(f"""
        import {first}, {second}, numba, numpy as np

        @numba.njit(parallel=True)
        def ids(n):
            out = np.zeros(n, np.int64)
            for i in numba.prange(n):
                out[i] = numba.get_thread_id()
            return out
        print(torch.get_num_threads(), pysparse_hpc.get_num_threads(),
              len(np.unique(ids(100000))))
        """)
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="2")
    env.pop("PYSPARSE_HPC_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    torch_threads, ours, used = map(int, done.stdout.split())
    assert torch_threads == 1 and ours == 2 and used == 2


@pytest.mark.parametrize("name, value", [("PYSPARSE_HPC_SPMM_TILE", "0"),
                                         ("PYSPARSE_HPC_CUDA_WARPS", "0"),
                                         ("PYSPARSE_HPC_CUDA_WARPS", "-1"),
                                         ("PYSPARSE_HPC_CUDA_SPLIT_BLOCKS", "-3")])
def test_counts_below_one_stop_the_import_by_name(name, value):
    """A tile, warp count or split threshold below 1 is refused, not silently taken as 1."""
    env = dict(os.environ, **{name: value})
    done = subprocess.run([sys.executable, "-c", "import pysparse_hpc"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert f"{name} must be an integer >= 1, got {value!r}" in done.stderr


def test_huge_tile_and_split_threshold_mean_whole_rows_and_no_split(monkeypatch):
    """Beyond a 64-bit count the kernels could not take them (every SpMM on a strided B failed
    in Numba's typing); they mean the same as the largest count."""
    import numpy as np

    import pysparse_hpc as sph
    from pysparse_hpc import _config
    from pysparse_hpc.kernels.cuda.spmm import mma_parts
    monkeypatch.setattr(_config, "_SPMM_TILE", 10 ** 30)
    monkeypatch.setattr(_config, "_CUDA_SPLIT_BLOCKS", 10 ** 30)
    assert _config.spmm_tile() == _config.cuda_split_blocks() == 2 ** 63 - 1
    A = sph.csr_array(np.arange(12, dtype=np.float32).reshape(3, 4))
    B = np.arange(20, dtype=np.float32).reshape(5, 4).T        # not C-contiguous: tiled path
    np.testing.assert_allclose(sph.spmm(A, B), A.toarray() @ B)
    M = sph.csr_array(np.ones((16, 200), np.float32)).to_mebcrs()
    window, first, n_blocks, atomic, split = mma_parts(M.row_window_offset,
                                                       _config.cuda_split_blocks())
    assert window.tolist() == [0, 1] and atomic.tolist() == [0, 0] and split.size == 0
