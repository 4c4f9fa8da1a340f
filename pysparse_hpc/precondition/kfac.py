"""K-FAC: Kronecker factors per module kind, pi-damping, Cholesky inversion, `KfacGradientMaker`.

This module owns the Kronecker-factored curvature of ASDL 0.1a5's K-FAC and the maker that
uses it. For a module with weight gradient ``G`` (``out x in`` after flattening) the curvature
is ``A (x) B`` with ``A`` from the module's inputs (a forward hook) and ``B`` from the gradients
w.r.t. its outputs (a tensor hook in the backward), both scaled by ``scale / data_size``:

* ``nn.Linear``: ``A = X^T X`` over every row of the input (all leading axes are examples),
  ``B = D^T D`` over every row of the output gradient;
* ``nn.Conv2d`` (dilation 1, groups 1, zero padding): ``A = sum_n P_n^T P_n / L`` over the
  im2col patches ``P_n`` (``L`` output positions), ``B = sum_n D_n D_n^T`` over positions;
* ``nn.Embedding``: ``A = C^T C`` for the per-example token counts ``C`` (``n x num_embeddings``;
  1-D input: one token per example), ``B = D^T D`` over every token's output gradient.

The preconditioned gradient is ``B^-1 G A^-1`` (``A^-1 G B^-1`` for an embedding, whose weight
is ``num_embeddings x embedding_dim``), the bias's ``B^-1 g_b``, with
``A^-1 = (A + d_A I)^-1`` and ``B^-1 = (B + d_B I)^-1`` by Cholesky and pi-damping
``pi = sqrt((tr A / dim A) / (tr B / dim B))``, ``d_A = max(sqrt(damping) pi, 1e-7)``,
``d_B = max(sqrt(damping) / pi, 1e-7)``. An inverse that will precondition one step only (the
next step inverts again) is kept as its Cholesky factor and applied by triangular solves where
it meets fewer right-hand sides than half its size (the other factor's size), which saves
forming it; with more, triangular solves run far below a product's speed and the inverse is
formed (on one CPU thread, a 785 x 785 factor against 256 right-hand sides: solves 7.5 ms,
inverse and product 13.8 ms; 256 x 256 against 785: 5.1 against 1.8 ms). One that serves
several steps is formed once and applied by products.

A factor of low rank is inverted through its rows. Without a moving average and in one
process, a ``Linear``'s input factor is ``A = U^T U`` with ``U`` the ``k`` captured input rows
(scaled); where ``k <= dim A / 3`` (an MLP's batch of 128 against 785 inputs), Woodbury's
identity ``(d I + U^T U)^-1 = (I - U^T (d I + U U^T)^-1 U) / d`` needs the Cholesky factor of
the ``k x k`` capacitance only, and applying it two thin products: ``k^3 / 3 + 4 k n o``
flops against ``n^3 / 3 + 2 n^2 o`` for ``o`` output rows. The same matrix, rounded in another
order. The rows stand for ``A`` (``A_rows``; the ``n x n`` product is never formed, and
pi-damping reads its trace, the rows' sum of squares), with the damping as
``A_woodbury_damping`` and the capacitance's inverse or Cholesky factor, by the rule above, as
``A_woodbury_inv`` or ``A_woodbury_chol``. An inversion that fails (a damped factor not
positive definite) keeps the previous inverses: a Woodbury one then keeps the rows it was built
from, as ``A_woodbury_rows``, beside the new ``A_rows``.

The update steps (compute, reduce, accumulate, invert, precondition) are those of
`NaturalGradientMaker`, kept apart so that the distributed strategies (`_kaisa`) can place
each on its rank.
"""
import math
import warnings

import torch

from .._sputils import check_flag
from ._maker import _all_finite, curvature_dtype
from ._fisher import FISHER_MC, LOSS_CROSS_ENTROPY
from ._gram import gram
from ._layers import conv2d_patch_columns, supported_kind
from ._natural import (_INVERSE_SUFFIXES, NaturalGradientMaker, in_curvature_dtype,
                       weight_and_bias)

__all__ = ["KfacGradientMaker", "pi_damping", "damped_cholesky"]

_MIN_DAMPING = 1e-7
_FACTOR_KEYS = ("A", "B", "A_inv", "B_inv", "A_chol", "B_chol")
#: Prefixes of the keys of a low-rank input factor: its rows and their Woodbury inverse.
_LOW_RANK_KEYS = ("A_rows", "A_woodbury")

#: The largest share of a factor's size its rows may have for Woodbury's identity: below
#: about 0.36 applying it (two thin products and two k x k solves) costs less than one product
#: with the explicit inverse, so a third is cheaper on every schedule.
LOW_RANK_SHARE = 1 / 3


def pi_damping(A, B, damping, use_pi=True, eps=_MIN_DAMPING):
    """The damping of each Kronecker factor: ``(d_A, d_B)``.

    Parameters
    ----------
    A, B : torch.Tensor
        Square factors.
    damping : float
        The damping of the product (> 0).
    use_pi : bool, default True
        False: ``d_A = d_B = sqrt(damping)`` (pi fixed at 1).
    eps : float
        The smallest damping of a factor.

    Returns
    -------
    (float, float)
        ``(max(sqrt(damping) pi, eps), max(sqrt(damping) / pi, eps))`` with
        ``pi = sqrt((tr A / dim A) / (tr B / dim B))`` (ASDL's pi-damping). When pi is 0, inf
        or NaN (a zero factor) both are `damping`, as in ASDL.
    """
    return _split_damping(_mean_diagonal(A), _mean_diagonal(B), damping, use_pi, eps)


def _mean_diagonal(matrix):
    """``tr(M) / dim M`` as a float."""
    return float(torch.diagonal(matrix).sum()) / matrix.shape[0]


def _split_damping(mean_a, mean_b, damping, use_pi, eps):
    """`pi_damping` from the factors' mean diagonal entries."""
    root = damping ** 0.5
    if not use_pi:
        return root, root
    pi = math.sqrt(mean_a / mean_b) if mean_b > 0 and mean_a > 0 else 0.0
    if pi == 0.0 or not math.isfinite(pi):
        return damping, damping
    return max(root * pi, eps), max(root / pi, eps)


def damped_cholesky(matrix, damping):
    """The lower Cholesky factor of ``matrix + damping I``; None when not positive definite.

    Parameters
    ----------
    matrix : torch.Tensor, shape (n, n)
        Symmetric; not changed (a damped copy is factored).
    damping : float
        Added to the diagonal.

    Returns
    -------
    torch.Tensor or None
        ``L``, lower triangular and row-major, with ``L L^T = matrix + damping I``; None
        where the damped matrix is not positive definite.
    """
    damped = matrix.clone()
    damped.diagonal().add_(damping)
    # LAPACK leaves its results column-major; the upper factor's transpose is the lower
    # factor in row-major order (see `_row_major`).
    factor, info = torch.linalg.cholesky_ex(damped, upper=True)
    if int(info) != 0:
        return None
    return factor.mT


def _row_major(symmetric):
    """An exactly symmetric matrix in row-major order: its transpose where that is the
    row-major view (no copy), else a copy.

    Every stored inverse and factor is row-major because a checkpoint and a broadcast hand
    them back row-major, and a product with a column-major operand is another BLAS call
    that rounds differently: a run resumed from a checkpoint, or a rank that received its
    inverses, would drift from the one that computed them."""
    if symmetric.is_contiguous():
        return symmetric
    return symmetric.mT if symmetric.mT.is_contiguous() else symmetric.contiguous()


def _solve_left(lower, x):
    """``(L L^T)^-1 x`` by two triangular solves with the lower Cholesky factor ``lower``."""
    return torch.linalg.solve_triangular(
        lower.T, torch.linalg.solve_triangular(lower, x, upper=False), upper=True)


def _solve_right(lower, x):
    """``x (L L^T)^-1`` by two triangular solves."""
    return torch.linalg.solve_triangular(
        lower, torch.linalg.solve_triangular(lower.T, x, upper=True, left=False),
        upper=False, left=False)


class _Inverse:
    """Applies ``(M + d I)^-1``, held as the explicit inverse, as its Cholesky factor, or, for
    ``M = U^T U``, as ``U``, ``d`` and the inverse of the capacitance ``d I + U U^T`` (itself
    an `_Inverse`: Woodbury's identity)."""
    __slots__ = ("inverse", "cholesky", "rows", "damping", "capacitance")

    def __init__(self, inverse=None, cholesky=None, rows=None, damping=None, capacitance=None):
        self.inverse = inverse
        self.cholesky = cholesky
        self.rows = rows
        self.damping = damping
        self.capacitance = capacitance

    @property
    def dtype(self):
        held = self.inverse if self.inverse is not None else self.cholesky
        return (held if held is not None else self.rows).dtype

    # Two triangular solves rather than torch.cholesky_solve: the same arithmetic, 1.4x-1.7x
    # faster on a CPU thread for the factor sizes of a K-FAC step (785 x 785 against 256
    # right-hand sides: 4.2 against 6.9 ms).
    def left(self, x):
        """``M^-1 x`` for a matrix `x`."""
        if self.inverse is not None:
            return self.inverse.mm(x)
        if self.rows is not None:
            rows = self.rows
            return x.sub(rows.T.mm(self.capacitance.left(rows.mm(x)))).div_(self.damping)
        return _solve_left(self.cholesky, x)

    def right(self, x):
        """``x M^-1`` for a matrix `x` (M is symmetric)."""
        if self.inverse is not None:
            return x.mm(self.inverse)
        if self.rows is not None:
            rows = self.rows
            return x.sub(self.capacitance.right(x.mm(rows.T)).mm(rows)).div_(self.damping)
        return _solve_right(self.cholesky, x)

    @classmethod
    def of(cls, state, key):
        # A Woodbury inverse applies with the rows it was built from: ``_woodbury_rows`` where
        # newer rows failed to invert, else the current ``_rows`` (see `_accumulate_factors`).
        rows = state.get(key + "_woodbury_rows", state.get(key + "_rows"))
        if key + "_woodbury_damping" in state and rows is not None:
            return cls(rows=rows, damping=float(state[key + "_woodbury_damping"]),
                       capacitance=cls.of(state, key + "_woodbury"))
        if key + "_inv" in state:
            return cls(inverse=state[key + "_inv"])
        if key + "_chol" in state:
            return cls(cholesky=state[key + "_chol"])
        return None


class _KronKind:
    """How one module class maps onto Kronecker factors (stateless; one instance per class)."""
    name = ""

    def factor_dims(self, module):
        """``(dim A, dim B)``."""
        raise NotImplementedError

    def input_factor(self, module, x):
        """The unscaled ``A`` contribution of the input `x` of one call."""
        raise NotImplementedError

    def input_rows(self, module, x):
        """Rows ``U`` with ``U^T U`` the `input_factor` of `x`, or None (not kept)."""
        return None

    def grad_factor(self, module, grad):
        """The unscaled ``B`` contribution of the gradient w.r.t. the output of one call."""
        raise NotImplementedError

    def precondition(self, module, A_inv, B_inv):
        """``[(grad, preconditioned grad)]`` of ``module.weight`` (and its bias); `A_inv` and
        `B_inv` are ``_Inverse`` objects."""
        results = []
        weight = module.weight.grad
        if weight is not None:
            flat = weight.reshape(weight.shape[0], -1).to(B_inv.dtype)
            results.append((weight, A_inv.right(B_inv.left(flat)).view_as(weight)))
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor) and bias.grad is not None:
            column = bias.grad.unsqueeze(1).to(B_inv.dtype)
            results.append((bias.grad, B_inv.left(column).squeeze(1)))
        return results


class _LinearKind(_KronKind):
    name = "Linear"

    def factor_dims(self, module):
        return module.in_features, module.out_features

    def input_factor(self, module, x):
        return gram(x.reshape(-1, x.shape[-1]))

    def input_rows(self, module, x):
        return x.reshape(-1, x.shape[-1])

    def grad_factor(self, module, grad):
        grad = grad.reshape(-1, grad.shape[-1])
        return grad.T.mm(grad)


class _Conv2dKind(_KronKind):
    name = "Conv2d"

    def factor_dims(self, module):
        kh, kw = module.kernel_size
        return module.in_channels * kh * kw, module.out_channels

    def input_factor(self, module, x):
        columns, positions = conv2d_patch_columns(module, x)
        return gram(columns.T).div_(positions)

    def grad_factor(self, module, grad):
        if grad.ndim == 4:
            grad = grad.transpose(0, 1)
        grad = grad.reshape(grad.shape[0], -1)
        return grad.mm(grad.T)


class _EmbeddingKind(_KronKind):
    name = "Embedding"

    def factor_dims(self, module):
        return module.num_embeddings, module.embedding_dim

    def input_factor(self, module, x):
        # Sizes spelled out, not -1: a rank holding no examples has an empty input.
        index = (x.reshape(-1, 1) if x.ndim <= 1
                 else x.reshape(x.shape[0], math.prod(x.shape[1:])))
        weight = module.weight
        # Counts in the curvature's dtype: float32 for a half-precision table (whose counts
        # would also overflow float16 on long sequences).
        dtype = curvature_dtype(weight.dtype)
        counts = torch.zeros(index.shape[0], module.num_embeddings, dtype=dtype,
                             device=weight.device)
        counts.scatter_add_(1, index, torch.ones(index.shape, dtype=dtype,
                                                 device=weight.device))
        if module.padding_idx is not None:
            counts[:, module.padding_idx] = 0
        return gram(counts)

    def grad_factor(self, module, grad):
        grad = grad.reshape(-1, grad.shape[-1])
        return grad.T.mm(grad)

    def precondition(self, module, A_inv, B_inv):
        weight = module.weight.grad
        if weight is None:
            return []
        return [(weight, B_inv.right(A_inv.left(weight.to(A_inv.dtype))))]


_KINDS = {"Linear": _LinearKind(), "Conv2d": _Conv2dKind(), "Embedding": _EmbeddingKind()}


class KfacGradientMaker(NaturalGradientMaker):
    """K-FAC preconditioned gradients (ASDL's ``KfacGradientMaker``, same arguments).

    ``nn.Linear``, ``nn.Conv2d`` (dilation 1, groups 1, zero padding) and ``nn.Embedding``
    (dense gradients) get Kronecker factors (see the module docstring); every other parameter
    keeps its plain gradient (`unpreconditioned_parameters` lists them; ASDL gives
    normalization layers 2x2 unit-wise blocks instead).

    Parameters
    ----------
    model : torch.nn.Module
    config : PreconditioningConfig
        ``data_size`` must be set; ``damping`` is pi-damped between the factors.
    fisher_type : {"fisher_mc", "fisher_emp", "fisher_exact"}, default "fisher_mc"
        ASDL's names (``"mc"``, ``"emp"``, ``"exact"`` also accepted). Empirical: the gradients
        of the training loss (one backward). MC: labels sampled from the model
        (`n_mc_samples` extra backwards). Exact: one extra backward per class.
    loss_type : {"cross_entropy", "mse"}, default "cross_entropy"
        The likelihood of the MC and exact Fishers (unused by the empirical Fisher). The
        classes are the last axis of the logits, which are the first placeholder argument of
        the loss call (ASDL takes the whole model output, ignoring any indexing); with torch's
        own cross-entropy (``F.cross_entropy``, ``nn.CrossEntropyLoss``) as the loss, the
        second of ``(N, C, d1, ...)`` logits, where it reads them (ASDL takes the last).
    scale : float, default 1.0
        Multiplies each factor (so the curvature by ``scale**2``), as in ASDL.
    grad_scale : float, default 1.0
        Multiplies the gradients of the preconditioned modules before preconditioning.
    n_mc_samples : int, default 1
        MC samples per curvature update; their contributions are averaged.
    var : float, default 1.0
        Variance of the Gaussian of the MC Fisher for the MSE loss.
    seed : int, optional
        When given, ``torch.manual_seed(seed)`` before each curvature pass (as ASDL), so the MC
        labels repeat; the pass runs on a fork of torch's generator, which goes on after it
        as it was (ASDL's reset left every later draw repeating).
    swift : bool, default False
        ASDL's SKFAC variant; not implemented (True raises ``NotImplementedError``).
    pi_damping : bool, default True
        False: each factor gets ``sqrt(damping)``.
    kl_clip : float, optional
        Bound the step (not in ASDL; KAISA's, default off): after preconditioning, every
        preconditioned gradient is scaled by ``min(1, sqrt(kl_clip / |lr^2 sum v.g|))``, ``v``
        the preconditioned and ``g`` the plain gradients, so that the step's predicted change
        of the output distribution stays below about ``kl_clip / 2`` (KAISA's default:
        1e-3). Use it where SGD applies the direction with a small damping; the factor of the
        last step is `last_kl_clip_scale`.
    lr : float or callable, optional
        With `kl_clip` (required there): the learning rate the optimizer applies the
        preconditioned gradients with, or a callable returning the current one (``lambda:
        opt.param_groups[0]["lr"]``, which follows a scheduler).
    check_finite : bool, default True
        See `PreconditionedGradientMaker`. Non-finite new factors are always refused: the
        module's update is skipped with a ``RuntimeWarning`` and its previous factors and
        inverses stay.
    comm : pysparse_hpc.distributed.Communicator, optional
        KAISA over the ranks (each holding part of the ``data_size`` examples): gradients and
        new factors are summed over the ranks, each module is inverted by one owner rank
        (greedy by cost), and the result is shared by `strategy`. Every rank then holds the
        one-process preconditioned gradient (up to the order of float sums); with the
        Monte Carlo Fisher, that of other sampled labels (each rank samples its own examples'
        labels from its own generator; a `seed` seeds every rank's alike).
    strategy : {"inverse", "gradient"}, default "inverse"
        With `comm`: broadcast the inverses (every rank preconditions every module), or
        precondition on the owner and broadcast the preconditioned gradients (inverses stay
        on their owner, so each rank's ``state_dict`` holds its own modules' inverses).

    Attributes
    ----------
    last_kl_clip_scale : float
        With `kl_clip`: the factor the last preconditioned step's gradients were scaled by
        (1.0: not clipped).

    Notes
    -----
    Without a moving average (``ema_decay=-1``) each curvature update replaces the factors and
    inverts them at once; the preconditioner interval then changes nothing (as in ASDL). With
    one, the factors are averaged on curvature steps and inverted on preconditioner steps.
    The factors and inverses are kept (``state_dict`` holds them all), which ASDL does not.

    Examples
    --------
    >>> import torch, torch.nn.functional as F
    >>> from pysparse_hpc.precondition import KfacGradientMaker, PreconditioningConfig
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> gm = KfacGradientMaker(model, PreconditioningConfig(data_size=16, damping=1e-3),
    ...                        fisher_type="fisher_emp")
    >>> x, t = torch.randn(16, 4), torch.randint(0, 3, (16,))
    >>> opt.zero_grad()
    >>> dy = gm.setup_model_call(model, x)
    >>> gm.setup_loss_call(F.cross_entropy, dy, t)
    >>> y, loss = gm.forward_and_backward()
    >>> opt.step()
    >>> sorted(gm.preconditioned_modules())
    ['0', '2']
    """
    _alike_settings = NaturalGradientMaker._alike_settings + ("pi_damping",)

    def __init__(self, model, config, fisher_type=FISHER_MC, loss_type=LOSS_CROSS_ENTROPY,
                 scale=1.0, grad_scale=1.0, n_mc_samples=1, var=1.0, seed=None, swift=False,
                 *, pi_damping=True, kl_clip=None, lr=None, check_finite=True, comm=None,
                 strategy="inverse"):
        if check_flag(swift, "swift"):
            raise NotImplementedError("swift=True (SKFAC) is not implemented; use swift=False")
        self.pi_damping = check_flag(pi_damping, "pi_damping")
        super().__init__(model, config, fisher_type, loss_type, scale, grad_scale, n_mc_samples,
                         var, seed, kl_clip=kl_clip, lr=lr, check_finite=check_finite,
                         comm=comm, strategy=strategy)

    # ------------------------------------------------------------------ modules
    def _kind_for(self, name, module):
        return _KINDS.get(supported_kind(name, module))

    # ------------------------------------------------------------------ compute
    def _on_input(self, name, module, x):
        x = in_curvature_dtype(x, self._weight_dtypes[name])
        # Added with the call's first output gradient, not here: a call whose output gets no
        # gradient (a forward re-run by activation checkpointing inside backward, as
        # GATConv(cache="none") does) must not count twice.
        kind = self._modules[name][1]
        if not (self._distributed or self.config.uses_ema):  # else the factor is summed
            rows = kind.input_rows(module, x)
            if rows is not None and rows.shape[0] <= LOW_RANK_SHARE * rows.shape[1]:
                return [("A_rows", rows)]
        return [("A", kind.input_factor(module, x))]

    def _on_output_grad(self, name, module, grad, weight, context):
        if context:
            self._add_pending(name, *context.pop())
        grad = in_curvature_dtype(grad, self._weight_dtypes[name])
        contribution = self._modules[name][1].grad_factor(module, grad)
        if weight != 1.0:
            contribution.mul_(weight)
        self._add_pending(name, "B", contribution)

    def _complete(self, entry):
        return ("A" in entry or "A_rows" in entry) and "B" in entry

    # ------------------------------------------------------------------ accumulate
    def _accumulate_factors(self, pending):
        """The base's accumulation, with finite input rows kept apart: scaled by the square
        root of the factors' scale (``A = U^T U``) and stored instead of ``A``, or made into
        ``A`` where calls stacked more of them than `LOW_RANK_SHARE` (or a call gave ``A``).

        New rows that replace those of a Woodbury inverse leave the old ones to the inverse as
        ``A_woodbury_rows`` until `_invert` replaces it: an inversion that fails keeps the
        previous inverse whole, which the new rows would not fit."""
        rows = {}
        for name, entry in pending.items():
            state = self._factors[name]
            if self.config.uses_ema and "A" in entry and "A" not in state and "A_rows" in state:
                # A factor held as its rows (no moving average until now, or a state saved
                # without one) is averaged whole: else the average would start from nothing.
                state["A"] = gram(state["A_rows"])
            stacked = entry.get("A_rows")
            if stacked is None:
                continue
            if not _all_finite(stacked):
                # The base refuses the module's update, as for A, after scaling the entry in
                # place: a copy, since one call's rows are a view of the model's input, which
                # would be scaled too.
                entry["A_rows"] = stacked.clone()
                continue
            del entry["A_rows"]
            if "A" in entry or stacked.shape[0] > LOW_RANK_SHARE * stacked.shape[1]:
                dense = gram(stacked)
                entry["A"] = entry["A"].add_(dense) if "A" in entry else dense
            else:
                rows[name] = stacked
        updated = super()._accumulate_factors(pending)
        root = math.sqrt(self.scale / self.config.data_size)
        for name in updated:
            state = self._factors[name]
            if name in rows:
                if "A_woodbury_damping" in state and "A_woodbury_rows" not in state:
                    state["A_woodbury_rows"] = state["A_rows"]
                # Not in place: a view of the input. Row-major (see `_row_major`): the product
                # keeps the strides of a transposed input, which a checkpoint hands back
                # row-major, and the resumed run would round its products differently.
                state["A_rows"] = rows[name].mul(root).contiguous()
                state.pop("A", None)
            else:
                # The rows' inverse goes with them (a rank that does not own the module under
                # strategy="gradient" inverts nothing that would replace it).
                for key in [k for k in state if k.startswith(_LOW_RANK_KEYS)]:
                    del state[key]
        return updated

    # ------------------------------------------------------------------ invert
    def _invert(self, names, once=False):
        """Invert the damped factors of `names`; `once`: keep Cholesky factors where solves are
        cheaper (see top)."""
        damping = self.config.damping
        for name in names:
            state = self._factors[name]
            if "B" not in state:
                continue
            B, rows = state["B"], state.get("A_rows")
            low_rank = rows is not None
            if low_rank:
                mean_a = float(rows.pow(2).sum()) / rows.shape[1]  # tr(U^T U) / dim A
            else:
                A = state["A"]
                mean_a = _mean_diagonal(A)
            damping_a, damping_b = _split_damping(mean_a, _mean_diagonal(B), damping,
                                                  self.pi_damping, _MIN_DAMPING)
            # Woodbury: the Cholesky factor of the capacitance d I + U U^T, not of A + d I.
            chol_a = damped_cholesky(rows.mm(rows.T) if low_rank else A, damping_a)
            chol_b = damped_cholesky(B, damping_b)
            if chol_a is None or chol_b is None:
                # Each previous inverse is whole (a Woodbury one with its own rows), so it
                # still applies; none at all (the first inversion, or a dense factor that
                # took the rows' place and dropped their inverse) leaves the plain gradient.
                if _Inverse.of(state, "A") is not None and _Inverse.of(state, "B") is not None:
                    kept = "the previous inverses are kept"
                else:
                    kept = ("it keeps the plain gradient until an inversion succeeds (no "
                            "previous inverses of both factors to keep)")
                warnings.warn(f"step {self.state['step']}: the damped factors of module "
                              f"{name or '<model>'!r} are not positive definite (damping "
                              f"{damping_a:.3g}, {damping_b:.3g}); {kept}. Raise "
                              f"config.damping if this repeats: it is too small against the "
                              f"factors in {B.dtype}", RuntimeWarning, stacklevel=4)
                continue
            for key in [k for k in state if k.endswith(_INVERSE_SUFFIXES)]:
                del state[key]
            # Each factor meets the other's size of right-hand sides, and so does the
            # capacitance of a low-rank one.
            dim_a = rows.shape[1] if low_rank else A.shape[0]
            held = [("A_woodbury" if low_rank else "A", chol_a, B.shape[0]),
                    ("B", chol_b, dim_a)]
            if low_rank:
                state["A_woodbury_damping"] = torch.tensor(damping_a, dtype=B.dtype)
            for key, chol, sides in held:
                if once and 2 * sides < chol.shape[0]:
                    state[key + "_chol"] = chol
                else:
                    state[key + "_inv"] = _row_major(torch.cholesky_inverse(chol))

    # ------------------------------------------------------------------ precondition
    def _precondition_modules(self, names):
        with torch.no_grad():
            for name in names:
                module, kind = self._modules[name]
                if self.grad_scale != 1.0:
                    for param in weight_and_bias(module):
                        if param.grad is not None:
                            param.grad.mul_(self.grad_scale)
                state = self._factors[name]
                A_inv, B_inv = _Inverse.of(state, "A"), _Inverse.of(state, "B")
                if A_inv is not None and B_inv is not None:
                    self._write_preconditioned(name, kind.precondition(module, A_inv, B_inv))

    # ------------------------------------------------------------------ state
    def factors(self, name):
        """The stored tensors of module `name`: ``A``, ``B`` and the inverses.

        The inverses are ``A_inv`` and ``B_inv``, or, when they serve one step only,
        ``A_chol`` and ``B_chol``: the lower Cholesky factors of the damped factors. An input
        factor of low rank (see the module docstring) is held as its rows ``A_rows``
        (``A = A_rows^T A_rows``), its inverse as ``A_woodbury_damping`` and the capacitance's
        ``A_woodbury_inv`` or ``A_woodbury_chol`` (by the same rule as the factors'), built
        from ``A_rows`` or, where newer rows have failed to invert since, from the rows kept
        with it as ``A_woodbury_rows``.

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
        return super().factors(name)

    def _check_entry(self, name, entry):
        """The factors load as a pair (``A`` or its rows ``A_rows``, and ``B``), or not at all:
        the maker stores them together, and one alone would fail at the next inversion. A
        low-rank input factor loads whole: its rows and, unless no inversion of it has
        succeeded yet, the damping and one ``k x k`` capacitance inverse or factor for the
        ``k`` rows it was built from (``A_woodbury_rows`` where present, else ``A_rows``)."""
        woodbury = {k for k in entry if k.startswith(_LOW_RANK_KEYS)}
        if woodbury and woodbury != {"A_rows"}:
            held = woodbury & {"A_woodbury_inv", "A_woodbury_chol"}
            rows = entry.get("A_woodbury_rows", entry.get("A_rows"))
            if "A_rows" not in entry or "A_woodbury_damping" not in entry or len(held) != 1 \
                    or entry[held.pop()].shape != (rows.shape[0],) * 2:
                raise ValueError(f"state_dict factors of {name!r} hold an incomplete low-rank "
                                 f"input factor ({sorted(woodbury)}); expected A_rows, "
                                 f"A_woodbury_damping and a k x k A_woodbury_inv or "
                                 f"A_woodbury_chol for the k rows it was built from "
                                 f"(A_woodbury_rows where present, else A_rows)")
        has_a, has_b = "A" in entry or "A_rows" in entry, "B" in entry
        if has_a != has_b:
            raise ValueError(f"state_dict factors of {name!r} hold "
                             f"{'A' if has_a else 'B'} without {'B' if has_a else 'A'} "
                             f"(found {sorted(entry)}); expected both factors or neither")

    def _expected_shapes(self, name):
        module, kind = self._modules[name]
        dim_a, dim_b = kind.factor_dims(module)
        shapes = {key: (dim_a, dim_a) if key[0] == "A" else (dim_b, dim_b)
                  for key in _FACTOR_KEYS}
        # Low-rank keys: any number k of rows (None), never summed over ranks.
        shapes.update(A_rows=(None, dim_a), A_woodbury_rows=(None, dim_a),
                      A_woodbury_chol=(None, None), A_woodbury_inv=(None, None),
                      A_woodbury_damping=())
        return shapes
