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
def pack_vote_digits(direction, powers, out):
    """Votes ``direction > 0`` as the digits of numbers in the base whose powers are
    ``powers`` (uint64, one per digit of a word of ``out``): coordinate ``start + j`` of a word
    is its digit ``j``. A sum of independent terms, not Horner's chain of multiplications,
    so the loop over a word's digits vectorises."""
    digits = powers.size
    size = direction.size
    for word in range(out.size):
        start = word * digits
        packed = np.uint64(0)
        for j in range(min(digits, size - start)):
            packed += powers[j] if direction[start + j] > 0 else np.uint64(0)
        out[word] = packed


@njit(inline="always", **_JIT)
def _sign(twice):
    return np.float32((twice > 0) - (twice < 0))


@njit(**_JIT)
def vote_digits_majority(words, base, digits, ranks, table, out):
    """``sign(2 s - ranks)`` into ``out`` (float32) from summed vote digits ``s``.

    ``table[r, t]`` is the majority of digit ``t`` of a chunk of digits worth ``r``
    (``table.shape[1]`` digits a chunk): one division per chunk instead of one per digit, for
    a division by a number known only at run time costs tens of cycles. Where ``base`` is a
    power of two the digits are bit fields, read by shifts."""
    size = out.size
    if base & (base - 1) == 0:
        shift = 0
        while (1 << shift) < base:
            shift += 1
        bits, mask = np.uint64(shift), np.uint64(base - 1)
        for word in range(words.size):
            fields = words[word]
            start = word * digits
            for j in range(min(digits, size - start)):
                out[start + j] = _sign(2 * np.int64(fields & mask) - ranks)
                fields >>= bits
        return
    chunk = table.shape[1]
    chunk_radix = np.uint64(base) ** np.uint64(chunk)
    for word in range(words.size):
        value = words[word]
        start = word * digits
        count = min(digits, size - start)
        for low in range(0, count, chunk):
            quotient = value // chunk_radix
            row = np.int64(value - quotient * chunk_radix)
            for t in range(min(chunk, count - low)):
                out[start + low + t] = table[row, t]
            value = quotient


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
