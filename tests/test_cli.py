"""The main job, as a user runs it."""
import subprocess
import sys

from pysparse_hpc.__main__ import run_demo


def test_demo_in_process(capsys):
    assert run_demo("cora") == 0
    out = capsys.readouterr().out
    assert "ME-BCRS 8x1" in out and "16x1" in out and "round-tripped" in out
    assert "SpMM" in out and "SDDMM" in out and "ours ME-BCRS" in out
    assert "2708 nodes" in out


def test_demo_command_line():
    result = subprocess.run([sys.executable, "-m", "pysparse_hpc", "demo", "--dataset", "citeseer"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "citeseer" in result.stdout


def test_bad_command_line():
    result = subprocess.run([sys.executable, "-m", "pysparse_hpc", "demo", "--dataset", "nope"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "invalid choice" in result.stderr
