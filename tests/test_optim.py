"""Lion against lion-pytorch, the compressed vote formats against plain loops, and
`DistributedLion` on one rank (the mpiexec runs are in test_optim_mpi.py)."""
import copy
import warnings

import numpy as np
import pytest
import torch

from pysparse_hpc.bench._agreeing_partner import AgreeingPartner
from pysparse_hpc.optim import COMPRESSIONS, DistributedLion, Lion, bytes_per_step
from pysparse_hpc.optim import _votes

from .faults import NanInEpoch
from .reference import reference_lion_agreement


def _mlp(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(),
                               torch.nn.Linear(9, 3)).to(dtype)


def _train(model, optimizer, steps, seed=1):
    generator = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        x = torch.randn(16, 6, generator=generator, dtype=dtype)
        target = torch.randn(16, 3, generator=generator, dtype=dtype)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("weight_decay", [0.0, 0.3])
def test_lion_equals_lion_pytorch_after_100_steps(weight_decay, dtype):
    """The kernel step is torch's arithmetic: the same bits as lion-pytorch's (the issue asks
    for 1e-12 in float64)."""
    lion_pytorch = pytest.importorskip("lion_pytorch")
    theirs, ours = _mlp(dtype=dtype), _mlp(dtype=dtype)
    expected = _train(theirs, lion_pytorch.Lion(theirs.parameters(), lr=1e-3,
                                                weight_decay=weight_decay), 100)
    got = _train(ours, Lion(ours.parameters(), lr=1e-3, weight_decay=weight_decay), 100)
    for e, g in zip(expected, got):
        assert torch.equal(g, e)


def test_lion_kernel_and_tensor_operations_agree_and_autograd_sees_the_change():
    """A parameter the kernel cannot take (a transposed view, float16) steps by tensor
    operations; in float32 both give the same bits. After a kernel step a graph that saved the
    parameter refuses to backpropagate, as after a torch in-place operation."""
    torch.manual_seed(3)
    weight = torch.randn(5, 7)
    grads = [torch.randn(5, 7) for _ in range(4)]
    contiguous = torch.nn.Parameter(weight.clone())
    strided = torch.nn.Parameter(weight.clone().t().contiguous().t())   # column-major
    assert not strided.is_contiguous()
    optimizers = [Lion([p], lr=1e-2, weight_decay=0.1) for p in (contiguous, strided)]
    for grad in grads:
        for p, optimizer in zip((contiguous, strided), optimizers):
            p.grad = grad.clone()
            optimizer.step()
    assert torch.equal(contiguous, strided)
    assert torch.equal(optimizers[0].state[contiguous]["exp_avg"],
                       optimizers[1].state[strided]["exp_avg"])
    half = torch.nn.Parameter(weight.half())
    half.grad = grads[0].half()
    Lion([half], lr=1e-2).step()
    assert half.dtype == torch.float16 and not torch.equal(half, weight.half())

    saved = (contiguous * 2).sum()   # the product saves nothing of contiguous ...
    kept = (contiguous ** 2).sum()   # ... this one saves it
    contiguous.grad = grads[0].clone()
    optimizers[0].step()
    saved.backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        kept.backward()


def test_lion_defaults_groups_and_state_dict_resume():
    model = _mlp()
    optimizer = Lion([{"params": model[0].parameters(), "lr": 1e-2},
                      {"params": model[2].parameters()}])
    assert optimizer.defaults == dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)
    _train(model, optimizer, 3)
    assert set(optimizer.state[model[0].weight]) == {"exp_avg"}
    resumed_model = copy.deepcopy(model)
    resumed = Lion([{"params": resumed_model[0].parameters(), "lr": 1e-2},
                    {"params": resumed_model[2].parameters()}])
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as if from a file
    expected = _train(model, optimizer, 4, seed=5)
    got = _train(resumed_model, resumed, 4, seed=5)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_lion_skips_parameters_without_gradient_and_zero_direction_stays():
    model = _mlp()
    frozen = model[2].weight.detach().clone()
    optimizer = Lion(model[0].parameters(), lr=0.1)
    model(torch.ones(2, 6, dtype=torch.float64)).sum().backward()
    model[0].bias.grad.zero_()
    bias = model[0].bias.detach().clone()
    optimizer.step()
    assert torch.equal(model[2].weight, frozen)
    assert torch.equal(model[0].bias, bias)  # sign(0) = 0: no move without weight decay


def test_lion_takes_a_group_frozen_by_lr_zero_but_not_a_zero_default():
    """A group's own lr = 0 (frozen, as torch's optimizers allow) was refused; the
    constructor's lr, every group's default, must be > 0 as lion-pytorch's."""
    model = _mlp()
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got 0.0"):
        Lion(model.parameters(), lr=0.0)
    optimizer = Lion([{"params": model[0].parameters(), "lr": 0.0}], lr=0.1)
    optimizer.add_param_group({"params": model[2].parameters(), "lr": 0.0})
    frozen = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(4, 6, dtype=torch.float64)).sum().backward()
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(frozen, model.parameters()))


@pytest.mark.parametrize("kwargs, kind, message", [
    (dict(lr=-1.0), ValueError, "lr must be"),
    (dict(lr=float("inf")), ValueError, "lr must be"),
    (dict(lr=10 ** 400), ValueError, "lr must be a finite number >=? 0"),  # was OverflowError
    (dict(weight_decay=10 ** 400), ValueError, "weight_decay must be a finite number"),
    (dict(betas=(0.9, 1.5)), ValueError, "betas must be"),
    (dict(betas=(0.9, float("nan"))), ValueError, "betas must be"),
    (dict(weight_decay=-1.0), ValueError, "weight_decay must be"),
    (dict(weight_decay=float("inf")), ValueError, "weight_decay must be"),
    (dict(lr=1.0, weight_decay=3.0), ValueError, r"lr \* weight_decay must be at most 1"),
    # wrong types are TypeErrors, as everywhere in the library (they were ValueErrors)
    (dict(lr=True), TypeError, "lr must be a number, got bool"),
    (dict(lr="1e-3"), TypeError, "lr must be a number, got str"),
    (dict(weight_decay=None), TypeError, "weight_decay must be a number, got NoneType"),
    (dict(betas=(0.9,)), TypeError, "betas must be two numbers"),
    (dict(betas=0.9), TypeError, "betas must be two numbers"),
    (dict(betas=(0.9, "0.99")), TypeError, "betas must be two numbers"),
    (dict(lr=torch.tensor(1e-3)), TypeError, r"lr must be a Python or NumPy number, got a tensor"),
    (dict(weight_decay=torch.tensor(0.1)), TypeError,
     r"weight_decay must be a Python or NumPy number"),
])
@pytest.mark.parametrize("where", ["constructor", "group", "added group"])
def test_lion_rejects_bad_hyperparameters(kwargs, kind, message, where):
    model = _mlp()
    with pytest.raises(kind, match=message):
        if where == "constructor":
            Lion(model.parameters(), **kwargs)
        elif where == "group":
            Lion([{"params": model[0].parameters(), **kwargs}])
        else:
            optimizer = Lion(model[0].parameters())
            try:
                optimizer.add_param_group({"params": model[2].parameters(), **kwargs})
            finally:   # a refused group is not kept
                assert len(optimizer.param_groups) == 1


def test_lion_takes_betas_once_and_numpy_scalars():
    optimizer = Lion(_mlp().parameters(), lr=np.float32(1e-3), betas=iter([0.8, 0.9]))
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.9)


@pytest.mark.parametrize("optimizer_class", [Lion, DistributedLion])
def test_lion_refuses_complex_parameters(optimizer_class):
    with pytest.raises(TypeError, match="real parameters, got one of torch.complex64"):
        optimizer_class([torch.nn.Parameter(torch.ones(2, dtype=torch.complex64))])


@pytest.mark.parametrize("optimizer_class", [Lion, DistributedLion])
@pytest.mark.parametrize("other_shape", [(20, 30), (9, 6)])  # larger; as many entries
def test_lion_refuses_the_state_of_another_model(optimizer_class, other_shape):
    # Its kernels index the momentum as the parameter: a state of other shapes once ran them
    # past the momentum's end.
    model, other = _mlp(), torch.nn.Linear(*reversed(other_shape)).double()
    source = optimizer_class(other.parameters(), lr=0.1)
    other(torch.ones(1, other_shape[1], dtype=torch.float64)).sum().backward()
    source.step()
    optimizer = optimizer_class(model[2].parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"parameter of shape \(3, 9\) has shape"):
        optimizer.load_state_dict(source.state_dict())
    assert len(optimizer.state) == 0    # left as it was
    model(torch.ones(1, 6, dtype=torch.float64)).sum().backward()
    optimizer.step()
    optimizer.state[model[2].weight]["exp_avg"] = torch.zeros(9, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="a state of another model"):   # set by hand
        optimizer.step()


@pytest.mark.parametrize("edit, message", [
    (lambda state: state["param_groups"][0].update(lr=float("nan")), "lr must be"),
    (lambda state: state["param_groups"][0].pop("betas"), "has no betas: not a Lion state"),
])
def test_lion_refuses_a_state_with_bad_settings(edit, message):
    model = _mlp()
    state = Lion(model.parameters(), lr=0.1).state_dict()
    edit(state)
    optimizer = Lion(model.parameters(), lr=0.2)
    with pytest.raises(ValueError, match=message):
        optimizer.load_state_dict(state)
    assert optimizer.param_groups[0]["lr"] == 0.2


def test_a_refused_state_fires_the_hooks_of_one_load():
    """A load kept a copy to go back to through `state_dict` and went back through a second
    load: the user's hooks were told of a state dict taken and of two loads, the second as
    if the refused one had been followed by another."""
    model = _mlp()
    state = Lion(model.parameters(), lr=0.1).state_dict()
    state["param_groups"][0]["lr"] = float("nan")
    optimizer = Lion(model.parameters(), lr=0.2)
    calls = []
    optimizer.register_state_dict_pre_hook(lambda *args: calls.append("state_dict"))
    optimizer.register_load_state_dict_pre_hook(lambda *args: calls.append("load"))
    with pytest.raises(ValueError, match="lr must be"):
        optimizer.load_state_dict(state)
    assert calls == ["load"] and optimizer.param_groups[0]["lr"] == 0.2
    model(torch.ones(1, 6, dtype=torch.float64)).sum().backward()
    optimizer.step()   # the groups restored are those the optimizer steps
    assert all("exp_avg" in optimizer.state[p] for p in model.parameters())


def test_distributed_lion_refuses_incomplete_counters():
    optimizer = DistributedLion(_mlp().parameters())
    state = optimizer.state_dict()
    del state["distributed_lion"]["next_sync"]
    with pytest.raises(ValueError, match="counters lack next_sync"):
        optimizer.load_state_dict(state)


def test_distributed_lion_refuses_a_non_bool_average_and_device_parameters():
    with pytest.raises(TypeError, match="average must be a bool, got str"):
        DistributedLion(_mlp().parameters(), average="no")
    optimizer = DistributedLion(_mlp().parameters())
    with pytest.raises(ValueError, match="host memory; a parameter is on meta"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(2, device="meta"))]})
    assert len(optimizer.param_groups) == 1


def test_distributed_lion_refuses_a_parameter_listed_twice():
    model = _mlp()
    with pytest.raises(ValueError, match="lists one twice"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch's own warning on duplicates
            DistributedLion([model[0].weight, model[0].weight])
    optimizer = DistributedLion(model[0].parameters())
    with pytest.raises(ValueError, match="lists one twice"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer.add_param_group({"params": [model[2].weight, model[2].weight]})
    assert len(optimizer.param_groups) == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(compression="bf16"), "compression must be"),
    (dict(momentum_sync="sometimes"), "momentum_sync must be"),
    (dict(compression="none", momentum_sync="always"), "must be 'local'"),
    (dict(sync_doubling=0), "sync_doubling must be"),
])
def test_distributed_lion_rejects_bad_modes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedLion(_mlp().parameters(), **kwargs)


def test_distributed_lion_takes_numpy_integers_and_refuses_other_numbers():
    assert DistributedLion(_mlp().parameters(), momentum_sync="growing",
                           sync_doubling=np.int64(3)).sync_doubling == 3
    for value in (2.0, True, "2"):
        with pytest.raises(TypeError, match="sync_doubling must be an integer"):
            DistributedLion(_mlp().parameters(), sync_doubling=value)


# ---------------------------------------------------------------- wire formats
@pytest.mark.parametrize("ranks, base, digits", [
    (1, 2, 64), (2, 3, 40), (3, 4, 32), (4, 5, 27), (5, 8, 21), (6, 8, 21), (7, 8, 21),
    (8, 9, 20), (9, 10, 19), (10, 16, 16), (255, 256, 8), (256, 512, 7)])
def test_vote_digits_fill_a_word_without_carrying(ranks, base, digits):
    """Digits of a base above P, as many as fit: the largest sum of P words, base^k - 1 at
    most, still fits in 64 bits, one more digit would not. The base is P + 1 where that packs
    at least a sixth more votes into a word than bit_length(P)-bit fields, else the fields."""
    assert (_votes.vote_base(ranks), _votes.vote_digits(ranks)) == (base, digits)
    assert base > ranks and base ** digits <= 2 ** 64 < base ** (digits + 1)
    fields = 64 // ranks.bit_length()
    assert (base == ranks + 1 and digits >= fields * 7 / 6) or (
        base == 2 ** ranks.bit_length() and digits == fields)


def test_vote_digits_sum_at_the_largest_counts():
    """Every vote +1 on every rank, in a full word and in a short last word: each digit of
    the SUM of P packed words is P (with base P + 1, the word is base^k - 1, its largest
    value) and reads back as unanimous +1."""
    for ranks in (2, 3, 4, 5, 8, 9):
        base, digits = _votes.vote_base(ranks), _votes.vote_digits(ranks)
        size = 2 * digits + 3
        words = sum(_votes.pack_vote_digits(np.ones(size, dtype=np.float32), ranks)
                    for _ in range(ranks))
        assert int(words[0]) == ranks * (base ** digits - 1) // (base - 1)
        assert int(words[2]) == ranks * (base ** 3 - 1) // (base - 1)
        if base == ranks + 1:  # every digit at its largest value
            assert int(words[0]) == base ** digits - 1
        np.testing.assert_array_equal(
            _votes.directions(*_votes.vote_digits_majority(words, ranks, size), size),
            np.ones(size, dtype=np.float32))


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize("size", [1, 7, 40, 41, 64, 65, 200])
@pytest.mark.parametrize("step", [0, 1])
def test_vote_formats_give_the_majority(ranks, size, step):
    rng = np.random.default_rng(ranks * 1000 + size)
    directions = [rng.standard_normal(size).astype(np.float32) for _ in range(ranks)]
    directions[0][::5] = 0.0  # exact zeros: the ranks split their votes
    for c in directions:
        c[3::7] = 0.0  # zero on every rank
    expected = reference_lion_agreement(directions, [size], "votes", step)
    parities = [_votes.zero_vote_parity(rank, step) for rank in range(ranks)]

    gathered = np.stack([_votes.pack_signs(c, parity) for c, parity in zip(directions, parities)])
    assert gathered.shape == (ranks, -(-size // 8))
    odd = np.arange(size) % 2 == 1
    np.testing.assert_array_equal(gathered, np.stack(
        [np.packbits((c > 0) | ((c == 0) & (odd != bool(parity))))
         for c, parity in zip(directions, parities)]))
    agreed = _votes.directions(*_votes.signs_majority(gathered, size), size)
    np.testing.assert_array_equal(agreed, expected)
    if ranks % 2 == 0:  # zero everywhere: a tie, so the coordinate stays
        assert not agreed[3::7].any()

    words = sum(_votes.pack_vote_digits(c, ranks, parity)  # an integer SUM
                for c, parity in zip(directions, parities))
    assert words.dtype == np.uint64 and words.size == -(-size // _votes.vote_digits(ranks))
    agreed = _votes.directions(*_votes.vote_digits_majority(words, ranks, size), size)
    np.testing.assert_array_equal(agreed, expected)
    if ranks == 1:
        agreed = _votes.directions(*_votes.signs_as_masks(gathered[0], size), size)
        np.testing.assert_array_equal(agreed, expected)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_nan_votes_as_a_zero_does(ranks):
    """Lion's sign(NaN) is 0: a NaN c splits its votes by parity, as an exact zero does, so a
    coordinate NaN on every rank ties and stays on an even number of ranks (it voted -1 and
    moved down by lr at every step); int8 gives it level 0 and scales by the finite |c|."""
    size = 40
    rng = np.random.default_rng(ranks)
    directions = [rng.standard_normal(size) for _ in range(ranks)]
    for c in directions:
        c[1::4] = np.nan
    parities = [_votes.zero_vote_parity(rank, 0) for rank in range(ranks)]
    odd = np.arange(size) % 2 == 1
    gathered = np.stack([_votes.pack_signs(c, parity) for c, parity in zip(directions, parities)])
    np.testing.assert_array_equal(gathered, np.stack(
        [np.packbits((c > 0) | (np.isnan(c) & (odd != bool(parity))))
         for c, parity in zip(directions, parities)]))
    words = sum(_votes.pack_vote_digits(c, ranks, parity)
                for c, parity in zip(directions, parities))
    for agreed in (_votes.directions(*_votes.signs_majority(gathered, size), size),
                   _votes.directions(*_votes.vote_digits_majority(words, ranks, size), size)):
        if ranks % 2 == 0:
            assert not agreed[1::4].any()
        else:   # up and down on alternate steps, never one way
            following = [_votes.zero_vote_parity(rank, 1) for rank in range(ranks)]
            next_step = _votes.directions(*_votes.signs_majority(np.stack(
                [_votes.pack_signs(c, parity) for c, parity in zip(directions, following)]),
                size), size)
            np.testing.assert_array_equal(next_step[1::4], -agreed[1::4])
    levels = _votes.quantize_int8(directions[0], np.array([0, size]), ranks)
    finite = np.delete(directions[0], np.s_[1::4])
    expected = np.clip(np.rint(finite / (np.abs(finite).sum() / size) *
                               _votes.int8_levels(ranks) / 2), -_votes.int8_levels(ranks),
                       _votes.int8_levels(ranks))
    assert not levels[1::4].any()
    np.testing.assert_array_equal(np.delete(levels, np.s_[1::4]), expected)


@pytest.mark.parametrize("ranks", [10, 255, 256])
def test_vote_digits_majority_on_many_ranks(ranks):
    """Bit fields of 16 values, 8-bit fields, and base 512 (one digit a chunk): every count
    0..P in turn, summed from P packed words."""
    size = 300
    counts = np.arange(size) % (ranks + 1)
    words = sum(_votes.pack_vote_digits(np.where(counts > r, 1.0, -1.0), ranks)
                for r in range(ranks))
    agreed = _votes.directions(*_votes.vote_digits_majority(words, ranks, size), size)
    np.testing.assert_array_equal(agreed, np.sign(2 * counts - ranks))


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7, 8])
def test_masks_count_every_number_of_plus_votes(ranks):
    """Each coordinate of a word sees another number of +1 votes, 0..P, so the bit-sliced
    counts and both comparisons with P / 2 meet every case; the tie only at even P."""
    size = 64 * 3 + 5
    counts = np.arange(size) % (ranks + 1)
    gathered = np.stack([np.packbits(counts > r) for r in range(ranks)])
    plus, minus = _votes.signs_majority(gathered, size)
    np.testing.assert_array_equal(_votes.directions(plus, minus, size),
                                  np.sign(2 * counts - ranks))
    np.testing.assert_array_equal(_votes.directions(plus, minus, 9, start=60),
                                  np.sign(2 * counts[60:69] - ranks))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_votes_packed_tensor_by_tensor_at_unaligned_offsets(dtype):
    """A rank packs each tensor's votes from its momentum and gradient where the tensor
    starts in the whole vote, mid-byte and mid-word: the same buffers as packing the whole
    interpolation at once, with torch's rounding of beta1 m + (1 - beta1) g; the int8
    levels are each tensor's own, whatever its size against the kernel's 32 running sums."""
    rng = np.random.default_rng(5)
    sizes = [3, 13, 1, 64, 45, 7, 130]
    momenta = [rng.standard_normal(n).astype(dtype) for n in sizes]
    grads = [rng.standard_normal(n).astype(dtype) for n in sizes]
    grads[1][:4] = -momenta[1][:4] * 9  # c a rounding away from 0
    for k in (4, 6):  # c exactly 0: no gradient yet; the tensors start at odd coordinates
        momenta[k][:9], grads[k][:9] = 0, 0
    beta1, rest1 = dtype(0.9), dtype(1 - 0.9)
    whole = np.concatenate([torch.from_numpy(m).mul(0.9).add_(torch.from_numpy(g),
                                                              alpha=1 - 0.9).numpy()
                            for m, g in zip(momenta, grads)])
    assert (whole == 0).any()
    packed = np.zeros(_votes.sign_bytes(sum(sizes)), dtype=np.uint8)
    for ranks, parity in ((2, 1), (3, 0)):
        words = np.zeros(_votes.digit_words(sum(sizes), ranks), dtype=np.uint64)
        start = 0
        for m, g in zip(momenta, grads):
            if ranks == 2:
                _votes.add_sign_bits(packed, start, m, g, beta1, rest1, parity)
            _votes.add_vote_digits(words, start, ranks, m, g, beta1, rest1, parity)
            start += m.size
        np.testing.assert_array_equal(words, _votes.pack_vote_digits(whole, ranks, parity))
    even = np.arange(whole.size) % 2 == 0  # where a zero votes +1 with parity 1
    np.testing.assert_array_equal(packed, np.packbits((whole > 0) | ((whole == 0) & even)))
    # int8 levels, each tensor scaled by its own mean |c| (NumPy's formula).
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for ranks in (2, 3):
        bound = _votes.int8_levels(ranks)
        levels = np.full(sum(sizes), 99, dtype=np.int8)
        expected = np.empty_like(levels)
        for m, g, start, stop in zip(momenta, grads, offsets[:-1], offsets[1:]):
            _votes.add_int8_levels(levels, start, ranks, m, g, beta1, rest1)
            c = whole[start:stop].astype(np.float64)
            expected[start:stop] = np.clip(np.rint(c / np.abs(c).mean() * bound / 2),
                                           -bound, bound)
        np.testing.assert_array_equal(levels, expected)
        np.testing.assert_array_equal(levels, _votes.quantize_int8(whole, offsets, ranks))


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_int8_levels_sum_without_overflow_and_match_the_reference(ranks):
    rng = np.random.default_rng(ranks)
    sizes = [13, 1, 30]
    directions = [rng.standard_normal(sum(sizes)) * 10.0 ** rng.integers(-3, 3)
                  for _ in range(ranks)]
    directions[-1][13] = 0.0  # a one-element tensor that is zero: no vote
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    levels = [_votes.quantize_int8(c, offsets, ranks) for c in directions]
    bound = _votes.int8_levels(ranks)
    assert all(np.abs(q).max() <= bound for q in levels)
    total = np.sum(levels, axis=0, dtype=np.int64)
    assert np.abs(total).max() <= 127
    expected = reference_lion_agreement(directions, sizes, "int8")
    np.testing.assert_array_equal(np.sign(total), expected)
    agreed = _votes.directions(*_votes.levels_as_masks(total.astype(np.int8)), total.size)
    np.testing.assert_array_equal(agreed, expected)


def test_int8_levels_of_a_tensor_with_a_subnormal_mean():
    """levels / (2 mean) overflows for a subnormal mean, and 0 * inf made NaN levels: the
    coordinates with no opinion voted the largest level."""
    c = np.zeros(10)
    c[0] = 1e-320
    levels = _votes.quantize_int8(c, np.array([0, 10]), 2)
    np.testing.assert_array_equal(levels, [_votes.int8_levels(2)] + [0] * 9)
    c[0] = -1e-320
    assert _votes.quantize_int8(c, np.array([0, 10]), 3)[0] == -_votes.int8_levels(3)


def test_int8_is_refused_where_its_levels_would_be_zero():
    class ManyRanks:
        rank, size = 0, 128

        def Allreduce(self, *args, **kwargs):
            raise AssertionError("not reached")
    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ValueError, match="int8' works on at most 127 ranks"):
        DistributedLion(params, comm=ManyRanks(), compression="int8")


def test_one_bit_combine_breaks_ties_by_parity_of_coordinate_and_step():
    mine, theirs = np.packbits([1, 0] * 8), np.packbits([0, 1] * 8)
    for step, plus_at_odd in ((0, True), (1, False), (2, True), (7, False)):
        combined = np.unpackbits(_votes.combine_one_bit(mine, theirs, step))
        np.testing.assert_array_equal(combined, [0, 1] * 8 if plus_at_odd else [1, 0] * 8)
    agree = np.packbits([1, 1, 0, 0, 1, 0, 1, 0])
    for step in (0, 1):
        np.testing.assert_array_equal(_votes.combine_one_bit(agree, agree, step), agree)


@pytest.mark.parametrize("compression, ranks, rank, expected", [
    ("none", 2, 0, 4000), ("none", 1, 0, 0), ("signs", 2, 0, 125), ("signs", 3, 1, 250),
    # votes: 1000 coordinates in words of 40 (P = 2), 32 (P = 3) and 27 (P = 4) digits.
    ("votes", 2, 0, 8 * 25), ("votes", 3, 0, 8 * 32), ("votes", 4, 0, 8 * 38),
    ("int8", 3, 2, 1000), ("1bit", 2, 0, 125), ("1bit", 3, 0, 250), ("1bit", 3, 1, 125),
    ("1bit", 3, 2, 125), ("1bit", 4, 3, 250),
])
def test_bytes_per_step_formulas(compression, ranks, rank, expected):
    assert bytes_per_step(compression, 1000, ranks, rank=rank) == expected


@pytest.mark.parametrize("compression, ranks, rank, expected", [
    # 1001 coordinates: the last byte of signs is partly filled (ceil(1001 / 8) = 126), the
    # last word of votes too (ceil(1001 / 40) = 26 words of 8 bytes); 1000 hid both.
    ("signs", 2, 0, 126), ("signs", 3, 1, 252), ("1bit", 2, 0, 126), ("1bit", 3, 0, 252),
    ("votes", 2, 0, 8 * 26), ("int8", 3, 2, 1001), ("none", 2, 0, 4004),
])
def test_bytes_per_step_round_partial_bytes_and_words_up(compression, ranks, rank, expected):
    assert bytes_per_step(compression, 1001, ranks, rank=rank) == expected


def test_the_default_momentum_sync_is_lion_cubs_growing_schedule():
    params = _mlp().parameters
    assert DistributedLion(params(), compression="votes").momentum_sync == "growing"
    assert DistributedLion(params(), compression="int8").momentum_sync == "growing"
    assert DistributedLion(params(), compression="none").momentum_sync == "local"


# ---------------------------------------------------------------- one rank
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_distributed_lion_on_one_rank_is_lion(compression):
    """Nothing crosses a network on one rank, so every mode takes Lion's step, to the bit."""
    reference, model = _mlp(), _mlp()
    expected = _train(reference, Lion(reference.parameters(), lr=1e-3, weight_decay=0.1), 20)
    optimizer = DistributedLion(model.parameters(), lr=1e-3, weight_decay=0.1,
                                compression=compression)
    got = _train(model, optimizer, 20)
    assert optimizer.steps_taken == 20
    for e, g in zip(expected, got):
        assert torch.equal(g, e)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_distributed_lion_takes_sparse_gradients(compression):
    """An ``Embedding(sparse=True)``'s gradient: one rank steps as Lion does, and the rows
    not looked up yet stay."""
    def run(optimizer_for):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(10, 4, sparse=True).double()
        optimizer = optimizer_for(embedding.parameters())
        for step in range(3):
            optimizer.zero_grad()
            embedding(torch.tensor([1, 3, 3, step])).pow(2).sum().backward()
            optimizer.step()
        return embedding.weight.detach()

    expected = run(lambda params: Lion(params, lr=1e-2))
    got = run(lambda params: DistributedLion(params, lr=1e-2, compression=compression))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("compression", ["signs", "votes", "int8", "1bit"])
def test_distributed_lion_tensor_operations_equal_the_kernels(compression):
    """Parameters the kernels cannot read (a transposed view, float16) vote and step by
    tensor operations, at their offsets in the vote: in float32 the same bits as the
    kernels'; the float16 one moves too."""
    torch.manual_seed(4)
    weight, bias = torch.randn(5, 7), torch.randn(13)
    plain = [torch.nn.Parameter(bias.clone()), torch.nn.Parameter(weight.clone())]
    strided = [torch.nn.Parameter(bias.clone()),  # the transposed view starts mid-byte
               torch.nn.Parameter(weight.clone().t().contiguous().t())]
    half = torch.nn.Parameter(torch.randn(70).half())  # starts at coordinate 48, mid-word
    before = half.detach().clone()
    settings = dict(lr=1e-2, weight_decay=0.1, compression=compression)
    optimizers = [DistributedLion(plain, comm=AgreeingPartner(), **settings),
                  DistributedLion(strided + [half], comm=AgreeingPartner(), **settings)]
    for _ in range(4):
        grads = torch.randn(13), torch.randn(5, 7)
        for params in (plain, strided):
            for param, grad in zip(params, grads):
                param.grad = grad.clone()
        half.grad = torch.randn(70).half()
        for optimizer in optimizers:
            optimizer.step()
    assert not strided[1].is_contiguous()
    for mine, theirs in zip(plain, strided):
        assert torch.equal(mine, theirs)
    assert not torch.equal(half, before)


class _TwinComm:
    """A two-rank communicator whose other rank holds what this one holds."""
    rank, size = 0, 2

    def Allreduce(self, buffer, op="sum", kind=None):
        buffer *= 2
        return buffer


def test_growing_momentum_sync_schedule():
    model = _mlp()
    optimizer = DistributedLion(model.parameters(), comm=_TwinComm(), compression="int8",
                                momentum_sync="growing", sync_doubling=2)
    synced_at = []
    for step in range(1, 30):
        before = optimizer.momentum_syncs
        _train(model, optimizer, 1, seed=step)
        if optimizer.momentum_syncs > before:
            synced_at.append(step)
    # gaps floor(2 ** (j / 2)) after the j-th sync: 1, 2, 2, 4, 5, 8, 11
    assert synced_at == [1, 2, 4, 6, 10, 15, 23]
    state = optimizer.state_dict()
    resumed = DistributedLion(_mlp().parameters(), comm=_TwinComm(), compression="int8",
                              momentum_sync="growing", sync_doubling=2)
    resumed.load_state_dict(state)
    assert (resumed.steps_taken, resumed.momentum_syncs, resumed._next_sync) == \
        (29, 7, 34)


def test_a_momentum_sync_takes_the_mean_over_the_ranks():
    """Ranks that hold the same momentum keep it through a sync: the mean, not the sum (which
    also leaves the ranks alike, so the checks of agreement alone passed it). Over a twin
    rank int8's agreed update is Lion's sign, so the run is Lion's, momenta included."""
    reference, model = _mlp(), _mlp()
    plain = Lion(reference.parameters(), lr=1e-3)
    twin = DistributedLion(model.parameters(), comm=_TwinComm(), lr=1e-3, compression="int8",
                           momentum_sync="always")
    _train(reference, plain, 3)
    _train(model, twin, 3)
    assert twin.momentum_syncs == 3
    for p, q in zip(reference.parameters(), model.parameters()):
        assert torch.equal(plain.momentum(p), twin.momentum(q))


# ---------------------------------------------------------------- in the trainer
def _cora():
    import pysparse_hpc as sph
    from pysparse_hpc.nn.train import node_tensors
    cora = sph.datasets.load("cora")
    return cora, node_tensors(cora)


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_fit_with_lion_trains(compression):
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit
    cora, (x, y, *masks) = _cora()
    torch.manual_seed(0)
    result = fit(models.GCN(x.shape[1], 16, cora.num_classes), x, cora.adj, y, masks,
                 epochs=30, progress=False, optimizer="lion", compression=compression)
    assert result.losses[-1] < 0.8 * result.losses[0] and result.val_accuracy > 0.5


@pytest.mark.parametrize("kwargs, message", [
    (dict(optimizer="rmsprop"), "optimizer must be one of"),
    (dict(compression="votes"), "apply to optimizer='lion', got compression='votes', "
                                "momentum_sync=None with optimizer='adam'"),
    (dict(optimizer="sgd", momentum_sync="always"), "apply to optimizer='lion'"),
    (dict(damping=0.1), "damping applies to a preconditioner, got damping=0.1 with "
                        "preconditioner=None"),
    (dict(preconditioner="kfac", damping=0.0), "damping must be a finite number > 0"),
    (dict(optimizer="lion", preconditioner="kfac"), "takes none"),
    (dict(optimizer="lion", compression="zip"), "compression must be one of"),
    (dict(lr=float("nan")), "lr must be a finite number > 0, got nan"),
    (dict(lr=0.0), "lr must be a finite number > 0, got 0.0"),
    (dict(optimizer="lion", lr=float("inf")), "lr must be a finite number > 0"),
    (dict(weight_decay=-1e-4), "weight_decay must be a finite number >= 0"),
    (dict(epochs=-1), "epochs must be at least 0, got -1"),
])
def test_fit_rejects_bad_optimizer_settings(kwargs, message):
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit
    cora, (x, y, *masks) = _cora()
    with pytest.raises(ValueError, match=message):
        fit(models.GCN(x.shape[1], 4, cora.num_classes), x, cora.adj, y, masks,
            **{"epochs": 1, "progress": False, **kwargs})


@pytest.mark.parametrize("change, kind, message", [
    (lambda y, masks: (y, [masks[0].long(), *masks[1:]]), TypeError,
     "train_mask must be a 1-D bool tensor, got 1-D torch.int64"),
    (lambda y, masks: (y, [masks[0], masks[1].float(), masks[2]]), TypeError,
     "val_mask must be a 1-D bool tensor"),
    (lambda y, masks: (y.double(), masks), TypeError, "y must be a 1-D int64 tensor"),
    (lambda y, masks: (torch.nn.functional.one_hot(y), masks), TypeError,
     "y must be a 1-D int64 tensor of class ids, got 2-D"),
    (lambda y, masks: (torch.where(masks[2], -100, y), masks), ValueError,
     "y holds the class id -100 on a node of the masks"),
])
def test_fit_refuses_masks_and_labels_it_would_misread(change, kind, message):
    # An int64 0/1 mask indexed rows 0 and 1 and reported accuracies of 3.0.
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit
    cora, (x, y, *masks) = _cora()
    y, masks = change(y, masks)
    with pytest.raises(kind, match=message):
        fit(models.GCN(x.shape[1], 4, cora.num_classes), x, cora.adj, y, masks, epochs=1,
            progress=False)


def test_fit_without_validation_nodes_keeps_the_last_epoch_and_no_epoch_measures_nothing():
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit
    cora, (x, y, train, val, test) = _cora()
    torch.manual_seed(0)
    result = fit(models.GCN(x.shape[1], 4, cora.num_classes), x, cora.adj, y,
                 (train, torch.zeros_like(val), test), epochs=5, progress=False)
    # no accuracy measured: NaN, as the test accuracy without test nodes (0.0 read as a
    # model wrong on every validation node)
    assert result.best_epoch == 4 and np.isnan(result.val_accuracy)
    assert 0 < result.test_accuracy < 1
    result = fit(models.GCN(x.shape[1], 4, cora.num_classes), x, cora.adj, y,
                 (train, val, test), epochs=0, progress=False)
    assert result.best_epoch == -1 and np.isnan(result.test_accuracy)
    assert np.isnan(result.val_accuracy) and result.losses == []


@pytest.mark.parametrize("optimizer", ["adam", "lion"])
@pytest.mark.filterwarnings("ignore:GCNConv produced NaN")
def test_fit_skips_a_nonfinite_step_and_says_so(optimizer, capsys):
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit
    cora, (x, y, *masks) = _cora()
    torch.manual_seed(0)
    model = NanInEpoch(models.GCN(x.shape[1], 8, cora.num_classes), epoch=2)
    with pytest.warns(RuntimeWarning, match="epoch 3: non-finite loss or gradient on rank 0"):
        result = fit(model, x, cora.adj, y, masks, epochs=5, progress=False,
                     optimizer=optimizer)
    assert result.skipped_epochs == [2] and np.isnan(result.losses[2])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert np.isfinite(result.losses[4])

    # under a progress bar, on standard error as the bar: not among a run's results
    torch.manual_seed(0)
    model = NanInEpoch(models.GCN(x.shape[1], 8, cora.num_classes), epoch=2)
    capsys.readouterr()
    fit(model, x, cora.adj, y, masks, epochs=4, progress=True, optimizer=optimizer)
    said = capsys.readouterr()
    assert "epoch 3: non-finite loss" in said.err and "non-finite" not in said.out

    torch.manual_seed(0)
    model = NanInEpoch(models.GCN(x.shape[1], 8, cora.num_classes), epoch=2)
    result = fit(model, x, cora.adj, y, masks, epochs=4, progress=False, optimizer=optimizer,
                 skip_nonfinite=False)
    assert result.skipped_epochs == []
    if optimizer == "adam":  # NaN weights. Lion's momentum turns NaN instead, and
        assert not np.isfinite(result.losses[3])  # sign(NaN) = 0 stops it silently.


def test_a_diverged_model_is_never_the_best_and_the_command_fails(capsys):
    """Overflowed weights give NaN outputs, whose argmax (class 0 everywhere) is an accuracy
    but not a model's: such an epoch is not selected, and the command exits with status 1."""
    from pysparse_hpc.__main__ import main
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit
    cora, (x, y, *masks) = _cora()
    torch.manual_seed(0)
    with pytest.warns(RuntimeWarning):
        result = fit(models.GCN(x.shape[1], 8, cora.num_classes), x, cora.adj, y, masks,
                     epochs=2, lr=1e30, progress=False)
    assert result.diverged_epoch == 0 and result.best_epoch == -1
    assert np.isnan(result.test_accuracy)
    with pytest.warns(RuntimeWarning):
        assert main(["train", "--epochs", "2", "--lr", "1e30", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "no finite model to measure" in captured.out
    assert "training diverged: the model's outputs were not finite after epoch 1" in captured.err


def test_train_command_with_lion(capsys):
    from pysparse_hpc.__main__ import main
    assert main(["train", "--optimizer", "lion", "--epochs", "3", "--no-progress"]) == 0
    assert "Lion (none compression)" in capsys.readouterr().out
    for bad in (["--compression", "votes"], ["--optimizer", "lion", "--momentum-sync", "always"]):
        with pytest.raises(SystemExit):
            main(["train", "--no-progress", *bad])
    assert "need --optimizer lion" in capsys.readouterr().err


def test_asv_lion_benchmark_times_the_vote_path(monkeypatch):
    """The asv benchmark of `DistributedLion` runs each mode as rank 0 of two (a one-rank
    job would take Lion's step and time nothing of the votes)."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "asv_bench"))
    from benchmarks.bench_optim import COMPRESSIONS as TIMED, LionStep
    assert list(TIMED) == list(COMPRESSIONS)
    for compression in ("votes", "1bit"):
        benchmark = LionStep()
        benchmark.setup(compression)
        before = [p.detach().clone() for p in benchmark.optimizer.param_groups[0]["params"]]
        benchmark.time_step(compression)
        assert benchmark.optimizer.comm.size == 2
        assert benchmark.optimizer.steps_taken == 3  # the warm-up steps and the timed one
        assert any(not torch.equal(b, p) for b, p in
                   zip(before, benchmark.optimizer.param_groups[0]["params"]))


@pytest.mark.parametrize("optimizer_class", [Lion, DistributedLion])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_a_nan_gradient_stops_its_coordinate_as_in_lion_pytorch(optimizer_class, dtype):
    """sign(NaN) is 0 in torch: lion-pytorch leaves the coordinate (its momentum turns NaN and
    keeps it still); the kernels moved it to NaN."""
    lion_pytorch = pytest.importorskip("lion_pytorch")
    results = []
    for make in (lambda p: lion_pytorch.Lion(p, lr=0.1, weight_decay=0.1),
                 lambda p: optimizer_class(p, lr=0.1, weight_decay=0.1)):
        param = torch.nn.Parameter(torch.ones(4, dtype=dtype))
        optimizer = make([param])
        for grad in ([float("nan"), 1.0, -1.0, 0.0], [1.0, 1.0, float("nan"), 1.0]):
            param.grad = torch.tensor(grad, dtype=dtype)
            optimizer.step()
        results.append(param.detach().clone())
    assert torch.equal(results[0], results[1]) and not results[1][1].isnan()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_signed_zeros_come_out_as_in_lion_pytorch(dtype, weight_decay):
    """torch.sign(-0.0) is +0.0, NumPy's sign -0.0: the kernel turned a parameter of -0.0 with
    a direction of -0.0 into +0.0, where lion-pytorch (and the tensor operations) keep -0.0."""
    lion_pytorch = pytest.importorskip("lion_pytorch")
    signs = []
    for make in (lion_pytorch.Lion, Lion):
        param = torch.nn.Parameter(torch.tensor([-0.0, 0.0, -0.0, 0.0, -0.0], dtype=dtype))
        optimizer = make([param], lr=0.1, weight_decay=weight_decay)
        param.grad = torch.tensor([-0.0, -0.0, 0.0, 0.0, -0.0], dtype=dtype)
        optimizer.state[param]["exp_avg"] = torch.tensor([-0.0, -0.0, -0.0, 0.0, 0.0],
                                                         dtype=dtype)
        optimizer.step()
        signs.append((torch.signbit(param.detach()).tolist(),
                      torch.signbit(optimizer.state[param]["exp_avg"]).tolist()))
    assert signs[0] == signs[1]


def test_decoupled_weight_decay_and_use_triton_as_lion_pytorch():
    """lion-pytorch's two switches: decoupled_weight_decay (the decay over the first lr, so it
    follows a schedule) gives its bits under a StepLR; use_triton=True is refused."""
    lion_pytorch = pytest.importorskip("lion_pytorch")
    params = []
    for make in (lion_pytorch.Lion, Lion):
        model = _mlp()
        optimizer = make(model.parameters(), lr=1e-2, weight_decay=0.5,
                         decoupled_weight_decay=True, use_triton=False)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        generator = torch.Generator().manual_seed(1)
        for _ in range(10):
            optimizer.zero_grad()
            model(torch.randn(8, 6, generator=generator, dtype=torch.float64)).sum().backward()
            optimizer.step()
            schedule.step()
        params.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*params))
    with pytest.raises(ValueError, match="use_triton=True"):
        Lion(_mlp().parameters(), use_triton=True)
    with pytest.raises(ValueError, match=r"lr \* weight_decay / initial lr must be at most 1"):
        Lion(_mlp().parameters(), lr=1e-3, weight_decay=2.0, decoupled_weight_decay=True)


def test_a_schedule_at_lr_zero_saves_and_loads_and_each_step_checks_its_groups():
    """A warm-up from lr = 0 (LambdaLR) or a cosine schedule's end: its state loads (it was
    refused) and steps; an lr raised by hand so that lr * weight_decay > 1 (which flips the
    weights' signs) is refused by the step before anything moves; a group that asks to
    maximize is refused."""
    model = _mlp()
    optimizer = Lion(model.parameters(), lr=1e-3, weight_decay=0.5)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 100)
    assert optimizer.param_groups[0]["lr"] == 0.0
    model(torch.ones(2, 6, dtype=torch.float64)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()   # lr = 0: nothing moves
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    resumed = Lion(_mlp().parameters(), lr=1e-3)
    resumed.load_state_dict(optimizer.state_dict())
    assert resumed.param_groups[0]["lr"] == 0.0
    optimizer.param_groups[0]["lr"] = 4.0
    with pytest.raises(ValueError, match=r"parameter group 0: lr \* weight_decay must be"):
        optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="asks to maximize"):
        Lion([{"params": model.parameters(), "maximize": True}])


def test_lion_refuses_the_state_of_another_optimizer():
    """Adam's state has betas and an exp_avg: it loaded, and Lion took Adam's first moment as
    its momentum beside exp_avg_sq and step. Now its extra entries are named and refused."""
    model = _mlp()
    adam = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 6, dtype=torch.float64)).sum().backward()
    adam.step()
    optimizer = Lion(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="holds exp_avg_sq, step for a parameter, which Lion"):
        optimizer.load_state_dict(adam.state_dict())
    assert len(optimizer.state) == 0 and optimizer.param_groups[0]["lr"] == 0.1


def test_distributed_lion_checks_its_counters_and_names_another_compression():
    state = DistributedLion(_mlp().parameters(), compression="votes").state_dict()
    bad = copy.deepcopy(state)
    bad["distributed_lion"]["steps_taken"] = "seven"
    optimizer = DistributedLion(_mlp().parameters(), compression="signs")
    with pytest.raises(ValueError, match="counter steps_taken must be an int >= 0, got 'seven'"):
        optimizer.load_state_dict(bad)
    with pytest.warns(RuntimeWarning, match="compression='votes' into compression='signs'"):
        optimizer.load_state_dict(state)


@pytest.mark.parametrize("optimizer_class", [Lion, DistributedLion])
def test_step_hooks_run_once_per_step(optimizer_class):
    """One rank's `DistributedLion` takes Lion's step: it called ``Lion.step``, which torch
    wraps with the step hooks once a Lion exists, so every hook ran twice per step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook
    Lion(_mlp().parameters())   # torch wraps Lion.step when the first Lion is made
    model = _mlp()
    optimizer = optimizer_class(model.parameters(), lr=1e-3)
    calls = []
    handles = [optimizer.register_step_pre_hook(lambda *_: calls.append("pre")),
               optimizer.register_step_post_hook(lambda *_: calls.append("post")),
               register_optimizer_step_post_hook(lambda *_: calls.append("global post"))]
    try:
        _train(model, optimizer, 2)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == ["pre", "post", "global post"] * 2


@pytest.mark.parametrize("optimizer_class", [Lion, DistributedLion])
def test_a_compiled_training_step_equals_lion_pytorch(optimizer_class):
    """``torch.compile`` over a training step (or over ``optimizer.step``): the compiler
    traced into Numba's dispatcher and failed, or handed the kernels 0-d arrays for their
    NumPy scalars. The update now runs eagerly inside the compiled step: lion-pytorch's bits,
    the float16 parameter's (tensor operations) too."""
    lion_pytorch = pytest.importorskip("lion_pytorch")
    results = []
    for make, compiled in ((lion_pytorch.Lion, False), (optimizer_class, True)):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3).double()
        half = torch.nn.Parameter(torch.randn(5).half())
        optimizer = make([*model.parameters(), half], lr=1e-2, weight_decay=0.1)

        def train_step(x):
            optimizer.zero_grad()
            loss = model(x).pow(2).sum() + half.float().pow(2).sum()
            loss.backward()
            optimizer.step()
            return loss
        step = torch.compile(train_step, backend="eager") if compiled else train_step
        generator = torch.Generator().manual_seed(1)
        for _ in range(3):
            step(torch.randn(4, 6, generator=generator, dtype=torch.float64))
        if compiled:   # the optimizer's step alone, as torch's tutorials compile it
            torch.compile(optimizer.step, backend="eager")()
        else:
            optimizer.step()
        results.append([p.detach().clone() for p in (*model.parameters(), half)])
    torch.compiler.reset()
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_copied_or_unpickled_lion_steps_as_the_original():
    """Torch's ``__getstate__`` keeps only defaults, state and groups: a deep copy or an
    unpickled Lion lost its decay setting (AttributeError at its first step). A copied
    `DistributedLion` keeps its mode and counters and shares the communicator."""
    import pickle
    model = _mlp()
    optimizer = Lion(model.parameters(), lr=1e-2, weight_decay=0.5, decoupled_weight_decay=True)
    _train(model, optimizer, 2)
    copies = [copy.deepcopy((model, optimizer)), pickle.loads(pickle.dumps((model, optimizer)))]
    expected = _train(model, optimizer, 3, seed=4)
    for copied_model, copied in copies:   # a model and its optimizer copied together
        assert all(torch.equal(e, g) for e, g in
                   zip(expected, _train(copied_model, copied, 3, seed=4)))

    distributed = DistributedLion(model.parameters(), compression="int8",
                                  momentum_sync="always", sync_doubling=3)
    _train(model, distributed, 2)
    twin_model, twin = copy.deepcopy((model, distributed))
    assert twin.comm is distributed.comm
    assert (twin.compression, twin.momentum_sync, twin.sync_doubling, twin.steps_taken) == \
        ("int8", "always", 3, 2)
    assert all(torch.equal(e, g) for e, g in zip(_train(model, distributed, 2),
                                                 _train(twin_model, twin, 2)))


@pytest.mark.parametrize("args, kind, message", [
    (("votes", 1000, 0), ValueError, "ranks must be at least 1, got 0"),  # looped for ever
    (("votes", 1000, -3), ValueError, "ranks must be at least 1"),
    (("1bit", 1000, 3, 5), ValueError, r"rank must be in 0\.\.2, got 5"),
    (("signs", -8, 2), ValueError, "size must be at least 0"),
    (("none", 1000, 2, 0, 0), ValueError, "itemsize must be at least 1"),
    (("1bit", 1000, 2.0), TypeError, "ranks must be an integer"),
    # int8's levels are 0 from 128 ranks: DistributedLion refuses it, this counted bytes
    (("int8", 1000, 128), ValueError, "'int8' works on at most 127 ranks.*got ranks=128"),
])
def test_bytes_per_step_refuses_bad_counts(args, kind, message):
    with pytest.raises(kind, match=message):
        bytes_per_step(*args)
    with pytest.raises(ValueError, match="ranks must be at least 1"):
        _votes.vote_base(0)


@pytest.mark.parametrize("optimizer_class", [Lion, DistributedLion])
@pytest.mark.parametrize("momentum, found", [
    (None, "NoneType"), (0.5, "float"), ([1.0, 2.0, 3.0], "list"),
    (torch.ones(3).to_sparse(), "torch.sparse_coo tensor")])
def test_lion_refuses_a_momentum_that_is_not_a_dense_tensor(optimizer_class, momentum, found):
    """A state dict's exp_avg that is no dense tensor: None loaded and failed at the step,
    a number or a list raised AttributeError and stayed loaded, a sparse tensor loaded and
    failed at the step. Now each is refused and the optimizer left as it was."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = optimizer_class([param], lr=0.1)
    state = optimizer.state_dict()
    state["state"] = {0: {"exp_avg": momentum}}
    with pytest.raises(ValueError, match=f"must be a dense tensor, got (a )?{found}"):
        optimizer.load_state_dict(state)
    assert len(optimizer.state) == 0
    optimizer.state[param]["exp_avg"] = momentum   # set by hand
    param.grad = torch.ones(3)
    with pytest.raises(ValueError, match="must be a dense tensor"):
        optimizer.step()
    assert torch.equal(param, torch.ones(3))


def test_int8_levels_of_a_tensor_whose_mean_is_above_half_the_largest_float():
    """levels / (2 mean) doubled a mean above half the largest float64 to infinity (a
    one-coordinate tensor of such a c), so the tensor got level 0 and had no say."""
    for ranks, c in ((2, 1e308), (3, -1.2e308)):
        bound = _votes.int8_levels(ranks)
        levels = _votes.quantize_int8(np.array([c]), np.array([0, 1]), ranks)
        assert levels[0] == np.sign(c) * np.rint(bound / 2)


def test_lion_flags_take_bools_only():
    """decoupled_weight_decay="no" was taken as True, and use_triton="False" was refused as
    use_triton=True."""
    for name, optimizers in (("decoupled_weight_decay", (Lion, DistributedLion)),
                             ("use_triton", (Lion,))):
        for optimizer in optimizers:
            with pytest.raises(TypeError, match=f"{name} must be a bool"):
                optimizer(_mlp().parameters(), **{name: "no"})
    assert Lion(_mlp().parameters(), decoupled_weight_decay=True).decoupled_weight_decay
