"""``python -m pysparse_hpc.bench convergence``: the runs and their summary on a tiny
configuration, and the verdicts on made-up curves."""
import math

import pytest

pytest.importorskip("torch")

from pysparse_hpc.bench import convergence  # noqa: E402
from pysparse_hpc.bench.__main__ import main  # noqa: E402
from pysparse_hpc.bench.convergence import Run, summarize, verdict  # noqa: E402


def _run(workload, method, lr, seed, val, ms_per_step=1.0):
    """A made-up run whose validation accuracy per epoch is ``val``."""
    epochs = len(val)
    return Run(workload, method, lr, seed, losses=[1.0 / (e + 1) for e in range(epochs)],
               val_accuracy=list(val), test_accuracy=[v - 0.01 for v in val],
               seconds=[1e-3 * ms_per_step * (e + 1) for e in range(epochs)], steps=epochs)


def _curve(reach_epoch, level, epochs=20, start=0.3):
    """Validation accuracy rising linearly to ``level`` at ``reach_epoch`` (from 1), then
    flat."""
    return [start + (level - start) * min(1.0, (e + 1) / reach_epoch) for e in range(epochs)]


@pytest.fixture(scope="module")
def digits():
    pytest.importorskip("sklearn")
    return convergence.load_problem("digits", epochs=2, seeds=1)


def test_measure_on_digits_gives_curves_and_a_study(digits):
    runs = convergence.measure(digits, methods=("adam", "kfac", "kfac-adam"))
    # K-FAC over SGD's grid (SGD applies it), kfac-adam over Adam's
    assert [(r.method, r.lr) for r in runs] == [("adam", lr) for lr in (3e-3, 1e-2, 3e-2)] + \
        [("kfac", lr) for lr in (0.01, 0.03, 0.1)] + \
        [("kfac-adam", lr) for lr in (3e-3, 1e-2, 3e-2)]
    steps_per_epoch = int(digits.masks[0].sum()) // convergence.DIGITS_BATCH
    for r in runs:
        assert len(r.losses) == len(r.val_accuracy) == len(r.test_accuracy) == 2
        assert r.steps == 2 * steps_per_epoch and 0 < r.seconds[0] < r.seconds[1]
        assert all(0.0 <= v <= 1.0 for v in r.val_accuracy) and r.ms_per_step > 0
    study, = summarize(runs)
    assert study.workload == "digits" and len(study.grid) == 9
    assert study.target == max(r.best_val for r in runs if r.method == "adam")
    assert study.lower_target == pytest.approx(0.99 * study.target)
    assert set(study.headline) == {"adam", "kfac", "kfac-adam"}
    assert study.headline["adam"].epochs_to_target <= 2   # Adam reaches its own best
    lines = verdict([study])
    assert "not measured (run with --workload cora)" in lines[0]
    assert "not measured (run with --method shampoo --method jorge)" in lines[1]


def test_the_command_prints_the_table_and_writes_the_csv(tmp_path, capsys):
    pytest.importorskip("sklearn")
    table = tmp_path / "convergence.csv"
    assert main(["convergence", "--workload", "digits", "--method", "sgd", "--epochs", "1",
                 "--seeds", "1", "--grid", "--csv", str(table)]) == 0
    out = capsys.readouterr().out
    assert "digits: target T = " in out and "ep->T" in out and "target: K-FAC" in out
    rows = table.read_text().splitlines()
    assert rows[0].split(",")[:4] == ["workload", "method", "lr", "seeds"]
    assert len(rows) == 1 + 6   # Adam's and SGD's grids
    assert sum(int(row.split(",")[4]) for row in rows[1:]) == 2   # one headline per method


def test_targets_and_headline_choice():
    runs = [_run("cora", "adam", 0.01, seed, _curve(10, 0.80)) for seed in range(3)]
    runs += [_run("cora", "adam", 0.03, seed, _curve(4, 0.78)) for seed in range(3)]
    # K-FAC: one seed never gets there, the lower median does in 5 epochs.
    runs += [_run("cora", "kfac", 0.01, 0, _curve(5, 0.81)),
             _run("cora", "kfac", 0.01, 1, _curve(4, 0.80)),
             _run("cora", "kfac", 0.01, 2, _curve(5, 0.70))]
    study, = summarize(runs)
    assert study.target == pytest.approx(0.80)
    adam = study.headline["adam"]
    assert adam.lr == 0.01 and adam.epochs_to_target == 10   # the only Adam reaching T
    assert study.headline["kfac"].epochs_to_target == 5
    lines = verdict([study])
    assert lines[0].endswith("5 epochs (lr 0.01) against Adam's 10 (lr 0.01), 0.50x, MET")
    assert lines[1].startswith("  same at .99T") and lines[1].endswith("MET")


def test_kfac_not_reaching_the_target_is_not_met():
    runs = [_run("cora", "adam", 0.01, 0, _curve(10, 0.80)),
            _run("cora", "kfac", 0.01, 0, _curve(3, 0.795)),
            _run("cora", "kfac", 0.03, 0, _curve(8, 0.75))]
    study, = summarize(runs)
    assert math.isinf(study.headline["kfac"].epochs_to_target)
    assert study.headline["kfac"].lr == 0.01   # reaches .99T first
    first, lower, limit = verdict([study])[:3]
    assert "K-FAC never does (best val 79.5% at lr 0.01" in first and first.endswith("NOT MET")
    assert lower.endswith("3 epochs (lr 0.01) against Adam's 10 (lr 0.01), 0.30x, MET")
    assert limit == ("  limit: K-FAC's best validation accuracy is 79.5%; to reach it K-FAC "
                     "takes 3 epochs (lr 0.01), Adam 10 (lr 0.01): 0.30x")


@pytest.mark.parametrize("jorge_ms, jorge_level, state", [
    (1.0, 0.80, "MET"), (2.0, 0.80, "NOT MET"), (1.0, 0.75, "NOT MET")])
def test_jorge_against_shampoo(jorge_ms, jorge_level, state):
    runs = [_run("digits", "adam", 0.01, 0, _curve(5, 0.80)),
            _run("digits", "shampoo", 0.01, 0, _curve(5, 0.80), ms_per_step=4.0),
            _run("digits", "jorge", 0.01, 0, _curve(5, jorge_level), ms_per_step=jorge_ms)]
    line = verdict(summarize(runs))[-1]
    assert line.startswith("target: Jorge's step >= 3x cheaper") and line.endswith(f", {state}")
    assert f"{4.0 / jorge_ms:.2f}x" in line
    assert ("accuracy not equal on digits" in line) == (jorge_level < 0.79)


def test_bad_names_and_a_run_without_adam():
    with pytest.raises(ValueError, match="workload must be one of"):
        convergence.load_problem("mnist")
    with pytest.raises(ValueError, match="method must be one of"):
        convergence.lr_grid("lion", "gcn")
    with pytest.raises(ValueError, match="no Adam run"):
        summarize([_run("cora", "sgd", 0.1, 0, _curve(3, 0.5))])
    assert convergence.lr_grid("sgd", "gcn") != convergence.lr_grid("sgd", "mlp")


def test_damping_option_reaches_the_maker(capsys):
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    assert convergence._maker("kfac", model, 10).config.damping == 0.03     # fit's under SGD
    assert convergence._maker("kfac-adam", model, 10).config.damping == 1e-2   # fit's
    assert convergence._maker("kfac", model, 10, damping=0.3).config.damping == 0.3
    assert convergence._maker("kfac-adam", model, 10, damping=0.3).config.damping == 0.3
    # SGD with momentum applies K-FAC's direction, Adam kfac-adam's
    sgd = convergence._optimizer("kfac", model, 0.1, 0.0)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.9
    assert isinstance(convergence._optimizer("kfac-adam", model, 0.1, 0.0), torch.optim.Adam)
    assert convergence._maker("adam", model, 10, damping=0.3) is None
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(SystemExit):
            main(["convergence", "--damping", bad])
        assert "expected a positive number" in capsys.readouterr().err
    # --kl-clip: K-FAC's bound at the learning rate of the optimizer applying it
    clipped = convergence._maker("kfac", model, 10, kl_clip=1e-3, optimizer=sgd)
    assert clipped.kl_clip == 1e-3 and clipped.lr() == 0.1
    sgd.param_groups[0]["lr"] = 0.05   # a scheduler's change is followed
    assert clipped.lr() == 0.05
    assert convergence._maker("shampoo", model, 10, kl_clip=1e-3, optimizer=sgd) is not None
    with pytest.raises(SystemExit):
        main(["convergence", "--kl-clip", "0"])
    assert "expected a positive number" in capsys.readouterr().err


def test_help_states_each_workloads_default_epochs_and_seeds(capsys):
    """The defaults ``--help`` names are those a run uses: PubMed trains 100 epochs, not the
    200 of the citation graphs."""
    with pytest.raises(SystemExit):
        main(["convergence", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    epochs = ", ".join(f"{n} on {name}" for name, n in convergence.DEFAULT_EPOCHS.items())
    seeds = ", ".join(f"{n} on {name}" for name, n in convergence.DEFAULT_SEEDS.items())
    assert f"epochs of every run (default: {epochs})" in text
    assert f"seeds of every grid point (default: {seeds})" in text
    assert "100 on pubmed" in epochs
    assert convergence.load_problem("cora").epochs == convergence.DEFAULT_EPOCHS["cora"]


@pytest.mark.parametrize("options, message", [
    (["--method", "sgd", "--kl-clip", "1e-3"], "--kl-clip applies to kfac, kfac-adam"),
    (["--method", "sgd", "--damping", "0.1"], "--damping applies to kfac, kfac-adam, shampoo"),
])
def test_options_no_selected_method_reads_are_refused(options, message, capsys):
    """``--method sgd --kl-clip 1`` ran SGD and Adam, and the report named a KL clip that
    nothing applied."""
    assert main(["convergence", "--workload", "digits", *options]) == 2
    assert message in capsys.readouterr().err
