"""``python -m pysparse_hpc.bench precondition`` on its smallest workload (one round, one step)."""
import pytest

pytest.importorskip("torch")

from pysparse_hpc.bench.__main__ import main  # noqa: E402
from pysparse_hpc.bench.precondition import StepResult, verdict  # noqa: E402


def test_precondition_benchmark_runs(tmp_path, capsys):
    table = tmp_path / "precondition.csv"
    assert main(["precondition", "--workload", "mlp", "--repeat", "1", "--steps", "1",
                 "--csv", str(table)]) == 0
    out = capsys.readouterr().out
    for label in ("mlp       sgd", "mlp       kfac/1", "mlp       kfac/10", "mlp       shampoo",
                  "mlp       jorge", "target: kfac >= 2x ASDL", "target: Jorge's step"):
        assert label in out, out
    rows = table.read_text().splitlines()
    assert rows[0].startswith("workload,method,interval,ours_ms,asdl_ms") and len(rows) == 6
    assert all(float(row.split(",")[3]) > 0 for row in rows[1:])


def test_precondition_verdict_and_bad_steps(capsys):
    results = [StepResult("mlp", "kfac", 1, 1.0, 2.5), StepResult("mlp", "shampoo", 1, 10.0, 40.0),
               StepResult("mlp", "jorge", 1, 2.0, float("nan"))]
    lines = verdict(results)
    assert lines[0].endswith("2.50x, MET") and lines[1].endswith("4.00x, NOT MET")
    assert lines[2].endswith("5.00x, MET")
    assert main(["precondition", "--steps", "0"]) == 2
    assert "--steps must be at least 1" in capsys.readouterr().err
