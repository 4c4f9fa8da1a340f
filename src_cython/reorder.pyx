# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Typed graph orderings on the symmetrized pattern of a square sparse matrix.

``symmetric_pattern`` merges the canonical CSR patterns of A and A^T into the adjacency of the
undirected graph A + A^T without self loops (int64 row pointer, sorted neighbour lists). The orderings read that
graph and return ``order``, an int64 permutation with ``order[new] = old``:

- ``degree_order``: by degree (descending unless asked otherwise), ties by vertex id, with a
  stable counting sort;
- ``rcm_order``: reverse Cuthill-McKee, each connected component started from the best of a
  few lowest-degree and George-Liu pseudo-peripheral vertices (smallest bandwidth).

The Python layer validates and symmetrizes; the ``nogil`` bodies trust their input.
"""
import numpy as np

from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawMalloc
from cython.parallel cimport prange, threadid
from libc.stdint cimport INT64_MAX
from libc.string cimport memcpy
from libcpp.algorithm cimport sort as cpp_sort

include "_fused.pxi"

def symmetric_pattern(const index_t[::1] indptr, const index_t[::1] indices,
                      const index_t[::1] t_indptr, const index_t[::1] t_indices):
    """Adjacency of A + A^T without the diagonal, from the canonical rows of A and of A^T.

    Merges each row of A with the same row of A^T (both sorted, duplicate-free), dropping the
    diagonal and columns present in both: one linear pass, no sorting.

    Returns
    -------
    indptr : ndarray of int64
    indices : ndarray of A's index dtype
        Sorted, duplicate-free neighbour lists.
    """
    cdef Py_ssize_t n = indptr.shape[0] - 1
    index_dtype = np.int32 if index_t is int32_t else np.int64
    sym_indptr_np = np.empty(n + 1, dtype=np.int64)
    sym_indices_np = np.empty(indices.shape[0] + t_indices.shape[0], dtype=index_dtype)
    cdef int64_t[::1] sym_indptr = sym_indptr_np
    cdef index_t[::1] sym_indices = sym_indices_np
    cdef Py_ssize_t row
    cdef int64_t p, q, p_stop, q_stop, column, n_out = 0
    with nogil:
        sym_indptr[0] = 0
        for row in range(n):
            p, p_stop = indptr[row], indptr[row + 1]
            q, q_stop = t_indptr[row], t_indptr[row + 1]
            while p < p_stop or q < q_stop:
                if q == q_stop or (p < p_stop and indices[p] < t_indices[q]):
                    column = indices[p]
                    p += 1
                elif p == p_stop or t_indices[q] < indices[p]:
                    column = t_indices[q]
                    q += 1
                else:
                    column = indices[p]
                    p += 1
                    q += 1
                if column != row:
                    sym_indices[n_out] = <index_t>column
                    n_out += 1
            sym_indptr[row + 1] = n_out
    return sym_indptr_np, sym_indices_np[:n_out]


cdef int64_t _max_degree(const int64_t[::1] indptr) noexcept nogil:
    cdef Py_ssize_t vertex
    cdef int64_t max_degree = 0
    for vertex in range(indptr.shape[0] - 1):
        max_degree = max(max_degree, indptr[vertex + 1] - indptr[vertex])
    return max_degree


cdef void _counting_sort_by_degree(const int64_t[::1] indptr, bint descending,
                                   int64_t[::1] start, int64_t[::1] order) noexcept nogil:
    """Vertices by degree (ascending or descending), ties by ascending id: a stable counting sort.

    ``start`` is zeroed scratch of length max degree + 2.
    """
    cdef Py_ssize_t n = indptr.shape[0] - 1
    cdef Py_ssize_t vertex
    cdef int64_t max_degree = start.shape[0] - 2
    cdef int64_t degree, slot
    for vertex in range(n):
        degree = indptr[vertex + 1] - indptr[vertex]
        start[(max_degree - degree if descending else degree) + 1] += 1
    for degree in range(max_degree + 1):
        start[degree + 1] += start[degree]
    for vertex in range(n):
        degree = indptr[vertex + 1] - indptr[vertex]
        slot = max_degree - degree if descending else degree
        order[start[slot]] = vertex
        start[slot] += 1


def degree_order(const int64_t[::1] indptr, bint descending=True):
    """Vertices by degree, descending by default, ties by ascending id (``order[new] = old``)."""
    order_np = np.empty(indptr.shape[0] - 1, dtype=np.int64)
    cdef int64_t[::1] order = order_np
    cdef int64_t[::1] start = np.zeros(_max_degree(indptr) + 2, dtype=np.int64)
    with nogil:
        _counting_sort_by_degree(indptr, descending, start, order)
    return order_np


# Starts tried per connected component, in this order: the two ends of a George-Liu
# pseudo-diameter (N_FAR_STARTS lowest-degree vertices of the far end's level), then
# N_LOW_DEGREE_STARTS of the component's lowest-degree vertices.
cdef enum:
    N_FAR_STARTS = 1
    N_LOW_DEGREE_STARTS = 8
    MAX_STARTS = 1 + N_FAR_STARTS + N_LOW_DEGREE_STARTS
    # A try's rank is bandwidth * START_SLOTS + its index among the starts: one integer compare
    # orders tries by bandwidth, ties to the earlier start.
    START_SLOTS = 16
    # Smaller components try their starts on one thread: a parallel region would cost more.
    PARALLEL_MIN_COMPONENT = 1024

cdef extern from *:
    """
    /* The best rank found so far is shared by the threads trying starts: every running try
       reads it to know when it can no longer win, and a finished try lowers it. */
    #if defined(__GNUC__) || defined(__clang__)
    static inline int64_t rcm_load_rank(const int64_t *rank) {
        return __atomic_load_n(rank, __ATOMIC_RELAXED);
    }
    static inline int rcm_lower_rank(int64_t *rank, int64_t value) {
        int64_t seen = __atomic_load_n(rank, __ATOMIC_RELAXED);
        while (value < seen) {
            if (__atomic_compare_exchange_n(rank, &seen, value, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
                return 1;
        }
        return 0;
    }
    #else
    static inline int64_t rcm_load_rank(const int64_t *rank) {
        return *(volatile const int64_t *)rank;
    }
    static inline int rcm_lower_rank(int64_t *rank, int64_t value) {
        int lowered = 0;
        #pragma omp critical(pysparse_hpc_rcm_rank)
        {
            if (value < *rank) {
                *(volatile int64_t *)rank = value;
                lowered = 1;
            }
        }
        return lowered;
    }
    #endif
    /* A finished try whose rank is the best so far trades its buffer for the one holding the
       best order: no copy, and a try that ranked better meanwhile keeps its place. */
    static inline void rcm_keep_best(int64_t rank, int64_t *kept_rank, int *mine, int *best) {
        #pragma omp critical(pysparse_hpc_rcm_keep)
        {
            if (rank < *kept_rank) {
                int swapped = *mine;
                *mine = *best;
                *best = swapped;
                *kept_rank = rank;
            }
        }
    }
    """
    int64_t rcm_load_rank(const int64_t* rank) noexcept nogil
    bint rcm_lower_rank(int64_t* rank, int64_t value) noexcept nogil
    void rcm_keep_best(int64_t rank, int64_t* kept_rank, int* mine, int* best) noexcept nogil



cdef inline bint _lower_degree(const int64_t[::1] indptr, int64_t a, int64_t b) noexcept nogil:
    """``a`` before ``b`` in ascending (degree, id) order."""
    cdef int64_t degree_a = indptr[a + 1] - indptr[a], degree_b = indptr[b + 1] - indptr[b]
    return degree_a < degree_b or (degree_a == degree_b and a < b)


cdef int _keep_lowest(const int64_t[::1] indptr, int64_t vertex, int64_t* kept, int count,
                      int capacity) noexcept nogil:
    """Insert ``vertex`` into ``kept``, the ``capacity`` lowest (degree, id) so far; new count."""
    cdef int slot = count if count < capacity else capacity - 1
    if count == capacity and not _lower_degree(indptr, vertex, kept[slot]):
        return count
    while slot > 0 and _lower_degree(indptr, vertex, kept[slot - 1]):
        kept[slot] = kept[slot - 1]
        slot -= 1
    kept[slot] = vertex
    return count + 1 if count < capacity else count


cdef int64_t _level_structure(const int64_t[::1] indptr, const index_t[::1] indices,
                              int64_t root, int64_t stamp, int64_t[::1] seen,
                              int64_t* queue, int64_t* last_level_start,
                              int64_t* n_reached) noexcept nogil:
    """BFS from ``root`` marking ``seen[v] = stamp``; returns the number of levels.

    The reached vertices land in ``queue`` level by level; the last level starts at
    ``last_level_start[0]`` and ends at ``n_reached[0]``.
    """
    cdef int64_t head = 0, tail = 1, level_stop = 1, levels = 1, vertex, p, neighbour
    queue[0] = root
    seen[root] = stamp
    last_level_start[0] = 0
    while head < tail:
        if head == level_stop:
            levels += 1
            last_level_start[0] = head
            level_stop = tail
        vertex = queue[head]
        head += 1
        for p in range(indptr[vertex], indptr[vertex + 1]):
            neighbour = indices[p]
            if seen[neighbour] != stamp:
                seen[neighbour] = stamp
                queue[tail] = neighbour
                tail += 1
    n_reached[0] = tail
    return levels


cdef int _lowest_degree_starts(const int64_t[::1] indptr, const int64_t* component,
                               int64_t size, int64_t* scratch, int64_t* low) noexcept nogil:
    """The component's ``N_LOW_DEGREE_STARTS`` low-degree starts into ``low``; returns how many.

    When more vertices than that share the lowest degree, they are taken evenly spaced in id
    order: neighbouring ids are often neighbouring vertices (meshes come numbered by geometry)
    and start nearly the same order, while spread-out ones start from different parts of the
    graph. Otherwise the lowest (degree, id). ``scratch`` holds ``size`` words.
    """
    cdef int64_t i, min_degree = indptr[component[0] + 1] - indptr[component[0]]
    cdef int64_t n_min = 0
    cdef int n_low = 0
    for i in range(size):
        min_degree = min(min_degree, indptr[component[i] + 1] - indptr[component[i]])
    for i in range(size):
        if indptr[component[i] + 1] - indptr[component[i]] == min_degree:
            scratch[n_min] = component[i]
            n_min += 1
    if n_min > N_LOW_DEGREE_STARTS:
        cpp_sort(scratch, scratch + n_min)
        for i in range(N_LOW_DEGREE_STARTS):
            low[i] = scratch[(i * (n_min - 1)) // (N_LOW_DEGREE_STARTS - 1)]
        return N_LOW_DEGREE_STARTS
    for i in range(size):
        n_low = _keep_lowest(indptr, component[i], low, n_low, N_LOW_DEGREE_STARTS)
    return n_low


cdef inline int _append_new(int64_t* starts, int count, int64_t vertex) noexcept nogil:
    cdef int i
    for i in range(count):
        if starts[i] == vertex:
            return count
    starts[count] = vertex
    return count + 1


cdef int _collect_starts(const int64_t[::1] indptr, const index_t[::1] indices, int64_t seed,
                        int64_t* stamp, int64_t[::1] seen, int64_t* queue, int64_t* scratch,
                        int64_t* starts, int64_t* component_size) noexcept nogil:
    """Fill ``starts`` with the Cuthill-McKee starts tried for ``seed``'s component; returns how many.

    In the order tried: a George-Liu pseudo-peripheral vertex, up to ``N_FAR_STARTS``
    lowest-degree vertices of its farthest level (the far end of the pseudo-diameter), then
    the low-degree starts of `_lowest_degree_starts`; no vertex twice. George-Liu moves from
    ``seed`` to the lowest-degree vertex of the last BFS level while the depth grows; good
    starts first let the later tries give up early. ``queue`` and ``scratch`` are scratch for
    the searches; ``seen`` holds stamps of earlier searches only, so stale marks never match.
    """
    cdef int64_t levels, new_levels, last_start, n_reached, i, root = seed
    cdef int64_t low[N_LOW_DEGREE_STARTS]
    cdef int64_t far[N_FAR_STARTS]
    cdef int n_low, n_far, n_starts
    stamp[0] += 1
    levels = _level_structure(indptr, indices, root, stamp[0], seen, queue, &last_start,
                              &n_reached)
    component_size[0] = n_reached
    n_low = _lowest_degree_starts(indptr, queue, n_reached, scratch, low)
    while True:
        n_far = 0
        for i in range(last_start, n_reached):
            n_far = _keep_lowest(indptr, queue[i], far, n_far, N_FAR_STARTS)
        stamp[0] += 1
        new_levels = _level_structure(indptr, indices, far[0], stamp[0], seen, queue,
                                      &last_start, &n_reached)
        if new_levels <= levels:
            break
        root, levels = far[0], new_levels
    starts[0] = root
    n_starts = 1
    for i in range(n_far):
        n_starts = _append_new(starts, n_starts, far[i])
    for i in range(n_low):
        n_starts = _append_new(starts, n_starts, low[i])
    return n_starts


cdef bint _neighbours_by_degree(const int64_t[::1] indptr, const index_t[::1] indices,
                                const int64_t[::1] by_degree, int64_t[::1] cursor,
                                index_t[::1] ordered) noexcept nogil:
    """Every neighbour list in ascending (degree, id), the order Cuthill-McKee places them in.

    The pattern is symmetric, so the rows that list ``u`` are ``u``'s neighbours: visiting the
    vertices in ``by_degree`` order and appending each to its neighbours' lists sorts every
    list in one pass. ``cursor`` is scratch of n words. Returns False, having written nothing
    out of place, when the pattern is not symmetric: a vertex listed by more rows than its own
    list holds would be written past it, and the lists it leaves short would keep
    uninitialized words that the searches then take for vertex ids.
    """
    cdef Py_ssize_t n = indptr.shape[0] - 1
    cdef Py_ssize_t i
    cdef int64_t p, u, v
    for i in range(n):
        cursor[i] = indptr[i]
    for i in range(n):
        u = by_degree[i]
        for p in range(indptr[u], indptr[u + 1]):
            v = indices[p]
            # Every list has room for exactly the rows that list its vertex when the pattern
            # is symmetric; as many writes as entries, none past a list, fill every list.
            if cursor[v] == indptr[v + 1]:
                return False
            ordered[cursor[v]] = <index_t>u
            cursor[v] += 1
    return True


cdef int64_t _cuthill_mckee(const int64_t[::1] indptr, const index_t[::1] by_degree_indices,
                            int64_t start, int64_t start_index, const int64_t* best_rank,
                            int64_t* order, uint8_t* visited, int64_t* bandwidth) noexcept nogil:
    """Place ``start``'s component at ``order[0:]`` in Cuthill-McKee order; returns how many.

    Breadth first from ``start``; each vertex's unvisited neighbours join in ascending degree,
    ties by id, the order in which ``by_degree_indices`` lists them. A vertex's earliest
    neighbour in this order is the one that discovered it, so the bandwidth is the largest
    distance from a vertex to the last neighbour it places, known as the search goes. Once the
    try's rank (``bandwidth * START_SLOTS + start_index``) exceeds ``best_rank[0]``, which other
    threads may lower meanwhile, it cannot win: the search stops, ``bandwidth[0]`` is -1 and
    the count is what was placed (still marked visited).
    """
    cdef int64_t head = 0, tail = 1, first, vertex, neighbour, p
    order[0] = start
    visited[start] = 1
    bandwidth[0] = 0
    while head < tail:
        vertex = order[head]
        head += 1
        first = tail
        for p in range(indptr[vertex], indptr[vertex + 1]):
            neighbour = by_degree_indices[p]
            if not visited[neighbour]:
                visited[neighbour] = 1
                order[tail] = neighbour
                tail += 1
        if tail > first:
            bandwidth[0] = max(bandwidth[0], tail - head)
            if bandwidth[0] * START_SLOTS + start_index > rcm_load_rank(best_rank):
                bandwidth[0] = -1
                return tail
    return tail


cdef void _try_starts_serially(const int64_t[::1] indptr, const index_t[::1] by_degree_indices,
                               const int64_t* starts, int n_starts, int64_t size,
                               int64_t* order, uint8_t* visited, int64_t* kept) noexcept nogil:
    """The best Cuthill-McKee order among ``starts`` into ``order[:size]``, marked visited.

    ``kept`` (``size`` words) holds the best finished order while later starts are tried.
    """
    cdef int64_t best_rank = INT64_MAX, reached = 0, width, k
    cdef int s
    cdef bint last_run_kept = False
    for s in range(n_starts):
        for k in range(reached):
            visited[order[k]] = 0
        reached = _cuthill_mckee(indptr, by_degree_indices, starts[s], s, &best_rank, order,
                                 visited, &width)
        last_run_kept = width >= 0
        if last_run_kept:
            best_rank = width * START_SLOTS + s
            if s < n_starts - 1:
                memcpy(kept, order, reached * sizeof(int64_t))
    if not last_run_kept:
        for k in range(reached):
            visited[order[k]] = 0
        memcpy(order, kept, size * sizeof(int64_t))
        for k in range(size):
            visited[order[k]] = 1


cdef void _try_starts_in_parallel(const int64_t[::1] indptr, const index_t[::1] by_degree_indices,
                                  const int64_t* starts, int n_starts, int64_t size,
                                  int64_t* order, uint8_t* visited, int64_t* work,
                                  int64_t capacity, uint8_t* thread_visited, int* slot,
                                  int threads) noexcept nogil:
    """`_try_starts_serially` with the starts spread over threads.

    ``work`` holds ``threads + 1`` buffers of ``capacity >= size`` words: one per thread for
    its search and one for the best finished order, which a better finished try takes over by
    trading buffers (`rcm_keep_best`). ``thread_visited`` holds each thread's n visited
    flags, all clear; ``slot`` is scratch of ``threads`` ints. The result is the same:
    the winner has the smallest rank, and no try that could still beat it gives up, whichever
    thread finishes first.
    """
    cdef int64_t n = indptr.shape[0] - 1
    cdef int64_t best_rank = INT64_MAX, kept_rank = INT64_MAX, width, placed, rank, k
    cdef int64_t* mine
    cdef int best_slot = threads
    cdef int s, t
    for t in range(threads):
        slot[t] = t
    for s in prange(n_starts, schedule="dynamic", chunksize=1, num_threads=threads):
        t = threadid()
        width = 0  # assigned here so that each thread has its own
        mine = work + slot[t] * capacity
        placed = _cuthill_mckee(indptr, by_degree_indices, starts[s], s, &best_rank, mine,
                                thread_visited + t * n, &width)
        for k in range(placed):
            thread_visited[t * n + mine[k]] = 0
        if width >= 0:
            rank = width * START_SLOTS + s
            if rcm_lower_rank(&best_rank, rank):
                rcm_keep_best(rank, &kept_rank, &slot[t], &best_slot)
    memcpy(order, work + best_slot * capacity, size * sizeof(int64_t))
    for k in range(size):
        visited[order[k]] = 1


def rcm_order(const int64_t[::1] indptr, const index_t[::1] indices, int num_threads=1):
    """Reverse Cuthill-McKee order of a symmetric pattern (``order[new] = old``).

    No single start rule wins on every matrix: the bandwidth from equally plausible starts
    varies by 1.5x on meshes. Each connected component tries the starts of `_collect_starts`
    and keeps the smallest bandwidth (the earliest start on a tie). A try stops as soon as it
    can no longer win, so losing starts cost a fraction of a search; components of at least
    ``PARALLEL_MIN_COMPONENT`` vertices try their starts on ``num_threads`` threads. The result
    does not depend on the thread count.

    ``indptr`` and ``indices`` are trusted to be an adjacency with vertex ids in ``[0, n)``
    (as from `symmetric_pattern`); its symmetry is checked, as the neighbour sorting would
    otherwise write past the lists: ValueError when it does not hold.
    """
    cdef Py_ssize_t n = indptr.shape[0] - 1
    # No component has more than MAX_STARTS starts to share out: more threads would only cost
    # memory.
    cdef int threads = min(max(1, num_threads), MAX_STARTS) if n >= PARALLEL_MIN_COMPONENT else 1
    index_dtype = np.int32 if index_t is int32_t else np.int64
    order_np = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] order = order_np
    cdef int64_t[::1] by_degree = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] degree_start = np.zeros(_max_degree(indptr) + 2, dtype=np.int64)
    cdef index_t[::1] by_degree_indices = np.empty(indices.shape[0], dtype=index_dtype)
    cdef int64_t[::1] seen = np.zeros(n, dtype=np.int64)
    cdef uint8_t[::1] visited = np.zeros(n, dtype=np.uint8)
    cdef int64_t[::1] kept = np.empty(n, dtype=np.int64)
    # The threads' buffers are made when a component first takes the parallel path, the order
    # buffers sized by the largest such component: sized by the graph, with a kept copy each,
    # they cost threads x 17 bytes a vertex, when every large component may be small (a few
    # among many isolated vertices). The visited flags are indexed by vertex id, n each.
    cdef int64_t* work = NULL
    cdef int64_t capacity = 0
    cdef uint8_t* thread_visited = NULL
    cdef int slot[MAX_STARTS]
    cdef int64_t starts[MAX_STARTS]
    cdef int64_t tail = 0, size, i, seed, stamp = 0
    cdef int n_starts
    cdef bint symmetric, in_parallel
    with nogil:
        _counting_sort_by_degree(indptr, False, degree_start, by_degree)
        # Sorted once for all the tries; ``kept`` is not in use yet.
        symmetric = _neighbours_by_degree(indptr, indices, by_degree, kept, by_degree_indices)
    if not symmetric:
        raise ValueError("the pattern is not symmetric: some vertex is listed by more rows than "
                         "its own row lists (build it with symmetric_pattern)")
    try:
        with nogil:
            for i in range(n):
                seed = by_degree[i]
                if visited[seed]:
                    continue
                # The component's future slots of ``order`` and ``kept`` are scratch for the
                # start searches.
                n_starts = _collect_starts(indptr, indices, seed, &stamp, seen, &order[tail],
                                           &kept[tail], starts, &size)
                if size <= 2:
                    n_starts = 1
                in_parallel = threads > 1 and size >= PARALLEL_MIN_COMPONENT and n_starts > 1
                if in_parallel and thread_visited == NULL:
                    thread_visited = <uint8_t*>PyMem_RawCalloc(threads * n, sizeof(uint8_t))
                    in_parallel = thread_visited != NULL
                if in_parallel and size > capacity:
                    PyMem_RawFree(work)
                    work = <int64_t*>PyMem_RawMalloc((threads + 1) * size * sizeof(int64_t))
                    capacity = size if work != NULL else 0
                    in_parallel = work != NULL
                # Out of memory for the threads' buffers, the serial tries give the same order.
                if in_parallel:
                    _try_starts_in_parallel(indptr, by_degree_indices, starts, n_starts, size,
                                            &order[tail], &visited[0], work, capacity,
                                            thread_visited, slot, threads)
                else:
                    _try_starts_serially(indptr, by_degree_indices, starts, n_starts, size,
                                         &order[tail], &visited[0], &kept[tail])
                tail += size
            # Reverse Cuthill-McKee: the reversed order has the same bandwidth and less fill-in.
            for i in range(n // 2):
                order[i], order[n - 1 - i] = order[n - 1 - i], order[i]
    finally:
        PyMem_RawFree(work)
        PyMem_RawFree(thread_visited)
    return order_np
