"""``python -m pysparse_hpc.bench COMMAND``: the benchmark command line.

Owns argument parsing and the set-up every command shares (thread count, data directory,
plotting check). A command is a module with ``HELP``, ``add_arguments(parser)`` and
``run(args)``; register it in `COMMANDS`.
"""
import argparse
import importlib.util
import os
import sys

from .._config import get_num_threads, set_num_threads
from . import (checkpoint, convergence, convert, distributed, firstrun, gnn, lion,
               positive_int, precondition, reorder, sddmm, spmm)
from ._data import DATA_ENV, data_dir

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
                        help="timed runs per measurement, best kept, after one warm-up "
                             "(default: 10)")
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
    try:
        args.data_dir = data_dir(args.data)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    for option in ("csv", "plot"):   # checked now, not after minutes of measuring
        path = getattr(args, option)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"--{option}: the directory of {path} does not exist")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib: pip install matplotlib (or pysparse_hpc[bench])")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
