"""Optimizers: Lion, and Lion over MPI with compressed communication.

Classes and functions
---------------------
Lion             the Lion optimizer (the update and defaults of PyPI's ``lion-pytorch``)
DistributedLion  Lion agreed over a communicator, compressed or not (COMPRESSIONS)
bytes_per_step   what each mode sends per rank and step
COMPRESSIONS     the modes of `DistributedLion`
MOMENTUM_SYNC    how `DistributedLion` keeps the ranks' momenta (local, always, growing)

The optimizers need torch; the modes and `bytes_per_step` do not.
"""
from ._modes import COMPRESSIONS, MOMENTUM_SYNC, bytes_per_step


def __getattr__(name):
    # The optimizers are torch classes: import torch only when one is asked for.
    if name == "Lion":
        from .lion import Lion
        return Lion
    if name == "DistributedLion":
        from .distributed_lion import DistributedLion
        return DistributedLion
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["COMPRESSIONS", "MOMENTUM_SYNC", "DistributedLion", "Lion", "bytes_per_step"]
