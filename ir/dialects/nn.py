"""The `nn` dialect: layers as traced, before `decompose` lowers them to core ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..opdef import InferenceError, OpDef, fmt_shape, normalize_axes, register, same_dtype
from ..types import TensorType, Type
from .ember_windows import Conv2d as CoreConv2d


@register
class Linear(OpDef):
    """`linear(x, w[, b])` = x @ w + b, with w of shape [d_in, d_out]."""

    name = "nn.linear"
    traits = frozenset({"pure", "compute_bound"})
    arity = (2, 3)

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        x, w, *b = operand_types
        same_dtype(cls.name, operand_types)
        if w.rank != 2 or x.rank < 1 or x.shape[-1] != w.shape[0]:
            raise InferenceError(f"nn.linear: input {fmt_shape(x.shape)} does not match "
                                 f"weight {fmt_shape(w.shape)}")
        if b and b[0].shape != (w.shape[1],):
            raise InferenceError(f"nn.linear: bias {fmt_shape(b[0].shape)} does not match "
                                 f"weight {fmt_shape(w.shape)}")
        return [x.with_shape(x.shape[:-1] + (w.shape[1],))]


class AxisOp(OpDef):
    arity = (1, 1)
    attrs = {"axis": int}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (t,) = operand_types
        normalize_axes(cls.name, [attrs["axis"]], t.rank)
        if not t.is_float:
            raise InferenceError(f"{cls.name} needs a float tensor, got {t}")
        return [t]


@register
class Softmax(AxisOp):
    name = "nn.softmax"


@register
class LogSoftmax(AxisOp):
    name = "nn.log_softmax"


@register
class CrossEntropy(OpDef):
    """Mean cross-entropy of logits [N, C] against integer labels [N]: a scalar. With
    `ignore_index`, rows labelled so count neither in the sum nor in the mean (torch's)."""

    name = "nn.cross_entropy"
    arity = (2, 2)
    optional_attrs = {"ignore_index": int}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        logits, labels = operand_types
        if logits.rank != 2 or labels.shape != logits.shape[:1]:
            raise InferenceError(f"nn.cross_entropy: logits {fmt_shape(logits.shape)} and "
                                 f"labels {fmt_shape(labels.shape)} disagree (want [N, C], [N])")
        if labels.dtype not in ("i64", "i32"):
            raise InferenceError(f"nn.cross_entropy needs integer labels, got {labels}")
        return [TensorType((), logits.dtype)]


@register
class Conv2d(OpDef):
    """`conv2d(x, w[, b]) {stride, padding, dilation, groups}`: ember.conv2d plus a bias [c_out]
    added on the channel axis."""

    name = "nn.conv2d"
    traits = frozenset({"pure", "compute_bound"})
    arity = (2, 3)
    attrs = {"stride": list, "padding": list, "dilation": list, "groups": int}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        x, w, *b = operand_types
        try:
            out = CoreConv2d.result_types([x, w], attrs)
            assert out is not None  # ember.conv2d infers its result
            (y,) = out
        except InferenceError as e:
            raise InferenceError(str(e).replace(CoreConv2d.name, cls.name)) from None
        if b and (b[0].shape != (w.shape[0],) or b[0].dtype != x.dtype):
            raise InferenceError(f"nn.conv2d: bias {b[0]} does not match weight "
                                 f"{fmt_shape(w.shape)} (want [{w.shape[0]}] of {x.dtype})")
        return [y]


def _affine(op: str, x: TensorType, params: list[TensorType], shape: tuple[int, ...],
            names: Sequence[str]) -> None:
    for t, n in zip(params, names):
        if t.shape != shape or t.dtype != x.dtype:
            raise InferenceError(f"{op}: {n} {t} does not match input {x} (want "
                                 f"{TensorType(shape, x.dtype)})")


@register
class LayerNorm(OpDef):
    """`layer_norm(x[, gamma, beta]) {axes, eps, affine}`: normalized over the trailing `axes`;
    gamma and beta (both or neither; `affine` says which) have x's shape over those axes."""

    name = "nn.layer_norm"
    arity = (1, 3)
    attrs = {"axes": list, "eps": float}
    optional_attrs = {"affine": bool}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        x, *params = operand_types
        affine = attrs.get("affine", bool(params))
        if len(params) != (2 if affine else 0):
            raise InferenceError(f"nn.layer_norm with affine={affine} takes "
                                 f"{3 if affine else 1} operands, got {len(operand_types)}")
        if not x.is_float:
            raise InferenceError(f"nn.layer_norm needs a float tensor, got {x}")
        axes = normalize_axes(cls.name, attrs["axes"], x.rank)
        if not axes or axes != list(range(x.rank - len(axes), x.rank)):
            raise InferenceError(f"nn.layer_norm: axes {attrs['axes']} must be the trailing "
                                 f"axes of {fmt_shape(x.shape)}")
        _affine(cls.name, x, params, x.shape[axes[0]:], ("gamma", "beta"))
        return [x]


@register
class BatchNorm(OpDef):
    """`batch_norm(x, gamma, beta, running_mean, running_var) {eps, momentum, training}`.

    Channels on axis 1 of (N, C) or (N, C, H, W). Three results: y, the new running mean and
    the new running var. training=true normalizes with the batch statistics (biased var)
    and updates the running ones with momentum (unbiased var), as PyTorch; training=false
    normalizes with the running statistics and returns them unchanged.
    """

    name = "nn.batch_norm"
    arity = (5, 5)
    attrs = {"eps": float, "momentum": float, "training": bool}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        x, *params = operand_types
        if x.rank not in (2, 4) or not x.is_float:
            raise InferenceError(f"nn.batch_norm: input must be a float (N, C) or (N, C, H, W) "
                                 f"tensor, got {x}")
        c = x.shape[1]
        _affine(cls.name, x, params, (c,), ("gamma", "beta", "running_mean", "running_var"))
        if attrs["training"] and x.size // max(c, 1) < 2:
            raise InferenceError(f"nn.batch_norm: training needs more than one value per "
                                 f"channel, got input {fmt_shape(x.shape)}")
        return [x, params[2], params[3]]


GELU_APPROXIMATIONS = ("none", "tanh")


@register
class Gelu(OpDef):
    """`gelu(x) {approximate = "none" | "tanh"}`: x * Phi(x), exactly (erf) or with tanh."""

    name = "nn.gelu"
    traits = frozenset({"pure", "elementwise", "memory_bound"})
    arity = (1, 1)
    attrs = {"approximate": str}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (x,) = operand_types
        if attrs["approximate"] not in GELU_APPROXIMATIONS:
            raise InferenceError(f"nn.gelu: approximate must be \"none\" or \"tanh\", got "
                                 f"{attrs['approximate']!r}")
        if not x.is_float:
            raise InferenceError(f"nn.gelu needs a float tensor, got {x}")
        return [x]


@register
class Attention(OpDef):
    """`attention(q, k, v) {causal, scale}` on [..., T, d]: softmax(q k^T * scale + mask) v.

    q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv]; the causal mask
    hides key j from query i when j > i (top-left aligned, as PyTorch's is_causal).
    """

    name = "nn.attention"
    traits = frozenset({"pure", "compute_bound"})
    arity = (3, 3)
    attrs = {"causal": bool, "scale": float}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        q, k, v = operand_types
        same_dtype(cls.name, operand_types)
        ok = (q.rank >= 2 and k.rank == q.rank and v.rank == q.rank and q.is_float
              and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
              and q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2])
        if not ok:
            raise InferenceError(f"nn.attention: q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}"
                                 f", v {fmt_shape(v.shape)} do not fit (want [..., Tq, d], "
                                 "[..., Tk, d], [..., Tk, dv] of floats)")
        return [q.with_shape(q.shape[:-1] + v.shape[-1:])]
