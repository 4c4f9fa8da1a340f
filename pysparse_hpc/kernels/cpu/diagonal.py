"""A stored diagonal added to a canonical CSR matrix: the self-loops of GCN's ``A + I`` and of
the attention layers.

Each missing ``(i, i)`` is inserted at its place in row ``i``, which is already sorted, in one
pass that copies the other entries around it. Appending the loops as coordinates and sorting
again needed every entry's row index, the coordinates twice and the sort's scratch: twice the
peak memory of PyG's ``gcn_norm`` on a graph without loops.
"""
from numba import njit, prange

_JIT = dict(cache=True, nogil=True)


@njit(inline="always", **_JIT)
def _lower_bound(indices, low, high, column):
    """The first position in ``indices[low:high]`` (sorted) holding ``column`` or more."""
    while low < high:
        middle = (low + high) >> 1
        if indices[middle] < column:
            low = middle + 1
        else:
            high = middle
    return low


@njit(parallel=True, **_JIT)
def missing_diagonal(indptr, indices, missing):
    """``missing[i] = 1`` where row ``i < missing.size`` of a canonical CSR matrix stores no
    ``(i, i)``, else 0."""
    for row in prange(missing.size):
        start, stop = indptr[row], indptr[row + 1]
        place = _lower_bound(indices, start, stop, row)
        missing[row] = place == stop or indices[place] != row


@njit(inline="always", **_JIT)
def _copy_entries(indices, data, start, stop, new_indices, new_data, out, total):
    """Copy entries ``start:stop`` to ``out`` on, adding their new values to ``total``; the
    next place and the sum."""
    for k in range(start, stop):
        new_indices[out] = indices[k]
        new_data[out] = data[k]
        total += new_data[out]
        out += 1
    return out, total


@njit(parallel=True, **_JIT)
def insert_diagonal(indptr, indices, data, new_indptr, new_indices, new_data, one, sums):
    """Copy a canonical CSR matrix into ``(new_indptr, new_indices, new_data)``, adding ``(i,
    i)`` with value ``one`` to every row that ``new_indptr`` gives one entry more (rows are
    sorted and stay so). ``new_data`` may be wider than ``data``. Where ``sums`` has a slot
    per row, each row's new values are summed into it in float64, in storage order (the
    degrees of GCN's normalization, in the same pass)."""
    keep_sums = sums.size > 0
    for row in prange(indptr.size - 1):
        start, stop, out = indptr[row], indptr[row + 1], new_indptr[row]
        adds = new_indptr[row + 1] - out > stop - start
        cut = _lower_bound(indices, start, stop, row) if adds else stop
        out, total = _copy_entries(indices, data, start, cut, new_indices, new_data, out, 0.0)
        if adds:
            new_indices[out] = row
            new_data[out] = one
            total += new_data[out]
            out += 1
        out, total = _copy_entries(indices, data, cut, stop, new_indices, new_data, out, total)
        if keep_sums:
            sums[row] = total


@njit(parallel=True, **_JIT)
def scale_symmetric(indptr, indices, data, scale):
    """``data[k] = data[k] * scale[i] * scale[j]`` for entry ``k`` at ``(i, j)``, in place: the
    row's factor first, in float64, rounded once to ``data``'s dtype."""
    for row in prange(indptr.size - 1):
        factor = scale[row]
        for k in range(indptr[row], indptr[row + 1]):
            data[k] = data[k] * factor * scale[indices[k]]
