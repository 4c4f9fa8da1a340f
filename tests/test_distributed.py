"""The distributed package in one process: plans against a brute-force halo computation,
the one-rank communicator, and every op, layer and the trainer on a one-rank `DistGraph`
against the single-process results (the multi-rank runs are in test_distributed_mpi.py)."""
import sys
import threading
import time

import numpy as np
import pytest
import scipy.sparse
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pysparse_hpc as sph
from pysparse_hpc import distributed
from pysparse_hpc.distributed import Communicator, DistGraph, _comm, _plan
from pysparse_hpc.nn import AGNNConv, GATConv, GCNConv
from pysparse_hpc.nn import _distributed
from pysparse_hpc.nn import functional as F


@st.composite
def graphs_and_owners(draw):
    n = draw(st.integers(0, 30))
    nparts = draw(st.integers(1, 5))
    density = draw(st.floats(0.0, 0.4))
    seed = draw(st.integers(0, 2 ** 31))
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, n)) < density) * rng.integers(1, 5, (n, n))
    owner = rng.integers(0, nparts, n)
    return sph.csr_array(dense.astype(np.float64)), owner, nparts


@settings(max_examples=60, deadline=None)
@given(graphs_and_owners())
def test_plans_against_brute_force(case):
    A, owner, nparts = case
    csr = A.canonical()
    pieces = _plan.local_pieces(csr.indptr, csr.indices, csr.data, owner, nparts)
    sends = _plan.send_lists(pieces)
    dense = A.toarray()
    for piece in pieces:
        p = piece.rank
        owned = [i for i in range(A.shape[0]) if owner[i] == p]
        halo = sorted({j for i in owned for j in np.flatnonzero(dense[i]) if owner[j] != p},
                      key=lambda j: (owner[j], j))
        assert piece.owned.tolist() == owned
        assert piece.halo.tolist() == halo
        assert piece.recv_counts.tolist() == [sum(owner[j] == q for j in halo)
                                              for q in range(nparts)]
        # The local matrix is A[owned] with columns renamed to owned-then-halo ids.
        columns = np.concatenate([piece.owned, piece.halo]).astype(np.int64)
        local = sph.csr_array((piece.data, piece.indices, piece.indptr),
                              shape=(len(owned), columns.size))
        assert local.has_canonical_format
        rebuilt = np.zeros((len(owned), A.shape[1]))
        rebuilt[:, columns] = local.toarray()
        assert np.array_equal(rebuilt, dense[owned])
        for q in range(nparts):
            # p sends q exactly q's halo rows owned by p, in q's order.
            assert piece.owned[sends[p][q]].tolist() == pieces[q].halo_from(p).tolist()


def test_one_rank_communicator():
    comm = Communicator(None)
    assert (comm.rank, comm.size) == (0, 1)
    buffer = np.arange(4.0)
    assert comm.Allreduce(buffer) is buffer and buffer.tolist() == [0, 1, 2, 3]
    comm.Iallreduce(torch.ones(3)).wait()
    comm.Bcast(buffer)
    assert comm.stats() == {} and comm.wait_seconds() == {}
    assert comm.allgather(5) == [5] and comm.bcast("x") == "x" and comm.scatter([7]) == 7
    comm.raise_if_any(None)
    with pytest.raises(KeyError, match="lost"):
        comm.raise_if_any(KeyError("lost"))
    assert comm.on_root(divmod, 7, 2) == (3, 1)
    with pytest.raises(ZeroDivisionError) as raised:
        comm.on_root(divmod, 7, 0)
    assert _comm.raised_on_every_rank(raised.value)
    with pytest.raises(ValueError, match="root must be a rank in"):
        comm.on_root(divmod, 7, 2, root=1)
    with pytest.raises(ValueError, match="op must be one of"):
        comm.Allreduce(buffer, op="product")
    # mpi4py's Allreduce(sendbuf, recvbuf): the receive buffer taken as the op failed with
    # NumPy's "truth value of an array ... is ambiguous".
    for recvbuf in (np.zeros(3), torch.zeros(3), [0.0, 0.0]):
        with pytest.raises(TypeError, match=r"the reductions work in place on one buffer "
                                            r"\(Allreduce\(buffer, op='sum'\)\), not "):
            comm.Allreduce(np.ones(3), recvbuf)
    with pytest.raises(TypeError, match="op must be one of .*, got 3"):
        comm.Allreduce(buffer, 3)
    with pytest.raises(TypeError, match="NumPy array or a CPU torch tensor"):
        comm.Allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.Allreduce(np.zeros((3, 3))[:, 0])


def test_one_rank_object_collectives_take_one_item_per_rank():
    """scatter and alltoall took a list of any length on one rank, where mpi4py (and P ranks)
    need one item per rank; scatter(None) is None, as in mpi4py."""
    comm = Communicator(None)
    assert comm.scatter([5]) == 5 and comm.alltoall((5,)) == [5] and comm.scatter(None) is None
    for call in (lambda: comm.scatter([1, 2]), lambda: comm.alltoall([1, 2])):
        with pytest.raises(ValueError, match=r"needs one item per rank \(1\), got 2"):
            call()
    with pytest.raises(TypeError, match=r"needs a sequence of one item per rank \(1\), got int"):
        comm.scatter(3)
    assert comm.stats() == {}


def test_one_rank_communicator_without_mpi_exchanges_with_itself_or_says_why_not():
    """Without MPI, Sendrecv with rank 0 (which MPI makes on one rank) and the point-to-point
    calls failed with an AttributeError of None, as did a bad argument of the constructor."""
    comm = Communicator(None)
    received = np.zeros(3)
    assert comm.Sendrecv(np.arange(3.0), 0, received, 0) is received
    assert received.tolist() == [0, 1, 2] and comm.stats() == {}
    with pytest.raises(ValueError, match="expected 16 bytes from rank 0"):
        comm.Sendrecv(np.ones(3), 0, np.zeros(2), 0)
    with pytest.raises(ValueError, match="dest must be a rank in"):
        comm.Sendrecv(np.ones(3), 1, np.zeros(3), 0)
    for call in (comm.Isend, comm.Irecv):
        with pytest.raises(RuntimeError, match="has no MPI"):
            call(np.zeros(2), 0, 1, "x")
    assert comm.stats() == {}
    with pytest.raises(TypeError, match="already a pysparse_hpc Communicator"):
        Communicator(comm)
    with pytest.raises(TypeError, match="mpi4py communicator .* or None, got int"):
        Communicator(3)


def test_init_is_one_rank_without_mpiexec_and_made_once():
    comm = distributed.init()
    assert comm.size == 1 and comm.rank == 0
    assert distributed.init() is comm


def test_init_without_mpi4py(monkeypatch):
    monkeypatch.setattr(_comm, "_WORLD", None)
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    for name in _comm._SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    comm = distributed.init()
    assert comm.size == 1 and comm.mpi is None
    monkeypatch.setattr(_comm, "_WORLD", None)
    monkeypatch.setenv("PMI_SIZE", "4")
    assert distributed.launched_ranks() == 4
    with pytest.raises(ImportError, match="launched with 4 ranks but mpi4py is not installed"):
        distributed.init()


def test_launched_rank_is_read_from_the_launchers_environment(monkeypatch):
    for name in _comm._RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert _comm.launched_rank() == 0
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    assert _comm.launched_rank() == 3
    monkeypatch.setenv("PMI_RANK", "1")  # MPICH's, read first
    assert _comm.launched_rank() == 1


def test_a_one_rank_communicator_refuses_read_only_results_and_duplicates():
    """Checked at every size: MPI refuses a read-only result buffer only on several ranks."""
    comm = Communicator(None)
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    for call in (comm.Allreduce, comm.Iallreduce, lambda b: comm.Allgatherv(frozen[:1], b, [1])):
        with pytest.raises(ValueError, match="read-only, and the result is written into it"):
            call(frozen)
    comm.Bcast(frozen)   # the root's buffer is only read
    twin = comm.duplicate()
    assert twin is not comm and (twin.rank, twin.size, twin.mpi) == (0, 1, None)
    comm.set_timeout(5)
    assert twin.timeout == 5.0   # shared, as the statistics are
    comm.set_timeout(None)
    twin.free()


def test_errors_of_another_rank_are_rebuilt_or_named():
    from pysparse_hpc.distributed._comm import _rebuilt
    error = _rebuilt("builtins", "KeyError", "rank 2", "'lost'")
    assert type(error) is KeyError and "rank 2" in str(error)
    error = _rebuilt("builtins", "UnicodeDecodeError", "rank 1", "bad byte")
    assert type(error) is RuntimeError
    assert str(error) == "rank 1 raised UnicodeDecodeError: bad byte"
    error = _rebuilt("json.decoder", "JSONDecodeError", "rank 1", "Expecting value")
    assert str(error) == "rank 1 raised json.decoder.JSONDecodeError: Expecting value"
    error = _rebuilt("a_module_not_imported", "Missing", "ranks 1, 2", "gone")
    assert type(error) is RuntimeError and "a_module_not_imported.Missing" in str(error)


def test_timeout_is_checked_and_read_from_the_environment(monkeypatch):
    comm = Communicator(None)
    assert comm.timeout is None
    comm.set_timeout(2)
    assert comm.timeout == 2.0 and comm._guard.watchdog is None  # one rank never waits
    comm.set_timeout(None)
    assert comm.timeout is None
    for bad, error in [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                       (float("inf"), ValueError), ("10", TypeError), (True, TypeError)]:
        with pytest.raises(error, match="timeout must be a"):
            comm.set_timeout(bad)
    # init reads PYSPARSE_HPC_COMM_TIMEOUT when it makes the communicator
    monkeypatch.setattr(_comm, "_WORLD", None)
    monkeypatch.setenv(_comm.TIMEOUT_VARIABLE, "12.5")
    assert distributed.init().timeout == 12.5
    assert distributed.init(timeout=3).timeout == 3.0   # a later call sets it
    for bad in ("soon", "0", "-5"):
        monkeypatch.setattr(_comm, "_WORLD", None)
        monkeypatch.setenv(_comm.TIMEOUT_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"PYSPARSE_HPC_COMM_TIMEOUT must be a number of "
                                             f"seconds > 0, got '{bad}'"):
            distributed.init()
    monkeypatch.setattr(_comm, "_WORLD", None)
    monkeypatch.setenv(_comm.TIMEOUT_VARIABLE, "")
    assert distributed.init().timeout is None


def test_the_watchdog_leaves_out_the_time_the_job_was_suspended(monkeypatch):
    """A job stopped and continued (SIGSTOP and SIGCONT, a scheduler suspending it) for
    longer than its timeout: the wall clock jumps while the process does not run, and the
    watchdog, measuring on it, ended the job the moment it was resumed."""
    ended = []
    comm = Communicator(None)
    comm.size = 2   # a rank of two without MPI: the watched calls are Python functions here
    monkeypatch.setattr(comm, "Abort", lambda code=1: ended.append(code))
    jump = [0.0]
    real = time.monotonic
    monkeypatch.setattr(_comm.time, "monotonic", lambda: real() + jump[0])

    def suspended_for_a_minute():
        time.sleep(0.3)
        jump[0] = 60.0          # the process did not run for a minute
        time.sleep(0.9)
    comm.set_timeout(3.0)
    try:
        comm._watched("Allreduce ('gradient allreduce')", suspended_for_a_minute)
        assert ended == []
        comm._watched("Barrier", time.sleep, 4.5)   # a real wait past the timeout still ends
        assert ended and set(ended) == {1}
    finally:
        comm.set_timeout(None)


def test_the_watchdog_ends_the_job_after_the_timeout_only(monkeypatch, capsys):
    """A watched call that outlasts the timeout ends the job, printing the caller's stack; one
    that returns in time does not."""
    ended = []
    comm = Communicator(None)
    comm.size = 2   # a rank of two without MPI: the watched calls are Python functions here
    monkeypatch.setattr(comm, "Abort", lambda code=1: ended.append(code))
    comm.set_timeout(0.2)
    watchdog = comm._guard.watchdog
    comm._watched("Barrier", time.sleep, 0.05)
    time.sleep(0.3)
    assert ended == [] and capsys.readouterr().err == ""

    def stuck_in_a_collective():
        comm._watched("Allreduce ('gradient allreduce')", time.sleep, 1.0)
    stuck_in_a_collective()
    comm.set_timeout(None)
    watchdog.join(timeout=5)
    assert not watchdog.is_alive() and comm._guard.watchdog is None
    assert ended and set(ended) == {1}
    err = capsys.readouterr().err
    assert "rank 0 of 2 waited" in err and "in Allreduce ('gradient allreduce'), beyond the " \
        "communicator's timeout of 0.2 s" in err, err
    assert "in stuck_in_a_collective" in err and "_comm.py" not in err


@pytest.fixture(scope="module")
def cora():
    return sph.datasets.load("cora")


@pytest.fixture(scope="module")
def cora_graph(cora):
    return DistGraph(cora.adj, distributed.partition(cora.adj, 1, "contiguous"),
                     Communicator(None))


def test_one_rank_graph_is_the_whole_graph(cora, cora_graph):
    assert cora_graph.shape == cora.adj.shape and cora_graph.nnz == cora.adj.nnz
    assert cora_graph.n_local == cora.adj.shape[0] and cora_graph.n_halo == 0
    assert np.array_equal(cora_graph.local.toarray(), cora.adj.toarray())
    x = np.arange(cora.adj.shape[0], dtype=np.float32)[:, None]
    assert np.array_equal(cora_graph.local_rows(x), x)
    assert np.array_equal(cora_graph.local_rows(x[:, 0].tolist()), x[:, 0])  # a list: rows
    with pytest.raises(ValueError, match="2708 rows, got shape \\(3,\\)"):
        cora_graph.local_rows([1, 2, 3])
    assert np.array_equal(cora_graph.scatter_rows(x), x)
    assert np.array_equal(cora_graph.gather_rows(x), x)
    assert "2708 rows" in repr(cora_graph)
    scattered = DistGraph.scatter(cora.adj, np.zeros(cora.adj.shape[0], np.int64),
                                  Communicator(None))
    assert np.array_equal(scattered.local.indices, cora_graph.local.indices)


def test_allreduce_sum_keeps_the_fractions_of_numpy_and_torch_numbers(cora_graph):
    """A NumPy float32 scalar or a torch scalar is no Python float: it was summed as an
    int64, so 0.5 came back as 0."""
    assert cora_graph.allreduce_sum(np.float32(0.5)) == 0.5
    assert cora_graph.allreduce_sum(torch.tensor(0.25)) == 0.25
    assert cora_graph.allreduce_sum(2.5) == 2.5 and cora_graph.allreduce_sum(3) == 3
    np.testing.assert_array_equal(cora_graph.allreduce_sum(torch.tensor([0.5, 1.5])),
                                  [0.5, 1.5])
    summed = cora_graph.allreduce_sum(np.array([[0.5], [2.0]], dtype=np.float32))
    assert summed.shape == (2, 1) and summed.dtype == np.float64
    with pytest.raises(TypeError, match="real numbers"):
        cora_graph.allreduce_sum(1j)


def test_bad_graph_input(cora):
    comm = Communicator(None)
    n = cora.adj.shape[0]
    with pytest.raises(ValueError, match="has 2707 owners but the graph has 2708 nodes"):
        DistGraph(cora.adj, np.zeros(n - 1, np.int64), comm)
    with pytest.raises(ValueError, match=r"partition\[0\] is 1, outside \[0, 1\); expected part "
                       r"numbers 0 <= partition < the communicator's size = 1"):
        DistGraph(cora.adj, np.ones(n, np.int64), comm)
    with pytest.raises(ValueError, match="is for 2 ranks but the communicator has 1"):
        DistGraph(cora.adj, distributed.partition(cora.adj, 2, "contiguous"), comm)
    with pytest.raises(TypeError, match="partition must hold integers, got dtype float64"):
        DistGraph(cora.adj, np.zeros(n), comm)
    with pytest.raises(ValueError, match="partition must be 1-D, got 2-D"):
        DistGraph(cora.adj, np.zeros((n, 1), np.int64), comm)
    with pytest.raises(ValueError, match=r"partition\[5\] is -1, outside"):
        DistGraph(cora.adj, np.r_[np.zeros(5, np.int64), -1, np.zeros(n - 6, np.int64)], comm)
    with pytest.raises(ValueError, match="square"):
        DistGraph(sph.csr_array(np.ones((2, 3))), np.zeros(2, np.int64), comm)
    with pytest.raises(TypeError, match="sparse array"):
        DistGraph(np.ones((2, 2)), np.zeros(2, np.int64), comm)
    graph = DistGraph(cora.adj, np.zeros(n, np.int64), comm)
    with pytest.raises(ValueError, match="rank 0 owns 2708 nodes"):
        F.spmm(graph, torch.zeros(n - 1, 3))
    with pytest.raises(ValueError, match="expected a global array with 2708 rows"):
        graph.scatter_rows(np.zeros(5))
    with pytest.raises(ValueError, match="expected the 2708 owned rows"):
        graph.gather_rows(np.zeros(5))


def _grads_of(adj, x, run):
    x = x.clone().requires_grad_()
    out = run(adj, x)
    out.backward(torch.ones_like(out))
    return out.detach(), x.grad


@pytest.mark.parametrize("run", [
    lambda adj, x: F.spmm(adj, x),
    lambda adj, x: F.spmm(adj, x, values=F.edge_softmax(adj, F.sddmm(adj, x, x))),
    lambda adj, x: F.gat_attention(adj, x[:, :2].contiguous(), x[:, 2:4].contiguous()),
    lambda adj, x: GCNConv(5, 3)(x, adj), lambda adj, x: GATConv(5, 2, heads=3)(x, adj),
    lambda adj, x: AGNNConv()(x, adj)],
    ids=["spmm", "attention-spmm", "gat_attention", "GCNConv", "GATConv", "AGNNConv"])
def test_one_rank_distributed_ops_equal_the_single_process_ones(cora, cora_graph, run):
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((cora.adj.shape[0], 5)))
    torch.manual_seed(0)
    expected = _grads_of(cora.adj, x, run)
    torch.manual_seed(0)
    got = _grads_of(cora_graph, x, run)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_distributed_ops_gradcheck():
    rng = np.random.default_rng(1)
    A = sph.csr_array(rng.random((7, 7)) * (rng.random((7, 7)) < 0.5))
    graph = DistGraph(A, np.zeros(7, np.int64), Communicator(None))
    x = torch.from_numpy(rng.standard_normal((7, 3))).requires_grad_()
    values = torch.from_numpy(rng.standard_normal(graph.local.nnz)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: F.spmm(graph, x), (x,))
    assert torch.autograd.gradcheck(lambda v, x: F.spmm(graph, x, values=v), (values, x))
    assert torch.autograd.gradcheck(lambda x: F.sddmm(graph, x, x * 2), (x,))


def test_distributed_products_differentiate_twice():
    """The product with a graph's own values and the halo exchange are linear, and their
    second derivatives are exact as the one-process product's are. They were marked with
    torch's once_differentiable, whose error torch.autograd.grad(..., inputs) goes around: a
    gradient penalty came back without the sparse term ([2, 2] for [10, 34] here)."""
    A = sph.csr_array(np.array([[0.0, 2.0], [1.0, 3.0]]))
    graph = DistGraph(A, np.zeros(2, np.int64), Communicator(None))

    def hessian_diagonal_sum(adj, layer=None):
        x = torch.ones(2, 1, dtype=torch.float64, requires_grad=True)
        out = F.spmm(adj, x) if layer is None else layer(x, adj)
        loss = (out ** 2).sum() + (x ** 2).sum()
        gx, = torch.autograd.grad(loss, x, create_graph=True)
        return torch.autograd.grad(gx.sum(), x)[0].ravel()

    torch.testing.assert_close(hessian_diagonal_sum(A), torch.tensor([10.0, 34.0],
                                                                     dtype=torch.float64))
    torch.testing.assert_close(hessian_diagonal_sum(graph), hessian_diagonal_sum(A))
    torch.manual_seed(0)
    layer = GCNConv(1, 2, normalize=False).double()
    torch.testing.assert_close(hessian_diagonal_sum(graph, layer), hessian_diagonal_sum(A, layer))
    rng = np.random.default_rng(1)
    B = sph.csr_array(rng.random((7, 7)) * (rng.random((7, 7)) < 0.5))
    graph = DistGraph(B, np.zeros(7, np.int64), Communicator(None))
    x = torch.from_numpy(rng.standard_normal((7, 3))).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: F.spmm(graph, x), (x,))
    assert torch.autograd.gradgradcheck(lambda x: _distributed.halo_rows(graph, x), (x,))


def test_one_rank_training_equals_the_single_process_fit(cora):
    from pysparse_hpc.distributed.training import train
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit, node_tensors
    x, y, *masks = node_tensors(cora)
    for name in ("gcn", "gat"):
        torch.manual_seed(0)
        model = models.MODELS[name](x.shape[1], out_channels=cora.num_classes,
                                    **models.MODELS[name].architecture)
        whole = fit(model, x, cora.adj, y, masks, epochs=4, progress=False,
                    **{k: v for k, v in models.MODELS[name].training.items() if k != "epochs"})
        result = train("cora", name, "contiguous", epochs=4, progress=False,
                       comm=Communicator(None))
        np.testing.assert_allclose(result.losses, whole.losses, rtol=1e-6)
        assert result.test_accuracy == whole.test_accuracy
        assert result.halo_bytes_per_epoch == 0 and result.cagnet_bytes_per_epoch == 0


def test_row_ids_key_the_dropout_masks():
    x = torch.ones(6, 4)
    torch.manual_seed(3)
    whole = F.dropout(x, 0.5)
    torch.manual_seed(3)
    same = F.dropout(x, 0.5, row_ids=np.arange(6))
    assert torch.equal(whole, same)
    torch.manual_seed(3)
    part = F.dropout(x[[4, 1]], 0.5, row_ids=np.array([4, 1]))
    assert torch.equal(part, whole[[4, 1]])
    torch.manual_seed(3)
    empty = F.dropout(torch.ones(0, 4), 0.5, row_ids=np.zeros(0, np.int64))
    assert empty.shape == (0, 4)
    with pytest.raises(ValueError, match="row_ids must have shape"):
        F.dropout(x, 0.5, row_ids=np.arange(5))
    with pytest.raises(ValueError, match="'node' or 'edge'"):
        F.row_ids(sph.csr_array(np.eye(2)), "column")


def test_edge_ids_are_global(cora):
    csr = cora.adj.canonical()
    ids = F.row_ids(csr, "edge")
    rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    assert np.array_equal(ids, rows * csr.shape[1] + csr.indices)
    owner = np.arange(csr.shape[0]) % 3
    pieces = _plan.local_pieces(csr.indptr, csr.indices, csr.data, owner, 3)
    keys = []
    for piece in pieces:
        columns = np.concatenate([piece.owned, piece.halo])
        keys.append(np.repeat(piece.owned, np.diff(piece.indptr)) * csr.shape[1]
                    + columns[piece.indices])
    assert np.array_equal(np.sort(np.concatenate(keys)), ids)


def test_data_parallel_on_one_rank():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    reference = [p.detach().clone() for p in model.parameters()]
    wrapped = distributed.DataParallel(model, Communicator(None), bucket_mb=1e-4)
    assert sum(wrapped.bucket_sizes) == 4 and len(wrapped.bucket_sizes) > 1
    data = torch.randn(5, 4)
    wrapped(data).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with wrapped.no_sync():
        model(data).sum().backward()
    for got, expected in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, expected)
    assert all(torch.equal(a, b) for a, b in zip(reference, model.parameters()))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        distributed.DataParallel(lambda x: x)
    with pytest.raises(ValueError, match="bucket_mb must be positive"):
        distributed.DataParallel(model, bucket_mb=0)
    with pytest.raises(TypeError, match="bucket_mb must be a number of megabytes, got str"):
        distributed.DataParallel(model, bucket_mb="25")
    for flag in ("average", "broadcast_parameters", "broadcast_buffers"):
        with pytest.raises(TypeError, match=f"{flag} must be a bool, got str 'no'"):
            distributed.DataParallel(model, **{flag: "no"})


def test_data_parallel_on_one_rank_leaves_the_gradients_without_a_reduction(monkeypatch):
    """On one rank the sum over the ranks is the gradient itself: no bucket copies, no
    collectives (they were half of a small model's step), and the gradients as the reduction
    leaves them on more ranks: dense for a parameter reduced densely, coalesced for a sparse
    Embedding's, None for one the backward did not reach."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(6, 3, sparse=True)
            self.plain = torch.nn.Parameter(torch.randn(6, 3))
            self.head = torch.nn.Linear(3, 2)
            self.unused = torch.nn.Linear(2, 2)

        def forward(self, tokens):
            hidden = self.table(tokens) + torch.nn.functional.embedding(tokens, self.plain,
                                                                        sparse=True)
            return self.head(hidden).sum()
    torch.manual_seed(0)
    model = Model()
    wrapped = distributed.DataParallel(model, Communicator(None), bucket_mb=1e-5)

    def refuse(*args, **kwargs):
        raise AssertionError("a collective on one rank")
    for name in ("Iallreduce", "Allreduce"):
        monkeypatch.setattr(Communicator, name, refuse)
    tokens = torch.tensor([1, 4, 4, 1])
    wrapped(tokens).backward()
    table_grad = model.table.weight.grad
    assert table_grad.is_sparse and table_grad.is_coalesced()
    assert table_grad.indices()[0].tolist() == [1, 4]
    assert not model.plain.grad.is_sparse and model.unused.weight.grad is None
    reached = {name: p.grad.to_dense().clone() for name, p in model.named_parameters()
               if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model(tokens).backward()   # the plain backward, no wrapper
    plain = dict(model.named_parameters())
    for name, grad in reached.items():
        torch.testing.assert_close(grad, plain[name].grad.to_dense(), rtol=0, atol=0)


def test_a_collected_data_parallel_leaves_its_module_as_it_was():
    """The parameters' hooks hold the wrapper weakly: a wrapper no one keeps is collected,
    its hooks removed and its MPI context freed (each wrapper of a new model kept one for
    good, and about 2000 ended the job); a retired one refuses to broadcast."""
    import gc
    import weakref
    model = torch.nn.Linear(4, 2)
    wrapped = distributed.DataParallel(model, Communicator(None))
    assert all(p._post_accumulate_grad_hooks for p in model.parameters())
    collected = weakref.ref(wrapped)
    del wrapped
    gc.collect()
    assert collected() is None
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())
    model(torch.ones(1, 4)).sum().backward()   # plain torch again
    first = distributed.DataParallel(model, Communicator(None))
    second = distributed.DataParallel(model, Communicator(None))
    for retired_call in (first.broadcast_parameters, lambda: first(torch.ones(1, 4))):
        with pytest.raises(RuntimeError, match="was retired"):
            retired_call()
    second(torch.ones(1, 4)).sum().backward()


def test_copies_and_pickles_of_a_data_parallel_reduce_their_own_module():
    """A deep copy kept the original's hook handles and a dead finalizer: wrapping the copy's
    module again left the retired copy's hooks on it (every gradient reduced twice); pickling
    failed on a weak reference. Both give a live wrapper of a copy of the module now."""
    import copy
    import pickle
    model = torch.nn.Linear(4, 2)
    wrapped = distributed.DataParallel(model, Communicator(None), average=False).eval()
    twin = copy.deepcopy(wrapped)
    assert twin.module is not model and twin.comm is wrapped.comm and not twin.training
    twin(torch.ones(3, 4)).sum().backward()
    torch.testing.assert_close(twin.module.weight.grad, torch.full((2, 4), 3.0))
    rewrapped = distributed.DataParallel(twin.module, Communicator(None))
    assert twin._retired
    assert all(len(p._post_accumulate_grad_hooks) == 1 for p in twin.module.parameters())
    rewrapped(torch.ones(1, 4)).sum().backward()
    unpickled = pickle.loads(pickle.dumps(wrapped))
    assert isinstance(unpickled, distributed.DataParallel) and not unpickled.average
    assert not unpickled.training and unpickled.comm.size == 1
    assert all(torch.equal(a, b) for a, b in zip(unpickled.parameters(), model.parameters()))
    unpickled(torch.ones(2, 4)).sum().backward()
    torch.testing.assert_close(unpickled.module.bias.grad, torch.full((2,), 2.0))
    with pytest.raises(TypeError, match="cannot be copied shallowly"):
        copy.copy(wrapped)
    wrapped(torch.ones(1, 4)).sum().backward()   # the original still reduces its own


def test_data_parallel_keeps_a_frozen_parameter_in_its_bucket():
    """Freezing and unfreezing a layer in turn (a GAN's discriminator) rebuilds the buckets
    once, when the layer first trains, not at every change."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model[1].requires_grad_(False)
    wrapped = distributed.DataParallel(model, Communicator(None), bucket_mb=1e-5)
    assert sum(wrapped.bucket_sizes) == 2
    model[1].requires_grad_(True)
    wrapped(torch.ones(2, 4)).sum().backward()
    buckets = wrapped._buckets
    assert sum(wrapped.bucket_sizes) == 4
    for frozen in (True, False, True):
        model[1].requires_grad_(not frozen)
        model.zero_grad(set_to_none=True)
        wrapped(torch.ones(2, 4)).sum().backward()
        assert wrapped._buckets is buckets
        assert (model[1].weight.grad is None) == frozen and model[0].weight.grad is not None


def test_data_parallel_reduces_a_layer_replaced_after_wrapping():
    """A layer replaced after wrapping (a new head for fine-tuning) is hooked and bucketed at
    the next forward, whatever ids its parameters reuse."""
    import gc
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    wrapped = distributed.DataParallel(model, Communicator(None), bucket_mb=1e-5)
    for _ in range(20):   # a collected parameter's id is soon reused: most rounds, here
        model[1] = torch.nn.Linear(4, 1)
        gc.collect()
        wrapped(torch.ones(2, 4)).sum().backward()
        assert sum(wrapped.bucket_sizes) == 4
        assert all(p._post_accumulate_grad_hooks for p in model.parameters())
        assert all(p.grad is not None for p in model.parameters())


def test_data_parallel_leaves_unreached_parameters_without_gradient():
    """A parameter no backward reaches keeps ``.grad`` None, as in one process, so Adam's
    weight decay and momentum leave it alone; one reached keeps its gradient."""
    torch.manual_seed(0)
    used, unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    model = torch.nn.ModuleDict({"used": used, "unused": unused})
    wrapped = distributed.DataParallel(model, Communicator(None), bucket_mb=1e-5)
    kept = unused.weight.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    for _ in range(2):
        optimizer.zero_grad()
        used(torch.ones(4, 3)).sum().backward()
        assert unused.weight.grad is None and unused.bias.grad is None
        assert torch.equal(used.bias.grad, torch.full((2,), 4.0))
        optimizer.step()
    assert torch.equal(unused.weight, kept)
    assert not wrapped.comm.stats()  # one rank: nothing crosses, nothing is booked


def test_bfloat16_on_one_rank():
    """NumPy has no bfloat16; the communicator still takes such tensors, and `DataParallel`
    and `DistributedLion` train a bfloat16 model without mpiexec."""
    comm = Communicator(None)
    values = torch.tensor([0.1, -2.5, 3.0], dtype=torch.bfloat16)
    kept = values.clone()
    comm.Allreduce(values)
    comm.Iallreduce(values).wait()
    comm.Bcast(values)
    gathered = torch.empty(3, dtype=torch.bfloat16)
    comm.Allgatherv(values, gathered, [3])
    comm.Reduce_scatter(values, gathered, [3])
    assert torch.equal(values, kept) and torch.equal(gathered, kept)
    with pytest.raises(TypeError, match="bfloat16 but recvbuf int16"):
        comm.Allgatherv(values, np.zeros(3, np.int16), [3])
    with pytest.raises(TypeError, match="bfloat16 but recvbuf list"):
        comm.Reduce_scatter(values, [0.0] * 3, [3])
    model = torch.nn.Linear(4, 2).to(torch.bfloat16)
    wrapped = distributed.DataParallel(model, comm)
    wrapped(torch.ones(3, 4, dtype=torch.bfloat16)).sum().backward()
    assert model.weight.grad.dtype == torch.bfloat16
    assert torch.equal(model.weight.grad, torch.full((2, 4), 3.0, dtype=torch.bfloat16))
    from pysparse_hpc.optim import DistributedLion
    before = model.weight.detach().clone()
    DistributedLion(model.parameters(), comm, lr=0.5, compression="none").step()
    assert torch.equal(model.weight, before - 0.5)


def test_halo_exchange_refuses_bfloat16_rows(cora):
    plan = DistGraph(cora.adj, np.zeros(cora.adj.shape[0], np.int64), Communicator(None)).plan
    with pytest.raises(TypeError, match="bfloat16.*convert them to float32"):
        plan.start_exchange(torch.zeros(plan.n_local, 2, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16"):
        plan.start_reverse_exchange(torch.zeros(plan.n_halo, 2, dtype=torch.bfloat16))


def test_exchanges_and_gathers_refuse_what_has_no_rows(cora):
    graph = DistGraph(cora.adj, np.zeros(cora.adj.shape[0], np.int64), Communicator(None))
    with pytest.raises(ValueError, match="one row per node, got a 0-d array"):
        graph.halo_exchange(np.array(1.0, np.float32))
    with pytest.raises(ValueError, match="one row per node"):
        graph.start_reverse_exchange(np.zeros((), np.float32))
    with pytest.raises(ValueError, match=r"owned rows of this rank, got shape \(\)"):
        graph.gather_rows(np.float64(2.0))
    with pytest.raises(TypeError, match="bfloat16.*convert them to float32"):
        graph.gather_rows(torch.zeros(graph.n_local, 2, dtype=torch.bfloat16))
    rows = torch.arange(graph.n_local * 2.0).reshape(-1, 2)
    np.testing.assert_array_equal(graph.gather_rows(rows), rows.numpy())


def test_a_partition_is_required(cora):
    with pytest.raises(TypeError, match="a partition is required"):
        DistGraph(cora.adj, None, Communicator(None))
    with pytest.raises(TypeError, match="a partition is required"):
        DistGraph.scatter(cora.adj, comm=Communicator(None))


def test_data_parallel_keeps_sparse_gradients_sparse():
    table, head = torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 3)
    model = distributed.DataParallel(torch.nn.Sequential(table, head), comm=Communicator())
    model(torch.tensor([1, 2, 2, 7])).sum().backward()
    grad = table.weight.grad
    assert grad.is_sparse and grad.indices()[0].tolist() == [1, 2, 7]
    torch.optim.SparseAdam([table.weight]).step()


def test_mpi4py_communicators_are_refused_by_name(tmp_path, cora):
    MPI = pytest.importorskip("mpi4py.MPI")
    from pysparse_hpc.optim import DistributedLion
    model = torch.nn.Linear(3, 2)
    for make in (lambda c: distributed.DataParallel(model, comm=c),
                 lambda c: DistributedLion(model.parameters(), comm=c),
                 lambda c: distributed.Checkpointer(tmp_path / "checkpoints", comm=c),
                 lambda c: DistGraph(cora.adj, np.zeros(cora.adj.shape[0], dtype=int), comm=c)):
        with pytest.raises(TypeError, match="mpi4py communicator"):
            make(MPI.COMM_WORLD)
        with pytest.raises(TypeError, match="must be a pysparse_hpc.distributed.Communicator"):
            make(object())


def test_gcn_norm_of_a_distributed_graph_matches(cora, cora_graph):
    from pysparse_hpc.nn import gcn_norm
    np.testing.assert_allclose(gcn_norm(cora_graph).local.toarray(),
                               gcn_norm(cora.adj).toarray(), rtol=1e-7)


def test_local_matrices_take_scipys_index_dtype(cora, cora_graph):
    """int32 indices where they fit, as one-process matrices: both run the same compiled
    kernels, and a graph that needs int64 keeps it."""
    from pysparse_hpc.nn import gcn_norm
    from pysparse_hpc.nn._graph import with_self_loops
    assert cora.adj.indices.dtype == np.int32
    for graph in (cora_graph, gcn_norm(cora_graph), with_self_loops(cora_graph)):
        assert graph.local.indices.dtype == graph.local.indptr.dtype == np.int32
    wide = sph.csr_array(cora.adj, index_dtype=np.int64)
    assert with_self_loops(wide).indices.dtype == np.int64
    assert with_self_loops(cora.adj).indices.dtype == np.int32


def test_load_file(tmp_path, cora):
    path = tmp_path / "graph.npz"
    adj = cora.adj
    arrays = dict(adj_indptr=adj.indptr, adj_indices=adj.indices, adj_data=adj.data,
                  adj_shape=np.array(adj.shape), labels=cora.y, train_mask=cora.train_mask,
                  val_mask=cora.val_mask, test_mask=cora.test_mask, num_classes=7)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="has no features"):
        sph.datasets.load_file(path)
    data = sph.datasets.load_file(path, random_features=12)
    assert data.x.shape == (2708, 12) and data.name == "graph"
    bundled = sph.datasets.load("cora", random_features=12)
    assert np.array_equal(bundled.x, data.x) and bundled.name == "cora"
    with pytest.raises(ValueError, match="positive width"):
        sph.datasets.load("cora", random_features=0)
    np.savez(path, **{k: v for k, v in arrays.items() if k != "labels"})
    with pytest.raises(ValueError, match="lacks labels"):
        sph.datasets.load_file(path, random_features=3)
    with pytest.raises(FileNotFoundError):
        sph.datasets.load_file(tmp_path / "missing.npz")
    scipy.sparse.save_npz(tmp_path / "plain.npz", adj.to_scipy())
    with pytest.raises(ValueError):
        sph.datasets.load_file(tmp_path / "plain.npz", random_features=3)
    # Cast unchecked, float labels were truncated and index masks read as 0/1 masks.
    for change, message in [(dict(labels=cora.y + 0.9), "labels must be a 1-D integer array"),
                            (dict(labels=np.where(cora.train_mask, 7, cora.y)),
                             r"range over 0..7; expected 0..6"),
                            (dict(labels=np.where(cora.test_mask, -1, cora.y)),
                             r"range over -1..6"),
                            (dict(train_mask=np.flatnonzero(cora.train_mask)),
                             "train_mask must be a 1-D bool array, got 1-D int64"),
                            (dict(num_classes=0), "num_classes must be an integer >= 1"),
                            (dict(adj_shape=np.array([2708, 2709])), "a graph's is square")]:
        np.savez(path, **{**arrays, **change})
        with pytest.raises(ValueError, match=message):
            sph.datasets.load_file(path, random_features=3)
    unlabelled = np.where(cora.train_mask | cora.val_mask | cora.test_mask, cora.y, -1)
    np.savez(path, **{**arrays, "labels": unlabelled})   # -1 outside the masks is fine
    assert sph.datasets.load_file(path, random_features=3).y.min() == -1


def test_train_command_without_mpiexec(capsys):
    from pysparse_hpc.__main__ import main
    assert main(["train", "--epochs", "3", "--no-progress", "--model", "agnn"]) == 0
    out = capsys.readouterr().out
    assert "AGNN on cora, 1 rank" in out and "test accuracy" in out
    assert "CAGNET" not in out  # nothing is exchanged on one rank
    assert main(["train", "--dataset", "nowhere", "--no-progress"]) == 2
    assert "unknown dataset 'nowhere'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--threads", "0"])


def test_callers_data_is_left_untouched(cora):
    adj = cora.adj
    before = [a.copy() for a in (adj.indptr, adj.indices, adj.data)]
    owner = np.arange(adj.shape[0], dtype=np.int64) % 1
    owner_before = owner.copy()
    features = np.ascontiguousarray(cora.x[:, :5])
    features_before = features.copy()
    graph = DistGraph.scatter(adj, owner, Communicator(None))
    graph.scatter_rows(features)
    graph.halo_exchange(features)
    F.spmm(graph, torch.from_numpy(features))
    F.dropout(torch.from_numpy(features), 0.5, row_ids=graph.owned)
    for array, saved in zip((adj.indptr, adj.indices, adj.data), before):
        assert np.array_equal(array, saved)
    assert np.array_equal(owner, owner_before) and np.array_equal(features, features_before)


def test_train_balances_rows_and_entries_with_metis_by_default(monkeypatch):
    from pysparse_hpc.distributed import _metis, training
    assert training._default_balance("metis", None) == "rows+nnz"
    assert training._default_balance("metis", 30.0) == 30.0
    assert training._default_balance("contiguous", None) is None  # the method's default
    # Without METIS's C functions, the trainer falls back to nodes rather than failing.
    monkeypatch.setattr(training, "multi_constraint_available", lambda: False)
    assert training._default_balance("metis", None) == "rows"
    monkeypatch.setattr(_metis, "_LIBRARY", None)
    monkeypatch.setattr(_metis.ctypes, "CDLL", _no_library)
    assert not _metis.multi_constraint_available()
    monkeypatch.setattr(_metis, "_LIBRARY", None)


def _no_library(path):
    raise OSError(f"cannot open {path}")


def test_data_parallel_follows_dtype_changes_and_other_sparse_gradients():
    """A model converted after wrapping (``.double()``) gets exact float64 gradients (the
    float32 buckets rounded them); a sparse gradient from ``F.embedding(sparse=True)`` on a
    plain parameter, and a dense one for a sparse Embedding whose weight is also used
    densely, are reduced (both crashed inside backward)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    wrapped = distributed.DataParallel(model, Communicator(None))
    model.double()
    x = torch.tensor([[1 / 3, 1e-9, 2.0, 5.0]], dtype=torch.float64)
    wrapped(x).sum().backward()
    assert torch.equal(model.weight.grad, x)

    class Functional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(6, 3))

        def forward(self, tokens):
            return torch.nn.functional.embedding(tokens, self.table, sparse=True).sum()
    functional = Functional()
    tokens = torch.tensor([1, 4, 4])
    wrapped = distributed.DataParallel(functional, Communicator(None))  # kept: its hooks live
    wrapped(tokens).backward()                                          # as long as it does
    expected = torch.zeros(6, 3)
    expected[1], expected[4] = 1.0, 2.0
    torch.testing.assert_close(functional.table.grad.to_dense(), expected)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(6, 3, sparse=True)

        def forward(self, tokens):
            hidden = self.embed(tokens)
            return (hidden @ self.embed.weight.T).sum()
    tied = Tied()
    wrapped = distributed.DataParallel(tied, Communicator(None))
    wrapped(tokens).backward()
    grad = tied.embed.weight.grad
    tied.embed.weight.grad = None
    with wrapped.no_sync():
        tied(tokens).backward()   # not reduced: the plain gradient
    assert not grad.is_sparse
    torch.testing.assert_close(grad, tied.embed.weight.grad.to_dense())


def test_train_refuses_arguments_it_would_misuse():
    """An owner array as partition failed on rank 0 alone after the graph was built (the other
    ranks hung); an mpi4py communicator failed mid-run; random_features beside a Dataset was
    ignored (yet recorded in the fingerprint)."""
    from pysparse_hpc.distributed.training import train
    cora = sph.datasets.load("cora")
    with pytest.raises(TypeError, match=r"Partition.from_owner\(adj, owner\)"):
        train(cora, partition=np.arange(cora.adj.shape[0]) % 2, epochs=1, progress=False)
    with pytest.raises(ValueError, match="random_features applies to a dataset name"):
        train(cora, random_features=8, epochs=1, progress=False)
    mpi = pytest.importorskip("mpi4py.MPI")
    with pytest.raises(TypeError, match="mpi4py communicator"):
        train("cora", comm=mpi.COMM_WORLD, epochs=1, progress=False)


def test_the_communicator_refuses_at_one_rank_what_mpi_refuses_at_two():
    """One rank returned these unchanged where two ranks failed inside MPI (or crashed it):
    a reduction MPI does not define for the dtype, a big-endian or object array, a root
    beyond the ranks, counts that are not integers."""
    comm = Communicator(None)
    for buffer, op in ((np.ones(3, bool), "sum"), (torch.ones(3, dtype=torch.bool), "max"),
                       (np.ones(3), "land"), (np.ones(3, np.complex128), "max"),
                       (torch.ones(2, dtype=torch.bfloat16), "band")):
        with pytest.raises(TypeError, match=f"op '{op}' does not apply"):
            comm.Allreduce(buffer, op)
        with pytest.raises(TypeError, match=f"op '{op}' does not apply"):
            comm.Iallreduce(buffer, op)
    comm.Allreduce(np.ones(3, bool), "lor")
    comm.Allreduce(np.ones(3, np.uint8), "max")
    with pytest.raises(ValueError, match="not in this machine's byte order"):
        comm.Allreduce(np.ones(3, ">f8"))
    with pytest.raises(TypeError, match="numbers and bools only"):
        comm.Bcast(np.array([None, 1], dtype=object))
    for call in (lambda: comm.Bcast(np.ones(2), root=5), lambda: comm.bcast(1, root=-1),
                 lambda: comm.gather(1, root=1)):
        with pytest.raises(ValueError, match=r"root must be a rank in \[0, 1\)"):
            call()
    with pytest.raises(TypeError, match="counts must be integers"):
        comm.Allgatherv(np.ones(2), np.ones(2), [2.7])


def test_a_job_past_its_timeout_is_stopped_with_every_process_under_it(tmp_path):
    """`run_job` stops the job's whole process group: a launcher killed alone (what
    ``subprocess.run``'s timeout does) can leave its ranks running."""
    import os
    import subprocess

    from pysparse_hpc.distributed._jobs import run_job
    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    with pytest.raises(subprocess.TimeoutExpired):
        run_job(["sh", "-c", script], timeout=2)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail("the job's child outlived the job")
    done = run_job([sys.executable, "-c", "print('ran')"], timeout=60)
    assert done.returncode == 0 and done.stdout == "ran\n"


def test_a_one_rank_graph_and_model_pickle_and_deep_copy(cora):
    """A DistGraph holds its communicator, which neither pickled nor deep-copied (an mpi4py
    communicator, or a lambda in the counters): copies of a one-rank graph must run as it."""
    import copy
    import io
    import pickle
    from pysparse_hpc.nn import models   # not imported by pysparse_hpc.nn itself
    comm = Communicator(None)
    comm.set_timeout(60)
    graph = DistGraph(cora.adj, distributed.partition(cora.adj, 1, "contiguous"), comm)
    x = graph.local_rows(torch.from_numpy(cora.x))
    torch.manual_seed(0)
    model = models.GCN(x.shape[1], 8, 7).eval()
    with torch.no_grad():
        expected = model(x, graph)

    def saved(value):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)
    # protocols 0 and 1 refused a used graph: its cache's token had slots and no state
    for copier in (copy.deepcopy, lambda value: pickle.loads(pickle.dumps(value)), saved,
                   lambda value: pickle.loads(pickle.dumps(value, protocol=0)),
                   lambda value: pickle.loads(pickle.dumps(value, protocol=1))):
        twin_model, twin = copier((model, graph))
        assert twin.comm.size == 1 and twin.comm.timeout == 60
        with torch.no_grad():
            torch.testing.assert_close(twin_model(x, twin), expected)
            torch.testing.assert_close(model(x, twin), expected)
    assert copy.deepcopy(graph).comm is comm          # the same ranks, not a copy of them
    twin = comm.duplicate()                            # a shallow copy still shares counters
    assert twin._counters is comm._counters and twin._guard is comm._guard
    with pytest.raises(TypeError, match="over 2 ranks cannot be pickled"):
        fake = copy.copy(comm)
        fake.size = 2
        pickle.dumps(fake)


class _ThreadRank:
    """One of ``size`` ranks run as threads of this process: ``Allreduce`` sums the ranks'
    buffers as MPI does, each rank reading every buffer's bytes with its own dtype."""

    def __init__(self, rank, size, shared):
        self.rank, self.size, self._shared = rank, size, shared

    def Allreduce(self, buffer, op="sum", kind="allreduce"):
        deposits, barrier = self._shared
        deposits[self.rank] = buffer.tobytes()
        barrier.wait()
        total = sum(np.frombuffer(raw, dtype=buffer.dtype) for raw in deposits)
        barrier.wait()  # every rank has read the deposits before the next call writes them
        buffer[...] = total.reshape(buffer.shape)
        return buffer


def _on_thread_ranks(values, run):
    """``run(comm, value)`` on one thread-rank per value; the list of their results."""
    import threading
    size = len(values)
    shared = ([None] * size, threading.Barrier(size, timeout=30))
    results = [None] * size

    def rank_main(rank):
        results[rank] = run(_ThreadRank(rank, size, shared), values[rank])
    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_sums_of_ints_on_some_ranks_and_floats_on_others_agree():
    """A rank summing the int 0 (nothing counted) beside ranks summing floats reduced int64
    bits with float64 bits: each rank got another wrong number."""
    from pysparse_hpc.distributed.graph import comm_sum
    assert _on_thread_ranks([3, 2.5], comm_sum) == [5.5, 5.5]
    assert _on_thread_ranks([0, np.float32(0.5), True], comm_sum) == [1.5] * 3
    halves = [torch.tensor([0.5, 1.0]), np.array([1, 2])]
    for summed in _on_thread_ranks(halves, comm_sum):
        np.testing.assert_array_equal(summed, [1.5, 3.0])
    # Integers stay exact integers, also beyond float64's 2**53.
    exact = _on_thread_ranks([2 ** 60 + 1, 2 ** 60 + 2], comm_sum)
    assert exact == [2 ** 61 + 3] * 2 and all(type(total) is int for total in exact)


def test_halo_exchanges_take_strided_rows(cora):
    """A column slice or a transpose was refused as not C-contiguous, but a rank owning one
    row has contiguous slices: it exchanged while the others raised, and waited for ever."""
    owner = np.zeros(cora.adj.shape[0], np.int64)
    graph = DistGraph(cora.adj, owner, Communicator(None))
    wide = np.arange(graph.n_local * 3.0).reshape(-1, 3)
    assert graph.halo_exchange(wide[:, :1]).shape == (0, 1)
    assert graph.halo_exchange(torch.from_numpy(wide).T.contiguous().T).shape == (0, 3)
    add_into = graph.start_reverse_exchange(np.zeros((3, graph.n_halo)).T).wait()
    assert add_into(wide) is wide


def test_rows_sent_back_are_added_into_rows_of_their_dtype_and_shape_only(cora):
    """The addition failed (torch) or cast (NumPy) only on ranks that received something:
    never on one rank, and on some ranks only of several."""
    graph = DistGraph(cora.adj, np.zeros(cora.adj.shape[0], np.int64), Communicator(None))
    add_into = graph.start_reverse_exchange(np.zeros((graph.n_halo, 2), np.float32)).wait()
    with pytest.raises(TypeError, match="owned rows are torch.float64 but the rows sent "
                                        "back are float32"):
        add_into(torch.zeros(graph.n_local, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="owned rows are float64 but"):
        add_into(np.zeros((graph.n_local, 2)))
    with pytest.raises(ValueError, match=rf"shape \({graph.n_local}, 2\).*got \(3, 2\)"):
        add_into(np.zeros((3, 2), np.float32))
    rows = torch.ones(graph.n_local, 2)
    assert add_into(rows) is rows


def test_different_errors_of_several_ranks_are_each_told():
    """Every failing rank was named beside the first one's message alone."""
    comm = Communicator(None)
    comm.size = 2
    comm.allgather = lambda report: [("builtins", "KeyError", "'lost'", ["on rank 0"]), report]
    with pytest.raises(KeyError) as raised:
        comm.raise_if_any(ValueError("bad value"))
    assert str(raised.value) == ("\"rank 0: 'lost'; rank 1 raised ValueError: bad value\"")
    assert raised.value.__notes__ == ["on rank 0"]   # the first failing rank's notes travel
    comm.allgather = lambda report: [report, report]
    with pytest.raises(ValueError, match="^ranks 0, 1: same$"):
        comm.raise_if_any(ValueError("same"))


def test_abort_ends_the_process_where_mpi_refuses_to(monkeypatch):
    """A freed duplicate's Abort raises, and the watchdog's rank waited on."""
    class Freed:
        def Abort(self, code):
            raise RuntimeError("Invalid communicator")
    comm = Communicator(None)
    comm.mpi = Freed()
    ended = []
    monkeypatch.setattr(_comm.os, "_exit", ended.append)
    with pytest.raises(RuntimeError, match="Invalid communicator"):
        comm.Abort(3)
    assert ended == [3]


def test_a_job_ignoring_sigterm_is_killed_with_every_process_under_it(tmp_path):
    """The group was sent SIGKILL only when the launcher outlived SIGTERM: a rank that
    ignores or handles SIGTERM outlived a launcher that did not."""
    import os
    import subprocess

    from pysparse_hpc.distributed._jobs import run_job
    pid_file = tmp_path / "child.pid"
    script = f"(trap '' TERM; exec sleep 60) & echo $! > {pid_file}; wait"
    with pytest.raises(subprocess.TimeoutExpired):
        run_job(["sh", "-c", script], timeout=2)
    child = int(pid_file.read_text())
    try:
        os.kill(child, 0)
    except ProcessLookupError:
        return
    os.kill(child, 9)
    pytest.fail("a process of the job that ignores SIGTERM outlived it")


@pytest.mark.parametrize("kind", [KeyboardInterrupt, ValueError])
def test_the_abort_hook_tells_each_error_once_and_ends_the_job(monkeypatch, capsys, kind):
    """A rank of several that raises prints its rank and one traceback, then aborts: an
    interrupt's traceback is left to the hook that was there before, and told by it alone."""
    ended, told_before = [], []
    comm = Communicator(None)
    comm.size = 2
    monkeypatch.setattr(comm, "Abort", lambda code=1: ended.append(code))

    def previous_hook(kind, value, tb):
        told_before.append(kind)
        sys.__excepthook__(kind, value, tb)
    monkeypatch.setattr(sys, "excepthook", previous_hook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    _comm._install_abort_hook(comm)
    try:
        raise kind("stopped here")
    except kind as error:
        sys.excepthook(kind, error, error.__traceback__)
    err = capsys.readouterr().err
    assert f"rank 0 of 2 raised {kind.__name__}; ending the job" in err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert err.count(f"{kind.__name__}: stopped here") == 1 and ended == [1]
    assert told_before == ([kind] if kind is KeyboardInterrupt else [])


def test_ranks_of_the_wrong_type_are_type_errors_and_messages_check_their_ranks(monkeypatch):
    """A rank that is no integer was a ValueError ("must be a rank in [0, 1)" for 0.0), and
    Isend and Irecv passed any rank to MPI, which answered with its error stack."""
    comm = Communicator(None)
    for root in (0.0, "0", True):
        with pytest.raises(TypeError, match=r"root must be a rank, an int in \[0, 1\), got"):
            comm.Bcast(np.ones(2), root=root)

    class Sent:
        def Isend(self, *args, **kwargs):
            raise AssertionError("reached MPI")
        Irecv = Isend
    comm = Communicator(None)
    comm.size, comm.mpi = 2, Sent()
    with pytest.raises(ValueError, match=r"dest must be a rank in \[0, 2\), got 5"):
        comm.Isend(np.ones(2), 5, 0, "x")
    with pytest.raises(ValueError, match=r"source must be a rank in \[0, 2\), got -1"):
        comm.Irecv(np.ones(2), -1, 0, "x")
    with pytest.raises(TypeError, match="dest must be a rank, an int"):
        comm.Isend(np.ones(2), 1.0, 0, "x")
