"""Gradient preconditioning (K-FAC, Shampoo, Jorge) with ASDL's interface, in one process or
over MPI (KAISA's strategies: ``comm=``, ``strategy=``).

Compatible with ASDL 0.1a5 (PyPI ``asdfghjkl``, import name ``asdl``): the same class names,
configuration fields, Fisher-type names and loop, so that a script changes only its import::

    gm = KfacGradientMaker(model, PreconditioningConfig(data_size=B, damping=1e-3))
    for x, t in loader:
        opt.zero_grad()
        dy = gm.setup_model_call(model, x)          # a placeholder for the output
        gm.setup_loss_call(F.cross_entropy, dy, t)  # the loss must accept reduction=
        y, loss = gm.forward_and_backward()         # .grad now holds the preconditioned gradient
        opt.step()

Classes
-------
PreconditioningConfig        what to precondition, how often, with what damping
PreconditionedGradientMaker  the loop: placeholders, schedules, hooks, state (base class)
NaturalGradientMaker         base of the Fisher-based makers: update steps, state
KfacGradientMaker            K-FAC for nn.Linear, nn.Conv2d, nn.Embedding
DiagNaturalGradientMaker     the diagonal Fisher, same modules and loop
ShampooGradientMaker         Shampoo: L^-1/4 G R^-1/4 per block, grafted to SGD or Adagrad
JorgeGradientMaker           Jorge: the roots updated by matrix products only, grafted to SGD
OutputPlaceholder            what ``setup_model_call`` returns

Constants
---------
FISHER_EMP, FISHER_MC, FISHER_EXACT   Fisher types (``"fisher_emp"`` ...; ``"emp"`` also works)
LOSS_CROSS_ENTROPY, LOSS_MSE          likelihoods of the MC and exact Fishers

Differences from ASDL 0.1a5
---------------------------
Fixed or added here:

* EMA (``ema_decay``) runs on the CPU (ASDL's raises "NVTX functions not installed");
* ``state_dict()`` holds the step, the factors and the inverses, so a run resumes bit for bit
  (ASDL's holds the step only; ``load_state_dict`` still accepts it);
* ``nn.Embedding``: ASDL skips it without EMA (then fails) and, with EMA, reshapes the
  ``V x d`` gradient as ``d x V``; here ``A^-1 G B^-1``, with the padding index left out of
  ``A`` so the padding row keeps a zero gradient;
* ``Conv2d(padding="same")`` works; unsupported convolutions (dilation, groups, padding mode)
  are refused when the maker is built, naming the module;
* the MC and exact Fishers take the logits the loss sees (``placeholder[mask]``: the masked
  rows), not the whole output; several MC samples are averaged (ASDL weights each by
  ``1 / n**2``);
* non-finite curvature or gradients skip the update with a ``RuntimeWarning`` instead of
  writing NaN; a Cholesky failure keeps the previous inverse;
* on curvature steps the backward runs on ``loss / data_size`` (ASDL divides every ``.grad``
  afterwards, also gradients accumulated before the call);
* an ``ignore_modules`` entry that is a container ignores its descendants; a bare leaf module
  works as the model; ``pi_damping=False`` switches pi-damping off;
* bad input fails early: ``data_size`` unset, ``damping <= 0``, a loss without ``reduction=``.

Not (yet) here: unit-wise curvature of normalization layers (they keep the plain gradient;
``unpreconditioned_parameters()`` lists them), ``setup_loss_repr`` / ``setup_logits_repr``,
SKFAC (``swift=True``), the other makers (PSGD, K-BFGS, SENG, ...), the
``"step"`` / ``"linear"`` interval types (ASDL ignores them). The distributed strategies are
KAISA's, over this library's communicator (ASDL's need NCCL and CUDA).
Shampoo differs from ASDL's on purpose: ``block_size`` is applied, and the damping is added to
the eigenvalues of each root, never into the stored statistics.

Importing this package imports torch.
"""
from ._fisher import (FISHER_EMP, FISHER_EXACT, FISHER_MC, FISHER_TYPES, LOSS_CROSS_ENTROPY,
                      LOSS_MSE)
from ._maker import OutputPlaceholder, PreconditionedGradientMaker
from ._natural import NaturalGradientMaker
from .config import PreconditioningConfig
from .diag import DiagNaturalGradientMaker
from .jorge import JorgeGradientMaker
from .kfac import KfacGradientMaker
from .shampoo import ShampooGradientMaker

__all__ = ["DiagNaturalGradientMaker", "FISHER_EMP", "FISHER_EXACT", "FISHER_MC", "FISHER_TYPES",
           "JorgeGradientMaker", "KfacGradientMaker", "LOSS_CROSS_ENTROPY", "LOSS_MSE",
           "NaturalGradientMaker", "OutputPlaceholder", "PreconditionedGradientMaker",
           "PreconditioningConfig", "ShampooGradientMaker"]
