"""``python -m pysparse_hpc.bench precondition`` on its smallest workload (one round, one step),
its PubMed workload, and the ``--distributed`` part on one rank and under ``mpiexec -n 2``."""
import importlib.util
import math
import re

import pytest

pytest.importorskip("torch")

from pysparse_hpc.bench.__main__ import main  # noqa: E402
from pysparse_hpc.bench.precondition import (KFAC_AGREEMENT, DistributedResult,  # noqa: E402
                                             StepResult, distributed_heading,
                                             format_distributed_table, measure,
                                             measure_distributed, verdict)
from pysparse_hpc.bench._data import data_dir  # noqa: E402
from pysparse_hpc.distributed import Communicator  # noqa: E402
from pysparse_hpc.distributed._comm import mpiexec_path  # noqa: E402

requires_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="needs mpi4py and mpiexec (pip install mpi4py mpich, or the [mpi] extra)")


def test_precondition_benchmark_runs(tmp_path, capsys):
    table = tmp_path / "precondition.csv"
    assert main(["precondition", "--workload", "mlp", "--repeat", "1", "--steps", "1",
                 "--csv", str(table), "--plot", str(tmp_path / "steps.png")]) == 0
    assert (tmp_path / "steps.png").stat().st_size > 0
    out = capsys.readouterr().out
    for label in ("mlp         sgd", "mlp         kfac/1", "mlp         kfac/10",
                  "mlp         shampoo", "mlp         jorge", "target: kfac >= 2x ASDL",
                  "target: Jorge's step"):
        assert label in out, out
    rows = table.read_text().splitlines()
    assert rows[0].startswith("workload,method,interval,ours_ms,asdl_ms") and len(rows) == 6
    assert all(float(row.split(",")[3]) > 0 for row in rows[1:])
    if importlib.util.find_spec("asdl") is not None:
        checked = re.search(r"K-FAC's update checked against ASDL's before timing \(largest "
                            r"relative difference\): mlp ([0-9.e+-]+)", out)
        assert checked and float(checked.group(1)) <= KFAC_AGREEMENT, out


def test_nothing_is_timed_when_kfac_differs_from_asdl(monkeypatch, capsys):
    """The times compare only if both libraries compute the same update: checked first."""
    from pysparse_hpc.bench import precondition
    if precondition._asdl() is None:
        pytest.skip("needs ASDL (pip install asdfghjkl)")
    timed = []
    monkeypatch.setattr(precondition, "kfac_difference", lambda *args: 0.5)
    monkeypatch.setattr(precondition, "_ms_per_step", lambda *args: timed.append(args) or 1.0)
    assert main(["precondition", "--workload", "mlp", "--repeat", "1", "--steps", "1"]) == 1
    assert "mlp: our K-FAC's preconditioned gradients differ from ASDL's by 0.5" in \
        capsys.readouterr().err
    assert not timed


def test_precondition_verdict_and_bad_steps(capsys):
    results = [StepResult("mlp", "kfac", 1, 1.0, 2.5), StepResult("mlp", "shampoo", 1, 10.0, 40.0),
               StepResult("mlp", "jorge", 1, 2.0, float("nan"))]
    lines = verdict(results)
    assert lines[0].endswith("2.50x, MET") and lines[1].endswith("4.00x, NOT MET")
    assert lines[2].endswith("5.00x, MET")
    assert main(["precondition", "--steps", "0"]) == 2
    assert "--steps must be at least 1" in capsys.readouterr().err


def test_gcn_on_pubmed_is_timed():
    try:
        shared = data_dir()
    except FileNotFoundError:
        pytest.skip("no shared data directory")
    if not (shared / "pubmed_structure.npz").is_file():
        pytest.skip("pubmed_structure.npz is not in the shared data")
    results = measure("gcn-pubmed", 1, 1, None, data_dir=shared)
    assert [(r.method, r.interval) for r in results] == [
        ("sgd", 1), ("kfac", 1), ("kfac", 10), ("shampoo", 1), ("jorge", 1)]
    assert all(r.workload == "gcn-pubmed" and r.ours_ms > 0 and math.isnan(r.asdl_ms)
               for r in results)


def test_distributed_configurations_on_one_rank():
    from pysparse_hpc.bench._precondition_worker import KIND_COLUMNS, measure_configurations
    config = dict(workloads=["mlp"], methods=[["sgd", 1], ["kfac", 1], ["jorge", 1]], steps=1)
    results = measure_configurations(config, Communicator(None))
    assert [(r["method"], r["strategy"], r["ranks"]) for r in results] == [
        ("sgd", None, 1), ("kfac", None, 1), ("jorge", None, 1)]
    for r in results:
        assert r["ms_per_step"] > 0 and len(r["losses"]) == 1 and r["losses"][0] > 0
        assert r["bytes_per_step"] == {column: 0 for column in KIND_COLUMNS}


def test_distributed_table_and_usage(capsys):
    results = [DistributedResult("mlp", "kfac", 10, None, 1, 2, 5.0, {}, [2.0, 1.5]),
               DistributedResult("mlp", "kfac", 10, "gradient", 2, 1, 4.0,
                                 {"gradient allreduce": 2e6, "gradient broadcast": 1e6},
                                 [2.0, 1.5], 1e-7)]
    table = format_distributed_table(results).splitlines()
    assert table[0].split()[:6] == ["workload", "method", "strategy", "P", "ms/step", "vs"]
    assert table[2].split()[:6] == ["mlp", "kfac/10", "gradient", "2", "4.00", "0.80x"]
    assert table[2].split()[-2:] == ["3.000", "1.0e-07"]
    assert main(["precondition", "--distributed", "--workload", "cnn"]) == 2
    assert "--distributed runs mlp, gcn, not cnn" in capsys.readouterr().err


def test_timeout_without_distributed_is_refused(monkeypatch, capsys):
    """``--timeout`` stops the MPI jobs of ``--distributed``; given without it, it is refused
    before anything is timed, not silently ignored."""
    from pysparse_hpc.bench import precondition
    monkeypatch.setattr(precondition, "measure",
                        lambda *args, **kwargs: pytest.fail("timed despite the bad option"))
    assert main(["precondition", "--workload", "mlp", "--timeout", "5"]) == 2
    assert ("--timeout applies to the MPI jobs of --distributed only, and --distributed was not "
            "given") in capsys.readouterr().err


def test_distributed_timeout_default_and_option(monkeypatch, capsys):
    """The jobs get ``--timeout``, else the default of `DISTRIBUTED_TIMEOUT` seconds."""
    from pysparse_hpc.bench import distributed, precondition
    seen = []

    def measured(workloads, steps, rounds, threads, timeout, mpiexec, progress=None):
        seen.append(timeout)
        return [DistributedResult("mlp", "sgd", 1, None, 1, threads, 1.0, {}, [1.0])]
    monkeypatch.setattr(precondition, "measure_distributed", measured)
    monkeypatch.setattr(distributed, "find_mpiexec", lambda: "mpiexec")
    assert main(["precondition", "--distributed", "--workload", "mlp", "--repeat", "1"]) == 0
    assert main(["precondition", "--distributed", "--workload", "mlp", "--repeat", "1",
                 "--timeout", "7"]) == 0
    assert seen == [precondition.DISTRIBUTED_TIMEOUT, 7]
    capsys.readouterr()


@pytest.mark.parametrize("threads, expected", [
    (2, "2 threads in all (P=2: 1 per rank)"),
    (4, "4 threads in all (P=2: 2 per rank)"),
    (1, "P=1 on 1 thread, P=2 on 2 x 1 = 2 (not the same total"),
    (3, "P=1 on 3 threads, P=2 on 2 x 1 = 2 (not the same total"),
])
def test_distributed_heading_states_each_jobs_threads(threads, expected):
    """A P = 2 job runs ``threads // 2`` threads per rank, at least one: with an odd count the
    totals differ, and the heading must not claim the P = 1 job's count for both."""
    heading = distributed_heading(threads, 3, 5)
    assert expected in heading, heading
    assert "median of 3 round(s) of 5 timed steps (10 with an interval of 10)" in heading


@pytest.mark.mpi
@requires_mpi
def test_distributed_kfac_under_mpiexec():
    results = measure_distributed(["mlp"], steps=1, rounds=1, threads=2, timeout=120,
                                  mpiexec=mpiexec_path(), methods=[("kfac", 1)])
    assert [(r.ranks, r.strategy) for r in results] == [
        (1, None), (2, "inverse"), (2, "gradient")]
    single, inverse, gradient = results
    assert single.total_bytes == 0 and math.isnan(single.loss_rel_diff)
    for r in (inverse, gradient):
        assert r.bytes_per_step["gradient allreduce"] > 0 < r.bytes_per_step["curvature allreduce"]
        assert r.loss_rel_diff < 1e-5   # two ranks reproduce one
    assert inverse.bytes_per_step["inverse broadcast"] > 0 == inverse.bytes_per_step[
        "gradient broadcast"]
    assert gradient.bytes_per_step["gradient broadcast"] > 0 == gradient.bytes_per_step[
        "inverse broadcast"]
