"""Differential checks of the distributed layer under a real ``mpiexec -n 2`` and ``-n 3``:
seeded random small graphs and partitions reproduce the one-process results, and bad input on
one rank raises on every rank.

Each test launches ``tests/mpi/fuzz_checks.py`` with a timeout (and a communicator timeout, so
that a rank left waiting ends the job with a message): a hang fails the test instead of stalling
the suite.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pysparse_hpc.distributed._comm import mpiexec_path

pytestmark = pytest.mark.mpi

CHECKS = Path(__file__).parent / "mpi" / "fuzz_checks.py"
REPO_ROOT = Path(__file__).resolve().parent.parent

requires_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="needs mpi4py and mpiexec (pip install mpi4py mpich, or the [mpi] extra)")


def run_mpi(ranks, *args, timeout=120):
    """``mpiexec -n ranks python args...`` from the repository root: (status, stdout,
    stderr). Fails the test if it has not ended after ``timeout`` seconds."""
    env = dict(os.environ, PYSPARSE_HPC_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", PYSPARSE_HPC_COMM_TIMEOUT="60")
    try:
        done = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, *args],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec -n {ranks} {' '.join(args)} hung for {timeout} s:\n"
                    f"{exc.stdout}\n{exc.stderr}")
    return done.returncode, done.stdout, done.stderr


def run_checks(ranks, *names, timeout=120):
    status, out, err = run_mpi(ranks, str(CHECKS), *names, timeout=timeout)
    assert status == 0, f"exit status {status}\n{out}\n{err[-6000:]}"
    for name in names:
        assert f"PASSED {name}" in out, out


@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_random_graphs_and_partitions_reproduce_one_process(ranks):
    """Construction, exchanges, placement, gcn_norm, GCN/GAT/AGNN layers, collectives of odd
    buffers, DataParallel and training on random graphs and partitions; ranks that wrap unlike
    models, call train with unlike arguments, or sum integers past int64."""
    run_checks(ranks, "graph_and_exchanges", "layers_match_one_process",
               "collectives_of_odd_buffers", "data_parallel_matches_one_process",
               "training_matches_one_process", "data_parallel_refuses_unlike_models",
               "train_refuses_unlike_arguments", "sums_of_large_integers")
