"""GNN layers: dense references, PyG on the same weights, every order / cache alike, bad input,
and accuracy on Cora."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc import nn  # noqa: E402
from pysparse_hpc.nn import functional as F  # noqa: E402
from pysparse_hpc.nn import models, train  # noqa: E402

from .conftest import random_scipy  # noqa: E402


@pytest.fixture
def graph(rng):
    """A directed 14-node graph with an isolated node and a self-loop."""
    matrix = random_scipy(rng, (14, 14), 0.25).tolil()
    matrix[5, :] = 0
    matrix[:, 5] = 0
    matrix[2, 2] = 1.5
    matrix = matrix.tocsr()
    matrix.data = np.abs(matrix.data) + 0.1
    return sph.csr_array(matrix)


def edge_index_of(adj):
    coo = adj.to_scipy().tocoo()
    return torch.from_numpy(np.vstack([coo.col, coo.row]).astype(np.int64))


def features(n, width, seed=0, dtype=torch.float64, grad=False):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, width, dtype=dtype, generator=generator).requires_grad_(grad)


def assert_spmm_matches_dense(adj, x):
    """``F.spmm(adj, x)`` and the gradient of its sum with respect to ``x`` (a leaf that
    requires grad) equal the dense product's."""
    x.grad = None
    out = F.spmm(adj, x)
    out.sum().backward()
    dense = torch.from_numpy(adj.toarray())
    torch.testing.assert_close(out, dense @ x.detach())
    torch.testing.assert_close(x.grad, dense.T @ torch.ones_like(out))


def dense_gcn_norm(adj):
    """D^-1/2 (A + I) D^-1/2 with I added where A stores no diagonal entry (PyG's rule)."""
    stored = adj.to_scipy().tocoo()
    has_loop = np.zeros(adj.shape[0], bool)
    has_loop[stored.row[stored.row == stored.col]] = True
    A = adj.toarray() + np.diag((~has_loop).astype(float))
    degree = A.sum(axis=1)
    scale = np.where(degree > 0, degree ** -0.5, 0.0)
    return scale[:, None] * A * scale[None, :]


def dense_attention_reference(adj, h, att_src, att_dst, slope):
    """GAT on a dense mask (self-loops added): (n, heads, F')."""
    mask = torch.from_numpy((adj.toarray() != 0) | np.eye(adj.shape[0], dtype=bool))
    s_src = (h * att_src).sum(-1)
    s_dst = (h * att_dst).sum(-1)
    scores = torch.nn.functional.leaky_relu(s_dst[:, None, :] + s_src[None, :, :], slope)
    scores = scores.masked_fill(~mask[:, :, None], -torch.inf)
    alpha = torch.softmax(scores, dim=1)
    return torch.einsum("ijh,jhf->ihf", alpha, h)


# -- gcn_norm ---------------------------------------------------------------------------------

def test_gcn_norm_matches_the_dense_formula(graph):
    np.testing.assert_allclose(nn.gcn_norm(graph.astype(np.float64)).toarray(),
                               dense_gcn_norm(graph), rtol=1e-12)
    assert nn.gcn_norm(graph.astype(np.float32)).dtype == np.float32


def test_gcn_norm_from_edge_index_and_without_self_loops(graph):
    from_edges = nn.gcn_norm(edge_index_of(graph), num_nodes=14)
    pattern_only = sph.csr_array((np.ones(graph.nnz), graph.indices, graph.indptr),
                                 shape=graph.shape)
    np.testing.assert_allclose(from_edges.toarray(), dense_gcn_norm(pattern_only), rtol=1e-6)
    no_loops = nn.gcn_norm(graph.astype(np.float64), add_self_loops=False).toarray()
    A = graph.toarray()
    scale = np.where(A.sum(1) > 0, A.sum(1), 1) ** -0.5 * (A.sum(1) > 0)
    np.testing.assert_allclose(no_loops, scale[:, None] * A * scale[None, :])


def test_gcn_norm_and_an_edge_index_give_int32_indices_where_they_fit(graph):
    """scipy's rule, as the bundled graphs': an int64 edge_index, or int64 self-loop
    coordinates, made the SpMM read twice the index bytes."""
    for adj in (graph, graph.astype(np.float64)):
        assert adj.indices.dtype == np.int32
        normalized = nn.gcn_norm(adj)
        assert normalized.indices.dtype == normalized.indptr.dtype == np.int32
    from pysparse_hpc.nn._graph import as_graph
    from_edges = as_graph(edge_index_of(graph), num_nodes=14)
    assert from_edges.indices.dtype == from_edges.indptr.dtype == np.int32
    np.testing.assert_array_equal(from_edges.toarray(), graph.toarray() != 0)
    assert nn.gcn_norm(edge_index_of(graph), num_nodes=14).indices.dtype == np.int32
    wide = sph.csr_array(graph.to_scipy(), index_dtype=np.int64)
    assert nn.gcn_norm(wide).indices.dtype == np.int64     # an int64 graph stays int64


def test_gcn_norm_warns_of_negative_degrees():
    """D^-1/2 is not real where a row of A + I sums below zero: zeroed, with a warning."""
    signed = sph.csr_array(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, -5.0], [0.0, -5.0, 0.0]]))
    with pytest.warns(RuntimeWarning, match="2 rows of A \\+ I sum to a negative degree"):
        normalized = nn.gcn_norm(signed).toarray()
    assert not normalized[1:].any() and not normalized[:, 1:].any()
    assert normalized[0, 0] == pytest.approx(0.5)


@pytest.mark.parametrize("route", ["gcn_norm", "GCNConv", "DistGraph"])
def test_gcn_norm_warns_of_negative_degrees_at_the_callers_line(route):
    """Reached through a layer or a DistGraph's cached normalization, the warning pointed into
    the library (gcn.py, norm.py): shown once for every caller, and not at any of them."""
    from pysparse_hpc import distributed
    signed = sph.csr_array(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, -5.0], [0.0, -5.0, 0.0]]))
    calls = {"gcn_norm": lambda: nn.gcn_norm(signed),
             "GCNConv": lambda: nn.GCNConv(2, 2)(torch.ones(3, 2), signed),
             "DistGraph": lambda: nn.gcn_norm(distributed.DistGraph(
                 signed, np.zeros(3, np.int64), distributed.Communicator(None)))}
    with pytest.warns(RuntimeWarning, match="negative degree") as caught:
        calls[route]()
    assert [w.filename for w in caught if "negative degree" in str(w.message)] == [__file__]


def test_gcn_norm_in_a_chosen_dtype(graph):
    """float64 values of an unweighted (float32) graph carry no float32 rounding."""
    pattern_only = sph.csr_array((np.ones(graph.nnz), graph.indices, graph.indptr),
                                 shape=graph.shape)
    exact = dense_gcn_norm(pattern_only)
    wide = nn.gcn_norm(edge_index_of(graph), num_nodes=14, dtype="float64")
    assert wide.dtype == np.float64
    np.testing.assert_allclose(wide.toarray(), exact, rtol=1e-14)
    assert nn.gcn_norm(graph.astype(np.float64), dtype=np.float32).dtype == np.float32
    # torch's names of the same dtypes (refused with "got torch.float64" before)
    assert nn.gcn_norm(graph, dtype=torch.float64).dtype == np.float64
    assert nn.gcn_norm(graph.astype(np.float64), dtype=torch.float32).dtype == np.float32
    for bad in ("int64", "float16", "bogus", 3, torch.float16):
        with pytest.raises(TypeError, match="dtype must be float32 or float64"):
            nn.gcn_norm(graph, dtype=bad)


# -- GCNConv ----------------------------------------------------------------------------------

def test_choose_order_rule():
    assert nn.choose_order(1433, 16, input_requires_grad=False) == "transform_first"
    assert nn.choose_order(20, 16, input_requires_grad=False) == "propagate_first"
    assert nn.choose_order(20, 16, input_requires_grad=True) == "transform_first"
    assert nn.choose_order(16, 20, input_requires_grad=True) == "propagate_first"


@pytest.mark.parametrize("in_channels, out_channels", [(6, 3), (3, 6)])
def test_gcnconv_orders_agree_with_dense_reference(graph, in_channels, out_channels):
    torch.manual_seed(0)
    reference = None
    for order in nn.ORDERS:
        conv = nn.GCNConv(in_channels, out_channels, order=order).double()
        conv.load_state_dict(reference[1] if reference else conv.state_dict())
        x = features(14, in_channels, grad=True)
        out = conv(x, graph)
        out.square().sum().backward()
        expected = torch.from_numpy(dense_gcn_norm(graph.astype(np.float32).astype(np.float64))
                                    ) @ x.detach() @ conv.lin.weight.detach().T + conv.bias.detach()
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
        grads = (x.grad, conv.lin.weight.grad, conv.bias.grad)
        if reference is None:
            reference = (grads, conv.state_dict())
        else:
            for got, want in zip(grads, reference[0]):
                torch.testing.assert_close(got, want)


def test_gcnconv_gradcheck(graph):
    conv = nn.GCNConv(4, 3).double()
    x = features(14, 4, grad=True)
    for order in ("transform_first", "propagate_first"):
        conv.order = order
        assert torch.autograd.gradcheck(lambda x, w: torch.nn.functional.linear(
            conv(x, graph), w), (x, torch.eye(3, dtype=torch.float64, requires_grad=True)))


def test_gcnconv_auto_follows_the_rule_and_reuses_the_propagated_input(graph, monkeypatch):
    conv = nn.GCNConv(40, 4).double()          # a first layer: 2 * 4 < 40, transform first
    x = features(14, 40)
    first = conv(x, graph)
    assert conv.last_order == "transform_first"
    second = conv(x, graph)                     # the same unchanged input: (Â X) W, Â X kept
    assert conv.last_order == "propagate_first"
    torch.testing.assert_close(first, second)
    calls = []
    monkeypatch.setattr(F, "spmm", lambda *a, **k: calls.append(1) or pytest.fail("SpMM ran"))
    third = conv(x, graph)                      # no SpMM at all
    torch.testing.assert_close(third, first)
    monkeypatch.undo()
    with torch.no_grad():
        x.mul_(2.0)                             # modified in place: recomputed
    torch.testing.assert_close(conv(x, graph), 2 * (first - conv.bias) + conv.bias)
    inner = nn.GCNConv(16, 4)                   # an input that needs a gradient: width rule
    inner(features(14, 16, dtype=torch.float32, grad=True), graph)
    assert inner.last_order == "transform_first"


def test_gcnconv_keeps_the_evaluation_input_across_training_steps(graph, monkeypatch):
    """Training steps feed fresh dropped-out features; evaluation passes in between reuse the
    raw features, whose Â X is computed on the second pass and kept from then on."""
    conv = nn.GCNConv(40, 4).double()
    x = features(14, 40)
    expected = None
    for epoch in range(4):
        conv(F.dropout(x, 0.5), graph).sum()      # a training step's input
        with torch.no_grad():
            out = conv(x, graph)
        expected = out if expected is None else expected
        torch.testing.assert_close(out, expected)
        assert conv.last_order == ("transform_first" if epoch == 0 else "propagate_first")
    kept = conv._propagated.value
    conv(F.dropout(x, 0.5), graph)
    with torch.no_grad():
        conv(x, graph)
    assert conv._propagated.value is kept


@pytest.mark.parametrize("write", ["torch", "numpy", "data"])
def test_gcnconv_kept_propagation_and_features_written_in_place(graph, write):
    """An in-place change torch counts drops the kept Â X; one it does not count (NumPy
    memory shared by torch.from_numpy, .data) is not seen, as documented, until
    reset_cache()."""
    conv = nn.GCNConv(40, 4).double()
    array = np.random.default_rng(0).standard_normal((14, 40))
    x = torch.from_numpy(array)
    for _ in range(3):                          # the third call reuses the kept Â X
        conv(x, graph)
    assert conv.last_order == "propagate_first"
    if write == "torch":
        x.mul_(2.0)
    elif write == "numpy":
        array *= 2.0
    else:
        x.data.mul_(2.0)
    fresh = nn.GCNConv(40, 4).double()
    fresh.load_state_dict(conv.state_dict())
    expected = fresh(x.clone(), graph)
    if write != "torch":
        assert not torch.allclose(conv(x, graph), expected)   # the documented limit
        conv.reset_cache()
    torch.testing.assert_close(conv(x, graph), expected)


@pytest.mark.parametrize("layer", [lambda: nn.GCNConv(3, 2), lambda: nn.GATConv(3, 2),
                                   lambda: nn.AGNNConv()])
def test_an_edge_index_written_through_numpy_is_converted_again(graph, layer):
    """An edge_index sharing a NumPy array's memory changes without its version counter
    moving: the layer must not keep the adjacency of its old edges."""
    conv = layer().double()
    edges = edge_index_of(graph).numpy().copy()
    edge_index = torch.from_numpy(edges)
    x = features(14, 3)
    conv(x, edge_index)
    edges[0, :] = (edges[0, :] + 1) % 14       # other sources, written in place
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # repeated edges, if any
        torch.testing.assert_close(conv(x, edge_index), conv(x, edge_index.clone()))


def test_an_edge_index_cache_replaced_during_a_lookup_returns_the_looked_up_graph(
        graph, monkeypatch):
    """A layer called from several threads: while one call checks that its edge_index is the
    one kept (a checksum, which releases the GIL), another call stores the adjacency of its
    own edge_index. The first must still get the adjacency of its edges, not the other's."""
    from pysparse_hpc.nn._graph import EdgeIndexCache
    cache = EdgeIndexCache()
    edge_index = edge_index_of(graph)
    other = edge_index.flip(0).contiguous()     # the reversed edges: another graph
    kept = cache.get(edge_index, 14)
    checksum = EdgeIndexCache._checksum
    interleaved = []

    def checksum_while_another_call_stores(tensor):
        if tensor is edge_index and not interleaved:
            interleaved.append(cache.get(other, 14))    # the other thread's call
        return checksum(tensor)
    monkeypatch.setattr(EdgeIndexCache, "_checksum",
                        staticmethod(checksum_while_another_call_stores))
    found = cache.get(edge_index, 14)
    assert interleaved
    np.testing.assert_array_equal(found.toarray(), kept.toarray())
    np.testing.assert_array_equal(cache.get(other, 14).toarray(), kept.toarray().T)


@pytest.mark.parametrize("layer", [lambda: nn.GCNConv(3, 2), lambda: nn.GATConv(3, 2),
                                   lambda: nn.AGNNConv()])
def test_edge_weights_passed_as_in_pyg_are_refused_with_the_way_to_pass_them(graph, layer):
    """PyG's layers take edge weights (attributes) third, where ours take num_nodes."""
    edge_index = edge_index_of(graph)
    with pytest.raises(TypeError, match="no per-edge weights.*csr_array"):
        layer()(features(14, 3, dtype=torch.float32), edge_index,
                torch.ones(edge_index.shape[1]))


@pytest.mark.parametrize("fmt", ["edge_index", "mebcrs", "blocked16"])
def test_gcnconv_accepts_every_graph_form(graph, fmt):
    torch.manual_seed(1)
    conv = nn.GCNConv(5, 3).double()
    x = features(14, 5)
    pattern_only = sph.csr_array((np.ones(graph.nnz, np.float32), graph.indices, graph.indptr),
                                 shape=graph.shape)
    if fmt == "edge_index":
        adj = edge_index_of(graph)
        torch.testing.assert_close(conv(x, adj), conv(x, pattern_only))
        cached = conv._edge_cache.get(adj, 14)
        assert conv._edge_cache.get(adj, 14) is cached      # converted once
    else:
        adj = graph.to_mebcrs() if fmt == "mebcrs" else graph.to_blocked(16)
        out = conv(x, adj)
        assert isinstance(conv._normalized_graph(adj, x), type(adj))  # in adj's format
        torch.testing.assert_close(out, conv(x, graph))


def test_gcnconv_cached_keeps_the_first_graph(graph, rng):
    conv = nn.GCNConv(3, 2, cached=True).double()
    x = features(14, 3)
    first = conv(x, graph)
    other = abs(sph.csr_array(random_scipy(rng, (14, 14), 0.5)).to_scipy())
    other = sph.csr_array(other)  # non-negative weights: every degree has a real D^-1/2
    torch.testing.assert_close(conv(x, other), first)
    conv.reset_cache()
    second = conv(x, other)
    assert not torch.allclose(second, first)
    # in another dtype it is still the first graph (it normalized the one passed)
    torch.testing.assert_close(conv.float()(x.float(), graph), second.float())


@pytest.mark.parametrize("normalize", [True, False])
def test_gcnconv_sees_rebound_values_and_keeps_one_normalization_per_graph(graph, normalize,
                                                                           monkeypatch):
    """Rebinding a graph's values (``A.data = new``) is a new graph for every cache, the kept
    Â X included; layers alternating between graphs normalize each once."""
    from pysparse_hpc.nn import gcn as gcn_module
    conv = nn.GCNConv(5, 3, normalize=normalize).double()
    x = features(14, 5)
    adj = graph.astype(np.float64)
    conv(x, adj), conv(x, adj)                      # Â X kept for x
    adj.data = adj.data * 5
    fresh = nn.GCNConv(5, 3, normalize=normalize).double()
    fresh.load_state_dict(conv.state_dict())
    torch.testing.assert_close(conv(x, adj), fresh(x, adj), rtol=0, atol=0)
    calls = []
    monkeypatch.setattr(gcn_module, "gcn_norm", lambda *a, **k: calls.append(1) or
                        nn.gcn_norm(*a, **k))
    other = graph.astype(np.float64)
    other.data = other.data * 2
    for _ in range(5):
        conv(x, adj), conv(x, other)
    assert len(calls) == (1 if normalize else 0)   # adj's is kept from before; other's once


def test_values_written_in_place_are_seen_forward_and_backward(graph):
    """The transpose the backward pass uses and a layer's normalization and kept Â X follow
    values written into the graph's arrays in place, as the forward product does."""
    adj = graph.astype(np.float64)
    x = features(14, 3, grad=True)
    F.spmm(adj, x).sum().backward()
    adj.data *= 10
    assert_spmm_matches_dense(adj, x)
    conv = nn.GCNConv(3, 2, normalize=False).double()
    constant = features(14, 3)
    conv(constant, adj), conv(constant, adj)        # Â X kept
    adj.data[:3] = -1.0
    fresh = nn.GCNConv(3, 2, normalize=False).double()
    fresh.load_state_dict(conv.state_dict())
    torch.testing.assert_close(conv(constant, adj), fresh(constant, adj), rtol=0, atol=0)
    normalized = nn.GCNConv(3, 2).double()
    normalized(constant, adj)
    adj.data[:] = np.abs(adj.data) + 1
    fresh = nn.GCNConv(3, 2).double()
    fresh.load_state_dict(normalized.state_dict())
    torch.testing.assert_close(normalized(constant, adj), fresh(constant, adj), rtol=0, atol=0)


@pytest.mark.parametrize("change", ["in place", "rebound"])
def test_a_graph_changed_between_forward_and_backward_makes_the_backward_raise(graph, change):
    """The backward of a product with the graph's own values reads them again: changed after
    the forward pass, it raises (as torch does for its own tensors) rather than return the
    gradient of another product."""
    adj = graph.astype(np.float64)
    x = features(14, 3, grad=True)
    out = F.spmm(adj, x)
    if change == "in place":
        adj.data *= 10
    else:
        adj.data = adj.data * 10
    with pytest.raises(RuntimeError, match="changed .* after the forward pass"):
        out.sum().backward()
    assert_spmm_matches_dense(adj, x)        # a forward after the change is fine


def test_a_distgraph_is_followed_through_its_local_matrix(graph):
    """Values written into a DistGraph's local matrix, or a local matrix rebound, are seen by
    what the layers keep on the graph (its split for the product, its normalization)."""
    from pysparse_hpc import distributed
    dist = distributed.DistGraph(graph.astype(np.float64), np.zeros(14, np.int64),
                                 distributed.Communicator(None))
    x = features(14, 3)
    before, norm_before = F.spmm(dist, x), nn.gcn_norm(dist).local.toarray()
    dist.local.data *= 2
    torch.testing.assert_close(F.spmm(dist, x), 2 * before)
    assert not np.allclose(nn.gcn_norm(dist).local.toarray(), norm_before)
    dist.local = sph.csr_array(dist.local.to_scipy() * 3)
    torch.testing.assert_close(F.spmm(dist, x), 6 * before)


def test_the_checksum_sees_any_one_changed_word_and_the_tail():
    from pysparse_hpc.kernels.cpu.checksum import checksum
    values = np.random.default_rng(0).random(101).astype(np.float32)   # a 4-byte tail
    before = checksum(values)
    assert checksum(values.copy()) == before
    for position in (0, 50, 100):
        changed = values.copy()
        changed[position] = np.nextafter(changed[position], np.float32(2))
        assert checksum(changed) != before, position
    swapped = values.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert checksum(swapped) != before
    assert checksum(values[:100]) != checksum(values)
    assert checksum(np.zeros(0)) == checksum(np.zeros(0, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_checksum_sees_signs_flipped_in_pairs(dtype):
    """A sign flip changes a word by 2**63, which a weighted sum of words keeps whatever the odd
    weight: two flips cancelled there. ``A.data *= -1`` and flips of any two entries change
    the checksum."""
    from pysparse_hpc.kernels.cpu.checksum import checksum
    values = np.random.default_rng(1).random(64).astype(dtype) + 1
    before = checksum(values)
    assert checksum(-values) != before
    for first, second in [(0, 1), (1, 3), (0, 63), (10, 42)]:
        flipped = values.copy()
        flipped[[first, second]] *= -1
        assert checksum(flipped) != before, (first, second)


def test_negated_values_are_seen_by_the_backward():
    adj = sph.csr_array(np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0], [4.0, 0.0, 0.0]]))
    x = features(3, 2, grad=True)
    F.spmm(adj, x).sum().backward()               # the transpose is built and kept
    adj.data *= -1                                # four float64 words: two pairs of flips
    assert_spmm_matches_dense(adj, x)


def test_a_layer_call_checksums_each_graph_array_once(graph, monkeypatch):
    """The lookups of one layer call (the normalization on the graph; the token of the
    normalized graph for the kept Â X and for the product) share each array's checksum; a
    backward likewise (the token and the transpose). Writes between calls are still seen."""
    from pysparse_hpc.nn import _graph
    summed = []
    monkeypatch.setattr(_graph, "checksum", lambda array: summed.append(id(array)) or
                        hash(array.tobytes()))
    adj = graph.astype(np.float64)
    conv = nn.GCNConv(3, 2).double()
    x = features(14, 3, grad=True)
    out = conv(x, adj)
    assert len(summed) == len(set(summed)) == 6      # adj's 3 arrays, the normalized graph's 3
    summed.clear()
    out.sum().backward()
    assert len(summed) == len(set(summed)) == 6      # the normalized graph's, its transpose's
    adj.data *= 2                                     # between calls: a new normalization
    fresh = nn.GCNConv(3, 2).double()
    fresh.load_state_dict(conv.state_dict())
    torch.testing.assert_close(conv(x, adj), fresh(x, adj), rtol=0, atol=0)


def test_a_pattern_edited_in_place_is_seen_by_the_backward_and_the_layers():
    """The kept transpose and normalization follow the index arrays too: an entry moved to
    another column in place (``A.indices[k] = j``, the pattern still canonical) gave the
    gradient of the old pattern's product."""
    adj = sph.csr_array(np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0], [4.0, 0.0, 0.0]]))
    x = features(3, 2, grad=True)
    F.spmm(adj, x).sum().backward()               # the transpose is built and kept
    adj.indices[2] = 1                            # row 1: its entry moves from column 2 to 1
    assert_spmm_matches_dense(adj, x)
    conv, constant = nn.GCNConv(2, 2).double(), features(3, 2)
    conv(constant, adj)                           # its normalization is kept
    adj.indices[2] = 0
    fresh = nn.GCNConv(2, 2).double()
    fresh.load_state_dict(conv.state_dict())
    torch.testing.assert_close(conv(constant, adj), fresh(constant, adj), rtol=0, atol=0)


def test_index_tensors_kept_on_a_graph_are_made_outside_inference_mode(graph):
    """The attention layers' index tensors (the GPU path's) and the transpose's order are kept
    on the graph: made during an evaluation under inference mode, a later training step
    could not save them for backward."""
    from pysparse_hpc.nn import _backend, _graph
    csr = _graph.pattern(graph)
    with torch.inference_mode():
        kept = [_backend.edge_rows(csr, "cpu"), _backend.edge_cols(csr, "cpu"),
                _graph.transpose(csr).torch_order("cpu")]
    assert not any(tensor.is_inference() for tensor in kept)
    scores = torch.randn(csr.nnz, 2, requires_grad=True)
    _backend.torch_edge_softmax(csr, scores).sum().backward()   # saves the rows for backward
    assert scores.grad is not None


def test_layers_run_under_inference_mode_and_train_after(graph):
    """Nothing made under inference_mode (whose tensors cannot be saved for backward) is
    kept: the layers run there, on a sparse array or an edge_index made there, and train
    after it."""
    graph = sph.csr_array((np.ones(graph.nnz), graph.indices, graph.indptr), shape=graph.shape)
    for layer in (nn.GCNConv(10, 2), nn.GATConv(10, 2, heads=2), nn.AGNNConv()):
        layer = layer.double().eval()   # no dropout: the same output every call
        x = features(14, 10)
        layer(x, graph)
        with torch.inference_mode():
            expected = layer(x, graph)
            torch.testing.assert_close(layer(x, edge_index_of(graph).clone()), expected)
        out = layer(x, graph)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        assert all(p.grad is not None for p in layer.parameters() if p.requires_grad)


def test_layers_and_models_pickle_after_use(graph):
    import io
    import pickle
    x = features(14, 6)
    for module in (nn.GCNConv(6, 3), nn.GATConv(6, 3), nn.AGNNConv(), models.GCN(6, 4, 3),
                   models.GAT(6, 4, 3, heads=2), models.AGNN(6, 4, 3)):
        module = module.double().eval()
        expected = module(x, edge_index_of(graph))
        on_graph = module(x, graph)
        buffer = io.BytesIO()
        torch.save(module, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        torch.testing.assert_close(loaded(x, edge_index_of(graph)), expected)
        # pickle's protocols 0 and 1 skipped the caches' __setstate__ for their empty state:
        # the copies lacked their attributes (AttributeError at the first call)
        for protocol in (0, 1):
            loaded = pickle.loads(pickle.dumps(module, protocol=protocol))
            torch.testing.assert_close(loaded(x, edge_index_of(graph)), expected)
            torch.testing.assert_close(loaded(x, graph), on_graph)


def test_a_graph_pickles_without_what_was_built_from_it(graph):
    """A ``cached=True`` layer keeps its graph, and pickling the layer pickled the graph's
    caches (its normalization, transpose, device copies) too."""
    import pickle
    x = features(14, 6)
    conv = nn.GCNConv(6, 3, cached=True).double()
    expected = conv(x, graph)
    conv(x, graph).sum().backward()
    assert "_nn_cache" in graph.__dict__
    plain = pickle.dumps(nn.GCNConv(6, 3, cached=True).double())
    loaded = pickle.loads(pickle.dumps(conv))
    assert "_nn_cache" not in loaded._first_graph.__dict__
    assert len(pickle.dumps(conv)) < len(plain) + len(pickle.dumps(graph)) + 1000
    torch.testing.assert_close(loaded(x, graph), expected)
    assert "_nn_cache" in graph.__dict__          # the original keeps its own


def test_models_take_an_edge_index(graph):
    graph = sph.csr_array((np.ones(graph.nnz), graph.indices, graph.indptr), shape=graph.shape)
    x = features(14, 6)
    for model in (models.GCN(6, 4, 3), models.GAT(6, 4, 3, heads=2), models.AGNN(6, 4, 3)):
        model = model.double()
        model(x, edge_index_of(graph)).sum().backward()    # training: dropout on
        model.eval()
        torch.testing.assert_close(model(x, edge_index_of(graph)), model(x, graph))


def test_attention_warns_of_repeated_edges_and_gcn_sums_them():
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 2, 2, 1]])
    x = features(3, 4)
    for layer in (nn.GATConv(4, 2), nn.AGNNConv()):
        with pytest.warns(RuntimeWarning, match=r"repeats edges \(1 copies beyond") as caught:
            layer.double()(x, edge_index)
        assert caught[0].filename == __file__     # the caller's line, not torch's Module
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.GATConv(4, 2).double()(x, edge_index[:, [0, 1, 3]])
        nn.GCNConv(4, 2).double()(x, edge_index)


def test_gcnconv_matches_pyg_on_the_same_weights(graph):
    pyg = pytest.importorskip("torch_geometric.nn")
    ours = nn.GCNConv(6, 4).double()
    theirs = pyg.GCNConv(6, 4).double()
    with torch.no_grad():
        theirs.lin.weight.copy_(ours.lin.weight)
        theirs.bias.copy_(torch.randn(4))
        ours.bias.copy_(theirs.bias)
    # Self-loops are added only where missing, as PyG does: the graph has one (node 2).
    ones = sph.csr_array((np.ones(graph.nnz), graph.indices, graph.indptr), shape=graph.shape)
    assert ones.toarray()[2, 2] == 1
    x = features(14, 6)
    torch.testing.assert_close(ours(x, ones), theirs(x, edge_index_of(ones)))
    weighted = graph.astype(np.float64)
    coo = weighted.to_scipy().tocoo()
    expected = theirs(x, edge_index_of(weighted), torch.from_numpy(coo.data))
    torch.testing.assert_close(ours(x, weighted), expected)
    # An edge_index (a float32 graph of ones) with float64 features is normalized in
    # float64, as PyG does: equal to float64 rounding.
    torch.testing.assert_close(ours(x, edge_index_of(ones)), theirs(x, edge_index_of(ones)),
                               rtol=1e-13, atol=1e-13)


# -- GATConv ----------------------------------------------------------------------------------

@pytest.mark.parametrize("concat", [True, False])
def test_gatconv_matches_dense_reference(graph, concat):
    torch.manual_seed(2)
    conv = nn.GATConv(5, 3, heads=2, concat=concat, negative_slope=0.2).double()
    x = features(14, 5)
    h = (x @ conv.lin.weight.T).view(14, 2, 3)
    expected = dense_attention_reference(graph, h, conv.att_src, conv.att_dst, 0.2)
    expected = expected.reshape(14, 6) if concat else expected.mean(1)
    torch.testing.assert_close(conv(x, graph), expected + conv.bias)


def test_gatconv_caches_agree_in_values_and_gradients(graph):
    results = []
    for cache in nn.GAT_CACHES:
        torch.manual_seed(3)
        conv = nn.GATConv(5, 3, heads=2, dropout=0.3, cache=cache).double()
        x = features(14, 5, grad=True)
        torch.manual_seed(4)                     # the same attention dropout for every mode
        out = conv(x, graph)
        out.square().sum().backward()
        results.append((out, x.grad, conv.lin.weight.grad, conv.att_src.grad, conv.att_dst.grad))
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            torch.testing.assert_close(got, want)


def test_gatconv_gradcheck(graph):
    conv = nn.GATConv(4, 2, heads=2).double()
    x = features(14, 4, grad=True)
    assert torch.autograd.gradcheck(lambda x, a: conv(x, graph) * a.sum(),
                                    (x, torch.ones(1, dtype=torch.float64, requires_grad=True)))


def test_gatconv_matches_pyg_on_the_same_weights(graph):
    pyg = pytest.importorskip("torch_geometric.nn")
    ours = nn.GATConv(5, 3, heads=2).double()
    theirs = pyg.GATConv(5, 3, heads=2).double()
    with torch.no_grad():
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())  # PyG's (1, heads, C) attention vectors load
    assert ours.att_src.shape == (2, 3)
    torch.testing.assert_close(ours.att_dst, theirs.att_dst[0], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="size mismatch"):  # other sizes are still refused
        ours.load_state_dict(pyg.GATConv(5, 3, heads=3).double().state_dict())
    x = features(14, 5)
    # PyG removes and re-adds self-loops; ours keeps the stored one: compare on the pattern.
    torch.testing.assert_close(ours(x, graph), theirs(x, edge_index_of(graph)))
    torch.testing.assert_close(ours(x, edge_index_of(graph)), theirs(x, edge_index_of(graph)))


def test_model_state_dict_loads_into_the_same_model_built_from_pyg(graph):
    """``to_pyg_state_dict`` gives each GATConv's attention vectors PyG's leading axis, at any
    depth of the model, and leaves every other entry as it is: PyG's model then computes
    ours."""
    pyg = pytest.importorskip("torch_geometric.nn")
    ours = torch.nn.ModuleDict({"gat": nn.GATConv(5, 3, heads=2),
                                "head": torch.nn.Sequential(nn.GATConv(6, 2, concat=False),
                                                            torch.nn.Linear(2, 2)),
                                "gcn": nn.GCNConv(5, 4)}).double()
    theirs = torch.nn.ModuleDict({"gat": pyg.GATConv(5, 3, heads=2),
                                  "head": torch.nn.Sequential(pyg.GATConv(6, 2, concat=False),
                                                              torch.nn.Linear(2, 2)),
                                  "gcn": pyg.GCNConv(5, 4)}).double()
    with pytest.raises(RuntimeError, match="size mismatch"):  # why the function is needed
        theirs.load_state_dict(ours.state_dict())
    state = nn.to_pyg_state_dict(ours)
    assert list(state) == list(ours.state_dict())
    assert state["head.0.att_src"].shape == (1, 1, 2)
    assert state["gcn.lin.weight"].shape == (4, 5)
    theirs.load_state_dict(state)
    x = features(14, 5)
    edges = edge_index_of(graph)
    torch.testing.assert_close(ours["gat"](x, graph), theirs["gat"](x, edges))
    torch.testing.assert_close(ours["head"][0](ours["gat"](x, graph), graph),
                               theirs["head"][0](theirs["gat"](x, edges), edges))
    back = nn.GATConv(5, 3, heads=2).double()
    back.load_state_dict(nn.to_pyg_state_dict(ours["gat"]))  # and into ours again
    torch.testing.assert_close(back.att_src, ours["gat"].att_src, rtol=0, atol=0)
    with pytest.raises(TypeError, match="load it into the model first"):
        nn.to_pyg_state_dict(ours.state_dict())


# -- AGNNConv ---------------------------------------------------------------------------------

def test_agnnconv_matches_dense_reference_and_pyg(graph):
    conv = nn.AGNNConv().double()
    with torch.no_grad():
        conv.beta.fill_(1.7)
    x = features(14, 4)
    unit = torch.nn.functional.normalize(x, dim=1)
    mask = torch.from_numpy((graph.toarray() != 0) | np.eye(14, dtype=bool))
    scores = (1.7 * unit @ unit.T).masked_fill(~mask, -torch.inf)
    torch.testing.assert_close(conv(x, graph), torch.softmax(scores, dim=1) @ x)
    pyg = pytest.importorskip("torch_geometric.nn")
    theirs = pyg.AGNNConv().double()
    with torch.no_grad():
        theirs.beta.fill_(1.7)
    torch.testing.assert_close(conv(x, graph), theirs(x, edge_index_of(graph)))


def test_agnnconv_gradcheck_and_fixed_beta(graph):
    conv = nn.AGNNConv().double()
    x = features(14, 3, grad=True)
    assert torch.autograd.gradcheck(lambda x: conv(x, graph), (x,))
    assert not any(p.requires_grad for p in nn.AGNNConv(requires_grad=False).parameters())


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", [lambda: nn.GCNConv(3, 2), lambda: nn.GATConv(3, 2),
                                   lambda: nn.AGNNConv()])
@pytest.mark.parametrize("make, error, message", [
    (lambda g, x: (x, sph.csr_array(np.ones((14, 13)))), ValueError, "square"),
    (lambda g, x: (x[:10], g), ValueError, "has 14 nodes but x has 10 rows"),
    (lambda g, x: (x.long(), g), TypeError, "float32 or float64"),
    (lambda g, x: (x[0], g), ValueError, "2-D"),
    (lambda g, x: (x, torch.tensor([[0, 1], [2, 14]])), ValueError, "out of range"),
    (lambda g, x: (x, torch.tensor([[0, -1], [2, 3]])), ValueError, "negative"),
    (lambda g, x: (x, torch.tensor([[0.0, 1.0], [2.0, 3.0]])), TypeError, "int64 or int32"),
    (lambda g, x: (x, torch.tensor([0, 1, 2])), ValueError, r"shape \[2, E\]"),
    (lambda g, x: (x, g.to_scipy()), TypeError,
     "got scipy.sparse's csr_array .wrap it with pysparse_hpc.csr_array"),
])
def test_layers_reject_bad_input_clearly(graph, layer, make, error, message):
    x, adj = make(graph, features(14, 3, dtype=torch.float32))
    with pytest.raises(error, match=message):
        layer()(x, adj)
    with pytest.raises(TypeError, match="num_nodes must be an integer, got float 14.0"):
        layer()(features(14, 3, dtype=torch.float32), edge_index_of(graph), num_nodes=14.0)
    with pytest.raises(ValueError, match="num_nodes must be non-negative, got -1"):
        nn.gcn_norm(edge_index_of(graph), num_nodes=-1)


@pytest.mark.parametrize("layer", [lambda: nn.GCNConv(3, 2), lambda: nn.GATConv(3, 2),
                                   lambda: nn.AGNNConv()])
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_torch_sparse_adj_is_rejected_with_the_conversion(graph, layer, layout):
    """A torch sparse adjacency failed as an edge_index "of float32 node ids"; the message must
    name it and give the conversion, which then works."""
    edge_index = edge_index_of(graph)
    adj = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.shape[1]), (14, 14),
                                  check_invariants=True)
    adj = adj.to_sparse_csr() if layout == "csr" else adj
    x = features(14, 3, dtype=torch.float32)
    conv = layer()
    with pytest.raises(TypeError, match=r"torch sparse tensor.*pysparse_hpc\.csr_array\(adj\)"
                                        r".*coalesce"):
        conv(x, adj)
    # both conversions the message gives (adj's values are ones, as an edge_index's)
    converted = adj.to_sparse_coo().coalesce().indices().flip(0)
    torch.testing.assert_close(conv(x, converted), conv(x, edge_index))
    torch.testing.assert_close(conv(x, sph.csr_array(adj)), conv(x, edge_index))


def test_inputs_are_left_untouched(graph):
    """Layers, gcn_norm and the functional ops read the caller's arrays and never write them."""
    x = features(14, 3, grad=True)
    edge_index = edge_index_of(graph)
    before = ([a.copy() for a in (graph.data, graph.indices, graph.indptr)], x.detach().clone(),
              edge_index.clone())
    nn.gcn_norm(graph)
    nn.gcn_norm(graph, add_self_loops=False)
    for layer in (nn.GCNConv(3, 2).double(), nn.GATConv(3, 2, dropout=0.5).double(),
                  nn.AGNNConv().double()):
        for adj in (graph, graph.to_mebcrs(), edge_index):
            layer(x, adj).square().sum().backward()
    values = torch.ones(F.pattern(graph).nnz, dtype=torch.float64, requires_grad=True)
    F.spmm(graph, x, values=values).sum().backward()
    F.sddmm(graph, x, x).sum().backward()
    for got, want in zip((graph.data, graph.indices, graph.indptr), before[0]):
        np.testing.assert_array_equal(got, want)
    assert torch.equal(x.detach(), before[1]) and torch.equal(edge_index, before[2])
    assert torch.equal(values.detach(), torch.ones_like(values))


def test_layer_options_are_validated():
    with pytest.raises(ValueError, match="order must be one of"):
        nn.GCNConv(3, 2, order="fastest")
    with pytest.raises(ValueError, match="cache must be one of"):
        nn.GATConv(3, 2, cache="all")
    with pytest.raises(ValueError, match="positive int"):
        nn.GCNConv(0, 2)
    with pytest.raises(ValueError, match="dropout"):
        nn.GATConv(3, 2, dropout=1.0)
    with pytest.raises(ValueError, match="negative_slope must be a finite number"):
        nn.GATConv(3, 2, negative_slope=float("nan"))   # every output would be NaN
    assert nn.GCNConv(np.int64(3), 2).in_channels == 3   # NumPy ints, as nn.Linear takes them
    assert nn.GATConv(3, np.int32(2), heads=np.int64(2)).heads == 2


@pytest.mark.parametrize("layer", [nn.GCNConv(3, 2), nn.GATConv(3, 2), nn.AGNNConv()])
def test_nan_features_propagate_and_warn_once(graph, layer):
    x = features(14, 3, dtype=torch.float32)
    x[0, 0] = torch.nan
    with pytest.warns(RuntimeWarning, match="produced NaN") as caught:
        out = layer(x, graph)
    assert caught[0].filename == __file__
    assert torch.isnan(out).any() and not torch.isnan(out).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(x, graph)                           # once per layer


@pytest.mark.parametrize("layer", [nn.GATConv(4, 2, add_self_loops=False),
                                   nn.AGNNConv(add_self_loops=False)])
def test_attention_of_a_nan_node_gives_nan_and_warns(layer):
    """Node 0 has NaN features and hears only nodes 1 and 2: its attention scores are all NaN,
    and its output must be NaN (as in PyG) with the layer's warning, not the uniform mean of
    its neighbours' finite features."""
    x = features(3, 4)
    x[0] = torch.nan
    edge_index = torch.tensor([[1, 2], [0, 0]])
    with pytest.warns(RuntimeWarning, match="produced NaN"):
        out = layer(x, edge_index)
    assert torch.isnan(out[0]).all()


@pytest.mark.parametrize("make", [lambda: nn.GCNConv(8, 3), lambda: nn.GCNConv(
    8, 3, order="transform_first"), lambda: nn.GCNConv(8, 3, order="propagate_first"),
    lambda: nn.GATConv(8, 3, heads=2), lambda: nn.AGNNConv()])
def test_layers_run_under_cpu_autocast_in_float32(graph, make):
    """Under torch.autocast the Linear returns bfloat16 (and einsum did), which the sparse kernels
    refused ("must be float32 or float64"); the layers return float32, as PyG's do."""
    torch.manual_seed(0)
    layer = make()
    x = features(14, 8, dtype=torch.float32, grad=True)
    reference = layer(x, graph)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x, graph)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=0.05, atol=0.05)   # bfloat16's precision
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


# -- training ---------------------------------------------------------------------------------

def mean_test_accuracy(name, seeds=5):
    data = sph.datasets.load("cora")
    x, y, *masks = train.node_tensors(data)
    model_class = models.MODELS[name]
    accuracies = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = model_class(x.shape[1], out_channels=data.num_classes, **model_class.architecture)
        result = train.fit(model, x, data.adj, y, masks, **model_class.training, progress=False)
        accuracies.append(result.test_accuracy)
    return float(np.mean(accuracies))


@pytest.mark.slow
@pytest.mark.parametrize("name, floor", [("gcn", 0.80), ("gat", 0.81)])
def test_cora_accuracy_mean_of_five_seeds(name, floor):
    assert mean_test_accuracy(name) >= floor


def test_layers_under_torch_compile_before_any_eager_call():
    """Dynamo traced into Numba's first dispatch and failed ("exception table entry start
    instruction has no offset") when a compiled layer ran before any eager call in the
    process: a fresh interpreter, so that no kernel has been dispatched yet."""
    import subprocess
    import sys
    script = """
import torch, pysparse_hpc as sph
torch.manual_seed(0)
edge_index = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 0]])
x = torch.randn(4, 5)
for layer in (sph.nn.GCNConv(5, 3), sph.nn.GATConv(5, 3, heads=2), sph.nn.AGNNConv()):
    compiled = torch.compile(layer, backend="eager")(x, edge_index)
    torch.testing.assert_close(compiled, layer(x, edge_index))
print("compiled layers agree")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "compiled layers agree" in done.stdout, done.stderr[-3000:]


# -- models -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("options, error, message", [
    (dict(hidden=0), ValueError, "hidden must be a positive int, got 0"),
    (dict(hidden=-1), ValueError, "hidden must be a positive int, got -1"),
    (dict(in_channels=0), ValueError, "in_channels must be a positive int, got 0"),
    (dict(out_channels=-2), ValueError, "out_channels must be a positive int, got -2"),
    (dict(hidden=4.0), TypeError, "hidden must be an integer, got float 4.0"),
    (dict(dropout=1.5), ValueError, r"dropout must be in \[0, 1\], got 1.5"),
    (dict(dropout=-0.1), ValueError, r"dropout must be in \[0, 1\], got -0.1"),
    (dict(dropout=float("nan")), ValueError, r"dropout must be in \[0, 1\], got nan"),
    (dict(dropout="0.5"), TypeError, "dropout must be a float, got str"),
])
def test_models_refuse_bad_sizes_and_dropout_when_built(name, options, error, message):
    """An AGNN of width 0 was built and ignored its input; a negative width failed in torch
    without the argument's name; GCN named its hidden width "out_channels"; a dropout rate
    outside [0, 1] was refused only by the first training step (never in evaluation)."""
    arguments = dict(in_channels=5, hidden=4, out_channels=3, dropout=0.5)
    arguments.update(options)
    with pytest.raises(error, match=message):
        models.MODELS[name](**arguments)


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_models_reset_parameters_as_a_new_model(graph, name):
    """``model.reset_parameters()`` (PyG's models have it) draws what a new model draws."""
    torch.manual_seed(3)
    fresh = models.MODELS[name](6, 4, 3)
    model = models.MODELS[name](6, 4, 3)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.add_(0.25)
        model(features(14, 6, dtype=torch.float32), graph).sum()
    torch.manual_seed(3)
    model.reset_parameters()
    for key, value in fresh.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


# -- argument types, sparse features, kept graphs -----------------------------------------------

@pytest.mark.parametrize("make, error, message", [
    (lambda: nn.GCNConv(3.0, 2), TypeError, "in_channels must be an integer, got float 3.0"),
    (lambda: nn.GATConv(3, 2, heads=2.0), TypeError, "heads must be an integer, got float"),
    (lambda: nn.GATConv(3, True), TypeError, "out_channels must be an integer, got bool"),
    (lambda: nn.GATConv(3, 2, dropout="0.5"), TypeError, r"dropout must be a float, got str"),
    (lambda: nn.GATConv(3, 2, dropout=True), TypeError, "dropout must be a float, got bool"),
    (lambda: nn.GATConv(3, 2, negative_slope="0.2"), TypeError,
     "negative_slope must be a float, got str"),
    (lambda: nn.GATConv(3, 2, negative_slope=float("inf")), ValueError,
     "negative_slope must be a finite number"),
    (lambda: nn.GCNConv(3, 2, normalize="no"), TypeError, "normalize must be a bool, got str"),
    (lambda: nn.GCNConv(3, 2, cached=1), TypeError, "cached must be a bool, got int"),
    (lambda: nn.GCNConv(3, 2, bias="False"), TypeError, "bias must be a bool, got str"),
    (lambda: nn.GATConv(3, 2, concat="False"), TypeError, "concat must be a bool, got str"),
    (lambda: nn.GATConv(3, 2, add_self_loops=None), TypeError,
     "add_self_loops must be a bool, got NoneType"),
    (lambda: nn.GATConv(3, 2, bias=0), TypeError, "bias must be a bool, got int"),
])
def test_layer_options_of_a_wrong_type_are_type_errors(make, error, message):
    """A float size was a ValueError, a string dropout failed on a comparison without the
    argument's name, and a truthy string flag (``normalize="no"``) silently meant True."""
    with pytest.raises(error, match=message):
        make()
    conv = nn.GATConv(3, 2, concat=np.bool_(False), negative_slope=np.float32(0.5))
    assert conv.concat is False and conv.negative_slope == 0.5


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_gcnconv_takes_sparse_features_on_every_call(graph, layout):
    """Sparse features ran on a first call (transform first) and were refused on the second,
    when the same input switched the layer to propagating it first."""
    dense = features(14, 40).relu()
    x = dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()
    torch.manual_seed(0)
    conv = nn.GCNConv(40, 3).double()
    expected = conv(dense, graph)
    for _ in range(3):
        torch.testing.assert_close(conv(x, graph), expected)
    conv.lin.weight.grad = None
    conv(x, graph).square().sum().backward()
    gradient = conv.lin.weight.grad
    conv.lin.weight.grad = None
    conv(dense, graph).square().sum().backward()
    torch.testing.assert_close(gradient, conv.lin.weight.grad)


def test_cached_gcnconv_names_its_kept_graph_when_the_sizes_differ(graph):
    """A cached=True layer given a graph of another size was refused by the product with a
    message about an adjacency of the kept size, not the one passed."""
    conv = nn.GCNConv(3, 2, cached=True).double()
    conv(features(14, 3), graph)
    smaller = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="x has 3 rows but the graph this cached=True layer "
                                         "keeps from its first call has 14 nodes.*reset_cache"):
        conv(features(3, 3), smaller)
    conv.reset_cache()
    assert conv(features(3, 3), smaller).shape == (3, 2)


@pytest.mark.parametrize("layer", [lambda: nn.GCNConv(3, 2), lambda: nn.GATConv(3, 2),
                                   lambda: nn.AGNNConv()])
def test_layers_refuse_features_on_a_device_without_kernels(graph, layer):
    """Features on the meta device were refused deep in the dispatch, as if a GPU were asked
    for and missing, or as a mismatch with the layer's own tensors."""
    x = torch.empty(14, 3, device="meta")
    with pytest.raises(ValueError, match="x is on device 'meta'; the layers run on CPU or CUDA"):
        layer()(x, graph)
    # an edge_index there: torch's "Cannot copy out of meta tensor" named nothing
    edge_index = torch.empty(2, 5, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="edge_index is on the 'meta' device"):
        layer()(torch.ones(14, 3), edge_index)


@pytest.mark.parametrize("layer", [lambda: nn.GATConv(3, 2, heads=2, add_self_loops=False),
                                   lambda: nn.AGNNConv(add_self_loops=False)])
def test_a_pattern_given_a_repeated_column_in_place_is_summed_as_a_fresh_one(layer):
    """An array's canonical flag, once computed, stays set when its indices are written in
    place; the attention layers trusted it and counted a repeated column twice where the
    same arrays in a new array count it once."""
    dense = np.array([[0, 1, 1, 1], [1, 0, 0, 1], [0, 1, 0, 1], [1, 0, 1, 0]], float)
    adj = sph.csr_array(dense)
    x = features(4, 3)
    torch.manual_seed(0)
    conv = layer().double()
    conv(x, adj)
    assert adj.has_canonical_format
    adj.indices[1] = 1                       # row 0 holds column 1 twice, column 2 no more
    fresh = sph.csr_array((adj.data.copy(), adj.indices.copy(), adj.indptr.copy()),
                          shape=adj.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(conv(x, adj), conv(x, fresh), rtol=0, atol=1e-15)
    assert F.pattern(adj).nnz == F.pattern(fresh).nnz == adj.nnz - 1


def test_gatconv_does_not_warn_of_repeated_self_loops_it_replaces():
    """With self-loops added, PyG's GATConv removes the listed ones and adds one per node, so
    a self-loop listed twice counts once there as here: the warning that the results differ
    was wrong. Without added self-loops PyG counts both copies, and the warning stays."""
    pyg = pytest.importorskip("torch_geometric.nn")
    edge_index = torch.tensor([[0, 1, 1, 1, 2], [1, 2, 1, 1, 1]])   # 1 -> 1 twice
    x = features(3, 4)
    ours, theirs = nn.GATConv(4, 2).double(), pyg.GATConv(4, 2).double()
    ours.load_state_dict(theirs.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index))
    with pytest.warns(RuntimeWarning, match=r"repeats edges \(1 copies beyond"):
        nn.GATConv(4, 2, add_self_loops=False).double()(x, edge_index)
    with pytest.warns(RuntimeWarning, match=r"repeats edges \(1 copies beyond"):
        ours(x, torch.tensor([[0, 1, 1, 1, 2, 2], [1, 2, 1, 1, 1, 1]]))   # and 2 -> 1 twice


def test_agnnconv_does_not_warn_of_repeated_self_loops_it_replaces_and_checks_its_flags():
    """As GATConv: PyG's AGNNConv removes the listed self-loops and adds one per node, so a
    self-loop listed twice counts once in both; its on/off options must be bools."""
    pyg = pytest.importorskip("torch_geometric.nn")
    edge_index = torch.tensor([[0, 1, 1, 1, 2], [1, 2, 1, 1, 1]])   # 1 -> 1 twice
    x = features(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(nn.AGNNConv().double()(x, edge_index),
                                   pyg.AGNNConv().double()(x, edge_index))
    with pytest.warns(RuntimeWarning, match=r"repeats edges \(1 copies beyond"):
        nn.AGNNConv(add_self_loops=False).double()(x, edge_index)
    for flag in ("requires_grad", "add_self_loops"):
        with pytest.raises(TypeError, match=f"{flag} must be a bool, got str 'no'"):
            nn.AGNNConv(**{flag: "no"})


def test_positional_arguments_mean_what_they_mean_in_pyg():
    """GATConv took dropout before negative_slope (PyG: the other way round), so a GAT built
    positionally the PyG way swapped them; GCNConv's third positional argument was bias where
    PyG's is improved (refused by keyword), so GCNConv(in, out, True) was taken silently."""
    conv = nn.GATConv(4, 2, 3, False, 0.3, 0.6, False)
    assert (conv.heads, conv.concat, conv.negative_slope, conv.dropout, conv.add_self_loops) \
        == (3, False, 0.3, 0.6, False)
    with pytest.raises(TypeError, match="positional"):
        nn.GATConv(4, 2, 3, False, 0.3, 0.6, False, "none")
    with pytest.raises(TypeError, match="positional"):
        nn.GCNConv(4, 2, True)
    assert nn.GCNConv(4, 2, bias=False, cached=True).bias is None
    pyg = pytest.importorskip("torch_geometric.nn")
    import inspect
    ours = list(inspect.signature(nn.GATConv).parameters)[:7]
    assert ours == list(inspect.signature(pyg.GATConv).parameters)[:7]
    theirs = list(inspect.signature(pyg.AGNNConv).parameters)[:2]
    assert list(inspect.signature(nn.AGNNConv).parameters)[:2] == theirs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gcn_norm_of_an_array_with_duplicates_is_that_of_its_sum(dtype):
    """Duplicates are summed (in float64) before the degrees: the result is the summed
    graph's, to the bit, and is canonical in fact, not only by its flag (a sort without the
    sum kept both entries, one per duplicate, flagged canonical)."""
    from pysparse_hpc._csr import read_canonical
    cols, indptr = np.array([1, 1, 2, 0, 2, 0, 1]), np.array([0, 3, 5, 7])
    rows = np.repeat(np.arange(3), np.diff(indptr))
    values = np.array([0.5, 0.25, 1.0, 2.0, 1.0, 3.0, 0.5], dtype=dtype)   # sums exact
    duplicated = sph.csr_array((values, cols, indptr), shape=(3, 3))
    assert not read_canonical(duplicated)
    summed = sph.csr_array((values.astype(np.float64), (rows, cols)), shape=(3, 3)).astype(dtype)
    got, expected = nn.gcn_norm(duplicated), nn.gcn_norm(summed)
    assert got.nnz == expected.nnz == 9 and read_canonical(got)
    for name in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))


def test_a_dense_adjacency_tensor_is_named_as_such():
    """A dense adjacency matrix was read as an edge_index and refused for its dtype only."""
    import torch
    layer = nn.GCNConv(4, 2)
    x = torch.ones(5, 4)
    with pytest.raises(TypeError, match=r"adj is a dense \(5, 5\) torch.float32 tensor, which "
                                        r"the layers do not take: pass a sparse array"):
        layer(x, torch.eye(5))
    with pytest.raises(TypeError, match="edge_index must hold int64 or int32 node ids"):
        layer(x, torch.zeros(2, 3))
