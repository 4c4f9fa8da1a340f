"""The worker side of `pysparse_hpc.bench.distributed.launch`: every benchmark worker module is
started as ``python -m MODULE CONFIG.json RESULT.json`` on each rank, reads the launcher's
configuration, measures, and has rank 0 write one JSON result."""
import json
import sys

__all__ = ["start", "finish"]


def start(argv, module):
    """``(config, comm)`` for a worker job: the configuration read, the library's and torch's
    threads set to its ``threads_per_rank``, the communicator made. None (after printing the
    usage) when ``argv`` is not ``CONFIG.json RESULT.json``."""
    import torch

    from .. import distributed
    from .._config import set_num_threads

    if len(argv) != 2:
        print(f"usage: python -m {module} CONFIG.json RESULT.json", file=sys.stderr)
        return None
    with open(argv[0]) as handle:
        config = json.load(handle)
    threads = int(config["threads_per_rank"])
    set_num_threads(threads)
    torch.set_num_threads(threads)
    return config, distributed.init()


def finish(argv, comm, result):
    """Rank 0 writes ``result`` to the result file named in ``argv``; every rank waits for it."""
    if comm.rank == 0:
        with open(argv[1], "w") as handle:
            json.dump(result, handle)
    comm.Barrier()
