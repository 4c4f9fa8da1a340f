"""Write a sparse matrix to a Matrix Market file and read it back unchanged.

The script builds a small random `pysparse_hpc.csr_array`, writes it with
`pysparse_hpc.io.write_matrix_market` to a temporary ``.mtx`` file, reads it back with
`pysparse_hpc.io.read_matrix_market` and compares the two: same shape, same sparsity pattern,
same values. It also writes a symmetric matrix, which the writer detects and stores as one
triangle, to show that the reader expands it to both triangles again.

Run it with ``python examples/matrix_market_roundtrip.py``.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

import pysparse_hpc as sph
from pysparse_hpc.io import read_matrix_market, write_matrix_market


def random_csr(rng, n_rows, n_cols, density):
    """A random float64 CSR array with roughly ``density * n_rows * n_cols`` entries."""
    nnz = int(density * n_rows * n_cols)
    row = rng.integers(0, n_rows, nnz)
    col = rng.integers(0, n_cols, nnz)
    # Values in [1, 2) cannot cancel when duplicate coordinates are summed, so every stored
    # coordinate keeps a nonzero value.
    data = rng.random(nnz) + 1.0
    return sph.csr_array((data, (row, col)), shape=(n_rows, n_cols))


def same_matrix(a, b):
    """True if two canonical CSR arrays hold the same shape, pattern and values."""
    return (a.shape == b.shape
            and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data, b.data))


def roundtrip(A, path, comment):
    """Write ``A`` to ``path``, then return the file's header line and the matrix read back."""
    write_matrix_market(path, A, comment=comment)
    with open(path) as f:
        header = f.readline().strip()
    B = read_matrix_market(path)
    return header, B


def main(argv=None):
    # No options: --help describes the script instead of running it.
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rng = np.random.default_rng(0)
    general = random_csr(rng, 200, 150, 0.02)
    # A + A^T of a square matrix is symmetric, which the writer stores as one triangle.
    square = random_csr(rng, 120, 120, 0.02)
    symmetric = sph.csr_array(square.toarray() + square.toarray().T)

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, A in (("general", general), ("symmetric", symmetric)):
            path = os.path.join(tmp, f"{name}.mtx")
            header, B = roundtrip(A, path, comment=f"{name} example matrix")
            print(f"{name}: {A.shape[0]} x {A.shape[1]}, {A.nnz} entries")
            print(f"  header: {header}")
            print(f"  file size: {os.path.getsize(path)} bytes")
            # Matrix Market stores values as text, so exact equality also shows that the writer
            # prints enough digits to restore every float64 bit for bit.
            exact = same_matrix(A.canonical(), B) and np.array_equal(A.toarray(), B.toarray())
            print(f"  read back: {B.shape[0]} x {B.shape[1]}, {B.nnz} entries, exact: {exact}")
            failures += not exact

    if failures:
        print(f"{failures} matrix(es) did not survive the round trip")
        return 1
    print("Every matrix survived the Matrix Market round trip exactly.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
