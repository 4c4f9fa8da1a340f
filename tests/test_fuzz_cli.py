"""Hostile command-line values: each is refused up front, exit status 2 and one line naming the
option, never a traceback found at the first allocation or after the first measurements."""
import os

import pytest

pytest.importorskip("torch")

HUGE = str(2 ** 70)


@pytest.mark.parametrize("argv, message", [
    # widths: numpy failed with "Maximum allowed dimension exceeded" at the first operand
    (["spmm", "--n", HUGE], "argument --n: expected a width of at most"),
    (["sddmm", "--n", "100000000"], "argument --n: expected a width of at most"),
    (["reorder", "--n", HUGE], "argument --n: expected a width of at most"),
    (["gnn", "--hidden", HUGE], "argument --hidden: expected a width of at most"),
    (["distributed", "--hidden", HUGE], "argument --hidden: expected a width of at most"),
    # timeouts: subprocess's wait raised OverflowError when the first job started
    (["distributed", "--timeout", HUGE], "argument --timeout: expected at most"),
    (["distributed", "--timeout", "2147484"], "argument --timeout: expected at most"),
    (["lion", "--timeout", HUGE], "argument --timeout: expected at most"),
    (["precondition", "--distributed", "--timeout", HUGE], "argument --timeout: expected at most"),
    # generated graphs: the generators failed at their allocation, after the shared matrices
    (["spmm", "--rmat", f"10:{HUGE}"], "argument --rmat: '10:" + HUGE + "' asks for"),
    (["sddmm", "--rmat", "30:8"], "argument --rmat: '30:8' asks for 8589934592 edges"),
    (["reorder", "--planted", "8:8:1e20:1"], "argument --planted: '8:8:1e20:1' asks for about"),
    (["reorder", "--planted", "8:8:1e9:1"], "argument --planted: '8:8:1e9:1' asks for about"),
])
def test_bench_refuses_sizes_that_fail_later(argv, message, capsys):
    from pysparse_hpc.bench.__main__ import build_parser
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err, err
    assert f"python -m pysparse_hpc.bench {argv[0]}: error:" in err


def test_bench_size_limits_leave_the_largest_valid_values(capsys):
    from pysparse_hpc.bench import MAX_TIMEOUT, MAX_WIDTH
    from pysparse_hpc.bench.__main__ import build_parser
    parser = build_parser()
    assert parser.parse_args(["spmm", "--n", str(MAX_WIDTH), "--rmat", "30:4"]).n == [MAX_WIDTH]
    assert parser.parse_args(["lion", "--timeout", str(MAX_TIMEOUT)]).timeout == MAX_TIMEOUT
    assert parser.parse_args(["reorder", "--planted", "1024:1024:8:2"]).planted


def test_bench_output_file_that_cannot_be_made_is_refused_up_front(tmp_path, monkeypatch,
                                                                   capsys):
    # The directory is writable, so os.access says yes, but no such file can be made (as for
    # root under /proc): the table's write failed only after the measurements.
    from pysparse_hpc.bench import convert
    from pysparse_hpc.bench.__main__ import main

    monkeypatch.setattr(convert, "run", lambda args, out=None: pytest.fail("measured"))
    too_long = tmp_path / ("x" * 300 + ".csv")
    with pytest.raises(SystemExit) as exc:
        main(["convert", "--csv", str(too_long)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--csv: cannot create" in err, err
    # the probe leaves nothing behind
    monkeypatch.setattr(convert, "run", lambda args, out=None: 0)
    assert main(["convert", "--csv", str(tmp_path / "t.csv"), "--plot",
                 str(tmp_path / "p.png")]) == 0
    assert os.listdir(tmp_path) == []


def test_checkpoint_refuses_a_large_state_beyond_memory_or_disk(tmp_path, monkeypatch, capsys):
    # It allocated 16 MiB parameters one after another until the machine ran out of memory.
    from pysparse_hpc.bench import checkpoint
    from pysparse_hpc.bench.__main__ import main

    monkeypatch.setattr(checkpoint, "measure", lambda *a, **k: pytest.fail("measured"))
    assert main(["checkpoint", "--state", "large", "--megabytes", HUGE, "--repeat", "1"]) == 2
    assert "error: --megabytes: a " + HUGE + " MB state does not fit" in capsys.readouterr().err
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda path: type("Usage", (), {"free": 10 ** 6})())
    assert main(["checkpoint", "--state", "large", "--megabytes", "2", "--repeat", "1",
                 "--dir", str(tmp_path)]) == 2
    assert f"MB free in {tmp_path}" in capsys.readouterr().err


def test_train_refuses_a_bad_seed_before_loading_the_graph(capsys):
    # It was refused by the trainer, after MPI start-up and the graph's loading, without the
    # option's name.
    from pysparse_hpc.__main__ import main
    for seed in ("-1", str(2 ** 63)):
        with pytest.raises(SystemExit) as exc:
            main(["train", "--seed", seed])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"error: --seed must be in [0, 2**63), got {seed}" in err


def test_train_refuses_a_huge_random_feature_width_by_name(capsys):
    # NumPy refused the feature matrix ("Maximum allowed dimension exceeded") after the graph
    # was loaded, naming no option.
    from pysparse_hpc.__main__ import main
    with pytest.raises(SystemExit) as exc:
        main(["train", "--random-features", str(2 ** 70), "--epochs", "0"])
    assert exc.value.code == 2
    assert "error: --random-features must be at most 65536" in capsys.readouterr().err


def test_train_usage_errors_come_from_rank_0_alone(monkeypatch, capsys):
    # Under mpiexec every rank parses the same line: P copies of usage and error.
    from pysparse_hpc.__main__ import main
    for rank, shown in (("1", False), ("0", True)):
        monkeypatch.setenv("PMI_RANK", rank)
        for argv in (["train", "--lr", "nan"], ["train", "--bogus"], ["demo", "--seeds", "0"]):
            with pytest.raises(SystemExit) as exc:
                main(argv)
            err = capsys.readouterr().err
            assert exc.value.code == 2
            assert ("error:" in err) == shown, (rank, argv, err)


@pytest.mark.parametrize("argv, message", [
    (["--balance", "nnz", "--partition", "random"],
     "balance must be 'rows' for method 'random', got 'nnz'"),
    (["--balance", "rows+nnz", "--partition", "contiguous"], "for method 'contiguous'"),
    (["--balance", "1e20"], "must be finite and in [0, 1e+09], got 1e+20")])
def test_train_refuses_a_balance_its_partition_does_not_take_before_starting(
        argv, message, monkeypatch, capsys):
    # It was refused by the partitioner, after MPI start-up and the graph's loading.
    from pysparse_hpc import distributed
    from pysparse_hpc.__main__ import main

    def started(*args, **kwargs):
        raise AssertionError("the run started")
    monkeypatch.setattr(distributed, "init", started)
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert "python -m pysparse_hpc train: error: --balance: " in err and message in err
