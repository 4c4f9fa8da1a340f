"""A checksum of an array's bytes, to notice values written in place (`pysparse_hpc.nn`'s
caches of what is built from a graph's values).

Each 64-bit word is multiplied by an odd number that depends on its position and the products
are summed modulo 2**64: a change to any one word always changes the sum (an odd factor is
invertible), a change to several almost always does. One pass at about a third of a
nanosecond per word; no cryptographic strength is needed or claimed.
"""
import numpy as np
from numba import njit, uint64

_JIT = dict(cache=True, nogil=True)


@njit(**_JIT)
def _word_sum(words):
    total = uint64(0)
    for i in range(words.size):
        total += (words[i] ^ uint64(0x9E3779B97F4A7C15)) * (uint64(2) * uint64(i) + uint64(1))
    return total


def checksum(array):
    """An int summarizing the bytes of ``array`` (any dtype; copied first if it is not
    C-contiguous)."""
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    whole = data.size // 8 * 8
    total = int(_word_sum(data[:whole].view(np.uint64))) if whole else 0
    # the tail's bytes (a float32 array of odd length has 4), with the length
    return hash((total, bytes(data[whole:]), data.size))
