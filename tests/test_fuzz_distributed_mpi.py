"""Differential checks of the distributed layer under a real ``mpiexec -n 2`` and ``-n 3``:
seeded random small graphs and partitions reproduce the one-process results, and bad input on
one rank raises on every rank.

Each test launches ``tests/mpi/fuzz_checks.py`` with a timeout (and a communicator timeout, so
that a rank left waiting ends the job with a message): a hang fails the test instead of stalling
the suite.
"""
from pathlib import Path

import pytest

from .test_distributed_mpi import requires_mpi, run_mpi

pytestmark = pytest.mark.mpi

CHECKS = Path(__file__).parent / "mpi" / "fuzz_checks.py"


def run_checks(ranks, *names, timeout=120):
    status, out, err, _ = run_mpi(ranks, str(CHECKS), *names, timeout=timeout,
                                  env={"PYSPARSE_HPC_COMM_TIMEOUT": "60"})
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
               "train_refuses_unlike_arguments", "sums_of_large_integers",
               "preconditioning_refuses_unlike_makers", "gcn_norm_refuses_unlike_arguments")
