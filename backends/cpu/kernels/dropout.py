"""Dropout on the cpu: the counter-based hash that keeps or drops each element, shared by
the fused kernels (`kernel.dropout`) and the unfused `ember.dropout` kernel, so both draw
the mask every backend draws: a function of (seed, key, step, coordinates) only."""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from . import scalar as S
from .loops import loop
from .scalar import I32, i64


def _mix(b, x):
    x = b.xor(x, b.lshr(x, ir.Constant(I32, 16)))
    x = b.mul(x, ir.Constant(I32, 0x7FEB352D))
    x = b.xor(x, b.lshr(x, ir.Constant(I32, 15)))
    x = b.mul(x, ir.Constant(I32, 0x846CA68B))
    return b.xor(x, b.lshr(x, ir.Constant(I32, 16)))


def dropout(b: ir.IRBuilder, x, step, coords: list, attrs: dict, dtype: str, rows: int):
    """One element of `ember.dropout`, at `coords` (i64, one per axis) of a result whose
    first dimension is `rows` (reference: backends/interpreter/rng.py)."""
    p = float(attrs["p"])
    if p == 0:
        return x
    index = ir.Constant(I32, 0)
    for k, c in enumerate(coords):
        if k == 0:
            c = b.add(c, b.mul(b.ashr(step, i64(32)), i64(rows)))
        index = _mix(b, b.xor(index, b.trunc(c, I32)))
    seed = ir.Constant(I32, int(attrs["seed"]) & 0xFFFFFFFF)
    key = ir.Constant(I32, int(attrs["key"]) & 0xFFFFFFFF)
    h = _mix(b, b.xor(seed, _mix(b, b.xor(key, _mix(b, b.xor(b.trunc(step, I32), index))))))
    threshold = math.ceil(p * 2.0 ** 24)
    keep = b.icmp_unsigned(">=", b.lshr(h, ir.Constant(I32, 8)), ir.Constant(I32, threshold))
    scale = S.const(dtype, _round(1.0 - p, dtype))
    return b.select(keep, b.fdiv(x, scale), S.const(dtype, 0.0))


def _round(v: float, dtype: str) -> float:
    return float(np.float32(v)) if dtype == "f32" else float(v)


def emit_dropout(b: ir.IRBuilder, op, outs, ins) -> None:
    """The unfused op: a loop nest over the result, its coordinates at hand."""
    t = op.result.type
    x, rng = ins
    step = S.load(b, rng, "i64", i64(0))
    shape = t.shape

    def nest(k: int, coords: list, flat) -> None:
        if k == len(shape):
            S.store(b, outs[0], t.dtype, flat, dropout(
                b, S.load(b, x, t.dtype, flat), step, coords, op.attributes, t.dtype,
                shape[0] if shape else 0))
            return
        loop(b, shape[k], lambda i: nest(k + 1, [*coords, i],
                                          b.add(b.mul(flat, i64(shape[k])), i)), f"d{k}")

    nest(0, [], i64(0))
