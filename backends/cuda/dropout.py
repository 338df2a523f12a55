"""Dropout in the cuda backend: one map kernel over the result, each element zeroed or
scaled by 1 / (1 - p) as `scalar.dropout`'s counter hash of (seed, key, the step operand,
its coordinates) decides: the mask of `backends/interpreter/rng.py` bit for bit. The
lowering takes the graph's `codegen.Lowering` in progress and one op, and adds the op's
slot and launch.
"""

from __future__ import annotations

from ...ir import Operation
from ..strides import contiguous_strides
from .scalar import dropout
from .templates import Operand, coordinate, map_kernel, out_operands


def _dropout(lw, op: Operation) -> None:
    x, rng = op.operands
    t, a = op.result.type, op.attributes
    ins = [Operand(t.dtype, tuple(contiguous_strides(t.shape))), Operand("i64", (0,) * t.rank)]

    def body(vals, i):
        coords = [coordinate(i, t.shape, k) for k in range(t.rank)]
        return [], [dropout(vals[0], vals[1], coords, a, t.dtype, t.shape[0] if t.rank else 0)]

    out = lw.result(op.result)
    lw.launch(map_kernel(lw.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                         sm_count=lw.sm), [out, lw.where[x], lw.where[rng]])


LOWERINGS = {"ember.dropout": _dropout}
