"""The documentation builds without warnings, its examples run, and so do the scripts and CLIs."""
import subprocess
import sys

import pytest

from .conftest import DATA_DIR, REPO_ROOT

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")


def run(args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          cwd=REPO_ROOT, **kwargs)


def test_docs_build_without_warnings(tmp_path):
    result = run(["-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs",
                  str(tmp_path / "html")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_examples_run(tmp_path):
    result = run(["-m", "sphinx", "-q", "-b", "doctest", "docs", str(tmp_path / "doctest")])
    assert result.returncode == 0, result.stdout + result.stderr


#: Shorter trainings for the scripts that train (their defaults are the published settings):
#: the same code paths, a fraction of the epochs.
QUICK = {"train_gnn.py": ["--epochs", "30"], "precondition_gcn.py": ["--epochs", "30"],
         "train_distributed.py": ["--epochs", "30"], "train_kill_resume.py": ["--epochs", "30"]}


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO_ROOT / "examples").glob("*.py")))
def test_example_scripts(script):
    result = run([str(REPO_ROOT / "examples" / script), *QUICK.get(script, [])])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(not (DATA_DIR / "cora.npz").exists(), reason="shared data not present")
def test_convert_benchmark_cli(tmp_path):
    result = run(["-m", "pysparse_hpc.bench", "convert", "--data", str(DATA_DIR), "--matrix",
                  "cora", "--repeat", "1", "--csv", str(tmp_path / "c.csv")])
    assert result.returncode == 0, result.stderr
    assert "geometric mean" in result.stdout
    assert (tmp_path / "c.csv").read_text().count("\n") == 2  # header + one matrix


def test_benchmark_cli_bad_arguments():
    result = run(["-m", "pysparse_hpc.bench", "convert", "--data", "/nonexistent-dir"])
    assert result.returncode == 2 and "does not exist" in result.stderr
    result = run(["-m", "pysparse_hpc.bench", "convert", "--threads", "0"])
    assert result.returncode == 2 and "positive integer" in result.stderr
