"""The main job, as a user runs it."""
import io
import re
import subprocess
import sys

import pytest

from pysparse_hpc.__main__ import run_demo


def test_demo_in_process(capsys):
    assert run_demo("cora", models=("gcn",), seeds=1, progress=False) == 0
    out = capsys.readouterr().out
    assert "ME-BCRS 8x1" in out and "16x1" in out and "round-tripped" in out
    assert "SpMM" in out and "SDDMM" in out and "ours ME-BCRS" in out
    assert "2708 nodes" in out
    accuracy = re.search(r"GCN +16 hidden +200 epochs +test accuracy +([0-9.]+)%", out)
    assert accuracy and float(accuracy.group(1)) >= 75.0   # one seed; the mean is tested apart
    assert "ms per training epoch" in out
    if "Distributed training skipped" not in out:
        assert "GCN on cora, 2 ranks x 1 thread, metis partition, 200 epochs" in out
        mpi = re.search(r"GCN on cora, 2 ranks.*\n +test accuracy ([0-9.]+)%.*final training loss "
                        r"([0-9.]+)", out)
        single = re.search(r"in one process: test accuracy ([0-9.]+)%, final training loss "
                           r"([0-9.]+)", out)
        assert mpi and single and mpi.groups() == single.groups(), out
        assert "CAGNET-1D" in out


@pytest.mark.parametrize("seeds, error, message", [
    (0, ValueError, "seeds must be a positive int, got 0"),
    (-1, ValueError, "seeds must be a positive int, got -1"),
    (1.5, TypeError, "seeds must be an integer, got float 1.5"),
    (True, TypeError, "seeds must be an integer, got bool True")])
def test_demo_refuses_a_bad_seed_count(seeds, error, message):
    # A float or a bool is a wrong type, a TypeError as everywhere else (it was a ValueError).
    with pytest.raises(error, match=message):
        run_demo("cora", seeds=seeds, out=io.StringIO())


def test_demo_command_line():
    # The run under mpiexec is test_demo_in_process's; here --no-distributed leaves it out.
    result = subprocess.run([sys.executable, "-m", "pysparse_hpc", "demo", "--dataset", "citeseer",
                             "--model", "agnn", "--seeds", "1", "--no-distributed"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "citeseer" in result.stdout and "AGNN" in result.stdout
    assert "agnn seed 0" in result.stderr                   # the progress bar
    assert "Distributed training" not in result.stdout


def test_demo_without_training():
    result = subprocess.run([sys.executable, "-m", "pysparse_hpc", "demo", "--no-train"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "GNN training" not in result.stdout


def test_bad_seed_count():
    result = subprocess.run([sys.executable, "-m", "pysparse_hpc", "demo", "--seeds", "0"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "--seeds must be at least 1" in result.stderr


def test_bad_command_line():
    result = subprocess.run([sys.executable, "-m", "pysparse_hpc", "demo", "--dataset", "nope"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_demo_refuses_training_options_without_training(capsys):
    from pysparse_hpc.__main__ import main
    for options in (["--model", "gat"], ["--seeds", "2"]):
        with pytest.raises(SystemExit) as stop:
            main(["demo", "--no-train", *options])
        assert stop.value.code == 2
        assert "--model and --seeds choose what is trained" in capsys.readouterr().err


def test_demo_dataset_names_ignore_case():
    from pysparse_hpc.__main__ import main
    assert main(["demo", "--dataset", "CORA", "--no-train", "--no-progress",
                 "--no-distributed"]) == 0


def test_threads_per_rank_share_the_node(monkeypatch):
    import numba

    from pysparse_hpc.__main__ import _threads_per_rank
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 64)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert [_threads_per_rank(ranks) for ranks in (1, 2, 3, 16)] == [8, 4, 2, 1]
    # bound by the launcher to two cores: those are this rank's
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert _threads_per_rank(4) == 2
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)   # Numba's pool is the cap
    assert _threads_per_rank(1) == 1


def test_train_timeout_option(capsys):
    from pysparse_hpc.__main__ import main
    from pysparse_hpc.distributed import init
    for bad in ("0", "-1", "inf", "nan"):
        with pytest.raises(SystemExit):
            main(["train", "--timeout", bad])
        assert "--timeout must be a finite number > 0" in capsys.readouterr().err
    try:
        assert main(["train", "--epochs", "1", "--no-progress", "--timeout", "30"]) == 0
        assert init().timeout == 30.0
        # one process partitions nothing: no partition is named
        header = capsys.readouterr().out.splitlines()[0]
        assert header.startswith("GCN on cora, 1 rank x ") and "thread" in header
        assert ", 1 epoch, Adam" in header and "partition" not in header
    finally:
        init().set_timeout(None)


@pytest.mark.parametrize("option, value, message", [
    ("--lr", "nan", "--lr must be a finite number > 0, got nan"),
    ("--lr", "0", "--lr must be a finite number > 0, got 0.0"),
    ("--weight-decay", "-1", "--weight-decay must be a finite number >= 0, got -1.0"),
    ("--weight-decay", "inf", "--weight-decay must be a finite number >= 0, got inf"),
    ("--lr", "1e300", "--lr 1e+300 does not fit --dtype float32"),
    ("--weight-decay", "1e300", "--weight-decay 1e+300 does not fit --dtype float32"),
    ("--threads", "100000", "--threads must be at most"),
])
def test_train_refuses_a_bad_schedule(option, value, message, capsys):
    from pysparse_hpc.__main__ import main
    with pytest.raises(SystemExit) as exit_info:
        main(["train", option, value])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error
    assert "usage: python -m pysparse_hpc train" in error  # the subcommand's usage


def test_train_on_a_file_with_nan_features_or_garbage(tmp_path, capsys):
    """A graph file with NaN features is refused by name (training would skip every step),
    and a file that is not an .npz archive is called that (not 'pickled data')."""
    import numpy as np
    import pysparse_hpc as sph
    from pysparse_hpc.__main__ import main
    cora = sph.datasets.load("cora")
    features = sph.csr_array(cora.x)
    features.data[0] = np.nan
    arrays = {f"adj_{k}": v for k, v in (("indptr", cora.adj.indptr),
                                         ("indices", cora.adj.indices),
                                         ("data", cora.adj.data),
                                         ("shape", np.array(cora.adj.shape)))}
    arrays.update({f"feat_{k}": v for k, v in (("indptr", features.indptr),
                                               ("indices", features.indices),
                                               ("data", features.data),
                                               ("shape", np.array(features.shape)))})
    arrays.update(labels=cora.y, num_classes=np.array(cora.num_classes),
                  **{f"{split}_mask": getattr(cora, f"{split}_mask")
                     for split in ("train", "val", "test")})
    with open(tmp_path / "nan.NPZ", "wb") as file:  # a name np.savez would extend
        np.savez(file, **arrays)
    assert main(["train", "--dataset", str(tmp_path / "nan.NPZ"), "--epochs", "1",
                 "--no-progress"]) == 2
    assert "the features hold NaN or infinite values" in capsys.readouterr().err
    (tmp_path / "garbage.npz").write_bytes(b"\x93NUMPY not really")
    assert main(["train", "--dataset", str(tmp_path / "garbage.npz"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "not a zip file" in error and "pickle" not in error


def test_train_refuses_a_bad_schedule_through_the_api():
    from pysparse_hpc.distributed.training import train
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got nan"):
        train(lr=float("nan"), progress=False)
    with pytest.raises(TypeError, match="epochs must be an int, got float"):
        train(epochs=2.5, progress=False)


def test_train_without_epochs_reports_no_time_per_epoch(capsys):
    from pysparse_hpc.__main__ import main
    assert main(["train", "--epochs", "0", "--no-progress"]) == 0
    report = capsys.readouterr().out
    assert "no epoch run" in report and "per training epoch" not in report
    assert "nan" not in report


def test_train_refuses_a_bad_timeout_variable(monkeypatch, capsys):
    from pysparse_hpc.__main__ import main
    from pysparse_hpc.distributed import _comm
    monkeypatch.setattr(_comm, "_WORLD", None)
    monkeypatch.setenv(_comm.TIMEOUT_VARIABLE, "soon")
    assert main(["train", "--epochs", "1", "--no-progress"]) == 2
    assert capsys.readouterr().err == ("python -m pysparse_hpc train: error: "
                                       "PYSPARSE_HPC_COMM_TIMEOUT must be a number of seconds "
                                       "> 0, got 'soon'\n")


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGTERM"), reason="needs SIGTERM")
@pytest.mark.parametrize("signal_name, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_train_interrupted_says_so_and_leaves_a_checkpoint_to_resume(tmp_path, signal_name,
                                                                     status):
    """Ctrl-C during training: status 130 and one line naming the checkpoints, no traceback;
    the last checkpoint is whole, and a resumed run with as many epochs ends as a finished one.
    SIGTERM (a scheduler ending the job) is taken alike, with status 143: it ended the
    process at once, leaving the save in flight as temporary files, and said nothing."""
    import signal
    import time
    checkpoints = tmp_path / "run"
    command = [sys.executable, "-m", "pysparse_hpc", "train", "--no-progress", "--checkpoint",
               str(checkpoints), "--checkpoint-every", "1"]
    # A shell's background job inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: the job gets the default a terminal gives.
    job = subprocess.Popen(command + ["--epochs", "100000"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300   # a first run compiles its kernels on a busy machine
    while time.monotonic() < deadline and len(list(checkpoints.glob("*/manifest*"))) < 2:
        time.sleep(0.2)
    started = len(list(checkpoints.glob("*/manifest*")))
    job.send_signal(getattr(signal, signal_name))
    _, errors = job.communicate(timeout=60)
    assert started >= 2, f"no checkpoint within 300 s before the interrupt:\n{errors[-2000:]}"
    assert job.returncode == status, errors[-2000:]
    assert (f"train: interrupted; --resume continues from the last checkpoint in {checkpoints}"
            in errors) and "Traceback" not in errors
    assert not list(checkpoints.glob("**/*.tmp")), "a save left unfinished"
    resumed = subprocess.run(command + ["--epochs", "1", "--resume"], capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "test accuracy" in resumed.stdout.lower()


def test_normalize_features_bounds_signed_rows_and_keeps_the_precision():
    """Signed features (--random-features draws standard-normal ones) are scaled by their rows'
    L1 norms: a row summing to nearly zero blew up under its plain sum. Non-negative rows still
    sum to 1, and float64 is normalized in float64, not rounded through float32 first."""
    import numpy as np
    import torch
    import pysparse_hpc as sph
    from pysparse_hpc.nn.train import node_tensors, normalize_features
    signed = np.array([[1.0, -1.0 + 1e-6, 0.5], [0.0, 0.0, 0.0], [-2.0, 0.0, 2.0]],
                      dtype=np.float32)
    scaled = normalize_features(signed)
    assert scaled.dtype == np.float32 and np.abs(scaled).max() <= 1.0
    assert np.allclose(np.abs(scaled).sum(axis=1), [1.0, 0.0, 1.0])
    counts = np.array([[1.0, 0.0, 2.0], [3.0, 3.0, 3.0]])
    assert np.allclose(normalize_features(counts), [[1 / 3, 0, 2 / 3], [1 / 3, 1 / 3, 1 / 3]])
    cora = sph.datasets.load("cora")
    x = node_tensors(cora, dtype=torch.float64)[0].numpy()
    exact = cora.x.astype(np.float64) / cora.x.astype(np.float64).sum(axis=1, keepdims=True)
    assert x.dtype == np.float64 and np.array_equal(x, exact)


def test_train_on_random_features_starts_from_a_sane_loss():
    from pysparse_hpc.distributed.training import train
    result = train("cora", epochs=1, random_features=16, progress=False)
    assert result.losses[0] < 2.5   # about ln(7) = 1.95 for 7 classes; 9.9 when it blew up


def _fake_training(monkeypatch, **fields):
    """`train` replaced by one returning a `DistributedTrainResult` with ``fields``."""
    from pysparse_hpc.distributed import training
    values = dict(dataset="cora", model="gcn", partition_method="metis", ranks=1,
                  test_accuracy=0.8, val_accuracy=0.8, best_epoch=11, epochs=12,
                  losses=[1.0] * 12, seconds_per_epoch=0.01, seconds_total=0.1,
                  halo_bytes_per_epoch=0.0, cagnet_bytes_per_epoch=0.0,
                  allreduce_bytes_per_epoch=0.0, partition_summary="")
    values.update(fields)
    monkeypatch.setattr(training, "train",
                        lambda *args, **kwargs: training.DistributedTrainResult(**values))


def test_train_resumed_with_earlier_skipped_steps_is_not_nothing_trained(monkeypatch, tmp_path,
                                                                         capsys):
    """Steps skipped before the checkpoint do not count against the epochs this run trained."""
    from pysparse_hpc.__main__ import main
    command = ["train", "--no-progress", "--checkpoint", str(tmp_path), "--resume"]
    _fake_training(monkeypatch, resumed_after=10, skipped_epochs=[0, 1, 2, 3, 4])
    assert main(command) == 0
    assert "nothing was trained" not in capsys.readouterr().err
    _fake_training(monkeypatch, resumed_after=10, skipped_epochs=[0, 10, 11])
    assert main(command) == 1
    assert "nothing was trained" in capsys.readouterr().err


def test_train_refuses_curvature_interval_without_a_preconditioner(capsys):
    from pysparse_hpc.__main__ import main
    with pytest.raises(SystemExit) as stop:
        main(["train", "--epochs", "0", "--no-progress", "--curvature-interval", "5"])
    assert stop.value.code == 2
    assert "--curvature-interval needs --optimizer kfac, shampoo or jorge" in \
        capsys.readouterr().err


def test_train_passes_curvature_interval_to_the_preconditioner(monkeypatch):
    from pysparse_hpc.__main__ import main
    from pysparse_hpc.distributed import training
    seen = []
    real = training.train
    monkeypatch.setattr(training, "train", lambda *args, **kwargs: seen.append(kwargs)
                        or real(*args, **dict(kwargs, epochs=0)))
    for options in ([], ["--curvature-interval", "3"]):
        assert main(["train", "--no-progress", "--optimizer", "kfac", *options]) == 0
    # not given: None, train's own default
    assert [kwargs["curvature_interval"] for kwargs in seen] == [None, 3]


def test_demo_trains_a_model_named_twice_once(monkeypatch):
    import pysparse_hpc.__main__ as cli
    seen = []
    monkeypatch.setattr(cli, "run_demo", lambda *args, **kwargs: seen.append(kwargs) or 0)
    assert cli.main(["demo", "--model", "gat", "--model", "gcn", "--model", "gat"]) == 0
    assert seen[0]["models"] == ("gat", "gcn")


def test_train_refuses_a_bad_optimizer_before_taking_the_checkpoint_directory(tmp_path):
    from pysparse_hpc.distributed.training import default_settings, train
    with pytest.raises(ValueError, match="optimizer must be one of"):
        default_settings("gcn", "adamw")
    with pytest.raises(ValueError, match="preconditioner must be None or one of"):
        default_settings("gcn", "sgd", "lbfgs")
    for bad, message in ((dict(optimizer="adamw"), "optimizer must be one of"),
                         (dict(checkpoint_every=0), "checkpoint_every must be a positive int")):
        with pytest.raises(ValueError, match=message):
            train(epochs=1, progress=False, checkpoint=tmp_path / "run", **bad)
        assert not (tmp_path / "run").exists()


def test_train_prints_the_halo_exchanged_once_apart(monkeypatch, capsys):
    from pysparse_hpc.__main__ import main
    _fake_training(monkeypatch, ranks=2, halo_bytes_per_epoch=0.06e6, halo_bytes_once=1.69e6,
                   cagnet_bytes_per_epoch=0.57e6)
    assert main(["train", "--no-progress"]) == 0
    assert ("halo exchange per epoch: 0.06 MB (all ranks; 1.69 MB more once, for the input "
            "rows of a kept product); CAGNET-1D") in capsys.readouterr().out
    _fake_training(monkeypatch, ranks=2, halo_bytes_per_epoch=0.06e6, halo_bytes_once=0.0,
                   cagnet_bytes_per_epoch=0.57e6)
    assert main(["train", "--no-progress"]) == 0
    assert "halo exchange per epoch: 0.06 MB (all ranks); CAGNET-1D" in capsys.readouterr().out


def test_train_names_a_scipy_matrix_file_given_as_the_dataset(tmp_path, capsys):
    """A matrix saved by scipy.sparse.save_npz is a plausible --dataset PATH.npz: the error
    says that it holds no labels or split and what a graph file holds, before anything runs."""
    import scipy.sparse
    import pysparse_hpc as sph
    from pysparse_hpc.__main__ import main
    path = tmp_path / "adjacency.npz"
    scipy.sparse.save_npz(path, sph.datasets.load("cora").adj.to_scipy())
    with pytest.raises(SystemExit) as stop:
        main(["train", "--dataset", str(path), "--epochs", "1", "--no-progress"])
    error = capsys.readouterr().err
    assert stop.value.code == 2
    assert "scipy.sparse.save_npz" in error and "pysparse_hpc.datasets.load_file" in error
    assert "labels" in error and "train_mask" in error


def test_train_choices_ignore_case(monkeypatch):
    """The report names the model in capitals (GCN on cora, ...): --model GCN is taken, as the
    demo's --dataset CORA is, and so are the other named choices."""
    from pysparse_hpc import __main__ as cli
    seen = {}
    monkeypatch.setattr(cli, "run_train", lambda args: seen.update(vars(args)) or 0)
    assert cli.main(["train", "--model", "GAT", "--partition", "Random", "--optimizer", "KFAC",
                     "--base-optimizer", "SGD"]) == 0
    assert (seen["model"], seen["partition"], seen["optimizer"], seen["base_optimizer"]) == (
        "gat", "random", "kfac", "sgd")
    demo = {}
    monkeypatch.setattr(cli, "run_demo", lambda name, models, **options: demo.update(
        models=models) or 0)
    assert cli.main(["demo", "--model", "GCN", "--model", "Gat"]) == 0
    assert demo["models"] == ("gcn", "gat")


def test_a_graph_without_test_nodes_has_no_test_accuracy(monkeypatch, capsys):
    """An empty test split reports NaN, and the command says so: it printed "test accuracy
    0.0%", a model wrong on every test node."""
    import math

    import torch

    import pysparse_hpc as sph
    from pysparse_hpc.__main__ import main
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit, node_tensors
    cora = sph.datasets.load("cora")
    x, y, train_mask, val_mask, test_mask = node_tensors(cora)
    torch.manual_seed(0)
    result = fit(models.GCN(x.shape[1], 16, cora.num_classes), x, cora.adj, y,
                 (train_mask, val_mask, torch.zeros_like(test_mask)), epochs=2, progress=False)
    assert math.isnan(result.test_accuracy) and 0 < result.val_accuracy <= 1, result
    _fake_training(monkeypatch, test_accuracy=float("nan"))
    assert main(["train", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "no test nodes (best validation accuracy 80.0% at epoch 12)" in out, out


def test_a_graph_without_validation_nodes_reports_the_last_epochs_model(monkeypatch, capsys):
    """No validation nodes: fit keeps the last epoch and measures no validation accuracy
    (NaN); the command said "best validation accuracy nan%"."""
    from pysparse_hpc.__main__ import main
    _fake_training(monkeypatch, val_accuracy=float("nan"))
    assert main(["train", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert ("test accuracy 80.0% (no validation nodes: the last epoch's model at epoch 12)"
            in out), out


def test_a_run_that_trained_no_epoch_reports_no_traffic_per_epoch(monkeypatch, capsys):
    """0 epochs, or a resumed run already finished, measured no epoch's traffic: NaN, and no
    traffic lines. It printed a halo exchange of "0.00 MB per epoch, 0.0% of CAGNET's"."""
    import math

    from pysparse_hpc.__main__ import main
    from pysparse_hpc.distributed.training import train
    result = train("cora", epochs=0, progress=False)
    assert all(math.isnan(value) for value in (
        result.halo_bytes_per_epoch, result.cagnet_bytes_per_epoch,
        result.allreduce_bytes_per_epoch, result.optimizer_bytes_per_epoch)), result
    nan = float("nan")
    _fake_training(monkeypatch, ranks=2, resumed_after=12, halo_bytes_per_epoch=nan,
                   cagnet_bytes_per_epoch=nan, allreduce_bytes_per_epoch=nan,
                   partition_summary="<Partition>")
    assert main(["train", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "per epoch" not in out and "partition: <Partition>" in out, out


def test_fit_names_node_arrays_that_are_not_tensors():
    """NumPy features failed inside the model ("'str' object has no attribute 'type'"), and
    NumPy labels were refused as "got 1-D int64", the dtype asked for."""
    import pysparse_hpc as sph
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit, node_tensors
    cora = sph.datasets.load("cora")
    x, y, *masks = node_tensors(cora)
    model = models.GCN(x.shape[1], 16, cora.num_classes)
    with pytest.raises(TypeError, match="x must be a torch.Tensor of node features, got "
                                        "ndarray"):
        fit(model, x.numpy(), cora.adj, y, masks, epochs=1, progress=False)
    with pytest.raises(TypeError, match="y must be a 1-D int64 torch.Tensor of class ids, got "
                                        "ndarray"):
        fit(model, x, cora.adj, y.numpy(), masks, epochs=1, progress=False)


@pytest.mark.parametrize("progress", [True, False])
def test_demo_mpi_run_and_its_reference_show_progress_as_asked(monkeypatch, progress):
    """The demo's last two trainings (under mpiexec, then in this process) took half a minute
    on two cores without a bar, whatever --no-progress said."""
    pytest.importorskip("mpi4py")
    from pysparse_hpc import __main__ as cli
    from pysparse_hpc.distributed import _comm, training
    seen = {}

    def run_ranks(command, timeout, env, show_stderr):
        seen["command"], seen["shown"] = command, show_stderr
        return subprocess.CompletedProcess(command, 0, "GCN on cora, 2 ranks\n", "")

    def train(*args, progress, **kwargs):
        seen["progress"] = progress
        return type("Result", (), {"test_accuracy": 0.8, "losses": [0.5]})()

    monkeypatch.setattr(_comm, "mpiexec_path", lambda: "mpiexec")
    monkeypatch.setattr(cli, "_run_ranks", run_ranks)
    monkeypatch.setattr(training, "train", train)
    out = io.StringIO()
    cli._distributed_report("cora", out, progress=progress)
    assert ("--no-progress" not in seen["command"]) == progress
    assert seen["shown"] == progress and seen["progress"] == progress
    assert "GCN on cora, 2 ranks" in out.getvalue() and "in one process" in out.getvalue()


def test_mpi_job_passes_its_bar_on_and_keeps_its_output(capsys):
    """The job's standard error reaches the screen as it comes, but for the PID line, and both
    streams come back whole for the report."""
    from pysparse_hpc.__main__ import _run_ranks
    code = ("import sys, time\n"
            "sys.stderr.write('pysparse_hpc train: rank 0 is PID 1 on host\\n')\n"
            "for i in range(3):\n"
            "    sys.stderr.write(f'\\rbar {i}'); sys.stderr.flush(); time.sleep(0.05)\n"
            "sys.stderr.write('\\r      \\r')\n"
            "print('the result')\n")
    done = _run_ranks([sys.executable, "-c", code], timeout=60, env=None, show_stderr=True)
    assert done.returncode == 0 and done.stdout == "the result\n"
    assert "rank 0 is PID 1" in done.stderr and "bar 2" in done.stderr
    shown = capsys.readouterr().err
    assert "\rbar 0" in shown and "\rbar 2" in shown and "PID" not in shown
    failed = _run_ranks([sys.executable, "-c", "import sys; sys.exit('no')"], timeout=60,
                        env=None, show_stderr=False)
    assert failed.returncode == 1 and "no" in failed.stderr and capsys.readouterr().err == ""


def _processes_marked(marker):
    """PIDs of the processes whose environment holds ``marker`` (this test's children and
    theirs, in whatever process group)."""
    from .conftest import processes_holding
    return processes_holding(marker.encode(), "environ")


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("signal_name, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupted_demo_stops_its_mpi_job(signal_name, status):
    """The demo's MPI job runs in its own process group, which no signal to the demo reaches.
    Ctrl-C stopped it but ended with status 1 and a traceback; SIGTERM (a scheduler, or
    ``timeout``) ended the demo at once and left the whole job running."""
    import os
    import signal
    import time
    import uuid
    pytest.importorskip("mpi4py")
    from pysparse_hpc.distributed._comm import mpiexec_path
    if mpiexec_path() is None:
        pytest.skip("needs mpiexec")
    marker = f"PYSPARSE_HPC_TEST_MARK={uuid.uuid4().hex}"
    environment = dict(os.environ, PYSPARSE_HPC_TEST_MARK=marker.split("=")[1])
    demo = subprocess.Popen([sys.executable, "-m", "pysparse_hpc", "demo", "--model", "gcn",
                             "--seeds", "1", "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in demo.stdout:
            if line.startswith("Distributed training:"):
                break
        deadline = time.monotonic() + 60
        while len(_processes_marked(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)    # the demo, mpiexec and its ranks
        assert len(_processes_marked(marker)) >= 3, "the MPI job never started"
        demo.send_signal(getattr(signal, signal_name))
        _, errors = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == status, errors[-2000:]
    assert "demo: interrupted" in errors and "Traceback" not in errors, errors[-2000:]
    deadline = time.monotonic() + 10
    while _processes_marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_marked(marker), "a process of the demo's job outlived it"


def test_feature_dtypes_are_numpys_or_torchs_float32_and_float64_only():
    """node_tensors took torch.int64 and truncated the normalized features to zeros, and
    failed inside torch on np.float64; normalize_features refused a torch dtype."""
    import numpy as np
    import pytest
    import torch
    import pysparse_hpc as sph
    from pysparse_hpc.nn.train import node_tensors, normalize_features
    cora = sph.datasets.load("cora")
    reference = node_tensors(cora, dtype=torch.float64)[0]
    for dtype in (np.float64, torch.float64, "float64"):
        assert torch.equal(node_tensors(cora, dtype=dtype)[0], reference)
        assert normalize_features(cora.x, dtype).dtype == np.float64
    assert node_tensors(cora, np.float32)[0].dtype == torch.float32
    for dtype in (torch.int64, np.int32, torch.float16, np.float16, bool):
        with pytest.raises(TypeError, match="dtype must be float32 or float64, got"):
            node_tensors(cora, dtype=dtype)
        with pytest.raises(TypeError, match="dtype must be float32 or float64, got"):
            normalize_features(cora.x, dtype)
