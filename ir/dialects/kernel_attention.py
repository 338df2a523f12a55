"""Fused attention in the `kernel` dialect: what `fuse` makes of a decomposed
softmax(q k^T * scale + causal mask) v and of its backward, so the [..., Tq, Tk] scores
are never stored.

Every operand is a strided view of its buffer: `maps[k]` holds one element stride per
dim of operand k's logical shape, so q, k and v are read in place from the [B, T, H, D]
projections a multi-head attention splits them from (no transpose is ever copied).
`batch` lists the leading dims, `sizes` is [Tq, Tk, D, Dv]; logical shapes are
q [*batch, Tq, D], k [*batch, Tk, D], v [*batch, Tk, Dv], o and do [*batch, Tq, Dv],
lse [*batch, Tq]. Results are contiguous in their logical shapes.

`kernel.attention(q, k, v) -> (o, lse)`: o = softmax(s) v with s = q k^T * scale (key j
hidden from query i when j > i if `causal`), and lse = logsumexp over each row of s,
which the backward needs to rebuild the probabilities block by block::

    %o, %lse = "kernel.attention"(%q, %k, %v) {batch = [16, 4], causal = true,
        maps = [[16384, 16, 64, 1], ...], scale = 0.25 : f64, sizes = [256, 256, 16, 16]}

`kernel.attention_grad(q, k, v, o, lse, do) -> (dq, dk, dv)`: the gradients of o with
respect to q, k and v given do, with p = exp(s - lse) recomputed and
ds = p * (do v^T - rowsum(do * o)) * scale.
"""

from __future__ import annotations

import math

from ..opdef import SHAPE, InferenceError, OpDef, register, same_dtype
from ..types import TensorType
from .kernel import check_map

ATTRS = {"batch": SHAPE, "sizes": SHAPE, "maps": (list,), "causal": bool, "scale": float}


def logical_shapes(attrs: dict) -> dict[str, list[int]]:
    """The logical shape of every operand and result name, from `batch` and `sizes`."""
    b, (tq, tk, d, dv) = list(attrs["batch"]), attrs["sizes"]
    return {"q": b + [tq, d], "k": b + [tk, d], "v": b + [tk, dv], "o": b + [tq, dv],
            "lse": b + [tq], "do": b + [tq, dv], "dq": b + [tq, d], "dk": b + [tk, d],
            "dv": b + [tk, dv]}


class AttentionOp(OpDef):
    """Shared checks: one map per operand over its logical shape, one float dtype."""

    traits = frozenset({"pure", "compute_bound"})
    attrs = ATTRS
    operand_names: tuple[str, ...] = ()
    result_names: tuple[str, ...] = ()

    @classmethod
    def infer(cls, operand_types, attrs):
        if len(attrs["sizes"]) != 4 or not all(attrs["sizes"]):
            raise InferenceError(f"{cls.name}: sizes must be [Tq, Tk, D, Dv], each > 0, got "
                                 f"{attrs['sizes']}")
        if math.prod(attrs["batch"]) == 0:
            raise InferenceError(f"{cls.name}: batch {attrs['batch']} is empty")
        dtype = same_dtype(cls.name, operand_types)
        if dtype not in ("f32", "f64"):
            raise InferenceError(f"{cls.name} needs f32 or f64 operands, got {dtype}")
        maps = attrs["maps"]
        if len(maps) != len(operand_types):
            raise InferenceError(f"{cls.name}: {len(operand_types)} operands but {len(maps)} "
                                 "maps")
        shapes = logical_shapes(attrs)
        for name, m, t in zip(cls.operand_names, maps, operand_types):
            check_map(cls.name, f"operand {name}", shapes[name], m, t)
        return [TensorType(tuple(shapes[n]), dtype) for n in cls.result_names]


@register
class Attention(AttentionOp):
    name = "kernel.attention"
    arity = (3, 3)
    operand_names = ("q", "k", "v")
    result_names = ("o", "lse")


@register
class AttentionGrad(AttentionOp):
    name = "kernel.attention_grad"
    arity = (6, 6)
    operand_names = ("q", "k", "v", "o", "lse", "do")
    result_names = ("dq", "dk", "dv")


ATTENTION_OPS = (Attention.name, AttentionGrad.name)
