"""Bundled graph datasets: the Planetoid citation graphs Cora and CiteSeer.

They ship inside the package, so `load` works offline. The adjacency is symmetric with unit
weights and no self-loops (PyG's ``Planetoid`` convention); the split is Kipf & Welling's.
"""
from ._loader import Dataset, available, load, load_file

__all__ = ["Dataset", "available", "load", "load_file"]
