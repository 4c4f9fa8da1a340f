"""``torch.func`` transforms through `pysparse_hpc.nn.functional` and the GNN layers: grad,
vjp, jacrev and vmap against torch.autograd on the same inputs.

The Numba kernels read the tensors' memory, which the transforms' wrapped tensors do not
expose; every autograd Function of the library therefore receives plain tensors (torch's
``setup_context`` form) and, where batched, takes the batch slice by slice (or, for the
product with the graph's own values, as extra feature columns)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pysparse_hpc as sph  # noqa: E402
from pysparse_hpc.distributed import Communicator, DistGraph  # noqa: E402
from pysparse_hpc.nn import AGNNConv, GATConv, GCNConv  # noqa: E402
from pysparse_hpc.nn import functional as F  # noqa: E402

DOUBLE = torch.float64


def f64(*shape, seed=0):
    return torch.randn(*shape, dtype=DOUBLE, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def adj():
    rng = np.random.default_rng(3)
    dense = rng.random((6, 6)) * (rng.random((6, 6)) < 0.4) + np.eye(6)
    return sph.csr_array(dense)


def operations(adj):
    """Each operation with inputs for it: ``name -> (function, args)``."""
    nnz = F.pattern(adj).nnz
    x, y = f64(6, 3, seed=1), f64(6, 3, seed=2)
    return {
        "spmm": (lambda x: F.spmm(adj, x), (x,)),
        "spmm_values": (lambda values, x: F.spmm(adj, x, values=values),
                        (f64(nnz, seed=3).abs(), x)),
        "spmm_heads": (lambda values, x: F.spmm(adj, x, values=values),
                       (f64(nnz, 2, seed=4), f64(6, 2, 3, seed=5))),
        "sddmm": (lambda x, y: F.sddmm(adj, x, y), (x, y)),
        "edge_softmax": (lambda scores: F.edge_softmax(adj, scores), (f64(nnz, 2, seed=6),)),
        "gat_attention": (lambda s_dst, s_src: F.gat_attention(adj, s_dst, s_src),
                          (f64(6, 2, seed=7), f64(6, 2, seed=8))),
        "gat_attention_scores": (
            lambda s_dst, s_src: F.gat_attention(adj, s_dst, s_src, keep="scores"),
            (f64(6, 2, seed=7), f64(6, 2, seed=8))),
        "dropout": (lambda x: F.dropout(x, 0.3), (x,)),
    }


OPERATIONS = ["spmm", "spmm_values", "spmm_heads", "sddmm", "edge_softmax", "gat_attention",
              "gat_attention_scores", "dropout"]


@pytest.mark.parametrize("name", OPERATIONS)
def test_jacrev_equals_autograds_jacobian(adj, name):
    """jacrev is vmap over vjp: both the backward and the batched backward run."""
    function, args = operations(adj)[name]
    argnums = tuple(range(len(args)))
    torch.manual_seed(0)  # dropout's mask: the same seed for both
    jacobians = torch.func.jacrev(function, argnums=argnums)(*args)
    torch.manual_seed(0)
    expected = torch.autograd.functional.jacobian(function, args)
    for jacobian, reference in zip(jacobians, expected):
        torch.testing.assert_close(jacobian, reference)


@pytest.mark.parametrize("name", OPERATIONS)
def test_vmap_equals_a_loop(adj, name):
    function, args = operations(adj)[name]
    first, rest = args[0], args[1:]
    batch = torch.stack([first, 2 * first, -first])
    torch.manual_seed(0)
    batched = torch.func.vmap(lambda a: function(a, *rest), randomness="same")(batch)
    expected = []
    for a in batch:
        torch.manual_seed(0)
        expected.append(function(a, *rest))
    torch.testing.assert_close(batched, torch.stack(expected))
    # a batch dimension that is not the first, and a batched second argument
    if len(args) == 2:
        batch = torch.stack([args[1], 3 * args[1]], dim=1)
        batched = torch.func.vmap(lambda b: function(first, b), in_dims=1)(batch)
        torch.testing.assert_close(batched[1], function(first, 3 * args[1]))


def layers():
    torch.manual_seed(0)
    return {"gcn": GCNConv(3, 4).double(),
            "gat": GATConv(3, 2, heads=2, dropout=0.2).double(),
            "agnn": AGNNConv(requires_grad=True).double()}


@pytest.mark.parametrize("name", ["gcn", "gat", "agnn"])
@pytest.mark.parametrize("graph", ["csr", "distgraph"])
def test_grad_of_a_functional_call_equals_autograd(adj, name, graph):
    """A meta-learning step: ``torch.func.grad`` of a loss in the layer's parameters (and
    its input), in training mode (GAT's attention dropout included), on a one-process
    graph and on a one-rank DistGraph."""
    layer = layers()[name]
    operand = adj
    if graph == "distgraph":
        operand = DistGraph(adj, np.zeros(6, np.int64), Communicator(None))
    params = {key: value.detach().clone() for key, value in layer.named_parameters()}
    x = f64(6, 3, seed=1)

    def loss(params, x):
        out = torch.func.functional_call(layer, params, (x, operand))
        return out.square().sum()

    torch.manual_seed(1)
    grads = torch.func.grad(loss, argnums=(0, 1))(params, x)
    leaves = {key: value.clone().requires_grad_() for key, value in params.items()}
    x_leaf = x.clone().requires_grad_()
    torch.manual_seed(1)
    expected = torch.autograd.grad(loss(leaves, x_leaf), [*leaves.values(), x_leaf])
    for got, reference in zip([*grads[0].values(), grads[1]], expected):
        torch.testing.assert_close(got, reference)


def test_vjp_and_jacrev_of_a_layer(adj):
    layer = layers()["gat"].eval()
    x = f64(6, 3, seed=1)
    out, vjp = torch.func.vjp(lambda x: layer(x, adj), x)
    cotangent = f64(*out.shape, seed=2)
    leaf = x.clone().requires_grad_()
    expected, = torch.autograd.grad(layer(leaf, adj), leaf, cotangent)
    torch.testing.assert_close(vjp(cotangent)[0], expected)
    torch.testing.assert_close(torch.func.jacrev(lambda x: layer(x, adj))(x),
                               torch.autograd.functional.jacobian(lambda x: layer(x, adj), x))


def test_grad_of_grad(adj):
    """The product with the graph's own values is linear and differentiates again under
    torch.func as under autograd (a Hessian-vector product); a once-differentiable
    operation refuses a nested grad with the error autograd gives."""
    x = f64(6, 3, seed=1)

    def gcn_loss(x):
        return F.spmm(adj, x).sin().sum()

    def gradient_norm(loss):
        return lambda x: torch.func.grad(loss)(x).square().sum()

    leaf = x.clone().requires_grad_()
    inner, = torch.autograd.grad(gcn_loss(leaf), leaf, create_graph=True)
    expected, = torch.autograd.grad(inner.square().sum(), leaf)
    torch.testing.assert_close(torch.func.grad(gradient_norm(gcn_loss))(x), expected)
    with pytest.raises(RuntimeError, match="differentiate twice through sddmm"):
        torch.func.grad(gradient_norm(lambda x: F.sddmm(adj, x, x).sin().sum()))(x)


@pytest.mark.parametrize("name", ["gcn", "gat", "agnn"])
def test_vmap_of_layers_ensembles_and_per_sample_gradients(adj, name):
    """The torch.func recipes: a layer vmapped over feature matrices, an ensemble of layers
    (``stack_module_state``, the parameters batched), and per-sample gradients (vmap of grad).
    The layers' NaN warning reads the output's values, which vmap does not expose: it is
    skipped there."""
    torch.manual_seed(0)
    models = [layers()[name].eval() for _ in range(3)]
    for model in models[1:]:
        for parameter in model.parameters():
            parameter.data.normal_()
    features = torch.stack([f64(6, 3, seed=seed) for seed in range(3)])
    batched = torch.func.vmap(lambda x: models[0](x, adj))(features)
    torch.testing.assert_close(batched, torch.stack([models[0](x, adj) for x in features]))

    params, buffers = torch.func.stack_module_state(models)

    def call(params, buffers, x):
        return torch.func.functional_call(models[0], (params, buffers), (x, adj))

    ensemble = torch.func.vmap(call, in_dims=(0, 0, None))(params, buffers, features[0])
    torch.testing.assert_close(ensemble, torch.stack([model(features[0], adj)
                                                      for model in models]))

    own = {key: value.detach() for key, value in models[0].named_parameters()}

    def loss(params, x):
        return torch.func.functional_call(models[0], params, (x, adj)).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(own, features)
    for index, x in enumerate(features):
        for key, grad in torch.func.grad(loss)(own, x).items():
            torch.testing.assert_close(per_sample[key][index], grad)


def test_an_empty_batch(adj):
    """vmap over a batch of none: the slice-by-slice rule read its first result."""
    x, nnz = f64(6, 3, seed=1), F.pattern(adj).nnz
    empty = torch.randn(0, 6, 3, dtype=DOUBLE)
    assert torch.func.vmap(lambda t: F.sddmm(adj, t, x))(empty).shape == (0, nnz)
    assert torch.func.vmap(lambda t: F.spmm(adj, t))(empty).shape == (0, 6, 3)
    scores = torch.randn(0, 6, 2, dtype=DOUBLE)
    assert torch.func.vmap(lambda s: F.gat_attention(adj, s, s))(scores).shape == (0, nnz, 2)


def test_the_product_operator_under_vmap():
    """``A @ v`` and ``v @ A`` under ``vmap`` went to the kernels' path, which cannot read a
    batched tensor ("Cannot access data pointer of Tensor that doesn't have storage")."""
    A = sph.csr_array(np.array([[0.0, 2.0, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0],
                                [0.0, 0.0, -1.0, 0.5]], dtype=np.float32))
    dense = torch.from_numpy(A.toarray())
    X, Y, Z = torch.randn(5, 4), torch.randn(5, 3), torch.randn(5, 4, 2)
    torch.testing.assert_close(torch.vmap(lambda v: A @ v)(X), X @ dense.T)
    torch.testing.assert_close(torch.vmap(lambda v: v @ A)(Y), Y @ dense)
    torch.testing.assert_close(torch.vmap(lambda v: A @ v)(Z), dense @ Z)
    X.requires_grad_()
    torch.vmap(lambda v: A @ v)(X).square().sum().backward()
    torch.testing.assert_close(X.grad, 2 * (X @ dense.T) @ dense)
