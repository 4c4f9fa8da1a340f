"""Gradient preconditioning of the GNN layers through their dense transform (``lin``): what is
preconditioned and what keeps its plain gradient, K-FAC equal to the same layer written with a
plain ``nn.Linear`` and `functional.spmm`, the same statistics whatever operator order the layer
takes, and GAT's recomputing cache counted once."""
import warnings

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc import precondition as P  # noqa: E402
from pysparse_hpc.nn import GATConv, GCNConv, functional, gcn_norm, models  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning")

DTYPE = torch.float64


def small_graph(n=40, seed=0):
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, n)) < 0.12).astype(np.float64)
    dense = np.maximum(dense, dense.T)
    np.fill_diagonal(dense, 0.0)
    return sph.csr_array(dense)


def node_batch(n=40, features=12, classes=3, seed=1):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator, dtype=DTYPE)
    y = torch.randint(0, classes, (n,), generator=generator)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[::2] = True
    return x, y, mask


def run_steps(maker, model, x, graph, y, mask, steps=3, lr=0.05):
    """SGD steps through the ASDL loop on the masked nodes; every step's gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        placeholder = maker.setup_model_call(model, x, graph)
        maker.setup_loss_call(F.cross_entropy, placeholder[mask], y[mask])
        maker.forward_and_backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        optimizer.step()
    return grads


def assert_same_grads(expected, actual, rtol=1e-9):
    for step, (e, a) in enumerate(zip(expected, actual)):
        for name in e:
            err = ((e[name] - a[name]).norm() / e[name].norm()).item()
            assert err <= rtol, f"step {step}, {name}: relative error {err:.2e}"


class TwoLayerGCN(nn.Module):
    def __init__(self, order="auto"):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = GCNConv(12, 8, order=order)
        self.conv2 = GCNConv(8, 3, order=order)

    def forward(self, x, graph):
        return self.conv2(torch.relu(self.conv1(x, graph)), graph)


class PlainGCNLayer(nn.Module):
    """``Â (X W) + b`` with a plain nn.Linear: what K-FAC sees of a GCNConv."""

    def __init__(self, conv):
        super().__init__()
        self.lin = nn.Linear(conv.in_channels, conv.out_channels, bias=False).to(DTYPE)
        self.bias = nn.Parameter(conv.bias.detach().clone())
        with torch.no_grad():
            self.lin.weight.copy_(conv.lin.weight)

    def forward(self, x, normalized):
        return functional.spmm(normalized, self.lin(x)) + self.bias


class PlainGCN(nn.Module):
    def __init__(self, gcn):
        super().__init__()
        self.conv1, self.conv2 = PlainGCNLayer(gcn.conv1), PlainGCNLayer(gcn.conv2)

    def forward(self, x, normalized):
        return self.conv2(torch.relu(self.conv1(x, normalized)), normalized)


def kfac(model, mask, fisher="emp"):
    config = P.PreconditioningConfig(data_size=int(mask.sum()), damping=1e-3)
    return P.KfacGradientMaker(model, config, fisher_type=fisher)


def test_gcn_and_gat_models_precondition_their_transforms():
    for name, expected in (("gcn", ["conv1.lin", "conv2.lin"]),
                           ("gat", ["conv1.lin", "conv2.lin"])):
        model_class = models.MODELS[name]
        model = model_class(12, out_channels=3, **model_class.architecture).to(DTYPE)
        maker = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=10))
        assert list(maker.preconditioned_modules()) == expected
        plain = maker.unpreconditioned_parameters()
        assert "conv1.bias" in plain and "held directly by" in plain["conv1.bias"]
        if name == "gat":
            assert {"conv1.att_src", "conv1.att_dst", "conv2.att_src"} <= set(plain)
        for root_maker in (P.ShampooGradientMaker, P.JorgeGradientMaker):
            assert list(root_maker(model, P.PreconditioningConfig())
                        .preconditioned_modules()) == expected


@pytest.mark.parametrize("fisher", ["emp", "mc"])
@pytest.mark.parametrize("order", ["auto", "transform_first", "propagate_first"])
def test_gcn_kfac_equals_a_plain_linear_model(order, fisher):
    """The hooks see X and the gradient of X W in every order: the preconditioned gradients
    equal those of the same model built from nn.Linear and spmm (transform first)."""
    graph = small_graph()
    x, y, mask = node_batch()
    model = TwoLayerGCN(order).to(DTYPE)
    reference = PlainGCN(model)
    normalized = gcn_norm(graph).astype(np.float64)
    torch.manual_seed(5)
    expected = run_steps(kfac(reference, mask, fisher), reference, x, normalized, y, mask)
    torch.manual_seed(5)
    got = run_steps(kfac(model, mask, fisher), model, x, graph, y, mask)
    assert_same_grads(expected, got)


def test_gcn_order_returns_after_the_curvature_pass():
    """Only calls watched by the preconditioner are forced to transform first."""
    graph = small_graph()
    x, y, mask = node_batch()
    model = TwoLayerGCN("propagate_first").to(DTYPE)
    maker = kfac(model, mask)
    run_steps(maker, model, x, graph, y, mask, steps=1)
    assert model.conv1.last_order == "transform_first"
    model(x, graph)
    assert model.conv1.last_order == "propagate_first"


def test_gat_cache_none_counts_the_recomputed_transform_once():
    """GATConv(cache="none") re-runs its transform inside backward (activation checkpointing);
    that call adds no curvature, so every cache gives the same preconditioned gradients."""
    graph = small_graph()
    x, y, mask = node_batch()
    results = []
    for cache in ("alpha", "none", "H"):
        torch.manual_seed(0)
        model = GATConv(12, 3, heads=2, concat=False, cache=cache).to(DTYPE)
        results.append(run_steps(kfac(model, mask), model, x, graph, y, mask))
    assert_same_grads(results[0], results[1])
    assert_same_grads(results[0], results[2])


@pytest.mark.parametrize("layer", ["gcn", "gat"])
def test_an_input_of_another_dtype_than_the_weights_is_watched(layer):
    """An input in another dtype than the weights (float64 features, a float32 model) went
    through F.linear, past the module's hooks: K-FAC built no curvature for the layer, kept
    its plain gradient, and blamed the loss path. The module is now called with its
    parameters cast, so its hooks (the maker's, a user's) see the call, and the preconditioned
    gradients are those of float32 features, to float32's precision."""
    graph = small_graph()
    x, y, mask = node_batch()

    def build():
        torch.manual_seed(0)
        return (TwoLayerGCN() if layer == "gcn" else GATConv(12, 3, heads=2)).to(torch.float32)
    seen = []
    model = build()
    model.get_submodule("conv1.lin" if layer == "gcn" else "lin").register_forward_hook(
        lambda module, args, output: seen.append(args[0].dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no module reported as missing its curvature
        got = run_steps(kfac(model, mask), model, x, graph, y, mask, steps=2)
    assert seen and set(seen) == {torch.float64}
    reference = build()
    expected = run_steps(kfac(reference, mask), reference, x.float(), graph, y, mask, steps=2)
    assert_same_grads(expected, got, rtol=1e-4)
    assert all(g.dtype == torch.float32 for step in got for g in step.values())


def test_fit_with_a_preconditioner():
    from pysparse_hpc.nn import train
    cora = sph.datasets.load("cora")
    x, y, *masks = train.node_tensors(cora)
    losses = {}
    for preconditioner in (None, "kfac", "shampoo", "jorge"):
        torch.manual_seed(0)
        model = models.GCN(x.shape[1], out_channels=cora.num_classes, hidden=16)
        interval = {} if preconditioner is None else dict(curvature_interval=2)
        result = train.fit(model, x, cora.adj, y, masks, epochs=3, progress=False,
                           preconditioner=preconditioner, **interval)
        assert np.isfinite(result.losses).all() and result.seconds_per_epoch > 0
        assert result.damping == (None if preconditioner is None
                                  else train.default_damping(preconditioner))
        losses[preconditioner] = result.losses
    assert losses[None][0] == losses["kfac"][0]          # the same model and first loss ...
    for name in ("kfac", "shampoo", "jorge"):            # ... then other updates
        assert losses[name][-1] != losses[None][-1], name
    model = models.GCN(x.shape[1], out_channels=cora.num_classes, hidden=16)
    with pytest.raises(ValueError, match="preconditioner must be None or one of"):
        train.fit(model, x, cora.adj, y, masks, epochs=1, preconditioner="lbfgs")
    with pytest.raises(ValueError, match="curvature_interval must be a positive int"):
        train.fit(model, x, cora.adj, y, masks, epochs=1, preconditioner="kfac",
                  curvature_interval=0)
    with pytest.raises(TypeError, match="curvature_interval must be an integer, got float"):
        train.fit(model, x, cora.adj, y, masks, epochs=1, preconditioner="kfac",
                  curvature_interval=2.0)


def test_fit_applies_kfac_by_sgd_as_a_hand_written_loop():
    """``fit(optimizer="sgd", preconditioner="kfac")`` is the ASDL loop feeding SGD with
    momentum 0.9, with K-FAC's SGD damping (0.03) unless ``damping`` says otherwise."""
    from pysparse_hpc.nn import train
    cora = sph.datasets.load("cora")
    x, y, *masks = train.node_tensors(cora)
    train_mask = masks[0]
    n_train = float(train_mask.sum())

    def summed(logits, labels, reduction="mean"):
        total = F.cross_entropy(logits, labels, reduction="sum")
        return total if reduction == "sum" else total / n_train

    def new_model():
        torch.manual_seed(0)
        return models.GCN(x.shape[1], out_channels=cora.num_classes, hidden=16)

    def by_hand(damping, epochs=4, kl_clip=None):
        model = new_model()
        optimizer = torch.optim.SGD(model.param_groups(5e-4), lr=0.3, momentum=0.9)
        config = P.PreconditioningConfig(data_size=int(n_train), damping=damping,
                                         curvature_upd_interval=2,
                                         preconditioner_upd_interval=2)
        clip = {} if kl_clip is None else dict(kl_clip=kl_clip, lr=0.3)
        maker = P.KfacGradientMaker(model, config, fisher_type="emp", **clip)
        losses = []
        for _ in range(epochs):
            model.train()
            optimizer.zero_grad()
            placeholder = maker.setup_model_call(model, x, cora.adj)
            maker.setup_loss_call(summed, placeholder[train_mask], y[train_mask])
            _, loss = maker.forward_and_backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    def by_fit(**options):
        options = dict(dict(optimizer="sgd", preconditioner="kfac"), **options)
        return train.fit(new_model(), x, cora.adj, y, masks, epochs=4, lr=0.3,
                         progress=False, curvature_interval=2, **options).losses

    assert train.SGD_DAMPINGS["kfac"] == 0.03
    assert by_fit() == by_hand(0.03)
    assert by_fit(damping=0.01) == by_hand(0.01) != by_hand(0.03)
    # KAISA's clip at SGD's rate: 1e-4 clips Cora's first steps (the losses differ)
    assert by_fit(kl_clip=1e-4) == by_hand(0.03, kl_clip=1e-4) != by_hand(0.03)
    with pytest.raises(ValueError, match="kl_clip applies to preconditioner='kfac'"):
        by_fit(kl_clip=1e-3, preconditioner="shampoo")
    with pytest.raises(ValueError, match="kl_clip applies to preconditioner='kfac'"):
        train.fit(new_model(), x, cora.adj, y, masks, epochs=1, progress=False, kl_clip=1e-3)


def test_fit_with_sgd_alone_is_torch_sgd_with_momentum():
    from pysparse_hpc.nn import train
    cora = sph.datasets.load("cora")
    x, y, *masks = train.node_tensors(cora)
    torch.manual_seed(0)
    model = models.GCN(x.shape[1], out_channels=cora.num_classes, hidden=16)
    fitted = train.fit(model, x, cora.adj, y, masks, epochs=3, lr=0.3, progress=False,
                       optimizer="sgd").losses
    torch.manual_seed(0)
    model = models.GCN(x.shape[1], out_channels=cora.num_classes, hidden=16)
    optimizer = torch.optim.SGD(model.param_groups(5e-4), lr=0.3, momentum=0.9)
    losses = []
    for _ in range(3):
        model.train()
        optimizer.zero_grad()
        logits = model(x, cora.adj)
        loss = F.cross_entropy(logits[masks[0]], y[masks[0]], reduction="sum") / float(
            masks[0].sum())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert fitted == losses


def test_train_command_with_a_preconditioner():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "pysparse_hpc", "train", "--optimizer", "kfac",
                           "--epochs", "3", "--curvature-interval", "2", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Adam on kfac preconditioned gradients" in done.stdout
    assert "ms per training epoch (mean)" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "pysparse_hpc", "train", "--optimizer", "kfac",
                          "--curvature-interval", "0"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "--curvature-interval must be at least 1" in bad.stderr


def test_train_default_settings_scale_adams_by_optimizer_and_preconditioner():
    from pysparse_hpc.distributed.training import default_settings
    adam = default_settings("gat")
    assert adam == models.GAT.training and adam is not models.GAT.training
    assert default_settings("gat", "sgd")["lr"] == pytest.approx(30 * adam["lr"])
    assert default_settings("gat", "sgd", "kfac")["lr"] == pytest.approx(30 * adam["lr"])
    assert default_settings("gat", "sgd", "shampoo")["lr"] == pytest.approx(10 * adam["lr"])
    assert default_settings("gat", "sgd", "shampoo")["weight_decay"] == adam["weight_decay"]
    lion = default_settings("gcn", "lion")
    assert lion["weight_decay"] == pytest.approx(200 * models.GCN.training["weight_decay"])
    assert default_settings("gcn", "adam", "shampoo") == models.GCN.training


def test_default_damping_by_preconditioner_and_optimizer():
    from pysparse_hpc.nn.train import default_damping
    assert default_damping("kfac") == 0.01 and default_damping("kfac", "sgd") == 0.03
    assert default_damping("shampoo", "sgd") == default_damping("shampoo") == 1e-3
    with pytest.raises(ValueError, match="preconditioner must be one of"):
        default_damping("lbfgs")


def test_train_command_applies_kfac_by_sgd():
    import subprocess
    import sys
    command = [sys.executable, "-m", "pysparse_hpc", "train", "--epochs", "2", "--no-progress"]
    done = subprocess.run(command + ["--optimizer", "kfac", "--base-optimizer", "sgd",
                                     "--damping", "0.05", "--kl-clip", "0.001"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert ("SGD (momentum 0.9) on kfac preconditioned gradients (damping 0.05, KL clip "
            "0.001), lr 0.3, weight decay 0.0005") in done.stdout
    for wrong, message in ((["--optimizer", "adam", "--base-optimizer", "sgd"],
                            "--base-optimizer and --damping need --optimizer kfac"),
                           (["--optimizer", "sgd", "--damping", "0.1"],
                            "--base-optimizer and --damping need --optimizer kfac"),
                           (["--optimizer", "kfac", "--damping", "0"],
                            "--damping must be a finite number > 0"),
                           (["--optimizer", "kfac", "--damping", "nan"],
                            "--damping must be a finite number > 0"),
                           (["--optimizer", "shampoo", "--kl-clip", "0.001"],
                            "--kl-clip needs --optimizer kfac"),
                           (["--optimizer", "kfac", "--kl-clip", "-1"],
                            "--kl-clip must be a finite number > 0")):
        bad = subprocess.run(command + wrong, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and message in bad.stderr, (wrong, bad.stderr)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_sparse_features_are_preconditioned_as_dense_ones(maker, layout):
    """Sparse features, which the GCN layer takes, reach the Linear inside it: K-FAC's factors
    failed on torch's reshape of them, the diagonal Fisher on their contiguity."""
    graph = small_graph()
    x, y, mask = node_batch()
    x = x * (x > 0.5)   # bag-of-words-like: mostly zeros
    sparse = x.to_sparse() if layout == "coo" else x.to_sparse_csr()
    config = P.PreconditioningConfig(data_size=int(mask.sum()), damping=1e-3)
    grads = []
    for features in (x, sparse):
        torch.manual_seed(0)
        model = GCNConv(12, 3).to(DTYPE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # torch's "CSR support is in beta"
            grads.append(run_steps(maker(model, config, fisher_type="emp"), model, features,
                                   graph, y, mask, steps=2))
    assert_same_grads(grads[0], grads[1])
