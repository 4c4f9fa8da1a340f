"""``python -m pysparse_hpc.bench lion``: its measuring functions on one rank in this process
(structure, byte check, projection, verdicts), and a tiny two-rank job under ``mpiexec``."""
import importlib.util
import math

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from pysparse_hpc.bench import lion  # noqa: E402
from pysparse_hpc.bench.__main__ import main  # noqa: E402
from pysparse_hpc.bench.distributed import allreduce_seconds, launch  # noqa: E402
from pysparse_hpc.distributed import Communicator  # noqa: E402
from pysparse_hpc.distributed._comm import mpiexec_path  # noqa: E402
from pysparse_hpc.optim import bytes_per_step  # noqa: E402

requires_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="needs mpi4py and mpiexec (pip install mpi4py mpich, or the [mpi] extra)")


@pytest.fixture(autouse=True)
def one_thread():
    """Each rank of the benchmark runs one thread: so do these in-process measurements (the
    MLP's steps are many times slower with threads competing for shared cores)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CONTENDERS = [lion.parse_contender(label) for label in ("adam", "none", "votes", "signs/local")]
D = 1024


def _result(label, ranks=2, optimizer_bytes=None, compute=0.01, window_syncs=None,
            **overrides):
    """A `StepResult` of one warm-up and two timed steps whose counters agree with
    `bytes_per_step` and the momentum schedule unless told otherwise."""
    contender = lion.parse_contender(label)
    compression = contender[2]
    if window_syncs is None:
        sync = lion._sync_of(contender)
        window_syncs = lion.momentum_syncs(sync, 3) - lion.momentum_syncs(sync, 1)
    fields = dict(
        workload=lion.MLP, contender=contender, ranks=ranks, parameters=D, step=compute,
        compute=compute, blocked=0.0, optimizer_compute=compute / 2,
        optimizer_bytes=optimizer_bytes or [bytes_per_step(compression, D, ranks, rank)
                                            for rank in range(ranks)],
        momentum_bytes=[window_syncs * 4 * D / 2] * ranks, other_bytes=[0] * ranks,
        other_messages=[0] * ranks, optimizer_calls=1.0, window_syncs=window_syncs, warmup=1,
        timed=2, training_steps=100)
    fields.update(overrides)
    result = lion.StepResult(**fields)
    result.mismatches = lion.check_bytes(result)
    return result


def test_steps_measured_on_one_rank():
    from pysparse_hpc.bench._lion_worker import measure_steps
    config = dict(workloads=["mlp-digits"], contenders=CONTENDERS, warmup=1, steps=2)
    job = dict(cases=measure_steps(config, Communicator(None)))
    results = lion.step_results(job)
    assert [r.label for r in results] == ["adam", "none", "votes", "signs/local"]
    for r in results:
        assert r.ranks == 1 and r.parameters == 1_126_410 and r.timed == 2
        assert r.step > 0 and 0 < r.compute <= r.step * 1.01 and r.optimizer_compute > 0
        assert r.optimizer_bytes == [0] and r.bytes_per_step == 0 and r.mismatches == []
        assert r.training_steps == lion.MLP_EPOCHS * 14   # 1437 rows, batches of 96
        projection = lion.project(r, lion.links()[0])
        assert projection.step == r.compute and projection.limit == "compute"


def test_accuracy_measured_on_one_rank():
    from pysparse_hpc.bench._lion_worker import measure_accuracy
    config = dict(workloads=["mlp-digits", "gcn-cora"], contenders=CONTENDERS[1:3],
                  seeds=[0], gcn_epochs=2, mlp_epochs=1)
    accuracies = lion.accuracy_results(dict(cases=measure_accuracy(config,
                                                                   Communicator(None))))
    assert [(a.workload, a.label) for a in accuracies] == [
        ("mlp-digits", "none"), ("mlp-digits", "votes"), ("gcn-cora", "none"),
        ("gcn-cora", "votes")]
    assert all(len(a.accuracies) == 1 and 0 < a.mean <= 1 and a.replicas_equal
               for a in accuracies)


def test_momentum_schedule():
    assert lion.momentum_syncs("growing", 16) == 16            # gap 1 for the first 16
    assert lion.momentum_syncs("growing", 17) == 16            # then 2 ...
    assert lion.momentum_syncs("growing", 18) == 17
    assert lion.momentum_syncs("growing", 48) == 30            # 2 up to j = 25, then 3
    assert lion.momentum_syncs("always", 7) == 7 and lion.momentum_syncs("local", 7) == 0


def test_byte_check_finds_mismatches():
    assert _result("votes").mismatches == lion.check_bytes(_result("votes")) == []
    assert lion.check_bytes(_result("1bit", ranks=3)) == []
    wrong = _result("votes", optimizer_bytes=[100, bytes_per_step("votes", D, 2)])
    assert lion.check_bytes(wrong) == [
        f"rank 0: 100 optimizer bytes per step counted, bytes_per_step says "
        f"{bytes_per_step('votes', D, 2)}"]
    # The growing schedule syncs at steps 2 and 3 (the timed ones after one warm-up step).
    assert lion.check_bytes(_result("signs")) == []
    unsynced = lion.check_bytes(_result("signs", window_syncs=0))
    assert "the growing schedule has 2" in unsynced[0]
    lines = lion.byte_check_lines([wrong])
    assert lines[0].startswith("BYTE CHECK FAILED mlp-digits P=2 votes: rank 0")


def test_projection_charges_each_collective():
    link = lion.links()[0]
    assert link.alpha == pytest.approx(50e-6) and link.beta == 125e6
    fp32 = _result("none")
    assert lion.communication_seconds(fp32, link) == allreduce_seconds(4 * D, 2, link)
    signs = _result("signs/local", ranks=3)
    block = math.ceil(D / 8)
    assert lion.communication_seconds(signs, link) == pytest.approx(
        2 * block / link.beta + 2 * link.alpha)
    one_bit = _result("1bit/local", ranks=3)   # fold in, one exchange, fold out
    assert lion.communication_seconds(one_bit, link) == pytest.approx(
        3 * (link.alpha + block / link.beta))
    growing = _result("votes")
    syncs = lion.momentum_syncs("growing", 100) / 100
    assert lion.communication_seconds(growing, link) == pytest.approx(
        allreduce_seconds(growing.vote_bytes, 2, link)
        + syncs * allreduce_seconds(4 * D, 2, link))
    projection = lion.project(fp32, link)
    assert projection.latency == pytest.approx(2 * link.alpha)
    assert projection.transfer == pytest.approx(4 * D / link.beta)
    assert projection.step == pytest.approx(fp32.compute + projection.latency
                                            + projection.transfer)


def test_verdicts():
    results = [_result("none", compute=0.050), _result("votes", compute=0.005),
               _result("signs/local", compute=0.001)]
    lines = lion.bytes_verdict(results)
    assert lines[0].startswith("target: packed votes (votes) send >= 30x fewer bytes")
    # 1024 votes in 26 words of 40 base-3 digits: 4096 / 208 bytes; the bound 32 / log2(3).
    assert "P=2: 19.7x" in lines[0] and lines[0].endswith("NOT MET")
    assert lines[1] == ("  limit: bytes -- a vote count takes P + 1 values, log2(P + 1) = 1.58 "
                        "bits per coordinate at P=2 in any format an integer SUM allreduce adds "
                        "(packed here in 1.60), so at most 20.2x against 32 fp32 bits")
    assert "signs/local: P=2 32.0x" in lines[2]
    link = lion.links()[0]
    projections = [lion.project(r, link) for r in results]
    verdict = lion.projection_verdict(projections, link.name)
    speedup = projections[0].step / projections[2].step
    assert speedup >= 5 and verdict[0].endswith(f"signs/local {speedup:.2f}x, MET")
    slow = [lion.project(_result("none", compute=0.050), link),
            lion.project(_result("signs/local", compute=0.040), link)]
    verdict = lion.projection_verdict(slow, link.name)
    assert verdict[0].endswith("NOT MET") and verdict[2].startswith(
        "  limit at P=2 (signs/local): compute")
    accuracies = [lion.AccuracyResult("gcn-cora", "none", 2, [0.80, 0.82, 0.81]),
                  lion.AccuracyResult("gcn-cora", "votes", 2, [0.80, 0.815, 0.80]),
                  lion.AccuracyResult("gcn-cora", "1bit", 2, [0.78, 0.80, 0.79]),
                  lion.AccuracyResult("gcn-cora", "int8", 2, [0.75, 0.83, 0.81])]
    lines = lion.accuracy_verdict(accuracies)
    assert lines[0].endswith("gcn-cora worst 1bit -2.0, NOT MET")
    # 1bit: 2 points below with every seed (no spread); int8: 2 below on average, seeds apart.
    assert lines[1] == ("  below: 1bit on gcn-cora -2.0 points (95 % CI -2.0 to -2.0), int8 "
                        "on gcn-cora -1.3 points (95 % CI -9.3 to +6.7)")
    assert lines[2] == ("  paired by seed, the shortfall is beyond 1 point with 95 % "
                        "confidence for: 1bit on gcn-cora; the others are within the seeds' "
                        "resolution")
    assert lion.accuracy_verdict(accuracies[:2])[0].endswith("worst votes -0.5, MET")
    mean, half = lion.paired_difference(accuracies[3], accuracies[0])
    assert mean == pytest.approx(-0.04 / 3)
    differences = np.array([-0.05, 0.01, 0.0])
    assert half == pytest.approx(4.302653 * differences.std(ddof=1) / np.sqrt(3), rel=1e-6)


def test_verdicts_judge_modes_by_compression_not_label():
    """``votes/always`` votes as ``votes`` does and ``none/local`` is the fp32 allreduce as
    ``none`` is: the targets judge the rows by what they run, whatever the label says."""
    link = lion.links()[0]
    # The packed votes under another momentum sync, against none/local as the reference.
    results = [_result("none/local", compute=0.050), _result("votes/always", compute=0.005)]
    lines = lion.bytes_verdict(results)
    assert lines[0].startswith("target: packed votes (votes/always) send >= 30x"), lines
    assert "P=2: 19.7x" in lines[0] and lines[0].endswith("NOT MET")
    table = lion.format_steps(results).splitlines()
    assert table[2].split()[:7] == ["mlp-digits", "2", "votes/always", "always", "208", "B",
                                    "19.7x"], table   # fp32/it against none/local
    verdict = lion.projection_verdict([lion.project(r, link) for r in results], link.name)
    assert "best P=2 votes/always" in verdict[0], verdict
    # none/local is not a compressed mode: with none and none/local only, nothing is judged.
    same = [_result("none", compute=0.050), _result("none/local", compute=0.001)]
    verdict = lion.projection_verdict([lion.project(r, link) for r in same], link.name)
    assert verdict[0].endswith("not measured (needs the MLP with none and a compressed mode at "
                               "P > 1)"), verdict
    accuracies = [lion.AccuracyResult("gcn-cora", "none", 2, [0.80, 0.82]),
                  lion.AccuracyResult("gcn-cora", "none/local", 2, [0.70, 0.72]),
                  lion.AccuracyResult("gcn-cora", "votes/always", 2, [0.80, 0.81])]
    assert lion.accuracy_verdict(accuracies)[0].endswith("gcn-cora worst votes/always -0.5, MET")
    assert lion.accuracy_verdict(accuracies[1:])[0].endswith(
        "gcn-cora worst votes/always +9.5, MET")
    table = lion.format_accuracy(accuracies[1:]).splitlines()
    assert table[2].split()[:5] == ["gcn-cora", "2", "votes/always", "80.5", "+9.5"], table


def test_report_and_outputs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    results = [_result(label, ranks=ranks) for ranks in (2, 3)
               for label in ("adam", "none", "votes", "1bit")]
    networks = lion.links()
    report = lion.Report(results, [lion.project(r, n) for r in results for n in networks],
                         [lion.AccuracyResult(lion.MLP, "none", 2, [0.9])],
                         lion.PeerResult(10, 0.001, 0.002, 0.0), networks)

    class Args:
        repeat, seeds = 2, 1
    text = "\n".join(lion.report_lines(report, Args))
    for piece in ("mlp-digits    2  votes       growing", "byte check: the counted bytes",
                  "lion-pytorch/ours 2.00x", "target: packed votes", "target: on mlp-digits"):
        assert piece in text, text
    lion.write_csv(report, tmp_path / "lion.csv")
    rows = (tmp_path / "lion.csv").read_text().splitlines()
    assert rows[0].startswith("section,workload,ranks,mode") and len(rows) == 1 + 8 + 24 + 1 + 1
    lion.write_plot(report, tmp_path / "lion.png")
    assert (tmp_path / "lion.png").stat().st_size > 0


def test_a_lion_step_unlike_lion_pytorch_is_not_timed(monkeypatch):
    """The peer's times compare only if both optimizers make the same update: checked first."""
    pytest.importorskip("lion_pytorch")
    import pysparse_hpc.optim as optim
    timed = []

    class OtherLion(optim.Lion):
        def __init__(self, params, lr, **settings):
            super().__init__(params, lr=2 * lr, **settings)

    monkeypatch.setattr(optim, "Lion", OtherLion)
    monkeypatch.setattr(lion, "best_times", lambda *args: timed.append(args))
    with pytest.raises(lion.RunError, match="differs from lion-pytorch's by 0.0001.* after one"):
        lion.time_peer(1)
    assert not timed


def test_peer_and_usage(capsys):
    pytest.importorskip("lion_pytorch")
    peer = lion.time_peer(1)
    assert peer.parameters == 1_126_410 and peer.ours > 0 and peer.theirs > 0
    assert peer.max_difference == 0.0
    assert main(["lion", "--modes", "votes/sometimes"]) == 2
    assert "unknown mode 'votes/sometimes'" in capsys.readouterr().err
    assert main(["lion", "--latency-us", "1", "2"]) == 2
    assert "--latency-us takes 1 or 3" in capsys.readouterr().err
    assert main(["lion", "--latency-us", "inf"]) == 2
    assert "finite non-negative values, got [inf]" in capsys.readouterr().err
    with pytest.raises(lion.UsageError):
        lion.parse_contender("none/growing")


@pytest.mark.parametrize("options, named", [
    (["--seeds", "2"], "--seeds"),
    (["--accuracy-ranks", "3"], "--accuracy-ranks"),
    (["--seeds", "2", "--accuracy-ranks", "3"], "--seeds and --accuracy-ranks"),
])
def test_accuracy_options_with_skip_accuracy_are_refused(options, named, monkeypatch, capsys):
    """``--seeds`` and ``--accuracy-ranks`` set the accuracy runs: with ``--skip-accuracy``
    they are refused before any job, not silently ignored."""
    monkeypatch.setattr(lion, "measure", lambda *args: pytest.fail("measured"))
    assert main(["lion", "--skip-accuracy", "--ranks", "1", *options]) == 2
    assert f"error: {named} set the accuracy runs, which --skip-accuracy leaves out" in \
        capsys.readouterr().err


def test_skipped_accuracy_runs_need_neither_their_ranks_nor_mpiexec(monkeypatch):
    """One-rank step jobs with ``--skip-accuracy`` run no multi-rank job: no mpiexec needed,
    whatever the accuracy runs' default ranks; without it, their two ranks need it."""
    monkeypatch.setattr(lion, "find_mpiexec", lambda: None)

    class Args:
        modes, latency_us, ranks, workload = ["none"], [50.0], [1], ["mlp-digits"]
        seeds = accuracy_ranks = None
        skip_accuracy, repeat, partition, epochs = True, 1, "metis", None
    contenders, workloads, _ = lion._check_arguments(Args)
    assert (Args.seeds, Args.accuracy_ranks) == (lion.ACCURACY_SEEDS, lion.ACCURACY_RANKS)
    assert [ranks for ranks, _ in lion._jobs(Args, contenders, workloads)] == [1]
    Args.skip_accuracy, Args.seeds, Args.accuracy_ranks = False, None, None
    with pytest.raises(lion.UsageError, match="more than one rank needs mpiexec"):
        lion._check_arguments(Args)


@pytest.mark.mpi
@requires_mpi
def test_two_ranks_count_what_bytes_per_step_says():
    labels = ("adam", "none", "signs", "votes", "int8", "1bit", "signs/local")
    config = dict(mode="steps", workloads=["mlp-digits"], warmup=1, steps=2,
                  contenders=[lion.parse_contender(label) for label in labels])
    results = lion.step_results(launch(2, 1, config, 300, mpiexec_path(),
                                       worker=lion.WORKER))
    assert [r.label for r in results] == list(labels)
    for r in results:
        assert r.ranks == 2 and r.mismatches == [], r.mismatches
        assert r.step > 0 and r.compute > 0
    by_label = {r.label: r for r in results}
    assert by_label["none"].vote_bytes == 4 * 1_126_410 == by_label["adam"].vote_bytes
    assert by_label["signs"].window_syncs == 2 and by_label["signs/local"].window_syncs == 0
    assert by_label["none"].vote_bytes / by_label["votes"].vote_bytes == pytest.approx(20.0,
                                                                                       rel=1e-4)


def test_partition_reaches_every_job(capsys):
    class Args:
        ranks, repeat, seeds, epochs, accuracy_ranks = [2, 3], 2, 1, None, 2
        skip_accuracy, partition = False, "random"
    jobs = lion._jobs(Args, [lion.parse_contender("none")], ["gcn-cora", "mlp-digits"])
    assert [(ranks, config["mode"]) for ranks, config in jobs] == [
        (2, "steps"), (3, "steps"), (2, "accuracy"), (2, "accuracy")]
    assert all(config["partition"] == "random" for _, config in jobs)
    with pytest.raises(SystemExit) as refused:
        main(["lion", "--partition", "contiguous"])
    assert refused.value.code == 2
    assert "--partition: invalid choice: 'contiguous'" in capsys.readouterr().err


@pytest.mark.mpi
@requires_mpi
def test_gcn_steps_on_a_random_partition():
    """A random split of Cora's nodes over two ranks cuts far more edges than METIS's: the
    halo exchanges carry more rows."""
    halo = {}
    for partition in lion.GCN_PARTITIONS:
        config = dict(mode="steps", workloads=["gcn-cora"], warmup=1, steps=1,
                      contenders=[lion.parse_contender("signs/local")], partition=partition)
        (result,) = lion.step_results(launch(2, 1, config, 300, mpiexec_path(),
                                             worker=lion.WORKER))
        assert result.ranks == 2 and result.mismatches == [], result.mismatches
        halo[partition] = max(result.other_bytes)
    assert halo["random"] > 3 * halo["metis"] > 0, halo


def _running_workers(marker):
    """PIDs of the processes running the lion benchmark's worker for the command whose
    environment holds ``marker``: another run's workers on the machine (another checkout's
    suite, a parallel test) are not this command's, and failed the test."""
    from .conftest import processes_holding
    ours = set(processes_holding(marker, "environ"))
    return [pid for pid in processes_holding(b"pysparse_hpc.bench._lion_worker", "cmdline")
            if pid in ours]


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("signal_name, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupted_benchmark_stops_its_job(signal_name, status):
    """The job runs in its own process group, which no signal to the command reaches: the
    command stops it before it exits, interrupted (Ctrl-C) or terminated."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid
    marker = f"PYSPARSE_HPC_TEST_MARK={uuid.uuid4().hex}"
    command = subprocess.Popen([sys.executable, "-m", "pysparse_hpc.bench", "lion", "--ranks",
                                "1", "--accuracy-ranks", "1", "--workload", "mlp-digits",
                                "--seeds", "1"],
                               env=dict(os.environ, PYSPARSE_HPC_TEST_MARK=marker.split("=")[1]),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               # a shell's background job inherits SIGINT ignored: give the
                               # command the default a terminal gives
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    marker = marker.encode()
    while not _running_workers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running_workers(marker), "the job never started"
    command.send_signal(getattr(signal, signal_name))
    _, errors = command.communicate(timeout=60)
    assert command.returncode == status, errors[-2000:]
    assert not _running_workers(marker)
    if signal_name == "SIGINT":
        assert "interrupted" in errors and "Traceback" not in errors


def test_a_rank_count_listed_twice_is_refused(monkeypatch, capsys):
    """``--ranks 2 2`` ran the P = 2 job twice and printed every row twice."""
    monkeypatch.setattr(lion, "measure", lambda *args: pytest.fail("measured"))
    assert main(["lion", "--skip-accuracy", "--ranks", "1", "2", "1"]) == 2
    assert "error: --ranks lists P=1 more than once" in capsys.readouterr().err
