"""Differential fuzzing of pysparse_hpc.precondition: random module configurations (Linear,
Conv2d, Embedding, shared and off-path modules) and PreconditioningConfig settings against plain
float64 references of the documented formulas (K-FAC with pi-damping, the diagonal Fisher,
Shampoo's blocked and grafted roots, Jorge's series), state_dict resumes bit for bit, and the
modules a maker cannot precondition refused or listed rather than silently half-done."""
import copy
import io
import math
import random
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from pysparse_hpc import precondition as P  # noqa: E402
from pysparse_hpc.precondition.config import _schedules  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning",
                                        "ignore:.*weight_norm.*:FutureWarning")

DTYPE = torch.float64
RTOL = 1e-8


# ---------------------------------------------------------------------- random models
class _Shared(nn.Module):
    """One Linear called on both halves of the batch (K-FAC's "expand" form)."""

    def __init__(self, lin, head):
        super().__init__()
        self.lin, self.head = lin, head

    def forward(self, x):
        a, b = x.chunk(2)
        return self.head(torch.cat([torch.tanh(self.lin(a)), torch.tanh(self.lin(b))]))


class _Embed(nn.Module):
    def __init__(self, emb, head):
        super().__init__()
        self.emb, self.head = emb, head

    def forward(self, x):
        e = self.emb(x)
        return self.head(e.mean(1) if e.ndim == 3 else e)


class _OffPath(nn.Module):
    """``c`` runs in the forward but does not reach the loss."""

    def __init__(self, a, b, c):
        super().__init__()
        self.a, self.b, self.c = a, b, c

    def forward(self, x):
        self.c(x)
        return self.b(torch.relu(self.a(x)))


def random_model(rng, kinds=("linear", "conv", "embedding", "shared", "offpath")):
    """``(model, x, t)`` of float64, of a random kind and configuration."""
    kind = rng.choice(kinds)
    classes = rng.randint(2, 4)
    n = rng.choice([1, 2, 5, 12])
    if kind == "linear":
        i, h = rng.randint(1, 40), rng.randint(1, 40)
        model = nn.Sequential(nn.Linear(i, h, bias=rng.random() < .5), nn.Tanh(),
                              nn.Linear(h, classes, bias=rng.random() < .5))
        x = torch.randn(n, i, dtype=DTYPE)
    elif kind == "conv":
        c, o = rng.randint(1, 3), rng.randint(1, 4)
        kh, kw = rng.randint(1, 5), rng.randint(1, 5)
        padding = rng.choice([0, 1, (rng.randint(0, 2), rng.randint(0, 2)), "same", "valid"])
        stride = 1 if padding == "same" else rng.choice([1, 2, (1, 2), (2, 1)])
        # A padding mode pads nothing without padding: such convolutions are supported too.
        mode = "zeros" if padding not in (0, "valid") else rng.choice(["zeros", "reflect"])
        conv = nn.Conv2d(c, o, (kh, kw), stride=stride, padding=padding, padding_mode=mode,
                         bias=rng.random() < .5)
        x = torch.randn(n, c, rng.randint(kh, 8), rng.randint(kw, 8), dtype=DTYPE)
        width = conv.to(DTYPE)(x).flatten(1).shape[1]
        model = nn.Sequential(conv, nn.Tanh(), nn.Flatten(), nn.Linear(width, classes))
    elif kind == "embedding":
        vocab, dim = rng.randint(2, 30), rng.randint(1, 10)
        emb = nn.Embedding(vocab, dim, padding_idx=rng.choice([None, 0, vocab - 1]),
                           max_norm=rng.choice([None, 1.0]))
        model = _Embed(emb, nn.Linear(dim, classes))
        shape = (n, rng.randint(1, 5)) if rng.random() < .7 else (n,)
        x = torch.randint(0, vocab, shape)
    elif kind == "shared":
        i, h = rng.randint(1, 20), rng.randint(1, 20)
        model = _Shared(nn.Linear(i, h), nn.Linear(h, classes))
        x = torch.randn(max(n, 2) // 2 * 2, i, dtype=DTYPE)
    else:
        i, h = rng.randint(1, 20), rng.randint(1, 20)
        model = _OffPath(nn.Linear(i, h), nn.Linear(h, classes), nn.Linear(i, 2))
        x = torch.randn(n, i, dtype=DTYPE)
    return model.to(DTYPE), x, torch.randint(0, classes, (x.shape[0],))


# ---------------------------------------------------------------------- references
def captured(model, names, x, t, data_size, summed_loss=None):
    """``{name: [(input, output gradient of the summed loss)]}`` of every call, and the plain
    gradients of ``sum loss / data_size`` left in ``model``. The loss is the cross-entropy of
    ``model(x)`` against ``t`` unless ``summed_loss()`` computes it (a masked GNN loss)."""
    calls = {name: [] for name in names}
    handles = []
    for name, module in model.named_modules():
        if name in names:
            def hook(mod, args, out, name=name):
                entry = [args[0].detach(), None]
                calls[name].append(entry)
                out.register_hook(lambda g, entry=entry: entry.__setitem__(1, g * data_size))
            handles.append(module.register_forward_hook(hook))
    loss = summed_loss() if summed_loss else F.cross_entropy(model(x), t, reduction="sum")
    loss.div(data_size).backward()
    for handle in handles:
        handle.remove()
    return calls


def patches(conv, x):
    """im2col by ``F.unfold``, with torch's odd ``"same"`` padding on the right and bottom."""
    kh, kw = conv.kernel_size
    padding = conv.padding
    if isinstance(padding, str):
        if padding == "same":
            x = F.pad(x, [(kw - 1) // 2, kw // 2, (kh - 1) // 2, kh // 2])
        padding = 0
    return F.unfold(x, (kh, kw), padding=padding, stride=conv.stride)


def kfac_factors(module, calls, data_size):
    """``(A, B)`` of the documented formulas, or None when no call reached the loss."""
    A = B = None
    for x, d in calls:
        if d is None:
            continue
        if isinstance(module, nn.Linear):
            X, D = x.reshape(-1, x.shape[-1]), d.reshape(-1, d.shape[-1])
            a, b = X.T @ X, D.T @ D
        elif isinstance(module, nn.Conv2d):
            cols = patches(module, x)
            a = torch.einsum("nil,njl->ij", cols, cols) / cols.shape[2]
            D = d.transpose(0, 1).reshape(d.shape[1], -1)
            b = D @ D.T
        else:
            index = x.reshape(-1, 1) if x.ndim == 1 else x
            counts = torch.zeros(index.shape[0], module.num_embeddings, dtype=DTYPE)
            counts.scatter_add_(1, index, torch.ones(index.shape, dtype=DTYPE))
            if module.padding_idx is not None:
                counts[:, module.padding_idx] = 0
            D = d.reshape(-1, d.shape[-1])
            a, b = counts.T @ counts, D.T @ D
        A, B = (a, b) if A is None else (A + a, B + b)
    return None if A is None else (A / data_size, B / data_size)


def kfac_expected(module, A, B, damping, use_pi=True):
    """``(B + d_B I)^-1 G (A + d_A I)^-1`` (an embedding: ``A^-1 G B^-1``), pi-damped."""
    root = math.sqrt(damping)
    d_a = d_b = root
    if use_pi:
        pi = math.sqrt((float(A.trace()) / len(A)) / (float(B.trace()) / len(B)))
        d_a, d_b = max(root * pi, 1e-7), max(root / pi, 1e-7)
    A_inv = torch.linalg.inv(A + d_a * torch.eye(len(A), dtype=DTYPE))
    B_inv = torch.linalg.inv(B + d_b * torch.eye(len(B), dtype=DTYPE))
    g = module.weight.grad
    out = {"weight": (A_inv @ g @ B_inv if isinstance(module, nn.Embedding)
                      else (B_inv @ g.reshape(len(g), -1) @ A_inv).view_as(g))}
    if getattr(module, "bias", None) is not None and module.bias.grad is not None:
        out["bias"] = B_inv @ module.bias.grad
    return out


def diag_factors(module, calls, data_size):
    """The diagonal Fisher ``(weight, bias)`` of the documented formulas, or None."""
    weight = bias = None
    for x, d in calls:
        if d is None:
            continue
        b = None
        if isinstance(module, nn.Linear):
            X, D = x.reshape(-1, x.shape[-1]), d.reshape(-1, d.shape[-1])
            w, b = (D * D).T @ (X * X), (D * D).sum(0)
        elif isinstance(module, nn.Conv2d):
            D = d.flatten(2)
            per_example = torch.bmm(D, patches(module, x).transpose(1, 2))
            w, b = per_example.square().sum(0).view_as(module.weight), D.sum(2).square().sum(0)
        else:
            D = d.reshape(-1, d.shape[-1])
            w = torch.zeros_like(module.weight).index_add_(0, x.reshape(-1), D * D)
            if module.padding_idx is not None:
                w[module.padding_idx] = 0
        weight = w if weight is None else weight + w
        if b is not None:
            bias = b if bias is None else bias + b
    if weight is None:
        return None
    return weight / data_size, None if bias is None else bias / data_size


def assert_close(actual, expected, what, rtol=RTOL):
    err = float((actual - expected).norm() / max(float(expected.norm()), 1e-300))
    assert err <= rtol, f"{what}: relative error {err:.2e}"


def random_natural_config(rng, rows):
    config = dict(data_size=rows if rng.random() < .6 else rng.randint(1, 40),
                  damping=rng.choice([1e-3, 1e-1, 10.0]))
    if rng.random() < .5:
        config["ema_decay"] = rng.choice([0.1, 0.5, 1.0])
    schedule = rng.random()
    if schedule < .3:
        config.update(preconditioner_upd_interval=rng.randint(1, 3),
                      preconditioner_warmup_steps=rng.randint(0, 2))
    elif schedule < .6:
        config.update(curvature_upd_interval=rng.randint(1, 3),
                      curvature_warmup_steps=rng.randint(0, 1),
                      preconditioner_upd_interval=rng.randint(1, 3))
    return config


# ---------------------------------------------------------------------- K-FAC, diagonal
@pytest.mark.parametrize("maker", ["kfac", "diag"])
@pytest.mark.parametrize("seed", range(6))
def test_natural_makers_match_the_float64_reference(maker, seed):
    """Random modules, data sizes, dampings, schedules and moving averages: every step's
    preconditioned gradients equal the documented formulas (empirical Fisher) to 1e-8, and the
    parameters left alone keep the plain gradient."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model, x, t = random_model(rng)
    config = random_natural_config(rng, x.shape[0])
    use_pi = maker == "diag" or rng.random() < .8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the off-path module's warning, expected
        if maker == "kfac":
            gm = P.KfacGradientMaker(model, P.PreconditioningConfig(**config),
                                     fisher_type="emp", pi_damping=use_pi)
        else:
            gm = P.DiagNaturalGradientMaker(model, P.PreconditioningConfig(**config),
                                            fisher_type="emp")
    curvature_step, preconditioner_step = _schedules(gm.config)
    names = set(gm.preconditioned_modules())
    ema, damping, data_size = config.get("ema_decay", -1), config["damping"], config["data_size"]
    kept = {name: {} for name in names}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    reference = copy.deepcopy(model)
    for step in range(4):
        opt.zero_grad()
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm.forward_and_backward()
        curvature = curvature_step(step, quiet=True)
        reference.zero_grad()
        if curvature:
            calls = captured(reference, names, x, t, data_size)
        else:
            F.cross_entropy(reference(x), t).backward()
        ours = dict(model.named_parameters())
        modules = dict(reference.named_modules())
        for name in names:
            module, state = modules[name], kept[name]
            new = None
            if curvature:
                new = (kfac_factors if maker == "kfac" else diag_factors)(
                    module, calls[name], data_size)
            if new is not None:
                if ema == -1:
                    state["factors"] = state["inverted"] = new
                else:
                    old = state.get("factors")
                    state["factors"] = tuple(
                        None if b is None else ema * b if a is None else (1 - ema) * a + ema * b
                        for a, b in zip(old or (None, None), new))
            if ema != -1 and preconditioner_step(step, quiet=True) and "factors" in state:
                state["inverted"] = state["factors"]
            if "inverted" not in state:
                expected = {k: p.grad for k, p in module.named_parameters(recurse=False)}
            elif maker == "kfac":
                expected = kfac_expected(module, *state["inverted"], damping, use_pi)
            else:
                weight, bias = state["inverted"]
                expected = {"weight": module.weight.grad / (weight + damping)}
                if bias is not None and module.bias is not None:
                    expected["bias"] = module.bias.grad / (bias + damping)
            for key, value in expected.items():
                if value is None:   # off the loss's path
                    assert ours[f"{name}.{key}"].grad is None
                else:
                    assert_close(ours[f"{name}.{key}"].grad, value, f"step {step}, {name}.{key}")
        plain = dict(reference.named_parameters())
        for name in gm.unpreconditioned_parameters():
            assert (ours[name].grad is None) == (plain[name].grad is None)
            if plain[name].grad is not None:
                torch.testing.assert_close(ours[name].grad, plain[name].grad)
        opt.step()
        reference.load_state_dict(model.state_dict())


# ---------------------------------------------------------------------- Shampoo, Jorge
def _blocks(dim, size):
    if size is None or dim <= size:
        return [(0, dim)]
    return [(start, min(start + size, dim)) for start in range(0, dim, size)]


def _inverse_root(M, eps, relative=False):
    values, vectors = torch.linalg.eigh(M)
    values = values.clamp(min=0)
    if relative and values[-1] > 0:
        eps = eps * float(values[-1])
    return (vectors * (values + eps) ** -0.25) @ vectors.T


def _series(root, M, decay, eps, radius, symmetrize):
    eye = torch.eye(len(M), dtype=DTYPE)
    X = torch.linalg.matrix_power(root, 4) @ (M + (1 - decay) * eps * eye) / decay
    norm = float(X.norm())
    if norm > radius:
        X = X * (radius / norm)
    new = decay ** -0.25 * root @ (eye - X / 4 + 5 / 32 * X @ X)
    return (new + new.T) / 2 if symmetrize else new


def _root_model(rng):
    """A Linear pair, a convolution of any groups, dilation and padding mode, or an
    embedding: every weight is a matrix to Shampoo and Jorge."""
    if rng.random() < .5:
        return random_model(rng, ("linear", "embedding"))
    groups = rng.choice([1, 2])
    c, o = groups * rng.randint(1, 2), groups * rng.randint(1, 2)
    kh, kw, dilation = rng.randint(1, 4), rng.randint(1, 4), rng.choice([1, 2])
    conv = nn.Conv2d(c, o, (kh, kw), padding=rng.choice([0, 1, "same"]), dilation=dilation,
                     groups=groups, padding_mode=rng.choice(["zeros", "circular", "replicate"]),
                     bias=rng.random() < .5).to(DTYPE)
    x = torch.randn(rng.choice([1, 4]), c, 2 * kh + 2, 2 * kw + 2, dtype=DTYPE)
    model = nn.Sequential(conv, nn.Tanh(), nn.Flatten(),
                          nn.Linear(conv(x).flatten(1).shape[1], 3)).to(DTYPE)
    return model, x, torch.randint(0, 3, (x.shape[0],))


@pytest.mark.parametrize("maker", ["shampoo", "jorge"])
@pytest.mark.parametrize("seed", range(5))
def test_root_makers_match_the_float64_reference(maker, seed):
    """Random parameters, blocks, graftings, moving averages, schedules and (Jorge) starts,
    radii and symmetrisation: every step's gradients equal the documented formulas to 1e-8.
    The damping stays >= 1e-2: below, Jorge's refresh of rank-one statistics amplifies
    rounding by ~100x per step (both implementations alike), which is no test of either."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model, x, t = _root_model(rng)
    damping = rng.choice([1e-2, 1.0])
    config = dict(damping=damping)
    if rng.random() < .5:
        config["ema_decay"] = rng.choice([0.1, 0.5] + ([1.0] if maker == "shampoo" else []))
    if rng.random() < .6:
        config.update(curvature_upd_interval=rng.choice([1, 2]),
                      preconditioner_upd_interval=rng.choice([1, 2, 4]),
                      preconditioner_warmup_steps=rng.randint(0, 2))
    block_size = rng.choice([None, 1, 2, 3, 16])
    grafting = rng.choice([None, "sgd", "adagrad"])
    relative = init = radius = symmetrize = None
    if maker == "shampoo":
        relative = rng.random() < .3
        gm = P.ShampooGradientMaker(model, P.PreconditioningConfig(**config),
                                    block_size=block_size, grafting=grafting,
                                    relative_damping=relative)
    else:
        init = rng.choice(["identity", "first_statistics"])
        radius, symmetrize = rng.choice([0.1, 0.5, 1.0]), rng.random() < .8
        gm = P.JorgeGradientMaker(model, P.PreconditioningConfig(**config),
                                  block_size=block_size, grafting=grafting, init=init,
                                  series_radius=radius, symmetrize=symmetrize)
    curvature_step, preconditioner_step = _schedules(gm.config)
    ema = config.get("ema_decay", -1)
    decay, weight = (1 - ema, ema) if ema != -1 else (1.0, 1.0)
    states = {name: {} for name in gm.preconditioned_parameters()}
    adagrad = {}
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        opt.zero_grad()
        reference = copy.deepcopy(model)
        F.cross_entropy(reference(x), t).backward()
        plain = {name: p.grad for name, p in reference.named_parameters()}
        dy = gm.setup_model_call(model, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
        ours = dict(model.named_parameters())
        for name, blocks in states.items():
            g = plain[name]
            if g.ndim == 1:   # Adagrad grafting's step
                adagrad[name] = adagrad.get(name, 0) + g * g
                assert_close(ours[name].grad, g / (adagrad[name].sqrt() + 1e-8), name)
                continue
            G = g.reshape(len(g), -1)
            out, rooted = G.clone(), False
            for r0, r1 in _blocks(G.shape[0], block_size):
                for c0, c1 in _blocks(G.shape[1], block_size):
                    s = blocks.setdefault((r0, c0), {})
                    Gb = G[r0:r1, c0:c1]
                    if curvature_step(step, quiet=True):
                        for key, new in (("L", Gb @ Gb.T), ("R", Gb.T @ Gb)):
                            s[key] = weight * new if key not in s else decay * s[key] + weight * new
                        s["a"] = s.get("a", 1.0) * decay
                    if preconditioner_step(step, quiet=True) and "L" in s:
                        for side in ("L", "R"):
                            if maker == "shampoo":
                                s[side + "h"] = _inverse_root(s[side], damping, relative)
                            elif side + "h" not in s and init == "first_statistics":
                                s[side + "h"] = _inverse_root(s[side], damping)
                            else:
                                start = damping ** -0.25 * torch.eye(len(s[side]), dtype=DTYPE)
                                s[side + "h"] = _series(s.get(side + "h", start), s[side],
                                                        s["a"], damping, radius, symmetrize)
                        if maker == "jorge":   # its statistics start again after a refresh
                            del s["L"], s["R"], s["a"]
                    if "Lh" in s:
                        rooted = True
                        out[r0:r1, c0:c1] = s["Lh"] @ Gb @ s["Rh"]
            target = None
            if grafting == "sgd":
                target = G.norm()
            elif grafting == "adagrad":
                adagrad[name] = adagrad.get(name, 0) + G * G
                target = (G / (adagrad[name].sqrt() + 1e-8)).norm()
            if target is not None and (rooted or grafting == "adagrad"):
                out = out * (target / out.norm())
            assert_close(ours[name].grad, out.view_as(g), f"step {step}, {name}")
        opt.step()


# ---------------------------------------------------------------------- resume
@pytest.mark.parametrize("seed", range(4))
def test_a_run_resumed_from_a_saved_state_continues_bit_for_bit(seed):
    """Any maker, Fisher, dtype, schedule and moving average: a state saved with torch.save
    after a few steps, loaded into a new maker on the saved model, gives the uninterrupted
    run's gradients exactly."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    which = ["kfac", "diag", "shampoo", "jorge"][seed % 4]
    model, x, t = random_model(rng, ("linear", "conv", "embedding", "shared"))
    dtype = rng.choice([torch.float32, torch.float64])
    model = model.to(dtype)
    x = x.to(dtype) if x.is_floating_point() else x
    config = dict(damping=rng.choice([1e-3, 1e-1]), data_size=x.shape[0])
    if rng.random() < .5:
        config["ema_decay"] = rng.choice([0.1, 0.5])
    if rng.random() < .5:
        config.update(curvature_upd_interval=rng.randint(1, 2),
                      preconditioner_upd_interval=rng.randint(1, 3))
    fisher, block_size = rng.choice(["emp", "mc", "exact"]), rng.choice([None, 2, 5])
    grafting = rng.choice([None, "sgd", "adagrad"])

    def build(m):
        c = P.PreconditioningConfig(**config)
        if which == "kfac":
            return P.KfacGradientMaker(m, c, fisher_type=fisher)
        if which == "diag":
            return P.DiagNaturalGradientMaker(m, c, fisher_type=fisher)
        Maker = P.ShampooGradientMaker if which == "shampoo" else P.JorgeGradientMaker
        return Maker(m, c, block_size=block_size, grafting=grafting)

    def step(gm, m, opt):
        opt.zero_grad()
        dy = gm.setup_model_call(m, x)
        gm.setup_loss_call(F.cross_entropy, dy, t)
        gm.forward_and_backward()
        grads = [None if p.grad is None else p.grad.clone() for p in m.parameters()]
        opt.step()
        return grads

    fresh = copy.deepcopy(model)
    gm, opt = build(model), torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    for _ in range(rng.randint(1, 3)):
        step(gm, model, opt)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "maker": gm.state_dict(),
                "rng": torch.get_rng_state()}, buffer)
    uninterrupted = [step(gm, model, opt) for _ in range(3)]
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    fresh.load_state_dict(saved["model"])
    resumed_gm = build(fresh)
    resumed_gm.load_state_dict(saved["maker"])
    resumed_opt = torch.optim.SGD(fresh.parameters(), lr=0.02, momentum=0.9)
    resumed_opt.load_state_dict(saved["opt"])
    torch.set_rng_state(saved["rng"])
    for k, expected in enumerate(uninterrupted):
        for i, (a, b) in enumerate(zip(expected, step(resumed_gm, fresh, resumed_opt))):
            assert (a is None) == (b is None), (k, i)
            assert a is None or torch.equal(a, b), (k, i)


# ---------------------------------------------------------------------- GNN layers
@pytest.mark.parametrize("seed", range(3))
def test_gnn_layers_dense_transforms_match_the_reference(seed):
    """GCN and GAT models on a random graph with a masked loss: ``conv.lin`` is preconditioned
    as the Linear of the node features and the gradient w.r.t. ``X W``; AGNN's propagation
    and every layer's bias keep the plain gradient."""
    sp = pytest.importorskip("scipy.sparse")
    import numpy as np
    import pysparse_hpc as sph
    from pysparse_hpc.nn import models
    rng = random.Random(seed)
    torch.manual_seed(seed)
    n, d, classes = rng.randint(5, 25), rng.randint(1, 12), 3
    adj = sp.random(n, n, density=0.2, random_state=seed, format="csr")
    adj = ((adj + adj.T) > 0).astype(np.float64).tocsr()
    adj.setdiag(0)
    adj.eliminate_zeros()
    adj = sph.csr_array(adj)
    model = [models.GCN(d, hidden=4, out_channels=classes, dropout=0.0),
             models.GAT(d, hidden=2, out_channels=classes, heads=2, dropout=0.0),
             models.AGNN(d, hidden=4, out_channels=classes, dropout=0.0)][seed].to(DTYPE)
    x, t = torch.randn(n, d, dtype=DTYPE), torch.randint(0, classes, (n,))
    mask = torch.rand(n) < 0.6
    mask[0] = True
    data_size, damping = int(mask.sum()), 1e-2
    reference = copy.deepcopy(model)
    gm = P.KfacGradientMaker(model, P.PreconditioningConfig(data_size=data_size,
                                                            damping=damping),
                             fisher_type="emp")
    dy = gm.setup_model_call(model, x, adj)
    gm.setup_loss_call(F.cross_entropy, dy[mask], t[mask])
    gm.forward_and_backward()
    names = set(gm.preconditioned_modules())
    assert names   # GCN and GAT: each conv.lin; AGNN: its two Linear layers
    calls = captured(reference, names, x, t, data_size, summed_loss=lambda: F.cross_entropy(
        reference(x, adj)[mask], t[mask], reduction="sum"))
    ours, modules = dict(model.named_parameters()), dict(reference.named_modules())
    for name in names:
        A, B = kfac_factors(modules[name], calls[name], data_size)
        for key, value in kfac_expected(modules[name], A, B, damping).items():
            assert_close(ours[f"{name}.{key}"].grad, value, f"{name}.{key}")
    plain = dict(reference.named_parameters())
    for name in gm.unpreconditioned_parameters():
        torch.testing.assert_close(ours[name].grad, plain[name].grad)


# ---------------------------------------------------------------------- what is left alone
class _LoraLinear(nn.Linear):
    """A Linear with trainable low-rank adapters beside its weight."""

    def __init__(self, i, o, rank=2):
        super().__init__(i, o)
        self.lora_a = nn.Parameter(torch.randn(rank, i) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(o, rank) * 0.1)

    def forward(self, x):
        return super().forward(x) + x @ self.lora_a.T @ self.lora_b.T


def _step(gm, model, x, t):
    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    gm.forward_and_backward()
    return {name: p.grad for name, p in model.named_parameters()}


def _plain(model, x, t):
    F.cross_entropy(model(x), t).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_a_weight_computed_by_weight_norm_leaves_its_module_plain_and_listed(maker):
    """``torch.nn.utils.weight_norm`` replaces a Linear's weight by a tensor computed from
    ``weight_g`` and ``weight_v``: the module has no weight gradient to precondition, so it
    keeps the plain gradient and its parameters are listed (it was counted as preconditioned,
    its bias alone preconditioned and ``weight_g``, ``weight_v`` left plain unlisted)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # deprecated in favour of parametrize
        model = nn.Sequential(nn.utils.weight_norm(nn.Linear(5, 4)), nn.ReLU(),
                              nn.Linear(4, 3)).to(DTYPE)
    x, t = torch.randn(8, 5, dtype=DTYPE), torch.randint(0, 3, (8,))
    plain = _plain(model, x, t)
    gm = maker(model, P.PreconditioningConfig(data_size=8, damping=1e-2), fisher_type="emp")
    assert list(gm.preconditioned_modules()) == ["2"]
    listed = gm.unpreconditioned_parameters()
    assert {"0.weight_g", "0.weight_v", "0.bias"} <= set(listed)
    assert "computed" in listed["0.weight_v"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no access to the .grad of a non-leaf weight
        grads = _step(gm, model, x, t)
    for name in ("0.weight_g", "0.weight_v", "0.bias"):
        torch.testing.assert_close(grads[name], plain[name])
    # Shampoo and Jorge precondition weight_g and weight_v as the matrices they are.
    assert {"0.weight_g", "0.weight_v"} <= set(P.ShampooGradientMaker(
        model, P.PreconditioningConfig()).preconditioned_parameters())


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_other_parameters_of_a_preconditioned_module_are_listed_and_left_plain(maker):
    """A Linear subclass with adapters: the weight and bias are preconditioned; the adapters
    keep their plain gradient, are listed, and neither ``grad_scale`` nor the ``kl_clip``
    scaling touches them (they were unlisted and scaled by both)."""
    torch.manual_seed(0)
    model = nn.Sequential(_LoraLinear(6, 5), nn.Tanh(), nn.Linear(5, 3)).to(DTYPE)
    x, t = torch.randn(8, 6, dtype=DTYPE), torch.randint(0, 3, (8,))
    plain = _plain(model, x, t)
    gm = maker(model, P.PreconditioningConfig(data_size=8, damping=1e-4), fisher_type="emp",
               grad_scale=3.0, kl_clip=1e-9, lr=1.0)
    assert list(gm.preconditioned_modules()) == ["0", "2"]
    assert {"0.lora_a", "0.lora_b"} <= set(gm.unpreconditioned_parameters())
    grads = _step(gm, model, x, t)
    assert gm.last_kl_clip_scale < 1.0
    for name in ("0.lora_a", "0.lora_b"):
        torch.testing.assert_close(grads[name], plain[name])
    assert not torch.allclose(grads["0.weight"], plain["0.weight"])


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker,
                                   P.ShampooGradientMaker, P.JorgeGradientMaker])
def test_a_lazy_module_is_refused_by_name_until_it_has_run(maker):
    """A LazyLinear has no shapes before its first call: every maker refuses it by name (K-FAC
    and the diagonal Fisher failed inside torch, Shampoo and Jorge left it plain for good),
    takes it once the model has run, and leaves it plain when ignored."""
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 3))
    config = dict(data_size=8, damping=1e-2)
    with pytest.raises(ValueError, match=r"'0' \(LazyLinear\) has uninitialized parameters"):
        maker(model, P.PreconditioningConfig(**config))
    ignored = maker(model, P.PreconditioningConfig(**config, ignore_modules=[nn.LazyLinear]))
    assert "0.weight" in ignored.unpreconditioned_parameters()
    model(torch.randn(2, 5))
    gm = maker(model, P.PreconditioningConfig(**config))
    assert "0" in gm.preconditioned_modules()


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
@pytest.mark.parametrize("mode", ["reflect", "circular", "replicate"])
def test_a_padding_mode_without_padding_is_the_zero_padded_convolution(maker, mode):
    """Where a convolution pads nothing (padding 0, ``"valid"``, ``"same"`` with a 1 x 1
    kernel) its padding mode changes nothing: it is preconditioned exactly as with zeros
    (it was refused); a mode with real padding is still refused by name."""
    torch.manual_seed(0)
    x, t = torch.randn(4, 2, 5, 6, dtype=DTYPE), torch.tensor([0, 1, 2, 0])
    for padding, kernel in ((0, (2, 3)), ("valid", 3), ("same", 1)):
        zeros = nn.Sequential(nn.Conv2d(2, 3, kernel, padding=padding), nn.Flatten(),
                              nn.LazyLinear(3)).to(DTYPE)
        zeros(x)
        other = copy.deepcopy(zeros)
        other[0].padding_mode = mode
        expected, actual = (
            _step(maker(m, P.PreconditioningConfig(data_size=4, damping=1e-2),
                        fisher_type="emp"), m, x, t) for m in (zeros, other))
        for name in expected:
            assert torch.equal(expected[name], actual[name]), (padding, name)
    padded = nn.Sequential(nn.Conv2d(2, 3, 3, padding="same", padding_mode=mode), nn.Flatten())
    with pytest.raises(NotImplementedError, match=f"module '0' has padding_mode='{mode}'"):
        maker(padded, P.PreconditioningConfig(data_size=4))


@pytest.mark.parametrize("maker", [P.KfacGradientMaker, P.DiagNaturalGradientMaker])
def test_unsupported_convolutions_and_sparse_embeddings_are_refused_by_name(maker):
    """Groups (depthwise included), dilation, real non-zero-mode padding, sparse embeddings and
    embeddings whose gradient is scaled by frequency raise NotImplementedError naming the
    module and the setting; ignored, they stay plain."""
    cases = [(nn.Conv2d(4, 4, 3, groups=4), "groups=4"),
             (nn.Conv2d(2, 2, (2, 3), dilation=(1, 2)), "dilation=(1, 2)"),
             (nn.Conv2d(2, 2, 3, padding=(0, 1), padding_mode="circular"),
              "padding_mode='circular'"),
             (nn.Embedding(5, 3, sparse=True), "sparse=True"),
             (nn.Embedding(5, 3, scale_grad_by_freq=True), "scale_grad_by_freq=True")]
    for module, what in cases:
        model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(module))
        with pytest.raises(NotImplementedError, match=r"'1\.0'.*" + "".join(
                "\\" + c if c in "()[]." else c for c in what)):
            maker(model, P.PreconditioningConfig(data_size=1))
        for ignore in ([type(module)], ["1.0"], [model[1]]):
            gm = maker(model, P.PreconditioningConfig(data_size=1, ignore_modules=ignore))
            assert list(gm.preconditioned_modules()) == ["0"]
            assert gm.unpreconditioned_parameters()["1.0.weight"] == "in config.ignore_modules"
