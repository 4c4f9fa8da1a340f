"""Checks that run under ``mpiexec -n P`` (launched by tests/test_distributed_mpi.py).

``python checks.py NAME [NAME ...]`` runs the named checks on every rank; a failed assertion
raises, and the library's abort hook ends the whole job with a non-zero status. Rank 0 prints
``PASSED NAME`` after each check that passed on every rank.
"""
import sys
import time

import numpy as np
import torch

import pysparse_hpc as sph
from pysparse_hpc import distributed
from pysparse_hpc.distributed import Communicator, DistGraph, partition
from pysparse_hpc.distributed.training import train
from pysparse_hpc.nn import GATConv, GCNConv
from pysparse_hpc.nn import functional as F

comm = distributed.init()
rank, size = comm.rank, comm.size
ALONE = Communicator(None)  # a one-rank communicator for this process's reference runs


def _option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def on_root_then_broadcast(compute):
    """``compute()`` on rank 0 alone (a one-rank reference), its result on every rank."""
    return comm.bcast(compute() if rank == 0 else None)


def raises_on_every_rank(call, message):
    """``call()`` must raise a ValueError naming ``message`` on every rank."""
    try:
        call()
    except ValueError as exc:
        assert message in str(exc), str(exc)
    else:
        raise AssertionError(f"rank {rank}: no error ({message})")


def check_training():
    """P ranks reproduce the single-process training: every model, dataset, partitioner, in
    float32 (1e-5 relative) and float64 (1e-10), dropout on, same final accuracy."""
    dtype = _option("--dtype", "float32")
    tolerance = 1e-5 if dtype == "float32" else 1e-10
    epochs = 3
    for dataset in _option("--datasets", "cora,citeseer").split(","):
        for model in _option("--models", "gcn,gat,agnn").split(","):
            reference = on_root_then_broadcast(lambda: train(
                dataset, model, "contiguous", epochs=epochs, dtype=dtype, comm=ALONE,
                progress=False))
            for method in ("metis", "contiguous", "random"):
                result = train(dataset, model, method, epochs=epochs, dtype=dtype,
                               progress=False)
                np.testing.assert_allclose(result.losses, reference.losses, rtol=tolerance,
                                           err_msg=f"{dataset} {model} {method} {dtype}")
                assert result.test_accuracy == reference.test_accuracy, (
                    dataset, model, method, result.test_accuracy, reference.test_accuracy)
                if size > 1:
                    assert result.halo_bytes_per_epoch < result.cagnet_bytes_per_epoch
                else:  # one rank exchanges nothing, in either scheme
                    assert result.halo_bytes_per_epoch == result.cagnet_bytes_per_epoch == 0


def check_halo_figures_per_epoch():
    """The halo bytes of an epoch are the same in a shorter and a longer run: the input rows
    GCN exchanges once, when it keeps ``Â X`` (Cora's 1433-wide features), are counted apart,
    where averaged into every epoch they made the figure fall with the number of epochs."""
    short, longer = (train("cora", "gcn", "contiguous", epochs=epochs, progress=False)
                     for epochs in (5, 8))
    if short.ranks == 1:
        assert short.halo_bytes_per_epoch == short.halo_bytes_once == 0
        return
    assert short.halo_bytes_per_epoch == longer.halo_bytes_per_epoch > 0
    # more than ten epochs' worth, the same in both
    assert short.halo_bytes_once == longer.halo_bytes_once > 10 * short.halo_bytes_per_epoch
    assert short.halo_bytes_per_epoch < short.cagnet_bytes_per_epoch


def check_scatter_rows_memory_and_dtypes():
    """The root holds about one more copy of the rows it scatters, not three or four (each
    rank's rows, every part pickled, and MPI's pickled list: rank 0 of a distributed train
    needed 6x the feature matrix); rows of objects and of another byte order still arrive."""
    import tracemalloc
    n = 400 * size
    A = sph.csr_array(np.eye(n, k=1) + np.eye(n, k=-1))
    graph = DistGraph(A, np.random.default_rng(0).integers(0, size, n), comm)
    features = np.arange(n * 2000, dtype=np.float64).reshape(n, 2000) if rank == 0 else None
    tracemalloc.start()
    local = graph.scatter_rows(features)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    expected = np.arange(n * 2000, dtype=np.float64).reshape(n, 2000)[graph.owned]
    assert np.array_equal(local, expected)
    whole_bytes = n * 2000 * 8
    if rank == 0:   # the root's own rows and one other rank's at a time
        assert peak < 1.3 * whole_bytes, (peak, whole_bytes)
    else:
        assert peak < 1.3 * local.nbytes + 100_000, (peak, local.nbytes)
    for array in (np.array([f"node {i}" for i in range(n)], dtype=object),
                  np.array([f"node {i}" for i in range(n)]),
                  np.arange(n * 3, dtype=">i4").reshape(n, 3),
                  np.arange(n) % 2 == 0):
        local = graph.scatter_rows(array if rank == 0 else None)
        assert local.dtype == array.dtype and np.array_equal(local, array[graph.owned]), array


def check_plan_and_placement():
    """Scatter and replicated construction agree; exchanges, gather and scatter move the
    right rows; the bytes counted equal the plan's."""
    cora = sph.datasets.load("cora")
    parts = partition(cora.adj, size, "random", seed=3)
    replicated = DistGraph(cora.adj, parts, comm)
    scattered = DistGraph.scatter(cora.adj if rank == 0 else None, parts if rank == 0 else None,
                                  comm)
    assert np.array_equal(replicated.owned, scattered.owned)
    assert np.array_equal(replicated.halo, scattered.halo)
    assert np.array_equal(replicated.local.indices, scattered.local.indices)
    assert replicated.nnz == scattered.nnz == cora.adj.nnz
    features = np.arange(cora.adj.shape[0] * 3, dtype=np.float64).reshape(-1, 3)
    local = scattered.scatter_rows(features if rank == 0 else None)
    assert np.array_equal(local, features[scattered.owned])
    comm.reset_stats()
    halo = scattered.halo_exchange(local)
    assert np.array_equal(halo, features[scattered.halo])
    received = comm.stats().get("halo", {}).get("bytes_received", 0)
    assert received == parts.halo_sizes[rank] * 3 * 8, (received, parts.halo_sizes[rank])
    add_into = scattered.start_reverse_exchange(np.ones((scattered.n_halo, 3))).wait()
    counts = add_into(np.zeros((scattered.n_local, 3)))
    # Every owned row gets one per rank whose halo holds it.
    expected = np.zeros(cora.adj.shape[0])
    for q in range(size):
        expected[comm.bcast(scattered.halo if rank == q else None, root=q)] += 1
    assert np.array_equal(counts[:, 0], expected[scattered.owned])
    gathered = scattered.gather_rows(local)
    assert (gathered is None) == (rank != 0)
    if rank == 0:
        assert np.array_equal(gathered, features)
    # Scattered from the last rank: rows come from it and go back to it by default (they were
    # gathered on rank 0 while scatter_rows read them from the graph's root).
    last = size - 1
    from_last = DistGraph.scatter(cora.adj if rank == last else None,
                                  parts if rank == last else None, comm, root=last)
    local = from_last.scatter_rows(features if rank == last else None)
    assert np.array_equal(local, features[from_last.owned])
    gathered = from_last.gather_rows(local)
    assert (gathered is None) == (rank != last)
    if rank == last:
        assert np.array_equal(gathered, features)
    on_first = from_last.gather_rows(local, root=0)
    assert (on_first is None) == (rank != 0)
    if rank == 0:
        assert np.array_equal(on_first, features)


def check_ops_match_one_process():
    """spmm, sddmm, edge_softmax and gat_attention on a DistGraph (forward and gradients)
    equal the single-process ops on the rows this rank owns."""
    rng = np.random.default_rng(7)
    n = 61
    A = sph.csr_array(rng.random((n, n)) * (rng.random((n, n)) < 0.08))
    owner = rng.integers(0, size, n)
    graph = DistGraph(A, owner, comm)
    owned = torch.from_numpy(graph.owned)
    x = torch.from_numpy(rng.standard_normal((n, 2, 5)))
    weights = torch.from_numpy(rng.standard_normal((n, 2, 5)))

    def run(adj, rows):
        xs = x[rows].clone().requires_grad_()
        s_dst = xs[:, :, 0].contiguous()
        s_src = xs[:, :, 1].contiguous()
        alpha = F.gat_attention(adj, s_dst, s_src)
        scores = F.sddmm(adj, xs, xs)
        soft = F.edge_softmax(adj, scores)
        out = F.spmm(adj, xs, values=alpha + soft) + F.spmm(adj, xs[:, 0]).unsqueeze(1)
        (out * weights[rows]).sum().backward()
        return out.detach(), xs.grad

    out, grad = run(graph, owned)
    whole_out, whole_grad = on_root_then_broadcast(lambda: run(A, torch.arange(n)))
    torch.testing.assert_close(out, whole_out[owned], rtol=1e-12, atol=1e-12)
    # Gradients of a rank's rows gather contributions from other ranks: compare globally.
    summed = torch.zeros_like(whole_grad)
    summed[owned] = grad
    comm.Allreduce(summed)
    torch.testing.assert_close(summed, whole_grad, rtol=1e-12, atol=1e-12)


def check_second_derivatives_match_one_process():
    """A gradient penalty through spmm with the graph's own values and through GCNConv on a
    DistGraph (the halo exchange and its reverse differentiated again) equals one process's."""
    rng = np.random.default_rng(11)
    n = 37
    A = sph.csr_array(rng.random((n, n)) * (rng.random((n, n)) < 0.1))
    graph = DistGraph(A, rng.integers(0, size, n), comm)
    owned = torch.from_numpy(graph.owned)
    x = torch.from_numpy(rng.standard_normal((n, 3)))
    torch.manual_seed(0)
    layer = GCNConv(3, 2).double()

    def run(adj, rows):
        xs = x[rows].clone().requires_grad_()
        out = F.spmm(adj, xs) * 2 + layer(xs, adj).sum(1, keepdim=True)
        loss = (out ** 2).sum()
        gx, = torch.autograd.grad(loss, xs, create_graph=True)
        penalty = (gx ** 2).sum()
        return torch.autograd.grad(penalty, [xs, layer.lin.weight])

    grad_x, grad_weight = run(graph, owned)
    whole_x, whole_weight = on_root_then_broadcast(lambda: run(A, torch.arange(n)))
    summed = torch.zeros_like(whole_x)
    summed[owned] = grad_x
    comm.Allreduce(summed)
    comm.Allreduce(grad_weight)
    torch.testing.assert_close(summed, whole_x, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(grad_weight, whole_weight, rtol=1e-11, atol=1e-11)


def check_torch_func_grad_matches_one_process():
    """``torch.func.grad`` of a loss in a GCN's and a GAT's parameters, through the halo
    exchange of a DistGraph, summed over the ranks, equals one process's."""
    rng = np.random.default_rng(12)
    n = 29
    A = sph.csr_array(rng.random((n, n)) * (rng.random((n, n)) < 0.15) + np.eye(n))
    graph = DistGraph(A, rng.integers(0, size, n), comm)
    owned = torch.from_numpy(graph.owned)
    x = torch.from_numpy(rng.standard_normal((n, 3)))
    torch.manual_seed(0)
    for layer in (GCNConv(3, 2).double(), GATConv(3, 2, heads=2).double()):
        params = {key: value.detach().clone() for key, value in layer.named_parameters()}

        def loss(params, adj, rows):
            return torch.func.functional_call(layer, params, (x[rows], adj)).square().sum()

        grads = torch.func.grad(loss)(params, graph, owned)
        whole = on_root_then_broadcast(
            lambda: torch.func.grad(loss)(params, A, torch.arange(n)))
        for key, grad in grads.items():
            comm.Allreduce(grad)
            torch.testing.assert_close(grad, whole[key], rtol=1e-11, atol=1e-11)


def check_edge_cases():
    """Ranks without training nodes or halo, isolated nodes, an empty rank, more ranks than
    components: training still reproduces one process."""
    # Two components (nodes 0-9 and 10-19) plus isolated nodes 20-23: with P=3 one rank
    # holds only isolated nodes (no halo, no training node).
    rows = np.concatenate([np.arange(9), np.arange(10, 19)])
    edges = (np.concatenate([rows, rows + 1]), np.concatenate([rows + 1, rows]))
    A = sph.csr_array((np.ones(36, np.float32), edges), shape=(24, 24))
    n = 24
    rng = np.random.default_rng(0)
    train_mask = np.zeros(n, bool)
    train_mask[[0, 3, 12]] = True
    val_mask = np.zeros(n, bool)
    val_mask[[1, 11, 21]] = True
    test_mask = ~(train_mask | val_mask)
    data = sph.datasets.Dataset("toy", A, rng.random((n, 6), dtype=np.float32),
                                rng.integers(0, 2, n), train_mask, val_mask, test_mask, 2)
    layouts = {"blocks": np.minimum(np.arange(n) // 10, size - 1),
               "empty last rank": np.minimum(np.arange(n) // 10, max(size - 2, 0)),
               "all on rank 0": np.zeros(n, np.int64)}
    for model in ("gcn", "gat", "agnn"):
        reference = on_root_then_broadcast(lambda: train(data, model, "contiguous", epochs=3,
                                                         dtype="float64", comm=ALONE,
                                                         progress=False))
        for name, owner in layouts.items():
            parts = partition(A, size, "contiguous") if size == 1 else \
                distributed.Partition.from_owner(A, owner, size)
            result = train(data if rank == 0 else None, model, parts if rank == 0 else None,
                           epochs=3, dtype="float64", progress=False)
            np.testing.assert_allclose(result.losses, reference.losses, rtol=1e-10,
                                       err_msg=f"{model} {name}")


def check_data_parallel():
    """A batch split over the ranks gives the full batch's summed gradient, through several
    buckets, with a parameter unused on some ranks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    extra = torch.nn.Linear(3, 3)  # used only by rank 0
    unused = torch.nn.Linear(3, 3)  # used by no rank: its gradient stays None
    container = torch.nn.ModuleDict({"body": model, "extra": extra, "unused": unused}).double()
    data = torch.randn(30, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 3, (30,), generator=torch.Generator().manual_seed(2))

    def loss_of(rows, use_extra):
        out = container["body"](data[rows])
        if use_extra:
            out = container["extra"](out)
        return torch.nn.functional.cross_entropy(out, target[rows], reduction="sum") / 30

    wrapped = distributed.DataParallel(container, comm, bucket_mb=1e-4, average=False)
    assert len(wrapped.bucket_sizes) > 2
    mine = np.array_split(np.arange(30), size)[rank]
    comm.reset_stats()
    loss_of(mine, rank == 0).backward()
    grads = [None if p.grad is None else p.grad.clone() for p in container.parameters()]
    if size > 1:  # the gradients' bytes, and apart one byte per parameter tensor
        stats = comm.stats()
        parameters = list(container.parameters())
        assert stats["allreduce"]["bytes_sent"] == 8 * sum(p.numel() for p in parameters)
        assert stats[distributed.data_parallel.PARTICIPATION_KIND]["bytes_sent"] == len(
            parameters)
    with wrapped.no_sync():  # the reference runs on rank 0 alone: no allreduce there
        reference = on_root_then_broadcast(lambda: _reference_grads(container, loss_of, size))
    assert unused.weight.grad is None and unused.bias.grad is None
    for got, expected in zip(grads, reference):
        if expected is None:
            assert got is None
        else:
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def check_data_parallel_reduces_each_gradient_once():
    """One backward() can hold two rounds of reductions: a reentrant activation checkpoint
    runs its backward as a pass of its own. The checkpointed layer's gradient, reduced in
    the inner round, was summed again in the outer one (P times the one-process gradient
    with average=False). And a gradient accumulated in no_sync for a parameter that the
    reduced backward does not reach is still reduced."""
    from torch.utils.checkpoint import checkpoint
    data = torch.randn(12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def network():
        torch.manual_seed(0)
        return torch.nn.ModuleDict({"a": torch.nn.Linear(4, 5), "b": torch.nn.Linear(5, 2),
                                    "side": torch.nn.Linear(4, 2)}).double()

    def loss_of(net, rows, reentrant):
        hidden = net["a"](data[rows]).tanh()
        out = checkpoint(net["b"], hidden, use_reentrant=reentrant)
        return (out ** 2).sum() / len(data)       # normalized by the global batch

    mine = np.arange(len(data))[rank::size]
    for reentrant in (True, False):
        reference = network()
        loss_of(reference, np.arange(len(data)), reentrant).backward()
        net = network()
        wrapped = distributed.DataParallel(net, comm, average=False)
        loss_of(wrapped.module, mine, reentrant).backward()
        for name, p in net.named_parameters():
            expected = reference.get_parameter(name).grad
            if expected is None:
                assert p.grad is None, name
            else:
                torch.testing.assert_close(p.grad, expected, rtol=1e-12, atol=1e-14,
                                           msg=f"{name}, use_reentrant={reentrant}")
        del wrapped
    # no_sync accumulation, then a reduced backward that does not reach "side"
    reference = network()
    (reference["side"](data).sum() / len(data)).backward()
    loss_of(reference, np.arange(len(data)), False).backward()
    net = network()
    wrapped = distributed.DataParallel(net, comm, average=False)
    with wrapped.no_sync():
        (net["side"](data[mine]).sum() / len(data)).backward()
    loss_of(net, mine, False).backward()
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.grad, reference.get_parameter(name).grad, rtol=1e-12,
                                   atol=1e-14, msg=name)


def check_data_parallel_sparse():
    """An ``Embedding(sparse=True)`` under `DataParallel`: its gradient is the full batch's,
    still sparse, over the rows any rank looked up (one rank looks up none), and
    ``SparseAdam`` takes it."""
    torch.manual_seed(0)
    model = _Tokens().double()
    tokens = torch.randint(0, 12, (24, 4), generator=torch.Generator().manual_seed(5))
    target = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(6))
    wrapped = distributed.DataParallel(model, comm, average=False)
    mine = (np.array_split(np.arange(24), size - 1)[rank] if rank < size - 1
            else np.arange(0)) if size > 1 else np.arange(24)
    torch.nn.functional.cross_entropy(wrapped(tokens[mine]), target[mine],
                                      reduction="sum").backward()
    got = model.table.weight.grad
    assert got.is_sparse and got.is_coalesced()
    with wrapped.no_sync():
        reference = on_root_then_broadcast(lambda: _sparse_reference(model, tokens, target))
    torch.testing.assert_close(got.to_dense(), reference[0], rtol=1e-12, atol=1e-14)
    assert got.indices()[0].tolist() == reference[1]
    torch.optim.SparseAdam([model.table.weight]).step()


def check_bfloat16():
    """bfloat16 tensors, which MPI cannot add: moved bit for bit, summed in float32 and
    rounded once (the same bits on every rank); `DataParallel` averages a bfloat16 model's
    gradients, and `DistributedLion` keeps its replicas and synchronised momenta equal."""
    every = torch.stack([torch.tensor([0.1, -1.7, 3.3], dtype=torch.bfloat16) * (r + 1)
                         for r in range(size)])
    mine = every[rank]
    comm.reset_stats()
    summed = comm.Allreduce(mine.clone(), kind="bf16")
    assert torch.equal(summed, every.float().sum(0).bfloat16()), (summed, every)
    if size > 1:
        assert comm.stats()["bf16"]["bytes_sent"] == 3 * 4  # float32 crossed
    pending = mine.clone()
    comm.Iallreduce(pending).wait()
    assert torch.equal(pending, summed)
    assert all(torch.equal(other, summed) for other in comm.allgather(summed))
    assert torch.equal(comm.Allreduce(mine.clone(), "max"), every.max(0).values)
    blocks = torch.arange(2 * size, dtype=torch.bfloat16) * 0.3 + rank
    block = torch.empty(2, dtype=torch.bfloat16)
    comm.Reduce_scatter(blocks, block, [2] * size)
    expected = sum(torch.arange(2 * size).float() * 0.3 + r for r in range(size))
    torch.testing.assert_close(block.float(), expected[2 * rank:2 * rank + 2], rtol=1e-2,
                               atol=0)
    gathered = torch.empty(2 * size, dtype=torch.bfloat16)
    comm.Allgatherv(mine[:2], gathered, [2] * size)
    assert torch.equal(gathered.view(size, 2), every[:, :2])
    assert torch.equal(comm.Bcast(mine.clone()), every[0])

    torch.manual_seed(rank)  # different weights: the broadcast makes them rank 0's
    model = torch.nn.Linear(5, 2).to(torch.bfloat16)
    wrapped = distributed.DataParallel(model, comm)
    data = torch.randn(4 * size, 5, generator=torch.Generator().manual_seed(3))
    rows = np.array_split(np.arange(4 * size), size)[rank]
    wrapped(data[rows].bfloat16()).square().sum().backward()
    grads = [model.weight.grad.clone(), model.bias.grad.clone()]
    with wrapped.no_sync():
        reference = on_root_then_broadcast(lambda: _bfloat16_reference(model, data, size))
    for got, expected in zip(grads, reference):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=1e-2)
        assert all(torch.equal(other, got) for other in comm.allgather(got))

    from pysparse_hpc.optim import DistributedLion
    for compression, sync in (("none", "local"), ("votes", "always")):
        optimizer = DistributedLion(model.parameters(), comm, lr=1e-2,
                                    compression=compression, momentum_sync=sync)
        for _ in range(2):
            optimizer.zero_grad()
            with wrapped.no_sync():  # the optimizer agrees on the step itself
                model(data[rows].bfloat16()).square().sum().backward()
            optimizer.step()
        for tensor in [*model.parameters(), *(optimizer.momentum(p) for p in model.parameters())]:
            assert tensor.dtype == torch.bfloat16
            assert all(torch.equal(other, tensor) for other in comm.allgather(tensor.detach()))


def _bfloat16_reference(model, data, parts):
    """The gradients of each rank's rows, taken apart in bfloat16, averaged in float32."""
    grads = []
    for rows in np.array_split(np.arange(len(data)), parts):
        model.zero_grad(set_to_none=True)
        model(data[rows].bfloat16()).square().sum().backward()
        grads.append([model.weight.grad.float(), model.bias.grad.float()])
    model.zero_grad(set_to_none=True)
    return [sum(column) / parts for column in zip(*grads)]


def _sparse_reference(model, tokens, target):
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(tokens), target, reduction="sum").backward()
    grad = model.table.weight.grad.coalesce()
    model.zero_grad(set_to_none=True)
    return grad.to_dense(), grad.indices()[0].tolist()


def _reference_grads(container, loss_of, parts):
    container.zero_grad()
    for part, rows in enumerate(np.array_split(np.arange(30), parts)):
        loss_of(rows, part == 0).backward()
    grads = [None if p.grad is None else p.grad.clone() for p in container.parameters()]
    container.zero_grad()
    return grads


def check_bad_input_on_every_rank():
    """Bad partitions raise the same clear error on every rank (no hang)."""
    cora = sph.datasets.load("cora")
    n = cora.adj.shape[0]
    cases = [(np.zeros(n - 1, np.int64), "has 2707 owners but the graph has 2708"),
             (np.full(n, size, np.int64), f"partition[0] is {size}, outside [0, {size})"),
             (partition(cora.adj, size + 1, "contiguous"),
              f"is for {size + 1} ranks but the communicator has {size}")]
    for bad, message in cases:
        for build in (lambda: DistGraph(cora.adj, bad, comm),
                      lambda: DistGraph.scatter(cora.adj if rank == 0 else None,
                                                bad if rank == 0 else None, comm)):
            try:
                build()
            except ValueError as exc:
                assert message in str(exc), (message, str(exc))
            else:
                raise AssertionError(f"no error for {message}")
    # A partition only rank 0 holds wrongly: the others raise too, naming rank 0.
    good = partition(cora.adj, size, "contiguous")
    try:
        DistGraph.scatter(cora.adj if rank == 0 else None, np.zeros(3) if rank == 0 else None,
                          comm)
    except (TypeError, ValueError) as exc:
        assert rank == 0 or "rank 0" in str(exc), str(exc)
    else:
        raise AssertionError("no error for a float partition")
    DistGraph(cora.adj, good, comm)  # still usable afterwards


def check_review_fixes():
    """Found by a review, each silently wrong or a crash before: partitions that disagree
    between ranks with one weighted sum of owners are refused; a module wrapped twice reduces
    once (the two sets of hooks started reductions in orders that differed between ranks,
    and MPICH aborted); after a backward that raised on every rank, the next one through the
    wrapper is summed again (it never was)."""
    import warnings

    import scipy.sparse as sp
    A = sp.csr_array(sp.diags([np.ones(3), np.ones(3)], [-1, 1], shape=(4, 4)))
    first, second = np.array([0, 1, 1, 0]), np.array([1, 0, 0, 1])
    assert first @ np.arange(1, 5) == second @ np.arange(1, 5)   # the old checksum's blind spot
    if size == 2:
        try:
            DistGraph(A, [first, second][rank], comm)
        except ValueError as exc:
            assert "different graphs or partitions" in str(exc), str(exc)
        else:
            raise AssertionError("two partitions passed as one")

    body = torch.nn.Linear(2, 1, bias=False).double()
    extra = torch.nn.Linear(1, 1, bias=False).double()
    container = torch.nn.ModuleDict(dict(body=body, extra=extra))
    retired = distributed.DataParallel(container, comm, average=False)
    newer = distributed.DataParallel(container, comm, average=False)   # retires the first
    try:
        retired(torch.ones(1, 2))
    except RuntimeError as exc:
        assert "retired" in str(exc)
    else:
        raise AssertionError("the retired wrapper still ran")
    comm.reset_stats()
    out = body(torch.tensor([[1.0 + rank, 1.0]], dtype=torch.float64))
    if rank == 0:
        out = extra(out)   # unused on the other ranks
    out.sum().backward()
    if size > 1:
        # one reduction of the 3 gradient values (two sets of hooks sent them twice)
        assert comm.stats()["allreduce"]["bytes_sent"] == 8 * 3
    del newer   # kept until here: a collected wrapper's hooks go with it, as DDP's reducer
    expected = on_root_then_broadcast(lambda: body.weight.grad.clone())
    torch.testing.assert_close(body.weight.grad, expected)

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("boom")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)).double()
    dp = distributed.DataParallel(model, comm, average=False)
    x = torch.ones(1, 2, dtype=torch.float64) * (rank + 1)
    try:
        model[1](Boom.apply(model[0](x))).sum().backward()
    except RuntimeError:
        pass
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dp(x).sum().backward()
    assert any("raised before it ended" in str(w.message) for w in caught)
    grads = [p.grad.clone() for p in model.parameters()]
    with dp.no_sync():
        model.zero_grad(set_to_none=True)
        local = [None] * size
        for r in range(size):
            model.zero_grad(set_to_none=True)
            model(torch.ones(1, 2, dtype=torch.float64) * (r + 1)).sum().backward()
            local[r] = [p.grad.clone() for p in model.parameters()]
    for got, *each in zip(grads, *local):
        torch.testing.assert_close(got, sum(each))


def check_data_parallel_broadcasts_buffers():
    """As torch DDP by default: each forward with gradients starts from rank 0's buffers
    (BatchNorm's running statistics), then updates them from this rank's batch; a forward
    under no_grad and ``broadcast_buffers=False`` leave each rank its own."""
    import copy
    torch.manual_seed(0)
    batches = [torch.randn(5, 3, dtype=torch.float64) * (1 + rank) + rank for _ in range(3)]
    for broadcast in (True, False):
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)).double()
        wrapped = distributed.DataParallel(model, comm, broadcast_buffers=broadcast)
        wrapped(batches[0]).sum().backward()
        before = comm.bcast(copy.deepcopy(model.state_dict()) if rank == 0 else None)
        if not broadcast:
            before = copy.deepcopy(model.state_dict())
        reference = copy.deepcopy(model)
        reference.load_state_dict(before)
        wrapped(batches[1]).sum().backward()
        reference(batches[1])
        for name, buffer in model.named_buffers():
            torch.testing.assert_close(buffer, dict(reference.named_buffers())[name], rtol=0,
                                       atol=0, msg=f"{name}, broadcast_buffers={broadcast}")
        with torch.no_grad():
            own = copy.deepcopy(model)
            wrapped(batches[2])
            own(batches[2])
        for name, buffer in model.named_buffers():
            assert torch.equal(buffer, dict(own.named_buffers())[name]), name
        if rank == size - 1:   # a rank-local pass (a saliency map) broadcasts nothing
            own = copy.deepcopy(model)
            with wrapped.no_sync():
                wrapped(batches[2]).sum().backward()
            own(batches[2])
            for name, buffer in model.named_buffers():
                assert torch.equal(buffer, dict(own.named_buffers())[name]), name
        wrapped(batches[0]).sum().backward()   # every rank again: the collectives still pair


def check_graph_values_changed_on_some_ranks():
    """Values written into rank 0's local matrix alone: every rank rebuilds what depends on
    every rank's values (the normalization, whose halo degrees come from the peers; GCNConv's
    kept Â X). A rank whose own values did not change kept a result of its peers' old values,
    or left them waiting in the rebuild's exchanges."""
    import copy
    from pysparse_hpc import nn
    from pysparse_hpc.nn import _graph
    adj = sph.datasets.load("cora").adj.astype(np.float64)
    graph = DistGraph(adj, partition(adj, size, "contiguous"), comm)
    x = torch.from_numpy(np.random.default_rng(0).random((adj.shape[0], 4)))
    local_x = torch.from_numpy(graph.local_rows(x.numpy()))
    torch.manual_seed(0)
    layers = [nn.GCNConv(4, 2).double(), nn.GCNConv(4, 2, normalize=False).double()]
    with torch.no_grad():
        for layer in layers:
            layer(local_x, graph), layer(local_x, graph)   # the second keeps Â X
    _graph.with_self_loops(graph)
    if rank == 0:
        graph.local.data *= 3
    changed = adj.to_scipy().tolil()
    for row in np.flatnonzero(partition(adj, size, "contiguous").owner == 0):
        changed[row] = changed[row] * 3
    changed = sph.csr_array(changed.tocsr())
    for layer in layers:
        with torch.no_grad():
            reference, out = copy.deepcopy(layer)(x, changed), layer(local_x, graph)
        np.testing.assert_allclose(out.numpy(), graph.local_rows(reference.numpy()),
                                   rtol=1e-10, atol=1e-14, err_msg=f"normalize={layer.normalize}")
    with_loops = _graph.with_self_loops(graph)
    expected = _graph.with_self_loops(changed)
    np.testing.assert_allclose(with_loops.local.toarray()[:, :graph.n_local],
                               expected.toarray()[graph.owned][:, graph.owned], rtol=0)


def check_features_written_on_some_ranks():
    """Features written in place on rank 0 alone: GCNConv's kept Â X is dropped on every
    rank, which agree on the order and on the SpMM (rank 0 alone recomputing left its peers
    with Â X of its old rows, or waiting in a halo exchange it skipped)."""
    import copy
    from pysparse_hpc import nn
    adj = sph.datasets.load("cora").adj.astype(np.float64)
    parts = partition(adj, size, "contiguous")
    graph = DistGraph(adj, parts, comm)
    x = np.random.default_rng(0).random((adj.shape[0], 4))
    local_x = torch.from_numpy(graph.local_rows(x))
    torch.manual_seed(0)
    layer = nn.GCNConv(4, 2).double()
    with torch.no_grad():
        layer(local_x, graph), layer(local_x, graph)   # the second keeps Â X
        if rank == 0:
            local_x.mul_(2)
        x[parts.owner == 0] *= 2
        reference = copy.deepcopy(layer)(torch.from_numpy(x), adj)
        out = layer(local_x, graph)
    assert layer.last_order == "propagate_first"
    np.testing.assert_allclose(out.numpy(), graph.local_rows(reference.numpy()), rtol=1e-10,
                               atol=1e-14)


def check_separate_contexts():
    """Two `DataParallel` wrappers on one communicator, a branch of one used on rank 0 only:
    their allreduces start in another order there, which paired one wrapper's buckets with
    the other's (wrong sums). Two graphs exchanged in another order on different ranks: their
    halos were swapped (started in one order on some ranks and in another on the others).
    Each now runs in an MPI context of its own."""
    import scipy.sparse as sp

    class Scale(torch.nn.Module):
        def __init__(self, *names):
            super().__init__()
            for name in names:
                self.register_parameter(name, torch.nn.Parameter(torch.randn(3)))

    def make():
        torch.manual_seed(0)
        return torch.nn.ModuleDict({"x": Scale("u", "v"), "y": Scale("w")}).double()

    def loss_of(model, part):
        inputs = torch.randn(3, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(100 + part))
        hidden = model["y"].w * inputs
        out = model["x"].u * hidden + (model["x"].v * hidden if part == 0 else 0)
        return out.pow(2).sum()

    def reference():
        model = make()
        for part in range(size):
            loss_of(model, part).backward()
        return {name: param.grad for name, param in model.named_parameters()}
    expected = on_root_then_broadcast(reference)
    model = make()
    outer = distributed.DataParallel(model["x"], comm, bucket_mb=1e-9, average=False)
    inner = distributed.DataParallel(model["y"], comm, bucket_mb=1e-9, average=False)
    assert outer.comm is comm and inner.comm is comm
    comm.reset_stats()
    loss_of(model, rank).backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-12, atol=0,
                                   msg=f"{name} on rank {rank}")
    if size > 1:   # the wrappers' traffic is counted on the communicator they were given
        assert comm.stats()["allreduce"]["bytes_sent"] == 8 * 9

    path = sp.csr_array(sp.diags([np.ones(size - 1), np.ones(size - 1)], [-1, 1],
                                 shape=(size, size)))
    first, second = (DistGraph(path, np.arange(size), comm) for _ in range(2))
    rows = {first: np.full((1, 1), 10.0 + rank), second: np.full((1, 1), 20.0 + rank)}
    # Both started, in another order on odd ranks, then waited on (blocking exchanges in
    # another order would wait for each other, in any MPI code).
    order = (first, second) if rank % 2 == 0 else (second, first)
    pending = {graph: graph.start_halo_exchange(rows[graph]) for graph in order}
    halos = {graph: pending[graph].wait() for graph in order[::-1]}
    for graph, base in ((first, 10.0), (second, 20.0)):
        np.testing.assert_array_equal(halos[graph].ravel(), base + graph.halo)


def check_many_wrappers_and_graphs():
    """More DataParallel wrappers and graphs, one after another, than MPI has contexts for
    (2048 in MPICH): each frees its context when it is collected (a wrapper's hooks kept it
    alive for good, and the loop ended the job with "Too many communicators")."""
    import scipy.sparse as sp
    path = sp.csr_array(sp.diags([np.ones(size - 1), np.ones(size - 1)], [-1, 1],
                                 shape=(size, size)))
    for step in range(2100):
        wrapped = distributed.DataParallel(torch.nn.Linear(2, 1), comm)
        if step % 700 == 0:
            wrapped(torch.ones(1, 2)).sum().backward()
        if size == 2 or step % 700 == 0:   # graphs' set-up is slow on oversubscribed cores
            graph = DistGraph(path, np.arange(size), comm)
    np.testing.assert_array_equal(graph.halo_exchange(np.full((1, 1), float(rank))).ravel(),
                                  graph.halo)


def check_deep_copies_outlive_the_original():
    """A deep copy of a graph or of a DataParallel model shares the original's MPI context
    (a duplicate of the communicator): it must still work once the original is collected,
    whose release freed that context under the copy ("Invalid communicator")."""
    import copy
    import gc
    adj = sph.datasets.load("cora").adj.astype(np.float64)
    graph = DistGraph(adj, partition(adj, size, "contiguous"), comm)
    x = np.random.default_rng(0).random((adj.shape[0], 3))
    expected = graph.halo_exchange(graph.local_rows(x))
    torch.manual_seed(0)
    model = distributed.DataParallel(torch.nn.Linear(3, 2).double(), comm, average=False)
    twins = copy.deepcopy((graph, model))
    del graph, model
    gc.collect()
    twin_graph, twin_model = twins
    np.testing.assert_array_equal(twin_graph.halo_exchange(twin_graph.local_rows(x)), expected)
    twin_model(torch.full((1, 3), float(rank + 1), dtype=torch.float64)).sum().backward()
    total = size * (size + 1) / 2
    torch.testing.assert_close(twin_model.module.weight.grad,
                               torch.full((2, 3), total, dtype=torch.float64))
    if rank == 0:   # copying is no collective: one rank alone may keep a snapshot
        snapshot = copy.deepcopy(twin_model)
        with snapshot.no_sync():
            snapshot(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
        del snapshot
    twin_model(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
    del twins, twin_graph, twin_model
    gc.collect()   # the shared contexts are freed with their last holder


def _squares_of(model, part):
    """The loss of batch ``part`` (4 x 3 float64 inputs, the same on every rank) for the
    DataParallel checks: the sum of the squared outputs."""
    inputs = torch.randn(4, 3, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(100 + part))
    return model(inputs).pow(2).sum()


def check_unfrozen_after_wrapping():
    """A layer frozen when the model was wrapped and unfrozen later (fine-tuning): its
    gradient is reduced from the next forward on (it had no hook, and each rank stepped with
    its own gradient)."""
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(),
                                   torch.nn.Linear(3, 1)).double()

    def reference():
        model = make()
        for part in range(size):
            _squares_of(model, part).backward()
        return [param.grad for param in model.parameters()]
    expected = on_root_then_broadcast(reference)
    model = make()
    model[0].requires_grad_(False)
    wrapped = distributed.DataParallel(model, comm, average=False)
    model[0].requires_grad_(True)
    _squares_of(wrapped, rank).backward()
    for param, grad in zip(model.parameters(), expected):
        torch.testing.assert_close(param.grad, grad, rtol=1e-12, atol=0)
    model.zero_grad()
    model[2].requires_grad_(False)            # frozen again: its gradient stays None
    _squares_of(wrapped, rank).backward()
    assert model[2].weight.grad is None
    torch.testing.assert_close(model[0].weight.grad, expected[0], rtol=1e-12, atol=0)


def check_wrapped_submodule_of_a_wrapped_model():
    """A head wrapped, then the whole model (unused layer included, so that the model's
    bucket starts only at the end of the backward): the head's gradient was summed twice
    (the model's bucket copied the head wrapper's sum), P times the sum. Each parameter is
    now reduced once, by the newer wrapper, and the earlier takes it back once that one
    is gone."""
    import gc

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
            self.unused = torch.nn.Linear(1, 1)

        def forward(self, inputs):
            return self.head(self.body(inputs))

    def make():
        torch.manual_seed(0)
        return Model().double()

    def reference():
        model = make()
        for part in range(size):
            _squares_of(model, part).backward()
        return {name: param.grad for name, param in model.named_parameters()}
    expected = on_root_then_broadcast(reference)
    for newer_is_the_model in (True, False):
        model = make()
        head = distributed.DataParallel(model.head, comm, average=False)
        whole = distributed.DataParallel(model, comm, average=False)
        if not newer_is_the_model:
            head = distributed.DataParallel(model.head, comm, average=False)
        _squares_of(whole, rank).backward()
        for name, param in model.named_parameters():
            if name.startswith("unused"):
                assert param.grad is None
            else:
                torch.testing.assert_close(param.grad, expected[name], rtol=1e-12, atol=0,
                                           msg=f"{name}, newer wrapper the model: "
                                               f"{newer_is_the_model}")
    del head
    gc.collect()
    model.zero_grad()
    _squares_of(whole, rank).backward()   # the model's wrapper reduces the head again
    torch.testing.assert_close(model.head.weight.grad, expected["head.weight"], rtol=1e-12,
                               atol=0)


def check_errors_of_other_ranks():
    """An error raised on one rank reaches the others as its class where it can be made from
    a message (most), else as a RuntimeError that names it; read-only result buffers are
    refused on every rank (MPI refused them on more than one rank only)."""
    import json
    from pysparse_hpc.distributed._comm import raised_on_every_rank

    class Local(Exception):   # defined in a function: it does not pickle
        pass

    def raise_local():
        raise Local("a class local to a function")
    failures = [lambda: b"\xff".decode("utf-8"), lambda: json.loads("{bad"),
                lambda: {}["key"], raise_local]
    for fail, expected in zip(failures, (RuntimeError, RuntimeError, KeyError, RuntimeError)):
        error = None
        if rank == size - 1:
            try:
                fail()
            except Exception as exc:
                error = exc
        try:
            comm.raise_if_any(error)
        except Exception as raised:
            assert raised_on_every_rank(raised), raised
            if rank != size - 1:
                assert type(raised) is expected, (type(raised), raised)
                assert f"rank {size - 1}" in str(raised), raised
                if expected is RuntimeError:
                    assert "Error" in str(raised) or "Local" in str(raised), raised
        else:
            raise AssertionError("raise_if_any did not raise")
    # on_root: the root's own error travels whole where it pickles, else rebuilt by name.
    last = size - 1
    assert comm.on_root(lambda: ("listed", rank), root=last) == ("listed", last)
    pickled = (UnicodeDecodeError, json.JSONDecodeError, KeyError, RuntimeError)
    for fail, expected in zip(failures, pickled):
        try:
            comm.on_root(fail, root=last)
        except Exception as raised:
            assert raised_on_every_rank(raised), raised
            assert type(raised) is (Local if rank == last and fail is raise_local
                                    else expected), (type(raised), raised)
            if expected is RuntimeError and rank != last:
                assert f"rank {last} raised" in str(raised) and "Local" in str(raised), raised
        else:
            raise AssertionError("on_root did not raise")
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    for call in (lambda: comm.Allreduce(frozen), lambda: comm.Iallreduce(frozen).wait(),
                 lambda: comm.Allgatherv(np.zeros(1), frozen[:size], [1] * size)):
        try:
            call()
        except ValueError as exc:
            assert "read-only" in str(exc), exc
        else:
            raise AssertionError("a read-only result buffer was taken")
    root_only = np.arange(3.0)
    root_only.flags.writeable = rank != 0   # the root's buffer is only read
    comm.Bcast(root_only)
    np.testing.assert_array_equal(root_only, np.arange(3.0))


def check_halo_exchange_of_mismatched_rows():
    """Ranks exchanging halo rows of different dtypes or row shapes: every rank that receives
    from a mismatched peer raises a clear error (a shorter message left part of the halo
    unwritten, silently; a longer one failed with MPI's bare truncation error), and the next
    matched exchange is right."""
    if size == 1:
        return
    import scipy.sparse as sp
    n = 3 * size
    path = sp.csr_array(sp.diags([np.ones(n - 1), np.ones(n - 1)], [-1, 1], shape=(n, n)))
    graph = DistGraph(path, np.arange(n) // 3, comm)
    features = np.arange(n * 2, dtype=np.float64).reshape(n, 2)
    local = graph.local_rows(features)
    for name, rows in (("dtype", local.astype(np.float32) if rank == 0 else local),
                       ("row shape", local[:, :1].copy() if rank == 0 else local),
                       # 4 bytes a row into rows of 16: MPICH's unpacking aborted the job
                       # without a word when the receive was posted as float64
                       ("dtype and row shape",
                        local[:, :1].astype(np.float32) if rank == 0 else local)):
        try:
            graph.halo_exchange(rows)
        except ValueError as exc:
            assert "different dtypes or shapes" in str(exc), str(exc)
            raised = True
        else:
            raised = False
        # a path graph (no wrap-around edge): rank 0's only neighbour is rank 1, and rank 1
        # is also rank 2's
        assert raised == (rank in (0, 1)), f"{name}: rank {rank} raised {raised}"
    np.testing.assert_array_equal(graph.halo_exchange(local), features[graph.halo])


def check_sendrecv_and_counted_object_traffic():
    """Sendrecv refuses a message of another size as Irecv does (a shorter one left the end
    of the buffer unwritten without a word, counted as received); the object collectives and
    the rows scatter_rows and gather_rows move are counted (nothing was)."""
    if size == 1:
        return
    partner = (rank + 1) % size, (rank - 1) % size
    received = np.full(3, -1.0)
    try:
        comm.Sendrecv(np.arange(2.0 if rank == 1 else 3.0), partner[0], received, partner[1])
    except ValueError as exc:
        assert "expected 24 bytes from rank 1 in 'sendrecv' but received 16" in str(exc), exc
        raised = True
    else:
        raised = False
    assert raised == (rank == 2 % size), f"rank {rank} raised {raised}"
    raises_on_every_rank(lambda: comm.raise_if_any(
        None if rank else _value_error(lambda: comm.Sendrecv(received, size, received, 0))),
        "dest must be a rank in")
    comm.reset_stats()
    n = 10 * size
    A = sph.csr_array(np.eye(n, k=1) + np.eye(n, k=-1))
    graph = DistGraph(A, np.arange(n) // 10, comm)
    features = np.arange(n * 4, dtype=np.float64).reshape(n, 4) if rank == 0 else None
    local = graph.scatter_rows(features)
    whole = graph.gather_rows(local)
    stats = comm.stats()
    everyone = comm.allgather(stats)
    for kind in ("scatter", "gather", "allgather", "alltoall"):
        sent = sum(s.get(kind, {}).get("bytes_sent", 0) for s in everyone)
        got = sum(s.get(kind, {}).get("bytes_received", 0) for s in everyone)
        assert sent == got > 0, (kind, sent, got)
    # the rows themselves crossed: at least their bytes, on the root
    if rank == 0:
        np.testing.assert_array_equal(whole, features)
        assert stats["scatter"]["bytes_sent"] >= 8 * 4 * (n - 10), stats
        assert stats["gather"]["bytes_received"] >= 8 * 4 * (n - 10), stats
    else:
        assert stats["scatter"]["bytes_received"] >= 8 * 4 * 10, stats


def _value_error(call):
    """The ValueError ``call()`` raises, or None."""
    try:
        call()
    except ValueError as exc:
        return exc
    return None


def check_gather_rows_of_unlike_ranks():
    """Rows of the wrong length on one rank made that rank raise and the others wait in the
    gather for ever; rows of another dtype were cast to the root's (ints truncated). Both now
    raise on every rank, naming the rank at fault. Sums agree when some ranks pass ints."""
    from pysparse_hpc.distributed._comm import raised_on_every_rank
    from pysparse_hpc.distributed.graph import comm_sum
    import scipy.sparse as sp
    n = 2 * size
    path = sp.csr_array(sp.diags([np.ones(n - 1), np.ones(n - 1)], [-1, 1], shape=(n, n)))
    graph = DistGraph(path, np.arange(n) // 2, comm)
    features = np.arange(n * 2, dtype=np.float64).reshape(n, 2)
    local = graph.local_rows(features)
    last = rank == size - 1
    for rows, message in ((local[:-1] if last else local, "expected the 2 owned rows"),
                          (local.astype(np.int64) if last else local, "the ranks' rows differ")):
        try:
            graph.gather_rows(rows)
        except ValueError as exc:
            assert message in str(exc) and raised_on_every_rank(exc), str(exc)
            assert last or f"rank {size - 1}" in str(exc), str(exc)
        else:
            raise AssertionError("gather_rows took unlike rows")
    gathered = graph.gather_rows(local)
    assert (gathered is None) == (rank != 0)
    if rank == 0:
        np.testing.assert_array_equal(gathered, features)
    assert comm_sum(comm, 0 if last else 0.5) == 0.5 * (size - 1)


def check_fit_refuses_wrong_local_rows_on_every_rank():
    """fit's input check is agreed over the ranks: all raise, naming the rank at fault."""
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit
    cora = sph.datasets.load("cora")
    graph = DistGraph(cora.adj, partition(cora.adj, size, "contiguous"), comm)
    rows = graph.n_local + (1 if rank == size - 1 else 0)
    x = torch.zeros(rows, 5)
    y = torch.zeros(graph.n_local, dtype=torch.int64)
    masks = [torch.ones(graph.n_local, dtype=torch.bool)] * 3
    try:
        fit(models.GCN(5, 4, 2), x, graph, y, masks, epochs=1, progress=False)
    except ValueError as exc:
        assert f"rank {size - 1}" in str(exc) and "x has" in str(exc), str(exc)
    else:
        raise AssertionError("fit accepted features with the wrong number of rows")


def check_wrong_local_rows():
    """Features with the wrong number of local rows on one rank: that rank's ValueError ends
    the job (checked by the test: non-zero status, the message, no hang)."""
    cora = sph.datasets.load("cora")
    graph = DistGraph(cora.adj, partition(cora.adj, size, "contiguous"), comm)
    rows = graph.n_local + (1 if rank == size - 1 else 0)
    F.spmm(graph, torch.zeros(rows, 4))
    comm.Barrier()


def check_rank_raises():
    """One rank raises while the others wait in a collective: the job must end."""
    if rank == size - 1:
        raise RuntimeError("deliberate failure on the last rank")
    comm.Allreduce(np.zeros(1))


def check_rank_exits():
    """One rank calls sys.exit(3) while the others wait in a collective: under ``python -m
    mpi4py``, which the docs advise for such scripts, the job must end (no hook sees
    SystemExit)."""
    if rank == size - 1:
        sys.exit(3)
    comm.Allreduce(np.zeros(1))


def check_rank_hangs_in_data_parallel():
    """The last rank's loss reaches no parameter, so its backward joins no gradient
    allreduce (torch DDP's waits too), and it then hangs: with a timeout, the others end
    the job instead of waiting for ever (the test checks how it ends)."""
    comm.set_timeout(3)
    model = distributed.DataParallel(torch.nn.Linear(4, 2), comm=comm)
    inputs = torch.ones(5, 4)
    if rank == size - 1:
        torch.zeros((), requires_grad=True).backward()
        time.sleep(120)
    else:
        model(inputs).sum().backward()


def check_rank_hangs_before_an_allreduce():
    """The last rank hangs; the others wait in an allreduce, watched by the timeout of the
    environment's PYSPARSE_HPC_COMM_TIMEOUT."""
    if rank == size - 1:
        time.sleep(120)
    comm.Allreduce(np.zeros(2), kind="metric allreduce")


def check_train_command_value_error_on_one_rank():
    """The ``train`` command with a ValueError raised on the last rank alone, in its third
    epoch: the job must end with that rank's message (the test checks how it ends)."""
    from pysparse_hpc.__main__ import main
    from pysparse_hpc.nn import train as trainer
    if rank == size - 1:
        checked = trainer._nonfinite_ranks
        epochs = []

        def failing(*args):
            epochs.append(len(epochs))
            if len(epochs) == 3:
                raise ValueError("deliberate ValueError on the last rank")
            return checked(*args)
        trainer._nonfinite_ranks = failing
    main(["train", "--epochs", "10", "--no-progress", "--threads", "1"])


def check_preconditioned_training():
    """``train(preconditioner=...)`` on P ranks reproduces the one-rank losses (float64,
    curvature every step and every second step; applied by Adam or by SGD with momentum, the
    latter with K-FAC's steps clipped, and SGD alone through `DataParallel`)."""
    for name, interval, optimizer in (("kfac", 1, "adam"), ("kfac", 2, "adam"),
                                      ("kfac", 2, "sgd"), ("shampoo", 3, "adam"),
                                      ("jorge", 2, "adam"), (None, None, "sgd")):
        extra = dict(kl_clip=1e-4) if (name, optimizer) == ("kfac", "sgd") else {}
        if interval is not None:
            extra.update(curvature_interval=interval)
        options = dict(epochs=3, dtype="float64", progress=False, preconditioner=name,
                       optimizer=optimizer, **extra)
        reference = on_root_then_broadcast(
            lambda: train("cora", "gcn", "contiguous", comm=ALONE, **options))
        result = train("cora", "gcn", "metis", **options)
        np.testing.assert_allclose(result.losses, reference.losses, rtol=1e-10,
                                   err_msg=f"{name} every {interval} by {optimizer}")
        assert (result.preconditioner, result.optimizer) == (name, optimizer)
        assert result.kl_clip == extra.get("kl_clip")
        # a preconditioner sums the gradients itself; without one, DataParallel does (over
        # several ranks: one rank sends nothing)
        assert (result.optimizer_bytes_per_epoch > 0) == (name is not None and size > 1)
        assert (result.allreduce_bytes_per_epoch > 0) == (size > 1)


def _precondition_run(make_maker, rows, steps=4, inputs=8, loss_fn=None):
    """SGD steps of an MLP through the ASDL loop on ``rows`` of a 30-example batch (the loss
    a sum over them divided by 30, unless ``loss_fn`` is given); every step's gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(inputs, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 3)).double()
    data = torch.randn(30, inputs, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 3, (30,), generator=torch.Generator().manual_seed(2))

    def summed(output, labels, reduction="mean"):
        total = torch.nn.functional.cross_entropy(output, labels, reduction="sum")
        return total if reduction == "sum" else total / 30

    loss_fn = summed if loss_fn is None else loss_fn
    maker = make_maker(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        placeholder = maker.setup_model_call(model, data[rows])
        maker.setup_loss_call(loss_fn, placeholder, target[rows])
        maker.forward_and_backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return grads


def check_precondition():
    """K-FAC (both KAISA strategies, with and without a moving average, empirical and exact
    Fisher, with kl_clip), the diagonal Fisher, Shampoo (blocks, Adagrad grafting) and Jorge
    (intervals), each of those with both strategies, on a batch split over the ranks give the
    one-process preconditioned gradients. "wide": 30 rows into 96 inputs, which one process inverts
    through the rows (Woodbury) and the ranks, whose factors are summed, densely."""
    from pysparse_hpc import precondition as P
    mine = np.array_split(np.arange(30), size)[rank]
    everything = np.arange(30)
    plain = dict(data_size=30, damping=1e-3)
    ema = dict(data_size=30, damping=1e-3, ema_decay=0.5, curvature_upd_interval=2,
               preconditioner_upd_interval=3)
    cases = [("kfac wide", lambda m, c: P.KfacGradientMaker(
        m, P.PreconditioningConfig(**plain), fisher_type="emp", comm=c), 96)]
    for strategy in ("inverse", "gradient"):
        for fisher in ("emp", "exact"):
            for settings in (plain, ema):
                cases.append((f"kfac {strategy} {fisher} {settings is ema}",
                              lambda m, c, f=fisher, s=settings, st=strategy:
                              P.KfacGradientMaker(m, P.PreconditioningConfig(**s),
                                                  fisher_type=f, comm=c, strategy=st), 8))
    clipping = []   # the makers with kl_clip, to see that they clipped

    def kfac_clipped(model, c, strategy):
        clipping.append(P.KfacGradientMaker(model, P.PreconditioningConfig(**plain),
                                            fisher_type="emp", kl_clip=1e-5, lr=0.1, comm=c,
                                            strategy=strategy))
        return clipping[-1]
    for strategy in ("inverse", "gradient"):
        cases.append((f"kfac {strategy} kl_clip",
                      lambda m, c, st=strategy: kfac_clipped(m, c, st), 8))
    cases.append(("diag gradient", lambda m, c: P.DiagNaturalGradientMaker(
        m, P.PreconditioningConfig(**plain), fisher_type="emp", comm=c, strategy="gradient"),
        8))
    intervals = dict(data_size=30, damping=1e-3, curvature_upd_interval=2,
                     preconditioner_upd_interval=2)
    for strategy in ("inverse", "gradient"):
        cases.append((f"shampoo {strategy}", lambda m, c, st=strategy: P.ShampooGradientMaker(
            m, P.PreconditioningConfig(**plain), block_size=6, grafting="adagrad", comm=c,
            strategy=st), 8))
        cases.append((f"jorge {strategy}", lambda m, c, st=strategy: P.JorgeGradientMaker(
            m, P.PreconditioningConfig(**intervals), comm=c, strategy=st), 8))
    for label, make, inputs in cases:
        reference = on_root_then_broadcast(
            lambda: _precondition_run(lambda m: make(m, ALONE), everything, inputs=inputs))
        got = _precondition_run(lambda m: make(m, comm), mine, inputs=inputs)
        for step, (expected, actual) in enumerate(zip(reference, got)):
            for e, a in zip(expected, actual):
                torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-13,
                                           msg=f"{label}, step {step}")
    assert clipping and all(maker.last_kl_clip_scale < 1 for maker in clipping)


def check_precondition_mean_loss():
    """The loop as documented, with ``F.cross_entropy`` (each rank's mean) on 29 examples
    split unevenly: every step, with or without a curvature update, gives the one-process
    gradients (a rank's mean summed over the ranks was P times the gradient, reweighted by
    the ranks' shares, on steps without one, and on every Shampoo and Jorge step). Shampoo
    without data_size is refused over several ranks, where one process needs none."""
    from pysparse_hpc import precondition as P
    count = 29
    mine = np.array_split(np.arange(count), size)[rank]
    config = dict(data_size=count, damping=1e-3, curvature_upd_interval=2,
                  preconditioner_upd_interval=2)
    cases = {
        "kfac": lambda m, c: P.KfacGradientMaker(m, P.PreconditioningConfig(**config),
                                                 fisher_type="emp", comm=c),
        "kfac gradient exact": lambda m, c: P.KfacGradientMaker(
            m, P.PreconditioningConfig(**config), fisher_type="exact", comm=c,
            strategy="gradient"),
        "diag": lambda m, c: P.DiagNaturalGradientMaker(m, P.PreconditioningConfig(**config),
                                                        fisher_type="emp", comm=c),
        "shampoo": lambda m, c: P.ShampooGradientMaker(m, P.PreconditioningConfig(**config),
                                                       comm=c),
        "jorge gradient": lambda m, c: P.JorgeGradientMaker(
            m, P.PreconditioningConfig(**config), comm=c, strategy="gradient"),
    }
    for label, make in cases.items():
        reference = on_root_then_broadcast(lambda: _precondition_run(
            lambda m: make(m, ALONE), np.arange(count), loss_fn=torch.nn.functional.cross_entropy))
        got = _precondition_run(lambda m: make(m, comm), mine,
                                loss_fn=torch.nn.functional.cross_entropy)
        for step, (expected, actual) in enumerate(zip(reference, got)):
            for e, a in zip(expected, actual):
                torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-13,
                                           msg=f"{label}, step {step}")
    model = torch.nn.Linear(3, 2)
    no_size = P.PreconditioningConfig(damping=1e-3)
    P.ShampooGradientMaker(model, no_size, comm=ALONE)  # one process: the loss as set up
    if size > 1:
        raises_on_every_rank(lambda: P.ShampooGradientMaker(model, no_size, comm=comm),
                             f"over {size} ranks needs PreconditioningConfig.data_size")


class _Tokens(torch.nn.Module):
    """A sparse embedding table (``ignored`` by the makers) under a dense head."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(12, 5, sparse=True)
        self.head = torch.nn.Linear(5, 3)

    def forward(self, tokens):
        return self.head(self.table(tokens).sum(1))


class _UnusedHead(torch.nn.Module):
    """An MLP with a second head no loss ever reaches."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 3))
        self.unused = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.body(x)


def _maker_run(build, make_maker, data, target, rows, steps=3, resume=None, finish=None):
    """SGD steps through the ASDL loop on ``rows`` of ``data`` (a sum over them divided by
    the whole batch), optionally from ``resume = (model, optimizer, maker)`` states; every
    step's gradients (None where a parameter has none), dense."""
    torch.manual_seed(0)
    model = build().double()
    count = len(data)

    def loss_fn(output, labels, reduction="mean"):
        total = torch.nn.functional.cross_entropy(output, labels, reduction="sum")
        return total if reduction == "sum" else total / count

    maker = make_maker(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if resume is not None:
        model.load_state_dict(resume[0])
        optimizer.load_state_dict(resume[1])
        maker.load_state_dict(resume[2])
    grads = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        placeholder = maker.setup_model_call(model, data[rows])
        maker.setup_loss_call(loss_fn, placeholder, target[rows])
        maker.forward_and_backward()
        grads.append([None if p.grad is None else p.grad.to_dense().clone()
                      for p in model.parameters()])
        optimizer.step()
    if finish is not None:
        finish(model, optimizer, maker)
    return grads


def _assert_same_grads(reference, got, label):
    for step, (expected, actual) in enumerate(zip(reference, got)):
        for e, a in zip(expected, actual):
            assert (e is None) == (a is None), f"{label}, step {step}: gradient presence"
            if e is not None:
                torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-13,
                                           msg=f"{label}, step {step}")


def check_precondition_edge_cases():
    """On a split batch the makers give the one-process gradients where a rank holds no
    examples (the diagonal Fisher on a Conv2d, K-FAC on 2-D token input), where no rank
    reaches a layer (Shampoo and Jorge sending preconditioned gradients) and with a sparse
    embedding in ``ignore_modules`` (its gradient summed and kept sparse); a low-rank
    one-process K-FAC state resumes on the ranks and saves a state that loads again; an
    mpi4py communicator is refused by name."""
    from mpi4py import MPI

    from pysparse_hpc import precondition as P
    config = dict(data_size=24, damping=1e-3)
    generator = torch.Generator().manual_seed(3)
    images = torch.randn(24, 2, 6, 6, dtype=torch.float64, generator=generator)
    tokens = torch.randint(0, 12, (24, 4), generator=generator)
    vectors = torch.randn(24, 8, dtype=torch.float64, generator=generator)
    target = torch.randint(0, 3, (24,), generator=generator)
    # the last rank holds no examples
    mine = (np.array_split(np.arange(24), size - 1)[rank] if rank < size - 1
            else np.arange(0)) if size > 1 else np.arange(24)
    cases = [
        ("diag conv, an empty rank", lambda: torch.nn.Sequential(
            torch.nn.Conv2d(2, 3, 3), torch.nn.Flatten(), torch.nn.Linear(48, 3)),
         lambda m, c: P.DiagNaturalGradientMaker(m, P.PreconditioningConfig(**config),
                                                 fisher_type="emp", comm=c), images),
        ("kfac tokens, an empty rank", lambda: torch.nn.Sequential(
            torch.nn.Embedding(12, 5), torch.nn.Flatten(), torch.nn.Linear(20, 3)),
         lambda m, c: P.KfacGradientMaker(m, P.PreconditioningConfig(**config),
                                          fisher_type="emp", comm=c), tokens),
        ("kfac, sparse table ignored", _Tokens,
         lambda m, c: P.KfacGradientMaker(m, P.PreconditioningConfig(
             **config, ignore_modules=[m.table]), fisher_type="emp", comm=c), tokens)]
    for maker in (P.ShampooGradientMaker, P.JorgeGradientMaker):
        cases.append((f"{maker.__name__} gradient, unused head", _UnusedHead,
                      lambda m, c, k=maker: k(m, P.PreconditioningConfig(**config), comm=c,
                                              strategy="gradient"), vectors))
    cases.append(("shampoo, sparse table ignored", _Tokens,
                  lambda m, c: P.ShampooGradientMaker(m, P.PreconditioningConfig(
                      **config, ignore_modules=[m.table]), comm=c), tokens))
    for label, build, make, data in cases:
        reference = on_root_then_broadcast(lambda: _maker_run(
            build, lambda m: make(m, ALONE), data, target, np.arange(24)))
        got = _maker_run(build, lambda m: make(m, comm), data, target, mine)
        _assert_same_grads(reference, got, label)

    # a one-process state whose input factor is held as rows (Woodbury), resumed by the
    # ranks with strategy="gradient": each rank's own state loads again
    wide = torch.randn(24, 96, dtype=torch.float64, generator=generator)

    def build_wide():
        return torch.nn.Sequential(torch.nn.Linear(96, 6), torch.nn.Tanh(),
                                   torch.nn.Linear(6, 3))

    def kfac(model, c, strategy="inverse"):
        return P.KfacGradientMaker(model, P.PreconditioningConfig(**config), fisher_type="emp",
                                   comm=c, strategy=strategy)
    saved = {}

    def keep(model, optimizer, maker):
        saved.update(model=model.state_dict(), optimizer=optimizer.state_dict(),
                     maker=maker.state_dict())
    on_root_then_broadcast(lambda: _maker_run(build_wide, lambda m: kfac(m, ALONE), wide, target,
                                              np.arange(24), steps=1, finish=keep))
    one_process = comm.bcast(saved if rank == 0 else None)
    assert "A_rows" in one_process["maker"]["factors"]["0"]
    resume = (one_process["model"], one_process["optimizer"], one_process["maker"])
    _maker_run(build_wide, lambda m: kfac(m, comm, "gradient"), wide, target, mine, steps=1,
               resume=resume, finish=keep)
    kfac(build_wide().double(), comm, "gradient").load_state_dict(saved["maker"])

    try:
        P.KfacGradientMaker(build_wide(), P.PreconditioningConfig(**config),
                            comm=MPI.COMM_WORLD)
    except TypeError as error:
        assert "mpi4py communicator" in str(error), error
    else:
        raise AssertionError("an mpi4py communicator was accepted")


def check_precondition_state_across_ranks():
    """``consolidated_state_dict()`` of P ranks (Shampoo and Jorge, whose owners alone keep
    the statistics; K-FAC under both strategies) continues in one process, and on the P
    ranks, as the uninterrupted one-process run does; a rank's own state of an owner-held
    maker is refused in one process, naming the way out."""
    from pysparse_hpc import precondition as P
    generator = torch.Generator().manual_seed(4)
    data = torch.randn(24, 8, dtype=torch.float64, generator=generator)
    target = torch.randint(0, 3, (24,), generator=generator)
    mine = np.array_split(np.arange(24), size)[rank]
    config = dict(data_size=24, damping=1e-3, curvature_upd_interval=1,
                  preconditioner_upd_interval=2)

    def build():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 3))
    cases = [("shampoo inverse", lambda m, c: P.ShampooGradientMaker(
        m, P.PreconditioningConfig(**config), block_size=6, grafting="adagrad", comm=c)),
        ("jorge gradient", lambda m, c: P.JorgeGradientMaker(
            m, P.PreconditioningConfig(**config), comm=c, strategy="gradient"))]
    for strategy in ("inverse", "gradient"):
        cases.append((f"kfac {strategy}", lambda m, c, s=strategy: P.KfacGradientMaker(
            m, P.PreconditioningConfig(data_size=24, damping=1e-3, ema_decay=0.5,
                                       curvature_upd_interval=1, preconditioner_upd_interval=2),
            fisher_type="emp", comm=c, strategy=s)))
    for label, make in cases:
        reference = on_root_then_broadcast(lambda: _maker_run(
            build, lambda m: make(m, ALONE), data, target, np.arange(24), steps=5))
        saved = {}

        def keep(model, optimizer, maker):
            saved.update(model=model.state_dict(), optimizer=optimizer.state_dict(),
                         own=maker.state_dict(), whole=maker.consolidated_state_dict())
        _maker_run(build, lambda m: make(m, comm), data, target, mine, finish=keep)
        assert (saved["whole"] is None) == (rank != 0), label
        resume = (saved["model"], saved["optimizer"], comm.bcast(saved["whole"]))
        rest = on_root_then_broadcast(lambda: _maker_run(
            build, lambda m: make(m, ALONE), data, target, np.arange(24), steps=2,
            resume=resume))
        _assert_same_grads(reference[3:], rest, f"{label}: consolidated, then one process")
        rest = _maker_run(build, lambda m: make(m, comm), data, target, mine, steps=2,
                          resume=resume)
        _assert_same_grads(reference[3:], rest, f"{label}: consolidated, then {size} ranks")
        if size > 1 and label != "kfac inverse":
            assert saved["own"]["shard"] == [rank, size], label
            try:
                make(build().double(), ALONE).load_state_dict(saved["own"])
            except ValueError as error:
                assert "consolidated_state_dict()" in str(error), error
            else:
                raise AssertionError(f"{label}: a rank's own state loaded in one process")


def check_checkpoint():
    """Per-rank shards and per-node rows saved asynchronously by P ranks load back bit for bit;
    a corrupt shard on one rank makes every rank fall back to the same older checkpoint; a
    write failing on one rank raises on every rank; per-node state reloads by global id under
    another split and another number of ranks. Needs P >= 2 (rank 1 fails, the last rank
    reloads alone); tests/test_checkpoint.py checks the same paths in one process."""
    import shutil
    import tempfile
    import warnings

    from pysparse_hpc.distributed import Checkpointer
    from pysparse_hpc.distributed import checkpoint as ckpt

    directory = comm.bcast(tempfile.mkdtemp(prefix="checkpoints-") if rank == 0 else None)
    n = 61
    features = np.random.default_rng(0).standard_normal((n, 4))
    owner = np.random.default_rng(1).integers(0, size, n)
    mine = np.flatnonzero(owner == rank)[::-1].copy()  # unsorted ids, as a partition gives

    def shard(step):
        generator = torch.Generator().manual_seed(100 * rank + step)
        return {"rank": rank, "step": step, "w": torch.randn(50, 3, generator=generator),
                "rng": distributed.rng_states()}

    nodes = {"node_ids": mine, "h": features[mine], "t": torch.from_numpy(features[mine] * 2)}
    checkpoints = Checkpointer(directory, keep=3, fingerprint={"n": n, "ranks": size})
    for step in (1, 2):
        checkpoints.save(step, shard(step), shared={"owner": owner}, nodes=nodes)
    assert checkpoints.wait() == 2 and checkpoints.steps() == [1, 2]
    loaded = checkpoints.load()
    assert loaded.step == 2 and loaded.ranks_saved == size
    expected = shard(2)
    assert loaded.shard["rank"] == rank and torch.equal(loaded.shard["w"], expected["w"])
    assert np.array_equal(loaded.shared["owner"], owner)
    assert np.array_equal(loaded.nodes["node_ids"], mine)
    assert np.array_equal(loaded.nodes["h"], features[mine])

    # A bit flipped in the newest checkpoint's last shard: all ranks load step 1.
    comm.Barrier()
    if rank == size - 1:
        path = f"{directory}/step-000000002/rank-{rank:05d}.ckpt"
        with open(path, "r+b") as handle:
            handle.seek(-5, 2)
            byte = handle.read(1)
            handle.seek(-5, 2)
            handle.write(bytes([byte[0] ^ 0x40]))
    comm.Barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = checkpoints.load()
    assert loaded.step == 1 and torch.equal(loaded.shard["w"], shard(1)["w"])
    messages = [str(w.message) for w in caught]
    if rank == 0:   # one warning for the job
        assert len(messages) == 1 and "loading step 1 instead" in messages[0], messages
    else:
        assert messages == [], messages
    assert [step for step, _ in loaded.skipped] == [2], loaded.skipped
    assert f"rank {size - 1}: rank-{size - 1:05d}.ckpt does not match" \
        in loaded.skipped[0][1], loaded.skipped

    # A write that fails on rank 1 only is raised by every rank's wait(); nothing commits.
    original = ckpt._files.write_atomic
    if rank == 1:
        def failing(path, chunks, threads=1):
            raise OSError("disk quota exceeded on rank 1")
        ckpt._files.write_atomic = failing
    try:
        checkpoints.save(3, shard(3), nodes=nodes)
        try:
            checkpoints.wait()
        except OSError as exc:
            assert "disk quota exceeded on rank 1" in str(exc), exc
        else:
            raise AssertionError("the failed write was not raised")
    finally:
        ckpt._files.write_atomic = original
    assert checkpoints.steps() == [1, 2]
    checkpoints.save(3, shard(3), shared={"owner": owner}, nodes=nodes, blocking=True)
    assert checkpoints.load().step == 3

    # Another split of the same P: rank r takes a block of the ids in reverse order.
    wanted = np.array_split(np.arange(n)[::-1], size + 1)[rank]
    loaded = checkpoints.load(node_ids=wanted)
    assert np.array_equal(loaded.nodes["h"], features[wanted])
    assert torch.equal(loaded.nodes["t"], torch.from_numpy(features[wanted] * 2))

    # Another number of ranks: P - 1 ranks in one group, the last rank alone in another.
    group = comm.mpi.Split(int(rank == size - 1), rank)
    try:
        sub = Communicator(group)
        reloaded = Checkpointer(directory, comm=sub, fingerprint={"n": n, "ranks": size})
        wanted = np.array_split(np.random.default_rng(2).permutation(n), sub.size)[sub.rank]
        loaded = reloaded.load(node_ids=wanted)
        assert loaded.step == 3 and loaded.ranks_saved == size and loaded.shard is None
        assert np.array_equal(loaded.nodes["h"], features[wanted])
        assert np.array_equal(loaded.shared["owner"], owner)
        rows = sub.allgather(loaded.nodes["node_ids"])
        assert np.array_equal(np.sort(np.concatenate(rows)), np.arange(n))
    finally:
        group.Free()

    # Per-node state that load() could not gather by node id is refused by save() on every
    # rank: unlike names (or dtypes), an id on two ranks (dense ids: the allreduced bitmap;
    # sparse ones: gathered on rank 0). Such saves committed, and failed at a load.
    unlike = {"node_ids": mine, "h" if rank == 0 else "g": features[mine]}
    retyped = {"node_ids": mine, "h": features[mine].astype(np.float32 if rank else np.float64)}
    dense = {"node_ids": np.union1d(mine, [7]), "h": features[np.union1d(mine, [7])]}
    sparse = {"node_ids": np.array([10 ** 12, 10 ** 13 + rank]), "h": features[:2]}
    for bad, message in ((unlike, "the ranks save unlike per-node state"),
                         (retyped, "the ranks save unlike per-node state"),
                         (dense, "node 7 is saved by more than one rank"),
                         (sparse, "node 1000000000000 is saved by more than one rank")):
        try:
            checkpoints.save(4, shard(4), nodes=bad)
        except ValueError as exc:
            assert message in str(exc), exc
        else:
            raise AssertionError(f"save() took {sorted(bad)} on rank {rank}")
    if rank == 0:
        assert "rank 0 has per-node array 'h' float64 rows (4,) where rank 1 has per-node " \
            "array 'g' float64 rows (4,); save the same names, dtypes and row shapes on every " \
            "rank" in _message_of(lambda: checkpoints.save(4, shard(4), nodes=unlike)), "names"
    else:
        _message_of(lambda: checkpoints.save(4, shard(4), nodes=unlike))
    assert checkpoints.steps() == [1, 2, 3]
    spread = {"node_ids": np.array([10 ** 12 + rank]), "h": features[:1]}  # sparse, disjoint
    checkpoints.save(4, shard(4), nodes=spread, blocking=True)
    assert checkpoints.load(node_ids=[10 ** 12 + size - 1]).nodes["h"].tolist() == \
        features[:1].tolist()
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(directory)


def _message_of(call):
    """The message of the ValueError ``call()`` raises."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    raise AssertionError("no ValueError")


def checks_in(namespace):
    """``{name: function}`` of a module's ``check_<name>`` functions."""
    return {name[len("check_"):]: fn for name, fn in namespace.items()
            if name.startswith("check_")}


def run_named(checks, argv):
    """Run the checks named in ``argv`` in order; rank 0 prints ``PASSED NAME`` after each
    that passed on every rank."""
    for name in [a for a in argv if a in checks]:
        checks[name]()
        comm.Barrier()
        if rank == 0:
            print(f"PASSED {name}", flush=True)


if __name__ == "__main__":
    run_named(checks_in(globals()), sys.argv[1:])
