"""The wire formats of the compressed Lion modes, on flat NumPy arrays: no MPI, no torch.

Each function turns this rank's Lion direction ``c`` (the interpolated momentum, float) into
the buffer a collective moves, or received buffers into the agreed update (float32 in
{-1, 0, 1}), in one pass of a Numba kernel (`pysparse_hpc.kernels.cpu.votes`). The
collectives themselves are `DistributedLion`'s; tests compare these against plain loops.

Votes are bits: a coordinate votes +1 where ``c > 0`` and -1 elsewhere (a bit cannot say 0).
The majority of ``P`` ranks of which ``s`` vote +1 is ``sign(2 s - P)``: 0 on a tie, which only
an even ``P`` can have, so a tied coordinate does not move.
"""
import numpy as np

from ..kernels.cpu import votes as _kernels

__all__ = ["field_bits", "pack_signs", "packed_signs_majority", "sign_bits_direction",
           "pack_vote_fields", "vote_fields_majority", "int8_levels", "quantize_int8",
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


def pack_vote_fields(direction, bits):
    """Votes in {0, 1} (1 where ``direction > 0``) packed ``64 // bits`` to a uint64 word, each
    in a field of ``bits`` bits: ``ceil(d / (64 // bits))`` words, summed by an integer
    allreduce as they are."""
    words = np.empty(-(-direction.size // (64 // bits)), dtype=np.uint64)
    _kernels.pack_vote_fields(direction, bits, words)
    return words


def vote_fields_majority(words, bits, ranks, size):
    """The majority of ``ranks`` votes from summed `pack_vote_fields` words: the first
    ``size`` coordinates, float32."""
    agreed = np.empty(size, dtype=np.float32)
    _kernels.vote_fields_majority(words, bits, ranks, agreed)
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
