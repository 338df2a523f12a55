"""Indexing ops of the cuda backend: one_hot, gather and scatter_add.

one_hot and gather are one map kernel over their result (a gather index out of range reads
0); scatter_add is a memset of the result and one kernel over the updates that adds each
row with atomics (f32, f64, i32 and i64 results; others are refused). Each lowering takes
the graph's `codegen.Lowering` in progress and one op, and adds the op's slots and steps.
"""

from __future__ import annotations

import math

from ...ir import Operation
from ..errors import UnsupportedOpError
from ..strides import contiguous_strides
from .program import Memset
from .scalar import ctype, literal
from .templates import Extra, Operand, coordinate, map_kernel, out_operands


def _one_hot(lw, op: Operation) -> None:
    (labels,), t = op.operands, op.result.type
    ins = [Operand(labels.type.dtype, (*contiguous_strides(labels.type.shape), 0))]

    def body(vals, i):
        hit = f"((long long){vals[0]} == (long long){coordinate(i, t.shape, t.rank - 1)})"
        return [], [hit if t.dtype == "i1" else f"(({ctype(t.dtype)}){hit})"]

    out = lw.result(op.result)
    lw.launch(map_kernel(lw.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                         sm_count=lw.sm), [out, lw.where[labels]])


def _gather(lw, op: Operation) -> None:
    table, idx = op.operands
    t = op.result.type
    rows, row = table.type.shape[0], math.prod(table.type.shape[1:])
    rest = t.rank - idx.type.rank
    ins = [Operand(idx.type.dtype, (*contiguous_strides(idx.type.shape), *(0,) * rest))]

    def body(vals, i):
        at = "j_" if row == 1 else f"j_ * {row} + {i} % {row}"
        return [f"const long long j_ = (long long){vals[0]};"], [
            f"(j_ >= 0 && j_ < {rows} ? ex0[{at}] : {literal(t.dtype, 0)})"]

    out = lw.result(op.result)
    k = map_kernel(lw.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                   extras=[Extra(table.type.dtype, table.type.size)], sm_count=lw.sm)
    lw.launch(k, [out, lw.where[idx], lw.where[table]])


_ATOMIC = {"f32": "atomicAdd(&ex0[{o}], {v})", "f64": "atomicAdd(&ex0[{o}], {v})",
           "i32": "atomicAdd(&ex0[{o}], {v})",
           "i64": "atomicAdd(reinterpret_cast<unsigned long long*>(&ex0[{o}]), "
                  "(unsigned long long){v})"}


def _scatter_add(lw, op: Operation) -> None:
    idx, upd = op.operands
    t = op.result.type
    if t.dtype not in _ATOMIC:
        raise UnsupportedOpError(f"the cuda backend has no scatter_add of {t.dtype} tensors")
    rows, row = t.shape[0], math.prod(t.shape[1:])
    u = upd.type
    rest = u.rank - idx.type.rank
    ins = [Operand(idx.type.dtype, (*contiguous_strides(idx.type.shape), *(0,) * rest)),
           Operand(u.dtype, tuple(contiguous_strides(u.shape)))]

    def body(vals, i):
        at = "j_" if row == 1 else f"j_ * {row} + {i} % {row}"
        return [f"const long long j_ = (long long){vals[0]};",
                f"if (j_ >= 0 && j_ < {rows}) {_ATOMIC[t.dtype].format(o=at, v=vals[1])};"], []

    out = lw.result(op.result)
    lw.p.steps.append(Memset(out, lw.op_index))
    k = map_kernel(lw.name(op), u.shape, [], ins, body,
                   extras=[Extra(t.dtype, t.size, writable=True)], vectorize=False,
                   sm_count=lw.sm)
    lw.launch(k, [lw.where[idx], lw.where[upd], out])


LOWERINGS = {
    "ember.one_hot": _one_hot,
    "ember.gather": _gather,
    "ember.scatter_add": _scatter_add,
}
