"""The compressed Lion votes on the CPU: packing a rank's votes and turning the received
buffers into the agreed update, one pass over the coordinates each (`pysparse_hpc.optim`).

Serial kernels: a pass is a few milliseconds for a million coordinates, less than a parallel
region's start-up is worth at that size, and serial kernels compile in a fraction of the
time. Inputs are trusted (`pysparse_hpc.optim._votes` shapes them).
"""
import numpy as np
from numba import njit

_JIT = dict(cache=True, nogil=True)


@njit(**_JIT)
def pack_vote_fields(direction, bits, out):
    """Votes ``direction > 0`` into fields of ``bits`` bits, ``64 // bits`` per word of
    ``out`` (uint64, zeroed here)."""
    per_word = 64 // bits
    size = direction.size
    for word in range(out.size):
        packed = np.uint64(0)
        start = word * per_word
        for j in range(min(per_word, size - start)):
            packed |= np.uint64(direction[start + j] > 0) << np.uint64(j * bits)
        out[word] = packed


@njit(inline="always", **_JIT)
def _sign(twice):
    return np.float32((twice > 0) - (twice < 0))


@njit(**_JIT)
def vote_fields_majority(words, bits, ranks, out):
    """``sign(2 s - ranks)`` into ``out`` (float32) from summed vote fields ``s``."""
    per_word = 64 // bits
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    shift = np.uint64(bits)
    size = out.size
    for word in range(words.size):
        fields = words[word]
        start = word * per_word
        for j in range(min(per_word, size - start)):
            out[start + j] = _sign(2 * np.int64(fields & mask) - ranks)
            fields >>= shift


@njit(**_JIT)
def packed_signs_majority(gathered, ranks, out):
    """``sign(2 s - ranks)`` into ``out`` (float32) from the ranks' packed sign bits, one row
    of ``gathered`` (uint8) each, NumPy's bit order (coordinate ``i`` in bit ``7 - i % 8``)."""
    size = out.size
    plus = np.zeros(8, dtype=np.int64)
    for byte in range(gathered.shape[1]):
        plus[:] = 0
        for rank in range(ranks):
            bits = gathered[rank, byte]
            for j in range(8):
                plus[j] += (bits >> (7 - j)) & 1
        start = byte * 8
        for j in range(min(8, size - start)):
            out[start + j] = _sign(2 * plus[j] - ranks)


@njit(**_JIT)
def packed_signs_direction(packed, out):
    """+1 where a bit of ``packed`` is set, -1 elsewhere, into ``out`` (float32)."""
    for i in range(out.size):
        out[i] = 1.0 if (packed[i >> 3] >> (7 - (i & 7))) & 1 else -1.0


@njit(**_JIT)
def quantize_int8(direction, offsets, levels, out):
    """Lion Cub's L1-scaled levels of each segment ``offsets[k]:offsets[k + 1]`` of
    ``direction`` into ``out`` (int8): ``clip(round(c / mean|c| * levels / 2), -levels,
    levels)``, rounding half to even as NumPy does; 0 for a segment whose mean is 0 or not
    finite."""
    for k in range(offsets.size - 1):
        start, stop = offsets[k], offsets[k + 1]
        total = 0.0
        for i in range(start, stop):
            total += abs(np.float64(direction[i]))
        scale = total / (stop - start) if stop > start else 0.0
        if scale == 0.0 or not np.isfinite(scale):
            for i in range(start, stop):
                out[i] = 0
            continue
        factor = levels / (2.0 * scale)
        for i in range(start, stop):
            level = np.rint(direction[i] * factor)
            out[i] = np.int8(max(-levels, min(levels, level)))
