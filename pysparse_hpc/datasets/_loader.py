"""Loading of the bundled citation graphs into a `Dataset`."""
import os
from dataclasses import dataclass
from importlib import resources

import numpy as np

from .._csr import csr_array
from .._sputils import check_integer, check_seed, get_index_dtype, refuse_beyond_memory
from ..io import _existing_path, _open_npz, _read_member, load_npz

__all__ = ["Dataset", "available", "load", "load_file"]

_BUNDLED = ("cora", "citeseer")


# eq=False: field-wise equality would compare arrays (an error or a meaningless answer), so
# datasets compare and hash by identity.
@dataclass(frozen=True, repr=False, eq=False)
class Dataset:
    """A node-classification graph.

    Attributes
    ----------
    name : str
    adj : csr_array
        N x N adjacency, float32, canonical (sorted rows, no duplicates). The bundled graphs'
        is symmetric with unit weights and no self-loops; `load_file` keeps a file's as stored.
    x : ndarray of float32, shape (N, F)
        Raw node features (not row-normalized).
    y : ndarray of int64, shape (N,)
        Class ids in ``[0, num_classes)``, or -1 for unlabeled nodes (15 in CiteSeer).
    train_mask, val_mask, test_mask : ndarray of bool, shape (N,)
        The standard Planetoid split.
    num_classes : int
    """

    name: str
    adj: csr_array
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int

    @property
    def num_nodes(self):
        """N, the number of nodes."""
        return self.adj.shape[0]

    @property
    def num_features(self):
        """F, the feature width."""
        return self.x.shape[1]

    @property
    def num_edges(self):
        """Stored adjacency entries (each undirected edge counts twice)."""
        return self.adj.nnz

    def __repr__(self):
        return (f"Dataset({self.name!r}: {self.num_nodes} nodes, {self.num_edges} edges, "
                f"{self.num_features} features, {self.num_classes} classes, split "
                f"{int(self.train_mask.sum())}/{int(self.val_mask.sum())}/"
                f"{int(self.test_mask.sum())})")


def available():
    """Names `load` accepts."""
    return _BUNDLED


def load(name, random_features=None, seed=0):
    """Load a bundled dataset by name.

    Parameters
    ----------
    name : {"cora", "citeseer"}
        Case-insensitive.
    random_features, seed : optional
        As for `load_file`: seeded random features of this width instead of the real ones.

    Returns
    -------
    Dataset

    Examples
    --------
    >>> from pysparse_hpc import datasets
    >>> cora = datasets.load("cora")
    >>> cora.num_nodes, cora.num_edges, cora.num_classes
    (2708, 10556, 7)
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a string, got {type(name).__name__}")
    key = name.lower()
    if key not in _BUNDLED:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(_BUNDLED)}")
    with resources.as_file(resources.files(__package__) / "data" / f"{key}.npz") as path:
        return load_file(path, random_features=random_features, seed=seed, name=key)


_SPLITS = ("train", "val", "test")


def _load_matrix(path, prefix, what):
    """The CSR matrix under ``prefix`` of an ``.npz`` file; its errors (which name the file and
    the prefix) say which matrix of the dataset it was."""
    try:
        matrix = load_npz(path, prefix=prefix)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{exc} (reading the {what})") from None
    # int32 indices where they fit (scipy's rule, and the bundled graphs'); a graph of more
    # than 2**31 - 1 entries keeps the int64 it needs.
    if (matrix.index_dtype == np.int64
            and get_index_dtype(maxval=max(*matrix.shape, matrix.nnz)) == np.int32):
        matrix = csr_array(matrix, index_dtype=np.int32)
    return matrix


_ADJ_KEYS = tuple(f"adj_{key}" for key in ("indptr", "indices", "data", "shape"))
_NODE_KEYS = ("labels", "num_classes") + tuple(f"{split}_mask" for split in _SPLITS)


def _check_keys(path, files):
    """Refuse a file without the keys of a graph, naming every missing one at once (a file
    that holds one bare matrix, as scipy and the SuiteSparse files store it, is told so)."""
    missing = [key for key in _ADJ_KEYS + _NODE_KEYS if key not in files]
    if not missing:
        return
    if not any(key.startswith("adj_") for key in files) and {
            "indptr", "indices", "data", "shape"} <= files:
        raise ValueError(f"{path!r} holds one sparse matrix (the layout of "
                         "scipy.sparse.save_npz), not a graph: pysparse_hpc.io.load_npz reads "
                         "it; a graph file holds the adjacency under adj_* with labels, the "
                         "three masks and num_classes")
    raise ValueError(f"{path!r} lacks {', '.join(missing)} (a node-classification graph file "
                     "needs adj_indptr, adj_indices, adj_data, adj_shape, labels, the three "
                     "masks and num_classes)")


def _check_dense_fits(path, shape, bytes_per_value, what):
    """Refuse up front dense features that cannot fit in memory. The sparse file is small
    whatever width it declares, so only the dense array's allocation would find out: NumPy's
    error names a shape, not the file or the key, and under memory overcommit the process was
    killed while filling it."""
    try:
        needed = float(shape[0]) * float(shape[1]) * bytes_per_value
    except OverflowError:   # a width past float's range
        needed = float("inf")
    refuse_beyond_memory(needed, f"{path!r}: dense features of {shape[0]} x {shape[1]} ({what})")


def load_file(path, random_features=None, seed=0, name=None):
    """Load a node-classification graph from an ``.npz`` file of the bundled layout.

    Keys: ``adj_indptr``, ``adj_indices``, ``adj_data``, ``adj_shape`` (the adjacency),
    ``labels``, ``train_mask``, ``val_mask``, ``test_mask``, ``num_classes``, and the features
    as CSR under ``feat_*`` (optional with ``random_features``). The adjacency is taken as
    stored, in canonical form (sorted rows, duplicate entries summed) with float32 weights; it
    is not made symmetric, nor are self-loops dropped.

    Parameters
    ----------
    path : str or path-like
    random_features : int, optional
        Use seeded standard-normal features of this width instead of the file's (for graphs
        shipped without features, such as PubMed's structure file, in benchmarks).
    seed : int
        Of the random features.
    name : str, optional
        Default: the file name without its extension.

    Returns
    -------
    Dataset

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        The file lacks a key (named), its arrays disagree in length, a label is not an integer
        in ``0..num_classes - 1`` (or -1, on a node outside the masks), ``num_classes`` is
        more than the nodes, a mask is not boolean, the masks overlap, or the adjacency is not
        square.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    # The arguments first, so that a bad one is not reported after (or as) a fault of the file.
    if random_features is not None:
        random_features = check_integer(random_features, "random_features")
        if random_features < 1:
            raise ValueError(f"random_features must be a positive width, got {random_features!r}")
    # Checked when unused too, as every other argument is: load("cora", seed="abc") passed.
    seed = check_seed(seed)
    path = _existing_path(path, file_objects=False)
    # The same checked reads as the matrices': a damaged or non-array member is a ValueError
    # that names the file and the key.
    with _open_npz(path) as archive:
        _check_keys(path, set(archive.files))
        # Any feat_* key means the file meant to hold features: load_npz then names the keys
        # that are missing, where "no features" would mislead.
        has_features = any(key.startswith("feat_") for key in archive.files)
        y = _read_member(archive, "labels", path)
        masks = [_read_member(archive, f"{split}_mask", path) for split in _SPLITS]
        num_classes = _read_member(archive, "num_classes", path)
    adj = _load_matrix(path, "adj_", "adjacency")
    # Cast without a check, float labels were truncated and index masks read as 0/1 masks.
    # By kind: NumPy counts timedelta64 among its integers, whose values int() cannot take.
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise ValueError(f"{path!r}: labels must be a 1-D integer array, got {y.ndim}-D {y.dtype}")
    for split, mask in zip(_SPLITS, masks):
        if mask.ndim != 1 or mask.dtype != np.bool_:
            raise ValueError(f"{path!r}: {split}_mask must be a 1-D bool array, got {mask.ndim}-D "
                             f"{mask.dtype}")
    if num_classes.ndim or num_classes.dtype.kind not in "iu" or num_classes < 1:
        raise ValueError(f"{path!r}: num_classes must be an integer >= 1, got {num_classes!r}")
    num_classes = int(num_classes)
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"{path!r}: the adjacency is {adj.shape[0]} x {adj.shape[1]}; a graph's "
                         f"is square")
    n = adj.shape[0]
    if num_classes > max(n, 1):
        # A model gets one output per class: 3e8 classes asked torch for 19 GB of weights.
        raise ValueError(f"{path!r}: num_classes is {num_classes}, more than its {n} nodes")
    # The Dataset's documented form, whatever the file stored: float32 weights (as the features)
    # and canonical rows, which kernels and reorderings expect. Checked after the cast and the
    # merge: a float64 weight beyond float32's range, or duplicates summing past it, became inf.
    with np.errstate(over="ignore"):
        adj = adj.astype(np.float32, copy=False)
        adj.sum_duplicates()
    if not np.isfinite(adj.data).all():
        raise ValueError(f"{path!r}: the adjacency holds NaN or infinite weights (or weights "
                         f"beyond float32's range)")
    if random_features is not None:
        _check_dense_fits(path, (n, random_features), 4, "random_features")
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n, random_features), dtype=np.float32)
    elif has_features:
        features = _load_matrix(path, "feat_", "feature matrix")
        # The dense array, and its float32 copy where it is not float32 already.
        copy_bytes = 0 if features.dtype == np.float32 else 4
        _check_dense_fits(path, features.shape, features.dtype.itemsize + copy_bytes,
                          "feat_shape")
        with np.errstate(over="ignore"):   # beyond float32's range: inf, refused below
            x = features.toarray().astype(np.float32, copy=False)
    else:
        raise ValueError(f"{path!r} has no features (feat_* keys); ask for random ones "
                         "(random_features=WIDTH, --random-features WIDTH on the command line)")
    if not np.isfinite(x).all():
        raise ValueError(f"{path!r}: the features hold NaN or infinite values")
    lengths = [("the features have", x, "rows"), ("labels has", y, "entries")]
    lengths += [(f"{split}_mask has", mask, "entries") for split, mask in zip(_SPLITS, masks)]
    for label, array, unit in lengths:
        if array.shape[0] != n:
            raise ValueError(f"{path!r}: {label} {array.shape[0]} {unit} but the graph has {n}"
                             " nodes")
    labelled = masks[0] | masks[1] | masks[2]
    # Ranges in Python ints: an unsigned label past int64 would wrap to a negative one.
    if labelled.any():
        low, high = int(y[labelled].min()), int(y[labelled].max())
        if not (0 <= low and high < num_classes):
            raise ValueError(f"{path!r}: labels of the masked nodes range over {low}..{high}; "
                             f"expected 0..{num_classes - 1} (num_classes {num_classes})")
    if n and not (-1 <= int(y.min()) and int(y.max()) < num_classes):
        raise ValueError(f"{path!r}: labels range over {int(y.min())}..{int(y.max())}; expected "
                         f"0..{num_classes - 1}, or -1 for a node without a label")
    # A node in two splits is trained and evaluated on (or validated and tested on) at once.
    for i, j in ((0, 1), (0, 2), (1, 2)):
        both = int(np.count_nonzero(masks[i] & masks[j]))
        if both:
            raise ValueError(f"{path!r}: {both} nodes are in both {_SPLITS[i]}_mask and "
                             f"{_SPLITS[j]}_mask; the splits must be disjoint")
    y = y.astype(np.int64)
    name = os.path.splitext(os.path.basename(os.fsdecode(path)))[0] if name is None else name
    return Dataset(name, adj, x, y, *masks, num_classes)
