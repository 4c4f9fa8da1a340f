"""Fisher types and the extra backward passes that estimate them (ASDL's names and sampling).

This module owns the names of the Fisher types (``"fisher_emp"``, ``"fisher_mc"``,
``"fisher_exact"``, as in ASDL, with the short aliases ``"emp"``, ``"mc"``, ``"exact"``) and of
the loss types, and, for the model's logits, the sequence of scalar "negative log-likelihoods"
whose backward passes expose the gradients w.r.t. each module's output that the curvature is
built from. The empirical Fisher needs no extra pass: it reuses the training backward.

The Monte Carlo labels are drawn exactly as ASDL 0.1a5 draws them (one ``torch.multinomial``
per sample over the normalised softmax, one ``torch.normal`` for the MSE loss), so that with the
same random state both libraries see the same labels.
"""
import math

import torch
import torch.nn.functional as F

__all__ = ["FISHER_EMP", "FISHER_MC", "FISHER_EXACT", "FISHER_TYPES", "LOSS_CROSS_ENTROPY",
           "LOSS_MSE", "LOSS_TYPES", "canonical_fisher_type", "fisher_passes"]

FISHER_EXACT = "fisher_exact"
FISHER_MC = "fisher_mc"
FISHER_EMP = "fisher_emp"
FISHER_TYPES = (FISHER_EMP, FISHER_MC, FISHER_EXACT)
_ALIASES = {"emp": FISHER_EMP, "mc": FISHER_MC, "exact": FISHER_EXACT}

LOSS_CROSS_ENTROPY = "cross_entropy"
LOSS_MSE = "mse"
LOSS_TYPES = (LOSS_CROSS_ENTROPY, LOSS_MSE)


def canonical_fisher_type(fisher_type):
    """ASDL's name for `fisher_type` (``"emp"`` -> ``"fisher_emp"``); raises on anything else."""
    if not isinstance(fisher_type, str):
        raise TypeError(f"fisher_type must be a str, got {type(fisher_type).__name__}")
    name = _ALIASES.get(fisher_type, fisher_type)
    if name not in FISHER_TYPES:
        raise ValueError(f"fisher_type must be one of {FISHER_TYPES} (or {tuple(_ALIASES)}), "
                         f"got {fisher_type!r}")
    return name


def fisher_passes(fisher_type, loss_type, logits, n_mc_samples=1, var=1.0,
                  classes_second=False):
    """Yield ``(nll, weight)``: scalars to backpropagate and the weight of each pass.

    The curvature of a module adds ``weight * g^T g`` for the gradient ``g`` w.r.t. its output
    in each pass. The classes (cross-entropy) or output dimensions (MSE) are the last axis of
    `logits`, or with ``classes_second`` the second of ``(N, C, d1, ...)`` cross-entropy
    logits (as torch's cross-entropy reads them); every other axis counts as examples.

    Parameters
    ----------
    fisher_type : {"fisher_mc", "fisher_exact"}
        Monte Carlo: `n_mc_samples` passes with labels drawn from the model's predictive
        distribution, each weighted ``1 / n_mc_samples`` (the average; ASDL weights each by
        ``1 / n_mc_samples**2`` when there are several). Exact: one pass per class, the
        class-``c`` negative log-likelihood of each example weighted by ``sqrt(p_c)`` (MSE: one
        pass per output dimension).
    loss_type : {"cross_entropy", "mse"}
    logits : torch.Tensor
        The model output the loss is computed from (after any indexing of the placeholder).
    n_mc_samples : int
    var : float
        Variance of the Gaussian the MSE targets are drawn from.
    classes_second : bool
        The loss is torch's own cross-entropy, which takes the classes of logits of more than
        two dimensions on their second axis.
    """
    if fisher_type == FISHER_EMP:
        return
    if classes_second and loss_type == LOSS_CROSS_ENTROPY and logits.ndim > 2:
        # A segmentation net's (N, C, H, W): taking W for the classes gave another Fisher
        # than the same loss on the logits flattened to (N * H * W, C), without a word.
        logits = logits.movedim(1, -1)
    classes = logits.shape[-1]
    flat = logits.reshape(-1, classes)
    if loss_type == LOSS_CROSS_ENTROPY:
        log_probs = F.log_softmax(flat, dim=-1)
        with torch.no_grad():
            probs = F.softmax(flat.detach(), dim=-1)
        if fisher_type == FISHER_MC:
            # torch.distributions.Categorical(probs).sample(), as ASDL calls it.
            probs = probs / probs.sum(-1, keepdim=True)
            # Rows of a non-finite output are sampled uniformly rather than refused by the
            # sampler: their NaN still reaches the curvature, which is then refused (and the
            # step skipped), as with the other Fishers.
            probs = torch.where(torch.isfinite(probs).all(-1, keepdim=True), probs,
                                1.0 / classes)
            for _ in range(n_mc_samples):
                with torch.no_grad():
                    targets = torch.multinomial(probs, 1, True).T.reshape(-1)
                yield F.nll_loss(log_probs, targets, reduction="sum"), 1.0 / n_mc_samples
        else:
            sqrt_probs = probs.sqrt()
            for c in range(classes):
                targets = torch.full((flat.shape[0],), c, dtype=torch.long, device=flat.device)
                nll = F.nll_loss(log_probs, targets, reduction="none")
                yield nll.mul(sqrt_probs[:, c]).sum(), 1.0
    else:
        if fisher_type == FISHER_MC:
            std = torch.full_like(flat, math.sqrt(var))
            for _ in range(n_mc_samples):
                with torch.no_grad():
                    targets = torch.normal(flat.detach(), std)
                yield 0.5 * F.mse_loss(flat, targets, reduction="sum"), 1.0 / n_mc_samples
        else:
            for c in range(classes):
                yield flat[:, c].sum(), 1.0
