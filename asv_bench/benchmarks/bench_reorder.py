"""asv benchmarks of the graph orderings, with scipy's reverse Cuthill-McKee as the peer.

Matrices are the shared ones (see `bench_convert`) and one generated graph with planted
communities whose node ids are shuffled, the case community orderings exist for.
"""
from scipy.sparse.csgraph import reverse_cuthill_mckee

import pysparse_hpc as sph
from pysparse_hpc.generators import planted_partition

from ._checks import check_close
from .bench_convert import MATRICES, load_matrix

PLANTED = "planted-c32"


def load_graph(name):
    """A shared matrix, or the planted-community graph (3125 communities of 32 nodes)."""
    if name == PLANTED:
        return planted_partition(3125, 32, internal_degree=8, external_degree=2, seed=1,
                                 shuffle=True)[0]
    return load_matrix(name)


class Reorder:
    """Computing each ordering, and scipy's RCM on the same matrix."""

    params = [list(MATRICES) + [PLANTED], ["rabbit", "rcm", "degree"]]
    param_names = ["matrix", "method"]

    def setup(self, matrix, method):
        self.A = load_graph(matrix)
        self.scipy_A = self.A.to_scipy()
        perm = sph.reorder(self.A, method)
        check_close(f"{method} order of {matrix} (sorted)", sorted(perm), range(self.A.shape[0]),
                    rtol=0)

    def time_reorder(self, matrix, method):
        sph.reorder(self.A, method)

    def time_scipy_rcm(self, matrix, method):
        # The peer: independent of ``method``, repeated so each row has its baseline.
        reverse_cuthill_mckee(self.scipy_A)

    def peakmem_reorder(self, matrix, method):
        sph.reorder(self.A, method)


class ReorderedSpmm:
    """CPU ME-BCRS SpMM (N = 128) on the original matrix and on its reordered versions."""

    params = [list(MATRICES) + [PLANTED], ["none", "rabbit", "rcm"]]
    param_names = ["matrix", "method"]

    def setup(self, matrix, method):
        import numpy as np
        A = load_graph(matrix).astype(np.float32)
        perm = sph.reorder(A, method)
        self.M = sph.permute(A, perm).to_mebcrs()
        self.X = np.random.default_rng(0).standard_normal((A.shape[0], 128),
                                                          dtype=np.float32)[perm]
        # compiles the kernels outside the timing; the reordered product is the original one,
        # permuted
        check_close(f"SpMM on {matrix} reordered by {method}", self.M @ self.X,
                    (A.to_scipy() @ self.X[np.argsort(perm)])[perm])

    def time_spmm(self, matrix, method):
        self.M @ self.X
