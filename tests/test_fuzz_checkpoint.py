"""Damaged checkpoints, found by fuzzing the format: each case loads exactly the last good
state or raises a clear error, never different data, a crash or a hang.

The fuzzing flipped one bit at every byte offset of every file of the newest checkpoint and
of its manifest, truncated them at every length, appended bytes, swapped files between steps
and runs, edited every manifest field (with and without its checksum recomputed), replaced
files by directories, links, FIFOs and devices, named step directories every other way, denied
permissions and killed saving processes at every file operation. The cases here are those
that went wrong, and a representative sample of those that did not.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pysparse_hpc.distributed.checkpoint import _files  # noqa: E402
from pysparse_hpc.distributed.checkpoint import _format as ckpt_format  # noqa: E402

from .conftest import run_isolated  # noqa: E402
from .test_checkpoint import assert_same, make  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
FINGERPRINT = {"dataset": "cora", "model": "gcn"}
STEP_3 = "step-000000003"


def state(step):
    """``(shard, shared, nodes)`` of ``step``: every kind of leaf, different at every step."""
    generator = torch.Generator().manual_seed(step)
    shard = {
        "step": step,
        "nested": {"list": [1, 2.5, "s", None, True, (3, "t", None)], "tuple": (step, [step])},
        "tensors": [torch.randn(3, 4, generator=generator, dtype=torch.float64),
                    torch.randn(2, 3, generator=generator).to(torch.bfloat16),
                    torch.randn(4, generator=generator).half(),
                    torch.tensor([True, False, step % 2 == 0]),
                    torch.randn(2, generator=generator, dtype=torch.complex64),
                    torch.zeros(0, 5), torch.tensor(3.25 + step),
                    torch.randn(4, 6, generator=generator)[:, ::2],
                    torch.nn.Parameter(torch.randn(2, 2, generator=generator))],
        "arrays": (np.arange(10)[::3] + step, np.array(["ab", "c"]), np.zeros((2, 0)),
                   np.array(step, dtype=np.uint16), np.float32(1.5 + step)),
        "plain": {"lr": 0.1 * step, "name": "gcn \u00e9", "bytes": b"\x00\xff", 3: "int key",
                  (1, "a"): "tuple key"},
        "ordered": OrderedDict(b=step, a=2),
    }
    shared = {"model": {"w": torch.randn(5, 3, generator=generator)}, "hidden": step}
    nodes = {"node_ids": np.arange(6) * 3 + step, "h": torch.randn(6, 2, generator=generator)}
    return shard, shared, nodes


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A directory of steps 1, 2 and 3, to copy and damage."""
    directory = tmp_path_factory.mktemp("pristine") / "run"
    with make(directory, fingerprint=FINGERPRINT) as checkpoints:
        for step in (1, 2, 3):
            shard, shared, nodes = state(step)
            checkpoints.save(step, shard, shared=shared, nodes=nodes)
    return directory


@pytest.fixture
def run(pristine, tmp_path):
    directory = tmp_path / "run"
    shutil.copytree(pristine, directory)
    return directory


def load_exactly(directory, step, skipped=None):
    """Load ``directory``; assert it is ``step`` bit for bit and returns the checkpoint (the
    warnings of the steps passed over are expected, ``skipped`` naming what they say)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = make(directory, fingerprint=FINGERPRINT).load()
    assert loaded.step == step, (loaded.step, loaded.skipped)
    shard, shared, nodes = state(step)
    assert_same(shard, loaded.shard)
    assert_same(shared, loaded.shared)
    assert_same({**nodes, "node_ids": nodes["node_ids"].astype(np.int64)}, loaded.nodes)
    if skipped is not None:
        assert [s for s, _ in loaded.skipped] == [3], loaded.skipped
        assert skipped in loaded.skipped[0][1], loaded.skipped
        assert len(caught) == 1 and skipped in str(caught[0].message)
    return loaded


def edit_manifest(directory, change, step=3):
    """Apply ``change`` to the manifest of ``step`` and recompute its checksum (as a hand edit
    or another writer would): only its shape and consistency can tell it apart."""
    path = directory / f"step-{step:09d}" / _files.MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    manifest["checksum"] = _files.manifest_checksum(manifest)
    path.write_text(json.dumps(manifest))


def harmless(data, original):
    try:
        return json.loads(data) == json.loads(original)
    except ValueError:
        return False


@pytest.mark.parametrize("name", ["rank-00000.ckpt", "nodes-00000.ckpt", "shared.ckpt",
                                  "manifest.json"])
def test_flipped_bits_truncations_and_appended_bytes_fall_back_exactly(run, name):
    """A sample of the offsets the exhaustive fuzzing went through (every one fell back): the
    magic, the header's length, the header, the payload, the last byte."""
    path = run / STEP_3 / name
    original = path.read_bytes()
    size = len(original)
    damaged = []
    for offset in sorted({0, 7, 8, 15, 16, 40, size // 3, size // 2, size - 2, size - 1}):
        for bit in (0, 5, 7):
            data = bytearray(original)
            data[offset] ^= 1 << bit
            damaged.append(bytes(data))
    damaged += [original[:length] for length in (0, 1, 16, size // 2, size - 1)]
    damaged += [original + b"\x00", original + b"{}"]
    for data in damaged:
        path.write_bytes(data)
        if name == "manifest.json" and harmless(data, original):
            load_exactly(run, 3)  # whitespace, as JSON sees it: the same manifest
        else:
            load_exactly(run, 2, skipped="")
    path.write_bytes(original)
    load_exactly(run, 3)


@pytest.mark.parametrize("name", ["step-3", "step-0000000003", "step-00000003"])
def test_a_step_directory_spelled_otherwise_does_not_hide_the_checkpoint(run, name):
    """``step-3`` and ``step-000000003`` were the same step: a stray copy of another step under
    the short name (copied by hand) stood for step 3 in place of its checkpoint, found damaged
    (of step 1), and the load fell back to step 2. Only the name the library gives a step is
    one now."""
    shutil.copytree(run / "step-000000001", run / name)
    assert make(run).steps() == [1, 2, 3]
    assert load_exactly(run, 3).skipped == []


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(has_shared=False), "not the nodes-00000.ckpt, rank-00000.ckpt its"),
    (lambda m: m.update(has_nodes=[False]), "not the rank-00000.ckpt, shared.ckpt its"),
    (lambda m: m["files"].pop("shared.ckpt"), "records the files nodes-00000.ckpt, "
                                              "rank-00000.ckpt, not"),
    (lambda m: m.update(ranks=2, has_nodes=[True, False]), "not the nodes-00000.ckpt, "
                                                           "rank-00000.ckpt, rank-00001.ckpt"),
])
def test_a_manifest_whose_flags_disagree_with_its_files_is_damaged(run, change, message):
    """A manifest that says no shared (or per-node) state was saved while it records its file
    loaded that state as None, without a word; one of two ranks with the file of one loaded
    without this rank's shard. Its checksum right, it is now damaged: its files are not those
    its flags say."""
    edit_manifest(run, change)
    load_exactly(run, 2, skipped=message)


@pytest.mark.parametrize("fingerprint", ["cora", ["dataset"], 3])
def test_a_fingerprint_that_is_no_dict_is_named_not_a_bare_error(run, fingerprint):
    """A manifest or ``CHECKPOINTS`` file whose fingerprint is no dict (edited by hand) failed
    with a bare AttributeError or TypeError from comparing it key by key; under MPI on rank 0
    alone (the marker), the other ranks waiting for ever."""
    edit_manifest(run, lambda m: m.update(fingerprint=fingerprint))
    load_exactly(run, 2, skipped=f"its fingerprint is {fingerprint!r}, not a dict or null")
    edit_manifest(run, lambda m: m.pop("fingerprint"))
    load_exactly(run, 2, skipped="it has no fingerprint")
    marker = json.loads((run / "CHECKPOINTS").read_text())
    marker["fingerprint"] = fingerprint
    del marker["checksum"]   # as a marker of before the checksum, read as it is
    (run / "CHECKPOINTS").write_text(json.dumps(marker))
    with pytest.raises(ValueError, match=f"CHECKPOINTS holds the fingerprint "
                                         f"{fingerprint!r}".replace("[", r"\[")):
        make(run, fingerprint=FINGERPRINT)


def test_json_nested_too_deep_is_damage_not_a_recursion_error(run):
    """A manifest (or marker) of garbage nested deeper than the JSON parser goes raised a
    RecursionError out of load (or of the constructor) instead of being passed over."""
    marker = (run / "CHECKPOINTS").read_text()
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        (run / STEP_3 / "manifest.json").write_text(text)
        load_exactly(run, 2, skipped="manifest.json cannot be read (")
        (run / "CHECKPOINTS").write_text(text)
        with pytest.warns(UserWarning, match="CHECKPOINTS cannot be read .* written again"):
            make(run).close()
        assert (run / "CHECKPOINTS").read_text() == marker


def test_a_damaged_marker_is_written_again_from_a_manifest_that_verifies(run):
    """A bit flipped in the ``CHECKPOINTS`` file refused the whole directory, checkpoints and
    all (or, flipped in the fingerprint, named another run). Its checksum now tells damage,
    and the marker is written again from the newest checkpoint that verifies when that
    checkpoint is of this run."""
    marker = (run / "CHECKPOINTS").read_bytes()
    flips = [marker.index(b"cora") + 1, marker.index(b"format") + 2, len(marker) // 2]
    for offset in flips:
        damaged = bytearray(marker)
        damaged[offset] ^= 0x04
        (run / "CHECKPOINTS").write_bytes(bytes(damaged))
        with pytest.warns(UserWarning, match="written again from the manifest of step 3"):
            make(run, fingerprint=FINGERPRINT).close()
        assert (run / "CHECKPOINTS").read_bytes() == marker
        (run / "CHECKPOINTS").write_bytes(bytes(damaged))
        with pytest.warns(UserWarning, match="written again"):   # no fingerprint given
            make(run).close()
        assert (run / "CHECKPOINTS").read_bytes() == marker   # the checkpoints' own kept
    load_exactly(run, 3)
    (run / "CHECKPOINTS").write_text("{")
    with pytest.raises(ValueError, match="CHECKPOINTS cannot be read .*; .* holds checkpoints "
                                         "of another run .*'model' \\(saved 'gcn', given 'gat'"):
        make(run, fingerprint={"dataset": "cora", "model": "gat"})
    for step in (3, 2, 1):   # no checkpoint verifies: refused, as before
        (run / f"step-{step:09d}" / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match="no checkpoint in .* verifies"):
        make(run, fingerprint=FINGERPRINT)


@pytest.mark.skipif(sys.platform != "linux", reason="needs mkfifo, /dev/zero and /proc")
def test_a_manifest_that_is_a_fifo_or_a_device_is_damaged_not_read_for_ever(tmp_path):
    """A manifest that is a FIFO waited for a writer for ever, and one linked to /dev/zero was
    read until memory ran out: in a child (bounded in time and memory), without torch."""
    run_isolated(f"""
        import os, resource, signal, warnings
        import numpy as np
        from pysparse_hpc.distributed import Checkpointer, Communicator

        signal.alarm(30)  # a hang ends the child, and fails the test
        size = next(int(line.split()[1]) for line in open("/proc/self/status")
                    if line.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), size + (1 << 30)))
        directory = {str(tmp_path)!r}
        checkpoints = Checkpointer(directory, comm=Communicator(None), threads=1)
        for step in (1, 2, 3):
            checkpoints.save(step, {{"w": np.arange(5) * step}}, shared={{"s": step}})
        checkpoints.close()
        manifest = os.path.join(directory, "step-000000003", "manifest.json")
        for kind in ("device", "fifo", "directory"):
            os.unlink(manifest)
            if kind == "device":
                os.symlink("/dev/zero", manifest)
            elif kind == "fifo":
                os.mkfifo(manifest)
            else:
                os.mkdir(manifest)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loaded = Checkpointer(directory, comm=Communicator(None), threads=1).load()
            assert loaded.step == 2 and loaded.shared == {{"s": 2}}, loaded
            assert (loaded.shard["w"] == np.arange(5) * 2).all()
            message = str(caught[0].message)
            expected = "is a symbolic link" if kind == "device" else "is not a regular file"
            assert f"manifest.json {{expected}}" in message, message
            print(kind, "ok")
    """)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_save_killed_at_any_file_operation_leaves_a_good_checkpoint(tmp_path):
    """A process killed before or after the n-th file operation of its saves (fsync, rename,
    unlink, rmtree, ...; the fuzzing went through every n) leaves a directory that loads one
    of the states saved exactly, or has none, and that a resumed run saves on in."""
    run_isolated(f"""
        import os, shutil, signal, warnings
        import numpy as np
        from pysparse_hpc.distributed import Checkpointer, Communicator

        root = {str(tmp_path / "run")!r}
        OPS = [(os, "fsync"), (os, "replace"), (os, "unlink"), (shutil, "rmtree"),
               (os, "makedirs"), (os, "rename"), (os, "remove")]

        def state(step):
            return ({{"step": step, "w": np.arange(50.0) * step}},
                    {{"model": np.full(7, step, np.int32)}},
                    {{"node_ids": np.arange(4) + step, "h": np.ones((4, 2)) * step}})

        def saver(kill_at, after):
            count = [0]
            for module, name in OPS:
                def op(*args, original=getattr(module, name), **kwargs):
                    count[0] += 1
                    number = count[0]  # rmtree counts the unlinks it makes after itself
                    if number == kill_at and not after:
                        os.kill(os.getpid(), signal.SIGKILL)
                    try:
                        return original(*args, **kwargs)
                    finally:
                        if number == kill_at and after:
                            os.kill(os.getpid(), signal.SIGKILL)
                setattr(module, name, op)
            checkpoints = Checkpointer(root, comm=Communicator(None), keep=2, threads=1)
            for step in range(5):
                shard, shared, nodes = state(step)
                checkpoints.save(step, shard, shared=shared, nodes=nodes)
            checkpoints.close()

        def loaded_step(keep=2):
            checkpoints = Checkpointer(root, comm=Communicator(None), keep=keep, threads=1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    loaded = checkpoints.load()
                except FileNotFoundError:
                    return checkpoints, -1
            shard, shared, nodes = state(loaded.step)
            assert loaded.shard["step"] == loaded.step
            assert loaded.shard["w"].tobytes() == shard["w"].tobytes()
            assert loaded.shared["model"].tobytes() == shared["model"].tobytes()
            assert loaded.nodes["h"].tobytes() == nodes["h"].tobytes()
            return checkpoints, loaded.step

        steps = set()
        for kill_at in (1, 4, 9, 16, 25, 36, 49, 64):
            for after in (False, True):
                shutil.rmtree(root, ignore_errors=True)
                pid = os.fork()
                if pid == 0:
                    try:
                        saver(kill_at, after)
                    finally:
                        os._exit(0)
                assert os.WIFSIGNALED(os.waitpid(pid, 0)[1]), (kill_at, after)  # killed
                checkpoints, step = loaded_step()
                steps.add(step)
                # The run resumes from it and saves on.
                shard, shared, nodes = state(step + 1)
                checkpoints.save(step + 1, shard, shared=shared, nodes=nodes)
                checkpoints.close()
                assert loaded_step()[1] == step + 1, (kill_at, after, step)
        assert -1 in steps and max(steps) >= 1, steps  # killed before the first save and later
        print("ok")
    """)


def mpi_available():
    import importlib.util

    from pysparse_hpc.distributed._comm import mpiexec_path
    return importlib.util.find_spec("mpi4py") is not None and mpiexec_path() is not None


@pytest.mark.mpi
@pytest.mark.skipif(not mpi_available(), reason="needs mpi4py and mpiexec")
def test_a_directory_that_cannot_be_read_is_an_error_on_every_rank(tmp_path):
    """Rank 0 reads the directory for all: a marker it could not make sense of (a fingerprint
    that is no dict) raised an AttributeError there, and a directory gone (replaced by a file)
    before a load a NotADirectoryError there, while the other ranks waited for rank 0's answer
    for ever. Every rank raises it now."""
    from pysparse_hpc.distributed._comm import mpiexec_path
    code = f"""if True:
        import os
        from pysparse_hpc.distributed import Checkpointer, init
        comm = init()
        marker, gone = {str(tmp_path / "marker")!r}, {str(tmp_path / "gone")!r}
        if comm.rank == 0:
            os.makedirs(marker)
            with open(os.path.join(marker, "CHECKPOINTS"), "w") as handle:
                handle.write('{{"format": "pysparse_hpc checkpoint", "fingerprint": "x"}}')
        comm.bcast(None)
        try:
            Checkpointer(marker, comm=comm, fingerprint={{"model": "gcn"}})
        except ValueError as exc:
            assert "holds the fingerprint 'x', not a dict" in str(exc), exc
        checkpoints = Checkpointer(gone, comm=comm)
        checkpoints.save(1, {{"rank": comm.rank}}, blocking=True)
        comm.bcast(None)
        if comm.rank == 0:
            os.rename(gone, gone + ".moved")
            open(gone, "w").close()
        comm.bcast(None)
        try:
            checkpoints.load()
        except NotADirectoryError:
            open(os.path.join({str(tmp_path)!r}, f"raised-{{comm.rank}}"), "w").close()
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYSPARSE_HPC_NUM_THREADS="1")
    try:
        done = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-c", code],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a rank waited for ever:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "raised-0").exists() and (tmp_path / "raised-1").exists()


def test_a_lock_directory_or_stray_names_do_not_stop_a_load(run):
    """Also found handled: names that are no step (``step-abc``, ``step-4.damaged``), an empty
    step directory newer than the newest checkpoint, a step directory that is a link to
    another step, a ``.lock`` that is a directory, a file that is a dangling link or a
    directory."""
    for name in ("step-", "step-abc", "step-000000004.damaged", "step-000000004 ",
                 "Step-000000005"):
        shutil.copytree(run / "step-000000001", run / name)
    (run / "step-000000009").mkdir()
    os.symlink("step-000000001", run / "step-000000008")
    (run / ".lock").unlink()
    (run / ".lock").mkdir()
    load_exactly(run, 3)
    (run / STEP_3 / "rank-00000.ckpt").unlink()
    os.symlink("/nonexistent", run / STEP_3 / "rank-00000.ckpt")
    (run / STEP_3 / "shared.ckpt").unlink()
    (run / STEP_3 / "shared.ckpt").mkdir()
    loaded = load_exactly(run, 2)
    assert [s for s, _ in loaded.skipped] == [9, 8, 3]
    assert loaded.skipped[2][1] == "shared.ckpt is not a regular file"  # the first file read


def test_files_swapped_between_steps_or_from_another_run_are_refused(run, tmp_path):
    """Another step's file (or manifest) fails its checksum (or its step), and another run's
    step directory its fingerprint, with the keys that differ."""
    shutil.copy(run / "step-000000002" / "rank-00000.ckpt", run / STEP_3 / "rank-00000.ckpt")
    load_exactly(run, 2, skipped="rank-00000.ckpt ")
    shutil.copy(run / "step-000000002" / "manifest.json", run / STEP_3 / "manifest.json")
    load_exactly(run, 2, skipped="manifest.json is of step 2, not of step 3")
    other = tmp_path / "other"
    with make(other, fingerprint={**FINGERPRINT, "model": "gat"}) as checkpoints:
        checkpoints.save(4, {"w": torch.ones(2)})
    shutil.copytree(other / "step-000000004", run / "step-000000004")
    with pytest.raises(ValueError, match=r"holds checkpoints of another run \(step 4\): the "
                                         r"fingerprint differs in 'model' \(saved 'gat', given "
                                         r"'gcn'\)"):
        make(run, fingerprint=FINGERPRINT).load()


def array_nodes(tree):
    """The header nodes of ``tree``'s arrays, tensors and bytes, in payload order."""
    if isinstance(tree, list):
        return [leaf for item in tree for leaf in array_nodes(item)]
    if not isinstance(tree, dict):
        return []
    if "at" in tree:
        return [tree]
    return [leaf for key in ("k", "v", "meta") if key in tree for leaf in array_nodes(tree[key])]


def rewrite_state(directory, name, change, step=3, extra=b""):
    """Give state file ``name`` the header ``change`` makes (and ``extra`` bytes after its
    payload), its hashes recomputed in the manifest: a file that verifies, made by another
    tool or an adversary, which only its own consistency can tell apart."""
    path = directory / f"step-{step:09d}" / name
    data = path.read_bytes()
    length = int.from_bytes(data[8:16], "little")
    header = json.loads(data[16:16 + length])
    payload = data[-(-(16 + length) // ckpt_format.ALIGN) * ckpt_format.ALIGN:]
    change(header["tree"])
    data = ckpt_format.prefix(header["tree"], header["payload"]) + payload + extra
    path.write_bytes(data)
    blocks = [[len(data[i:i + _files.BLOCK]), hashlib.sha256(data[i:i + _files.BLOCK]).hexdigest()]
              for i in range(0, len(data), _files.BLOCK)]
    edit_manifest(directory, lambda manifest: manifest["files"].__setitem__(
        name, {"bytes": len(data), "sha256": blocks}), step)


def overlapping(tree):
    first, second = array_nodes(tree)[:2]
    second["at"] = first["at"]


@pytest.mark.parametrize("name, change, message", [
    ("rank-00000.ckpt", overlapping, "overlap another's"),
    ("rank-00000.ckpt", lambda tree: array_nodes(tree)[0].update(at=1), "not an aligned range"),
    ("rank-00000.ckpt", lambda tree: array_nodes(tree)[0].update(at=True), "not an aligned"),
    ("rank-00000.ckpt", lambda tree: array_nodes(tree)[0].update(shape=[-1]), "list of sizes"),
    ("rank-00000.ckpt", lambda tree: array_nodes(tree)[0].update(shape=[5, 3]), "does not fill"),
    # a shape smaller than its bytes too: NumPy's view of it raised its own error, no Damaged
    ("rank-00000.ckpt", lambda tree: array_nodes(tree)[0].update(shape=[1]), "does not fill"),
    ("rank-00000.ckpt", lambda tree: array_nodes(tree)[0].update(dtype="float32; import os"),
     "is no torch dtype's name"),
    ("rank-00000.ckpt", lambda tree: array_nodes(tree)[0].update(dtype="_dynamo"),
     "is no torch dtype's name"),
    ("rank-00000.ckpt", lambda tree: tree["v"].pop(), "keys and values do not pair up"),
    ("rank-00000.ckpt", lambda tree: tree["k"].__setitem__(1, tree["k"][0]), "twice"),
    ("nodes-00000.ckpt", lambda tree: tree["k"].__setitem__(0, "ids"),
     "does not hold per-node state"),
    ("shared.ckpt", lambda tree: None, "bytes of payload where its header says"),
])
def test_a_state_file_that_verifies_but_was_not_written_so_is_damaged(
        run, name, change, message):
    """Files whose checksums were recomputed (another tool, an adversary) are checked for what
    the writer never makes. Overlapping ranges loaded as tensors sharing memory (one payload
    read as many copies: a 1 MB file gave gigabytes), a shape of -1 was inferred, a dict
    dropped its unpaired values, a name such as "_dynamo" imported torch's submodule, per-node
    files failed later with a bare IndexError."""
    rewrite_state(run, name, change, extra=b"trailing" if name == "shared.ckpt" else b"")
    load_exactly(run, 2, skipped=message)


@pytest.mark.parametrize("kind", ["outside", "within"])
def test_a_state_file_that_is_a_link_is_damaged_not_followed(run, tmp_path, kind):
    """A state file linked elsewhere was read through the link: a valid file from outside
    loaded as this step, and the size of any file (/etc/shadow) showed in the warning."""
    target = tmp_path / "elsewhere.ckpt" if kind == "outside" else run / STEP_3 / "copy.ckpt"
    shard = run / STEP_3 / "rank-00000.ckpt"
    shutil.copy(shard, target)
    shard.unlink()
    os.symlink(target, shard)
    load_exactly(run, 2, skipped="rank-00000.ckpt is a symbolic link")


def test_links_planted_in_the_directory_are_not_written_through(run, tmp_path):
    """A link planted at the name of the temporary file a write uses, or at the lock file's:
    the marker's repair wrote the checkpoint's JSON into the link's target, and the lock wrote
    and then emptied it (any file of the user running the job)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("important")
    (run / "CHECKPOINTS").write_text("garbage")
    os.symlink(victim, run / f".CHECKPOINTS.{os.getpid()}.tmp")
    with pytest.warns(UserWarning, match="written again from the manifest"):
        checkpoints = make(run, fingerprint=FINGERPRINT)
    assert victim.read_text() == "important"
    assert not (run / "CHECKPOINTS").is_symlink() and not list(run.glob(".CHECKPOINTS.*"))
    checkpoints.close()
    (run / ".lock").unlink()
    os.symlink(victim, run / ".lock")
    with pytest.raises(OSError, match="is a symbolic link"):
        make(run, fingerprint=FINGERPRINT).save(4, {"w": 1})
    assert victim.read_text() == "important"
