"""Checkpoints on one rank: bit-exact round trips, the asynchronous copy, atomic commits,
verification and fallback, keep-k, clear errors, and gathering per-node rows by global id."""
import collections
import gc
import hashlib
import json
import os
import random
import shutil
import signal
import threading
import warnings
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pysparse_hpc.distributed import Checkpoint, Checkpointer, Communicator  # noqa: E402
from pysparse_hpc.distributed import checkpoint as ckpt  # noqa: E402


def make(directory, **kwargs):
    return Checkpointer(directory, comm=Communicator(None), **kwargs)


def assert_same(a, b, path="state"):
    """Equal trees with equal types; arrays and tensors equal bit for bit (NaNs included)."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.requires_grad == b.requires_grad, path
        assert torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                           b.detach().contiguous().reshape(-1).view(torch.uint8)), path
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b), path
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, (path, a, b)


def training_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5),
                                torch.nn.Linear(5, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(8, 6)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def nested_state():
    model, optimizer = training_state()
    rng = np.random.default_rng(1)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate()},
        "tensors": [torch.randn(3, 4, dtype=torch.float64), torch.arange(7, dtype=torch.int32),
                    torch.randn(2, 3).to(torch.bfloat16), torch.randn(4).half(),
                    torch.tensor([True, False, True]), torch.randn(2, dtype=torch.complex64),
                    torch.zeros(0, 5), torch.tensor(3.25), torch.randn(4, 6)[:, ::2],
                    torch.nn.Parameter(torch.randn(2, 2)),
                    torch.tensor([float("nan"), -0.0, float("inf")])],
        "arrays": (rng.standard_normal((3, 2)).astype(np.float32), np.arange(10)[::3],
                   np.array(["ab", "c"]), np.zeros((2, 0)), np.array(7, dtype=np.uint16),
                   np.array([(1, 2.5)], dtype=[("a", "<i4"), ("b", "<f8")]),
                   # sub-array fields, a titled field and a nested record
                   np.arange(48, dtype=np.uint8).view([("v", "<f8", (2,)),
                                                       (("title", "t"), "<u2"),
                                                       ("r", [("x", "u1", (2, 3))])])),
        "scalars": [np.float32(1.5), np.int64(-3), np.bool_(True)],
        "plain": {"step": 12, "lr": 0.1 + 0.2, "name": "gcn \u00e9", "none": None, "flag": False,
                  "big": 2 ** 80, "nan": float("nan"), "bytes": b"\x00\xff", 3: "int key",
                  (1, "a"): "tuple key", "torch": (torch.float16, torch.Size([2, 3]),
                                                   torch.device("cpu"))},
        "ordered": OrderedDict(b=1, a=2),
    }


def test_round_trip_is_bit_exact(tmp_path):
    state = nested_state()
    shared = {"partition": np.arange(20) % 3, "config": {"hidden": 16}}
    checkpoints = make(tmp_path / "run")
    checkpoints.save(5, state, shared=shared)
    assert checkpoints.wait() == 5
    loaded = checkpoints.load()
    assert isinstance(loaded, Checkpoint)
    assert (loaded.step, loaded.ranks_saved, loaded.nodes) == (5, 1, None)
    assert_same(state, loaded.shard)
    assert_same(shared, loaded.shared)
    assert loaded.shard["model"]._metadata == state["model"]._metadata
    assert isinstance(loaded.shard["tensors"][9], torch.nn.Parameter)
    # The loaded state restores a model, an optimizer and the generators.
    model, optimizer = training_state(seed=1)
    model.load_state_dict(loaded.shard["model"])
    optimizer.load_state_dict(loaded.shard["optimizer"])
    np.random.seed(0)
    np.random.set_state(loaded.shard["rng"]["numpy"])
    random.setstate(loaded.shard["rng"]["python"])
    torch.set_rng_state(loaded.shard["rng"]["torch"])


def test_rng_states_round_trip(tmp_path):
    checkpoints = make(tmp_path)
    checkpoints.save(0, {"rng": ckpt.rng_states()}, blocking=True)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.restore_rng_states(checkpoints.load().shard["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_save_returns_before_writing_and_copies_the_state(tmp_path, monkeypatch):
    release, writing = threading.Event(), threading.Event()
    original = ckpt._files.write_atomic

    def held_write(path, chunks, threads=1):
        writing.set()
        assert release.wait(10)
        return original(path, chunks, threads)

    checkpoints = make(tmp_path)
    monkeypatch.setattr(ckpt._files, "write_atomic", held_write)
    weights = torch.arange(6, dtype=torch.float32)
    array = np.ones(4)
    state = {"w": weights, "a": array, "items": [1, 2], "step": 3}
    checkpoints.save(1, state)
    assert writing.wait(10)  # save() returned while the file is still being written
    assert not os.path.exists(tmp_path / "step-000000001" / "manifest.json")
    weights.add_(100)
    array[:] = -1
    state["items"].append(3)
    state["step"] = 4
    release.set()
    checkpoints.wait()
    loaded = checkpoints.load().shard
    assert torch.equal(loaded["w"], torch.arange(6, dtype=torch.float32))
    assert np.array_equal(loaded["a"], np.ones(4))
    assert loaded["items"] == [1, 2] and loaded["step"] == 3


def test_wait_commits_a_manifest_of_verified_files(tmp_path):
    checkpoints = make(tmp_path, fingerprint={"dataset": "cora"})
    checkpoints.save(7, {"w": torch.ones(3)}, shared={"s": 1},
                     nodes={"node_ids": np.arange(4), "h": np.zeros((4, 2))})
    checkpoints.wait()
    step_dir = tmp_path / "step-000000007"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["nodes-00000.ckpt", "rank-00000.ckpt", "shared.ckpt"]
    assert manifest["step"] == 7 and manifest["ranks"] == 1
    assert manifest["fingerprint"] == {"dataset": "cora"}
    for name, entry in manifest["files"].items():
        data = (step_dir / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": [[len(data),
                                                         hashlib.sha256(data).hexdigest()]]}
    assert sorted(os.listdir(step_dir)) == sorted([*manifest["files"], "manifest.json"])
    # no temporaries
    assert sorted(os.listdir(tmp_path)) == [".lock", "CHECKPOINTS", "step-000000007"]
    assert checkpoints.steps() == [7] and checkpoints.latest() == 7


def test_blocking_save_is_committed_on_return(tmp_path):
    checkpoints = make(tmp_path)
    checkpoints.save(0, {"w": torch.ones(2)}, blocking=True)
    assert (tmp_path / "step-000000000" / "manifest.json").is_file()
    assert checkpoints.wait() is None


def test_keep_last_k(tmp_path):
    checkpoints = make(tmp_path, keep=2)
    for step in (1, 3, 5):
        checkpoints.save(step, {"step": step})
    checkpoints.wait()
    assert checkpoints.steps() == [3, 5]
    checkpoints.save(8, {"step": 8})
    # Step 8 is being written: the older ones go only once it is committed.
    assert checkpoints.steps() == [3, 5]
    checkpoints.wait()
    assert checkpoints.steps() == [5, 8]
    checkpoints.close()  # and the files of the older ones are deleted
    assert checkpoints.steps() == [5, 8]
    assert sorted(os.listdir(tmp_path)) == [".lock", "CHECKPOINTS", "step-000000005",
                                            "step-000000008"]
    with make(tmp_path, keep=None) as everything:
        for step in (9, 10, 11):
            everything.save(step, {})
    assert make(tmp_path).steps() == [5, 8, 9, 10, 11]


@pytest.mark.parametrize("damage", ["manifest", "truncate", "renamed"])
def test_keep_counts_only_sound_checkpoints_of_an_earlier_run(tmp_path, damage):
    """A later run's pruning does not count an earlier run's damaged checkpoint among the kept:
    a good older one stays, so that `load` still finds a good checkpoint."""
    with make(tmp_path, keep=None) as first:
        for step in (1, 2, 3):
            first.save(step, {"w": torch.full((1000,), float(step))})
    newest = tmp_path / "step-000000003"
    if damage == "manifest":
        manifest = json.loads((newest / "manifest.json").read_text())
        manifest["created"] = "edited"
        (newest / "manifest.json").write_text(json.dumps(manifest))
    elif damage == "truncate":
        with open(newest / "rank-00000.ckpt", "r+b") as handle:
            handle.truncate(3)
    else:  # step 3's files under step 4's name
        shutil.copytree(newest, tmp_path / "step-000000004")
        shutil.rmtree(newest)
    second = make(tmp_path, keep=2)
    second.save(5, {"w": torch.full((1000,), 5.0)})
    second.close()
    # Step 1 goes; step 2 stays as the second good one beside step 5.
    assert second.steps() == ([2, 4, 5] if damage == "renamed" else [2, 3, 5])
    loaded = make(tmp_path).load(2)
    assert loaded.step == 2 and loaded.shard["w"][0] == 2.0


@pytest.mark.parametrize("failing", ["manifest", "directory"])
def test_a_failed_commit_says_whether_the_checkpoint_has_its_manifest(
        tmp_path, monkeypatch, failing):
    """A commit that fails names the step, and says whether the manifest was written (the
    checkpoint loads, but its directory's fsync failed) or not (there is no checkpoint)."""
    from pysparse_hpc.distributed.checkpoint import _files
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(3)})
    checkpoints._pending.thread.wait()  # the files are written: only the commit can fail
    if failing == "manifest":
        def write_json(path, obj):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(_files, "write_json", write_json)
    else:
        real = _files.fsync_directory

        def fsync_directory(path):
            if str(path) == str(tmp_path):
                raise OSError(5, "Input/output error")
            real(path)
        monkeypatch.setattr(_files, "fsync_directory", fsync_directory)
    with pytest.raises(OSError) as raised:
        checkpoints.wait()
    monkeypatch.undo()
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "while committing checkpoint step 1" in notes
    if failing == "directory":
        assert "manifest.json is written, so it loads" in notes
        assert make(tmp_path).load().step == 1
    else:
        assert "(writing its manifest.json)" in notes
        assert make(tmp_path).steps() == []
    # raised once, not tried again by the next call; the next save goes on
    assert checkpoints.wait() is None
    checkpoints.save(2, {"w": torch.full((3,), 2.0)})
    checkpoints.close()
    assert make(tmp_path).load().step == 2


def save_three(directory, **kwargs):
    checkpoints = make(directory, **kwargs)
    for step in (1, 2, 3):
        checkpoints.save(step, {"step": step, "w": torch.full((1000,), float(step))},
                         shared={"s": step})
    checkpoints.wait()
    return checkpoints


@pytest.mark.parametrize("damage, message", [
    ("truncate", "rank-00000.ckpt has 3 bytes but the manifest says"),
    ("flip", "rank-00000.ckpt does not match its SHA-256 checksum"),
    ("delete", "rank-00000.ckpt is missing"),
    ("shared", "shared.ckpt does not match its SHA-256 checksum"),
    ("manifest", "manifest.json does not match its own checksum"),
    ("torn", "manifest.json is missing (an interrupted save)"),
])
def test_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, damage, message):
    checkpoints = save_three(tmp_path)
    step_dir = tmp_path / "step-000000003"
    shard = step_dir / "rank-00000.ckpt"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:3])
    elif damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x10
        shard.write_bytes(bytes(data))
    elif damage == "delete":
        shard.unlink()
    elif damage == "shared":
        data = bytearray((step_dir / "shared.ckpt").read_bytes())
        data[-1] ^= 1
        (step_dir / "shared.ckpt").write_bytes(bytes(data))
    elif damage == "manifest":
        manifest = json.loads((step_dir / "manifest.json").read_text())
        manifest["files"]["rank-00000.ckpt"]["bytes"] += 1
        (step_dir / "manifest.json").write_text(json.dumps(manifest))
    else:
        (step_dir / "manifest.json").unlink()
    with pytest.warns(UserWarning, match="step 3 in .* is damaged") as caught:
        loaded = checkpoints.load()
    assert message in str(caught[0].message) and "loading step 2 instead" in str(
        caught[0].message)
    assert loaded.step == 2 and loaded.shared == {"s": 2}
    assert [step for step, _ in loaded.skipped] == [3] and message in loaded.skipped[0][1]
    assert torch.equal(loaded.shard["w"], torch.full((1000,), 2.0))
    if damage == "torn":
        assert checkpoints.steps() == [1, 2]  # a checkpoint without a manifest does not exist
    else:
        # The damaged step can be saved again (the damaged copy is moved aside).
        checkpoints.save(3, {"step": 3, "w": torch.zeros(2)}, blocking=True)
        assert checkpoints.load().step == 3


def test_every_checkpoint_damaged_or_none_is_a_clear_error(tmp_path):
    checkpoints = save_three(tmp_path)
    for step in (1, 2, 3):
        path = tmp_path / f"step-{step:09d}" / "rank-00000.ckpt"
        path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match=f"no usable checkpoint in {tmp_path}: step 3: "
                                         "rank-00000.ckpt has"):
        checkpoints.load()
    with pytest.raises(ValueError, match="step 2: rank-00000.ckpt has"):
        checkpoints.load(step=2)  # no fallback from an explicit step
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 9 in"):
        checkpoints.load(step=9)
    with pytest.raises(FileNotFoundError, match=f"no committed checkpoint in {tmp_path / 'empty'}"):
        make(tmp_path / "empty").load()


def test_only_interrupted_saves_is_no_checkpoint(tmp_path):
    # A job killed during its first save leaves a step directory without a manifest: that is
    # a directory without checkpoints (FileNotFoundError, so a resumed run starts afresh), not
    # a damaged one.
    checkpoints = make(tmp_path)
    checkpoints.save(5, {"w": torch.ones(3)}, blocking=True)
    (tmp_path / "step-000000005" / "manifest.json").unlink()
    assert checkpoints.steps() == []
    with pytest.raises(FileNotFoundError, match=r"no committed checkpoint in .*steps 5 were"):
        checkpoints.load()
    with pytest.raises(FileNotFoundError, match="no committed checkpoint of step 5"):
        checkpoints.load(step=5)
    checkpoints.save(5, {"w": torch.zeros(3)}, blocking=True)  # the torn files are replaced
    assert torch.equal(checkpoints.load().shard["w"], torch.zeros(3))


def test_saving_the_step_just_saved_again_keeps_the_first(tmp_path):
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(3)}, blocking=True)
    checkpoints.save(2, {"w": torch.full((3,), 2.0)})  # not yet committed
    with pytest.raises(FileExistsError, match="checkpoint step 2 already exists .*just before"):
        checkpoints.save(2, {"w": torch.zeros(3)})
    assert checkpoints.steps() == [1, 2]
    assert torch.equal(checkpoints.load().shard["w"], torch.full((3,), 2.0))
    checkpoints.close()


def test_a_rolled_back_run_cannot_save_beside_newer_checkpoints(tmp_path):
    # Pruning keeps the highest steps and load() takes the newest: steps 11 and 12 saved after
    # going back to step 10 would have been pruned in favour of step 20, and loaded as it.
    checkpoints = make(tmp_path, keep=2)
    for step in (10, 20):
        checkpoints.save(step, {"step": step})
    checkpoints.wait()
    assert checkpoints.load(step=10).shard == {"step": 10}
    with pytest.raises(ValueError, match="cannot save step 11 .* newer checkpoint of step 20 "
                                         r"\(a run rolled back"):
        checkpoints.save(11, {"step": 11})
    assert checkpoints.steps() == [10, 20]
    checkpoints.save(21, {"step": 21})   # forward from the newest is fine
    with pytest.raises(ValueError, match="cannot save step 15 .* checkpoints of steps 20, 21 "):
        checkpoints.save(15, {"step": 15})   # older than the pending save: it is committed
    assert checkpoints.steps() == [20, 21] and checkpoints.load().shard == {"step": 21}
    checkpoints.close()


def test_fingerprint_of_another_run(tmp_path):
    make(tmp_path / "a", fingerprint={"dataset": "cora", "seed": 0, "model": "gcn"})
    make(tmp_path / "a", fingerprint={"dataset": "cora", "seed": 0, "model": "gcn"}).save(
        1, {}, blocking=True)
    with pytest.raises(ValueError, match=r"another run .*'model' \(saved 'gcn', given 'gat'\), "
                                         r"'seed' \(saved 0, given 1\)"):
        make(tmp_path / "a", fingerprint={"dataset": "cora", "seed": 1, "model": "gat"})
    # A directory made without a fingerprint: the manifests' fingerprints are checked on load.
    make(tmp_path / "b").save(0, {}, blocking=True)
    make(tmp_path / "b", fingerprint={"seed": 0}).save(1, {}, blocking=True)
    with pytest.raises(ValueError, match=r"step 1\): the fingerprint differs in 'lr' \(saved "
                                         r"<absent>, given 0.1\), 'seed'"):
        make(tmp_path / "b", fingerprint={"seed": 2, "lr": 0.1}).load()
    assert make(tmp_path / "b").load().step == 1
    with pytest.raises(TypeError, match="fingerprint must be a dict of JSON values"):
        make(tmp_path / "c", fingerprint={"x": object()})


def test_a_run_that_saved_nothing_leaves_its_directory_to_the_next(tmp_path):
    """A run that failed before its first save (a mistyped dataset) left only its marker: the
    corrected run takes the directory over instead of calling it another run's."""
    make(tmp_path / "a", fingerprint={"dataset": "no/such/file.npz"}).close()
    checkpoints = make(tmp_path / "a", fingerprint={"dataset": "cora"})
    checkpoints.save(1, {"x": 1}, blocking=True)
    checkpoints.close()
    assert make(tmp_path / "a", fingerprint={"dataset": "cora"}).load().shard == {"x": 1}
    with pytest.raises(ValueError, match="another run"):
        make(tmp_path / "a", fingerprint={"dataset": "pubmed"})


def test_a_run_not_yet_saved_keeps_its_directory(tmp_path):
    """Only the run that made the marker takes it back: a run still before its first save
    keeps its directory from another, and a directory whose steps were deleted is kept for
    its own run."""
    live = make(tmp_path / "a", fingerprint={"dataset": "cora"})
    with pytest.raises(ValueError, match="was made by another run .* it holds no checkpoint "
                                         ".* delete"):
        make(tmp_path / "a", fingerprint={"dataset": "pubmed"})
    live.save(1, {"x": 1}, blocking=True)
    live.close()
    shutil.rmtree(tmp_path / "a" / next(e for e in os.listdir(tmp_path / "a")
                                        if e.startswith("step")))
    with pytest.raises(ValueError, match="another run"):
        make(tmp_path / "a", fingerprint={"dataset": "pubmed"})
    make(tmp_path / "a", fingerprint={"dataset": "cora"}).save(2, {"x": 2}, blocking=True)


def test_bad_arguments_are_clear_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        make(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a checkpoint directory .*'notes.txt'"):
        make(tmp_path / "other")
    with pytest.raises(ValueError, match="keep must be at least 1"):
        make(tmp_path / "k", keep=0)
    with pytest.raises(TypeError, match="keep must be a positive int"):
        make(tmp_path / "k", keep="3")
    with pytest.raises(ValueError, match="threads must be at least 1 .* got 0"):
        make(tmp_path / "t", threads=0)
    with pytest.raises(TypeError, match="threads must be a positive int or None, got 'x'"):
        make(tmp_path / "t", threads="x")
    checkpoints = make(tmp_path / "run")
    for step, kind in ((-1, ValueError), (1.5, TypeError), (True, TypeError), ("3", TypeError)):
        with pytest.raises(kind, match="step must be a non-negative int"):
            checkpoints.save(step, {})
    checkpoints.save(np.int64(4), {}, blocking=True)
    with pytest.raises(FileExistsError, match="checkpoint step 4 already exists"):
        checkpoints.save(4, {})
    with pytest.raises(TypeError, match=r"shard\['a'\]\[1\] is a builtins.object"):
        checkpoints.save(5, {"a": [1, object()]})
    with pytest.raises(TypeError, match=r"shared\['x'\] is a NumPy array of dtype object"):
        checkpoints.save(5, {}, shared={"x": np.array([None])})
    with pytest.raises(TypeError, match=r"shard\['s'\] is a torch.sparse_coo tensor"):
        checkpoints.save(5, {"s": torch.eye(2).to_sparse()})
    with pytest.raises(TypeError, match=r"shard has a key of type frozenset"):
        checkpoints.save(5, {frozenset(): 1})
    loop = []
    loop.append(loop)
    with pytest.raises(TypeError, match=r"shard\[0\] contains itself"):
        checkpoints.save(5, loop)
    with pytest.raises(ValueError, match=r"nodes\['h'\] has shape \(2, 3\) but there are 3 node"):
        checkpoints.save(5, {}, nodes={"node_ids": np.arange(3), "h": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="repeated ids"):
        checkpoints.save(5, {}, nodes={"node_ids": np.array([1, 1])})
    with pytest.raises(TypeError, match="1-D array of integer node ids"):
        checkpoints.save(5, {}, nodes={"node_ids": np.zeros(2)})
    with pytest.raises(ValueError, match="ids beyond int64"):  # they wrapped round to -1
        checkpoints.save(5, {}, nodes={"node_ids": np.array([0, 2 ** 64 - 1], np.uint64)})
    assert checkpoints.steps() == [4]  # nothing was half-saved
    checkpoints.save(5, {}, blocking=True)
    assert checkpoints.steps() == [4, 5]


def test_a_failed_background_write_surfaces(tmp_path, monkeypatch):
    def failing_write(path, chunks, threads=1):
        raise OSError(28, "No space left on device")

    checkpoints = make(tmp_path)
    monkeypatch.setattr(ckpt._files, "write_atomic", failing_write)
    checkpoints.save(1, {"w": torch.ones(3)})
    with pytest.raises(OSError, match="No space left") as caught:
        checkpoints.wait()
    assert any("saving checkpoint step 1" in note for note in caught.value.__notes__)
    checkpoints.save(2, {"w": torch.ones(3)})  # the next save() raises it too
    with pytest.raises(OSError, match="No space left"):
        checkpoints.save(3, {"w": torch.ones(3)})
    assert checkpoints.steps() == []
    monkeypatch.undo()
    checkpoints.save(2, {"w": torch.ones(3)})  # the failed save's leftovers are replaced
    checkpoints.close()
    assert checkpoints.steps() == [2] and checkpoints.load().step == 2
    assert sorted(os.listdir(tmp_path)) == [".lock", "CHECKPOINTS", "step-000000002"]


def split_nodes(ids_by_part, features, labels):
    return [{"node_ids": ids, "h": features[ids], "y": torch.from_numpy(labels[ids])}
            for ids in ids_by_part]


def test_gather_node_rows_by_global_id():
    rng = np.random.default_rng(0)
    n = 40
    features = rng.standard_normal((n, 3)).astype(np.float32)
    labels = rng.integers(0, 5, n)
    parts = split_nodes(np.array_split(rng.permutation(n), 3), features, labels)
    parts.insert(1, {"node_ids": np.zeros(0, np.int64), "h": np.zeros((0, 3), np.float32),
                     "y": torch.zeros(0, dtype=torch.int64)})  # a rank without nodes
    for wanted in (np.arange(n)[::-1], rng.permutation(n)[:17], np.zeros(0, np.int64),
                   torch.tensor([5, 5, 0])):
        rows = ckpt.gather_node_rows(wanted, parts)
        ids = np.asarray(wanted)
        assert np.array_equal(rows["node_ids"], ids)
        assert rows["h"].dtype == np.float32 and np.array_equal(rows["h"], features[ids])
        assert torch.equal(rows["y"], torch.from_numpy(labels[ids]))
    with pytest.raises(ValueError, match=r"2 of the 3 node ids are in no part, e.g. \[40, 99\]"):
        ckpt.gather_node_rows([40, 1, 99], parts)
    with pytest.raises(ValueError, match="node 3 is held by more than one part"):
        ckpt.gather_node_rows([3], parts + [parts[0]])
    with pytest.raises(ValueError, match="different per-node arrays"):
        ckpt.gather_node_rows([3], parts + [{"node_ids": np.array([50])}])


def test_per_node_state_loads_by_node_id(tmp_path):
    n = 30
    features = np.arange(n * 2, dtype=np.float64).reshape(n, 2)
    order = np.random.default_rng(3).permutation(n)
    checkpoints = make(tmp_path)
    checkpoints.save(1, {}, nodes={"node_ids": order, "h": features[order],
                                   "m": torch.from_numpy(features[order]).float()})
    loaded = checkpoints.load()
    assert np.array_equal(loaded.nodes["node_ids"], order)
    assert np.array_equal(loaded.nodes["h"], features[order])
    wanted = np.array([29, 0, 7, 3])
    loaded = checkpoints.load(node_ids=wanted)
    assert np.array_equal(loaded.nodes["h"], features[wanted])
    assert torch.equal(loaded.nodes["m"], torch.from_numpy(features[wanted]).float())
    with pytest.raises(ValueError, match=r"step 1 in .*: 1 of the 2 node ids are in no part"):
        checkpoints.load(node_ids=[1, 30])


def test_the_next_save_commits_the_previous_one(tmp_path):
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(2)})
    checkpoints.save(2, {"w": torch.ones(2)})   # commits step 1 in its background thread
    while checkpoints.writing:
        threading.Event().wait(0.001)
    assert checkpoints.steps() == [1]
    with pytest.raises(TypeError, match="builtins.object"):
        checkpoints.save(3, {"w": object()})   # a failing save still commits step 2
    assert checkpoints.steps() == [1, 2]
    checkpoints.save(3, {"w": torch.zeros(2)})
    assert checkpoints.load().step == 3   # load() commits first


def test_one_run_writes_a_directory_at_a_time(tmp_path):
    """Two runs writing one directory would each delete the other's unfinished saves: a save
    through a second `Checkpointer` is refused while the first writes (in this process or
    another), reading is not, and the directory is free once the writer is closed or
    released, or its process ends."""
    import subprocess
    import sys
    directory = tmp_path / "run"
    first = make(directory)
    first.save(1, {"x": torch.ones(3)})
    first.wait()
    reader = make(directory)
    assert reader.load().step == 1
    with pytest.raises(BlockingIOError, match=rf"another run \(PID {os.getpid()} on .*: this "
                                              "process"):
        reader.save(2, {"x": torch.zeros(3)})
    first.close()
    second = make(directory)
    second.save(2, {"x": torch.zeros(3)}, blocking=True)
    second.release()  # a failing run frees the directory without committing anything
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, numpy; from pysparse_hpc.distributed import "
         "Checkpointer; held = Checkpointer(sys.argv[1]); held.save(3, numpy.ones(2), "
         "blocking=True); "
         "print('locked', flush=True); time.sleep(60)", str(directory)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(BlockingIOError, match=rf"PID {holder.pid} on"):
            make(directory).save(4, {"x": torch.zeros(3)})
    finally:
        holder.kill()
        holder.wait()
    make(directory).save(4, {"x": torch.zeros(3)}, blocking=True)  # a killed holder left none


def test_loaded_tensors_share_nothing_with_the_files(tmp_path):
    """Loading reads the files into memory: overwriting or truncating a checkpoint file later
    (a copy over the run directory) changes nothing loaded (a mapping of the file followed it,
    and a truncated file ended the process with SIGBUS on the next read)."""
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.zeros(1000)}, blocking=True)
    loaded = checkpoints.load().shard["w"]
    path = tmp_path / "step-000000001" / "rank-00000.ckpt"
    with open(path, "r+b") as handle:
        handle.seek(-4000, 2)
        handle.write(np.ones(1000, np.float32).tobytes())
    assert float(loaded.sum()) == 0.0
    with open(path, "r+b") as handle:
        handle.truncate(0)
    assert float(loaded.sum()) == 0.0


def test_a_failing_block_commits_the_finished_save_in_one_process(tmp_path):
    """`with Checkpointer(...)` whose body raises: the save's files are finished and, in one
    process, committed (it was lost); the body's exception propagates."""
    with pytest.raises(RuntimeError, match="the body"):
        with make(tmp_path) as checkpoints:
            checkpoints.save(100, {"w": torch.ones(3)})
            raise RuntimeError("the body failed")
    assert torch.equal(make(tmp_path).load().shard["w"], torch.ones(3))


def test_an_interrupted_save_or_wait_keeps_the_save_before(tmp_path, monkeypatch):
    """Ctrl-C while a save copies its state commits the previous save (its files are whole);
    Ctrl-C while `wait` waits for the files leaves the save pending, and the next `wait`
    commits it (both were lost)."""
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(2)})

    def interrupted(self, region):
        raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(ckpt._format.Encoder, "stage", interrupted)
        with pytest.raises(KeyboardInterrupt):
            checkpoints.save(2, {"w": torch.zeros(2)})
    assert checkpoints.steps() == [1] and checkpoints.wait() is None

    release = threading.Event()
    original = ckpt._files.write_atomic

    def held_write(path, chunks, threads=1):
        assert release.wait(10)
        return original(path, chunks, threads)
    monkeypatch.setattr(ckpt._files, "write_atomic", held_write)
    checkpoints.save(3, {"w": torch.full((2,), 3.0)})
    waiting = threading.Event()
    original_wait = threading.Event.wait

    def interrupt_once(self, timeout=None):
        if not waiting.is_set() and self is not release:
            waiting.set()
            raise KeyboardInterrupt
        return original_wait(self, timeout)
    with monkeypatch.context() as patch:
        patch.setattr(threading.Event, "wait", interrupt_once)
        with pytest.raises(KeyboardInterrupt):
            checkpoints.wait()
    release.set()
    assert checkpoints.wait() == 3
    assert torch.equal(checkpoints.load().shard["w"], torch.full((2,), 3.0))


def two_saved(directory):
    with make(directory, keep=2) as checkpoints:
        for step in (1, 2):
            checkpoints.save(step, {"w": torch.full((2,), float(step))})


@pytest.mark.parametrize("when", ["before the thread starts", "after it started",
                                  "after the job is queued"])
def test_a_save_interrupted_while_starting_its_writer_loses_nothing(tmp_path, monkeypatch,
                                                                    when):
    """Ctrl-C inside `save` as it starts the background writer (starting a thread waits for
    it to be scheduled). The save was left pending with no job: `close` committed a manifest
    without this rank's files, `keep` counted it and deleted the last good checkpoint; an
    interrupt inside the thread's start made `close` fail with a TypeError."""
    two_saved(tmp_path)
    original_start, original_background = threading.Thread.start, Checkpointer._background

    def interrupted_start(thread):
        if thread.name == "checkpoint-writer":
            if when == "after it started":
                original_start(thread)
            raise KeyboardInterrupt
        return original_start(thread)

    def interrupted_background(self, *args, **kwargs):
        original_background(self, *args, **kwargs)
        raise KeyboardInterrupt

    checkpoints = make(tmp_path, keep=1)   # a resumed run
    assert checkpoints.load().step == 2
    with monkeypatch.context() as patch:
        if when == "after the job is queued":
            patch.setattr(Checkpointer, "_background", interrupted_background)
        else:
            patch.setattr(threading.Thread, "start", interrupted_start)
        with pytest.raises(KeyboardInterrupt):
            checkpoints.save(3, {"w": torch.full((2,), 3.0)})
    checkpoints.close()
    # The writer may have taken the queued job before the interrupt was handled: then step 3
    # is whole and committed; else it was dropped. Either way nothing torn is kept.
    loaded = make(tmp_path).load()
    assert loaded.step in (2, 3) and torch.equal(loaded.shard["w"],
                                                 torch.full((2,), float(loaded.step)))
    if when != "after the job is queued":
        assert checkpoints.steps() == [1, 2]  # nothing committed, nothing pruned
    with make(tmp_path, keep=1) as again:   # and the directory takes the next save
        again.save(4, {"w": torch.full((2,), 4.0)})
    assert make(tmp_path).load().step == 4


def test_a_commit_interrupted_in_wait_is_taken_up_by_the_next_call(tmp_path, monkeypatch):
    """Ctrl-C while `wait` writes the manifest lost the save: `wait` had let it go before
    committing, so the next `wait` found nothing, and the next save deleted its files."""
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(2)})
    checkpoints.wait()
    checkpoints.save(2, {"w": torch.full((2,), 2.0)})

    def interrupted(path, obj):
        raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(ckpt._files, "write_json", interrupted)
        with pytest.raises(KeyboardInterrupt):
            checkpoints.wait()
    assert checkpoints.wait() == 2 and checkpoints.steps() == [1, 2]
    checkpoints.save(3, {"w": torch.full((2,), 3.0)})
    checkpoints.close()
    assert checkpoints.steps() == [1, 2, 3]


def test_a_commit_of_a_save_without_its_files_is_refused(tmp_path):
    checkpoints = make(tmp_path)
    with pytest.raises(RuntimeError, match="no rank-00000.ckpt written"):
        checkpoints._commit(5, [{}])
    checkpoints.close()
    assert checkpoints.steps() == []


def test_a_directory_deleted_under_the_run_is_not_made_again(tmp_path):
    """The step's directory was made with its parents: the deleted checkpoint directory came
    back without its CHECKPOINTS file and lock, and the resumed run was refused."""
    directory = tmp_path / "run"
    checkpoints = make(directory)
    checkpoints.save(1, {"w": torch.ones(2)})
    checkpoints.wait()
    shutil.rmtree(directory)
    checkpoints.save(2, {"w": torch.ones(2)})
    with pytest.raises(FileNotFoundError) as caught:
        checkpoints.wait()
    assert "saving checkpoint step 2" in caught.value.__notes__[-1]
    checkpoints.close()
    assert not directory.exists()


def test_a_linked_step_is_pruned_by_removing_the_link(tmp_path):
    """A step directory linked to a copy kept elsewhere: pruning deleted the copy's manifest
    (through the link) and then failed to remove the link."""
    directory, archive = tmp_path / "run", tmp_path / "archive"
    two_saved(directory)
    shutil.move(directory / "step-000000001", archive)
    os.symlink(archive, directory / "step-000000001")
    with make(directory, keep=2) as checkpoints:
        checkpoints.save(3, {"w": torch.full((2,), 3.0)})
    assert sorted(os.listdir(directory)) == [".lock", "CHECKPOINTS", "step-000000002",
                                             "step-000000003"]
    assert sorted(os.listdir(archive)) == ["manifest.json", "rank-00000.ckpt"]


def test_a_failed_write_names_its_file(tmp_path, monkeypatch):
    def failing_fsync(descriptor):
        raise OSError(28, "No space left on device")
    checkpoints = make(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(ckpt._files.os, "fsync", failing_fsync)
        checkpoints.save(1, {"w": torch.ones(2)})
        with pytest.raises(OSError, match="No space left") as caught:
            checkpoints.wait()
    assert any(note.startswith("while writing ") and "rank-00000.ckpt" in note
               for note in caught.value.__notes__)
    checkpoints.close()


def test_a_bytes_path_is_taken(tmp_path):
    with make(os.fsencode(tmp_path / "run")) as checkpoints:
        checkpoints.save(1, {"w": torch.ones(2)})
    assert make(tmp_path / "run").load().step == 1


def test_what_save_takes_loads(tmp_path):
    """Tuple keys holding NumPy scalars, bytes or torch values, a torch.Size key, and a bool
    tensor viewed from bytes other than 0 and 1: saved without a word, then refused as
    damage by the stricter loader (which must load whatever the writer writes)."""
    mask = torch.tensor([0, 2, 255], dtype=torch.uint8).view(torch.bool)
    state = {("layer", np.int64(0)): torch.ones(2), (b"k", 1): 2, (torch.float32, "x"): 3,
             torch.Size([2, 3]): 4, "mask": mask}
    with make(tmp_path) as checkpoints:
        checkpoints.save(1, state)
    loaded = make(tmp_path).load().shard
    assert set(loaded) == set(state)
    assert torch.equal(loaded["mask"], mask) and torch.equal(loaded[("layer", 0)], torch.ones(2))


def test_a_wait_interrupted_while_it_gathers_keeps_the_save(tmp_path, monkeypatch):
    """Ctrl-C in the collectives of `wait` (gathering the ranks' records, which waits for the
    slowest rank) lost the save: it had been let go of before them."""
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(2)})
    with monkeypatch.context() as patch:
        def interrupted(records):
            raise KeyboardInterrupt
        patch.setattr(checkpoints.comm, "gather", interrupted)
        with pytest.raises(KeyboardInterrupt):
            checkpoints.wait()
    assert checkpoints.wait() == 1
    checkpoints.close()
    assert checkpoints.steps() == [1]


def test_a_large_fingerprint_reopens_without_repair(tmp_path):
    fingerprint = {"vocabulary": ["w%d" % i for i in range(200_000)]}   # about 2 MB
    with make(tmp_path, fingerprint=fingerprint) as checkpoints:
        checkpoints.save(1, {"w": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make(tmp_path, fingerprint=fingerprint).load().step == 1


def test_a_first_save_that_failed_leaves_the_directory_to_the_next_run(tmp_path, monkeypatch):
    """A first save that failed after taking the directory's lock (no memory for the copy)
    left the lock file beside nothing else: the corrected run took it for a foreign folder."""
    from pysparse_hpc.distributed.checkpoint import _format
    failing = make(tmp_path / "a", fingerprint={"dataset": "cora"})
    with monkeypatch.context() as patch:
        patch.setattr(_format.Encoder, "stage", lambda self, buffer: (_ for _ in ()).throw(
            MemoryError("no memory for the copy")))
        with pytest.raises(MemoryError):
            failing.save(1, {"w": np.ones(3)})
    failing.abandon()
    assert os.listdir(tmp_path / "a") == [".lock"]
    corrected = make(tmp_path / "a", fingerprint={"dataset": "pubmed"})
    corrected.save(1, {"w": np.ones(3)}, blocking=True)
    assert corrected.load().shard["w"].tolist() == [1, 1, 1]


def test_abandon_commits_a_whole_pending_save_in_one_process(tmp_path):
    """A run failing in one process (Ctrl-C) keeps the save it had started: its files are
    whole, and no other rank is needed to commit it."""
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": np.ones(3)}, blocking=True)
    checkpoints.save(2, {"w": np.zeros(3)})
    checkpoints.abandon()
    assert make(tmp_path).load().step == 2


def test_an_asynchronous_save_writes_the_bytes_of_a_blocking_one(tmp_path):
    """The staging buffer is reused: the padding between its arrays is zeroed, not left with
    the bytes of the state saved before."""
    def state(fill):
        return {"a": np.full(3, fill, np.int8), "b": np.full(5, fill, np.float64),
                "c": torch.full((7,), fill, dtype=torch.int16)}
    asynchronous, blocking = make(tmp_path / "async"), make(tmp_path / "blocking")
    asynchronous.save(1, {"junk": np.full(4096, 0x5A, np.uint8)})
    asynchronous.save(2, state(3))
    asynchronous.wait()
    blocking.save(2, state(3), blocking=True)
    name = "step-000000002/rank-00000.ckpt"
    assert (tmp_path / "async" / name).read_bytes() == (tmp_path / "blocking" / name).read_bytes()


def test_a_whole_file_this_torch_cannot_read_is_an_error_not_damage(tmp_path):
    """A file whose checksums verify but whose tensor dtype this torch lacks (a file of a newer
    torch) was taken for damaged: load passed over the newest checkpoint for an older one."""
    from pysparse_hpc.distributed.checkpoint import _files
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(2)}, blocking=True)
    checkpoints.save(2, {"w": torch.full((2,), 2.0)}, blocking=True)
    step_dir = tmp_path / "step-000000002"
    data = (step_dir / "rank-00000.ckpt").read_bytes().replace(b'"dtype":"float32"',
                                                               b'"dtype":"float99"')
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"]["rank-00000.ckpt"] = _files.write_atomic(
        str(step_dir / "rank-00000.ckpt"), [data])
    manifest["checksum"] = _files.manifest_checksum(manifest)
    _files.write_json(str(step_dir / "manifest.json"), manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no "damaged, loading step 1 instead"
        with pytest.raises(ValueError, match=r"rank-00000.ckpt holds a tensor of dtype "
                                             r"torch.float99, which torch .* does not have"):
            checkpoints.load()
    assert checkpoints.load(step=1).shard["w"].tolist() == [1.0, 1.0]


def run_checkpointing_script(directory, body):
    """Run ``body`` in a new Python process, with ``checkpoints`` a one-process `Checkpointer`
    on ``directory`` (and ``numpy`` imported); it must end with status 0."""
    import subprocess
    import sys
    script = ("import sys, numpy\n"
              "from pysparse_hpc.distributed import Checkpointer, Communicator\n"
              "checkpoints = Checkpointer(sys.argv[1], comm=Communicator(None))\n" + body)
    done = subprocess.run([sys.executable, "-c", script, str(directory)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_end_of_the_process_finishes_the_background_saves(tmp_path):
    """The writer is a daemon thread, which the interpreter stopped where it was: a script
    that ended without close() lost the commit of the save before its last (which the last
    save had begun in the background) and left a temporary manifest behind. Now the end of
    the process finishes both, and in one process commits the last save too."""
    run_checkpointing_script(tmp_path, (
        "import time\n"
        "from pysparse_hpc.distributed.checkpoint import _files\n"
        "write = _files.write_atomic\n"
        "def slow(*args, **kwargs):  # a slow disk: the writer is busy when the script ends\n"
        "    time.sleep(0.3)\n"
        "    return write(*args, **kwargs)\n"
        "_files.write_atomic = slow\n"
        "checkpoints.save(1, {'w': numpy.ones(3)})\n"
        "checkpoints.save(2, {'w': numpy.zeros(3)})\n"))
    loaded = make(tmp_path).load()
    assert loaded.step == 2 and loaded.shard["w"].tolist() == [0, 0, 0] and not loaded.skipped
    left = [name for _, _, names in os.walk(tmp_path) for name in names if name.endswith(".tmp")]
    assert left == []


def test_a_released_checkpointer_commits_nothing_at_the_end_of_the_process(tmp_path):
    """release() gives the directory up without committing: the end of the process must not
    commit the pending save afterwards, into a directory another run may hold by then."""
    run_checkpointing_script(tmp_path, "checkpoints.save(1, {'w': numpy.ones(3)})\n"
                                       "checkpoints.release()\n")
    assert make(tmp_path).steps() == []


def test_a_checkpointer_dropped_without_close_frees_the_directory(tmp_path):
    """The background thread held its last job, a bound method of the checkpointer: one
    dropped without close() was never freed, nor its staging buffer, lock and thread, and a
    new checkpointer on its directory in the same process (a notebook's cell run again) was
    refused as another run."""
    import gc
    import weakref
    dropped = make(tmp_path)
    dropped.save(1, {"w": torch.ones(1000)})
    dropped.wait()
    worker, alive = dropped._worker, weakref.ref(dropped)
    del dropped
    gc.collect()
    assert alive() is None
    worker.join(10)
    assert not worker.is_alive()
    assert (tmp_path / ".lock").read_text() == ""  # released as close() does: no holder named
    checkpoints = make(tmp_path)
    checkpoints.save(2, {"w": torch.zeros(3)})
    assert checkpoints.wait() == 2
    checkpoints.close()


def test_a_released_lock_file_names_no_holder(tmp_path, monkeypatch):
    """A run that failed or was refused (and freed the directory) left its PID in the lock
    file, which read as held by that process; the lock itself is an flock, released with the
    process, so such a file never blocked a run, but it misled whoever read it."""
    checkpoints = make(tmp_path / "a")
    checkpoints.save(1, {"w": np.ones(3)}, blocking=True)
    assert (tmp_path / "a" / ".lock").read_text().startswith(f"PID {os.getpid()} on ")
    checkpoints.close()
    assert (tmp_path / "a" / ".lock").read_text() == ""
    # A run that made the directory and failed before its first save takes its marker back.
    failed = make(tmp_path / "b")
    failed.release()
    assert os.listdir(tmp_path / "b") == [".lock"]
    assert (tmp_path / "b" / ".lock").read_text() == ""


def test_a_marker_left_half_written_does_not_block_the_directory(tmp_path):
    """A run killed while it wrote the CHECKPOINTS file left only its temporary name: the
    directory was then refused as someone else's folder."""
    (tmp_path / ".CHECKPOINTS.12345.tmp").write_text("{")
    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": np.ones(3)}, blocking=True)
    assert checkpoints.load().step == 1
    (tmp_path / "step-\u0661").mkdir()   # an Arabic-Indic digit one: not a step directory
    assert checkpoints.steps() == [1]
    (tmp_path / "x").mkdir()   # any other file still makes a folder not ours
    (tmp_path / "x" / ".CHECKPOINTS.tmp").write_text("{")
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        make(tmp_path / "x")


def test_a_renamed_or_hand_made_manifest_is_damaged_not_loaded(tmp_path):
    """A step directory copied under another step's name loaded as that step with the state
    of the one it was copied from (resuming repeated or skipped steps); a manifest of the
    right format and checksum but not of the shape written (edited by hand, another writer)
    failed with a bare KeyError. Both are now damaged checkpoints: passed over, named."""
    from pysparse_hpc.distributed.checkpoint import _files
    checkpoints = save_three(tmp_path)
    shutil.copytree(tmp_path / "step-000000001", tmp_path / "step-000000004")
    with pytest.warns(UserWarning, match=r"step 4 .* manifest.json is of step 1, not of step 4 "
                                         r"as its directory step-000000004 says"):
        assert checkpoints.load().step == 3
    shutil.rmtree(tmp_path / "step-000000004")
    path = tmp_path / "step-000000003" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["has_nodes"]
    manifest["checksum"] = _files.manifest_checksum(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match=r"step 3 .* manifest.json is not one this library "
                                         r"writes: has_nodes is None"):
        assert checkpoints.load().step == 2


def test_a_manifest_of_another_version_is_damaged_not_loaded(tmp_path):
    """Format and version are both checked: a manifest of another version of this format,
    with a checksum that verifies, is passed over, named with its version."""
    from pysparse_hpc.distributed.checkpoint import _files
    checkpoints = save_three(tmp_path)
    path = tmp_path / "step-000000003" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["version"] = _files.VERSION + 1
    manifest["checksum"] = _files.manifest_checksum(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match=rf"step 3 .* manifest.json is of format "
                                         rf"'{_files.FORMAT}' version {_files.VERSION + 1}"):
        assert checkpoints.load().step == 2


def test_a_load_while_another_run_commits_and_prunes_finds_its_newer_checkpoint(tmp_path):
    """Loading takes no lock, so a job may read the checkpoints another one is writing: the
    writer committed the save in flight when the reader listed the directory and pruned the
    one it was reading, and the reader failed with "no usable checkpoint" although a good
    checkpoint was there. It now lists the directory again, and what was pruned under it is
    not reported as damaged."""
    writer = make(tmp_path, keep=1)
    writer.save(1, {"s": np.full(4, 1.0)}, blocking=True)
    writer.save(2, {"s": np.full(4, 2.0)})   # in flight: its files, no manifest yet
    while writer.writing:
        threading.Event().wait(0.001)
    reader = make(tmp_path)
    read = reader._read
    calls = []

    def read_while_the_writer_commits(step, step_dir, node_ids):
        calls.append(step)
        try:
            return read(step, step_dir, node_ids)
        finally:
            if len(calls) == 1:   # step 2, torn: the writer commits it and prunes step 1
                writer.close()

    reader._read = read_while_the_writer_commits
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = reader.load()
    assert calls == [2, 1, 2]
    assert loaded.step == 2 and loaded.skipped == []
    assert_same(loaded.shard, {"s": np.full(4, 2.0)})


def test_a_failed_directory_fsync_is_an_error_not_a_commit(tmp_path, monkeypatch):
    """The fsync of a directory made a renamed file's name durable, but its errors (EIO,
    ENOSPC) were swallowed: a commit whose manifest a crash could still take back was reported
    done. Every directory fsync of a save fails in turn; each is raised, naming the save."""
    import errno
    import stat
    fsync = os.fsync
    for fail_at in range(1, 4):   # the shard's directory entry, the manifest's, the step's
        directory = tmp_path / str(fail_at)
        checkpoints = make(directory)
        count = [0]

        def failing_fsync(fd):
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                count[0] += 1
                if count[0] == fail_at:
                    raise OSError(errno.EIO, "Input/output error")
            return fsync(fd)

        monkeypatch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(OSError, match="Input/output error") as caught:
            checkpoints.save(1, {"w": np.ones(3)}, blocking=True)
        monkeypatch.setattr(os, "fsync", fsync)
        assert any("checkpoint step 1" in note and str(directory) in note
                   for note in caught.value.__notes__), (fail_at, caught.value.__notes__)
        checkpoints.close()
    # A file system that cannot fsync a directory at all (EINVAL) still saves.
    monkeypatch.setattr(os, "fsync", lambda fd: fsync(fd) if not stat.S_ISDIR(
        os.fstat(fd).st_mode) else (_ for _ in ()).throw(OSError(errno.EINVAL, "Invalid")))
    checkpoints = make(tmp_path / "einval")
    checkpoints.save(1, {"w": np.ones(3)}, blocking=True)
    assert checkpoints.load().step == 1
    checkpoints.close()


def test_a_second_run_keeps_the_marker_the_first_took_back(tmp_path):
    """Two jobs opened one new directory; the one that made its CHECKPOINTS file failed before
    saving and took the file back, and the other's checkpoints then lay in a directory refused
    as "not a checkpoint directory" when it resumed. The run that saves writes it again."""
    first = make(tmp_path, fingerprint={"run": 1})
    second = make(tmp_path, fingerprint={"run": 1})
    first.release()
    second.save(1, {"w": np.ones(3)}, blocking=True)
    second.close()
    assert sorted(os.listdir(tmp_path)) == [".lock", "CHECKPOINTS", "step-000000001"]
    resumed = make(tmp_path, fingerprint={"run": 1})
    assert resumed.load().step == 1
    with pytest.raises(ValueError, match=r"fingerprint differs in 'run' \(saved 1, given 2\)"):
        make(tmp_path, fingerprint={"run": 2})
    resumed.close()


def in_forked_child(function, seconds=20):
    """Run ``function()`` in a forked child; its exit status (0: it returned; 1: it raised;
    SIGALRM: it hung for ``seconds``)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            signal.alarm(seconds)
            function()
            status = 0
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_loads_with_its_own_hashing_threads(tmp_path):
    checkpoints = make(tmp_path, threads=4)
    checkpoints.save(1, {"w": torch.arange(5.0)}, blocking=True)
    checkpoints.load()   # the parent's hashing threads exist now
    checkpoints.close()

    def load_in_child():
        child = make(tmp_path, threads=4)
        assert torch.equal(child.load().shard["w"], torch.arange(5.0))
        child.close()

    # The child handed its blocks to the parent's pool, whose threads it does not have, and
    # waited for ever.
    assert in_forked_child(load_in_child) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_is_refused_its_parents_checkpointer(tmp_path, monkeypatch):
    release = threading.Event()
    original = ckpt._files.write_atomic

    def held_write(path, chunks, threads=1):
        assert release.wait(30)
        return original(path, chunks, threads)

    checkpoints = make(tmp_path)
    checkpoints.save(1, {"w": torch.ones(3)}, blocking=True)
    monkeypatch.setattr(ckpt._files, "write_atomic", held_write)
    checkpoints.save(2, {"w": torch.zeros(3)})   # pending while the child runs

    for method in ("wait", "load", "close", "release"):
        def use_in_child():
            with pytest.raises(RuntimeError, match="belongs to process .* forked process"):
                getattr(checkpoints, method)()

        # The child waited for ever for a background thread only the parent has.
        assert in_forked_child(use_in_child) == 0, method
    release.set()
    assert checkpoints.wait() == 2
    checkpoints.close()

    # A child that drops its copy leaves the parent's lock, and the holder's name, alone.
    checkpoints = make(tmp_path)
    checkpoints.save(3, {"w": torch.ones(3)}, blocking=True)
    lock = tmp_path / ".lock"
    held = lock.read_text()
    assert held.startswith(f"PID {os.getpid()} ")

    def forget_in_child():
        nonlocal checkpoints
        checkpoints = None
        gc.collect()

    assert in_forked_child(forget_in_child) == 0
    assert lock.read_text() == held
    with pytest.raises(BlockingIOError, match=f"PID {os.getpid()} "):
        make(tmp_path).save(4, {})
    checkpoints.close()


def test_values_that_would_not_load_as_saved_are_refused(tmp_path):
    class Tagged(np.ndarray):
        pass

    checkpoints = make(tmp_path)
    with pytest.raises(TypeError, match=r"shard\['m'\] is a numpy.ma.MaskedArray"):
        checkpoints.save(1, {"m": np.ma.masked_array([1, 2], mask=[0, 1])})  # lost its mask
    with pytest.raises(TypeError, match=r"nodes\['h'\] is a .*Tagged, a NumPy array subclass"):
        checkpoints.save(1, {}, nodes={"node_ids": np.arange(1), "h": np.zeros((1, 2)).view(
            Tagged)})
    # Container subclasses loaded as the plain container: a namedtuple without its fields
    # (an AttributeError at the first .lr), a defaultdict without its default.
    Settings = collections.namedtuple("Settings", "lr momentum")
    for value, message in (
            (Settings(0.1, 0.9), r"shard\['c'\]\[0\] is a .*Settings, a subclass of tuple, "
                                 r".* load as a plain tuple\); save it as a tuple, or a "
                                 r"namedtuple's \._asdict\(\)"),
            (collections.defaultdict(list), r"shard\['c'\]\[0\] is a "
                                            r"collections\.defaultdict, a subclass of dict"),
            (collections.Counter("ab"), r"collections\.Counter, a subclass of dict")):
        with pytest.raises(TypeError, match=message):
            checkpoints.save(1, {"c": [value]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(TypeError, match=r"shard\[0\] is a torch.strided tensor on cpu \(nested"):
        checkpoints.save(1, [nested])   # torch's internal RuntimeError
    assert checkpoints.steps() == []
    mapped = np.memmap(tmp_path.parent / "mapped.bin", mode="w+", shape=(3,), dtype="<f4")
    mapped[:] = [1, 2, 3]
    checkpoints.save(1, {"m": mapped}, blocking=True)   # a memmap is an array: loaded as one
    loaded = checkpoints.load().shard["m"]
    assert type(loaded) is np.ndarray and loaded.tolist() == [1, 2, 3]
    checkpoints.save(2, {"c": (collections.OrderedDict(a=1), [1], (2,), {"b": 3})},
                     blocking=True)   # the containers it holds, exactly
    loaded = checkpoints.load().shard["c"]
    assert loaded == (collections.OrderedDict(a=1), [1], (2,), {"b": 3})
    assert type(loaded[0]) is collections.OrderedDict
    checkpoints.close()


def test_gathered_per_node_tensors_are_leaves_as_saved(tmp_path):
    checkpoints = make(tmp_path)
    hidden = torch.randn(4, 2, requires_grad=True)
    checkpoints.save(1, {}, nodes={"node_ids": np.arange(4), "h": hidden,
                                   "p": torch.nn.Parameter(torch.arange(4.0)),
                                   "c": torch.arange(4)}, blocking=True)
    nodes = checkpoints.load(node_ids=[3, 1]).nodes
    # The rows of a tensor that requires grad came back as a non-leaf with a grad_fn (which no
    # optimizer takes), a Parameter as a plain tensor.
    assert nodes["h"].is_leaf and nodes["h"].requires_grad and nodes["h"].grad_fn is None
    assert torch.equal(nodes["h"], hidden.detach()[[3, 1]])
    assert type(nodes["p"]) is torch.nn.Parameter and nodes["p"].tolist() == [3.0, 1.0]
    assert not nodes["c"].requires_grad and nodes["c"].tolist() == [3, 1]
    checkpoints.close()


def test_an_asynchronous_save_without_memory_for_its_copy_says_so(tmp_path, monkeypatch):
    """NumPy's "Unable to allocate ... uint8" named neither the save nor the way out."""
    from pysparse_hpc.distributed.checkpoint import checkpointer as module

    class NoMemoryForLargeArrays:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(shape, dtype=float):
            if np.prod(shape) * np.dtype(dtype).itemsize > 1 << 20:
                raise MemoryError("Unable to allocate")
            return np.empty(shape, dtype)

    state = {"weight": torch.zeros(1 << 19)}
    with Checkpointer(tmp_path / "run") as checkpointer:
        monkeypatch.setattr(module, "np", NoMemoryForLargeArrays())
        with pytest.raises(MemoryError, match=r"an asynchronous save copies the state first, "
                                              r".* GiB, .*save\(\.\.\., blocking=True\)"):
            checkpointer.save(1, state)
        checkpointer.save(1, state, blocking=True)    # the way out works
        monkeypatch.undo()
    loaded = Checkpointer(tmp_path / "run").load()
    assert loaded.step == 1 and torch.equal(loaded.shard["weight"], state["weight"])
