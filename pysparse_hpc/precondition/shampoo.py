"""Shampoo: `ShampooGradientMaker` (ASDL's name and loop), roots by eigendecomposition.

This module owns Shampoo's statistics and roots; the parameters, blocks, grafting, the update
steps and the state are `RootGradientMaker`'s (``_root_maker``). For the gradient ``G`` of a
parameter (``m x n`` after reshaping; per block with ``block_size``):

* statistics, on curvature steps: ``L <- b L + (1 - b) G G^T`` and
  ``R <- b R + (1 - b) G^T G`` with ``b = 1 - config.ema_decay`` (ASDL's convention, from
  zero), or the sums ``L <- L + G G^T``, ``R <- R + G^T G`` with ``ema_decay = -1`` (ASDL's
  default and the original Shampoo);
* roots, on preconditioner steps: ``L^-1/4 = V diag((max(l, 0) + eps)^-1/4) V^T`` from the
  eigendecomposition ``L = V diag(l) V^T``, with ``eps = config.damping`` (or
  ``damping * l_max`` with ``relative_damping=True``). The damping goes into the eigenvalues
  only: the stored statistics never change except by new gradients;
* direction: ``L^-1/4 G R^-1/4``, then grafting.

The schedules are the configuration's: statistics on curvature steps (``curvature_upd_interval``,
which follows ``preconditioner_upd_interval`` when unset, as in ASDL), roots on preconditioner
steps. The usual Shampoo, statistics every step and roots every ``k``, is
``PreconditioningConfig(curvature_upd_interval=1, preconditioner_upd_interval=k)``.
"""
from .._sputils import check_flag
from ._root_maker import RootGradientMaker
from ._roots import inverse_root

__all__ = ["ShampooGradientMaker"]


class ShampooGradientMaker(RootGradientMaker):
    """Shampoo preconditioned gradients (ASDL's ``ShampooGradientMaker``, same loop).

    Parameters
    ----------
    model : torch.nn.Module
    config : PreconditioningConfig
        ``damping`` is the ``eps`` of ``(L + eps I)^-1/4``; ``ema_decay`` chooses moving
        average or sum (module docstring); ``data_size`` is not used.
    block_size : int, optional
        Cut rows and columns into blocks of at most this many; each block is preconditioned
        on its own. None (default) or -1 (ASDL's default): no blocks. Needed for large
        dimensions: an ``nn.Embedding(V, d)`` without blocks stores ``V x V`` matrices.
    sync_group : None
        ASDL's process group for its distributed Shampoo; anything else raises
        ``NotImplementedError`` (one process only, for now).
    grafting : {None, "sgd", "adagrad"}, default None
        Rescale each parameter's preconditioned gradient to the norm of SGD's step (the
        gradient) or of Adagrad's (``G / (sqrt(sum of G^2 over steps) + grafting_epsilon)``,
        the sum over every step, whatever ``ema_decay``). None: no grafting, as in ASDL. With
        ``"adagrad"`` the 1-D parameters of the preconditioned modules (biases) get Adagrad's
        step; otherwise they keep the plain gradient.
    grafting_epsilon : float, default 1e-8
        Adagrad's epsilon.
    relative_damping : bool, default False
        True: ``eps = damping * l_max`` per matrix (the scale-free ridge of Google's Shampoo
        and ASDL).
    check_finite : bool, default True
        See `PreconditionedGradientMaker`. Whatever its value, non-finite new statistics are
        refused (a ``RuntimeWarning``; the block keeps its statistics and roots), a failed
        eigendecomposition keeps the previous roots, and a non-finite preconditioned gradient
        leaves the gradient as it is.
    comm : pysparse_hpc.distributed.Communicator, optional
        Over the ranks, KAISA-style: gradients summed after each backward (see
        `PreconditionedGradientMaker`); each parameter has one owner rank (greedy by the cost
        of its roots) that keeps its statistics, computed from the summed gradient, and
        refreshes its roots. Every rank ends with the one-process preconditioned gradient.
    strategy : {"inverse", "gradient"}, default "inverse"
        With `comm`: broadcast the roots (every rank preconditions every parameter), or
        precondition on the owner and broadcast the preconditioned gradients. Either way a
        rank's ``state_dict`` holds the statistics of its own parameters only.

    Notes
    -----
    A block without roots (before the first root update) is left as it is (the identity);
    grafting applies as usual. Roots are recomputed on every preconditioner step, also when the
    statistics have not changed since (as in ASDL): keep the preconditioner interval a
    multiple of the curvature interval.

    Differences from ASDL 0.1a5: ``block_size`` is applied (ASDL never passes it on); the
    damping is added to the eigenvalues (ASDL adds ``damping * l_max`` into the stored
    statistics at every root update, so their trace grows without new data); roots by
    eigendecomposition (ASDL: coupled Newton iterations to a tolerance of 1e-6 in float32);
    statistics start at zero (ASDL: ``1e-12 I``); a convolution's weight is one
    ``out x in*kh*kw`` matrix with fourth roots (ASDL: four factors with eighth roots);
    ``nn.Embedding`` weights are ``V x d`` (the same); biases can be grafted; grafting;
    ``state_dict`` holds the statistics and roots (ASDL's holds the step only); float64 works.

    Examples
    --------
    >>> import torch, torch.nn.functional as F
    >>> from pysparse_hpc.precondition import ShampooGradientMaker, PreconditioningConfig
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> gm = ShampooGradientMaker(model, PreconditioningConfig(damping=1e-4), grafting="sgd")
    >>> x, t = torch.randn(16, 4), torch.randint(0, 3, (16,))
    >>> opt.zero_grad()
    >>> dy = gm.setup_model_call(model, x)
    >>> gm.setup_loss_call(F.cross_entropy, dy, t)
    >>> y, loss = gm.forward_and_backward()
    >>> opt.step()
    >>> sorted(gm.factors("0.weight")[0])
    ['L', 'L_root', 'R', 'R_root']
    """
    _block_keys = {"L": "L", "R": "R", "L_root": "L", "R_root": "R"}
    _block_key_groups = (("L", "R"), ("L_root", "R_root"))
    _skipped_statistics = "the update is skipped and the previous statistics and roots are kept"

    _alike_settings = RootGradientMaker._alike_settings + ("relative_damping",)

    def __init__(self, model, config, block_size=None, sync_group=None, *, grafting=None,
                 grafting_epsilon=1e-8, relative_damping=False, check_finite=True, comm=None,
                 strategy="inverse"):
        if sync_group is not None:
            raise NotImplementedError("sync_group (ASDL's distributed Shampoo) is not "
                                      "implemented; use sync_group=None")
        self.relative_damping = check_flag(relative_damping, "relative_damping")
        super().__init__(model, config, block_size, grafting=grafting,
                         grafting_epsilon=grafting_epsilon, check_finite=check_finite,
                         comm=comm, strategy=strategy)

    def _update_roots(self, names):
        damping = self.config.damping
        for name in names:
            bad = []
            for k, state in enumerate(self._blocks[name]):
                if "L" not in state:
                    continue
                left = inverse_root(state["L"], damping, 4, self.relative_damping)
                right = inverse_root(state["R"], damping, 4, self.relative_damping)
                if left is None or right is None:
                    bad.append(k)
                    continue
                state["L_root"], state["R_root"] = left, right
            if bad:
                self._warn(name, ("the eigendecomposition failed or gave non-finite roots",
                                  "the previous roots are kept"), bad)

    def _roots_of(self, state):
        if "L_root" in state:
            return state["L_root"], state["R_root"]
        return None
