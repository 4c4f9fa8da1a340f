"""The preconditioned-gradient loop shared by every maker (ASDL's ``PreconditionedGradientMaker``).

This module owns

* `OutputPlaceholder`: what ``setup_model_call`` returns, standing for the model's output until
  the loop runs the model; indexing (``placeholder[mask]``), attribute access and calls on it are
  recorded and replayed on the real output;
* the choice of the modules to precondition, and the list of the parameters left with their
  plain gradient, each with the reason;
* the loop itself: step counter, curvature and preconditioner schedules, the plain pass and the
  curvature pass (forward hooks that see each module's input, tensor hooks on its output that
  see the gradient w.r.t. it, the extra backward passes of the MC and exact Fishers), the check
  for non-finite gradients, and the base of ``state_dict``.

What a curvature *is* (Kronecker factors, diagonals) and how it preconditions belongs to the
subclasses, which implement ``_kind_for``, ``_on_input``, ``_on_output_grad``,
``update_curvature``, ``update_preconditioner`` and ``precondition``.
"""
import contextlib
import dataclasses
import inspect
import math
import warnings
from collections import OrderedDict
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parameter import is_lazy

from .._sputils import check_flag, check_integer
from ..distributed._comm import check_communicator, check_rank, launched_ranks
from ..distributed._sparse_grads import allreduce_sparse, sparse_gradient_parameters
from ..nn._checks import user_stacklevel
from ._fisher import FISHER_EMP, fisher_passes
from ._kaisa import allreduce_sum
from .config import PreconditioningConfig, _schedules

__all__ = ["OutputPlaceholder", "PreconditionedGradientMaker"]


def _check_step(step):
    """``step`` as an int >= 0: a negative one was read from the end of a fixed schedule, and
    as warm-up by an interval's."""
    step = check_integer(step, "step")
    if step < 0:
        raise ValueError(f"step must be >= 0 (steps count from 0), got {step}")
    return step


def _is_torch_cross_entropy(loss_fn):
    """Whether ``loss_fn`` is torch's own cross-entropy, which reads the classes of
    ``(N, C, d1, ...)`` logits on their second axis (a loss of the user's, which may flatten
    ``(B, T, V)`` logits itself, keeps them last)."""
    return loss_fn is F.cross_entropy or isinstance(loss_fn, nn.CrossEntropyLoss)


#: The reason `unpreconditioned_parameters` gives a parameter frozen when the maker was built.
_FROZEN_AT_BUILD = ("frozen (requires_grad=False) when the maker was built: the plain "
                    "gradient if it trains later")

_NORM_LAYERS = tuple(getattr(nn, name) for name in (
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "InstanceNorm1d",
    "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "GroupNorm", "RMSNorm", "LocalResponseNorm")
    if hasattr(nn, name))


class OutputPlaceholder:
    """Stands for the output of the model call set up by ``setup_model_call``.

    Indexing (``placeholder[mask]``, ``placeholder[0]``), attribute access
    (``placeholder.logits``) and calls (``placeholder.view(-1, 3)``) return new placeholders
    that record the operation; ``forward_and_backward`` replays them on the real output.
    Names starting with an underscore are not recorded (they raise ``AttributeError``), so
    that copying and introspection see an ordinary object.

    Examples
    --------
    >>> from pysparse_hpc.precondition import OutputPlaceholder
    >>> import torch
    >>> p = OutputPlaceholder()[torch.tensor([True, False, True])]
    >>> p._resolve(torch.arange(3.0))
    tensor([0., 2.])
    """
    __slots__ = ("_ops",)

    def __init__(self, ops=()):
        object.__setattr__(self, "_ops", tuple(ops))

    def __getitem__(self, item):
        return OutputPlaceholder(self._ops + (("item", item),))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return OutputPlaceholder(self._ops + (("attr", name),))

    def __call__(self, *args, **kwargs):
        return OutputPlaceholder(self._ops + (("call", args, kwargs),))

    def __setattr__(self, name, value):
        raise AttributeError("an OutputPlaceholder records operations; it cannot be assigned to")

    def __reduce__(self):
        return (OutputPlaceholder, (self._ops,))

    def __iter__(self):
        raise TypeError("an OutputPlaceholder cannot be iterated (its length is unknown until "
                        "the model runs); index it instead")

    def __repr__(self):
        text = "output"
        for op in self._ops:
            if op[0] == "item":
                text += f"[{_short(op[1])}]"
            elif op[0] == "attr":
                text += f".{op[1]}"
            else:
                text += "(...)"
        return f"OutputPlaceholder({text})"

    def _resolve(self, output):
        """Apply the recorded operations to `output` (placeholders in arguments as well)."""
        value = output
        for op in self._ops:
            if op[0] == "item":
                value = value[_resolve(op[1], output)]
            elif op[0] == "attr":
                value = getattr(value, op[1])
            else:
                value = value(*_resolve(op[1], output), **_resolve(op[2], output))
        return value


def _short(value):
    if isinstance(value, torch.Tensor):
        return f"<{str(value.dtype).replace('torch.', '')} tensor {tuple(value.shape)}>"
    return repr(value)


def _resolve(value, output):
    """`value` with every placeholder in it (also inside lists, tuples, dicts) replayed."""
    if isinstance(value, OutputPlaceholder):
        return value._resolve(output)
    if isinstance(value, (list, tuple)):
        items = [_resolve(v, output) for v in value]
        # A namedtuple's constructor takes its fields as separate arguments, not an iterable.
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            return type(value)(*items)
        return type(value)(items)
    if isinstance(value, dict):
        return {k: _resolve(v, output) for k, v in value.items()}
    return value


def _first_placeholder(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, OutputPlaceholder):
            return value
    return None


def curvature_dtype(dtype):
    """The dtype a method keeps the curvature of a ``dtype`` parameter in: its own, float32
    for float16 and bfloat16 (Cholesky and eigendecompositions need float32 at least, and half
    precision would round the curvature away)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _autocast_off():
    """A context that turns autocast off (on the CPU, and on CUDA where there is one).

    Under ``torch.autocast`` the products that build the curvature would run in bfloat16 or
    float16 whatever the dtype of their operands: the factors would be rounded to 8 bits of
    mantissa, and the kernels that take float32 and float64 only (Jorge's Gram factors)
    would be handed half precision. The curvature is computed in `curvature_dtype`, as
    without autocast; the model's own forward and backward keep the autocast they run in.
    """
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast("cpu", enabled=False))
    if torch.cuda.is_available():
        stack.enter_context(torch.autocast("cuda", enabled=False))
    return stack


def _all_finite(tensor, total=None):
    """Whether `tensor` has no NaN or inf: one sum, and an exact check only if that overflows."""
    if total is None:
        total = float(tensor.sum())
    return math.isfinite(total) or bool(torch.isfinite(tensor).all())


def _trainable_parameters(module):
    """The weight and bias of ``module`` that train now."""
    return [param for param in (module.weight, getattr(module, "bias", None))
            if isinstance(param, torch.Tensor) and param.requires_grad]


def _accepts_reduction(loss_fn):
    if isinstance(loss_fn, nn.Module):
        return hasattr(loss_fn, "reduction")
    try:
        parameters = inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False
    return "reduction" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _detached(value):
    """``value`` with every tensor in it (in nested tuples, lists and dicts) detached."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        items = [_detached(item) for item in value]
        # A named tuple is rebuilt from its fields, a plain tuple or list from the sequence.
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return type(value)((key, _detached(item)) for key, item in value.items())
    return value


class PreconditionedGradientMaker:
    """Base class: ASDL's forward-backward-precondition loop over a model.

    Each ``forward_and_backward()`` runs the model call and the loss call set up by
    ``setup_model_call`` and ``setup_loss_call``, backpropagates, updates the curvature and the
    preconditioner when their schedules say so, preconditions the ``.grad`` of every
    preconditioned module in place and counts one step. Any torch optimizer's ``step()`` then
    applies the preconditioned gradient.

    Parameters
    ----------
    model : torch.nn.Module
        The model whose modules are preconditioned (hooks go on its leaf modules).
    config : PreconditioningConfig
    check_finite : bool, default True
        Check every gradient for NaN and inf after each backward (one reduction per
        parameter). A non-finite gradient skips the step: a ``RuntimeWarning``, every gradient
        of the model zeroed (so ``opt.step()`` leaves plain SGD weights unchanged; a stateful
        optimizer still applies its momentum: test `last_step_skipped` to skip it), no
        curvature update and no preconditioning. False: gradients are used as they come.
    comm : pysparse_hpc.distributed.Communicator, optional
        Each rank holds part of the examples (a split batch, or its rows of a `DistGraph`) and
        ``config.data_size`` counts all of them: after each backward the gradients are summed
        over the ranks in one flat buffer per dtype (do not also wrap the model in
        `DataParallel`), so every rank preconditions the one-process gradient. The makers
        add their own distribution of the curvature (see each). None: one process, with a
        ``UserWarning`` on a job launched with several ranks (``Communicator()`` keeps one
        process without it).

    Attributes
    ----------
    model : torch.nn.Module
    config : PreconditioningConfig
    state : dict
        ``{"step": number of forward_and_backward calls so far}``.
    last_step_skipped : bool
        Whether the last ``forward_and_backward`` met a non-finite gradient and skipped.
    """
    #: Whether `data_size` must be set (the curvature is scaled by it).
    _requires_data_size = True
    #: The attributes that must be alike on every rank (checked at the first distributed step).
    _alike_settings = ("check_finite",)

    def __init__(self, model, config, *, check_finite=True, comm=None):
        check_communicator(comm, ("rank", "size", "Allreduce", "Bcast", "bcast", "gather"))
        if comm is None and launched_ranks() > 1:
            # DataParallel, DistributedLion and DistGraph take the world for comm=None; a maker
            # keeps to one process, so a forgotten comm= preconditions each replica's summed
            # gradient with its own batch's curvature and the replicas part without an error.
            warnings.warn(f"{type(self).__name__} was made without comm= on a job of "
                          f"{launched_ranks()} ranks: it preconditions with this rank's "
                          f"examples alone, and ranks that step alike part ways. Pass "
                          f"comm=distributed.init() to take every rank's examples, or "
                          f"comm=distributed.Communicator() to keep each rank's own (which "
                          f"also silences this warning)", UserWarning,
                          stacklevel=user_stacklevel())
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(config, PreconditioningConfig):
            raise TypeError(f"config must be a PreconditioningConfig, got "
                            f"{type(config).__name__}")
        # Checked again: a field set after the config was made (ASDL's configs are plain
        # dataclasses, changed in scripts) failed inside the first step, a negative damping
        # as a comparison of a complex number.
        config._check()
        self.model = model
        self.config = config
        self.comm = comm
        #: Whether there are other ranks to sum gradients and curvature with.
        self._distributed = comm is not None and comm.size > 1
        self._check_config()
        self.check_finite = check_flag(check_finite, "check_finite")
        self.state = {"step": 0}
        self.last_step_skipped = False
        self._schedule_pair = self._config_values = None
        self._forward_calls = None      # {module name: calls} during a curvature forward
        self._reached = None            # modules whose output gradient a Fisher pass reached
        #: Modules the last MC or exact Fisher pass ran forward but reached no gradient of.
        self._unreached = ()
        self._warned_repeated = set()   # modules already warned of as called repeatedly
        self._ranks_agreed = False      # whether the ranks compared their makers (first step)
        self._current_schedules()
        self._model_fn = None
        self._model_args = ()
        self._model_kwargs = {}
        self._loss_fn = None
        self._loss_args = ()
        self._loss_kwargs = {}
        self._model_output = None
        self._loss = None
        self._grad_weight = None
        self._weight_dtypes = {}   # name -> weight dtype during a curvature pass
        self._modules = OrderedDict()
        self._unpreconditioned = OrderedDict()
        self._select_modules()
        self._parameter_layout = self._current_parameter_layout()

    def _current_parameter_layout(self):
        """The identity, dtype and device of every parameter: what the maker's references and
        the stored curvature follow."""
        return tuple((id(param), param.dtype, param.device) for param in self.model.parameters())

    def _rebind_parameters(self):
        """Take up the parameter objects the model holds now (a subclass that keeps
        references to them follows here); the modules' hooks need nothing."""

    def _follow_parameters(self):
        """Move the stored curvature to the dtype and device the parameters have now.

        After ``model.double()`` or ``model.to(device)`` the curvature kept from before (a
        moving average, Shampoo's statistics and roots) would stay in the old dtype and be
        mixed into every later step. It is moved as `load_state_dict` moves a loaded state,
        so the maker continues as one built on the converted model and loaded with its
        state would. Parameters the model replaced (``load_state_dict(assign=True)``) are
        taken up: Shampoo and Jorge read the replaced ones' empty ``.grad`` and stopped
        preconditioning without a word.
        """
        layout = self._current_parameter_layout()
        if layout != self._parameter_layout:
            # The maker's references keep the replaced parameters alive: an id cannot be
            # reused by a new one while they do.
            if [entry[0] for entry in layout] != [entry[0] for entry in self._parameter_layout]:
                self._rebind_parameters()
            if [entry[1:] for entry in layout] != [entry[1:] for entry in
                                                   self._parameter_layout]:
                self.load_state_dict(self.state_dict())
            self._parameter_layout = layout

    # ------------------------------------------------------------------ modules
    def _kind_for(self, name, module):
        """The handler that preconditions `module`, or None when this maker does not.

        Raises ``NotImplementedError`` for a supported class in a configuration it cannot
        handle (a dilated convolution).
        """
        raise NotImplementedError

    def _supported_names(self):
        return "supported modules"

    def _is_ignored(self, name, module, ignored_ids):
        for entry in self.config.ignore_modules or ():
            if isinstance(entry, type):
                if isinstance(module, entry):
                    return True
            elif isinstance(entry, str):
                if entry in name:
                    return True
        return id(module) in ignored_ids

    def _select_modules(self):
        ignored_ids = set()
        for entry in self.config.ignore_modules or ():
            if isinstance(entry, nn.Module):
                ignored_ids.update(id(m) for m in entry.modules())
        owners = {}
        for name, module in self.model.named_modules():
            for pname, param in module.named_parameters(recurse=False):
                if param.requires_grad:
                    owners.setdefault(id(param), []).append(name or "<model>")
        unsupported = []
        for name, module in self.model.named_modules():
            params = [(pname, p) for pname, p in module.named_parameters(recurse=False)
                      if p.requires_grad]
            for pname, param in module.named_parameters(recurse=False):
                if not param.requires_grad:
                    # Unfrozen later (gradual unfreezing), it trains on the plain gradient:
                    # listed, where it was neither preconditioned nor listed.
                    self._unpreconditioned[f"{name}.{pname}" if name else pname] = (
                        _FROZEN_AT_BUILD)
            if not params:
                continue
            kind = None
            if self._is_ignored(name, module, ignored_ids):
                reason = "in config.ignore_modules"
            elif next(module.children(), None) is not None:
                reason = (f"held directly by {type(module).__name__}, which has submodules "
                          f"(only leaf modules are preconditioned)")
            elif any(is_lazy(p) for _, p in params):
                # Its shapes are unknown until its first call: a maker built now would size
                # nothing (or fail on torch's uninitialized parameter far from the cause).
                raise ValueError(
                    f"module {name or '<model>'!r} ({type(module).__name__}) has uninitialized "
                    f"parameters: call the model once (on a dummy batch) before building "
                    f"{type(self).__name__}, or add it to PreconditioningConfig.ignore_modules")
            elif self._weight_is_frozen(module, params):
                # Before `_kind_for`: a module that would keep the plain gradient anyway must
                # not be refused for a configuration its curvature cannot handle (a grouped
                # Conv2d whose bias alone trains).
                reason = "the module's weight is frozen"
            elif self._weight_is_computed(module, params):
                reason = ("the module's weight is computed from other parameters (as by "
                          "torch.nn.utils.weight_norm), which have no curvature here")
            elif self._weight_is_empty(module):
                # No curvature to gather (a factor of a 0-wide side), and its bias has nothing
                # to be preconditioned with.
                reason = "the module's weight is empty"
            else:
                kind = self._kind_for(name, module)
                if kind is None:
                    if isinstance(module, _NORM_LAYERS):
                        reason = f"normalization layer ({type(module).__name__})"
                    else:
                        reason = (f"{type(module).__name__} is not supported by "
                                  f"{type(self).__name__}")
                        unsupported.append(f"{name or '<model>'} ({type(module).__name__})")
                else:
                    shared = sorted({o for _, p in params for o in owners[id(p)]}
                                    - {name or "<model>"})
                    reason = None
                    if shared:
                        reason = f"tied to a parameter of {', '.join(shared)}"
                        kind = None
                        warnings.warn(f"module {name or '<model>'!r} shares a parameter with "
                                      f"{shared}: it keeps the plain gradient", UserWarning,
                                      stacklevel=4)
            if kind is None:
                for pname, _ in params:
                    self._unpreconditioned[f"{name}.{pname}" if name else pname] = reason
            else:
                self._modules[name] = (module, kind)
        if not self._modules:
            trainable = [(k, v) for k, v in self._unpreconditioned.items()
                         if not v.startswith(_FROZEN_AT_BUILD)]
            found = "; ".join(f"{k}: {v}" for k, v in trainable[:8])
            raise ValueError(
                f"{type(self).__name__} found nothing to precondition in "
                f"{type(self.model).__name__}: expected at least one {self._supported_names()} "
                f"with a trainable weight outside ignore_modules; found "
                f"{found or 'no trainable parameter'}")
        if unsupported:
            warnings.warn(f"{type(self).__name__} leaves these modules with the plain gradient "
                          f"(unsupported type): {', '.join(unsupported)}; add them to "
                          f"ignore_modules to silence this", UserWarning, stacklevel=4)

    @staticmethod
    def _weight_is_empty(module):
        """Whether ``module`` has a ``weight`` of no element (``nn.Linear(0, n)``)."""
        weight = getattr(module, "weight", None)
        return isinstance(weight, torch.Tensor) and weight.numel() == 0

    def _weight_is_computed(self, module, params):
        """Whether `module`'s ``weight`` is a tensor computed from other parameters rather than
        one of its trainable parameters `params` (``torch.nn.utils.weight_norm`` sets it from
        ``weight_g`` and ``weight_v`` before each call).

        K-FAC and the diagonal Fisher: such a module keeps the plain gradient, since their
        curvature and preconditioned gradient are the weight's, which has no ``.grad`` (a
        module whose ``weight`` trains is called frozen or not by `_weight_is_frozen`).
        """
        weight = getattr(module, "weight", None)
        return (isinstance(weight, torch.Tensor) and weight.requires_grad
                and not any(p is weight for _, p in params))

    def _weight_is_frozen(self, module, params):
        """Whether `module` (a leaf with the trainable parameters `params`, ``[(name,
        parameter)]``) keeps the plain gradient because its ``weight`` is frozen.

        K-FAC and the diagonal Fisher: whenever it has a ``weight`` that does not require a
        gradient, since their curvature is the weight's (the bias is preconditioned with it).
        """
        weight = getattr(module, "weight", None)
        return isinstance(weight, torch.Tensor) and not weight.requires_grad

    def preconditioned_modules(self):
        """The modules whose gradients are preconditioned.

        Returns
        -------
        collections.OrderedDict
            Qualified module name (``""`` for a leaf model itself) -> module.
        """
        return OrderedDict((name, module) for name, (module, _) in self._modules.items())

    def unpreconditioned_parameters(self):
        """The parameters that keep their plain gradient, and why.

        Parameters frozen when the maker was built (they train on the plain gradient if
        unfrozen later: build a new maker to precondition them), normalization layers,
        modules in ``config.ignore_modules``, module types this maker does not support,
        parameters held directly by container modules, biases of modules whose weight is
        frozen (Shampoo and Jorge: of those with no other trainable parameter of two or more
        dimensions) and parameters tied between modules; under K-FAC and the diagonal Fisher
        also the parameters of a module whose weight is computed from them
        (``torch.nn.utils.weight_norm``) and those of a preconditioned module other than its
        weight and bias (a LoRA layer's adapters).

        Returns
        -------
        collections.OrderedDict
            Qualified parameter name -> reason.
        """
        return OrderedDict(self._unpreconditioned)

    # ------------------------------------------------------------------ set-up calls
    def setup_model_call(self, model_fn, *args, **kwargs):
        """Set up the model call of the next ``forward_and_backward``.

        Parameters
        ----------
        model_fn : callable
            Usually the model; called as ``model_fn(*args, **kwargs)``.
        *args, **kwargs
            Its arguments.

        Returns
        -------
        OutputPlaceholder
            Stands for the output; index it or pass it to ``setup_loss_call``.
        """
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable, got {type(model_fn).__name__}")
        self._model_fn = model_fn
        self._model_args = args
        self._model_kwargs = kwargs
        return OutputPlaceholder()

    def setup_loss_call(self, loss_fn, *args, **kwargs):
        """Set up the loss call of the next ``forward_and_backward``.

        Parameters
        ----------
        loss_fn : callable
            A loss that accepts ``reduction=`` (``torch.nn.functional.cross_entropy``, an
            ``nn.CrossEntropyLoss()``): curvature steps call it with ``reduction="sum"``.
        *args, **kwargs
            Its arguments; placeholders from ``setup_model_call`` (indexed or not, e.g.
            ``placeholder[train_mask]``) are replaced by the real output. The first placeholder
            is also what the MC and exact Fishers take as the logits.
        """
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        if not _accepts_reduction(loss_fn):
            what = (f"module {type(loss_fn).__name__} without a .reduction attribute"
                    if isinstance(loss_fn, nn.Module) else
                    f"{getattr(loss_fn, '__name__', type(loss_fn).__name__)} without a "
                    f"reduction parameter")
            raise TypeError(f"loss_fn must accept reduction= (curvature steps call it with "
                            f"reduction='sum'); found {what}")
        if _first_placeholder(args, kwargs) is None:
            raise ValueError("setup_loss_call got no placeholder: pass the value returned by "
                             "setup_model_call (or an indexed form of it) as an argument")
        self._loss_fn = loss_fn
        self._loss_args = args
        self._loss_kwargs = kwargs

    @property
    def model_output(self):
        """The output of the last model call."""
        return self._model_output

    @property
    def loss(self):
        """The loss of the last ``forward_and_backward``."""
        return self._loss

    def __getstate__(self):
        """The maker's attributes, with the last output and loss (`model_output`, `loss`)
        detached from their autograd graph: ``copy.deepcopy`` refuses a tensor that is not a
        leaf, so a maker that had taken a step could not be copied (alone, or with its model
        and optimizer), and a pickle would carry the graph's tensors for nothing."""
        state = self.__dict__.copy()
        state["_model_output"] = _detached(self._model_output)
        state["_loss"] = _detached(self._loss)
        return state

    @property
    def step(self):
        """Number of ``forward_and_backward`` calls so far (``state["step"]``)."""
        return self.state["step"]

    # ------------------------------------------------------------------ schedules
    def _check_config(self):
        """What this maker needs of its config beyond `PreconditioningConfig`'s own checks."""
        if self._requires_data_size and self.config.data_size == -1:
            raise ValueError(
                f"{type(self).__name__} needs PreconditioningConfig.data_size (found -1, "
                f"unset; expected the number of examples the loss sums over, e.g. the batch "
                f"size or the number of training nodes)")
        if self._distributed and self.config.data_size == -1:
            # Each rank's loss is its summed loss over the examples of all ranks: the
            # gradients summed over the ranks are then the one-process gradient.
            raise ValueError(
                f"{type(self).__name__} over {self.comm.size} ranks needs "
                f"PreconditioningConfig.data_size (found -1, unset; expected the number of "
                f"examples of all ranks, which each rank's summed loss is divided by)")

    def _current_schedules(self):
        """The (curvature, preconditioner) schedules of the config as it is now: ASDL reads
        its config at every step, so a script may change it during training. Any changed
        field (damping, data_size, ...) is checked as on construction, at the start of the
        next step, before it is used."""
        values = _config_values(self.config)
        if values != self._config_values:
            if self._config_values is not None:
                self.config._check()
                self._check_config()
            self._schedule_pair = _schedules(self.config)
            self._config_values = values
        return self._schedule_pair

    @property
    def _curvature_schedule(self):
        return self._current_schedules()[0]

    @property
    def _preconditioner_schedule(self):
        return self._current_schedules()[1]

    def do_update_curvature(self, step=None):
        """Whether `step` (default: the current one) updates the curvature.

        Parameters
        ----------
        step : int, optional
            A step number, counted from 0 as ``state["step"]`` counts them.

        Returns
        -------
        bool

        Raises
        ------
        TypeError, ValueError
            ``step`` is not an integer >= 0; a field of the config was changed since it was
            last read to an invalid value (checked as on construction).

        Warns
        -----
        RuntimeWarning
            Once, for a step past ``config.num_total_steps``: no update from there on.
        """
        return self._curvature_schedule(
            self.state["step"] if step is None else _check_step(step))

    def do_update_preconditioner(self, step=None):
        """Whether `step` (default: the current one) updates the preconditioner.

        Parameters
        ----------
        step : int, optional
            A step number, counted from 0 as ``state["step"]`` counts them.

        Returns
        -------
        bool

        Raises
        ------
        TypeError, ValueError
            ``step`` is not an integer >= 0; a field of the config was changed since it was
            last read to an invalid value (checked as on construction).

        Warns
        -----
        RuntimeWarning
            Once, for a step past ``config.num_total_steps``: no update from there on.
        """
        return self._preconditioner_schedule(
            self.state["step"] if step is None else _check_step(step))

    # ------------------------------------------------------------------ the loop
    def forward_and_backward(self):
        """Forward, backward, update on schedule, precondition ``.grad`` in place; one step.

        Returns
        -------
        output : object
            The model's output.
        loss : torch.Tensor
            The loss. On curvature steps it is computed with ``reduction="sum"`` and divided
            by ``config.data_size`` (as are the gradients), as in ASDL; on the other steps it
            is the loss call as set up. Over several ranks (``comm=``) every step computes it
            the first way: the rank's summed loss over all ranks' examples, so that the
            gradients summed over the ranks are the one-process ones whatever the loss's own
            reduction.
        """
        if self._model_fn is None or self._loss_fn is None:
            raise RuntimeError("call setup_model_call() and setup_loss_call() before "
                               "forward_and_backward()")
        if not torch.is_grad_enabled():
            # torch's own error ("element 0 of tensors does not require grad") names no cause
            raise RuntimeError(f"{type(self).__name__}.forward_and_backward() needs autograd, "
                               f"but gradients are off here (torch.no_grad() or "
                               f"torch.inference_mode()); call it outside those contexts")
        if self._distributed and not self._ranks_agreed:
            self._check_ranks_alike()
        self._follow_parameters()
        step = self.state["step"]
        self.last_step_skipped = False
        update_curvature = self.do_update_curvature(step)
        held = self._set_aside_gradients()
        try:
            if update_curvature:
                output, loss = self._curvature_forward_and_backward()
            else:
                output, loss = self._plain_forward_and_backward()
            if self._distributed:
                self._allreduce_gradients()
            with _autocast_off():
                if self.check_finite and not self._gradients_finite(step):
                    self.last_step_skipped = True
                    self._discard_curvature()
                else:
                    if update_curvature:
                        self.update_curvature()
                    if self.do_update_preconditioner(step):
                        self.update_preconditioner()
                    self.precondition()
        except BaseException:
            # The step's gradient may be raw here (not preconditioned, not yet summed over
            # the ranks): .grad goes back to what it held before the call.
            for param in self.model.parameters():
                param.grad = None
            for param, before in held:
                param.grad = before
            raise
        self._add_back_gradients(held)
        self.state["step"] = step + 1
        self._model_output, self._loss = output, loss
        return output, loss

    def _set_aside_gradients(self):
        """Take what ``.grad`` holds before the step (an earlier micro-batch's step, when
        gradients are accumulated, or an auxiliary loss's own backward) out of the step's
        way: preconditioned, reduced over the ranks and read into the statistics with the
        step's own gradient, the first micro-batch was preconditioned twice (its gradient
        norm 24x the sum of both micro-batches' preconditioned ones, with K-FAC)."""
        held = []
        for param in self.model.parameters():
            if param.grad is not None:
                held.append((param, param.grad))
                param.grad = None
        return held

    def _add_back_gradients(self, held):
        """Add the step's gradient to what `_set_aside_gradients` took (in the tensor the
        user's ``.grad`` was, as autograd accumulates)."""
        with torch.no_grad():
            for param, before in held:
                step = param.grad
                if step is None:
                    param.grad = before
                elif before.is_sparse or step.is_sparse:
                    param.grad = before + step
                else:
                    param.grad = before.add_(step)

    def _check_ranks_alike(self):
        """Refuse, on every rank, ranks whose makers differ (collective, once). Another
        model, selection or config paired the gradient and factor allreduces wrongly (an
        error inside MPI, or sums of unlike things); another damping or interval moved the
        replicas apart without a word."""
        def plain(value):  # a function's or an object's repr holds its address
            return repr(value) if isinstance(value, (str, int, float, bool, tuple,
                                                     type(None))) else type(value).__name__
        layout = ((("maker", type(self).__name__),)
                  + tuple((f"config.{field.name}", plain(getattr(self.config, field.name)))
                          for field in dataclasses.fields(self.config)
                          if field.name != "ignore_modules")
                  + tuple((name, plain(getattr(self, name, None)))
                          for name in self._alike_settings)
                  + (("preconditioned modules", tuple(self._modules)),
                     ("plain parameters", tuple(self._unpreconditioned)))
                  + tuple((f"parameter {name!r}", tuple(param.shape), str(param.dtype))
                          for name, param in self.model.named_parameters()
                          if param.requires_grad))
        if hasattr(self.comm, "check_alike"):
            self.comm.check_alike(layout, f"the ranks build unlike {type(self).__name__}s",
                                  "build the model, the config and the maker alike on every "
                                  "rank")
        self._ranks_agreed = True

    def _allreduce_gradients(self):
        """Sum every trainable parameter's gradient over the ranks; a parameter without a
        gradient on some ranks counts as zero there, and stays without one where no rank has
        it (NaN or inf on one rank reaches every rank, so all skip the step together). Sparse
        gradients (an ignored ``Embedding(sparse=True)``) stay sparse."""
        sparse = sparse_gradient_parameters(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        for param in params:
            if id(param) in sparse:
                param.grad = allreduce_sparse(self.comm, param, "gradient allreduce")
        params = [p for p in params if id(p) not in sparse]
        present = torch.tensor([p.grad is not None for p in params], dtype=torch.float64)
        grads = [torch.zeros_like(p) if p.grad is None
                 else p.grad.to_dense() if p.grad.is_sparse else p.grad for p in params]
        allreduce_sum(self.comm, grads + [present], "gradient allreduce")
        for param, grad, count in zip(params, grads, present.tolist()):
            param.grad = grad if count > 0 else None

    def _call_model(self):
        return self._model_fn(*self._model_args, **self._model_kwargs)

    def _call_loss(self, output, reduction=None):
        """The loss on `output` (with `reduction` forced when given) and the logits."""
        args = _resolve(self._loss_args, output)
        kwargs = _resolve(self._loss_kwargs, output)
        logits = _first_placeholder(self._loss_args, self._loss_kwargs)._resolve(output)
        if reduction is None:
            return self._loss_fn(*args, **kwargs), logits
        if isinstance(self._loss_fn, nn.Module):
            original = self._loss_fn.reduction
            self._loss_fn.reduction = reduction
            try:
                return self._loss_fn(*args, **kwargs), logits
            finally:
                self._loss_fn.reduction = original
        kwargs["reduction"] = reduction
        return self._loss_fn(*args, **kwargs), logits

    def _plain_forward_and_backward(self):
        output = self._call_model()
        if self._distributed:
            # A rank's mean (the loss as set up, F.cross_entropy) summed over the ranks is no
            # mean of the batch: every rank divides its sum by the count of all ranks instead,
            # as the curvature pass does.
            loss_sum, _ = self._call_loss(output, reduction="sum")
            loss = loss_sum / self.config.data_size
        else:
            loss, _ = self._call_loss(output)
        loss.backward()
        return output, loss

    def _curvature_forward_and_backward(self):
        """Run the curvature pass; the subclass's `_fisher` tells which Fisher to build."""
        raise NotImplementedError

    def _fisher_forward_and_backward(self, fisher_type, loss_type, n_mc_samples=1, var=1.0,
                                     seed=None):
        """Forward and backward with the curvature hooks on; returns ``(output, loss)``.

        Forward hooks pass each module's input to ``_on_input``; tensor hooks on its output
        pass the gradient w.r.t. it to ``_on_output_grad`` with the weight of the current
        backward pass. The loss is computed with ``reduction="sum"``; the training backward
        runs on ``loss / data_size``. The empirical Fisher captures the gradients of that
        backward (weight ``data_size**2``, undoing the division: the curvature is built from
        the gradients of the summed loss, as in ASDL); the MC and exact Fishers capture those
        of their own passes first (``torch.autograd.grad`` w.r.t. the weights that train now,
        whose results are dropped; no pass where none does), and nothing of the training
        backward.
        """
        data_size = self.config.data_size
        # The forward hooks' handles, and the output gradients' hooks' the forward hooks add:
        # those hold the maker, and the model's output (kept by the maker) holds them through
        # its graph, which Python's collector cannot see into. Left in place, maker, model and
        # output were never freed; they are removed with the others.
        handles = []
        # Read before the forward: a layer that calls its module with parameters cast to its
        # input's dtype (GCNConv's transform of float64 features with float32 weights) shows
        # the cast ones to the hooks, and the curvature follows the parameters.
        self._weight_dtypes = {name: module.weight.dtype
                               for name, (module, _) in self._modules.items()}
        # With a seed, ASDL's torch.manual_seed before each curvature pass reset the global
        # generator: every later draw of the user's (a DataLoader's shuffle, the next step's
        # dropout) repeated at each such step. The pass runs on a fork of it instead.
        devices = sorted({param.device.index or 0 for param in self.model.parameters()
                          if param.device.type == "cuda"})
        with (torch.random.fork_rng(devices=devices) if seed is not None
              else contextlib.nullcontext()):
            try:
                for name, (module, _) in self._modules.items():
                    handles.append(module.register_forward_hook(
                        partial(self._forward_hook, name, handles), with_kwargs=True))
                if seed is not None:
                    torch.manual_seed(seed)   # in the fork: the user's stream is left as it was
                self._forward_calls = {}
                output = self._call_model()
                calls, self._forward_calls = self._forward_calls, None
                self._warn_repeated_calls(calls)
                loss_sum, logits = self._call_loss(output, reduction="sum")
                if fisher_type != FISHER_EMP:
                    # Only the parameters that train now: a weight frozen after the maker was built
                    # (gradual freezing) cannot be differentiated, but its module's bias, if it
                    # trains, still takes the pass to the module's output (as the training
                    # backward does for the empirical Fisher); none at all leaves nothing to pass.
                    trainable = {name: _trainable_parameters(module)
                                 for name, (module, _) in self._modules.items()}
                    inputs = [param for params in trainable.values() for param in params]
                    passes = (fisher_passes(fisher_type, loss_type, logits, n_mc_samples, var,
                                            _is_torch_cross_entropy(self._loss_fn))
                              if inputs else ())
                    self._reached = set()
                    for nll, weight in passes:
                        self._grad_weight = weight
                        torch.autograd.grad(nll, inputs, retain_graph=True, allow_unused=True)
                    self._grad_weight = None
                    if inputs:
                        self._unreached = tuple(
                            name for name in calls if name not in self._reached
                            and trainable[name])  # all frozen: no gradient to reach it
                else:
                    self._grad_weight = float(data_size) ** 2
                loss = loss_sum / data_size
                loss.backward()
            finally:
                self._grad_weight = self._forward_calls = self._reached = None
                for handle in handles:
                    handle.remove()
        return output, loss

    def _forward_hook(self, name, handles, module, args, kwargs, output):
        # A call without grad (under no_grad: a target computed by the same network; the
        # first pass of a reentrant checkpoint) ran, but no gradient will reach it: it is no
        # example of the curvature, nor a repeated call.
        differentiated = isinstance(output, torch.Tensor) and output.requires_grad
        # Counted in the forward only: a forward re-run inside backward (activation
        # checkpointing) is the same call again.
        if self._forward_calls is not None:
            counts = self._forward_calls.setdefault(name, [0, 0])
            counts[0] += 1
            counts[1] += differentiated
        if not differentiated:
            return
        x = (args[0] if args else next(iter(kwargs.values()))).detach()
        if x.layout != torch.strided:
            # Sparse features (a GCN layer's on a bag-of-words graph) reach the Linear inside
            # it; the factors' products take them dense (torch's reshape refused them).
            x = x.to_dense()
        with torch.no_grad(), _autocast_off():
            context = self._on_input(name, module, x)
        handles.append(output.register_hook(partial(self._output_grad_hook, name, context)))

    def _warn_repeated_calls(self, calls):
        """Warn once per module called more than once in a forward: its curvature counts the
        calls as separate examples, an approximation where they see the same example.
        ``calls``: module name -> [calls, calls with grad] in the forward."""
        repeated = {name: n for name, (_, n) in calls.items()
                    if n > 1 and name not in self._warned_repeated}
        if repeated:
            self._warned_repeated.update(repeated)
            listed = ", ".join(f"{name or '<model>'!r} ({n} calls)"
                               for name, n in repeated.items())
            warnings.warn(f"{type(self).__name__}: {listed} ran more than once in one forward. "
                          f"Each call's input and output gradient count as separate examples "
                          f"(K-FAC's 'expand'): exact where the calls see different examples "
                          f"(parts of a batch), an approximation where they see the same ones "
                          f"(weights shared across the calls of a recurrent or Siamese network: "
                          f"the terms that pair two calls are left out)", UserWarning,
                          stacklevel=5)

    def _output_grad_hook(self, name, context, grad):
        if self._grad_weight is not None:
            if self._reached is not None:
                self._reached.add(name)
            with torch.no_grad(), _autocast_off():
                self._on_output_grad(name, self._modules[name][0], grad.detach(),
                                     self._grad_weight, context)

    def _on_input(self, name, module, x):
        """Record what the curvature needs from the input `x` of one call of `module`.

        Returns a context handed to ``_on_output_grad`` for the gradient of the same call.
        """
        raise NotImplementedError

    def _on_output_grad(self, name, module, grad, weight, context):
        """Record what the curvature needs from the gradient w.r.t. the output of one call.

        `weight` is the weight of the current backward pass, `context` what ``_on_input``
        returned for the same call.
        """
        raise NotImplementedError

    def _discard_curvature(self):
        """Forget what the hooks recorded in a skipped step."""

    def update_curvature(self):
        """Turn what the hooks recorded into the curvature (called on curvature steps)."""
        raise NotImplementedError

    def update_preconditioner(self):
        """Refresh the preconditioner from the curvature (called on preconditioner steps)."""
        raise NotImplementedError

    def precondition(self):
        """Precondition the ``.grad`` of the preconditioned modules in place."""
        raise NotImplementedError

    def _gradients_finite(self, step):
        named = [(n, p.grad) for n, p in self.model.named_parameters() if p.grad is not None]
        if not named:
            return True
        sums = torch.stack([(g._values() if g.is_sparse else g).sum() for _, g in named])
        if bool(torch.isfinite(sums).all()):
            return True
        bad = [n for (n, g), total in zip(named, sums.tolist())
               if not _all_finite(g._values() if g.is_sparse else g, total)]
        if not bad:
            return True
        warnings.warn(f"step {step}: non-finite gradient in {', '.join(bad[:6])}"
                      f"{' ...' if len(bad) > 6 else ''}; the step is skipped (no curvature "
                      f"update, gradients zeroed)", RuntimeWarning, stacklevel=3)
        with torch.no_grad():
            for _, g in named:
                g.zero_()
        return False

    # ------------------------------------------------------------------ state
    #: The ``state_dict`` key of the per-module (or per-parameter) entries, of which KAISA's
    #: owner ranks may hold the only complete copy.
    _entries_key = None

    def state_dict(self):
        """The maker's state: ``{"step": ..., "maker": class name}`` plus the subclass's.

        Tensors are references, not copies (as in ``torch.optim.Optimizer.state_dict``); the
        makers replace them rather than change them in place, so a returned dict stays a
        snapshot. Over ranks where the owners alone hold part of the state (Shampoo and
        Jorge; K-FAC and the diagonal Fisher with ``strategy="gradient"``) it also holds
        ``"shard": [rank, size]``: it resumes this rank of as many ranks only (see
        `consolidated_state_dict`).
        """
        state = {"step": self.state["step"], "maker": type(self).__name__}
        if self._distributed and self._owners_hold_state():
            state["shard"] = [self.comm.rank, self.comm.size]
        return state

    def _owners_hold_state(self):
        """Whether some of this rank's entries are only complete on their owner rank."""
        return False

    def _owned_entries(self):
        """The names of the entries this rank is the authority on (its own modules)."""
        raise NotImplementedError

    def consolidated_state_dict(self, to=0):
        """The state of the whole maker, gathered from every rank onto rank `to`.

        A collective, like ``ZeroRedundancyOptimizer.consolidate_state_dict``: every rank
        calls it. Each rank sends the entries it owns (KAISA's owners keep some statistics or
        inverses alone), and rank `to` puts them together into one ``state_dict`` that any
        number of ranks, or one process, can load. In one process it is ``state_dict()``.

        Parameters
        ----------
        to : int, default 0
            The rank that receives the state.

        Returns
        -------
        dict or None
            The complete state on rank `to`, None on the other ranks.
        """
        if not self._distributed:
            return self.state_dict()
        to = check_rank(to, self.comm.size, "to")
        state = self.state_dict()
        key = self._entries_key
        order = list(state[key])
        owned = set(self._owned_entries())
        state[key] = {name: entry for name, entry in state[key].items() if name in owned}
        shards = self.comm.gather(state, root=to)
        if self.comm.rank != to:
            return None
        entries = {}
        for shard in shards:
            entries.update(shard[key])
        merged = dict(shards[to])
        merged.pop("shard", None)
        merged[key] = {name: entries[name] for name in order}
        return merged

    def load_state_dict(self, state_dict):
        """Restore a ``state_dict()`` (also ASDL's, which holds only the step).

        Parameters
        ----------
        state_dict : dict
            From `state_dict` or `consolidated_state_dict` of a maker of this class.

        Raises
        ------
        TypeError
            ``state_dict`` is not a dict.
        ValueError
            Its ``"step"`` is missing or not an int >= 0, it is another maker class's, or it
            is one rank's part of a run on other ranks (see `consolidated_state_dict`).
            Nothing changes then.
        """
        self.state["step"] = self._loaded_step(state_dict)

    def _loaded_entries(self, state_dict, holds, settings, names, of):
        """``(step, entries)``: the checked step and the entries under `_entries_key`.
        ``entries`` is None for an ASDL state dict, which holds the step alone (restored here,
        with a warning that names what is missing, ``holds``).

        ``settings`` maps each setting the state depends on (the Fisher type, the grafting)
        to this maker's value, and ``names`` lists the entries expected (``of``: what they
        name, modules or parameters); a state dict that differs in either is refused with a
        ``ValueError`` before anything changes.
        """
        step = self._loaded_step(state_dict)
        key = self._entries_key
        if key not in state_dict:
            self.state["step"] = step
            warnings.warn(f"state_dict holds no {holds} (an ASDL state_dict?): only the step is "
                          "restored", UserWarning, stacklevel=3)
            return step, None
        for setting, mine in settings.items():
            saved = state_dict.get(setting, mine)
            if saved != mine:
                raise ValueError(f"state_dict is for {setting}={saved!r}, this maker uses "
                                 f"{setting}={mine!r}")
        entries = state_dict[key]
        if not isinstance(entries, dict) or set(entries) != set(names):
            found = sorted(entries) if isinstance(entries, dict) else type(entries).__name__
            raise ValueError(f"state_dict holds the {of} {found}, this maker the {of} "
                             f"{sorted(names)}")
        return step, entries

    def _loaded_step(self, state_dict):
        """The step of ``state_dict``, checked (with its maker class); nothing is assigned, so
        a subclass can check the rest before it changes anything."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        if "step" not in state_dict:
            raise ValueError(f"state_dict has no 'step'; found keys {sorted(state_dict)}")
        maker = state_dict.get("maker", type(self).__name__)
        if maker != type(self).__name__:
            raise ValueError(f"state_dict is from {maker}, expected {type(self).__name__}")
        step = state_dict["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"state_dict['step'] must be an int >= 0, got {step!r}")
        shard = state_dict.get("shard")
        here = [self.comm.rank, self.comm.size] if self._distributed else [0, 1]
        if shard is not None and list(shard) != here:
            raise ValueError(
                f"state_dict is rank {shard[0]}'s part of a run on {shard[1]} ranks, whose "
                f"owner ranks alone hold some of its statistics or inverses; load it on rank "
                f"{shard[0]} of {shard[1]}, or save consolidated_state_dict() (every rank "
                f"calls it) to resume on another number of ranks")
        return step


def _config_values(config):
    """Every field of ``config``, lists as tuples (so that a list changed in place shows)."""
    return tuple(tuple(value) if isinstance(value, (list, set)) else value
                 for value in (getattr(config, field.name) for field in dataclasses.fields(config)))
