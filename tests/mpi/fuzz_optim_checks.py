"""Differential checks of `DistributedLion` under ``mpiexec -n P`` (launched by
tests/test_fuzz_optim.py): on seeded random parameter sets (empty tensors, one-element ones,
sizes off the bytes and words of the packed votes), parameter groups with their own settings
and gradients missing on some ranks, every mode and momentum schedule takes the step that a
one-process simulation of all the ranks computes from their gradients, and sends the bytes of
`bytes_per_step`.

``python fuzz_optim_checks.py NAME [NAME ...]``: the conventions of checks.py (rank 0 prints
``PASSED NAME`` after each check that passed on every rank).
"""
import math
import sys
from pathlib import Path

import numpy as np
import torch

from checks import checks_in, comm, rank, run_named, size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import reference_lion_agreement  # noqa: E402

from pysparse_hpc.optim import COMPRESSIONS, DistributedLion, bytes_per_step  # noqa: E402
from pysparse_hpc.optim.distributed_lion import (  # noqa: E402
    AGREEMENT_KIND, GRADIENT_KIND, MOMENTUM_KIND, PARTICIPATION_KIND, VOTE_KIND)
from pysparse_hpc.optim.lion import interpolate  # noqa: E402

SHAPES = [(0,), (1,), (), (7,), (8,), (9,), (63,), (64,), (65,), (3, 5), (2, 0, 3), (40, 3)]


def _case(seed):
    """A random problem, the same on every rank: parameters, groups, settings and every
    rank's gradient at every step (None where that rank's backward missed the parameter)."""
    rng = np.random.default_rng(seed)
    dtype = torch.float64 if rng.random() < 0.75 else torch.float32
    shapes = [SHAPES[i] for i in rng.integers(0, len(SHAPES), int(rng.integers(1, 6)))]
    starts = [torch.from_numpy(rng.standard_normal(s)).to(dtype) for s in shapes]
    cuts = sorted({0, len(shapes), *rng.integers(0, len(shapes) + 1, 2).tolist()})
    groups = []
    for low, high in zip(cuts[:-1], cuts[1:]):
        group = {"params": list(range(low, high))}
        if rng.random() < 0.5:
            group["lr"] = float(rng.choice([1e-3, 0.05, 0.0]))
        if rng.random() < 0.5:
            group["betas"] = (float(rng.choice([0.0, 0.5, 0.9])), float(rng.choice([0.0, 0.9])))
        if rng.random() < 0.5:
            group["weight_decay"] = float(rng.choice([0.0, 0.5]))
        groups.append(group)
    steps = int(rng.integers(2, 6))
    grads = []
    for _ in range(steps):
        missing = rng.random((size, len(shapes))) < 0.2
        grads.append([[None if missing[r, k] else
                       torch.from_numpy(rng.standard_normal(s)).to(dtype)
                       for k, s in enumerate(shapes)] for r in range(size)])
    settings = dict(lr=float(rng.choice([1e-2, 0.1])), betas=(0.9, 0.99),
                    weight_decay=float(rng.choice([0.0, 0.1])))
    return starts, groups, grads, settings


def _simulate(starts, groups, grads, settings, compression, sync, doubling, average):
    """The step of every rank, computed in this process from every rank's gradient: the
    parameters, each rank's momenta, the bytes of each kind and the syncs after every step."""
    params = [p.clone() for p in starts]
    momenta = [[torch.zeros_like(p) for p in params] for _ in range(size)]
    owner = {k: dict(settings, **{key: value for key, value in group.items()
                                  if key != "params"})
             for group in groups for k in group["params"]}
    order = [k for group in groups for k in group["params"]]
    taken, syncs, next_sync = 0, 0, 1
    counted = {}

    def count(kind, nbytes):
        counted[kind] = counted.get(kind, 0) + nbytes

    for step_grads in grads:
        if size > 1:
            count(AGREEMENT_KIND, 80)  # five int64 counters and their negations
            count(PARTICIPATION_KIND, len(order))
        part = [k for k in order if any(step_grads[r][k] is not None for r in range(size))]
        if not part:
            continue
        full = [[step_grads[r][k] if step_grads[r][k] is not None
                 else torch.zeros_like(params[k]) for k in range(len(params))]
                for r in range(size)]
        if size == 1 or compression == "none":
            total = [sum(full[r][k] for r in range(size)) for k in range(len(params))]
            if average:
                total = [t / size for t in total]
            for k in part:
                beta1, beta2 = owner[k]["betas"]
                lr, decay = owner[k]["lr"], owner[k]["weight_decay"]
                direction = interpolate(momenta[0][k], total[k], beta1).sign_()
                params[k].mul_(1.0 - lr * decay).add_(direction, alpha=-lr)
                for r in range(size):
                    momenta[r][k].mul_(beta2).add_(total[k], alpha=1.0 - beta2)
            if size > 1:
                for dtype in dict.fromkeys(params[k].dtype for k in part):
                    count(GRADIENT_KIND, bytes_per_step(
                        "none", sum(params[k].numel() for k in part if params[k].dtype == dtype),
                        size, rank, torch.empty(0, dtype=dtype).element_size()))
        else:
            directions = [torch.cat([interpolate(momenta[r][k], full[r][k],
                                                 owner[k]["betas"][0]).reshape(-1)
                                     for k in part]).numpy() for r in range(size)]
            sizes = [params[k].numel() for k in part]
            agreed = torch.from_numpy(reference_lion_agreement(directions, sizes, compression,
                                                               taken))
            start = 0
            for k in part:
                lr, decay = owner[k]["lr"], owner[k]["weight_decay"]
                beta2 = owner[k]["betas"][1]
                piece = agreed[start:start + params[k].numel()]
                start += params[k].numel()
                params[k].mul_(1.0 - lr * decay).add_(
                    piece.view_as(params[k]).to(params[k].dtype), alpha=-lr)
                for r in range(size):
                    momenta[r][k].mul_(beta2).add_(full[r][k], alpha=1.0 - beta2)
            count(VOTE_KIND, bytes_per_step(compression, sum(sizes), size, rank))
        taken += 1
        due = size > 1 and (sync == "always" or (sync == "growing" and taken >= next_sync))
        if due:
            for k in part:
                mean = sum(momenta[r][k] for r in range(size)) / size
                for r in range(size):
                    momenta[r][k] = mean.clone()
            count(MOMENTUM_KIND, sum(params[k].numel() * params[k].element_size()
                                     for k in part))
            syncs += 1
            next_sync = taken + math.floor(2.0 ** (syncs / doubling))
    return params, momenta[rank], counted, syncs


def _run(starts, groups, grads, settings, **options):
    """The parameters and this rank's momenta after `DistributedLion`'s steps on this rank's
    gradients, its traffic counters and its syncs."""
    params = [torch.nn.Parameter(p.clone()) for p in starts]
    optimizer = DistributedLion([dict(group, params=[params[k] for k in group["params"]])
                                 for group in groups], comm, **settings, **options)
    comm.reset_stats()
    for step_grads in grads:
        for param, grad in zip(params, step_grads[rank]):
            param.grad = None if grad is None else grad.clone()
        optimizer.step()
    stats = comm.stats()
    counted = {kind: entry["bytes_sent"] for kind, entry in stats.items()
               if kind in (VOTE_KIND, GRADIENT_KIND, MOMENTUM_KIND, PARTICIPATION_KIND,
                           AGREEMENT_KIND)}
    for kind in counted:
        assert stats[kind]["bytes_sent"] == stats[kind]["bytes_received"], (kind, stats)
    return ([p.detach() for p in params], [optimizer.momentum(p) for p in params],
            {kind: n for kind, n in counted.items() if n}, optimizer.momentum_syncs)


def check_random_steps_match_simulation():
    """Every mode and momentum schedule on seeded random problems: P ranks take the step
    the one-process simulation computes from all the ranks' gradients, stay equal, count the
    bytes of `bytes_per_step` (and of the participation and syncs), and sync when due."""
    cases = 0
    for seed in range(4):
        problem = _case(seed)
        for compression in COMPRESSIONS:
            schedules = ("local",) if compression == "none" else ("local", "always", "growing")
            for sync in schedules:
                doubling = 1 + seed % 2
                average = bool(seed % 3)
                options = dict(compression=compression, momentum_sync=sync,
                               sync_doubling=doubling, average=average)
                label = f"seed {seed} {options}"
                params, momenta, counted, syncs = _run(*problem, **options)
                want_params, want_momenta, want_counted, want_syncs = _simulate(
                    *problem, compression, sync, doubling, average)
                tolerance = 1e-12 if problem[0][0].dtype == torch.float64 else 1e-5
                for got, want in zip(params + momenta, want_params + want_momenta):
                    torch.testing.assert_close(got, want, rtol=0, atol=tolerance, msg=label)
                assert counted == {k: n for k, n in want_counted.items() if n}, \
                    (label, counted, want_counted)
                assert syncs == want_syncs, (label, syncs, want_syncs)
                flat = torch.cat([p.reshape(-1) for p in params]).numpy()
                assert all(np.array_equal(flat, other) for other in comm.allgather(flat)), label
                cases += 1
    assert cases == 4 * 13


if __name__ == "__main__":
    run_named(checks_in(globals()), sys.argv[1:])
