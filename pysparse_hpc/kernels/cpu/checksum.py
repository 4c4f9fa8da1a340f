"""A checksum of an array's bytes, to notice arrays written in place (`pysparse_hpc.nn`'s
caches of what is built from a graph's values).

Each 64-bit word, offset by a multiple of its position, goes through the splitmix64 finaliser
(a bijection of 64-bit words: two rounds of xor-shift and multiply) and the results are summed
modulo 2**64. A change to any one word always changes the sum; a change to several leaves it
only by a coincidence of about 2**-64. A plain weighted sum of the words would not do: a sign
flip changes a word by exactly 2**63, which any odd weight keeps, so two flips (``A.data *=
-1`` on an even number of float64 entries) cancelled. One pass at about 0.7 ns per word; no
cryptographic strength is needed or claimed.
"""
import numpy as np
from numba import njit, uint64

_JIT = dict(cache=True, nogil=True)


@njit(**_JIT)
def _word_sum(words):
    total = uint64(0)
    for i in range(words.size):
        mixed = words[i] + uint64(i) * uint64(0x9E3779B97F4A7C15)
        mixed = (mixed ^ (mixed >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
        mixed = (mixed ^ (mixed >> uint64(27))) * uint64(0x94D049BB133111EB)
        total += mixed ^ (mixed >> uint64(31))
    return total


def checksum(array):
    """An int summarizing the bytes of ``array`` (any dtype; copied first if it is not
    C-contiguous)."""
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    whole = data.size // 8 * 8
    total = int(_word_sum(data[:whole].view(np.uint64))) if whole else 0
    # the tail's bytes (a float32 array of odd length has 4), with the length
    return hash((total, bytes(data[whole:]), data.size))
