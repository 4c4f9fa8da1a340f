"""Distributed sparse training over MPI: partitioned graphs with halo exchange, gradient
allreduce.

Functions and classes
---------------------
init            the library's communicator (a Dup of COMM_WORLD; one rank without mpiexec)
Communicator    buffer-protocol collectives on NumPy arrays and CPU tensors, with byte counters
partition       owner rank of every node: METIS, contiguous blocks, random; with its quality
Partition       an owner array with edge cut, communication volume and balance
DistGraph       a graph distributed by rows with its halo-exchange plan (``nn`` layers take it)
DataParallel    bucketed gradient allreduce launched from gradient hooks (needs torch)
Checkpointer    asynchronous, atomic, verified checkpoints; reloadable at another number of ranks
Checkpoint      what `Checkpointer.load` returns
rng_states      the global random generators' states, to checkpoint (``restore_rng_states``)
training        ``train``: what ``python -m pysparse_hpc train`` runs

Launch a script with ``mpiexec -n P python script.py``; started without ``mpiexec`` the same
script is a one-rank job. mpi4py is the engine (``pip install mpi4py mpich``, any MPI on a
cluster); without it only one-rank jobs run.
"""
from ._comm import Communicator, init, launched_ranks
from .checkpoint import Checkpoint, Checkpointer, restore_rng_states, rng_states
from .graph import DistGraph, HaloPlan
from .partition import PARTITION_METHODS, Partition, partition


def __getattr__(name):
    # DataParallel is a torch Module: import torch only when it is asked for.
    if name == "DataParallel":
        from .data_parallel import DataParallel
        return DataParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Checkpoint", "Checkpointer", "Communicator", "DataParallel", "DistGraph", "HaloPlan",
           "PARTITION_METHODS", "Partition", "init", "launched_ranks", "partition",
           "restore_rng_states", "rng_states"]
