"""The ONNX op table: for each op ember imports, the attributes it understands, which of its
inputs must be known at import time (shapes, axes, pads: `static`, read as numpy arrays),
which are running statistics (`buffers`), a check of attribute values, and its lowering onto
ember's functional API, `lower(node, *inputs)` (a Tensor, or a tuple for several outputs).

A node whose inputs are all known at import is not lowered but folded with numpy (see
onnx_import.fold), so shape arithmetic needs no entry here.

The table itself (`RULES`, `rule`, `problems`) is interop/onnx_rules.py's; this module holds
the core ops, interop/onnx_ops_logic.py the logic and arithmetic extras (And, Mod, TopK,
Einsum, ...), interop/onnx_ops_index.py GatherElements/GatherND/Scatter* and sequences,
with `NUMPY_FOLDS`, interop/onnx_ops_resize.py Resize; importing this module registers them
all.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..frontend import functional as F
from ..frontend.tensor import Tensor
from ..ir import numpy_dtype
from . import onnx_ops_index, onnx_ops_logic, onnx_ops_resize  # noqa: F401  (rules join RULES)
from .onnx_lower import concat, gather, pad, slice_axes, tensor
from .onnx_ops_index import NUMPY_FOLDS
from .onnx_read import Node
from .onnx_rules import DTYPES, RULES, Rule, attr, problems, rule
from .onnx_rules import fail as _fail
from .onnx_rules import ints as _ints
from .onnx_rules import norm_axis as _axis

__all__ = ["DTYPES", "NUMPY_FOLDS", "RULES", "Rule", "attr", "problems", "rule"]

# -- elementwise ------------------------------------------------------------------------

UNARY = {"Neg": "ember.neg", "Abs": "ember.abs", "Erf": "ember.erf", "Sqrt": "ember.sqrt",
         "Exp": "ember.exp", "Log": "ember.log", "Tanh": "ember.tanh",
         "Sigmoid": "ember.sigmoid", "Relu": "ember.relu", "Sign": "ember.sign"}
BINARY = {"Add": "ember.add", "Sub": "ember.sub", "Mul": "ember.mul", "Div": "ember.div",
          "Max": "ember.max", "Min": "ember.min", "Sum": "ember.add"}


def _unary(name: str, node: Node, x) -> Tensor:
    x = tensor(x)
    return x.trace.op(name, x)


def _variadic(name: str, node: Node, *xs) -> Tensor:
    return functools.reduce(lambda a, b: a.trace.op(name, a, tensor(b)), xs[1:], tensor(xs[0]))


for _op, _name in UNARY.items():
    rule(_op)(functools.partial(_unary, _name))
for _op, _name in BINARY.items():
    rule(_op)(functools.partial(_variadic, _name))


COMPARE = {"Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge",
           "Equal": "eq"}


def _compare(predicate: str, node: Node, a, b) -> Tensor:
    a = tensor(a)
    return a.trace.op("ember.cmp", a, tensor(b), predicate=predicate)


for _op, _predicate in COMPARE.items():
    rule(_op)(functools.partial(_compare, _predicate))


@rule("Not")
def _not(node, x):
    return _compare("eq", node, x, np.bool_(False))


@rule("Reciprocal")
def _reciprocal(node, x):
    return 1.0 / tensor(x)


@rule("Pow")
def _pow(node, x, y):
    x = tensor(x)
    return x.trace.op("ember.pow", x, tensor(y).astype(x.dtype))  # ONNX lets y's type differ


@rule("Identity")
def _identity(node, x):
    return x


@rule("Softplus")
def _softplus(node, x):
    """log(1 + exp(x)) everywhere: ONNX's has no threshold above which it returns x, as
    PyTorch's does from 20 on (a difference below f32's rounding, not f64's)."""
    return F.softplus(tensor(x), 1.0, math.inf)


@rule("HardSigmoid", attrs="alpha beta")
def _hard_sigmoid(node, x):
    """max(0, min(1, alpha x + beta)); torch's (alpha 1/6, beta 1/2, as it exports
    F.hardsigmoid) is F.hardsigmoid, so the import computes and differentiates as torch."""
    x, alpha, beta = tensor(x), attr(node, "alpha", 0.2), attr(node, "beta", 0.5)
    if np.float32(alpha) == np.float32(1 / 6) and beta == 0.5:
        return F.hardsigmoid(x)
    return F.minimum(1.0, F.maximum(0.0, x * alpha + beta))  # constants first, as there


@rule("HardSwish")
def _hard_swish(node, x):
    return F.hardswish(tensor(x))


@rule("LeakyRelu", attrs="alpha")
def _leaky_relu(node, x):
    return F.leaky_relu(tensor(x), attr(node, "alpha", 0.01))


def _gelu_check(node):
    a = attr(node, "approximate", "none")
    return [] if a in ("none", "tanh") else [f"approximate={a!r} is not supported"]


@rule("Gelu", attrs="approximate", check=_gelu_check)
def _gelu(node, x):
    return F.gelu(tensor(x), attr(node, "approximate", "none"))


@rule("Softmax", "LogSoftmax", attrs="axis")
def _softmax(node, x):
    fn = F.softmax if node.op_type == "Softmax" else F.log_softmax
    return fn(tensor(x), attr(node, "axis", -1))


@rule("Clip", static=(1, 2))
def _clip(node, x, lo=None, hi=None):
    x = tensor(x)
    if lo is not None:
        x = F.maximum(x, tensor(lo))
    return x if hi is None else F.minimum(x, tensor(hi))


@rule("Where")
def _where(node, c, a, b):
    return F.where(tensor(c), tensor(a), tensor(b))


@rule("Cast", attrs="to saturate round_mode",
      check=lambda n: [] if attr(n, "to") in DTYPES else [
          f"cast to ONNX type {attr(n, 'to')} (ember has f32 f64 f16 bf16 i64 i32 bool)"])
def _cast(node, x):
    return tensor(x).astype(DTYPES[attr(node, "to")])


@rule("Dropout", attrs="seed", static=(1, 2))
def _dropout(node, x, ratio=None, training=None):
    """Dropout at inference is the identity; ember's own dropout is for ember's modules."""
    if training is not None and bool(np.asarray(training)):
        raise _fail(node, "training_mode=true is not supported (imported models run as "
                          "for inference)")
    x = tensor(x)
    return (x, np.ones(x.shape, bool)) if len(node.outputs) > 1 else x


# -- linear algebra -----------------------------------------------------------------------

@rule("MatMul")
def _matmul(node, a, b):
    a, b = tensor(a), tensor(b)
    a2 = a.reshape(1, *a.shape) if a.ndim == 1 else a
    b2 = b.reshape(*b.shape, 1) if b.ndim == 1 else b
    y = a2 @ b2
    shape = y.shape[:-2] + (() if a.ndim == 1 else y.shape[-2:-1]) + (() if b.ndim == 1
                                                                      else y.shape[-1:])
    return y if shape == y.shape else y.reshape(shape)


@rule("Gemm", attrs="alpha beta transA transB")
def _gemm(node, a, b, c=None):
    """Y = alpha A' B' + beta C; `transB=1` (PyTorch's Linear, weight [out, in]) stays one
    nn.linear on the weight as stored."""
    a, b = tensor(a), tensor(b)
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    if attr(node, "transA", 0):
        a = a.T
    torch_layout = bool(attr(node, "transB", 0))
    n = b.shape[0] if torch_layout else b.shape[1]
    c = None if c is None else tensor(c)
    if alpha == 1 and beta == 1 and (c is None or c.shape == (n,)):
        return F.linear(a, b, c, layout="torch" if torch_layout else "ember")
    y = a @ (b.T if torch_layout else b)
    y = y if alpha == 1 else y * alpha
    return y if c is None else y + (c if beta == 1 else c * beta)


# -- convolutions and pools ---------------------------------------------------------------

AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def _spatial_check(node: Node, dilations: bool = True) -> list[str]:
    out = []
    if attr(node, "auto_pad", "NOTSET") not in AUTO_PADS:
        out.append(f"auto_pad={attr(node, 'auto_pad')!r} is not supported")
    k = attr(node, "kernel_shape")
    if k is not None and len(k) not in (1, 2, 3):
        out.append(f"a {len(k)}-d kernel (ember has 1-d, 2-d and 3-d convolutions and pools)")
    if not dilations and any(d != 1 for d in attr(node, "dilations", [])):
        out.append("dilations other than 1 are not supported")
    return out


def _window(node: Node, sizes, kernel, strides, dilations) -> tuple[list, list]:
    """Explicit (before, after) pads per spatial axis from pads/auto_pad, and what ceil_mode
    adds after them."""
    n, auto = len(sizes), attr(node, "auto_pad", "NOTSET")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, e, s in zip(sizes, eff, strides):
            total = max((-(-size // s) - 1) * s + e - size, 0)
            pads.append((total // 2, total - total // 2) if auto == "SAME_UPPER"
                        else (total - total // 2, total // 2))
    else:
        p = [0] * 2 * n if auto == "VALID" else list(attr(node, "pads", [0] * 2 * n))
        pads = list(zip(p[:n], p[n:]))
    extra = [0] * n
    if attr(node, "ceil_mode", 0):
        for i, (size, e, s, (b, a)) in enumerate(zip(sizes, eff, strides, pads)):
            out = -(-(size + b + a - e) // s) + 1
            if (out - 1) * s >= size + b:  # a window must start inside the input or its pad
                out -= 1
            extra[i] = max((out - 1) * s + e - (size + b + a), 0)
    return pads, extra


def _as_2d(node: Node, x: Tensor) -> Tensor:
    """x [N, C, L] as [N, C, 1, L]; [N, C, H, W] and [N, C, D, H, W] as they are."""
    if x.ndim == 3:
        return x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])
    if x.ndim not in (4, 5):
        raise _fail(node, f"input {list(x.shape)} is not [N, C, L], [N, C, H, W] or "
                          "[N, C, D, H, W] (ember has 1-d, 2-d and 3-d convolutions and pools)")
    return x


# the functional op of each rank of input (after _as_2d)
CONV = {4: F.conv2d, 5: F.conv3d}
CONV_TRANSPOSE = {4: F.conv_transpose2d, 5: F.conv_transpose3d}
MAX_POOL = {4: F.max_pool2d, 5: F.max_pool3d}
AVG_POOL = {4: F.avg_pool2d, 5: F.avg_pool3d}


def _geometry(node: Node, x: Tensor, kernel) -> tuple:
    """(x as NCHW or NCDHW, kernel, strides, dilations, pads, ceil extra), 2-d or 3-d; a 1-d
    op has H=1."""
    sp = x.ndim - 2
    strides = list(attr(node, "strides", [1] * sp))
    dilations = list(attr(node, "dilations", [1] * sp))
    pads, extra = _window(node, x.shape[2:], kernel, strides, dilations)
    if sp == 1:
        kernel, strides, dilations = [1, *kernel], [1, *strides], [1, *dilations]
        pads, extra = [(0, 0), *pads], [0, *extra]
    return _as_2d(node, x), list(kernel), strides, dilations, pads, extra


def _unbatch(x: Tensor, like: Tensor) -> Tensor:
    """A 2-d result back to 1-d when the op's input was [N, C, L]."""
    return x.reshape(x.shape[0], x.shape[1], x.shape[3]) if like.ndim == 3 else x


@rule("Conv", attrs="auto_pad dilations group kernel_shape pads strides", check=_spatial_check)
def _conv(node, x, w, b=None):
    x0, w = tensor(x), tensor(w)
    x, kernel, strides, dilations, pads, _ = _geometry(node, x0, list(w.shape[2:]))
    w = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]) if w.ndim == 3 else w
    if any(bf != af for bf, af in pads):
        x, pads = pad(x, [(0, 0), (0, 0), *pads]), [(0, 0)] * len(pads)
    y = CONV[x.ndim](x, w, b, strides, [p for p, _ in pads], dilations, attr(node, "group", 1))
    return _unbatch(y, x0)


@rule("ConvTranspose", attrs="auto_pad dilations group kernel_shape output_padding "
      "output_shape pads strides", check=_spatial_check)
def _conv_transpose(node, x, w, b=None):
    """The full transposed convolution (no padding), then cropped to ONNX's pads (which may
    be uneven) and widened by output_padding."""
    x0, w = tensor(x), tensor(w)
    x = _as_2d(node, x0)
    w = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]) if w.ndim == 3 else w
    sp = x0.ndim - 2
    strides = list(attr(node, "strides", [1] * sp))
    dilations = list(attr(node, "dilations", [1] * sp))
    out_pad = list(attr(node, "output_padding", [0] * sp))
    kernel = list(w.shape[2:])[-sp:]
    sizes = list(x0.shape[2:])
    full = [(n - 1) * s + (k - 1) * d + 1 for n, s, k, d in zip(sizes, strides, kernel, dilations)]
    shape, auto = attr(node, "output_shape"), attr(node, "auto_pad", "NOTSET")
    if shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = [n * s for n, s in zip(sizes, strides)]
    if shape is not None:
        shape = list(shape)[-sp:]
        pads = []
        for f, o, want in zip(full, out_pad, shape):
            total = f + o - want
            pads.append((total // 2, total - total // 2) if auto == "SAME_UPPER"
                        else (total - total // 2, total // 2))
    else:
        p = [0] * 2 * sp if auto == "VALID" else list(attr(node, "pads", [0] * 2 * sp))
        pads = list(zip(p[:sp], p[sp:]))
    y = CONV_TRANSPOSE[x.ndim](x, w, None, [1] * (2 - sp) + strides, 0, 0,
                               attr(node, "group", 1), [1] * (2 - sp) + dilations)
    y = _unbatch(y, x0)
    # output_padding widens the end; pads crop (a negative amount of pad() crops)
    y = pad(y, [(0, 0), (0, 0)] + [(-b, o - a) for (b, a), o in zip(pads, out_pad)])
    if b is not None:
        y = y + tensor(b).reshape(1, -1, *([1] * sp))
    return y


@rule("MaxPool", attrs="auto_pad ceil_mode dilations kernel_shape pads storage_order strides",
      check=lambda n: _spatial_check(n) + (
          ["the Indices output is not supported"] if len(n.outputs) > 1 and n.outputs[1]
          else []))
def _max_pool(node, x):
    """F.max_pool2d or 3d, dilations included; uneven pads (or more than its padding allows)
    as -inf padding first (padding never wins a max)."""
    x0 = tensor(x)
    x, kernel, strides, dilations, pads, extra = _geometry(node, x0,
                                                           list(attr(node, "kernel_shape")))
    pads = [(b, a + e) for (b, a), e in zip(pads, extra)]
    if any(b != a or 2 * b > d * (k - 1) + 1 for (b, a), k, d in zip(pads, kernel, dilations)):
        x, pads = pad(x, [(0, 0), (0, 0), *pads], value=-np.inf), [(0, 0)] * len(pads)
    return _unbatch(MAX_POOL[x.ndim](x, kernel, strides, [b for b, _ in pads], dilations), x0)


@rule("AveragePool", attrs="auto_pad ceil_mode count_include_pad dilations kernel_shape pads "
      "strides", check=lambda n: _spatial_check(n, dilations=False))
def _avg_pool(node, x):
    """ember's avg_pool2d divides by the kernel's area; ONNX divides by the count of input
    elements (count_include_pad=0, the default) or of input and pads, never of what ceil_mode
    adds: where those differ, the zero-padded mean is rescaled by a constant."""
    x0 = tensor(x)
    x, kernel, strides, _, pads, extra = _geometry(node, x0, list(attr(node, "kernel_shape")))
    pool = AVG_POOL[x.ndim]
    if not any(b or a or e for (b, a), e in zip(pads, extra)):
        return _unbatch(pool(x, kernel, strides), x0)
    counted = np.ones(x.shape[2:])
    if attr(node, "count_include_pad", 0):
        counted = np.pad(counted, pads, constant_values=1)
        counted = np.pad(counted, [(0, e) for e in extra])
    else:
        counted = np.pad(counted, [(b, a + e) for (b, a), e in zip(pads, extra)])
    x = pad(x, [(0, 0), (0, 0)] + [(b, a + e) for (b, a), e in zip(pads, extra)])
    windows = np.lib.stride_tricks.sliding_window_view(counted, kernel)[
        tuple(slice(None, None, s) for s in strides)]
    axes = tuple(range(-len(kernel), 0))
    scale = (math.prod(kernel) / windows.sum(axes)).astype(numpy_dtype(x.dtype))
    return _unbatch(pool(x, kernel, strides) * tensor(scale), x0)


@rule("GlobalAveragePool")
def _global_avg_pool(node, x):
    x = tensor(x)
    return x.mean(tuple(range(2, x.ndim)), keepdims=True)


@rule("GlobalMaxPool")
def _global_max_pool(node, x):
    x = tensor(x)
    return x.amax(tuple(range(2, x.ndim)), keepdim=True)


# -- normalization ------------------------------------------------------------------------

@rule("BatchNormalization", attrs="epsilon momentum training_mode", buffers=(3, 4),
      check=lambda n: ["training_mode=1 is not supported (imported models normalize with "
                       "their running statistics)"] if attr(n, "training_mode", 0) else [])
def _batch_norm(node, x, scale, bias, mean, var):
    return F.batch_norm(tensor(x), tensor(mean), tensor(var), tensor(scale), tensor(bias),
                        training=False, eps=attr(node, "epsilon", 1e-5))


@rule("LayerNormalization", attrs="axis epsilon stash_type")
def _layer_norm(node, x, scale, bias=None):
    """nn.layer_norm; the optional Mean and InvStdDev outputs from core ops beside it."""
    x = tensor(x)
    axis = _axis(node, attr(node, "axis", -1), x.ndim)
    shape = x.shape[axis:]
    eps, scale = attr(node, "epsilon", 1e-5), tensor(scale)
    bias = None if bias is None else tensor(bias)
    if bias is not None and scale.shape == bias.shape == shape:
        y = F.layer_norm(x, shape, scale, bias, eps)
    else:
        y = F.layer_norm(x, shape, eps=eps) * scale  # a scale or bias that broadcasts
        y = y if bias is None else y + bias
    if not any(node.outputs[1:]):
        return y
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axes, keepdims=True)
    d = x - mean
    return y, mean, F.rsqrt((d * d).mean(axes, keepdims=True) + eps)


# -- reductions ------------------------------------------------------------------------

def _reduce_axes(node: Node, x: Tensor, axes) -> list[int] | None:
    """The axes to reduce (from the attribute or the input), None for none at all."""
    axes = attr(node, "axes") if axes is None else _ints(axes)
    if not axes:
        return None if attr(node, "noop_with_empty_axes", 0) else list(range(x.ndim))
    return [_axis(node, a, x.ndim) for a in axes]


def _reduce(node, x, axes=None):
    x = tensor(x)
    axes = _reduce_axes(node, x, axes)
    if axes is None:
        return x
    keep = bool(attr(node, "keepdims", 1))
    if node.op_type in ("ReduceMax", "ReduceMin"):
        empty = [a for a in axes if not x.shape[a]]
        if empty:
            raise _fail(node, f"reducing the empty axis {empty[0]} of {list(x.shape)} (no max "
                              "or min there) is not supported")
        if x.dtype == "i1":
            raise _fail(node, "max and min of bool tensors are not supported")
    if node.op_type == "ReduceMin":
        return -((-x).amax(axes, keep))
    return {"ReduceSum": x.sum, "ReduceMean": x.mean, "ReduceMax": x.amax}[node.op_type](
        axes, keep)


rule("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", attrs="axes keepdims "
     "noop_with_empty_axes", static=(1,))(_reduce)


@rule("ArgMax", attrs="axis keepdims select_last_index")
def _argmax(node, x):
    """The first (or last) index of the max: max, compare, then the min (max) of the
    indices where it is hit; ember has no argmax op."""
    x = tensor(x)
    axis = _axis(node, attr(node, "axis", 0), x.ndim)
    n = x.shape[axis]
    iota = np.arange(n, dtype=np.int64).reshape([n if i == axis else 1 for i in range(x.ndim)])
    hit = x == x.amax(axis, keepdim=True)
    keep = bool(attr(node, "keepdims", 1))
    if attr(node, "select_last_index", 0):
        return F.where(hit, tensor(iota), tensor(np.int64(-1))).amax(axis, keep)
    return -F.where(hit, tensor(-iota), tensor(np.int64(-n))).amax(axis, keep)


# -- shapes and indexing ------------------------------------------------------------------

@rule("Shape", attrs="start end")
def _shape(node, x):
    return np.array(x.shape[attr(node, "start", 0):attr(node, "end")], np.int64)


@rule("Reshape", attrs="allowzero", static=(1,))
def _reshape(node, x, shape):
    x = tensor(x)
    shape = _ints(shape)
    if not attr(node, "allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


@rule("Transpose", attrs="perm")
def _transpose(node, x):
    x = tensor(x)
    return x.transpose(list(attr(node, "perm", reversed(range(x.ndim)))))


@rule("Flatten", attrs="axis")
def _flatten(node, x):
    x = tensor(x)
    a = attr(node, "axis", 1)
    a = a + x.ndim if a < 0 else a
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))


@rule("Squeeze", static=(1,))
def _squeeze(node, x, axes=None):
    x = tensor(x)
    axes = ([i for i, d in enumerate(x.shape) if d == 1] if axes is None
            else [_axis(node, a, x.ndim) for a in _ints(axes)])
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


@rule("Unsqueeze", static=(1,))
def _unsqueeze(node, x, axes):
    x = tensor(x)
    rank = x.ndim + len(_ints(axes))
    axes = {_axis(node, a, rank) for a in _ints(axes)}
    dims = iter(x.shape)
    return x.reshape([1 if i in axes else next(dims) for i in range(rank)])


@rule("Expand", static=(1,))
def _expand(node, x, shape):
    x = tensor(x)
    out = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return x if out == x.shape else F.broadcast_to(x, out)


@rule("Concat", attrs="axis")
def _concat(node, *xs):
    xs = [tensor(x) for x in xs]
    if len({x.ndim for x in xs}) > 1:
        raise _fail(node, f"its inputs have different ranks {[x.ndim for x in xs]}")
    return concat(xs, _axis(node, attr(node, "axis"), xs[0].ndim))


@rule("Gather", attrs="axis")
def _gather(node, x, idx):
    x = tensor(x)
    axis = _axis(node, attr(node, "axis", 0), x.ndim)
    n = x.shape[axis]
    if isinstance(idx, Tensor):
        idx = F.where(idx < 0, idx + n, idx)
    else:
        idx = np.where(idx < 0, idx + n, idx)
    return gather(x, idx, axis)


@rule("Slice", static=(1, 2, 3, 4))
def _slice(node, x, starts, ends, axes=None, steps=None):
    x = tensor(x)
    starts, ends = _ints(starts), _ints(ends)
    axes = range(len(starts)) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if 0 in steps:
        raise _fail(node, "a step of 0")
    return slice_axes(x, {_axis(node, a, x.ndim): slice(s, e, st)
                          for s, e, a, st in zip(starts, ends, axes, steps)})


@rule("Split", attrs="axis num_outputs", static=(1,))
def _split(node, x, split=None):
    x = tensor(x)
    axis = _axis(node, attr(node, "axis", 0), x.ndim)
    n, parts = x.shape[axis], len(node.outputs)
    if split is not None:
        sizes = _ints(split)
    else:
        chunk = -(-n // attr(node, "num_outputs", parts))
        sizes = [min(chunk, n - i * chunk) for i in range(parts)]
    if sum(sizes) != n or len(sizes) != parts:
        raise _fail(node, f"split sizes {sizes} do not divide axis {axis} of {list(x.shape)} "
                          f"into {parts} outputs")
    return x.split(sizes, axis)


PAD_MODES = ("constant", "edge", "reflect", "wrap")


@rule("Pad", attrs="mode", static=(1, 2, 3),
      check=lambda n: [] if attr(n, "mode", "constant") in PAD_MODES
      else [f"mode={attr(n, 'mode')!r} is not supported"])
def _pad(node, x, pads, value=None, axes=None):
    x = tensor(x)
    pads = _ints(pads)
    axes = range(x.ndim) if axes is None else [_axis(node, a, x.ndim) for a in _ints(axes)]
    amounts = [(0, 0)] * x.ndim
    k = len(pads) // 2
    for i, a in enumerate(axes):
        amounts[a] = (pads[i], pads[k + i])
    v = 0 if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)[0]
    return pad(x, amounts, attr(node, "mode", "constant"), v)

