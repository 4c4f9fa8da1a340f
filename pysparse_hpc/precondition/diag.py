"""The diagonal Fisher: `DiagNaturalGradientMaker` (ASDL's), on the same machinery as K-FAC.

This module owns the per-parameter diagonal of the Fisher of ``nn.Linear``, ``nn.Conv2d`` and
``nn.Embedding`` and the maker that preconditions with it: ``grad / (diag + damping)``. The
diagonal is the sum of squared per-example gradients, scaled by ``scale / data_size``:

* ``nn.Linear``: ``(D*D)^T (X*X)`` for the weight, ``sum D*D`` for the bias, every row of the
  input and of the output gradient an example (as in ASDL);
* ``nn.Conv2d``: the per-example gradients ``D_n P_n^T`` (summed over positions) squared
  (for the weight, ASDL switches to squares per position, another quantity, when that needs
  less memory: ``L (c_out + c_in kh kw) < c_out c_in kh kw`` for ``L`` output positions; this
  module does not); the bias's ``(sum_l D_n)^2``;
* ``nn.Embedding``: each token's output gradient squared, added to its row (per token, as in
  ASDL); the padding row stays zero.

It costs one elementwise product per parameter to apply, against two matrix products for
K-FAC, and a forward input kept per module during curvature passes.
"""
import torch

from ._layers import conv2d_patches, supported_kind
from ._natural import NaturalGradientMaker, in_curvature_dtype

__all__ = ["DiagNaturalGradientMaker"]


def _trainable(module, key):
    param = getattr(module, key, None)
    return isinstance(param, torch.Tensor) and param.requires_grad


def _linear_diagonal(module, x, grad):
    x = x.reshape(-1, x.shape[-1])
    grad = grad.reshape(-1, grad.shape[-1])
    squares = grad.square()
    out = {"weight": squares.T.mm(x.square())}
    if _trainable(module, "bias"):
        out["bias"] = squares.sum(0)
    return out


def _conv2d_diagonal(module, x, grad):
    patches = conv2d_patches(module, x)  # n x ckk x L
    # Sizes spelled out, not -1: a rank holding no examples has an empty gradient.
    grad = grad.reshape(patches.shape[0], grad.shape[-3], patches.shape[2])  # n x c_out x L
    per_example = torch.bmm(grad, patches.transpose(1, 2))  # n x c_out x ckk
    out = {"weight": per_example.square().sum(0).view_as(module.weight)}
    if _trainable(module, "bias"):
        out["bias"] = grad.sum(2).square().sum(0)
    return out


def _embedding_diagonal(module, x, grad):
    index = x.reshape(-1)
    squares = grad.reshape(-1, grad.shape[-1]).square()
    # In the squares' dtype (the curvature's: float32 for a half-precision table), not the
    # weight's, which index_add_ refuses to mix.
    weight = torch.zeros(module.weight.shape, dtype=squares.dtype,
                         device=squares.device).index_add_(0, index, squares)
    if module.padding_idx is not None:
        weight[module.padding_idx] = 0
    return {"weight": weight}


_DIAGONALS = {"Linear": _linear_diagonal, "Conv2d": _conv2d_diagonal,
              "Embedding": _embedding_diagonal}


class DiagNaturalGradientMaker(NaturalGradientMaker):
    """Diagonal-Fisher preconditioned gradients (ASDL's ``DiagNaturalGradientMaker``).

    The same modules, loop, Fisher types, schedules, moving average, checks and state as
    `KfacGradientMaker`; the curvature of a parameter is its diagonal Fisher (see the module
    docstring) and the preconditioned gradient ``grad / (diag + damping)``. ASDL also gives
    normalization layers a diagonal; here they keep the plain gradient.

    Parameters
    ----------
    model, config, fisher_type, loss_type, scale, grad_scale, n_mc_samples, var, seed
        As for `KfacGradientMaker`.
    kl_clip, lr, check_finite, comm, strategy
        As for `KfacGradientMaker`.

    Examples
    --------
    >>> import torch, torch.nn.functional as F
    >>> from pysparse_hpc.precondition import DiagNaturalGradientMaker, PreconditioningConfig
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> gm = DiagNaturalGradientMaker(model, PreconditioningConfig(data_size=16, damping=1e-3),
    ...                               fisher_type="fisher_emp")
    >>> dy = gm.setup_model_call(model, torch.randn(16, 4))
    >>> gm.setup_loss_call(F.cross_entropy, dy, torch.randint(0, 3, (16,)))
    >>> sorted(gm.factors("0"))
    []
    >>> y, loss = gm.forward_and_backward()
    >>> sorted(gm.factors("0"))
    ['bias', 'bias_inv', 'weight', 'weight_inv']
    """

    def _kind_for(self, name, module):
        return supported_kind(name, module)

    # The diagonals are kept in the curvature's dtype, float32 for half-precision weights:
    # in float16 1 / (0 + damping) overflows at the default damping (1e-7).
    def _on_input(self, name, module, x):
        return in_curvature_dtype(x, self._weight_dtypes[name])

    def _on_output_grad(self, name, module, grad, weight, context):
        grad = in_curvature_dtype(grad, self._weight_dtypes[name])
        contribution = _DIAGONALS[self._modules[name][1]](module, context, grad)
        for key, value in contribution.items():
            if weight != 1.0:
                value.mul_(weight)
            self._add_pending(name, key, value)

    def _complete(self, entry):
        return "weight" in entry

    def _invert(self, names, once=False):
        damping = self.config.damping
        for name in names:
            state = self._factors[name]
            for key in ("weight", "bias"):
                if key in state:
                    state[key + "_inv"] = torch.reciprocal(state[key] + damping)

    def _precondition_modules(self, names):
        with torch.no_grad():
            for name in names:
                module = self._modules[name][0]
                state = self._factors[name]
                results = []
                for key in ("weight", "bias"):
                    param = getattr(module, key, None)
                    if not isinstance(param, torch.Tensor) or param.grad is None:
                        continue
                    if self.grad_scale != 1.0:
                        param.grad.mul_(self.grad_scale)
                    if key + "_inv" in state:
                        results.append((param.grad, param.grad.mul(state[key + "_inv"])))
                # A module without a diagonal yet keeps the plain gradient, which the kl_clip
                # scaling must then leave alone, as K-FAC's does for a module without inverses.
                if results:
                    self._write_preconditioned(name, results)

    def factors(self, name):
        """The stored diagonals of module `name`: ``weight``, ``bias`` and their ``*_inv``.

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

    def _loadable_shapes(self, name):
        # A bias frozen since the state was saved (gradual freezing) left its diagonal in the
        # state, kept and unused as in the run that saved it: it loads whether the bias trains
        # now or not.
        shapes = self._expected_shapes(name)
        bias = getattr(self._modules[name][0], "bias", None)
        if isinstance(bias, torch.Tensor):
            shapes.update(bias=tuple(bias.shape), bias_inv=tuple(bias.shape))
        return shapes

    def _expected_shapes(self, name):
        module = self._modules[name][0]
        shapes = {"weight": tuple(module.weight.shape)}
        if _trainable(module, "bias"):
            shapes["bias"] = tuple(module.bias.shape)
        shapes.update({key + "_inv": shape for key, shape in list(shapes.items())})
        return shapes
