"""Fused attention in the `kernel` dialect: what `fuse` makes of a decomposed
softmax(q k^T * scale + causal mask) v and of its backward, so the [..., Tq, Tk] scores
are never stored.

Every operand is a strided view of its buffer: `maps[k]` holds one element stride per
dim of operand k's logical shape, so q, k and v are read in place from the [B, T, H, D]
projections a multi-head attention splits them from (no transpose is ever copied).
`batch` lists the leading dims, `sizes` is [Tq, Tk, D, Dv]; logical shapes are
q [*batch, Tq, D], k [*batch, Tk, D], v [*batch, Tk, Dv], o and do [*batch, Tq, Dv],
lse [*batch, Tq]. Results are contiguous in their logical shapes unless the op carries
`out_maps` and `out_types` (both or neither): then result k is a buffer of type
`out_types[k]` whose element at logical index i is `flat[sum(i * out_maps[k])]`, each
element written once, so o, dq, dk and dv land in the [B, T, H, D] layout the projections
read (no transpose is copied after the op either); an f32 result may be stored as bf16
(rounded, as a cast would round it).

`kernel.attention(q, k, v) -> (o, lse)`: o = softmax(s) v with s = q k^T * scale (key j
hidden from query i when j > i if `causal`), and lse = logsumexp over each row of s,
which the backward needs to rebuild the probabilities block by block::

    %o, %lse = "kernel.attention"(%q, %k, %v) {batch = [16, 4], causal = true,
        maps = [[16384, 16, 64, 1], ...], scale = 0.25 : f64, sizes = [256, 256, 16, 16]}

On bf16 q, k and v (`low-precision-attention`) a `kernel.attention` returns f32 o and lse:
the attention of those bf16 values, its sums in f32; a backend may multiply v by the
probabilities rounded to bf16, as bf16 flash attention does (PyTorch's too). Likewise a
`kernel.attention_grad` on bf16 q, k, v and do (o f32 or bf16, lse f32) returns f32
gradients, its p and ds possibly rounded to bf16 before they multiply.

`kernel.attention_grad(q, k, v, o, lse, do) -> (dq, dk, dv)`: the gradients of o with
respect to q, k and v given do, with p = exp(s - lse) recomputed and
ds = p * (do v^T - rowsum(do * o)) * scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..opdef import OPS, SHAPE, InferenceError, OpDef, register, same_dtype
from ..types import TensorType, Type
from .kernel import check_cover, check_map

if TYPE_CHECKING:
    from ..core import Operation

ATTRS = {"batch": SHAPE, "sizes": SHAPE, "maps": (list,), "causal": bool, "scale": float}
LAYOUT = {"out_maps": (list,), "out_types": (list,)}


def logical_shapes(attrs: dict[str, Any]) -> dict[str, list[int]]:
    """The logical shape of every operand and result name, from `batch` and `sizes`."""
    b, (tq, tk, d, dv) = list(attrs["batch"]), attrs["sizes"]
    return {"q": b + [tq, d], "k": b + [tk, d], "v": b + [tk, dv], "o": b + [tq, dv],
            "lse": b + [tq], "do": b + [tq, dv], "dq": b + [tq, d], "dk": b + [tk, d],
            "dv": b + [tk, dv]}


def result_maps(op_name: str, attrs: dict[str, Any]) -> list[list[int]]:
    """Each result's element strides over its logical shape: `out_maps`, or contiguous."""
    if "out_maps" in attrs:
        out_maps: list[list[int]] = attrs["out_maps"]
        return out_maps
    shapes = logical_shapes(attrs)
    op = OPS[op_name]
    assert issubclass(op, AttentionOp)  # one of ATTENTION_OPS
    return [[math.prod(s[i + 1:]) for i in range(len(s))]
            for s in (shapes[n] for n in op.result_names)]


class AttentionOp(OpDef):
    """Shared checks: one map per operand over its logical shape, one float dtype, and
    results that cover their buffers."""

    traits = frozenset({"pure", "compute_bound"})
    attrs = ATTRS
    optional_attrs = LAYOUT
    operand_names: tuple[str, ...] = ()
    result_names: tuple[str, ...] = ()
    # low-precision-attention's operands: these bf16 (the others f32), and those either
    bf16_operands: tuple[str, ...] = ()
    either_operands: tuple[str, ...] = ()

    @classmethod
    def result_dtype(cls, types: list[TensorType]) -> str:
        """The results' dtype: the operands', f32 or f64; f32 where `bf16_operands` are
        bf16, `either_operands` bf16 or f32 and the others f32."""
        by_name = {n: t.dtype for n, t in zip(cls.operand_names, types)}
        if cls.bf16_operands and all(by_name[n] == "bf16" for n in cls.bf16_operands) and all(
                d == "f32" or (n in cls.either_operands and d == "bf16")
                for n, d in by_name.items() if n not in cls.bf16_operands):
            return "f32"
        dtype = same_dtype(cls.name, types)
        if dtype not in ("f32", "f64"):
            raise InferenceError(f"{cls.name} needs f32 or f64 operands (or bf16 "
                                 f"{', '.join(cls.bf16_operands)}), got {dtype}")
        return dtype

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        if len(attrs["sizes"]) != 4 or not all(attrs["sizes"]):
            raise InferenceError(f"{cls.name}: sizes must be [Tq, Tk, D, Dv], each > 0, got "
                                 f"{attrs['sizes']}")
        if math.prod(attrs["batch"]) == 0:
            raise InferenceError(f"{cls.name}: batch {attrs['batch']} is empty")
        dtype = cls.result_dtype(operand_types)
        maps = attrs["maps"]
        if len(maps) != len(operand_types):
            raise InferenceError(f"{cls.name}: {len(operand_types)} operands but {len(maps)} "
                                 "maps")
        shapes = logical_shapes(attrs)
        for name, m, t in zip(cls.operand_names, maps, operand_types):
            check_map(cls.name, f"operand {name}", shapes[name], m, t)
        if ("out_maps" in attrs) != ("out_types" in attrs):
            raise InferenceError(f"{cls.name}: out_maps and out_types come together")
        if "out_types" not in attrs:
            return [TensorType(tuple(shapes[n]), dtype) for n in cls.result_names]
        outs, out_maps = attrs["out_types"], attrs["out_maps"]
        stored = (dtype, "bf16") if dtype == "f32" else (dtype,)  # bf16: the f32 rounded
        if len(outs) != len(cls.result_names) or len(out_maps) != len(outs) or not all(
                isinstance(t, TensorType) and t.dtype in stored for t in outs):
            raise InferenceError(f"{cls.name}: out_types and out_maps must list one "
                                 f"{' or '.join(stored)} tensor type and one map per result "
                                 f"({', '.join(cls.result_names)}), got {outs!r}")
        for k, (name, m, t) in enumerate(zip(cls.result_names, out_maps, outs)):
            check_map(cls.name, f"result {name}", shapes[name], m, t)
            check_cover(cls.name, k, shapes[name], m, t)
        return list(outs)


@register
class Attention(AttentionOp):
    name = "kernel.attention"
    arity = (3, 3)
    operand_names = ("q", "k", "v")
    result_names = ("o", "lse")
    bf16_operands = ("q", "k", "v")


@register
class AttentionGrad(AttentionOp):
    name = "kernel.attention_grad"
    arity = (6, 6)
    operand_names = ("q", "k", "v", "o", "lse", "do")
    result_names = ("dq", "dk", "dv")
    bf16_operands = ("q", "k", "v", "do")
    either_operands = ("o",)


ATTENTION_OPS = (Attention.name, AttentionGrad.name)


@dataclass(frozen=True)
class AttentionShape:
    """One attention op's static shape, for any backend: the batch dims, the sizes, causal,
    scale, the dtype, and each operand's and result's element strides over its logical
    shape (`maps` and `result_maps`), by buffer name (q, k, v, ... then o, lse or dq, dk,
    dv)."""

    batch: tuple[int, ...]
    tq: int
    tk: int
    d: int
    dv: int
    causal: bool
    scale: float
    dtype: str
    maps: dict[str, tuple[int, ...]]


def attention_shape(op: Operation) -> AttentionShape:
    """The AttentionShape of a (verified) `kernel.attention` or `kernel.attention_grad` op."""
    cls, a = OPS[op.name], op.attributes
    assert issubclass(cls, AttentionOp)  # one of ATTENTION_OPS
    t = op.operands[0].type
    assert isinstance(t, TensorType)
    tq, tk, d, dv = (int(n) for n in a["sizes"])
    maps = {name: tuple(m) for name, m in zip(cls.operand_names + cls.result_names,
                                               a["maps"] + result_maps(op.name, a))}
    return AttentionShape(tuple(a["batch"]), tq, tk, d, dv, bool(a["causal"]),
                          float(a["scale"]), t.dtype, maps)
