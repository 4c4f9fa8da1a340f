"""What the Fisher-based makers (K-FAC, diagonal) share: arguments, the update steps, state.

This module owns `NaturalGradientMaker`, the base of the makers whose curvature is a Fisher
estimated in the curvature pass of `PreconditionedGradientMaker`: the checks of ASDL's
arguments (Fisher type, loss type, ``scale``, ``grad_scale``, MC samples, ``var``, ``seed``),
and an update cut into separate steps so that a distributed strategy (KAISA) can slot in
between them:

1. compute: the subclass's hooks add each module's contributions into ``_pending``;
2. reduce: ``_reduce_factors``: the identity in one process, a sum over the ranks with a
   communicator (`_kaisa.allreduce_sum`);
3. accumulate: scale by ``scale / data_size``, refuse NaN/inf, replace or moving-average
   (``_accumulate_factors``);
4. invert: ``_invert(names, once)`` for the modules ``_inverse_owners()`` returns (all in one
   process; each module's owner rank with a communicator, then, with ``strategy="inverse"``,
   a broadcast of the inverses);
5. precondition: ``_precondition_modules(names)`` (every module; with ``strategy="gradient"``
   each owner its own, then a broadcast of the preconditioned gradients);
6. clip (with ``kl_clip``): scale every preconditioned gradient by one factor that bounds the
   update's predicted change of the model's output distribution (``_clip_update``).

It also owns the state (every module's stored tensors, by name) and its checks on loading.
"""
import math
import numbers
import warnings

import torch

from .._sputils import check_real_number
from ._fisher import LOSS_CROSS_ENTROPY, LOSS_TYPES, FISHER_MC, canonical_fisher_type
from ._kaisa import STRATEGIES, allreduce_sum, assign_owners, broadcast_from_owners
from ._maker import PreconditionedGradientMaker, _all_finite, curvature_dtype

__all__ = ["NaturalGradientMaker"]

#: Keys of the stored tensors that are inverses (the rest is curvature); the rows a Woodbury
#: inverse was built from are part of it (K-FAC's ``A_woodbury_rows``).
_INVERSE_SUFFIXES = ("_inv", "_chol", "_damping", "_woodbury_rows")
#: Curvature kept as rows ``U`` of ``U^T U``: one call's rows stack under the next's.
_ROWS_SUFFIX = "_rows"


#: The parameters of a module that a natural-gradient maker preconditions.
_PRECONDITIONED = ("weight", "bias")


def weight_and_bias(module):
    """The parameters of `module` a natural-gradient maker preconditions: its ``weight`` and
    ``bias`` where they are parameters (the others keep their plain gradient)."""
    return [param for param in (getattr(module, key, None) for key in _PRECONDITIONED)
            if isinstance(param, torch.nn.Parameter)]


def _fixed(shape):
    """Whether an expected shape is fixed (None stands for any size: a key of one process's
    low-rank curvature, which is never summed over ranks)."""
    return None not in shape


def _fits(shape, expected):
    return len(shape) == len(expected) and all(
        want is None or have == want for have, want in zip(shape, expected))


def in_curvature_dtype(tensor, weight_dtype):
    """A captured input or output gradient of a module whose weight has ``weight_dtype``, in
    the dtype its curvature is kept in (`curvature_dtype`: float32 for half-precision
    weights); integer inputs as they are."""
    dtype = curvature_dtype(weight_dtype)
    return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor


def _learning_rate(lr):
    """The value of `lr` (a number, a 0-d tensor as torch optimizers take, or a callable
    returning one), checked."""
    value = lr() if callable(lr) else lr
    if (isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype != torch.bool
            and not value.is_complex()):
        value = value.item()
    check_real_number("lr" if not callable(lr) else "the value lr() returned", value)
    return float(value)


class NaturalGradientMaker(PreconditionedGradientMaker):
    """Base of the Fisher-based makers (see the module docstring); not used directly.

    Parameters
    ----------
    model, config, fisher_type, loss_type, scale, grad_scale, n_mc_samples, var, seed,
    kl_clip, lr, check_finite, comm, strategy
        As documented for `KfacGradientMaker`.

    Attributes
    ----------
    last_kl_clip_scale : float
        The factor the last preconditioned step's gradients were scaled by (1.0: not clipped,
        or no `kl_clip`).

    Notes
    -----
    Subclasses implement ``_kind_for``, ``_on_input``, ``_on_output_grad`` (adding tensors to
    the dict ``_pending[name]``), ``_complete``, ``_invert``, ``_precondition_modules`` and
    ``_expected_shapes``.
    """
    # The seed is left out: each rank may sample its own labels.
    _alike_settings = PreconditionedGradientMaker._alike_settings + (
        "strategy", "fisher_type", "loss_type", "scale", "grad_scale", "n_mc_samples", "var",
        "kl_clip", "lr")

    def __init__(self, model, config, fisher_type=FISHER_MC, loss_type=LOSS_CROSS_ENTROPY,
                 scale=1.0, grad_scale=1.0, n_mc_samples=1, var=1.0, seed=None, *,
                 kl_clip=None, lr=None, check_finite=True, comm=None, strategy="inverse"):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        self._owner_of = None   # module name -> inverting rank, assigned on first use
        self.fisher_type = canonical_fisher_type(fisher_type)
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        check_real_number("scale", scale)
        check_real_number("grad_scale", grad_scale, positive=False)
        check_real_number("var", var)
        if not isinstance(n_mc_samples, numbers.Integral) or isinstance(n_mc_samples, bool):
            raise TypeError(f"n_mc_samples must be an int, got {type(n_mc_samples).__name__}")
        if n_mc_samples < 1:
            raise ValueError(f"n_mc_samples must be >= 1, got {n_mc_samples}")
        if seed is not None and (not isinstance(seed, numbers.Integral)
                                 or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        # torch.manual_seed's range, checked here: out of it torch raises an OverflowError-like
        # ValueError that names no argument, and only at the first curvature pass.
        if seed is not None and not -2 ** 63 <= seed < 2 ** 64:
            raise ValueError(f"seed must be in [-2**63, 2**64) (torch.manual_seed's range), "
                             f"got {seed}")
        self.loss_type = loss_type
        self.scale = float(scale)
        self.grad_scale = float(grad_scale)
        self.n_mc_samples = int(n_mc_samples)
        self.var = float(var)
        self.seed = None if seed is None else int(seed)
        if kl_clip is not None:
            check_real_number("kl_clip", kl_clip)
            if lr is None:
                raise ValueError("kl_clip needs lr: the learning rate the optimizer applies the "
                                 "preconditioned gradients with (a float, or a callable "
                                 "returning the current one, e.g. lambda: "
                                 "opt.param_groups[0]['lr'])")
            if not callable(lr):
                check_real_number("lr", lr)
        elif lr is not None:
            raise ValueError("lr is only used with kl_clip, which is None")
        self.kl_clip = None if kl_clip is None else float(kl_clip)
        self.lr = lr
        self.last_kl_clip_scale = 1.0
        self._kl_terms = {}   # module name -> sum(preconditioned * plain gradient), this step
        self._pending = {}
        self._warned_missing = False
        super().__init__(model, config, check_finite=check_finite, comm=comm)
        self._factors = {name: {} for name in self._modules}
        # The curvature is the weight's (and the bias's): any other trainable parameter of a
        # preconditioned module (the adapters of a LoRA layer subclassing nn.Linear) keeps its
        # plain gradient, and is listed with those left alone.
        for name, (module, _) in self._modules.items():
            for pname, param in module.named_parameters(recurse=False):
                qualified = f"{name}.{pname}" if name else pname
                if pname in _PRECONDITIONED:
                    # A frozen bias of a preconditioned module is covered by its curvature
                    # once it trains: not plain, not listed.
                    self._unpreconditioned.pop(qualified, None)
                elif param.requires_grad:
                    self._unpreconditioned[qualified] = (
                        f"not the weight or bias of {type(module).__name__} (the curvature is "
                        f"the weight's): plain gradient")

    def _supported_names(self):
        return "nn.Linear, nn.Conv2d or nn.Embedding"

    def _check_config(self):
        super()._check_config()
        # Here, not in PreconditioningConfig: ASDL's config accepts the ratio without a moving
        # average, and its Shampoo uses it (its statistics are sums); its natural-gradient
        # makers refuse it, as these do.
        if self.config.curvature_upd_ratio is not None and not self.config.uses_ema:
            raise ValueError(f"{type(self).__name__} needs ema_decay with "
                             f"curvature_upd_ratio: without a moving average the curvature "
                             f"is recomputed with every preconditioner update")

    # ------------------------------------------------------------------ step 1: compute
    def _curvature_forward_and_backward(self):
        self._pending = {}
        return self._fisher_forward_and_backward(self.fisher_type, self.loss_type,
                                                 self.n_mc_samples, self.var, self.seed)

    def _add_pending(self, name, key, contribution):
        entry = self._pending.setdefault(name, {})
        if key not in entry:
            entry[key] = contribution
        elif key.endswith(_ROWS_SUFFIX):
            entry[key] = torch.cat([entry[key], contribution])
        else:
            entry[key] = entry[key].add_(contribution)

    def _complete(self, entry):
        """Whether a module's pending contributions make a curvature (both factors...)."""
        raise NotImplementedError

    def _discard_curvature(self):
        self._pending = {}

    # ------------------------------------------------------------------ steps 2-4
    def update_curvature(self):
        """Reduce, scale, check and store this pass's curvature; invert it without EMA."""
        pending, self._pending = self._reduce_factors(self._pending), {}
        missing = [n or "<model>" for n in self._modules
                   if not self._complete(pending.get(n, {}))]
        if missing and not self._warned_missing:
            self._warned_missing = True
            unreached = {n or "<model>" for n in self._unreached}
            hidden = [n for n in missing if n in unreached]
            # The MC and exact Fishers differentiate with torch.autograd.grad, which does not
            # run the backward of a reentrant checkpoint: its modules stay unseen.
            hint = (f"; {hidden} ran in the forward but the Fisher's passes reached no gradient "
                    f"of their output: off the loss's path, or inside activation checkpointing "
                    f"with use_reentrant=True, which hides a module from the MC and exact "
                    f"Fishers (use_reentrant=False does not)") if hidden else ""
            warnings.warn(f"modules {missing} saw no input or no output gradient in the "
                          f"curvature pass (not called, or not on the loss's path){hint}; they "
                          f"keep the plain gradient until they do", UserWarning, stacklevel=3)
        pending = {n: v for n, v in pending.items() if self._complete(v)}
        updated = self._accumulate_factors(pending)
        if not self.config.uses_ema:
            once = self._curvature_schedule(self.state["step"] + 1, quiet=True)
            self._invert_and_share(updated, once)

    def _reduce_factors(self, pending):
        """Sum the new curvature over the ranks (the identity in one process).

        Every rank takes part for every module complete on any rank (the others add zeros),
        so the ranks hold the same modules afterwards."""
        if not self._distributed:
            return pending
        complete = torch.tensor([self._complete(pending.get(n, {})) for n in self._modules],
                                dtype=torch.float64)
        self.comm.Allreduce(complete, kind="curvature allreduce")
        reduced, tensors = {}, []
        for name, count in zip(self._modules, complete.tolist()):
            if count == 0:
                continue
            entry = pending.get(name, {})
            if not self._complete(entry):
                # Zeros in the dtype the other ranks send, the curvature's (float32 for a
                # half-precision weight): else the flat buffers of the sum differ in size.
                weight = self._modules[name][0].weight
                entry = {key: torch.zeros(shape, dtype=curvature_dtype(weight.dtype),
                                          device=weight.device)
                         for key, shape in self._expected_shapes(name).items()
                         if not key.endswith(_INVERSE_SUFFIXES) and _fixed(shape)}
            reduced[name] = entry
            tensors += [entry[key] for key in sorted(entry)]
        allreduce_sum(self.comm, tensors, "curvature allreduce")
        return reduced

    def _invert_and_share(self, names, once):
        """Invert `names` where this rank owns them; with ``strategy="inverse"``, broadcast the
        inverses of every module in `names` from its owner."""
        owners = set(self._inverse_owners())
        self._invert([n for n in names if n in owners], once)
        if self._distributed and self.strategy == "inverse":
            broadcast_from_owners(
                self.comm, {n: self._owners()[n] for n in names},
                lambda name: {k: v for k, v in self._factors[name].items()
                              if k.endswith(_INVERSE_SUFFIXES)},
                self._store_inverses, "inverse broadcast")

    def _store_inverses(self, name, entries):
        state = self._factors[name]
        if entries:   # none: the owner has no inverses yet (every inversion so far failed)
            for key in [k for k in state if k.endswith(_INVERSE_SUFFIXES)]:
                del state[key]
            state.update(entries)

    def _inversion_cost(self, name):
        """A module's share of the inversion work (floating-point operations, up to a
        constant): the cube of each stored square factor's size, the size of a diagonal."""
        cost = 0.0
        for key, shape in self._expected_shapes(name).items():
            if key.endswith(_INVERSE_SUFFIXES) or not _fixed(shape):
                continue
            if len(shape) == 2 and shape[0] == shape[1]:
                cost += float(shape[0]) ** 3
            else:
                cost += float(torch.Size(shape).numel())
        return cost

    def _owners(self):
        """Module name -> the rank that inverts it (greedy by cost; rank 0 alone)."""
        if self._owner_of is None:
            size = self.comm.size if self._distributed else 1
            self._owner_of = assign_owners({n: self._inversion_cost(n) for n in self._modules},
                                           size)
        return self._owner_of

    def _accumulate_factors(self, pending):
        """Scale the new tensors and store them (replace, or moving average); the names done."""
        config = self.config
        coefficient = self.scale
        if config.uses_ema:
            coefficient *= config.ema_decay
        coefficient /= config.data_size
        updated = []
        for name, entry in pending.items():
            entry = {key: value.mul_(coefficient) for key, value in entry.items()}
            bad = [key for key, value in entry.items() if not _all_finite(value)]
            if bad:
                warnings.warn(f"step {self.state['step']}: non-finite curvature "
                              f"({' and '.join(bad)}) in module {name or '<model>'!r}; its "
                              f"update is skipped and its previous curvature and inverses are "
                              f"kept", RuntimeWarning, stacklevel=4)
                continue
            state = self._factors[name]
            for key, value in entry.items():
                if config.uses_ema and key in state:
                    value = state[key].mul(1.0 - config.ema_decay).add_(value)
                state[key] = value
            updated.append(name)
        return updated

    def _inverse_owners(self):
        """The modules this process inverts: all of them in one process, its own with a
        communicator."""
        if not self._distributed:
            return list(self._modules)
        return [n for n, owner in self._owners().items() if owner == self.comm.rank]

    def _invert(self, names, once=False):
        """Refresh the inverses of `names`; `once`: they will serve one step only."""
        raise NotImplementedError

    def update_preconditioner(self):
        """With a moving average: invert the current curvature. Without: nothing (as ASDL)."""
        if self.config.uses_ema:
            once = self._preconditioner_schedule(self.state["step"] + 1, quiet=True)
            self._invert_and_share(list(self._modules), once)

    # ------------------------------------------------------------------ step 5
    def _write_preconditioned(self, name, results):
        """Write ``results`` (``[(grad, preconditioned)]`` of module `name`) into the
        gradients, or leave every one of them as it was when any result is not finite (a
        stale inverse against a gradient far larger than its curvature can overflow)."""
        # Rounded to the gradient's dtype first: a float16 gradient can overflow there.
        results = [(grad, value.to(grad.dtype)) for grad, value in results]
        if all(_all_finite(value) for _, value in results):
            if self.kl_clip is not None:
                self._kl_terms[name] = math.fsum(
                    float(torch.sum(value.double() * grad.double())) for grad, value in results)
            for grad, value in results:
                grad.copy_(value)
            return
        warnings.warn(f"step {self.state['step']}: non-finite preconditioned gradient in "
                      f"module {name or '<model>'!r}; the gradient is left unchanged",
                      RuntimeWarning, stacklevel=5)

    def precondition(self):
        """Precondition the ``.grad`` of every module that has inverses, in place; with
        ``strategy="gradient"`` each owner its own modules, then a broadcast of the results;
        with ``kl_clip``, then the scaling of them all."""
        self._kl_terms = {}
        # Read before any gradient changes: a bad rate raises with the gradients untouched.
        lr = None if self.kl_clip is None else _learning_rate(self.lr)
        if not (self._distributed and self.strategy == "gradient"):
            self._precondition_modules(list(self._modules))
        else:
            self._precondition_by_owners()
        if self.kl_clip is not None:
            self._clip_update(lr)

    def _precondition_by_owners(self):
        """``strategy="gradient"``: each owner its modules, then a broadcast of the results."""
        self._precondition_modules(self._inverse_owners())

        def gradients(name):
            return {pname: p.grad for pname, p in self._modules[name][0].named_parameters(
                recurse=False) if p.grad is not None}

        def store(name, entries):
            params = dict(self._modules[name][0].named_parameters(recurse=False))
            for pname, grad in entries.items():
                params[pname].grad.copy_(grad)
        broadcast_from_owners(self.comm, self._owners(), gradients, store, "gradient broadcast")

    def _clip_update(self, lr):
        """Scale the preconditioned gradients by ``min(1, sqrt(kl_clip / |lr^2 sum v.g|))``.

        ``v`` are the preconditioned gradients and ``g`` the plain ones, over every module
        preconditioned this step. With ``v = F^-1 g`` for the damped Fisher ``F``,
        ``lr^2 v.g = lr^2 v^T F v`` is twice the KL divergence between the model's output
        distributions before and after a step of ``-lr v`` that ``F`` predicts (Ba, Grosse and
        Martens, 2017; KAISA's ``kl_clip``): a small damping can no longer make a step that
        moves the predictions far. The terms are summed exactly (``math.fsum``), so every
        number of ranks scales by the same factor."""
        names = list(self._modules)
        if self._distributed and self.strategy == "gradient":
            # Only owners know their modules' terms: one sum, with zeros elsewhere (exact).
            terms = torch.tensor([[self._kl_terms.get(n, 0.0) for n in names],
                                  [float(n in self._kl_terms) for n in names]],
                                 dtype=torch.float64)
            self.comm.Allreduce(terms, kind="kl clip allreduce")
            self._kl_terms = {n: value for n, value, done in zip(names, *terms.tolist())
                              if done > 0}
        predicted_kl = lr ** 2 * math.fsum(
            self._kl_terms[n] for n in names if n in self._kl_terms)
        scale = 1.0
        if predicted_kl != 0.0 and math.isfinite(predicted_kl):
            scale = min(1.0, math.sqrt(self.kl_clip / abs(predicted_kl)))
        self.last_kl_clip_scale = scale
        if scale < 1.0:
            with torch.no_grad():
                for name in self._kl_terms:
                    for param in weight_and_bias(self._modules[name][0]):
                        if param.grad is not None:
                            param.grad.mul_(scale)

    def _precondition_modules(self, names):
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    _entries_key = "factors"

    def _owners_hold_state(self):
        return self.strategy == "gradient"   # the inverses stay on their owner

    def _owned_entries(self):
        return self._inverse_owners()

    def factors(self, name):
        """The stored tensors of module `name` (curvature and inverses; see the subclass).

        Parameters
        ----------
        name : str
            A qualified module name, as in `preconditioned_modules`.

        Returns
        -------
        dict of str to torch.Tensor
            A new dict of the tensors stored so far (themselves, not copies).

        Raises
        ------
        KeyError
            ``name`` is not a preconditioned module.
        """
        if name not in self._factors:
            raise KeyError(f"{name!r} is not a preconditioned module; they are "
                           f"{list(self._factors)}")
        return dict(self._factors[name])

    def _expected_shapes(self, name):
        """Key -> shape of every tensor module `name` may store."""
        raise NotImplementedError

    def _loadable_shapes(self, name):
        """Key -> shape of every tensor a loaded state of module `name` may hold (by default
        `_expected_shapes`)."""
        return self._expected_shapes(name)

    def _check_entry(self, name, entry):
        """Raise ``ValueError`` where module `name`'s loaded tensors do not fit together (the
        shapes of each are checked already); nothing here."""

    def state_dict(self):
        """Step, Fisher type and every module's stored tensors (see the base class)."""
        state = super().state_dict()
        state["fisher_type"] = self.fisher_type
        state["factors"] = {name: dict(entry) for name, entry in self._factors.items()}
        return state

    def load_state_dict(self, state_dict):
        """Restore a ``state_dict()``; an ASDL state dict (the step only) restores the step.

        Raises ``ValueError`` when the modules, the keys, the shapes or the Fisher type differ,
        and then changes nothing.

        Parameters
        ----------
        state_dict : dict
            From `state_dict` or `consolidated_state_dict` of a maker of this class.

        Raises
        ------
        TypeError
            ``state_dict`` is not a dict, or an entry of its factors is not a dict of
            tensors.
        ValueError
            As above, and as the base class's `PreconditionedGradientMaker.load_state_dict`.

        Warns
        -----
        UserWarning
            The state dict holds no curvature (an ASDL one): only the step is restored.
        """
        step, saved = self._loaded_entries(state_dict, "curvature",
                                           {"fisher_type": self.fisher_type}, self._modules,
                                           "modules")
        if saved is None:
            return
        restored = {}
        for name, entry in saved.items():
            if not isinstance(entry, dict):
                raise TypeError(f"state_dict factors of {name!r} must be a dict, got "
                                f"{type(entry).__name__}")
            expected = self._loadable_shapes(name)
            unknown = set(entry) - set(expected)
            if unknown:
                raise ValueError(f"state_dict factors of {name!r} have unknown keys "
                                 f"{sorted(unknown)}; expected some of {sorted(expected)}")
            weight = self._modules[name][0].weight
            restored[name] = {}
            for key, tensor in entry.items():
                if not isinstance(tensor, torch.Tensor):
                    raise TypeError(f"state_dict factor {key} of {name!r} must be a tensor, "
                                    f"got {type(tensor).__name__}")
                if not _fits(tuple(tensor.shape), expected[key]):
                    raise ValueError(f"state_dict factor {key} of {name!r} has shape "
                                     f"{tuple(tensor.shape)}, expected {expected[key]}")
                # The dtype the maker computes them in (float32 for half-precision weights).
                restored[name][key] = tensor.to(device=weight.device,
                                                dtype=curvature_dtype(weight.dtype))
            self._check_entry(name, restored[name])
        self.state["step"] = step
        self._factors = restored
        self._pending = {}
