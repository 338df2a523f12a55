"""Pooling and gather/scatter on the cpu (convolutions: conv.py).

Pools walk their windows directly; out-of-range taps are padding (never a max, zero in an
average).

Gather and scatter_add check every index: an index outside the table writes nothing
and records the kernel in the module's `ember_status` word, which the executable turns
into an IndexError naming the op — generated code never reads or writes out of bounds.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ..parallel.outline import parallel_chunks, parallel_region
from . import scalar as S
from .conv import Conv, tap_position
from .loops import fill_zero, for_range, loop
from .scalar import I64, i64

STATUS = "ember_status"


# -- pooling ------------------------------------------------------------------------------------

class Pool(Conv):
    def __init__(self, op):
        a = op.attributes
        self.name = op.name
        (self.kh, self.kw), (self.sh, self.sw), (self.ph, self.pw) = (
            a["kernel"], a["stride"], a["padding"])
        self.dh = self.dw = 1
        x = op.result.type if op.name in ("ember.max_pool2d_grad", "ember.avg_pool2d_grad") \
            else op.operands[0].type
        y = op.operands[-1].type if op.name.endswith("_grad") else op.result.type
        self.dtype = x.dtype
        self.n, self.c, self.h, self.w = x.shape
        self.oh, self.ow = y.shape[2:]


def emit_pool(b: ir.IRBuilder, op, outs, ins, threads: int, name: str) -> None:
    """The pool, its planes (image and channel) split across threads: a window never
    crosses a plane, so a gradient's read-modify-writes stay within one thread's planes
    (ResNet-18's 3x3 stride-2 max pool of 64 x 112 x 112 took 0.4 ms on one)."""
    pl = Pool(op)
    dt = pl.dtype
    el = S.REG[dt]
    out = outs[0]
    grad = op.name.endswith("_grad")
    padded = pl.ph or pl.pw  # without padding every tap is inside: no checks
    # windows that tile the input without overlap: each max_pool2d_grad window writes its
    # own taps (the gradient at the first maximum, zeros elsewhere) with no read-modify-write
    tiles = (op.name == "ember.max_pool2d_grad" and not padded and pl.sh >= pl.kh
             and pl.sw >= pl.kw)
    exact = tiles and (pl.sh, pl.sw) == (pl.kh, pl.kw) and (pl.oh * pl.kh, pl.ow * pl.kw) == (
        pl.h, pl.w)
    zero = grad and not exact  # (each thread zeroes its own planes of the gradient first)
    if pl.n * pl.c == 0:  # (a pool's output is at least 1 x 1)
        return
    is_max = op.name.startswith("ember.max_pool2d")
    inv = S.const(dt, 1.0 / (pl.kh * pl.kw))

    def window(b, ins, out, nc, oh, ow):
        o_off = b.add(b.mul(b.add(b.mul(nc, i64(pl.oh)), oh), i64(pl.ow)), ow)

        def x_off(h, w):
            return b.add(b.mul(b.add(b.mul(nc, i64(pl.h)), h), i64(pl.w)), w)

        taps = [(i, j) for i in range(pl.kh) for j in range(pl.kw)]
        if op.name == "ember.avg_pool2d_grad":
            gv = b.fmul(S.load(b, ins[0], dt, o_off), inv)
            for i, j in taps:
                h, w, inside = tap_position(b, pl, oh, ow, i64(i), i64(j))
                with b.if_then(inside):
                    off = x_off(h, w)
                    S.store(b, out, dt, off, b.fadd(S.load(b, out, dt, off), gv))
            return
        best, where = ir.Constant(el, float("-inf")) if is_max else S.const(dt, 0), i64(-1)
        first = i64(0)  # which tap won (for `tiles`)
        offs = []
        for t_i, (i, j) in enumerate(taps):
            if padded:
                h, w, inside = tap_position(b, pl, oh, ow, i64(i), i64(j))
                off = x_off(b.select(inside, h, i64(0)), b.select(inside, w, i64(0)))
                pad = ir.Constant(el, float("-inf")) if is_max else S.const(dt, 0)
                v = b.select(inside, S.load(b, ins[0], dt, off), pad)
            else:
                inside = ir.Constant(ir.IntType(1), 1)
                off = x_off(b.add(b.mul(oh, i64(pl.sh)), i64(i)),
                            b.add(b.mul(ow, i64(pl.sw)), i64(j)))
                v = S.load(b, ins[0], dt, off)
            offs.append(off)
            if not is_max:
                best = b.fadd(best, v)
                continue
            # numpy argmax: the first maximum, or the first NaN
            best_nan = b.fcmp_unordered("uno", best, best)
            take = b.and_(b.not_(best_nan), b.or_(b.fcmp_ordered(">", v, best),
                                                  b.fcmp_unordered("uno", v, v)))
            if (i, j) == taps[0]:
                take = ir.Constant(ir.IntType(1), 1)
            best = b.select(take, v, best)
            where = b.select(take, b.select(inside, off, i64(-1)), where)
            first = b.select(take, i64(t_i), first)
        if op.name == "ember.max_pool2d":
            S.store(b, out, dt, o_off, best)
        elif op.name == "ember.avg_pool2d":
            S.store(b, out, dt, o_off, b.fmul(best, inv))
        elif tiles:
            gv = S.load(b, ins[1], dt, o_off)
            for t_i, off in enumerate(offs):
                S.store(b, out, dt, off, b.select(b.icmp_signed("==", first, i64(t_i)), gv,
                                                   S.const(dt, 0)))
        elif not padded:  # max_pool2d_grad: the gradient goes to the first maximum
            old = S.load(b, out, dt, where)
            S.store(b, out, dt, where, b.fadd(old, S.load(b, ins[1], dt, o_off)))
        else:  # ... unless that maximum is padding
            with b.if_then(b.icmp_signed(">=", where, i64(0))):
                old = S.load(b, out, dt, where)
                S.store(b, out, dt, where, b.fadd(old, S.load(b, ins[1], dt, o_off)))

    def planes(bb: ir.IRBuilder, ptrs: list, lo, hi) -> None:
        if zero:
            plane = i64(pl.h * pl.w)
            for_range(bb, bb.mul(lo, plane), bb.mul(hi, plane),
                      lambda i: S.store(bb, ptrs[-1], dt, i, S.const(dt, 0)), "z")
        for_range(bb, lo, hi, lambda nc: loop(bb, pl.oh, lambda oh: loop(
            bb, pl.ow, lambda ow: window(bb, ptrs[:-1], ptrs[-1], nc, oh, ow), "ow"), "oh"),
            "nc")

    planes_n = pl.n * pl.c
    t = parallel_chunks(planes_n * pl.oh * pl.ow * pl.kh * pl.kw, planes_n, threads)
    if t == 1:
        planes(b, [*ins, out], i64(0), i64(planes_n))
    else:
        parallel_region(b, f"{name}.planes", [*ins, out], [False] * len(ins) + [True],
                        planes_n, t, planes)


# -- gather / scatter_add --------------------------------------------------------------------

def status(mod: ir.Module) -> ir.GlobalVariable:
    g = mod.globals.get(STATUS)
    if g is None:
        g = ir.GlobalVariable(mod, I64, STATUS)
        g.initializer = i64(0)
    return g


def emit_gather_scatter(b: ir.IRBuilder, op, outs, ins, step: int) -> None:
    """gather(table, idx): out[r] = table[idx[r]]; scatter_add(idx, upd): out = 0, then
    out[idx[r]] += upd[r]. A bad index sets ember_status to step + 1 and is skipped."""
    out = outs[0]
    t = op.result.type
    dt = t.dtype
    if op.name == "ember.gather":
        table, idx = ins
        rows_t = op.operands[0].type.shape[0]
        it = op.operands[1].type
        row = math.prod(op.operands[0].type.shape[1:])
    else:
        idx, upd = ins
        it = op.operands[0].type
        rows_t = t.shape[0]
        row = math.prod(t.shape[1:])
        fill_zero(b, out, dt, t.size)
    flag = status(b.module)

    def one(r):
        j = S.load(b, idx, it.dtype, r)
        j = b.sext(j, I64) if it.dtype != "i64" else j
        ok = b.and_(b.icmp_signed(">=", j, i64(0)), b.icmp_signed("<", j, i64(rows_t)))
        with b.if_else(ok) as (good, bad):
            with good:
                def copy(c):
                    if op.name == "ember.gather":
                        v = S.load(b, table, dt, b.add(b.mul(j, i64(row)), c))
                        S.store(b, out, dt, b.add(b.mul(r, i64(row)), c), v)
                    else:
                        dst = b.add(b.mul(j, i64(row)), c)
                        v = S.load(b, upd, dt, b.add(b.mul(r, i64(row)), c))
                        old = S.load(b, out, dt, dst)
                        S.store(b, out, dt, dst, S.combine(b, "add", old, v, dt))
                loop(b, row, copy, "c")
            with bad:
                cur = b.load(flag, typ=I64)  # the first failing kernel is reported
                b.store(b.select(b.icmp_signed("==", cur, i64(0)), i64(step + 1), cur), flag)
                if op.name == "ember.gather":
                    loop(b, row, lambda c: S.store(b, out, dt, b.add(b.mul(r, i64(row)), c),
                                                   S.const(dt, 0)), "c")

    loop(b, it.size, one, "r")
