"""Lion over a communicator, with the update's sign agreed by compressed votes.

Modes (``compression=``), with the bytes one rank sends (and receives) per step as the
communicator counts them (`bytes_per_step`), for ``d`` coordinates on ``P`` ranks:

``"none"``
    The gradients, full precision, allreduced: Lion under data parallelism, every rank taking
    the step one process would. ``d * itemsize`` bytes, one buffer per dtype: parameters of
    several dtypes each send their own (bfloat16 crosses as float32, 4 bytes).
``"signs"``
    Distributed Lion (Liu et al., 2024): each rank's sign bits, packed and allgathered; the
    update is their majority. ``(P - 1) * ceil(d / 8)`` bytes.
``"votes"``
    Lion Cub (Ishikawa et al., 2025): votes in {0, 1} summed by one integer allreduce, packed
    as ``k`` digits of base ``b > P`` to a uint64 (the largest ``k`` with
    ``b ** k <= 2 ** 64``, so no digit carries into the next); the same majority.
    ``8 * ceil(d / k)`` bytes. ``b = P + 1`` spends ``log2(P + 1)`` bits on a vote, what its
    count needs (1.6 at P = 2, against 2 in Lion Cub's ``bit_length(P)``-bit fields); where
    that saves less than a sixth of the words, ``b`` is the power of two of those fields
    (`pysparse_hpc.optim._votes.vote_base`).
``"int8"``
    Lion Cub's L1-scaled int8 levels (scaled per tensor, at most ``floor(127 / P)`` so the sum
    cannot overflow), SUM allreduced; the update is the sign of the sum, a vote weighted by
    magnitude. ``d`` bytes. At most 127 ranks (the levels would be 0); from 64 ranks the
    levels are -1, 0 and 1, so a coordinate whose ``|c|`` is at most the tensor's mean abstains.
``"1bit"``
    Lion Cub's 1-bit allreduce: packed signs combined pairwise by recursive doubling and
    re-signed at every stage, ties split by the parity of coordinate plus step
    (`pysparse_hpc.optim._votes.tie_mask`): an approximate majority.
    ``ceil(d / 8)`` bytes per stage, ``log2`` of the largest power of two <= ``P`` stages (plus
    one on ranks that fold in a rank past it).

The majority of ``s`` votes of +1 among ``P`` is ``sign(2 s - P)``; a tie (even ``P``) leaves
the coordinate where it is, apart from weight decay. A bit cannot say 0, so in ``signs``,
``votes`` and ``1bit`` the ranks split their votes where ``c = beta1 m + (1 - beta1) g`` is
exactly zero (a parameter no gradient has reached yet, such as an embedding row nobody looked
up), half +1 and half -1 by the parity of coordinate, rank and step
(`pysparse_hpc.optim._votes.zero_vote_parity`). Such a coordinate, zero on every rank, ties and
stays on an even number of ranks, as Lion leaves it; on an odd number (and in ``1bit``, whose
result has no 0) it moves up and down on alternate steps instead of drifting one way.

On one rank nothing crosses a network and nothing is compressed: every mode takes `Lion`'s
step, to the bit.

The ranks first agree on which parameters take part (a MAX allreduce of one byte per parameter
tensor, traffic kind `PARTICIPATION_KIND`, on more than one rank): those with a gradient on
some rank. A rank where such a parameter's ``.grad`` is None (unused in its backward) takes
part with a zero gradient, written to its ``.grad``, as `pysparse_hpc.distributed.DataParallel`
does; a parameter with no gradient on any rank is skipped, as one process's Lion skips it.
Without the agreement the ranks' votes would line up against different tensors. Before it,
the ranks compare their number of parameters, counters and a digest of their groups' ``lr``,
``betas`` and ``weight_decay`` and their parameters' shapes (80 bytes, traffic kind
`AGREEMENT_KIND`): optimizers that parted after
construction (a group added, a state loaded or a rate changed on some ranks only) are a
ValueError on every rank. At the first step after construction the digest covers the
parameters' values as well: replicas that start apart are a ValueError too, where every
rank's identical updates would keep them apart without a word.

In the compressed modes each rank updates its momentum with its own gradient. With
``momentum_sync="local"`` (Distributed Lion) the momenta are never synchronised; ``"always"``
averages them over the ranks after every step (a full-precision allreduce); ``"growing"`` (the
default, Lion Cub's) at growing intervals: the gap between two synchronisations is
``floor(2 ** (j / k))`` steps after the j-th, with ``k = sync_doubling`` (16: the gap doubles
every 16 synchronisations). The schedule trades bytes for accuracy: on the GCN over two ranks
of a METIS partition (BENCHMARKS.md, 20 seeds) it keeps every compressed mode within 0.2
points of uncompressed Lion on Cora and CiteSeer, where local momenta lose 2.6 and 2.3; but
in a 200-step training its syncs are full-precision allreduces on a quarter of the steps.
Local momenta assume that every rank's gradient comes from data alike: METIS puts a graph's
communities, and so its classes, on different ranks. On a random split of the same graphs
local momenta end within a point (+0.1 and +0.9), but the halo exchanges then carry 8x
(Cora) and 45x (CiteSeer) the rows. Over three ranks of METIS's split local momenta lose 8.3
and 3.3 points, and even synchronised momenta leave the sign votes 0.5 and 1.1 below (10
seeds): each vote carries its rank's own gradient.
"""
import copy
import functools
import hashlib
import math
import numbers
import warnings

import numpy as np
import torch

from .._sputils import check_flag, check_positive_integer
from ..distributed._comm import check_communicator, init, raising_alike
from ..distributed._flat import by_dtype, flatten, pieces
from ..kernels.cpu import votes as vote_kernels
from . import _votes
from ._modes import COMPRESSIONS, MOMENTUM_SYNC, default_momentum_sync
from .lion import (Lion, apply_update, interpolate, kernel_arrays, kernel_scalars, lion_step,
                   written)

__all__ = ["DistributedLion", "VOTE_KIND", "GRADIENT_KIND", "MOMENTUM_KIND",
           "PARTICIPATION_KIND", "AGREEMENT_KIND"]

#: The communicator's traffic kinds of `DistributedLion` (`Communicator.stats`).
VOTE_KIND = "lion votes"
GRADIENT_KIND = "gradient allreduce"
MOMENTUM_KIND = "momentum sync"
PARTICIPATION_KIND = "lion participation"
AGREEMENT_KIND = "lion agreement"

#: Set in the agreed digest where it covers the parameters' values (the digest has 56 bits).
_VALUES_FLAG = 1 << 60

#: What the ranks compare before every step (`DistributedLion._check_still_alike`).
_AGREED = ("the number of parameters", "the steps taken", "the momentum syncs made",
           "the step of the next momentum sync", "the parameter groups' settings or shapes")


def _value_bytes(param):
    """The bytes of a parameter's values, whatever its dtype (bfloat16 has no NumPy one)."""
    flat = param.detach().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def _one_bit_allreduce(comm, packed, kind, step):
    """The 1-bit majority of every rank's ``packed`` signs, on every rank (recursive doubling
    over the largest power of two of ranks; the others fold in first and get the result)."""
    paired = 1 << (comm.size.bit_length() - 1)
    received = np.empty_like(packed)
    rank = comm.rank
    if rank >= paired:  # hand my bits to a partner, get the result back from it
        comm.Isend(packed, rank - paired, 7, kind).wait()
        comm.Irecv(packed, rank - paired, 8, kind).wait()
        return packed
    if rank + paired < comm.size:
        comm.Irecv(received, rank + paired, 7, kind).wait()
        packed = _votes.combine_one_bit(packed, received, step)
    distance = 1
    while distance < paired:
        comm.Sendrecv(packed, rank ^ distance, received, rank ^ distance, 9, kind)
        packed = _votes.combine_one_bit(packed, received, step)
        distance <<= 1
    if rank + paired < comm.size:
        comm.Isend(packed, rank + paired, 8, kind).wait()
    return packed


def _with_offsets(entries):
    """``(group, param, start)`` of each entry, ``start`` its first coordinate in the vote."""
    start = 0
    for group, param in entries:
        yield group, param, start
        start += param.numel()


def _checked_settings(compression, momentum_sync, sync_doubling, average, ranks):
    """`DistributedLion`'s own settings, checked: ``(compression, momentum_sync,
    sync_doubling, average)`` with the default momentum synchronisation resolved."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if momentum_sync is None:
        momentum_sync = default_momentum_sync(compression)
    if momentum_sync not in MOMENTUM_SYNC:
        raise ValueError(f"momentum_sync must be one of {MOMENTUM_SYNC}, got "
                         f"{momentum_sync!r}")
    if compression == "none" and momentum_sync != "local":
        raise ValueError("compression='none' keeps the momenta equal on every rank: "
                         f"momentum_sync must be 'local', got {momentum_sync!r}")
    sync_doubling = check_positive_integer(sync_doubling, "sync_doubling")
    average = check_flag(average, "average")
    if compression == "int8" and _votes.int8_levels(ranks) == 0:
        raise ValueError(f"compression='int8' works on at most 127 ranks (its levels are "
                         f"at most floor(127 / P), 0 on {ranks}: nothing would "
                         f"move); use 'votes', whose sum does not overflow at any P")
    return compression, momentum_sync, sync_doubling, average


def _canonical(value):
    """``value`` as the same text on every rank that holds an equal one: numbers as floats
    (``np.float64(1e-3)`` and ``1e-3``, ``0`` and ``0.0`` alike), sequences item by item,
    anything else by its ``repr``."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return repr(float(value))
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_canonical(item) for item in value) + ")"
    return repr(value)


#: The settings of a group that Lion's update reads: the others (a name, a tag for the
#: user's own code) may differ between ranks without moving the replicas apart.
_LION_SETTINGS = ("lr", "betas", "weight_decay")


def _group_settings(group):
    return [(name, _canonical(group.get(name))) for name in _LION_SETTINGS]


def _layout(param_groups, compression, momentum_sync, average, sync_doubling,
            decoupled_weight_decay, init_lr):
    """What must be alike on every rank: the settings, each group's options, and the shape
    and dtype of each parameter. The counts come first, so that the first difference named
    is a group or parameter missing, not its neighbour's settings."""
    entries = [("compression", compression), ("momentum_sync", momentum_sync),
               ("average", average), ("sync_doubling", sync_doubling),
               ("decoupled_weight_decay", decoupled_weight_decay),
               ("constructor lr", _canonical(init_lr)),
               ("parameter groups", len(param_groups))]
    entries += [(f"group {index} parameters", len(group["params"]))
                for index, group in enumerate(param_groups)]
    for index, group in enumerate(param_groups):
        entries += [(f"group {index} {name}", value) for name, value in _group_settings(group)]
        entries += [(f"group {index} parameter {k}", tuple(param.shape), str(param.dtype))
                    for k, param in enumerate(group["params"])]
    return tuple(entries)


class DistributedLion(Lion):
    """Lion whose update is agreed over the ranks of a communicator, compressed or not.

    Every rank calls `step` after its own backward pass; the parameters stay equal on every
    rank (they start equal: broadcast them, or build the model from the same seed).

    Parameters
    ----------
    params : iterable of tensors or of dicts
        CPU parameters, as for `Lion`.
    comm : Communicator, optional
        Default: `pysparse_hpc.distributed.init()` (one rank without ``mpiexec``).
    lr, betas, weight_decay, decoupled_weight_decay
        As for `Lion`.
    compression : {"none", "signs", "votes", "int8", "1bit"}
        What crosses the network (the module docstring lists the modes and their bytes).
    momentum_sync : {"local", "always", "growing"}, optional
        In the compressed modes: keep each rank's momentum, average it every step, or at
        Lion Cub's growing intervals (the default). With ``"none"`` the momenta are equal
        anyway: only ``"local"`` (the default there) is accepted.
    average : bool
        ``"none"`` divides the gradients' sum by the ranks (each rank's loss a mean over its
        share of the batch). False keeps the sum, when every rank's loss is already normalised
        by the global batch (the full-graph GNN trainer). The votes do not depend on it.
    sync_doubling : int
        Lion Cub's ``k`` of ``momentum_sync="growing"``.

    Attributes
    ----------
    steps_taken, momentum_syncs : int

    Raises
    ------
    ValueError
        On every rank, when a setting is wrong on any rank, or when the ranks pass other
        parameters (shapes, dtypes, groups) or settings (the first difference is named):
        construction is collective.

    Notes
    -----
    A deep copy (`copy.deepcopy`) shares the communicator, whose MPI handle cannot be
    copied, and copies the rest. Pickling is refused over several ranks for the same reason
    (save `state_dict` instead); over one rank the unpickled optimizer gets a fresh one-rank
    communicator (its traffic counters start afresh).

    Examples
    --------
    >>> import torch
    >>> from pysparse_hpc.optim import DistributedLion
    >>> model = torch.nn.Linear(4, 2)
    >>> optimizer = DistributedLion(model.parameters(), lr=1e-4, compression="votes")
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> optimizer.step()
    """

    def __init__(self, params, comm=None, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *,
                 compression="votes", momentum_sync=None, average=True, sync_doubling=16,
                 decoupled_weight_decay=False):
        self.comm = init() if comm is None else check_communicator(comm)
        # A bad setting on one rank would raise there alone while the others wait for it in
        # their first step: the ranks agree on the failure, then on the settings themselves.
        error = None
        try:
            compression, momentum_sync, sync_doubling, average = _checked_settings(
                compression, momentum_sync, sync_doubling, average, self.comm.size)
            super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay,
                             decoupled_weight_decay=decoupled_weight_decay)
        except Exception as exc:
            if not hasattr(self.comm, "raise_if_any"):
                raise
            error = exc
        if hasattr(self.comm, "raise_if_any"):
            self.comm.raise_if_any(error)
        if hasattr(self.comm, "check_alike"):
            # Unlike parameters pair their collectives wrongly (an error inside MPI, or
            # nonsense sums); another mode or rate moves the replicas apart without a word.
            self.comm.check_alike(
                _layout(self.param_groups, compression, momentum_sync, average, sync_doubling,
                        self.decoupled_weight_decay, self._init_lr),
                "the ranks build unlike DistributedLion optimizers",
                "pass the same parameters and settings on every rank")
        self.compression, self.momentum_sync = compression, momentum_sync
        self.average, self.sync_doubling = average, sync_doubling
        self.steps_taken, self.momentum_syncs = 0, 0
        self._next_sync = 1
        self._sync_buffer = None
        # The parameters' values join the agreement at the first step (_check_still_alike).
        self._values_unchecked = True

    def add_param_group(self, param_group):
        """`Lion.add_param_group`, refusing parameters outside host memory and a parameter
        listed twice in the group.

        Add the same group on every rank: the next `step` raises on every rank otherwise.

        Parameters
        ----------
        param_group : dict
            As for `Lion.add_param_group`.

        Raises
        ------
        TypeError, ValueError
            As for `Lion.add_param_group`; also a ``ValueError`` for a parameter outside
            host memory or listed twice. The group is not added.
        """
        super().add_param_group(param_group)
        params = self.param_groups[-1]["params"]
        for param in params:
            if param.device.type != "cpu":
                self.param_groups.pop()
                raise ValueError(f"DistributedLion exchanges host memory; a parameter is "
                                 f"on {param.device}")
        # Torch only warns here; one process would then step the parameter twice, each step
        # reading the momentum the first left, while the ranks' vote is taken once on the
        # momentum before both, so P ranks would not reproduce one.
        if len({id(param) for param in params}) != len(params):
            self.param_groups.pop()
            raise ValueError("DistributedLion takes each parameter once; a parameter group "
                             "lists one twice")

    def __getstate__(self):
        """`Lion.__getstate__` and this optimizer's settings, counters and communicator."""
        state = super().__getstate__()
        state.update({name: getattr(self, name) for name in (
            "comm", "compression", "momentum_sync", "average", "sync_doubling", "steps_taken",
            "momentum_syncs", "_next_sync", "_values_unchecked")}, _sync_buffer=None)
        return state

    def __deepcopy__(self, memo):
        # The copy steps over the same ranks: the communicator is shared (an MPI communicator
        # cannot be copied), everything else copied.
        memo[id(self.comm)] = self.comm
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return copied

    # ------------------------------------------------------------------ the step
    # `step` is Lion's: the closure, then this (eager under torch.compile, as Lion's).
    @torch.compiler.disable
    def _update(self):
        """One step of every parameter that has a gradient on some rank, agreed over the
        ranks."""
        if self.comm.size > 1:
            # First: a rate that is wrong on some ranks only is a difference, raised on every
            # rank, where check_groups would raise on those ranks alone and the others wait.
            self._check_still_alike(sum(len(group["params"]) for group in self.param_groups))
        self.check_groups()
        entries = self._taking_part()
        if entries:
            if self.comm.size == 1:
                self._step_parameters()   # Lion's step, to the bit
            elif self.compression == "none":
                self._step_on_reduced_gradients(entries)
            else:
                self._step_on_votes(entries)
            self.steps_taken += 1
            if self._sync_due():
                self._synchronise_momenta([self.momentum(param) for _, param in entries])

    def _taking_part(self):
        """``[(group, param)]`` of the parameters with a gradient on some rank, the same list
        on every rank; this rank's missing ones get a zero ``.grad``."""
        entries = [(group, param) for group in self.param_groups for param in group["params"]]
        has_grad = np.array([param.grad is not None for _, param in entries], dtype=np.uint8)
        if self.comm.size > 1:
            self.comm.Allreduce(has_grad, "max", kind=PARTICIPATION_KIND)
        taking_part = []
        for (group, param), flag in zip(entries, has_grad):
            if flag:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                taking_part.append((group, param))
        return taking_part

    def _check_still_alike(self, n_entries):
        """Raise on every rank where the ranks' optimizers have parted since construction: a
        group added, a state loaded or a learning rate changed on some ranks only. Their
        collectives would then pair unlike buffers (an error inside MPI, or a hang), or the
        replicas part without a word. One MAX allreduce of 80 bytes (each value and its
        negation, so every rank sees the same maximum and minimum and raises alike).

        At the first step after construction, the digest covers the parameters' values too:
        every rank applies the same update, so replicas that start apart (a model built from
        each rank's own seed) stay apart, and only rank 0's would be evaluated. A resumed run
        loads its checkpoint before that step. Hashing costs about a millisecond per megabyte
        of parameters, once.
        """
        unchecked = self._values_unchecked
        values = self._agreement(n_entries, unchecked)
        # The digest's 56 bits leave room for a flag: whether it covers the values here. The
        # second comparison below is decided from the agreed extremes alone, so every rank
        # takes it alike (an optimizer's copy, made before the first step and stepped on one
        # rank only, holds the flag where the others do not).
        values[-1] |= _VALUES_FLAG if unchecked else 0
        extremes = np.concatenate([values, -values])
        self.comm.Allreduce(extremes, "max", kind=AGREEMENT_KIND)
        most, least = extremes[:values.size], -extremes[values.size:]
        differ = [name for name, high, low in zip(_AGREED, most, least) if high != low]
        if differ and differ[-1] == _AGREED[-1] and most[-1] & _VALUES_FLAG:
            # Some digest held the values too: a second comparison, on this failing path
            # only, tells the settings from the values.
            settings = self._agreement(n_entries, False)[-1:]
            settings = np.concatenate([settings, -settings])
            self.comm.Allreduce(settings, "max", kind=AGREEMENT_KIND)
            if settings[0] == -settings[1]:
                differ[-1] = ("the parameters' values" if least[-1] & _VALUES_FLAG else
                              "whether the parameters' values are compared (a first step "
                              "on some ranks only)")
        if differ:
            with raising_alike():
                if differ == ["the parameters' values"]:
                    raise ValueError(
                        "the ranks' parameters differ at DistributedLion's first step: "
                        "replicas must start equal (DataParallel broadcasts rank 0's, or "
                        "build the model from the same seed on every rank, or load the same "
                        "checkpoint)")
                raise ValueError(
                    f"the ranks' DistributedLion optimizers differ in {', '.join(differ)}: "
                    "add_param_group, load_state_dict and changes to a group's settings (an lr "
                    "scheduler) must be made alike on every rank")
        self._values_unchecked = False

    def _agreement(self, n_entries, with_values):
        """The int64 values `_check_still_alike` compares: the counters, then a digest of the
        groups' settings and the parameters' shapes (and values, ``with_values``)."""
        groups = [(_group_settings(group),
                   [(tuple(param.shape), str(param.dtype)) for param in group["params"]])
                  for group in self.param_groups]
        settings = repr((groups, self.decoupled_weight_decay, _canonical(self._init_lr)))
        hashed = hashlib.blake2b(settings.encode(), digest_size=7)
        if with_values:
            for group in self.param_groups:
                for param in group["params"]:
                    hashed.update(_value_bytes(param))
        digest = int.from_bytes(hashed.digest(), "little")
        return np.array([n_entries, self.steps_taken, self.momentum_syncs, self._next_sync,
                         digest], dtype=np.int64)

    def _step_on_reduced_gradients(self, entries):
        # A sparse gradient (an Embedding's) is summed densely: the ranks' rows differ.
        grads = [param.grad.to_dense() if param.grad.is_sparse else param.grad
                 for _, param in entries]
        reduced = {}   # id of a gradient -> its sum over the ranks
        for same_dtype in by_dtype(grads).values():
            flat = flatten(same_dtype)
            self.comm.Allreduce(flat, "sum", kind=GRADIENT_KIND)
            if self.average and self.comm.size > 1:
                flat /= self.comm.size
            reduced.update(zip(map(id, same_dtype), pieces(flat, same_dtype)))
        for (group, param), grad in zip(entries, map(reduced.get, map(id, grads))):
            lion_step(param, self.momentum(param), grad, group["lr"], self.weight_decay(group),
                      *group["betas"])

    def _step_on_votes(self, entries):
        plus, minus = self._agree(entries)
        for group, param, start in _with_offsets(entries):
            self._apply_agreed(group, param, plus, minus, start)

    def _vote_operands(self, group, param):
        """This rank's vote on ``param`` as the packing kernels (sign bits, vote digits, int8
        levels) take it: ``(m, g, beta1, 1 - beta1)`` of one float dtype, or ``(c, 0, 1, 0)``
        with ``c`` from tensor operations where the kernels cannot read the tensors."""
        momentum, beta1 = self.momentum(param), group["betas"][0]
        arrays = kernel_arrays(momentum, param.grad)
        if arrays is not None:
            return (*arrays, *kernel_scalars(param.dtype, beta1, 1.0 - beta1))
        direction = interpolate(momentum, param.grad, beta1).reshape(-1)
        if direction.dtype != torch.float64:
            direction = direction.float()  # exact, so the int8 levels are c's own
        return _votes.plain_operands(direction.numpy())

    def _pack(self, entries, add, out, *args):
        """``out`` with every entry's vote added by ``add(out, start, *args, *operands)``
        (`_votes.add_sign_bits`, ``add_vote_digits`` or ``add_int8_levels``) at its offset."""
        for group, param, start in _with_offsets(entries):
            add(out, start, *args, *self._vote_operands(group, param))
        return out

    def _agree(self, entries):
        """The agreed update's `_votes.masks` from this rank's votes."""
        comm, ranks = self.comm, self.comm.size
        size = sum(param.numel() for _, param in entries)
        zero_parity = _votes.zero_vote_parity(comm.rank, self.steps_taken)
        if self.compression == "int8":
            levels = self._pack(entries, _votes.add_int8_levels,
                                np.empty(size, dtype=np.int8), ranks)
            comm.Allreduce(levels, "sum", kind=VOTE_KIND)
            return _votes.levels_as_masks(levels)
        if self.compression == "votes":
            words = self._pack(entries, functools.partial(_votes.add_vote_digits,
                                                          zero_parity=zero_parity),
                               np.zeros(_votes.digit_words(size, ranks), dtype=np.uint64), ranks)
            comm.Allreduce(words, "sum", kind=VOTE_KIND)
            return _votes.vote_digits_majority(words, ranks, size)
        packed = self._pack(entries, functools.partial(_votes.add_sign_bits,
                                                       zero_parity=zero_parity),
                            np.zeros(_votes.sign_bytes(size), dtype=np.uint8))
        if self.compression == "signs":
            gathered = np.empty((ranks, packed.size), dtype=np.uint8)
            comm.Allgatherv(packed, gathered, [packed.size] * ranks, kind=VOTE_KIND)
            return _votes.signs_majority(gathered, size)
        packed = _one_bit_allreduce(comm, packed, VOTE_KIND, self.steps_taken)
        return _votes.signs_as_masks(packed, size)

    def _apply_agreed(self, group, param, plus, minus, start):
        """The rest of ``param``'s step once the ranks agreed on the masks, ``param`` at
        coordinate ``start`` of them."""
        momentum = self.momentum(param)
        lr, weight_decay, beta2 = group["lr"], self.weight_decay(group), group["betas"][1]
        arrays = kernel_arrays(param, momentum, param.grad)
        if arrays is None:
            direction = _votes.directions(plus, minus, param.numel(), start)
            apply_update(param, torch.from_numpy(direction).view_as(param).to(param.dtype),
                         momentum, param.grad, lr, weight_decay, beta2)
            return
        vote_kernels.apply_agreed(*arrays, plus, minus, start,
                                  *kernel_scalars(param.dtype, 1.0 - lr * weight_decay, -lr,
                                                  beta2, 1.0 - beta2))
        written(param, momentum)

    # ------------------------------------------------------------------ momentum
    def _sync_due(self):
        if self.comm.size == 1 or self.momentum_sync == "local":
            return False
        if self.momentum_sync == "always":
            return True
        return self.steps_taken >= self._next_sync

    def _synchronise_momenta(self, momenta):
        # One buffer per dtype, as the gradients of "none" (one promoted buffer sent float32
        # momenta as float64), each kept for every sync: a fresh one would cost its page
        # faults each time.
        buffers = self._sync_buffer if self._sync_buffer is not None else {}
        self._sync_buffer = {}
        for dtype, same_dtype in by_dtype(momenta).items():
            size = sum(momentum.numel() for momentum in same_dtype)
            buffer = buffers.get(dtype)
            if buffer is None or buffer.numel() != size:
                buffer = torch.empty(size, dtype=dtype)
            self._sync_buffer[dtype] = buffer
            flat = flatten(same_dtype, out=buffer)
            self.comm.Allreduce(flat, "sum", kind=MOMENTUM_KIND)
            for momentum, total in zip(same_dtype, pieces(flat, same_dtype)):
                # the mean, written back in one pass
                torch.div(total, self.comm.size, out=momentum)
        self.momentum_syncs += 1
        gap = math.floor(2.0 ** (self.momentum_syncs / self.sync_doubling))
        self._next_sync = self.steps_taken + gap

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self):
        """Torch's optimizer state (this rank's momenta) and the step and sync counters."""
        state = super().state_dict()
        state["distributed_lion"] = dict(steps_taken=self.steps_taken,
                                         momentum_syncs=self.momentum_syncs,
                                         next_sync=self._next_sync,
                                         compression=self.compression)
        return state

    def load_state_dict(self, state_dict):
        """Restore what `state_dict` returned: this rank's momenta and the counters, so the
        momentum schedule continues where it was.

        Parameters
        ----------
        state_dict : dict
            This rank's; a `Lion` state (without the counters) leaves the counters as they
            are.

        Raises
        ------
        ValueError
            The counters are incomplete or not ints >= 0, or `Lion.load_state_dict` refuses
            the state; nothing is loaded then.

        Warns
        -----
        RuntimeWarning
            The state was saved with another ``compression``.
        """
        state_dict = dict(state_dict)
        counters = state_dict.pop("distributed_lion", None)
        missing = {"steps_taken", "momentum_syncs", "next_sync"} - set(counters or {})
        if counters is not None and missing:
            raise ValueError(f"the state's distributed_lion counters lack "
                             f"{', '.join(sorted(missing))}")
        for name in () if counters is None else ("steps_taken", "momentum_syncs", "next_sync"):
            value = counters[name]
            # a ValueError whatever is wrong: the state is bad, not an argument's type
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) \
                    or value < 0:
                raise ValueError(f"the state's distributed_lion counter {name} must be an "
                                 f"int >= 0, got {value!r}")
        saved = None if counters is None else counters.get("compression", self.compression)
        super().load_state_dict(state_dict)
        if saved != self.compression and saved is not None:
            warnings.warn(f"loading a state saved with compression={saved!r} into "
                          f"compression={self.compression!r}: the momenta and the sync "
                          f"schedule carry over", RuntimeWarning, stacklevel=2)
        if counters is not None:
            self.steps_taken = int(counters["steps_taken"])
            self.momentum_syncs = int(counters["momentum_syncs"])
            self._next_sync = int(counters["next_sync"])
