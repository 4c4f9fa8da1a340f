"""Convert the Cora adjacency matrix to the blocked formats and inspect what each one costs.

The script loads the bundled Cora citation graph, converts its adjacency matrix from CSR to
ME-BCRS with block widths 8 (what the library's fp16 and tf32 GPU kernels read) and 4
(FlashSparse's tf32 layout) and to the 16x1 layout of TC-GNN / DTC-SpMM, prints the
`pysparse_hpc.block_stats` of each, and checks that converting back to CSR reproduces the
original arrays exactly.

Run it with ``python examples/convert_and_inspect.py``.
"""
import argparse
import sys

import numpy as np

import pysparse_hpc as sph
from pysparse_hpc import datasets

# (label, window height, block width). The block width is the reduction extent of the MMA that
# reads the blocks: the library's GPU kernels use m16n8k8 in fp16 and in tf32 (k=8);
# FlashSparse's tf32 kernel uses m16n8k4 (k=4). 16-row windows are the granularity of TC-GNN
# and DTC-SpMM.
LAYOUTS = [
    ("ME-BCRS 8x1, k=8", 8, 8),
    ("ME-BCRS 8x1, k=4 (FlashSparse tf32)", 8, 4),
    ("16x1, k=8", 16, 8),
]


def same_csr(a, b):
    """True if two CSR arrays hold identical shapes, dtypes and arrays.

    Comparing the raw arrays rather than ``toarray()`` also catches a lost explicit zero or a
    reordered row, which a dense comparison would hide.
    """
    return (a.shape == b.shape and a.dtype == b.dtype
            and all(np.array_equal(x, y) for x, y in ((a.indptr, b.indptr),
                                                      (a.indices, b.indices),
                                                      (a.data, b.data))))


def main(argv=None):
    # No options: --help describes the script instead of running it.
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    cora = datasets.load("cora")
    # canonical() so the reference is the sorted, duplicate-free form that tocsr() produces.
    adj = cora.adj.canonical()
    print(cora)
    print(f"adjacency: {adj.shape[0]} x {adj.shape[1]}, {adj.nnz} stored entries, "
          f"{adj.dtype} values, {adj.index_dtype} indices")
    print()

    failures = 0
    for label, window, block_width in LAYOUTS:
        blocked = adj.to_blocked(window=window, block_width=block_width)
        stats = sph.block_stats(adj, window=window, block_width=block_width)
        print(f"{label} -> {type(blocked).__name__}")
        print(f"  {stats}")
        # block_stats predicts the layout without building it; the built array must agree.
        if (stats.n_windows, stats.n_vectors) != (blocked.n_windows, blocked.n_vectors):
            print("  block_stats disagrees with the converted array")
            failures += 1
        exact = same_csr(blocked.tocsr(), adj)
        print(f"  round trip to CSR exact: {exact}")
        failures += not exact
        print()

    if failures:
        print(f"{failures} check(s) failed")
        return 1
    print("All conversions round-tripped exactly.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
