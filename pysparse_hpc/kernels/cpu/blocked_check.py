"""The full check of a blocked array's vector mask against its values, and the mask read from
the values where none is given (FlashSparse's convention), each in one pass and without a
table: a table of every value's position (int64) and the values gathered by it took about
five times the arrays checked, at the load of a blocked array from raw arrays or a file.

`mask_problems` marks, per window, which of these its vectors show (bit flags, so that the
caller can name the problems in a fixed order whatever window holds them):
"""
from numba import njit, prange

_JIT = dict(cache=True, nogil=True)

#: A vector with no stored entry.
EMPTY_VECTOR = 1
#: A mask bit past the window's height.
BEYOND_WINDOW = 2
#: A mask bit in a row past the matrix (the last window's missing rows).
BEYOND_MATRIX = 4
#: A value other than +-0 where the mask marks no entry.
NONZERO_PADDING = 8


@njit(parallel=True, **_JIT)
def mask_problems(value_bits, magnitude, row_window_offset, vector_mask, window, block_width,
                  mask_bytes, last_rows, problems):
    """``problems[w]``: the flags of window ``w``'s vectors.

    ``value_bits`` are the values viewed as unsigned integers of their width; a value is zero
    where its bits outside the sign (``magnitude``) are all 0, so -0.0 passes as 0.0 does and
    NaN does not. Vector ``v`` of a window whose vectors are ``first..stop - 1`` lies in the
    block starting at ``b = first + (v - first) // block_width * block_width``, of width
    ``min(block_width, stop - b)``, row ``r`` at ``b * window + r * width + v - b``.
    """
    n_windows = row_window_offset.size - 1
    for w in prange(n_windows):
        first, stop = row_window_offset[w], row_window_offset[w + 1]
        rows = last_rows if w == n_windows - 1 else window
        found = 0
        for v in range(first, stop):
            block = first + (v - first) // block_width * block_width
            width = min(block_width, stop - block)
            held = 0
            for r in range(mask_bytes * 8):
                bit = (vector_mask[v * mask_bytes + (r >> 3)] >> (r & 7)) & 1
                if bit:
                    held = 1
                    if r >= window:
                        found |= BEYOND_WINDOW
                    elif r >= rows:
                        found |= BEYOND_MATRIX
                elif r < window:
                    if value_bits[block * window + r * width + v - block] & magnitude:
                        found |= NONZERO_PADDING
            if not held:
                found |= EMPTY_VECTOR
        problems[w] = found


@njit(parallel=True, **_JIT)
def mask_of_values(value_bits, magnitude, row_window_offset, window, block_width, mask_bytes,
                   vector_mask):
    """Write ``vector_mask`` (zeroed) with a bit for every value other than +-0 (NaN counts),
    in the layout `mask_problems` reads."""
    n_windows = row_window_offset.size - 1
    for w in prange(n_windows):
        first, stop = row_window_offset[w], row_window_offset[w + 1]
        for v in range(first, stop):
            block = first + (v - first) // block_width * block_width
            width = min(block_width, stop - block)
            for r in range(window):
                if value_bits[block * window + r * width + v - block] & magnitude:
                    vector_mask[v * mask_bytes + (r >> 3)] |= 1 << (r & 7)
