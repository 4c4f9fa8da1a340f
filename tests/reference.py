"""Plain reference implementations the tests compare against (slow, obvious, independent).

The blocked layout is rebuilt here directly from its definition, with Python loops over a
dense matrix, sharing no code with the library.
"""
import numpy as np


def reference_blocked(dense, stored, window, block_width):
    """Blocked arrays of a dense matrix whose stored entries are ``stored`` (boolean, same shape).

    Returns ``(row_window_offset, col_idx, values, vector_mask)``, built from the definition:
    windows of ``window`` rows; a vector per column with a stored entry in the window, columns
    ascending; blocks of ``block_width`` vectors stored row-major, the last one compact; bit r of a
    vector's mask set when row r holds a stored entry.
    """
    n_rows, _ = dense.shape
    offsets, col_idx, values, masks = [0], [], [], []
    mask_bytes = (window + 7) // 8
    for row0 in range(0, n_rows, window):
        rows = range(row0, min(row0 + window, n_rows))
        columns = sorted({c for r in rows for c in np.flatnonzero(stored[r])})
        col_idx.extend(columns)
        offsets.append(offsets[-1] + len(columns))
        for start in range(0, len(columns), block_width):
            block_columns = columns[start:start + block_width]
            block = np.zeros((window, len(block_columns)), dtype=dense.dtype)
            for j, c in enumerate(block_columns):
                for r in rows:
                    block[r - row0, j] = dense[r, c]
            values.extend(block.ravel())  # row-major [window][width]
        for c in columns:
            mask = [0] * mask_bytes
            for r in rows:
                if stored[r, c]:
                    mask[(r - row0) // 8] |= 1 << ((r - row0) % 8)
            masks.extend(mask)
    return (np.array(offsets), np.array(col_idx, dtype=np.int64),
            np.array(values, dtype=dense.dtype), np.array(masks, dtype=np.uint8))


def assert_same_csr(ours, theirs, rtol=0.0):
    """Equality of a pysparse_hpc CSR and a canonical scipy CSR: same pattern, and values bit for
    bit unless ``rtol`` allows for duplicates summed in another order."""
    theirs = theirs.tocsr()
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_array_equal(ours.indptr, theirs.indptr)
    np.testing.assert_array_equal(ours.indices, theirs.indices)
    if rtol:
        np.testing.assert_allclose(ours.data, theirs.data, rtol=rtol, atol=0)
    else:
        np.testing.assert_array_equal(ours.data, theirs.data)
