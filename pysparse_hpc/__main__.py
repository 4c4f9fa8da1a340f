"""Command line: ``python -m pysparse_hpc demo`` runs the library's main job on bundled data;
``[mpiexec -n P] python -m pysparse_hpc train`` trains a GNN on a graph distributed over P ranks.
"""
import argparse
import contextlib
import importlib.util
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numba
import numpy as np

from . import block_stats, datasets, sddmm
from ._compiling import compile_ahead, compile_messages
from ._config import environment_value, get_num_threads
from ._sputils import check_positive_integer
from .optim import COMPRESSIONS, MOMENTUM_SYNC


def _format_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _time_best(fn, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def run_demo(name="cora", out=None, models=("gcn", "gat"), seeds=5, progress=True,
             distributed=True):
    """Load a bundled graph, convert it to the blocked formats, report their statistics and
    cost, then train GNNs on it (``models``; none when empty) and report their accuracy; with
    ``distributed`` (and training on), end with the ``train`` command under ``mpiexec -n 2``
    beside the same training in one process."""
    out = sys.stdout if out is None else out
    seeds = check_positive_integer(seeds, "seeds")
    data = datasets.load(name)
    print(f"{data!r}", file=out)
    adj = data.adj
    print(f"adjacency: {adj!r}", file=out)
    print(f"threads: {get_num_threads()}", file=out)
    print("", file=out)
    header = (f"{'format':<22}{'vectors':>9}{'nnz/vec':>9}{'redund.':>9}{'blocks':>8}"
              f"{'bytes':>12}{'vs CSR':>8}{'convert':>11}")
    print(header, file=out)
    print("-" * len(header), file=out)
    csr_bytes = adj.indptr.nbytes + adj.indices.nbytes + adj.data.nbytes
    print(f"{'CSR':<22}{'':>9}{'':>9}{'':>9}{'':>8}{_format_bytes(csr_bytes):>12}{1.0:>8.2f}"
          f"{'':>11}", file=out)
    for window, block_width, label in ((8, 8, "ME-BCRS 8x1, k=8"),
                                       (8, 4, "ME-BCRS 8x1, k=4"),
                                       (16, 8, "16x1 (TC-GNN), k=8")):
        stats = block_stats(adj, window=window, block_width=block_width)
        seconds, blocked = _time_best(lambda: adj.to_blocked(window, block_width))
        roundtrip = blocked.tocsr()
        exact = (np.array_equal(roundtrip.indptr, adj.indptr)
                 and np.array_equal(roundtrip.indices, adj.indices)
                 and np.array_equal(roundtrip.data, adj.data))
        if not exact:
            raise RuntimeError(f"{label}: the round trip to CSR did not reproduce the adjacency")
        print(f"{label:<22}{stats.n_vectors:>9}{stats.nnz_per_vector:>9.2f}"
              f"{stats.redundancy:>9.2f}{stats.n_blocks:>8}{_format_bytes(stats.bytes_mebcrs):>12}"
              f"{stats.bytes_mebcrs / stats.bytes_csr:>8.2f}{seconds * 1e3:>9.2f}ms", file=out)
        if block_width == 8 and window == 8:
            print(f"{'  SR-BCRS (padded)':<22}{stats.padded_vectors:>9}{'':>9}"
                  f"{stats.padded_vectors * window / stats.nnz:>9.2f}{'':>8}"
                  f"{_format_bytes(stats.bytes_srbcrs):>12}"
                  f"{stats.bytes_srbcrs / stats.bytes_csr:>8.2f}", file=out)
    print("", file=out)
    print("Every blocked format round-tripped to the original CSR exactly.", file=out)
    print("", file=out)
    with compile_messages():
        # On a first run the training's kernels compile in a helper process while this one
        # compiles the kernel report's; the report waits for it before timing anything.
        ahead = compile_ahead("gnn", name, *models) if models and _has_torch() else None
        try:
            _kernels_report(adj, data.x, out, before_timing=ahead.wait if ahead else None)
        except BaseException:
            if ahead is not None:
                ahead.stop()   # nothing outlives an interrupted demo
            raise
    if models:
        print("", file=out)
        _training_report(data, models, seeds, progress, out)
        if distributed:
            print("", file=out)
            _distributed_report(name, out, progress=progress)
    return 0


def _distributed_report(name, out, ranks=2, progress=True):
    """GCN trained by ``python -m pysparse_hpc train`` on ``ranks`` MPI ranks, beside the same
    training (same seed) in this process; with ``progress``, both show their progress bars."""
    from .distributed._comm import mpiexec_path
    launcher = mpiexec_path()
    if importlib.util.find_spec("mpi4py") is None or launcher is None:
        print("Distributed training skipped: it needs mpi4py and mpiexec (pip install mpi4py "
              "mpich, or the [mpi] extra)", file=out)
        return
    from .distributed import Communicator
    from .distributed.training import train

    command = [launcher, "-n", str(ranks), sys.executable, "-m", "pysparse_hpc", "train",
               "--dataset", name, "--model", "gcn", "--partition", "metis", "--threads", "1"]
    if not progress:
        command.append("--no-progress")
    print(f"Distributed training: mpiexec -n {ranks} python -m pysparse_hpc train --dataset "
          f"{name} --model gcn --partition metis --threads 1", file=out, flush=True)
    environment = dict(os.environ, PYSPARSE_HPC_NUM_THREADS="1", OMP_NUM_THREADS="1")
    try:
        done = _run_ranks(command, timeout=600, env=environment, show_stderr=progress)
    except subprocess.TimeoutExpired:  # the launcher and its ranks were stopped
        print("  the MPI run did not finish within 600 s", file=out)
        return
    if done.returncode != 0:
        print(f"  the MPI run failed (exit status {done.returncode}):\n{done.stderr[-2000:]}",
              file=out)
        return
    for line in done.stdout.strip().splitlines():
        print(f"  {line}", file=out)
    single = train(name, "gcn", "metis", comm=Communicator(None), progress=progress)
    print(f"  the same training in one process: test accuracy {100 * single.test_accuracy:.1f}%"
          f", final training loss {single.losses[-1]:.4f}", file=out)


#: The line rank 0 of the ``train`` command starts its standard error with: for the log of a
#: job, not for the demo's screen.
_RANK_PIDS_LINE = "pysparse_hpc train: rank "


def _run_ranks(command, timeout, env, show_stderr):
    """`~pysparse_hpc.distributed._jobs.run_job`, with the job's standard error (rank 0's
    progress bar) also passed on to this process's as it arrives when ``show_stderr``.

    Captured whole, the bar of a run of many seconds would only appear, unseen, in the
    captured text. Lines are passed on whole, ended by a newline or a carriage return (a
    bar's redraw), except the line that maps ranks to PIDs.

    Returns
    -------
    subprocess.CompletedProcess
        With the whole standard output and standard error, as `run_job` returns them.

    Raises
    ------
    subprocess.TimeoutExpired
        After the job was stopped; an interrupt of this process stops it too.
    """
    from .distributed._jobs import run_job, stop_job
    if not show_stderr:
        return run_job(command, timeout=timeout, env=env)
    import tempfile
    import threading

    captured = []

    def read_chunks(fd):
        try:
            yield from iter(lambda: os.read(fd, 4096), b"")
        except OSError:   # closed under us: the job has ended and the wait is over
            return

    def pass_on(stream):
        pending = ""
        for chunk in read_chunks(stream.fileno()):
            text = chunk.decode(errors="replace")
            captured.append(text)
            pending += text
            # Whole lines only, so that the PID line is recognised wherever a read cut it.
            cut = max(pending.rfind("\n"), pending.rfind("\r")) + 1
            lines, pending = pending[:cut], pending[cut:]
            shown = "".join(line for line in lines.splitlines(keepends=True)
                            if not line.startswith(_RANK_PIDS_LINE))
            if shown:
                sys.stderr.write(shown)
                sys.stderr.flush()
        if pending and not pending.startswith(_RANK_PIDS_LINE):
            sys.stderr.write(pending)
            sys.stderr.flush()

    with tempfile.TemporaryFile() as stdout:
        process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, env=env,
                                   start_new_session=True)
        reader = threading.Thread(target=pass_on, args=(process.stderr,), daemon=True)
        reader.start()
        try:
            process.wait(timeout=timeout)
        except BaseException:  # timed out or interrupted: nothing may outlive us
            stop_job(process)
            raise
        finally:
            # The pipe ends with the job; a process that left the group could hold it open.
            reader.join(timeout=5)
            process.stderr.close()
        stdout.seek(0)
        output = stdout.read().decode(errors="replace")
    return subprocess.CompletedProcess(command, process.returncode, output, "".join(captured))


def _training_report(data, model_names, seeds, progress, out):
    """Train each model with its published hyper-parameters; test accuracy at the best
    validation epoch, mean over ``seeds`` seeds, and time per training epoch."""
    try:
        import torch
    except ImportError:
        print("GNN training skipped: it needs PyTorch (pip install torch==2.13.0, the CPU "
              "build)", file=out)
        return
    from .nn import models, train

    x, y, *masks = train.node_tensors(data)
    print(f"GNN training on {data.name} (full batch, Adam, test accuracy at the best validation "
          f"epoch, {seeds} seed{'s' if seeds > 1 else ''}):", file=out)
    for name in model_names:
        model_class = models.MODELS[name]
        architecture = model_class.architecture
        accuracies, seconds = [], []
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = model_class(x.shape[1], out_channels=data.num_classes, **architecture)
            result = train.fit(model, x, data.adj, y, masks, **model_class.training,
                               progress=progress, description=f"{name} seed {seed}")
            accuracies.append(result.test_accuracy)
            seconds.append(result.seconds_per_epoch)
        shape = (f"{architecture['heads']} heads x {architecture['hidden']}"
                 if "heads" in architecture else f"{architecture['hidden']} hidden")
        print(f"  {name.upper():<5} {shape:<16} {model_class.training['epochs']} epochs  "
              "test accuracy "
              f"{100 * np.mean(accuracies):5.1f}%  ({1e3 * np.median(seconds):.1f} ms per "
              "training epoch)", file=out)


def _has_torch():
    return importlib.util.find_spec("torch") is not None


def _kernels_report(adj, x, out, before_timing=None):
    """SpMM and SDDMM on the graph, ours (CSR and ME-BCRS) against scipy / NumPy in the same run;
    every kernel runs once (compiling it on a first run), then ``before_timing()``, then the
    timings."""
    scipy_adj = adj.to_scipy()
    mebcrs = adj.to_mebcrs()
    hidden = np.ascontiguousarray((scipy_adj @ x)[:, :64])  # a GNN-like 64-wide operand
    for matrix in (adj, mebcrs):
        matrix @ x
        sddmm(matrix, hidden, hidden)
    if before_timing is not None:
        before_timing()
    print(f"SpMM A @ X, X {x.shape[0]}x{x.shape[1]} float32 (GFLOP/s, speedup over scipy):",
          file=out)
    scipy_seconds, reference = _time_best(lambda: scipy_adj @ x)
    flops = 2 * adj.nnz * x.shape[1]
    print(f"  {'scipy':<14}{flops / scipy_seconds / 1e9:8.2f}{1.0:8.2f}x", file=out)
    for label, matrix in (("ours CSR", adj), ("ours ME-BCRS", mebcrs)):
        seconds, result = _time_best(lambda: matrix @ x)
        if not np.allclose(result, reference, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"{label}: SpMM disagrees with scipy")
        print(f"  {label:<14}{flops / seconds / 1e9:8.2f}{scipy_seconds / seconds:8.2f}x", file=out)

    rows = np.repeat(np.arange(adj.shape[0]), np.diff(adj.indptr))
    numpy_seconds, expected = _time_best(
        lambda: np.einsum("ij,ij->i", hidden[rows], hidden[adj.indices]))
    flops = 2 * adj.nnz * hidden.shape[1]
    print(f"SDDMM <H[i], H[j]> on A's pattern, H {hidden.shape[0]}x{hidden.shape[1]} "
          "(GFLOP/s, speedup over NumPy):", file=out)
    print(f"  {'NumPy':<14}{flops / numpy_seconds / 1e9:8.2f}{1.0:8.2f}x", file=out)
    for label, matrix in (("ours CSR", adj), ("ours ME-BCRS", mebcrs)):
        seconds, result = _time_best(lambda: sddmm(matrix, hidden, hidden))
        if not np.allclose(result.tocsr().data, expected, rtol=1e-4, atol=1e-3):
            raise RuntimeError(f"{label}: SDDMM disagrees with NumPy")
        print(f"  {label:<14}{flops / seconds / 1e9:8.2f}{numpy_seconds / seconds:8.2f}x", file=out)


def _format_mb(n_bytes):
    return f"{n_bytes / 1e6:.2f} MB"


#: Environment variables that set threads per process: where one is set, the user chose.
_THREAD_VARIABLES = ("PYSPARSE_HPC_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
#: How long an interrupted rank other than 0 leaves rank 0 to report the interrupt and end the
#: job before it does so itself.
_INTERRUPT_GRACE_SECONDS = 2.0


def _threads_per_rank(ranks_here):
    """The ``train`` command's threads per rank under mpiexec without ``--threads``: the cores
    this rank may use, shared among the ``ranks_here`` ranks of its node (at least one), as
    torchrun's one thread per process avoids oversubscription. A rank the launcher bound to
    some of the cores keeps those. Every waiting rank polls its core in MPI, so ranks whose
    threads outnumber the cores run many times slower."""
    import numba
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    if usable >= (os.cpu_count() or usable):   # not bound: the node's cores are shared
        usable //= ranks_here
    return max(1, min(usable, numba.config.NUMBA_NUM_THREADS))


def _train_error(exc):
    """The ``train`` command's line for input it refuses (the status it exits with is 2)."""
    print(f"python -m pysparse_hpc train: error: {exc}", file=sys.stderr)


def run_train(args, out=None):
    """The ``train`` command: `pysparse_hpc.distributed.training.train`, reported on rank 0."""
    out = sys.stdout if out is None else out
    from . import set_num_threads
    from .distributed import init
    from .distributed._comm import launched_rank, raised_on_every_rank
    from .distributed.partition import check_balance
    from .distributed.training import train

    try:
        # Here, not after the graph is read and split: --balance nnz with --partition random
        # would be refused seconds into the run.
        check_balance(args.balance, args.partition)
    except ValueError as exc:  # the same options on every rank
        if launched_rank() == 0:
            _train_error(f"--balance: {exc}")
        return 2
    # Under mpiexec: a rank that raises ends the job with its message, and with a timeout so
    # does a rank that hangs.
    try:
        comm = init(timeout=args.timeout)
    except ValueError as exc:  # a bad PYSPARSE_HPC_COMM_TIMEOUT: the same on every rank
        if launched_rank() == 0:
            _train_error(exc)
        return 2
    if comm.size > 1:
        # A rank killed outright (SIGKILL, the OOM killer) cannot say who it was, and MPICH's
        # launcher names only its PID: this line maps PIDs to ranks.
        where = comm.allgather((os.getpid(), socket.gethostname()))
        if comm.rank == 0:
            print("pysparse_hpc train: " + ", ".join(
                f"rank {r} is PID {pid} on {host}" for r, (pid, host) in enumerate(where)),
                file=sys.stderr, flush=True)
    threads = args.threads
    if comm.size > 1:
        node_share = _threads_per_rank(comm.ranks_on_this_node())   # a collective: all call it
        if threads is None and not any(environment_value(name) for name in _THREAD_VARIABLES):
            threads = node_share
    if threads is not None:
        import torch
        set_num_threads(threads)
        torch.set_num_threads(threads)
    try:
        result = train(args.dataset, args.model, args.partition, epochs=args.epochs, lr=args.lr,
                       weight_decay=args.weight_decay, seed=args.seed, dtype=args.dtype,
                       random_features=args.random_features, comm=comm,
                       progress=not args.no_progress, balance=args.balance,
                       preconditioner=(args.optimizer if args.optimizer in PRECONDITIONER_NAMES
                                       else None),
                       damping=args.damping,
                       kl_clip=args.kl_clip,
                       optimizer=(args.base_optimizer if args.optimizer in PRECONDITIONER_NAMES
                                  else args.optimizer),
                       compression=args.compression, momentum_sync=args.momentum_sync,
                       checkpoint=args.checkpoint, resume=args.resume,
                       checkpoint_every=args.checkpoint_every,
                       curvature_interval=args.curvature_interval)
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank of a job launched from a terminal: one line, not P
        # tracebacks. Checkpoints are renamed into place only once complete, so the last one is
        # whole whenever this lands.
        if comm.rank != 0:
            # Rank 0 says it and ends the job when it got the interrupt too; but it may be
            # blocked in a collective that waits for this rank, and then this rank says it.
            try:
                time.sleep(_INTERRUPT_GRACE_SECONDS)
            except KeyboardInterrupt:
                pass
        resume = (f"; --resume continues from the last checkpoint in {args.checkpoint}"
                  if args.checkpoint else "")
        sys.stderr.write(f"python -m pysparse_hpc train: interrupted{resume}\n")
        sys.stderr.flush()
        if comm.size > 1:
            comm.Abort(130)   # a rank interrupted alone would leave the others waiting
        return 130
    except (OSError, ValueError, MemoryError) as exc:
        if comm.size == 1 or raised_on_every_rank(exc):
            if comm.rank == 0:
                _train_error(exc)
            return 2
        # This rank alone: the others wait in a collective, so only ending the job ends them.
        # One write, so that the lines of ranks failing together do not interleave.
        sys.stderr.write(f"python -m pysparse_hpc train: error on rank {comm.rank} of "
                         f"{comm.size}: {exc}; ending the job\n")
        sys.stderr.flush()
        comm.Abort(2)
    if comm.rank == 0:
        print(report_train(result, get_num_threads()), file=out)
    # This run's epochs only: a resumed run's list holds the skips before its checkpoint too.
    resumed_after = result.resumed_after or 0
    trained = result.epochs - resumed_after
    if trained > 0 and sum(e >= resumed_after for e in result.skipped_epochs) >= trained:
        if comm.rank == 0:
            _train_error(ValueError("every step was skipped for a non-finite loss or "
                                    "gradient: nothing was trained (check the data for NaN "
                                    "or infinity, or lower --lr)"))
        return 1
    if result.diverged_epoch >= 0:
        if comm.rank == 0:
            _train_error(ValueError(f"training diverged: the model's outputs were not finite "
                                    f"after epoch {result.diverged_epoch + 1} (its weights "
                                    "overflowed); lower --lr"))
        return 1
    return 0


def report_train(result, threads):
    """The ``train`` command's summary of a `DistributedTrainResult`."""
    ranks = f"{result.ranks} rank{'s' if result.ranks > 1 else ''}"
    if not result.losses:
        outcome = "  no epoch run"
    elif result.best_epoch < 0:
        outcome = f"  no finite model to measure, final training loss {result.losses[-1]:.4f}"
    else:
        # No test nodes: no accuracy (NaN), where "0.0%" read as a model wrong on every node.
        tested = ("no test nodes" if math.isnan(result.test_accuracy)
                  else f"test accuracy {100 * result.test_accuracy:.1f}%")
        chosen = ("no validation nodes: the last epoch's model"
                  if math.isnan(result.val_accuracy) else
                  f"best validation accuracy {100 * result.val_accuracy:.1f}%")
        outcome = (f"  {tested} ({chosen} at epoch {result.best_epoch + 1}), final training "
                   f"loss {result.losses[-1]:.4f}")
    # One process partitions nothing: naming the default method read as a split made.
    split = f", {result.partition_method} partition" if result.ranks > 1 else ""
    lines = [f"{result.model.upper()} on {result.dataset}, {ranks} x {threads} "
             f"thread{'s' if threads > 1 else ''}{split}, "
             f"{result.epochs} epoch{'s' if result.epochs != 1 else ''}, "
             + _optimizer_label(result)
             + ("" if result.lr is None else f", lr {result.lr:g}, weight decay "
                f"{result.weight_decay:g}"),
             outcome,
             (f"  {1e3 * result.seconds_per_epoch:.1f} ms per training epoch "
              f"({'median' if result.preconditioner is None else 'mean'}), "
              if math.isfinite(result.seconds_per_epoch) else "  ")
             + f"{result.seconds_total:.1f} s in all"]
    if result.ranks > 1 and math.isnan(result.halo_bytes_per_epoch):
        # This run trained no epoch: no traffic per epoch was measured.
        lines.append(f"  partition: {result.partition_summary}")
    elif result.ranks > 1:
        share = (100 * result.halo_bytes_per_epoch / result.cagnet_bytes_per_epoch
                 if result.cagnet_bytes_per_epoch else 0.0)
        once = ("" if not result.halo_bytes_once > 0 else
                f"; {_format_mb(result.halo_bytes_once)} more once, for the input rows of a kept "
                f"product")
        lines += [f"  halo exchange per epoch: {_format_mb(result.halo_bytes_per_epoch)} "
                  f"(all ranks{once}); CAGNET-1D (all of H to every rank) would move "
                  f"{_format_mb(result.cagnet_bytes_per_epoch)}, {share:.1f}% of it",
                  f"  gradient and metric allreduce per epoch: "
                  f"{_format_mb(result.allreduce_bytes_per_epoch)}"]
        if result.preconditioner is not None:
            lines.append(f"  preconditioner sums and broadcasts per epoch: "
                         f"{_format_mb(result.optimizer_bytes_per_epoch)}")
        elif result.optimizer == "lion":
            what = "gradient allreduce" if result.compression == "none" else "votes"
            lines.append(f"  Lion's {what} per epoch: "
                         f"{_format_mb(result.optimizer_bytes_per_epoch)}")
        lines.append(f"  partition: {result.partition_summary}")
    if result.resumed_after is not None:
        lines.insert(1, f"  resumed from the checkpoint after epoch {result.resumed_after}")
    if result.diverged_epoch >= 0:
        measured = "; the accuracy is the best finite epoch's" if result.best_epoch >= 0 else ""
        lines.append(f"  diverged: the model's outputs were not finite after epoch "
                     f"{result.diverged_epoch + 1}{measured}")
    if result.skipped_epochs:
        lines.append(f"  steps skipped for a non-finite loss or gradient: "
                     f"{len(result.skipped_epochs)} (epochs "
                     f"{', '.join(str(e + 1) for e in result.skipped_epochs)})")
    return "\n".join(lines)


PRECONDITIONER_NAMES = ("kfac", "shampoo", "jorge")


def _optimizer_label(result):
    from .nn.train import SGD_MOMENTUM
    if result.optimizer == "lion":
        return f"Lion ({result.compression} compression)"
    label = "Adam" if result.optimizer == "adam" else f"SGD (momentum {SGD_MOMENTUM:g})"
    if result.preconditioner is not None:
        clip = "" if result.kl_clip is None else f", KL clip {result.kl_clip:g}"
        label += (f" on {result.preconditioner} preconditioned gradients (damping "
                  f"{result.damping:g}{clip})")
    return label


def _balance(text):
    """``--balance``: "rows", "nnz", "rows+nnz" or a number."""
    if text in ("rows", "nnz", "rows+nnz"):
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected rows, nnz, rows+nnz or a number, got {text!r}") from None


def _scipy_matrix_file(path):
    """Why ``--dataset path`` cannot be trained on when the file is one sparse matrix as
    ``scipy.sparse.save_npz`` writes it (a graph file holds labels and a split too); None for
    any other file, which the loader checks."""
    if not (path.lower().endswith(".npz") and os.path.isfile(path)):
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            keys = set(archive.files)
    except Exception:   # not an archive: the loader says what is wrong with it
        return None
    if "adj_indptr" in keys or not {"indptr", "indices", "data", "shape"} <= keys:
        return None
    return (f"{path!r} holds one sparse matrix (the layout of scipy.sparse.save_npz), not a "
            "graph: --dataset PATH.npz needs the adjacency with node labels and a "
            "train/validation/test split, under the keys pysparse_hpc.datasets.load_file "
            "reads (adj_indptr, adj_indices, adj_data, adj_shape, labels, train_mask, val_mask, "
            "test_mask, num_classes, and feat_* or --random-features)")


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors rank 0 alone reports: under mpiexec every rank parses the
    same command line, and P copies of the usage and the error would bury the one line."""

    def error(self, message):
        from .distributed._comm import launched_rank
        if launched_rank() != 0:
            self.exit(2)
        super().error(message)


def main(argv=None):
    parser = _Parser(prog="python -m pysparse_hpc", description="pysparse_hpc command line")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="formats, kernels and GNN training on a bundled graph")
    demo.add_argument("--dataset", default="cora", type=str.lower,
                      choices=datasets.available(), help="bundled graph (default: cora)")
    demo.add_argument("--model", action="append", type=str.lower, choices=("gcn", "gat", "agnn"),
                      help="GNN to train (repeatable; default: gcn and gat)")
    demo.add_argument("--no-train", action="store_true", help="skip the GNN training")
    demo.add_argument("--seeds", type=int, metavar="N",
                      help="report the mean test accuracy over N seeds (default: 5)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.add_argument("--no-distributed", action="store_true",
                      help="skip the final training run under mpiexec")
    train = commands.add_parser(
        "train", help="full-graph GNN training; under mpiexec -n P, on a graph split over P ranks",
        description="Train a GNN on the whole graph. Under 'mpiexec -n P' rank 0 reads and "
        "partitions the graph and every rank trains on its part with halo exchange; without "
        "mpiexec it is a one-rank run.")
    train.add_argument("--dataset", default="cora",
                       help=f"{' | '.join(datasets.available())} | PATH.npz, a graph file in "
                            "the layout of pysparse_hpc.datasets.load_file (default: cora)")
    train.add_argument("--model", default="gcn", type=str.lower, choices=("gcn", "gat", "agnn"),
                       help="default: gcn")
    train.add_argument("--partition", default="metis", type=str.lower,
                       choices=("metis", "contiguous", "random"),
                       help="how the graph is split over the ranks (default: metis)")
    train.add_argument("--balance", type=_balance,
                       help="what the partition balances: rows, nnz, rows+nnz (both at once, "
                            "metis only), or a number c (each node weighs its stored entries + "
                            "c; default: rows+nnz for metis, rows for random, nnz for "
                            "contiguous)")
    train.add_argument("--epochs", type=int, help="default: the model's published setting")
    train.add_argument("--lr", type=float,
                       help="default: the model's published (Adam) setting, scaled for sgd "
                            "and lion as --optimizer says")
    train.add_argument("--weight-decay", type=float,
                       help="default: the model's published (Adam) setting, scaled for lion "
                            "as --optimizer says")
    train.add_argument("--seed", type=int, default=0,
                       help="of the weights, the dropout, a random partition and "
                            "--random-features (default: 0)")
    train.add_argument("--threads", type=int,
                       help="threads per rank (default: all cores in one process; under "
                            "mpiexec, each node's cores shared among its ranks, unless "
                            "PYSPARSE_HPC_NUM_THREADS, OMP_NUM_THREADS or NUMBA_NUM_THREADS "
                            "is set)")
    train.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                       help="of the features, weights and graph values (default: float32)")
    train.add_argument("--random-features", type=int, metavar="WIDTH",
                       help="seeded random features of this width (graphs without features)")
    train.add_argument("--optimizer", default="adam", type=str.lower,
                       choices=("adam", "sgd", "lion") + PRECONDITIONER_NAMES,
                       help="adam; sgd (momentum 0.9, lr 30x the model's Adam lr); lion (its "
                            "lr and decay scaled from the model's Adam settings); or gradients "
                            "preconditioned by K-FAC, Shampoo or Jorge (KAISA-style over the "
                            "ranks) and applied by --base-optimizer (default: adam)")
    train.add_argument("--base-optimizer", default="adam", type=str.lower,
                       choices=("adam", "sgd"),
                       help="with --optimizer kfac, shampoo or jorge: what applies the "
                            "preconditioned gradients; sgd, as Martens and Grosse apply K-FAC, "
                            "is the faster on Cora, its lr 30x the model's Adam lr (10x under "
                            "Shampoo; default: adam)")
    train.add_argument("--damping", type=float, metavar="D",
                       help="with --optimizer kfac, shampoo or jorge: the damping (default: "
                            "the one measured for the method and base optimizer: K-FAC 0.01 "
                            "under Adam, 0.03 under SGD; Shampoo and Jorge 0.001)")
    train.add_argument("--kl-clip", type=float, metavar="C",
                       help="with --optimizer kfac: scale each preconditioned step so that "
                            "its predicted change of the output distribution (lr^2 v.g) is at "
                            "most C, as KAISA does (e.g. 0.001; default: off)")
    train.add_argument("--compression", default="none", choices=COMPRESSIONS,
                       help="with --optimizer lion over several ranks: what crosses the "
                            "network: none (gradient allreduce), signs (packed sign bits, "
                            "allgathered), votes (packed vote sums), int8, 1bit "
                            "(default: none)")
    train.add_argument("--momentum-sync", choices=MOMENTUM_SYNC,
                       help="with a compressed Lion: keep each rank's momentum (local), "
                            "average it every step (always) or at growing intervals "
                            "(default: growing). local assumes ranks whose training nodes "
                            "are alike (--partition random): on METIS parts it ends 2-8 "
                            "points below Lion on Cora and CiteSeer (2 and 3 ranks)")
    train.add_argument("--curvature-interval", type=int, metavar="N",
                       help="with --optimizer kfac, shampoo or jorge: steps between the "
                            "preconditioner's curvature updates (default: 10)")
    train.add_argument("--checkpoint", metavar="DIR",
                       help="save checkpoints in DIR (asynchronous, atomic, the last 3 kept)")
    train.add_argument("--checkpoint-every", type=int, metavar="K",
                       help="epochs between checkpoints (default: 10; the last epoch too)")
    train.add_argument("--resume", action="store_true",
                       help="continue from the newest good checkpoint in --checkpoint DIR "
                            "(--epochs is the total: only the epochs left are trained)")
    train.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="under mpiexec: end the job when a rank waits longer than SECONDS "
                            "in one communication call (a rank that hangs; default: "
                            "PYSPARSE_HPC_COMM_TIMEOUT, else wait for ever)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.command == "train":
        if args.optimizer != "lion" and (args.compression != "none"
                                         or args.momentum_sync is not None):
            train.error("--compression and --momentum-sync need --optimizer lion")
        if args.compression == "none" and args.momentum_sync not in (None, "local"):
            train.error("--momentum-sync applies to a compressed Lion (--compression)")
        preconditioner_options = args.base_optimizer != "adam" or args.damping is not None
        if args.optimizer not in PRECONDITIONER_NAMES and preconditioner_options:
            train.error("--base-optimizer and --damping need --optimizer kfac, shampoo or "
                        "jorge")
        if args.optimizer not in PRECONDITIONER_NAMES and args.curvature_interval is not None:
            # Without a preconditioner there is no curvature: the value would go unused.
            train.error("--curvature-interval needs --optimizer kfac, shampoo or jorge")
        if args.kl_clip is not None and args.optimizer != "kfac":
            train.error("--kl-clip needs --optimizer kfac")
        for name in ("lr", "damping", "kl_clip", "timeout"):
            value = getattr(args, name)
            if value is not None and not (0 < value < float("inf")):
                train.error(f"--{name.replace('_', '-')} must be a finite number > 0, got "
                            f"{value}")
        if args.weight_decay is not None and not (0 <= args.weight_decay < float("inf")):
            train.error(f"--weight-decay must be a finite number >= 0, got "
                        f"{args.weight_decay}")
        # The optimizers multiply the weights by these: beyond the dtype's range they overflow.
        largest = float(np.finfo(args.dtype).max)
        for name in ("lr", "weight_decay", "damping", "kl_clip"):
            value = getattr(args, name)
            if value is not None and value > largest:
                train.error(f"--{name.replace('_', '-')} {value:g} does not fit --dtype "
                            f"{args.dtype} (at most {largest:g})")
        if args.threads is not None and args.threads > numba.config.NUMBA_NUM_THREADS:
            train.error(f"--threads must be at most {numba.config.NUMBA_NUM_THREADS} (the "
                        f"kernels' thread pool, NUMBA_NUM_THREADS), got {args.threads}")
        problem = _scipy_matrix_file(args.dataset)
        if problem is not None:
            train.error(problem)
        if not 0 <= args.seed < 2 ** 63:   # refused now, not after the graph is loaded
            train.error(f"--seed must be in [0, 2**63), got {args.seed}")
        if args.checkpoint == "":
            train.error("--checkpoint needs a directory, got ''")
        for option in ("resume", "checkpoint_every"):
            if getattr(args, option) not in (None, False) and args.checkpoint is None:
                train.error(f"--{option.replace('_', '-')} needs --checkpoint DIR")
        for name in ("epochs", "threads", "random_features", "curvature_interval",
                     "checkpoint_every"):
            value = getattr(args, name)
            if value is not None and value < (0 if name == "epochs" else 1):
                train.error(f"--{name.replace('_', '-')} must be at least "
                            f"{0 if name == 'epochs' else 1}, got {value}")
        if args.random_features is not None and args.random_features > 1 << 16:
            # NumPy's own refusal of the feature matrix names no option, after the graph loads.
            train.error(f"--random-features must be at most {1 << 16}, got "
                        f"{args.random_features}")
        # One process only: a rank in a blocking MPI call would run the handler only once
        # the call returned, where the signal's default ends it at once and the launcher
        # then ends the job.
        from .distributed._comm import launched_ranks
        with (_terminations_as_interrupts() if launched_ranks() == 1
              else contextlib.nullcontext([])) as received:
            status = run_train(args)
        # Ended by SIGTERM or SIGHUP: the status a shell gives a process the signal ended
        return 128 + received[-1] if status == 130 and received else status
    if args.command == "demo":
        if args.no_train and (args.model or args.seeds is not None):
            demo.error("--model and --seeds choose what is trained; drop them or --no-train")
        args.seeds = 5 if args.seeds is None else args.seeds
        if args.seeds < 1:
            demo.error(f"--seeds must be at least 1, got {args.seeds}")
        # A model named twice is trained and reported once.
        models = () if args.no_train else tuple(dict.fromkeys(args.model or ("gcn", "gat")))
        with _terminations_as_interrupts() as received:
            try:
                return run_demo(args.dataset, models=models, seeds=args.seeds,
                                progress=not args.no_progress,
                                distributed=not args.no_distributed)
            except KeyboardInterrupt:
                # What the interrupt reached (the MPI job, the compiling helper) has been
                # stopped on the way out.
                sys.stderr.write("python -m pysparse_hpc demo: interrupted\n")
                return 128 + (received[-1] if received else signal.SIGINT)
    return 2


@contextlib.contextmanager
def _terminations_as_interrupts():
    """SIGTERM and SIGHUP (a scheduler ending the job, a closed terminal) raise
    KeyboardInterrupt in the main thread, as Ctrl-C does, so that what an interrupt stops
    is stopped (an MPI job in its own process group, which no signal to this process
    reaches; a helper process) and a pending checkpoint is finished. Yields the list of the
    signals received. Outside the main thread, where no handler can be set, nothing changes."""
    received = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def interrupt(signum, frame):
        received.append(int(signum))
        raise KeyboardInterrupt

    caught = [sig for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig]
    previous = {sig: signal.signal(sig, interrupt) for sig in caught}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
