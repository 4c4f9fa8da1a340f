"""The numbers of a Matrix Market file's entries, checked whole (`pysparse_hpc.io`).

scipy's parser reads a number up to the first byte it cannot take and skips the rest of the
line: ``1-2`` is read as 1, ``2.5.7`` as 2.5, and a column index ``2-1`` puts the value -1 in
column 2. One serial pass over the bytes finds the first token that is not a number of the
field: a few hundred megabytes a second, against the tens of a regular expression's.
"""
import numpy as np
from numba import njit

__all__ = ["first_malformed", "INTEGER", "REAL"]

#: The grammars: an integer ``[+-]?[0-9]+``, or a real ``[+-]?(digits[.digits]|.digits)``
#: with an optional exponent ``[eE][+-]?digits``, or ``nan``, ``inf``, ``infinity`` (any case,
#: with a sign).
INTEGER, REAL = 0, 1

_WORDS = (b"nan", b"inf", b"infinity")


@njit(cache=True, nogil=True)
def _is_space(byte):
    return byte == 32 or byte == 9 or byte == 13 or byte == 10


@njit(cache=True, nogil=True)
def _is_digit(byte):
    return 48 <= byte <= 57


@njit(cache=True, nogil=True)
def _word_is(data, start, stop, word):
    """Whether ``data[start:stop]`` spells ``word`` (lower case ASCII) in any case."""
    if stop - start != word.size:
        return False
    for k in range(word.size):
        if data[start + k] | 32 != word[k]:
            return False
    return True


@njit(cache=True, nogil=True)
def _valid(data, start, stop, grammar, nan, inf, infinity):
    at = start
    if data[at] == 43 or data[at] == 45:                       # a sign
        at += 1
    if at == stop:
        return False
    if grammar == INTEGER:
        for k in range(at, stop):
            if not _is_digit(data[k]):
                return False
        return True
    if not (_is_digit(data[at]) or data[at] == 46):           # a word: nan, inf, infinity
        return (_word_is(data, at, stop, nan) or _word_is(data, at, stop, inf)
                or _word_is(data, at, stop, infinity))
    digits = 0
    while at < stop and _is_digit(data[at]):
        at += 1
        digits += 1
    if at < stop and data[at] == 46:                            # the fraction
        at += 1
        while at < stop and _is_digit(data[at]):
            at += 1
            digits += 1
    if digits == 0:
        return False
    if at < stop and (data[at] == 101 or data[at] == 69):     # the exponent
        at += 1
        if at < stop and (data[at] == 43 or data[at] == 45):
            at += 1
        exponent_digits = 0
        while at < stop and _is_digit(data[at]):
            at += 1
            exponent_digits += 1
        if exponent_digits == 0:
            return False
    return at == stop


@njit(cache=True, nogil=True)
def _first_malformed(data, grammar, nan, inf, infinity):
    n = data.size
    at = 0
    while at < n:
        while at < n and _is_space(data[at]):
            at += 1
        if at == n:
            break
        start = at
        while at < n and not _is_space(data[at]):
            at += 1
        if not _valid(data, start, at, grammar, nan, inf, infinity):
            return start, at
    return -1, -1


_WORD_ARRAYS = tuple(np.frombuffer(word, np.uint8) for word in _WORDS)


def first_malformed(chunk, grammar):
    """``(start, stop)`` of the first whitespace-separated token of ``chunk`` (bytes of whole
    lines) that is not a number of ``grammar`` (`INTEGER` or `REAL`), or ``(-1, -1)``."""
    data = np.frombuffer(chunk, np.uint8)
    return _first_malformed(data, grammar, *_WORD_ARRAYS)
