"""The ``distributed`` benchmark: exact plans against `Partition`, the alpha-beta arithmetic on a
hand-made case, the CAGNET-1D peer on one rank, the command end to end without MPI jobs, bad
input, and (marked ``mpi``) the real P=1 / P=2 runs on a small graph."""
import csv
import importlib.util
import math
import subprocess
import sys

import numpy as np
import pytest

import pysparse_hpc as sph
from pysparse_hpc.bench import distributed as bench
from pysparse_hpc.bench.__main__ import main
from pysparse_hpc.distributed import _plan
from pysparse_hpc.distributed.partition import partition

from .conftest import REPO_ROOT

requires_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                    reason="torch not installed")
requires_metis = pytest.mark.skipif(importlib.util.find_spec("pymetis") is None,
                                    reason="pymetis not installed")
requires_plot = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                   reason="matplotlib not installed")


@pytest.fixture(scope="module")
def cora():
    return sph.datasets.load("cora").adj


# --- exact plans ---------------------------------------------------------------------------

@requires_metis
def test_plans_match_partition(cora):
    methods, ranks = ["metis", "rabbit", "rcm", "contiguous", "random"], [2, 4, 8]
    plans = bench.make_plans("cora", cora, methods, ranks)
    assert [(p.method, p.ranks) for p in plans] == [(m, r) for m in methods for r in ranks]
    reordered = {m: sph.permute(cora, sph.reorder(cora, m)) for m in ("rabbit", "rcm")}
    nnz_hat = cora.nnz + cora.shape[0]  # Cora stores no diagonal: A + I adds one per row
    for plan in plans:
        if plan.method in reordered:
            part = partition(reordered[plan.method], plan.ranks, "contiguous")
        else:
            part = partition(cora, plan.ranks, plan.method, seed=0)
        assert plan.volume == part.communication_volume
        assert plan.cagnet_volume == (plan.ranks - 1) * cora.shape[0] == part.cagnet_volume
        assert plan.fraction == pytest.approx(part.communication_fraction)
        np.testing.assert_array_equal(plan.halo_rows, part.halo_sizes)
        np.testing.assert_array_equal(plan.peers, part.peers)
        np.testing.assert_array_equal(plan.owned_rows, part.owned_rows)
        assert plan.max_halo == part.halo_sizes.max()
        assert plan.peers_max == part.peers.max()
        assert plan.peers_mean == pytest.approx(part.peers.mean())
        assert (plan.row_balance, plan.nnz_balance) == (part.row_balance, part.nnz_balance)
        assert plan.edge_cut == part.edge_cut
        np.testing.assert_array_equal(plan.owned_nnz_hat, part.owned_nnz + part.owned_rows)
        assert plan.owned_nnz_hat.sum() == nnz_hat
        # Every halo row is sent by its owner once per receiver: the send side sums alike.
        assert plan.sent_rows.sum() == plan.volume
        assert plan.send_peers.sum() == plan.peers.sum()
    metis8 = next(p for p in plans if (p.method, p.ranks) == ("metis", 8))
    random8 = next(p for p in plans if (p.method, p.ranks) == ("random", 8))
    assert metis8.volume < random8.volume / 3


def test_send_side_against_the_plans_send_lists(rng):
    n, nparts = 60, 5
    dense = rng.random((n, n)) < 0.08
    adj = sph.csr_array(np.where(dense | dense.T, 1.0, 0.0))
    owner = rng.integers(0, nparts, n).astype(np.int64)
    pieces = _plan.local_pieces(adj.indptr, adj.indices, adj.data, owner, nparts)
    lists = _plan.send_lists(pieces)
    sent_rows, send_peers = bench.send_side(adj.indptr, adj.indices, owner, nparts)
    assert sent_rows.tolist() == [sum(len(to) for to in lists[q]) for q in range(nparts)]
    assert send_peers.tolist() == [sum(1 for to in lists[q] if len(to)) for q in range(nparts)]


def test_hat_row_lengths_count_the_diagonal_once():
    adj = sph.csr_array(np.array([[1.0, 1, 0], [1, 0, 0], [0, 0, 0]]))
    assert bench._hat_row_lengths(adj).tolist() == [2, 2, 1]


# --- the alpha-beta model ------------------------------------------------------------------

def _hand_made_plan():
    """Three ranks with chosen per-rank figures."""
    return bench.Plan(
        graph="hand", method="given", ranks=3, nodes=10, nnz=20, volume=6, cagnet_volume=20,
        max_halo=3, peers_max=2, peers_mean=4 / 3, row_balance=1.2, nnz_balance=1.1,
        edge_cut=8, seconds=0.0, owned_rows=np.array([4, 3, 3]),
        owned_nnz_hat=np.array([12, 9, 9]), halo_rows=np.array([3, 1, 2]),
        peers=np.array([2, 1, 1]), sent_rows=np.array([1, 2, 3]),
        send_peers=np.array([1, 1, 2]))


def _hand_made_rates():
    # nnz_hat 30: t_entry = 3e-4 / 30 = 1e-5 s at width 4 and 6e-4 / 30 = 2e-5 s at width 2.
    return bench.Rates(graph="hand", hidden=4, nodes=10, nnz_hat=30, forward=[4, 2],
                       backward=[2, 4], spmm_seconds={4: 3e-4, 2: 6e-4},
                       step_seconds=1.0e-2, parameter_bytes=1000)


def test_alpha_beta_arithmetic_by_hand():
    network = bench.Network("hand", alpha=1e-6, beta=1e9)
    # rank 0: 2 peers, 3 rows x 4 values x 4 B = 48 B -> 2 us + 48 ns.
    assert bench.exchange_seconds([2, 1, 1], [3, 1, 2], 4, network) == pytest.approx(2.048e-6)
    assert bench.exchange_seconds([], [], 4, network) == 0.0
    assert bench.allreduce_seconds(1000, 1, network) == 0.0
    # Ring over 4 ranks: 2 * 3/4 * 1000 B / 1e9 B/s + 2 * log2(4) * 1 us.
    assert bench.allreduce_seconds(1000, 4, network) == pytest.approx(1.5e-6 + 4e-6)

    plan, rates = _hand_made_plan(), _hand_made_rates()
    assert rates.spmm_total == pytest.approx(1.8e-3)
    assert rates.row_seconds == pytest.approx((1e-2 - 1.8e-3) / 10)
    per_entry = 2 * (1e-5 + 2e-5)
    compute = max(12 * per_entry + 4 * 8.2e-4, 9 * per_entry + 3 * 8.2e-4)
    forward = ((1e-6 * 2 + 3 * 4 * 4 / 1e9)  # width 4: rank 0 (2 peers, 3 rows)
               + (1e-6 * 2 + 3 * 2 * 4 / 1e9))  # width 2: rank 0 again
    backward = ((1e-6 * 2 + 3 * 2 * 4 / 1e9)  # width 2: rank 2 (2 peers, sends 3 rows)
                + (1e-6 * 2 + 3 * 4 * 4 / 1e9))
    allreduce = 2 * 2 / 3 * 1000 / 1e9 + 2 * math.log2(3) * 1e-6
    projection = bench.project(plan, rates, network)
    assert projection.compute == pytest.approx(compute)
    assert projection.exchanges == pytest.approx(forward + backward)
    assert projection.allreduce == pytest.approx(allreduce)
    assert projection.epoch == pytest.approx(compute + forward + backward + allreduce)
    assert projection.efficiency == pytest.approx(1e-2 / (3 * projection.epoch))

    # CAGNET-1D: 2 peers each; allgatherv receives n - rows (max 7 rows on ranks 1 and 2),
    # the reduce-scatter 2 contributions of the rank's rows (max 8 rows on rank 0).
    cagnet = bench.project_cagnet(plan, rates, network)
    exchanges = sum(2e-6 + 7 * w * 4 / 1e9 for w in (4, 2)) + sum(2e-6 + 8 * w * 4 / 1e9
                                                                  for w in (2, 4))
    assert cagnet.method == bench.CAGNET
    assert cagnet.exchanges == pytest.approx(exchanges)
    assert cagnet.compute == projection.compute


def test_one_process_projection_reproduces_the_measured_step():
    plan = _hand_made_plan()
    whole = bench.Plan(**{**plan.__dict__, "ranks": 1, "owned_rows": np.array([10]),
                          "owned_nnz_hat": np.array([30]), "halo_rows": np.array([0]),
                          "peers": np.array([0]), "sent_rows": np.array([0]),
                          "send_peers": np.array([0])})
    projection = bench.project(whole, _hand_made_rates(), bench.NETWORKS[0])
    assert projection.epoch == pytest.approx(1e-2)
    assert projection.efficiency == pytest.approx(1.0)


@requires_torch
def test_schedule_follows_the_gcn_operator_order():
    # Cora h16: transform first in both layers; an input at most twice the hidden width
    # propagates first (no backward SpMM: the features need no gradient), and so does a second
    # layer wider out than in.
    assert bench.schedule(1433, 16, 7) == ([16, 7], [7, 16])
    assert bench.schedule(128, 64, 10) == ([128, 10], [10])
    assert bench.schedule(128, 8, 10) == ([8, 8], [8, 8])


# --- the CAGNET-1D peer on one rank --------------------------------------------------------

@requires_torch
def test_cagnet_spmm_on_one_rank_is_the_plain_product(cora):
    import torch

    from pysparse_hpc.bench import _distributed_worker as worker
    from pysparse_hpc.distributed import Communicator, DistGraph
    from pysparse_hpc.nn import functional
    from pysparse_hpc.nn.norm import gcn_norm
    comm = Communicator(None)
    graph = DistGraph(cora, np.zeros(cora.shape[0], dtype=np.int64), comm)
    operator = worker.CagnetOperator(graph)
    h = torch.randn(cora.shape[0], 5, dtype=torch.float64, requires_grad=True)
    reference = functional.spmm(gcn_norm(cora), h)
    result = worker.cagnet_spmm(operator, h)
    torch.testing.assert_close(result, reference)
    weights = torch.randn_like(result)
    (grad,) = torch.autograd.grad((result * weights).sum(), h)
    (expected,) = torch.autograd.grad((reference * weights).sum(), h)
    torch.testing.assert_close(grad, expected)
    assert comm.stats() == {}


# --- the command ---------------------------------------------------------------------------

@requires_metis
@requires_torch
@requires_plot
def test_plans_and_projection_cli(tmp_path, capsys):
    table, plot = tmp_path / "dist.csv", tmp_path / "dist.png"
    status = main(["distributed", "--data", str(REPO_ROOT), "--graphs", "cora,generated",
                   "--quick", "--skip-runs", "--max-ranks", "8", "--hidden", "16", "--repeat",
                   "1", "--csv", str(table), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert status == 0
    assert "== exact plans" in out and "== projection (alpha-beta): 25GB/s: alpha 2 us, beta " \
        "25 GB/s, 100GB/s: alpha 2 us, beta 100 GB/s" in out
    assert "model: per step, compute = max over ranks" in out
    assert "METIS halo volume at P=8 on cora" in out and "(no target on this graph)" in out
    verdict = [line for line in out.splitlines()
               if line.startswith("target: METIS halo volume at P=8 on generated")]
    assert len(verdict) == 1 and verdict[0].endswith(("): MET", "): NOT MET"))
    assert "== real runs" not in out
    with open(table, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0].keys()) == bench.CSV_COLUMNS
    plans = [r for r in rows if r["section"] == "plan"]
    projections = [r for r in rows if r["section"] == "projection"]
    assert len(plans) == 2 * len(bench.DEFAULT_METHODS) * 3
    # Per graph: (methods + CAGNET-1D) x 2 networks x 3 rank counts.
    assert len(projections) == 2 * (len(bench.DEFAULT_METHODS) + 1) * 2 * 3
    assert not [r for r in rows if r["section"] == "run"]
    metis = next(r for r in plans if (r["graph"], r["method"], r["ranks"]) == ("cora", "metis",
                                                                               "4"))
    part = partition(sph.datasets.load("cora").adj, 4, "metis", seed=0)
    assert int(metis["volume_rows"]) == part.communication_volume
    assert int(metis["cagnet_volume_rows"]) == 3 * 2708
    assert float(metis["volume_fraction"]) == pytest.approx(part.communication_fraction,
                                                            abs=1e-6)
    assert int(metis["peers_max"]) == part.peers.max()
    for r in projections:
        total = float(r["compute_ms"]) + float(r["exchange_ms"]) + float(r["allreduce_ms"])
        assert float(r["epoch_ms"]) == pytest.approx(total, rel=1e-4)
        assert float(r["efficiency"]) == pytest.approx(
            float(r["single_ms"]) / (int(r["ranks"]) * float(r["epoch_ms"])), rel=1e-3)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--graphs", "cora,nosuch"], "unknown graph 'nosuch'"),
    (["--methods", "metis,spectral"], "unknown partition method 'spectral'"),
    (["--max-ranks", "1"], "--max-ranks must be at least 2, got 1"),
    (["--run-ranks", "1"], "--run-ranks must be at least 2, got 1"),
])
def test_bad_arguments(args, message, capsys):
    status = main(["distributed", "--data", str(REPO_ROOT), "--skip-runs", *args])
    assert status == 2
    assert message in capsys.readouterr().err


def test_bad_argument_types_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["distributed", "--data", str(REPO_ROOT), "--epochs", "0"])
    assert exit_info.value.code == 2
    assert "positive integer" in capsys.readouterr().err


def test_missing_pubmed_is_a_clear_error(tmp_path, capsys):
    status = main(["distributed", "--data", str(tmp_path), "--graphs", "pubmed", "--skip-runs"])
    assert status == 2
    assert "pubmed_structure.npz not found" in capsys.readouterr().err


def test_missing_mpiexec_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(bench, "find_mpiexec", lambda: None)
    status = main(["distributed", "--data", str(REPO_ROOT), "--graphs", "cora", "--quick",
                   "--max-ranks", "2", "--hidden", "4", "--repeat", "1", "--methods",
                   "random"])
    assert status == 2
    assert "the real runs need mpiexec" in capsys.readouterr().err


# --- real runs under MPI -------------------------------------------------------------------

@pytest.mark.mpi
@requires_metis
@requires_torch
@pytest.mark.skipif(bench.find_mpiexec() is None, reason="mpiexec not found")
def test_real_runs_p1_p2(tmp_path):
    table = tmp_path / "runs.csv"
    command = [sys.executable, "-m", "pysparse_hpc.bench", "distributed", "--data",
               str(REPO_ROOT), "--graphs", "generated", "--quick", "--methods", "metis",
               "--max-ranks", "2", "--hidden", "8", "--epochs", "2", "--warmup", "2",
               "--repeat", "1", "--timeout", "240", "--csv", str(table)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "CAGNET-1D losses equal ours over 4 steps" in out
    checks = [line for line in out.splitlines() if " bytes per epoch measured " in line]
    assert len(checks) == 4 and all(line.endswith(": equal") for line in checks)
    assert "targets of the real runs: not judged" in out  # the quick graph is small
    with open(table, newline="") as handle:
        runs = {r["config"]: r for r in csv.DictReader(handle) if r["section"] == "run"}
    assert set(runs) == {"single", "ours", "cagnet"}
    single, ours, cagnet = runs["single"], runs["ours"], runs["cagnet"]
    assert (single["ranks"], ours["ranks"], cagnet["ranks"]) == ("1", "2", "2")
    assert int(ours["threads_per_rank"]) == max(1, int(single["threads_per_rank"]) // 2)
    assert float(single["bytes_per_epoch"]) == 0
    assert 0 < float(ours["halo_bytes"]) < float(cagnet["halo_bytes"])
    assert 0 < float(ours["reverse_halo_bytes"]) < float(cagnet["reverse_halo_bytes"])
    assert float(ours["allreduce_bytes"]) == float(cagnet["allreduce_bytes"]) > 0
    # CAGNET-1D receives the other rank's rows: n rows over both ranks, times the widths.
    forward, backward = bench.schedule(bench.gnn.GENERATED_FEATURES, 8,
                                       bench.gnn.GENERATED_CLASSES)
    assert float(cagnet["halo_bytes"]) == 6400 * sum(forward) * 4
    assert float(cagnet["reverse_halo_bytes"]) == 6400 * sum(backward) * 4
    assert float(ours["bytes_per_epoch"]) == pytest.approx(
        sum(float(ours[k]) for k in ("halo_bytes", "reverse_halo_bytes", "allreduce_bytes")))
    for r in runs.values():
        assert float(r["epoch_ms"]) > 0 and 0 <= float(r["exposed_fraction"]) <= 1


def _run(config, ranks, epoch, exposed_per_rank=(0.0,), owned_nnz=(100,)):
    kinds = ("halo", "reverse_halo", "allreduce")
    return bench.RunResult(
        graph="big", nodes=1000, edges=2_000_000, hidden=16, ranks=ranks,
        threads_per_rank=2 // ranks, config=config, epoch=epoch, exposed=max(exposed_per_rank),
        exposed_by_kind={kind: max(exposed_per_rank) / 3 for kind in kinds},
        bytes_received={kind: 0.0 if ranks == 1 else 1e6 for kind in kinds}, losses=[1.0],
        orders=[], owned_rows=[1000 // ranks] * ranks, halo_rows=[0] * ranks,
        owned_nnz=list(owned_nnz), loss_rel_diff_vs_ours=None, epochs=1,
        exposed_per_rank=list(exposed_per_rank))


def test_run_verdicts_judge_and_name_the_limit():
    single = _run("single", 1, 0.100)
    balanced = [single, _run("ours", 2, 0.110, (0.010, 0.012), (50, 50)),
                _run("cagnet", 2, 0.130, (0.02, 0.03), (50, 50))]
    lines = bench.run_verdicts(balanced)
    assert lines[0].endswith("big h16 1.10x MET: MET")
    assert lines[1].endswith("big h16 10.9% MET: MET")
    assert lines[2].startswith("ratio: big h16: CAGNET-1D epoch 130.0 ms = 1.18x ours")
    # One rank holds most of the entries: the other waits for it, which is not the network.
    skewed = [single, _run("ours", 2, 0.130, (0.002, 0.050), (95, 5))]
    lines = bench.run_verdicts(skewed)
    assert lines[0].endswith("1.30x NOT MET: NOT MET")
    assert lines[1].endswith("38.5% NOT MET: NOT MET")
    assert lines[2].startswith("limit: big h16: load imbalance: the busiest rank is blocked "
                               "2.0 ms (2%)")
    assert "entries of Â per rank 95/5 (balance 1.900)" in lines[2]
    # Every rank waits: communication.
    slow = [single, _run("ours", 2, 0.100, (0.040, 0.045), (50, 50))]
    assert "limit: big h16: communication: every rank is blocked" in bench.run_verdicts(slow)[2]
    small = [bench.RunResult(**{**r.__dict__, "edges": 10}) for r in balanced]
    assert bench.run_verdicts(small)[0].startswith("targets of the real runs: not judged")


_VECTOR_COLLECTIVES = """
import numpy as np
from pysparse_hpc import distributed
comm = distributed.init()
rank, size = comm.rank, comm.size
counts = [2 * q + 1 for q in range(size)]  # uneven blocks
offsets = np.concatenate([[0], np.cumsum(counts)])
mine = np.full(counts[rank], rank, dtype=np.float32)
gathered = np.empty(offsets[-1], dtype=np.float32)
comm.Allgatherv(mine, gathered, counts, kind="halo")
assert np.array_equal(gathered, np.repeat(np.arange(size, dtype=np.float32), counts))
again = np.empty_like(gathered)
comm.Iallgatherv(mine, again, counts, kind="halo").wait()
assert np.array_equal(again, gathered)
contribution = np.arange(offsets[-1], dtype=np.float64) * (rank + 1)
block = np.empty(counts[rank])
comm.Ireduce_scatter(contribution, block, counts, kind="reverse_halo").wait()
expected = np.arange(offsets[rank], offsets[rank + 1]) * (size * (size + 1) // 2)
assert np.allclose(block, expected)
stats = comm.stats()
others = offsets[-1] - counts[rank]
assert stats["halo"]["bytes_received"] == 2 * 4 * others, stats
assert stats["halo"]["bytes_sent"] == 2 * 4 * counts[rank] * (size - 1), stats
assert stats["reverse_halo"]["bytes_received"] == 8 * counts[rank] * (size - 1), stats
assert stats["reverse_halo"]["bytes_sent"] == 8 * others, stats
assert set(comm.wait_seconds()) == {"halo", "reverse_halo"}
print("ok", rank)
"""


@pytest.mark.mpi
@pytest.mark.skipif(bench.find_mpiexec() is None, reason="mpiexec not found")
def test_communicator_vector_collectives_on_three_ranks():
    result = subprocess.run([bench.find_mpiexec(), "-n", "3", sys.executable, "-c",
                             _VECTOR_COLLECTIVES], capture_output=True, text=True, timeout=120,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("ok") == 3  # every rank's checks passed (lines may interleave)
