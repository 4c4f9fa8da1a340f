"""The compressed Lion votes on the CPU: packing a rank's votes and turning the received
buffers into the agreed update, one pass over the coordinates each (`pysparse_hpc.optim`).

A rank votes on ``c = beta1 m + rest1 g`` (Lion's interpolation, torch's rounding): the packing
kernels (sign bits, vote digits, int8 levels) read the momentum and the gradient and compute
``c`` on the way, so the vector is never stored. They take one tensor at a time, at
coordinate ``start`` of the whole vote; a tensor that begins or ends inside a byte or a word
adds its bits to what its neighbour left there, so the bit and digit outputs start zeroed
(int8 levels are written, a byte each). A plain vector ``c`` packs as ``(c, zeros, 1, 0)``.
A bit cannot say 0: where ``c`` is exactly 0 the bit follows the parity of the coordinate
plus ``zero_parity`` (`pysparse_hpc.optim._votes.zero_vote_parity` splits the ranks' votes).

The agreed update is kept as two bit masks, ``plus`` and ``minus`` (uint64 words; coordinate
``i`` is bit ``(i % 64) ^ 7`` of word ``i // 64``, the little-endian words of NumPy's packed
bits), one bit where the majority says +1 or -1; neither on a tie. The majority of packed signs
is counted 64 coordinates at a time by bit-sliced adders, and the update reads its direction
from the masks: an eighth of a float32 vector's bytes, written and read once.

Serial kernels: a pass is a millisecond or less for a million coordinates, less than a parallel
region's start-up is worth at that size, and serial kernels compile in a fraction of the time.
Inputs are trusted (`pysparse_hpc.optim._votes` shapes them).
"""
import numpy as np
from numba import njit

from .lion import fused_multiply_add

_JIT = dict(cache=True, nogil=True)

_ONE = np.uint64(1)


@njit(inline="always", **_JIT)
def _interpolation(momentum, grad, i, beta1, rest1):
    """``c = beta1 m + rest1 g`` at coordinate ``i``, with torch's rounding."""
    return fused_multiply_add(grad[i], rest1, momentum[i] * beta1)


@njit(inline="always", **_JIT)
def _votes_plus(momentum, grad, i, beta1, rest1, zero_plus):
    """Rank's vote at coordinate ``i``: True where ``beta1 m + rest1 g > 0``, and where it
    is exactly 0 or NaN (Lion's ``sign`` is 0 for both) and ``zero_plus`` (the zero-vote
    parity of the coordinate)."""
    direction = _interpolation(momentum, grad, i, beta1, rest1)
    return direction > 0 or (not direction < 0 and zero_plus)


@njit(inline="always", **_JIT)
def _zero_plus(index, zero_parity):
    """Whether a zero ``c`` votes +1 at coordinate ``index`` of the whole vote: where
    ``index + zero_parity`` is odd."""
    return ((index + zero_parity) & 1) == 1


@njit(inline="always", **_JIT)
def _mask_bit(index):
    """The bit of coordinate ``index`` in its mask word."""
    return np.uint64((index & 63) ^ 7)


@njit(inline="always", **_JIT)
def _add_sign_bit(momentum, grad, i, beta1, rest1, out, index, zero_parity):
    if _votes_plus(momentum, grad, i, beta1, rest1, _zero_plus(index, zero_parity)):
        out[index >> 3] |= np.uint8(1 << (7 - (index & 7)))


@njit(**_JIT)
def pack_sign_bits(momentum, grad, beta1, rest1, out, start, zero_parity):
    """Votes of one tensor as bits of ``out`` (uint8) from coordinate ``start`` on, NumPy's
    order (coordinate ``k`` in bit ``7 - k % 8`` of byte ``k // 8``): 1 where ``c > 0``, and
    where ``c == 0`` and ``k + zero_parity`` is odd."""
    size = momentum.size
    i = 0
    while i < size and (start + i) & 63:  # bytes shared with the tensor before, or short
        _add_sign_bit(momentum, grad, i, beta1, rest1, out, start + i, zero_parity)
        i += 1
    # 64 coordinates to a register (an OR reduction, which vectorises), stored as 8 bytes.
    # A word starts at a multiple of 64, so coordinate first + j has the parity of j.
    whole = i + (size - i) // 64 * 64
    for first in range(i, whole, 64):
        word = np.uint64(0)
        for j in range(64):
            word |= np.uint64(_votes_plus(momentum, grad, first + j, beta1, rest1,
                                          _zero_plus(j, zero_parity))) << _mask_bit(j)
        byte = (start + first) >> 3
        for k in range(8):
            out[byte + k] = np.uint8((word >> np.uint64(8 * k)) & np.uint64(255))
    for i in range(whole, size):  # bytes shared with the tensor after
        _add_sign_bit(momentum, grad, i, beta1, rest1, out, start + i, zero_parity)


@njit(**_JIT)
def pack_vote_digits(momentum, grad, beta1, rest1, powers, out, start, zero_parity):
    """Votes of one tensor (as `pack_sign_bits` casts them) as digits of ``out`` (uint64)
    from coordinate ``start`` on: coordinate ``k`` adds ``powers[k % K]`` to word ``k // K``
    (``K = powers.size``) where it votes +1."""
    digits = powers.size
    size = momentum.size
    word = start // digits
    digit = start - word * digits
    i = 0
    while i < size and digit:  # a word shared with the tensor before
        if _votes_plus(momentum, grad, i, beta1, rest1, _zero_plus(start + i, zero_parity)):
            out[word] += powers[digit]
        i += 1
        digit += 1
        if digit == digits:
            digit, word = 0, word + 1
    # Whole words: a sum of independent terms, not Horner's chain, so it vectorises.
    while i + digits <= size:
        packed = np.uint64(0)
        for j in range(digits):
            plus = _votes_plus(momentum, grad, i + j, beta1, rest1,
                               _zero_plus(start + i + j, zero_parity))
            packed += powers[j] if plus else np.uint64(0)
        out[word] = packed
        i += digits
        word += 1
    for j in range(size - i):  # a word shared with the tensor after
        if _votes_plus(momentum, grad, i + j, beta1, rest1,
                       _zero_plus(start + i + j, zero_parity)):
            out[word] += powers[j]


@njit(inline="always", **_JIT)
def _word_of_bytes(row, first, stop):
    """Bytes ``row[first:min(first + 8, stop)]`` as a little-endian uint64 (zeros past
    ``stop``)."""
    value = np.uint64(0)
    if first + 8 <= stop:  # a fixed count, which the compiler turns into one load
        for k in range(8):
            value |= np.uint64(row[first + k]) << np.uint64(8 * k)
        return value
    for k in range(stop - first):
        value |= np.uint64(row[first + k]) << np.uint64(8 * k)
    return value


@njit(inline="always", **_JIT)
def _exceeds(planes, bits, threshold):
    """Lanes of the bit-sliced counts ``planes[:bits]`` (least significant plane first) whose
    count exceeds ``threshold``, as a uint64 mask."""
    greater = np.uint64(0)
    equal = ~np.uint64(0)
    for k in range(bits - 1, -1, -1):
        if (threshold >> k) & 1:
            equal &= planes[k]
        else:
            greater |= equal & planes[k]
            equal &= ~planes[k]
    return greater


@njit(**_JIT)
def sign_majority_masks(gathered, plus, minus):
    """The majority masks of the ranks' packed sign bits, one row of ``gathered`` (uint8) per
    rank: ``s`` of ``P`` votes +1 is +1 where ``s > P / 2``, -1 where ``s < P / 2``.

    Each word counts its 64 lanes at once: adding a rank's word to bit planes of the counts
    is a ripple of ANDs and XORs, and the comparisons with ``P / 2`` run on the planes too."""
    ranks, stop = gathered.shape
    bits = 1
    while (1 << bits) <= ranks:
        bits += 1
    planes = np.zeros(bits, dtype=np.uint64)
    above, below = ranks // 2, (ranks + 1) // 2 - 1  # s > above: +1; s > below fails: -1
    for word in range(plus.size):
        planes[:] = 0
        for rank in range(ranks):
            carry = _word_of_bytes(gathered[rank], 8 * word, stop)
            for k in range(bits):
                if carry == 0:
                    break
                overflow = planes[k] & carry
                planes[k] ^= carry
                carry = overflow
        plus[word] = _exceeds(planes, bits, above)
        minus[word] = ~_exceeds(planes, bits, below)


@njit(inline="always", **_JIT)
def _reverse_bits_of_bytes(word):
    """Bit ``b`` of every byte of ``word`` moved to bit ``7 - b``: a mask word filled in
    coordinate order (coordinate ``i`` at bit ``i % 64``) in the masks' order."""
    word = ((word >> np.uint64(1)) & np.uint64(0x5555555555555555)) \
        | ((word & np.uint64(0x5555555555555555)) << np.uint64(1))
    word = ((word >> np.uint64(2)) & np.uint64(0x3333333333333333)) \
        | ((word & np.uint64(0x3333333333333333)) << np.uint64(2))
    return ((word >> np.uint64(4)) & np.uint64(0x0F0F0F0F0F0F0F0F)) \
        | ((word & np.uint64(0x0F0F0F0F0F0F0F0F)) << np.uint64(4))


@njit(**_JIT)
def digit_majority_masks(words, base, digits, plus_patterns, minus_patterns, chunk, size,
                         plus, minus):
    """The majority masks of the first ``size`` coordinates from summed vote digits.

    A chunk of ``chunk`` digits worth ``r`` has the majorities ``plus_patterns[r]`` and
    ``minus_patterns[r]`` (bit ``t`` for digit ``t``): one division and two look-ups per
    chunk, the patterns appended to two 64-bit registers that are stored when full."""
    radix = np.uint64(base) ** np.uint64(chunk)
    shift = np.uint64(0)  # a power-of-two radix (bit fields) is read by shifts
    while (np.uint64(1) << shift) < radix:
        shift += np.uint64(1)
    by_shifts = (np.uint64(1) << shift) == radix
    up = np.uint64(0)
    down = np.uint64(0)
    filled, stored = np.uint64(0), 0
    for word in range(words.size):
        value = words[word]
        count = min(digits, size - word * digits)
        for low in range(0, count, chunk):
            quotient = value >> shift if by_shifts else value // radix
            row = value - quotient * radix
            value = quotient
            taken = np.uint64(min(chunk, count - low))
            keep = (_ONE << taken) - _ONE
            up_bits, down_bits = plus_patterns[row] & keep, minus_patterns[row] & keep
            up |= up_bits << filled
            down |= down_bits << filled
            filled += taken
            if filled >= np.uint64(64):
                plus[stored] = _reverse_bits_of_bytes(up)
                minus[stored] = _reverse_bits_of_bytes(down)
                stored += 1
                filled -= np.uint64(64)
                # The pattern's bits that did not fit (none when it filled the word exactly).
                up = up_bits >> (taken - filled) if filled else np.uint64(0)
                down = down_bits >> (taken - filled) if filled else np.uint64(0)
    if filled:
        plus[stored] = _reverse_bits_of_bytes(up)
        minus[stored] = _reverse_bits_of_bytes(down)


@njit(**_JIT)
def level_masks(levels, plus, minus):
    """The masks of the signs of summed int8 ``levels``, 64 coordinates to a register,
    without branches."""
    size = levels.size
    for word in range(plus.size):
        first = 64 * word
        up = np.uint64(0)
        down = np.uint64(0)
        for j in range(min(64, size - first)):
            up |= np.uint64(levels[first + j] > 0) << _mask_bit(j)
            down |= np.uint64(levels[first + j] < 0) << _mask_bit(j)
        plus[word] = up
        minus[word] = down


@njit(inline="always", **_JIT)
def mask_direction(plus, minus, index):
    """The agreed direction of coordinate ``index``: 1, -1 or 0 (float32)."""
    bit = _mask_bit(index)
    return np.float32(np.int64((plus[index >> 6] >> bit) & _ONE)
                      - np.int64((minus[index >> 6] >> bit) & _ONE))


@njit(**_JIT)
def mask_directions(plus, minus, start, out):
    """Coordinates ``start:start + out.size`` of the masks as a float32 vector."""
    for i in range(out.size):
        out[i] = mask_direction(plus, minus, start + i)


@njit(inline="always", **_JIT)
def _apply_one(param, momentum, grad, i, direction, decay, neg_lr, beta2, rest2):
    # -lr times a direction in {-1, 0, 1} is exact, so one rounding of the sum is torch's
    # fma(direction, -lr, p * decay).
    param[i] = param[i] * decay + neg_lr * direction
    momentum[i] = fused_multiply_add(grad[i], rest2, momentum[i] * beta2)


@njit(**_JIT)
def apply_agreed(param, momentum, grad, plus, minus, start, decay, neg_lr, beta2, rest2):
    """The rest of a Lion step once the ranks agreed, for one tensor at coordinate ``start``
    of the masks: ``p <- p * decay - lr * direction``, ``m <- beta2 m + rest2 g``."""
    size = param.size
    i = 0
    while i < size and (start + i) & 63:
        _apply_one(param, momentum, grad, i, mask_direction(plus, minus, start + i), decay,
                   neg_lr, beta2, rest2)
        i += 1
    # A whole mask word at a time, its two words read once: the loop vectorises.
    whole = i + (size - i) // 64 * 64
    for first in range(i, whole, 64):
        up, down = plus[(start + first) >> 6], minus[(start + first) >> 6]
        for j in range(64):
            bit = _mask_bit(j)
            direction = np.float32(np.int64((up >> bit) & _ONE) - np.int64((down >> bit) & _ONE))
            _apply_one(param, momentum, grad, first + j, direction, decay, neg_lr, beta2, rest2)
    for i in range(whole, size):
        _apply_one(param, momentum, grad, i, mask_direction(plus, minus, start + i), decay,
                   neg_lr, beta2, rest2)


@njit(inline="always", **_JIT)
def _magnitude(momentum, grad, i, beta1, rest1):
    """``|c|`` in float64, 0 where ``c`` is not finite (the int8 scale is the finite ones')."""
    magnitude = abs(np.float64(_interpolation(momentum, grad, i, beta1, rest1)))
    return magnitude if magnitude < np.inf else 0.0


@njit(**_JIT)
def _l1_norm_of_votes(momentum, grad, beta1, rest1):
    """``sum |c|`` in float64, over 32 running sums: one sum's chain of additions would cap
    the pass at an addition's latency per coordinate (the order is fixed, so the result is
    the same on every call)."""
    size = momentum.size
    lanes = np.zeros(32)
    whole = size // 32 * 32
    for first in range(0, whole, 32):
        for j in range(32):
            lanes[j] += _magnitude(momentum, grad, first + j, beta1, rest1)
    total = 0.0
    for i in range(whole, size):
        total += _magnitude(momentum, grad, i, beta1, rest1)
    for j in range(32):
        total += lanes[j]
    return total


@njit(**_JIT)
def pack_int8_levels(momentum, grad, beta1, rest1, levels, out, start):
    """Lion Cub's L1-scaled levels of one tensor's ``c = beta1 m + rest1 g`` into ``out``
    (int8) from coordinate ``start`` on: ``clip(round(c / mean|c| * levels / 2), -levels,
    levels)``, rounding half to even as NumPy does, the mean over the tensor's finite
    ``|c|``; a NaN ``c`` gets level 0 (Lion's ``sign(NaN)``), an infinite one the largest, and
    a tensor whose mean is 0 (or overflows) all 0. Two passes over the tensor (its mean, then
    its levels), ``c`` computed in each."""
    size = momentum.size
    scale = _l1_norm_of_votes(momentum, grad, beta1, rest1) / size if size else 0.0
    if scale == 0.0 or not np.isfinite(scale):
        for i in range(size):
            out[start + i] = 0
        return
    # c / mean first, in the formula's order: a factor levels / (2 mean) taken out of the
    # loop rounds twice, and missed the exact halves of round-half-to-even by rounding noise
    # either way (a one-element tensor's c / mean is +-1, its level s / 2 for an odd s), so
    # that the ranks' tied levels moved a coordinate the rule leaves. |c| / mean stays below
    # the tensor's size, so a subnormal mean cannot overflow it. The NaN test is a select,
    # not a branch, so the loop vectorises and the division costs a few percent of the pass.
    half = levels / 2.0
    for i in range(size):
        direction = _interpolation(momentum, grad, i, beta1, rest1)
        level = 0.0 if direction != direction else np.rint(direction / scale * half)
        out[start + i] = np.int8(max(-levels, min(levels, level)))
