"""Ops with their own cuda kernels: slice, unslice and concat, one-hot, dropout, gather
and scatter_add, the convolutions and the pools (the window kernel bodies are in conv.py),
and fused attention (attention.py).

Each lowering takes the graph's `codegen.Lowering` in progress and one op, and adds the
op's slots and steps: slice is one map kernel reading its input through a window (an
operand with strides and an element offset), unslice a memset and one map kernel writing
through that window, concat one map kernel over the result that picks each element's
operand by its coordinate along the axis; conv2d and its gradients are im2col / col2im
kernels around cuBLAS GEMMs (a 1x1 stride-1 unpadded conv reads its input as the
columns, no copy); pools are one map kernel over their output; scatter_add is a memset
and an atomic-add kernel.
"""

from __future__ import annotations

import math

from ...ir import Operation, TensorType, Value
from ..errors import UnsupportedOpError
from ..strides import contiguous_strides
from . import conv as C
from . import launch as L
from .attention import LOWERINGS as ATTENTION
from .program import HostAllReduce, Memset, View
from .scalar import ctype, dropout, literal
from .templates import (
    Extra,
    Kernel,
    Operand,
    coordinate,
    map_kernel,
    out_operands,
    transpose_kernel,
)

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


def _one_hot(lw, op: Operation) -> None:
    (labels,), t = op.operands, op.result.type
    ins = [Operand(labels.type.dtype, (*contiguous_strides(labels.type.shape), 0))]

    def body(vals, i):
        hit = f"((long long){vals[0]} == (long long){coordinate(i, t.shape, t.rank - 1)})"
        return [], [hit if t.dtype == "i1" else f"(({ctype(t.dtype)}){hit})"]

    out = lw.result(op.result)
    lw.launch(map_kernel(lw.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                         sm_count=lw.sm), [out, lw.where[labels]])


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


def _conv_geometry(op: Operation, x_shape, w_shape):
    a = op.attributes
    win = C.Window.conv(x_shape, w_shape, a)
    g = a["groups"]
    n, c = x_shape[:2]
    co = w_shape[0]
    kk = (c // g) * win.kh * win.kw
    pointwise = (win.kh == win.kw == 1 and a["stride"] == [1, 1] and a["padding"] == [0, 0])
    return win, g, n, c, co, kk, pointwise


def _im2col(lw, op: Operation, x: Value, win, g, layout: str, suffix: str) -> int:
    n, c = x.type.shape[:2]
    kk, p = (c // g) * win.kh * win.kw, win.oh * win.ow
    shape = (n, g, kk, p) if layout == "ngkp" else (g, kk, n, p)
    dt = x.type.dtype
    cols = lw.scratch(shape, dt)
    itype = L.index_type(math.prod(shape), x.type.size)
    k = map_kernel(lw.name(op, suffix), shape, out_operands([dt], shape), [],
                   C.im2col_body(n, c, g, win, layout, itype, dt), extras=[Extra(dt, x.type.size)],
                   sm_count=lw.sm)
    lw.launch(k, [cols, lw.where[x]])
    return cols


def _conv2d(lw, op: Operation) -> None:
    x, w = op.operands
    win, g, n, c, co, kk, pointwise = _conv_geometry(op, x.type.shape, w.type.shape)
    p = win.oh * win.ow
    lw.result(op.result)
    if pointwise:
        cols = View(lw.where[x], (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p))))
    else:
        slot = _im2col(lw, op, x, win, g, "ngkp", "_im2col")
        cols = View(slot, (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p))))
    lw.gemm(lw.view(op.result, (n, g, co // g, p)),
            lw.view(w, (1, g, co // g, kk)), cols)


def _conv2d_grad_input(lw, op: Operation) -> None:
    gy, w = op.operands
    x_shape = tuple(op.attributes["input_shape"])
    win, g, n, c, co, kk, pointwise = _conv_geometry(op, x_shape, w.type.shape)
    p = win.oh * win.ow
    dt = gy.type.dtype
    out = lw.result(op.result)
    wt = View(lw.where[w], (1, g, kk, co // g), (0, (co // g) * kk, 1, kk))  # w^T per group
    gv = lw.view(gy, (n, g, co // g, p))
    if pointwise:
        lw.gemm(lw.view(op.result, (n, g, kk, p)), wt, gv)
        return
    dcols = lw.scratch((n, g, kk, p), dt)
    lw.gemm(View(dcols, (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p)))), wt, gv)
    itype = L.index_type(math.prod(x_shape), n * g * kk * p)
    acc = "double" if dt == "f64" else "float"
    k = map_kernel(lw.name(op, "_col2im"), x_shape, out_operands([dt], x_shape), [],
                   C.col2im_body(c, g, win, itype, dt, acc),
                   extras=[Extra(dt, n * g * kk * p)], sm_count=lw.sm)
    lw.launch(k, [out, dcols])


def _conv2d_grad_weight(lw, op: Operation) -> None:
    x, gy = op.operands
    w_shape = tuple(op.attributes["weight_shape"])
    win, g, n, c, co, kk, pointwise = _conv_geometry(op, x.type.shape, w_shape)
    p = win.oh * win.ow
    lw.result(op.result)
    if n == 1:
        gt = lw.view(gy, (g, co // g, p))
    else:  # [n, g, co/g, p] -> [g, co/g, n, p], so one GEMM contracts over n and p
        slot = lw.scratch((g, co // g, n, p), gy.type.dtype)
        k = transpose_kernel(lw.name(op, "_transpose"), (n, g, co // g, p), [1, 2, 0, 3],
                             gy.type.dtype, lw.sm)
        lw.launch(k, [slot, lw.where[gy]])
        gt = View(slot, (g, co // g, n * p), tuple(contiguous_strides((g, co // g, n * p))))
    if pointwise and n == 1:
        cols_t = View(lw.where[x], (g, p, kk), (kk * p, 1, p))
    else:
        slot = _im2col(lw, op, x, win, g, "gknp", "_im2col")
        cols_t = View(slot, (g, n * p, kk), (kk * n * p, 1, n * p))
    lw.gemm(lw.view(op.result, (g, co // g, kk)), gt, cols_t)


def _pool(lw, op: Operation) -> None:
    x = op.operands[0]
    t, a = op.result.type, op.attributes
    x_shape = a["input_shape"] if op.name == "ember.avg_pool2d_grad" else x.type.shape
    win = C.Window.pool(x_shape, a)
    c = t.shape[1]
    itype = L.index_type(t.size, x.type.size)
    dt = t.dtype
    make = {"ember.max_pool2d": C.max_pool_body, "ember.avg_pool2d": C.avg_pool_body,
            "ember.max_pool2d_grad": C.max_pool_grad_body,
            "ember.avg_pool2d_grad": C.avg_pool_grad_body}[op.name]
    extras = [Extra(v.type.dtype, v.type.size) for v in op.operands]
    out = lw.result(op.result)
    k = map_kernel(lw.name(op), t.shape, out_operands([dt], t.shape), [],
                   make(c, win, itype, dt), extras=extras, sm_count=lw.sm)
    lw.launch(k, [out] + [lw.where[v] for v in op.operands])


def _allreduce(lw, op: Operation) -> None:
    lw.p.steps.append(HostAllReduce(lw.result(op.result), lw.where[op.operands[0]],
                                    lw.op_index))


LOWERINGS = {
    "ember.slice": _slice,
    "ember.unslice": _unslice,
    "ember.concat": _concat,
    "ember.allreduce": _allreduce,
    "ember.one_hot": _one_hot,
    "ember.dropout": _dropout,
    "ember.gather": _gather,
    "ember.scatter_add": _scatter_add,
    "ember.conv2d": _conv2d,
    "ember.conv2d_grad_input": _conv2d_grad_input,
    "ember.conv2d_grad_weight": _conv2d_grad_weight,
    "ember.max_pool2d": _pool,
    "ember.avg_pool2d": _pool,
    "ember.max_pool2d_grad": _pool,
    "ember.avg_pool2d_grad": _pool,
    **ATTENTION,  # kernel.attention, kernel.attention_grad
}
