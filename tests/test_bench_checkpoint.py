"""``python -m pysparse_hpc.bench checkpoint`` on a tiny state (one round)."""
import os

import pytest

pytest.importorskip("torch")

from pysparse_hpc.bench.__main__ import main  # noqa: E402
from pysparse_hpc.bench.checkpoint import CheckpointResult, measure, verdict  # noqa: E402


def test_checkpoint_benchmark_measures_a_tiny_state(tmp_path):
    result = measure("large", megabytes=1, repeat=1, steps=1, directory=tmp_path)
    assert result.state == "large" and 0.9 < result.megabytes < 1.1
    assert all(t > 0 for t in (result.sync_save, result.async_stall, result.torch_save,
                               result.load, result.torch_load))
    assert list(tmp_path.iterdir()) == []  # its temporary folder is gone


def test_checkpoint_benchmark_command(tmp_path, capsys):
    table = tmp_path / "checkpoint.csv"
    assert main(["checkpoint", "--state", "gcn", "--repeat", "1", "--steps", "1", "--dir",
                 str(tmp_path), "--csv", str(table)]) == 0
    out = capsys.readouterr().out
    assert "gcn " in out and "target: an asynchronous save stalls training at most 1/5" in out
    rows = table.read_text().splitlines()
    assert rows[0].startswith("state,megabytes,sync_save_seconds,async_stall_seconds")
    assert len(rows) == 2 and rows[1].startswith("gcn,")
    assert main(["checkpoint", "--dir", str(tmp_path / "missing")]) == 2
    assert main(["checkpoint", "--dir", "/proc"]) == 2  # a directory nothing can be written in


def test_checkpoint_verdict():
    fast = CheckpointResult("a", 10.0, 1.0, 0.1, 1.0, 1.2, 1.0, 0.5, 0.5)
    slow = CheckpointResult("b", 10.0, 1.0, 0.3, 1.0, 1.2, 1.0, 0.5, 0.5)
    assert verdict([fast])[0].endswith("worst 0.100 (a), MET")
    assert verdict([fast, slow])[0].endswith("worst 0.300 (b), NOT MET")


def test_torch_save_writes_a_new_file_each_round(tmp_path, monkeypatch):
    # Ours writes every save to a new directory and deletes old ones in the background, so
    # torch.save must not be charged for truncating the previous round's file.
    from pysparse_hpc.bench import checkpoint

    original, found = checkpoint._torch_save, []

    def recording(state, path):
        found.append(os.path.exists(path))
        original(state, path)
    monkeypatch.setattr(checkpoint, "_torch_save", recording)
    measure("gcn", repeat=2, steps=1, directory=tmp_path)
    assert found == [False, False, False]


def test_checkpointer_hashes_on_the_benchmark_threads(tmp_path, monkeypatch):
    # torch runs on --threads; our hashing threads must be the same number, not the CPUs.
    import pysparse_hpc.distributed as distributed

    threads = []

    class Recording(distributed.Checkpointer):
        def __init__(self, *args, **kwargs):
            threads.append(kwargs.get("threads"))
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(distributed, "Checkpointer", Recording)
    assert main(["checkpoint", "--state", "gcn", "--repeat", "1", "--steps", "1", "--threads",
                 "1", "--dir", str(tmp_path)]) == 0
    assert threads == [1]


def test_megabytes_without_the_large_state_is_refused(tmp_path, monkeypatch, capsys):
    """``--megabytes`` sizes the large state only: without it the option is refused before
    anything is saved, not silently ignored; with it, the large state gets that size."""
    from pysparse_hpc.bench import checkpoint

    sizes = []

    def measured(name, megabytes, *args, **kwargs):
        sizes.append((name, megabytes))
        return CheckpointResult(name, 1.0, 1.0, 0.1, 1.0, 1.0, 1.0, 1.0, 1.0)
    monkeypatch.setattr(checkpoint, "measure", measured)
    assert main(["checkpoint", "--state", "gcn", "--state", "mlp", "--megabytes", "50",
                 "--dir", str(tmp_path)]) == 2
    assert ("error: --megabytes sizes the large state, and the states run are gcn, mlp: add "
            "--state large") in capsys.readouterr().err
    assert sizes == []
    assert main(["checkpoint", "--state", "gcn", "--state", "large", "--megabytes", "50",
                 "--repeat", "1", "--dir", str(tmp_path)]) == 0
    assert main(["checkpoint", "--state", "large", "--repeat", "1", "--dir", str(tmp_path)]) == 0
    assert sizes == [("gcn", 50), ("large", 50), ("large", checkpoint.LARGE_MEGABYTES)]
