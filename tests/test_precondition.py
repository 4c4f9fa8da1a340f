"""pysparse_hpc.precondition: K-FAC against ASDL 0.1a5 (float64), plain references where ASDL is
broken (EMA on the CPU, nn.Embedding), placeholders, resume, bad input and non-finite values."""
import collections
import contextlib
import copy
import io
import types
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from pysparse_hpc import precondition as P  # noqa: E402
from pysparse_hpc.precondition.config import update_schedule  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import asdl
        import asdl.precondition.natural_gradient as asdl_ng
    except ImportError:  # the peer is optional: only the comparisons need it
        asdl = None

requires_asdl = pytest.mark.skipif(asdl is None, reason="ASDL (pip install asdfghjkl) missing")
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning")

RTOL = 1e-8
DTYPE = torch.float64


def mlp(seed=0, dtype=DTYPE):
    """20-16-8-3 with biases."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh(),
                         nn.Linear(8, 3)).to(dtype)


def cnn(seed=0, dtype=DTYPE):
    """Conv2d (stride 2, padding 1) + ReLU + flatten + Linear on 2x8x8 images."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 3)).to(dtype)


def wide_mlp(seed=0, dtype=DTYPE, hidden=16):
    """100-16-3: a batch of up to 33 rows gives its first input factor low rank."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(100, hidden), nn.ReLU(), nn.Linear(hidden, 3)).to(dtype)


MODELS = {"mlp": (mlp, (32, 20)), "cnn": (cnn, (32, 2, 8, 8))}


def batch(shape, classes=3, seed=1, dtype=DTYPE):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator, dtype=dtype)
    t = torch.randint(0, classes, (shape[0],), generator=generator)
    return x, t


def train(maker, model, x, t, steps, loss_fn=F.cross_entropy, lr=0.01, rng_seed=123,
          index=None, momentum=0.9):
    """Run `steps` SGD steps; the preconditioned gradients of every step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    grads = []
    torch.manual_seed(rng_seed)
    for _ in range(steps):
        opt.zero_grad()
        dy = maker.setup_model_call(model, x)
        if index is None:
            maker.setup_loss_call(loss_fn, dy, t)
        else:
            maker.setup_loss_call(loss_fn, dy[index], t[index])
        maker.forward_and_backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        opt.step()
    return grads


def assert_grads_close(expected, actual, rtol=RTOL):
    assert len(expected) == len(actual)
    for step, (e_step, a_step) in enumerate(zip(expected, actual)):
        for i, (e, a) in enumerate(zip(e_step, a_step)):
            err = ((e - a).norm() / e.norm()).item()
            assert err <= rtol, f"step {step}, parameter {i}: relative error {err:.2e}"


def asdl_maker(model, fisher, **config):
    return asdl.KfacGradientMaker(model, asdl.PreconditioningConfig(**config),
                                  fisher_type="fisher_" + fisher)


@pytest.fixture
def asdl_without_nvtx(monkeypatch):
    """ASDL with its NVTX ranges (CUDA-only) replaced by no-ops, so its EMA runs on the CPU."""
    stub = types.SimpleNamespace(range=lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(asdl_ng, "nvtx", stub)


# ---------------------------------------------------------------------- against ASDL
@requires_asdl
@pytest.mark.parametrize("schedule", [{}, {"curvature_upd_interval": 3}],
                         ids=["every-step", "curvature-every-3"])
@pytest.mark.parametrize("fisher", ["emp", "exact", "mc"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_matches_asdl(name, fisher, schedule):
    """Preconditioned gradients equal ASDL's over 6 SGD steps (float64, 1e-8 relative).

    MC too: the labels are drawn as ASDL draws them (``torch.multinomial`` on the normalised
    softmax, one sample per example), and both runs start from the same global RNG state.
    """
    make, shape = MODELS[name]
    x, t = batch(shape)
    config = dict(data_size=32, damping=1e-3, **schedule)
    expected = train(asdl_maker(model := make(), fisher, **config), model, x, t, 6)
    ours = P.KfacGradientMaker(model := make(), P.PreconditioningConfig(**config),
                               fisher_type=fisher)
    assert_grads_close(expected, train(ours, model, x, t, 6))


def bag_of_words(n=48, d=300, density=0.01, seed=2, dtype=DTYPE):
    """Nonnegative rows with about ``density`` nonzeros, like a graph's word features."""
    generator = torch.Generator().manual_seed(seed)
    keep = torch.rand(n, d, generator=generator) < density
    return torch.rand(n, d, generator=generator, dtype=dtype) * keep


@requires_asdl
@pytest.mark.parametrize("fisher", ["emp", "exact"])
def test_matches_asdl_on_sparse_inputs(fisher):
    """Inputs with 1 % nonzeros take the sparse input factor (`_gram`); still ASDL's."""
    from pysparse_hpc.precondition import _gram
    x = bag_of_words()
    assert int(torch.count_nonzero(x)) < _gram.SPARSE_DENSITY * x.numel()
    t = torch.randint(0, 3, (x.shape[0],), generator=torch.Generator().manual_seed(3))

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(300, 16), nn.ReLU(), nn.Linear(16, 3)).to(DTYPE)
    config = dict(data_size=x.shape[0], damping=1e-3)
    expected = train(asdl_maker(model := make(), fisher, **config), model, x, t, 4)
    ours = P.KfacGradientMaker(model := make(), P.PreconditioningConfig(**config),
                               fisher_type=fisher)
    assert_grads_close(expected, train(ours, model, x, t, 4))


@requires_asdl
@pytest.mark.parametrize("hidden", [16, 4])
@pytest.mark.parametrize("schedule", [{}, {"curvature_upd_interval": 3}],
                         ids=["every-step", "curvature-every-3"])
@pytest.mark.parametrize("fisher", ["emp", "exact", "mc"])
def test_matches_asdl_where_the_input_factor_has_low_rank(fisher, schedule, hidden):
    """24 rows into 100 inputs: the first input factor has rank 24 <= 100 / 3 and is
    inverted through its rows (Woodbury's identity), applied for one step or reused for
    three; the gradients are still ASDL's. Its 24 x 24 capacitance is held as an inverse
    where it meets at least 12 right-hand sides (16 outputs) or for several steps, else
    (4 outputs, every step) as its Cholesky factor."""
    x, t = batch((24, 100))
    config = dict(data_size=24, damping=1e-3, **schedule)
    expected = train(asdl_maker(model := wide_mlp(hidden=hidden), fisher, **config), model,
                     x, t, 6)
    ours = P.KfacGradientMaker(model := wide_mlp(hidden=hidden),
                               P.PreconditioningConfig(**config), fisher_type=fisher)
    assert_grads_close(expected, train(ours, model, x, t, 6))
    first, second = ours.factors("0"), ours.factors("2")
    held = "A_woodbury_chol" if hidden == 4 and not schedule else "A_woodbury_inv"
    assert first["A_rows"].shape == (24, 100) and first[held].shape == (24, 24)
    assert not {"A", "A_inv", "A_chol"} & set(first)  # the rows stand for A
    assert "A_rows" not in second and "A" in second  # 24 rows of `hidden` inputs: dense
    torch.testing.assert_close(first["A_rows"].T.mm(first["A_rows"]), x.T.mm(x) / 24,
                               rtol=1e-12, atol=1e-14)


def test_low_rank_rows_stack_over_calls_and_leave_with_a_larger_batch():
    """A module called twice in a pass stacks both calls' rows, which stand for its input
    factor; a pass with more rows than a third of the inputs goes back to the dense factor
    and inverse and drops the rows."""
    model = nn.Linear(60, 3).to(DTYPE)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=8, damping=1e-3),
                             fisher_type="emp")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 60, generator=generator, dtype=DTYPE)
    t = torch.randint(0, 3, (8,), generator=generator)

    def twice(module, inputs):
        return torch.cat([module(inputs), module(inputs * 2)])
    dy = gm.setup_model_call(twice, model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    with pytest.warns(UserWarning, match=r"'<model>' \(2 calls\) ran more than once in one "
                                         r"forward.*'expand'"):
        gm.forward_and_backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per module
        gm.forward_and_backward()
    rows = gm.factors("")["A_rows"]
    assert rows.shape == (8, 60) and "A" not in gm.factors("")
    torch.testing.assert_close(rows.T.mm(rows), 5 * x.T.mm(x) / 8, rtol=1e-12, atol=1e-14)
    wide = torch.randn(30, 60, generator=generator, dtype=DTYPE)
    dy = gm.setup_model_call(model, wide)
    gm.setup_loss_call(F.cross_entropy, dy, torch.randint(0, 3, (30,), generator=generator))
    gm.forward_and_backward()
    assert {"A_rows", "A_woodbury_chol", "A_woodbury_inv",
            "A_woodbury_damping"}.isdisjoint(gm.factors(""))
    assert {"A", "A_chol"} <= set(gm.factors(""))
    torch.testing.assert_close(gm.factors("")["A"], wide.T.mm(wide) / 8, rtol=1e-12,
                               atol=1e-14)


def test_load_state_dict_refuses_an_incomplete_low_rank_factor():
    """Rows without their capacitance, or a capacitance of another size than the rows:
    ValueError naming the module, and the maker keeps its own state."""
    x, t = batch((24, 100))
    config = P.PreconditioningConfig(data_size=24, damping=1e-3)
    gm = P.KfacGradientMaker(wide_mlp(), config, fisher_type="emp")
    train(gm, gm.model, x, t, 1)
    state = gm.state_dict()
    held = "A_woodbury_inv"
    assert held in state["factors"]["0"]
    other = P.KfacGradientMaker(wide_mlp(), config, fisher_type="emp")
    train(other, other.model, x, t, 2)
    before = {key: value.clone() for key, value in other.factors("0").items()}
    for damage in ("drop capacitance", "resize capacitance", "drop rows"):
        bad = copy.deepcopy(state)
        entry = bad["factors"]["0"]
        if damage == "drop capacitance":
            del entry[held]
        elif damage == "resize capacitance":
            entry[held] = torch.eye(5, dtype=DTYPE)
        else:
            del entry["A_rows"]
        with pytest.raises(ValueError, match="'0' hold an incomplete low-rank input factor"):
            other.load_state_dict(bad)
        assert all(torch.equal(other.factors("0")[k], v) for k, v in before.items())
        assert other.step == 2  # the state's step 1 is not taken either
    other.load_state_dict(state)
    assert set(other.factors("0")) == set(state["factors"]["0"])


def test_failed_inversion_after_rows_gave_way_keeps_the_plain_gradient(monkeypatch):
    """Rows, then a batch too wide for them whose damped factor fails to invert: a warning,
    and the module keeps its plain gradient (the rows' Woodbury inverse went with them)
    instead of failing; the next inversion restores the preconditioning."""
    from pysparse_hpc.precondition import kfac
    model = nn.Linear(60, 3).to(DTYPE)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=30, damping=1e-3),
                             fisher_type="emp")
    generator = torch.Generator().manual_seed(0)

    def step(rows):
        x = torch.randn(rows, 60, generator=generator, dtype=DTYPE)
        t = torch.randint(0, 3, (rows,), generator=generator)
        model.zero_grad()
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
        plain = torch.autograd.grad(F.cross_entropy(model(x), t), model.weight)[0]
        return model.weight.grad.clone(), plain

    step(8)
    assert "A_rows" in gm.factors("")
    working = kfac.damped_cholesky
    monkeypatch.setattr(kfac, "damped_cholesky", lambda matrix, damping: None)
    with pytest.warns(RuntimeWarning, match="not positive definite.*keeps the plain gradient"):
        preconditioned, plain = step(30)
    assert not [key for key in gm.factors("") if key.startswith(("A_rows", "A_woodbury"))]
    torch.testing.assert_close(preconditioned, plain, rtol=1e-12, atol=1e-14)
    monkeypatch.setattr(kfac, "damped_cholesky", working)
    preconditioned, plain = step(30)
    assert {"A", "A_chol"} <= set(gm.factors("")) and not torch.allclose(preconditioned, plain)


@pytest.mark.parametrize("rows", [8, 5], ids=["as-many-rows", "fewer-rows"])
def test_failed_inversion_keeps_the_woodbury_inverse_with_the_rows_it_was_built_from(
        monkeypatch, rows):
    """Rows, then new rows (as many, or fewer) whose damped factors fail to invert: the
    previous inverses are kept, as the warning says, and the Woodbury one applies with the
    rows it was built from (with the new rows it was a wrong, indefinite matrix, or a shape
    error); that state loads back, and the next inversion that succeeds drops the old rows."""
    from pysparse_hpc.precondition import kfac
    model = nn.Linear(60, 3).to(DTYPE)
    config = P.PreconditioningConfig(data_size=8, damping=1e-3)
    gm = P.KfacGradientMaker(model, config, fisher_type="emp")
    generator = torch.Generator().manual_seed(0)

    def step(count):
        x = torch.randn(count, 60, generator=generator, dtype=DTYPE)
        t = torch.randint(0, 3, (count,), generator=generator)
        model.zero_grad()
        gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
        gm.forward_and_backward()
        plain = torch.autograd.grad(F.cross_entropy(model(x), t, reduction="sum") / 8,
                                    [model.weight, model.bias])
        return [model.weight.grad.clone(), model.bias.grad.clone()], plain

    step(8)
    first = gm.factors("")
    A, B = first["A_rows"].T.mm(first["A_rows"]), first["B"]
    damping_a, damping_b = P.kfac.pi_damping(A, B, 1e-3)
    A_inv = torch.linalg.inv(A + damping_a * torch.eye(60, dtype=DTYPE))
    B_inv = torch.linalg.inv(B + damping_b * torch.eye(3, dtype=DTYPE))
    working = kfac.damped_cholesky
    monkeypatch.setattr(kfac, "damped_cholesky", lambda matrix, damping: None)
    with pytest.warns(RuntimeWarning, match="not positive definite.*the previous inverses "
                                            "are kept"):
        preconditioned, (weight, bias) = step(rows)
    expected = [B_inv.mm(weight).mm(A_inv), B_inv.mv(bias)]
    assert_grads_close([expected], [preconditioned], rtol=1e-9)
    factors = gm.factors("")
    assert factors["A_rows"].shape == (rows, 60)
    assert torch.equal(factors["A_woodbury_rows"], first["A_rows"])
    resumed = P.KfacGradientMaker(nn.Linear(60, 3).to(DTYPE), config, fisher_type="emp")
    resumed.load_state_dict(gm.state_dict())
    assert set(resumed.factors("")) == set(factors)
    monkeypatch.setattr(kfac, "damped_cholesky", working)
    step(rows)
    assert "A_woodbury_rows" not in gm.factors("") and "A_rows" in gm.factors("")


def test_failed_first_inversion_of_rows_says_it_keeps_the_plain_gradient(monkeypatch):
    """A first inversion that fails has no previous inverses to keep: the warning says the
    plain gradient stays (it said the previous inverses were kept), and the rows without an
    inverse load back (they were refused as incomplete)."""
    from pysparse_hpc.precondition import kfac
    model = nn.Linear(60, 3).to(DTYPE)
    config = P.PreconditioningConfig(data_size=8, damping=1e-3)
    gm = P.KfacGradientMaker(model, config, fisher_type="emp")
    x, t = batch((8, 60))
    monkeypatch.setattr(kfac, "damped_cholesky", lambda matrix, damping: None)
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
    with pytest.warns(RuntimeWarning, match="keeps the plain gradient until an inversion "
                                            "succeeds"):
        gm.forward_and_backward()
    plain = torch.autograd.grad(F.cross_entropy(model(x), t), model.weight)[0]
    torch.testing.assert_close(model.weight.grad, plain, rtol=1e-12, atol=1e-14)
    assert set(gm.factors("")) == {"A_rows", "B"}
    resumed = P.KfacGradientMaker(nn.Linear(60, 3).to(DTYPE), config, fisher_type="emp")
    resumed.load_state_dict(gm.state_dict())
    assert set(resumed.factors("")) == {"A_rows", "B"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("density", [0.0, 0.005, 0.02, 0.5])
@pytest.mark.parametrize("shape", [(40, 200), (1, 130), (7, 4), (30, 301)])
def test_gram_equals_dense_product(shape, density, dtype):
    """Sparse (few nonzeros, wide), blocked dense (wide) and plain dense paths all give
    x^T x; the sparse sum is exactly symmetric."""
    from pysparse_hpc.precondition._gram import gram
    x = bag_of_words(*shape, density=density, dtype=dtype) - 0.3 * bag_of_words(
        *shape, density=density, seed=4, dtype=dtype)   # negative values too
    expected = x.T.mm(x)
    result = gram(x)
    assert result.dtype == dtype and result.shape == expected.shape
    torch.testing.assert_close(result, expected, rtol=1e-5 if dtype == torch.float32 else 1e-12,
                               atol=1e-6 if dtype == torch.float32 else 1e-14)
    if shape[1] >= 128 and density <= 0.005:
        assert torch.equal(result, result.T)
    # A view with strides (a transposed matrix's rows) gives the same.
    torch.testing.assert_close(gram(x.T.contiguous().T), expected, rtol=1e-5, atol=1e-6)


@requires_asdl
@pytest.mark.parametrize("fisher", ["exact", "mc"])
def test_matches_asdl_mse(fisher):
    """The MSE likelihood (exact: one pass per output; MC: Gaussian targets, var 0.5)."""
    x, _ = batch((32, 20))
    target = torch.randn(32, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(5))
    config = dict(data_size=32, damping=1e-2)
    model = mlp()
    theirs = asdl.KfacGradientMaker(model, asdl.PreconditioningConfig(**config),
                                    fisher_type="fisher_" + fisher, loss_type="mse", var=0.5)
    expected = train(theirs, model, x, target, 4, loss_fn=F.mse_loss)
    model = mlp()
    ours = P.KfacGradientMaker(model, P.PreconditioningConfig(**config),
                               fisher_type="fisher_" + fisher, loss_type="mse", var=0.5)
    assert_grads_close(expected, train(ours, model, x, target, 4, loss_fn=F.mse_loss))


@requires_asdl
def test_masked_loss_matches_asdl():
    """``placeholder[mask]``: the indexing is replayed on the real output (a GNN's training
    nodes); data_size is the number of masked rows. ASDL replays it the same way for the
    empirical Fisher."""
    x, t = batch((30, 20), seed=3)
    mask = torch.zeros(30, dtype=torch.bool)
    mask[::3] = True
    mask[1] = True
    config = dict(data_size=int(mask.sum()), damping=1e-3, curvature_upd_interval=2)
    model = mlp()
    expected = train(asdl_maker(model, "emp", **config), model, x, t, 4, index=mask)
    model = mlp()
    ours = P.KfacGradientMaker(model, P.PreconditioningConfig(**config), fisher_type="emp")
    assert_grads_close(expected, train(ours, model, x, t, 4, index=mask))
    dy = ours.setup_model_call(model, x)
    ours.setup_loss_call(F.cross_entropy, dy[mask], t[mask])
    y, loss = ours.forward_and_backward()  # step 4: a curvature step (sum / data_size)
    assert torch.allclose(loss, F.cross_entropy(y[mask], t[mask]), rtol=1e-12)


@requires_asdl
@pytest.mark.skipif(torch.cuda.is_available(), reason="the crash is CPU-only")
def test_asdl_ema_crashes_on_cpu():
    """ASDL 0.1a5's K-FAC with any ema_decay raises on a CPU build of torch (its NVTX ranges
    need CUDA); ours runs. The two tests below check our EMA against ASDL with the NVTX stubbed
    out and against a plain reference."""
    model = mlp()
    x, t = batch((32, 20))
    gm = asdl_maker(model, "emp", data_size=32, damping=1e-3, ema_decay=0.1)
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    with pytest.raises(RuntimeError, match="NVTX"):
        gm.forward_and_backward()


@requires_asdl
@pytest.mark.parametrize("fisher", ["emp", "mc"])
def test_ema_matches_asdl_without_nvtx(asdl_without_nvtx, fisher):
    config = dict(data_size=32, damping=1e-3, ema_decay=0.3, curvature_upd_interval=2,
                  preconditioner_upd_interval=3)
    x, t = batch((32, 20))
    model = mlp()
    expected = train(asdl_maker(model, fisher, **config), model, x, t, 6)
    model = mlp()
    ours = P.KfacGradientMaker(model, P.PreconditioningConfig(**config), fisher_type=fisher)
    assert_grads_close(expected, train(ours, model, x, t, 6))


def reference_kfac_ema(model, x, t, steps, data_size, damping, ema, curv_every, inv_every,
                       lr=0.01):
    """Plain K-FAC with an EMA for an MLP of Linear + activation, written out: factors from
    retained pre-activation gradients of the summed loss, inverses by torch.linalg.inv."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    acts = [m for m in model if not isinstance(m, nn.Linear)]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    A = [None] * len(linears)
    B = [None] * len(linears)
    inverses = [None] * len(linears)
    grads = []
    for step in range(steps):
        opt.zero_grad()
        h, inputs, outs = x, [], []
        for i, lin in enumerate(linears):
            inputs.append(h)
            z = lin(h)
            z.retain_grad()
            outs.append(z)
            h = acts[i](z) if i < len(acts) else z
        loss = F.cross_entropy(h, t, reduction="sum") / data_size
        loss.backward()
        with torch.no_grad():
            if step % curv_every == 0:
                for i in range(len(linears)):
                    g = outs[i].grad * data_size
                    A_new = inputs[i].T @ inputs[i] / data_size
                    B_new = g.T @ g / data_size
                    A[i] = ema * A_new if A[i] is None else (1 - ema) * A[i] + ema * A_new
                    B[i] = ema * B_new if B[i] is None else (1 - ema) * B[i] + ema * B_new
            if step % inv_every == 0:
                for i in range(len(linears)):
                    pi = ((A[i].trace() / A[i].shape[0]) / (B[i].trace() / B[i].shape[0])).sqrt()
                    d_a, d_b = damping ** 0.5 * pi, damping ** 0.5 / pi
                    eye_a = torch.eye(A[i].shape[0], dtype=DTYPE)
                    eye_b = torch.eye(B[i].shape[0], dtype=DTYPE)
                    inverses[i] = (torch.linalg.inv(A[i] + d_a * eye_a),
                                   torch.linalg.inv(B[i] + d_b * eye_b))
            for lin, (A_inv, B_inv) in zip(linears, inverses):
                lin.weight.grad.copy_(B_inv @ lin.weight.grad @ A_inv)
                lin.bias.grad.copy_(B_inv @ lin.bias.grad)
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return grads


def test_ema_matches_plain_reference():
    x, t = batch((32, 20))
    expected = reference_kfac_ema(mlp(), x, t, 7, data_size=32, damping=1e-3, ema=0.25,
                                  curv_every=2, inv_every=3)
    config = P.PreconditioningConfig(data_size=32, damping=1e-3, ema_decay=0.25,
                                     curvature_upd_interval=2, preconditioner_upd_interval=3)
    model = mlp()
    ours = P.KfacGradientMaker(model, config, fisher_type="emp")
    assert_grads_close(expected, train(ours, model, x, t, 7))


@pytest.mark.parametrize("fisher", ["exact", "mc"])
def test_fisher_logits_are_the_masked_rows(fisher):
    """The MC and exact Fishers sample the rows the loss sees: with ``placeholder[mask]`` the
    B factors equal those of the masked rows run alone (ASDL samples every row of the
    output)."""
    x, t = batch((30, 20), seed=3)
    mask = torch.arange(30) % 3 == 0
    factors = []
    for inputs, index in ((x, mask), (x[mask], None)):
        model = mlp()
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=10, damping=1e-3),
                                 fisher_type=fisher, seed=0)
        train(gm, model, inputs, t if index is not None else t[mask], 1, index=index)
        factors.append([gm.factors(k)["B"] for k in ("0", "2", "4")])
    for full, alone in zip(*factors):
        assert torch.allclose(full, alone, rtol=1e-12, atol=1e-300)


def test_mc_samples_are_averaged():
    """Many MC samples approach the exact Fisher's B (ASDL would give 1/n_mc of it)."""
    torch.manual_seed(0)
    x, t = batch((16, 5))
    factors = {}
    for fisher, samples in (("exact", 1), ("mc", 400)):
        torch.manual_seed(2)   # the same model for both
        model = nn.Linear(5, 3).to(DTYPE)
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=16),
                                 fisher_type=fisher, n_mc_samples=samples, seed=1)
        train(gm, model, x, t, 1)
        factors[fisher] = gm.factors("")["B"]
    error = (factors["mc"] - factors["exact"]).norm() / factors["exact"].norm()
    assert error < 0.1


def test_module_off_the_loss_path_warns_and_keeps_plain_gradient():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(20, 3)
            self.unused = nn.Linear(20, 3)

        def forward(self, x):
            return self.used(x)

    model = Net().to(DTYPE)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32), fisher_type="emp")
    x, t = batch((32, 20))
    with pytest.warns(UserWarning, match=r"\['unused'\] saw no input"):
        train(gm, model, x, t, 1)
    assert gm.factors("unused") == {}
    # 20 inputs against 3 outputs: A applied by solves, B (3 x 3 against 20) as its inverse.
    assert set(gm.factors("used")) == {"A", "B", "A_chol", "B_inv"}


@pytest.mark.parametrize("maker", ["KfacGradientMaker", "DiagNaturalGradientMaker"])
@pytest.mark.parametrize("fisher", ["mc", "exact"])
def test_layers_frozen_after_the_maker_is_built(fisher, maker):
    """Gradual freezing: the extra passes of the MC and exact Fishers differentiate the
    weights that still train (a frozen one made torch.autograd.grad raise), and run not at
    all once every weight is frozen; a frozen layer gets no gradient, the others are still
    preconditioned."""
    model = mlp()
    gm = getattr(P, maker)(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
                           fisher_type=fisher)
    x, t = batch((32, 20))

    def step():
        model.zero_grad(set_to_none=True)
        gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
        gm.forward_and_backward()
        plain = torch.autograd.grad(F.cross_entropy(model(x), t),
                                    [p for p in model.parameters() if p.requires_grad])
        return [p.grad for p in model.parameters() if p.requires_grad], plain
    step()
    model[0].requires_grad_(False)
    with pytest.warns(UserWarning, match=r"\['0'\] saw no input or no output gradient") as caught:
        grads, plain = step()
    assert "use_reentrant" not in str(caught[0].message)  # frozen, not hidden
    assert model[0].weight.grad is None and model[0].bias.grad is None
    assert all(torch.isfinite(g).all() for g in grads)
    assert not torch.allclose(grads[-2], plain[-2])   # the last weight: preconditioned
    for layer in (model[2], model[4]):
        layer.weight.requires_grad_(False)
    grads, plain = step()   # the biases alone train
    assert len(grads) == 2 and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_a_step_with_gradients_off_names_the_cause(context):
    """Under no_grad or inference_mode torch's own error said only that "element 0 of tensors
    does not require grad"; the maker says why, and stays usable."""
    model = mlp()
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-3))
    x, t = batch((32, 20))
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
    message = r"gradients are off here \(torch.no_grad\(\) or"
    with context(), pytest.raises(RuntimeError, match=message):
        gm.forward_and_backward()
    assert gm.step == 0
    gm.forward_and_backward()
    assert gm.step == 1 and all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("fisher", ["mc", "exact"])
def test_a_bias_that_trains_beside_a_frozen_weight_keeps_fresh_factors(fisher):
    """A weight frozen after the maker was built, its bias still training: the extra passes
    of the MC and exact Fishers reach the module through its bias, as the empirical Fisher's
    backward does. They differentiated the weights alone, so the module's factors stayed
    those of the step before the freeze, and its bias was preconditioned with them for good,
    while a warning said it kept the plain gradient."""
    model = mlp()
    config = P.PreconditioningConfig(data_size=32, damping=1e-3)
    gm = P.KfacGradientMaker(model, config, fisher_type=fisher, seed=0)
    x, t = batch((32, 20))

    def step(maker, inputs):
        model.zero_grad(set_to_none=True)
        maker.setup_loss_call(F.cross_entropy, maker.setup_model_call(model, inputs), t)
        maker.forward_and_backward()
    step(gm, x)
    model[0].weight.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no module is reported as unreached
        step(gm, 3 * x)
    assert model[0].weight.grad is None and model[0].bias.grad is not None
    # The factors of the new batch: those a maker built now (weight trainable) computes
    # from it, with the same seed and so the same sampled labels.
    model[0].weight.requires_grad_(True)
    fresh = P.KfacGradientMaker(model, config, fisher_type=fisher, seed=0)
    fresh.state["step"] = 1   # the seed's stream at the same step
    step(fresh, 3 * x)
    torch.testing.assert_close(gm.factors("0")["B"], fresh.factors("0")["B"])


@pytest.mark.parametrize("fisher", ["mc", "exact"])
def test_a_reentrant_checkpoint_is_named_when_it_hides_a_module(fisher):
    """Activation checkpointing with use_reentrant=True hides its modules from the extra passes
    of the MC and exact Fishers (torch.autograd.grad does not run a reentrant checkpoint's
    backward): the warning says so. It named only "not called, or not on the loss's path",
    though the module had been called on it; the empirical Fisher sees it."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.head = torch.nn.Linear(20, 16), torch.nn.Linear(16, 10)

        def forward(self, x):
            hidden = checkpoint(lambda t: torch.relu(self.inner(t)), x, use_reentrant=True)
            return self.head(hidden)

    x, t = batch((32, 20))
    x.requires_grad_(True)  # a reentrant checkpoint differentiates nothing otherwise
    for fisher_type, hidden in ((fisher, True), ("emp", False)):
        model = Checkpointed().to(x.dtype)
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
                                 fisher_type=fisher_type)
        gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gm.forward_and_backward()
        messages = [str(w.message) for w in caught]
        if hidden:
            assert len(messages) == 1 and "['inner'] ran in the forward" in messages[0] \
                and "use_reentrant=True" in messages[0], messages
        else:
            assert messages == []


# ---------------------------------------------------------------------- diagonal Fisher
@requires_asdl
@pytest.mark.parametrize("fisher", ["emp", "exact", "mc"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_diag_matches_asdl(name, fisher):
    make, shape = MODELS[name]
    x, t = batch(shape)
    config = dict(data_size=32, damping=1e-3, curvature_upd_interval=2)
    model = make()
    theirs = asdl.DiagNaturalGradientMaker(model, asdl.PreconditioningConfig(**config),
                                           fisher_type="fisher_" + fisher)
    expected = train(theirs, model, x, t, 5)
    ours = P.DiagNaturalGradientMaker(model := make(), P.PreconditioningConfig(**config),
                                      fisher_type=fisher)
    assert_grads_close(expected, train(ours, model, x, t, 5))


@requires_asdl
def test_diag_ema_matches_asdl_without_nvtx(asdl_without_nvtx):
    config = dict(data_size=32, damping=1e-3, ema_decay=0.3, curvature_upd_interval=2,
                  preconditioner_upd_interval=3)
    x, t = batch((32, 2, 8, 8))
    model = cnn()
    theirs = asdl.DiagNaturalGradientMaker(model, asdl.PreconditioningConfig(**config),
                                           fisher_type="fisher_emp")
    expected = train(theirs, model, x, t, 6)
    ours = P.DiagNaturalGradientMaker(model := cnn(), P.PreconditioningConfig(**config),
                                      fisher_type="emp")
    assert_grads_close(expected, train(ours, model, x, t, 6))


def test_diag_conv_is_sum_of_squared_per_example_gradients():
    x, t = batch((6, 2, 8, 8))
    model = cnn()
    gm = P.DiagNaturalGradientMaker(model, P.PreconditioningConfig(data_size=6),
                                    fisher_type="emp")
    train(gm, model, x, t, 1)
    per_example = []
    for i in range(6):
        ref = cnn()
        F.cross_entropy(ref(x[i:i + 1]), t[i:i + 1], reduction="sum").backward()
        per_example.append([ref[0].weight.grad, ref[0].bias.grad])
    for j, key in enumerate(["weight", "bias"]):
        expected = torch.stack([g[j] for g in per_example]).square().sum(0) / 6
        assert torch.allclose(gm.factors("0")[key], expected, rtol=1e-12, atol=0)


# ---------------------------------------------------------------------- embedding
class EmbeddingNet(nn.Module):
    def __init__(self, vocab=7, dim=4, length=3, padding_idx=0):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, dim, padding_idx=padding_idx).to(DTYPE)
        self.out = nn.Linear(dim * length, 3).to(DTYPE)

    def forward(self, index):
        return self.out(self.emb(index).flatten(1))


def dense_pi_inverse(A, B, damping):
    pi = ((A.trace() / A.shape[0]) / (B.trace() / B.shape[0])).sqrt()
    return (torch.linalg.inv(A + damping ** 0.5 * pi * torch.eye(A.shape[0], dtype=DTYPE)),
            torch.linalg.inv(B + damping ** 0.5 / pi * torch.eye(B.shape[0], dtype=DTYPE)))


@pytest.mark.parametrize("length", [3, 1])
def test_embedding_factors_match_one_hot_reference(length):
    """A = C^T C / n for the per-example one-hot token counts C (padding column zeroed),
    B = D^T D / n for the gradients of the summed loss w.r.t. every token's embedding, and the
    preconditioned gradient A^-1 G B^-1, from a dense one-hot matmul model. ASDL 0.1a5 cannot
    be compared: without EMA it skips nn.Embedding and then fails ("has not been calculated"),
    with EMA it reshapes the V x d gradient as d x V."""
    n, vocab, dim, damping = 10, 7, 4, 1e-3
    generator = torch.Generator().manual_seed(7)
    index = torch.randint(0, vocab, (n, length), generator=generator)
    index[0, 0] = 0  # the padding token occurs
    t = torch.randint(0, 3, (n,), generator=generator)
    model = EmbeddingNet(vocab, dim, length)
    ref = copy.deepcopy(model)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=n, damping=damping),
                             fisher_type="emp")
    feed = index if length > 1 else index[:, 0]  # 1-D input: one token per example
    dy = gm.setup_model_call(model, feed)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    gm.forward_and_backward()

    one_hot = F.one_hot(index, vocab).to(DTYPE)  # n x L x V
    emb_out = one_hot @ ref.emb.weight  # the embedding as a dense matmul
    emb_out.retain_grad()
    loss = F.cross_entropy(ref.out(emb_out.flatten(1)), t, reduction="sum") / n
    loss.backward()
    counts = one_hot.sum(1)
    counts[:, 0] = 0  # padding_idx
    A = counts.T @ counts / n
    D = emb_out.grad.reshape(-1, dim) * n  # gradients of the summed loss
    B = D.T @ D / n
    factors = gm.factors("emb")
    assert torch.allclose(factors["A"], A, rtol=1e-12, atol=0)
    assert torch.allclose(factors["B"], B, rtol=1e-12, atol=1e-300)
    grad = ref.emb.weight.grad.clone()
    grad[0] = 0  # nn.Embedding never updates the padding row
    A_inv, B_inv = dense_pi_inverse(A, B, damping)
    expected = A_inv @ grad @ B_inv
    assert torch.allclose(model.emb.weight.grad, expected, rtol=1e-9, atol=1e-12)
    assert torch.all(model.emb.weight.grad[0] == 0)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")
@pytest.mark.parametrize("kernel", [3, 4])
def test_conv_padding_same_equals_explicit_padding(kernel):
    """padding="same" (which ASDL 0.1a5's im2col cannot take) gives the factors and gradients
    of the same convolution padded by hand; an even kernel pads one more on the right and
    bottom, as torch does."""
    x, t = batch((8, 2, 7, 7))
    left, right = (kernel - 1) // 2, kernel - 1 - (kernel - 1) // 2
    torch.manual_seed(0)
    same = nn.Sequential(nn.Conv2d(2, 3, kernel, padding="same"), nn.Flatten(),
                         nn.Linear(3 * 49, 3)).to(DTYPE)
    padded = nn.Sequential(nn.ZeroPad2d((left, right, left, right)), nn.Conv2d(2, 3, kernel),
                           nn.Flatten(), nn.Linear(3 * 49, 3)).to(DTYPE)
    padded.load_state_dict({f"{int(k[0]) + 1}{k[1:]}": v for k, v in same.state_dict().items()})
    results = []
    for model, conv in ((same, "0"), (padded, "1")):
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=8, damping=1e-3),
                                 fisher_type="emp")
        train(gm, model, x, t, 1)
        results.append((gm.factors(conv)["A"], model[int(conv)].weight.grad))
    assert torch.allclose(results[0][0], results[1][0], rtol=1e-12)
    assert torch.allclose(results[0][1], results[1][1], rtol=1e-10)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")
@pytest.mark.parametrize("kernel, stride, padding", [
    (3, 1, 1), (3, 2, 1), ((2, 3), (2, 1), (1, 0)), (4, 1, "same"), (3, 1, "valid"),
    (1, 3, 0),
])
def test_conv_patches_equal_unfold(kernel, stride, padding):
    """The strided im2col (per example, and as one matrix's columns) equals ``F.unfold`` of
    the padded input, for odd, even and rectangular kernels, strides and paddings, an
    unbatched input, a channels-last input and a view that starts inside its storage."""
    from pysparse_hpc.precondition._layers import conv2d_patch_columns, conv2d_patches

    conv = nn.Conv2d(3, 2, kernel, stride=stride, padding=padding).to(DTYPE)
    kh, kw = conv.kernel_size
    if padding == "same":
        pads = ((kw - 1) // 2, kw // 2, (kh - 1) // 2, kh // 2)
    elif padding == "valid":
        pads = (0, 0, 0, 0)
    else:
        ph, pw = conv.padding
        pads = (pw, pw, ph, ph)
    stored = torch.randn(6, 3, 9, 8, dtype=DTYPE)
    for x in (stored[1:5], stored[2], stored[:4].contiguous(memory_format=torch.channels_last)):
        batched = x if x.ndim == 4 else x.unsqueeze(0)
        expected = F.unfold(F.pad(batched, pads), conv.kernel_size, stride=conv.stride)
        patches = conv2d_patches(conv, x)
        assert torch.equal(patches, expected)
        columns, positions = conv2d_patch_columns(conv, x)
        assert positions == expected.shape[-1]
        assert torch.equal(columns, expected.permute(1, 0, 2).reshape(expected.shape[1], -1))
        # and the convolution's own output is the weight times the patches
        out = conv.weight.reshape(2, -1) @ patches + conv.bias[:, None]
        assert torch.allclose(out.reshape(conv(batched).shape), conv(batched), rtol=1e-12)


@pytest.mark.parametrize("density", [1.0, 0.5, 0.01])
def test_wide_conv_input_factor_is_the_patches_gram(density):
    """A Conv2d of 32 x 3 x 3 = 288 patch rows: its input factor is P P^T / L of the unfold
    patches through the blocked dense product (dense and ReLU-like inputs) and the sparse one
    (1 % nonzeros)."""
    from pysparse_hpc.precondition.kfac import _KINDS

    torch.manual_seed(0)
    conv = nn.Conv2d(32, 4, 3, padding=1).to(DTYPE)
    x = torch.randn(3, 32, 6, 5, dtype=DTYPE)
    x = x * (torch.rand(x.shape, dtype=DTYPE) < density)
    patches = F.unfold(x, 3, padding=1)  # n x 288 x L
    rows = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    expected = rows.T @ rows / patches.shape[-1]
    got = _KINDS["Conv2d"].input_factor(conv, x)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- placeholders
def test_placeholder_records_and_replays():
    y = torch.arange(12.0).reshape(4, 3)
    mask = torch.tensor([True, False, True, True])
    p = P.OutputPlaceholder()
    assert torch.equal(p[mask]._resolve(y), y[mask])
    assert torch.equal(p[mask][:, 1:]._resolve(y), y[mask][:, 1:])
    assert torch.equal(p.view(-1)._resolve(y), y.view(-1))
    assert torch.equal(p[0]._resolve((y, "aux")), y)
    assert "output[<bool tensor (4,)>]" in repr(p[mask])
    with pytest.raises(TypeError, match="iterated"):
        list(p)
    with pytest.raises(AttributeError):
        p._private  # noqa: B018
    copy.deepcopy(p[mask])


def test_tuple_output_and_loss_module():
    """A model returning a tuple (index 0 of the placeholder) and an nn.CrossEntropyLoss,
    whose reduction is forced to "sum" on curvature steps and restored."""
    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return self.net(x), x.sum()

    x, t = batch((32, 20))
    model, ref = TwoOutputs(), mlp()
    criterion = nn.CrossEntropyLoss()
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
                             fisher_type="emp")
    gm2 = P.KfacGradientMaker(ref, P.PreconditioningConfig(data_size=32, damping=1e-3),
                              fisher_type="emp")
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(criterion, dy[0], t)
    (y, _), loss = gm.forward_and_backward()
    assert criterion.reduction == "mean"
    dy = gm2.setup_model_call(ref, x)
    gm2.setup_loss_call(F.cross_entropy, dy, t)
    gm2.forward_and_backward()
    assert_grads_close([[p.grad for p in ref.parameters()]],
                       [[p.grad for p in model.parameters()]], rtol=1e-14)


def test_a_namedtuple_among_the_loss_arguments_is_rebuilt_field_by_field():
    """A namedtuple argument of the loss call goes through the placeholder replay as the
    same namedtuple (its constructor takes the fields, not one iterable: a TypeError
    before), and the gradients are those of the same loss with plain arguments."""
    Target = collections.namedtuple("Target", "labels weights")

    def weighted_ce(logits, target, reduction="mean"):
        losses = F.cross_entropy(logits, target.labels, reduction="none") * target.weights
        return losses.sum() if reduction == "sum" else losses.mean()

    x, t = batch((32, 20))
    config = P.PreconditioningConfig(data_size=32, damping=1e-3)
    grads = []
    for loss_fn, args in ((weighted_ce, (Target(t, torch.ones(32, dtype=DTYPE)),)),
                          (F.cross_entropy, (t,))):
        gm = P.KfacGradientMaker(model := mlp(), config, fisher_type="mc", seed=0)
        gm.setup_loss_call(loss_fn, gm.setup_model_call(model, x), *args)
        gm.forward_and_backward()
        grads.append([p.grad for p in model.parameters()])
    assert_grads_close([grads[1]], [grads[0]], rtol=1e-12)


# ---------------------------------------------------------------------- what is preconditioned
def test_unpreconditioned_parameters_keep_plain_gradient():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = nn.Linear(20, 16)
            self.bn = nn.BatchNorm1d(16)
            self.skip_me = nn.Linear(16, 16)
            self.frozen = nn.Linear(16, 8)
            self.frozen.weight.requires_grad_(False)
            self.head = nn.Linear(8, 3)
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x):
            h = self.skip_me(self.bn(self.fc1(x)).relu()).tanh()
            return self.head(self.frozen(h)) * self.scale

    model = Net().to(DTYPE)
    plain = copy.deepcopy(model)
    config = P.PreconditioningConfig(data_size=32, damping=1e-3, ignore_modules=["skip_"])
    gm = P.KfacGradientMaker(model, config, fisher_type="emp")
    assert list(gm.preconditioned_modules()) == ["fc1", "head"]
    reasons = gm.unpreconditioned_parameters()
    assert set(reasons) == {"bn.weight", "bn.bias", "skip_me.weight", "skip_me.bias",
                            "frozen.bias", "frozen.weight", "scale"}
    assert "normalization" in reasons["bn.weight"] and "ignore_modules" in reasons["skip_me.bias"]
    assert "frozen" in reasons["frozen.bias"] and "submodules" in reasons["scale"]
    # frozen when the maker was built: it was neither preconditioned nor listed, and trains on
    # the plain gradient once unfrozen
    assert "when the maker was built" in reasons["frozen.weight"]
    x, t = batch((32, 20))
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    gm.forward_and_backward()
    (F.cross_entropy(plain(x), t, reduction="sum") / 32).backward()
    plain_params = dict(plain.named_parameters())
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        same = torch.allclose(param.grad, plain_params[name].grad, rtol=1e-13, atol=0)
        assert same == (name in reasons), name

    by_class = P.KfacGradientMaker(cnn(), P.PreconditioningConfig(
        data_size=4, ignore_modules=[nn.Conv2d]), fisher_type="emp")
    assert list(by_class.preconditioned_modules()) == ["3"]
    model = mlp()
    by_instance = P.KfacGradientMaker(model, P.PreconditioningConfig(
        data_size=4, ignore_modules=[model[2]]), fisher_type="emp")
    assert list(by_instance.preconditioned_modules()) == ["0", "4"]


def test_bare_leaf_model():
    """A single nn.Linear as the model (ASDL 0.1a5 fails on it)."""
    model = nn.Linear(20, 3).to(DTYPE)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
                             fisher_type="emp")
    x, t = batch((32, 20))
    grads = train(gm, model, x, t, 2)
    assert list(gm.preconditioned_modules()) == [""]
    assert all(torch.isfinite(g).all() for step in grads for g in step)


@pytest.mark.parametrize("maker", ["KfacGradientMaker", "DiagNaturalGradientMaker"])
def test_a_module_with_an_empty_weight_keeps_the_plain_gradient(maker):
    """``nn.Linear(0, n)`` (a branch of width 0) has no curvature: it keeps the plain
    gradient, the rest is preconditioned (its factors failed to reshape)."""
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.main, self.empty = nn.Linear(20, 3), nn.Linear(0, 3)

        def forward(self, x):
            return self.main(x) + self.empty(x[:, :0])

    with warnings.catch_warnings():   # torch: "Initializing zero-element tensors is a no-op"
        warnings.simplefilter("ignore", UserWarning)
        model = Branches().to(DTYPE)
    gm = getattr(P, maker)(model, P.PreconditioningConfig(data_size=32, damping=1e-3))
    assert list(gm.preconditioned_modules()) == ["main"]
    reason = "the module's weight is empty"
    assert gm.unpreconditioned_parameters() == {"empty.weight": reason, "empty.bias": reason}
    x, t = batch((32, 20))
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
    gm.forward_and_backward()
    plain = torch.autograd.grad(F.cross_entropy(model(x), t), list(model.parameters()))
    assert torch.equal(model.empty.bias.grad, plain[3])
    assert torch.isfinite(model.main.weight.grad).all()
    assert not torch.allclose(model.main.weight.grad, plain[0])


@pytest.mark.parametrize("maker", ["KfacGradientMaker", "DiagNaturalGradientMaker"])
def test_a_frozen_unsupported_convolution_keeps_the_plain_gradient(maker):
    """A grouped Conv2d whose weight is frozen (its bias alone trains) keeps the plain
    gradient, as any module with a frozen weight, instead of being refused for its groups
    at construction; a trainable one is still refused."""
    cls = getattr(P, maker)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, groups=4), nn.Flatten(), nn.Linear(16, 3))
    model[0].weight.requires_grad_(False)
    gm = cls(model, P.PreconditioningConfig(data_size=4))
    assert list(gm.preconditioned_modules()) == ["2"]
    listed = gm.unpreconditioned_parameters()
    assert set(listed) == {"0.weight", "0.bias"}
    assert listed["0.bias"] == "the module's weight is frozen"
    with pytest.raises(NotImplementedError, match="module '0' has groups=4"):
        cls(model.requires_grad_(True), P.PreconditioningConfig(data_size=4))


@pytest.mark.parametrize("fisher_type", ["fisher_emp", "fisher_mc"])
def test_grad_scale_scales_what_kfac_preconditions(fisher_type):
    """ASDL's grad_scale multiplies each preconditioned module's gradient before its
    preconditioning (a loss scale to undo, say); the curvature is left as it is. A power of
    two scales every step of the product exactly, so the results are 2x to the bit."""
    data, target = torch.randn(8, 20, dtype=DTYPE), torch.randint(0, 3, (8,))
    grads = {}
    for scale in (1.0, 2.0):
        model = mlp()
        maker = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=8, damping=0.1),
                                    fisher_type=fisher_type, grad_scale=scale, seed=0)
        placeholder = maker.setup_model_call(model, data)
        maker.setup_loss_call(F.cross_entropy, placeholder, target)
        maker.forward_and_backward()
        grads[scale] = [param.grad.clone() for param in model.parameters()]
    for once, twice in zip(grads[1.0], grads[2.0]):
        assert torch.equal(twice, 2 * once)


# ---------------------------------------------------------------------- lifetime
@pytest.mark.parametrize("make", [
    lambda m: P.KfacGradientMaker(m, P.PreconditioningConfig(data_size=8, damping=0.1),
                                  fisher_type="fisher_emp"),
    lambda m: P.KfacGradientMaker(m, P.PreconditioningConfig(data_size=8, damping=0.1),
                                  fisher_type="fisher_mc"),
    lambda m: P.DiagNaturalGradientMaker(m, P.PreconditioningConfig(data_size=8, damping=0.1),
                                         fisher_type="fisher_emp"),
    lambda m: P.ShampooGradientMaker(m, P.PreconditioningConfig(data_size=8, damping=0.1))])
def test_a_dropped_maker_and_its_model_are_freed(make):
    """The output gradients' hooks held the maker, and the model's output (kept by the
    maker) held them through its graph, out of the collector's sight: a model ending in a
    preconditioned Linear was never freed, 5 MB a trial of a sweep over a 512-wide MLP."""
    import gc
    import weakref
    data, target = torch.randn(8, 20, dtype=DTYPE), torch.randint(0, 3, (8,))
    model = mlp()
    maker = make(model)
    for _ in range(2):
        placeholder = maker.setup_model_call(model, data)
        maker.setup_loss_call(F.cross_entropy, placeholder, target)
        output, loss = maker.forward_and_backward()
    dropped = [weakref.ref(model), weakref.ref(maker), weakref.ref(output)]
    del model, maker, placeholder, output, loss
    gc.collect()
    assert [ref() is None for ref in dropped] == [True] * 3


# ---------------------------------------------------------------------- resume
RESUME_SCHEDULES = {
    "ema": dict(ema_decay=0.3, curvature_upd_interval=2, preconditioner_upd_interval=3),
    "every-step": dict(curvature_warmup_steps=6, curvature_upd_interval=2),
}


RESUME_MODELS = {"cnn": (cnn, (32, 2, 8, 8)), "wide": (wide_mlp, (32, 100))}


@pytest.mark.parametrize("schedule", list(RESUME_SCHEDULES))
@pytest.mark.parametrize("maker", ["KfacGradientMaker", "DiagNaturalGradientMaker"])
@pytest.mark.parametrize("fisher", ["emp", "mc"])
@pytest.mark.parametrize("layout", ["as saved", "row-major"])
@pytest.mark.parametrize("model_name", list(RESUME_MODELS))
def test_state_dict_resume_bit_for_bit(fisher, maker, schedule, layout, model_name):
    """Run 8 steps; or run 5, save model, optimizer and maker, load them into fresh objects and
    run 3 more: the weights are equal bit for bit. MC too, with ``seed`` (ASDL's argument) to
    make the labels repeat. "every-step" resumes from a step whose inverses are Cholesky
    factors (the next step inverts again). "row-major": the saved tensors come back in
    row-major order whatever their strides were (what a checkpoint file or a broadcast
    gives), so an inverse kept column-major (LAPACK's order) would resume with another
    rounding. "wide": K-FAC inverts the first input factor through its rows (Woodbury)
    without a moving average."""
    config = P.PreconditioningConfig(data_size=32, damping=1e-3, **RESUME_SCHEDULES[schedule])
    make, shape = RESUME_MODELS[model_name]
    x, t = batch(shape)

    def fresh():
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        return model, opt, getattr(P, maker)(model, config, fisher_type=fisher, seed=11)

    def steps(model, opt, gm, count):
        for _ in range(count):
            opt.zero_grad()
            dy = gm.setup_model_call(model, x)
            gm.setup_loss_call(F.cross_entropy, dy, t)
            gm.forward_and_backward()
            opt.step()

    model, opt, gm = fresh()
    steps(model, opt, gm, 8)
    expected = [p.detach().clone() for p in model.parameters()]

    model, opt, gm = fresh()
    steps(model, opt, gm, 5)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gm": gm.state_dict()},
               buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    if layout == "row-major":  # as the Checkpointer and the KAISA broadcasts hand them back
        saved["gm"]["factors"] = {
            name: {key: tensor.contiguous() for key, tensor in entry.items()}
            for name, entry in saved["gm"]["factors"].items()}
    model, opt, gm = fresh()
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    gm.load_state_dict(saved["gm"])
    # Every step: an 18 x 18 input factor against 4 outputs is kept as its Cholesky factor,
    # the output factor (4 x 4 against 18 inputs; 16 x 16 against 100) as its inverse.
    inverses = "_chol" if schedule == "every-step" else "_inv"
    expected_keys = ({"A", "B", "A" + inverses, "B_inv"} if maker == "KfacGradientMaker"
                     else {"weight", "bias", "weight_inv", "bias_inv"})
    if maker == "KfacGradientMaker" and model_name == "wide" and schedule != "ema":
        expected_keys = {"B", "A_rows", "A_woodbury_inv", "A_woodbury_damping", "B_inv"}
    assert gm.step == 5 and set(gm.factors("0")) == expected_keys
    steps(model, opt, gm, 3)
    for e, p in zip(expected, model.parameters()):
        assert torch.equal(e, p.detach())


def test_low_rank_rows_of_a_transposed_input_resume_bit_for_bit_from_row_major_tensors():
    """A Linear fed a transposed (column-major) batch keeps its input factor as rows; the
    curvature is refreshed every 4 steps, so the steps after the save apply the saved rows.
    Handed back row-major (as a checkpoint or a broadcast gives them), they resume bit for
    bit: the rows are stored row-major, not with the strides of the input."""
    x = torch.randn(100, 32, dtype=DTYPE, generator=torch.Generator().manual_seed(4)).T
    t = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(5))
    config = P.PreconditioningConfig(data_size=32, damping=1e-3, curvature_upd_interval=4)

    def fresh():
        model = wide_mlp()
        return model, P.KfacGradientMaker(model, config, fisher_type="emp")

    def steps(model, gm, count):  # plain SGD: no optimizer state to carry over
        train(gm, model, x, t, count, momentum=0.0)

    model, gm = fresh()
    steps(model, gm, 4)
    expected = [p.detach().clone() for p in model.parameters()]
    model, gm = fresh()
    steps(model, gm, 1)
    saved = gm.state_dict()
    assert "A_rows" in saved["factors"]["0"]
    saved["factors"] = {name: {key: tensor.contiguous() for key, tensor in entry.items()}
                        for name, entry in saved["factors"].items()}
    weights = copy.deepcopy(model.state_dict())
    model, gm = fresh()
    model.load_state_dict(weights)
    gm.load_state_dict(saved)
    steps(model, gm, 3)
    for e, p in zip(expected, model.parameters()):
        assert torch.equal(e, p.detach())


def test_load_state_dict_checks():
    gm = P.KfacGradientMaker(mlp(), P.PreconditioningConfig(data_size=32), fisher_type="emp")
    x, t = batch((32, 20))
    train(gm, gm.model, x, t, 1)
    state = gm.state_dict()
    other = P.KfacGradientMaker(mlp(), P.PreconditioningConfig(data_size=32),
                                fisher_type="emp")
    with pytest.warns(UserWarning, match="only the step"):
        other.load_state_dict({"step": 3})  # ASDL's state_dict
    assert other.step == 3
    bad = copy.deepcopy(state)
    bad["factors"]["0"]["A"] = torch.eye(5, dtype=DTYPE)
    with pytest.raises(ValueError, match=r"shape \(5, 5\), expected \(20, 20\)"):
        other.load_state_dict(bad)
    bad = copy.deepcopy(state)
    del bad["factors"]["2"]
    with pytest.raises(ValueError, match=r"holds the modules \['0', '4'\], this maker the "
                                         r"modules \['0', '2', '4'\]"):
        other.load_state_dict(bad)
    with pytest.raises(ValueError, match="fisher_type"):
        other.load_state_dict({**state, "fisher_type": "fisher_mc"})
    with pytest.raises(ValueError, match="'step'"):
        other.load_state_dict({})
    with pytest.raises(ValueError, match="rank 1's part of a run on 2 ranks.*consolidated"):
        other.load_state_dict({**state, "shard": [1, 2]})
    # in one process the consolidated state is the state, and no rank's part
    assert "shard" not in state
    assert gm.consolidated_state_dict().keys() == state.keys()


# ---------------------------------------------------------------------- bad input
def test_communicator_checked():
    MPI = pytest.importorskip("mpi4py.MPI")
    config = P.PreconditioningConfig(data_size=8)
    with pytest.raises(TypeError, match=r"mpi4py communicator.*Communicator\(comm\)"):
        P.KfacGradientMaker(mlp(), config, comm=MPI.COMM_WORLD)
    with pytest.raises(TypeError, match="must be a pysparse_hpc.distributed.Communicator"):
        P.ShampooGradientMaker(mlp(), config, comm="world")


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.ShampooGradientMaker,
                                   P.JorgeGradientMaker, P.DiagNaturalGradientMaker])
def test_a_maker_without_comm_on_a_job_of_several_ranks_says_it_keeps_to_one(monkeypatch, maker):
    """DataParallel and DistributedLion take the whole job for comm=None, a maker one
    process: a forgotten comm= left each replica's curvature its own, and the replicas
    parted without a word. A one-rank communicator asks for that and is not warned of."""
    from pysparse_hpc.distributed import Communicator, _comm
    config = P.PreconditioningConfig(data_size=8)
    for name in _comm._SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        maker(mlp(), config)        # launched alone: nothing to say
        monkeypatch.setenv("PMI_SIZE", "3")
        maker(mlp(), config, comm=Communicator())
    with pytest.warns(UserWarning, match=rf"{maker.__name__} was made without comm= on a job "
                                         r"of 3 ranks: .* Pass comm=distributed.init\(\)") as told:
        maker(mlp(), config)
    assert told[0].filename == __file__


@pytest.mark.parametrize("option, error, message", [
    (dict(loss_type="hinge"), ValueError, "loss_type must be one of"),
    (dict(n_mc_samples=2.0), TypeError, "n_mc_samples must be an int, got float"),
    (dict(n_mc_samples=0), ValueError, "n_mc_samples must be >= 1, got 0"),
    (dict(seed="1"), TypeError, "seed must be an int or None, got str"),
    (dict(seed=2 ** 64), ValueError, r"seed must be in \[-2\*\*63, 2\*\*64\)"),
    (dict(strategy="owners"), ValueError, "strategy must be one of"),
])
def test_the_natural_makers_name_a_bad_option(option, error, message):
    config = P.PreconditioningConfig(data_size=8, damping=1e-3)
    for maker in (P.KfacGradientMaker, P.DiagNaturalGradientMaker):
        with pytest.raises(error, match=message):
            maker(mlp(), config, **option)


def test_bad_input():
    config = P.PreconditioningConfig(data_size=8, damping=1e-3)
    with pytest.raises(ValueError, match="nothing to precondition.*expected at least one"):
        P.KfacGradientMaker(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(3)), config)
    with pytest.raises(ValueError, match="found no trainable|no trainable parameter"):
        P.KfacGradientMaker(nn.Linear(3, 3).requires_grad_(False), config)
    with pytest.raises(ValueError, match="data_size.*found -1"):
        P.KfacGradientMaker(mlp(), P.PreconditioningConfig(damping=1e-3))
    for damping in (0.0, -1e-3, float("nan")):
        with pytest.raises(ValueError, match="damping must be a finite number > 0"):
            P.PreconditioningConfig(data_size=8, damping=damping)
    with pytest.raises(TypeError, match="damping must be a float"):
        P.PreconditioningConfig(data_size=8, damping="1e-3")
    with pytest.raises(ValueError, match="curvature_upd_interval must be >= 1, got 0"):
        P.PreconditioningConfig(data_size=8, curvature_upd_interval=0)
    with pytest.raises(ValueError, match="ema_decay"):
        P.PreconditioningConfig(data_size=8, ema_decay=0.0)
    with pytest.raises(NotImplementedError, match="ASDL 0.1a5 accepts it but always"):
        P.PreconditioningConfig(data_size=8, preconditioner_interval_type="linear")
    # Not a field of ASDL's: its message must not say that ASDL accepts it.
    with pytest.raises(NotImplementedError, match="a class attribute, not a field, and always"):
        P.PreconditioningConfig(data_size=8, curvature_interval_type="step")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        P.KfacGradientMaker("model", config)
    with pytest.raises(TypeError, match="PreconditioningConfig"):
        P.KfacGradientMaker(mlp(), {"data_size": 8})
    with pytest.raises(ValueError, match="fisher_type must be one of"):
        P.KfacGradientMaker(mlp(), config, fisher_type="fisher_kfe")
    with pytest.raises(NotImplementedError, match="swift"):
        P.KfacGradientMaker(mlp(), config, swift=True)
    # torch.manual_seed's range: out of it torch raised its own ValueError at the first step
    for seed in (2**64, -2**63 - 1):
        with pytest.raises(ValueError, match=r"seed must be in \[-2\*\*63, 2\*\*64\)"):
            P.KfacGradientMaker(mlp(), config, seed=seed)
    dilated = nn.Sequential(nn.Conv2d(2, 3, 3, dilation=2), nn.Flatten())
    with pytest.raises(NotImplementedError, match=r"dilation=\(2, 2\).*ignore_modules"):
        P.KfacGradientMaker(dilated, config)
    with pytest.raises(NotImplementedError, match="groups=2"):
        P.KfacGradientMaker(nn.Conv2d(2, 4, 3, groups=2), config)
    ignored = P.PreconditioningConfig(data_size=8, ignore_modules=[nn.Conv2d])
    with pytest.raises(ValueError, match="nothing to precondition"):
        P.KfacGradientMaker(dilated, ignored)  # ignored, so not refused, but then empty

    gm = P.KfacGradientMaker(mlp(), config, fisher_type="emp")
    with pytest.raises(RuntimeError, match="setup_model_call"):
        gm.forward_and_backward()
    dy = gm.setup_model_call(gm.model, torch.randn(8, 20, dtype=DTYPE))
    with pytest.raises(TypeError, match="reduction=.*found <lambda> without a reduction"):
        gm.setup_loss_call(lambda y, t: ((y - t) ** 2).mean(), dy, torch.zeros(8, 3))

    class NoReduction(nn.Module):
        def forward(self, y, t):
            return ((y - t) ** 2).sum()

    with pytest.raises(TypeError, match="NoReduction without a .reduction"):
        gm.setup_loss_call(NoReduction(), dy, torch.zeros(8, 3))
    with pytest.raises(ValueError, match="no placeholder"):
        gm.setup_loss_call(F.cross_entropy, torch.zeros(8, 3), torch.zeros(8).long())


def test_unsupported_module_warns_and_is_listed():
    model = nn.Sequential(nn.Linear(4, 6), nn.Conv1d(1, 1, 1), nn.Flatten())
    with pytest.warns(UserWarning, match=r"1 \(Conv1d\)"):
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=2))
    assert "Conv1d is not supported" in gm.unpreconditioned_parameters()["1.weight"]

    tied = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Linear(4, 2))
    tied[2].weight = tied[0].weight
    with pytest.warns(UserWarning, match="shares a parameter"):
        gm = P.KfacGradientMaker(tied, P.PreconditioningConfig(data_size=2))
    assert list(gm.preconditioned_modules()) == ["3"]
    assert "tied to a parameter of 2" in gm.unpreconditioned_parameters()["0.weight"]


# ---------------------------------------------------------------------- non-finite values
@pytest.mark.parametrize("model_name", ["mlp", "wide"])
def test_nan_input_skips_step_without_writing_nan(model_name):
    """A NaN in a module's input: the curvature is not updated, a RuntimeWarning, every
    gradient zeroed (the NaN gradient never reaches the optimizer), the weights stay finite and
    training continues once the input is clean. "wide": the first input factor is held as
    its rows (low rank)."""
    model, shape = (mlp(), (32, 20)) if model_name == "mlp" else (wide_mlp(), (32, 100))
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
                             fisher_type="emp")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, t = batch(shape)
    bad = x.clone()
    bad[3, 5] = float("nan")
    for step, inputs in enumerate([x, bad, x]):
        before = {k: copy.copy(gm.factors(k)) for k in gm.preconditioned_modules()}
        weights = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        dy = gm.setup_model_call(model, inputs)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        if step == 1:
            with pytest.warns(RuntimeWarning, match="step 1: non-finite gradient"):
                gm.forward_and_backward()
            assert gm.last_step_skipped
            for k, saved in before.items():
                assert all(gm.factors(k)[key] is saved[key] for key in saved)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                gm.forward_and_backward()
            assert not gm.last_step_skipped
        opt.step()
        for p, w in zip(model.parameters(), weights):
            assert torch.isfinite(p.grad).all() and torch.isfinite(p).all()
            assert torch.equal(p, w) == (step == 1)
    assert gm.step == 3
    assert ("A_rows" in gm.factors("0")) == (model_name == "wide")


@pytest.mark.parametrize("fisher_type", ["fisher_emp", "fisher_mc", "fisher_exact"])
@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_nan_output_skips_the_step_with_every_fisher(maker, fisher_type):
    """The MC Fisher samples labels from the output: a NaN there must skip the step as the
    other Fishers do, not stop the sampler."""
    model = mlp()
    gm = maker(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
               fisher_type=fisher_type)
    x, t = batch((32, 20))
    x[3, 5] = float("nan")
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm.forward_and_backward()
    assert gm.last_step_skipped
    assert any("non-finite gradient" in str(w.message) for w in caught)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_overflowing_preconditioned_gradient_leaves_the_gradient(maker):
    """A finite gradient far larger than the stale curvature (tiny inputs at the curvature
    step, huge ones after): the preconditioned gradient overflows in float32, a
    RuntimeWarning, and the gradient stays as the backward left it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    gm = maker(model, P.PreconditioningConfig(data_size=8, damping=1e-14,
                                              curvature_upd_interval=100),
               fisher_type="fisher_emp")
    t = torch.randint(0, 3, (8,))
    for step, scale in enumerate((1e-4, 1e33)):
        model.zero_grad()
        x = torch.randn(8, 4) * scale
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        if step == 0:
            gm.forward_and_backward()
            continue
        expected = torch.autograd.grad(F.cross_entropy(model(x), t), model[0].weight)[0]
        with pytest.warns(RuntimeWarning, match="step 1: non-finite preconditioned gradient "
                                                "in module '0'; the gradient is left"):
            gm.forward_and_backward()
    assert not gm.last_step_skipped
    assert torch.isfinite(model[0].weight.grad).all()
    torch.testing.assert_close(model[0].weight.grad, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kfac_on_a_half_precision_model_keeps_float32_factors(dtype):
    """Cholesky has no float16 or bfloat16 kernels: the factors and inverses are float32, the
    preconditioned gradient is rounded back to the weights' dtype and is that of the same
    (rounded) weights and inputs in float32 up to the half-precision arithmetic."""
    def preconditioned(compute):
        model = mlp(dtype=torch.float32).to(dtype).to(compute)
        x, t = batch((32, 20), dtype=torch.float32)
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
                                 fisher_type="emp")
        dy = gm.setup_model_call(model, x.to(dtype).to(compute))
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
        return gm, [p.grad for p in model.parameters()]

    reference = preconditioned(torch.float32)[1]
    gm, grads = preconditioned(dtype)
    assert {v.dtype for k in gm.preconditioned_modules() for v in gm.factors(k).values()} \
        == {torch.float32}
    tolerance = 0.05 if dtype == torch.bfloat16 else 0.01  # 8 and 11 significant bits
    for got, expected in zip(grads, reference):
        assert got.dtype == dtype and torch.isfinite(got).all()
        assert float((got.float() - expected).norm() / expected.norm()) < tolerance


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_state_resumes_and_embeddings_count_in_float32(dtype):
    """A half-precision model's K-FAC state (float32 factors, a moving average) loads back in
    float32 and the resumed maker continues as the uninterrupted one to the bit; a
    half-precision Embedding's token counts are float32 too (Cholesky has no half kernels)."""
    def model_and_maker():
        model = mlp(dtype=torch.float32).to(dtype)
        config = P.PreconditioningConfig(data_size=32, damping=1e-2, ema_decay=0.1)
        return model, P.KfacGradientMaker(model, config, fisher_type="emp")

    x, t = batch((32, 20), dtype=torch.float32)
    x = x.to(dtype)

    def step(gm, model):
        model.zero_grad()
        gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
        gm.forward_and_backward()
        return [p.grad.clone() for p in model.parameters()]
    model, gm = model_and_maker()
    step(gm, model)
    resumed_model, resumed = model_and_maker()
    resumed_model.load_state_dict(model.state_dict())
    resumed.load_state_dict(copy.deepcopy(gm.state_dict()))
    assert {v.dtype for k in resumed.preconditioned_modules()
            for v in resumed.factors(k).values()} == {torch.float32}
    for expected, got in zip(step(gm, model), step(resumed, resumed_model)):
        assert torch.equal(expected, got)

    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(20, 8), nn.Linear(8, 3)

        def forward(self, tokens):
            return self.head(self.embed(tokens).mean(1))
    torch.manual_seed(0)
    bag = Bag().to(dtype)
    gm = P.KfacGradientMaker(bag, P.PreconditioningConfig(data_size=16, damping=1e-2),
                             fisher_type="emp")
    tokens = torch.randint(0, 20, (16, 5), generator=torch.Generator().manual_seed(3))
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(bag, tokens), t[:16])
    gm.forward_and_backward()
    assert gm.factors("embed")["A"].dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in bag.parameters())


def test_a_moving_average_switched_on_averages_the_factor_held_as_rows():
    """Without a moving average a thin input factor is kept as its rows; switching
    ``ema_decay`` on (or loading such a state into a maker with one) averages the new factor
    with the whole old one: the same batch twice gives the same A (it gave half of it)."""
    model = mlp(dtype=torch.float32)
    x, t = batch((4, 20), dtype=torch.float32)   # 4 rows of 21 inputs: kept as rows
    config = P.PreconditioningConfig(data_size=4, damping=1e-2)
    gm = P.KfacGradientMaker(model, config, fisher_type="emp")
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
    gm.forward_and_backward()
    assert "A_rows" in gm.factors("0")
    rows = gm.factors("0")["A_rows"]
    config.ema_decay = 0.5
    model.zero_grad()
    gm.forward_and_backward()
    factors = gm.factors("0")
    assert "A_rows" not in factors
    torch.testing.assert_close(factors["A"], rows.T @ rows)


def test_diag_fisher_of_a_float16_model_keeps_float32_diagonals():
    """At the default damping (1e-7) 1 / (0 + damping) overflows float16: the diagonals are
    float32, and the step is preconditioned without a warning (it fell back to the plain
    gradient), close to the same rounded weights and inputs in float32."""
    def preconditioned(dtype):
        model = mlp(dtype=torch.float32).to(torch.float16).to(dtype)
        x, t = batch((64, 20), dtype=torch.float32)
        gm = P.DiagNaturalGradientMaker(model, P.PreconditioningConfig(data_size=64),
                                        fisher_type="emp")
        gm.setup_loss_call(F.cross_entropy,
                           gm.setup_model_call(model, x.to(torch.float16).to(dtype)), t)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gm.forward_and_backward()
        return gm, [p.grad for p in model.parameters()]
    reference = preconditioned(torch.float32)[1]
    gm, grads = preconditioned(torch.float16)
    assert {v.dtype for k in gm.preconditioned_modules() for v in gm.factors(k).values()} \
        == {torch.float32}
    for got, expected in zip(grads, reference):
        # float16 holds magnitudes up to 65504: beyond, the float32 result itself is that big
        finite = torch.isfinite(got)
        assert got.dtype == torch.float16 and bool((finite | (expected.abs() > 6e4)).all())
        error = (got[finite].float() - expected[finite]).norm() / expected[finite].norm()
        assert float(error) < 0.05


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_diag_fisher_of_a_half_precision_embedding_sums_in_float32(dtype):
    """A half-precision nn.Embedding's squared token gradients are added into a float32 table
    (index_add_ refused to mix them with a table in the weight's dtype), close to the float32
    computation on the same rounded weights; the padding row stays zero."""
    def diagonal(model_dtype):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(20, 6, padding_idx=0), nn.Flatten(),
                              nn.Linear(18, 3)).to(dtype).to(model_dtype)
        tokens = torch.randint(0, 20, (8, 3), generator=torch.Generator().manual_seed(1))
        gm = P.DiagNaturalGradientMaker(model, P.PreconditioningConfig(data_size=8,
                                                                       damping=1e-2),
                                        fisher_type="emp")
        gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, tokens),
                           torch.arange(8) % 3)
        gm.forward_and_backward()
        assert torch.isfinite(model[0].weight.grad).all()
        return gm.factors("0")["weight"]
    got = diagonal(dtype)
    assert got.dtype == torch.float32 and not got[0].any()
    torch.testing.assert_close(got, diagonal(torch.float32), rtol=0.1, atol=1e-6)


def test_kl_clip_takes_a_tensor_learning_rate():
    """torch optimizers take a 0-d tensor as lr, and a param group then returns it: kl_clip
    reads it as its value."""
    model = mlp(dtype=torch.float32)
    x, t = batch((16, 20), dtype=torch.float32)
    clipped = {}
    for name, lr in (("float", lambda: 0.1),
                     ("tensor", lambda: torch.tensor(0.1, dtype=torch.float64))):
        model.load_state_dict(mlp(dtype=torch.float32).state_dict())
        model.zero_grad()
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=16, damping=1e-2),
                                 fisher_type="emp", kl_clip=1e-3, lr=lr)
        gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
        gm.forward_and_backward()
        clipped[name] = gm.last_kl_clip_scale
    assert clipped["tensor"] == clipped["float"] < 1.0


def test_non_finite_curvature_keeps_previous_inverses():
    """An input so large that X^T X overflows in float32 while the gradients stay finite: the
    new factors are refused (RuntimeWarning), the previous inverses precondition the step."""
    model = mlp(dtype=torch.float32)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-3),
                             fisher_type="emp")
    x, t = batch((32, 20), dtype=torch.float32)
    train(gm, model, x, t, 1)
    previous = gm.factors("0")
    huge = x.clone()
    huge[0, 0] = 1e25
    model.zero_grad()
    dy = gm.setup_model_call(model, huge)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm.forward_and_backward()
    messages = sorted(str(w.message) for w in caught if w.category is RuntimeWarning)
    assert len(messages) == 2  # the two ReLU-fed layers; the Tanh-fed head stays finite
    assert "non-finite curvature (A) in module '0'" in messages[0]
    assert "module '2'" in messages[1]
    assert not gm.last_step_skipped
    # The next step inverts again, but 20 inputs against 16 outputs meet more right-hand
    # sides than half their size: inverses, not Cholesky factors.
    assert set(previous) == {"A", "B", "A_inv", "B_inv"}
    assert all(gm.factors("0")[key] is value for key, value in previous.items())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# ---------------------------------------------------------------------- schedules
def test_schedules():
    gm = P.KfacGradientMaker(mlp(), P.PreconditioningConfig(
        data_size=4, curvature_upd_interval=3, curvature_warmup_steps=2,
        preconditioner_upd_interval=2), fisher_type="emp")
    assert [gm.do_update_curvature(k) for k in range(9)] == [
        True, True, True, False, False, True, False, False, True]
    assert [gm.do_update_preconditioner(k) for k in range(5)] == [True, False, True, False, True]
    follows = P.KfacGradientMaker(mlp(), P.PreconditioningConfig(
        data_size=4, preconditioner_upd_interval=4), fisher_type="emp")
    assert [follows.do_update_curvature(k) for k in range(5)] == [True, False, False, False, True]
    if asdl is not None:
        for total, ratio, warmup in [(10, 0.3, 0.1), (100, 0.1, 0.0), (7, 1.0, 0.5), (9, 0.0, 0)]:
            assert update_schedule(total, ratio, warmup) == asdl.get_update_schedule(
                total, ratio, warmup)
    by_ratio = P.KfacGradientMaker(mlp(), P.PreconditioningConfig(
        data_size=4, num_total_steps=10, preconditioner_upd_ratio=0.3,
        preconditioner_warmup_ratio=0.1), fisher_type="emp")
    expected = update_schedule(10, 0.3, 0.1)
    assert [by_ratio.do_update_preconditioner(k) for k in range(10)] == expected
    with pytest.warns(RuntimeWarning, match="past num_total_steps") as told:
        assert not any(by_ratio.do_update_preconditioner(k) for k in range(10, 40))
    # once, not every step: each step's own message filled Python's registry of warnings
    assert len(told) == 1 and "step 10 is past num_total_steps (10)" in str(told[0].message)
    # a negative step was read from the end of the list, and as warm-up by an interval
    for maker in (by_ratio, gm):
        for method in (maker.do_update_preconditioner, maker.do_update_curvature):
            with pytest.raises(ValueError, match=r"step must be >= 0 \(steps count from 0\), "
                                                 r"got -1"):
                method(-1)
            with pytest.raises(TypeError, match="step must be an integer, got float"):
                method(2.0)


def test_curvature_ratio_without_a_moving_average_is_refused_by_the_natural_makers_only():
    """As in ASDL: the config takes ``curvature_upd_ratio`` without ``ema_decay``; Shampoo and
    Jorge (statistics summed) follow its schedule, K-FAC and the diagonal Fisher refuse it."""
    config = P.PreconditioningConfig(num_total_steps=10, curvature_upd_ratio=1.0,
                                     preconditioner_upd_ratio=0.5)
    for name in ("ShampooGradientMaker", "JorgeGradientMaker"):
        gm = getattr(P, name)(mlp(), config)
        assert [gm.do_update_curvature(k) for k in range(10)] == [True] * 10
        assert [gm.do_update_preconditioner(k) for k in range(10)] == [True, False] * 5
    for name in ("KfacGradientMaker", "DiagNaturalGradientMaker"):
        with pytest.raises(ValueError, match=f"{name} needs ema_decay with curvature_upd_ratio"):
            getattr(P, name)(mlp(), P.PreconditioningConfig(
                data_size=4, num_total_steps=10, curvature_upd_ratio=1.0))


def test_schedules_follow_the_config_as_it_changes():
    """ASDL reads the intervals from ``gm.config`` at every step: a script may change them
    after a warm-up phase. A bad new value is refused as on construction."""
    gm = P.KfacGradientMaker(mlp(), P.PreconditioningConfig(
        data_size=4, curvature_upd_interval=1), fisher_type="emp")
    assert [gm.do_update_curvature(k) for k in range(3)] == [True, True, True]
    gm.config.curvature_upd_interval = 5
    gm.config.preconditioner_upd_interval = 5
    assert [gm.do_update_curvature(k) for k in range(7)] == [
        True, False, False, False, False, True, False]
    assert [gm.do_update_preconditioner(k) for k in range(7)] == [
        True, False, False, False, False, True, False]
    if asdl is not None:
        theirs = asdl.KfacGradientMaker(mlp(), asdl.PreconditioningConfig(
            data_size=4, curvature_upd_interval=1))
        theirs.config.curvature_upd_interval = 5
        theirs.config.preconditioner_upd_interval = 5
        assert [theirs.do_update_curvature(k) for k in range(7)] == [
            gm.do_update_curvature(k) for k in range(7)]
    gm.config.curvature_upd_interval = 0
    with pytest.raises(ValueError, match="curvature_upd_interval must be >= 1, got 0"):
        gm.do_update_curvature(1)


@pytest.mark.parametrize("maker", ["KfacGradientMaker", "DiagNaturalGradientMaker",
                                   "ShampooGradientMaker", "JorgeGradientMaker"])
@pytest.mark.parametrize("field, value, message", [
    ("damping", -1e-3, "damping must be a finite number > 0, got -0.001"),
    ("ema_decay", 5.0, "ema_decay must be -1 .* got 5.0"),
    ("data_size", 0, "data_size must be >= 1"),
])
def test_every_changed_field_is_checked_before_the_next_step(maker, field, value, message):
    """Not only the intervals: a damping made negative during training would flip the signs
    of the diagonal Fisher's step."""
    model = mlp()
    config = P.PreconditioningConfig(data_size=32, damping=1e-3)
    gm = getattr(P, maker)(model, config)
    x, t = batch((32, 20))
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
    gm.forward_and_backward()
    weights = [p.detach().clone() for p in model.parameters()]
    setattr(config, field, value)
    with pytest.raises(ValueError, match=message):
        gm.forward_and_backward()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


@pytest.mark.parametrize("maker", ["ShampooGradientMaker", "JorgeGradientMaker"])
def test_root_makers_keep_their_ema_decay(maker):
    model = mlp()
    config = P.PreconditioningConfig(damping=1e-3, ema_decay=0.1)
    gm = getattr(P, maker)(model, config)
    config.ema_decay = 0.5   # valid, but the statistics gathered so far assume 0.1
    with pytest.raises(ValueError, match="keeps the ema_decay it was made with \\(0.1\\), "
                                         "got 0.5"):
        gm.do_update_curvature()


def test_pi_damping_switch():
    """pi_damping=False gives each factor sqrt(damping)."""
    x, t = batch((32, 20))
    model = mlp()
    ref = copy.deepcopy(model)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-2),
                             fisher_type="emp", pi_damping=False)
    train(gm, model, x, t, 1)
    A, B = gm.factors("4")["A"], gm.factors("4")["B"]
    (F.cross_entropy(ref(x), t, reduction="sum") / 32).backward()
    eye_a, eye_b = torch.eye(8, dtype=DTYPE), torch.eye(3, dtype=DTYPE)
    expected = (torch.linalg.inv(B + 0.1 * eye_b) @ ref[4].weight.grad
                @ torch.linalg.inv(A + 0.1 * eye_a))
    assert torch.allclose(model[4].weight.grad, expected, rtol=1e-10)
    assert P.kfac.pi_damping(A, B, 1e-2) != (0.1, 0.1)
    assert P.kfac.pi_damping(torch.zeros(2, 2), torch.eye(2), 1e-2) == (1e-2, 1e-2)


@pytest.mark.parametrize("maker", ["kfac", "diag"])
def test_kl_clip_scales_the_preconditioned_gradients_by_the_predicted_kl(maker):
    """kl_clip: every preconditioned gradient times min(1, sqrt(kl_clip / |lr^2 sum v.g|)),
    the plain gradients of unpreconditioned parameters untouched; no clip where the bound is
    not reached."""
    x, t = batch((32, 20))
    make = P.KfacGradientMaker if maker == "kfac" else P.DiagNaturalGradientMaker
    config = P.PreconditioningConfig(data_size=32, damping=1e-3,
                                     ignore_modules=["2"])   # module 2 keeps its gradient
    plain_model = mlp()
    plain = make(plain_model, config, fisher_type="emp")
    plain_model.zero_grad()
    dy = plain.setup_model_call(plain_model, x)
    plain.setup_loss_call(F.cross_entropy, dy, t)
    plain.forward_and_backward()
    preconditioned = [p.grad.clone() for p in plain_model.parameters()]
    raw_model = mlp()
    (F.cross_entropy(raw_model(x), t, reduction="sum") / 32).backward()
    raw = [p.grad for p in raw_model.parameters()]
    kept = {2, 3}   # module 2's weight and bias
    vg = sum(float((v * g).sum()) for i, (v, g) in enumerate(zip(preconditioned, raw))
             if i not in kept)
    lr = 0.1
    predicted = lr ** 2 * vg
    for kl_clip in (predicted / 7, predicted * 2):
        model = mlp()
        gm = make(model, config, fisher_type="emp", kl_clip=kl_clip, lr=lambda: lr)
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
        scale = min(1.0, (kl_clip / predicted) ** 0.5)
        assert gm.last_kl_clip_scale == pytest.approx(scale, rel=1e-12)
        for i, (param, v) in enumerate(zip(model.parameters(), preconditioned)):
            expected = v if i in kept else v * scale
            torch.testing.assert_close(param.grad, expected, rtol=1e-12, atol=0)
    assert gm.last_kl_clip_scale == 1.0   # twice the predicted KL: not clipped


def test_kl_clip_follows_a_changing_learning_rate_and_bounds_every_step():
    """The callable lr is read at every step (a scheduler's rate), and with a tiny damping the
    steps are clipped to the bound: for the clipped direction ``s v`` the predicted
    ``lr^2 (s v)^T F (s v) = s lr^2 (s v).g`` equals kl_clip, and never exceeds it."""
    x, t = batch((32, 20))
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=32, damping=1e-6),
                             fisher_type="emp", kl_clip=1e-3,
                             lr=lambda: opt.param_groups[0]["lr"])
    scales = []
    for step in range(6):
        opt.zero_grad()
        raw_model = copy.deepcopy(model)
        (F.cross_entropy(raw_model(x), t, reduction="sum") / 32).backward()
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
        lr = opt.param_groups[0]["lr"]
        vg = sum(float((p.grad * r.grad).sum())
                 for p, r in zip(model.parameters(), raw_model.parameters()))
        scales.append(gm.last_kl_clip_scale)
        predicted = scales[-1] * lr ** 2 * vg
        if scales[-1] < 1:
            assert predicted == pytest.approx(1e-3, rel=1e-9)
        else:
            assert predicted <= 1e-3
        opt.step()
        opt.param_groups[0]["lr"] = lr / 4
    assert scales[0] < 1 and scales[-1] == 1.0
    # A quarter of the rate: a scale about four times larger (the direction changes too).
    assert 2 < scales[1] / scales[0] < 8


def test_kl_clip_bad_input():
    model, config = mlp(), P.PreconditioningConfig(data_size=8, damping=1e-3)
    with pytest.raises(ValueError, match="kl_clip needs lr"):
        P.KfacGradientMaker(model, config, kl_clip=1e-3)
    with pytest.raises(ValueError, match="lr is only used with kl_clip"):
        P.KfacGradientMaker(model, config, lr=0.1)
    for bad in (0.0, -1e-3, float("inf")):
        with pytest.raises(ValueError, match="kl_clip must be a finite number > 0"):
            P.KfacGradientMaker(model, config, kl_clip=bad, lr=0.1)
    with pytest.raises(TypeError, match="lr must be a float"):
        P.KfacGradientMaker(model, config, kl_clip=1e-3, lr="0.1")
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        P.KfacGradientMaker(model, config, kl_clip=1e-3, lr=0.0)
    gm = P.KfacGradientMaker(model, config, fisher_type="emp", kl_clip=1e-3,
                             lr=lambda: float("nan"))
    x, t = torch.randn(8, 20, dtype=DTYPE), torch.randint(0, 3, (8,))
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    with pytest.raises(ValueError, match="the value lr\\(\\) returned must be a finite"):
        gm.forward_and_backward()
    # raised before any gradient was preconditioned, the step not counted, and .grad left
    # as it was before the call (empty), not holding a raw gradient
    assert gm.step == 0
    assert all(p.grad is None for p in model.parameters())


@requires_asdl
def test_the_config_has_asdls_fields_in_asdls_order():
    """So that a config made positionally means the same in both libraries."""
    import dataclasses
    theirs = [(f.name, f.default) for f in dataclasses.fields(asdl.PreconditioningConfig)]
    ours = [(f.name, f.default) for f in dataclasses.fields(P.PreconditioningConfig)]
    assert ours[:len(theirs)] == theirs
    assert [name for name, _ in ours[len(theirs):]] == ["curvature_interval_type"]
    assert P.PreconditioningConfig(None, 2).preconditioner_upd_interval == 2


@pytest.mark.parametrize("make", [
    lambda m, c: P.KfacGradientMaker(m, c, fisher_type="fisher_emp"),
    lambda m, c: P.DiagNaturalGradientMaker(m, c, fisher_type="fisher_emp"),
    lambda m, c: P.ShampooGradientMaker(m, c),
    lambda m, c: P.JorgeGradientMaker(m, c)])
def test_a_maker_that_took_a_step_deep_copies_and_trains_on_as_the_original(make):
    """The maker keeps the last output and loss, which are not autograd leaves: a deep copy
    of it (alone, or with its model and optimizer) raised before."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    maker = make(model, P.PreconditioningConfig(data_size=16, damping=1e-3))

    def train(model, optimizer, maker, steps):
        generator = torch.Generator().manual_seed(3)
        for _ in range(steps):
            x = torch.randn(16, 6, generator=generator, dtype=torch.float64)
            target = torch.randint(0, 3, (16,), generator=generator)
            optimizer.zero_grad()
            output = maker.setup_model_call(model, x)
            maker.setup_loss_call(F.cross_entropy, output, target)
            maker.forward_and_backward()
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    train(model, optimizer, maker, 2)
    twin_model, twin_optimizer, twin = copy.deepcopy((model, optimizer, maker))
    torch.testing.assert_close(twin.loss, maker.loss.detach(), rtol=0, atol=0)
    assert twin.model is twin_model and twin.step == maker.step
    expected = train(model, optimizer, maker, 3)
    assert all(torch.equal(e, g) for e, g in
               zip(expected, train(twin_model, twin_optimizer, twin, 3)))


def test_non_finite_input_rows_leave_the_models_input_unchanged():
    """With check_finite=False a NaN in a wide Linear's input reaches its low-rank input
    factor, whose rows are a view of the input: the refused update leaves that input as the
    caller passed it (it was scaled in place by 1 / data_size), with the usual warning."""
    model = wide_mlp()
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=8, damping=1e-3),
                             fisher_type="emp", check_finite=False)
    x, t = batch((8, 100))
    x[0, 0] = float("nan")
    before = x.clone()
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    with pytest.warns(RuntimeWarning, match="non-finite curvature"):
        gm.forward_and_backward()
    assert torch.equal(x[1:], before[1:]) and torch.equal(x[0, 1:], before[0, 1:])
    assert "A_rows" not in gm.factors("0")


class _OptionalLayer(nn.Module):
    """An MLP whose middle layer runs only when `use_middle` is set."""

    def __init__(self):
        super().__init__()
        self.first, self.middle, self.out = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.use_middle = False

    def forward(self, x):
        h = self.first(x)
        return self.out(self.middle(h) if self.use_middle else h)


@pytest.mark.filterwarnings("ignore:modules \\['middle'\\] saw no input")
@pytest.mark.parametrize("maker", ["KfacGradientMaker", "DiagNaturalGradientMaker"])
def test_kl_clip_leaves_a_module_without_curvature_plain(maker):
    """A module first called after the last curvature step has no curvature: it keeps its
    plain gradient, which the kl_clip factor leaves alone (the diagonal Fisher scaled it)."""
    torch.manual_seed(0)
    model = _OptionalLayer().to(DTYPE)
    gm = getattr(P, maker)(model, P.PreconditioningConfig(data_size=8, damping=1e-4,
                                                          curvature_upd_interval=5),
                           fisher_type="emp", kl_clip=1e-6, lr=1.0)
    x, t = batch((8, 6))
    for step in range(2):
        model.use_middle = step == 1
        model.zero_grad()
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
    assert gm.last_kl_clip_scale < 1e-2   # the preconditioned modules were clipped
    plain = copy.deepcopy(model)
    plain.zero_grad()
    F.cross_entropy(plain(x), t).backward()
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(model.middle, name).grad,
                                   getattr(plain.middle, name).grad, rtol=0, atol=0)


@pytest.mark.parametrize("option", ["pi_damping", "swift", "check_finite"])
def test_flags_of_the_natural_makers_must_be_bools(option):
    """A flag given as a string (``"False"`` is truthy) or a number is a TypeError naming
    it, not silently taken as True."""
    config = P.PreconditioningConfig(data_size=8)
    for value in ("False", 0, None):
        with pytest.raises(TypeError, match=f"{option} must be a bool"):
            P.KfacGradientMaker(mlp(), config, **{option: value})
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        P.DiagNaturalGradientMaker(mlp(), config, check_finite="no")
    assert P.KfacGradientMaker(mlp(), config, pi_damping=np.bool_(False)).pi_damping is False


def test_load_state_dict_refuses_one_factor_alone_or_not_a_tensor():
    """K-FAC stores A (or its rows) and B together: a state with one alone, or with a
    factor that is not a tensor, is refused on loading (ValueError, TypeError) and the maker
    keeps its state; it failed at the next inversion (KeyError) or with an AttributeError."""
    x, t = batch((32, 20))
    config = P.PreconditioningConfig(data_size=32, damping=1e-3, ema_decay=0.5)
    gm = P.KfacGradientMaker(mlp(), config, fisher_type="emp")
    train(gm, gm.model, x, t, 1)
    state = gm.state_dict()
    other = P.KfacGradientMaker(mlp(), config, fisher_type="emp")
    for key in ("A", "B"):
        bad = copy.deepcopy(state)
        del bad["factors"]["0"][key]
        with pytest.raises(ValueError, match=f"'0' hold {'AB'.replace(key, '')} without {key}"):
            other.load_state_dict(bad)
        assert other.step == 0 and other.factors("0") == {}
    bad = copy.deepcopy(state)
    bad["factors"]["0"]["B"] = bad["factors"]["0"]["B"].tolist()
    with pytest.raises(TypeError, match="factor B of '0' must be a tensor, got list"):
        other.load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["factors"]["0"] = None
    with pytest.raises(TypeError, match="factors of '0' must be a dict, got NoneType"):
        other.load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["factors"]["0"] = {key: bad["factors"]["0"][key] for key in ("A_inv", "B_inv")}
    other.load_state_dict(bad)   # inverses without factors: they precondition, as saved
    assert set(other.factors("0")) == {"A_inv", "B_inv"}


def test_diag_state_of_a_bias_frozen_since_loads():
    """A bias frozen after the maker was built leaves its diagonal in the state; a maker
    built on the model with that bias frozen (the resumed run) loads it and trains on as the
    original does."""
    x, t = batch((32, 20))
    config = P.PreconditioningConfig(data_size=32, damping=1e-3)
    gm = P.DiagNaturalGradientMaker(model := mlp(), config, fisher_type="emp")
    train(gm, model, x, t, 1)
    model[0].bias.requires_grad_(False)
    model[0].bias.grad = None
    train(gm, model, x, t, 1)
    state = gm.state_dict()
    assert {"bias", "bias_inv"} <= set(state["factors"]["0"])
    twin = copy.deepcopy(model)
    resumed = P.DiagNaturalGradientMaker(twin, config, fisher_type="emp")
    resumed.load_state_dict(state)
    expected, resumed_grads = train(gm, model, x, t, 2), train(resumed, twin, x, t, 2)
    assert all(torch.equal(e, g) for e, g in zip(expected[-1], resumed_grads[-1]))


def _all_makers(model, config):
    return [P.KfacGradientMaker(model, config), P.DiagNaturalGradientMaker(model, config),
            P.ShampooGradientMaker(model, config), P.JorgeGradientMaker(model, config)]


def _stored(maker, name):
    """The stored tensors of module `name`'s weight, whichever the maker."""
    if isinstance(maker, P.NaturalGradientMaker):
        return maker.factors(name)
    return maker.factors(f"{name}.weight")[0]


def test_the_curvature_stays_in_full_precision_under_autocast():
    """A forward_and_backward inside torch.autocast (the way to train in mixed precision with
    this loop) built K-FAC's factors and Shampoo's statistics in bfloat16 (K-FAC's input
    factor 0.2 % from x^T x / N) and Jorge stopped with a TypeError in its Gram factors."""
    x, t = batch((32, 20), dtype=torch.float32)
    config = P.PreconditioningConfig(data_size=32, damping=1e-3)
    for maker in _all_makers(mlp(dtype=torch.float32), config):
        model = maker.model
        with torch.autocast("cpu", dtype=torch.bfloat16):
            maker.setup_loss_call(F.cross_entropy, maker.setup_model_call(model, x), t)
            maker.forward_and_backward()
        stored = _stored(maker, "0")
        assert {str(v.dtype) for v in stored.values() if torch.is_tensor(v)} \
            == {"torch.float32"}, (type(maker).__name__, stored.keys())
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        if isinstance(maker, P.KfacGradientMaker):
            # The first layer's input is x itself: its factor is x^T x / N.
            expected = x.T @ x / 32
            assert torch.allclose(stored["A"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ema_decay", [-1, 0.1])
def test_the_curvature_follows_a_dtype_cast_after_the_maker_is_built(ema_decay):
    """model.double() after the maker was built: Shampoo and Jorge went on computing in float32
    (the dtype fixed when the maker was built), and a moving average (K-FAC, the diagonal
    Fisher) kept its float32 factors for good. The maker now continues exactly as a maker built
    on the cast model and loaded with its state."""
    x, t = batch((32, 20), dtype=torch.float32)
    config = P.PreconditioningConfig(data_size=32, damping=1e-3, ema_decay=ema_decay)

    def step(maker, model):
        model.zero_grad()
        torch.manual_seed(5)  # K-FAC's and the diagonal's Monte Carlo Fisher (ASDL's default)
        inputs = x.to(next(model.parameters()).dtype)
        maker.setup_loss_call(F.cross_entropy, maker.setup_model_call(model, inputs), t)
        maker.forward_and_backward()
        return [p.grad.clone() for p in model.parameters()]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Shampoo's and Jorge's unused data_size
        followed = _all_makers(mlp(dtype=torch.float32), config)
        rebuilt = _all_makers(mlp(dtype=torch.float32), config)
    for maker, before in zip(followed, rebuilt):
        step(maker, maker.model)
        step(before, before.model)
        maker.model.double()
        before.model.double()
        reference = type(before)(before.model, config)
        reference.load_state_dict(before.state_dict())
        for _ in range(2):
            got, expected = step(maker, maker.model), step(reference, reference.model)
            assert all(torch.equal(a, b) for a, b in zip(got, expected)), type(maker).__name__
        assert {v.dtype for v in _stored(maker, "0").values() if torch.is_tensor(v)} \
            == {torch.float64}, type(maker).__name__


def test_a_call_without_grad_is_no_example_nor_a_repeated_call():
    """The network also called under no_grad in the forward (a consistency target): the
    curvature was right, but the warning said the modules ran more than once."""
    x, t = batch((32, 20))
    config = P.PreconditioningConfig(data_size=32, damping=1e-3)
    model = mlp()

    def with_target(inputs):
        with torch.no_grad():
            target = model(inputs + 0.1)
        return model(inputs) + 0 * target

    factors = []
    for forward in (with_target, model):
        maker = P.KfacGradientMaker(model, config)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            maker.setup_loss_call(F.cross_entropy, maker.setup_model_call(forward, x), t)
            torch.manual_seed(5)  # the Monte Carlo Fisher's samples
            maker.forward_and_backward()
        assert not [str(w.message) for w in caught if "more than once" in str(w.message)]
        factors.append(maker.factors("0"))
    assert all(torch.equal(factors[0][k], factors[1][k]) for k in factors[1])


def _maker_of(kind, model, config):
    return {"kfac": lambda: P.KfacGradientMaker(model, config, fisher_type="emp"),
            "diag": lambda: P.DiagNaturalGradientMaker(model, config, fisher_type="emp"),
            "shampoo": lambda: P.ShampooGradientMaker(model, config),
            "jorge": lambda: P.JorgeGradientMaker(model, config)}[kind]()


def _micro_step(maker, model, x, t):
    dy = maker.setup_model_call(model, x)
    maker.setup_loss_call(F.cross_entropy, dy, t)
    maker.forward_and_backward()


@pytest.mark.parametrize("kind", ["kfac", "diag", "shampoo", "jorge"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_accumulated_micro_batches_are_each_preconditioned_once(kind, set_to_none):
    """Two calls before one optimizer step (gradient accumulation) preconditioned what the
    first left in ``.grad`` again, and read it into the statistics: K-FAC's accumulated
    gradient was 24x the sum of the two micro-batches' preconditioned ones. Each call now
    adds its own preconditioned gradient to what ``.grad`` held, as backward() does."""
    x, t = batch((16, 20))
    config = P.PreconditioningConfig(data_size=8, damping=1e-3)
    separate, together = mlp(), mlp()
    apart, accumulating = _maker_of(kind, separate, config), _maker_of(kind, together, config)
    expected = []
    for rows in (slice(0, 8), slice(8, 16)):
        separate.zero_grad(set_to_none=set_to_none)
        _micro_step(apart, separate, x[rows], t[rows])
        expected.append([p.grad.clone() for p in separate.parameters()])
    together.zero_grad(set_to_none=set_to_none)
    _micro_step(accumulating, together, x[:8], t[:8])
    held = [p.grad for p in together.parameters()]
    _micro_step(accumulating, together, x[8:], t[8:])
    for first, second, param in zip(*expected, together.parameters()):
        torch.testing.assert_close(param.grad, first + second, rtol=1e-10, atol=1e-12)
    # accumulated into the tensors .grad held, as autograd does
    assert all(p.grad is before for p, before in zip(together.parameters(), held))
    # a gradient of the user's own (an auxiliary loss's backward) is kept, not preconditioned
    together.zero_grad()
    auxiliary = sum(p.square().sum() for p in together.parameters())
    auxiliary.backward()
    kept = [p.grad.clone() for p in together.parameters()]
    separate.zero_grad()
    _micro_step(apart, separate, x[:8], t[:8])
    _micro_step(accumulating, together, x[:8], t[:8])
    for before, own, param in zip(kept, separate.parameters(), together.parameters()):
        torch.testing.assert_close(param.grad, before + own.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["kfac", "diag", "shampoo", "jorge"])
def test_parameters_the_model_replaces_are_followed(kind):
    """``load_state_dict(..., assign=True)`` replaces the parameter objects: Shampoo and
    Jorge kept reading the replaced ones' empty ``.grad`` and left every gradient plain,
    without a word."""
    x, t = batch((16, 20))
    config = P.PreconditioningConfig(data_size=16, damping=1e-3)
    kept, replaced = mlp(), mlp()
    kept_maker, replaced_maker = _maker_of(kind, kept, config), _maker_of(kind, replaced, config)
    for step in range(2):
        if step == 1:
            replaced.load_state_dict(copy.deepcopy(kept.state_dict()), assign=True)
        for model, maker in ((kept, kept_maker), (replaced, replaced_maker)):
            model.zero_grad()
            _micro_step(maker, model, x, t)
        for a, b in zip(kept.parameters(), replaced.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-10, atol=1e-12)
    if kind in ("shampoo", "jorge"):
        replaced[0].weight = nn.Parameter(torch.zeros(17, 20, dtype=DTYPE))
        with pytest.raises(RuntimeError, match="no longer holds a parameter '0.weight' of "
                                               "shape \\(16, 20\\)"):
            _micro_step(replaced_maker, replaced, x, t)


class _ClassesLast(nn.Module):
    def forward(self, y):
        return y.permute(0, 2, 3, 1).reshape(-1, y.shape[1])


@pytest.mark.parametrize("fisher_type", ["exact", "mc"])
@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_segmentation_logits_have_their_classes_on_the_second_axis(maker, fisher_type):
    """Cross-entropy logits of shape (N, C, H, W), as torch's cross-entropy takes them: the
    MC and exact Fishers took the width W for the classes, and gave another curvature than
    the same loss on the logits flattened to (N * H * W, C), without a word."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.Tanh(),
                        nn.Conv2d(4, 3, 3, padding=1)).to(DTYPE)
    flat = nn.Sequential(copy.deepcopy(net), _ClassesLast())
    x = torch.randn(4, 2, 5, 6, dtype=DTYPE)
    t = torch.randint(0, 3, (4, 5, 6))
    config = P.PreconditioningConfig(data_size=4, damping=1e-3)
    grads = []
    for model, target in ((net, t), (flat, t.reshape(-1))):
        gm = maker(model, config, fisher_type=fisher_type, seed=0)
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, target)
        gm.forward_and_backward()
        grads.append([p.grad for p in model.parameters()])
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_a_seed_repeats_the_curvature_pass_and_leaves_the_users_draws_alone(maker):
    """``seed=`` reseeds torch before each curvature pass, as ASDL, so its dropout masks and
    MC labels repeat; ASDL's reset of the global generator also made every later draw of the
    user's repeat (a DataLoader's shuffle was the same at every step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3)).to(DTYPE)
    gm = maker(model, P.PreconditioningConfig(data_size=8, damping=1e-2), seed=3)
    x, t = batch((8, 4))
    torch.manual_seed(5)
    expected = [torch.randperm(8) for _ in range(3)]
    torch.manual_seed(5)
    draws, outputs = [], []
    for _ in range(3):
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        outputs.append(gm.forward_and_backward()[0].detach())
        draws.append(torch.randperm(8))
    assert all(torch.equal(a, b) for a, b in zip(draws, expected))
    assert all(torch.equal(output, outputs[0]) for output in outputs)   # the same masks


@pytest.mark.parametrize("fisher_type", ["exact", "mc"])
def test_a_loss_of_the_users_keeps_the_classes_last(fisher_type):
    """A language model's (B, T, V) logits, flattened by the user's own loss function: the
    classes are the last axis, as before; only torch's cross-entropy moves them."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4, dtype=DTYPE)
    t = torch.randint(0, 3, (2, 5))

    def lm_loss(logits, target, reduction="mean"):
        return F.cross_entropy(logits.reshape(-1, 3), target.reshape(-1), reduction=reduction)

    grads = []
    for flattened in (False, True):
        torch.manual_seed(1)
        model = nn.Linear(4, 3).to(DTYPE)
        gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=2, damping=1e-3),
                                 fisher_type=fisher_type, seed=0)
        dy = gm.setup_model_call(model, x)
        if flattened:
            gm.setup_loss_call(F.cross_entropy, dy.reshape(-1, 3), t.reshape(-1))
        else:
            gm.setup_loss_call(lm_loss, dy, t)
        gm.forward_and_backward()
        grads.append([p.grad for p in model.parameters()])
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_a_bias_frozen_at_build_of_a_preconditioned_module_is_preconditioned_once_it_trains(
        maker):
    """The curvature of a preconditioned module covers its bias whenever it trains: it is not
    listed among the plain parameters (it was, as frozen at build)."""
    x, t = batch((16, 20))
    config = P.PreconditioningConfig(data_size=16, damping=1e-3)
    frozen, trainable = mlp(), mlp()
    frozen[0].bias.requires_grad_(False)
    gm = maker(frozen, config, fisher_type="emp")
    assert "0.bias" not in gm.unpreconditioned_parameters()
    frozen[0].bias.requires_grad_(True)
    reference = maker(trainable, config, fisher_type="emp")
    for model, maker_of_it in ((frozen, gm), (trainable, reference)):
        _micro_step(maker_of_it, model, x, t)
    torch.testing.assert_close(frozen[0].bias.grad, trainable[0].bias.grad, rtol=1e-10,
                               atol=1e-12)


def test_a_step_that_fails_after_its_backward_leaves_the_gradients_as_they_were():
    """An error after the backward (in the preconditioning) left the raw step gradient added
    to what .grad held: neither preconditioned nor, over ranks, summed."""
    x, t = batch((16, 20))
    model = mlp()
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=8, damping=1e-3),
                             fisher_type="emp")
    _micro_step(gm, model, x[:8], t[:8])
    before = [p.grad.clone() for p in model.parameters()]

    def broken():
        raise RuntimeError("injected")
    gm.precondition = broken
    with pytest.raises(RuntimeError, match="injected"):
        _micro_step(gm, model, x[8:], t[8:])
    for param, expected in zip(model.parameters(), before):
        assert torch.equal(param.grad, expected)
    model.zero_grad()
    with pytest.raises(RuntimeError, match="injected"):
        _micro_step(gm, model, x[8:], t[8:])
    assert all(p.grad is None for p in model.parameters())


def test_a_config_changed_before_the_maker_is_made_is_checked_by_it():
    """Fields set after the config was made were checked only when changed again during
    training: a negative damping failed at the first step comparing a complex number, an
    interval of 0 dividing by zero."""
    for field, value, error, message in (("damping", -1.0, ValueError, "damping"),
                                         ("damping", "x", TypeError, "damping"),
                                         ("curvature_upd_interval", 0, ValueError,
                                          "curvature_upd_interval")):
        config = P.PreconditioningConfig(data_size=8, damping=1e-3)
        setattr(config, field, value)
        for maker in (P.KfacGradientMaker, P.ShampooGradientMaker):
            with pytest.raises(error, match=message):
                maker(mlp(), config)


def test_a_warm_up_longer_than_the_updates_is_refused_naming_the_fields():
    with pytest.raises(ValueError, match="preconditioner_warmup_ratio 0.5 gives 5 warm-up "
                                         "steps of num_total_steps 10, more than the 1 updates "
                                         "preconditioner_upd_ratio 0.1 gives"):
        P.PreconditioningConfig(num_total_steps=10, preconditioner_upd_ratio=0.1,
                                preconditioner_warmup_ratio=0.5)
    with pytest.raises(ValueError, match="curvature_warmup_ratio 0.3"):
        P.PreconditioningConfig(num_total_steps=10, curvature_upd_ratio=0.2,
                                curvature_warmup_ratio=0.3)
    for arguments, error, message in (((10, "0.5"), TypeError, "update_ratio must be a float"),
                                      ((10.0,), TypeError, "num_total_steps must be an int"),
                                      ((10, 0.5, None), TypeError, "warmup_ratio must be"),
                                      ((0,), ValueError, "num_total_steps must be an int > 0")):
        with pytest.raises(error, match=message):
            update_schedule(*arguments)
