"""The ``gnn`` benchmark command runs end to end on a tiny case (Cora, one hidden width).

Its GPU mode runs in tests/test_gpu.py (real GPU only); here only its refusal without one.
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from .conftest import DATA_DIR, REPO_ROOT

requires_pyg = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None
    or importlib.util.find_spec("torch_geometric") is None,
    reason="torch and torch_geometric not installed")
requires_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared data not present")


def run(args, env=None):
    return subprocess.run([sys.executable, "-m", "pysparse_hpc.bench", "gnn", *args],
                          capture_output=True, text=True, timeout=900, cwd=REPO_ROOT, env=env)


@requires_pyg
@requires_data
def test_gnn_benchmark_cli(tmp_path):
    table, plot = tmp_path / "gnn.csv", tmp_path / "gnn.png"
    result = run(["--data", str(DATA_DIR), "--graph", "cora", "--hidden", "16", "--repeat", "1",
                  "--accuracy", "--seeds", "1", "--epochs", "3", "--csv", str(table),
                  "--plot", str(plot)])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "graph        nodes    edges hidden model variant" in out
    for line in ("target: GCN >= 1.5x faster than PyG per epoch",
                 "target: GAT >= 1.3x faster than PyG per epoch",
                 "AGNN (no target):", "ratio: GCN variants vs PyG (geo-mean): ours ",
                 "ratio: GAT variants vs PyG (geo-mean): ours ",
                 "ours (defaults) slower than PyG on:",
                 "accuracy: GCN on Cora, mean test accuracy over 1 seeds (3 epochs): ours ",
                 "accuracy: GAT on Cora"):
        assert line in out
    for model in ("GCN", "GAT"):
        assert re.search(rf"^target: {model} .*\): \d+\.\d\dx (MET|NOT MET)$", out, re.M)
    rows = table.read_text().splitlines()
    # header + cora x hidden 16 x (GCN: PyG + 5 of ours, GAT: PyG + 6, AGNN: PyG + 2)
    assert len(rows) == 1 + 6 + 7 + 3
    assert rows[0] == ("graph,nodes,edges,hidden,model,variant,ms_per_epoch,speedup_vs_pyg,"
                       "threads")
    assert rows[1].startswith("cora,2708,10556,16,gcn,pyg,")
    assert rows[1].split(",")[7] == "1.0000"
    assert plot.stat().st_size > 0


@pytest.mark.parametrize("args, message", [
    (["--graph", "nosuch"], "invalid choice"),
    (["--model", "gin"], "invalid choice"),
    (["--hidden", "0"], "positive integer"),
    (["--graph", "cora", "--model", "gat", "--hidden", "12"], "multiple of 8"),
    (["--device", "tpu"], "invalid choice"),
])
def test_gnn_benchmark_bad_arguments(args, message):
    result = run(["--data", str(REPO_ROOT), *args])
    assert result.returncode == 2
    assert message in result.stderr


@requires_pyg
def test_gnn_benchmark_cuda_without_a_device():
    """``--device cuda`` with no CUDA device (hidden from torch here, so this holds on a GPU
    machine too): one error line and status 2 before any graph is loaded (the data directory,
    the repository, holds no PubMed, which the GPU run loads first)."""
    result = run(["--data", str(REPO_ROOT), "--device", "cuda"],
                 env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 2
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("error: --device cuda: torch finds no CUDA device (")
    assert "use --device cpu" in errors[0]
    assert "loading" not in result.stderr and "pubmed" not in result.stderr
