"""The preconditioning configuration (ASDL's `PreconditioningConfig`) and its update schedules.

This module owns what a user sets, with ASDL 0.1a5's field names, order, defaults and meaning,
the checks of those values, and the translation of the intervals, warm-up steps and ratios into
"does step k update the curvature / the preconditioner". The makers in this package read a
configuration; they never change it.
"""
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional

from .._sputils import is_real_number

__all__ = ["PreconditioningConfig", "INTERVAL_CONSTANT", "update_schedule"]

INTERVAL_CONSTANT = "constant"
_ASDL_ONLY_INTERVAL_TYPES = ("step", "linear")
_DEFAULT_INTERVAL = 1
_UNSET = -1


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass
class PreconditioningConfig:
    """What to precondition, how often and with what damping (ASDL-compatible).

    The fields, their order and their defaults are ASDL 0.1a5's, so that
    ``PreconditioningConfig(data_size=128, damping=1e-3)`` means the same in both libraries;
    `curvature_interval_type`, a class attribute in ASDL, comes after them.

    Parameters
    ----------
    num_total_steps : int, optional
        Total number of training steps. When given, the ``*_ratio`` fields replace the
        intervals (as in ASDL): updates are spread evenly over the run.
    preconditioner_upd_interval : int, default 1
        Steps between preconditioner (inverse) updates.
    preconditioner_warmup_steps : int, default 0
        The first this many steps all update the preconditioner; the interval applies after.
    preconditioner_upd_ratio : float, default 1.0
        With `num_total_steps`: the fraction of steps that update the preconditioner.
    preconditioner_warmup_ratio : float, default 0.0
        With `num_total_steps`: the fraction of steps, at the start, that all update it.
    preconditioner_interval_type : {"constant"}
        Only ``"constant"``. ASDL accepts ``"step"`` and ``"linear"`` but never uses them (its
        schedules are always constant), so they raise ``NotImplementedError`` here instead of
        being ignored.
    curvature_upd_interval : int, optional
        Steps between curvature updates; ``None`` (default) follows the preconditioner's
        schedule.
    curvature_warmup_steps : int, default 0
        The first this many steps all update the curvature.
    curvature_upd_ratio : float, optional
        With `num_total_steps`: the fraction of steps that update the curvature (``None``: the
        curvature follows `curvature_upd_interval`, else the preconditioner's schedule). K-FAC
        and the diagonal Fisher need `ema_decay` with it (as in ASDL); Shampoo and Jorge,
        whose statistics are sums without one, do not.
    curvature_warmup_ratio : float, default 0.0
        With `num_total_steps` and `curvature_upd_ratio`: the warm-up fraction.
    curvature_interval_type : {"constant"}
        As `preconditioner_interval_type`.
    data_size : int, default -1
        The number of examples the loss sums over (usually the batch size; the number of
        training nodes for a masked GNN loss). The curvature is scaled by ``1 / data_size`` and,
        on curvature steps, the loss is computed with ``reduction="sum"`` and divided by it.
        -1 means unset; K-FAC requires it.
    damping : float, default 1e-7
        Tikhonov damping added before inversion (> 0). K-FAC splits it between the two
        Kronecker factors (pi-damping).
    ema_decay : float, default -1
        -1: no moving average (each curvature update replaces the factors). In (0, 1]:
        ``factor = (1 - ema_decay) * factor + ema_decay * new`` (ASDL's convention, starting
        from zero: the first update stores ``ema_decay * new``).
    ignore_modules : list, optional
        Modules to leave unpreconditioned: module classes (``torch.nn.Linear``), module
        instances (a container ignores all its descendants, which ASDL does not), or
        substrings of qualified module names (``"conv1"``, ``"block2."``). Read when a maker
        is built, which fixes the modules it preconditions: a later change to the list does
        not reach that maker (build a new one).

    Notes
    -----
    Checked on construction: wrong types raise ``TypeError``, wrong values ``ValueError``.
    ASDL's fields are all present; none is left out. ``data_size`` is checked by the maker that
    needs it.

    Examples
    --------
    >>> from pysparse_hpc.precondition import PreconditioningConfig
    >>> config = PreconditioningConfig(data_size=32, damping=1e-3, curvature_upd_interval=10)
    >>> config.ema_decay
    -1
    """
    num_total_steps: Optional[int] = None
    preconditioner_upd_interval: int = _DEFAULT_INTERVAL
    preconditioner_warmup_steps: int = 0
    preconditioner_upd_ratio: float = 1.0
    preconditioner_warmup_ratio: float = 0.0
    preconditioner_interval_type: str = INTERVAL_CONSTANT
    curvature_upd_interval: Optional[int] = None
    curvature_warmup_steps: int = 0
    curvature_upd_ratio: Optional[float] = None
    curvature_warmup_ratio: float = 0.0
    data_size: int = _UNSET
    damping: float = 1e-7
    ema_decay: float = _UNSET
    ignore_modules: Optional[List[Any]] = None
    # last: ASDL declares it without a type, so it is not among ASDL's fields, whose positions
    # the fields above keep
    curvature_interval_type: str = INTERVAL_CONSTANT

    def __post_init__(self):
        self._check()

    def _check(self):
        """Raise TypeError or ValueError on a field that is not valid."""
        for name in ("preconditioner_upd_interval", "curvature_upd_interval", "num_total_steps"):
            value = getattr(self, name)
            if value is None and name != "preconditioner_upd_interval":
                continue
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("preconditioner_warmup_steps", "curvature_warmup_steps"):
            value = getattr(self, name)
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        for name in ("preconditioner_upd_ratio", "preconditioner_warmup_ratio",
                     "curvature_upd_ratio", "curvature_warmup_ratio"):
            value = getattr(self, name)
            if value is None and name == "curvature_upd_ratio":
                continue
            if not is_real_number(value):
                raise TypeError(f"{name} must be a float, got {type(value).__name__} ({value!r})")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.num_total_steps is not None:
            # Found here, naming the fields: `update_schedule` said only that "the warm-up
            # cannot exceed the number of updates", when the maker was made.
            for kind in ("preconditioner", "curvature"):
                ratio, warmup_ratio = (getattr(self, f"{kind}_upd_ratio"),
                                       getattr(self, f"{kind}_warmup_ratio"))
                if ratio is None:
                    continue
                updates = int(self.num_total_steps * ratio)
                warmup = int(self.num_total_steps * warmup_ratio)
                if warmup > updates:
                    raise ValueError(
                        f"{kind}_warmup_ratio {warmup_ratio} gives {warmup} warm-up steps of "
                        f"num_total_steps {self.num_total_steps}, more than the {updates} "
                        f"updates {kind}_upd_ratio {ratio} gives; expected a warm-up ratio "
                        f"at most the update ratio")
        for name in ("preconditioner_interval_type", "curvature_interval_type"):
            value = getattr(self, name)
            if value in _ASDL_ONLY_INTERVAL_TYPES:
                in_asdl = ("accepts it but" if name == "preconditioner_interval_type"
                           else "has it as a class attribute, not a field, and")
                raise NotImplementedError(
                    f"{name}={value!r} is not implemented (ASDL 0.1a5 {in_asdl} always "
                    f"schedules {INTERVAL_CONSTANT!r}); use {INTERVAL_CONSTANT!r}")
            if value != INTERVAL_CONSTANT:
                raise ValueError(f"{name} must be {INTERVAL_CONSTANT!r}, got {value!r}")
        if not _is_int(self.data_size):
            raise TypeError(f"data_size must be an int, got {type(self.data_size).__name__} "
                            f"({self.data_size!r})")
        if self.data_size != _UNSET and self.data_size < 1:
            raise ValueError(f"data_size must be >= 1 (or -1: unset), got {self.data_size}")
        if not is_real_number(self.damping):
            raise TypeError(f"damping must be a float, got {type(self.damping).__name__} "
                            f"({self.damping!r})")
        if not (math.isfinite(self.damping) and self.damping > 0):
            raise ValueError(f"damping must be a finite number > 0, got {self.damping}")
        if not is_real_number(self.ema_decay):
            raise TypeError(f"ema_decay must be a float, got {type(self.ema_decay).__name__} "
                            f"({self.ema_decay!r})")
        if self.ema_decay != _UNSET and not 0.0 < self.ema_decay <= 1.0:
            raise ValueError(f"ema_decay must be -1 (no moving average) or in (0, 1], "
                             f"got {self.ema_decay}")
        if self.ignore_modules is not None:
            if not isinstance(self.ignore_modules, (list, tuple, set)):
                raise TypeError(f"ignore_modules must be a list of module classes, modules or "
                                f"name substrings, got {type(self.ignore_modules).__name__}")
            for entry in self.ignore_modules:
                if not (isinstance(entry, (type, str)) or hasattr(entry, "named_modules")):
                    raise TypeError(f"ignore_modules entries must be module classes, modules "
                                    f"or strings, got {type(entry).__name__} ({entry!r})")

    @property
    def uses_ema(self):
        """Whether the curvature is a moving average (``ema_decay`` is not -1)."""
        return self.ema_decay != _UNSET


def update_schedule(num_total_steps, update_ratio=1.0, warmup_ratio=0.0):
    """Which of `num_total_steps` steps update, spread at a constant interval (ASDL's schedule).

    The first ``floor(num_total_steps * warmup_ratio)`` steps all update; the remaining
    updates, ``floor(num_total_steps * update_ratio)`` in all, come every
    ``floor(remaining steps / remaining updates)`` steps.

    Parameters
    ----------
    num_total_steps : int
        Length of the schedule (> 0).
    update_ratio : float
        Fraction of the steps that update, in [0, 1].
    warmup_ratio : float
        Fraction of the steps, at the start, that all update, in [0, update_ratio].

    Returns
    -------
    list of bool
        ``schedule[k]`` is True when step k updates.

    Examples
    --------
    >>> from pysparse_hpc.precondition.config import update_schedule
    >>> update_schedule(10, update_ratio=0.3, warmup_ratio=0.1)
    [True, True, False, False, False, True, False, False, False, False]
    """
    if not _is_int(num_total_steps):
        raise TypeError(f"num_total_steps must be an int, got {type(num_total_steps).__name__} "
                        f"({num_total_steps!r})")
    if num_total_steps <= 0:
        raise ValueError(f"num_total_steps must be an int > 0, got {num_total_steps!r}")
    for name, ratio in (("update_ratio", update_ratio), ("warmup_ratio", warmup_ratio)):
        if not is_real_number(ratio):
            raise TypeError(f"{name} must be a float, got {type(ratio).__name__} ({ratio!r})")
        if not 0 <= ratio <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {ratio}")
    total_updates = int(num_total_steps * update_ratio)
    warmup = int(num_total_steps * warmup_ratio)
    if warmup > total_updates:
        raise ValueError(f"the warm-up ({warmup} steps) cannot exceed the number of updates "
                         f"({total_updates})")
    schedule = [True] * warmup
    remaining_steps = num_total_steps - warmup
    remaining_updates = total_updates - warmup
    if remaining_updates > 0:
        interval = remaining_steps // remaining_updates
        done = warmup
        for i in range(remaining_steps):
            update = i % interval == 0 and done < total_updates
            done += update
            schedule.append(update)
    schedule.extend([False] * (num_total_steps - len(schedule)))
    return schedule


class _Schedule:
    """Answers "does this step update?" from an interval with warm-up or from a fixed list."""

    def __init__(self, interval=1, warmup_steps=0, steps=None, what="update"):
        self.interval = interval
        self.warmup_steps = warmup_steps
        self.steps = steps
        self.what = what
        # Said once: a warning per step past the end, each with its own step number, filled
        # the output and Python's registry of warnings shown (two entries a step, unbounded).
        self._told_past_end = False

    def __call__(self, step, quiet=False):
        if self.steps is not None:
            if step < len(self.steps):
                return self.steps[step]
            if not quiet and not self._told_past_end:
                self._told_past_end = True
                warnings.warn(f"step {step} is past num_total_steps ({len(self.steps)}): no "
                              f"{self.what} from here on", RuntimeWarning, stacklevel=3)
            return False
        return step < self.warmup_steps or (step - self.warmup_steps) % self.interval == 0


def _schedules(config):
    """The (curvature, preconditioner) schedules of `config`, as ASDL derives them."""
    if config.num_total_steps is None:
        preconditioner = _Schedule(config.preconditioner_upd_interval,
                                   config.preconditioner_warmup_steps, what="preconditioner update")
    else:
        if config.preconditioner_upd_interval != _DEFAULT_INTERVAL:
            warnings.warn("num_total_steps is set: preconditioner_upd_interval is ignored and "
                          "preconditioner_upd_ratio is used", UserWarning, stacklevel=3)
        preconditioner = _Schedule(steps=update_schedule(
            config.num_total_steps, config.preconditioner_upd_ratio,
            config.preconditioner_warmup_ratio), what="preconditioner update")
    if config.num_total_steps is not None and config.curvature_upd_ratio is not None:
        if config.curvature_upd_interval is not None:
            warnings.warn("num_total_steps is set: curvature_upd_interval is ignored and "
                          "curvature_upd_ratio is used", UserWarning, stacklevel=3)
        curvature = _Schedule(steps=update_schedule(
            config.num_total_steps, config.curvature_upd_ratio, config.curvature_warmup_ratio),
            what="curvature update")
    elif config.curvature_upd_interval is not None:
        curvature = _Schedule(config.curvature_upd_interval, config.curvature_warmup_steps,
                              what="curvature update")
    else:
        curvature = preconditioner
    return curvature, preconditioner
