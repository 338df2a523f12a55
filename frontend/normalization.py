"""The norms of `nn.functional` (layer, RMS, group and batch norm, SyncBatchNorm's
allreduced statistics): re-exported by frontend/functional.py."""

from __future__ import annotations

import math

import numpy as np

from .. import ir
from . import context
from .ops import _t
from .param import Param
from .tensor import Tensor


def _norm_shape(x: Tensor, shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not shape or x.shape[x.ndim - len(shape):] != shape or len(shape) > x.ndim:
        raise x.trace.error(f"input {list(x.shape)} does not end with the normalized shape "
                            f"{list(shape)}")
    return shape


def layer_norm(x, normalized_shape, gamma=None, beta=None, eps: float = 1e-5) -> Tensor:
    """Normalize over the trailing `normalized_shape` axes, * gamma + beta (`nn.layer_norm`)."""
    x = _t(x)
    t = x.trace
    shape = _norm_shape(x, normalized_shape)
    if (gamma is None) != (beta is None):
        raise ValueError("layer_norm takes both gamma and beta, or neither")
    axes = list(range(x.ndim - len(shape), x.ndim))
    params = [] if gamma is None else [t.lift(gamma), t.lift(beta)]
    return t.op("nn.layer_norm", x, *params, axes=axes, eps=float(eps), affine=bool(params))


def rsqrt(x) -> Tensor:
    """1 / sqrt(x), elementwise (torch.rsqrt)."""
    return context.current().op("ember.rsqrt", _t(x))


def rms_norm(x, normalized_shape, gamma=None, eps: float = 1e-5) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the trailing axes, * gamma (core ops)."""
    x = _t(x)
    shape = _norm_shape(x, normalized_shape)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    y = x * rsqrt((x * x).mean(axes, keepdims=True) + float(eps))
    return y if gamma is None else y * gamma


def group_norm(x, num_groups: int, gamma=None, beta=None, eps: float = 1e-5) -> Tensor:
    """Normalize [N, C, ...] over each group of C/num_groups channels (core ops)."""
    x = _t(x)
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise x.trace.error(f"group_norm: {num_groups} groups do not divide the channels of "
                            f"input {list(x.shape)}")
    n, c = x.shape[:2]
    xr = x.reshape(n, num_groups, math.prod(x.shape[1:]) // num_groups)  # no -1: n may be 0
    d = xr - xr.mean(2, keepdims=True)
    y = (d * rsqrt((d * d).mean(2, keepdims=True) + float(eps))).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if gamma is not None:
        y = y * x.trace.lift(gamma).reshape(bshape)
    if beta is not None:
        y = y + x.trace.lift(beta).reshape(bshape)
    return y


def batch_norm(x, running_mean, running_var, gamma=None, beta=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5, sync: bool = False) -> Tensor:
    """`nn.batch_norm` over channel axis 1 of (N, C), (N, C, L), (N, C, H, W) or
    (N, C, D, H, W) (a 5-d input as (N, C, D, H*W)).

    Batch statistics are used only when `training` and the trace is a training trace, or
    always when there are no running statistics (None, torch's track_running_stats=False,
    which torch refuses outside training); then running stats that are buffer Params get
    their new values (`update_buffer`).
    `sync`: the statistics of the global batch of a data-parallel run (torch's
    SyncBatchNorm), from sums allreduced across the ranks (`ember.allreduce`); in one
    process the same as without.
    """
    t = context.current()
    x = t.lift(x)
    if x.ndim not in (2, 3, 4, 5):
        raise t.error(f"batch_norm: input must be (N, C), (N, C, L), (N, C, H, W) or "
                      f"(N, C, D, H, W), got {list(x.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm takes both running_mean and running_var, or neither")
    tracked = running_mean is not None
    if not (tracked or training):
        raise ValueError("batch_norm: running_mean and running_var must be given when not "
                         "training (as torch)")
    ones = np.ones(x.shape[1], ir.numpy_dtype(x.dtype))
    g = t.lift(gamma) if gamma is not None else t.lift(ones, x.dtype)
    b = t.lift(beta) if beta is not None else t.lift(np.zeros_like(ones), x.dtype)
    mean, var = ((t.lift(running_mean), t.lift(running_var)) if tracked else
                 (t.lift(np.zeros_like(ones), x.dtype), t.lift(ones, x.dtype)))
    active = (bool(training) and t.training) or not tracked
    x4 = x if x.ndim in (2, 4) else x.reshape(*x.shape[:3], math.prod(x.shape[3:]))
    if active and sync:
        y, new_mean, new_var = _synced_batch_norm(x4, g, b, mean, var, float(momentum),
                                                  float(eps))
    else:
        y, new_mean, new_var = t.ops("nn.batch_norm", x4, g, b, mean, var, eps=float(eps),
                                     momentum=float(momentum), training=active)
    if active and tracked:
        for p, v in ((running_mean, new_mean), (running_var, new_var)):
            if isinstance(p, Param) and p.kind == "buffer":
                t.update_buffer(p, v)
    return y.reshape(x.shape) if x4 is not x else y


def _synced_batch_norm(x: Tensor, gamma: Tensor, beta: Tensor, running_mean: Tensor,
                       running_var: Tensor, momentum: float, eps: float) -> tuple:
    """Training batch norm on the global batch's statistics: the count, the sum and the
    centered sum of squares are allreduced (two passes, as `nn.batch_norm` computes them
    locally). Autodiff through `ember.allreduce` gives SyncBatchNorm's backward."""
    t = x.trace
    axes = [0, *range(2, x.ndim)]
    c = x.shape[1]
    channel = [1, c] + [1] * (x.ndim - 2)

    def allreduce(v: Tensor) -> Tensor:
        return t.op("ember.allreduce", v)

    count = allreduce(t.lift(np.array(math.prod(x.shape) // c, ir.numpy_dtype(x.dtype))))
    mean = allreduce(x.sum(axes, keepdims=True)) / count
    centered = x - mean
    var = allreduce((centered * centered).sum(axes, keepdims=True)) / count
    y = centered * rsqrt(var + eps) * gamma.reshape(*channel) + beta.reshape(*channel)
    unbiased = var * count / (count - 1.0)
    new_mean = running_mean * (1.0 - momentum) + mean.reshape(c) * momentum
    new_var = running_var * (1.0 - momentum) + unbiased.reshape(c) * momentum
    return y, new_mean, new_var
