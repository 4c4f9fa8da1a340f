"""The ``norm`` benchmark command runs end to end on small graphs."""
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT

pytest.importorskip("torch_geometric")


def run(args):
    return subprocess.run([sys.executable, "-m", "pysparse_hpc.bench", "norm", *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)


def test_norm_benchmark_cli(tmp_path):
    table, plot = tmp_path / "norm.csv", tmp_path / "norm.png"
    result = run(["--graphs", "random", "--edges", "5000", "--repeat", "1", "--threads", "1",
                  "--csv", str(table), "--plot", str(plot)])
    assert result.returncode == 0, result.stderr
    assert "norm: pysparse_hpc.nn.gcn_norm(csr_array) against torch_geometric's" in result.stdout
    rows = table.read_text().splitlines()
    assert rows[0].startswith("graph,nodes,edges,threads,repeat,ours_s,pyg_s,pyg_over_ours,"
                              "ours_peak_mb,pyg_peak_mb")
    random, = (row.split(",") for row in rows[1:])
    assert random[:2] == ["random", "500"] and 4900 < int(random[2]) <= 5000
    assert all(float(value) > 0 for value in random[5:8])
    if sys.platform.startswith("linux"):   # the high-water mark is Linux's
        assert all(float(value) >= 0 for value in random[8:])
    assert plot.stat().st_size > 0


def test_norm_benchmark_can_skip_the_memory_runs_and_refuses_unknown_graphs():
    result = run(["--graphs", "cora", "--repeat", "1", "--skip-memory"])
    assert result.returncode == 0, result.stderr
    assert "cora            2708      10556" in result.stdout and "n/a" in result.stdout
    result = run(["--graphs", "karate"])
    assert result.returncode == 2 and "invalid choice: 'karate'" in result.stderr
