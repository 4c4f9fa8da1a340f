"""Differential fuzzing of `pysparse_hpc.optim`: `Lion` against lion-pytorch on seeded random
problems (shapes, empty and one-element tensors, parameter groups with their own settings,
missing gradients, dtypes, sparse and strided gradients, closures, resumed state dicts), the
vote formats of several simulated ranks against plain NumPy formulas (zeros, NaN, infinities,
tensors at every offset), and `DistributedLion` under ``mpiexec -n 2`` and ``-n 3`` against a
one-process simulation of its ranks (tests/mpi/fuzz_optim_checks.py)."""
import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from lion_pytorch import Lion as ReferenceLion

from pysparse_hpc.optim import COMPRESSIONS, DistributedLion, Lion
from pysparse_hpc.optim import _votes
from pysparse_hpc.optim.lion import interpolate, kernel_scalars

from .reference import reference_lion_agreement
from .test_distributed_mpi import requires_mpi, run_mpi

SHAPES = [(0,), (), (1,), (7,), (8,), (9,), (3, 5), (2, 0, 3), (64,), (65,), (4, 33)]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _problem(seed, dtype):
    """Seeded parameters, group options and gradients (None where a step has none)."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    shapes = [rng.choice(SHAPES) for _ in range(rng.randint(1, 5))]
    starts = [torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
              for shape in shapes]
    groups, low = [], 0
    while low < len(shapes):
        high = rng.randint(low + 1, len(shapes))
        group = {"params": list(range(low, high))}
        if rng.random() < 0.5:
            group["lr"] = rng.choice([0.0, 1e-3, 0.1, 0.37])
        if rng.random() < 0.5:
            group["betas"] = (rng.choice([0.0, 0.5, 0.9, 1.0]), rng.choice([0.0, 0.99, 1.0]))
        if rng.random() < 0.5:
            group["weight_decay"] = rng.choice([0.0, 0.1, 1.0])
        groups.append(group)
        low = high
    settings = dict(lr=rng.choice([1e-4, 1e-2, 0.3]), betas=(rng.random(), rng.random()),
                    weight_decay=rng.choice([0.0, 0.01, 1.0]))
    grads = [[torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
              if rng.random() < 0.8 else None for shape in shapes]
             for _ in range(rng.randint(1, 6))]
    for step in grads:  # a gradient read through a transposed view: no kernel, same step
        for k, grad in enumerate(step):
            if grad is not None and grad.dim() == 2 and rng.random() < 0.5:
                step[k] = grad.t().contiguous().t()
    return starts, groups, settings, grads


def _optimizer(optimizer_class, params, groups, settings, **options):
    return optimizer_class([dict(group, params=[params[k] for k in group["params"]])
                            for group in groups], **settings, **options)


def _steps(optimizer, params, grads):
    for step in grads:
        for param, grad in zip(params, step):
            param.grad = None if grad is None else grad.clone()
        optimizer.step()


def _assert_same(mine, theirs, label):
    for a, b in zip(mine, theirs):
        assert torch.equal(a, b), (label, (a - b).abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
def test_lion_and_one_rank_modes_equal_lion_pytorch_on_random_problems(dtype):
    """Bit for bit: Lion and DistributedLion of every mode on one rank (Lion's step there)."""
    for seed in range(12):
        starts, groups, settings, grads = _problem(seed, dtype)
        params = [torch.nn.Parameter(p.clone()) for p in starts]
        _steps(_optimizer(ReferenceLion, params, groups, settings), params, grads)
        for optimizer_class, options in [(Lion, {})] + [
                (DistributedLion, dict(compression=mode)) for mode in COMPRESSIONS]:
            mine = [torch.nn.Parameter(p.clone()) for p in starts]
            _steps(_optimizer(optimizer_class, mine, groups, settings, **options), mine, grads)
            _assert_same(mine, params, (seed, dtype, optimizer_class.__name__, options))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_gradients_and_closures_as_lion_pytorch(dtype):
    def run(optimizer_for):
        torch.manual_seed(0)
        table = torch.nn.Embedding(10, 4, sparse=True).to(dtype)
        optimizer = optimizer_for(table.parameters())
        losses = []
        for step in range(3):
            def closure():
                optimizer.zero_grad()
                loss = table(torch.tensor([1, 2, 2, 3 + step])).float().pow(2).sum()
                loss.backward()
                return loss
            losses.append(float(optimizer.step(closure).detach()))
        return losses, table.weight.detach()

    losses, weight = run(lambda params: ReferenceLion(params, lr=0.1, weight_decay=0.2))
    for optimizer_for in [lambda params: Lion(params, lr=0.1, weight_decay=0.2)] + [
            lambda params, mode=mode: DistributedLion(params, lr=0.1, weight_decay=0.2,
                                                      compression=mode)
            for mode in COMPRESSIONS]:
        got_losses, got = run(optimizer_for)
        assert got_losses == losses
        assert torch.equal(got, weight)


@pytest.mark.parametrize("options", [None] + [dict(compression=mode) for mode in COMPRESSIONS])
def test_a_resumed_run_continues_bit_for_bit(options):
    """state_dict mid-run, through torch.save, into a fresh optimizer (and into the other
    class): the resumed steps equal the uninterrupted ones, a group added after the resume
    included."""
    optimizer_class = Lion if options is None else DistributedLion
    options = options or {}
    for seed in range(3):
        starts, groups, settings, grads = _problem(100 + seed, torch.float32)
        extra = torch.randn(5, generator=torch.Generator().manual_seed(seed))
        half = len(grads) // 2

        def run(resume_into=None):
            params = [torch.nn.Parameter(p.clone()) for p in starts]
            late = torch.nn.Parameter(extra.clone())
            optimizer = _optimizer(optimizer_class, params, groups, settings, **options)
            _steps(optimizer, params, grads[:half])
            if resume_into is not None:
                buffer = io.BytesIO()
                torch.save(optimizer.state_dict(), buffer)
                buffer.seek(0)
                params = [torch.nn.Parameter(p.detach().clone()) for p in params]
                optimizer = _optimizer(resume_into, params, groups, settings,
                                       **(options if resume_into is DistributedLion else {}))
                optimizer.load_state_dict(torch.load(buffer))
            optimizer.add_param_group({"params": [late], "lr": 0.05})
            late.grad = torch.ones(5)
            _steps(optimizer, params + [late], [step + [torch.ones(5)] for step in grads[half:]])
            return params + [late]

        whole = run()
        for resume_into in (optimizer_class, Lion if optimizer_class is DistributedLion
                            else ReferenceLion):
            _assert_same(run(resume_into), whole, (seed, resume_into.__name__, options))


def _int8_reference(c, ranks):
    """Lion Cub's levels of one tensor, from the formula: round half to even of
    ``c / mean|c| * s / 2``, clipped to ``[-s, s]`` (NaN: 0; mean 0 or not finite: all 0)."""
    levels = _votes.int8_levels(ranks)
    magnitude = np.abs(c.astype(np.float64))
    with np.errstate(all="ignore"):
        mean = magnitude[np.isfinite(magnitude)].sum() / c.size if c.size else 0.0
        scaled = np.rint(c.astype(np.float64) / mean * levels / 2)
    if mean == 0 or not np.isfinite(mean):
        return np.zeros(c.size, dtype=np.int64)
    return np.where(np.isnan(c), 0, np.clip(scaled, -levels, levels)).astype(np.int64)


@pytest.mark.parametrize("ranks", [2, 4, 5])
def test_int8_levels_round_exact_halves_to_even(ranks):
    """A tensor whose |c| are all equal (one element: always; of 2 or 4 elements the mean is
    exact too) has levels exactly +-s / 2,
    a half for an odd s. The levels were c times a factor s / (2 mean) rounded beforehand,
    which missed the half either way by rounding noise: two ranks of opposite c on a bias of
    one element summed to +-1 instead of a tie, and the coordinate moved."""
    rng = np.random.default_rng(ranks)
    levels = _votes.int8_levels(ranks)
    assert levels % 2 == 1
    half = round(levels / 2)   # Python rounds half to even too
    for value in rng.standard_normal(300) * 10.0 ** rng.integers(-20, 20, 300):
        for c in (np.array([value]), np.array([value, -value, -value, value]),
                  np.array([value, -value], dtype=np.float32)):
            got = _votes.quantize_int8(c, np.array([0, c.size]), ranks)
            np.testing.assert_array_equal(got, np.sign(c) * half, err_msg=repr(c))
            np.testing.assert_array_equal(got, _int8_reference(c, ranks), err_msg=repr(c))
    # Two ranks of opposite sign on a one-element tensor tie: the coordinate stays.
    ours, theirs = np.array([0.6404226504432821]), np.array([-0.5])
    total = sum(_votes.quantize_int8(c, np.array([0, 1]), 2).astype(np.int64)
                for c in (ours, theirs))
    assert total.tolist() == [0]
    assert reference_lion_agreement([ours, theirs], [1], "int8").tolist() == [0.0]


def _random_vector(rng, size, dtype):
    c = rng.standard_normal(size).astype(dtype)
    kind = rng.random()
    if kind < 0.3:
        c[rng.random(size) < 0.4] = 0.0
    elif kind < 0.5 and size:
        specials = [np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype).tiny / 4,
                    np.finfo(dtype).max / 3]
        c[rng.integers(0, size, 3)] = rng.choice(specials, 3)
    elif kind < 0.55:
        c[:] = 0.0
    return c


def test_vote_formats_of_simulated_ranks_equal_the_formulas():
    """Several ranks' votes packed tensor by tensor (at every offset within bytes and words),
    from momenta and gradients that hold zeros, NaN, infinities, subnormal and huge values:
    the sign and digit majorities, the summed int8 levels and the 1-bit recursive doubling
    equal NumPy's formulas, the tie and zero-vote rules included."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        ranks = int(rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 17, 63, 64, 65, 127, 200]))
        dtype = rng.choice([np.float32, np.float64])
        sizes = [int(rng.choice([0, 1, 2, 7, 8, 9, 63, 64, 65, 129])) for _ in
                 range(int(rng.integers(1, 5)))]
        size, step = sum(sizes), int(rng.integers(0, 4))
        beta1 = float(rng.choice([0.0, 0.5, 0.9, 1.0]))
        operands = [[(torch.from_numpy(_random_vector(rng, n, dtype)),
                      torch.from_numpy(_random_vector(rng, n, dtype))) for n in sizes]
                    for _ in range(ranks)]
        scalars = kernel_scalars(operands[0][0][0].dtype, beta1, 1.0 - beta1)
        directions = [np.concatenate([interpolate(m, g, beta1).numpy() for m, g in rank_ops]
                                     + [np.zeros(0, dtype)]) for rank_ops in operands]
        index = np.arange(size)
        votes = np.array([np.where((c > 0) | (c < 0), c > 0,
                                   (index + _votes.zero_vote_parity(r, step)) % 2 == 1)
                          for r, c in enumerate(directions)]).reshape(ranks, size)
        majority = np.sign(2 * votes.sum(axis=0) - ranks)
        label = (seed, ranks, dtype, sizes)

        def packed(add, out, *args, **kwargs):
            start = 0
            for m, g in rank_ops:
                add(out, start, *args, m.numpy(), g.numpy(), *scalars, **kwargs)
                start += m.numel()
            return out

        bits, words = [], np.zeros(_votes.digit_words(size, ranks), dtype=np.uint64)
        total = np.zeros(size, dtype=np.int8)
        for r, rank_ops in enumerate(operands):
            parity = _votes.zero_vote_parity(r, step)
            bits.append(packed(_votes.add_sign_bits, np.zeros(_votes.sign_bytes(size),
                                                              dtype=np.uint8),
                               zero_parity=parity))
            np.testing.assert_array_equal(np.unpackbits(bits[-1], count=size), votes[r])
            words += packed(_votes.add_vote_digits, np.zeros_like(words), ranks,
                            zero_parity=parity)
            if _votes.int8_levels(ranks):
                total += packed(_votes.add_int8_levels, np.full(size, 99, dtype=np.int8),
                                ranks)

        def agreed(masks):
            return _votes.directions(*masks, size).astype(np.int64)

        np.testing.assert_array_equal(agreed(_votes.signs_majority(np.stack(bits), size)),
                                      majority, err_msg=repr(label))
        np.testing.assert_array_equal(agreed(_votes.vote_digits_majority(words, ranks, size)),
                                      majority, err_msg=repr(label))
        if _votes.int8_levels(ranks):
            offsets = np.cumsum([0] + sizes)
            expected = sum(np.concatenate([_int8_reference(c[a:b], ranks) for a, b in
                                           zip(offsets[:-1], offsets[1:])] + [np.zeros(0)])
                           for c in directions)
            np.testing.assert_array_equal(total, expected, err_msg=repr(label))
            np.testing.assert_array_equal(agreed(_votes.levels_as_masks(total)),
                                          np.sign(expected), err_msg=repr(label))
        # 1 bit: +-1 votes folded into the largest power of two, then recursive doubling.
        tie = np.where((index + step) % 2 == 1, 1, -1)
        signs = [np.where(v, 1, -1) for v in votes]
        paired = 1 << (ranks.bit_length() - 1)
        partial, ours = signs[:paired], bits[:paired]
        for r in range(paired, ranks):
            partial[r - paired] = np.where(partial[r - paired] == signs[r], signs[r], tie)
            ours[r - paired] = _votes.combine_one_bit(ours[r - paired], bits[r], step)
        distance = 1
        while distance < paired:
            partial = [np.where(partial[r] == partial[r ^ distance], partial[r], tie)
                       for r in range(paired)]
            ours = [_votes.combine_one_bit(ours[r], ours[r ^ distance], step)
                    for r in range(paired)]
            distance *= 2
        for r in range(paired):
            np.testing.assert_array_equal(agreed(_votes.signs_as_masks(ours[r], size)),
                                          partial[r], err_msg=repr(label))


@pytest.mark.parametrize("betas", [(10 ** 400, 0.5), (0.5, -(10 ** 400))])
def test_betas_beyond_float_range_are_a_value_error(betas):
    """An int beyond float's range raised OverflowError from math.isfinite, where lr and
    weight_decay give the ValueError of a value out of range."""
    with pytest.raises(ValueError, match="betas must be two numbers in"):
        Lion([torch.nn.Parameter(torch.zeros(2))], betas=betas)


CHECKS = Path(__file__).parent / "mpi" / "fuzz_optim_checks.py"


@pytest.mark.mpi
@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_lion_on_random_problems_matches_a_simulation_of_its_ranks(ranks):
    """Every mode and momentum schedule: the step, the momenta, the bytes of `bytes_per_step`
    and the syncs equal a one-process simulation of all the ranks' gradients."""
    status, out, err, _ = run_mpi(ranks, str(CHECKS), "random_steps_match_simulation",
                                  timeout=120, env={"PYSPARSE_HPC_COMM_TIMEOUT": "60"})
    assert status == 0, f"exit status {status}\n{out}\n{err[-6000:]}"
    assert "PASSED random_steps_match_simulation" in out, out
