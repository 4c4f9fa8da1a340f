"""The numeric steps of the autograd Functions, on the CPU (Numba kernels) or the GPU.

Each function takes detached torch tensors and returns a torch tensor on the same device. CPU
tensors go to the Numba kernels as zero-copy NumPy views. CUDA tensors go to the CUDA backend of
`pysparse_hpc.ops` (fixed-value SpMM and SDDMM) and to the CUDA-core CSR kernel with per-edge
values; the attention softmax on the GPU is written with torch operations (`torch_edge_softmax`),
which torch differentiates itself.
"""
import sys

import numpy as np

from .. import ops
from .._config import get_num_threads, parallel_launch
from ..kernels.cpu import edge_softmax as _softmax_kernels
from . import _graph

__all__ = ["on_cpu", "spmm_fixed", "spmm_values", "sddmm_values", "torch_edge_softmax",
           "edge_rows"]


def _torch():
    return sys.modules["torch"]


def on_cpu(tensor):
    return tensor.device.type == "cpu"


def host(tensor):
    """A contiguous NumPy view of a CPU tensor (a copy only when it is strided)."""
    return np.ascontiguousarray(tensor.detach().numpy())


def spmm_fixed(adj, x):
    """``adj @ x`` with adj's own values, in x's dtype."""
    adj = _graph.with_dtype(adj, numpy_dtype(x))
    if on_cpu(x):
        return ops.spmm(adj, x.detach())
    # The CUDA-core kernel reads CSR: hand it the kept canonical form, so the device copies of
    # its arrays are made once rather than for a fresh conversion of a blocked adj every call.
    # Its values go to the device once too, until they change (`cached_on` checks a checksum
    # on the host, far cheaper than `ops.spmm`'s copy of them on every call).
    from .._cuda_backend import pattern_spmm_cuda
    csr = _graph.pattern(adj)
    values = _graph.cached_on(csr, ("device_values", str(x.device)), _graph.kept_tensor(
        lambda: _torch().from_numpy(np.ascontiguousarray(csr.data)).to(x.device)))
    return pattern_spmm_cuda(csr, values, x.detach().contiguous())


def spmm_values(csr, values, x):
    """``A @ x`` for A = ``csr``'s pattern holding ``values`` ((nnz,) with 2-D x, (nnz, heads)
    with x of shape (n, heads, F))."""
    if on_cpu(x):
        return _torch().from_numpy(ops.pattern_spmm(csr, host(values), host(x)))
    from .._cuda_backend import pattern_spmm_cuda
    return pattern_spmm_cuda(csr, values.detach(), x.detach())


def sddmm_values(csr, x, y):
    """``dot(x[i], y[j])`` for every stored (i, j) of ``csr``: (nnz,) or (nnz, heads)."""
    csr = _graph.with_dtype(csr, numpy_dtype(x))  # only the pattern is read; keep x's dtype
    if on_cpu(x):
        result = ops.sddmm(csr, host(x), host(y))
        return _torch().from_numpy(result if x.ndim == 3 else result.data)
    # Device operands give the values in the kernel's order: csr's own for the CSR kernel.
    return ops.sddmm(csr, x.detach().contiguous(), y.detach().contiguous(), backend="cuda")


def edge_rows(csr, device):
    """The row of every stored entry as a torch index tensor on ``device`` (made once)."""
    def build():
        rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), np.diff(csr.indptr))
        return _torch().from_numpy(rows)
    rows = _graph.cached_on(csr, "edge_rows", _graph.kept_tensor(build))
    if str(device) == "cpu":
        return rows
    return _graph.cached_on(csr, ("edge_rows", str(device)),
                            _graph.kept_tensor(lambda: rows.to(device)))


def edge_cols(csr, device):
    """The column of every stored entry as a torch int64 index tensor on ``device``."""
    return _graph.cached_on(csr, ("edge_cols", str(device)), _graph.kept_tensor(
        lambda: _torch().from_numpy(csr.indices.astype(np.int64)).to(device)))


def torch_edge_softmax(csr, scores):
    """Softmax over each row's entries written with torch scatter operations (any device,
    differentiated by torch). ``scores`` is (nnz, heads)."""
    torch = _torch()
    rows = edge_rows(csr, scores.device)
    index = rows[:, None].expand_as(scores)
    shape = (csr.shape[0], scores.shape[1])
    peak = torch.full(shape, -torch.inf, dtype=scores.dtype, device=scores.device)
    peak = peak.scatter_reduce(0, index, scores.detach(), "amax")
    exp = (scores - peak[rows]).exp()
    total = torch.zeros(shape, dtype=scores.dtype, device=scores.device).index_add(0, rows, exp)
    return exp / total[rows]


def _parallel_kernel():
    """The context to run a parallel kernel in (`pysparse_hpc._config.parallel_launch`), with
    the library's thread count handed to Numba in the calling thread first: Numba keeps one
    count per thread and starts a thread it has not seen on its whole pool
    (`pysparse_hpc.set_num_threads`; the products of `ops` do the same)."""
    get_num_threads()
    return parallel_launch()


def softmax_rows(csr, scores):
    """Row softmax of (nnz, heads) scores on the CPU: the probabilities as a tensor."""
    alpha = np.empty(scores.shape, dtype=numpy_dtype(scores))
    with _parallel_kernel():
        _softmax_kernels.softmax_rows(csr.indptr, host(scores), alpha)
    return _torch().from_numpy(alpha)


def softmax_backward(csr, alpha, grad_alpha):
    grad_scores = np.empty(alpha.shape, dtype=numpy_dtype(alpha))
    with _parallel_kernel():
        _softmax_kernels.softmax_backward_rows(csr.indptr, host(alpha), host(grad_alpha),
                                               grad_scores)
    return _torch().from_numpy(grad_scores)


def gat_softmax(csr, s_dst, s_src, negative_slope):
    """GAT's attention on the CPU: probabilities (tensor) and the LeakyReLU sign (NumPy)."""
    dtype = numpy_dtype(s_dst)
    alpha = np.empty((csr.nnz, s_dst.shape[1]), dtype=dtype)
    positive = np.empty(alpha.shape, dtype=np.bool_)
    with _parallel_kernel():
        _softmax_kernels.gat_softmax_rows(csr.indptr, csr.indices, host(s_dst), host(s_src),
                                          dtype.type(negative_slope), alpha, positive)
    return _torch().from_numpy(alpha), positive


def gat_softmax_backward(csr, alpha, positive, grad_alpha, negative_slope):
    """Gradients of ``s_dst`` and ``s_src`` from that of the probabilities."""
    dtype = numpy_dtype(alpha)
    n_heads = alpha.shape[1]
    grad_z = np.empty(alpha.shape, dtype=dtype)
    grad_s_dst = np.empty((csr.shape[0], n_heads), dtype=dtype)
    with _parallel_kernel():
        _softmax_kernels.gat_softmax_backward_rows(csr.indptr, host(alpha), host(grad_alpha),
                                                   positive, dtype.type(negative_slope), grad_z,
                                                   grad_s_dst)
    transposed = _graph.transpose(csr)
    grad_s_src = np.empty((csr.shape[1], n_heads), dtype=dtype)
    with _parallel_kernel():
        _softmax_kernels.column_sums(transposed.matrix.indptr, transposed.order, grad_z,
                                     grad_s_src)
    torch = _torch()
    return torch.from_numpy(grad_s_dst), torch.from_numpy(grad_s_src)


def numpy_dtype(tensor):
    return np.dtype(str(tensor.dtype).replace("torch.", ""))


def dropout_threshold(p):
    """The uint64 a hash must reach for its element to be kept with probability ``1 - p``."""
    return np.uint64(min(int(p * 2.0 ** 64), 2 ** 64 - 1))


def dropout(x, p, seed, row_ids=None):
    """``x`` with elements dropped with probability ``p`` and the rest scaled by 1/(1-p).

    Element ``(r, c)`` of ``x`` viewed as rows (its first dimension) is hashed at counter
    ``row_ids[r] * row_size + c``; without ``row_ids`` that is its flat index."""
    from ..kernels.cpu import dropout as _dropout_kernels
    dtype = numpy_dtype(x)
    source = host(x)
    out = np.empty_like(source)
    scale = dtype.type(1.0 / (1.0 - p))
    if row_ids is None:
        with _parallel_kernel():
            _dropout_kernels.dropout(source.reshape(-1), out.reshape(-1), np.uint64(seed),
                                     dropout_threshold(p), scale)
    else:
        shape = (source.shape[0], int(np.prod(source.shape[1:])))  # exact for empty x too
        with _parallel_kernel():
            _dropout_kernels.dropout_rows(source.reshape(shape), out.reshape(shape), row_ids,
                                          np.uint64(seed), dropout_threshold(p), scale)
    return _torch().from_numpy(out)
