"""Differential fuzzing of pysparse_hpc.nn: the operations and layers against dense torch
references written from the documented formulas (and PyG's layers, where installed), on small
random graphs with isolated nodes, empty rows, self-loops and repeated entries."""
import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc import nn  # noqa: E402
from pysparse_hpc.nn import functional as F  # noqa: E402


def random_coordinates(rng, n_rows, n_cols):
    """Edges of a random graph: some rows empty, some entries repeated, some self-loops."""
    density = rng.choice([0.0, 0.15, 0.4, 1.0])
    nnz = int(round(density * n_rows * n_cols))
    rows, cols = rng.integers(0, n_rows, nnz), rng.integers(0, n_cols, nnz)
    if n_rows == n_cols and rng.random() < 0.5:
        loops = rng.choice(n_rows, rng.integers(0, n_rows + 1), replace=False)
        rows, cols = np.concatenate([rows, loops]), np.concatenate([cols, loops])
    repeated = rng.integers(0, rows.size + 1)
    return np.concatenate([rows, rows[:repeated]]), np.concatenate([cols, cols[:repeated]])


def random_adjacency(rng, n_rows, n_cols, form):
    rows, cols = random_coordinates(rng, n_rows, n_cols)
    data = rng.standard_normal(rows.size)
    if form == "raw":  # unsorted and repeated columns in each row, as given
        order = np.lexsort((rng.random(rows.size), rows))
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))])
        return sph.csr_array((data[order], cols[order], indptr), shape=(n_rows, n_cols))
    adj = sph.csr_array((data, (rows, cols)), shape=(n_rows, n_cols))
    return {"coo": adj, "blocked": adj.to_blocked(2, 4), "mebcrs": adj.to_mebcrs(2)}[form]


def edge_coordinates(csr):
    rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    return torch.from_numpy(rows), torch.from_numpy(csr.indices.astype(np.int64))


def reference_softmax(csr, scores):
    """Softmax over each row's entries of (nnz, heads) scores, by scatter operations."""
    rows, _ = edge_coordinates(csr)
    shape = (csr.shape[0], scores.shape[1])
    peak = torch.full(shape, -torch.inf, dtype=scores.dtype).scatter_reduce(
        0, rows[:, None].expand_as(scores), scores.detach(), "amax")
    exp = (scores - peak[rows]).exp()
    return exp / torch.zeros(shape, dtype=scores.dtype).index_add(0, rows, exp)[rows]


def assert_same_gradients(out, reference, inputs, seed):
    grad = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(seed))
    for ours, theirs in zip(torch.autograd.grad(out, inputs, grad),
                            torch.autograd.grad(reference, inputs, grad, retain_graph=True)):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("seed", range(6))
def test_operations_match_dense_references(seed):
    """spmm (own values and per-edge values, one and several heads), sddmm, edge_softmax and
    gat_attention: values and every gradient, on random graphs in every format."""
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    for form in ("coo", "raw", "blocked", "mebcrs"):
        n = int(rng.integers(1, 9))
        m = n if rng.random() < 0.6 else int(rng.integers(1, 9))
        adj = random_adjacency(rng, n, m, form)
        csr = F.pattern(adj)
        rows, cols = edge_coordinates(csr)
        dtype = (torch.float32, torch.float64)[seed % 2]
        width, heads = int(rng.integers(0, 4)), int(rng.integers(1, 3))

        def randn(*shape):
            return torch.randn(*shape, dtype=dtype, generator=generator).requires_grad_()
        x = randn(width, m).T    # not contiguous
        dense = torch.from_numpy(adj.toarray()).to(dtype)
        assert_same_gradients(F.spmm(adj, x), dense @ x, (x,), seed)

        values, h = randn(csr.nnz, heads), randn(m, heads, width)
        reference = torch.zeros(n, heads, width, dtype=dtype).index_add(
            0, rows, values[:, :, None] * h[cols])
        torch.testing.assert_close(F.spmm(adj, h, values=values), reference)
        assert_same_gradients(F.spmm(adj, h, values=values), reference, (values, h), seed)

        g = randn(n, heads, width)
        reference = (g[rows] * h[cols]).sum(-1)
        torch.testing.assert_close(F.sddmm(adj, g, h), reference)
        assert_same_gradients(F.sddmm(adj, g, h), reference, (g, h), seed)

        reference = reference_softmax(csr, values)
        torch.testing.assert_close(F.edge_softmax(adj, values), reference)
        assert_same_gradients(F.edge_softmax(adj, values), reference, (values,), seed)
        if n == m:
            s_dst, s_src = randn(n, heads), randn(n, heads)
            slope = float(rng.choice([0.2, 0.0, -0.5, 1.5]))
            z = s_dst[rows] + s_src[cols]
            reference = reference_softmax(csr, torch.where(z > 0, z, slope * z))
            for keep in F.GAT_KEEP:
                alpha = F.gat_attention(adj, s_dst, s_src, slope, keep=keep)
                torch.testing.assert_close(alpha, reference)
                assert_same_gradients(alpha, reference, (s_dst, s_src), seed)


def test_operations_gradcheck_on_tiny_graphs():
    rng = np.random.default_rng(0)
    for form in ("coo", "raw", "blocked"):
        adj = random_adjacency(rng, 4, 4, form)
        nnz = F.pattern(adj).nnz

        def f64(*shape):
            return torch.randn(*shape, dtype=torch.float64).requires_grad_()
        x, values, h = f64(4, 2), f64(nnz, 2), f64(4, 2, 3)
        assert torch.autograd.gradgradcheck(lambda x: F.spmm(adj, x), (x,))
        assert torch.autograd.gradcheck(lambda v, h: F.spmm(adj, h, values=v), (values, h))
        assert torch.autograd.gradcheck(lambda a, b: F.sddmm(adj, a, b), (h, f64(4, 2, 3)))
        assert torch.autograd.gradcheck(lambda v: F.edge_softmax(adj, v), (values,))
        assert torch.autograd.gradcheck(
            lambda a, b: F.gat_attention(adj, a, b, 0.3, keep="scores"), (x, f64(4, 2)))


def dense_gcn_norm(dense, add_self_loops=True):
    """``D^-1/2 (A + I) D^-1/2`` from the formula, loops added where the diagonal is unset."""
    dense = dense.copy()
    if add_self_loops:
        missing = np.flatnonzero(np.diag(dense) == 0)
        dense[missing, missing] = 1.0
    with np.errstate(divide="ignore"):
        scale = dense.sum(axis=1) ** -0.5
    scale[np.isinf(scale)] = 0.0
    return scale[:, None] * dense * scale[None, :]


@pytest.mark.parametrize("seed", range(4))
def test_gcn_norm_matches_the_formula(seed):
    rng = np.random.default_rng(seed)
    for form in ("coo", "raw", "blocked", "mebcrs"):
        n = int(rng.integers(1, 9))
        rows, cols = random_coordinates(rng, n, n)
        rows, cols = np.unique(np.stack([rows, cols]), axis=1)   # no zero-sum diagonal
        weights = rng.random(rows.size) + 0.1
        adj = sph.csr_array((weights, (rows, cols)), shape=(n, n))
        adj = {"coo": adj, "raw": adj, "blocked": adj.to_blocked(2, 2),
               "mebcrs": adj.to_mebcrs(2)}[form]
        for loops in (True, False):
            np.testing.assert_allclose(
                nn.gcn_norm(adj, add_self_loops=loops, dtype=np.float64).toarray(),
                dense_gcn_norm(adj.toarray(), loops), rtol=1e-12, atol=1e-15)


def test_gcn_norm_propagates_a_nan_weight_to_its_row_and_column():
    """A NaN weight makes its node's degree NaN: D^-1/2 (A + I) D^-1/2 is NaN in that node's
    row and column (as PyG's gcn_norm gives). The scale was zeroed as for a non-positive
    degree, so the neighbors read 0 from the node and came out finite."""
    rows, cols = np.array([0, 1, 1, 2]), np.array([1, 0, 2, 1])
    adj = sph.csr_array((np.array([1.0, np.nan, 1.0, 1.0]), (rows, cols)), shape=(3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # NaN is not a negative degree: no warning
        normalized = nn.gcn_norm(adj).toarray()
    nan = np.isnan(normalized)
    assert nan[1].all() and nan[:, 1].all()
    np.testing.assert_allclose(normalized[[0, 2]][:, [0, 2]], np.diag([0.5, 0.5]), atol=1e-7)
    conv = nn.GCNConv(2, 2)
    with pytest.warns(RuntimeWarning, match="NaN"):
        out = conv(torch.ones(3, 2), adj)
    assert torch.isnan(out).all()


def test_gcn_norm_keeps_an_edge_stored_with_weight_zero():
    """An edge stored with weight 0 (a masked edge) stays, as in PyG and on a DistGraph: adding
    the loops by scipy's sum dropped it, so an inf in its source's features no longer made
    its target NaN, in one process only."""
    from pysparse_hpc.distributed import Communicator, DistGraph
    from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm
    adj = sph.csr_array((np.array([0.0]), (np.array([1]), np.array([0]))), shape=(2, 2))
    normalized = nn.gcn_norm(adj)
    assert normalized.nnz == 3 and normalized.toarray()[1, 0] == 0
    edge_index, weight = pyg_gcn_norm(torch.tensor([[0], [1]]), torch.tensor([0.0]), 2)
    assert edge_index.shape[1] == 3
    x = torch.tensor([[np.inf], [1.0]])
    conv = nn.GCNConv(1, 1, bias=False)
    twin = copy.deepcopy(conv)
    with pytest.warns(RuntimeWarning, match="NaN"):
        out = conv(x, adj)
    assert torch.isnan(out[1]).all()
    with pytest.warns(RuntimeWarning, match="NaN"):
        out_graph = twin(x, DistGraph(adj, np.zeros(2, np.int64), Communicator(None)))
    torch.testing.assert_close(out_graph, out, equal_nan=True)


def loops_added_by_coordinates(csr, n_diagonal, dtype):
    """The plain reference of `with_unit_loops`: the missing loops appended as coordinates,
    summed and sorted again."""
    rows, cols, data = csr.tocoo()
    has_loop = np.zeros(n_diagonal, dtype=bool)
    has_loop[rows[(rows == cols) & (rows < n_diagonal)]] = True
    missing = np.flatnonzero(~has_loop)
    return sph.csr_array((np.concatenate([data.astype(dtype), np.ones(missing.size, dtype)]),
                          (np.concatenate([rows, missing]), np.concatenate([cols, missing]))),
                         shape=csr.shape).canonical()


@pytest.mark.parametrize("seed", range(12))
def test_unit_loops_are_inserted_where_rows_lack_them(seed):
    """The loops go in at their place in each sorted row, for every index dtype, value dtype
    and number of diagonal rows (a DistGraph's owned rows come before its halo columns); the
    given arrays are not written."""
    from pysparse_hpc.nn._graph import rows_without_loop, with_unit_loops
    rng = np.random.default_rng(seed)
    n_rows, n_cols = int(rng.integers(0, 9)), int(rng.integers(0, 12))
    n_diagonal = int(rng.integers(0, min(n_rows, n_cols) + 1))
    rows, cols = random_coordinates(rng, n_rows, n_cols)
    diagonal = rng.choice(max(n_diagonal, 1), rng.integers(0, n_diagonal + 1), replace=False)
    rows, cols = np.concatenate([rows, diagonal]), np.concatenate([cols, diagonal])
    index_dtype = np.dtype(rng.choice([np.int32, np.int64]))
    value_dtype = np.dtype(rng.choice([np.float16, np.float32, np.float64]))
    csr = sph.csr_array((rng.standard_normal(rows.size).astype(value_dtype), (rows, cols)),
                        shape=(n_rows, n_cols), index_dtype=index_dtype).canonical()
    before = [array.copy() for array in (csr.indptr, csr.indices, csr.data)]
    for out_dtype in {value_dtype, np.dtype(np.float64)}:
        missing = rows_without_loop(csr.indptr, csr.indices, n_diagonal)
        indptr, indices, data = with_unit_loops(csr.indptr, csr.indices, csr.data, csr.shape,
                                                missing, out_dtype)
        expected = loops_added_by_coordinates(csr, n_diagonal, out_dtype)
        assert indptr.dtype == indices.dtype == index_dtype and data.dtype == out_dtype
        np.testing.assert_array_equal(indptr, expected.indptr)
        np.testing.assert_array_equal(indices, expected.indices)
        np.testing.assert_array_equal(data, expected.data)
    for array, old in zip((csr.indptr, csr.indices, csr.data), before):
        np.testing.assert_array_equal(array, old)


def test_gcn_norm_leaves_a_non_canonical_input_as_it_was():
    """Unsorted rows with repeated columns are summed and sorted in a copy."""
    adj = sph.csr_array((np.array([1.0, 2.0, 3.0, 4.0]), np.array([2, 0, 2, 1]),
                         np.array([0, 3, 4, 4])), shape=(3, 3))
    arrays = [array.copy() for array in (adj.indptr, adj.indices, adj.data)]
    normalized = nn.gcn_norm(adj, dtype=np.float64)
    np.testing.assert_allclose(normalized.toarray(), dense_gcn_norm(adj.toarray(), True),
                               rtol=1e-15)
    for array, old in zip((adj.indptr, adj.indices, adj.data), arrays):
        np.testing.assert_array_equal(array, old)


def test_gcn_norm_allocates_about_one_copy_of_the_graph():
    """Adding the loops as coordinates and sorting again allocated about 70 bytes per entry
    (every entry's int64 row, the coordinates twice, the sort's output, a float64 copy):
    twice PyG's peak. Inserted at their place in each row, in a float32 copy that is scaled
    in place, the result's 8 bytes an entry are all that grows with the entries."""
    import tracemalloc
    rng = np.random.default_rng(0)
    n_nodes, n_edges = 20_000, 200_000
    rows, cols = rng.integers(0, n_nodes, n_edges), rng.integers(0, n_nodes, n_edges)
    keep = rows != cols
    adj = sph.csr_array((np.ones(keep.sum(), np.float32), (rows[keep], cols[keep])),
                        shape=(n_nodes, n_nodes), index_dtype=np.int32).canonical()
    nn.gcn_norm(sph.csr_array(np.ones((2, 2), np.float32)))   # kernels compiled or loaded
    tracemalloc.start()
    try:
        normalized = nn.gcn_norm(adj)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert normalized.nnz == adj.nnz + n_nodes
    assert peak < 8 * normalized.nnz + 100 * n_nodes, (peak / adj.nnz, "bytes per entry")


def test_gcn_norm_refuses_a_non_bool_add_self_loops():
    """A string such as "False" is truthy and added the loops it was meant to leave out."""
    adj = sph.csr_array(np.array([[0.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(TypeError, match="add_self_loops must be a bool"):
        nn.gcn_norm(adj, add_self_loops="False")
    np.testing.assert_array_equal(nn.gcn_norm(adj, add_self_loops=np.bool_(False)).toarray(),
                                  adj.toarray())


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support:UserWarning")
def test_agnn_refuses_sparse_features_with_a_clear_message():
    """GCNConv and GATConv take torch sparse features; AGNNConv failed in torch's normalize,
    with a message about its reductions."""
    adj = sph.csr_array(np.array([[0.0, 1.0], [1.0, 1.0]]))
    x = torch.eye(2)
    for sparse in (x.to_sparse(), x.to_sparse_csr()):
        with pytest.raises(TypeError, match=r"AGNNConv takes dense features.*to_dense"):
            nn.AGNNConv()(sparse, adj)
    torch.testing.assert_close(nn.AGNNConv()(x, adj), nn.AGNNConv()(x.to_sparse().to_dense(),
                                                                    adj))


def make_layer(kind, rng):
    if kind == "gcn":
        order = str(rng.choice(["auto", "transform_first", "propagate_first"]))
        return nn.GCNConv(3, 2, order=order).double()
    if kind == "gat":
        return nn.GATConv(3, 2, heads=2, cache=str(rng.choice(["none", "H", "alpha"]))).double()
    return nn.AGNNConv().double()


def fresh_output(layer, x, adj):
    """The layer's output from a copy with nothing kept, on a fresh copy of the graph."""
    layer = copy.deepcopy(layer)
    if isinstance(layer, nn.GCNConv):
        layer.reset_cache()
    adj = sph.csr_array((adj.data.copy(), adj.indices.copy(), adj.indptr.copy()), shape=adj.shape)
    return layer(x.detach().clone(), adj)


@pytest.mark.parametrize("kind", ["gcn", "gat", "agnn"])
def test_layers_follow_graph_and_feature_changes_between_calls(kind):
    """Calls on two graphs in turn, with values and patterns written in place, arrays rebound,
    features changed in place, in train and eval mode and under no_grad: each output equals
    that of a fresh layer on a fresh graph (what is kept, Â X included, is never stale)."""
    rng = np.random.default_rng(1)
    layer = make_layer(kind, rng)
    graphs = [random_adjacency(rng, 6, 6, "coo") for _ in range(2)]
    for graph in graphs:
        graph.data = np.abs(graph.data) + 0.1
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for step in range(14):
        action = step % 7
        if action == 1:
            graphs.reverse()
        elif action == 2 and graphs[0].nnz:
            graphs[0].data *= 2.0
        elif action == 3 and graphs[0].nnz:
            graphs[0].data = graphs[0].data / 3.0
        elif action == 4:
            x.mul_(1.5)
        elif action == 5:
            layer.train(not layer.training)
        elif action == 6 and graphs[0].nnz:
            graph = graphs[0]   # move a row's first entry to a column the row lacks
            row = int(np.flatnonzero(np.diff(graph.indptr))[0])
            start, stop = graph.indptr[row], graph.indptr[row + 1]
            free = np.setdiff1d(np.arange(6), graph.indices[start:stop])
            if free.size:
                graph.indices[start] = free[0]
                order = np.argsort(graph.indices[start:stop], kind="stable")
                graph.indices[start:stop] = graph.indices[start:stop][order]
                graph.data[start:stop] = graph.data[start:stop][order]
        for context in (torch.enable_grad(), torch.no_grad()):
            with context:
                out = layer(x, graphs[0])
            torch.testing.assert_close(out, fresh_output(layer, x, graphs[0]))


@pytest.mark.parametrize("seed", range(3))
def test_layers_match_pyg(seed):
    pyg = pytest.importorskip("torch_geometric.nn")
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    n = int(rng.integers(1, 9))
    rows, cols = np.unique(np.stack(random_coordinates(rng, n, n)), axis=1)
    edge_index = torch.from_numpy(np.stack([cols, rows]))
    for adj in (edge_index, sph.csr_array((np.ones(rows.size), (rows, cols)),
                                          shape=(n, n)).to_blocked(2, 2)):
        slope = float(rng.choice([0.2, 1.5]))
        pairs = [(nn.GCNConv(3, 4), pyg.GCNConv(3, 4)),
                 (nn.GATConv(3, 2, heads=3, concat=bool(seed % 2), negative_slope=slope),
                  pyg.GATConv(3, 2, heads=3, concat=bool(seed % 2), negative_slope=slope)),
                 (nn.GATConv(3, 2, add_self_loops=False), pyg.GATConv(3, 2, add_self_loops=False)),
                 (nn.AGNNConv(add_self_loops=bool(seed % 2)),
                  pyg.AGNNConv(add_self_loops=bool(seed % 2)))]
        for ours, theirs in pairs:
            ours, theirs = ours.double(), theirs.double()
            with torch.no_grad():
                for parameter in ours.parameters():
                    parameter.normal_()
            theirs.load_state_dict({key: value.view(getattr(theirs, key.split(".")[0]).shape)
                                    if key.startswith("att") else value
                                    for key, value in ours.state_dict().items()})
            x = torch.randn(n, 3, dtype=torch.float64).requires_grad_()
            out, reference = ours(x, adj), theirs(x, edge_index)
            torch.testing.assert_close(out, reference)
            inputs = [x] + list(ours.parameters())
            grads = torch.autograd.grad(out.square().sum(), inputs)
            expected = torch.autograd.grad(reference.square().sum(),
                                           [x] + list(theirs.parameters()))
            for ours_grad, theirs_grad in zip(grads, expected):
                torch.testing.assert_close(ours_grad, theirs_grad.view(ours_grad.shape))
