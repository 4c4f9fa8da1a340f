"""Loading of the bundled citation graphs into a `Dataset`."""
from dataclasses import dataclass
from importlib import resources

import numpy as np

from .._csr import csr_array
from ..io import load_npz

__all__ = ["Dataset", "available", "load"]

_BUNDLED = ("cora", "citeseer")


@dataclass(frozen=True, repr=False)
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


def load(name):
    """Load a bundled dataset by name.

    Parameters
    ----------
    name : {"cora", "citeseer"}
        Case-insensitive.

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
        adj = load_npz(path, prefix="adj_", index_dtype=np.int32)
        features = load_npz(path, prefix="feat_", index_dtype=np.int32)
        with np.load(path, allow_pickle=False) as archive:
            y = archive["labels"].astype(np.int64)
            masks = [archive[f"{split}_mask"].astype(bool) for split in ("train", "val", "test")]
            num_classes = int(archive["num_classes"])
    return Dataset(key, adj, features.toarray().astype(np.float32), y, *masks, num_classes)
