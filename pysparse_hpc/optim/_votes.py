"""The wire formats of the compressed Lion modes, on flat NumPy arrays: no MPI, no torch.

Each function turns this rank's Lion direction ``c`` (the interpolated momentum, float) into
the buffer a collective moves, or a received buffer back into per-coordinate counts. The
collectives themselves are `DistributedLion`'s; tests compare these against plain loops.

Votes are bits: a coordinate votes +1 where ``c > 0`` and -1 elsewhere (a bit cannot say 0).
The majority of ``P`` ranks of which ``s`` vote +1 is ``sign(2 s - P)``: 0 on a tie, which only
an even ``P`` can have, so a tied coordinate does not move.
"""
import numpy as np

__all__ = ["field_bits", "pack_signs", "count_packed_signs", "pack_vote_fields",
           "count_vote_fields", "majority", "int8_levels", "quantize_int8",
           "combine_one_bit", "TIE_MASK"]

#: Bits of a packed byte where a 1-bit combine breaks a tie toward +1: NumPy packs coordinate
#: ``i`` into bit ``7 - i % 8``, so ties go to +1 at odd coordinates and to -1 at even ones,
#: and do not push the parameters one way on average.
TIE_MASK = np.uint8(0x55)


def field_bits(ranks):
    """Bits per field of the packed vote sum: the fewest that hold the count 0..ranks, so an
    integer SUM over ``ranks`` ranks never carries into the next field."""
    return int(ranks).bit_length()


def pack_signs(direction):
    """One bit per coordinate, 1 where ``direction > 0``, eight to a byte (NumPy's bit order):
    ``ceil(d / 8)`` uint8."""
    return np.packbits(direction > 0)


def count_packed_signs(gathered, size):
    """The number of +1 votes per coordinate in ``gathered``, the ranks' `pack_signs` buffers
    stacked as rows (uint8, shape ``(P, ceil(size / 8))``)."""
    return np.unpackbits(gathered, axis=1, count=size).sum(axis=0, dtype=np.int64)


def _field_shifts(bits):
    per_word = 64 // bits
    return per_word, (np.arange(per_word, dtype=np.uint64) * np.uint64(bits))


def pack_vote_fields(direction, bits):
    """Votes in {0, 1} (1 where ``direction > 0``) packed ``64 // bits`` to a uint64 word, each
    in a field of ``bits`` bits: ``ceil(d / (64 // bits))`` words, summed by an integer
    allreduce as they are."""
    per_word, shifts = _field_shifts(bits)
    words = -(-direction.size // per_word)
    votes = np.zeros(words * per_word, dtype=np.uint64)
    votes[:direction.size] = direction > 0
    return np.bitwise_or.reduce(votes.reshape(words, per_word) << shifts, axis=1)


def count_vote_fields(words, bits, size):
    """The field values of summed `pack_vote_fields` words: the number of +1 votes of each of
    the first ``size`` coordinates."""
    _, shifts = _field_shifts(bits)
    mask = np.uint64((1 << bits) - 1)
    return ((words[:, None] >> shifts) & mask).reshape(-1)[:size].astype(np.int64)


def majority(plus_votes, ranks):
    """``sign(2 s - P)`` per coordinate as float32 in {-1, 0, 1}: 0 where the vote is tied."""
    return np.sign(2 * plus_votes - ranks).astype(np.float32)


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
        taken over each tensor; 0 for a tensor that is all zeros.
    """
    levels = int8_levels(ranks)
    quantized = np.empty(direction.size, dtype=np.int8)
    for start, stop in zip(offsets[:-1], offsets[1:]):
        segment = direction[start:stop]
        scale = np.abs(segment).mean(dtype=np.float64) if stop > start else 0.0
        if scale == 0.0 or not np.isfinite(scale):
            # All zeros (no direction), or a non-finite value: send no vote rather than
            # garbage; the trainer's non-finite check skips such a step everywhere.
            quantized[start:stop] = 0
            continue
        scaled = np.rint(segment * (levels / (2.0 * scale)))
        quantized[start:stop] = np.clip(scaled, -levels, levels)
    return quantized


def combine_one_bit(mine, theirs):
    """The majority of two packed sign buffers, re-signed: where they agree, their vote; where
    they disagree, +1 at odd coordinates and -1 at even ones (`TIE_MASK`).
    Symmetric, so both partners of an exchange get the same bytes."""
    return (mine & theirs) | ((mine ^ theirs) & TIE_MASK)
