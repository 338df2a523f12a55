"""`kernel.attention_grad` on the cpu: the backward item of the flash-attention kernels
(see forward.py for the blocking), all of one batch element per call."""

from __future__ import annotations

import math

from llvmlite import ir

from ..kernels import scalar as S
from ..kernels import vmath
from ..kernels.loops import for_range, loop
from ..kernels.scalar import i64
from .tiles import Blocking, Emitter, item_function

BWD_IO = ["dq", "dk", "dv", "q", "k", "v", "o", "lse", "do"]


def backward_item(mod: ir.Module, g: Blocking, bufs: list[str], name: str) -> ir.Function:
    """`item(dq, dk, dv, q, k, v, o, lse, do, <scratch buffers>, bi)`: all of batch
    element bi."""
    fn = item_function(mod, f"{name}.batch", BWD_IO + bufs, {"dq", "dk", "dv", *bufs})
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b, g)
    a = dict(zip(BWD_IO + bufs, fn.args))
    bi = fn.args[-1]
    q, k, v, o, lse, do, dq = (e.batch_ptr(a[n], bi, n)
                               for n in ("q", "k", "v", "o", "lse", "do", "dq"))
    dp_, dvp = g.pad(g.d), g.pad(g.dv)
    tkp = g.nkb * g.bk
    s, ds, dqt, dka, dva, drow = (a[n] for n in ("s", "ds", "dqt", "dka", "dva", "drow"))
    e.zero(dka, tkp * dp_)
    e.zero(dva, tkp * dvp)
    lse_stride, (qrs, qcs) = g.maps["lse"][g.nb], g.strides("dq")

    def query_block(qb):
        i0 = b.mul(qb, i64(g.bq))
        nq = S.at_most(b, b.sub(i64(g.tq), i0), g.bq)
        e.pack(a["qt"], q, "q", i0, nq, g.d, False, g.scale)
        e.pack(a["qp"], q, "q", i0, nq, g.d, True)
        e.pack(a["dot"], do, "do", i0, nq, g.dv, False)
        e.pack(a["dop"], do, "do", i0, nq, g.dv, True)
        (ors, ocs), (drs, dcs) = g.strides("o"), g.strides("do")

        def rows(i):  # Drow = rowsum(do * o), 0 past Tq; lse, +inf past Tq (so p = 0)
            inside = b.icmp_signed("<", i, nq)
            r = b.add(i0, b.select(inside, i, i64(0)))
            e.st(e.c(0.0), drow, i)
            loop(b, g.dv, lambda c: e.st(b.fadd(e.ld(drow, i), b.select(inside, b.fmul(
                e.ld(do, (r, drs), (c, dcs)), e.ld(o, (r, ors), (c, ocs))), e.c(0.0))), drow,
                i), "c")
            e.st(b.select(inside, e.ld(lse, (r, lse_stride)), e.c(math.inf)), a["lse_b"], i)

        loop(b, g.bq, rows, "i")
        e.zero(dqt, g.d * g.bq)
        ivec = e.query_ivec(i0)

        def key_block(kb):
            j0, nk, groups = e.block_keys(i0, nq, kb)
            e.scores(s, k, "k", a["qt"], g.d, j0, groups, i0, ivec)
            e.scores(ds, v, "v", a["dot"], g.dv, j0, groups, i0, None)

            def grad(j, start):
                def one(i):
                    x = b.fsub(e.ld(s, (j, g.bq), i), e.ld(a["lse_b"], i))
                    p = vmath.exp(b, g.dtype, x)
                    e.st(p, s, (j, g.bq), i)
                    dp = b.fsub(e.ld(ds, (j, g.bq), i), e.ld(drow, i))
                    e.st(b.fmul(b.fmul(p, dp), e.c(g.scale)), ds, (j, g.bq), i)
                for_range(b, start, i64(g.bq), one, "i")

            e.rows_live(j0, groups, i0, grad)
            e.key_rows(dva, dvp, s, a["dop"], j0, groups, i0, nq)
            e.key_rows(dka, dp_, ds, a["qp"], j0, groups, i0, nq)
            e.query_lanes(dqt, k, "k", g.d, j0, e.segments(i0, j0, nk), ds)

        for_range(b, i64(0), e.key_blocks(i0, nq), key_block, "kb")

        def out(i):
            row = b.add(i0, i)
            loop(b, g.d, lambda c: e.st(e.ld(dqt, (c, g.bq), i), dq, (row, qrs), (c, qcs)),
                 "c")

        for_range(b, i64(0), nq, out, "i")

    loop(b, g.nqb, query_block, "qb")
    for res, acc, width, wp in (("dk", dka, g.d, dp_), ("dv", dva, g.dv, dvp)):
        dst, (rs, cs) = e.batch_ptr(a[res], bi, res), g.strides(res)

        def copy(j, acc=acc, width=width, wp=wp, dst=dst, rs=rs, cs=cs):
            loop(b, width, lambda c: e.st(e.ld(acc, (j, wp), c), dst, (j, rs), (c, cs)), "c")

        loop(b, g.tk, copy, "j")
    b.ret_void()
    return fn
