"""``python -m pysparse_hpc.bench COMMAND``: the benchmark command line.

Owns argument parsing and the set-up every command shares (thread count, data directory,
plotting check). A command is a module with ``HELP``, ``add_arguments(parser)`` and
``run(args)``; register it in `COMMANDS`, the statistic its ``--repeat`` keeps in
`REPEAT_KEPT`, and any shared option it does not use in `UNUSED_OPTIONS` (hidden from its help
and refused when given).
"""
import argparse
import importlib.util
import os
import signal
import sys
import threading

from .._config import get_num_threads, set_num_threads
from . import (checkpoint, convergence, convert, distributed, firstrun, gnn, lion, norm,
               positive_int, precondition, read, reorder, sddmm, spmm)
from ._data import DATA_ENV, DataError, data_dir

__all__ = ["COMMANDS", "REPEAT_KEPT", "UNUSED_OPTIONS", "build_parser", "main"]

COMMANDS = {
    "convert": convert,
    "spmm": spmm,
    "sddmm": sddmm,
    "reorder": reorder,
    "gnn": gnn,
    "distributed": distributed,
    "firstrun": firstrun,
    "precondition": precondition,
    "convergence": convergence,
    "checkpoint": checkpoint,
    "lion": lion,
    "read": read,
    "norm": norm,
}


#: What ``--repeat`` means to each command: the statistic it keeps of the timed runs.
REPEAT_KEPT = {
    "convert": "the best is kept",
    "spmm": "the best is kept (--backend cuda: the median)",
    "sddmm": "the best is kept (--backend cuda: the median)",
    "reorder": "the best is kept",
    "gnn": "the median is kept",
    "distributed": "the median is kept",
    "precondition": "the median is kept",
    "checkpoint": "the median is kept",
    "lion": "the median step is kept (the best for the Lion.step peer)",
    "read": "the best is kept",
    "norm": "the best is kept",
}

#: Shared options a command does not use, with the reason: hidden from its help, and refused
#: when given (an option that silently does nothing reads as if it had been applied).
UNUSED_OPTIONS = {
    "firstrun": {"repeat": "it times --rounds cold/warm pairs instead",
                 "data": "its jobs load the bundled Cora"},
    "convergence": {"repeat": "it trains to a target accuracy; --seeds sets the runs"},
    "checkpoint": {"data": "it saves generated model states, not shared data"},
    "lion": {"data": "its workloads load the bundled graphs and scikit-learn's digits",
             "threads": "every MPI rank and the Lion.step peer run one thread"},
    "read": {"data": "it reads the files it writes itself"},
}

#: ``--repeat`` when it is not given.
DEFAULT_REPEAT = 10


def _common_options(command=None):
    """Options every command takes (a parent parser), with the ``--repeat`` help of
    ``command``; those `UNUSED_OPTIONS` names for it are hidden from its help."""
    unused = UNUSED_OPTIONS.get(command, {})

    def shown(dest, text):
        return argparse.SUPPRESS if dest in unused else text

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", metavar="DIR",
                        help=shown("data", f"shared data directory (default: ${DATA_ENV}, else "
                                           "../shared/data next to the repository)"))
    # None, not the default: an explicit --repeat must be told apart (see UNUSED_OPTIONS)
    kept = REPEAT_KEPT.get(command, "the best is kept")
    common.add_argument("--repeat", type=positive_int, metavar="N",
                        help=shown("repeat", "timed runs per measurement, after untimed warm-up "
                                             f"calls; {kept} (default: {DEFAULT_REPEAT})"))
    common.add_argument("--threads", type=positive_int, metavar="T",
                        help=shown("threads", "threads of the parallel kernels (default: the "
                                              "library's setting)"))
    common.add_argument("--csv", metavar="FILE", help="also write the results as CSV")
    common.add_argument("--plot", metavar="FILE.png",
                        help="also write a bar plot (needs matplotlib)")
    return common


def build_parser():
    """The parser with one sub-parser per registered command."""
    parser = argparse.ArgumentParser(prog="python -m pysparse_hpc.bench",
                                     description="Benchmarks of pysparse_hpc on real matrices.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        sub = commands.add_parser(name, parents=[_common_options(name)], help=module.HELP,
                                  description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, command_parser=sub)
    return parser


def main(argv=None):
    """Parse ``argv``, apply the shared settings and run the command; returns the exit status."""
    args = build_parser().parse_args(argv)
    # Errors of the shared settings name the command, as its own options' errors do.
    parser = args.command_parser
    unused = [(dest, reason) for dest, reason in UNUSED_OPTIONS.get(args.command, {}).items()
              if getattr(args, dest) is not None]
    for dest, reason in unused:   # before their values are checked: they are not used
        parser.error(f"--{dest} does not apply to {args.command}: {reason}")
    if args.threads is not None:
        try:
            set_num_threads(args.threads)
        except ValueError as exc:
            parser.error(f"--threads: {exc}")
    args.threads = get_num_threads()
    try:  # commands that read no shared file run without the default directory
        args.data_dir = data_dir(args.data, must_exist=False)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if args.repeat is None:
        args.repeat = DEFAULT_REPEAT
    for option in ("csv", "plot"):   # checked now, not after minutes of measuring
        error = _output_path_error(getattr(args, option))
        if error:
            parser.error(f"--{option}: {error}")
    if args.csv is not None and args.plot is not None and _same_file(args.csv, args.plot):
        parser.error(f"--csv and --plot name the same file {args.csv!r}: the plot would "
                     "overwrite the table; name two files")
    if args.plot is not None:
        if importlib.util.find_spec("matplotlib") is None:
            parser.error("--plot needs matplotlib: pip install matplotlib (or "
                         "pysparse_hpc[bench])")
        suffix = os.path.splitext(args.plot)[1].lstrip(".").lower()
        if suffix not in _PLOT_FORMATS:
            parser.error(f"--plot: {args.plot!r} needs a file extension matplotlib writes: "
                         f"{', '.join(_PLOT_FORMATS)}")
    # A terminated benchmark stops its MPI jobs as an interrupted one does (the jobs run in
    # their own process group, which no signal to this process reaches).
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main_thread else None
    try:
        return args.run(args)
    except DataError as exc:
        print(f"python -m pysparse_hpc.bench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"python -m pysparse_hpc.bench {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


#: The extensions ``--plot`` takes (formats every matplotlib backend writes).
_PLOT_FORMATS = ("png", "pdf", "svg", "eps", "ps")


def _output_path_error(path):
    """Why ``path`` cannot take an output file (None when it can, or when no path was given)."""
    if path is None:
        return None
    if not path:
        return "an empty file name"
    if os.path.isdir(path):
        return f"{path} is a directory; name a file"
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"the directory of {path} does not exist"
    if not os.access(directory, os.W_OK):
        return f"the directory of {path} is not writable"
    # An existing file is replaced: it must be writable itself, or the write fails only after
    # the measurements.
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{path} exists and is not writable"
    if not os.path.exists(path):
        # os.access answers yes to root for a directory such as /proc where no file can be
        # made: only making the file tells.
        try:
            with open(path, "x"):
                pass
        except OSError as exc:
            return f"cannot create {path} ({exc.strerror or exc})"
        os.remove(path)
    return None


def _same_file(first, second):
    """Whether two output paths name one file (the same path, or links to one file)."""
    if os.path.abspath(first) == os.path.abspath(second):
        return True
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist yet: two different new files
        return False


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
