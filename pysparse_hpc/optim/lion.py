"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"): the optimizer.

One step per parameter ``p`` with gradient ``g`` and momentum ``m``::

    p <- p * (1 - lr * wd)                         decoupled weight decay, applied first
    p <- p - lr * sign(beta1 * m + (1 - beta1) g)  the update: every coordinate moves by lr
    m <- beta2 * m + (1 - beta2) g

`DistributedLion` runs the same step over a communicator, with the update's sign agreed by
compressed votes. On CPU tensors of float32 or float64 a step is one pass of a Numba kernel
(`pysparse_hpc.kernels.cpu.lion`) with torch's arithmetic, so the same bits as the tensor
operations, which remain for every other tensor (GPU, half precision, strided).
"""
import math

import numpy as np
import torch

from .._sputils import check_flag, is_real_number
from ..kernels.cpu import lion as kernels

__all__ = ["Lion", "check_hyperparameters", "lion_step"]

_KERNEL_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _finite(number):
    """Whether ``number`` is finite as a float (an int beyond float's range is not; `math.isfinite`
    raises OverflowError there)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def check_hyperparameters(lr, betas, weight_decay, *, zero_lr=False, init_lr=None):
    """Raise TypeError naming the first of Lion's hyper-parameters that is not a number (or,
    for ``betas``, not two), ValueError for one out of range; return ``betas`` as a tuple (read
    once: an iterator is accepted).

    ``lr * weight_decay`` above 1 is refused too: the decay multiplies the parameters by
    ``1 - lr * weight_decay``, which would flip their signs (``lr * weight_decay / init_lr``
    for lion-pytorch's ``decoupled_weight_decay``, given ``init_lr``). ``zero_lr``: accept
    ``lr = 0``, where a learning-rate schedule starts or ends (a new optimizer refuses it, as
    lion-pytorch's does).

    Parameters
    ----------
    lr : float
        Finite, > 0 (>= 0 with ``zero_lr``).
    betas : iterable of two floats
        Each in [0, 1].
    weight_decay : float
        Finite, >= 0.
    zero_lr : bool, default False
    init_lr : float, optional
        The constructor's ``lr``, with ``decoupled_weight_decay``.

    Returns
    -------
    tuple of float
        ``betas``.

    Raises
    ------
    TypeError
        ``lr`` or ``weight_decay`` is not a number (a tensor included), or ``betas`` not two.
    ValueError
        A value is out of range or not finite, or the decay exceeds 1.
    """
    for name, value in (("lr", lr), ("weight_decay", weight_decay)):
        if isinstance(value, torch.Tensor):
            # torch.optim takes a tensor lr (for capturable, compiled steps); the kernels here
            # take numbers, and "must be a finite number, got tensor(0.001)" misled.
            raise TypeError(f"{name} must be a Python or NumPy number, got a tensor "
                            f"({value!r}): pass float({name})")
        if not is_real_number(value):   # a string, a bool, None: a wrong type, not a value
            raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    if not (_finite(lr) and (lr >= 0 if zero_lr else lr > 0)):
        raise ValueError(f"lr must be a finite number {'>=' if zero_lr else '>'} 0, got {lr!r}")
    try:
        betas = tuple(betas)
    except TypeError:
        raise TypeError(f"betas must be two numbers in [0, 1], got {betas!r}") from None
    if len(betas) != 2 or not all(is_real_number(b) for b in betas):
        raise TypeError(f"betas must be two numbers in [0, 1], got {betas!r}")
    if not all(_finite(b) and 0.0 <= b <= 1.0 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1], got {betas!r}")
    if not (_finite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    decay = weight_decay if init_lr is None else weight_decay / init_lr
    if lr * decay > 1:
        what = "lr * weight_decay" if init_lr is None else "lr * weight_decay / initial lr"
        raise ValueError(f"{what} must be at most 1 (each step multiplies the parameters by "
                         f"1 - {what}), got {lr!r} * {weight_decay!r}"
                         + ("" if init_lr is None else f" / {init_lr!r}"))
    return betas


def kernel_arrays(*tensors):
    """Flat NumPy views of ``tensors`` when the CPU kernels can update them in place (dense,
    contiguous CPU tensors of one dtype, float32 or float64), else None."""
    first = tensors[0]
    for tensor in tensors:
        if (tensor.device.type != "cpu" or tensor.dtype != first.dtype
                or tensor.dtype not in _KERNEL_DTYPES or tensor.layout != torch.strided
                or not tensor.is_contiguous()):
            return None
    return [tensor.detach().view(-1).numpy() for tensor in tensors]


def kernel_scalars(dtype, *values):
    """``values`` rounded to ``dtype`` (torch's float32 or float64) as the kernels take them,
    the way torch rounds a Python scalar for a tensor of that dtype."""
    kind = _KERNEL_DTYPES[dtype]
    return tuple(kind(value) for value in values)


def written(*tensors):
    """Tell autograd that a kernel changed ``tensors`` in place (their version counters), as a
    torch in-place operation would: a graph that saved one of them then refuses to
    backpropagate instead of using the new values."""
    torch.autograd.graph.increment_version(list(tensors))


def interpolate(momentum, grad, beta1):
    """``beta1 * m + (1 - beta1) g``, the vector whose sign is Lion's update (a new tensor)."""
    return momentum.mul(beta1).add_(grad, alpha=1.0 - beta1)


def apply_update(param, direction, momentum, grad, lr, weight_decay, beta2):
    """Decay ``param``, move it by ``-lr * direction`` and advance ``momentum``, in place."""
    param.mul_(1.0 - lr * weight_decay)
    param.add_(direction, alpha=-lr)
    momentum.mul_(beta2).add_(grad, alpha=1.0 - beta2)


def lion_step(param, momentum, grad, lr, weight_decay, beta1, beta2):
    """One Lion step of ``param`` and ``momentum`` in place from ``grad``: one kernel pass on
    CPU float32 or float64 tensors, the tensor operations otherwise (the same results).

    Nothing is checked: `Lion` checks its settings before it calls this.

    Parameters
    ----------
    param, momentum, grad : torch.Tensor
        Of one shape; ``param`` and ``momentum`` are updated in place. Call it under
        ``torch.no_grad()`` for a parameter that requires grad: the tensor operations refuse
        to change such a leaf in place.
    lr : float
    weight_decay : float
        The decay applied, ``param *= 1 - lr * weight_decay`` (as `Lion.weight_decay`
        returns it).
    beta1, beta2 : float
    """
    arrays = kernel_arrays(param, momentum, grad)
    if arrays is None:
        apply_update(param, interpolate(momentum, grad, beta1).sign_(), momentum, grad, lr,
                     weight_decay, beta2)
        return
    kernels.lion_step(*arrays, *kernel_scalars(param.dtype, 1.0 - lr * weight_decay, -lr,
                                               beta1, 1.0 - beta1, beta2, 1.0 - beta2))
    written(param, momentum)


class Lion(torch.optim.Optimizer):
    """The Lion optimizer, with the interface and defaults of PyPI's ``lion-pytorch``.

    Parameters
    ----------
    params : iterable of tensors or of dicts
        As for any torch optimizer (parameter groups may set their own ``lr``, ``betas``,
        ``weight_decay``).
    lr : float
        Every coordinate moves by ``lr`` per step: take 3-10x smaller than AdamW's.
    betas : (float, float)
        ``beta1`` interpolates the update's direction, ``beta2`` the momentum.
    weight_decay : float
        Decoupled (``p *= 1 - lr * weight_decay``): take 3-10x larger than AdamW's.
    use_triton : bool, default False
        lion-pytorch's switch to its Triton (CUDA) kernels: True is refused, these kernels are
        the library's own.
    decoupled_weight_decay : bool, default False
        As lion-pytorch: the decay is ``weight_decay / lr_0`` with ``lr_0`` the constructor's
        ``lr``, so ``p *= 1 - (lr / lr_0) weight_decay`` follows a learning-rate schedule.

    Notes
    -----
    Parameters whose ``.grad`` is None are skipped. The momentum is the state ``"exp_avg"``, as
    in ``lion-pytorch``, so state dicts carry over (a state holding other per-parameter
    entries, such as Adam's, is refused). A coordinate where ``beta1 m + (1 - beta1) g`` is
    exactly zero or NaN does not move (``sign(0) = 0``, and torch's ``sign(NaN) = 0``, as in
    lion-pytorch); a NaN gradient makes the momentum NaN, which then stops the coordinate.
    Each step checks its groups' settings first (a scheduler may have changed ``lr``; ``lr =
    0`` is accepted there and in loaded states). Inside ``torch.compile`` the update runs
    eagerly (a graph break: the Numba kernels cannot be traced), the closure and the step
    hooks as compiled. A deep copy or a pickle keeps ``decoupled_weight_decay``.

    Examples
    --------
    >>> import torch
    >>> from pysparse_hpc.optim import Lion
    >>> model = torch.nn.Linear(4, 2)
    >>> optimizer = Lion(model.parameters(), lr=1e-4, weight_decay=1e-2)
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> optimizer.step()
    """

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, use_triton=False,
                 decoupled_weight_decay=False):
        # Flags as bools only: the string "no" was taken as True.
        if check_flag(use_triton, "use_triton"):
            raise ValueError("use_triton=True selects lion-pytorch's Triton (CUDA) kernels; "
                             "this Lion runs the library's own kernels: leave it False")
        self.decoupled_weight_decay = check_flag(decoupled_weight_decay, "decoupled_weight_decay")
        betas = check_hyperparameters(lr, betas, weight_decay,
                                      init_lr=lr if self.decoupled_weight_decay else None)
        # Read by add_param_group, which torch's constructor calls for every group.
        self._init_lr = lr if self.decoupled_weight_decay else None
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    def weight_decay(self, group):
        """The decay a step of ``group`` applies: its ``weight_decay``, divided by the
        constructor's ``lr`` with ``decoupled_weight_decay`` (as lion-pytorch).

        Parameters
        ----------
        group : dict
            One of ``param_groups``.

        Returns
        -------
        float
        """
        decay = group["weight_decay"]
        return decay / self._init_lr if self._init_lr is not None else decay

    def check_groups(self):
        """Check every group's settings before a step changes anything (a scheduler or a
        hand edit may have changed them since they were checked)."""
        for index, group in enumerate(self.param_groups):
            _check_group(group, f"parameter group {index}", zero_lr=True,
                         init_lr=self._init_lr)

    def add_param_group(self, param_group):
        """Torch's, with the group's ``lr``, ``betas`` and ``weight_decay`` checked (the
        constructor's groups come through here too) and complex parameters refused. A group
        may set its own ``lr`` to 0 (frozen, as torch's optimizers allow); the constructor's
        ``lr``, every group's default, must be > 0, as lion-pytorch's.

        Parameters
        ----------
        param_group : dict
            ``"params"`` and any of ``"lr"``, ``"betas"`` and ``"weight_decay"`` (the
            constructor's by default).

        Raises
        ------
        TypeError
            A setting is not a number (``betas`` not two), or a parameter is complex.
        ValueError
            A setting is out of range, the group asks to ``maximize``, or torch refuses the
            group (a parameter already in another one). The group is not added.
        """
        own_lr = isinstance(param_group, dict) and "lr" in param_group
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _check_group(group, zero_lr=own_lr, init_lr=self._init_lr)
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise

    def load_state_dict(self, state_dict):
        """Torch's, refusing a state whose groups' hyper-parameters are out of range (the
        state of another optimizer, such as SGD's, has none) or whose momenta do not have
        their parameters' shapes; the optimizer is then left as it was.

        Parameters
        ----------
        state_dict : dict
            What `state_dict` returned (lion-pytorch's too).

        Raises
        ------
        ValueError
            A state refused as above (whatever the type of the wrong value), or one that
            torch refuses (another number of groups, or of parameters in a group).
        """
        # Torch's load puts a new state and new groups in place: the old ones are intact to
        # go back to (where a second load, or `state_dict`, would fire the user's hooks).
        before = self.state, self.param_groups
        super().load_state_dict(state_dict)
        try:
            for index, group in enumerate(self.param_groups):
                _check_group(group, f"parameter group {index} of the state dict",
                             zero_lr=True, init_lr=self._init_lr)
                for param in group["params"]:
                    state = self.state[param]
                    others = sorted(map(str, set(state) - {"exp_avg"}))
                    if others:
                        raise ValueError(f"the state dict holds {', '.join(others)} for a "
                                         f"parameter, which Lion does not keep (only exp_avg): "
                                         f"the state of another optimizer")
                    if "exp_avg" in state:
                        _check_momentum(state["exp_avg"], param)
        except (TypeError, ValueError) as error:
            self.state, self.param_groups = before
            # What a state dict holds are values: a wrong one, of whatever type, is a bad
            # state (ValueError, which a resumed run reports as a bad checkpoint).
            raise ValueError(str(error)) from None

    def momentum(self, param):
        """The momentum of ``param``, made (zeros) on first use.

        Parameters
        ----------
        param : torch.Tensor
            A parameter of this optimizer.

        Returns
        -------
        torch.Tensor
            Its state ``"exp_avg"``, itself (not a copy).

        Raises
        ------
        ValueError
            The state holds a momentum that is not a dense tensor of ``param``'s shape.
        """
        state = self.state[param]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return _check_momentum(state["exp_avg"], param)

    def __getstate__(self):
        """Torch's state (defaults, state, groups) and the settings kept as attributes, so a
        copy (`copy.deepcopy`) or an unpickled optimizer can step."""
        state = super().__getstate__()
        state.update(decoupled_weight_decay=self.decoupled_weight_decay,
                     _init_lr=self._init_lr)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        """One step on every parameter that has a gradient (`DistributedLion`: agreed over
        its ranks); returns ``closure()``'s loss when a closure is given.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss; called once, with gradients enabled,
            before the update.

        Returns
        -------
        object or None
            What ``closure`` returned; None without one.

        Raises
        ------
        TypeError, ValueError
            A group's ``lr``, ``betas`` or ``weight_decay`` is no longer valid (a scheduler or
            a hand edit changed it), checked before any parameter changes.
            `DistributedLion`: a ``ValueError`` on every rank, when the ranks' optimizers
            have parted (see its notes).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._update()
        return loss

    # Eager under torch.compile: the compiler cannot trace into the Numba kernels (it failed
    # inside Numba's dispatcher) and would turn their NumPy scalars into arrays.
    @torch.compiler.disable
    def _update(self):
        """The step without the closure: the groups checked, then `_step_parameters`.
        `DistributedLion` overrides it; `step` (which torch wraps with the step hooks) is
        never called from inside, so the hooks run once per step."""
        self.check_groups()
        self._step_parameters()

    def _step_parameters(self):
        """Lion's step of every parameter that has a gradient, the groups already checked."""
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                lion_step(param, self.momentum(param), param.grad, group["lr"],
                          self.weight_decay(group), beta1, beta2)


def _check_group(group, where="a parameter group", *, zero_lr=False, init_lr=None):
    """Raise for a group whose hyper-parameters `check_hyperparameters` refuses, that lacks
    one, that asks to maximize, or that holds a complex parameter; normalise its ``betas`` to
    a tuple."""
    missing = [key for key in ("lr", "betas", "weight_decay") if key not in group]
    if missing:
        raise ValueError(f"{where} has no {', '.join(missing)}: not a Lion state")
    if group.get("maximize"):
        raise ValueError(f"{where} asks to maximize, which Lion does not do (it would "
                         f"minimize): negate the loss instead")
    try:
        group["betas"] = check_hyperparameters(group["lr"], group["betas"],
                                               group["weight_decay"], zero_lr=zero_lr,
                                               init_lr=init_lr)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}: {error}") from None
    for param in group["params"]:
        if param.is_complex():
            raise TypeError(f"Lion takes real parameters, got one of {param.dtype} (view it "
                            f"as real with torch.view_as_real)")


def _check_momentum(momentum, param):
    """``momentum`` when it is a dense tensor of ``param``'s shape (the kernels index both
    alike), else raise ValueError (the state is bad, whatever is wrong with it, as for its
    groups' settings)."""
    # A state dict's exp_avg may be anything (None, a number, a list, a sparse tensor): it
    # failed at the step, or with an AttributeError that left a bad state loaded.
    if not isinstance(momentum, torch.Tensor) or momentum.layout != torch.strided:
        found = (f"a {momentum.layout} tensor" if isinstance(momentum, torch.Tensor)
                 else type(momentum).__name__)
        raise ValueError(f"the momentum (exp_avg) of a parameter must be a dense tensor, got "
                         f"{found}: not a Lion state")
    if momentum.shape != param.shape:
        raise ValueError(f"the momentum (exp_avg) of a parameter of shape {tuple(param.shape)} "
                         f"has shape {tuple(momentum.shape)}: a state of another model")
    return momentum
