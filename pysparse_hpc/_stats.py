"""Block statistics: what a blocked format costs for a given matrix, before building it."""
from dataclasses import asdict, dataclass

import numpy as np

from ._blocked import _check_geometry
from ._csr import as_csr
from ._cy import blocked as _blocked

__all__ = ["block_stats", "BlockStats"]


@dataclass(frozen=True)
class BlockStats:
    """Costs of the blocked formats of one matrix for one window height.

    Attributes
    ----------
    window, block_width : int
        Rows per window and vectors per block the numbers are for.
    n_rows, n_cols, nnz : int
        The matrix (``nnz`` counts stored entries, explicit zeros included, after merging
        duplicates).
    n_windows, n_empty_windows : int
        Row windows, and those with no stored entry.
    n_vectors : int
        ``window`` x 1 vectors (distinct columns per window, summed over windows).
    n_blocks : int
        Blocks of up to ``block_width`` vectors (a window's last block may be narrower).
    nnz_per_vector : float
        ``nnz / n_vectors``: how full a vector is, at most ``window``.
    redundancy : float
        ``n_vectors * window / nnz``: multiply-adds a dense MMA block does per useful one.
    padded_vectors : int
        Vectors of the padded SR-BCRS variant (each window rounded up to whole blocks).
    bytes_csr, bytes_mebcrs, bytes_srbcrs : int
        Storage of CSR, of the blocked format without padding (ME-BCRS when ``window == 8``),
        and of the padded variant, for the matrix's value and index dtypes.
    bytes_mask : int
        The vector mask pysparse_hpc keeps beside the blocked format (not in ``bytes_mebcrs``).
    """

    window: int
    block_width: int
    n_rows: int
    n_cols: int
    nnz: int
    n_windows: int
    n_empty_windows: int
    n_vectors: int
    n_blocks: int
    nnz_per_vector: float
    redundancy: float
    padded_vectors: int
    bytes_csr: int
    bytes_mebcrs: int
    bytes_srbcrs: int
    bytes_mask: int

    def as_dict(self):
        """The statistics as a plain dict."""
        return asdict(self)

    def __str__(self):
        # ME-BCRS is the 8-row format: other heights are the same layout under another name.
        blocked = "ME-BCRS" if self.window == 8 else f"{self.window}x1 blocked"
        return (
            f"{self.window}x1 vectors, blocks of {self.block_width}: "
            f"{self.n_windows} windows ({self.n_empty_windows} empty), {self.n_vectors} vectors, "
            f"{self.nnz_per_vector:.2f} nnz/vector, redundancy {self.redundancy:.2f}; bytes: "
            f"CSR {self.bytes_csr}, {blocked} {self.bytes_mebcrs} (+{self.bytes_mask} mask), "
            f"SR-BCRS {self.bytes_srbcrs}"
        )


def block_stats(A, window=8, block_width=8):
    """Count windows, vectors and bytes of the blocked formats of ``A`` without building them.

    Parameters
    ----------
    A : sparse array or array_like
        Anything `csr_array` accepts. Duplicates are merged first (a copy; ``A`` is unchanged).
    window : int, default 8
        Rows per window: 8 for ME-BCRS (FlashSparse), 16 for TC-GNN / DTC-SpMM.
    block_width : int, default 8
        Vectors per block; only the padded SR-BCRS figures depend on it.

    Returns
    -------
    BlockStats

    Examples
    --------
    >>> import numpy as np
    >>> import pysparse_hpc as sph
    >>> stats = sph.block_stats(sph.csr_array(np.ones((8, 4))), window=8)
    >>> stats.n_vectors, stats.nnz_per_vector, stats.redundancy
    (4, 8.0, 1.0)
    """
    window, block_width = _check_geometry(window, block_width)
    csr = as_csr(A)
    # The O(nnz) checks too: a column written in place out of range (which the kept canonical
    # flag does not see) sent the counting kernel, which indexes a counter by column, outside
    # its buffer (a wrong count, or a corrupted heap and an abort).
    csr._check_arrays(full_check=True, problem="A's arrays do not agree")
    csr = csr.canonical()
    n_rows, n_cols = csr.shape
    indices, distinct_cols = csr.indices, n_cols
    if n_cols > 2 * csr.nnz + 4096:
        # The counter keeps one slot per column; renumbering the columns that hold entries
        # keeps each window's distinct columns and sizes it by nnz (a 3 x 2**40 matrix would
        # otherwise ask for 8 TiB).
        used, renumbered = np.unique(indices, return_inverse=True)
        indices, distinct_cols = renumbered.astype(indices.dtype, copy=False), used.size
    vectors_per_window = _blocked.count_window_vectors(csr.indptr, indices, distinct_cols,
                                                       window)
    blocks_per_window = -(-vectors_per_window // block_width)
    n_vectors = int(vectors_per_window.sum())
    padded_vectors = int(blocks_per_window.sum()) * block_width
    n_windows = vectors_per_window.size
    index_bytes = csr.index_dtype.itemsize
    value_bytes = csr.dtype.itemsize
    offsets_bytes = (n_windows + 1) * index_bytes
    return BlockStats(
        window=window,
        block_width=block_width,
        n_rows=n_rows,
        n_cols=n_cols,
        nnz=csr.nnz,
        n_windows=n_windows,
        n_empty_windows=int(np.count_nonzero(vectors_per_window == 0)),
        n_vectors=n_vectors,
        n_blocks=int(blocks_per_window.sum()),
        nnz_per_vector=csr.nnz / n_vectors if n_vectors else 0.0,
        redundancy=n_vectors * window / csr.nnz if csr.nnz else 0.0,
        padded_vectors=padded_vectors,
        bytes_csr=(n_rows + 1) * index_bytes + csr.nnz * (index_bytes + value_bytes),
        bytes_mebcrs=offsets_bytes + n_vectors * (index_bytes + window * value_bytes),
        bytes_srbcrs=offsets_bytes + padded_vectors * (index_bytes + window * value_bytes),
        bytes_mask=n_vectors * ((window + 7) // 8),
    )
