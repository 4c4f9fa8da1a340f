"""Distributed code under a real ``mpiexec -n 2`` and ``-n 3`` (and 4): P ranks reproduce the
one-rank results, bad input raises on every rank, and a failing rank ends the job.

Each test launches ``tests/mpi/checks.py`` (or the command line) with a timeout: a hang fails
the test instead of stalling the suite.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pysparse_hpc.distributed._comm import mpiexec_path

pytestmark = pytest.mark.mpi

CHECKS = Path(__file__).parent / "mpi" / "checks.py"
REPO_ROOT = Path(__file__).resolve().parent.parent


requires_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="needs mpi4py and mpiexec (pip install mpi4py mpich, or the [mpi] extra)")


def run_mpi(ranks, *args, timeout=300, env=None):
    """``mpiexec -n ranks python args...`` from the repository root: (status, stdout, stderr,
    seconds). Fails the test if it has not ended after ``timeout`` seconds. ``env`` adds
    environment variables. The job's temporary files (the checks' checkpoint directories,
    the topology file MPICH's launcher writes and leaves behind when a job aborts) go to a
    directory removed afterwards: they were left in /tmp, hundreds after a few runs."""
    with tempfile.TemporaryDirectory(prefix="pysparse-hpc-mpi-",
                                     ignore_cleanup_errors=True) as scratch:
        env = dict(os.environ, PYSPARSE_HPC_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1", TMPDIR=scratch,
                   HWLOC_XMLFILE=os.path.join(scratch, "topology.xml"), **(env or {}))
        start = time.perf_counter()
        try:
            done = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, *args],
                                  cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"mpiexec -n {ranks} {' '.join(args)} hung for {timeout} s:\n"
                        f"{exc.stdout}\n{exc.stderr}")
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - start


def run_checks(ranks, *names, timeout=300):
    status, out, err, _ = run_mpi(ranks, str(CHECKS), *names, timeout=timeout)
    assert status == 0, f"exit status {status}\n{out}\n{err[-6000:]}"
    checks = names[:[n.startswith("--") for n in names + ("--",)].index(True)]
    for name in checks:  # the names before the first option
        assert f"PASSED {name}" in out, out


@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_plan_ops_edge_cases_data_parallel_and_bad_input(ranks):
    run_checks(ranks, "plan_and_placement", "ops_match_one_process",
               "second_derivatives_match_one_process", "torch_func_grad_matches_one_process",
               "edge_cases", "halo_figures_per_epoch", "scatter_rows_memory_and_dtypes",
               "data_parallel", "data_parallel_reduces_each_gradient_once",
               "data_parallel_sparse", "bfloat16", "bad_input_on_every_rank",
               "fit_refuses_wrong_local_rows_on_every_rank", "review_fixes",
               "halo_exchange_of_mismatched_rows", "sendrecv_and_counted_object_traffic",
               "data_parallel_broadcasts_buffers",
               "graph_values_changed_on_some_ranks", "features_written_on_some_ranks",
               "separate_contexts",
               "unfrozen_after_wrapping", "errors_of_other_ranks", "many_wrappers_and_graphs")


@requires_mpi
def test_gather_rows_refuses_unlike_rows_on_every_rank():
    run_checks(3, "gather_rows_of_unlike_ranks", timeout=120)


@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_preconditioning_reproduces_one_process(ranks):
    """KAISA K-FAC (both strategies), the diagonal Fisher, Shampoo and Jorge on a split batch
    (also with each rank's mean as the loss, with an empty rank, an unused layer, a sparse
    embedding), their states gathered for another number of ranks, and GCN training on a
    partitioned graph with each."""
    run_checks(ranks, "precondition", "precondition_mean_loss", "precondition_edge_cases",
               "precondition_state_across_ranks", "preconditioned_training")


@requires_mpi
@pytest.mark.parametrize("ranks, dtype", [(2, "float64"), (3, "float32")])
def test_training_reproduces_one_process(ranks, dtype):
    """GCN, GAT and AGNN on Cora and CiteSeer, every partitioner, dropout on."""
    run_checks(ranks, "training", "--dtype", dtype, timeout=600)


@pytest.mark.slow  # four ranks on two cores: the 2- and 3-rank runs above cover the same
@requires_mpi
def test_training_reproduces_one_process_on_4_ranks():
    run_checks(4, "training", "--dtype", "float32", "--datasets", "cora", "--models",
               "gcn,gat", timeout=600)


@requires_mpi
def test_deep_copies_of_a_graph_and_a_wrapper_outlive_the_original():
    run_checks(2, "deep_copies_outlive_the_original", timeout=120)


@requires_mpi
def test_a_parameter_of_two_wrappers_is_reduced_once():
    run_checks(2, "wrapped_submodule_of_a_wrapped_model", timeout=120)


@requires_mpi
@pytest.mark.parametrize("check, message", [
    ("rank_raises", "deliberate failure on the last rank"),
    ("wrong_local_rows", "nodes of the distributed graph"),
    # an error the command line reports itself, where every rank raised it
    ("train_command_value_error_on_one_rank", "error on rank 2 of 3: deliberate ValueError"),
])
def test_a_failing_rank_ends_the_job(check, message):
    status, out, err, seconds = run_mpi(3, str(CHECKS), check, timeout=120)
    assert status != 0
    assert "rank 2 of 3" in err, err[-3000:]
    assert message in err, err[-3000:]
    assert seconds < 60


@requires_mpi
def test_a_rank_that_exits_ends_the_job_under_python_m_mpi4py():
    """SystemExit reaches no exception hook; the docs send such scripts to ``python -m
    mpi4py``, which must then end the job rather than leave the others waiting."""
    status, out, err, seconds = run_mpi(3, "-m", "mpi4py", str(CHECKS), "rank_exits",
                                        timeout=120)
    assert status != 0 and seconds < 60, (status, err[-3000:])


@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_timeout_ends_a_job_whose_rank_hangs(ranks):
    """Without a timeout MPI waits for ever; with one, the job ends within seconds, naming
    the rank, the call and where it waited (a healthy job with a timeout runs as usual:
    test_train_command_under_mpiexec)."""
    status, out, err, seconds = run_mpi(ranks, str(CHECKS), "rank_hangs_in_data_parallel",
                                        timeout=120)
    assert status != 0 and seconds < 60, err[-3000:]
    # The first waiting rank to give up aborts the job, which may end the others before they
    # say so: at least one of them says it, and the hung rank never does.
    assert any(f"rank {waiting} of {ranks} waited" in err for waiting in range(ranks - 1)), \
        err[-3000:]
    assert f"rank {ranks - 1} of {ranks} waited" not in err, err[-3000:]
    assert "in a wait for 'allreduce', beyond the communicator's timeout of 3 s" in err
    assert "in _finish" in err and "_comm.py" not in err  # the caller's frames only


@requires_mpi
def test_the_timeout_can_come_from_the_environment():
    status, out, err, seconds = run_mpi(2, str(CHECKS), "rank_hangs_before_an_allreduce",
                                        timeout=120, env={"PYSPARSE_HPC_COMM_TIMEOUT": "2.5"})
    assert status != 0 and seconds < 60, err[-3000:]
    assert "rank 0 of 2 waited" in err and "in Allreduce ('metric allreduce'), beyond the " \
        "communicator's timeout of 2.5 s" in err, err[-3000:]


@requires_mpi
def test_train_command_under_mpiexec():
    # METIS with two constraints: the path that calls METIS's C functions directly.
    # With a timeout: the watchdog lets a healthy job run and end as usual.
    status, out, err, _ = run_mpi(2, "-m", "pysparse_hpc", "train", "--epochs", "5",
                                  "--balance", "rows+nnz", "--no-progress", "--threads", "1",
                                  "--timeout", "120", timeout=300)
    assert status == 0, err[-3000:]
    assert "GCN on cora, 2 ranks x 1 thread, metis partition, 5 epochs" in out
    assert "test accuracy" in out and "CAGNET-1D" in out
    assert "\n  partition: <Partition metis" in out, out
    assert out.count("test accuracy") == 1  # rank 0 alone reports


@requires_mpi
def test_train_command_shares_the_cores_among_the_ranks():
    """Without --threads and without a thread variable in the environment, two ranks on one
    node split its cores (at least one thread each) instead of each taking all of them."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYSPARSE_HPC_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    done = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-m", "pysparse_hpc",
                           "train", "--epochs", "1", "--no-progress"], cwd=REPO_ROOT,
                          env=dict(env, PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"2 ranks x {expected} thread" in done.stdout, done.stdout


@pytest.mark.slow  # timing-dependent on a loaded machine (one failure in the suite's run)
@requires_mpi
def test_train_command_interrupted_under_mpiexec_says_so_once_and_resumes(tmp_path):
    """Ctrl-C reaches every rank through mpiexec: status 130, one line naming the checkpoints
    (rank 0's, or another rank's when rank 0 is blocked waiting for it), no traceback from any
    rank; a resumed job finishes."""
    import signal
    checkpoints = tmp_path / "run"
    command = [mpiexec_path(), "-n", "2", sys.executable, "-m", "pysparse_hpc", "train",
               "--no-progress", "--threads", "1", "--checkpoint", str(checkpoints),
               "--checkpoint-every", "1"]
    env = dict(os.environ, PYSPARSE_HPC_NUM_THREADS="1", OMP_NUM_THREADS="1")
    # A shell's background job inherits SIGINT ignored: give mpiexec a terminal's default.
    job = subprocess.Popen(command + ["--epochs", "100000"], cwd=REPO_ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(checkpoints.glob("*/manifest*"))) < 2 \
            and job.poll() is None:
        time.sleep(0.2)
    started = len(list(checkpoints.glob("*/manifest*")))
    job.send_signal(signal.SIGINT)
    try:
        _, errors = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        pytest.fail("the interrupted job did not end within 60 s")
    assert started >= 2, f"no checkpoint within 300 s before the interrupt:\n{errors[-2000:]}"
    assert job.returncode == 130, errors[-3000:]
    assert errors.count("train: interrupted; --resume continues from the last checkpoint in "
                        f"{checkpoints}") == 1, errors[-3000:]
    assert "Traceback" not in errors
    resumed = subprocess.run(command + ["--epochs", "1", "--resume"], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.lower().count("test accuracy") == 1


@requires_mpi
def test_train_command_reports_a_missing_file_on_every_rank():
    status, out, err, seconds = run_mpi(2, "-m", "pysparse_hpc", "train", "--dataset",
                                        "no/such/graph.npz", "--no-progress", timeout=120)
    assert status == 2, (status, err[-3000:])
    assert "no such file: 'no/such/graph.npz'" in err
    assert "Traceback" not in err


@requires_mpi
def test_train_command_reports_a_bad_timeout_variable_once():
    status, out, err, seconds = run_mpi(2, "-m", "pysparse_hpc", "train", "--epochs", "1",
                                        "--no-progress", timeout=120,
                                        env={"PYSPARSE_HPC_COMM_TIMEOUT": "soon"})
    assert status == 2, (status, err[-3000:])
    assert err.count("PYSPARSE_HPC_COMM_TIMEOUT must be a number of seconds > 0") == 1, err
    assert "Traceback" not in err


@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_checkpoints_save_fall_back_and_reload_at_another_size(ranks):
    """Asynchronous per-rank checkpoints: bit-exact reload, one rank's corrupt shard makes every
    rank fall back alike, one rank's failed write raises everywhere, and per-node state reloads
    by global id under another split and another number of ranks."""
    run_checks(ranks, "checkpoint", timeout=120)
