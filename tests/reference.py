"""Plain reference implementations the tests compare against (slow, obvious, independent).

The blocked layout is rebuilt here directly from its definition, with Python loops over a
dense matrix, and the graph orderings with sets, dicts and lists, sharing no code with the
library.
"""
import numpy as np
import scipy.sparse


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


# -- graph orderings: plain-Python versions of the Cython ones, written for clarity ------------

def symmetric_neighbours(A):
    """Sorted neighbour lists of the pattern of A + A^T without the diagonal (any sparse input)."""
    coo = scipy.sparse.coo_array(A)
    n = coo.shape[0]
    neighbours = [set() for _ in range(n)]
    for i, j in zip(coo.row.tolist(), coo.col.tolist()):
        if i != j:
            neighbours[i].add(j)
            neighbours[j].add(i)
    return [sorted(s) for s in neighbours]


def _by_degree(neighbours):
    return lambda v: (len(neighbours[v]), v)


def _bfs_levels(neighbours, root):
    levels, seen = [[root]], {root}
    while True:
        level = [u for v in levels[-1] for u in neighbours[v] if u not in seen and not seen.add(u)]
        if not level:
            return levels
        levels.append(level)


def _cuthill_mckee(neighbours, start):
    key = _by_degree(neighbours)
    order, seen = [start], {start}
    for vertex in order:   # the list grows while it is walked: a BFS
        fresh = sorted((u for u in neighbours[vertex] if u not in seen), key=key)
        seen.update(fresh)
        order.extend(fresh)
    return order


def _order_bandwidth(neighbours, order):
    position = {v: k for k, v in enumerate(order)}
    return max((abs(position[v] - position[u]) for v in order for u in neighbours[v]), default=0)


def reference_rcm(neighbours, n_low=8, n_far=1):
    """RCM with the start rule of pysparse_hpc: best of the far and lowest-degree starts."""
    key = _by_degree(neighbours)
    placed, order = set(), []
    for seed in sorted(range(len(neighbours)), key=key):
        if seed in placed:
            continue
        levels = _bfs_levels(neighbours, seed)
        component = [v for level in levels for v in level]
        lowest = min(len(neighbours[v]) for v in component)
        tied = sorted(v for v in component if len(neighbours[v]) == lowest)
        if len(tied) > n_low:     # spread over the ids of the lowest degree
            low = [tied[i * (len(tied) - 1) // (n_low - 1)] for i in range(n_low)]
        else:
            low = sorted(component, key=key)[:n_low]
        root = seed
        while True:   # George-Liu pseudo-peripheral search
            far = sorted(levels[-1], key=key)[:n_far]
            deeper = _bfs_levels(neighbours, far[0])
            if len(deeper) <= len(levels):
                break
            root, levels = far[0], deeper
        starts = list(dict.fromkeys([root] + far + low))
        if len(component) <= 2:
            starts = starts[:1]
        candidates = [_cuthill_mckee(neighbours, s) for s in starts]
        widths = [_order_bandwidth(neighbours, c) for c in candidates]
        order += candidates[widths.index(min(widths))]
        placed.update(component)
    return np.array(order[::-1], dtype=np.int64)


def reference_rabbit(neighbours):
    """Rabbit-Order-style ordering, dict-based: the paper's steps one by one."""
    n = len(neighbours)
    total = sum(len(x) for x in neighbours)
    community = list(range(n))

    def root(v):
        while community[v] != v:
            v = community[v]
        return v

    strength = [float(len(x)) for x in neighbours]
    children = [[] for _ in range(n)]
    left_behind = {}
    top_level = []
    for u in sorted(range(n), key=_by_degree(neighbours)):
        edges = [(v, 1.0) for v in neighbours[u]]
        for child in children[u]:
            edges += left_behind[child]
        weight = {}
        for v, w in edges:
            r = root(v)
            if r != u:
                weight[r] = weight.get(r, 0.0) + w
        gains = {r: w - strength[u] * strength[r] / total for r, w in weight.items()}
        best = min((r for r in gains if gains[r] > 0), key=lambda r: (-gains[r], r), default=None)
        if best is None:
            top_level.append(u)
            continue
        community[u] = best
        strength[best] += strength[u]
        children[best].append(u)
        left_behind[u] = list(weight.items())

    order = []
    for r in top_level:   # depth first, children in merge order
        stack = [r]
        while stack:
            v = stack.pop()
            order.append(v)
            stack.extend(reversed(children[v]))
    return np.array(order, dtype=np.int64)


def reference_lion_step_direction(directions, sizes, compression, step=0):
    """The direction `DistributedLion` steps by: on one rank, where nothing is compressed,
    Lion's own ``sign(c)`` in every mode; on more, `reference_lion_agreement`."""
    if len(directions) == 1:
        return np.sign(np.asarray(directions[0], dtype=float))
    return reference_lion_agreement(directions, sizes, compression, step)


def reference_lion_agreement(directions, sizes, compression, step=0):
    """The update direction every rank of a compressed Lion step takes, from every rank's
    ``c = beta1 m + (1 - beta1) g`` (``directions``: one flat float array per rank, the
    rank its index), with per-coordinate Python loops: the majority of bit votes (ties give
    0), the sign of summed L1-scaled int8 levels (scaled per tensor of ``sizes``), or the
    1-bit pairwise combine (ties: +1 at coordinates i with i + step odd, -1 at the others)
    folded and doubled as the library's 1-bit allreduce does. A bit vote is +1 where c > 0,
    and where c == 0 on rank r at the coordinates i with i + r + step odd."""
    ranks, size = len(directions), len(directions[0])

    def bit(c, i, r):
        return 1 if c[i] > 0 or (c[i] == 0 and (i + r + step) % 2 == 1) else 0

    bits = [[bit(c, i, r) for i in range(size)] for r, c in enumerate(directions)]
    agreed = np.zeros(size)
    if compression in ("signs", "votes"):
        for i in range(size):
            plus = sum(votes[i] for votes in bits)
            agreed[i] = np.sign(2 * plus - ranks)
        return agreed
    if compression == "int8":
        levels, start = 127 // ranks, 0
        totals = [0] * size
        for n in sizes:
            for c in directions if n else ():   # an empty tensor has no scale and no vote
                scale = sum(abs(v) for v in c[start:start + n]) / n
                for i in range(start, start + n):
                    q = 0 if scale == 0 else round(c[i] / scale * levels / 2)
                    totals[i] += max(-levels, min(levels, q))
            start += n
        return np.sign(np.array(totals, dtype=float))

    def combine(a, b):  # a tie gives +1 where i + step is odd, -1 elsewhere
        return [x if x == y else (i + step) % 2 for i, (x, y) in enumerate(zip(a, b))]

    paired = 1
    while paired * 2 <= ranks:
        paired *= 2
    partial = [bits[r] if r + paired >= ranks else combine(bits[r], bits[r + paired])
               for r in range(paired)]
    distance = 1
    while distance < paired:
        partial = [combine(partial[r], partial[r ^ distance]) for r in range(paired)]
        distance *= 2
    return np.array([1.0 if b else -1.0 for b in partial[0]])
