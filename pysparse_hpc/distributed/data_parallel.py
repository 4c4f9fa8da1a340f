"""Data-parallel training: replicated parameters whose gradients are summed over the ranks.

Gradients are copied into flat buckets (about ``bucket_mb`` each, parameters in reverse order of
registration, which is roughly the order backward produces them) and each bucket's allreduce is
started from a gradient hook as soon as it is full, so communication overlaps the rest of the
backward pass; the last one is waited on before ``backward()`` returns. Buckets are launched in
the same order on every rank (a bucket waits for the ones before it), as MPI requires of
collectives. The full-graph GNN trainer uses it, and so can any data-parallel torch model.
"""
import contextlib
import copy
import functools
import warnings
import weakref

import numpy as np
import torch
from torch.utils.weak import WeakIdKeyDictionary

from .._sputils import check_flag, is_real_number
from ._comm import PARTICIPATION_KIND, check_communicator, init
from ._flat import by_dtype, copy_out, flatten
from ._sparse_grads import allreduce_sparse, sparse_gradient_parameters

__all__ = ["DataParallel", "PARTICIPATION_KIND"]

#: The wrapper of each wrapped module (weak on both sides: neither keeps the other alive, and
#: the module pickles as it did).
_WRAPPER_OF = weakref.WeakKeyDictionary()
#: The wrapper that reduces each parameter, as a weak reference (keyed by identity: tensors
#: compare element-wise). A parameter reduced by two wrappers (a wrapped submodule of a wrapped
#: model) was summed twice where one wrapper's bucket copied the other's sum.
_REDUCER_OF = WeakIdKeyDictionary()


def _reducer_of(param):
    """The live wrapper that reduces ``param``, or None."""
    ref = _REDUCER_OF.get(param)
    wrapper = None if ref is None else ref()
    return None if wrapper is None or wrapper._retired else wrapper


class _Bucket:
    __slots__ = ("params", "flat", "ready", "request")

    def __init__(self, params):
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
        self.ready, self.request = 0, None


class DataParallel(torch.nn.Module):
    """Wrap a model whose parameters are replicated on every rank; its gradients are summed
    (or averaged) over the ranks during ``backward()``.

    Parameters
    ----------
    module : torch.nn.Module
        CPU parameters. The wrapper's ``forward`` calls it.
    comm : Communicator, optional
        Default: `pysparse_hpc.distributed.init()`.
    bucket_mb : float
        Gradient megabytes per allreduce (torch DDP's default, 25).
    average : bool
        Divide the sum by the number of ranks (each rank's loss is a mean over its own part of
        the batch, as in DDP). False keeps the sum: the right choice when every rank's loss is
        already normalized by the global batch (the full-graph GNN trainer).
    broadcast_parameters : bool
        Copy rank 0's parameters and buffers to every rank first, so replicas start equal.
    broadcast_buffers : bool
        Copy rank 0's buffers (BatchNorm's running statistics) to every rank at the start of
        each forward with gradients enabled outside `no_sync`, as torch DDP does by default:
        one broadcast per buffer dtype, booked as ``"broadcast"``. False leaves each rank its
        own buffers.

    Notes
    -----
    A parameter that one rank's backward does not reach contributes zero there (torch DDP
    needs ``find_unused_parameters=True`` for that); one that no rank's backward reaches
    keeps ``.grad`` None, as in one process (and DDP), so optimizers skip it rather than
    decaying it or applying momentum to a zero. Which is which is agreed on by a MAX
    allreduce of one byte per parameter tensor (traffic kind `PARTICIPATION_KIND`), started
    after the last bucket and waited on with them. A backward that reaches no parameter at
    all never starts this rank's allreduces, and the other ranks wait for them, as under
    DDP: give every rank a loss computed from the model's output (a rank without data can use
    ``0 * output.sum()``), and set a communicator timeout
    (`~pysparse_hpc.distributed.Communicator.set_timeout`) to end such a job with a message
    instead of a hang.

    The hooks are the parameters' own: while the wrapper lives (keep a reference to it; once
    collected, its hooks and MPI context go with it, as torch DDP's reducer goes with DDP),
    every backward that reaches them is reduced, whether or not it went through the
    wrapper's ``forward`` (torch DDP reduces only after its own forward), so every rank must
    run it; wrap a rank-local backward (a saliency map on one rank) in `no_sync`. With
    ``average=False`` a gradient already in ``.grad`` from an earlier reduced backward is
    summed over the ranks again (counted P times): zero the gradients between reduced
    backwards, and accumulate inside `no_sync`, as under DDP (with ``average=True`` the mean
    makes either way right). An activation checkpoint with ``use_reentrant=True`` runs its
    backward as a pass of its own inside the outer one: the gradients it produces are reduced
    when it ends, and not again with the rest. With ``broadcast_buffers`` every rank must
    call the wrapper's forward the same number of times with gradients enabled outside
    `no_sync` (the broadcast is a collective, as under DDP); a forward under
    ``torch.no_grad()`` (evaluation) or inside `no_sync` (a rank-local pass, accumulation)
    broadcasts nothing, so call `broadcast_parameters` before evaluating on one rank after
    training without it.

    Every rank must wrap a model of the same parameters and buffers (names, shapes, dtypes,
    the same ones frozen) with the same settings: the wrapper compares them once, and ranks
    that differ raise a ``ValueError`` on every rank, naming the first difference.

    Wrapping a module again (``fit`` does, once per call) retires the earlier wrapper: its
    hooks are removed and calling it is an error. A layer unfrozen after wrapping
    (fine-tuning) is reduced from the wrapper's next ``forward`` on, provided every rank
    unfreezes it alike; a layer frozen again keeps ``.grad`` None. Each wrapper reduces in an
    MPI context of its own (`~pysparse_hpc.distributed.Communicator.duplicate`), so several
    wrappers on one communicator (an encoder and a head, a GAN's two networks, a wrapped
    submodule of a wrapped model) never take each other's reductions; their traffic is
    counted in ``comm``'s `~pysparse_hpc.distributed.Communicator.stats`. A parameter that
    two live wrappers hold (the submodule's) is reduced once, by the newer wrapper; the
    earlier takes it back at its next ``forward`` once the newer is retired or collected.
    A backward that raised part-way leaves its reductions unfinished: the wrapper's next
    ``forward`` waits for those it started and starts afresh, with a warning.

    ``copy.deepcopy`` gives a wrapper of a copy of the module on the same ranks (no
    collective: one rank alone may copy). A wrapper pickles, and ``torch.save`` saves it,
    on one rank; over several, save its module's ``state_dict``, as with torch's
    ``DistributedDataParallel``.

    Examples
    --------
    >>> import torch
    >>> from pysparse_hpc import distributed
    >>> model = distributed.DataParallel(torch.nn.Linear(4, 2))
    >>> model(torch.ones(3, 4)).sum().backward()   # gradients summed over the ranks
    """

    def __init__(self, module, comm=None, bucket_mb=25.0, average=True,
                 broadcast_parameters=True, broadcast_buffers=True):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not is_real_number(bucket_mb):   # a string failed with a bare comparison error
            raise TypeError(f"bucket_mb must be a number of megabytes, got "
                            f"{type(bucket_mb).__name__}")
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb!r}")
        # A string such as "no" is truthy: average=False would have been read as True.
        average = check_flag(average, "average")
        broadcast_parameters = check_flag(broadcast_parameters, "broadcast_parameters")
        broadcast_buffers = check_flag(broadcast_buffers, "broadcast_buffers")
        comm = init() if comm is None else check_communicator(
            comm, ("rank", "size", "Iallreduce", "Bcast"))
        # The wrapper's collectives run in a context of their own: its buckets start when
        # this rank's gradients are ready, so two wrappers reducing during one backward
        # interleave their allreduces differently on different ranks, which in one context
        # paired one wrapper's buckets with the other's (wrong sums, or MPI's abort).
        reducing = comm.duplicate() if hasattr(comm, "duplicate") else comm
        try:
            _check_alike(reducing, module, bucket_mb, average, broadcast_parameters,
                         broadcast_buffers)
        except BaseException:
            if reducing is not comm:
                reducing.free()
            raise
        self._attach(module, comm, reducing, bucket_mb, average, broadcast_buffers)
        if broadcast_parameters:
            self.broadcast_parameters()

    def _attach(self, module, comm, reducing, bucket_mb, average, broadcast_buffers):
        """Reduce the gradients of ``module`` over ``comm``, in the MPI context ``reducing``
        (``comm`` itself or a duplicate of it)."""
        self.module = module
        self.comm = comm
        self._reducing = reducing
        # The parameters' hooks, ``{id: (weak parameter, handle)}``: they call this wrapper
        # through a weak reference, so that it can be collected, and its release then removes
        # them and frees its context (MPI has about 2000 per process: a loop that wraps new
        # models would run out).
        self._hooks = {}
        self._release = weakref.finalize(
            self, _release, self._hooks,
            self._reducing if self._reducing is not self.comm else None)
        self._release.atexit = False
        self.average = average
        self.broadcast_buffers = broadcast_buffers
        self._bucket_mb = bucket_mb
        self._launched = 0
        self._in_backward = False
        # Ids of the parameters whose gradient hook fired in this round of reductions. A
        # round ends with the backward pass that started it; an activation checkpoint
        # (use_reentrant=True) runs its backward as a pass of its own inside the outer one,
        # so one backward() can hold two rounds, and a gradient reduced in the first must
        # not be summed again in the second.
        self._produced = set()
        self._accumulated = set()   # ids of the parameters no_sync gave a gradient since
        self._enabled = True
        self._retired = False
        # On one rank the sum over the ranks is each gradient itself: nothing is copied into
        # buckets and back (half the step of a small model went there).
        self._alone = comm.size == 1
        # One wrapper per module: a second set of hooks would start every reduction twice, in
        # an order that can differ between ranks.
        earlier = _WRAPPER_OF.get(module)
        if earlier is not None and earlier() is not None:
            earlier()._retire()
        _WRAPPER_OF[module] = weakref.ref(self)
        self._params = []
        self._reduce(self._newly_trainable(take_over=True))

    # ------------------------------------------------------------- copies
    def __deepcopy__(self, memo):
        # A field-by-field copy kept the original's hook handles and a dead finalizer: once
        # its module was wrapped again, the retired copy's hooks stayed on the parameters and
        # every gradient was reduced twice. The copy is wrapped afresh around a copy of the
        # module, in the original's MPI context (shared, as a deep copy of the communicator
        # is; no collective, so one rank alone may copy its model).
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        kept = {name: value for name, value in self.__dict__.items()
                if name not in _WRAPPING_STATE}
        twin.__dict__.update(copy.deepcopy(kept, memo))
        twin._attach(twin.module, twin.comm, copy.deepcopy(self._reducing, memo),
                     self._bucket_mb, self.average, self.broadcast_buffers)
        return twin

    def __copy__(self):
        raise TypeError("a DataParallel cannot be copied shallowly: the copy would share its "
                        "module, whose gradients one wrapper reduces; use copy.deepcopy")

    def __reduce_ex__(self, protocol):
        # Python's own pickling failed on the wrapper's weak references ("cannot pickle
        # 'weakref.ReferenceType' object"). The module and the settings travel, and are
        # wrapped afresh where they are loaded; the communicator pickles by its own rule (a
        # one-rank one as a fresh one; one over several ranks refuses, naming what to save).
        return _rebuilt, (self.module, self.comm, self._bucket_mb, self.average,
                          self.broadcast_buffers, self.training)

    def _newly_trainable(self, take_over=False):
        """Parameters that require grad and are not reduced yet by this wrapper, nor (unless
        ``take_over``: wrapping hands them to the newest wrapper) by another live one."""
        return [p for p in self.module.parameters()
                if p.requires_grad and not self._hooked(p)
                and (take_over or _reducer_of(p) in (None, self))]

    def _hooked(self, parameter):
        """Whether ``parameter`` itself carries our hook: compared by identity through the
        weak reference, as a parameter replaced since may reuse a collected one's id."""
        entry = self._hooks.get(id(parameter))
        return entry is not None and entry[0]() is parameter

    def _reduce(self, added):
        """Reduce the parameters ``added`` too: buckets of every parameter reduced so far and
        these, in module order, and a gradient hook on each new one.

        A parameter frozen since stays in its bucket: its hook no longer fires, so its bucket
        starts at the end of the backward, where it contributes zero and keeps ``.grad``
        None; keeping it spares a rebuild per step to code that freezes and unfreezes layers
        in turn (a GAN's discriminator)."""
        for p in added:
            if p.device.type != "cpu":
                raise ValueError(f"DataParallel reduces host memory; a parameter is on "
                                 f"{p.device}")
        # One wrapper per parameter: another live one that reduces some of ``added`` hands
        # them over (every rank wraps alike, so all hand over the same ones).
        others = {}
        for p in added:
            other = _reducer_of(p)
            if other is not None and other is not self:
                others.setdefault(id(other), (other, []))[1].append(p)
        for other, given in others.values():
            other._hand_over(given)
        reduced = {id(p) for p in self._params + added}
        self._set_params([p for p in self.module.parameters() if id(p) in reduced])
        wrapper = weakref.ref(self)
        for p in added:
            stale = self._hooks.pop(id(p), None)
            if stale is not None:
                stale[1].remove()
            self._hooks[id(p)] = (weakref.ref(p), p.register_post_accumulate_grad_hook(
                functools.partial(_on_gradient_of, wrapper)))
            _REDUCER_OF[p] = wrapper

    def _set_params(self, params):
        """Reduce ``params`` (in module order): their buckets."""
        sparse = sparse_gradient_parameters(self.module)
        self._params = params
        # Sparse gradients (Embedding(sparse=True)) are summed apart, after the buckets.
        self._sparse = [p for p in params if id(p) in sparse]
        self._buckets = self._make_buckets([p for p in params[::-1] if id(p) not in sparse],
                                           self._bucket_mb * 2 ** 20)
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}

    def _hand_over(self, params):
        """Stop reducing ``params``, which a newer wrapper reduces from now on (this one takes
        them back at its next ``forward`` once that one is retired or collected)."""
        given = {id(p) for p in params}
        for p in params:
            entry = self._hooks.pop(id(p), None)
            if entry is not None:
                entry[1].remove()
        self._set_params([p for p in self._params if id(p) not in given])

    def _retire(self):
        self._retired = True
        self._release()  # every rank retires it at once: wrapping is collective

    def _check_live(self):
        if self._retired:
            raise RuntimeError("this DataParallel was retired: its module was wrapped again "
                               "(by a newer DataParallel, or by fit); call the newer wrapper")

    @staticmethod
    def _make_buckets(params, capacity):
        buckets, current, size = [], [], 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > capacity or p.dtype != current[0].dtype):
                buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            buckets.append(_Bucket(current))
        return buckets

    @property
    def bucket_sizes(self):
        """Parameters per bucket, in launch order."""
        return [len(b.params) for b in self._buckets]

    def forward(self, *args, **kwargs):
        """The wrapped module's output, ``module(*args, **kwargs)``.

        First it takes up the parameters unfrozen or added since wrapping, rebuilds the
        buckets of a model whose dtype changed and, with ``broadcast_buffers``, copies rank
        0's buffers to every rank when gradients are enabled outside `no_sync` (a collective
        on more than one rank).

        Parameters
        ----------
        *args, **kwargs
            Passed to the module.

        Returns
        -------
        object
            What the module returns.

        Raises
        ------
        RuntimeError
            The wrapper was retired: its module was wrapped again.
        ValueError
            A parameter that became trainable is not in host memory.

        Warns
        -----
        RuntimeWarning
            The last backward raised before it ended: its partial reductions are dropped.
        """
        self._check_live()
        if self._in_backward:
            self._abandon_backward()
        added = self._newly_trainable()
        if added:
            # Parameters unfrozen (or added) since wrapping: without a hook each rank stepped
            # with its own gradient and the replicas drifted. Every rank changes them alike
            # (as the model itself), so all rebuild here.
            self._reduce(added)
        elif any(p.dtype != b.flat.dtype for b in self._buckets for p in b.params):
            # The model changed dtype after wrapping (model.double()): buckets of the old one
            # would round its gradients.
            self._buckets = self._make_buckets([p for b in self._buckets for p in b.params],
                                               self._bucket_mb * 2 ** 20)
            self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        if (self.broadcast_buffers and self._enabled and self.comm.size > 1
                and torch.is_grad_enabled()):
            self._broadcast_buffers()
        return self.module(*args, **kwargs)

    def _broadcast_buffers(self, root=0):
        """Rank ``root``'s buffers on every rank: one broadcast per dtype of a flat copy."""
        with torch.no_grad():
            for buffers in by_dtype(self.module.buffers()).values():
                flat = flatten(buffers)
                self._reducing.Bcast(flat, root=root)
                copy_out(flat, buffers)

    def _abandon_backward(self):
        """Wait for the reductions a backward that raised had started, and start afresh."""
        warnings.warn("the last backward through DataParallel raised before it ended: its "
                      "partial gradient reductions are dropped", RuntimeWarning, stacklevel=3)
        try:
            for bucket in self._buckets:
                if bucket.request is not None:
                    bucket.request.wait()
        finally:
            self._reset()

    def broadcast_parameters(self, root=0):
        """Overwrite every rank's parameters and buffers with those of ``root``.

        Collective: one broadcast per tensor, booked as ``"broadcast"``.

        Parameters
        ----------
        root : int, default 0

        Raises
        ------
        RuntimeError
            The wrapper was retired: its module was wrapped again.
        TypeError, ValueError
            ``root`` is not a rank of the communicator, or a parameter or buffer is not in
            host memory.
        """
        self._check_live()
        with torch.no_grad():
            for tensor in list(self.module.parameters()) + list(self.module.buffers()):
                if tensor.is_contiguous():
                    self._reducing.Bcast(tensor.data, root=root)
                else:
                    staged = tensor.data.contiguous()
                    self._reducing.Bcast(staged, root=root)
                    tensor.data.copy_(staged)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no allreduce) inside the block, as torch DDP's."""
        self._enabled = False
        try:
            yield
        finally:
            self._enabled = True

    # ---------------------------------------------------------------- hooks
    def _on_gradient(self, param):  # through `_on_gradient_of`
        if self._alone:
            # What the reduction leaves on more ranks: a sparse gradient of a parameter reduced
            # densely (F.embedding(..., sparse=True) on a plain Parameter) comes back dense,
            # a sparse one coalesced.
            if param.grad is not None and param.grad.is_sparse:
                dense = id(param) in self._bucket_of
                param.grad = param.grad.to_dense() if dense else param.grad.coalesce()
            return
        if not self._enabled:
            self._accumulated.add(id(param))
            return
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            # Gradients accumulated in no_sync are this round's too, reached or not
            self._produced |= self._accumulated
            self._accumulated.clear()
        self._produced.add(id(param))
        bucket = self._bucket_of.get(id(param))
        if bucket is None:
            return  # a sparse gradient: summed in _finish
        bucket.ready += 1
        buckets = self._buckets
        while (self._launched < len(buckets)
               and buckets[self._launched].ready == len(buckets[self._launched].params)):
            self._launch(buckets[self._launched])
            self._launched += 1

    def _launch(self, bucket):
        offset = 0
        for p in bucket.params:
            size = p.numel()
            target = bucket.flat[offset:offset + size]
            if p.grad is None or id(p) not in self._produced:
                # unused in this round on this rank: contributes zero (a gradient it holds
                # was reduced in an earlier round)
                target.zero_()
            else:
                if p.grad.dtype != target.dtype:
                    raise RuntimeError(f"a parameter is {p.dtype} but DataParallel's buckets "
                                       f"are {target.dtype}: the model changed dtype after "
                                       f"wrapping; call the wrapper (it rebuilds them)")
                if p.grad.is_sparse:   # F.embedding(..., sparse=True) on a plain Parameter
                    p.grad = p.grad.to_dense()
                target.copy_(p.grad.reshape(-1))
            offset += size
        bucket.request = self._reducing.Iallreduce(bucket.flat)

    def _start_participation(self):
        """One flag per bucketed parameter, in bucket order: whether this round produced its
        gradient here, and once the returned request is waited on, on some rank."""
        has_grad = np.array([id(p) in self._produced for b in self._buckets for p in b.params],
                            dtype=np.uint8)
        return has_grad, self._reducing.Iallreduce(has_grad, "max", kind=PARTICIPATION_KIND)

    def _finish(self):
        """Launch the buckets whose parameters got no gradient, wait for all, write back."""
        try:
            while self._launched < len(self._buckets):
                self._launch(self._buckets[self._launched])
                self._launched += 1
            has_grad, participation = self._start_participation()
            scale = 1.0 / self.comm.size if self.average else None
            for bucket in self._buckets:
                bucket.request.wait()
            participation.wait()
            flags = iter(has_grad)
            for bucket in self._buckets:
                if scale is not None:
                    bucket.flat.mul_(scale)
                offset = 0
                for p in bucket.params:
                    size = p.numel()
                    reduced = bucket.flat[offset:offset + size].view_as(p)
                    used_on_some_rank = next(flags)
                    offset += size
                    if not used_on_some_rank:
                        continue   # untouched: None, or reduced in an earlier round
                    if p.grad is not None:
                        p.grad.copy_(reduced)
                    else:
                        p.grad = reduced.clone()
            for p in self._sparse:
                # A sparse Embedding whose weight is also used densely (tied weights) gets a
                # dense gradient: it takes the sparse reduction like the other ranks' (which
                # may differ), and is dense again after it.
                produced = id(p) in self._produced
                dense = produced and p.grad is not None and not p.grad.is_sparse
                if dense:
                    p.grad = p.grad.to_sparse()
                summed = allreduce_sparse(self._reducing, p, produced=produced)
                if summed is None:
                    continue   # no rank produced it in this round: untouched
                p.grad = summed if scale is None else summed * scale
                if dense:
                    p.grad = p.grad.to_dense()
        finally:
            self._reset()

    def _reset(self):
        for bucket in self._buckets:
            bucket.ready, bucket.request = 0, None
        self._launched, self._in_backward = 0, False
        self._produced = set()


#: What `DataParallel._attach` makes for the wrapper's module (hooks, buckets, state of a
#: backward): made afresh for a copy, never copied. The module and the communicator are
#: copied as any attribute (a communicator's deep copy is itself: the same ranks).
_WRAPPING_STATE = frozenset((
    "_reducing", "_hooks", "_release", "_launched", "_in_backward", "_produced", "_accumulated",
    "_enabled", "_retired", "_alone", "_params", "_sparse", "_buckets", "_bucket_of"))


def _layout(module, bucket_mb, average, broadcast_parameters, broadcast_buffers):
    """What must be alike on every rank for the wrapper's collectives to pair up: its settings,
    and the name, shape, dtype and trainability of each parameter and buffer."""
    sparse = sparse_gradient_parameters(module)
    return ((("bucket_mb", float(bucket_mb)), ("average", average),
             ("broadcast_parameters", broadcast_parameters),
             ("broadcast_buffers", broadcast_buffers))
            + tuple((f"parameter {name!r}", tuple(p.shape), str(p.dtype),
                     "trainable" if p.requires_grad else "frozen",
                     "sparse" if id(p) in sparse else "dense")
                    for name, p in module.named_parameters())
            + tuple((f"buffer {name!r}", tuple(b.shape), str(b.dtype))
                    for name, b in module.named_buffers()))


def _check_alike(comm, module, bucket_mb, average, broadcast_parameters, broadcast_buffers):
    """Raise on every rank when the ranks wrap unlike models or pass unlike settings.

    Each rank lays out its buckets from its own model: a parameter of another shape or dtype,
    one more, or one frozen on one rank only, gave buckets of other sizes, whose allreduces
    paired up anyway (gradients silently left unreduced) or failed inside MPI on some ranks
    only; ``broadcast_parameters`` on some ranks only paired their broadcasts with the
    others' first reductions. A collective, once per wrapper."""
    if comm.size == 1 or not hasattr(comm, "check_alike"):
        return
    comm.check_alike(_layout(module, bucket_mb, average, broadcast_parameters,
                             broadcast_buffers),
                     "the ranks wrap unlike models or pass unlike DataParallel settings",
                     "build the model alike on every rank (freeze the same layers) and wrap it "
                     "with the same settings")


def _rebuilt(module, comm, bucket_mb, average, broadcast_buffers, training):
    """A wrapper of ``module`` as an unpickled `DataParallel` was (its communicator has one
    rank: one over several refuses to be pickled)."""
    wrapper = DataParallel(module, comm, bucket_mb, average, broadcast_parameters=False,
                           broadcast_buffers=broadcast_buffers)
    return wrapper.train(training)


def _on_gradient_of(wrapper, param):
    """A parameter's gradient hook: hands it to its wrapper while the wrapper lives."""
    live = wrapper()
    if live is not None:
        live._on_gradient(param)


def _release(hooks, context):
    """What a wrapper leaves when it is retired or collected: its parameters' hooks, and the
    MPI context it duplicated (None: it reduced on the communicator it was given)."""
    for _, handle in hooks.values():
        handle.remove()
    hooks.clear()
    if context is not None:
        context.free()
