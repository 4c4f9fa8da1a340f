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
    methods, ranks = ["metis", "metis-nnz", "rabbit", "rcm", "contiguous", "random"], [2, 4, 8]
    plans = bench.make_plans("cora", cora, methods, ranks)
    assert [(p.method, p.ranks) for p in plans] == [(m, r) for m in methods for r in ranks]
    reordered = {m: sph.permute(cora, sph.reorder(cora, m)) for m in ("rabbit", "rcm")}
    nnz_hat = cora.nnz + cora.shape[0]  # Cora stores no diagonal: A + I adds one per row
    for plan in plans:
        if plan.method in reordered:
            part = partition(reordered[plan.method], plan.ranks, "contiguous")
        elif plan.method == "metis-nnz":
            part = partition(cora, plan.ranks, "metis", seed=0, balance="nnz")
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


def test_planted_plans_deal_whole_communities_in_blocks():
    """"planted" gives each rank whole communities, consecutive ones, as evenly as they
    divide; its halo is the brute-force count of the remote neighbours; without communities
    there is no such plan."""
    from pysparse_hpc.generators import planted_partition
    adj, communities = planted_partition(10, 8, 4.0, 2.0, seed=3, shuffle=True)
    owner = bench.planted_owner(communities, 4)
    for c in range(10):  # one owner per community, never decreasing with the community
        assert len(set(owner[communities == c])) == 1
    assert [int(owner[communities == c][0]) for c in range(10)] == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    plans = bench.make_plans("g", adj, ["planted", "random"], [4], communities=communities)
    assert [p.method for p in plans] == ["planted", "random"]
    csr = adj.tocsr()
    halo = [len({int(j) for i in np.flatnonzero(owner == r)
                 for j in csr.indices[csr.indptr[i]:csr.indptr[i + 1]] if owner[j] != r})
            for r in range(4)]
    np.testing.assert_array_equal(plans[0].halo_rows, halo)
    assert plans[0].volume == sum(halo) and plans[0].cagnet_volume == 3 * 80
    assert [p.method for p in bench.make_plans("g", adj, ["planted", "random"], [4])] == [
        "random"]


@requires_metis
def test_mixing_sweep_keeps_the_degree_and_the_target_follows_the_share_outside():
    sweep = bench.mixing_plans([4.0, 0.5], quick=True)
    assert [external for external, _ in sweep] == [4.0, 0.5]
    metis = {external: next(p for p in plans if p.method == "metis") for external, plans in sweep}
    planted = {external: next(p for p in plans if p.method == "planted")
               for external, plans in sweep}
    # Same nodes, about the same edges (expected degree 12 either way).
    assert metis[4.0].nodes == metis[0.5].nodes == 200 * 32
    assert metis[0.5].nnz == pytest.approx(metis[4.0].nnz, rel=0.15)
    assert metis[4.0].fraction > 0.3 > 0.1 > metis[0.5].fraction
    assert planted[4.0].fraction > 0.3 and planted[0.5].fraction < 0.1
    lines = bench.mixing_lines(sweep)
    assert lines[2].split()[:3] == ["generated", "ext=4", "0.333"]
    assert lines[2].endswith("NOT MET") and lines[3].endswith(" MET")


@requires_metis
def test_metis_nnz_balances_the_entries_of_a_skewed_graph():
    # R-MAT's hubs gather in a few of METIS's equal node counts; weighting every node by its
    # entries + 1 evens out the entries of Â (what the SpMMs multiply).
    adj = bench.build_case("rmat", REPO_ROOT, quick=True).adj
    plans = {p.method: p for p in bench.make_plans("rmat", adj, ["metis", "metis-nnz"], [8])}
    rows, nnz = plans["metis"], plans["metis-nnz"]
    assert nnz.method == "metis-nnz" and nnz.ranks == 8
    assert rows.nnz_balance > 1.5 and nnz.nnz_balance < 1.1
    assert nnz.owned_nnz_hat.max() < rows.owned_nnz_hat.max()
    assert rows.row_balance < nnz.row_balance  # the price: unequal node counts
    part = bench.partition_graph(adj, 8, "metis-nnz")
    assert part.method == "metis-nnz"
    np.testing.assert_array_equal(part.owner,
                                  partition(adj, 8, "metis", seed=0, balance="nnz").owner)


def _work_balance(plan, c):
    """max / mean over ranks of the model's per-rank work in entries: entries of Â + c rows."""
    work = plan.owned_nnz_hat + c * plan.owned_rows
    return work.max() / work.mean()


@requires_metis
def test_metis_work_balances_entries_plus_c_rows():
    # METIS weighing every node by its entries + c evens out entries + c rows (the model's
    # compute in units of t_entry_step) better than balancing rows or entries alone.
    adj = bench.build_case("rmat", REPO_ROOT, quick=True).adj
    ratios = {16: 40.0, 64: 55.0}
    plans = bench.make_plans("rmat", adj, ["metis", "metis-nnz", "metis-work"], [2, 8],
                             work_ratios=ratios)
    assert [(p.method, p.hidden, p.ranks) for p in plans] == [
        ("metis", 0, 2), ("metis", 0, 8), ("metis-nnz", 0, 2), ("metis-nnz", 0, 8),
        ("metis-work", 16, 2), ("metis-work", 16, 8), ("metis-work", 64, 2),
        ("metis-work", 64, 8)]
    by = {(p.method, p.hidden, p.ranks): p for p in plans}
    for hidden, c in ratios.items():
        for ranks in (2, 8):
            work = by["metis-work", hidden, ranks]
            assert work.work_ratio == c and work.label == f"metis-work h{hidden}"
            assert work.fits(hidden) and not work.fits(hidden + 1)
            assert _work_balance(work, c) < min(_work_balance(by["metis", 0, ranks], c),
                                                _work_balance(by["metis-nnz", 0, ranks], c))
    assert by["metis", 0, 2].fits(16) and by["metis", 0, 2].work_ratio is None
    part = bench.partition_graph(adj, 2, "metis-work", work_ratio=40.0)
    assert part.method == "metis-work"
    np.testing.assert_array_equal(part.owner,
                                  partition(adj, 2, "metis", seed=0, balance=40.0).owner)
    with pytest.raises(ValueError, match="needs the work ratio c"):
        bench.partition_graph(adj, 2, "metis-work")
    with pytest.raises(ValueError, match="need the work ratios c per hidden width"):
        bench.make_plans("rmat", adj, ["metis-work"], [2])


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
    # c = t_row / t_entry_step: 8.2e-4 s per row over 1.8e-3 s / 30 entries.
    assert rates.step_entry_seconds == pytest.approx(6e-5)
    assert rates.work_ratio == pytest.approx(8.2e-4 / 6e-5)
    # The model's compute is t_entry_step x (entries + c rows): what metis-work balances.
    assert rates.compute_seconds(4, 12) == pytest.approx(6e-5 * (12 + rates.work_ratio * 4))
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
    # the peer's indices as scipy picks them for its size, as ours are (they were int64)
    assert operator.rows.index_dtype == np.int32 == graph.local.index_dtype
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
                   "1", "--mixing", "4,0.5", "--csv", str(table), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert status == 0
    assert "== exact plans" in out and "== projection (alpha-beta): 25GB/s: alpha 2 us, beta " \
        "25 GB/s, 100GB/s: alpha 2 us, beta 100 GB/s" in out
    assert "model: per step, compute = max over ranks" in out
    assert "METIS halo volume at P=8 on cora" in out and "(no target on this graph)" in out
    assert "METIS balanced by entries (metis-nnz): halo volume at P=8 on cora" in out
    summary = [line for line in out.splitlines()
               if line.startswith("projection: cora h16 25GB/s")]
    assert len(summary) == 1 and " metis-nnz " in summary[0] and " metis-work " in summary[0]
    ratio = [line for line in out.splitlines() if line.startswith("work ratio: cora h16: c = ")]
    assert len(ratio) == 1 and "METIS vertex weights = stored entries + c" in ratio[0]
    c = float(ratio[0].split(" = ")[3].split()[0])
    assert c > 0
    assert f"METIS balanced by work (metis-work h16, c {c:.1f}): halo volume at P=8 on cora" \
        in out
    verdict = [line for line in out.splitlines()
               if line.startswith("target: METIS halo volume at P=8 on generated")]
    assert len(verdict) == 1 and verdict[0].endswith(("): MET", "): NOT MET"))
    planted = out.splitlines()[out.splitlines().index(verdict[0]) + 1]
    assert planted.startswith("  planted communities in blocks at P=8 on generated: ")
    # The quick planted graph: a third of the edges go anywhere, METIS beats the planted split.
    assert "METIS does better than the generator's own communities" in planted
    sweep = out.split("== mixing sweep")[1].split("\n\n")[0].splitlines()
    assert [line.split()[1] for line in sweep[3:]] == ["ext=4", "ext=0.5"]
    assert sweep[3].endswith("NOT MET") and sweep[4].endswith(" MET")
    assert "== real runs" not in out
    with open(table, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0].keys()) == bench.CSV_COLUMNS
    plans = [r for r in rows if r["section"] == "plan"]
    projections = [r for r in rows if r["section"] == "projection"]
    # "planted": on the generated graph only (cora has no planted communities).
    assert len(plans) == (2 * len(bench.DEFAULT_METHODS) - 1) * 3
    assert {r["graph"] for r in plans if r["method"] == "planted"} == {"generated"}
    mixing = [r for r in rows if r["section"] == "mixing"]
    assert [(r["graph"], r["method"], r["ranks"]) for r in mixing] == [
        ("generated ext=4", "metis", "8"), ("generated ext=4", "planted", "8"),
        ("generated ext=0.5", "metis", "8"), ("generated ext=0.5", "planted", "8")]
    # Per graph: (methods + CAGNET-1D) x 2 networks x 3 rank counts.
    assert len(projections) == (2 * (len(bench.DEFAULT_METHODS) + 1) - 1) * 2 * 3
    assert not [r for r in rows if r["section"] == "run"]
    metis = next(r for r in plans if (r["graph"], r["method"], r["ranks"]) == ("cora", "metis",
                                                                               "4"))
    part = partition(sph.datasets.load("cora").adj, 4, "metis", seed=0)
    assert int(metis["volume_rows"]) == part.communication_volume
    assert int(metis["cagnet_volume_rows"]) == 3 * 2708
    assert float(metis["volume_fraction"]) == pytest.approx(part.communication_fraction,
                                                            abs=1e-6)
    assert int(metis["peers_max"]) == part.peers.max()
    by_entries = next(r for r in plans if (r["graph"], r["method"], r["ranks"])
                      == ("cora", "metis-nnz", "4"))
    part = partition(sph.datasets.load("cora").adj, 4, "metis", seed=0, balance="nnz")
    assert int(by_entries["volume_rows"]) == part.communication_volume
    assert float(by_entries["nnz_balance"]) == pytest.approx(part.nnz_balance, abs=1e-4)
    assert by_entries["work_ratio"] == "" and by_entries["hidden"] == ""
    by_work = next(r for r in plans if (r["graph"], r["method"], r["ranks"])
                   == ("cora", "metis-work", "4"))
    assert by_work["hidden"] == "16" and float(by_work["work_ratio"]) == pytest.approx(c, abs=0.06)
    part = partition(sph.datasets.load("cora").adj, 4, "metis", seed=0,
                     balance=float(by_work["work_ratio"]))
    assert int(by_work["volume_rows"]) == part.communication_volume
    assert all(float(r["work_ratio"]) == float(by_work["work_ratio"]) for r in projections
               if (r["graph"], r["method"]) == ("cora", "metis-work"))
    assert {r["method"] for r in projections} == set(bench.DEFAULT_METHODS) | {bench.CAGNET}
    for r in projections:
        total = float(r["compute_ms"]) + float(r["exchange_ms"]) + float(r["allreduce_ms"])
        assert float(r["epoch_ms"]) == pytest.approx(total, rel=1e-4)
        assert float(r["efficiency"]) == pytest.approx(
            float(r["single_ms"]) / (int(r["ranks"]) * float(r["epoch_ms"])), rel=1e-3)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("c", [1.23456789012345, 1 / 3, 51.000049, 3.0])
def test_the_csv_keeps_every_digit_of_the_work_ratio(c):
    # The CSV's c rebuilds a metis-work partition; a rounded c can weigh the nodes differently.
    assert float(bench._ratio_text(c)) == c
    assert bench._ratio_text(None) == ""


@pytest.mark.parametrize("args, message", [
    (["--graphs", "cora,nosuch"], "unknown graph 'nosuch'"),
    (["--methods", "metis,spectral"], "unknown partition method 'spectral'"),
    (["--max-ranks", "1"], "--max-ranks must be in [2, 4096], got 1"),
    (["--run-ranks", "1"], "--run-ranks must be at least 2, got 1"),
    (["--run-methods", "metis,rabbit"], "unknown run method 'rabbit'"),
    (["--mixing", "1,x"], "--mixing must be comma-separated numbers or 'none', got '1,x'"),
    (["--mixing", "13"], "--mixing degrees must lie in [0, 12], got 13"),
    (["--run-methods", "metis", "--cagnet-methods", "metis-nnz"],
     "unknown CAGNET method 'metis-nnz'"),
])
def test_bad_arguments(args, message, capsys):
    # Refused before any job is launched (or mpiexec looked for).
    status = main(["distributed", "--data", str(REPO_ROOT), *args])
    assert status == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--run-ranks", "3"], "--run-ranks is an option of the real runs, which --skip-runs "
                           "leaves out"),
    (["--rounds", "2", "--run-methods", "metis", "--cagnet-methods", "none"],
     "--run-methods, --cagnet-methods, --rounds are options of the real runs"),
])
def test_run_options_are_refused_without_runs(args, message, capsys):
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


def test_real_runs_give_metis_work_one_job_per_width(monkeypatch):
    # Without MPI: the jobs real_runs launches, each metis-work job with one hidden width
    # and its graphs' c at that width.
    import argparse
    launched = []

    def fake_launch(ranks, threads, config, timeout, mpiexec=None):
        launched.append((ranks, threads, config))
        return dict(threads_per_rank=threads, cases=[])
    monkeypatch.setattr(bench, "find_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(bench, "launch", fake_launch)
    monkeypatch.setattr(bench, "_load_average", lambda: 0.5)
    args = argparse.Namespace(threads=2, run_ranks=2, hidden=[16, 64], epochs=1, warmup=1,
                              seed=0, data_dir=".", quick=True, repeat=1, rounds=1,
                              timeout=10)
    ratios = {("a", 16): 30.0, ("a", 64): 50.0, ("b", 16): 35.0, ("b", 64): 55.0}
    runs, loads = bench.real_runs(args, ["a", "b"], ["metis", "metis-work"], ["metis"],
                                  work_ratios=ratios)
    assert runs == []
    assert [label for label, _, _ in loads] == ["P=1", "P=2 metis", "P=2 metis-work h16",
                                                "P=2 metis-work h64"]
    (_, _, single), (_, _, rows), (_, _, work16), (_, _, work64) = launched
    assert single["method"] is None and single["hidden"] == [16, 64]
    assert rows["method"] == "metis" and rows["cagnet"] and rows["work_ratios"] is None
    assert (work16["method"], work16["hidden"], work16["cagnet"]) == ("metis-work", [16], False)
    assert work16["work_ratios"] == {"a": 30.0, "b": 35.0}
    assert (work64["hidden"], work64["work_ratios"]) == ([64], {"a": 50.0, "b": 55.0})
    with pytest.raises(bench.UsageError, match="needs the measured work ratios"):
        bench.real_runs(args, ["a"], ["metis-work"])


# --- real runs under MPI -------------------------------------------------------------------

@pytest.mark.mpi
@requires_metis
@requires_torch
@pytest.mark.skipif(bench.find_mpiexec() is None, reason="mpiexec not found")
def test_real_runs_p1_p2(tmp_path):
    table = tmp_path / "runs.csv"
    command = [sys.executable, "-m", "pysparse_hpc.bench", "distributed", "--data",
               str(REPO_ROOT), "--graphs", "generated", "--quick", "--methods",
               "metis,metis-nnz,metis-work", "--run-methods", "metis,metis-nnz,metis-work",
               "--max-ranks", "2", "--hidden", "8", "--epochs", "2",
               "--warmup", "2", "--repeat", "1", "--timeout", "240", "--cagnet-methods",
               "metis", "--csv", str(table)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "CAGNET-1D losses equal ours over 4 steps" in out
    checks = [line for line in out.splitlines() if " bytes per epoch measured " in line]
    # ours on three partitions, CAGNET-1D on METIS's only: halo and reverse halo each.
    assert len(checks) == 8 and all(line.endswith(": equal") for line in checks)
    ratio = [line for line in out.splitlines()
             if line.startswith("work ratio: generated h8 metis-work: partitioned with c = ")]
    assert len(ratio) == 1
    c = float(ratio[0].split(" = ")[1].split()[0])
    assert "work ratio: generated h8: c = t_row / t_entry_step = " in out
    for method in ("metis", "metis-nnz", "metis-work"):
        losses = [line for line in out.splitlines()
                  if line.startswith(f"check: generated h8 {method}: P=2 losses vs P=1")]
        assert len(losses) == 1 and losses[0].endswith(": equal (rtol 1e-05)"), losses
        assert f"ranks: generated h8 {method} ours: compute " in out
    assert "partitions: generated h8 ours: metis " in out and "x metis's (" in out
    assert "targets of the real runs: not judged" in out  # the quick graph is small
    with open(table, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["section"] == "run"]
    runs = {(r["method"], r["config"]): r for r in rows}
    assert set(runs) == {("", "single"), ("metis", "ours"), ("metis", "cagnet"),
                         ("metis-nnz", "ours"), ("metis-work", "ours")}
    by_work = runs["metis-work", "ours"]
    assert float(by_work["work_ratio"]) == pytest.approx(c, abs=0.06)
    assert runs["metis", "ours"]["work_ratio"] == ""
    single, ours, cagnet = runs["", "single"], runs["metis", "ours"], runs["metis", "cagnet"]
    by_entries = runs["metis-nnz", "ours"]
    assert by_entries["ranks"] == "2" and float(by_entries["epoch_ms"]) > 0
    assert float(by_entries["allreduce_bytes"]) == float(ours["allreduce_bytes"])
    for r in (ours, by_entries, by_work, cagnet):
        compute = [float(t) for t in r["rank_compute_ms"].split("/")]
        blocked = [float(t) for t in r["rank_blocked_ms"].split("/")]
        assert len(compute) == len(blocked) == 2 and min(compute) > 0 and min(blocked) >= 0
        assert max(compute) <= float(r["epoch_ms"]) * 1.5  # a median step less its waits
        assert sum(map(int, r["rank_nnz"].split("/"))) > 0
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


def _run(config, ranks, epoch, exposed_per_rank=(0.0,), owned_nnz=(100,), method=None,
         rank_compute=()):
    kinds = ("halo", "reverse_halo", "allreduce")
    method = ("metis" if ranks > 1 else "") if method is None else method
    return bench.RunResult(
        graph="big", nodes=1000, edges=2_000_000, hidden=16, ranks=ranks,
        threads_per_rank=2 // ranks, config=config, epoch=epoch, exposed=max(exposed_per_rank),
        exposed_by_kind={kind: max(exposed_per_rank) / 3 for kind in kinds},
        bytes_received={kind: 0.0 if ranks == 1 else 1e6 for kind in kinds}, losses=[1.0],
        orders=[], owned_rows=[1000 // ranks] * ranks, halo_rows=[0] * ranks,
        owned_nnz=list(owned_nnz), loss_rel_diff_vs_ours=None, epochs=1,
        exposed_per_rank=list(exposed_per_rank), method=method,
        rank_compute=list(rank_compute),
        rank_blocked=list(exposed_per_rank) if rank_compute else [])


def test_run_verdicts_judge_and_name_the_limit():
    single = _run("single", 1, 0.100)
    balanced = [single, _run("ours", 2, 0.110, (0.010, 0.012), (50, 50)),
                _run("cagnet", 2, 0.130, (0.02, 0.03), (50, 50))]
    lines = bench.run_verdicts(balanced)
    assert lines[0].endswith("graphs >= 1M edges, metis partition: big h16 1.10x MET: MET")
    assert lines[1].endswith("metis partition: big h16 10.9% MET: MET")
    assert lines[2].startswith("ratio: big h16 metis: CAGNET-1D epoch 130.0 ms = 1.18x ours")
    # One rank holds most of the entries: the other waits for it, which is not the network.
    skewed = [single, _run("ours", 2, 0.130, (0.002, 0.050), (95, 5))]
    lines = bench.run_verdicts(skewed)
    assert lines[0].endswith("1.30x NOT MET: NOT MET")
    assert lines[1].endswith("38.5% NOT MET: NOT MET")
    assert lines[2].startswith("limit: big h16 metis: load imbalance: the busiest rank is "
                               "blocked 2.0 ms (2%)")
    assert "entries of Â per rank 95/5 (balance 1.900)" in lines[2]
    # Every rank waits: communication.
    slow = [single, _run("ours", 2, 0.100, (0.040, 0.045), (50, 50))]
    assert "limit: big h16 metis: communication: every rank is blocked" in \
        bench.run_verdicts(slow)[2]
    small = [bench.RunResult(**{**r.__dict__, "edges": 10}) for r in balanced]
    assert bench.run_verdicts(small)[0].startswith("targets of the real runs: not judged")


def test_epoch_target_states_the_threads_each_side_ran():
    """``threads // P`` per rank (at least one) does not always add up to the single process's
    threads: the epoch target then says both totals instead of claiming the same."""
    single = _run("single", 1, 0.100)
    line = bench.run_verdicts([single, _run("ours", 2, 0.110)])[0]
    assert "the single-process epoch at the same total threads (2), graphs" in line
    three = bench.RunResult(**{**single.__dict__, "threads_per_rank": 3})
    line = bench.run_verdicts([three, _run("ours", 2, 0.110)])[0]
    assert ("the single-process epoch on 2 threads in all (2 x 1) against its 3, NOT the same "
            "total, graphs") in line, line
    assert "same total threads" not in line


def test_verdicts_per_partition_and_per_rank_compute():
    # METIS by rows: rank 0 computes 120 ms and hardly waits, rank 1 computes 10 and waits
    # for it; by entries both compute 70 ms and wait little.
    single = _run("single", 1, 0.100)
    rows = _run("ours", 2, 0.124, (0.002, 0.112), (95, 5), "metis", (0.120, 0.010))
    entries = _run("ours", 2, 0.075, (0.004, 0.006), (51, 49), "metis-nnz", (0.070, 0.068))
    runs = [single, rows, entries]
    lines = bench.run_verdicts(runs)
    assert lines[0].endswith("metis partition: big h16 1.24x MET: MET")
    assert lines[1].endswith("metis partition: big h16 90.3% NOT MET: NOT MET")
    assert lines[2].startswith("limit: big h16 metis: load imbalance: the busiest rank is "
                               "blocked 2.0 ms (2%), the others wait for it")
    assert "compute per rank 120.0/10.0 ms, blocked per rank 2.0/112.0 ms" in lines[2]
    assert lines[3].endswith("metis-nnz partition: big h16 0.75x MET: MET")
    assert lines[4].endswith("metis-nnz partition: big h16 8.0% MET: MET")
    assert len(lines) == 5
    ranks = bench.rank_lines(runs)
    assert ranks == [
        "ranks: big h16 metis ours: compute 120.0/10.0 ms (max/mean 1.85), blocked "
        "2.0/112.0 ms (medians over the steps); entries of Â 95/5 (balance 1.900), rows "
        "500/500, halo rows 0/0",
        "ranks: big h16 metis-nnz ours: compute 70.0/68.0 ms (max/mean 1.01), blocked "
        "4.0/6.0 ms (medians over the steps); entries of Â 51/49 (balance 1.020), rows "
        "500/500, halo rows 0/0"]
    (comparison,) = bench.partition_comparison(runs)
    assert comparison.startswith("partitions: big h16 ours: metis 124.00 ms = 1.24x P=1 "
                                 "(90.3% exposed, entries balance 1.900")
    assert "metis-nnz 75.00 ms = 0.75x P=1 = 0.60x metis's (8.0% exposed" in comparison
    assert bench.partition_comparison([single, rows]) == []
    work = bench.RunResult(**{**entries.__dict__, "method": "metis-work", "work_ratio": 41.25})
    assert bench.run_ratio_lines([single, rows, work]) == [
        "work ratio: big h16 metis-work: partitioned with c = 41.2 (METIS vertex weights = "
        "stored entries + c)"]


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
