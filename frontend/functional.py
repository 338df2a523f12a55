"""`em.nn.functional`: stateless ops on tensors (Params and arrays accepted).

Layers call these; users may too, inside `forward` or a traced loss function. Each is
one `nn.*` or `ember.*` op where one exists, else a short composition of core ops.
Configuration errors (a bad kernel size, an unknown padding) raise ValueError naming the
value; shape errors raise `em.ShapeError` naming the module path and the shapes.
"""

from __future__ import annotations

import math

import numpy as np

from . import context
from .config import number
from .config import pair as _pair
from .param import Param
from .tensor import Tensor, axes_list


def _t(x) -> Tensor:
    return context.current().lift(x)


def _axis(axis: int, x: Tensor) -> int:
    return axes_list((axis,), x.ndim)[0]


def relu(x) -> Tensor:
    return _t(x).relu()


def sigmoid(x) -> Tensor:
    return _t(x).sigmoid()


def tanh(x) -> Tensor:
    return _t(x).tanh()


def _pair_of(a, b) -> tuple[Tensor, Tensor]:
    """Two operands of one dtype: a python scalar takes the other's (torch's promotion)."""
    if isinstance(a, (bool, int, float)):
        b = _t(b)
        return context.current().lift(a, b.dtype), b
    a = _t(a)
    return a, context.current().lift(b, a.dtype)


def maximum(a, b) -> Tensor:
    """Elementwise max, broadcast; NaN if either is NaN (torch.maximum)."""
    return context.current().op("ember.max", *_pair_of(a, b))


def minimum(a, b) -> Tensor:
    """Elementwise min, broadcast; NaN if either is NaN (torch.minimum)."""
    return context.current().op("ember.min", *_pair_of(a, b))


def where(condition, a, b) -> Tensor:
    """`a` where `condition` (a comparison's result) holds, else `b`, broadcast."""
    cond = _t(condition)
    if cond.dtype != "i1":
        raise cond.trace.error(f"where: the condition must be a boolean tensor (a "
                               f"comparison), got {cond.dtype}")
    return context.current().op("ember.select", cond, *_pair_of(a, b))


def clamp(x, min=None, max=None) -> Tensor:  # noqa: A002  (torch.clamp's names)
    """x limited to [min, max] (either may be None), as torch.clamp: max wins if min > max."""
    x = _t(x)
    if min is None and max is None:
        raise x.trace.error("clamp: give min, max or both")
    if min is not None:
        x = maximum(x, min)
    return x if max is None else minimum(x, max)


def broadcast_to(x, shape) -> Tensor:
    """x repeated (without copies in fused code) to `shape`, numpy's broadcasting rules."""
    return context.current().op("ember.broadcast", _t(x), shape=[int(d) for d in shape])


LAYOUTS = ("ember", "torch")


def linear(x, weight, bias=None, layout: str = "ember") -> Tensor:
    """x @ weight + bias (`nn.linear`). NOTE: ember's weight is [d_in, d_out] (burn's, y = x W),
    the transpose of PyTorch's [d_out, d_in]; a square PyTorch weight would be used
    transposed without any shape error, so pass `layout="torch"` for one."""
    if layout not in LAYOUTS:
        raise ValueError(f"linear: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    t = context.current()
    w = t.lift(weight)
    if layout == "torch":
        w = w.transpose(1, 0)
    operands = [t.lift(x), w] + ([] if bias is None else [t.lift(bias)])
    return t.op("nn.linear", *operands)


def softmax(x, axis: int = -1, dtype=None) -> Tensor:
    """Softmax along `axis`, computed in `dtype` when given (torch's dtype=: cast first)."""
    x = _t(x) if dtype is None else _t(x).astype(dtype)
    return x.trace.op("nn.softmax", x, axis=_axis(axis, x))


def log_softmax(x, axis: int = -1, dtype=None) -> Tensor:
    """Log-softmax along `axis`, computed in `dtype` when given (torch's dtype=)."""
    x = _t(x) if dtype is None else _t(x).astype(dtype)
    return x.trace.op("nn.log_softmax", x, axis=_axis(axis, x))



# -- activations ------------------------------------------------------------------------------

def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    x = _t(x)
    return x.trace.op("ember.select", x > 0, x, x * negative_slope)


def gelu(x, approximate: str = "none") -> Tensor:
    """x * Phi(x): exact (`"none"`, with erf) or the `"tanh"` approximation (`nn.gelu`)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    x = _t(x)
    return x.trace.op("nn.gelu", x, approximate=approximate)


def silu(x) -> Tensor:
    x = _t(x)
    return x * x.sigmoid()


def softplus(x, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold, as PyTorch's: one
    primitive (`ember.softplus`), so it stays stable where exp(beta x) overflows."""
    x = _t(x)
    return x.trace.op("ember.softplus", x, beta=float(beta), threshold=float(threshold))


def erf(x) -> Tensor:
    x = _t(x)
    return x.trace.op("ember.erf", x)


# -- convolutions and pools -------------------------------------------------------------------

def conv_padding(padding, kernel: tuple[int, int], stride: tuple[int, int],
                 dilation: tuple[int, int]) -> tuple[int, int]:
    """Explicit symmetric padding from an int, a pair, "valid" or "same"."""
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        if stride != (1, 1):
            raise ValueError(f"padding='same' needs stride 1, got stride {stride}")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        if any(t % 2 for t in total):
            raise ValueError(f"padding='same' needs an odd effective kernel (dilation*(k-1) "
                             f"even); kernel {kernel} with dilation {dilation} would need "
                             "uneven padding")
        return (total[0] // 2, total[1] // 2)
    if isinstance(padding, str):
        raise ValueError(f"padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
    return _pair("padding", padding, lo=0)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """NCHW convolution, weight [c_out, c_in/groups, kh, kw] (`nn.conv2d`)."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    if w.ndim != 4:
        raise t.error(f"conv2d: weight must be [c_out, c_in/groups, kh, kw], got {list(w.shape)}")
    stride, dilation = _pair("stride", stride), _pair("dilation", dilation)
    pad = conv_padding(padding, w.shape[2:], stride, dilation)
    operands = [x, w] + ([] if bias is None else [t.lift(bias)])
    return t.op("nn.conv2d", *operands, stride=list(stride), padding=list(pad),
                dilation=list(dilation), groups=groups)


def conv1d(x, weight, bias=None, stride: int = 1, padding=0, dilation: int = 1,
           groups: int = 1) -> Tensor:
    """NCL convolution, weight [c_out, c_in/groups, k]: conv2d with H = 1."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    if x.ndim != 3 or w.ndim != 3:
        raise t.error(f"conv1d: input {list(x.shape)} and weight {list(w.shape)} must be "
                      "[N, C, L] and [c_out, c_in/groups, k]")
    pad = padding if isinstance(padding, str) else (0, _pair("padding", padding, lo=0)[0])
    y = conv2d(x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]),
               w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), bias,
               (1, _pair("stride", stride)[0]), pad, (1, _pair("dilation", dilation)[0]), groups)
    return y.reshape(y.shape[0], y.shape[1], y.shape[3])


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    """The transpose of conv2d (PyTorch's weight layout [c_in, c_out/groups, kh, kw])."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    stride, dilation = _pair("stride", stride), _pair("dilation", dilation)
    pad, out_pad = _pair("padding", padding, lo=0), _pair("output_padding", output_padding, 0)
    if any(o >= s for o, s in zip(out_pad, stride)):
        raise ValueError(f"output_padding {out_pad} must be smaller than stride {stride}")
    if x.ndim != 4 or w.ndim != 4:
        raise t.error(f"conv_transpose2d: input {list(x.shape)} and weight {list(w.shape)} "
                      "must be [N, C, H, W] and [c_in, c_out/groups, kh, kw]")
    n, _, h, wd = x.shape
    out = [(size - 1) * s - 2 * p + d * (k - 1) + o + 1 for size, s, p, d, k, o in
           zip((h, wd), stride, pad, dilation, w.shape[2:], out_pad)]
    y = t.op("ember.conv2d_grad_input", x, w, stride=list(stride), padding=list(pad),
             dilation=list(dilation), groups=groups,
             input_shape=[n, w.shape[1] * groups, *out])
    return y if bias is None else y + t.lift(bias).reshape(1, -1, 1, 1)


def _pool(name: str, x, kernel_size, stride, padding) -> Tensor:
    x = _t(x)
    kernel = _pair("kernel_size", kernel_size)
    stride = kernel if stride is None else _pair("stride", stride)
    return x.trace.op(name, x, kernel=list(kernel), stride=list(stride),
                      padding=list(_pair("padding", padding, lo=0)))


def max_pool2d(x, kernel_size, stride=None, padding=0) -> Tensor:
    """Max over windows of NCHW x (stride defaults to the kernel); padding never wins."""
    return _pool("ember.max_pool2d", x, kernel_size, stride, padding)


def avg_pool2d(x, kernel_size, stride=None, padding=0) -> Tensor:
    """Mean over windows of NCHW x; zero padding is counted (PyTorch's count_include_pad)."""
    return _pool("ember.avg_pool2d", x, kernel_size, stride, padding)


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """[out, size]: row i averages x[floor(i*size/out) : ceil((i+1)*size/out)] (PyTorch's)."""
    m = np.zeros((out, size))
    for i in range(out):
        lo, hi = (i * size) // out, -(-(i + 1) * size // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def adaptive_avg_pool2d(x, output_size) -> Tensor:
    """Mean over PyTorch's adaptive windows: one avg_pool2d when the sizes divide, else two
    constant averaging matmuls."""
    x = _t(x)
    oh, ow = _pair("output_size", output_size)
    if x.ndim != 4:
        raise x.trace.error(f"adaptive_avg_pool2d: input must be NCHW, got {list(x.shape)}")
    if 0 in x.shape[1:]:  # no window to average (torch's check too)
        raise x.trace.error(f"adaptive_avg_pool2d: input {list(x.shape)} is empty in a "
                            "non-batch dimension")
    h, w = x.shape[2:]
    if h % oh == 0 and w % ow == 0:
        return avg_pool2d(x, (h // oh, w // ow))
    dtype = np.dtype("f8") if x.dtype == "f64" else np.dtype("f4")
    ph, pw = (_adaptive_matrix(n, o).astype(dtype) for n, o in ((h, oh), (w, ow)))
    return x.trace.lift(ph, x.dtype) @ (x @ x.trace.lift(pw.T, x.dtype))


def flatten(x, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    x = _t(x)
    a, b = axes_list((start_dim, end_dim), x.ndim)
    if not 0 <= a <= b < x.ndim:
        raise x.trace.error(f"flatten: dims {start_dim}..{end_dim} do not fit {list(x.shape)}")
    return x.reshape(*x.shape[:a], math.prod(x.shape[a:b + 1]), *x.shape[b + 1:])


# -- normalization ------------------------------------------------------------------------

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
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """`nn.batch_norm` over channel axis 1 of (N, C), (N, C, L) or (N, C, H, W).

    Batch statistics are used only when `training` and the trace is a training trace;
    then running stats that are buffer Params get their new values (`update_buffer`).
    """
    t = context.current()
    x = t.lift(x)
    if x.ndim not in (2, 3, 4):
        raise t.error(f"batch_norm: input must be (N, C), (N, C, L) or (N, C, H, W), got "
                      f"{list(x.shape)}")
    ones = np.ones(x.shape[1], dtype=np.float64 if x.dtype == "f64" else np.float32)
    g = t.lift(gamma) if gamma is not None else t.lift(ones, x.dtype)
    b = t.lift(beta) if beta is not None else t.lift(np.zeros_like(ones), x.dtype)
    active = bool(training) and t.training
    x4 = x.reshape(*x.shape, 1) if x.ndim == 3 else x
    y, new_mean, new_var = t.ops("nn.batch_norm", x4, g, b, t.lift(running_mean),
                                 t.lift(running_var), eps=float(eps), momentum=float(momentum),
                                 training=active)
    if active:
        for p, v in ((running_mean, new_mean), (running_var, new_var)):
            if isinstance(p, Param) and p.kind == "buffer":
                t.update_buffer(p, v)
    return y.reshape(x.shape) if x.ndim == 3 else y


# -- dropout, embedding, attention ----------------------------------------------------------

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


def scaled_dot_product_attention(q, k, v, causal: bool = False, scale: float | None = None
                                 ) -> Tensor:
    """softmax(q k^T * scale + causal mask) v on [..., T, d] (`nn.attention`); scale
    defaults to 1/sqrt(d)."""
    t = context.current()
    q, k, v = t.lift(q), t.lift(k), t.lift(v)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return t.op("nn.attention", q, k, v, causal=bool(causal), scale=scale)


def multi_head_attention(query, key, value, num_heads: int, q_weight, k_weight, v_weight,
                         out_weight, q_bias=None, k_bias=None, v_bias=None, out_bias=None,
                         causal: bool = False) -> Tensor:
    """[B, T, D] inputs projected (weights [D, D]), split into heads, attended, merged and
    projected out."""
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
    y = scaled_dot_product_attention(q, k, v, causal)
    bsz, _, n, dh = y.shape
    return linear(y.transpose(0, 2, 1, 3).reshape(bsz, n, num_heads * dh), out_weight, out_bias)


# -- losses ----------------------------------------------------------------------------

def _labels(logits: Tensor, labels: Tensor, what: str) -> None:
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise logits.trace.error(f"{what}: input {list(logits.shape)} and target "
                                 f"{list(labels.shape)} disagree (want [N, C] and [N])")


def _one_hot(labels: Tensor, num_classes: int, dtype: str) -> Tensor:
    return labels.trace.op("ember.one_hot", labels, num_classes=num_classes, dtype=dtype)


REDUCTIONS = ("mean", "sum", "none")


def _reduced(losses: Tensor, reduction: str, weights: Tensor | None = None) -> Tensor:
    """Per-sample `losses` as `reduction` asks (torch's names); with per-sample `weights`
    the mean is the weighted mean, sum(w l) / sum(w), as torch's class weights give."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if weights is not None:
        losses = losses * weights
    if reduction == "none":
        return losses
    if reduction == "sum" or weights is None:
        return losses.sum() if reduction == "sum" else losses.mean()
    return losses.sum() / weights.sum()


def _class_weights(weight, labels_one_hot: Tensor) -> Tensor | None:
    """Each sample's class weight (weight[target[i]]), from a [C] tensor or array."""
    if weight is None:
        return None
    w = _t(weight)
    c = labels_one_hot.shape[1]
    if w.shape != (c,):
        raise w.trace.error(f"weight must have one value per class, [{c}], got {list(w.shape)}")
    return (labels_one_hot * w).sum(1)


def cross_entropy(logits, target, label_smoothing: float = 0.0, weight=None,
                  reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits [N, C] against integer labels [N] or class probabilities
    [N, C], with PyTorch's label smoothing, class `weight` [C] (integer labels) and
    `reduction` ("mean", "sum", "none")."""
    logits, target = _t(logits), _t(target)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    integer = target.dtype in ("i32", "i64")
    if integer and label_smoothing == 0 and weight is None and reduction == "mean":
        return logits.trace.op("nn.cross_entropy", logits, target)
    weights = None
    if integer:
        _labels(logits, target, "cross_entropy")
        target = _one_hot(target, logits.shape[1], logits.dtype)
        weights = _class_weights(weight, target)
    elif target.shape != logits.shape or logits.ndim != 2:
        raise logits.trace.error(f"cross_entropy: logits {list(logits.shape)} and target "
                                 f"probabilities {list(target.shape)} disagree (want [N, C])")
    if weight is not None and (not integer or label_smoothing):
        raise logits.trace.error("cross_entropy: weight= is supported for integer labels "
                                 "without label smoothing")
    if label_smoothing:
        target = target * (1.0 - label_smoothing) + label_smoothing / logits.shape[1]
    return _reduced(-(target * log_softmax(logits, 1)).sum(1), reduction, weights)


def nll_loss(log_probs, target, weight=None, reduction: str = "mean") -> Tensor:
    """-log_probs[i, target[i]] over log-probabilities [N, C] and labels [N], with class
    `weight` [C] and `reduction` as torch's."""
    log_probs, target = _t(log_probs), _t(target)
    _labels(log_probs, target, "nll_loss")
    hot = _one_hot(target, log_probs.shape[1], log_probs.dtype)
    return _reduced(-(hot * log_probs).sum(1), reduction, _class_weights(weight, hot))


def mse_loss(a, b, reduction: str = "mean") -> Tensor:
    """The squared difference, reduced as torch's `reduction` says."""
    d = _t(a) - _t(b)
    return _reduced(d * d, reduction)


def binary_cross_entropy_with_logits(logits, target, pos_weight=None,
                                     reduction: str = "mean") -> Tensor:
    """max(x, 0) - x*t + log(1 + exp(-|x|)), stable for any logit; with `pos_weight` (per
    class, broadcast over the last axis) the positive term is weighted, as torch's:
    (1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)."""
    x, y = _t(logits), _t(target)
    if pos_weight is None:
        return _reduced(x.relu() - x * y + (1.0 + (-x.abs()).exp()).log(), reduction)
    log_weight = (_t(pos_weight) - 1.0) * y + 1.0
    return _reduced((1.0 - y) * x + log_weight * softplus(-x), reduction)


__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "binary_cross_entropy_with_logits",
           "broadcast_to", "clamp", "conv1d", "conv2d", "conv_transpose2d", "cross_entropy",
           "dropout", "embedding", "erf", "flatten", "gelu", "group_norm", "layer_norm",
           "leaky_relu", "linear", "log_softmax", "max_pool2d", "maximum", "minimum", "mse_loss",
           "multi_head_attention", "nll_loss", "relu", "rms_norm", "rsqrt",
           "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "softplus", "tanh",
           "where"]
