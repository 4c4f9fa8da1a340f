"""Jorge: `JorgeGradientMaker`, Shampoo's inverse fourth roots updated by matrix products only.

Jorge (Singh, Sating, Bhatele, 2023) stores ``Lh = L^-1/4`` and ``Rh = R^-1/4`` themselves
and updates them without inverses or eigendecompositions. This module owns that update; the
parameters, blocks, grafting, update steps and state are `RootGradientMaker`'s
(``_root_maker``), so the loop, ``block_size`` and ``state_dict`` are Shampoo's.

For the gradient ``G`` of a parameter (``m x n``; per block with ``block_size``):

* statistics, on curvature steps, gathered until the next refresh:
  ``M_L <- b M_L + (1 - b) G G^T``, ``M_R <- b M_R + (1 - b) G^T G`` and ``a <- b a``
  (starting from ``M = 0``, ``a = 1``), with ``b = 1 - config.ema_decay``; or
  ``M <- M + G G^T``, ``a = 1`` with ``ema_decay = -1`` (sums). After ``s`` curvature steps,
  Shampoo's statistics are ``L_new = a L + M_L`` with ``a = b^s``;
* refresh, on preconditioner steps (`_roots.series_root_update`):
  ``X_L = Lh^4 (M_L + (1 - a) eps I) / a``, scaled to Frobenius norm `series_radius` when
  larger, ``Lh <- a^-1/4 Lh (I - X_L/4 + (5/32) X_L^2)``, then ``Lh <- (Lh + Lh^T) / 2``
  (`symmetrize`); the same for ``Rh``. For one curvature step and ``eps = 0`` this is the
  paper's ``X_L = ((1 - b) / b) Lh^4 G G^T``. The ``(1 - a) eps I`` term (``eps =
  config.damping``) keeps the damping constant: ``Lh^-4`` tracks Shampoo's ``L + eps I``
  instead of letting the initial ``eps I`` decay like old statistics. Where the statistics are
  one gradient's, summed, and gathered in the refreshing step, ``M_L = G G^T = F F^T`` with
  ``F`` of ``k = rank(G)`` columns (at most ``G``'s other side, and the batch size for a
  layer's weight; `_roots.gram_factors` finds ``k`` and ``F``), and a root with
  ``k <= n / 2`` (`FACTORED_SHARE`) refreshes by thin products
  (`_roots.series_root_update_factored`, ``O(n^2 k)``);
* direction: ``Lh G Rh``, grafted per parameter to SGD's norm by default.

Initialisation (`init`): ``"identity"``: ``Lh = eps^-1/4 I`` before the first refresh, i.e.
``L_0 = eps I`` (no eigendecomposition ever); ``"first_statistics"``: the first refresh sets
``Lh = (M_L + eps I)^-1/4`` by one eigendecomposition (Shampoo's root at that step), the later
ones use the series. Before its first refresh a block is left as it is (the identity).

Accuracy: below `series_radius`, the refresh equals the exact root update
``(a (L + eps I) + M + (1 - a) eps I)^-1/4`` (Shampoo's ``(L_new + eps I)^-1/4``) up to
``O(||X||^3)`` when ``L`` and ``M`` commute; otherwise it is the commuting approximation of
the paper (the symmetrisation roughly halves the root error in our measurements). Jorge's
design notes normalise ``X`` by its norm; here only an ``X`` above `series_radius` is scaled
(to that norm), so that small updates stay exact to second order. A clipped ``X`` is the same
update for statistics whose new part enters with the weight ``series_radius / ||X||_F``, so
Jorge's statistics then lag behind Shampoo's; ``clipped_updates`` counts such refreshes. The
series is accurate when ``eps`` is large compared with ``(1 - b) ||G G^T||`` or once the
statistics have accumulated: ``X ~ ((1 - b) / b) (L + eps I)^-1 G G^T``.
"""
import torch

from .._sputils import check_flag
from ._maker import _all_finite
from ._root_maker import RootGradientMaker, check_positive
from ._roots import (gram_factors, inverse_root, series_root_update,
                     series_root_update_factored)

__all__ = ["JorgeGradientMaker", "JORGE_INITS"]

#: Jorge's initialisations: ``"identity"`` and ``"first_statistics"``.
JORGE_INITS = ("identity", "first_statistics")
#: A root of side ``n`` refreshes from the gradient block itself (`_refresh`) when the
#: block's other side ``k`` is at most this share of ``n``: ``12 n^2 k`` flops against
#: ``10 n^3``, with thin products that run slower per flop than square ones.
FACTORED_SHARE = 0.5


class JorgeGradientMaker(RootGradientMaker):
    """Jorge preconditioned gradients, on the loop of `ShampooGradientMaker`.

    Parameters
    ----------
    model : torch.nn.Module
    config : PreconditioningConfig
        ``ema_decay``: ``b = 1 - ema_decay`` (0.001 for the paper's ``b = 0.999``; 1 is refused),
        -1 for sums;
        ``damping``: the initial ``L = damping I`` (or the ``eps`` of the first root);
        ``preconditioner_upd_interval``: steps between refreshes;
        ``curvature_upd_interval``: steps between statistics (follows the preconditioner's
        when unset; with 1, every gradient enters the next refresh).
    block_size : int, optional
        As for `ShampooGradientMaker`.
    grafting : {"sgd", "adagrad", None}, default "sgd"
        As for `ShampooGradientMaker`; Jorge grafts to SGD's norm.
    grafting_epsilon : float, default 1e-8
    init : {"identity", "first_statistics"}, default "identity"
        See the module docstring.
    series_radius : float, default 0.5
        The largest Frobenius norm of ``X`` used, in (0, 1]: larger ``X`` are scaled down
        (at 0.5 the truncated series is within 1.2% of ``(1 + x)^-1/4``).
    symmetrize : bool, default True
        Keep ``Lh`` and ``Rh`` symmetric after each refresh.
    check_finite : bool, default True
        As for `ShampooGradientMaker`; a non-finite refresh keeps the previous roots and
        drops the gathered statistics.
    comm : pysparse_hpc.distributed.Communicator, optional
    strategy : {"inverse", "gradient"}, default "inverse"
        As for `ShampooGradientMaker`.

    Attributes
    ----------
    clipped_updates : int
        How many refreshes of one root had ``X`` scaled down (not in ``state_dict``).

    Examples
    --------
    >>> import torch, torch.nn.functional as F
    >>> from pysparse_hpc.precondition import JorgeGradientMaker, PreconditioningConfig
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> gm = JorgeGradientMaker(model, PreconditioningConfig(damping=1e-3, ema_decay=0.1))
    >>> dy = gm.setup_model_call(model, torch.randn(16, 4))
    >>> gm.setup_loss_call(F.cross_entropy, dy, torch.randint(0, 3, (16,)))
    >>> y, loss = gm.forward_and_backward()
    >>> sorted(gm.factors("2.weight")[0])
    ['Lh', 'Rh']
    """
    _block_keys = {"Lh": "L", "Rh": "R", "L_stat": "L", "R_stat": "R", "stat_decay": None}
    _block_key_groups = (("Lh", "Rh"), ("L_stat", "R_stat", "stat_decay"))
    # Statistics gathered since the last refresh of the roots (and the decay they carry).
    _statistics_keys = ("L_stat", "R_stat")
    _root_keys = ("Lh", "Rh")
    _skipped_statistics = "they are skipped; the gathered statistics and the roots are kept"
    _alike_settings = RootGradientMaker._alike_settings + ("init", "series_radius",
                                                           "symmetrize")

    def __init__(self, model, config, block_size=None, *, grafting="sgd", grafting_epsilon=1e-8,
                 init="identity", series_radius=0.5, symmetrize=True, check_finite=True,
                 comm=None, strategy="inverse"):
        if getattr(config, "ema_decay", None) == 1.0:
            raise ValueError("JorgeGradientMaker needs ema_decay < 1 (or -1: sums): with 1 the "
                             "old statistics get the weight b = 0 and Lh^4 M / b is undefined")
        if init not in JORGE_INITS:
            raise ValueError(f"init must be one of {JORGE_INITS}, got {init!r}")
        self.init = init
        self.series_radius = check_positive("series_radius", series_radius, upper=1.0)
        self.symmetrize = check_flag(symmetrize, "symmetrize")
        self.clipped_updates = 0
        self._fresh = (None, {})   # (step, {(name, block): gradient block}), see below
        self._refresh_follows = False
        super().__init__(model, config, block_size, grafting=grafting,
                         grafting_epsilon=grafting_epsilon, check_finite=check_finite,
                         comm=comm, strategy=strategy)

    def _statistics_added(self, state):
        state["stat_decay"] = state.get("stat_decay", 1.0) * self._decay

    # A block whose gathered statistics are one gradient's, G G^T and G^T G summed (no decay,
    # so no damping term joins them), refreshes in the same step from G itself: the series'
    # matrix then has the rank of G (`gram_factors`, `series_root_update_factored`). The blocks
    # are views of .grad, valid until the step preconditions it, and only in that step.
    def forward_and_backward(self):
        # Within the loop a refresh follows the statistics at once, so a fresh block's larger
        # Gram matrix (784 x 784 for a 256 x 784 weight) is formed only if its refresh needs it.
        self._refresh_follows = True
        try:
            return super().forward_and_backward()
        finally:
            self._refresh_follows = False

    def _compute_statistics(self, names):
        self._fresh = (self.state["step"], {})
        return super()._compute_statistics(names)

    def _block_statistics(self, name, k, block):
        if self._decay != 1.0 or "L_stat" in self._blocks[name][k]:
            return super()._block_statistics(name, k, block)
        self._fresh[1][name, k] = block
        if not (self._refresh_follows and self.do_update_preconditioner()):
            return super()._block_statistics(name, k, block)
        if block.shape[0] <= block.shape[1]:
            return torch.mm(block, block.T), None
        return None, torch.mm(block.T, block)

    def _combine_pair(self, state, keys, pair):
        if pair[0] is not None and pair[1] is not None:
            return super()._combine_pair(state, keys, pair)
        # A fresh block refreshed in this step: only its smaller Gram matrix was formed (its
        # entries bound the larger one's, so one check covers both).
        gram = pair[0] if pair[0] is not None else pair[1]
        return pair if _all_finite(gram) else None

    def _fresh_block(self, name, k):
        """The gradient block whose statistics alone are gathered in block ``k`` of ``name``,
        when they were gathered in this step; else None."""
        step, fresh = self._fresh
        return fresh.get((name, k)) if step == self.state["step"] else None

    def update_preconditioner(self):
        try:
            super().update_preconditioner()
        finally:
            self._fresh = (None, {})
            # A refresh that did not finish leaves no half-formed statistics behind.
            for states in self._blocks.values():
                for state in states:
                    if state.get("L_stat", 0) is None or state.get("R_stat", 0) is None:
                        for key in ("L_stat", "R_stat", "stat_decay"):
                            state.pop(key, None)

    def _update_roots(self, names):
        for name in names:
            bad = []
            for k, state in enumerate(self._blocks[name]):
                if "L_stat" not in state:
                    continue
                stats = (state.pop("L_stat"), state.pop("R_stat"))
                decay = state.pop("stat_decay")
                block = self._fresh_block(name, k)
                factors = (None, None) if block is None else gram_factors(
                    block, *stats, max_rank=self._useful_rank(block.shape))
                roots = [self._refresh(state.get(key), stat, decay, factor)
                         for key, stat, factor in zip(("Lh", "Rh"), stats, factors)]
                if roots[0] is None or roots[1] is None:
                    bad.append(k)
                    continue
                state["Lh"], state["Rh"] = roots
            if bad:
                self._warn(name, ("non-finite root update", "the previous roots are kept and "
                                  "the gathered statistics dropped"), bad)

    @staticmethod
    def _useful_rank(shape):
        """The largest rank of a gradient block of `shape` that lets one of its roots refresh
        by thinner products than the block itself gives (`gram_factors` searches no further)."""
        small, large = sorted(shape)
        if small <= FACTORED_SHARE * large:
            return small - 1   # the larger side is thin already: any lower rank is cheaper
        return int(FACTORED_SHARE * large)

    def _refresh(self, root, statistics, decay, factor=None):
        """The new root for ``decay L + statistics`` (None when not finite); `factor`, when
        given, is ``F`` with ``statistics = F F^T`` (and ``decay`` 1), and `statistics` may
        then be None (formed here if the update needs them)."""
        damping = self.config.damping
        first_root = root is None and self.init == "first_statistics"
        if statistics is None and (first_root or not self._thin(factor)):
            statistics = torch.mm(factor, factor.T)
        if first_root:
            return inverse_root(statistics, damping, 4)
        if root is None:
            like = factor if statistics is None else statistics
            root = torch.eye(like.shape[0], dtype=like.dtype,
                             device=like.device).mul_(damping ** -0.25)
        if decay == 1.0 and self._thin(factor):
            new, clipped = series_root_update_factored(root, factor, decay, self.series_radius,
                                                       self.symmetrize)
        else:
            if decay != 1.0:  # L_new + eps I = decay (L + eps I) + M + (1 - decay) eps I
                statistics = statistics.clone()
                statistics.diagonal().add_((1.0 - decay) * damping)
            new, clipped = series_root_update(root, statistics, decay, self.series_radius,
                                              self.symmetrize)
        self.clipped_updates += clipped
        if new is None or not _all_finite(new):
            return None
        return new

    @staticmethod
    def _thin(factor):
        """Whether a root refreshes from `factor` (``n x k``) by thin products."""
        return factor is not None and factor.shape[1] <= FACTORED_SHARE * factor.shape[0]

    def _roots_of(self, state):
        if "Lh" in state:
            return state["Lh"], state["Rh"]
        return None
