"""`em.nn.functional`: stateless ops on tensors (Params and arrays accepted).

Layers call these; users may too, inside `forward` or a traced loss function. Each is
one `nn.*` or `ember.*` op where one exists, else a short composition of core ops.
Configuration errors (a bad kernel size, an unknown padding) raise ValueError naming the
value; shape errors raise `em.ShapeError` naming the module path and the shapes.

This module holds flatten, dropout, embedding and attention; the elementwise and row-wise
ops live in ops.py, the convolutions in convolution.py, the pools in pooling.py, padding in
windows.py, the norms in normalization.py and the losses in losses.py, re-exported here.
"""

from __future__ import annotations

import math

import numpy as np

from . import context
from .config import number
from .convolution import (  # nn.functional's convolutions
    conv1d,
    conv2d,
    conv3d,
    conv_transpose2d,
    conv_transpose3d,
)
from .losses import (  # nn.functional's losses
    binary_cross_entropy_with_logits,
    cross_entropy,
    mse_loss,
    nll_loss,
)
from .normalization import (  # and the norms
    batch_norm,
    group_norm,
    layer_norm,
    rms_norm,
    rsqrt,
)
from .ops import (  # and elementwise ops
    _t,
    add,
    broadcast_to,
    clamp,
    div,
    erf,
    gelu,
    hardsigmoid,
    hardswish,
    leaky_relu,
    linear,
    log_softmax,
    maximum,
    minimum,
    relu,
    sigmoid,
    sign,
    silu,
    softmax,
    softplus,
    sub,
    tanh,
    where,
)
from .pooling import (  # and pools
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool2d,
    max_pool3d,
)
from .resize import interpolate  # nn.functional.interpolate
from .tensor import Tensor, axes_list
from .windows import pad  # nn.functional.pad

# -- reshaping, dropout, embedding, attention ------------------------------------------------

def flatten(x, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    x = _t(x)
    a, b = axes_list((start_dim, end_dim), x.ndim)
    if not 0 <= a <= b < x.ndim:
        raise x.trace.error(f"flatten: dims {start_dim}..{end_dim} do not fit {list(x.shape)}")
    return x.reshape(*x.shape[:a], math.prod(x.shape[a:b + 1]), *x.shape[b + 1:])


def check_dropout_p(p) -> float:
    return number("dropout probability p", p, 0, 1)


def dropout(x, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p), only when
    `training` and the trace is a training trace (`ember.dropout`, counter-based RNG)."""
    p = check_dropout_p(p)
    t = context.current()
    x = t.lift(x)
    if not (training and t.training) or p == 0:
        return x
    if p == 1:  # every element dropped (torch's p=1), with no 1/(1-p) to scale by
        return x * 0.0
    return t.op("ember.dropout", x, t.rng(), p=p, seed=t.seed, key=t.next_key())


def embedding(indices, weight) -> Tensor:
    """Rows of weight [num, d] at integer `indices`: shape indices.shape + [d] (`ember.gather`)."""
    t = context.current()
    return t.op("ember.gather", t.lift(weight), t.lift(indices), axis=0)


def _broadcast(*shapes) -> tuple[int, ...] | None:
    """numpy's broadcast of `shapes`, None where they do not broadcast."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None


def _same_batch(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] with their leading dims broadcast to
    one shape (torch's SDPA lets [H, T, d] queries meet [B, H, T, d] keys)."""
    batch = _broadcast(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if min(q.ndim, k.ndim, v.ndim) < 2 or batch is None:
        raise q.trace.error(f"attention: q {list(q.shape)}, k {list(k.shape)} and v "
                            f"{list(v.shape)} must be [..., T, d] with leading dims that "
                            "broadcast")
    return tuple(x if x.shape[:-2] == batch else broadcast_to(x, batch + x.shape[-2:])
                 for x in (q, k, v))


def _masked_scores(s: Tensor, mask: Tensor) -> Tensor:
    """Scores with torch SDPA's `attn_mask`: a bool mask keeps where True (-inf elsewhere),
    a float mask is added; it broadcasts to the scores [..., Tq, Tk]."""
    if _broadcast(mask.shape, s.shape) != s.shape:
        raise s.trace.error(f"attention: attn_mask {list(mask.shape)} does not broadcast to "
                            f"the scores [..., Tq, Tk] {list(s.shape)}")
    return where(mask, s, -math.inf) if mask.dtype == "i1" else s + mask


def scaled_dot_product_attention(q, k, v, causal: bool = False, scale: float | None = None,
                                 attn_mask=None) -> Tensor:
    """softmax(q k^T * scale + mask) v on [..., T, d], leading dims broadcast (`nn.attention`;
    with `attn_mask`, torch SDPA's: bool True = attend, or float added, composed of core
    ops); scale defaults to 1/sqrt(d)."""
    t = context.current()
    q, k, v = _same_batch(t.lift(q), t.lift(k), t.lift(v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if attn_mask is None:
        return t.op("nn.attention", q, k, v, causal=bool(causal), scale=scale)
    if causal:
        raise ValueError("scaled_dot_product_attention: give attn_mask or causal, not both "
                         "(as torch)")
    s = (q @ k.mT) * scale
    return softmax(_masked_scores(s, t.lift(attn_mask)), -1) @ v


def multi_head_attention(query, key, value, num_heads: int, q_weight, k_weight, v_weight,
                         out_weight, q_bias=None, k_bias=None, v_bias=None, out_bias=None,
                         causal: bool = False, attn_mask=None) -> Tensor:
    """[B, T, D] inputs projected (weights [D, D]), split into heads, attended, merged and
    projected out. `attn_mask` broadcasts to [B, heads, Tq, Tk] with torch SDPA's meaning
    (bool True = attend), NOT torch.nn.MultiheadAttention's (True = masked out)."""
    t = context.current()
    query, key, value = t.lift(query), t.lift(key), t.lift(value)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.ndim != 3:
            raise t.error(f"multi_head_attention: {name} must be [B, T, D], got {list(x.shape)}")

    def heads(x, w, b):
        y = linear(x, w, b)
        bsz, n, d = y.shape
        if d % num_heads:
            raise t.error(f"multi_head_attention: {num_heads} heads do not divide width {d}")
        return y.reshape(bsz, n, num_heads, d // num_heads).transpose(0, 2, 1, 3)

    q, k, v = heads(query, q_weight, q_bias), heads(key, k_weight, k_bias), heads(value,
                                                                                   v_weight,
                                                                                   v_bias)
    y = scaled_dot_product_attention(q, k, v, causal, attn_mask=attn_mask)
    bsz, _, n, dh = y.shape
    return linear(y.transpose(0, 2, 1, 3).reshape(bsz, n, num_heads * dh), out_weight, out_bias)

__all__ = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "add",
           "avg_pool1d", "avg_pool2d", "avg_pool3d", "batch_norm",
           "binary_cross_entropy_with_logits", "broadcast_to", "clamp", "conv1d", "conv2d",
           "conv3d", "conv_transpose2d", "conv_transpose3d", "cross_entropy", "div", "dropout",
           "embedding", "erf", "flatten", "gelu", "group_norm", "hardsigmoid", "hardswish",
           "interpolate", "layer_norm", "leaky_relu", "linear", "log_softmax", "max_pool1d",
           "max_pool2d", "max_pool3d", "maximum", "minimum", "mse_loss",
           "multi_head_attention", "nll_loss", "pad", "relu", "rms_norm", "rsqrt",
           "scaled_dot_product_attention", "sigmoid", "sign", "silu", "softmax", "softplus", "sub",
           "tanh", "where"]
