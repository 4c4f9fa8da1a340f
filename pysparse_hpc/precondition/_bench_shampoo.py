"""Step time of our Shampoo against ASDL's, and of Jorge against our Shampoo, in the same run
(``python -m pysparse_hpc.precondition._bench_shampoo [repeats]``).

A 784-256-128-10 ReLU MLP, batch 128, float32, 2 threads, SGD. Three comparisons, the runs
interleaved, ``repeats`` rounds, medians:

* ASDL's Shampoo and ours with ASDL's default configuration (statistics and roots every step,
  sums, no blocks, no grafting): ratio ASDL / ours (above 1: ours is faster);
* ours and Jorge (``ema_decay=0.001``, SGD grafting for both) with statistics every step and
  roots every 1 and every 10 steps: ratio Jorge / Shampoo.

Needs ASDL (``pip install asdfghjkl``) for the first comparison; without it that line is
skipped.
"""
import statistics
import sys
import warnings

import torch

from . import JorgeGradientMaker, PreconditioningConfig, ShampooGradientMaker
from ._bench import mlp, ms_per_step


def _make(kind, model, interval, asdl):
    if kind == "sgd":
        return None
    if kind == "asdl":
        return asdl.ShampooGradientMaker(model, asdl.PreconditioningConfig(damping=1e-4))
    if kind == "ours-asdl-config":
        return ShampooGradientMaker(model, PreconditioningConfig(damping=1e-4))
    config = PreconditioningConfig(damping=1e-4, ema_decay=0.001, curvature_upd_interval=1,
                                   preconditioner_upd_interval=interval)
    if kind == "shampoo":
        return ShampooGradientMaker(model, config, grafting="sgd")
    return JorgeGradientMaker(model, config, grafting="sgd")


def _step_time(kind, interval, x, t, steps, asdl=None):
    model = mlp()
    return ms_per_step(model, _make(kind, model, interval, asdl), x, t, max(2, interval), steps)


def main(repeats=5):
    """Print the medians (ms per step) and the ratios."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import asdl
    except ImportError:
        asdl = None
    torch.set_num_threads(2)
    x = torch.randn(128, 784)
    t = torch.randint(0, 10, (128,))
    runs = [("sgd", 1, 20)]
    if asdl is not None:
        runs += [("asdl", 1, 5), ("ours-asdl-config", 1, 10)]
    for interval in (1, 10):
        runs += [("shampoo", interval, 10 if interval == 1 else 40),
                 ("jorge", interval, 10 if interval == 1 else 40)]
    times = {}
    for _ in range(repeats):
        for kind, interval, steps in runs:
            times.setdefault((kind, interval), []).append(
                _step_time(kind, interval, x, t, steps, asdl))
    median = {key: statistics.median(value) for key, value in times.items()}
    print(f"SGD alone: {median[('sgd', 1)]:.2f} ms/step ({repeats} rounds, medians)")
    if asdl is not None:
        a, o = median[("asdl", 1)], median[("ours-asdl-config", 1)]
        print(f"Shampoo, ASDL's configuration: ASDL {a:.1f} ms, ours {o:.1f} ms, "
              f"ASDL/ours {a / o:.1f}x")
    print("roots every  Shampoo ms  Jorge ms  Jorge/Shampoo")
    for interval in (1, 10):
        s, j = median[("shampoo", interval)], median[("jorge", interval)]
        print(f"{interval:>11}  {s:10.1f}  {j:8.1f}  {j / s:13.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
