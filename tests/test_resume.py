"""Checkpointed training in one process: resuming is bit for bit, and a directory, a
checkpoint or a command that does not fit the run is refused with a clear error (the mpiexec
runs, a killed rank included, are in test_resume_mpi.py)."""
import warnings

import pytest
import torch

from pysparse_hpc.__main__ import main
from pysparse_hpc.distributed import Checkpointer
from pysparse_hpc.distributed.training import train

OPTIONS = dict(progress=False, dtype="float64")


def test_resume_continues_bit_for_bit_and_a_finished_run_trains_nothing(tmp_path):
    whole = train("cora", "gcn", epochs=6, **OPTIONS)
    train("cora", "gcn", epochs=3, checkpoint=tmp_path, checkpoint_every=2, **OPTIONS)
    assert Checkpointer(tmp_path).steps() == [2, 3]  # every 2 epochs, and the last
    resumed = train("cora", "gcn", epochs=6, checkpoint=tmp_path, resume=True, **OPTIONS)
    assert resumed.resumed_after == 3 and resumed.losses == whole.losses
    assert resumed.test_accuracy == whole.test_accuracy
    finished = train("cora", "gcn", epochs=6, checkpoint=tmp_path, resume=True, **OPTIONS)
    assert finished.resumed_after == 6 and finished.losses == whole.losses
    # Fewer epochs than the checkpoint holds: nothing is trained, and the result is of the
    # epochs the model was trained, not of the number asked for.
    with pytest.warns(UserWarning, match="holds 6 epochs, more than the 4 asked for: nothing "
                                         "is trained, and the result is that of its 6"):
        fewer = train("cora", "gcn", epochs=4, checkpoint=tmp_path, resume=True, **OPTIONS)
    assert fewer.epochs == 6 and fewer.losses == whole.losses
    assert fewer.test_accuracy == whole.test_accuracy


def test_a_resume_that_asks_for_another_partition_says_it_keeps_the_saved_one(tmp_path):
    """The saved partition is kept for a bit-exact resume; another one asked for was dropped
    without a word."""
    whole = train("cora", "gcn", epochs=3, partition="contiguous", **OPTIONS)
    train("cora", "gcn", epochs=2, partition="contiguous", checkpoint=tmp_path, **OPTIONS)
    with pytest.warns(UserWarning, match="resuming on the contiguous partition the checkpoint "
                                         "was saved with; partition='random' is not used"):
        resumed = train("cora", "gcn", epochs=3, partition="random", checkpoint=tmp_path,
                        resume=True, **OPTIONS)
    assert resumed.losses == whole.losses
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same partition: nothing to say
        train("cora", "gcn", epochs=3, partition="contiguous", checkpoint=tmp_path,
              resume=True, **OPTIONS)


def test_a_preconditioned_run_resumes_bit_for_bit_from_state_written_once(tmp_path):
    options = dict(OPTIONS, optimizer="sgd", preconditioner="kfac", curvature_interval=3)
    whole = train("cora", "gcn", epochs=5, **options)
    train("cora", "gcn", epochs=2, checkpoint=tmp_path, **options)
    # One process: the shared part holds the optimizer's and K-FAC's state, its shard nothing.
    step = tmp_path / "step-000000002"
    assert (step / "rank-00000.ckpt").stat().st_size < 4096
    assert (step / "shared.ckpt").stat().st_size > 1433 ** 2 * 8   # the input factor
    resumed = train("cora", "gcn", epochs=5, checkpoint=tmp_path, resume=True, **options)
    assert resumed.resumed_after == 2 and resumed.losses == whole.losses


def test_resume_before_the_first_checkpoint_was_committed_starts_afresh(tmp_path):
    # A job killed while writing its first checkpoint leaves a step without a manifest.
    first = train("cora", "gcn", epochs=2, checkpoint=tmp_path, **OPTIONS)
    (tmp_path / "step-000000002" / "manifest.json").unlink()
    again = train("cora", "gcn", epochs=2, checkpoint=tmp_path, resume=True, **OPTIONS)
    assert again.resumed_after is None and again.losses == first.losses
    assert Checkpointer(tmp_path).steps() == [2]


def test_naming_a_default_resumes_the_same_run(tmp_path):
    options = dict(epochs=2, checkpoint=tmp_path, **OPTIONS)
    train("cora", "gcn", optimizer="sgd", preconditioner="kfac", **options)
    resumed = train("cora", "gcn", optimizer="sgd", preconditioner="kfac", damping=0.03,
                    curvature_interval=10, checkpoint_every=10, resume=True, **options)
    assert resumed.resumed_after == 2
    train("cora", "gcn", optimizer="lion", compression="votes", checkpoint_every=1,
          **dict(options, checkpoint=tmp_path / "lion", epochs=1))
    resumed = train("cora", "gcn", optimizer="lion", compression="votes",
                    momentum_sync="growing", resume=True,
                    **dict(options, checkpoint=tmp_path / "lion"))
    assert resumed.resumed_after == 1
    # another curvature interval updates the curvature on other epochs: another run
    with pytest.raises(ValueError, match="'curvature_interval'"):
        train("cora", "gcn", optimizer="sgd", preconditioner="kfac", curvature_interval=3,
              resume=True, **options)
    # so does a bound on K-FAC's steps
    with pytest.raises(ValueError, match="'kl_clip'"):
        train("cora", "gcn", optimizer="sgd", preconditioner="kfac", kl_clip=1e-3,
              resume=True, **options)
    with pytest.raises(ValueError, match="kl_clip applies to preconditioner='kfac'"):
        train("cora", "gcn", preconditioner="shampoo", kl_clip=1e-3, **options)
    with pytest.raises(ValueError, match="kl_clip must be a finite number > 0, got 0"):
        train("cora", "gcn", preconditioner="kfac", kl_clip=0.0, **options)


def test_resume_skips_a_corrupt_newest_checkpoint(tmp_path):
    whole = train("cora", "gcn", epochs=6, **OPTIONS)
    train("cora", "gcn", epochs=4, checkpoint=tmp_path, checkpoint_every=2, **OPTIONS)
    shard = tmp_path / "step-000000004" / "shared.ckpt"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="step 4 .* damaged: shared.ckpt .* loading step 2"):
        resumed = train("cora", "gcn", epochs=6, checkpoint=tmp_path, resume=True, **OPTIONS)
    assert resumed.resumed_after == 2 and resumed.losses == whole.losses


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path):
    result = train("cora", "gcn", epochs=2, checkpoint=tmp_path / "new", resume=True,
                   **OPTIONS)
    assert result.resumed_after is None and len(result.losses) == 2


def test_a_run_that_does_not_match_is_refused(tmp_path):
    train("cora", "gcn", epochs=2, checkpoint=tmp_path, **OPTIONS)
    with pytest.raises(ValueError, match="holds checkpoints .* resume"):
        train("cora", "gcn", epochs=4, checkpoint=tmp_path, **OPTIONS)
    with pytest.raises(ValueError, match="'seed'"):
        train("cora", "gcn", epochs=4, checkpoint=tmp_path, resume=True, seed=1, **OPTIONS)
    with pytest.raises(ValueError, match="'model'"):
        train("cora", "gat", epochs=4, checkpoint=tmp_path, resume=True, **OPTIONS)
    with pytest.raises(ValueError, match="needs a checkpoint directory"):
        train("cora", "gcn", epochs=4, resume=True, **OPTIONS)


def test_fit_refuses_a_checkpoint_of_another_model(tmp_path):
    import pysparse_hpc as sph
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit, node_tensors
    cora = sph.datasets.load("cora")
    x, y, *masks = node_tensors(cora)
    with Checkpointer(tmp_path) as checkpoints:
        fit(models.GCN(x.shape[1], 16, cora.num_classes), x, cora.adj, y, masks, epochs=1,
            progress=False, checkpointer=checkpoints)
        saved = checkpoints.load()
    with pytest.raises(ValueError, match="holds another model"):
        fit(models.GCN(x.shape[1], 32, cora.num_classes), x, cora.adj, y, masks, epochs=2,
            progress=False, resume_from=saved)
    with Checkpointer(tmp_path / "other") as checkpoints:
        checkpoints.save(1, {"weights": torch.zeros(3)}, blocking=True)
        foreign = checkpoints.load()
    with pytest.raises(ValueError, match="is not one of fit's"):
        fit(models.GCN(x.shape[1], 16, cora.num_classes), x, cora.adj, y, masks, epochs=2,
            progress=False, resume_from=foreign)


def test_fit_keeps_checkpoint_extras_beside_its_own_state_and_refuses_its_keys(tmp_path):
    """Extras named like fit's own entries were silently replaced by them (``model`` by the
    model's state): they are refused, before anything trains; others are saved as given."""
    import pysparse_hpc as sph
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit, node_tensors
    cora = sph.datasets.load("cora")
    x, y, *masks = node_tensors(cora)

    def run(extras, directory):
        with Checkpointer(directory) as checkpoints:
            fit(models.GCN(x.shape[1], 16, cora.num_classes), x, cora.adj, y, masks, epochs=1,
                progress=False, checkpointer=checkpoints, checkpoint_extras=extras)
            return checkpoints.load()
    saved = run({"note": "first run", "lr_grid": [0.1, 0.01]}, tmp_path / "kept")
    assert saved.shared["note"] == "first run" and saved.shared["lr_grid"] == [0.1, 0.01]
    for extras, error, message in (
            ({"model": "mine", "rng": 1}, ValueError,
             r"may not use fit's own keys .*, got \['model', 'rng'\]"),
            ([("note", 1)], TypeError, "checkpoint_extras must be a dict or None, got list")):
        with pytest.raises(error, match=message):
            run(extras, tmp_path / "refused")
        assert not list((tmp_path / "refused").glob("*[0-9]*"))


def test_fit_saves_its_per_epoch_lists_as_arrays_and_resumes_from_either(tmp_path):
    """The losses and step times went into each checkpoint as lists, one entry of its tree
    per epoch, so each save cost more than the last; they are one array each, and a
    checkpoint holding lists (written before) resumes alike. Resuming twice from one
    Checkpoint gives the same run: Adam's loaded moments were the checkpoint's own tensors,
    updated in place by the first resume (its second run parted at the fourth epoch)."""
    import numpy as np
    import pysparse_hpc as sph
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit, node_tensors
    cora = sph.datasets.load("cora")
    x, y, *masks = node_tensors(cora)

    def run(epochs, **options):
        torch.manual_seed(0)
        return fit(models.GCN(x.shape[1], 16, cora.num_classes), x, cora.adj, y, masks,
                   epochs=epochs, progress=False, **options)
    whole = run(4)
    with Checkpointer(tmp_path) as checkpoints:
        run(2, checkpointer=checkpoints, checkpoint_every=2)
        saved = checkpoints.load()
    progress = saved.shared["progress"]
    for name, dtype in (("losses", np.float64), ("step_seconds", np.float64),
                        ("skipped", np.int64)):
        assert isinstance(progress[name], np.ndarray) and progress[name].dtype == dtype, name
    assert progress["losses"].tolist() == whole.losses[:2]
    resumed = run(4, resume_from=saved)
    assert resumed.losses == whole.losses and type(resumed.losses[0]) is float
    assert run(4, resume_from=saved).losses == whole.losses
    for name in ("losses", "step_seconds", "skipped"):
        progress[name] = progress[name].tolist()
    assert run(4, resume_from=saved).losses == whole.losses


def test_train_refuses_a_directory_a_plain_checkpointer_wrote(tmp_path, capsys):
    """A Checkpointer's directory without a fingerprint passed the fingerprint check, and
    train then read its partition from a shared part that is not there: AttributeError."""
    with Checkpointer(tmp_path / "plain") as checkpoints:
        checkpoints.save(3, {"weights": torch.zeros(3)}, blocking=True)
    with pytest.raises(ValueError, match=r"step-000000003 is not one of fit's: it lacks "
                                         r"\['model', 'optimizer', 'progress', 'rng'\]"):
        train("cora", "gcn", epochs=4, checkpoint=tmp_path / "plain", resume=True, **OPTIONS)
    assert main(["train", "--epochs", "4", "--no-progress", "--checkpoint",
                 str(tmp_path / "plain"), "--resume"]) == 2
    assert "is not one of fit's" in capsys.readouterr().err
    # Refused without taking the directory: the lock is released.
    with Checkpointer(tmp_path / "plain") as checkpoints:
        assert checkpoints.latest() == 3


def test_train_command_checkpoints_and_resumes(tmp_path, capsys):
    directory = str(tmp_path / "run")
    assert main(["train", "--epochs", "2", "--no-progress", "--checkpoint", directory]) == 0
    assert main(["train", "--epochs", "3", "--no-progress", "--checkpoint", directory,
                 "--resume"]) == 0
    out = capsys.readouterr().out
    assert "resumed from the checkpoint after epoch 2" in out and "test accuracy" in out
    assert main(["train", "--epochs", "3", "--no-progress", "--checkpoint", directory]) == 2
    assert "holds checkpoints" in capsys.readouterr().err
    # A directory that is a file, or lies under one: the command's error line, no traceback.
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "run"):
        assert main(["train", "--epochs", "1", "--no-progress", "--checkpoint",
                     str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m pysparse_hpc train: error: ") and str(path) in err, err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for bad, message in ((["--resume"], "--resume needs --checkpoint DIR"),
                             (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint"),
                             (["--checkpoint", ""], "--checkpoint needs a directory"),
                             (["--checkpoint", directory, "--checkpoint-every", "0"],
                              "--checkpoint-every must be at least 1")):
            with pytest.raises(SystemExit):
                main(["train", "--no-progress", *bad])
            assert message in capsys.readouterr().err


def test_the_checkpoints_name_a_bundled_dataset_whatever_its_spelling(tmp_path):
    train("cora", "gcn", epochs=1, checkpoint=tmp_path, **OPTIONS)
    resumed = train("CORA", "gcn", epochs=2, checkpoint=tmp_path, resume=True, **OPTIONS)
    assert resumed.resumed_after == 1


@pytest.mark.parametrize("kwargs, kind, message", [
    (dict(seed=-1, random_features=4), ValueError, r"seed must be in \[0, 2\*\*63\), got -1"),
    (dict(seed=1.5), TypeError, "seed must be an integer"),
    (dict(model=["gcn"]), ValueError, "model must be one of"),
    (dict(dtype=torch.float16), ValueError, "dtype must be one of"),
])
def test_train_names_a_bad_argument(kwargs, kind, message):
    arguments = dict(dataset="cora", model="gcn", epochs=1, progress=False)
    arguments.update(kwargs)
    with pytest.raises(kind, match=message):
        train(**arguments)


def test_train_takes_a_numpy_dtype_and_default_settings_names_a_bad_model():
    import numpy as np

    from pysparse_hpc.distributed.training import default_settings
    assert train("cora", "gcn", epochs=1, progress=False, dtype=np.float64).epochs == 1
    # torch's dtype of the same name too (a ValueError before)
    assert train("cora", "gcn", epochs=1, progress=False, dtype=torch.float64).losses == \
        train("cora", "gcn", epochs=1, progress=False, dtype="float64").losses
    with pytest.raises(ValueError, match="model must be one of"):
        default_settings("GCN")


def test_train_and_save_take_bool_flags_only(tmp_path):
    """train(resume="no", checkpoint=dir) resumed, and save(blocking="no") blocked."""
    with pytest.raises(TypeError, match="resume must be a bool, got str 'no'"):
        train(epochs=1, checkpoint=tmp_path / "run", resume="no", **OPTIONS)
    with pytest.raises(ValueError, match="resume=True needs a checkpoint directory, got "
                                         "checkpoint=None"):
        train(epochs=1, resume=True, **OPTIONS)
    with Checkpointer(tmp_path / "flags") as checkpoints:
        with pytest.raises(TypeError, match="blocking must be a bool, got str 'no'"):
            checkpoints.save(1, {"w": torch.zeros(2)}, blocking="no")
        assert checkpoints.steps() == []


def test_train_refuses_options_of_what_it_was_not_asked_for(tmp_path):
    """As the command line does: a curvature interval without a preconditioner and a
    checkpoint interval without a directory went unused."""
    for options, message in (
            (dict(curvature_interval=5), "curvature_interval applies to a preconditioner"),
            (dict(checkpoint_every=2), "checkpoint_every applies to checkpoints, got "
                                       "checkpoint_every=2 with checkpoint=None")):
        with pytest.raises(ValueError, match=message):
            train("cora", "gcn", epochs=0, **options, **OPTIONS)


def test_train_names_its_slow_set_up_stages_on_rank_0(monkeypatch, capsys):
    """Reading, partitioning and scattering a large graph went by in silence before the
    progress bar appeared; a stage that lasts is now named on standard error, with progress
    on only."""
    import contextlib
    import time

    from pysparse_hpc.distributed import training
    monkeypatch.setattr(training, "SETUP_NOTICE_DELAY", 0.25)
    with training._said_if_slow(True, "a slow stage"):
        time.sleep(1.0)
    with training._said_if_slow(True, "a quick stage"):
        pass
    with training._said_if_slow(False, "a silent stage"):
        time.sleep(0.5)
    said = capsys.readouterr()
    assert said.err == "pysparse_hpc: a slow stage ...\n" and said.out == ""

    stages = []

    @contextlib.contextmanager
    def recorded(show, what):
        stages.append((show, what))
        yield
    monkeypatch.setattr(training, "_said_if_slow", recorded)
    for progress in (True, False):
        stages.clear()
        train("cora", "gcn", epochs=0, progress=progress, dtype="float64")
        shown = [what for show, what in stages if show]
        # one rank partitions nothing worth naming
        assert shown == (["reading cora", "setting up the graph"] if progress else []), stages
