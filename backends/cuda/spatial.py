"""Convolutions and pools of the cuda backend (the window kernel bodies are in conv.py).

conv2d and its gradients are im2col / col2im kernels around cuBLAS GEMMs (a 1x1 stride-1
unpadded conv reads its input as the columns, no copy; the weight gradient transposes the
output gradient first when the batch is over 1); the pools and their gradients are one
map kernel over their output. Each lowering takes the graph's `codegen.Lowering` in
progress and one op, and adds the op's slots and steps. The other ops with kernels of
their own are in windows.py, indexing.py, dropout.py, collective.py and attention.py.
"""

from __future__ import annotations

import math

from ...ir import Operation, Value
from ...ir.dialects.kernel import conv_output
from ..strides import contiguous_strides
from . import conv as C
from . import launch as L
from .program import View
from .templates import Extra, map_kernel, out_operands, transpose_kernel


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
    conv_into(lw, op, lw.result(op.result))


def conv_into(lw, op: Operation, out: int) -> None:
    """conv2d(x, w) of an `ember.conv2d` or `kernel.conv2d` into slot `out`."""
    x, w = op.operands[:2]
    win, g, n, c, co, kk, pointwise = _conv_geometry(op, x.type.shape, w.type.shape)
    p = win.oh * win.ow
    if pointwise:
        cols = View(lw.where[x], (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p))))
    else:
        slot = _im2col(lw, op, x, win, g, "ngkp", "_im2col")
        cols = View(slot, (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p))))
    lw.gemm(View(out, (n, g, co // g, p), tuple(contiguous_strides((n, g, co // g, p)))),
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


def _conv2d_nhwc(lw, op: Operation) -> None:
    conv_nhwc_into(lw, op, lw.result(op.result))


def conv_nhwc_into(lw, op: Operation, out: int) -> None:
    """An `ember.conv2d_nhwc`'s or `kernel.conv2d_nhwc`'s conv into slot `out`, one thread
    per output element (the layout pass makes this op for the cpu only, so here it is
    hand-written IR's: correct, not tuned)."""
    x, w = op.operands[:2]
    shape = conv_output(op)
    k = map_kernel(lw.name(op), shape, out_operands([x.type.dtype], shape), [],
                   C.conv_nhwc_body(op, L.index_type(math.prod(shape), x.type.size)),
                   extras=[Extra(v.type.dtype, v.type.size) for v in (x, w)], sm_count=lw.sm)
    lw.launch(k, [out, lw.where[x], lw.where[w]])


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


LOWERINGS = {
    "ember.conv2d": _conv2d,
    "ember.conv2d_nhwc": _conv2d_nhwc,
    "ember.conv2d_grad_input": _conv2d_grad_input,
    "ember.conv2d_grad_weight": _conv2d_grad_weight,
    "ember.max_pool2d": _pool,
    "ember.avg_pool2d": _pool,
    "ember.max_pool2d_grad": _pool,
    "ember.avg_pool2d_grad": _pool,
}
