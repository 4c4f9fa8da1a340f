"""The ``read`` benchmark command runs end to end on a tiny matrix."""
import subprocess
import sys

from .conftest import REPO_ROOT


def run(args):
    return subprocess.run([sys.executable, "-m", "pysparse_hpc.bench", "read", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)


def test_read_benchmark_cli(tmp_path):
    table, plot = tmp_path / "read.csv", tmp_path / "read.png"
    result = run(["--rows", "300", "--repeat", "1", "--threads", "1", "--dir", str(tmp_path),
                  "--csv", str(table), "--plot", str(plot)])
    assert result.returncode == 0, result.stderr
    assert "read: pysparse_hpc.io.read_matrix_market against scipy.io.mmread" in result.stdout
    assert "ours on 1 thread" in result.stdout
    rows = table.read_text().splitlines()
    assert rows[0].startswith("file,megabytes,stored,threads,repeat,ours_s,scipy_s")
    assert [row.split(",")[0] for row in rows[1:]] == ["mtx symmetric", "mtx general", "npz"]
    # the two Matrix Market files hold one matrix: the same entries once read
    assert rows[1].split(",")[2] == rows[2].split(",")[2] == rows[3].split(",")[2]
    assert plot.stat().st_size > 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["read.csv", "read.png"]


def test_read_benchmark_refuses_what_it_cannot_use(tmp_path):
    result = run(["--data", str(tmp_path)])
    assert result.returncode == 2
    assert "--data does not apply to read: it reads the files it writes itself" in result.stderr
    result = run(["--density", "1.5"])
    assert result.returncode == 2 and "--density is at most 1, got 1.5" in result.stderr
    result = run(["--dir", str(tmp_path / "missing")])
    assert result.returncode == 2 and "is not a directory" in result.stderr
