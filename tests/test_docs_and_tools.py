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
    result = run(["-m", "pysparse_hpc.bench", "lion", "--ranks", "100000", "--skip-accuracy"])
    assert result.returncode == 2 and "100000 ranks on" in result.stderr
    for bad in (["--max-ranks", "100000000000000000000"], ["--seed", str(2 ** 70)]):
        result = run(["-m", "pysparse_hpc.bench", "distributed", "--skip-runs", "--quick"]
                     + bad)
        assert result.returncode == 2 and "must be in" in result.stderr, result.stderr
    result = run(["-m", "pysparse_hpc.bench", "reorder", "--planted", "4:8:nan:1"])
    assert result.returncode == 2 and "finite" in result.stderr


def test_an_installed_package_names_the_default_data_directory(tmp_path, monkeypatch):
    """Installed in site-packages, the default ../shared/data names a folder beside it: the
    message said only that it did not exist."""
    from pysparse_hpc.bench import _data
    missing = tmp_path / "lib" / "shared" / "data"
    monkeypatch.setattr(_data, "default_data_dir", lambda: missing)
    monkeypatch.setattr(_data, "_source_checkout", lambda: False)
    monkeypatch.delenv(_data.DATA_ENV, raising=False)
    with pytest.raises(_data.DataDirectoryMissing,
                       match="beside a source checkout, which this installed package is not"):
        _data.find_graph("pubmed")


def test_benchmarks_without_the_default_data_directory(tmp_path, monkeypatch, capsys):
    """A missing default ``../shared/data`` stops only what reads a shared file, saying how to
    point at one; the rest runs (the bundled Cora, generated matrices, argument checks)."""
    from pysparse_hpc.bench import _data
    from pysparse_hpc.bench.__main__ import main
    missing = tmp_path / "no-data"
    monkeypatch.setattr(_data, "default_data_dir", lambda: missing)
    monkeypatch.delenv(_data.DATA_ENV, raising=False)
    hint = f"benchmark data directory {str(missing)!r} does not exist; pass --data DIR or set " \
           f"{_data.DATA_ENV}"
    assert main(["convert", "--repeat", "1"]) == 2
    assert hint in capsys.readouterr().err
    with pytest.raises(_data.DataDirectoryMissing, match="pass --data DIR"):
        _data.find_graph("pubmed")
    with pytest.raises(FileNotFoundError, match="pass --data DIR"):  # what callers catch
        _data.find_graph("pubmed", missing)
    # The generated matrices still run; a shared matrix asked for by name is unknown.
    assert main(["spmm", "--rmat", "5:2", "--matrix", "cora", "--repeat", "1"]) == 2
    err = capsys.readouterr().err
    assert f"note: {hint}; only generated matrices run" in err and "unknown matrices" in err
    assert main(["precondition", "--steps", "0"]) == 2  # the argument, not the data
    assert "--steps must be at least 1" in capsys.readouterr().err
    # An explicit directory that does not exist is an error before anything runs.
    with pytest.raises(SystemExit):
        main(["convert", "--data", str(missing)])
    assert "(from the given path) does not exist" in capsys.readouterr().err


def test_benchmark_refuses_an_unreadable_matrix_and_twin_planted_graphs(tmp_path):
    (tmp_path / "suitesparse").mkdir()
    (tmp_path / "suitesparse" / "bad.npz").write_bytes(b"not a zip archive")
    result = run(["-m", "pysparse_hpc.bench", "convert", "--data", str(tmp_path),
                  "--repeat", "1"])
    assert result.returncode == 2 and "matrix bad" in result.stderr, result.stderr
    assert "not a zip file" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "empty").mkdir()
    result = run(["-m", "pysparse_hpc.bench", "reorder", "--data", str(tmp_path / "empty"),
                  "--planted", "4:8:2:1", "64:8:2:1"])
    assert result.returncode == 2 and "would both be named planted-c8-i2-e1" in result.stderr


PUBLIC_MODULES = ["pysparse_hpc", "pysparse_hpc.nn", "pysparse_hpc.nn.functional",
                  "pysparse_hpc.nn.models", "pysparse_hpc.nn.train", "pysparse_hpc.distributed",
                  "pysparse_hpc.distributed.training", "pysparse_hpc.distributed.checkpoint",
                  "pysparse_hpc.optim",
                  "pysparse_hpc.precondition", "pysparse_hpc.io", "pysparse_hpc.datasets",
                  "pysparse_hpc.generators"]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_api_reference_names_every_public_name(module):
    """Every name in a public module's ``__all__`` appears in the API reference."""
    import importlib
    import re
    pytest.importorskip("torch")
    text = (REPO_ROOT / "docs" / "api.rst").read_text()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    missing = [name for name in importlib.import_module(module).__all__ if name not in words]
    assert not missing, f"{module}: {missing} not in docs/api.rst"


def example_main(script):
    """The ``main`` of an example script, loaded as a module (not run)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(script[:-3], REPO_ROOT / "examples" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("script, arguments, message", [
    # --epochs 0 read as "not given": 200 epochs were trained.
    ("train_gnn.py", ["--epochs", "0"], "--epochs must be at least 1, got 0"),
    ("train_distributed.py", ["--epochs", "0"], "--epochs must be at least 1, got 0"),
    ("precondition_gcn.py", ["--epochs", "0"], "--epochs must be at least 1, got 0"),
    # A batch larger than the training set: no step, untrained models reported as trained.
    ("precondition_mlp.py", ["--batch-size", "5000"],
     "--batch-size must be at most the 1437 training examples, got 5000"),
    ("precondition_mlp.py", ["--threads", "0"], "--threads must be at least 1, got 0"),
    ("train_kill_resume.py", ["--ranks", "0"], "--ranks must be at least 1, got 0"),
    ("train_kill_resume.py", ["--epochs", "10"], "--epochs must be more than 10"),
    # dropped without a word, where the train command refuses them
    ("train_kill_resume.py", ["--compression", "votes"], "--compression applies to --optimizer"),
    ("train_kill_resume.py", ["--optimizer", "lion", "--base-optimizer", "sgd"],
     "--base-optimizer applies to a preconditioner"),
])
def test_example_scripts_refuse_bad_arguments(script, arguments, message, capsys):
    pytest.importorskip("torch")
    if script == "precondition_mlp.py":
        pytest.importorskip("sklearn")   # the synthetic data's size is another
    with pytest.raises(SystemExit) as stop:
        example_main(script)(arguments)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_example_help_describes_the_script_in_whole_sentences(capsys):
    pytest.importorskip("torch")
    with pytest.raises(SystemExit):
        example_main("precondition_gcn.py")(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "preconditioned by K-FAC, Shampoo and Jorge, and with SGD (momentum 0.9) on K-FAC's." \
        in out


@pytest.mark.parametrize("script, first_line", [
    ("convert_and_inspect.py", "Convert the Cora adjacency matrix to the blocked formats"),
    ("matrix_market_roundtrip.py", "Write a sparse matrix to a Matrix Market file"),
])
def test_examples_without_options_answer_help_without_running(script, first_line, capsys):
    # They took no arguments at all: --help ran the whole script.
    with pytest.raises(SystemExit) as stop:
        example_main(script)(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert first_line in out and "round trip" not in out.lower()   # what a run prints


def test_cuda_profile_without_a_gpu_is_one_error_line(capsys):
    # It ended in a traceback and status 1, where every other bench command prints one
    # error line and exits with 2.
    from numba import cuda

    from pysparse_hpc.bench import spmm_cuda_profile
    if cuda.is_available():
        pytest.skip("a CUDA device (or the simulator) is available")
    with pytest.raises(SystemExit) as stop:
        spmm_cuda_profile.main(["--rmat", "8:4"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: backend='cuda' needs a CUDA GPU") and "Traceback" not in err
