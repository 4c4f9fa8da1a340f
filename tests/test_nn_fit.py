"""`pysparse_hpc.nn.train.fit` in one process, and the models' and layers' options, on a small
planted-community graph (its labels are the communities)."""
import numpy as np
import pytest
import torch

import pysparse_hpc as sph
from pysparse_hpc.distributed import Checkpointer
from pysparse_hpc.generators import planted_partition
from pysparse_hpc.nn import models
from pysparse_hpc.nn.train import fit


@pytest.fixture(scope="module")
def problem():
    """(adj, x, y, masks) of 4 communities of 30 nodes, noisy features."""
    adj, labels = planted_partition(4, 30, internal_degree=6.0, external_degree=3.0, seed=2)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(np.eye(4, dtype=np.float32)[labels]
                         + rng.standard_normal((120, 4), dtype=np.float32))
    role = rng.permutation(120) % 3
    masks = [torch.from_numpy(role == k) for k in range(3)]
    return adj, x, torch.from_numpy(labels), masks


def _accuracy(model, x, adj, y, mask):
    model.eval()
    with torch.no_grad():
        return int((model(x, adj).argmax(1)[mask] == y[mask]).sum()) / int(mask.sum())


def _gcn(seed=0):
    torch.manual_seed(seed)
    return models.GCN(4, 8, 4)


def test_restore_best_leaves_the_model_that_scored_the_result(problem):
    """The result reports the best epoch; the model held the last epoch's weights (without a
    word in the docs). ``restore_best=True`` leaves the model that scored it."""
    adj, x, y, masks = problem
    settings = dict(epochs=40, lr=0.05, progress=False)
    last = _gcn()
    result = fit(last, x, adj, y, masks, **settings)
    assert not last.training and result.best_epoch < 39   # else nothing to tell apart
    best = _gcn()
    restored = fit(best, x, adj, y, masks, restore_best=True, **settings)
    assert restored.losses == result.losses and restored.best_epoch == result.best_epoch
    assert _accuracy(best, x, adj, y, masks[1]) == restored.val_accuracy
    assert _accuracy(best, x, adj, y, masks[2]) == restored.test_accuracy
    assert not all(torch.equal(a, b) for a, b in zip(best.parameters(), last.parameters()))


def test_restore_best_resumes_with_the_best_weights(problem, tmp_path):
    """A run resumed from its checkpoint restores the best epoch even where that epoch came
    before the checkpoint; a checkpoint saved without the option cannot."""
    adj, x, y, masks = problem
    settings = dict(lr=0.05, progress=False, restore_best=True)
    whole = _gcn()
    fit(whole, x, adj, y, masks, epochs=30, **settings)
    with Checkpointer(tmp_path / "best") as checkpoints:
        fit(_gcn(), x, adj, y, masks, epochs=15, checkpointer=checkpoints, **settings)
        saved = checkpoints.load()
    resumed = _gcn(seed=1)
    fit(resumed, x, adj, y, masks, epochs=30, resume_from=saved, **settings)
    for a, b in zip(resumed.parameters(), whole.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with Checkpointer(tmp_path / "plain") as checkpoints:
        fit(_gcn(), x, adj, y, masks, epochs=5, checkpointer=checkpoints, lr=0.05,
            progress=False)
        plain = checkpoints.load()
    with pytest.raises(ValueError, match="saved without restore_best: it lacks the best"):
        fit(_gcn(), x, adj, y, masks, epochs=10, resume_from=plain, **settings)


@pytest.mark.parametrize("where", [0, 1, 2])
def test_a_class_id_the_model_has_no_output_for_is_refused_before_any_step(problem, where):
    """On a training node cross_entropy raised a bare IndexError; on a validation node it did
    so after the first step had changed the weights; on a test node nothing was said and the
    node counted as wrong."""
    adj, x, y, masks = problem
    labels = y.clone()
    labels[int(masks[where].nonzero()[0])] = 4
    model = _gcn()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="class id 4 on a node of the masks, but the model's "
                                         "output has 4 classes"):
        fit(model, x, adj, labels, masks, epochs=3, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    # the check is gone with the error: the model runs as before, and fit runs again
    model(x, adj)
    fit(model, x, adj, y, masks, epochs=1, progress=False)


def test_fit_refuses_a_model_with_nothing_to_train(problem):
    adj, x, y, masks = problem
    model = _gcn().requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        fit(model, x, adj, y, masks, epochs=1, progress=False)


@pytest.mark.parametrize("option", ["progress", "skip_nonfinite", "restore_best"])
def test_fit_switches_take_bools_only(problem, option):
    # "no" is truthy: progress="no" showed the bar
    adj, x, y, masks = problem
    with pytest.raises(TypeError, match=f"{option} must be a bool, got str 'no'"):
        fit(_gcn(), x, adj, y, masks, epochs=1, **{"progress": False, option: "no"})


@pytest.mark.parametrize("name, option", [("gcn", "input_dropout"), ("gcn", "fast_dropout"),
                                          ("gat", "fast_dropout"), ("agnn", "fast_dropout")])
def test_model_switches_take_bools_only(name, option):
    # input_dropout="False" kept the input dropout on, as the layers' flags refuse
    with pytest.raises(TypeError, match=f"{option} must be a bool, got str 'False'"):
        models.MODELS[name](5, 4, 3, **{option: "False"})


def test_layer_reprs_show_the_options_that_change_results():
    assert sph.nn.GCNConv(3, 2).extra_repr() == "3, 2, order='auto', cached=False"
    assert sph.nn.GCNConv(3, 2, normalize=False, bias=False).extra_repr().endswith(
        "cached=False, normalize=False, bias=False")
    gat = sph.nn.GATConv(3, 2, negative_slope=0.1, add_self_loops=False, bias=False)
    assert gat.extra_repr().endswith("negative_slope=0.1, add_self_loops=False, bias=False")
    assert "negative_slope" not in repr(sph.nn.GATConv(3, 2))
    assert repr(sph.nn.AGNNConv(add_self_loops=False)) == (
        "AGNNConv(requires_grad=True, add_self_loops=False)")


def test_to_pyg_state_dict_converts_a_layer_under_every_name():
    """A GATConv registered under two names is listed twice in the state dict; the second
    entry kept our 2-D attention vectors, which PyG's layer refuses."""
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = sph.nn.GATConv(4, 4)
            self.b = self.a

    state = sph.nn.to_pyg_state_dict(Shared())
    assert state["a.att_src"].shape == state["b.att_src"].shape == (1, 1, 4)
    assert state["b.att_dst"].shape == (1, 1, 4)


def test_fit_leaves_no_hook_on_a_model_whose_first_forward_fails(problem):
    """An error (or a KeyboardInterrupt) before the first forward ended left fit's class check
    hooked to the user's model, to run (on a DistGraph, a collective) on later calls."""
    adj, x, y, masks = problem

    class FailsOnce(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.failed = _gcn(), False

        def forward(self, x, adj):
            if not self.failed:
                self.failed = True
                raise KeyboardInterrupt
            return self.inner(x, adj)

    model = FailsOnce()
    with pytest.raises(KeyboardInterrupt):
        fit(model, x, adj, y, masks, epochs=2, progress=False)
    assert not model._forward_hooks
    fit(model, x, adj, y, masks, epochs=2, progress=False)


def test_layers_called_from_threads_with_features_of_another_dtype_keep_their_parameters():
    """The call with parameters cast swaps the module's attributes for its duration: threads
    swapping at once could leave one's cast tensor where the parameter was."""
    from concurrent.futures import ThreadPoolExecutor

    adj, _ = planted_partition(4, 30, seed=3)
    x = torch.randn(120, 16, dtype=torch.float64)
    torch.manual_seed(0)
    conv = sph.nn.GCNConv(16, 8)
    expected = conv(x, adj)
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda _: conv(x, adj), range(256)))
    assert all(torch.equal(out, expected) for out in outputs)
    assert isinstance(conv.lin.weight, torch.nn.Parameter)
    assert [p.dtype for p in conv.parameters()] == [torch.float32] * 2


def test_fit_names_bad_masks_and_an_empty_training_set(problem):
    adj, x, y, masks = problem
    for bad, error, message in (
            (masks[:2], ValueError, r"masks must be \(train, val, test\), got 2 of them"),
            ([masks[0].long(), masks[1], masks[2]], TypeError, "train_mask"),
            ([torch.zeros_like(masks[0]), masks[1], masks[2]], ValueError,
             "the training mask selects no node")):
        with pytest.raises(error, match=message):
            fit(_gcn(), x, adj, y, bad, epochs=1, progress=False)


def test_resuming_with_a_preconditioner_from_a_run_without_one_is_refused(problem, tmp_path):
    adj, x, y, masks = problem
    with Checkpointer(tmp_path) as checkpoints:
        fit(_gcn(), x, adj, y, masks, epochs=1, progress=False, checkpointer=checkpoints)
        saved = checkpoints.load()
    with pytest.raises(ValueError, match="has no preconditioner state"):
        fit(_gcn(), x, adj, y, masks, epochs=2, progress=False, resume_from=saved,
            preconditioner="kfac")


def test_fit_names_objects_of_the_wrong_kind_before_training(problem, tmp_path):
    """A path as the checkpointer failed at the first save, after checkpoint_every epochs;
    a function as the model and a path as the checkpoint with AttributeErrors; a model
    returning a row too few with torch's mask error."""
    adj, x, y, masks = problem
    for options, message in (
            (dict(checkpointer=str(tmp_path)), "checkpointer must be a pysparse_hpc.distributed"
                                               ".Checkpointer or None, got str"),
            (dict(resume_from=str(tmp_path)), "resume_from must be a Checkpoint"),
            (dict(model=lambda x, adj: x), "model must be a torch.nn.Module, got function")):
        arguments = dict(dict(model=_gcn(), x=x, adj=adj, y=y, masks=masks, epochs=3,
                              progress=False), **options)
        with pytest.raises(TypeError, match=message):
            fit(arguments.pop("model"), **arguments)

    class RowShort(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _gcn()

        def forward(self, x, adj):
            return self.inner(x, adj)[:-1]
    with pytest.raises(ValueError, match="the model returned logits for 119 nodes, expected "
                                         "120"):
        fit(RowShort(), x, adj, y, masks, epochs=1, progress=False)


def test_fit_refuses_options_of_what_it_was_not_asked_for(problem, tmp_path):
    """A curvature interval without a preconditioner, and a checkpoint interval or extras
    without a checkpointer, were taken and never used: the run looked configured as asked."""
    adj, x, y, masks = problem
    for options, message in (
            (dict(curvature_interval=5), "curvature_interval applies to a preconditioner, got "
                                         "curvature_interval=5 with preconditioner=None"),
            (dict(checkpoint_every=2), r"checkpoint_every=2 applies to checkpoints, got "
                                       r"checkpointer=None"),
            (dict(checkpoint_extras={"note": 1}, checkpoint_every=3),
             r"checkpoint_every=3 and checkpoint_extras=\{'note': 1\} apply to checkpoints")):
        with pytest.raises(ValueError, match=message):
            fit(_gcn(), x, adj, y, masks, epochs=1, progress=False, **options)
    # named with what they configure, the defaults' values train as the defaults do
    reference = fit(_gcn(), x, adj, y, masks, epochs=2, progress=False,
                    preconditioner="kfac").losses
    assert fit(_gcn(), x, adj, y, masks, epochs=2, progress=False, preconditioner="kfac",
               curvature_interval=10).losses == reference
    with Checkpointer(tmp_path) as checkpoints:
        fit(_gcn(), x, adj, y, masks, epochs=3, progress=False, checkpointer=checkpoints)
        assert checkpoints.steps() == [3]


def test_compile_notices_go_to_standard_error_with_the_bar(problem, monkeypatch, capsys):
    """tqdm.write's default is standard output: the notices of kernels compiling were mixed
    into a run's printed results, while the bar they stand above is on standard error."""
    import contextlib

    from pysparse_hpc.nn import train

    @contextlib.contextmanager
    def notices(write):   # as the real one does when a kernel takes a while to compile
        write("pysparse_hpc: compiling a kernel")
        yield
    monkeypatch.setattr(train, "compile_messages", notices)
    adj, x, y, masks = problem
    capsys.readouterr()
    fit(_gcn(), x, adj, y, masks, epochs=1, progress=True)
    said = capsys.readouterr()
    assert "compiling a kernel" in said.err and "compiling" not in said.out
