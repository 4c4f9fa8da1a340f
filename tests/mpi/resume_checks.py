"""Checkpoint-and-resume checks under ``mpiexec -n P`` (launched by
tests/test_resume_mpi.py); the conventions of checks.py: ``python resume_checks.py NAME
[NAME ...] [--dir DIR]``, rank 0 prints ``PASSED NAME`` after each check that passed on every
rank.
"""
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from checks import ALONE, checks_in, comm, on_root_then_broadcast, rank, run_named

from pysparse_hpc.distributed.training import train

RUNS = {"adam": dict(), "lion-votes": dict(optimizer="lion", compression="votes"),
        "kfac-sgd": dict(preconditioner="kfac", optimizer="sgd", curvature_interval=3)}


def _option(name):
    return sys.argv[sys.argv.index(name) + 1]


def _shared_directory():
    """A new directory every rank writes in (these ranks share one machine's disk)."""
    return comm.bcast(tempfile.mkdtemp(prefix="resume-") if rank == 0 else None)


def check_resume_is_bit_exact():
    """20 epochs in one go against 10, stop, and 10 more resumed from the checkpoint (Adam;
    8 against 4 + 4 for the others): the same losses bit for bit and the same test accuracy,
    for Adam, compressed Lion (momenta per rank) and K-FAC applied by SGD (KAISA's owners,
    SGD's momentum; curvature every 3 epochs, so the checkpoint falls between two curvature
    updates); a finished run resumed trains nothing."""
    for label, options in RUNS.items():
        options = dict(options, dtype="float64", progress=False, comm=comm)
        directory = str(Path(_shared_directory()) / label)
        epochs = 20 if label == "adam" else 8
        whole = train("cora", "gcn", epochs=epochs, **options)
        train("cora", "gcn", epochs=epochs // 2, checkpoint=directory, **options)
        resumed = train("cora", "gcn", epochs=epochs, checkpoint=directory, resume=True,
                        **options)
        assert resumed.resumed_after == epochs // 2, (label, resumed.resumed_after)
        assert resumed.losses == whole.losses, (label, resumed.losses, whole.losses)
        assert resumed.test_accuracy == whole.test_accuracy, label
        finished = train("cora", "gcn", epochs=epochs, checkpoint=directory, resume=True,
                         **options)
        assert finished.resumed_after == epochs and finished.losses == whole.losses, label


def check_resume_with_a_dataset_on_rank_0_only():
    """A `Dataset` passed on rank 0 and None on the others (train reads it on rank 0 only):
    its checkpoints name the dataset alike on every rank, and resuming them continues the run
    bit for bit. The other ranks' fingerprint named the dataset "None", and resuming was refused
    as another run's on them."""
    import pysparse_hpc as sph

    data = sph.datasets.load("cora") if rank == 0 else None
    options = dict(dtype="float64", progress=False, comm=comm)
    directory = str(Path(_shared_directory()) / "dataset")
    whole = train("cora", "gcn", epochs=4, **options)
    train(data, "gcn", epochs=2, checkpoint=directory, **options)
    resumed = train(data, "gcn", epochs=4, checkpoint=directory, resume=True, **options)
    assert resumed.resumed_after == 2 and resumed.losses == whole.losses, resumed


#: Runs resumed on another number of ranks: Adam, and Jorge applied by SGD, whose owner ranks
#: alone keep each parameter's statistics (curvature every 3 epochs, so the checkpoint at 10
#: falls between two updates and the resumed roots need the saved statistics).
OTHER_SIZE_RUNS = {"adam": dict(),
                   "jorge-sgd": dict(preconditioner="jorge", optimizer="sgd",
                                     curvature_interval=3)}


def check_save_for_another_size():
    """Train 10 of 20 epochs of each run of `OTHER_SIZE_RUNS` with checkpoints in ``--dir``."""
    for label, options in OTHER_SIZE_RUNS.items():
        train("cora", "gcn", epochs=10, checkpoint=str(Path(_option("--dir"), label)),
              dtype="float64", progress=False, comm=comm, **options)


def check_resume_at_another_size():
    """Resume ``--dir``'s checkpoints (saved on another number of ranks) to 20 epochs: the
    graph is partitioned for this size and the losses are the uninterrupted one-process run's
    within float64 rounding."""
    for label, options in OTHER_SIZE_RUNS.items():
        options = dict(options, dtype="float64", progress=False)
        resumed = train("cora", "gcn", epochs=20, checkpoint=str(Path(_option("--dir"), label)),
                        resume=True, comm=comm, **options)
        assert resumed.resumed_after == 10, (label, resumed.resumed_after)
        whole = on_root_then_broadcast(
            lambda: train("cora", "gcn", epochs=20, comm=ALONE, **options))
        np.testing.assert_allclose(resumed.losses, whole.losses, rtol=1e-10, err_msg=label)


#: Checkpointers left open to the end of the process, as a script that forgets close() does.
_LEFT_OPEN = []


def check_exit_without_close():
    """Save steps 1 and 2 in ``--dir`` and end the process without close(), while rank 0's
    background thread still writes step 1's manifest (a slow disk): `exit_finished_the_saves`
    then finds step 1 committed. The writer is a daemon thread, which the interpreter stopped
    where it was: step 1, whose files every rank had finished, was lost."""
    import time

    from pysparse_hpc.distributed import Checkpointer
    from pysparse_hpc.distributed.checkpoint import _files

    write = _files.write_atomic

    def slow(path, *args, **kwargs):
        if path.endswith("manifest.json"):
            time.sleep(1)
        return write(path, *args, **kwargs)

    _files.write_atomic = slow
    checkpoints = Checkpointer(_option("--dir"), comm=comm)
    checkpoints.save(1, {"rank": rank, "w": np.full(5, rank)})
    checkpoints.save(2, {"rank": rank, "w": np.full(5, rank + 10)})
    _LEFT_OPEN.append(checkpoints)


def check_exit_finished_the_saves():
    """What `exit_without_close` left in ``--dir``: step 1 committed and whole on every rank;
    step 2 written but not committed (committing is collective, and the ranks were ending);
    no temporary file."""
    from pysparse_hpc.distributed import Checkpointer

    checkpoints = Checkpointer(_option("--dir"), comm=comm)
    assert checkpoints.steps() == [1], checkpoints.steps()
    loaded = checkpoints.load()
    assert loaded.step == 1 and loaded.shard["rank"] == rank, loaded
    assert loaded.shard["w"].tolist() == [rank] * 5
    left = [name for _, _, names in os.walk(_option("--dir")) for name in names
            if name.endswith(".tmp")]
    assert left == [], left
    checkpoints.close()


def check_load_arguments_agree():
    """Node ids wrong on one rank, and steps that differ between ranks, are errors on every
    rank. The rank with wrong ids raised alone while the others went on into the next
    collective (a hang), and ranks given different steps each loaded their own."""
    import pytest

    from pysparse_hpc.distributed import Checkpointer

    checkpoints = Checkpointer(_shared_directory(), comm=comm, keep=None)
    owned = np.arange(rank, 8, comm.size)
    for step in (1, 2):
        checkpoints.save(step, {"rank": rank}, nodes={"node_ids": owned, "h": owned * 10})
    checkpoints.wait()
    with pytest.raises(TypeError, match="1-D array of integer node ids"):
        checkpoints.load(node_ids=np.arange(3) if rank == 0 else [[1]])
    with pytest.raises(ValueError, match=r"different steps on different ranks: \[1, 2"):
        checkpoints.load(step=1 + (rank > 0))
    loaded = checkpoints.load(step=1, node_ids=[7, 0])
    assert loaded.step == 1 and loaded.nodes["h"].tolist() == [70, 0], loaded
    checkpoints.close()


def _step_1_kept_and_the_next_save_works(checkpoints):
    """After a save that failed on some rank: step 1 alone is committed (on every rank's view
    of the directory), and saving step 3 and loading it work on every rank."""
    comm.Barrier()
    assert checkpoints.steps() == [1], checkpoints.steps()
    checkpoints.save(3, {"rank": rank})
    assert checkpoints.wait() == 3
    loaded = checkpoints.load()
    assert loaded.step == 3 and loaded.shard["rank"] == rank, loaded
    checkpoints.close()


def check_staging_failure_on_one_rank():
    """No memory for the in-memory copy on one rank: every rank raises it, the previous save
    is committed all the same, and the next save and `wait` work. The failing rank raised alone
    while the others went on with the save, one save ahead of it in every later collective."""
    import pytest

    from pysparse_hpc.distributed import Checkpointer
    from pysparse_hpc.distributed.checkpoint import _format

    checkpoints = Checkpointer(_shared_directory(), comm=comm, keep=None)
    checkpoints.save(1, {"rank": rank})
    stage = _format.Encoder.stage
    if rank == comm.size - 1:
        def no_memory(self, buffer):
            raise MemoryError("no room for the copy")
        _format.Encoder.stage = no_memory
    try:
        with pytest.raises(MemoryError, match="no room for the copy"):
            checkpoints.save(2, {"rank": rank})
    finally:
        _format.Encoder.stage = stage
    assert checkpoints.wait() is None
    _step_1_kept_and_the_next_save_works(checkpoints)  # rank 0 committed step 1 before raising


def check_interrupted_save_on_one_rank():
    """Ctrl-C on one rank as its save starts the background writer: that rank drops the save
    while the others have it pending. Every rank then raises at the next `wait`, with the
    interrupted rank's notes; the save before it stays, and the next save works. The dropped
    save had been committed without that rank's files, or the ranks' collectives paired
    with different saves and the job hung."""
    import pytest

    from pysparse_hpc.distributed import Checkpointer

    checkpoints = Checkpointer(_shared_directory(), comm=comm, keep=1)
    checkpoints.save(1, {"rank": rank})
    checkpoints.wait()
    last = comm.size - 1
    if rank == last:
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt
        checkpoints._background = interrupted
        with pytest.raises(KeyboardInterrupt):
            checkpoints.save(2, {"rank": rank})
        del checkpoints._background
    else:
        checkpoints.save(2, {"rank": rank})
    with pytest.raises(RuntimeError, match="step 2 was not saved") as caught:
        checkpoints.wait()
    assert f"while saving checkpoint step 2 to {checkpoints.directory} on rank {last}" in \
        caught.value.__notes__, caught.value.__notes__
    _step_1_kept_and_the_next_save_works(checkpoints)


if __name__ == "__main__":
    run_named(checks_in(globals()), sys.argv[1:])
