"""The blocking and register tiles both cpu attention kernels are made of (forward.py
has the forward and the plan, backward.py the backward): an op's Blocking, and an
Emitter of element, vector and tile code over its buffers, each read or written through
its map over its logical shape."""

from __future__ import annotations

import math

from llvmlite import ir

from ....ir import Operation
from ....ir.dialects.kernel_attention import attention_shape
from ...strides import cdiv, contiguous_strides
from ..gemm.microkernel import splat
from ..kernels import scalar as S
from ..kernels.loops import carried, for_range, loop
from ..kernels.scalar import I32, I64, PTR, i64
from ..machine.host import Isa

MR = 6  # broadcast rows per register tile (keys, or value/head dims)
BK = 48  # keys per block, a multiple of MR: small, so little of a causal diagonal is wasted
BIG = 1 << 30  # a key index no query reaches (rows past Tk)


class Blocking:
    """Sizes, strides and blocking of one attention op."""

    def __init__(self, op: Operation, isa: Isa):
        s = attention_shape(op)
        self.tq, self.tk, self.d, self.dv = s.tq, s.tk, s.d, s.dv
        self.dtype = s.dtype
        self.lanes = isa.lanes(self.dtype)
        self.batch = s.batch
        self.maps = s.maps  # every buffer's map over its logical shape, by name
        self.nb, self.nbatch = len(self.batch), math.prod(self.batch)
        self.causal, self.scale = s.causal, s.scale
        self.nvmax = 4 if isa.regs >= 32 else 2  # MR * nv accumulators, nv loads, a splat
        self.nv = min(self.nvmax, cdiv(self.tq, self.lanes))  # query vectors per tile
        self.bq = self.nv * self.lanes  # queries per block
        self.bk = min(BK, cdiv(self.tk, MR) * MR)  # keys per block
        self.nqb, self.nkb = cdiv(self.tq, self.bq), cdiv(self.tk, self.bk)

    def pad(self, n: int) -> int:
        return cdiv(n, self.lanes) * self.lanes

    def strides(self, name: str) -> tuple[int, int]:
        """(row, column) element strides of buffer `name`."""
        m = self.maps[name]
        return m[self.nb], m[self.nb + 1]


class Emitter:
    """Element and vector helpers over one builder, for one geometry."""

    def __init__(self, b: ir.IRBuilder, g: Blocking):
        self.b, self.g = b, g
        self.el = S.REG[g.dtype]
        self.vt = ir.VectorType(self.el, g.lanes)
        self.fma = S.declare(b.module, f"llvm.fma.v{g.lanes}{g.dtype}", self.vt, [self.vt] * 3)

    def c(self, x: float) -> ir.Constant:
        return ir.Constant(self.el, x)

    def idx(self, *terms) -> ir.Value:
        """sum of terms, each an int, a value or a (value, int) product."""
        b, out = self.b, None
        for t in terms:
            if isinstance(t, tuple):
                x, k = t
                t = 0 if k == 0 else x if k == 1 else (
                    i64(x * k) if isinstance(x, int) else b.mul(x, i64(k)))
            if isinstance(t, int):
                if t == 0:
                    continue
                t = i64(t)
            out = t if out is None else b.add(out, t)
        return i64(0) if out is None else out

    def at(self, ptr: ir.Value, *terms) -> ir.Value:
        return self.b.gep(ptr, [self.idx(*terms)], inbounds=True, source_etype=self.el)

    def ld(self, ptr, *terms) -> ir.Value:
        return self.b.load(self.at(ptr, *terms), typ=self.el)

    def st(self, v, ptr, *terms) -> None:
        self.b.store(v, self.at(ptr, *terms))

    def vld(self, ptr, *terms) -> ir.Value:
        return self.b.load(self.at(ptr, *terms), typ=self.vt, align=S.size(self.g.dtype))

    def vst(self, v, ptr, *terms) -> None:
        self.b.store(v, self.at(ptr, *terms), align=S.size(self.g.dtype))

    def pos(self, x: ir.Value) -> ir.Value:
        return self.b.select(self.b.icmp_signed(">", x, i64(0)), x, i64(0))

    def batch_ptr(self, ptr: ir.Value, bi: ir.Value, name: str) -> ir.Value:
        """`ptr` advanced to batch element `bi` of buffer `name` (through its map)."""
        g, terms = self.g, []
        for n, cs, s in zip(g.batch, contiguous_strides(g.batch), g.maps[name]):
            if n > 1 and s:
                terms.append((self.b.urem(self.b.udiv(bi, i64(cs)), i64(n)), s))
        return self.at(ptr, *terms) if terms else ptr

    def vmax(self, x: ir.Value, y: ir.Value) -> ir.Value:
        """max(x, y) as one vmaxps: a NaN score is dropped here but still reaches the
        output through exp."""
        return self.b.select(self.b.fcmp_ordered(">", x, y), x, y)

    def tile(self, rows: list, a_cs: int, bptr: ir.Value, b_rs: int, vecs: range, start,
             end, init: list[list[ir.Value]]) -> list[list[ir.Value]]:
        """acc[r][v] = init[r][v] + sum_{start <= k < end} rows[r][k*a_cs] *
        bptr[k*b_rs + v*lanes] for the vectors v in `vecs` (the others pass through); a
        row None sums the B vectors. The register tile of every product here."""
        b, lanes = self.b, self.g.lanes
        keys = [(r, v) for r in range(len(rows)) for v in vecs]

        def step(k, flat):
            acc = dict(zip(keys, flat))
            bv = {v: self.vld(bptr, (k, b_rs), v * lanes) for v in vecs}
            out = []
            for r, row in enumerate(rows):
                x = splat(b, self.ld(row, (k, a_cs)), lanes) if row is not None else None
                out += [b.call(self.fma, [x, bv[v], acc[r, v]]) if x is not None
                        else b.fadd(acc[r, v], bv[v]) for v in vecs]
            return out

        _, flat = carried(b, start, end, [init[r][v] for r, v in keys], step, name="tile")
        acc = dict(zip(keys, flat))
        return [[acc.get((r, v), init[r][v]) for v in range(len(init[r]))]
                for r in range(len(rows))]

    def zero(self, ptr: ir.Value, n: int) -> None:
        loop(self.b, n, lambda i: self.st(self.c(0.0), ptr, i), "z")

    def pack(self, dst, src, name: str, i0, nq, width: int, rows: bool,
             mul: float = 1.0) -> None:
        """dst[c][i] (dst[i][c] with `rows`, c < pad(width)) = src[i0 + i, c] * mul for
        queries i < nq and c < width, 0 elsewhere."""
        g, b = self.g, self.b
        rs, cs = g.strides(name)
        wp = g.pad(width) if rows else width

        def one(i, c):
            ok = b.icmp_signed("<", i, nq)
            if wp != width:
                ok = b.and_(ok, b.icmp_signed("<", c, i64(width)))
            x = self.ld(src, (b.add(i0, b.select(ok, i, i64(0))), rs),
                        (b.select(ok, c, i64(0)), cs))
            x = b.fmul(x, self.c(mul)) if mul != 1.0 else x
            self.st(b.select(ok, x, self.c(0.0)), dst, *(((i, wp), c) if rows else ((c, g.bq), i)))

        if rows:
            loop(b, g.bq, lambda i: loop(b, wp, lambda c: one(i, c), "c"), "i")
        else:
            loop(b, width, lambda c: loop(b, g.bq, lambda i: one(i, c), "i"), "c")

    def block_keys(self, i0, nq, kb) -> tuple[ir.Value, ir.Value, ir.Value]:
        """(first key, keys the block's queries may see, MR-row groups covering them)."""
        g, b = self.g, self.b
        j0 = b.mul(kb, i64(g.bk))
        nk = S.at_most(b, b.sub(i64(g.tk), j0), g.bk)
        if g.causal:
            nk = S.at_most(b, nk, b.sub(b.add(i0, nq), j0))
        return j0, nk, b.udiv(b.add(nk, i64(MR - 1)), i64(MR))

    def key_blocks(self, i0, nq) -> ir.Value:
        """Key blocks with a key some query of the block sees."""
        if not self.g.causal:
            return i64(self.g.nkb)
        last = self.b.udiv(self.b.sub(self.b.add(i0, nq), i64(1)), i64(self.g.bk))
        return S.at_most(self.b, self.b.add(last, i64(1)), self.g.nkb)

    def first_vector(self, jf, i0) -> ir.Value:
        """The first query vector of the block that key jf (and every later key) may see:
        the vectors before it are hidden by the causal mask, so no stage computes them."""
        if not self.g.causal or self.g.nv == 1:
            return i64(0)
        v = self.b.udiv(self.pos(self.b.sub(jf, i0)), i64(self.g.lanes))
        return S.at_most(self.b, v, self.g.nv - 1)

    def by_first_vector(self, v0: ir.Value, emit) -> None:
        """emit(c) in the branch where v0 == c (c < nv, compile-time): one copy of a
        tile per count of live vectors."""
        b, nv = self.b, self.g.nv
        if not self.g.causal or nv == 1:
            emit(0)
            return
        fn = b.function
        cases = [fn.append_basic_block(f"live{c}") for c in range(nv)]
        merge = fn.append_basic_block("live.done")
        sw = b.switch(v0, cases[0])
        for c in range(1, nv):
            sw.add_case(i64(c), cases[c])
        for c, blk in enumerate(cases):
            b.position_at_end(blk)
            emit(c)
            b.branch(merge)
        b.position_at_end(merge)

    def segments(self, i0, j0, nk) -> list[ir.Value]:
        """Key-row bounds r_0 = 0 <= r_1 <= ... <= r_nv = nk: rows [r_c, r_c+1) of the
        block have first live vector c (whole MR-row groups, as `first_vector`)."""
        g, b = self.g, self.b
        if not g.causal or g.nv == 1:
            return [i64(0), nk]
        out = [i64(0)]
        for c in range(1, g.nv):
            x = self.pos(b.sub(b.add(i0, i64(c * g.lanes)), j0))
            rows = b.mul(b.udiv(b.add(x, i64(MR - 1)), i64(MR)), i64(MR))
            out.append(S.at_most(b, rows, nk))
        return out + [nk]

    def scores(self, dst, src, name: str, qt, depth: int, j0, groups, i0, ivec,
               bmax=None) -> None:
        """dst[j][i] = sum_c src[j0 + j, c] qt[c][i] over `groups` MR-row groups (the
        live vectors of each); with `ivec` (the block's query indices, vectors of i32)
        entries past Tk and, if causal, above the diagonal are -inf; with `bmax`,
        bmax = max(bmax, column max)."""
        g, b = self.g, self.b
        rs, cs = g.strides(name)
        ninf = ir.Constant(self.vt, [self.c(-math.inf)] * g.lanes)

        def group(grp):
            r0 = b.mul(grp, i64(MR))
            keys, rows = [], []
            for r in range(MR):
                j = b.add(j0, b.add(r0, i64(r)))
                inside = b.icmp_signed("<", j, i64(g.tk))
                keys.append((j, inside))
                rows.append(self.at(src, (b.select(inside, j, i64(g.tk - 1)), rs)))

            def live(c):
                zeros = [[ir.Constant(self.vt, None)] * g.nv for _ in range(MR)]
                accs = self.tile(rows, cs, qt, g.bq, range(c, g.nv), i64(0), i64(depth),
                                 zeros)

                def finish(masked: bool):
                    col = {}
                    for r, (j, inside) in enumerate(keys):
                        if masked and g.causal:
                            jj = splat(b, b.trunc(b.select(inside, j, i64(BIG)), I32), g.lanes)
                        for v in range(c, g.nv):
                            x = accs[r][v]
                            if masked and g.causal:
                                x = b.select(b.icmp_signed("<", ivec[v], jj), ninf, x)
                            elif masked:
                                x = b.select(inside, x, ninf)
                            self.vst(x, dst, (b.add(r0, i64(r)), g.bq), v * g.lanes)
                            col[v] = x if v not in col else self.vmax(col[v], x)
                    if bmax is not None:
                        for v in range(c, g.nv):
                            self.vst(self.vmax(self.vld(bmax, v * g.lanes), col[v]), bmax,
                                     v * g.lanes)

                if ivec is None or not (g.causal or g.tk % MR):
                    finish(False)
                    return
                # most tiles lie below the diagonal and before Tk: no mask to apply there
                last = b.add(j0, b.add(r0, i64(MR - 1)))
                whole = b.icmp_signed("<", last, i64(g.tk))
                if g.causal:
                    whole = b.and_(whole, b.icmp_signed("<=", last, i0))
                with b.if_else(whole) as (plain, masked):
                    with plain:
                        finish(False)
                    with masked:
                        finish(True)

            self.by_first_vector(self.first_vector(b.add(j0, r0), i0), live)

        for_range(b, i64(0), groups, group, "grp")

    def rows_live(self, j0, groups, i0, emit) -> None:
        """emit(row, first live query) for the key rows of `groups` MR-row groups."""
        b = self.b

        def group(grp):
            r0 = b.mul(grp, i64(MR))
            start = b.mul(self.first_vector(b.add(j0, r0), i0), i64(self.g.lanes))
            loop(b, MR, lambda r: emit(b.add(r0, r), start), "r")

        for_range(b, i64(0), groups, group, "grp")

    def query_lanes(self, acc, rows_src, name: str, n_rows: int, j0, bounds, pt,
                    alpha=None, lsum=None) -> None:
        """acc[c][i] = acc[c][i] (* alpha[i]) + sum_j src[j0 + j, c] pt[j][i] for
        c < n_rows, j < bounds[-1], each segment of `bounds` over its live vectors: v^T p
        forward, k^T ds backward. With `lsum`, lsum = lsum * alpha + sum_j pt[j] too."""
        g, b = self.g, self.b
        rs, cs = g.strides(name)
        al = [self.vld(alpha, v * g.lanes) for v in range(g.nv)] if alpha is not None \
            else None

        def group(c0, rows: int, with_sum: bool):
            bufs = [(acc, (b.add(c0, i64(r)), g.bq)) for r in range(rows)]
            ptrs = [self.at(rows_src, (j0, rs), (b.add(c0, i64(r)), cs)) for r in range(rows)]
            if with_sum:
                bufs.append((lsum, 0))
                ptrs.append(None)
            accs = []
            for buf, off in bufs:
                xs = [self.vld(buf, off, v * g.lanes) for v in range(g.nv)]
                accs.append([b.fmul(x, a) for x, a in zip(xs, al)] if al else xs)
            for c in range(len(bounds) - 1):
                accs = self.tile(ptrs, rs, pt, g.bq, range(c, g.nv), bounds[c],
                                 bounds[c + 1], accs)
            for (buf, off), xs in zip(bufs, accs):
                for v, x in enumerate(xs):
                    self.vst(x, buf, off, v * g.lanes)

        loop(b, n_rows // MR, lambda k: group(b.mul(k, i64(MR)), MR, False), "grp")
        if n_rows % MR or lsum is not None:
            group(i64(n_rows // MR * MR), n_rows % MR, lsum is not None)

    def key_rows(self, acc, width: int, pt, src, j0, groups, i0, count) -> None:
        """acc[j0 + j][c] += sum_{i < count} pt[j][i] src[i][c] over `groups` MR-row
        groups of keys and c < width (padded rows), from each group's first key on the
        diagonal: dv += p do, dk += ds q."""
        g, b = self.g, self.b
        nvec = width // g.lanes

        def chunk(r0, start, c0, n: int):
            rows = [b.add(j0, b.add(r0, i64(r))) for r in range(MR)]
            init = [[self.vld(acc, (j, width), c0, v * g.lanes) for v in range(n)]
                    for j in rows]
            ptrs = [self.at(pt, (b.add(r0, i64(r)), g.bq)) for r in range(MR)]
            out = self.tile(ptrs, 1, self.at(src, c0), width, range(n), start, count, init)
            for j, vs in zip(rows, out):
                for v, x in enumerate(vs):
                    self.vst(x, acc, (j, width), c0, v * g.lanes)

        def group(grp):
            r0 = b.mul(grp, i64(MR))
            # queries before the group's first key see none of its keys
            start = self.pos(b.sub(b.add(j0, r0), i0)) if g.causal else i64(0)
            full, rest = divmod(nvec, g.nvmax)
            loop(b, full, lambda k: chunk(r0, start, b.mul(k, i64(g.nvmax * g.lanes)),
                                          g.nvmax), "ch")
            if rest:
                chunk(r0, start, i64(full * g.nvmax * g.lanes), rest)

        for_range(b, i64(0), groups, group, "grp")

    def query_ivec(self, i0) -> list[ir.Value]:
        """The query indices of a block, one i32 vector per tile vector."""
        return query_indices(self.b, i0, self.g.lanes, self.g.nv)


def query_indices(b: ir.IRBuilder, i0: ir.Value, lanes: int, vectors: int) -> list[ir.Value]:
    """i0, i0 + 1, ... as `vectors` i32 vectors of `lanes` (a query block's indices)."""
    vt = ir.VectorType(I32, lanes)
    base = splat(b, b.trunc(i0, I32), lanes)
    return [b.add(base, ir.Constant(vt, [ir.Constant(I32, v * lanes + k) for k in range(lanes)]))
            for v in range(vectors)]


def item_function(mod: ir.Module, name: str, names: list[str], noalias: set[str]) -> ir.Function:
    """An internal `void name(ptr per name..., i64 item)`; the buffers it writes noalias."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR] * len(names) + [I64]), name)
    fn.linkage = "internal"
    for a, n in zip(fn.args, names):
        a.name = n
        if n in noalias:
            a.add_attribute("noalias")
    return fn
