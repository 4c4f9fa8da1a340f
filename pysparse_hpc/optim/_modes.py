"""The modes of `DistributedLion` and the bytes each sends: no torch, so the command line
can offer them without importing it."""
from .._sputils import check_integer
from . import _votes

__all__ = ["COMPRESSIONS", "MOMENTUM_SYNC", "bytes_per_step", "default_momentum_sync"]

COMPRESSIONS = ("none", "signs", "votes", "int8", "1bit")
MOMENTUM_SYNC = ("local", "always", "growing")


def default_momentum_sync(compression):
    """`DistributedLion`'s ``momentum_sync`` when none is given: ``"local"`` for ``"none"``
    (its momenta are equal on every rank anyway), Lion Cub's ``"growing"`` for the others."""
    return "local" if compression == "none" else "growing"


def bytes_per_step(compression, size, ranks, rank=0, itemsize=4):
    """Bytes one rank sends (and as many it receives) per step under ``compression``, as the
    communicator counts them under the votes' traffic kind: momentum synchronisations and the
    ranks' agreement on which tensors take part (one byte per parameter tensor, booked under
    ``"lion participation"``) are left out.

    Parameters
    ----------
    compression : str
        One of `COMPRESSIONS`.
    size : int
        Coordinates of all parameters that have a gradient.
    ranks : int
    rank : int
        Matters only for ``"1bit"`` on a number of ranks that is not a power of two (the ranks
        past the largest power of two hand their bits to a partner and get the result back).
    itemsize : int
        Bytes per gradient element of ``"none"`` as it crosses: 8 for float64, 4 for float32
        and for bfloat16 (reduced in float32). Each dtype is summed in its own buffer: for
        parameters of several dtypes add each dtype's bytes.

    Returns
    -------
    int

    Raises
    ------
    TypeError
        For a count or a rank that is not an integer.
    ValueError
        For an unknown ``compression``, ``size < 0``, ``ranks < 1``, a ``rank`` outside
        ``0..ranks - 1``, ``itemsize < 1``, or ``"int8"`` on more than 127 ranks.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    # Checked, not trusted: ranks = 0 sent the vote packing's search for a base into an
    # endless loop, and a rank past the last one got another rank's bytes.
    size, ranks, rank, itemsize = (check_integer(value, name) for value, name in (
        (size, "size"), (ranks, "ranks"), (rank, "rank"), (itemsize, "itemsize")))
    for name, value, low in (("size", size, 0), ("ranks", ranks, 1), ("itemsize", itemsize, 1)):
        if value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")
    if not 0 <= rank < ranks:
        raise ValueError(f"rank must be in 0..{ranks - 1}, got {rank}")
    # As `DistributedLion` refuses it: a count for a mode that cannot run read as a plan.
    if compression == "int8" and _votes.int8_levels(ranks) == 0:
        raise ValueError(f"compression='int8' works on at most 127 ranks (its levels are at "
                         f"most floor(127 / P)), got ranks={ranks}")
    if ranks == 1:
        return 0
    sign_bytes = -(-size // 8)
    if compression == "none":
        return size * itemsize
    if compression == "signs":
        return (ranks - 1) * sign_bytes
    if compression == "votes":
        return 8 * -(-size // _votes.vote_digits(ranks))
    if compression == "int8":
        return size
    paired = 1 << (ranks.bit_length() - 1)
    stages = paired.bit_length() - 1
    if rank >= paired:
        return sign_bytes
    return (stages + (rank < ranks - paired)) * sign_bytes
