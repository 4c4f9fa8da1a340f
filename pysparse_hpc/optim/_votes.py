"""The wire formats of the compressed Lion modes, on flat NumPy arrays: no MPI, no torch.

Each function turns this rank's Lion direction ``c`` (the interpolated momentum, float) into
the buffer a collective moves, or received buffers into the agreed update (float32 in
{-1, 0, 1}), in one pass of a Numba kernel (`pysparse_hpc.kernels.cpu.votes`). The
collectives themselves are `DistributedLion`'s; tests compare these against plain loops.

Votes are bits: a coordinate votes +1 where ``c > 0`` and -1 elsewhere (a bit cannot say 0).
The majority of ``P`` ranks of which ``s`` vote +1 is ``sign(2 s - P)``: 0 on a tie, which only
an even ``P`` can have, so a tied coordinate does not move.
"""
import functools

import numpy as np

from ..kernels.cpu import votes as _kernels

__all__ = ["vote_base", "vote_digits", "pack_signs", "packed_signs_majority", "sign_bits_direction",
           "pack_vote_digits", "vote_digits_majority", "int8_levels", "quantize_int8",
           "combine_one_bit", "TIE_MASK"]

#: Bits of a packed byte where a 1-bit combine breaks a tie toward +1: NumPy packs coordinate
#: ``i`` into bit ``7 - i % 8``, so ties go to +1 at odd coordinates and to -1 at even ones,
#: and do not push the parameters one way on average.
TIE_MASK = np.uint8(0x55)


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
    fields, read by shifts."""
    ranks = int(ranks)
    fields = 1 << ranks.bit_length()
    if _digits_in_a_word(ranks + 1) >= (1 + _MIN_DIGIT_GAIN) * _digits_in_a_word(fields):
        return ranks + 1
    return fields


def vote_digits(ranks):
    """Votes per uint64 word of the packed vote sum: the digits of base `vote_base` a word
    holds."""
    return _digits_in_a_word(vote_base(ranks))


def pack_signs(direction):
    """One bit per coordinate, 1 where ``direction > 0``, eight to a byte (NumPy's bit order):
    ``ceil(d / 8)`` uint8."""
    return np.packbits(direction > 0)


def packed_signs_majority(gathered, size):
    """The majority of the ranks' `pack_signs` buffers, stacked as the rows of ``gathered``
    (uint8, shape ``(P, ceil(size / 8))``), for the first ``size`` coordinates."""
    agreed = np.empty(size, dtype=np.float32)
    _kernels.packed_signs_majority(gathered, gathered.shape[0], agreed)
    return agreed


def sign_bits_direction(packed, size):
    """+1 where a bit of ``packed`` (a `pack_signs` buffer) is set, -1 elsewhere: the first
    ``size`` coordinates, float32."""
    direction = np.empty(size, dtype=np.float32)
    _kernels.packed_signs_direction(packed, direction)
    return direction


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
def _majority_table(ranks):
    """``table[r, t] = sign(2 * digit_t(r) - ranks)`` for every value ``r`` of a chunk of
    digits of base `vote_base`."""
    base = vote_base(ranks)
    chunk = _chunk_digits(base)
    digit = np.arange(base ** chunk)[:, None] // base ** np.arange(chunk) % base
    table = np.sign(2 * digit - int(ranks)).astype(np.float32)
    table.setflags(write=False)
    return table


def pack_vote_digits(direction, ranks):
    """Votes in {0, 1} (1 where ``direction > 0``) as digits of base `vote_base`,
    `vote_digits` to a uint64 word (coordinate ``i`` is digit ``i % k`` of word ``i // k``):
    ``ceil(d / k)`` words, summed by an integer allreduce as they are."""
    words = np.empty(-(-direction.size // vote_digits(ranks)), dtype=np.uint64)
    _kernels.pack_vote_digits(direction, _digit_powers(int(ranks)), words)
    return words


def vote_digits_majority(words, ranks, size):
    """The majority of ``ranks`` votes from summed `pack_vote_digits` words: the first
    ``size`` coordinates, float32."""
    agreed = np.empty(size, dtype=np.float32)
    _kernels.vote_digits_majority(words, vote_base(ranks), vote_digits(ranks), int(ranks),
                                  _majority_table(int(ranks)), agreed)
    return agreed


def int8_levels(ranks):
    """The largest level of the int8 quantisation on ``ranks`` ranks, ``floor(127 / P)``, so
    that the SUM of every rank's levels fits in an int8."""
    return 127 // int(ranks)


def quantize_int8(direction, offsets, ranks):
    """Lion Cub's L1-scaled int8 levels of ``direction``, scaled per tensor.

    Parameters
    ----------
    direction : ndarray of float, shape (d,)
    offsets : sequence of int
        Where each tensor starts in ``direction``, and ``d`` last.
    ranks : int

    Returns
    -------
    ndarray of int8
        ``clip(round(c / mean|c| * s / 2), -s, s)`` with ``s = int8_levels(ranks)``, the mean
        taken over each tensor, rounding half to even; 0 for a tensor that is all zeros or
        holds a non-finite value (no vote rather than garbage: the trainer's non-finite
        check skips such a step everywhere).
    """
    levels = np.empty(direction.size, dtype=np.int8)
    _kernels.quantize_int8(direction, np.asarray(offsets, dtype=np.int64), int8_levels(ranks),
                           levels)
    return levels


def combine_one_bit(mine, theirs):
    """The majority of two packed sign buffers, re-signed: where they agree, their vote; where
    they disagree, +1 at odd coordinates and -1 at even ones (`TIE_MASK`).
    Symmetric, so both partners of an exchange get the same bytes."""
    return (mine & theirs) | ((mine ^ theirs) & TIE_MASK)
