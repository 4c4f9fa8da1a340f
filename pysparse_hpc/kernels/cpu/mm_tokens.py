"""The numbers of a Matrix Market file's entries, checked whole (`pysparse_hpc.io`).

scipy's parser reads a number up to the first byte it cannot take and skips the rest of the
line: ``1-2`` is read as 1, ``2.5.7`` as 2.5, and a column index ``2-1`` puts the value -1 in
column 2. One pass over the bytes, split at line starts among the threads, counts the tokens
with a finite automaton of the field's grammar (two table lookups a byte: about a gigabyte a
second a thread, against the tens of a regular expression's). Where the automaton fails, the
plain reference (`_scan`, a token at a time) finds the first wrong token and says what is
wrong with it; it is the one that decides.
"""
import numpy as np
from numba import njit, prange

__all__ = ["scan_entries", "INTEGER", "REAL", "BAD_BYTE", "MALFORMED"]

#: The grammars: an integer ``[+-]?[0-9]+``, or a real ``[+-]?(digits[.digits]|.digits)``
#: with an optional exponent ``[eE][+-]?digits``, or ``nan``, ``inf``, ``infinity`` (any case,
#: with a sign).
INTEGER, REAL = 0, 1

#: What `scan_entries` found wrong: a byte that belongs to no number of the field, or a token
#: of such bytes that is not one of its numbers.
BAD_BYTE, MALFORMED = 1, 2

_WORDS = (b"nan", b"inf", b"infinity")


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
def _scan(data, start, stop, classes, grammar, nan, inf, infinity):
    """``(tokens, bad_start, bad_stop, kind)`` of ``data[start:stop]``, which starts at a line:
    the tokens before the first wrong one, and where that one is (``-1`` where none is)."""
    tokens = 0
    at = start
    while at < stop:
        while at < stop and classes[data[at]] == 0:
            at += 1
        if at == stop:
            break
        first, bad = at, -1
        while at < stop:
            kind = classes[data[at]]
            if kind == 0:
                break
            if kind == 2 and bad < 0:
                bad = at
            at += 1
        if bad >= 0:
            return tokens, bad, at, BAD_BYTE
        if not _valid(data, first, at, grammar, nan, inf, infinity):
            return tokens, first, at, MALFORMED
        tokens += 1
    return tokens, -1, -1, 0


# The automaton. Byte classes: whitespace, a digit, a sign, the point, an exponent's e, and the
# letters of nan, inf and infinity (any case); anything else.
(_SPACE_BYTE, _DIGIT, _SIGN, _POINT, _E, _N, _A, _I, _F, _T, _Y, _OTHER) = range(12)
_LETTERS = {_E: b"e", _N: b"n", _A: b"a", _I: b"i", _F: b"f", _T: b"t", _Y: b"y"}
# States: between tokens, failed (for good), then those inside a token; a "+" marks where a
# token may end.
_GRAMMARS = {
    INTEGER: {"space": {_DIGIT: "digits+", _SIGN: "sign"},
              "sign": {_DIGIT: "digits+"},
              "digits+": {_DIGIT: "digits+"}},
    REAL: {"space": {_DIGIT: "digits+", _SIGN: "sign", _POINT: "point", _N: "n", _I: "i"},
           "sign": {_DIGIT: "digits+", _POINT: "point", _N: "n", _I: "i"},
           "digits+": {_DIGIT: "digits+", _POINT: "digits.+", _E: "e"},
           "digits.+": {_DIGIT: "fraction+", _E: "e"},
           "point": {_DIGIT: "fraction+"},
           "fraction+": {_DIGIT: "fraction+", _E: "e"},
           "e": {_DIGIT: "exponent+", _SIGN: "e sign"},
           "e sign": {_DIGIT: "exponent+"},
           "exponent+": {_DIGIT: "exponent+"},
           "n": {_A: "na"}, "na": {_N: "nan+"}, "nan+": {},
           "i": {_N: "in"}, "in": {_F: "inf+"}, "inf+": {_I: "infi"}, "infi": {_N: "infin"},
           "infin": {_I: "infini"}, "infini": {_T: "infinit"}, "infinit": {_Y: "infinity+"},
           "infinity+": {}},
}
_AUTOMATON_SPACE, _AUTOMATON_FAILED = 0, 1


def _automaton(grammar):
    """``(moves, ends, accepts)``: the next state of ``state << 4 | byte class``, whether that
    step ends a token, and whether a state may end one (at the end of the bytes)."""
    names = ["space", "failed"] + [name for name in _GRAMMARS[grammar] if name != "space"]
    number = {name: k for k, name in enumerate(names)}
    moves = np.full(len(names) << 4, _AUTOMATON_FAILED, dtype=np.uint8)
    ends = np.zeros(len(names) << 4, dtype=np.uint8)
    accepts = np.array([name.endswith("+") for name in names], dtype=np.uint8)
    for name, steps in _GRAMMARS[grammar].items():
        for byte_class, following in steps.items():
            moves[number[name] << 4 | byte_class] = number[following]
        if name == "space" or accepts[number[name]]:
            moves[number[name] << 4 | _SPACE_BYTE] = _AUTOMATON_SPACE
            ends[number[name] << 4 | _SPACE_BYTE] = name != "space"
    return moves, ends, accepts


def _automaton_classes():
    classes = np.full(256, _OTHER, dtype=np.uint8)
    for byte in b" \t\r\n":
        classes[byte] = _SPACE_BYTE
    classes[np.frombuffer(b"0123456789", np.uint8)] = _DIGIT
    classes[np.frombuffer(b"+-", np.uint8)] = _SIGN
    classes[ord(".")] = _POINT
    for byte_class, letter in _LETTERS.items():
        classes[letter[0]] = classes[letter.upper()[0]] = byte_class
    return classes


_AUTOMATA = {grammar: _automaton(grammar) for grammar in _GRAMMARS}
_AUTOMATON_CLASSES = _automaton_classes()


@njit(cache=True, nogil=True)
def _line_start(data, at, stop):
    """The first line start at or after ``at`` (``stop`` where none is before it)."""
    while at < stop and data[at - 1] != 10:
        at += 1
    return min(at, stop)


@njit(cache=True, nogil=True)
def _count_tokens(data, start, stop, classes, moves, ends, accepts):
    """``(tokens, valid)`` of ``data[start:stop]`` (whole lines) by the automaton.

    Each step waits for the last one's table lookup; four pieces of the range, split at line
    starts, are stepped together so that the core has four lookups in flight, not one.
    """
    size = stop - start
    first = np.empty(5, dtype=np.intp)
    first[0], first[4] = start, stop
    for k in range(1, 4):
        first[k] = _line_start(data, max(start + k * size // 4, first[k - 1], start + 1), stop)
    lockstep = min(first[1] - first[0], first[2] - first[1], first[3] - first[2],
                   first[4] - first[3])
    s0 = s1 = s2 = s3 = _AUTOMATON_SPACE
    t0 = t1 = t2 = t3 = 0
    a0, a1, a2, a3 = first[0], first[1], first[2], first[3]
    for step in range(lockstep):
        k0 = (s0 << 4) | classes[data[a0 + step]]
        k1 = (s1 << 4) | classes[data[a1 + step]]
        k2 = (s2 << 4) | classes[data[a2 + step]]
        k3 = (s3 << 4) | classes[data[a3 + step]]
        t0 += ends[k0]
        t1 += ends[k1]
        t2 += ends[k2]
        t3 += ends[k3]
        s0 = np.intp(moves[k0])
        s1 = np.intp(moves[k1])
        s2 = np.intp(moves[k2])
        s3 = np.intp(moves[k3])
    states = (s0, s1, s2, s3)
    counts = (t0, t1, t2, t3)
    tokens = 0
    valid = True
    for k in range(4):
        state, count = states[k], counts[k]
        for at in range(first[k] + lockstep, first[k + 1]):
            step = (state << 4) | classes[data[at]]
            count += ends[step]
            state = np.intp(moves[step])
        if state != _AUTOMATON_SPACE:
            count += 1
            valid = valid and accepts[state] != 0
        tokens += count
    return tokens, valid


@njit(parallel=True, cache=True, nogil=True)
def _scan_parts(data, bounds, classes, grammar, automaton_classes, moves, ends, accepts,
                nan, inf, infinity, found):
    for part in prange(bounds.size - 1):
        tokens, valid = _count_tokens(data, bounds[part], bounds[part + 1],
                                      automaton_classes, moves, ends, accepts)
        bad_start, bad_stop, kind = -1, -1, 0
        if not valid:
            tokens, bad_start, bad_stop, kind = _scan(data, bounds[part], bounds[part + 1],
                                                      classes, grammar, nan, inf, infinity)
        found[part, 0] = tokens
        found[part, 1] = bad_start
        found[part, 2] = bad_stop
        found[part, 3] = kind


_WORD_ARRAYS = tuple(np.frombuffer(word, np.uint8) for word in _WORDS)


def byte_classes(whitespace, number_bytes):
    """The table `scan_entries` takes: 0 for a byte of ``whitespace``, 1 for one of
    ``number_bytes``, 2 for any other."""
    classes = np.full(256, 2, dtype=np.uint8)
    classes[np.frombuffer(whitespace, np.uint8)] = 0
    classes[np.frombuffer(number_bytes, np.uint8)] = 1
    return classes


def scan_entries(chunk, classes, grammar, parts=1):
    """Count the whitespace-separated tokens of ``chunk`` (bytes of whole lines) and find the
    first wrong one.

    Parameters
    ----------
    chunk : bytes
        Whole lines: a token is never cut at its end.
    classes : ndarray of uint8
        `byte_classes` of the field.
    grammar : int
        `INTEGER` or `REAL`.
    parts : int
        How many pieces, split at line starts, to scan at once (one a thread); the answer is
        the same for any.

    Returns
    -------
    tokens : int
        The tokens of ``chunk``, when none is wrong.
    wrong : tuple of int or None
        ``(kind, start, stop)`` of the first wrong token: `BAD_BYTE` with ``start`` at its
        first such byte, or `MALFORMED` with ``start`` at the token.
    """
    data = np.frombuffer(chunk, np.uint8)
    bounds = [0]
    for part in range(1, parts):
        # The next line start after an even split; a piece may be empty.
        line_end = chunk.find(b"\n", max(part * len(chunk) // parts, bounds[-1]))
        bounds.append(len(chunk) if line_end < 0 else line_end + 1)
    bounds.append(len(chunk))
    found = np.empty((len(bounds) - 1, 4), dtype=np.int64)
    _scan_parts(data, np.asarray(bounds, dtype=np.int64), classes, grammar,
                _AUTOMATON_CLASSES, *_AUTOMATA[grammar], *_WORD_ARRAYS, found)
    for tokens, bad_start, bad_stop, kind in found:
        if kind:
            return 0, (int(kind), int(bad_start), int(bad_stop))
    return int(found[:, 0].sum()), None
