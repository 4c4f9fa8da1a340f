"""METIS calls: one vertex weight per node through pymetis, several through METIS's C API.

pymetis's ``part_graph`` always hands METIS one balance constraint (``ncon = 1``). Balancing
two things at once, node counts and stored entries, needs METIS's multi-constraint
partitioning (Karypis and Kumar, "Multilevel algorithms for multi-constraint graph
partitioning", SC 1998), which METIS's own C functions offer: `part_graph` calls
``METIS_PartGraphRecursive``/``METIS_PartGraphKway`` with ``ncon > 1`` through ctypes, in the
METIS library that pymetis's extension module carries (and exports), so no other dependency
is needed.
"""
import ctypes

import numpy as np

__all__ = ["import_pymetis", "multi_constraint_available", "part_graph"]

#: METIS's return codes (metis.h).
_METIS_OK = 1
_METIS_ERRORS = {-2: "METIS_ERROR_INPUT (invalid input)", -3: "METIS_ERROR_MEMORY (out of "
                 "memory)", -4: "METIS_ERROR (an error in METIS)"}
#: Entries of METIS's options array (``METIS_NOPTIONS`` is 40 in every METIS 5 release).
_METIS_NOPTIONS = 40
#: pymetis uses recursive bisection up to this many parts and k-way beyond; so do we, except
#: on graphs of few nodes per part (`_KWAY_MIN_NODES_PER_PART`).
_MAX_RECURSIVE_PARTS = 8
#: METIS's k-way partitioning needs more than about 2 nodes per part. With fewer, the initial
#: partitioning of its coarsened graph bisects empty graphs ("Cannot bisect a graph with 0
#: vertices!", printed, not returned as an error) and the result can put every node in one
#: part: seen up to 2.06 nodes per part on random, clustered and complete graphs, never from
#: 2.1 on. Recursive bisection has no such limit but balances worse than k-way where both
#: work, so it takes over only below this many nodes per part.
_KWAY_MIN_NODES_PER_PART = 3


def _recursive(n, nparts):
    """Whether METIS partitions ``n`` nodes into ``nparts`` parts by recursive bisection
    (rather than k-way)."""
    return nparts <= _MAX_RECURSIVE_PARTS or n < _KWAY_MIN_NODES_PER_PART * nparts


def import_pymetis():
    """The ``pymetis`` module, or a ModuleNotFoundError that says how to get it (an
    ImportError that says why it failed, where pymetis is installed but does not load)."""
    try:
        import pymetis
    except ImportError as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "pymetis"):
            # Installed but broken (its METIS library missing, an ABI mismatch): "pip
            # install pymetis" would not help, the original error does.
            raise ImportError(f"partition(method='metis') needs pymetis, which is installed "
                              f"but failed to import: {exc}") from exc
        raise ModuleNotFoundError(
            "partition(method='metis') needs pymetis, which is not installed: "
            "pip install pymetis (or the pysparse_hpc[mpi] extra); method='contiguous' "
            "after pysparse_hpc.reorder needs no extra dependency") from exc
    return pymetis


class _CLibrary:
    """METIS's C entry points in pymetis's extension module, with its index type and option
    positions (both depend on how that METIS was built)."""

    def __init__(self, pymetis):
        try:
            from pymetis import _internal
            width = int(_internal._idx_type_width())
            self.seed_option = int(_internal.options_indices.SEED)
            self.numbering_option = int(_internal.options_indices.NUMBERING)
            library = ctypes.CDLL(_internal.__file__)
            self.recursive = library.METIS_PartGraphRecursive
            self.kway = library.METIS_PartGraphKway
            self.set_default_options = library.METIS_SetDefaultOptions
        except (ImportError, AttributeError, OSError) as exc:
            version = getattr(pymetis, "__version__", None) or _pymetis_version()
            raise RuntimeError(
                f"balancing several weights per node needs METIS's C functions, which this "
                f"pymetis ({version}) does not expose ({exc}); balance='rows', 'nnz' or a "
                f"number needs only pymetis's own API") from exc
        if width not in (32, 64):
            raise RuntimeError(f"unexpected METIS index width {width} bits")
        self.idx = np.int32 if width == 32 else np.int64
        for function in (self.recursive, self.kway, self.set_default_options):
            function.restype = ctypes.c_int


def _pymetis_version():
    try:
        from importlib import metadata
        return metadata.version("pymetis")
    except Exception:  # noqa: BLE001 - only for an error message
        return "unknown version"


_LIBRARY = None


def _c_library(pymetis):
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = _CLibrary(pymetis)
    return _LIBRARY


def multi_constraint_available():
    """Whether `part_graph` can balance several weights per node here (pymetis installed and
    exposing METIS's C functions)."""
    try:
        _c_library(import_pymetis())
    except (ModuleNotFoundError, RuntimeError):
        return False
    return True


def _pointer(array):
    return None if array is None else array.ctypes.data_as(ctypes.c_void_p)


def _multi_constraint(pymetis, xadj, adjncy, weights, nparts, seed):
    library = _c_library(pymetis)
    idx = library.idx
    n, ncon = weights.shape
    xadj = np.ascontiguousarray(xadj, dtype=idx)
    adjncy = np.ascontiguousarray(adjncy, dtype=idx)
    vwgt = np.ascontiguousarray(weights, dtype=idx).reshape(-1)  # node-major, as METIS reads
    options = np.empty(_METIS_NOPTIONS, dtype=idx)
    library.set_default_options(_pointer(options))
    # METIS uses the low 32 bits of its seed, and a 32-bit build's options array cannot
    # hold more (NumPy raised OverflowError there): those bits, signed where idx is 32-bit.
    seed = int(seed) % 2**32
    options[library.seed_option] = seed - 2**32 if idx == np.int32 and seed >= 2**31 else seed
    options[library.numbering_option] = 0
    scalars = {name: np.array([value], dtype=idx)
               for name, value in (("n", n), ("ncon", ncon), ("nparts", nparts), ("cut", 0))}
    owner = np.empty(n, dtype=idx)
    function = library.recursive if _recursive(n, nparts) else library.kway
    # tpwgts and ubvec NULL: equal parts, METIS's default tolerance per constraint (their
    # real_t width is not published by pymetis, so they are not passed).
    status = function(_pointer(scalars["n"]), _pointer(scalars["ncon"]), _pointer(xadj),
                      _pointer(adjncy), _pointer(vwgt), None, None, _pointer(scalars["nparts"]),
                      None, None, _pointer(options), _pointer(scalars["cut"]), _pointer(owner))
    if status != _METIS_OK:
        raise RuntimeError(f"METIS failed with {_METIS_ERRORS.get(status, status)} on a graph "
                           f"of {n} nodes with {ncon} weights per node")
    return owner


def part_graph(xadj, adjncy, weights, nparts, seed):
    """Owner of every node: METIS's partition of an undirected graph into ``nparts`` parts.

    Parameters
    ----------
    xadj, adjncy : ndarray
        The graph in METIS's CSR form: symmetric, no self loops.
    weights : ndarray of int, shape (n, ncon), or None
        The weights of every node, one column per balance constraint; None weighs nodes 1.
    nparts : int
        At least 2.
    seed : int
        METIS's random seed.

    Returns
    -------
    ndarray of int64, shape (n,)
    """
    pymetis = import_pymetis()
    n = xadj.size - 1
    if weights is not None and weights.shape[1] > 1:
        owner = _multi_constraint(pymetis, xadj, adjncy, weights, nparts, seed)
    else:
        idx = pymetis.zero_copy_dtype() if hasattr(pymetis, "zero_copy_dtype") else np.int64
        xadj = np.ascontiguousarray(xadj, dtype=idx)
        adjncy = np.ascontiguousarray(adjncy, dtype=idx)
        vweights = None if weights is None else np.ascontiguousarray(weights[:, 0], dtype=idx)
        options = pymetis.Options(seed=int(seed))
        # pymetis's own choice looks at nparts only; k-way fails on few nodes per part.
        recursive = _recursive(n, nparts)
        if hasattr(pymetis, "CSRAdjacency"):
            result = pymetis.part_graph(nparts, pymetis.CSRAdjacency(xadj, adjncy),
                                        vweights=vweights, options=options,
                                        recursive=recursive)
        else:  # pymetis before 2025.2
            result = pymetis.part_graph(nparts, xadj=xadj, adjncy=adjncy, vweights=vweights,
                                        options=options, recursive=recursive)
        owner = result[1]
    owner = np.asarray(owner, dtype=np.int64)
    if owner.shape != (n,) or (n and (owner.min() < 0 or owner.max() >= nparts)):
        raise RuntimeError(
            f"METIS returned an invalid partition (shape {owner.shape}, expected ({n},), with "
            f"parts in [0, {nparts}))")
    return owner
