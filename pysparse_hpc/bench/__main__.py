"""``python -m pysparse_hpc.bench COMMAND``: the benchmark command line.

Owns argument parsing and the set-up every command shares (thread count, data directory,
plotting check). A command is a module with ``HELP``, ``add_arguments(parser)`` and
``run(args)``; register it in `COMMANDS`.
"""
import argparse
import importlib.util
import os
import signal
import sys
import threading

from .._config import get_num_threads, set_num_threads
from . import (checkpoint, convergence, convert, distributed, firstrun, gnn, lion,
               positive_int, precondition, reorder, sddmm, spmm)
from ._data import DATA_ENV, DataError, data_dir

__all__ = ["COMMANDS", "build_parser", "main"]

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
}


def _common_options():
    """Options every command takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", metavar="DIR",
                        help=f"shared data directory (default: ${DATA_ENV}, else ../shared/data "
                             "next to the repository)")
    common.add_argument("--repeat", type=positive_int, default=10, metavar="N",
                        help="timed runs per measurement, after untimed warm-up calls; the "
                             "best is kept, except by gnn (the median); firstrun takes "
                             "--rounds instead (default: 10)")
    common.add_argument("--threads", type=positive_int, metavar="T",
                        help="threads of the parallel kernels (default: the library's setting)")
    common.add_argument("--csv", metavar="FILE", help="also write the results as CSV")
    common.add_argument("--plot", metavar="FILE.png",
                        help="also write a bar plot (needs matplotlib)")
    return common


def build_parser():
    """The parser with one sub-parser per registered command."""
    parser = argparse.ArgumentParser(prog="python -m pysparse_hpc.bench",
                                     description="Benchmarks of pysparse_hpc on real matrices.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_options()
    for name, module in COMMANDS.items():
        sub = commands.add_parser(name, parents=[common], help=module.HELP,
                                  description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv=None):
    """Parse ``argv``, apply the shared settings and run the command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
    for option in ("csv", "plot"):   # checked now, not after minutes of measuring
        error = _output_path_error(getattr(args, option))
        if error:
            parser.error(f"--{option}: {error}")
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
    return None


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
