"""Window ops of the cuda backend: slice, unslice and concat, each one map kernel.

slice reads its input through a window (an operand with strides and an element offset),
unslice is a memset (when the window does not cover the result) and one map kernel writing
through that window, concat one map kernel over the result (over a slab of it per
CONCAT_OPERANDS operands) that picks each element's operand by its coordinate along the
axis. Each lowering takes the graph's `codegen.Lowering` in progress and one op, and adds
the op's slots and steps.
"""

from __future__ import annotations

import math

from ...ir import Operation, TensorType, Value
from ..strides import contiguous_strides
from .program import Memset
from .templates import Extra, Kernel, Operand, coordinate, map_kernel

CONCAT_OPERANDS = 256  # most operands one concat kernel reads: 2 KiB of pointer params


def _dense(t: TensorType) -> Operand:
    return Operand(t.dtype, tuple(contiguous_strides(t.shape)))


def _window(t: TensorType, attrs: dict) -> Operand:
    """The elements of a contiguous `t` that slice {start, step} reads: strides and offset."""
    st = contiguous_strides(t.shape)
    return Operand(t.dtype, tuple(s * k for s, k in zip(st, attrs["step"])),
                   sum(s * a for s, a in zip(st, attrs["start"])))


def _copy(lw, op: Operation, shape, dst: Operand, src: Operand, out: int, x: Value) -> None:
    """One map kernel over `shape`: out[dst window] = x[src window]."""
    k = map_kernel(lw.name(op), shape, [dst], [src], lambda vals, i: ([], vals), sm_count=lw.sm)
    lw.launch(k, [out, lw.where[x]])


def _slice(lw, op: Operation) -> None:
    (x,), t = op.operands, op.result.type
    _copy(lw, op, t.shape, _dense(t), _window(x.type, op.attributes), lw.result(op.result), x)


def _unslice(lw, op: Operation) -> None:
    (x,), t = op.operands, op.result.type
    out = lw.result(op.result)
    if x.type.size < t.size:  # zeros around the window
        lw.p.steps.append(Memset(out, lw.op_index))
    _copy(lw, op, x.type.shape, _window(t, op.attributes), _dense(x.type), out, x)


def _concat(lw, op: Operation) -> None:
    """One map kernel over the result (over a slab of it per CONCAT_OPERANDS operands, so
    one nearly always): each element reads the operand its coordinate along the axis
    falls in, found by bisection (nested selects, log2 of the operand count deep)."""
    t = op.result.type
    axis = op.attributes["axis"] % t.rank
    parts, at = [], 0  # (operand, its start along the axis); empty ones read nothing
    for v in op.operands:
        if v.type.shape[axis]:
            parts.append((v, at))
        at += v.type.shape[axis]
    out = lw.result(op.result)
    groups = [parts[g:g + CONCAT_OPERANDS] for g in range(0, len(parts), CONCAT_OPERANDS)]
    for n, group in enumerate(groups):
        k = _concat_kernel(lw.name(op, f"_{n}" if len(groups) > 1 else ""), t, axis, group,
                           lw.sm)
        lw.launch(k, [out] + [lw.where[v] for v, _ in group])


def _concat_kernel(name: str, t: TensorType, axis: int, group: list[tuple[Value, int]],
                   sm_count: int) -> Kernel:
    """out[slab] = concat(group), the slab being the group's rows along `axis` of `t`."""
    first, (last, end) = group[0][1], group[-1]
    m = end + last.type.shape[axis] - first  # the slab's extent along the axis
    shape = (*t.shape[:axis], m, *t.shape[axis + 1:])
    inner = math.prod(shape[axis + 1:])
    outer = math.prod(shape[:axis])

    def pick(lo: int, hi: int, i: str) -> str:
        if hi - lo == 1:  # slab index i less what other operands hold before it: the
            # rest of each earlier outer row (q_ of them), the operands ahead in this one
            v, a = group[lo]
            rest = m - v.type.shape[axis]
            skip = ([f"q_ * {rest * inner}"] if rest and outer > 1 else []) + (
                [str((a - first) * inner)] if a > first else [])
            return f"ex{lo}[{' - '.join([i, *skip])}]"
        mid = (lo + hi) // 2
        return f"(c_ < {group[mid][1] - first} ? {pick(lo, mid, i)} : {pick(mid, hi, i)})"

    def body(vals, i):
        stmts = []
        if len(group) > 1:  # c_: the coordinate along the axis; q_: the outer index
            stmts.append(f"const long long c_ = {coordinate(i, shape, axis)};")
            if outer > 1:
                stmts.append(f"const long long q_ = {i} / {m * inner};")
        return stmts, [pick(0, len(group), i)]

    dst = Operand(t.dtype, tuple(contiguous_strides(t.shape)), first * inner)
    return map_kernel(name, shape, [dst], [], body,
                      extras=[Extra(t.dtype, v.type.size) for v, _ in group], sm_count=sm_count)


LOWERINGS = {
    "ember.slice": _slice,
    "ember.unslice": _unslice,
    "ember.concat": _concat,
}
