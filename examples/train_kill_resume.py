"""Train with checkpoints, kill a rank mid-run, resume, and compare with a run never killed.

Starts ``mpiexec -n RANKS python -m pysparse_hpc train ... --checkpoint DIR`` (a plain process
where mpiexec or mpi4py is missing, or with ``--ranks 1``), waits for its second checkpoint,
kills the last rank with SIGKILL, and shows how the job ended. Then it runs the same command
with ``--resume``, which trains only the epochs left, and an uninterrupted run of the same
settings: both end with the same test accuracy.

Run it with ``python examples/train_kill_resume.py [--ranks 2] [--epochs 100]
[--optimizer lion] [--compression votes] [--optimizer kfac --base-optimizer sgd]``:
``--optimizer`` takes what the trainer takes, and the checkpoints hold that optimizer's state
(Lion's momenta, K-FAC's curvature and SGD's momentum buffers alike).
"""
import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pysparse_hpc.nn.train import OPTIMIZERS, PRECONDITIONERS
from pysparse_hpc.optim import COMPRESSIONS


def mpiexec_path():
    """The ``mpiexec`` beside the running Python (a virtual environment's mpich), else the one
    on the PATH; None when there is none."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def command(ranks, options):
    """The train command on ``ranks`` ranks (one plain process when MPI cannot start)."""
    train = [sys.executable, "-m", "pysparse_hpc", "train", "--no-progress", "--threads", "1",
             *options]
    return train if ranks == 1 else [mpiexec_path(), "-n", str(ranks), *train]


def accuracy(out):
    found = re.search(r"test accuracy ([0-9.]+)%", out)
    return found.group(1) if found else "none"


#: The kill comes once this many checkpoints, one every `EVERY` epochs, are committed.
CHECKPOINTS, EVERY = 2, 5


def kill_after_checkpoints(ranks, options, directory, checkpoints=CHECKPOINTS, every=EVERY):
    """Start training with checkpoints and SIGKILL its last rank once ``checkpoints`` are
    committed; returns the exit status, the seconds it took to end, and its output."""
    job = subprocess.Popen(command(ranks, [*options, "--checkpoint", str(directory),
                                           "--checkpoint-every", str(every)]),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = job.pid
    if ranks > 1:  # rank 0's first line maps every rank to its PID
        pids = re.findall(r"rank (\d+) is PID (\d+)", job.stderr.readline())
        victim = int(pids[-1][1])
    step = directory / f"step-{checkpoints * every:09d}" / "manifest.json"
    while not step.exists():
        if job.poll() is not None:
            raise SystemExit("training ended before its checkpoints: use more --epochs")
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    out, err = job.communicate(timeout=60)
    return job.returncode, time.monotonic() - killed, out + err


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--optimizer", default="adam",
                        choices=OPTIMIZERS + tuple(PRECONDITIONERS))
    parser.add_argument("--base-optimizer", choices=("adam", "sgd"),
                        help="what applies a preconditioner's gradients (default adam)")
    parser.add_argument("--compression", choices=COMPRESSIONS,
                        help="how Lion's ranks agree (default none)")
    args = parser.parse_args(argv)
    # Refused as the train command refuses them, rather than dropped without a word
    if args.compression is not None and args.optimizer != "lion":
        parser.error("--compression applies to --optimizer lion")
    if args.base_optimizer is not None and args.optimizer not in PRECONDITIONERS:
        parser.error(f"--base-optimizer applies to a preconditioner "
                     f"({', '.join(PRECONDITIONERS)})")
    if args.ranks < 1:
        parser.error(f"--ranks must be at least 1, got {args.ranks}")
    # The run must outlast the checkpoint the kill waits for, or the kill finds it finished.
    if args.epochs <= CHECKPOINTS * EVERY:
        parser.error(f"--epochs must be more than {CHECKPOINTS * EVERY} (a rank is killed after "
                     f"the checkpoint of epoch {CHECKPOINTS * EVERY}), got {args.epochs}")
    ranks = args.ranks
    if ranks > 1 and (mpiexec_path() is None or importlib.util.find_spec("mpi4py") is None):
        print("mpiexec or mpi4py is missing: one process instead")
        ranks = 1
    options = ["--epochs", str(args.epochs), "--optimizer", args.optimizer]
    if args.compression is not None:
        options += ["--compression", args.compression]
    if args.base_optimizer is not None:
        options += ["--base-optimizer", args.base_optimizer]

    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder) / "checkpoints"
        status, seconds, output = kill_after_checkpoints(ranks, options, directory)
        ending = [line for line in output.splitlines() if "PID" in line or "Killed" in line]
        print(f"killed: the job ended {seconds:.2f} s later with status {status}")
        print("\n".join(f"  | {line}" for line in ending))
        steps = sorted(directory.glob("step-*"))
        committed = [p.name for p in steps if (p / "manifest.json").exists()]
        torn = [p.name for p in steps if p.name not in committed]
        print(f"committed: {', '.join(committed)}; torn by the kill: {', '.join(torn) or '-'}")

        resumed = subprocess.run(command(ranks, [*options, "--checkpoint", str(directory),
                                                 "--resume"]),
                                 capture_output=True, text=True, check=True).stdout
        print("resumed:\n" + "\n".join(f"  {line}" for line in resumed.splitlines()[:3]))
    whole = subprocess.run(command(ranks, options), capture_output=True, text=True,
                           check=True).stdout
    print(f"test accuracy resumed {accuracy(resumed)}%, never killed {accuracy(whole)}%")
    return 0 if accuracy(resumed) == accuracy(whole) else 1


if __name__ == "__main__":
    sys.exit(main())
