"""The wire formats of the compressed Lion modes, on flat NumPy arrays: no MPI, no torch.

A rank's votes are packed from its momentum and gradient, one tensor at a time at its offset
in the whole vote (``c = beta1 m + (1 - beta1) g`` is computed on the way, never stored), or
from a plain vector ``c``; received buffers become the agreed update as two bit masks (`masks`:
+1 and -1 coordinates; neither on a tie), which `pysparse_hpc.kernels.cpu.votes.apply_agreed`
reads or `directions` expands. One pass of a Numba kernel each
(`pysparse_hpc.kernels.cpu.votes`). The collectives themselves are `DistributedLion`'s; tests
compare these against plain loops.

Votes are bits: a coordinate votes +1 where ``c > 0`` and -1 where ``c < 0``. A bit cannot say
0, so where ``c`` is exactly 0 (a parameter with no gradient yet: an embedding row nobody
looked up, a dead unit) or NaN (Lion's ``sign(NaN)`` is 0 too) the ranks split their votes
(`zero_vote_parity`): half vote +1 and half -1, by the parity of coordinate, rank and step.
The majority of ``P`` ranks of which ``s`` vote +1 is ``sign(2 s - P)``: 0 on a tie, which only
an even ``P`` can have, so a tied coordinate does not move. A coordinate whose ``c`` is 0 on
every rank is such a tie on an even number of ranks and stays, as Lion's ``sign(0) = 0``
leaves it; on an odd number it moves up and down on alternate steps, never drifting one way
(where always voting -1 would move it down by ``lr`` at every step).
"""
import functools

import numpy as np

from ..kernels.cpu import votes as _kernels

__all__ = ["zero_vote_parity", "vote_base", "vote_digits", "sign_bytes", "digit_words", "masks",
           "directions", "plain_operands", "pack_signs", "add_sign_bits", "signs_majority",
           "signs_as_masks", "pack_vote_digits", "add_vote_digits", "vote_digits_majority",
           "int8_levels", "add_int8_levels", "quantize_int8", "levels_as_masks", "combine_one_bit",
           "tie_mask"]


def zero_vote_parity(rank, step):
    """The ``zero_parity`` with which rank ``rank`` packs its votes at step ``step``: where its
    ``c`` is exactly 0, coordinate ``i`` votes +1 if ``i + zero_parity`` is odd. The ranks of
    one step alternate, so on ``2 k`` ranks ``k`` vote +1; the step alternates it too, so on
    an odd number of ranks the coordinates that are 0 everywhere take turns."""
    return (int(rank) + int(step)) & 1


def tie_mask(step):
    """The bits of a packed byte where a 1-bit combine breaks a tie toward +1 at step ``step``
    (counted from 0): coordinates ``i`` with ``i + step`` odd. NumPy packs coordinate ``i``
    into bit ``7 - i % 8``, so that is 0x55 on even steps and 0xAA on odd ones. Ties push the
    parameters no way on average over the coordinates, and a coordinate tied step after step
    moves back and forth instead of drifting one way."""
    return np.uint8(0xAA if int(step) % 2 else 0x55)


#: The fewest words, as a share of bit fields', for which `vote_base` takes the base
#: ``P + 1``: reading its digits costs a division per chunk, up to 1 ms more per million
#: coordinates than shifting bit fields, about what 1/6 of the words saves on a 1 Gb/s link.
_MIN_DIGIT_GAIN = 1 / 6


def _digits_in_a_word(base):
    """The largest ``k`` with ``base ** k <= 2 ** 64``."""
    digits, capacity = 0, 1
    while capacity * base <= 1 << 64:
        capacity *= base
        digits += 1
    return digits


def vote_base(ranks):
    """The base of the packed vote sum's digits on ``ranks`` ranks: ``P + 1``, or the power of
    two ``2 ** bit_length(P)`` where that packs nearly as many votes into a word
    (`_MIN_DIGIT_GAIN`).

    A digit holds a count 0..P whenever the base exceeds ``P``, so the integer SUM of ``P``
    words never carries from one digit into the next. Base ``P + 1`` spends ``log2(P + 1)``
    bits on a vote, what ``P + 1`` possible counts need: 40 votes a word at P = 2 (1.6 bits)
    where Lion Cub's fields of ``bit_length(P)`` bits hold 32. A power of two is those bit
    fields, read by shifts. ValueError for ``ranks < 1`` (a base below 2 fills no word)."""
    ranks = int(ranks)
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    fields = 1 << ranks.bit_length()
    if _digits_in_a_word(ranks + 1) >= (1 + _MIN_DIGIT_GAIN) * _digits_in_a_word(fields):
        return ranks + 1
    return fields


def vote_digits(ranks):
    """Votes per uint64 word of the packed vote sum: the digits of base `vote_base` a word
    holds."""
    return _digits_in_a_word(vote_base(ranks))


def sign_bytes(size):
    """Bytes of ``size`` packed sign bits."""
    return -(-int(size) // 8)


def digit_words(size, ranks):
    """uint64 words of ``size`` packed vote digits on ``ranks`` ranks."""
    return -(-int(size) // vote_digits(ranks))


def masks(size):
    """Zeroed ``plus`` and ``minus`` masks of ``size`` coordinates (uint64 words; coordinate
    ``i`` is bit ``(i % 64) ^ 7`` of word ``i // 64``)."""
    words = -(-int(size) // 64)
    return np.zeros(words, dtype=np.uint64), np.zeros(words, dtype=np.uint64)


def directions(plus, minus, size, start=0):
    """Coordinates ``start:start + size`` of the agreed update as float32 in {-1, 0, 1}."""
    out = np.empty(size, dtype=np.float32)
    _kernels.mask_directions(plus, minus, int(start), out)
    return out


def plain_operands(direction):
    """A plain vector ``c`` as the operands ``(m, g, beta1, 1 - beta1)`` of `add_sign_bits`,
    `add_vote_digits` and `add_int8_levels`: ``(c, 0, 1, 0)``, whose interpolation is ``c``
    exactly."""
    one = direction.dtype.type(1)
    return direction, np.zeros_like(direction), one, one - one


def add_sign_bits(out, start, momentum, grad, beta1, rest1, zero_parity=0):
    """Add one tensor's votes on ``c = beta1 m + rest1 g`` (1 where ``c > 0``; where
    ``c == 0``, 1 at the coordinates ``i`` with ``i + zero_parity`` odd) to the packed sign
    bits ``out`` (uint8, zeroed, `sign_bytes` of the whole vote) from coordinate ``start``
    on. The four operands are flat arrays and scalars of one float dtype."""
    _kernels.pack_sign_bits(momentum, grad, beta1, rest1, out, int(start), int(zero_parity))


def pack_signs(direction, zero_parity=0):
    """One bit per coordinate, as `add_sign_bits` votes on ``c = direction``, eight to a
    byte (NumPy's bit order): `sign_bytes` uint8."""
    out = np.zeros(sign_bytes(direction.size), dtype=np.uint8)
    add_sign_bits(out, 0, *plain_operands(direction), zero_parity)
    return out


def signs_majority(gathered, size):
    """The `masks` of the majority of the ranks' packed sign bits, stacked as the rows of
    ``gathered`` (uint8, shape ``(P, sign_bytes(size))``)."""
    plus, minus = masks(size)
    _kernels.sign_majority_masks(gathered, plus, minus)
    return plus, minus


def signs_as_masks(packed, size):
    """The `masks` of packed sign bits taken as they are: +1 where a bit is set, else -1."""
    return signs_majority(packed[None, :], size)


#: Largest value of a chunk of digits that `vote_digits_majority` reads by one look-up
#: (a table of at most this many rows: larger tables read no faster).
_CHUNK_VALUES = 256


def _chunk_digits(base):
    """Digits of a look-up chunk: the most whose values stay within `_CHUNK_VALUES`."""
    digits = 1
    while base ** (digits + 1) <= _CHUNK_VALUES:
        digits += 1
    return digits


@functools.lru_cache(maxsize=None)
def _digit_powers(ranks):
    """``vote_base(ranks) ** j`` for every digit ``j`` of a word (uint64)."""
    base = vote_base(ranks)
    powers = np.array([base ** j for j in range(vote_digits(ranks))], dtype=np.uint64)
    powers.setflags(write=False)
    return powers


@functools.lru_cache(maxsize=None)
def _majority_patterns(ranks):
    """For every value ``r`` of a chunk of digits of base `vote_base`, the bits ``t`` of the
    chunk's digits whose majority ``sign(2 * digit_t(r) - ranks)`` is +1, and those where it
    is -1 (two uint64 arrays)."""
    base = vote_base(ranks)
    chunk = _chunk_digits(base)
    digit = np.arange(base ** chunk)[:, None] // base ** np.arange(chunk) % base
    majority = np.sign(2 * digit - int(ranks))
    weights = np.left_shift(1, np.arange(chunk)).astype(np.uint64)
    patterns = ((majority > 0) @ weights).astype(np.uint64), \
        ((majority < 0) @ weights).astype(np.uint64)
    for pattern in patterns:
        pattern.setflags(write=False)
    return patterns


def add_vote_digits(out, start, ranks, momentum, grad, beta1, rest1, zero_parity=0):
    """Add one tensor's votes (in {0, 1}, as `add_sign_bits` casts them) to the packed vote
    digits ``out`` (uint64, zeroed, `digit_words` of the whole vote) from coordinate
    ``start`` on: coordinate ``i`` is digit ``i % k`` of word ``i // k``
    (``k = vote_digits(ranks)``), so an integer SUM allreduce of the words counts the
    votes."""
    _kernels.pack_vote_digits(momentum, grad, beta1, rest1, _digit_powers(int(ranks)), out,
                              int(start), int(zero_parity))


def pack_vote_digits(direction, ranks, zero_parity=0):
    """Votes in {0, 1} on ``c = direction`` (as `add_sign_bits` casts them) as digits of
    base `vote_base`, `vote_digits` to a uint64 word: `digit_words` words, summed by an
    integer allreduce as they are."""
    out = np.zeros(digit_words(direction.size, ranks), dtype=np.uint64)
    add_vote_digits(out, 0, ranks, *plain_operands(direction), zero_parity)
    return out


def vote_digits_majority(words, ranks, size):
    """The `masks` of the majority of ``ranks`` votes from summed vote digit words, for the
    first ``size`` coordinates."""
    plus, minus = masks(size)
    base = vote_base(ranks)
    _kernels.digit_majority_masks(words, base, vote_digits(ranks), *_majority_patterns(int(ranks)),
                                  _chunk_digits(base), int(size), plus, minus)
    return plus, minus


def int8_levels(ranks):
    """The largest level of the int8 quantisation on ``ranks`` ranks, ``floor(127 / P)``, so
    that the SUM of every rank's levels fits in an int8."""
    return 127 // int(ranks)


def add_int8_levels(out, start, ranks, momentum, grad, beta1, rest1):
    """Write one tensor's Lion Cub levels of ``c = beta1 m + rest1 g`` into ``out`` (int8,
    the whole vote) from coordinate ``start`` on: ``clip(round(c / mean|c| * s / 2), -s, s)``
    with ``s = int8_levels(ranks)``, the mean of the finite ``|c|`` taken over the tensor's
    size, rounding half to even; a NaN ``c`` gets level 0 (Lion's ``sign(NaN)``), an infinite
    one the largest, and a tensor whose mean is 0 or overflows all 0 (no vote rather than
    garbage: the trainer's non-finite check skips such a step everywhere)."""
    _kernels.pack_int8_levels(momentum, grad, beta1, rest1, int8_levels(ranks), out, int(start))


def quantize_int8(direction, offsets, ranks):
    """`add_int8_levels` of a plain vector ``c``, each tensor ``offsets[k]:offsets[k + 1]``
    (``offsets`` ends with ``d``) scaled by its own mean: ``d`` int8 levels."""
    levels = np.empty(direction.size, dtype=np.int8)
    for start, stop in zip(offsets[:-1], offsets[1:]):
        add_int8_levels(levels, start, ranks, *plain_operands(direction[start:stop]))
    return levels


def levels_as_masks(levels):
    """The `masks` of the signs of summed int8 ``levels``."""
    plus, minus = masks(levels.size)
    _kernels.level_masks(levels, plus, minus)
    return plus, minus


def combine_one_bit(mine, theirs, step):
    """The majority of two packed sign buffers, re-signed: where they agree, their vote; where
    they disagree, +1 at the coordinates of `tie_mask` for ``step`` and -1 at the others.
    Symmetric, so both partners of an exchange get the same bytes."""
    return (mine & theirs) | ((mine ^ theirs) & tie_mask(step))
