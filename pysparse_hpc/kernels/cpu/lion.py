"""Lion's update on the CPU, one pass over a parameter's flat arrays (`pysparse_hpc.optim`).

Lion written as tensor operations (``lion-pytorch``, and this package's fallback) passes over
the parameter, its momentum and its gradient five times and allocates the direction; here each
coordinate is read and written once. The arithmetic is torch's, operation for operation, so
the results are the same bits: a product, then a fused multiply-add where torch adds a scaled
tensor (``a.add(b, alpha=s)`` is ``fma(b, s, a)`` in torch's vectorised CPU kernels), with the
scalars rounded to the arrays' dtype first as torch rounds them.

Serial kernels: a pass over a million coordinates takes under a millisecond, and a parallel
region's start-up is not worth it at that size. Inputs are trusted (`pysparse_hpc.optim.lion`
checks dtypes, devices and layouts and falls back to tensor operations).
"""
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["fused_multiply_add", "lion_step"]

_JIT = dict(cache=True, nogil=True)


@intrinsic
def fused_multiply_add(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's ``fma``), for three floats of one type."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return a(a, b, c), codegen


@njit(**_JIT)
def lion_step(param, momentum, grad, decay, neg_lr, beta1, rest1, beta2, rest2):
    """One Lion step in place: ``p <- p * decay - lr * sign(beta1 m + rest1 g)``,
    ``m <- beta2 m + rest2 g`` (``rest = 1 - beta``, ``neg_lr = -lr``)."""
    for i in range(param.size):
        m = momentum[i]
        g = grad[i]
        interpolated = fused_multiply_add(g, rest1, m * beta1)
        direction = np.sign(interpolated)
        if not (interpolated > 0 or interpolated < 0):
            # NaN and both zeros: torch.sign (and so lion-pytorch) gives +0.0, no move, where
            # np.sign keeps -0.0, which turned a parameter of -0.0 into +0.0.
            direction = rest1 - rest1
        param[i] = fused_multiply_add(direction, neg_lr, param[i] * decay)
        momentum[i] = fused_multiply_add(g, rest2, m * beta2)
