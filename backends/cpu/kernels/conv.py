"""Convolutions on the cpu: im2col into scratch memory, then the GEMM (ember's own or
OpenBLAS, chosen as for matmuls, on every thread), per group and chunk of `nb` images side
by side (Q = nb * P columns):
- conv2d:              Y[n.., g]  = W[g] (Og x K)     @ cols(x[n.., g]) (K x Q)
- conv2d_grad_weight:  dW[g]     += G[n.., g] (Og x Q) @ cols(x[n.., g])^T (Q x K)
- conv2d_grad_input:   dcols      = W[g]^T (K x Og)   @ G[n.., g] (Og x Q), then col2im
(a pointwise conv's columns are its input, or its input gradient, in place: `direct`)
with K = c_in/groups * kh * kw and P = oh * ow. A chunk is as many images as give the GEMM
FOLD_COLUMNS columns (one where P is that large already): per image, the late layers of a
ResNet at 32x32 were GEMMs of 16 columns that each read the whole weight. With more than
one image a chunk's product and gradient are gathered side by side in scratch (NCHW keeps
each image's channels apart). Depthwise forward convs have loops of their own; forward
convs, stride-1 input gradients and weight gradients whose weight is within their limits
(`Conv.implicit`) pack their columns straight from the image, with no im2col
(implicit_conv.py, implicit_weight_grad.py); of those, 3x3 stride-1 forward convs and
input gradients with padding 1 run as Winograd F(2x2, 3x3) where their tiles allow
(winograd.py).
"""

from __future__ import annotations

from llvmlite import ir

from ....ir.dialects.kernel import conv_output
from ..call.buffers import regions
from ..gemm.emit import GemmProblem
from ..gemm.matmul import byte_offset, engine_for, gemm_call, gemm_scratch
from ..machine.host import Isa
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from . import scalar as S
from . import winograd_weight_grad
from .conv_epilogue import ConvEpilogue, Finish
from .implicit_conv import (
    Geometry,
    emit_implicit,
    fits,
    flip_weight,
    forward_weight_bytes,
    scratch_bytes,
)
from .implicit_pack import valid_outputs
from .implicit_weight_grad import emit_weight_grad, weight_bytes, weight_grad_scratch
from .loops import fill_zero, for_range, loop
from .scalar import i64
from .winograd import emit_winograd, runs_winograd
from .winograd import scratch_bytes as winograd_scratch

# -- convolution geometry ---------------------------------------------------------------------

class Conv:
    """Sizes of one conv op: x [n, c, h, w], w [o, c/g, kh, kw], y [n, o, oh, ow]."""

    def __init__(self, op):
        a = op.attributes
        self.name = "ember.conv2d" if op.name == "kernel.conv2d" else op.name
        self.g = a["groups"]
        (self.sh, self.sw), (self.ph, self.pw) = a["stride"], a["padding"]
        self.dh, self.dw = a["dilation"]
        if self.name == "ember.conv2d":
            x, w, y = op.operands[0].type, op.operands[1].type, conv_output(op)
        elif op.name == "ember.conv2d_grad_input":
            y, w, x = op.operands[0].type.shape, op.operands[1].type, op.result.type
        else:
            x, y, w = op.operands[0].type, op.operands[1].type.shape, op.result.type
        self.dtype = x.dtype
        self.n, self.c, self.h, self.w = x.shape
        self.o, self.cg, self.kh, self.kw = w.shape
        self.oh, self.ow = y[2:]
        self.og = self.o // self.g
        self.k = self.cg * self.kh * self.kw
        self.p = self.oh * self.ow

    @property
    def nb(self) -> int:
        """Images per GEMM: the largest divisor of the batch up to FOLD_COLUMNS / P, where
        a group's weight is too large to read again for each image from L1."""
        if self.og * self.k * S.size(self.dtype) <= FOLD_WEIGHT_BYTES:
            return 1
        want = max(1, min(self.n, -(-FOLD_COLUMNS // max(self.p, 1))))
        return max(d for d in range(1, want + 1) if self.n % d == 0)

    @property
    def q(self) -> int:
        return self.nb * self.p

    def problem(self) -> GemmProblem:
        """The GEMM of one (group, chunk of nb images)."""
        k, q, og = self.k, self.q, self.og
        if self.name == "ember.conv2d":
            return GemmProblem(og, q, k, k, 1, q, 1, q, self.dtype)
        if self.name == "ember.conv2d_grad_weight":  # B: the columns, Q x K
            ks, ps = self.cols_strides
            return GemmProblem(og, k, q, q, 1, ps, ks, k, self.dtype)
        return GemmProblem(k, q, og, 1, k, q, 1, q, self.dtype)

    def implicit(self, isa: Isa) -> Geometry | None:
        """The forward conv this op runs as an implicit GEMM (implicit_conv.py,
        implicit_weight_grad.py), if any: a forward conv's or weight gradient's own, or a
        stride-1 input gradient's."""
        geo = (Geometry.input_gradient(self) if self.name == "ember.conv2d_grad_input"
               else None if self.depthwise else Geometry.forward(self))
        limit = (weight_bytes() if self.name == "ember.conv2d_grad_weight"
                 else forward_weight_bytes())
        return geo if fits(geo, limit) else None

    @property
    def flipped_bytes(self) -> int:
        """Scratch for the flipped weight of an implicit input gradient."""
        return self.weight_bytes if self.name == "ember.conv2d_grad_input" else 0

    @property
    def depthwise(self) -> bool:
        """A forward conv of one input channel per output channel (MobileNet's): its own
        loops, not K x P GEMMs of one row each (`_emit_depthwise`)."""
        return self.name == "ember.conv2d" and self.cg == 1 and self.og == 1

    @property
    def direct(self) -> bool:
        """A pointwise conv of one image per GEMM: its columns are the image's channels,
        read (or, as the input gradient, written) where they are, with no im2col."""
        return (self.kh == self.kw == 1 and (self.sh, self.sw) == (1, 1)
                and (self.ph, self.pw) == (0, 0) and self.nb == 1)

    @property
    def cols_strides(self) -> tuple[int, int]:
        """(stride of a row (c, i, j) of the columns, of a position (image, p)): K x Q,
        but Q x K for a weight gradient's small enough to write down its columns (then its
        GEMM reads them unpacked; large ones, written a row K apart per store, took
        ResNet-18's weight gradients at 32x32 2.1x as long: 462 vs 216 ms a step)."""
        if (self.name == "ember.conv2d_grad_weight" and not self.direct
                and self.k * self.q * S.size(self.dtype) <= TRANSPOSED_COLUMNS):
            return 1, self.k
        return self.q, 1

    @property
    def weight_bytes(self) -> int:
        return self.o * self.k * S.size(self.dtype)

    def chunk_threads(self, threads: int) -> int:
        """Threads that each take whole chunks (a GEMM on one thread each), where there
        are chunks enough; else 1, and the GEMMs use every thread. A weight gradient sums
        every chunk into one dW: each thread but the first into a copy of its own, added
        up after, where dW is small and the work large (else its GEMMs split)."""
        flops = 2 * self.n * self.o * self.p * self.k
        if self.name == "ember.conv2d_grad_weight" and (
                self.weight_bytes > COPIED_WEIGHT_BYTES or flops < COPIED_WEIGHT_FLOPS):
            return 1
        return parallel_chunks(flops / 8, self.n // self.nb, threads)

    def gemm_threads(self, threads: int) -> int:
        return 1 if self.chunk_threads(threads) > 1 else threads

    def scratch(self, isa: Isa, threads: int) -> tuple[int, list[int]]:
        """(bytes of one chunk thread's scratch, offsets in it of: the columns, the chunk's
        product or gradient side by side (with more than one image), the GEMM's own, and
        a weight gradient's copy (split across threads))."""
        if self.depthwise:
            return 0, [0, 0, 0, 0]
        p, size, t = self.problem(), S.size(self.dtype), self.gemm_threads(threads)
        side = self.og * self.q * size if self.nb > 1 else 0
        copy = (self.weight_bytes if self.name == "ember.conv2d_grad_weight"
                and self.chunk_threads(threads) > 1 else 0)
        cols = 0 if self.direct else self.k * self.q * size
        offsets, total = regions(cols, side,
                                 gemm_scratch(p, engine_for(p, isa, t), isa, t), copy)
        return total, offsets


# columns a conv's GEMM gets at least, where the batch has the images, when its weight is
# larger than this (a smaller one stays in L1 from image to image)
FOLD_COLUMNS = 512
TRANSPOSED_COLUMNS = 128 << 10
FOLD_WEIGHT_BYTES = 32 << 10
# a weight gradient split across threads by chunks has a copy per thread, up to this size
# and from this much work (below, a thread's share is under ~0.1 ms: the copies' scratch
# and sum are not worth it)
COPIED_WEIGHT_BYTES = 1 << 20
COPIED_WEIGHT_FLOPS = 32 << 20


def conv_scratch(op, isa: Isa, threads: int) -> int:
    """A conv's scratch: a kernel.conv2d's product first, where it is not the first result
    (conv_epilogue.py), then the conv's own."""
    return _product_bytes(op) + _own_scratch(Conv(op), isa, threads)


def _product_bytes(op) -> int:
    if op.name != "kernel.conv2d":
        return 0
    return regions(ConvEpilogue(op, "").product_bytes)[1]


def _own_scratch(cv: Conv, isa: Isa, threads: int) -> int:
    geo = cv.implicit(isa)
    if geo is not None and cv.name == "ember.conv2d_grad_weight":
        if winograd_weight_grad.runs_weight_grad(geo, isa):
            return winograd_weight_grad.scratch_bytes(geo, isa, threads)
        return weight_grad_scratch(geo, isa, threads)
    if geo is not None and runs_winograd(geo, isa):
        return winograd_scratch(geo, isa, threads)
    if geo is not None:
        return cv.flipped_bytes + scratch_bytes(geo, isa, threads)
    return cv.chunk_threads(threads) * cv.scratch(isa, threads)[0]


def tap_position(b, cv: Conv, oh, ow, i, j):
    """(input row, input col, inside?) of tap (i, j) of output position (oh, ow)."""
    h = b.sub(b.add(b.mul(oh, i64(cv.sh)), b.mul(i, i64(cv.dh))), i64(cv.ph))
    w = b.sub(b.add(b.mul(ow, i64(cv.sw)), b.mul(j, i64(cv.dw))), i64(cv.pw))
    inside = b.and_(b.and_(b.icmp_signed(">=", h, i64(0)), b.icmp_signed("<", h, i64(cv.h))),
                    b.and_(b.icmp_signed(">=", w, i64(0)), b.icmp_signed("<", w, i64(cv.w))))
    return h, w, inside


def _ranges(n: int, valid: range) -> list[tuple[int, int, bool]]:
    """[0, n) as (start, stop, inside) pieces around `valid`."""
    out = [(0, valid.start, False), (valid.start, valid.stop, True), (valid.stop, n, False)]
    return [r for r in out if r[1] > r[0]]


def _span(b, n: int, body, name: str, start: int = 0) -> None:
    loop(b, n, lambda i: body(b.add(i, i64(start)) if start else i), name)


def _each_tap(b, cv: Conv, n, g, body) -> None:
    """For each channel c of group g of image n and each kernel tap (i, j):
    body(chan, i, j, vh, vw, row): `chan` the input channel's row of x, `vh`/`vw` the output
    rows/columns whose tap lands inside the image, `row` the tap's row of the columns."""
    def chan_body(c):
        chan = b.add(b.mul(n, i64(cv.c)), b.add(b.mul(g, i64(cv.cg)), c))
        for i in range(cv.kh):
            vh = valid_outputs(cv.oh, cv.h, cv.sh, cv.ph, i, cv.dh)
            for j in range(cv.kw):
                vw = valid_outputs(cv.ow, cv.w, cv.sw, cv.pw, j, cv.dw)
                row = b.add(b.mul(c, i64(cv.kh * cv.kw)), i64(i * cv.kw + j))
                body(chan, i, j, vh, vw, row)

    loop(b, cv.cg, chan_body, "c")


def _im2col(b, cv: Conv, x, n, g, cols, pos0):
    """cols[(c, i, j), pos0 + (oh, ow)] = x[n, g*cg + c, tap] (0 outside) (`cols_strides`):
    image n's P positions from `pos0` on. Taps are unrolled, so each piece of each row is a
    constant-bound loop: zeros before and after, a (vectorized) strided copy in between."""
    dt = cv.dtype
    zero = S.const(dt, 0)
    ks, ps = cv.cols_strides

    def tap(chan, i, j, vh, vw, row):
        base = b.add(b.mul(row, i64(ks)), b.mul(pos0, i64(ps)))
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


def _col2im(b, cv: Conv, cols, dx, n, g, pos0):
    """dx[n, g*cg + c, tap] += cols[(c, i, j), pos0 + (oh, ow)] for taps inside (K x Q
    cols)."""
    dt = cv.dtype

    def tap(chan, i, j, vh, vw, row):
        if not len(vh) or not len(vw):
            return

        def orow(oh):
            h = b.add(b.mul(oh, i64(cv.sh)), i64(i * cv.dh - cv.ph))
            xrow = b.mul(b.add(b.mul(chan, i64(cv.h)), h), i64(cv.w))
            prow = b.add(b.add(b.mul(row, i64(cv.q)), pos0), b.mul(oh, i64(cv.ow)))

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
    """A conv op, or a `kernel.conv2d`: the conv, its epilogue (conv_epilogue.py) on each
    span an implicit conv finishes or else after the conv."""
    cv = Conv(op)
    if 0 in (cv.n, cv.o, cv.p, cv.c):
        return
    if op.name != "kernel.conv2d":
        _emit(b, cv, outs[0], ins, scratch, isa, threads, name, None)
        return
    epi = ConvEpilogue(op, name)
    y = outs[0] if epi.in_place else scratch
    own = byte_offset(b, scratch, _product_bytes(op))
    # after each implicit unit; other convs run it after, in place: after each depthwise
    # plane, or per chunk on the blocks of rows the GEMM finished, it was slower (a 32-channel
    # depthwise conv at 112x112 with bias and ReLU6, 0.42 -> 0.63 ms; a pointwise conv 16 ->
    # 96 at 112x112, 1.14 -> 1.86 ms)
    finish = epi.finish(b, ins[2:], outs) if cv.implicit(isa) else None
    _emit(b, cv, y, ins[:2], own, isa, threads, name, finish)
    if finish is None:
        epi.emit_after(b, y, ins[2:], outs, threads)


def _emit(b: ir.IRBuilder, cv: Conv, y, ins, scratch, isa: Isa, threads: int, name: str,
          finish: Finish | None) -> None:
    """The conv into y, `finish` called on each span of y it completes (forward only)."""
    dt = cv.dtype
    if cv.depthwise:
        _emit_depthwise(b, cv, ins, y, threads, name)
        return
    geo = cv.implicit(isa)
    if geo is not None and cv.name == "ember.conv2d_grad_weight":
        emit = (winograd_weight_grad.emit_weight_grad
                if winograd_weight_grad.runs_weight_grad(geo, isa) else emit_weight_grad)
        emit(b, geo, *ins, y, scratch, isa, threads, name)
        return
    if geo is not None:
        x, w = ins
        if runs_winograd(geo, isa):  # an input gradient's flip read in place
            emit_winograd(b, geo, x, w, y, scratch, isa, threads, name, finish,
                          flipped=bool(cv.flipped_bytes))
            return
        if cv.flipped_bytes:
            flip_weight(b, cv, w, scratch, threads, name)
            w, scratch = scratch, byte_offset(b, scratch, cv.flipped_bytes)
        emit_implicit(b, geo, x, w, y, scratch, isa, threads, name, finish)
        return
    weights = cv.o * cv.k
    if cv.name != "ember.conv2d":  # both gradients accumulate: start from zero
        total = weights if cv.name == "ember.conv2d_grad_weight" else cv.n * cv.c * cv.h * cv.w
        fill_zero(b, y, dt, total)
    t = cv.chunk_threads(threads)
    per, offsets = cv.scratch(isa, threads)
    args = [*ins, y, scratch]
    chunks = cv.n // cv.nb
    if t == 1:
        loop(b, chunks, lambda ci: _conv_chunk(b, cv, args, offsets, ci, isa, threads, name),
             "chunk")
        return

    copies = cv.name == "ember.conv2d_grad_weight"

    def share(bb, ptrs, lo, hi):
        index = chunk_index(bb, lo, chunks, t)
        own = byte_offset(bb, ptrs[3], bb.mul(index, i64(per)))
        dw = ptrs[2]
        if copies:  # threads past the first sum into a copy of their own
            copy = byte_offset(bb, own, offsets[3])
            dw = bb.select(bb.icmp_signed("==", index, i64(0)), dw, copy)
            with bb.if_then(bb.icmp_signed("!=", index, i64(0))):
                fill_zero(bb, copy, dt, weights)
        for_range(bb, lo, hi, lambda ci: _conv_chunk(bb, cv, [*ptrs[:2], dw, own], offsets,
                                                       ci, isa, 1, name), "chunk")

    parallel_region(b, f"{name}.chunks", args, [False, False, True, True], chunks, t, share)
    if copies:
        def add(i):
            total = S.load(b, y, dt, i)
            for k in range(1, t):
                copy = byte_offset(b, scratch, k * per + offsets[3])
                total = b.fadd(total, S.load(b, copy, dt, i))
            S.store(b, y, dt, i, total)
        loop(b, weights, add, "dw")


def _emit_depthwise(b: ir.IRBuilder, cv: Conv, ins: list, y, threads: int,
                    name: str) -> None:
    """Each plane (image, channel) of a depthwise conv on its own, planes split across
    threads, row by row (`interior` and `edge` rows)."""
    x, w = ins
    dt = cv.dtype
    planes = cv.n * cv.c

    def plane(bb, xp, wp, yp, pl):
        xbase, ybase = bb.mul(pl, i64(cv.h * cv.w)), bb.mul(pl, i64(cv.p))
        wbase = bb.mul(bb.urem(pl, i64(cv.c)), i64(cv.kh * cv.kw))
        taps = [[S.load(bb, wp, dt, bb.add(wbase, i64(i * cv.kw + j))) for j in range(cv.kw)]
                for i in range(cv.kh)]

        vh = [valid_outputs(cv.oh, cv.h, cv.sh, cv.ph, i, cv.dh) for i in range(cv.kh)]
        vw = [valid_outputs(cv.ow, cv.w, cv.sw, cv.pw, j, cv.dw) for j in range(cv.kw)]
        inner = range(max(r.start for r in vw), min(r.stop for r in vw))

        def x_row(oh, i):
            return bb.add(xbase, bb.mul(bb.add(bb.mul(oh, i64(cv.sh)),
                                               i64(i * cv.dh - cv.ph)), i64(cv.w)))

        def tap(xrow, i, j, ow):
            col = bb.add(bb.mul(ow, i64(cv.sw)), i64(j * cv.dw - cv.pw))
            return bb.fmul(taps[i][j], S.load(bb, xp, dt, bb.add(xrow, col)))

        def interior(oh):
            """A row every tap row lands inside: each output its taps' sum (vectorized
            along the columns where every tap lands inside), a few edge columns each
            with the taps that land inside."""
            yrow = bb.add(ybase, bb.mul(oh, i64(cv.ow)))
            xrows = [x_row(oh, i) for i in range(cv.kh)]

            def out(ow, js):
                total = S.const(dt, 0)
                for i in range(cv.kh):
                    for j in js:
                        total = bb.fadd(total, tap(xrows[i], i, j, ow))
                S.store(bb, yp, dt, bb.add(yrow, ow), total)

            _span(bb, len(inner), lambda ow: out(ow, range(cv.kw)), "ow", inner.start)
            for c in (*range(min(inner.start, cv.ow)), *range(max(inner.stop, inner.start),
                                                              cv.ow)):
                out(i64(c), [j for j in range(cv.kw) if c in vw[j]])

        def edge(oh):
            """A row some tap rows miss: zeros, then each tap's weight times the input row
            it lands on, along the columns' valid span."""
            yrow = bb.add(ybase, bb.mul(oh, i64(cv.ow)))
            loop(bb, cv.ow, lambda ow: S.store(bb, yp, dt, bb.add(yrow, ow), S.const(dt, 0)),
                 "z")
            for i in range(cv.kh):
                if not len(vh[i]):
                    continue
                inside = bb.and_(bb.icmp_signed(">=", oh, i64(vh[i].start)),
                                 bb.icmp_signed("<", oh, i64(vh[i].stop)))
                with bb.if_then(inside):
                    xrow = x_row(oh, i)
                    for j in range(cv.kw):
                        def add(ow, i=i, j=j, xrow=xrow):
                            at = bb.add(yrow, ow)
                            S.store(bb, yp, dt, at, bb.fadd(S.load(bb, yp, dt, at),
                                                            tap(xrow, i, j, ow)))
                        _span(bb, len(vw[j]), add, "ow", vw[j].start)

        rows = range(max(r.start for r in vh), min(r.stop for r in vh))

        def row(oh):
            inside = bb.and_(bb.icmp_signed(">=", oh, i64(rows.start)),
                             bb.icmp_signed("<", oh, i64(rows.stop)))
            with bb.if_else(inside) as (all_taps, some):
                with all_taps:
                    interior(oh)
                with some:
                    edge(oh)

        loop(bb, cv.oh, row, "oh")

    t = parallel_chunks(2 * planes * cv.p * cv.k, planes, threads)
    if t == 1:
        loop(b, planes, lambda pl: plane(b, x, w, y, pl), "plane")
        return
    parallel_region(b, f"{name}.planes", [x, w, y], [False, False, True], planes, t,
                    lambda bb, ptrs, lo, hi: for_range(
                        bb, lo, hi, lambda pl: plane(bb, *ptrs, pl), "plane"))


def _conv_chunk(b: ir.IRBuilder, cv: Conv, ptrs: list, offsets: list[int], ci, isa: Isa,
                threads: int, name: str) -> None:
    """The GEMMs of chunk ci (images ci*nb ..), each group's, on `threads`; `ptrs`: the
    op's two operands, its result and this chunk thread's scratch."""
    a_in, b_in, out, scratch = ptrs
    cols, side, gscr = (byte_offset(b, scratch, o) for o in offsets[:3])
    el, nb, p = S.REG[cv.dtype], cv.nb, cv.problem()
    engine = engine_for(p, isa, threads)
    n0 = b.mul(ci, i64(nb))

    def at(ptr, offset):
        return b.gep(ptr, [offset], inbounds=True, source_etype=el)

    def rows(g):
        """Row (n0, g*og) of a [n, o, p] tensor (its product or gradient), in elements."""
        return b.mul(b.add(b.mul(n0, i64(cv.o)), b.mul(g, i64(cv.og))), i64(cv.p))

    def images(body):
        loop(b, nb, lambda nl: body(b.add(n0, nl), b.mul(nl, i64(cv.p))), "img")

    def group(g):
        weight = at(b_in if cv.name != "ember.conv2d_grad_weight" else out,
                    b.mul(g, i64(cv.og * cv.k)))
        # a pointwise conv's columns are its input's channels (its input gradient's)
        x_cols = at(out if cv.name == "ember.conv2d_grad_input" else a_in,
                    b.mul(b.add(b.mul(n0, i64(cv.c)), b.mul(g, i64(cv.cg))), i64(cv.p)))
        columns = x_cols if cv.direct else cols
        if cv.name == "ember.conv2d":
            if not cv.direct:
                images(lambda n, pos0: _im2col(b, cv, a_in, n, g, cols, pos0))
            product = side if nb > 1 else at(out, rows(g))
            gemm_call(b, p, engine, weight, columns, product, gscr, isa, threads, f"{name}.g")
            if nb > 1:
                _side_by_side(b, cv, out, side, n0, g, gather=False)
            return
        grads = a_in if cv.name == "ember.conv2d_grad_input" else b_in
        if nb > 1:
            _side_by_side(b, cv, grads, side, n0, g, gather=True)
        g_rows = side if nb > 1 else at(grads, rows(g))
        if cv.name == "ember.conv2d_grad_weight":
            if not cv.direct:
                images(lambda n, pos0: _im2col(b, cv, a_in, n, g, cols, pos0))
            gemm_call(b, p, engine, g_rows, columns, weight, gscr, isa, threads, f"{name}.g",
                      accumulate=True)
        else:
            gemm_call(b, p, engine, weight, g_rows, columns, gscr, isa, threads, f"{name}.g")
            if not cv.direct:
                images(lambda n, pos0: _col2im(b, cv, cols, out, n, g, pos0))

    loop(b, cv.g, group, "grp")


def _side_by_side(b, cv: Conv, tensor, side, n0, g, gather: bool) -> None:
    """side[o, (nl, p)] = tensor[n0 + nl, g*og + o, p] over the chunk's images (`gather`),
    or back the other way."""
    dt = cv.dtype

    def row(nl, o):
        in_tensor = b.mul(b.add(b.add(b.mul(b.add(n0, nl), i64(cv.o)), b.mul(g, i64(cv.og))),
                                o), i64(cv.p))
        in_side = b.add(b.mul(o, i64(cv.q)), b.mul(nl, i64(cv.p)))
        (src, s0), (dst, d0) = (((tensor, in_tensor), (side, in_side)) if gather else
                                ((side, in_side), (tensor, in_tensor)))
        loop(b, cv.p, lambda i: S.store(b, dst, dt, b.add(d0, i),
                                        S.load(b, src, dt, b.add(s0, i))), "p")

    loop(b, cv.nb, lambda nl: loop(b, cv.og, lambda o: row(nl, o), "o"), "img")
