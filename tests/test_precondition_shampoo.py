"""pysparse_hpc.precondition Shampoo and Jorge: plain float64 references of the same formulas
(NumPy eigendecompositions), Jorge against Shampoo, ASDL's Shampoo where the two agree, resume,
bad input and non-finite values."""
import copy
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from pysparse_hpc import precondition as P  # noqa: E402
from pysparse_hpc.precondition import jorge as jorge_module  # noqa: E402
from pysparse_hpc.precondition._roots import (block_bounds, inverse_root,  # noqa: E402
                                              series_root_update, series_root_update_factored)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import asdl
    except ImportError:  # the peer is optional: only the comparison needs it
        asdl = None

requires_asdl = pytest.mark.skipif(asdl is None, reason="ASDL (pip install asdfghjkl) missing")
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The matrices here are tiny: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


RTOL = 1e-10
DTYPE = torch.float64
GRAFT_EPS = 1e-8


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


MODELS = {"mlp": (mlp, (32, 20)), "cnn": (cnn, (32, 2, 8, 8))}


def batch(shape, classes=3, seed=1, dtype=DTYPE):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator, dtype=dtype)
    t = torch.randint(0, classes, (shape[0],), generator=generator)
    return x, t


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train(maker, model, x, t, steps):
    """`steps` SGD steps through `maker`; the gradients of every step."""
    opt = sgd(model)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        dy = maker.setup_model_call(model, x)
        maker.setup_loss_call(F.cross_entropy, dy, t)
        maker.forward_and_backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return grads


def assert_grads_close(expected, actual, rtol=RTOL):
    assert len(expected) == len(actual)
    for step, (e_step, a_step) in enumerate(zip(expected, actual)):
        for i, (e, a) in enumerate(zip(e_step, a_step)):
            err = ((e - a).norm() / e.norm()).item()
            assert err <= rtol, f"step {step}, parameter {i}: relative error {err:.2e}"


# ---------------------------------------------------------------------- plain references
def due(step, interval):
    return step % interval == 0


def np_root(matrix, eps, relative=False):
    """(M + eps I)^-1/4 from NumPy's eigendecomposition (eigenvalues clamped at 0)."""
    w, v = np.linalg.eigh(matrix)
    w = np.maximum(w, 0.0)
    if relative and w[-1] > 0:
        eps = eps * w[-1]
    return (v * (w + eps) ** -0.25) @ v.T


def np_jorge_refresh(root, m, a, eps, init, radius, symmetrize):
    """Jorge's refresh written out: X = Lh^4 (M + (1 - a) eps I) / a, clipped, series."""
    n = m.shape[0]
    eye = np.eye(n)
    if root is None:
        if init == "first_statistics":
            return np_root(m, eps), False
        root = eps ** -0.25 * eye
    x = np.linalg.matrix_power(root, 4) @ (m + (1 - a) * eps * eye) / a
    norm = np.linalg.norm(x)
    clipped = norm > radius
    if clipped:
        x = x * (radius / norm)
    new = a ** -0.25 * root @ (eye - x / 4 + 5 / 32 * x @ x)
    if symmetrize:
        new = (new + new.T) / 2
    return new, clipped


def reference_run(model, x, t, steps, method="shampoo", damping=1e-3, ema=-1, block=None,
                  grafting=None, curvature_every=None, roots_every=1, relative=False,
                  init="identity", radius=0.5, symmetrize=True):
    """Shampoo or Jorge written plainly in NumPy float64, training `model` as `train` does.

    Every parameter of >= 2 dimensions is a matrix (shape[0] x rest), cut into blocks; the
    1-D ones get Adagrad's step with Adagrad grafting and stay plain otherwise."""
    opt = sgd(model)
    decay, weight = (1.0 - ema, ema) if ema != -1 else (1.0, 1.0)
    curvature_every = curvature_every or roots_every
    state, adagrad, clips, out = {}, {}, 0, []
    for step in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), t).backward()
        for name, p in model.named_parameters():
            g = p.grad.detach().numpy().astype(np.float64)
            if p.ndim == 1:
                if grafting == "adagrad":
                    adagrad[name] = adagrad.get(name, 0.0) + g * g
                    p.grad.copy_(torch.from_numpy(g / (np.sqrt(adagrad[name]) + GRAFT_EPS)))
                continue
            G = g.reshape(p.shape[0], -1)
            D = G.copy()
            blocks = [(slice(*r), slice(*c)) for r in block_bounds(G.shape[0], block)
                      for c in block_bounds(G.shape[1], block)]
            for k, (rows, cols) in enumerate(blocks):
                Gb = G[rows, cols]
                st = state.setdefault((name, k), {})
                if due(step, curvature_every):
                    SL, SR = Gb @ Gb.T, Gb.T @ Gb
                    if method == "shampoo":
                        st["L"] = weight * SL if "L" not in st else decay * st["L"] + weight * SL
                        st["R"] = weight * SR if "R" not in st else decay * st["R"] + weight * SR
                    else:
                        st["ML"] = weight * SL if "ML" not in st else decay * st["ML"] + weight * SL
                        st["MR"] = weight * SR if "MR" not in st else decay * st["MR"] + weight * SR
                        st["a"] = st.get("a", 1.0) * decay
                if due(step, roots_every):
                    if method == "shampoo" and "L" in st:
                        st["Lr"] = np_root(st["L"], damping, relative)
                        st["Rr"] = np_root(st["R"], damping, relative)
                    elif method == "jorge" and "ML" in st:
                        a = st.pop("a")
                        st["Lr"], c1 = np_jorge_refresh(st.get("Lr"), st.pop("ML"), a, damping,
                                                        init, radius, symmetrize)
                        st["Rr"], c2 = np_jorge_refresh(st.get("Rr"), st.pop("MR"), a, damping,
                                                        init, radius, symmetrize)
                        clips += int(c1) + int(c2)
                if "Lr" in st:
                    D[rows, cols] = st["Lr"] @ Gb @ st["Rr"]
            if grafting == "sgd":
                D = D * (np.linalg.norm(G) / np.linalg.norm(D))
            elif grafting == "adagrad":
                adagrad[name] = adagrad.get(name, 0.0) + G * G
                step_a = G / (np.sqrt(adagrad[name]) + GRAFT_EPS)
                D = D * (np.linalg.norm(step_a) / np.linalg.norm(D))
            p.grad.copy_(torch.from_numpy(D.reshape(p.shape)))
        out.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return out, clips


# ---------------------------------------------------------------------- Shampoo vs reference
SCHEDULES = {
    "every-step": dict(config=dict(), ref=dict()),
    "roots-every-3-ema": dict(config=dict(curvature_upd_interval=1, preconditioner_upd_interval=3,
                                          ema_decay=0.3),
                              ref=dict(curvature_every=1, roots_every=3, ema=0.3)),
    "both-every-3": dict(config=dict(preconditioner_upd_interval=3), ref=dict(roots_every=3)),
}


@pytest.mark.parametrize("grafting", [None, "sgd", "adagrad"])
@pytest.mark.parametrize("block", [None, 5])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_shampoo_matches_reference(name, schedule, block, grafting):
    """Preconditioned gradients equal the plain NumPy Shampoo over 7 SGD steps (float64,
    1e-10 relative): statistics, blocks (block 5 cuts 20 into 4 blocks, 16 into 5+5+5+1, the
    convolution's 4 x 18 into 1 x 4), eigendecomposition roots, grafting, schedules."""
    make, shape = MODELS[name]
    x, t = batch(shape)
    spec = SCHEDULES[schedule]
    config = P.PreconditioningConfig(damping=1e-3, **spec["config"])
    gm = P.ShampooGradientMaker(model := make(), config, block_size=block, grafting=grafting)
    actual = train(gm, model, x, t, 7)
    expected, _ = reference_run(make(), x, t, 7, damping=1e-3, block=block, grafting=grafting,
                                **spec["ref"])
    assert_grads_close(expected, actual)
    if block is not None and name == "mlp":
        assert gm.block_shapes("0.weight") == [(5, 5)] * 12 + [(1, 5)] * 4  # 16 x 20
        assert len(gm.factors("0.weight")) == 16


def test_shampoo_relative_damping_matches_reference():
    x, t = batch((32, 20))
    config = P.PreconditioningConfig(damping=1e-2, ema_decay=0.5)
    gm = P.ShampooGradientMaker(model := mlp(), config, relative_damping=True, grafting="sgd")
    expected, _ = reference_run(mlp(), x, t, 4, damping=1e-2, ema=0.5, relative=True,
                                grafting="sgd")
    assert_grads_close(expected, train(gm, model, x, t, 4))


def test_damping_never_enters_the_statistics():
    """Same gradient every step, no optimizer step: the sum statistics are exactly k G G^T
    (ASDL adds damping * l_max into them at every root update)."""
    model = mlp()
    x, t = batch((32, 20))
    gm = P.ShampooGradientMaker(model, P.PreconditioningConfig(damping=1e-2))
    plain = mlp()
    F.cross_entropy(plain(x), t).backward()
    G = plain[0].weight.grad
    for _ in range(3):
        model.zero_grad()
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
    stats = gm.factors("0.weight")[0]
    assert torch.allclose(stats["L"], 3 * (G @ G.T), rtol=1e-14, atol=1e-18)
    assert torch.allclose(stats["R"], 3 * (G.T @ G), rtol=1e-14, atol=1e-18)


# ---------------------------------------------------------------------- Jorge
JORGE_CASES = {
    "identity-ema-every-step": dict(init="identity", config=dict(ema_decay=0.3), ref=dict(ema=0.3)),
    "first-stats-sums-roots-every-2": dict(
        init="first_statistics",
        config=dict(curvature_upd_interval=1, preconditioner_upd_interval=2),
        ref=dict(curvature_every=1, roots_every=2)),
    "identity-sums-not-symmetrized": dict(init="identity", config=dict(), ref=dict(),
                                          symmetrize=False),
}


@pytest.mark.parametrize("block", [None, 5])
@pytest.mark.parametrize("case", list(JORGE_CASES))
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_jorge_matches_reference(name, case, block):
    """Jorge's product-only refresh (gathered statistics, decay, constant damping, clipping to
    the series radius, symmetrisation, both initialisations) equals its NumPy formulas over 7
    SGD steps; the clipping path runs (damping 1e-3 makes the first updates large)."""
    make, shape = MODELS[name]
    x, t = batch(shape)
    spec = JORGE_CASES[case]
    symmetrize = spec.get("symmetrize", True)
    config = P.PreconditioningConfig(damping=1e-3, **spec["config"])
    gm = P.JorgeGradientMaker(model := make(), config, block_size=block, init=spec["init"],
                              symmetrize=symmetrize)
    actual = train(gm, model, x, t, 7)
    expected, clips = reference_run(make(), x, t, 7, method="jorge", damping=1e-3, block=block,
                                    grafting="sgd", init=spec["init"], symmetrize=symmetrize,
                                    **spec["ref"])
    assert_grads_close(expected, actual)
    assert gm.clipped_updates == clips > 0


@pytest.mark.parametrize("decay, radius, symmetrize", [
    (1.0, 0.5, True), (1.0, 1e3, False), (0.9, 0.5, False), (0.9, 1e3, True)])
def test_factored_series_update_equals_the_dense_one(decay, radius, symmetrize):
    """Statistics F F^T of rank 5 on a 40 x 40 root: the thin products give the dense update
    (1e-12 relative), clipped (radius 0.5) or not, with and without decay and symmetry."""
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((40, 40)))
    root = torch.from_numpy((q * rng.uniform(0.5, 2.0, 40)) @ q.T)
    factor = torch.from_numpy(rng.standard_normal((40, 5)) * 0.05)
    dense, dense_clipped = series_root_update(root, factor @ factor.T, decay, radius, symmetrize)
    thin, thin_clipped = series_root_update_factored(root, factor, decay, radius, symmetrize)
    assert dense_clipped == thin_clipped == (radius == 0.5)
    torch.testing.assert_close(thin, dense, rtol=1e-12, atol=1e-12 * float(dense.abs().max()))
    bad = factor.clone()
    bad[3, 1] = float("nan")
    assert series_root_update_factored(root, bad, decay, radius, symmetrize) == (None, False)


@pytest.mark.parametrize("case, factored", [("identity-sums-not-symmetrized", True),
                                            ("identity-ema-every-step", False),
                                            ("first-stats-sums-roots-every-2", False)])
def test_jorge_refreshes_thin_blocks_from_the_gradient(monkeypatch, case, factored):
    """With summed statistics gathered in the step that refreshes them, a root whose block
    is thin (the MLP's 8 x 16 and 3 x 8 weights: right sides of 16 and 8 against 8 and 3
    rows) refreshes from the gradient itself, and the run still equals the NumPy formulas;
    a moving average (its damping term is not of low rank) or statistics of two steps take
    the dense update. The 3 x 8 gradient of the cross-entropy's logits has rank 2 (its rows
    sum to zero), and its 8-side root refreshes from 2 columns."""
    calls = []

    def counted(root, factor, *args):
        calls.append(tuple(factor.shape))
        return series_root_update_factored(root, factor, *args)
    monkeypatch.setattr(jorge_module, "series_root_update_factored", counted)
    x, t = batch((32, 20))
    spec = JORGE_CASES[case]
    symmetrize = spec.get("symmetrize", True)
    config = P.PreconditioningConfig(damping=1e-3, **spec["config"])
    gm = P.JorgeGradientMaker(model := mlp(), config, init=spec["init"], symmetrize=symmetrize)
    actual = train(gm, model, x, t, 7)
    expected, _ = reference_run(mlp(), x, t, 7, method="jorge", damping=1e-3, grafting="sgd",
                                init=spec["init"], symmetrize=symmetrize, **spec["ref"])
    assert_grads_close(expected, actual)
    if factored:  # 7 steps, each refreshing the two thin roots (from eps^-1/4 I first)
        assert sorted(set(calls)) == [(8, 2), (16, 8)] and len(calls) == 2 * 7
    else:
        assert calls == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_symmetrized_gives_the_bits_of_the_plain_formula(dtype):
    """In place by tiles (sides around the 64-wide tile, and one of several tiles) or, for a
    transposed view, by the formula: (M + M^T) / 2 to the bit."""
    from pysparse_hpc.precondition._roots import symmetrized
    generator = torch.Generator().manual_seed(7)
    for n in (1, 2, 63, 64, 65, 200):
        matrix = torch.randn(n, n, generator=generator, dtype=dtype)
        expected = matrix.add(matrix.T).mul_(0.5)
        assert torch.equal(symmetrized(matrix.clone()), expected)
        assert torch.equal(symmetrized(matrix.T), matrix.T.add(matrix).mul_(0.5))


def test_pivoted_cholesky_finds_the_rank_and_a_factor():
    """Against NumPy: a 30 x 30 Gram matrix of rank 7 gives 7 columns whose product is the
    matrix (float64 1e-12, float32 1e-5 relative); full rank gives all 30; a search stopped at
    max_rank says it found more; a zero matrix has rank 0."""
    from pysparse_hpc.kernels.cpu.linalg import pivoted_cholesky
    rng = np.random.default_rng(5)
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        for rank in (7, 30):
            a = rng.standard_normal((30, rank)).astype(dtype)
            gram = a @ a.T
            rows = np.zeros((30, 30), dtype=dtype)
            tol = 30 * np.finfo(dtype).eps * gram.diagonal().max()
            found = pivoted_cholesky(gram, tol, 30, rows)
            assert found == rank
            factor = rows[:found].T
            np.testing.assert_allclose(factor @ factor.T, gram, rtol=0,
                                       atol=rtol * np.abs(gram).max())
            assert pivoted_cholesky(gram, tol, rank - 1, rows) == rank
    assert pivoted_cholesky(np.zeros((4, 4)), 0.0, 3, np.zeros((3, 4))) == 0


@pytest.mark.parametrize("shape, rank", [((12, 40), 5), ((40, 12), 5), ((12, 40), 12),
                                         ((6, 6), 0)])
def test_gram_factors_have_the_gradient_rank(shape, rank):
    """A gradient block of rank r < min(m, n) gets factors of r columns whose products are its
    two Gram matrices (1e-12 relative); full rank (or a search stopped below the rank) keeps
    G and G^T themselves."""
    from pysparse_hpc.precondition._roots import gram_factors
    rng = np.random.default_rng(6)
    block = torch.from_numpy(rng.standard_normal((shape[0], rank)) @
                             rng.standard_normal((rank, shape[1])))
    left, right = block @ block.T, block.T @ block
    f_left, f_right = gram_factors(block, left, right)
    if rank < min(shape):
        assert f_left.shape == (shape[0], rank) and f_right.shape == (shape[1], rank)
        scale = max(float(left.abs().max()), 1e-300)
        torch.testing.assert_close(f_left @ f_left.T, left, rtol=0, atol=1e-12 * scale)
        torch.testing.assert_close(f_right @ f_right.T, right, rtol=0, atol=1e-12 * scale)
    else:
        assert f_left is block and f_right.data_ptr() == block.data_ptr()
    if rank > 0:
        assert gram_factors(block, left, right, max_rank=rank - 1)[0] is block


def test_jorge_refreshes_from_the_batch_rank_without_the_larger_gram(monkeypatch):
    """A batch of 4 (rank 4 gradients, below every side but the last layer's 3): the wide
    roots refresh from 4 columns (2 for the 3-row output layer), the larger Gram matrix of
    such a block is never formed in the loop, and the run equals the NumPy formulas. Calling
    the steps by hand (`update_curvature` without a refresh) keeps full statistics."""
    calls, statistics = [], []

    def counted(root, factor, *args):
        calls.append(tuple(factor.shape))
        return series_root_update_factored(root, factor, *args)
    monkeypatch.setattr(jorge_module, "series_root_update_factored", counted)
    refresh = P.JorgeGradientMaker._refresh

    def watched(self, root, stats, *args):
        statistics.append(stats is None)
        return refresh(self, root, stats, *args)
    monkeypatch.setattr(P.JorgeGradientMaker, "_refresh", watched)
    x, t = batch((4, 20))
    config = P.PreconditioningConfig(damping=1e-3)
    gm = P.JorgeGradientMaker(model := mlp(), config)
    actual = train(gm, model, x, t, 5)
    expected, _ = reference_run(mlp(), x, t, 5, method="jorge", damping=1e-3, grafting="sgd")
    assert_grads_close(expected, actual)
    assert sorted(set(calls)) == [(8, 2), (8, 4), (16, 4), (20, 4)]
    assert sum(statistics) == 3 * 5   # one skipped Gram per weight and step
    model.zero_grad()
    F.cross_entropy(model(x), t).backward()
    gm.update_curvature()
    for name in gm.preconditioned_parameters():
        state = gm._blocks[name][0]
        if "L_stat" in state:
            assert state["L_stat"] is not None and state["R_stat"] is not None
    statistics.clear()
    gm.update_preconditioner()
    assert statistics and not any(statistics)

    """L and M diagonal in one basis: the refresh error against (a L + M)^-1/4 is third order
    in ||X|| (halving X divides it by ~8); clipping equals the series of the scaled M."""
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    lam, mu = rng.uniform(0.5, 2.0, 6), rng.uniform(0.0, 1.0, 6)
    L = torch.from_numpy((q * lam) @ q.T)
    root = torch.from_numpy((q * lam ** -0.25) @ q.T)
    errors = []
    for scale in (0.04, 0.02):
        M = torch.from_numpy((q * (scale * mu)) @ q.T)
        exact = torch.from_numpy(np_root((0.9 * L + M).numpy(), 0.0))
        new, clipped = series_root_update(root, M, 0.9, radius=1.0)
        assert not clipped
        errors.append(float((new - exact).norm() / exact.norm()))
    assert errors[0] < 1e-5 and 6 < errors[0] / errors[1] < 10
    M = torch.from_numpy((q * (5 * mu)) @ q.T)
    x_norm = float((torch.linalg.matrix_power(root, 4) @ M).norm() / 0.9)
    clipped, was_clipped = series_root_update(root, M, 0.9, radius=0.5)
    scaled, _ = series_root_update(root, M * (0.5 / x_norm), 0.9, radius=1.0)
    assert was_clipped and torch.allclose(clipped, scaled, rtol=1e-13, atol=0)


def test_jorge_tracks_shampoo_where_the_series_is_accurate():
    """b = 0.999 (ema_decay 0.001), damping 1 against a summed loss, so that
    ||X|| ~ 0.001 ||G G^T|| / 1 stays below the radius (measured max 0.26: no clipping);
    100 batches whose features span two decades of scale, fixed weights. Jorge's direction is
    within cosine 0.9999 of Shampoo's (measured > 0.99993), their difference is under 10% of
    Shampoo's distance from the plain gradient (measured 3.3-5.9%: Jorge keeps > 90% of the
    preconditioning) and the roots are within 1% (measured 0.01-0.4%)."""
    model = mlp()
    config = P.PreconditioningConfig(damping=1.0, ema_decay=0.001)
    shampoo = P.ShampooGradientMaker(copy.deepcopy(model), config, grafting="sgd")
    jorge = P.JorgeGradientMaker(copy.deepcopy(model), config, grafting="sgd")
    generator = torch.Generator().manual_seed(1)
    scales = torch.logspace(-1, 1, 20, dtype=DTYPE)
    for _ in range(100):
        x = torch.randn(32, 20, generator=generator, dtype=DTYPE) * scales
        t = torch.randint(0, 3, (32,), generator=generator)
        for gm in (shampoo, jorge):
            gm.model.zero_grad()
            dy = gm.setup_model_call(gm.model, x)
            gm.setup_loss_call(F.cross_entropy, dy, t, reduction="sum")
            gm.forward_and_backward()
    plain = copy.deepcopy(model)
    F.cross_entropy(plain(x), t, reduction="sum").backward()
    assert jorge.clipped_updates == 0
    for name in ("0.weight", "2.weight", "4.weight"):
        s = shampoo.model.get_parameter(name).grad.flatten()
        j = jorge.model.get_parameter(name).grad.flatten()
        g = plain.get_parameter(name).grad.flatten()
        assert F.cosine_similarity(s, j, 0) > 0.9999
        assert (s - j).norm() < 0.1 * (s - g).norm()
        for side in "LR":
            exact = shampoo.factors(name)[0][side + "_root"]
            approx = jorge.factors(name)[0][side + "h"]
            assert (approx - exact).norm() < 1e-2 * exact.norm()


# ---------------------------------------------------------------------- ASDL
@requires_asdl
def test_first_step_matches_asdl_then_its_damping_accumulates():
    """ASDL 0.1a5's Shampoo (float32, sums, coupled Newton roots of S + damping * l_max I):
    our first step with relative_damping=True agrees to 1e-4. After that ASDL's statistics hold
    the ridge of every root update (their trace grows by damping * l_max * n per step without
    new data) and its ``block_size`` is ignored, so the later steps differ on purpose."""
    x, t = batch((32, 20), dtype=torch.float32)
    runs = {}
    for library in ("asdl", "ours"):
        model = mlp(dtype=torch.float32)
        if library == "asdl":
            gm = asdl.ShampooGradientMaker(model, asdl.PreconditioningConfig(damping=1e-3),
                                           block_size=4)
        else:
            gm = P.ShampooGradientMaker(model, P.PreconditioningConfig(damping=1e-3),
                                        relative_damping=True)
        grads = []
        for _ in range(2):
            model.zero_grad()
            dy = gm.setup_model_call(model, x)
            gm.setup_loss_call(F.cross_entropy, dy, t)
            gm.forward_and_backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        runs[library] = gm, grads
    theirs, ours = runs["asdl"], runs["ours"]
    assert_grads_close(theirs[1][:1], ours[1][:1], rtol=1e-4)
    with pytest.raises(AssertionError):
        assert_grads_close(theirs[1][1:], ours[1][1:], rtol=1e-2)
    stats = theirs[0].preconditioners[0].statistics
    assert [tuple(s.shape) for s in stats] == [(16, 16), (20, 20)]  # block_size=4 not applied
    assert float(stats[0].trace()) > 1.01 * float(ours[0].factors("0.weight")[0]["L"].trace())


# ---------------------------------------------------------------------- what is preconditioned
def test_parameters_selected_and_listed():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.pos = nn.Parameter(torch.randn(4, 6) * 0.1)  # held by the container
            self.conv = nn.Conv2d(1, 2, 3, dilation=2, groups=1)  # K-FAC refuses dilation
            self.grouped = nn.Conv2d(2, 4, 1, groups=2)
            self.bn = nn.BatchNorm1d(6)
            self.fc = nn.Linear(6, 3)
            self.skip_me = nn.Linear(3, 3)
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x):
            h = self.grouped(self.conv(x)).mean((2, 3))  # n x 4
            h = (h @ self.pos).relu()  # n x 6
            return self.skip_me(self.fc(self.bn(h))) * self.scale

    config = P.PreconditioningConfig(damping=1e-3, ignore_modules=["skip_"])
    for grafting in ("sgd", "adagrad"):
        gm = P.ShampooGradientMaker(Net().to(DTYPE), config, grafting=grafting)
        matrices = ["conv.weight", "grouped.weight", "fc.weight", "pos"]
        vectors = ["conv.bias", "grouped.bias", "fc.bias"]
        assert list(gm.preconditioned_modules()) == ["conv", "grouped", "fc"]
        assert sorted(gm.preconditioned_parameters()) == sorted(
            matrices + (vectors if grafting == "adagrad" else []))
        reasons = gm.unpreconditioned_parameters()
        assert set(reasons) == {"bn.weight", "bn.bias", "skip_me.weight", "skip_me.bias",
                                "scale"} | (set(vectors) if grafting == "sgd" else set())
        if grafting == "sgd":
            assert "plain gradient (grafting='sgd')" in reasons["fc.bias"]
        assert gm.block_shapes("conv.weight") == [(2, 9)]
    model = Net().to(DTYPE)
    plain = copy.deepcopy(model)
    gm = P.ShampooGradientMaker(model, config, grafting="adagrad")
    x = torch.randn(8, 1, 7, 7, dtype=DTYPE)
    t = torch.randint(0, 3, (8,))
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    gm.forward_and_backward()
    F.cross_entropy(plain(x), t).backward()
    plain_grads = dict(plain.named_parameters())
    for name, param in model.named_parameters():
        same = torch.equal(param.grad, plain_grads[name].grad)
        assert same == (name in gm.unpreconditioned_parameters()), name
    assert torch.allclose(model.fc.bias.grad, plain.fc.bias.grad
                          / (plain.fc.bias.grad.abs() + GRAFT_EPS), rtol=1e-12)


def test_embedding_bare_leaf_and_padding_row():
    """nn.Embedding (V x d, blocks over V) keeps the padding row's zero gradient (to rounding):
    its row and column of L are zero, so L^-1/4 does not mix it into the other rows. A bare
    nn.Linear works as the model."""
    emb = nn.Embedding(11, 4, padding_idx=0).to(DTYPE)
    gm = P.ShampooGradientMaker(emb, P.PreconditioningConfig(damping=1e-3), block_size=6,
                                grafting="sgd")
    tokens = torch.tensor([[0, 3, 5, 7], [2, 0, 10, 9]])
    target = torch.randn(2, 4, 4, dtype=DTYPE)
    for _ in range(3):
        emb.zero_grad()
        dy = gm.setup_model_call(emb, tokens)
        gm.setup_loss_call(F.mse_loss, dy, target)
        gm.forward_and_backward()
    assert gm.block_shapes("weight") == [(6, 4), (5, 4)]
    grad = emb.weight.grad
    assert float(grad[0].abs().max()) <= 1e-12 * float(grad.abs().max())
    leaf = nn.Linear(20, 3).to(DTYPE)
    gm = P.JorgeGradientMaker(leaf, P.PreconditioningConfig(damping=1e-3))
    x, t = batch((32, 20))
    grads = train(gm, leaf, x, t, 2)
    assert list(gm.preconditioned_parameters()) == ["weight"]
    assert all(torch.isfinite(g).all() for step in grads for g in step)


class LoraLinear(nn.Module):
    """A LoRA-style leaf: a frozen base weight and trainable adapters of rank `rank`."""

    def __init__(self, inputs, outputs, rank=2):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(outputs, inputs), requires_grad=False)
        self.lora_A = nn.Parameter(torch.randn(rank, inputs) * 0.1)
        self.lora_B = nn.Parameter(torch.randn(outputs, rank) * 0.1)

    def forward(self, x):
        return x @ (self.weight + self.lora_B @ self.lora_A).T


@pytest.mark.parametrize("maker", ["ShampooGradientMaker", "JorgeGradientMaker"])
def test_trainable_adapters_beside_a_frozen_weight_are_preconditioned(maker):
    """Every trainable parameter with two or more dimensions is preconditioned, also in a leaf
    whose weight is frozen (it was left out, "the module's weight is frozen"): the adapters
    get the preconditioned gradients they get beside a trainable weight, each parameter having
    its own statistics. A frozen Linear's bias still keeps the plain gradient."""
    x, t = batch((16, 6))

    def run(weight_trains):
        torch.manual_seed(0)
        model = nn.Sequential(LoraLinear(6, 5), nn.Tanh(), nn.Linear(5, 3),
                              nn.Linear(3, 3)).to(DTYPE)
        model[0].weight.requires_grad_(weight_trains)
        model[3].weight.requires_grad_(False)
        gm = getattr(P, maker)(model, P.PreconditioningConfig(damping=1e-3))
        for _ in range(2):
            model.zero_grad()
            gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
            gm.forward_and_backward()
        return gm, model
    gm, model = run(weight_trains=False)
    assert list(gm.preconditioned_modules()) == ["0", "2"]
    assert list(gm.preconditioned_parameters()) == ["0.lora_A", "0.lora_B", "2.weight"]
    assert gm.unpreconditioned_parameters()["3.bias"] == "the module's weight is frozen"
    assert model[0].weight.grad is None
    reference = run(weight_trains=True)[1]
    plain = torch.autograd.grad(F.cross_entropy(model(x), t), model[0].lora_A)[0]
    assert not torch.allclose(model[0].lora_A.grad, plain)
    for name in ("lora_A", "lora_B"):
        torch.testing.assert_close(getattr(model[0], name).grad,
                                   getattr(reference[0], name).grad, rtol=1e-12, atol=0)


# ---------------------------------------------------------------------- resume
RESUME_CASES = {
    "shampoo-ema-blocks-adagrad": ("ShampooGradientMaker", dict(
        ema_decay=0.2, curvature_upd_interval=1, preconditioner_upd_interval=3),
        dict(block_size=5, grafting="adagrad")),
    "shampoo-sums": ("ShampooGradientMaker", dict(), dict()),
    "jorge-gathered-statistics": ("JorgeGradientMaker", dict(
        ema_decay=0.1, curvature_upd_interval=1, preconditioner_upd_interval=3),
        dict(block_size=5)),
    "jorge-first-statistics": ("JorgeGradientMaker", dict(preconditioner_upd_interval=2),
                               dict(init="first_statistics", grafting="adagrad")),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_state_dict_resume_bit_for_bit(case):
    """Run 8 steps; or run 5, save model, optimizer and maker (through torch.save), load them
    into fresh objects and run 3 more: the weights are equal bit for bit. Step 5 is between
    root updates, so Jorge's gathered statistics are in the state."""
    maker, schedule, options = RESUME_CASES[case]
    config = P.PreconditioningConfig(damping=1e-3, **schedule)
    x, t = batch((32, 2, 8, 8))

    def fresh():
        model = cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        return model, opt, getattr(P, maker)(model, config, **options)

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
    model, opt, gm = fresh()
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    gm.load_state_dict(saved["gm"])
    assert gm.step == 5
    if maker == "JorgeGradientMaker" and "curvature_upd_interval" in schedule:
        assert {"Lh", "Rh", "L_stat", "R_stat", "stat_decay"} == set(gm.factors("0.weight")[0])
    steps(model, opt, gm, 3)
    for e, p in zip(expected, model.parameters()):
        assert torch.equal(e, p.detach())


def test_load_state_dict_checks():
    x, t = batch((32, 20))
    gm = P.ShampooGradientMaker(mlp(), P.PreconditioningConfig(), block_size=8,
                                grafting="adagrad")
    train(gm, gm.model, x, t, 1)
    state = gm.state_dict()
    assert state["block_size"] == 8 and set(state["parameters"]["0.weight"]) == {"blocks",
                                                                                 "adagrad"}

    def other(**options):
        return P.ShampooGradientMaker(mlp(), P.PreconditioningConfig(),
                                      **{"block_size": 8, "grafting": "adagrad", **options})

    target = other()
    with pytest.warns(UserWarning, match="only the step"):
        target.load_state_dict({"step": 3})  # ASDL's state_dict
    assert target.step == 3
    with pytest.raises(ValueError, match="6 blocks for '0.weight', expected 1"):
        other(block_size=None).load_state_dict(state)
    with pytest.raises(ValueError, match="grafting='adagrad'.*grafting='sgd'"):
        other(grafting="sgd").load_state_dict(state)
    bad = copy.deepcopy(state)
    bad["parameters"]["0.weight"]["blocks"][0]["L"] = torch.eye(5, dtype=DTYPE)
    with pytest.raises(ValueError, match=r"shape \(5, 5\), expected \(8, 8\)"):
        target.load_state_dict(bad)
    assert target.step == 3  # a refused state changes nothing, its step included
    bad = copy.deepcopy(state)
    bad["parameters"]["0.weight"]["blocks"][0]["Lh"] = torch.eye(8, dtype=DTYPE)
    with pytest.raises(ValueError, match="unknown key 'Lh'"):
        target.load_state_dict(bad)
    bad = copy.deepcopy(state)
    del bad["parameters"]["4.bias"]
    with pytest.raises(ValueError, match=r"holds the parameters \['0.bias', .*\], this maker "
                                         r"the parameters \[.*'4.bias'"):
        target.load_state_dict(bad)
    bad["parameters"] = ["0.weight"]
    with pytest.raises(ValueError, match="holds the parameters list"):
        target.load_state_dict(bad)
    with pytest.raises(ValueError, match="from ShampooGradientMaker, expected Jorge"):
        P.JorgeGradientMaker(mlp(), P.PreconditioningConfig()).load_state_dict(state)


# ---------------------------------------------------------------------- bad input
def test_bad_input():
    config = P.PreconditioningConfig(damping=1e-3)
    for maker in (P.ShampooGradientMaker, P.JorgeGradientMaker):
        for size in (0, -2):
            with pytest.raises(ValueError, match=f"block_size must be an int >= 1.*got {size}"):
                maker(mlp(), config, block_size=size)
        with pytest.raises(TypeError, match="block_size must be an int"):
            maker(mlp(), config, block_size=2.5)
        with pytest.raises(ValueError, match="grafting must be one of"):
            maker(mlp(), config, grafting="adam")
        with pytest.raises(ValueError, match="grafting_epsilon must be a finite number > 0"):
            maker(mlp(), config, grafting_epsilon=0.0)
        with pytest.raises(ValueError, match="nothing to precondition.*expected at least one"):
            maker(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(3)), config)
        with pytest.raises(ValueError, match="nothing to precondition"):
            maker(mlp(), P.PreconditioningConfig(ignore_modules=[nn.Linear]))
        with pytest.raises(NotImplementedError, match="sparse=True"):
            maker(nn.Embedding(5, 3, sparse=True), config)
        with pytest.raises(NotImplementedError, match=r"nn.EmbeddingBag\(sparse=True\)"):
            maker(nn.EmbeddingBag(5, 3, sparse=True), config)
        with pytest.raises(TypeError, match="PreconditioningConfig"):
            maker(mlp(), {"damping": 1e-3})
    assert P.ShampooGradientMaker(mlp(), config, block_size=-1).block_size is None  # ASDL's
    with pytest.raises(NotImplementedError, match="sync_group"):
        P.ShampooGradientMaker(mlp(), config, sync_group=object())
    with pytest.raises(ValueError, match="ema_decay < 1"):
        P.JorgeGradientMaker(mlp(), P.PreconditioningConfig(ema_decay=1.0))
    with pytest.raises(ValueError, match="init must be one of"):
        P.JorgeGradientMaker(mlp(), config, init="eye")
    for radius in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"series_radius must be in \(0, 1.0\]"):
            P.JorgeGradientMaker(mlp(), config, series_radius=radius)
    with pytest.raises(KeyError, match="not a preconditioned matrix"):
        P.ShampooGradientMaker(mlp(), config).factors("0.bias")


# ---------------------------------------------------------------------- non-finite values
class Scaled(nn.Module):
    """A loss ``sum(y * scale)``: finite, with gradients as large as `scale` makes them."""
    reduction = "mean"

    def forward(self, y, scale):
        return (y * scale).sum()


@pytest.mark.parametrize("maker", ["ShampooGradientMaker", "JorgeGradientMaker"])
def test_overflowing_statistics_are_skipped(maker):
    """float32 gradients near 1e21: G G^T overflows. The statistics update is refused with a
    RuntimeWarning, the previous statistics and roots stay (the same tensors), the step is
    preconditioned with them and no gradient holds NaN or inf."""
    model = mlp(dtype=torch.float32)
    gm = getattr(P, maker)(model, P.PreconditioningConfig(damping=1e-3), grafting="sgd")
    x, _ = batch((32, 20), dtype=torch.float32)
    loss = Scaled()
    for step, scale in enumerate((1.0, 1e19)):
        before = {name: gm.factors(name)[0] for name in ("0.weight", "2.weight", "4.weight")}
        model.zero_grad()
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(loss, dy, torch.full((32, 3), scale))
        if step == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                gm.forward_and_backward()
            continue
        with pytest.warns(RuntimeWarning, match="step 1: non-finite statistics in parameter"):
            gm.forward_and_backward()
        assert not gm.last_step_skipped
        for name, saved in before.items():
            now = gm.factors(name)[0]
            assert set(now) == set(saved)
            for key in saved:  # the statistics are kept; Shampoo's roots recomputed from them
                assert now[key] is saved[key] or (key.endswith("_root")
                                                  and torch.equal(now[key], saved[key]))
        grads = [p.grad for p in model.parameters()]
        assert all(torch.isfinite(g).all() for g in grads)
        assert max(float(g.abs().max()) for g in grads) > 1e15


def _weighted_sum(y, weights, reduction="mean"):
    return (y.float() * weights).sum()


@pytest.mark.parametrize("maker", ["ShampooGradientMaker", "JorgeGradientMaker"])
def test_half_precision_direction_that_overflows_leaves_the_gradient(maker):
    """A float16 weight: roots from a tiny gradient in one direction, then a gradient of 100
    in the direction their statistics never saw, which the roots scale by about
    ``damping^-1/2 = 1e4``. The float32 direction is finite but overflows float16: a
    RuntimeWarning, and the gradient stays as the backward left it (no inf)."""
    model = nn.Linear(2, 2, bias=False).half()
    gm = getattr(P, maker)(model, P.PreconditioningConfig(
        damping=1e-8, curvature_upd_interval=1, preconditioner_upd_interval=100),
        grafting=None)
    x = torch.eye(2, dtype=torch.float16)
    weights = torch.tensor([[1e-3, 0.0], [0.0, 100.0]])
    for step in range(2):
        model.zero_grad()
        dy = gm.setup_model_call(model, x[step:step + 1])
        gm.setup_loss_call(_weighted_sum, dy, weights[step:step + 1])
        if step == 0:
            gm.forward_and_backward()
            continue
        with pytest.warns(RuntimeWarning, match="step 1: preconditioned gradient that "
                                                "overflows torch.float16 in parameter 'weight'"):
            gm.forward_and_backward()
    expected = torch.tensor([[0.0, 0.0], [0.0, 100.0]], dtype=torch.float16)
    assert torch.equal(model.weight.grad, expected)


def test_nan_gradient_skips_step_and_unchecked_nan_is_not_spread():
    """check_finite (default): a NaN input skips the step (the base loop's warning, gradients
    zeroed, statistics untouched). check_finite=False: the statistics refuse the NaN, the
    gradient is left as it came (its NaN stays where autograd put it) with a warning, and the
    next clean step is preconditioned as usual."""
    x, t = batch((32, 20))
    bad = x.clone()
    bad[3, 5] = float("nan")
    for check in (True, False):
        model = mlp()
        gm = P.ShampooGradientMaker(model, P.PreconditioningConfig(damping=1e-3),
                                    grafting="sgd", check_finite=check)
        for step, inputs in enumerate((x, bad, x)):
            before = gm.factors("2.weight")[0]
            model.zero_grad()
            dy = gm.setup_model_call(model, inputs)
            gm.setup_loss_call(F.cross_entropy, dy, t)
            if step != 1:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    gm.forward_and_backward()
                assert all(torch.isfinite(p.grad).all() for p in model.parameters())
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                gm.forward_and_backward()
            messages = " ".join(str(w.message) for w in caught)
            now = gm.factors("2.weight")[0]
            assert now["L"] is before["L"] and now["R"] is before["R"]
            assert torch.equal(now["L_root"], before["L_root"])
            if check:
                assert "non-finite gradient" in messages and gm.last_step_skipped
                assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
            else:
                assert "non-finite statistics" in messages and not gm.last_step_skipped
                plain = mlp()
                F.cross_entropy(plain(inputs), t).backward()
                for p, q in zip(model.parameters(), plain.parameters()):
                    assert torch.equal(torch.isnan(p.grad), torch.isnan(q.grad))


def test_inverse_root_edge_cases():
    zero = torch.zeros(3, 3, dtype=DTYPE)
    assert torch.allclose(inverse_root(zero, 1e-4), 10.0 * torch.eye(3, dtype=DTYPE))
    assert torch.allclose(inverse_root(zero, 1e-4, relative=True), 10.0 * torch.eye(3,
                                                                                    dtype=DTYPE))
    rank_one = torch.tensor([[4.0, 0.0], [0.0, 0.0]], dtype=DTYPE)
    root = inverse_root(rank_one, 1e-2, relative=True)  # eps = 1e-2 * 4
    assert torch.allclose(root.diagonal(), torch.tensor([4.04, 0.04], dtype=DTYPE) ** -0.25)
    assert block_bounds(7, 7) == [(0, 7)] and block_bounds(8, 3) == [(0, 3), (3, 6), (6, 8)]


def test_the_inverse_root_of_a_rank_deficient_float32_statistic_is_finite():
    """G G^T over fewer examples than rows has zero eigenvalues, which float32's eigh gives
    as small negatives (-1e-5 here): below a damping of 1e-7 their power was NaN, the root
    refused, and Shampoo kept a stale one. They count as zeros."""
    torch.manual_seed(0)
    factor = torch.randn(64, 4)
    statistic = factor @ factor.T
    eigenvalues, eigenvectors = torch.linalg.eigh(statistic)
    assert eigenvalues.min() < -1e-7    # the rounding the clamp is there for
    root = inverse_root(statistic, 1e-7)
    assert root is not None and torch.isfinite(root).all()
    expected = (eigenvectors * (eigenvalues.clamp(min=0) + 1e-7) ** -0.25) @ eigenvectors.T
    torch.testing.assert_close(root, expected)


def test_an_interrupted_jorge_refresh_leaves_no_partial_statistics(monkeypatch):
    """A refresh that raises (here the thin update) propagates, and the fresh blocks' half-formed
    statistics (the larger Gram matrix is not formed in the loop) are dropped: the state saves
    and the next step runs."""
    x, t = batch((4, 20))
    gm = P.JorgeGradientMaker(model := mlp(), P.PreconditioningConfig(damping=1e-3))

    def broken(*args):
        raise RuntimeError("interrupted")
    monkeypatch.setattr(jorge_module, "series_root_update_factored", broken)
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x), t)
    with pytest.raises(RuntimeError, match="interrupted"):
        gm.forward_and_backward()
    assert all("L_stat" not in state for states in gm._blocks.values() for state in states)
    gm.state_dict()
    monkeypatch.undo()
    gm.forward_and_backward()


@pytest.mark.parametrize("maker, groups", [
    ("ShampooGradientMaker", [("L", "R"), ("L_root", "R_root")]),
    ("JorgeGradientMaker", [("Lh", "Rh"), ("L_stat", "R_stat", "stat_decay")])])
def test_load_state_dict_refuses_a_block_missing_part_of_a_pair(maker, groups):
    """A block stores its two sides (and Jorge's gathered statistics their decay) together: a
    state missing one is refused with ValueError naming the block, and the maker keeps its
    state. Accepted, a missing R restarted from the next gradient alone, a missing decay
    counted as 1, and a missing root failed at the next step with a KeyError."""
    x, t = batch((32, 20))
    config = P.PreconditioningConfig(damping=1e-3, ema_decay=0.1, curvature_upd_interval=1,
                                     preconditioner_upd_interval=3)
    gm = getattr(P, maker)(mlp(), config)
    train(gm, gm.model, x, t, 2)   # Jorge: roots, and statistics gathered since
    state = gm.state_dict()
    block = state["parameters"]["0.weight"]["blocks"][0]
    assert {key for group in groups for key in group} == set(block)
    target = getattr(P, maker)(mlp(), config)
    for group in groups:
        for key in group:
            bad = copy.deepcopy(state)
            del bad["parameters"]["0.weight"]["blocks"][0][key]
            with pytest.raises(ValueError, match=f"block 0 of '0.weight' holds .* without "
                                                 f"\\['{key}'\\]"):
                target.load_state_dict(bad)
            assert target.step == 0 and target.factors("0.weight") == [{}]
    if maker == "JorgeGradientMaker":
        bad = copy.deepcopy(state)
        bad["parameters"]["0.weight"]["blocks"][0]["stat_decay"] = "0.9"
        with pytest.raises(TypeError, match="stat_decay of block 0 of '0.weight' must be a "
                                            "float, got str"):
            target.load_state_dict(bad)
    target.load_state_dict(state)
    assert target.step == 2


@pytest.mark.parametrize("maker, option", [("ShampooGradientMaker", "relative_damping"),
                                           ("ShampooGradientMaker", "check_finite"),
                                           ("JorgeGradientMaker", "symmetrize")])
def test_flags_must_be_bools(maker, option):
    """A flag given as a string (``"False"`` is truthy) or a number is a TypeError naming it,
    not silently taken as True."""
    for value in ("False", 1, None):
        with pytest.raises(TypeError, match=f"{option} must be a bool"):
            getattr(P, maker)(mlp(), P.PreconditioningConfig(), **{option: value})
    assert getattr(getattr(P, maker)(mlp(), P.PreconditioningConfig(),
                                     **{option: np.bool_(False)}), option) is False
