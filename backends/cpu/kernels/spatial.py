"""Convolutions, pooling and gather/scatter on the cpu.

Convolutions are im2col into scratch memory, then the GEMM (ember's own or OpenBLAS,
chosen as for matmuls), per image and group:
- conv2d:              Y[n, g]  = W[g] (Og x K)          @ cols(x[n, g]) (K x P)
- conv2d_grad_weight:  dW[g]   += G[n, g] (Og x P)       @ cols(x[n, g])^T (P x K)
- conv2d_grad_input:   dcols    = W[g]^T (K x Og)        @ G[n, g] (Og x P), then col2im
with K = c_in/groups * kh * kw and P = oh * ow. Images are split across threads when the
work is large (each thread has its own columns buffer). Pools walk their windows
directly; out-of-range taps are padding (never a max, zero in an average).

Gather and scatter_add check every index: an index outside the table writes nothing
and records the kernel in the module's `ember_status` word, which the executable turns
into an IndexError naming the op — generated code never reads or writes out of bounds.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ..call.buffers import regions
from ..gemm.emit import GemmProblem
from ..gemm.matmul import byte_offset, engine_for, gemm_call, gemm_scratch
from ..machine.host import Isa
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from . import scalar as S
from .loops import for_range, loop
from .scalar import I64, i64

STATUS = "ember_status"


# -- convolution geometry ---------------------------------------------------------------------

class Conv:
    """Sizes of one conv op: x [n, c, h, w], w [o, c/g, kh, kw], y [n, o, oh, ow]."""

    def __init__(self, op):
        a = op.attributes
        self.name = op.name
        self.g = a["groups"]
        (self.sh, self.sw), (self.ph, self.pw) = a["stride"], a["padding"]
        self.dh, self.dw = a["dilation"]
        if op.name == "ember.conv2d":
            x, w, y = op.operands[0].type, op.operands[1].type, op.result.type
        elif op.name == "ember.conv2d_grad_input":
            y, w, x = op.operands[0].type, op.operands[1].type, op.result.type
        else:
            x, y, w = op.operands[0].type, op.operands[1].type, op.result.type
        self.dtype = x.dtype
        self.n, self.c, self.h, self.w = x.shape
        self.o, self.cg, self.kh, self.kw = w.shape
        self.oh, self.ow = y.shape[2:]
        self.og = self.o // self.g
        self.k = self.cg * self.kh * self.kw
        self.p = self.oh * self.ow

    def problem(self) -> GemmProblem:
        """The per-(image, group) GEMM."""
        k, p, og = self.k, self.p, self.og
        if self.name == "ember.conv2d":
            return GemmProblem(og, p, k, k, 1, p, 1, p, self.dtype)
        if self.name == "ember.conv2d_grad_weight":  # B = transposed columns, P x K
            return GemmProblem(og, k, p, p, 1, k, 1, k, self.dtype)
        return GemmProblem(k, p, og, 1, k, p, 1, p, self.dtype)

    def threads(self, threads: int) -> int:
        if self.name == "ember.conv2d_grad_weight":
            return 1  # images accumulate into one dW
        work = 2 * self.n * self.o * self.p * self.k
        return parallel_chunks(work / 8, self.n, threads)

    def scratch(self, isa: Isa) -> tuple[int, int]:
        """(bytes of one thread's scratch, where its GEMM's part starts after its columns
        buffer); threads' parts follow each other."""
        p = self.problem()
        cols = self.k * self.p * S.size(self.dtype)
        (_, gemm), per = regions(cols, gemm_scratch(p, engine_for(p, isa, 1), isa, 1))
        return per, gemm


def conv_scratch(op, isa: Isa, threads: int) -> int:
    cv = Conv(op)
    return cv.threads(threads) * cv.scratch(isa)[0]


def _taps(b, cv: Conv, oh, ow, i, j):
    """(input row, input col, inside?) of tap (i, j) of output position (oh, ow)."""
    h = b.sub(b.add(b.mul(oh, i64(cv.sh)), b.mul(i, i64(cv.dh))), i64(cv.ph))
    w = b.sub(b.add(b.mul(ow, i64(cv.sw)), b.mul(j, i64(cv.dw))), i64(cv.pw))
    inside = b.and_(b.and_(b.icmp_signed(">=", h, i64(0)), b.icmp_signed("<", h, i64(cv.h))),
                    b.and_(b.icmp_signed(">=", w, i64(0)), b.icmp_signed("<", w, i64(cv.w))))
    return h, w, inside


def _valid(n_out: int, size: int, stride: int, pad: int, tap: int, dil: int) -> range:
    """Output positions whose input coordinate o*stride - pad + tap*dil lies in [0, size)."""
    lo = max(0, -(-(pad - tap * dil) // stride))
    hi = min(n_out, (size - 1 + pad - tap * dil) // stride + 1)
    return range(lo, max(lo, hi))


def _ranges(n: int, valid: range) -> list[tuple[int, int, bool]]:
    """[0, n) as (start, stop, inside) pieces around `valid`."""
    out = [(0, valid.start, False), (valid.start, valid.stop, True), (valid.stop, n, False)]
    return [r for r in out if r[1] > r[0]]


def _cols_layout(cv: Conv, transposed: bool) -> tuple[int, int]:
    """(stride of a column-matrix row (c, i, j), stride of a position p)."""
    return (1, cv.k) if transposed else (cv.p, 1)


def _span(b, n: int, body, name: str, start: int = 0) -> None:
    loop(b, n, lambda i: body(b.add(i, i64(start)) if start else i), name)


def _each_tap(b, cv: Conv, n, g, body) -> None:
    """For each channel c of group g of image n and each kernel tap (i, j):
    body(chan, i, j, vh, vw, row): `chan` the input channel's row of x, `vh`/`vw` the output
    rows/columns whose tap lands inside the image, `row` the tap's row of the columns."""
    def chan_body(c):
        chan = b.add(b.mul(n, i64(cv.c)), b.add(b.mul(g, i64(cv.cg)), c))
        for i in range(cv.kh):
            vh = _valid(cv.oh, cv.h, cv.sh, cv.ph, i, cv.dh)
            for j in range(cv.kw):
                vw = _valid(cv.ow, cv.w, cv.sw, cv.pw, j, cv.dw)
                row = b.add(b.mul(c, i64(cv.kh * cv.kw)), i64(i * cv.kw + j))
                body(chan, i, j, vh, vw, row)

    loop(b, cv.cg, chan_body, "c")


def _im2col(b, cv: Conv, x, n, g, cols, transposed: bool = False):
    """cols[(c, i, j), (oh, ow)] = x[n, g*cg + c, tap] (0 outside), as K x P (or P x K when
    `transposed`). Taps are unrolled, so each piece of each row is a constant-bound loop:
    zeros before and after, a (vectorized) strided copy in between."""
    dt = cv.dtype
    zero = S.const(dt, 0)
    ks, ps = _cols_layout(cv, transposed)

    def tap(chan, i, j, vh, vw, row):
        base = b.mul(row, i64(ks))
        for h0, h1, hin in _ranges(cv.oh, vh):
            def orow(oh, hin=hin):
                prow = b.add(base, b.mul(b.mul(oh, i64(cv.ow)), i64(ps)))
                if hin:
                    h = b.add(b.mul(oh, i64(cv.sh)), i64(i * cv.dh - cv.ph))
                    xrow = b.mul(b.add(b.mul(chan, i64(cv.h)), h), i64(cv.w))
                for w0, w1, win in _ranges(cv.ow, vw if hin else range(0)):
                    def put(ow, win=win, prow=prow, xrow=xrow if hin else None):
                        dst = b.add(prow, b.mul(ow, i64(ps)))
                        if not win:
                            S.store(b, cols, dt, dst, zero)
                            return
                        w = b.add(b.mul(ow, i64(cv.sw)), i64(j * cv.dw - cv.pw))
                        S.store(b, cols, dt, dst, S.load(b, x, dt, b.add(xrow, w)))
                    _span(b, w1 - w0, put, "ow", w0)
            _span(b, h1 - h0, orow, "oh", h0)

    _each_tap(b, cv, n, g, tap)


def _col2im(b, cv: Conv, cols, dx, n, g):
    """dx[n, g*cg + c, tap] += cols[(c, i, j), (oh, ow)] for taps inside (K x P cols)."""
    dt = cv.dtype

    def tap(chan, i, j, vh, vw, row):
        if not len(vh) or not len(vw):
            return

        def orow(oh):
            h = b.add(b.mul(oh, i64(cv.sh)), i64(i * cv.dh - cv.ph))
            xrow = b.mul(b.add(b.mul(chan, i64(cv.h)), h), i64(cv.w))
            prow = b.add(b.mul(row, i64(cv.p)), b.mul(oh, i64(cv.ow)))

            def add(ow):
                w = b.add(b.mul(ow, i64(cv.sw)), i64(j * cv.dw - cv.pw))
                off = b.add(xrow, w)
                v = S.load(b, cols, dt, b.add(prow, ow))
                S.store(b, dx, dt, off, b.fadd(S.load(b, dx, dt, off), v))
            _span(b, len(vw), add, "ow", vw.start)
        _span(b, len(vh), orow, "oh", vh.start)

    _each_tap(b, cv, n, g, tap)


def emit_conv(b: ir.IRBuilder, op, outs, ins, scratch, isa: Isa, threads: int,
              name: str) -> None:
    cv = Conv(op)
    if 0 in (cv.n, cv.o, cv.p, cv.c):
        return
    dt = cv.dtype
    el = S.REG[dt]
    p = cv.problem()
    engine = engine_for(p, isa, 1)
    out = outs[0]
    a_in, b_in = ins
    per, gemm_offset = cv.scratch(isa)
    if op.name != "ember.conv2d":  # both gradients accumulate: start from zero
        total = math.prod(op.result.type.shape)
        loop(b, total, lambda i: S.store(b, out, dt, i, S.const(dt, 0)), "z")

    def image(bb, ptrs, n, chunk):
        x_or_g, w_or_g, y, scr = ptrs
        cols = byte_offset(bb, scr, bb.mul(chunk, i64(per)))
        gscr = byte_offset(bb, cols, gemm_offset)

        def group(g):
            if op.name == "ember.conv2d":
                _im2col(bb, cv, x_or_g, n, g, cols)
                pa = bb.gep(w_or_g, [bb.mul(g, i64(cv.og * cv.k))], inbounds=True,
                            source_etype=el)
                pc = bb.gep(y, [bb.mul(b_off(bb, n, g), i64(cv.p))], inbounds=True,
                            source_etype=el)
                gemm_call(bb, p, engine, pa, cols, pc, gscr, isa, 1, f"{name}.g")
            elif op.name == "ember.conv2d_grad_weight":
                _im2col(bb, cv, x_or_g, n, g, cols, transposed=True)
                pa = bb.gep(w_or_g, [bb.mul(b_off(bb, n, g), i64(cv.p))], inbounds=True,
                            source_etype=el)
                pc = bb.gep(y, [bb.mul(g, i64(cv.og * cv.k))], inbounds=True, source_etype=el)
                gemm_call(bb, p, engine, pa, cols, pc, gscr, isa, 1, f"{name}.g",
                          accumulate=True)
            else:  # grad input: x_or_g is G, w_or_g is W
                pa = bb.gep(w_or_g, [bb.mul(g, i64(cv.og * cv.k))], inbounds=True,
                            source_etype=el)
                pb = bb.gep(x_or_g, [bb.mul(b_off(bb, n, g), i64(cv.p))], inbounds=True,
                            source_etype=el)
                gemm_call(bb, p, engine, pa, pb, cols, gscr, isa, 1, f"{name}.g")
                _col2im(bb, cv, cols, y, n, g)

        loop(bb, cv.g, group, "grp")

    def b_off(bb, n, g):
        """Row (n, g*og) of a [n, o, ...] tensor, in units of rows."""
        return bb.add(bb.mul(n, i64(cv.o)), bb.mul(g, i64(cv.og)))

    t = cv.threads(threads)
    args = [a_in, b_in, out, scratch]
    if t == 1:
        loop(b, cv.n, lambda n: image(b, args, n, i64(0)), "img")
        return

    def images(bb, ptrs, lo, hi):
        chunk = chunk_index(bb, lo, cv.n, t)  # its scratch
        for_range(bb, lo, hi, lambda n: image(bb, ptrs, n, chunk), "img")

    parallel_region(b, f"{name}.images", args, [False, False, True, True], cv.n, t, images)


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


def emit_pool(b: ir.IRBuilder, op, outs, ins, name: str) -> None:
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
    if grad and not exact:
        loop(b, pl.n * pl.c * pl.h * pl.w, lambda i: S.store(b, out, dt, i, S.const(dt, 0)),
             "z")
    if pl.n * pl.c * pl.oh * pl.ow == 0:
        return
    is_max = op.name.startswith("ember.max_pool2d")
    inv = S.const(dt, 1.0 / (pl.kh * pl.kw))

    def window(nc, oh, ow):
        o_off = b.add(b.mul(b.add(b.mul(nc, i64(pl.oh)), oh), i64(pl.ow)), ow)

        def x_off(h, w):
            return b.add(b.mul(b.add(b.mul(nc, i64(pl.h)), h), i64(pl.w)), w)

        taps = [(i, j) for i in range(pl.kh) for j in range(pl.kw)]
        if op.name == "ember.avg_pool2d_grad":
            gv = b.fmul(S.load(b, ins[0], dt, o_off), inv)
            for i, j in taps:
                h, w, inside = _taps(b, pl, oh, ow, i64(i), i64(j))
                with b.if_then(inside):
                    off = x_off(h, w)
                    S.store(b, out, dt, off, b.fadd(S.load(b, out, dt, off), gv))
            return
        best, where = ir.Constant(el, float("-inf")) if is_max else S.const(dt, 0), i64(-1)
        first = i64(0)  # which tap won (for `tiles`)
        offs = []
        for t_i, (i, j) in enumerate(taps):
            if padded:
                h, w, inside = _taps(b, pl, oh, ow, i64(i), i64(j))
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

    loop(b, pl.n * pl.c, lambda nc: loop(b, pl.oh, lambda oh: loop(
        b, pl.ow, lambda ow: window(nc, oh, ow), "ow"), "oh"), "nc")


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
        loop(b, t.size, lambda i: S.store(b, out, dt, i, S.const(dt, 0)), "z")
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
