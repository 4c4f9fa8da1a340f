"""`pysparse_hpc.optim` under a real ``mpiexec -n 2`` and ``-n 3``: the compressed Lion modes
agree with the plain reference, keep the replicas equal and send the bytes of their formula."""
from pathlib import Path

import pytest

from .test_distributed_mpi import requires_mpi, run_mpi

pytestmark = pytest.mark.mpi

CHECKS = Path(__file__).parent / "mpi" / "optim_checks.py"


def run_optim_checks(ranks, *names, timeout=300):
    status, out, err, _ = run_mpi(ranks, str(CHECKS), *names, timeout=timeout)
    assert status == 0, f"exit status {status}\n{out}\n{err[-6000:]}"
    for name in names:
        assert f"PASSED {name}" in out, out


@requires_mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_lion_modes(ranks):
    run_optim_checks(ranks, "lion_modes", "lion_unused_parameters",
                     "lion_rows_without_gradient")


@requires_mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_lion_training_and_nonfinite_steps(ranks):
    run_optim_checks(ranks, "lion_training", "nonfinite_step_skipped_everywhere")


@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_lion_parameters_of_several_dtypes_and_unlike_ranks(ranks):
    run_optim_checks(ranks, "lion_mixed_dtypes", "lion_refuses_unlike_ranks",
                     "lion_refuses_ranks_that_parted",
                     "lion_refuses_replicas_that_start_apart")
