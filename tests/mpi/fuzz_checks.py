"""Differential checks of the distributed layer under ``mpiexec -n P`` (launched by
tests/test_fuzz_distributed_mpi.py): on seeded random small graphs (isolated nodes, empty rows,
self-loops, directed edges, a hub, fewer nodes than ranks, components on one rank) and
partitions (contiguous, random, every node on one rank, a rank without nodes, unbalanced), P
ranks reproduce the one-process results; bad input on one rank raises on every rank.

``python fuzz_checks.py NAME [NAME ...]`` runs the named checks on every rank; a failed
assertion raises, and the library's abort hook ends the whole job with a non-zero status. Rank 0
prints ``PASSED NAME`` after each check that passed on every rank.
"""
import sys
import warnings

import numpy as np
import scipy.sparse as sp
import torch

from checks import ALONE, checks_in, comm, raises_on_every_rank, rank, run_named, size

import pysparse_hpc as sph
from pysparse_hpc import distributed
from pysparse_hpc.distributed import DistGraph, Partition, partition
from pysparse_hpc.distributed.graph import comm_sum
from pysparse_hpc.distributed.training import train
from pysparse_hpc.nn import AGNNConv, GATConv, GCNConv, gcn_norm

GRAPHS = ("random", "isolated", "empty_rows", "self_loops", "directed", "hub", "tiny",
          "components")
OWNERS = ("contiguous", "random", "all_on_0", "all_on_last", "one_empty", "unbalanced")


def random_graph(rng, kind):
    """A seeded scipy CSR graph (float64 values) of one of `GRAPHS`; every rank draws the same
    one from the same seed."""
    n = int(rng.integers(1, size + 1)) if kind == "tiny" else int(rng.integers(4, 24))
    dense = rng.random((n, n)) * (rng.random((n, n)) < 0.15)
    if kind != "self_loops":
        np.fill_diagonal(dense, 0)
    else:
        dense[np.diag_indices(n)] = rng.random(n) + 0.1
    if kind == "isolated":
        alone = rng.choice(n, max(1, n // 3), replace=False)
        dense[alone], dense[:, alone] = 0, 0
    elif kind == "empty_rows":
        dense[rng.choice(n, max(1, n // 2), replace=False)] = 0
    elif kind == "hub":
        hub = int(rng.integers(n))
        dense[hub], dense[:, hub] = rng.random(n) + 0.1, rng.random(n) + 0.1
    elif kind == "components":
        cut = int(rng.integers(1, n))
        dense[:cut, cut:], dense[cut:, :cut] = 0, 0
    if kind not in ("directed", "empty_rows"):
        dense = np.maximum(dense, dense.T)
    return sp.csr_array(dense)


def random_owner(rng, adj, how):
    """An owner array of one of `OWNERS` for ``size`` ranks."""
    n = adj.shape[0]
    if how in ("contiguous", "random"):
        return partition(adj, size, how, seed=int(rng.integers(100))).owner
    if how == "all_on_0":
        return np.zeros(n, np.int64)
    if how == "all_on_last":
        return np.full(n, size - 1, np.int64)
    if how == "one_empty":
        empty = int(rng.integers(size))
        return rng.choice([q for q in range(size) if q != empty] or [0], n).astype(np.int64)
    return rng.choice(size, n, p=rng.dirichlet(np.full(size, 0.3))).astype(np.int64)


def cases(count, seed):
    """``count`` seeded (rng, graph, owner, label) cases cycling through the kinds."""
    for i in range(count):
        rng = np.random.default_rng(seed + i)
        kind, how = GRAPHS[i % len(GRAPHS)], OWNERS[(i // len(GRAPHS) + i) % len(OWNERS)]
        adj = random_graph(rng, kind)
        yield rng, adj, random_owner(rng, adj, how), f"case {i}: {kind} graph, {how} owners"


def summed_rows(n, owned, rows):
    """The (n, ...) global array of every rank's ``rows`` (owned ids ``owned``), summed."""
    full = np.zeros((n,) + rows.shape[1:])
    full[owned] = rows
    return comm.Allreduce(full)


def check_graph_and_exchanges():
    """Construction (replicated and scattered), the halo exchange in several dtypes and row
    shapes, the reverse exchange into NumPy and torch rows, scatter and gather of rows from
    any root, and sums over the ranks reproduce the global arrays."""
    for rng, A, owner, label in cases(10, 100):
        n = A.shape[0]
        graph = DistGraph(sph.csr_array(A), owner, comm)
        scattered = DistGraph.scatter(A if rank == 0 else None, owner if rank == 0 else None,
                                      comm)
        mine = np.flatnonzero(owner == rank)
        for g in (graph, scattered):
            assert np.array_equal(g.owned, mine), label
            assert g.nnz == A.nnz, label
            np.testing.assert_array_equal(g.local.toarray(),
                                          A.toarray()[np.ix_(mine, g.column_ids)], label)
        referenced = np.unique(A[mine].tocoo().col) if mine.size else np.zeros(0, np.int64)
        assert np.array_equal(np.sort(graph.halo), referenced[owner[referenced] != rank]), label
        for dtype, row in ((np.float64, (3,)), (np.int8, (2, 2)), (np.complex64, ()),
                           (np.bool_, (0,))):
            rows = (np.arange(n * int(np.prod(row, dtype=int))) % 5).reshape((n,) + row)
            rows = rows.astype(dtype)
            np.testing.assert_array_equal(graph.halo_exchange(rows[mine]), rows[graph.halo],
                                          label)
            strided = torch.from_numpy(np.repeat(rows[mine], 2, axis=0))[::2]
            np.testing.assert_array_equal(scattered.halo_exchange(strided), rows[graph.halo],
                                          label)
        sent = np.random.default_rng(rank).standard_normal((graph.n_halo, 2))
        add_into = graph.start_reverse_exchange(sent).wait()
        expected = np.zeros((n, 2))
        np.add.at(expected, graph.halo, sent)
        expected = comm.Allreduce(expected)[mine]
        np.testing.assert_allclose(add_into(np.zeros((mine.size, 2))), expected, atol=1e-12)
        np.testing.assert_allclose(add_into(torch.zeros(mine.size, 2, dtype=torch.float64)),
                                   expected, atol=1e-12)
        x = rng.standard_normal((n, 3))
        for root in range(size):
            np.testing.assert_array_equal(
                graph.scatter_rows(x if rank == root else None, root=root), x[mine])
            gathered = scattered.gather_rows(torch.from_numpy(x[mine]), root=root)
            assert (gathered is None) == (rank != root)
            if rank == root:
                np.testing.assert_array_equal(gathered, x)
        assert graph.allreduce_sum(graph.n_local) == n
        assert graph.allreduce_sum(0 if rank else 0.5) == 0.5


def check_layers_match_one_process():
    """gcn_norm (with and without self-loops), GCNConv, GATConv (concatenated and averaged
    heads) and AGNNConv on a DistGraph, forward and gradients in float64, equal the
    single-process results on this rank's rows."""
    warnings.simplefilter("ignore", RuntimeWarning)  # isolated nodes of the random graphs
    layers = (lambda: GCNConv(4, 3), lambda: GATConv(4, 3, heads=2),
              lambda: GATConv(4, 2, heads=2, concat=False, cache="none"), AGNNConv)
    for rng, A, owner, label in cases(10, 200):
        n = A.shape[0]
        graph = DistGraph(sph.csr_array(A), owner, comm)
        mine = torch.from_numpy(graph.owned)
        for loops in (True, False):
            whole = gcn_norm(sph.csr_array(A), add_self_loops=loops, dtype=np.float64)
            local = gcn_norm(graph, add_self_loops=loops, dtype=np.float64)
            np.testing.assert_allclose(
                local.local.toarray(),
                whole.toarray()[np.ix_(graph.owned, local.column_ids)], atol=1e-14,
                err_msg=label)
        x = torch.from_numpy(rng.standard_normal((n, 4)))
        weights = torch.from_numpy(rng.standard_normal((n, 6)))
        for make in layers:
            results = []
            for adj, rows in ((sph.csr_array(A), torch.arange(n)), (graph, mine)):
                torch.manual_seed(3)
                layer = make().double()
                xs = x[rows].clone().requires_grad_()
                out = layer(xs, adj)
                (out * weights[rows, :out.shape[1]]).sum().backward()
                results.append((out.detach(), xs.grad, [p.grad for p in layer.parameters()]))
            (out, x_grad, grads), (got, got_x_grad, got_grads) = results
            torch.testing.assert_close(got, out[mine], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(summed_rows(n, graph.owned, got_x_grad.numpy()),
                                       x_grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=label)
            for grad, got_grad in zip(grads, got_grads):
                got_grad = torch.zeros_like(grad) if got_grad is None else got_grad.clone()
                torch.testing.assert_close(comm.Allreduce(got_grad), grad, rtol=1e-9,
                                           atol=1e-12)


def check_collectives_of_odd_buffers():
    """The communicator's collectives on empty, 0-d and multi-dimensional buffers of bools,
    small and unsigned integers, float16, bfloat16 and complex numbers, NumPy and torch."""
    def mine_of(dtype, shape, r):
        base = (np.arange(int(np.prod(shape, dtype=int))) * 3 + 5 * r) % 4
        if isinstance(dtype, torch.dtype):
            values = torch.from_numpy(base.astype(np.float64)).reshape(shape)
            return (values % 2).bool() if dtype == torch.bool else values.to(dtype)
        return (base % 2 if dtype == np.bool_ else base).astype(dtype).reshape(shape)

    def numpy_of(values):
        return values.float().numpy() if values.dtype == torch.bfloat16 else np.asarray(values)

    for dtype in (np.bool_, np.int8, np.uint16, np.float16, np.complex64, torch.bool,
                  torch.uint8, torch.float16, torch.bfloat16, torch.complex128):
        for shape in ((0,), (), (2, 3), (3, 0)):
            every = [numpy_of(mine_of(dtype, shape, r)) for r in range(size)]
            op = "lor" if every[0].dtype == np.bool_ else "sum"
            want = np.any(every, 0) if op == "lor" else np.sum(every, 0).astype(every[0].dtype)
            got = comm.Allreduce(mine_of(dtype, shape, rank), op)
            np.testing.assert_array_equal(numpy_of(got), want, f"{dtype} {shape}")
            root = size - 1
            got = comm.Bcast(mine_of(dtype, shape, rank), root=root)
            np.testing.assert_array_equal(numpy_of(got), every[root])
            counts = [r % 3 for r in range(size)]
            block = mine_of(dtype, (counts[rank],), rank)
            gathered = comm.Allgatherv(block, block.new_zeros(sum(counts)) if isinstance(
                block, torch.Tensor) else np.zeros(sum(counts), block.dtype), counts)
            np.testing.assert_array_equal(numpy_of(gathered), np.concatenate(
                [numpy_of(mine_of(dtype, (c,), r)) for r, c in enumerate(counts)]))


def check_data_parallel_matches_one_process():
    """Bucketed DataParallel (tiny and default buckets, summed and averaged, float32 and
    float64) gives the one-process gradient of the whole batch, split unevenly over the
    ranks (one rank may get no rows), with a layer some ranks skip and one no rank uses."""
    for i, (dtype, average, bucket_mb) in enumerate(
            [(torch.float64, False, 1e-6), (torch.float64, True, 25.0),
             (torch.float32, True, 5e-5), (torch.float32, False, 1e-6)]):
        rng = np.random.default_rng(300 + i)
        torch.manual_seed(i)
        model = torch.nn.ModuleDict({
            "body": torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(),
                                        torch.nn.Linear(5, 2)),
            "side": torch.nn.Linear(2, 2), "unused": torch.nn.Linear(2, 2)}).to(dtype)
        n = int(rng.integers(0, 3 * size))
        data = torch.from_numpy(rng.standard_normal((n, 3))).to(dtype)
        bounds = np.concatenate([[0], np.sort(rng.integers(0, n + 1, size - 1)), [n]])
        side = set(rng.choice(size, int(rng.integers(0, size + 1)), replace=False).tolist())

        def loss(q):
            out = model["body"](data[bounds[q]:bounds[q + 1]])
            out = model["side"](out) if q in side else out
            return out.square().sum() + 0 * model["body"][0].bias.sum()

        for q in range(size):
            loss(q).backward()
        want = [None if p.grad is None else p.grad / (size if average else 1)
                for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        wrapped = distributed.DataParallel(model, comm, bucket_mb=bucket_mb, average=average)
        loss(rank).backward()
        del wrapped   # kept alive through the backward: its hooks reduce
        tolerance = 1e-12 if dtype == torch.float64 else 1e-5
        for p, expected in zip(model.parameters(), want):
            if expected is None:
                assert p.grad is None
            else:
                torch.testing.assert_close(p.grad, expected, rtol=tolerance, atol=tolerance)


def check_training_matches_one_process():
    """GCN, GAT and AGNN trained for a few epochs on odd random graphs and partitions lose
    what one process loses (float64)."""
    for i, (model, (rng, A, owner, label)) in enumerate(zip(
            ("gcn", "gat", "agnn"), cases(3, 400))):
        n = A.shape[0]
        masks = rng.integers(0, 3, n)
        masks[0] = 0  # a training node
        data = sph.datasets.Dataset("fuzz", sph.csr_array(A), rng.random((n, 5)),
                                    rng.integers(0, 3, n), masks == 0, masks == 1, masks == 2,
                                    3)
        optimizer = ("adam", "sgd", "lion")[i]
        reference = comm.bcast(train(data, model, "contiguous", epochs=3, dtype="float64",
                                     optimizer=optimizer, comm=ALONE, progress=False)
                               if rank == 0 else None)
        result = train(data if rank == 0 else None, model,
                       Partition.from_owner(A, owner, size) if rank == 0 else None, epochs=3,
                       dtype="float64", optimizer=optimizer, progress=False)
        np.testing.assert_allclose(result.losses, reference.losses, rtol=1e-10,
                                   err_msg=f"{model} {label}")


def check_gcn_norm_refuses_unlike_arguments():
    """gcn_norm of a DistGraph with another dtype or loop rule on one rank is refused on
    every rank; before, that rank's rows came out in its own dtype or without loops."""
    A = sph.csr_array(sp.random(9, 9, density=0.4, random_state=1, format="csr")
                      + sp.identity(9))
    graph = DistGraph.scatter(A if rank == 0 else None,
                              partition(A, size, "contiguous") if rank == 0 else None, comm)
    last = rank == size - 1
    raises_on_every_rank(lambda: gcn_norm(graph, dtype=np.float32 if last else np.float64),
                         "rank 0 has dtype float64 where rank")
    raises_on_every_rank(lambda: gcn_norm(graph, add_self_loops=not last),
                         "add_self_loops")
    assert gcn_norm(graph, dtype=np.float32).local.dtype == np.float32  # alike: built


def check_preconditioning_refuses_unlike_makers():
    """Makers that differ between the ranks (another damping, a layer frozen on one rank,
    another maker setting) are refused at the first step, on every rank. Before, the
    damping moved the replicas apart without a word and the frozen layer paired the
    gradient allreduces wrongly."""
    from pysparse_hpc import precondition as P
    last = rank == size - 1
    generator = torch.Generator().manual_seed(0)
    data = torch.randn(6, 4, dtype=torch.float64, generator=generator)
    target = torch.randint(0, 3, (6,), generator=generator)

    def step(make, frozen=False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(),
                                    torch.nn.Linear(5, 3)).double()
        model[0].weight.requires_grad_(not frozen)
        maker = make(model)
        placeholder = maker.setup_model_call(model, data)
        maker.setup_loss_call(torch.nn.functional.cross_entropy, placeholder, target)
        maker.forward_and_backward()

    def kfac(damping=1e-3, **options):
        return lambda m: P.KfacGradientMaker(
            m, P.PreconditioningConfig(data_size=6, damping=damping), fisher_type="emp",
            comm=comm, **options)
    raises_on_every_rank(lambda: step(kfac(damping=1e-2 if last else 1e-3)),
                         "rank 0 has config.damping 0.001 where rank")
    raises_on_every_rank(lambda: step(kfac(), frozen=last), "unlike KfacGradientMakers")
    raises_on_every_rank(lambda: step(kfac(pi_damping=not last)), "pi_damping")
    raises_on_every_rank(lambda: step(lambda m: P.JorgeGradientMaker(
        m, P.PreconditioningConfig(data_size=6, damping=1e-3), comm=comm,
        series_radius=0.25 if last else 0.5)), "series_radius")
    step(kfac(seed=rank))  # each rank may sample its own labels: not a difference


def check_data_parallel_refuses_unlike_models():
    """Models that differ between the ranks (a layer frozen on one rank, another shape or
    dtype, a missing bias) or other DataParallel settings raise on every rank. Before, the
    frozen layer's gradient stayed unreduced without a word (the ranks' buckets differed in
    size and their allreduces paired up anyway), and the others failed inside MPI on some
    ranks only."""
    last = rank == size - 1

    def model(frozen=False, width=2, dtype=torch.float64, bias=True):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(2, width, bias=bias),
                                  torch.nn.Linear(width, 1)).to(dtype)
        net[0].weight.requires_grad_(not frozen)
        return net

    raises_on_every_rank(lambda: distributed.DataParallel(model(frozen=last), comm),
                         "rank 0 has parameter '0.weight' (2, 2) torch.float64 trainable")
    raises_on_every_rank(lambda: distributed.DataParallel(model(width=3 if last else 2), comm),
                         "unlike models")
    raises_on_every_rank(lambda: distributed.DataParallel(
        model(dtype=torch.float32 if last else torch.float64), comm), "torch.float32")
    raises_on_every_rank(lambda: distributed.DataParallel(model(bias=not last), comm),
                         "rank 0 has parameter '0.bias'")
    raises_on_every_rank(lambda: distributed.DataParallel(
        model(), comm, bucket_mb=1e-5 if last else 25), "bucket_mb")
    raises_on_every_rank(lambda: distributed.DataParallel(model(), comm, average=last),
                         "average")
    # broadcast_parameters on some ranks only paired their broadcasts with the others' first
    # reductions: an MPI truncation error, a hang, or replicas that silently differed
    raises_on_every_rank(lambda: distributed.DataParallel(
        model(), comm, broadcast_parameters=last), "broadcast_parameters")
    frozen = model(frozen=True)   # frozen alike on every rank: reduced as before
    wrapped = distributed.DataParallel(frozen, comm, average=False)
    hidden = frozen[0](torch.ones(1, 2, dtype=torch.float64))
    frozen[1](hidden).sum().backward()
    assert frozen[0].weight.grad is None
    torch.testing.assert_close(frozen[1].weight.grad, size * hidden.detach())
    assert not wrapped._retired


def check_train_refuses_unlike_arguments():
    """``train`` with other arguments on one rank raises on every rank, naming them. Before,
    another learning rate or seed trained replicas that drifted apart without a word, and
    a bad model name on one rank was marked as raised on every rank there while the others
    waited in the next collective (the command line returned on that rank: a hang)."""
    path = sph.csr_array(sp.diags_array([np.ones(3), np.ones(3)], offsets=[-1, 1]))
    data = sph.datasets.Dataset("path", path, np.eye(4), np.array([0, 1, 0, 1]),
                                np.array([1, 1, 0, 0], bool), np.array([0, 0, 1, 0], bool),
                                np.array([0, 0, 0, 1], bool), 2)
    last = rank == size - 1

    def run(model="gcn", **changed):
        arguments = dict(dict(epochs=1, seed=0), **(changed if last else {}))
        return train(data if rank == 0 else None, model if last else "gcn", "contiguous",
                     progress=False, **arguments)

    raises_on_every_rank(lambda: run(lr=0.1), "lr=0.1 against 0.01")
    raises_on_every_rank(lambda: run(seed=1), "seed=1 against 0")
    raises_on_every_rank(lambda: run(epochs=2), "epochs=2 against 1")
    raises_on_every_rank(lambda: run(model="nope"), "model must be one of")


def check_sums_of_large_integers():
    """Integer sums over the ranks are exact past 2**63 (a number) or refused (an int64
    array), and a uint64 past 2**63 is not read as negative. Before, the int64 MPI sum
    wrapped and the uint64 was cast to a negative int64, both without a word."""
    assert comm_sum(comm, 2 ** 62) == size * 2 ** 62
    assert comm_sum(comm, np.uint64(2 ** 63 + rank)) == sum(2 ** 63 + r for r in range(size))
    summed = comm_sum(comm, np.array([2 ** 60, rank]))
    assert summed.tolist() == [size * 2 ** 60, size * (size - 1) // 2]
    huge = np.array([2 ** 63 - 1 if rank == 0 else 1], dtype=np.int64)
    try:
        comm_sum(comm, huge)
    except OverflowError as exc:
        assert "leaves int64" in str(exc)
    else:
        assert size == 1, "no error for an int64 sum past 2**63"


if __name__ == "__main__":
    run_named(checks_in(globals()), sys.argv[1:])
