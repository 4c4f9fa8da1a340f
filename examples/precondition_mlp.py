"""Train an MLP with SGD, K-FAC, Shampoo and Jorge through ASDL's gradient-maker loop.

The data are scikit-learn's handwritten digits (8x8 images, 10 classes) when scikit-learn is
installed, otherwise a synthetic 10-class problem of the same size generated here (noisy
points around random class centres, passed through a fixed random nonlinearity). Every
optimizer trains the same MLP from the same initial weights with the same SGD (momentum 0.9);
the preconditioners only replace ``.grad`` between the backward and ``opt.step()``:

    dy = gm.setup_model_call(model, x)
    gm.setup_loss_call(F.cross_entropy, dy, t)
    y, loss = gm.forward_and_backward()
    opt.step()

The script prints the test accuracy and the mean time per training step of each. Run it with
``python examples/precondition_mlp.py [--epochs N] [--batch-size B] [--seed S]``.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from pysparse_hpc.precondition import (JorgeGradientMaker, KfacGradientMaker,
                                       PreconditioningConfig, ShampooGradientMaker)


def load_data(seed):
    """``(x_train, y_train, x_test, y_test, description)``, features standardised."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        x, y, what = synthetic(seed)
    else:
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32)
        y = torch.tensor(digits.target, dtype=torch.int64)
        what = "scikit-learn digits"
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(y), generator=generator)
    x, y = x[order], y[order]
    n_train = int(0.8 * len(y))
    mean, std = x[:n_train].mean(0), x[:n_train].std(0).clamp_min(1e-3)
    x = (x - mean) / std
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:], what


def synthetic(seed, n=1797, features=64, classes=10):
    """A digits-sized classification problem that a linear model cannot solve exactly."""
    generator = torch.Generator().manual_seed(seed + 1)
    y = torch.randint(0, classes, (n,), generator=generator)
    centres = torch.randn(classes, 16, generator=generator)
    latent = centres[y] + 0.9 * torch.randn(n, 16, generator=generator)
    mixing = torch.randn(16, features, generator=generator) / 4
    x = torch.tanh(latent @ mixing) + 0.1 * torch.randn(n, features, generator=generator)
    return x, y, "synthetic (scikit-learn not installed)"


def make_model(features, classes, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, classes))


def make_maker(name, model, batch_size):
    """The gradient maker of `name` (None: plain SGD)."""
    if name == "sgd":
        return None
    if name == "k-fac":
        # Factors (empirical Fisher) every 5 steps as a moving average, inverses every 5. The
        # damping bounds the step: with 1e-2 and this learning rate the run diverges.
        config = PreconditioningConfig(data_size=batch_size, damping=0.1, ema_decay=0.1,
                                       curvature_upd_interval=5, preconditioner_upd_interval=5)
        return KfacGradientMaker(model, config, fisher_type="fisher_emp")
    if name == "shampoo":
        # Statistics every step, roots every 10 steps, grafted to SGD's step norm.
        config = PreconditioningConfig(damping=1e-4, ema_decay=0.05, curvature_upd_interval=1,
                                       preconditioner_upd_interval=10)
        return ShampooGradientMaker(model, config, grafting="sgd")
    if name == "jorge":
        # Statistics every step, roots refreshed by matrix products every 10 steps.
        config = PreconditioningConfig(damping=1e-3, ema_decay=0.05, curvature_upd_interval=1,
                                       preconditioner_upd_interval=10)
        return JorgeGradientMaker(model, config)
    raise ValueError(name)


def train(name, data, epochs, batch_size, lr, seed):
    """``(test accuracy, seconds per step)`` of one optimizer."""
    x_train, y_train, x_test, y_test = data
    model = make_model(x_train.shape[1], int(y_train.max()) + 1, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gm = make_maker(name, model, batch_size)
    generator = torch.Generator().manual_seed(seed)
    steps, seconds = 0, 0.0
    for _ in range(epochs):
        order = torch.randperm(len(y_train), generator=generator)
        for start in range(0, len(order) - batch_size + 1, batch_size):  # full batches only
            index = order[start:start + batch_size]
            x, t = x_train[index], y_train[index]
            begin = time.perf_counter()
            opt.zero_grad()
            if gm is None:
                F.cross_entropy(model(x), t).backward()
            else:
                dy = gm.setup_model_call(model, x)
                gm.setup_loss_call(F.cross_entropy, dy, t)
                gm.forward_and_backward()  # .grad now holds the preconditioned gradient
            opt.step()
            seconds += time.perf_counter() - begin
            steps += 1
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    return accuracy, seconds / max(steps, 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1:
        parser.error("--epochs and --batch-size must be positive")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if not 0 < args.lr < float("inf"):
        parser.error(f"--lr must be a finite number > 0, got {args.lr}")
    torch.set_num_threads(args.threads)

    *data, what = load_data(args.seed)
    if args.batch_size > len(data[1]):
        # Only full batches are trained: a larger one would leave every model untrained.
        parser.error(f"--batch-size must be at most the {len(data[1])} training examples, got "
                     f"{args.batch_size}")
    print(f"data: {what}, {len(data[1])} training and {len(data[3])} test examples, "
          f"{data[0].shape[1]} features")
    for name in ("sgd", "k-fac", "shampoo", "jorge"):
        accuracy, per_step = train(name, data, args.epochs, args.batch_size, args.lr, args.seed)
        print(f"{name:<8} test accuracy {100 * accuracy:5.1f}%   "
              f"{1e3 * per_step:6.2f} ms per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
