"""asv benchmarks of reading Matrix Market files, with scipy's ``mmread(path).tocsr()`` as
the peer (the ``read`` command of ``python -m pysparse_hpc.bench`` times larger files).

The file is written by scipy in ``setup``: a random matrix plus its transpose, stored as a
symmetric or as a general file. Threads follow the library's setting
(``PYSPARSE_HPC_NUM_THREADS``); scipy's parser runs on its own threads.
"""
import os
import tempfile

import scipy.io
import scipy.sparse

from pysparse_hpc.io import read_matrix_market

from ._checks import check_same_csr


class ReadMatrixMarket:
    """Ours and scipy's reader on the same file."""

    params = ["symmetric", "general"]
    param_names = ["symmetry"]
    rows, density = 5000, 0.005

    def setup(self, symmetry):
        random = scipy.sparse.random(self.rows, self.rows, density=self.density,
                                     format="coo", random_state=0)
        self.directory = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.directory.name, "matrix.mtx")
        scipy.io.mmwrite(self.path, (random + random.T).tocoo(), symmetry=symmetry)
        expected = scipy.io.mmread(self.path).tocsr()
        expected.sum_duplicates()
        check_same_csr(f"reading a {symmetry} file", read_matrix_market(self.path), expected)

    def teardown(self, symmetry):
        self.directory.cleanup()

    def time_read_matrix_market(self, symmetry):
        read_matrix_market(self.path)

    def time_scipy_mmread_tocsr(self, symmetry):
        scipy.io.mmread(self.path).tocsr()
