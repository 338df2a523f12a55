"""The `nn` dialect: layers as traced, before `decompose` lowers them to core ops."""

from __future__ import annotations

from ..opdef import InferenceError, OpDef, fmt_shape, normalize_axes, register, same_dtype
from ..types import TensorType


@register
class Linear(OpDef):
    """`linear(x, w[, b])` = x @ w + b, with w of shape [d_in, d_out]."""

    name = "nn.linear"
    traits = frozenset({"pure", "compute_bound"})
    arity = (2, 3)

    @classmethod
    def infer(cls, operand_types, attrs):
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
    def infer(cls, operand_types, attrs):
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
    """Mean cross-entropy of logits [N, C] against integer labels [N]: a scalar."""

    name = "nn.cross_entropy"
    arity = (2, 2)

    @classmethod
    def infer(cls, operand_types, attrs):
        logits, labels = operand_types
        if logits.rank != 2 or labels.shape != logits.shape[:1]:
            raise InferenceError(f"nn.cross_entropy: logits {fmt_shape(logits.shape)} and "
                                 f"labels {fmt_shape(labels.shape)} disagree (want [N, C], [N])")
        if labels.dtype not in ("i64", "i32"):
            raise InferenceError(f"nn.cross_entropy needs integer labels, got {labels}")
        return [TensorType((), logits.dtype)]
