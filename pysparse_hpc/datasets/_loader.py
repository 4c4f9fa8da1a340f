"""Loading of the bundled citation graphs into a `Dataset`."""
from dataclasses import dataclass
from importlib import resources

import numpy as np

from .._csr import csr_array
from .._sputils import check_integer, check_seed
from ..io import _open_npz, _read_member, load_npz

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
        N x N adjacency, float32, symmetric, unit weights, no self-loops.
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
        return load_npz(path, prefix=prefix, index_dtype=np.int32)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{exc} (reading the {what})") from None


def load_file(path, random_features=None, seed=0, name=None):
    """Load a node-classification graph from an ``.npz`` file of the bundled layout.

    Keys: ``adj_indptr``, ``adj_indices``, ``adj_data``, ``adj_shape`` (the adjacency),
    ``labels``, ``train_mask``, ``val_mask``, ``test_mask``, ``num_classes``, and the features
    as CSR under ``feat_*`` (optional with ``random_features``).

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
        The file lacks a key (named), its arrays disagree in length, the labels are not
        integers in ``0..num_classes - 1`` on the masked nodes, a mask is not boolean, or the
        adjacency is not square.
    """
    import os
    path = os.fspath(path)
    adj = _load_matrix(path, "adj_", "adjacency")
    # The same checked reads as the matrices': a damaged or non-array member is a ValueError
    # that names the file and the key.
    with _open_npz(path) as archive:
        missing = [key for key in ("labels", "num_classes") + tuple(f"{s}_mask" for s in _SPLITS)
                   if key not in archive.files]
        if missing:
            raise ValueError(f"{path!r} lacks {', '.join(missing)} (a node-classification "
                             "graph file needs labels, the three masks and num_classes)")
        has_features = "feat_indptr" in archive.files
        y = _read_member(archive, "labels", path)
        masks = [_read_member(archive, f"{split}_mask", path) for split in _SPLITS]
        num_classes = _read_member(archive, "num_classes", path)
    # Cast without a check, float labels were truncated and index masks read as 0/1 masks.
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{path!r}: labels must be a 1-D integer array, got {y.ndim}-D {y.dtype}")
    for split, mask in zip(_SPLITS, masks):
        if mask.ndim != 1 or mask.dtype != np.bool_:
            raise ValueError(f"{path!r}: {split}_mask must be a 1-D bool array, got {mask.ndim}-D "
                             f"{mask.dtype}")
    if num_classes.ndim or not np.issubdtype(num_classes.dtype, np.integer) or num_classes < 1:
        raise ValueError(f"{path!r}: num_classes must be an integer >= 1, got {num_classes!r}")
    y, num_classes = y.astype(np.int64), int(num_classes)
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"{path!r}: the adjacency is {adj.shape[0]} x {adj.shape[1]}; a graph's "
                         f"is square")
    n = adj.shape[0]
    if not np.isfinite(adj.data).all():
        raise ValueError(f"{path!r}: the adjacency holds NaN or infinite weights")
    if random_features is not None:
        random_features = check_integer(random_features, "random_features")
        if random_features < 1:
            raise ValueError(f"random_features must be a positive width, got {random_features!r}")
        seed = check_seed(seed)
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n, random_features), dtype=np.float32)
    elif has_features:
        x = _load_matrix(path, "feat_", "feature matrix").toarray().astype(np.float32)
    else:
        raise ValueError(f"{path!r} has no features (feat_* keys); ask for random ones "
                         "(random_features=WIDTH, --random-features WIDTH on the command line)")
    if not np.isfinite(x).all():
        raise ValueError(f"{path!r}: the features hold NaN or infinite values")
    for label, array in [("features", x), ("labels", y)] + list(zip(_SPLITS, masks)):
        if array.shape[0] != n:
            raise ValueError(f"{path!r}: {label} have {array.shape[0]} rows but the graph has {n}"
                             " nodes")
    labelled = masks[0] | masks[1] | masks[2]
    if labelled.any() and not (0 <= y[labelled].min() and y[labelled].max() < num_classes):
        raise ValueError(f"{path!r}: labels of the masked nodes range over "
                         f"{y[labelled].min()}..{y[labelled].max()}; expected 0..{num_classes - 1}"
                         f" (num_classes {num_classes})")
    name = os.path.splitext(os.path.basename(path))[0] if name is None else name
    return Dataset(name, adj, x, y, *masks, num_classes)
