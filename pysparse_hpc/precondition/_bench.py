"""Step time of our K-FAC against ASDL's, measured in the same run (``python -m
pysparse_hpc.precondition._bench [repeats]``).

A 784-256-128-10 ReLU MLP, batch 128, float32, 2 threads, SGD; curvature and inverse every step
and every 10 steps, MC and empirical Fisher. The makers run interleaved, ``repeats`` rounds;
the table gives medians and the ratio ours / ASDL (below 1: ours is faster). Needs ASDL
(``pip install asdfghjkl``).
"""
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from . import KfacGradientMaker, PreconditioningConfig


def mlp():
    """The benchmarks' 784-256-128-10 ReLU MLP, the same weights every call."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def ms_per_step(model, maker, x, t, warmup, steps):
    """Milliseconds per SGD step of ``model`` on ``(x, t)``: through ``maker``'s ASDL loop,
    or plain backward when ``maker`` is None; ``warmup`` untimed steps first."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        if maker is None:
            F.cross_entropy(model(x), t).backward()
        else:
            dy = maker.setup_model_call(model, x)
            maker.setup_loss_call(F.cross_entropy, dy, t)
            maker.forward_and_backward()
        opt.step()

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def _step_time(library, fisher_type, interval, x, t, steps):
    model = mlp()
    maker = None
    if library is not None:
        config_class, maker_class = (
            (library.PreconditioningConfig, library.KfacGradientMaker) if library != "ours"
            else (PreconditioningConfig, KfacGradientMaker))
        config = config_class(data_size=x.shape[0], damping=1e-3, curvature_upd_interval=interval,
                              preconditioner_upd_interval=interval)
        maker = maker_class(model, config, fisher_type=fisher_type)
    return ms_per_step(model, maker, x, t, 2 * interval, steps)


def main(repeats=5):
    """Print the medians (ms per step) and the ratios ours / ASDL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import asdl
    warnings.simplefilter("ignore", FutureWarning)  # ASDL's non-full backward hooks
    torch.set_num_threads(2)
    x = torch.randn(128, 784)
    t = torch.randint(0, 10, (128,))
    runs = [("sgd", None, None, 1)]
    for fisher_type in ("fisher_mc", "fisher_emp"):
        for interval in (1, 10):
            runs += [("asdl", asdl, fisher_type, interval), ("ours", "ours", fisher_type, interval)]
    times = {}
    for _ in range(repeats):
        for name, library, fisher_type, interval in runs:
            steps = 40 if interval == 10 else 20
            times.setdefault((name, fisher_type, interval), []).append(
                _step_time(library, fisher_type, interval, x, t, steps))
    median = {key: statistics.median(value) for key, value in times.items()}
    print(f"SGD alone: {median[('sgd', None, 1)]:.2f} ms/step")
    print("fisher      every  ASDL ms  ours ms  ours/ASDL")
    for fisher_type in ("fisher_mc", "fisher_emp"):
        for interval in (1, 10):
            a = median[("asdl", fisher_type, interval)]
            o = median[("ours", fisher_type, interval)]
            print(f"{fisher_type:<11} {interval:>5}  {a:7.2f}  {o:7.2f}  {o / a:9.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
