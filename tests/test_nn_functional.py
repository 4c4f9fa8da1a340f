"""pysparse_hpc.nn.functional: values against dense torch references, gradients by gradcheck."""
import os
import numpy as np
import pytest
import scipy.sparse

torch = pytest.importorskip("torch")

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc.nn import _graph  # noqa: E402
from pysparse_hpc.nn import functional as F  # noqa: E402

from .conftest import random_scipy  # noqa: E402


def f64(*shape, seed=0, grad=True):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_(grad)


def dense_of(csr, values):
    """The dense matrix of ``csr``'s pattern holding ``values`` ((nnz,) or (nnz, heads))."""
    rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    shape = csr.shape + tuple(values.shape[1:])
    dense = torch.zeros(shape, dtype=values.dtype)
    return dense.index_put((torch.from_numpy(rows), torch.from_numpy(csr.indices.astype(np.int64))),
                           values)


def reference_edge_softmax(csr, scores):
    """Softmax per row through a dense matrix with -inf off the pattern."""
    rows = torch.from_numpy(np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr)))
    cols = torch.from_numpy(csr.indices.astype(np.int64))
    dense = torch.full(csr.shape + tuple(scores.shape[1:]), -torch.inf, dtype=scores.dtype)
    dense = dense.index_put((rows, cols), scores)
    return torch.softmax(dense, dim=1)[rows, cols]


@pytest.fixture
def square(rng):
    """A non-symmetric 9x9 pattern with an empty row and duplicates (made canonical by F)."""
    matrix = random_scipy(rng, (9, 9), 0.35, duplicates=True)
    keep = np.repeat(np.arange(9), np.diff(matrix.indptr)) != 4
    indptr = np.concatenate([[0], np.cumsum(np.bincount(
        np.repeat(np.arange(9), np.diff(matrix.indptr))[keep], minlength=9))])
    return sph.csr_array((matrix.data[keep], matrix.indices[keep], indptr), shape=(9, 9))


@pytest.fixture
def rectangular(rng):
    return sph.csr_array(random_scipy(rng, (7, 5), 0.4))


def test_spmm_matches_dense_and_gradchecks(rectangular):
    x = f64(5, 3)
    out = F.spmm(rectangular, x)
    torch.testing.assert_close(out, torch.from_numpy(rectangular.toarray()) @ x)
    assert torch.autograd.gradcheck(lambda x: F.spmm(rectangular, x), (x,))


@pytest.mark.parametrize("fmt", ["mebcrs", "blocked16"])
def test_spmm_on_blocked_adjacency_gradchecks(square, fmt):
    adj = square.to_mebcrs() if fmt == "mebcrs" else square.to_blocked(16)
    x = f64(9, 4)
    torch.testing.assert_close(F.spmm(adj, x), F.spmm(square, x))
    assert torch.autograd.gradcheck(lambda x: F.spmm(adj, x), (x,))
    assert isinstance(_graph.transposed_like(adj), type(adj))


def test_spmm_float32_adjacency_with_float64_x_keeps_x_dtype(rectangular):
    adj = rectangular.astype(np.float32)
    x = f64(5, 2)
    out = F.spmm(adj, x)
    assert out.dtype == torch.float64
    out.sum().backward()
    assert x.grad.dtype == torch.float64


@pytest.mark.parametrize("heads", [None, 3])
def test_spmm_with_values_gradchecks(rectangular, heads):
    csr = F.pattern(rectangular)
    values = f64(csr.nnz, seed=1) if heads is None else f64(csr.nnz, heads, seed=1)
    x = f64(5, 2) if heads is None else f64(5, heads, 2)
    out = F.spmm(rectangular, x, values=values)
    dense = dense_of(csr, values)
    expected = dense @ x if heads is None else torch.einsum("ijh,jhf->ihf", dense, x)
    torch.testing.assert_close(out, expected)
    assert torch.autograd.gradcheck(lambda v, x: F.spmm(rectangular, x, values=v), (values, x))


@pytest.mark.parametrize("heads", [None, 2])
def test_sddmm_gradchecks(rectangular, heads):
    csr = F.pattern(rectangular)
    x = f64(7, 3) if heads is None else f64(7, heads, 3)
    y = f64(5, 3, seed=2) if heads is None else f64(5, heads, 3, seed=2)
    out = F.sddmm(rectangular, x, y)
    rows = np.repeat(np.arange(7), np.diff(csr.indptr))
    expected = (x[rows] * y[csr.indices]).sum(-1)
    torch.testing.assert_close(out, expected)
    assert torch.autograd.gradcheck(lambda a, b: F.sddmm(rectangular, a, b), (x, y))


def test_sddmm_values_follow_the_canonical_pattern(square):
    """Duplicates are summed and rows sorted before the per-edge order is fixed."""
    assert not square.has_canonical_format
    csr = F.pattern(square)
    assert csr.has_canonical_format and csr.nnz < square.nnz
    x, y = f64(9, 2, grad=False), f64(9, 2, seed=3, grad=False)
    expected = sph.sddmm(csr, x.numpy(), y.numpy()).data
    np.testing.assert_allclose(F.sddmm(square, x, y).numpy(), expected)


@pytest.mark.parametrize("heads", [None, 2])
def test_edge_softmax_matches_dense_softmax_and_gradchecks(square, heads):
    csr = F.pattern(square)
    scores = f64(csr.nnz, seed=4) if heads is None else f64(csr.nnz, heads, seed=4)
    alpha = F.edge_softmax(square, scores)
    expected = reference_edge_softmax(csr, scores)
    torch.testing.assert_close(alpha, expected)
    torch.testing.assert_close(alpha, _torch_softmax(csr, scores))
    assert torch.autograd.gradcheck(lambda s: F.edge_softmax(square, s), (scores,))


def _torch_softmax(csr, scores):
    from pysparse_hpc.nn import _backend
    two_d = scores if scores.ndim == 2 else scores[:, None]
    result = _backend.torch_edge_softmax(csr, two_d)
    return result if scores.ndim == 2 else result[:, 0]


def test_edge_softmax_of_large_scores_does_not_overflow(square):
    csr = F.pattern(square)
    scores = torch.full((csr.nnz,), 1e4, dtype=torch.float32)
    alpha = F.edge_softmax(square, scores)
    assert torch.isfinite(alpha).all()
    row_sums = np.add.reduceat(alpha.numpy(), csr.indptr[:-1][np.diff(csr.indptr) > 0])
    np.testing.assert_allclose(row_sums, 1.0, rtol=1e-6)


@pytest.mark.parametrize("keep", F.GAT_KEEP)
def test_gat_attention_matches_reference_and_gradchecks(square, keep):
    csr = F.pattern(square)
    s_dst, s_src = f64(9, 3, seed=5), f64(9, 3, seed=6)
    alpha = F.gat_attention(square, s_dst, s_src, negative_slope=0.2, keep=keep)
    rows = torch.from_numpy(np.repeat(np.arange(9), np.diff(csr.indptr)))
    cols = torch.from_numpy(csr.indices.astype(np.int64))
    scores = torch.nn.functional.leaky_relu(s_dst[rows] + s_src[cols], 0.2)
    torch.testing.assert_close(alpha, reference_edge_softmax(csr, scores))
    assert torch.autograd.gradcheck(
        lambda a, b: F.gat_attention(square, a, b, negative_slope=0.2, keep=keep), (s_dst, s_src))


def test_transpose_is_built_once_and_reused_for_symmetric_graphs(rng):
    upper = scipy.sparse.triu(random_scipy(rng, (12, 12), 0.3), k=1)
    adj = sph.csr_array((upper + upper.T).tocsr())
    first = _graph.transpose(adj)
    assert first is _graph.transpose(adj)
    assert first.symmetric and first.matrix is F.pattern(adj)
    directed = sph.csr_array(upper.tocsr())
    transposed = _graph.transpose(directed)
    assert not transposed.symmetric
    np.testing.assert_array_equal(transposed.matrix.toarray(), directed.toarray().T)
    np.testing.assert_array_equal(transposed.matrix.data, directed.data[transposed.order])


def test_rebinding_an_array_of_the_graph_drops_what_was_built_from_it():
    adj = sph.csr_array(np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    x = torch.rand(3, 2, dtype=torch.float64, requires_grad=True)
    F.spmm(adj, x).sum().backward()
    np.testing.assert_array_equal(x.grad[:, 0].numpy(), [1.0, 1.0, 1.0])
    adj.data = np.array([2.0, 3.0, 4.0])     # a new array: the cached transpose is stale
    x.grad = None
    F.spmm(adj, x).sum().backward()
    np.testing.assert_array_equal(x.grad[:, 0].numpy(), [4.0, 2.0, 3.0])   # column sums


def test_dropout_statistics_repeatability_and_gradient():
    x = torch.ones(200, 500)
    torch.manual_seed(7)
    first = F.dropout(x, 0.3)
    torch.manual_seed(7)
    assert torch.equal(first, F.dropout(x, 0.3))
    kept = first != 0
    assert abs(float(kept.float().mean()) - 0.7) < 0.01
    torch.testing.assert_close(first[kept], torch.full_like(first[kept], 1 / 0.7))
    assert not torch.equal(first, F.dropout(x, 0.3))  # a fresh mask per call
    leaf = torch.rand(30, 40, dtype=torch.float64, requires_grad=True)
    out = F.dropout(leaf, 0.5)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(leaf.grad, (out != 0).double() * 2.0)
    assert F.dropout(x, 0.5, training=False) is x
    scalar = F.dropout(torch.tensor(2.0), 0.5)  # keeps its shape, as torch's does
    assert scalar.shape == () and float(scalar) in (0.0, 4.0)
    with pytest.raises(ValueError, match="row_ids needs an x with rows"):
        F.dropout(torch.tensor(2.0), 0.5, row_ids=np.arange(1))
    # A cast truncated float ids (0.2 and 0.7 shared a mask) and wrapped huge unsigned ones
    with pytest.raises(TypeError, match="row_ids must hold integers, got dtype float64"):
        F.dropout(torch.ones(3, 2), 0.5, row_ids=np.array([0.2, 0.7, 1.5]))
    with pytest.raises(TypeError, match="row_ids must hold integers, got dtype bool"):
        F.dropout(torch.ones(3, 2), 0.5, row_ids=np.array([True, False, True]))
    with pytest.raises(ValueError, match="row_ids holds ids beyond int64"):
        F.dropout(torch.ones(3, 2), 0.5, row_ids=np.full(3, 2**63, dtype=np.uint64))
    torch.manual_seed(3)
    by_tensor = F.dropout(torch.ones(3, 2), 0.5, row_ids=torch.tensor([4, 5, 6]))
    torch.manual_seed(3)
    by_list = F.dropout(torch.ones(3, 2), 0.5, row_ids=[4, 5, 6])
    assert torch.equal(by_tensor, by_list)
    leaf = torch.tensor([1.0, 2.0], requires_grad=True)   # p = 1 keeps nothing, as torch
    dropped = F.dropout(leaf, 1.0)
    dropped.sum().backward()
    assert torch.equal(dropped, torch.zeros(2)) and torch.equal(leaf.grad, torch.zeros(2))


@pytest.mark.parametrize("row_ids", [None, np.arange(40)[::-1].copy()])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_of_nan_and_inf_is_x_times_mask_as_torch(row_ids, dtype):
    """Torch computes x * mask * scale: a dropped NaN or inf is NaN and a dropped -1 is -0.0,
    where the kernels wrote a literal 0."""
    x = torch.tensor([torch.nan, torch.inf, -torch.inf, -1.0], dtype=dtype).repeat(40, 1)
    torch.manual_seed(0)
    kept = F.dropout(torch.ones_like(x), 0.5, row_ids=row_ids) != 0   # the mask of the seed
    torch.manual_seed(0)
    out = F.dropout(x, 0.5, row_ids=row_ids)
    assert kept.any() and not kept.all()
    expected = x * kept.to(dtype) * 2.0
    torch.testing.assert_close(out, expected, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(torch.signbit(out), torch.signbit(expected))


def test_second_derivatives_are_exact_or_refused(rectangular):
    """A gradient penalty through `spmm` and `dropout` equals the dense one; through the
    once-differentiable operations it raises instead of dropping the second-order term."""
    square = sph.csr_array(np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    dense = torch.tensor(square.toarray())
    x, weight = f64(3, 2), f64(2, 2)

    def penalty(product):
        grad_x, = torch.autograd.grad(product(x @ weight).tanh().sum(), x, create_graph=True)
        return torch.autograd.grad(grad_x.pow(2).sum(), weight)[0]
    torch.testing.assert_close(penalty(lambda h: F.spmm(square, h)),
                               penalty(lambda h: dense @ h))
    assert torch.autograd.gradgradcheck(lambda h: F.spmm(square, h), (x,))

    def dropped(h):
        torch.manual_seed(3)  # the same mask at every call gradgradcheck makes
        return F.dropout(h, 0.5)
    assert torch.autograd.gradgradcheck(dropped, (x,))
    scores = f64(F.pattern(square).nnz)
    for once in (lambda: F.sddmm(square, x, x), lambda: F.edge_softmax(square, scores),
                 lambda: F.spmm(square, x, values=scores),
                 lambda: F.gat_attention(square, x[:, :1], x[:, :1])):
        first = [t for t in (x, scores) if t.requires_grad]
        grads = torch.autograd.grad(once().pow(2).sum(), first, create_graph=True,
                                    allow_unused=True)
        with pytest.raises(RuntimeError, match="differentiate twice"):
            sum(g.sum() for g in grads if g is not None).backward()


@pytest.mark.parametrize("operation", ["sddmm", "edge_softmax", "spmm_values",
                                       "gat_attention"])
@pytest.mark.parametrize("allow_unused", [False, True])
def test_second_derivative_asked_for_one_input_raises(operation, allow_unused):
    """``torch.autograd.grad(..., inputs)`` visits only the paths to ``inputs``; torch's own
    once_differentiable error sits on none of them, so a second derivative came back without
    the operation's term. Every path through the gradient must now reach the error."""
    square = sph.csr_array(np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    nnz = F.pattern(square).nnz
    x, weight, values = f64(3, 2), f64(2, 2, seed=1), f64(nnz, seed=2)
    operations = {
        "sddmm": lambda h: F.sddmm(square, h, h),
        "edge_softmax": lambda h: F.edge_softmax(square, F.sddmm(square, h, h).detach()
                                                 + h.sum() * values),
        "spmm_values": lambda h: F.spmm(square, h, values=values * h.sum()),
        "gat_attention": lambda h: F.gat_attention(square, h[:, :1], h[:, 1:]),
    }
    out = operations[operation](x @ weight)
    grad_x, = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        torch.autograd.grad(grad_x.pow(2).sum(), weight, allow_unused=allow_unused)
    # first-order gradients and gradients without create_graph are unaffected
    grad_plain, = torch.autograd.grad(operations[operation](x @ weight).pow(2).sum(), x)
    torch.testing.assert_close(grad_plain, grad_x.detach())


def test_softmax_of_a_row_of_nan_is_nan():
    """A row whose scores are all NaN is NaN, as in torch and PyG (it came out uniform, as a
    row of -inf does); a row of -inf stays uniform; other rows are unaffected."""
    adj = sph.csr_array(np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    nan, inf = float("nan"), float("inf")
    scores = torch.tensor([nan, nan, -inf, -inf, 1.0], dtype=torch.float64)
    expected = torch.tensor([nan, nan, 0.5, 0.5, 1.0], dtype=torch.float64)
    torch.testing.assert_close(F.edge_softmax(adj, scores), expected, equal_nan=True)
    nodes = torch.tensor([[nan], [0.0], [1.0]], dtype=torch.float64)
    alpha = F.gat_attention(adj, nodes, torch.zeros(3, 1, dtype=torch.float64))
    assert torch.isnan(alpha[:2]).all() and not torch.isnan(alpha[2:]).any()


@pytest.mark.parametrize("call, error, message", [
    (lambda A, x: F.spmm(A.to_scipy(), x), TypeError, "wrap it with pysparse_hpc.csr_array"),
    (lambda A, x: F.spmm(A, x.numpy()), TypeError, "must be a torch.Tensor"),
    (lambda A, x: F.spmm(A, x.long()), TypeError, "float32 or float64"),
    (lambda A, x: F.spmm(A, x[:4]), ValueError, "dimension mismatch"),
    (lambda A, x: F.spmm(A, x, values=torch.ones(3, dtype=x.dtype)), ValueError,
     "one entry per stored edge"),
    (lambda A, x: F.spmm(A, x, values=torch.ones(F.pattern(A).nnz)), TypeError, "dtype"),
    (lambda A, x: F.sddmm(A, x, x), ValueError, "dimension mismatch"),
    (lambda A, x: F.edge_softmax(A, torch.ones(2, 2, 2)), ValueError, "1-D or 2-D"),
    (lambda A, x: F.dropout(x, 1.5), ValueError, "[0, 1]"),
    (lambda A, x: F.gat_attention(A, x, x, keep="everything"), ValueError, "keep must be"),
    (lambda A, x: F.gat_attention(A, x, x, negative_slope="a"), TypeError,
     "negative_slope must be a float, got str"),
    (lambda A, x: F.gat_attention(A, x, x, negative_slope=float("nan")), ValueError,
     "negative_slope must be a finite number"),
    (lambda A, x: F.pattern(A.toarray()), TypeError, "adj must be a pysparse_hpc sparse array"),
    (lambda A, x: F.row_ids(A.to_scipy(), "edge"), TypeError,
     "wrap it with pysparse_hpc.csr_array"),
])
def test_bad_input_is_rejected_clearly(rectangular, call, error, message):
    x = f64(5, 2, grad=False)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        call(rectangular, x)


@pytest.mark.parametrize("operation", ["edge_softmax", "gat_attention", "dropout"])
def test_the_thread_count_holds_in_a_new_thread(square, operation):
    """The attention and dropout kernels run on the library's thread count in a thread that has
    run nothing yet (Numba would start it on its whole pool), as the products do."""
    import threading

    import numba
    from pysparse_hpc._config import get_num_threads, set_num_threads
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs a pool of two threads or more")
    nnz = F.pattern(square).nnz
    run = {"edge_softmax": lambda: F.edge_softmax(square, f64(nnz, 2, grad=False)),
           "gat_attention": lambda: F.gat_attention(square, f64(9, 2, grad=False),
                                                    f64(9, 2, seed=1, grad=False)),
           "dropout": lambda: F.dropout(f64(9, 4, grad=False), 0.5)}[operation]
    seen = []

    def in_new_thread():
        run()
        seen.append(numba.get_num_threads())

    original = get_num_threads()
    set_num_threads(1)
    try:
        worker = threading.Thread(target=in_new_thread)
        worker.start()
        worker.join()
    finally:
        set_num_threads(original)
    assert seen == [1]


def test_kernels_from_several_threads_under_numba_workqueue_layer():
    """Numba's ``workqueue`` threading layer (its fallback where neither OpenMP nor TBB loads)
    aborts the whole process when two threads launch parallel kernels at once: a thread pool
    serving one model died with SIGABRT. The library's parallel kernels take turns under it,
    from the first launch on (before any kernel has run, Numba has not chosen its layer)."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        from concurrent.futures import ThreadPoolExecutor

        import numba
        import numpy as np
        import scipy.sparse
        import torch

        import pysparse_hpc as sph
        from pysparse_hpc.nn import functional as F

        A = sph.csr_array(scipy.sparse.random(300, 300, density=0.05, format="csr",
                                              random_state=0))
        X = np.random.default_rng(0).random((300, 8))
        nodes = torch.from_numpy(X[:, :2]).requires_grad_()

        def work(_):
            product = A @ X
            sampled = sph.sddmm(A, X, X).data
            alpha = F.gat_attention(A, nodes, nodes)
            (grad,) = torch.autograd.grad(alpha.square().sum(), nodes)
            # The mask's seed comes from torch's generator, shared by the threads: check
            # only that each element is dropped or doubled.
            dropped = F.dropout(torch.from_numpy(X), 0.5).numpy()
            assert ((dropped == 0) | (dropped == 2 * X)).all()
            return product, sampled, alpha.detach(), grad

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(work, range(60)))
        reference = work(0)
        assert all(np.array_equal(np.asarray(a), np.asarray(b))
                   for result in results for a, b in zip(result, reference))
        print(numba.threading_layer())
        """)
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue", NUMBA_NUM_THREADS="2",
               PYSPARSE_HPC_NUM_THREADS="2", PYSPARSE_HPC_PARALLEL_MIN_FLOPS="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["workqueue"]


def _per_edge_operation(operation, adj, x, values):
    """One of the operations whose backward reads ``adj``'s pattern, on ``x`` (3, 2)."""
    if operation == "spmm_values":
        return F.spmm(adj, x, values=values)
    if operation == "sddmm":
        return F.sddmm(adj, x, x)
    if operation == "edge_softmax":
        return F.edge_softmax(adj, values * x.sum())
    return F.gat_attention(adj, x[:, :1], x[:, 1:])


@pytest.mark.parametrize("operation", ["spmm_values", "sddmm", "edge_softmax", "gat_attention"])
@pytest.mark.parametrize("change", ["indices in place", "indptr in place", "indices rebound"])
def test_a_pattern_changed_between_forward_and_backward_makes_a_per_edge_backward_raise(
        operation, change):
    """The backward passes of the per-edge operations read the pattern again (its transpose,
    its row bounds): an entry moved to another column after the forward pass gave the gradient
    of the operation on the new pattern, silently, where `spmm` with A's own values raises."""
    adj = sph.csr_array(np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0], [4.0, 0.0, 0.0]]))
    x, values = f64(3, 2), f64(4, seed=1)
    out = _per_edge_operation(operation, adj, x, values)
    if change == "indices in place":
        adj.indices[2] = 1
    elif change == "indptr in place":
        adj.indptr[1] = 1
    else:
        adj.indices = np.array([1, 2, 1, 0], dtype=adj.indices.dtype)
    with pytest.raises(RuntimeError, match="pattern of the sparse array of .* was changed"):
        torch.autograd.grad(out.square().sum(), x)


@pytest.mark.parametrize("operation", ["spmm_values", "sddmm", "edge_softmax", "gat_attention"])
def test_values_written_between_forward_and_backward_leave_a_per_edge_backward_exact(operation):
    """The per-edge operations read only the pattern: new values are no reason to refuse."""
    adj = sph.csr_array(np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0], [4.0, 0.0, 0.0]]))
    x, values = f64(3, 2), f64(4, seed=1)
    expected, = torch.autograd.grad(_per_edge_operation(operation, adj, x, values).square().sum(),
                                    x)
    out = _per_edge_operation(operation, adj, x, values)
    adj.data *= -3.0
    got, = torch.autograd.grad(out.square().sum(), x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("values, error, message", [
    ([1.0, 1.0, 1.0], TypeError, "values must be a torch.Tensor, got list"),
    (torch.ones(3, 1, 1, dtype=torch.float64), ValueError,
     r"values must be 1-D or 2-D, got shape \(3, 1, 1\)"),
])
def test_spmm_on_a_distgraph_checks_values_as_on_a_sparse_array(values, error, message):
    """On a DistGraph, values were read (``values.ndim``) before being checked: a list raised
    AttributeError, and 3-D values were reported as "x must be 4-D"."""
    from pysparse_hpc import distributed
    adj = sph.csr_array(np.array([[0.0, 1.0], [1.0, 1.0]]))
    dist = distributed.DistGraph(adj, np.zeros(2, np.int64), distributed.Communicator(None))
    x = f64(2, 3, grad=False)
    for graph in (adj, dist):
        with pytest.raises(error, match=message):
            F.spmm(graph, x, values=values)


def test_meta_tensors_are_refused_by_every_operation():
    """A meta tensor went to the CUDA backend ("needs a CUDA GPU"), or through edge_softmax's
    torch operations to a meta result, where sddmm named the device."""
    A = sph.csr_array(np.eye(3))
    x = torch.ones(3, 2, device="meta")
    calls = {"x": lambda: F.spmm(A, x), "scores": lambda: F.edge_softmax(A, x[:, 0]),
             "s_dst": lambda: F.gat_attention(A, x, x)}
    for name, call in calls.items():
        with pytest.raises(ValueError, match=f"{name} is on device 'meta'; the kernels take CPU"):
            call()


def test_gat_attention_checks_negative_slope_as_gatconv_does():
    """A string slope was a ValueError saying it was not finite; a tensor of 0.2 too."""
    A = sph.csr_array(np.ones((3, 3)))
    scores = torch.zeros(3, 1, dtype=torch.float64)
    with pytest.raises(TypeError, match="negative_slope must be a float, got str"):
        F.gat_attention(A, scores, scores, negative_slope="0.2")
    with pytest.raises(ValueError, match="negative_slope must be a finite number, got nan"):
        F.gat_attention(A, scores, scores, negative_slope=float("nan"))
    assert F.gat_attention(A, scores, scores, negative_slope=np.float32(0.2)).shape == (9, 1)
