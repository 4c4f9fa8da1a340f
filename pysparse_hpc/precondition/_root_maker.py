"""What Shampoo and Jorge share: parameters as matrices, blocks, statistics, grafting, state.

This module owns `RootGradientMaker`, the base of the makers that precondition the gradient
``G`` of a parameter (``m x n`` after reshaping) by two inverse fourth roots,
``L^-1/4 G R^-1/4``, with ``L`` built from ``G G^T`` and ``R`` from ``G^T G``
(`ShampooGradientMaker`, `JorgeGradientMaker`). It owns

* which parameters: every trainable parameter with 2 or more dimensions of a leaf module whose
  ``weight`` has 2 or more dimensions, trainable or frozen (``nn.Linear``, ``nn.Conv1d/2d/3d``
  with any dilation, groups or padding, ``nn.Embedding`` with dense gradients, custom modules
  such as a LoRA layer's frozen weight beside its trainable adapters), reshaped to
  ``shape[0] x prod(shape[1:])`` (a convolution: ``out x in*kh*kw``); and the parameters with 2
  or more dimensions held directly by a container module (a positional embedding), unless
  tied or ignored. The 1-D parameters of those leaf modules (biases) get the grafting method's
  step (Adagrad's) or keep the plain gradient (listed by ``unpreconditioned_parameters``);
* blocks: with ``block_size``, the rows and the columns are cut into blocks of at most
  ``block_size``; each block ``G_ij`` has its own ``L_ij`` and ``R_ij`` (as in Google's and
  ASDL's Shampoo, where ASDL never passes its ``block_size`` on);
* the update, cut into separate steps so that a distributed strategy can slot in between:

  1. compute: ``G_b G_b^T`` and ``G_b^T G_b`` of every block, from ``.grad``
     (``_compute_statistics``);
  2. reduce: ``_reduce_statistics`` (the identity: with a communicator the gradients are
     already summed over the ranks, so the owner's statistics are the one-process ones);
  3. accumulate: refuse NaN/inf (a ``RuntimeWarning``; the block keeps its previous state),
     then sum or moving average (``_accumulate_statistics``, in the subclass);
  4. roots: ``_update_roots(names)`` for the parameters ``_root_owners()`` returns (all in one
     process; with a communicator each parameter's owner rank, steps 1-4 alike, then with
     ``strategy="inverse"`` a broadcast of the roots);
  5. precondition: ``L^-1/4 G R^-1/4`` per block, grafting per parameter, ``.grad`` replaced
     in place (``_precondition_parameters``; with ``strategy="gradient"`` each owner its own
     matrices, then a broadcast of the preconditioned gradients);

* grafting: the preconditioned step of each parameter rescaled to the norm of a first-order
  step: ``"sgd"`` (the gradient), ``"adagrad"`` (``G / (sqrt(sum G^2) + epsilon)``), None;
* the state (per block statistics and roots, Adagrad sums) and its checks on loading.

Statistics: with ``config.ema_decay = e`` in (0, 1] they are the moving average
``L <- (1 - e) L + e G G^T`` (ASDL's convention: ``b = 1 - e`` is the weight of the old value,
starting from zero); with ``ema_decay = -1`` (ASDL's default) the sum ``L <- L + G G^T``, as in
the original Shampoo and ASDL. They are computed from ``.grad`` as the loss call leaves it
(no ``data_size`` scaling, as in ASDL), in the parameter's dtype (float32 for float16 and
bfloat16 parameters).
"""
import numbers
import warnings
from collections import Counter, OrderedDict

import torch
from torch import nn

from .._sputils import is_real_number
from ._kaisa import STRATEGIES, assign_owners, broadcast_from_owners
from ._maker import PreconditionedGradientMaker, _all_finite, curvature_dtype
from ._roots import block_bounds, finite_norm

__all__ = ["RootGradientMaker", "GRAFTINGS"]

#: The grafting methods: None (no grafting), ``"sgd"``, ``"adagrad"``.
GRAFTINGS = (None, "sgd", "adagrad")
_ASDL_NO_BLOCKS = -1


def _check_block_size(block_size):
    if block_size is None or (isinstance(block_size, numbers.Integral)
                              and not isinstance(block_size, bool)
                              and block_size == _ASDL_NO_BLOCKS):
        return None
    if not isinstance(block_size, numbers.Integral) or isinstance(block_size, bool):
        raise TypeError(f"block_size must be an int or None, got {type(block_size).__name__} "
                        f"({block_size!r})")
    if block_size < 1:
        raise ValueError(f"block_size must be an int >= 1 (or None, or ASDL's -1: no blocks), "
                         f"got {block_size}")
    return int(block_size)


def check_positive(name, value, upper=None):
    """`value` as a float; TypeError unless a real number, ValueError unless in (0, upper]."""
    if not is_real_number(value):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not (value > 0 and (value <= upper if upper is not None else value < float("inf"))):
        bound = f"in (0, {upper}]" if upper is not None else "a finite number > 0"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


class _Matrix:
    """A parameter seen as an ``rows x cols`` matrix, and its blocks (row slice, column slice)."""
    __slots__ = ("param", "rows", "cols", "blocks")

    def __init__(self, param, block_size):
        self.param = param
        self.rows = param.shape[0]
        self.cols = param.numel() // self.rows
        self.blocks = [(slice(r0, r1), slice(c0, c1))
                       for r0, r1 in block_bounds(self.rows, block_size)
                       for c0, c1 in block_bounds(self.cols, block_size)]

    @property
    def dtype(self):
        """The statistics dtype: the parameter's now (it follows ``model.double()``)."""
        return curvature_dtype(self.param.dtype)

    def view(self, grad):
        """``grad`` as the ``rows x cols`` matrix, in the statistics dtype (no copy if it can)."""
        return grad.reshape(self.rows, self.cols).to(self.dtype)

    def block_dims(self, k):
        rows, cols = self.blocks[k]
        return rows.stop - rows.start, cols.stop - cols.start


class RootGradientMaker(PreconditionedGradientMaker):
    """Base of `ShampooGradientMaker` and `JorgeGradientMaker` (module docstring); not used
    directly.

    Subclasses set ``_block_keys`` (what a block stores: key -> ``"L"``, ``"R"`` for an
    ``m x m`` or ``n x n`` tensor, None for a float), ``_statistics_keys`` (where a block keeps
    the statistics it accumulates) and ``_skipped_statistics`` (what happens when new ones are
    not finite), and implement ``_update_roots`` and ``_roots_of``.
    """
    _requires_data_size = False
    _alike_settings = PreconditionedGradientMaker._alike_settings + (
        "strategy", "block_size", "grafting", "grafting_epsilon")
    _block_keys = {}
    #: Keys a block stores together (all or none): a loaded block missing part of a group
    #: would restart a statistic from nothing, or fail at its next use.
    _block_key_groups = ()
    _statistics_keys = ("L", "R")
    #: Where a block keeps its roots (what an owner broadcasts).
    _root_keys = ("L_root", "R_root")
    _skipped_statistics = "the update is skipped"

    def __init__(self, model, config, block_size=None, *, grafting=None, grafting_epsilon=1e-8,
                 check_finite=True, comm=None, strategy="inverse"):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        self._owner_of = None   # parameter name -> rank refreshing its roots, on first use
        self.block_size = _check_block_size(block_size)
        if grafting not in GRAFTINGS:
            raise ValueError(f"grafting must be one of {GRAFTINGS}, got {grafting!r}")
        self.grafting = grafting
        self.grafting_epsilon = check_positive("grafting_epsilon", grafting_epsilon)
        self._ema_decay = getattr(config, "ema_decay", None)   # checked in super().__init__
        super().__init__(model, config, check_finite=check_finite, comm=comm)
        if config.uses_ema:
            self._decay, self._weight = 1.0 - config.ema_decay, float(config.ema_decay)
        else:
            self._decay, self._weight = 1.0, 1.0
        self._matrices = OrderedDict()
        self._vectors = OrderedDict()
        self._collect_parameters()
        self._blocks = {name: [{} for _ in m.blocks] for name, m in self._matrices.items()}
        self._adagrad = {}

    # ------------------------------------------------------------------ parameters
    def _kind_for(self, name, module):
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            raise NotImplementedError(
                f"{type(self).__name__} needs dense gradients; module {name!r} is "
                f"nn.{type(module).__name__}(sparse=True) (add it to "
                f"PreconditioningConfig.ignore_modules to keep its plain gradient)")
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.ndim >= 2:
            return "matrix"
        return None

    def _weight_is_frozen(self, module, params):
        # Each trainable matrix has statistics of its own, whether the weight trains or not: a
        # LoRA-style leaf (frozen weight, trainable adapters lora_A and lora_B) is kept, and
        # only one left with 1-D parameters (a frozen Linear's bias) keeps the plain gradient.
        return (super()._weight_is_frozen(module, params)
                and not any(p.ndim >= 2 and p.numel() > 0 for _, p in params))

    def _weight_is_computed(self, module, params):
        # Each trainable matrix has statistics of its own: weight_norm's weight_v (and its
        # out x 1 weight_g) are preconditioned as they are, whatever the weight is made of.
        return False

    @staticmethod
    def _weight_is_empty(module):
        # Statistics are per parameter here: an empty one is left out where the matrices are
        # chosen, and the module's other parameters still take part.
        return False

    def _supported_names(self):
        return ("module whose weight has 2 or more dimensions (nn.Linear, nn.Conv2d, "
                "nn.Embedding, ...)")

    def _check_config(self):
        super()._check_config()
        # The statistics gathered so far (sums, or averages and their decay) assume one.
        if self.config.ema_decay != self._ema_decay:
            raise ValueError(f"{type(self).__name__} keeps the ema_decay it was made with "
                             f"({self._ema_decay}), got {self.config.ema_decay}: make a new "
                             f"maker to change it")

    def _collect_parameters(self):
        for module_name, (module, _) in self._modules.items():
            for pname, param in module.named_parameters(recurse=False):
                if not param.requires_grad:
                    continue
                name = f"{module_name}.{pname}" if module_name else pname
                if param.ndim >= 2 and param.numel() > 0:
                    self._matrices[name] = _Matrix(param, self.block_size)
                elif param.ndim == 1 and self.grafting == "adagrad":
                    self._vectors[name] = param
                else:
                    self._unpreconditioned[name] = (
                        f"{param.ndim}-D parameter: plain gradient (grafting={self.grafting!r})"
                        if param.ndim == 1 else f"{param.ndim}-D or empty parameter")
        # >= 2-D parameters held directly by containers (the base class leaves them out).
        ignored_ids = set()
        for entry in self.config.ignore_modules or ():
            if isinstance(entry, nn.Module):
                ignored_ids.update(id(m) for m in entry.modules())
        counts = Counter(id(p) for _, p in self.model.named_parameters(remove_duplicate=False))
        for module_name, module in self.model.named_modules():
            if (next(module.children(), None) is None
                    or self._is_ignored(module_name, module, ignored_ids)):
                continue
            for pname, param in module.named_parameters(recurse=False):
                if (param.requires_grad and param.ndim >= 2 and param.numel() > 0
                        and counts[id(param)] == 1):
                    name = f"{module_name}.{pname}" if module_name else pname
                    self._unpreconditioned.pop(name, None)
                    self._matrices[name] = _Matrix(param, self.block_size)

    def _rebind_parameters(self):
        """Read and write the gradients of the parameter objects the model holds now."""
        for name, matrix in self._matrices.items():
            matrix.param = self._parameter_now(name, matrix.param)
        for name, param in self._vectors.items():
            self._vectors[name] = self._parameter_now(name, param)

    def _parameter_now(self, name, before):
        try:
            param = self.model.get_parameter(name)
        except AttributeError:
            param = None
        if param is None or param.shape != before.shape:
            raise RuntimeError(f"the model no longer holds a parameter {name!r} of shape "
                               f"{tuple(before.shape)}, which {type(self).__name__} "
                               f"preconditions: make a new maker for the changed model")
        return param

    def preconditioned_parameters(self):
        """The parameters whose ``.grad`` this maker replaces.

        Returns
        -------
        collections.OrderedDict
            Qualified parameter name -> parameter: every matrix (preconditioned) and, with
            ``grafting="adagrad"``, the 1-D parameters of the preconditioned modules (given
            Adagrad's step). The other trainable parameters are in
            ``unpreconditioned_parameters()``.
        """
        out = OrderedDict((name, m.param) for name, m in self._matrices.items())
        out.update(self._vectors)
        return out

    def block_shapes(self, name):
        """The ``(rows, cols)`` of each block of parameter `name`, row-major.

        Parameters
        ----------
        name : str
            A qualified matrix parameter name, as in `preconditioned_parameters`.

        Returns
        -------
        list of (int, int)

        Raises
        ------
        KeyError
            ``name`` is not a preconditioned matrix parameter.
        """
        return [self._matrix(name).block_dims(k) for k in range(len(self._matrix(name).blocks))]

    def _matrix(self, name):
        if name not in self._matrices:
            raise KeyError(f"{name!r} is not a preconditioned matrix parameter; they are "
                           f"{list(self._matrices)}")
        return self._matrices[name]

    # ------------------------------------------------------------------ the loop
    def _curvature_forward_and_backward(self):
        # The statistics come from .grad: no hooks, the loss call as set up (as in ASDL).
        return self._plain_forward_and_backward()

    def update_curvature(self):
        """Compute, reduce and accumulate the statistics of every block (steps 1-3)."""
        pending = self._compute_statistics(self._statistics_owners())
        self._accumulate_statistics(self._reduce_statistics(pending))

    def update_preconditioner(self):
        """Refresh the roots of the parameters this process owns (step 4); with
        ``strategy="inverse"`` over ranks, broadcast every parameter's roots from its owner."""
        self._update_roots(self._root_owners())
        if self._distributed and self.strategy == "inverse":
            broadcast_from_owners(self.comm, self._owners(), self._block_roots,
                                  self._store_block_roots, "inverse broadcast")

    def precondition(self):
        """Replace the ``.grad`` of every preconditioned parameter in place (step 5); with
        ``strategy="gradient"`` over ranks, each owner its own matrices, then a broadcast."""
        if not (self._distributed and self.strategy == "gradient"):
            self._precondition_parameters(list(self._matrices), list(self._vectors))
            return
        self._precondition_parameters(self._root_owners(), list(self._vectors))

        def gradient(name):
            # No rank's backward reached the parameter: the same on every rank after the
            # gradient allreduce, so nothing to send.
            grad = self._matrices[name].param.grad
            return {} if grad is None else {"grad": grad}

        def store(name, entries):
            if "grad" in entries:
                self._matrices[name].param.grad.copy_(entries["grad"])
        broadcast_from_owners(self.comm, self._owners(), gradient, store, "gradient broadcast")

    # ------------------------------------------------------------------ ownership
    def _owners(self):
        """Parameter name -> the rank that keeps its statistics and refreshes its roots:
        greedy by the cost of the roots (the cube of every block's sides; rank 0 alone)."""
        if self._owner_of is None:
            costs = {name: sum(float(rows) ** 3 + float(cols) ** 3
                               for rows, cols in map(matrix.block_dims,
                                                     range(len(matrix.blocks))))
                     for name, matrix in self._matrices.items()}
            self._owner_of = assign_owners(costs, self.comm.size if self._distributed else 1)
        return self._owner_of

    def _owned(self):
        if not self._distributed:
            return list(self._matrices)
        return [name for name, owner in self._owners().items() if owner == self.comm.rank]

    def _block_roots(self, name):
        """``{"k:key": tensor}``: the roots each block of parameter `name` holds."""
        return {f"{k}:{key}": state[key] for k, state in enumerate(self._blocks[name])
                for key in self._root_keys if key in state}

    def _store_block_roots(self, name, entries):
        for label, tensor in entries.items():
            k, key = label.split(":", 1)
            self._blocks[name][int(k)][key] = tensor

    # ------------------------------------------------------------------ steps 1-3
    def _statistics_owners(self):
        """The matrices whose statistics this process computes: all of them in one process,
        its own with a communicator."""
        return self._owned()

    def _compute_statistics(self, names):
        """``{name: [(G_b G_b^T, G_b^T G_b) for each block]}`` for those with a gradient."""
        pending = {}
        with torch.no_grad():
            for name in names:
                matrix = self._matrices[name]
                grad = matrix.param.grad
                if grad is None:
                    continue
                G = matrix.view(grad)
                pending[name] = [self._block_statistics(name, k, G[rows, cols])
                                 for k, (rows, cols) in enumerate(matrix.blocks)]
        return pending

    def _block_statistics(self, name, k, block):
        """``(G_b G_b^T, G_b^T G_b)`` of block ``k`` of parameter ``name``."""
        return torch.mm(block, block.T), torch.mm(block.T, block)

    def _reduce_statistics(self, pending):
        """Combine the new statistics across processes (the identity in one process)."""
        return pending

    def _accumulate_statistics(self, pending):
        """Add each block's new statistics to its kept ones (`_combine`); blocks whose result
        is not finite keep theirs, with one warning per parameter."""
        left, right = self._statistics_keys
        for name, pairs in pending.items():
            bad = []
            for k, pair in enumerate(pairs):
                state = self._blocks[name][k]
                combined = self._combine_pair(state, self._statistics_keys, pair)
                if combined is None:
                    bad.append(k)
                    continue
                state[left], state[right] = combined
                self._statistics_added(state)
            if bad:
                self._warn(name, ("non-finite statistics", self._skipped_statistics), bad)

    def _statistics_added(self, state):
        """Called after a block's statistics were accumulated (nothing to do by default)."""

    def _combine(self, old, new):
        """``decay * old + weight * new`` (``weight * new`` without `old`); `new` is consumed."""
        if old is None:
            return new.mul_(self._weight) if self._weight != 1.0 else new
        if self._decay != 1.0:
            old = old.mul(self._decay)
        return torch.add(old, new, alpha=self._weight)

    def _combine_pair(self, state, keys, pair):
        """The combined ``(L, R)`` statistics of one block, or None when not finite."""
        new_l = self._combine(state.get(keys[0]), pair[0])
        new_r = self._combine(state.get(keys[1]), pair[1])
        if _all_finite(new_l) and _all_finite(new_r):
            return new_l, new_r
        return None

    def _warn(self, name, what, bad=()):
        """A RuntimeWarning about parameter `name` (and its blocks `bad`, when it has several)."""
        where = ""
        count = len(self._matrices[name].blocks) if name in self._matrices else 1
        if bad and count > 1:
            where = f" (block{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of {count})"
        warnings.warn(f"step {self.state['step']}: {what[0]} in parameter {name!r}{where}; "
                      f"{what[1]}", RuntimeWarning, stacklevel=5)

    # ------------------------------------------------------------------ step 4
    def _root_owners(self):
        """The matrices whose roots this process refreshes: all of them in one process, its
        own with a communicator."""
        return self._owned()

    def _update_roots(self, names):
        raise NotImplementedError

    def _roots_of(self, state):
        """``(left, right)`` roots of a block's state, or None (the block is left as it is)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ step 5
    def _precondition_parameters(self, matrices, vectors):
        with torch.no_grad():
            for name in matrices:
                self._precondition_matrix(name)
            for name in vectors:
                param = self._vectors[name]
                if param.grad is not None:
                    step = self._adagrad_step(name, param.grad.to(curvature_dtype(param.dtype)))
                    if step is not None:
                        param.grad.copy_(step)

    def _precondition_matrix(self, name):
        matrix = self._matrices[name]
        grad = matrix.param.grad
        if grad is None:
            return
        roots = [self._roots_of(state) for state in self._blocks[name]]
        if self.grafting != "adagrad" and all(r is None for r in roots):
            return  # no roots yet: the identity, and SGD grafting changes nothing
        G = matrix.view(grad)
        target = None
        if self.grafting == "sgd":
            target = finite_norm(G)
        elif self.grafting == "adagrad":
            step = self._adagrad_step(name, G)
            if step is None:
                return
            target = finite_norm(step)
        if self.grafting is not None and target is None:
            self._warn(name, ("non-finite gradient", "it is left unchanged"))
            return
        direction = self._direction(matrix, G, roots)
        norm = finite_norm(direction)
        if norm is None:
            self._warn(name, ("non-finite preconditioned gradient",
                              "the gradient is left unchanged"))
            return
        if target is not None:
            direction = direction.mul(target / norm) if norm > 0 else torch.zeros_like(G)
        if direction.dtype != grad.dtype:
            # Rounded to the gradient's dtype first: a finite float32 direction can overflow a
            # half-precision gradient (roots of small statistics against a larger gradient).
            direction = direction.to(grad.dtype)
            if not _all_finite(direction):
                self._warn(name, (f"preconditioned gradient that overflows {grad.dtype}",
                                  "the gradient is left unchanged"))
                return
        grad.copy_(direction.view(grad.shape))

    @staticmethod
    def _direction(matrix, G, roots):
        """``left G_b right`` per block (``G_b`` where the block has no roots)."""
        if len(matrix.blocks) == 1:
            if roots[0] is None:
                return G
            return torch.mm(torch.mm(roots[0][0], G), roots[0][1])
        out = torch.empty_like(G)
        for (rows, cols), pair in zip(matrix.blocks, roots):
            block = G[rows, cols]
            if pair is not None:
                block = torch.mm(torch.mm(pair[0], block), pair[1])
            out[rows, cols] = block
        return out

    def _adagrad_step(self, name, G):
        """Add ``G^2`` to the Adagrad sum of `name`; ``G / (sqrt(sum) + epsilon)``, or None."""
        if not _all_finite(G):
            self._warn(name, ("non-finite gradient", "it is left unchanged"))
            return None
        square = G * G
        total = self._adagrad.get(name)
        total = square if total is None else total + square
        self._adagrad[name] = total
        return G / total.sqrt().add_(self.grafting_epsilon)

    # ------------------------------------------------------------------ state
    _entries_key = "parameters"

    def _owners_hold_state(self):
        return True   # the statistics stay on their owner

    def _owned_entries(self):
        # The 1-D parameters' Adagrad sums are the same on every rank.
        return self._owned() + list(self._vectors)

    def factors(self, name):
        """The stored tensors of matrix parameter `name`: one dict per block, row-major.

        Parameters
        ----------
        name : str
            A qualified matrix parameter name, as in `preconditioned_parameters`.

        Returns
        -------
        list of dict
            A new dict per block, of the tensors stored so far (themselves, not copies).

        Raises
        ------
        KeyError
            ``name`` is not a preconditioned matrix parameter.
        """
        self._matrix(name)
        return [dict(state) for state in self._blocks[name]]

    def state_dict(self):
        """Step, grafting, block size, and per parameter its blocks' state and Adagrad sum.

        ``{"step", "maker", "grafting", "block_size", "parameters": {name: {"blocks": [dict
        per block], "adagrad": tensor (with Adagrad grafting)}}}``. Tensors are references
        (see the base class); the makers replace them rather than change them in place.
        """
        state = super().state_dict()
        state["grafting"] = self.grafting
        state["block_size"] = self.block_size
        parameters = {}
        for name in list(self._matrices) + list(self._vectors):
            entry = {}
            if name in self._matrices:
                entry["blocks"] = [dict(block) for block in self._blocks[name]]
            if name in self._adagrad:
                entry["adagrad"] = self._adagrad[name]
            parameters[name] = entry
        state["parameters"] = parameters
        return state

    def load_state_dict(self, state_dict):
        """Restore a ``state_dict()``; an ASDL state dict (the step only) restores the step.

        Raises ``ValueError`` when the parameters, the blocks, the keys, the shapes or the
        grafting differ, and then changes nothing.

        Parameters
        ----------
        state_dict : dict
            From `state_dict` or `consolidated_state_dict` of a maker of this class.

        Raises
        ------
        TypeError
            ``state_dict`` is not a dict, or a stored value is not a tensor (or a number,
            where a block holds one).
        ValueError
            As above, and as the base class's `PreconditionedGradientMaker.load_state_dict`.

        Warns
        -----
        UserWarning
            The state dict holds no statistics (an ASDL one): only the step is restored.
        """
        step, saved = self._loaded_entries(state_dict, "statistics",
                                           {"grafting": self.grafting},
                                           list(self._matrices) + list(self._vectors),
                                           "parameters")
        if saved is None:
            return
        blocks, adagrad = {}, {}
        for name, entry in saved.items():
            unknown = set(entry) - {"blocks", "adagrad"}
            if unknown:
                raise ValueError(f"state_dict entry of {name!r} has unknown keys "
                                 f"{sorted(unknown)}")
            if name in self._matrices:
                matrix = self._matrices[name]
                blocks[name] = self._load_blocks(name, matrix, entry.get("blocks", []))
                shape, like = (matrix.rows, matrix.cols), matrix
            else:
                param = self._vectors[name]
                shape, like = tuple(param.shape), param
            if "adagrad" in entry:
                adagrad[name] = self._load_tensor(f"adagrad sum of {name!r}", entry["adagrad"],
                                                  shape, like)
        self.state["step"] = step
        self._blocks = blocks
        self._adagrad = adagrad

    def _load_blocks(self, name, matrix, saved):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(matrix.blocks):
            found = len(saved) if isinstance(saved, (list, tuple)) else type(saved).__name__
            raise ValueError(f"state_dict has {found} blocks for {name!r}, expected "
                             f"{len(matrix.blocks)} (block_size={self.block_size})")
        out = []
        for k, block in enumerate(saved):
            rows, cols = matrix.block_dims(k)
            restored = {}
            for key, value in block.items():
                if key not in self._block_keys:
                    raise ValueError(f"state_dict block {k} of {name!r} has unknown key "
                                     f"{key!r}; expected some of {sorted(self._block_keys)}")
                side = self._block_keys[key]
                if side is None:
                    if not is_real_number(value) and not (
                            isinstance(value, torch.Tensor) and value.numel() == 1):
                        raise TypeError(f"state_dict {key} of block {k} of {name!r} must be a "
                                        f"float, got {type(value).__name__}")
                    restored[key] = float(value)
                    continue
                dim = rows if side == "L" else cols
                restored[key] = self._load_tensor(f"{key} of block {k} of {name!r}", value,
                                                  (dim, dim), matrix)
            for group in self._block_key_groups:
                held = [key for key in group if key in restored]
                if held and len(held) != len(group):
                    raise ValueError(f"state_dict block {k} of {name!r} holds {held} without "
                                     f"{[key for key in group if key not in held]}; expected "
                                     f"all of {list(group)} or none")
            out.append(restored)
        return out

    @staticmethod
    def _load_tensor(what, value, shape, like):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict {what} must be a tensor, got {type(value).__name__}")
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"state_dict {what} has shape {tuple(value.shape)}, expected "
                             f"{tuple(shape)}")
        param = like.param if isinstance(like, _Matrix) else like
        return value.to(device=param.device, dtype=curvature_dtype(param.dtype))
