"""`kernel.attention` and `kernel.attention_grad` on the cpu: flash attention, so the
[..., Tq, Tk] scores never exist whole (one block of `bk` keys x `bq` queries per thread).

The queries sit in the vector lanes throughout. A block's scores are kept transposed
(s[j][i], one row per key), so the online softmax's running max m, sum l and rescale
factor are vectors over queries (no horizontal reductions), and keys and values are
broadcast one element at a time straight from their strided buffers (no packing,
whatever the maps); only the query block is copied, transposed and pre-scaled. Every
product is one register tile (`_Emitter.tile`): MR broadcast rows times `nv` vectors of
accumulators; exp and log are scalar loops that LLVM vectorizes (vmath).

Forward, per (batch element, query block), parallel over both: for each key block,
s = (q*scale) k^T (hidden entries -inf), m' = max(m, colmax s), p = exp(s - m'),
l = l e^(m-m') + colsum p, acc = acc e^(m-m') + v^T p; then o = acc / l, lse = m + log l.
Backward, per batch element (one thread owns its element's dq, dk and dv, so nothing
races): per query block, q (both layouts), do and Drow = rowsum(do*o) are packed; per key
block p = exp(s - lse) and ds = p (v do^T - Drow) scale are rebuilt, then dv += p do and
dk += ds q (key rows in registers) and dq^T += k^T ds (queries in lanes).

A causal mask skips the key blocks past a query block's diagonal and, within a block, the
query vectors an MR-row group of keys cannot see (`first_vector`). Queries past Tq and
key rows past a block's last key are computed from clamped or zeroed data and never
stored; in the backward their p is 0 (padded queries get lse = +inf).
"""

from __future__ import annotations

import math

from llvmlite import ir

from ...ir import Operation
from ..strides import contiguous_strides
from . import scalar as S
from . import vmath
from .buffers import regions
from .host import Isa
from .loops import for_range, loop
from .matmul import byte_offset
from .scalar import I32, I64, PTR, i64
from .threads import parallel_chunks, parallel_region

MR = 6  # broadcast rows per register tile (keys, or value/head dims)
BK = 48  # keys per block, a multiple of MR: small, so little of a causal diagonal is wasted
BIG = 1 << 30  # a key index no query reaches (rows past Tk)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Geometry:
    """Sizes, strides and blocking of one attention op."""

    def __init__(self, op: Operation, isa: Isa):
        a = op.attributes
        self.tq, self.tk, self.d, self.dv = a["sizes"]
        self.dtype = op.operands[0].type.dtype
        self.lanes = isa.lanes(self.dtype)
        self.batch, self.maps = list(a["batch"]), a["maps"]  # maps over logical shapes
        self.nb, self.nbatch = len(self.batch), math.prod(self.batch)
        self.causal, self.scale = a["causal"], a["scale"]
        self.nvmax = 4 if isa.regs >= 32 else 2  # MR * nv accumulators, nv loads, a splat
        self.nv = min(self.nvmax, _cdiv(self.tq, self.lanes))  # query vectors per tile
        self.bq = self.nv * self.lanes  # queries per block
        self.bk = min(BK, _cdiv(self.tk, MR) * MR)  # keys per block
        self.nqb, self.nkb = _cdiv(self.tq, self.bq), _cdiv(self.tk, self.bk)

    def pad(self, n: int) -> int:
        return _cdiv(n, self.lanes) * self.lanes

    def strides(self, operand: int) -> tuple[int, int]:
        """(row, column) element strides of operand `operand`."""
        m = self.maps[operand]
        return m[self.nb], m[self.nb + 1]


def _regions(g: Geometry, forward: bool) -> tuple[dict[str, int], int]:
    """Byte offsets of one thread's scratch buffers (element counts below) and its bytes."""
    bq, bk = g.bq, g.bk
    if forward:
        sizes = {"qt": g.d * bq, "s": bk * bq, "acc": g.dv * bq, "m": bq, "l": bq,
                 "alpha": bq, "bmax": bq}
    else:
        tkp = g.nkb * bk
        sizes = {"qt": g.d * bq, "qp": bq * g.pad(g.d), "dot": g.dv * bq,
                 "dop": bq * g.pad(g.dv), "drow": bq, "lse_b": bq, "s": bk * bq, "ds": bk * bq,
                 "dqt": g.d * bq, "dka": tkp * g.pad(g.d), "dva": tkp * g.pad(g.dv)}
    offs, total = regions(*(n * S.size(g.dtype) for n in sizes.values()))
    return dict(zip(sizes, offs)), total


def _threads(g: Geometry, forward: bool, threads: int) -> tuple[int, int]:
    """(parallel items, threads): (batch, query block) pairs forward, batch elements
    backward; small ones stay on one thread (a hand-off costs more than they take)."""
    flops = 2 * g.nbatch * g.tq * g.tk * (g.d + g.dv) * (1 if forward else 3) / (
        2 if g.causal else 1)  # a causal mask hides half the scores
    items = g.nbatch * (g.nqb if forward else 1)
    return items, parallel_chunks(flops / 4, items, threads)


def attention_scratch(op: Operation, isa: Isa, threads: int) -> int:
    """Scratch bytes of an attention op: one set of block buffers per thread."""
    g, forward = Geometry(op, isa), op.name == "kernel.attention"
    return _threads(g, forward, threads)[1] * _regions(g, forward)[1]


class _Emitter:
    """Element and vector helpers over one builder, for one geometry."""

    def __init__(self, b: ir.IRBuilder, g: Geometry):
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

    def splat(self, x: ir.Value, vt: ir.VectorType | None = None) -> ir.Value:
        vt = vt or self.vt
        undef = ir.Constant(vt, ir.Undefined)
        zeros = ir.Constant(ir.VectorType(I32, vt.count), [ir.Constant(I32, 0)] * vt.count)
        return self.b.shuffle_vector(self.b.insert_element(undef, x, i64(0)), undef, zeros)

    def imin(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def pos(self, x: ir.Value) -> ir.Value:
        return self.b.select(self.b.icmp_signed(">", x, i64(0)), x, i64(0))

    def batch_ptr(self, ptr: ir.Value, bi: ir.Value, operand: int) -> ir.Value:
        """`ptr` advanced to batch element `bi` of operand `operand` (through its map)."""
        g, terms = self.g, []
        for n, cs, s in zip(g.batch, contiguous_strides(g.batch), g.maps[operand]):
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
        b, fn, lanes = self.b, self.b.function, self.g.lanes
        pre = b.block
        head, body, done = (fn.append_basic_block(f"tile.{n}") for n in ("head", "body",
                                                                            "done"))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64)
        k.add_incoming(start, pre)
        phis = [{v: b.phi(self.vt) for v in vecs} for _ in rows]
        for r in range(len(rows)):
            for v in vecs:
                phis[r][v].add_incoming(init[r][v], pre)
        b.cbranch(b.icmp_signed("<", k, end), body, done)
        b.position_at_end(body)
        bv = {v: self.vld(bptr, (k, b_rs), v * lanes) for v in vecs}
        for r, row in enumerate(rows):
            x = self.splat(self.ld(row, (k, a_cs))) if row is not None else None
            for v in vecs:
                new = (b.call(self.fma, [x, bv[v], phis[r][v]]) if x is not None
                       else b.fadd(phis[r][v], bv[v]))
                phis[r][v].add_incoming(new, body)
        k.add_incoming(b.add(k, i64(1)), body)
        b.branch(head)
        b.position_at_end(done)
        return [[phis[r][v] if v in vecs else init[r][v] for v in range(len(init[r]))]
                for r in range(len(rows))]

    def zero(self, ptr: ir.Value, n: int) -> None:
        loop(self.b, n, lambda i: self.st(self.c(0.0), ptr, i), "z")

    def pack(self, dst, src, operand: int, i0, nq, width: int, rows: bool,
             mul: float = 1.0) -> None:
        """dst[c][i] (dst[i][c] with `rows`, c < pad(width)) = src[i0 + i, c] * mul for
        queries i < nq and c < width, 0 elsewhere."""
        g, b = self.g, self.b
        rs, cs = g.strides(operand)
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
        nk = self.imin(i64(g.bk), b.sub(i64(g.tk), j0))
        if g.causal:
            nk = self.imin(nk, b.sub(b.add(i0, nq), j0))
        return j0, nk, b.udiv(b.add(nk, i64(MR - 1)), i64(MR))

    def key_blocks(self, i0, nq) -> ir.Value:
        """Key blocks with a key some query of the block sees."""
        if not self.g.causal:
            return i64(self.g.nkb)
        last = self.b.udiv(self.b.sub(self.b.add(i0, nq), i64(1)), i64(self.g.bk))
        return self.imin(i64(self.g.nkb), self.b.add(last, i64(1)))

    def first_vector(self, jf, i0) -> ir.Value:
        """The first query vector of the block that key jf (and every later key) may see:
        the vectors before it are hidden by the causal mask, so no stage computes them."""
        if not self.g.causal or self.g.nv == 1:
            return i64(0)
        v = self.b.udiv(self.pos(self.b.sub(jf, i0)), i64(self.g.lanes))
        return self.imin(v, i64(self.g.nv - 1))

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
            out.append(self.imin(rows, nk))
        return out + [nk]

    def scores(self, dst, src, operand: int, qt, depth: int, j0, groups, i0, ivec,
               bmax=None) -> None:
        """dst[j][i] = sum_c src[j0 + j, c] qt[c][i] over `groups` MR-row groups (the
        live vectors of each); with `ivec` (the block's query indices, vectors of i32)
        entries past Tk and, if causal, above the diagonal are -inf; with `bmax`,
        bmax = max(bmax, column max)."""
        g, b = self.g, self.b
        rs, cs = g.strides(operand)
        i32v = ir.VectorType(I32, g.lanes)
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
                            jj = self.splat(b.trunc(b.select(inside, j, i64(BIG)), I32), i32v)
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

    def query_lanes(self, acc, rows_src, operand: int, n_rows: int, j0, bounds, pt,
                    alpha=None, lsum=None) -> None:
        """acc[c][i] = acc[c][i] (* alpha[i]) + sum_j src[j0 + j, c] pt[j][i] for
        c < n_rows, j < bounds[-1], each segment of `bounds` over its live vectors: v^T p
        forward, k^T ds backward. With `lsum`, lsum = lsum * alpha + sum_j pt[j] too."""
        g, b = self.g, self.b
        rs, cs = g.strides(operand)
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
        vt, n = ir.VectorType(I32, self.g.lanes), self.g.lanes
        base = self.splat(self.b.trunc(i0, I32), vt)
        return [self.b.add(base, ir.Constant(vt, [ir.Constant(I32, v * n + k) for k in range(n)]))
                for v in range(self.g.nv)]


def _function(mod: ir.Module, name: str, names: list[str], noalias: set[str]) -> ir.Function:
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR] * len(names) + [I64]), name)
    fn.linkage = "internal"
    for a, n in zip(fn.args, names):
        a.name = n
        if n in noalias:
            a.add_attribute("noalias")
    return fn


FWD_IO = ["o", "lse", "q", "k", "v"]
BWD_IO = ["dq", "dk", "dv", "q", "k", "v", "o", "lse", "do"]


def _forward_item(mod: ir.Module, g: Geometry, bufs: list[str], name: str) -> ir.Function:
    """`item(o, lse, q, k, v, <scratch buffers>, it)`: query block it % nqb of batch
    element it // nqb."""
    fn = _function(mod, f"{name}.block", FWD_IO + bufs, {"o", "lse", *bufs})
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = _Emitter(b, g)
    a = dict(zip(FWD_IO + bufs, fn.args))
    it = fn.args[-1]
    bi, qb = b.udiv(it, i64(g.nqb)), b.urem(it, i64(g.nqb))
    q, k, v = (e.batch_ptr(a[n], bi, i) for i, n in enumerate(("q", "k", "v")))
    i0 = b.mul(qb, i64(g.bq))
    nq = e.imin(i64(g.bq), b.sub(i64(g.tq), i0))
    e.pack(a["qt"], q, 0, i0, nq, g.d, False, g.scale)
    m, l_, alpha, bmax, s, acc = (a[n] for n in ("m", "l", "alpha", "bmax", "s", "acc"))

    def init(i):
        for buf, x in ((m, -math.inf), (l_, 0.0), (bmax, -math.inf)):
            e.st(e.c(x), buf, i)

    loop(b, g.bq, init, "i")
    e.zero(acc, g.dv * g.bq)
    ivec = e.query_ivec(i0)
    exp = vmath.exp

    def key_block(kb):
        j0, nk, groups = e.block_keys(i0, nq, kb)
        e.scores(s, k, 1, a["qt"], g.d, j0, groups, i0, ivec, bmax)

        def rescale(i):
            mo = e.ld(m, i)
            mn = S.intrinsic(b, f"llvm.maxnum.{g.dtype}", e.el, [mo, e.ld(bmax, i)])
            e.st(mn, m, i)
            e.st(exp(b, g.dtype, b.fsub(mo, mn)), alpha, i)
            e.st(e.c(-math.inf), bmax, i)

        loop(b, g.bq, rescale, "i")

        def prob(j, start):
            def one(i):
                x = b.fsub(e.ld(s, (j, g.bq), i), e.ld(m, i))
                e.st(exp(b, g.dtype, x), s, (j, g.bq), i)
            for_range(b, start, i64(g.bq), one, "i")

        e.rows_live(j0, groups, i0, prob)
        e.query_lanes(acc, v, 2, g.dv, j0, e.segments(i0, j0, nk), s, alpha, l_)

    for_range(b, i64(0), e.key_blocks(i0, nq), key_block, "kb")

    def out(i):
        row = b.add(b.mul(bi, i64(g.tq)), b.add(i0, i))
        inv = b.fdiv(e.c(1.0), e.ld(l_, i))
        loop(b, g.dv, lambda c: e.st(b.fmul(e.ld(acc, (c, g.bq), i), inv), a["o"],
                                     (row, g.dv), c), "c")
        e.st(b.fadd(e.ld(m, i), vmath.call(b, "log", g.dtype, e.ld(l_, i))), a["lse"], row)

    for_range(b, i64(0), nq, out, "i")
    b.ret_void()
    return fn


def _backward_item(mod: ir.Module, g: Geometry, bufs: list[str], name: str) -> ir.Function:
    """`item(dq, dk, dv, q, k, v, o, lse, do, <scratch buffers>, bi)`: all of batch
    element bi."""
    fn = _function(mod, f"{name}.batch", BWD_IO + bufs, {"dq", "dk", "dv", *bufs})
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = _Emitter(b, g)
    a = dict(zip(BWD_IO + bufs, fn.args))
    bi = fn.args[-1]
    q, k, v, o, lse, do = (e.batch_ptr(a[n], bi, i)
                           for i, n in enumerate(("q", "k", "v", "o", "lse", "do")))
    dp_, dvp = g.pad(g.d), g.pad(g.dv)
    tkp = g.nkb * g.bk
    s, ds, dqt, dka, dva, drow = (a[n] for n in ("s", "ds", "dqt", "dka", "dva", "drow"))
    e.zero(dka, tkp * dp_)
    e.zero(dva, tkp * dvp)
    lse_stride = g.maps[4][g.nb]

    def query_block(qb):
        i0 = b.mul(qb, i64(g.bq))
        nq = e.imin(i64(g.bq), b.sub(i64(g.tq), i0))
        e.pack(a["qt"], q, 0, i0, nq, g.d, False, g.scale)
        e.pack(a["qp"], q, 0, i0, nq, g.d, True)
        e.pack(a["dot"], do, 5, i0, nq, g.dv, False)
        e.pack(a["dop"], do, 5, i0, nq, g.dv, True)
        (ors, ocs), (drs, dcs) = g.strides(3), g.strides(5)

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
            e.scores(s, k, 1, a["qt"], g.d, j0, groups, i0, ivec)
            e.scores(ds, v, 2, a["dot"], g.dv, j0, groups, i0, None)

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
            e.query_lanes(dqt, k, 1, g.d, j0, e.segments(i0, j0, nk), ds)

        for_range(b, i64(0), e.key_blocks(i0, nq), key_block, "kb")

        def out(i):
            row = b.add(b.mul(bi, i64(g.tq)), b.add(i0, i))
            loop(b, g.d, lambda c: e.st(e.ld(dqt, (c, g.bq), i), a["dq"], (row, g.d), c), "c")

        for_range(b, i64(0), nq, out, "i")

    loop(b, g.nqb, query_block, "qb")
    for res, acc, width, wp in (("dk", dka, g.d, dp_), ("dv", dva, g.dv, dvp)):
        def copy(j, res=res, acc=acc, width=width, wp=wp):
            row = b.add(b.mul(bi, i64(g.tk)), j)
            loop(b, width, lambda c: e.st(e.ld(acc, (j, wp), c), a[res], (row, width), c), "c")

        loop(b, g.tk, copy, "j")
    b.ret_void()
    return fn


def emit_attention(b: ir.IRBuilder, op: Operation, outs: list, ins: list, scratch: ir.Value,
                   isa: Isa, threads: int, name: str) -> None:
    """The op's kernel: its items (see `_threads`) over the thread pool, each thread
    with its own block buffers in `scratch`."""
    g, forward = Geometry(op, isa), op.name == "kernel.attention"
    offs, per = _regions(g, forward)
    item = (_forward_item if forward else _backward_item)(b.module, g, list(offs), name)
    items, t = _threads(g, forward, threads)
    ptrs = list(outs) + list(ins) + [scratch]

    def chunk(bb, ps, lo, hi):
        c = bb.udiv(bb.add(bb.mul(lo, i64(t)), i64(items - 1)), i64(items))  # chunk index
        base = byte_offset(bb, ps[-1], bb.mul(c, i64(per)))
        regs = [byte_offset(bb, base, off) for off in offs.values()]
        for_range(bb, lo, hi, lambda it: bb.call(item, ps[:-1] + regs + [it]), "item")

    if t == 1:
        chunk(b, ptrs, i64(0), i64(items))
        return
    parallel_region(b, f"{name}.items", ptrs, [True] * len(outs) + [False] * len(ins) + [True],
                    items, t, chunk)
