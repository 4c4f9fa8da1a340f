"""The Matrix Market entries' scan (its automaton and its pieces) against a regular expression."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pysparse_hpc.kernels.cpu import mm_tokens

_WHITESPACE = b" \t\r\n"
_NUMBER_BYTES = {mm_tokens.INTEGER: b"0123456789+-",
                 mm_tokens.REAL: b"0123456789+-.eEnNaAiIfFtTyY"}
_NUMBER = {mm_tokens.INTEGER: re.compile(rb"[+-]?[0-9]+"),
           mm_tokens.REAL: re.compile(rb"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                                      rb"(?:[eE][+-]?[0-9]+)?|(?i:nan|inf|infinity))")}


def _expected(chunk, grammar):
    """`scan_entries`' answer, one token at a time with a regular expression."""
    tokens = 0
    for token in re.finditer(rb"[^ \t\r\n]+", chunk):
        outside = [k for k, byte in enumerate(token.group()) if byte not in
                   _NUMBER_BYTES[grammar]]
        if outside:
            return 0, (mm_tokens.BAD_BYTE, token.start() + outside[0], token.end())
        if not _NUMBER[grammar].fullmatch(token.group()):
            return 0, (mm_tokens.MALFORMED, token.start(), token.end())
        tokens += 1
    return tokens, None


def _scan(chunk, grammar, parts):
    classes = mm_tokens.byte_classes(_WHITESPACE, _NUMBER_BYTES[grammar])
    return mm_tokens.scan_entries(chunk, classes, grammar, parts)


_VALID = [b"0", b"-12", b"+7", b"1.", b".5", b"-1E-3", b"2e+01", b"1.e5", b"nan", b"-Infinity",
          b"+INF", b"NaN", b"007"]
_WRONG = [b"1-2", b"2.5.7", b"1e5e3", b"+", b".", b".e5", b"1e", b"1e+", b"nana", b"in",
          b"infinit", b"infinityy", b"--1", b"e5", b"1ee5", b"nan5", b"5nan"]


@pytest.mark.parametrize("token", _VALID + _WRONG)
@pytest.mark.parametrize("grammar", [mm_tokens.INTEGER, mm_tokens.REAL])
def test_a_token_is_judged_as_its_grammar_says(token, grammar):
    for chunk in (token, b"1 2 " + token + b"\n", b"1 2 3\n" * 5 + token + b" 4\n9\n"):
        for parts in (1, 2, 3):
            assert _scan(chunk, grammar, parts) == _expected(chunk, grammar)


def test_the_first_wrong_token_is_found_whichever_piece_holds_it():
    lines = [b"%d %d %.17g\n" % (k, k + 1, k / 7) for k in range(1, 4000)]
    for wrong_line in (0, 1500, 2999, 3998):
        for wrong in (b"1-2", b"1,5", b"2.5.7"):
            chunk = b"".join(lines[:wrong_line] + [b"3 4 " + wrong + b"\n"]
                             + lines[wrong_line:] + [b"5 x 1\n"])
            expected = _expected(chunk, mm_tokens.REAL)
            assert expected[1] is not None and expected[1][1] < len(chunk) - 6
            for parts in (1, 2, 4, 7):
                assert _scan(chunk, mm_tokens.REAL, parts) == expected


def test_many_pieces_of_few_lines_and_no_final_newline():
    chunk = b"1 2 3.5\n4 5 6"
    for parts in range(1, 12):
        assert _scan(chunk, mm_tokens.REAL, parts) == (6, None)
        assert _scan(chunk + b"\n\n\n", mm_tokens.INTEGER, parts) == (
            0, (mm_tokens.BAD_BYTE, 5, 7))
    assert _scan(b"", mm_tokens.REAL, 3) == (0, None)
    assert _scan(b"\n \n", mm_tokens.REAL, 2) == (0, None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"0", b"7", b"+", b"-", b".", b"e", b"E", b"n", b"a", b"N",
                                 b"i", b"f", b"t", b"y", b"I", b",", b"x", b" ", b"\t",
                                 b"\n", b"\r", b"1.5", b"nan", b"inf", b"infinity"]),
                max_size=60),
       st.sampled_from([mm_tokens.INTEGER, mm_tokens.REAL]), st.integers(1, 5))
def test_the_scan_equals_a_regular_expression(pieces, grammar, parts):
    chunk = b"".join(pieces)
    assert _scan(chunk, grammar, parts) == _expected(chunk, grammar)


def test_the_automaton_alone_counts_and_judges_as_the_reference():
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"0123456789+-.eEnaNIfty \n", np.uint8)
    for grammar in (mm_tokens.INTEGER, mm_tokens.REAL):
        moves, ends, accepts = mm_tokens._AUTOMATA[grammar]
        classes = mm_tokens.byte_classes(_WHITESPACE, _NUMBER_BYTES[grammar])
        for _ in range(300):
            data = rng.choice(alphabet, size=int(rng.integers(0, 40)))
            data[-1:] = ord("\n")
            tokens, valid = mm_tokens._count_tokens(data, 0, data.size,
                                                    mm_tokens._AUTOMATON_CLASSES, moves,
                                                    ends, accepts)
            reference = mm_tokens._scan(data, 0, data.size, classes, grammar,
                                        *mm_tokens._WORD_ARRAYS)
            assert valid == (reference[3] == 0)
            if valid:
                assert tokens == reference[0]
