"""The weight gradient of a conv whose weight is past L2 (implicit_weight_grad.py takes
smaller ones, in copies of dW^T per thread) as an implicit GEMM: dW^T (K x O) =
cols(x) (K x NP) @ dy^T (NP x O), over every output position of every image, the
columns never written out. Two passes, each split across threads:
1. dy^T: the output gradient transposed into panels (positions x O columns), once;
2. threads take blocks of the weight's input channels, so of K's rows (`_block_channels`:
   the block's dW^T rows stay in L2 in the thread's scratch, and no two threads write
   the same): per panel of positions, the block's columns are packed straight from the
   image (the forward's `packer`) and the micro-kernel multiplies them with the panel's
   dy^T into the block (each of dy^T's O panels in L1 over the block's tiles), which is
   then transposed into dW, lanes x lanes squares through registers.
In a ResNet-18 CIFAR b32 step the 256-channel 3x3's gradient ran 10.3-10.9 -> 8.4-8.6 ms
(the step 427 -> 412 ms); im2col wrote the columns first, then the GEMM packed them
again, and its threads summed copies of dW of their own.
"""

from __future__ import annotations

from llvmlite import ir

from ...strides import cdiv
from ..gemm.emit import blocking
from ..gemm.matmul import byte_offset
from ..gemm.microkernel import I1, microkernel, transpose_lanes
from ..machine.host import Isa, host_caches
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from . import scalar as S
from .implicit_conv import Geometry, Panels
from .implicit_pack import packer
from .loops import fill_zero, for_range, loop
from .scalar import i64


class _Layout:
    """Sizes and scratch regions of one weight gradient on `threads` threads."""

    def __init__(self, geo: Geometry, isa: Isa, threads: int):
        self.geo, self.size = geo, S.size(geo.dtype)
        self.pn = Panels.of(geo, isa)
        blk = blocking(isa, geo.dtype, geo.og)
        self.width, self.mr = blk.nr(isa.lanes(geo.dtype)), blk.mr  # dW^T's O columns
        self.o_panels = cdiv(geo.og, self.width)
        self.panel_elems = self.o_panels * self.pn.width * self.width  # a panel's dy^T
        self.channels = _block_channels(geo, threads)
        self.per_group = cdiv(geo.cg, self.channels)
        self.blocks = geo.g * self.per_group
        flops = 2 * geo.n * geo.o * geo.p * geo.k
        self.threads = parallel_chunks(flops / 8, self.blocks, threads)
        self.cols_elems = self.channels * geo.taps * self.pn.width  # a thread's columns
        self.block_elems = self.channels * geo.taps * geo.og  # and its block of dW^T
        self.per_thread = (self.cols_elems + self.block_elems) * self.size
        self.own = self.pn.items * self.panel_elems * self.size  # offsets in bytes: dy^T at 0
        self.total = self.own + self.threads * self.per_thread


def _block_channels(geo: Geometry, threads: int) -> int:
    """Input channels per block of dW^T's rows: as many as keep the block in half of L2,
    and few enough that every thread gets one, in blocks as even as can be (for as many
    of them for each thread)."""
    by_cache = max(1, host_caches().l2 // 2 // (geo.taps * geo.og * S.size(geo.dtype)))
    per_group = cdiv(geo.cg, min(geo.cg, by_cache, cdiv(geo.cg, cdiv(threads, geo.g))))
    while per_group < geo.cg and (geo.g * per_group) % threads:
        per_group += 1
    return cdiv(geo.cg, per_group)


def scratch_bytes(geo: Geometry, isa: Isa, threads: int) -> int:
    return _Layout(geo, isa, threads).total


def emit_by_blocks(b: ir.IRBuilder, geo: Geometry, x, dy, dw, scratch, isa: Isa,
                   threads: int, name: str) -> None:
    """dw = conv2d_grad_weight(x, dy) of `geo`, in the two passes above."""
    lay = _Layout(geo, isa, threads)
    _transpose_dy(b, lay, dy, scratch, threads, name)
    _multiply(b, lay, x, scratch, dw, byte_offset(b, scratch, lay.own), isa, name)


def _transpose_dy(b: ir.IRBuilder, lay: _Layout, dy, dy_t, threads: int, name: str) -> None:
    """dy_t[g, panel][o / width][q][o % width] = dy[image, g*og + o, p] for the panel's
    positions q (image, p), zeros in the columns past O (which the micro-kernel reads)."""
    geo, pn, dt, width = lay.geo, lay.pn, lay.geo.dtype, lay.width

    def panel(bb, src, dst, it):
        g, pos0, npos, _ = pn.locate(bb, it)
        base = bb.mul(it, i64(lay.panel_elems))

        def position(q):
            image, p = (f(bb.add(pos0, q), i64(geo.p)) for f in (bb.udiv, bb.urem))
            at = bb.add(bb.mul(bb.add(bb.mul(image, i64(geo.o)), bb.mul(g, i64(geo.og))),
                               i64(geo.p)), p)
            for op in range(lay.o_panels):
                row = bb.add(base, bb.add(i64(op * pn.width * width), bb.mul(q, i64(width))))
                o0 = op * width
                real = min(width, geo.og - o0)
                loop(bb, real, lambda o, o0=o0, row=row: S.store(
                    bb, dst, dt, bb.add(row, o),
                    S.load(bb, src, dt, bb.add(at, bb.mul(bb.add(o, i64(o0)), i64(geo.p))))),
                    "o")
                loop(bb, width - real, lambda o, real=real, row=row: S.store(
                    bb, dst, dt, bb.add(row, bb.add(o, i64(real))), S.const(dt, 0)), "o0")

        for_range(bb, i64(0), npos, position, "q")

    t = parallel_chunks(geo.n * geo.o * geo.p, pn.items, threads)
    if t == 1:
        loop(b, pn.items, lambda it: panel(b, dy, dy_t, it), "panel")
        return
    parallel_region(b, f"{name}.dyt", [dy, dy_t], [False, True], pn.items, t,
                    lambda bb, ptrs, lo, hi: for_range(
                        bb, lo, hi, lambda it: panel(bb, *ptrs, it), "panel"))


def _multiply(b: ir.IRBuilder, lay: _Layout, x, dy_t, dw, own, isa: Isa, name: str) -> None:
    """dW^T's blocks of rows, split across threads: each block, in the thread's own
    scratch, over every panel, then transposed into dW."""
    geo, pn, dt = lay.geo, lay.pn, lay.geo.dtype
    el, lanes, mr, width = S.REG[dt], isa.lanes(dt), lay.mr, lay.width
    nr, cb = pn.width, lay.channels
    mod = b.module
    o_tail = geo.og - (lay.o_panels - 1) * width
    kernels = [microkernel(mod, dt, lanes, mr, cdiv(width, lanes), False),
               microkernel(mod, dt, lanes, mr, cdiv(o_tail, lanes), False)]
    packers = {cc: packer(mod, geo, cc, nr, lanes, f"{name}.pack{cc}")
               for cc in {cb, geo.cg % cb} if cc}

    def at(bb, ptr, offset):
        return bb.gep(ptr, [offset], inbounds=True, source_etype=el)

    def block(bb, xp, dyt, dwp, buf, g, c0, cc: int):
        """Input channels [c0, c0 + cc) of group g: dW^T's rows k0 .. k0 + cc*taps."""
        kk = cc * geo.taps
        rows_at = at(bb, buf, i64(lay.cols_elems))
        fill_zero(bb, rows_at, dt, kk * geo.og)
        xg = at(bb, xp, bb.mul(bb.add(bb.mul(g, i64(geo.cg)), c0), i64(geo.h * geo.w)))

        def panel(jp):
            it = bb.add(bb.mul(g, i64(pn.count)), jp)
            _, pos0, npos, _ = pn.locate(bb, it)
            bb.call(packers[cc], [xg, buf, pos0, npos])
            dyt_panel = at(bb, dyt, bb.mul(it, i64(lay.panel_elems)))

            for op in range(lay.o_panels):  # dy^T's panel stays in L1 over the tiles
                last = op == lay.o_panels - 1

                def tile(r, op=op, last=last):
                    rows = bb.sub(i64(kk), bb.mul(r, i64(mr)))
                    rows = bb.select(bb.icmp_signed("<", rows, i64(mr)), rows, i64(mr))
                    a = at(bb, buf, bb.mul(r, i64(mr * nr)))
                    c = at(bb, rows_at, bb.add(bb.mul(r, i64(mr * geo.og)), i64(op * width)))
                    bb.call(kernels[last], [a, i64(nr), i64(1),
                                            at(bb, dyt_panel, i64(op * nr * width)),
                                            i64(width), c, i64(geo.og), npos,
                                            ir.Constant(I1, 1), rows,
                                            i64(o_tail if last else width)])

                loop(bb, cdiv(kk, mr), tile, "tile")

        loop(bb, pn.count, panel, "panel")
        k0 = bb.add(bb.mul(g, i64(geo.og * geo.k)), bb.mul(c0, i64(geo.taps)))
        _put_block(bb, lay, rows_at, at(bb, dwp, k0), kk, lanes)

    def unit(bb, xp, dyt, dwp, buf, u):
        g, j = bb.udiv(u, i64(lay.per_group)), bb.urem(u, i64(lay.per_group))
        c0 = bb.mul(j, i64(cb))
        rest = geo.cg % cb
        if not rest:
            block(bb, xp, dyt, dwp, buf, g, c0, cb)
            return
        with bb.if_else(bb.icmp_signed("==", j, i64(lay.per_group - 1))) as (short, whole):
            with short:
                block(bb, xp, dyt, dwp, buf, g, c0, rest)
            with whole:
                block(bb, xp, dyt, dwp, buf, g, c0, cb)

    t = lay.threads
    if t == 1:
        loop(b, lay.blocks, lambda u: unit(b, x, dy_t, dw, own, u), "block")
        return

    def share(bb, ptrs, lo, hi):
        buf = byte_offset(bb, ptrs[3], bb.mul(chunk_index(bb, lo, lay.blocks, t),
                                              i64(lay.per_thread)))
        for_range(bb, lo, hi, lambda u: unit(bb, *ptrs[:3], buf, u), "block")

    parallel_region(b, f"{name}.blocks", [x, dy_t, dw, own], [False, False, True, True],
                    lay.blocks, t, share)


def _put_block(b: ir.IRBuilder, lay: _Layout, block, dw, kk: int, lanes: int) -> None:
    """dw[o, k] = block[k, o] for the block's kk rows of dW^T (dw: at the block's first
    column of dW's row 0): lanes x lanes squares through registers where O divides into
    them, the rows past the last whole square and other O element by element."""
    geo, dt = lay.geo, lay.geo.dtype
    el = S.REG[dt]
    vt = ir.VectorType(el, lanes)

    def at(ptr, offset):
        return b.gep(ptr, [offset], inbounds=True, source_etype=el)

    def one(k, o):
        S.store(b, dw, dt, b.add(b.mul(o, i64(geo.k)), k),
                S.load(b, block, dt, b.add(b.mul(k, i64(geo.og)), o)))

    squares = kk // lanes if geo.og % lanes == 0 else 0

    def square(kb, ob):
        k0, o0 = b.mul(kb, i64(lanes)), b.mul(ob, i64(lanes))
        rows = [b.load(at(block, b.add(b.mul(b.add(k0, i64(i)), i64(geo.og)), o0)), typ=vt,
                       align=lay.size) for i in range(lanes)]
        for j, v in enumerate(transpose_lanes(b, rows)):
            b.store(v, at(dw, b.add(b.mul(b.add(o0, i64(j)), i64(geo.k)), k0)),
                    align=lay.size)

    loop(b, squares, lambda kb: loop(b, geo.og // lanes, lambda ob: square(kb, ob), "ob"),
         "kb")
    loop(b, kk - squares * lanes, lambda k: loop(
        b, geo.og, lambda o: one(b.add(k, i64(squares * lanes)), o), "o"), "k")
