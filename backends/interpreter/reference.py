"""The numpy reference of every op: the living definition of what an op computes."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...ir.dialects.ember import erf
from ...ir.dialects.ember_windows import sides
from ...ir.semantics import SIMPLE_OPS
from .. import collectives
from . import rng


def _log_softmax(x, axis):
    """The max starts from -inf, so that over an empty axis the result is empty, as torch's."""
    shifted = x - x.max(axis=axis, keepdims=True, initial=-np.inf)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _cross_entropy(attrs, logits, labels):
    """The mean as sum / rows (over the rows not labelled `ignore_index`, if given): over no
    rows 0/0 = NaN (as torch), without numpy's warning."""
    logp = _log_softmax(logits, 1)
    keep = labels != attrs.get("ignore_index", np.iinfo(np.int64).min)
    rows = np.nonzero(keep)[0]
    return -logp[rows, labels[rows]].sum() / len(rows)


def _allreduce(attrs, x):
    y = np.array(x, order="C")  # a copy: the reducer sums it in place
    collectives.allreduce_(y)
    return y


def _grads_ready(attrs, *grads):
    collectives.grads_ready(attrs["bucket"])
    return np.array(attrs["bucket"], np.int64)


def _one_hot(attrs, labels):
    return np.arange(attrs["num_classes"]) == labels[..., None]


def _linear(attrs, x, w, b=None):
    y = x @ w
    return y if b is None else y + b


# -- conv, pools, gather/scatter, dropout, norms, attention (computed in float64) ----------


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _windows(xp: np.ndarray, kh, kw, sh, sw, dh, dw, oh, ow) -> np.ndarray:
    """A read-only view [n, c, kh, kw, oh, ow] of the windows of padded NCHW `xp`."""
    n, c = xp.shape[:2]
    s0, s1, s2, s3 = xp.strides
    return as_strided(xp, (n, c, kh, kw, oh, ow), (s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw),
                      writeable=False)


def _pad(x: np.ndarray, ph: int, pw: int, value=0.0) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _conv_geometry(a, x_shape, w_shape):
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    kh, kw = w_shape[2:]
    oh = (x_shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (x_shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return (kh, kw, sh, sw, dh, dw, oh, ow), (ph, pw)


def _conv_cols(a, x, w_shape) -> np.ndarray:
    """im2col of x: [n, groups, c_in/groups, kh, kw, oh, ow]."""
    geo, (ph, pw) = _conv_geometry(a, x.shape, w_shape)
    cols = _windows(_pad(_f64(x), ph, pw), *geo)
    n, c = x.shape[:2]
    return cols.reshape(n, a["groups"], c // a["groups"], *cols.shape[2:])


def _conv2d(a, x, w):
    g = a["groups"]
    cols = _conv_cols(a, x, w.shape)
    wg = _f64(w).reshape(g, w.shape[0] // g, *w.shape[1:])
    y = np.einsum("ngcijhw,gocij->ngohw", cols, wg, optimize=True)
    return y.reshape(x.shape[0], w.shape[0], *y.shape[-2:])


def _conv2d_nhwc(a, x, w):
    """The NCHW conv of the channels-last operands (padded per side first), its result
    channels last again."""
    top, left, bottom, right = sides("ember.conv2d_nhwc", a["padding"])
    x = np.pad(x.transpose(0, 3, 1, 2), ((0, 0), (0, 0), (top, bottom), (left, right)))
    return _conv2d({**a, "padding": [0, 0]}, x, w.transpose(3, 2, 0, 1)).transpose(0, 2, 3, 1)


def _col2im(a, dcols: np.ndarray, x_shape) -> np.ndarray:
    """Adds window values [n, c, kh, kw, oh, ow] back into an [n, c, h, w] input (cropped)."""
    (kh, kw, sh, sw, dh, dw, oh, ow), (ph, pw) = _conv_geometry(
        a, x_shape, (0, 0) + tuple(dcols.shape[2:4]))
    n, c, h, w = x_shape
    dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                j * dw:j * dw + sw * (ow - 1) + 1:sw] += dcols[:, :, i, j]
    return dxp[:, :, ph:ph + h, pw:pw + w]


def _conv2d_grad_input(a, g, w):
    groups, x_shape = a["groups"], tuple(a["input_shape"])
    n, co, oh, ow = g.shape
    gg = _f64(g).reshape(n, groups, co // groups, oh, ow)
    wg = _f64(w).reshape(groups, co // groups, *w.shape[1:])
    dcols = np.einsum("ngohw,gocij->ngcijhw", gg, wg, optimize=True)
    return _col2im(a, dcols.reshape(n, x_shape[1], *dcols.shape[3:]), x_shape)


def _conv2d_grad_weight(a, x, g):
    groups, w_shape = a["groups"], tuple(a["weight_shape"])
    cols = _conv_cols(a, x, w_shape)
    n, co, oh, ow = g.shape
    gg = _f64(g).reshape(n, groups, co // groups, oh, ow)
    return np.einsum("ngcijhw,ngohw->gocij", cols, gg, optimize=True).reshape(w_shape)


def _pool_geometry(a, x_shape):
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    oh, ow = (x_shape[2] + 2 * ph - kh) // sh + 1, (x_shape[3] + 2 * pw - kw) // sw + 1
    return (kh, kw, sh, sw, 1, 1, oh, ow), (ph, pw)


def _pool_attrs(a):
    """Pool attributes in conv terms, for `_col2im`."""
    return {"stride": a["stride"], "padding": a["padding"], "dilation": [1, 1]}


def _max_pool2d(a, x):
    geo, (ph, pw) = _pool_geometry(a, x.shape)
    return _windows(_pad(_f64(x), ph, pw, -np.inf), *geo).max(axis=(2, 3))


def _max_pool2d_grad(a, x, g):
    """g goes to the first maximum (row-major within the window) of each window, summed."""
    geo, (ph, pw) = _pool_geometry(a, x.shape)
    kh, kw = geo[:2]
    win = _windows(_pad(_f64(x), ph, pw, -np.inf), *geo)
    n, c, _, _, oh, ow = win.shape
    first = win.reshape(n, c, kh * kw, oh, ow).argmax(axis=2)
    onehot = np.arange(kh * kw).reshape(1, 1, -1, 1, 1) == first[:, :, None]
    dcols = (onehot * _f64(g)[:, :, None]).reshape(n, c, kh, kw, oh, ow)
    return _col2im(_pool_attrs(a), dcols, x.shape)


def _avg_pool2d(a, x):
    geo, (ph, pw) = _pool_geometry(a, x.shape)
    return _windows(_pad(_f64(x), ph, pw), *geo).mean(axis=(2, 3))


def _avg_pool2d_grad(a, g):
    x_shape = tuple(a["input_shape"])
    kh, kw = a["kernel"]
    gg = _f64(g)[:, :, None, None] / (kh * kw)
    dcols = np.broadcast_to(gg, gg.shape[:2] + (kh, kw) + gg.shape[-2:])
    return _col2im(_pool_attrs(a), dcols, x_shape)


def _gather(a, table, idx):
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        raise IndexError(f"ember.gather: index {idx.min() if idx.min() < 0 else idx.max()} out "
                         f"of range for a table of {table.shape[0]} rows")
    return table[idx]


def _scatter_add(a, idx, updates):
    out = np.zeros(a["shape"], dtype=updates.dtype)
    np.add.at(out, np.asarray(idx, dtype=np.int64), updates)
    return out


def _dropout(a, x, step):
    return rng.dropout(x, float(a["p"]), a["seed"], a["key"], int(step))


def _normalize(x, axes, eps, mean=None, var=None):
    mean = x.mean(axis=axes, keepdims=True) if mean is None else mean
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True) if var is None else var
    return (x - mean) / np.sqrt(var + eps)


def _layer_norm(a, x, gamma=None, beta=None):
    y = _normalize(_f64(x), tuple(a["axes"]), a["eps"])
    return y if gamma is None else y * _f64(gamma) + _f64(beta)


def _batch_norm(a, x, gamma, beta, running_mean, running_var):
    x = _f64(x)
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    rm, rv = _f64(running_mean), _f64(running_var)
    if a["training"]:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        count = x.size // x.shape[1]
        m = a["momentum"]
        rm, rv = (1 - m) * rm + m * mean, (1 - m) * rv + m * var * count / (count - 1)
    else:
        mean, var = rm, rv
    y = _normalize(x, axes, a["eps"], mean.reshape(bshape), var.reshape(bshape))
    return y * _f64(gamma).reshape(bshape) + _f64(beta).reshape(bshape), rm, rv


def _gelu(a, x):
    x = _f64(x)
    if a["approximate"] == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _attention(a, q, k, v):
    s = _f64(q) @ np.swapaxes(_f64(k), -1, -2) * a["scale"]
    if a["causal"]:
        tq, tk = s.shape[-2:]
        s = np.where(np.arange(tk) > np.arange(tq)[:, None], -np.inf, s)
    return np.exp(_log_softmax(s, -1)) @ _f64(v)


KERNELS = {
    **SIMPLE_OPS,
    "ember.matmul": lambda a, x, y: x @ y,
    "ember.one_hot": _one_hot,
    "ember.constant": lambda a: a["value"],
    "ember.dropout": _dropout,
    "ember.gather": _gather,
    "ember.scatter_add": _scatter_add,
    "ember.conv2d": _conv2d,
    "ember.conv2d_nhwc": _conv2d_nhwc,
    "ember.conv2d_grad_input": _conv2d_grad_input,
    "ember.conv2d_grad_weight": _conv2d_grad_weight,
    "ember.max_pool2d": _max_pool2d,
    "ember.max_pool2d_grad": _max_pool2d_grad,
    "ember.avg_pool2d": _avg_pool2d,
    "ember.avg_pool2d_grad": _avg_pool2d_grad,
    "nn.linear": _linear,
    "nn.conv2d": lambda a, x, w, b=None: _conv2d(a, x, w) + (0 if b is None else
                                                            _f64(b).reshape(1, -1, 1, 1)),
    "nn.layer_norm": _layer_norm,
    "nn.batch_norm": _batch_norm,
    "nn.gelu": _gelu,
    "nn.attention": _attention,
    "nn.softmax": lambda a, x: np.exp(_log_softmax(x, a["axis"])),
    "nn.log_softmax": lambda a, x: _log_softmax(x, a["axis"]),
    "nn.cross_entropy": _cross_entropy,
    "ember.allreduce": _allreduce,
    "ember.grads_ready": _grads_ready,
}
