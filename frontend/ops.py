"""The elementwise and row-wise part of `nn.functional`: activations, comparisons,
clamps, division with rounding, linear and softmax, and the helpers (`_t`: lift to the
trace) that the other functional modules build on. Re-exported by frontend/functional.py.
"""
from __future__ import annotations

from . import context
from .tensor import Tensor, axes_list, scalar_axes

_t = context.lift


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


def add(a, b, alpha=1) -> Tensor:
    """a + alpha * b, broadcast (torch.add's `alpha`)."""
    a, b = _pair_of(a, b)
    return a + (b if alpha == 1 else b * alpha)


def sub(a, b, alpha=1) -> Tensor:
    """a - alpha * b, broadcast (torch.sub's `alpha`)."""
    a, b = _pair_of(a, b)
    return a - (b if alpha == 1 else b * alpha)


ROUNDING_MODES = (None, "trunc", "floor")
EXACT = {"bf16": 2 ** 7, "f16": 2 ** 10, "f32": 2 ** 23, "f64": 2 ** 52}  # |x| >= these: whole


def _trunc(q: Tensor) -> Tensor:
    """q rounded toward zero: through i64 where |q| is below the dtype's whole numbers (so
    huge values, inf and NaN pass as they are); no gradient, as torch's."""
    whole = q.astype("i64").astype(q.dtype)
    small = q.abs() < float(EXACT[q.dtype])
    return q.trace.op("ember.select", small, whole, q, stop_gradient=True)


def div(a, b, rounding_mode: str | None = None) -> Tensor:
    """a / b, broadcast; `rounding_mode` "trunc" (toward zero) or "floor" rounds the
    quotient as torch.div does, integer tensors computed in f64 (exact below 2**53)."""
    if rounding_mode not in ROUNDING_MODES:
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                         f"{rounding_mode!r}")
    a, b = _pair_of(a, b)
    if rounding_mode is None:
        return a / b
    dtype = a.dtype if a.dtype in EXACT else "f64"
    q = a.astype(dtype) / b.astype(dtype)
    t = _trunc(q)
    if rounding_mode == "floor":
        t = t - (t > q).astype(dtype)
    return t.astype(a.dtype)


def where(condition, a, b) -> Tensor:
    """`a` where `condition` (a comparison's result) holds, else `b`, broadcast."""
    cond = _t(condition)
    if cond.dtype != "i1":
        raise cond.trace.error(f"where: the condition must be a boolean tensor (a "
                               f"comparison), got {cond.dtype}")
    return context.current().op("ember.select", cond, *_pair_of(a, b))


def clamp(x, min=None, max=None) -> Tensor:  # noqa: A002  (torch.clamp's names)
    """x limited to [min, max] (either may be None), as torch.clamp: max wins if min > max."""
    return _t(x).clamp(min, max)


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


def _along(name: str, x, axis: int, dtype) -> Tensor:
    """`name` along `axis` of x cast to `dtype` (torch's dtype=: cast first); a 0-d x is
    taken as one axis of size 1 (torch allows its dim 0 or -1)."""
    x = _t(x) if dtype is None else _t(x).astype(dtype)
    if x.ndim == 0:
        scalar_axes(x, axis)
        return x.trace.op(name, x.reshape(1), axis=0).reshape(())
    return x.trace.op(name, x, axis=_axis(axis, x))


def softmax(x, dim: int = -1, dtype=None, *, axis: int | None = None) -> Tensor:
    """Softmax along `dim` (torch's name; numpy's `axis` too), in `dtype` when given."""
    return _along("nn.softmax", x, dim if axis is None else axis, dtype)


def log_softmax(x, dim: int = -1, dtype=None, *, axis: int | None = None) -> Tensor:
    """Log-softmax along `dim` (or `axis`), computed in `dtype` when given."""
    return _along("nn.log_softmax", x, dim if axis is None else axis, dtype)



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


def hardsigmoid(x) -> Tensor:
    """relu6(x + 3) / 6, as torch's, spelled min(6, max(0, x + 3)) / 6 with each constant
    first: a max or min sends a tie's gradient to its first operand (autodiff/rules.py), so
    the gradient is 0 at x = -3 and x = 3, as torch's, and 1/6 strictly between."""
    return minimum(6.0, maximum(0.0, _t(x) + 3.0)) / 6.0


def hardswish(x) -> Tensor:
    """x * relu6(x + 3) / 6, as torch's, spelled x * hardsigmoid(x) (no x * 6 to overflow):
    the gradient is 0 for x <= -3, 1 for x >= 3 and x / 3 + 1/2 between, as torch's."""
    x = _t(x)
    return x * hardsigmoid(x)


def sign(x) -> Tensor:
    """-1, 0 or 1 by the sign of x (torch.sign; NaN stays NaN), gradient 0: `ember.sign`."""
    return _t(x).sign()


def softplus(x, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold, as PyTorch's: one
    primitive (`ember.softplus`), so it stays stable where exp(beta x) overflows."""
    x = _t(x)
    return x.trace.op("ember.softplus", x, beta=float(beta), threshold=float(threshold))


def erf(x) -> Tensor:
    x = _t(x)
    return x.trace.op("ember.erf", x)
