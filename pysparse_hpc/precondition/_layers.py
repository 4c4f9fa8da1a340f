"""The module classes the makers precondition, and what they need from them.

This module owns which leaf modules have a curvature (``nn.Linear``, ``nn.Conv2d`` with dilation
1, groups 1 and zero padding, or any padding mode where nothing is padded, ``nn.Embedding`` with
dense gradients), the refusal, with the reason, of the configurations that cannot be handled,
and the im2col of a convolution's input.
"""
import torch.nn.functional as F
from torch import nn

__all__ = ["conv2d_patch_columns", "conv2d_patches", "supported_kind"]


def _pads(module):
    """What `module` (an ``nn.Conv2d``) pads its input by: ``[left, right, top, bottom]``;
    ``padding="same"`` puts the odd one on the right and the bottom, as torch does."""
    padding = module.padding
    if isinstance(padding, str):
        if padding != "same":
            return [0, 0, 0, 0]
        pads = []
        for k, d in zip(reversed(module.kernel_size), reversed(module.dilation)):
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        return pads
    return [padding[1], padding[1], padding[0], padding[0]]


def _patch_view(module, x):
    """The im2col patches of `module`'s input `x` as a strided view of the padded input,
    ``n x c_in x kh x kw x h_out x w_out``: copying it once into the layout a product needs
    is several times faster than ``F.unfold`` followed by the transposing copy."""
    if x.ndim == 3:
        x = x.unsqueeze(0)
    kh, kw = module.kernel_size
    pads = _pads(module)
    if any(pads):
        x = F.pad(x, pads)
    sh, sw = module.stride
    n, c, height, width = x.shape
    h_out, w_out = (height - kh) // sh + 1, (width - kw) // sw + 1
    s_n, s_c, s_h, s_w = x.stride()
    return x.as_strided((n, c, kh, kw, h_out, w_out),
                        (s_n, s_c, s_h, s_w, s_h * sh, s_w * sw), x.storage_offset())


def conv2d_patches(module, x):
    """im2col of the input `x` of `module` (an ``nn.Conv2d``, dilation 1, groups 1).

    Returns ``n x (c_in kh kw) x L`` (``L`` output positions; an unbatched input counts as one
    example), in the order of ``module.weight.view(c_out, -1)``'s columns.
    """
    view = _patch_view(module, x)
    n, c, kh, kw, h_out, w_out = view.shape
    return view.reshape(n, c * kh * kw, h_out * w_out)


def conv2d_patch_columns(module, x):
    """The patches of `conv2d_patches` as the columns of one matrix,
    ``(c_in kh kw) x (n L)``, and ``L``."""
    view = _patch_view(module, x)
    n, c, kh, kw, h_out, w_out = view.shape
    return (view.permute(1, 2, 3, 0, 4, 5).reshape(c * kh * kw, n * h_out * w_out),
            h_out * w_out)


def supported_kind(name, module):
    """``"Linear"``, ``"Conv2d"``, ``"Embedding"`` or None; refuses what cannot be handled.

    Raises ``NotImplementedError`` for an ``nn.Conv2d`` with dilation, groups or a non-zero
    padding of another mode than zeros, and for an ``nn.Embedding`` with sparse gradients or
    gradients scaled by frequency.
    """
    if isinstance(module, nn.Conv2d):
        problems = []
        if tuple(module.dilation) != (1, 1):
            problems.append(f"dilation={tuple(module.dilation)}")
        if module.groups != 1:
            problems.append(f"groups={module.groups}")
        # A padding mode changes nothing where nothing is padded (torch's pad of zero width
        # before the convolution), so only a non-zero padding must be of zeros.
        if module.padding_mode != "zeros" and any(_pads(module)):
            problems.append(f"padding_mode={module.padding_mode!r}")
        if problems:
            raise NotImplementedError(
                f"nn.Conv2d is supported with dilation 1, groups 1 and zero padding; module "
                f"{name!r} has {', '.join(problems)} (add it to "
                f"PreconditioningConfig.ignore_modules to keep its plain gradient)")
        return "Conv2d"
    if isinstance(module, nn.Linear):
        return "Linear"
    if isinstance(module, nn.Embedding):
        if module.sparse:
            raise NotImplementedError(
                f"preconditioning needs dense gradients; module {name!r} is "
                f"nn.Embedding(sparse=True) (add it to PreconditioningConfig.ignore_modules to "
                f"keep its plain gradient)")
        if module.scale_grad_by_freq:
            # Its gradient divides each row by that token's count in the batch, which the
            # captured inputs and output gradients (the curvature) know nothing of: the two
            # would not belong together.
            raise NotImplementedError(
                f"module {name!r} is nn.Embedding(scale_grad_by_freq=True), whose gradient is "
                f"scaled by each token's count in the batch and so no longer matches its "
                f"curvature (add it to PreconditioningConfig.ignore_modules to keep its plain "
                f"gradient)")
        return "Embedding"
    return None
