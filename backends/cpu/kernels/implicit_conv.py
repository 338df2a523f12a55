"""Convolutions as implicit GEMMs: Y[n, o, p] = W (O x K) @ cols(x[n]) (K x P), the
columns never written out. Each `nr`-wide panel of output positions (`Panels`: the
images' positions one after another) packs a slice of whole input channels (about `KC`
rows) of its columns straight from the image into a buffer that stays in L1,
and every `mr`-row tile of W multiplies it there (the own GEMM's micro-kernel, A = W read
in place). im2col wrote an image's whole K x P columns first (2.4 MB at 64 channels of
32x32, past L2) and the GEMM then packed them a second time.

A weight larger than L2 is read from L3 once for a chunk of panels (`Units`); this path
is for weights up to `forward_weight_bytes` (`fits`); larger ones keep im2col and
batch-folded GEMMs (conv.py). A stride-1 conv's input gradient is a forward conv of the
output gradient with the weight's taps flipped and its channels swapped
(`Geometry.input_gradient`): the same kernel, where im2col's path wrote K x P gradient
columns and added them back (col2im).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ...strides import cdiv
from ..gemm.emit import blocking
from ..gemm.matmul import byte_offset
from ..gemm.microkernel import microkernel
from ..machine.host import Isa, host_caches
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from . import scalar as S
from .conv_epilogue import Finish
from .implicit_pack import packer
from .loops import fill_zero, for_range, loop
from .scalar import i64

# depth of a packed slice of the columns, about: its nr x KC buffer (32 KiB of f32 at
# nr = 64) stays in L1 while the tiles of W multiply it. A slice is whole channels (all
# their taps), so each tap's place in it, and the output columns it reaches, are constants
KC = 128
# an input gradient flips its weight (`flip_weight`, a pass over it) for the implicit GEMM
# where the batch has this many positions; with the flip by tiles on every thread,
# 512-channel 3x3 input gradients at 4x4 ran 7.96 ms flipped against 9.62 through im2col
# at batch 32 (512 positions), 2.22 against 2.39 at batch 8 (128), but 1.41 against 1.21
# at 7x7, batch 1 (49); a 256-channel one at 8x8, batch 4 (256), 0.95 against 1.15
FLIP_POSITIONS = 128


@dataclass(frozen=True)
class Geometry:
    """A forward conv: x [n, c, h, w], weight [o, c/g, kh, kw], y [n, o, oh, ow]."""

    n: int
    c: int
    h: int
    w: int
    o: int
    g: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    oh: int
    ow: int
    dtype: str

    @classmethod
    def forward(cls, cv) -> Geometry:
        """Of a `conv.Conv` of `ember.conv2d`."""
        return cls(cv.n, cv.c, cv.h, cv.w, cv.o, cv.g, cv.kh, cv.kw, cv.sh, cv.sw, cv.ph,
                   cv.pw, cv.dh, cv.dw, cv.oh, cv.ow, cv.dtype)

    @classmethod
    def input_gradient(cls, cv) -> Geometry | None:
        """The forward conv of dy [n, o, oh, ow] that gives a `conv.Conv` of
        `ember.conv2d_grad_input`'s dx, where its stride is 1: the weight's taps flipped
        and its channels swapped (`flip_weight`), padded by the taps' reach less the
        forward's padding. None for other strides (or padding past the reach), and where
        the flip, a pass over the weight on every call, would cost too much for the few
        positions (`FLIP_POSITIONS`)."""
        ph, pw = cv.dh * (cv.kh - 1) - cv.ph, cv.dw * (cv.kw - 1) - cv.pw
        if (cv.sh, cv.sw) != (1, 1) or ph < 0 or pw < 0 or cv.n * cv.p < FLIP_POSITIONS:
            return None
        return cls(cv.n, cv.o, cv.oh, cv.ow, cv.c, cv.g, cv.kh, cv.kw, 1, 1, ph, pw,
                   cv.dh, cv.dw, cv.h, cv.w, cv.dtype)

    @property
    def cg(self) -> int:
        return self.c // self.g

    @property
    def og(self) -> int:
        return self.o // self.g

    @property
    def k(self) -> int:
        return self.cg * self.kh * self.kw

    @property
    def p(self) -> int:
        return self.oh * self.ow

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    @property
    def weight_bytes(self) -> int:
        """A group's weight."""
        return self.og * self.k * S.size(self.dtype)

    @property
    def flops(self) -> int:
        return 2 * self.n * self.o * self.p * self.k

    @property
    def slice_channels(self) -> int:
        """Channels per packed slice of the columns (`KC`)."""
        return min(self.cg, max(1, KC // self.taps))


def fits(geo: Geometry | None, weight_bytes: int) -> bool:
    """Whether `geo` runs as an implicit GEMM: f32/f64, taps to gather (a pointwise conv's
    columns are its input already), a group's weight within `weight_bytes`."""
    if geo is None or geo.dtype not in S.FLOATS or geo.taps == 1:
        return False
    return geo.weight_bytes <= weight_bytes


def forward_weight_bytes() -> int:
    """The largest weight (of a group) a forward implicit GEMM takes: each chunk of panels
    (`Units`) reads it all, from L3 where it is larger than L2; read by every panel (4
    bytes per 2 x 64 multiply-adds), 2 threads sustained it in isolation: ResNet-18's 3x3
    convs of 256 and 512 channels (2.4 and 9.4 MB) ran at 84% and 80% of peak, against
    71% and 57% through im2col. Past L3 it would come from DRAM, which the 16 L2s this
    allows stay below on the CPUs measured (a znver4's 32 MB L3 per 16 MB, a Xeon's
    480 MB per 32 MB)."""
    return 16 * host_caches().l2


def panel_width(geo: Geometry, isa: Isa) -> int:
    """Output positions per panel: the micro-kernel's width."""
    return blocking(isa, geo.dtype, 1 << 20).nr(isa.lanes(geo.dtype))


@dataclass(frozen=True)
class Panels:
    """The work items of an implicit conv: per group, panels of `width` output positions,
    the positions of all images one after another (P each), so that late layers' images of
    fewer than `width` positions share panels; the last panel holds `tail`."""

    width: int
    count: int  # per group
    tail: int
    groups: int

    @classmethod
    def of(cls, geo: Geometry, isa: Isa) -> Panels:
        width = panel_width(geo, isa)
        count = cdiv(geo.n * geo.p, width)
        return cls(width, count, geo.n * geo.p - (count - 1) * width, geo.g)

    @property
    def items(self) -> int:
        return self.groups * self.count

    def locate(self, b: ir.IRBuilder, it) -> tuple:
        """(group, first position, positions, whether it is the last panel) of item it."""
        jp = b.urem(it, i64(self.count))
        last = b.icmp_signed("==", jp, i64(self.count - 1))
        return (b.udiv(it, i64(self.count)), b.mul(jp, i64(self.width)),
                b.select(last, i64(self.tail), i64(self.width)), last)


def threads_for(geo: Geometry, isa: Isa, threads: int) -> int:
    """Threads for work split by panels alone (the weight gradient's)."""
    return parallel_chunks(geo.flops / 8, Panels.of(geo, isa).items, threads)


def resident_weight_bytes() -> int:
    """The largest weight (of a group) that every panel reads on its own: from L2."""
    return host_caches().l2 // 2


def chunk_bytes() -> int:
    """The most bytes of a chunk's packed panels (`Units`), and of its product's block of
    rows: an eighth of L2 each."""
    return host_caches().l2 // 8


@dataclass(frozen=True)
class Units:
    """The forward's work units: per group, chunks of `span` panels, times blocks of
    `per_block` mr-row tiles of the weight. A weight that stays in L2 is read by every
    panel on its own (span 1, all its rows). A larger one would come from L3 for every
    panel: a chunk of panels is packed first (`chunk_bytes`), then each, in L1, is
    multiplied by the tiles of a block of W's rows, whose slice stays in L2 from panel to
    panel, so W comes from L3 once a chunk (ResNet-18's 512-channel 3x3 at 4x4, in a
    training step: 10.6 -> 8.6 ms); the block's product of the chunk fits `chunk_bytes`
    too. Rows are split further where units are too few for the threads (an image at
    batch 1: ResNet-18's last layer at 224 is one panel of 49 positions)."""

    panels: Panels
    span: int
    chunks: int  # per group
    blocks: int
    per_block: int

    @classmethod
    def of(cls, geo: Geometry, isa: Isa, threads: int) -> Units:
        pn = Panels.of(geo, isa)
        mr = blocking(isa, geo.dtype, 1 << 20).mr
        tiles, size = cdiv(geo.og, mr), S.size(geo.dtype)
        if geo.weight_bytes <= resident_weight_bytes():
            span, chunks = 1, pn.count
            blocks = 1 if pn.items >= 2 * threads else min(tiles, cdiv(2 * threads, pn.items))
        else:
            packed = pn.width * geo.slice_channels * geo.taps * size
            chunks = cdiv(pn.count, max(1, chunk_bytes() // packed))
            span = cdiv(pn.count, chunks)
            blocks = min(tiles, cdiv(tiles, max(1, chunk_bytes() // (span * pn.width * size)
                                                // mr)))
            while blocks < tiles and (pn.groups * chunks * blocks) % threads:
                blocks += 1  # as many units for each thread
        per_block = cdiv(tiles, blocks)
        return cls(pn, span, chunks, cdiv(tiles, per_block), per_block)

    @property
    def count(self) -> int:
        return self.panels.groups * self.chunks * self.blocks

    def locate(self, b: ir.IRBuilder, u) -> tuple:
        """(group, first position, positions, first tile of the block) of unit u."""
        pn, chunk = self.panels, b.udiv(u, i64(self.blocks))
        g, jc = b.udiv(chunk, i64(self.chunks)), b.urem(chunk, i64(self.chunks))
        pos0 = b.mul(jc, i64(self.span * pn.width))
        npos = b.sub(i64(pn.count * pn.width - pn.width + pn.tail), pos0)
        npos = S.at_most(b, npos, self.span * pn.width)
        return g, pos0, npos, b.mul(b.urem(u, i64(self.blocks)), i64(self.per_block))


def forward_threads(geo: Geometry, isa: Isa, threads: int) -> int:
    return parallel_chunks(geo.flops / 8, Units.of(geo, isa, threads).count, threads)


def scratch_bytes(geo: Geometry, isa: Isa, threads: int) -> int:
    return forward_threads(geo, isa, threads) * _thread_bytes(geo, isa, threads)


def _thread_bytes(geo: Geometry, isa: Isa, threads: int) -> int:
    """A thread's scratch: a chunk's packed slices, and where panels cross images, the
    chunk's product of a block's rows."""
    un = Units.of(geo, isa, threads)
    nr, mr = un.panels.width, blocking(isa, geo.dtype, 1 << 20).mr
    product = un.per_block * mr * un.span * nr if _gathers(geo, isa) else 0
    return (un.span * nr * geo.slice_channels * geo.taps + product) * S.size(geo.dtype)


FLIP_TILE = 16  # (o, c) pairs a side of each tile `flip_weight` moves


def flip_weight(b: ir.IRBuilder, cv, w, out, threads: int, name: str) -> None:
    """out[g, c, o, kh-1-i, kw-1-j] = w[g, o, c, i, j] per group (`input_gradient`), a tile
    of 16 x 16 (o, c) pairs at a time, so reads and writes both walk runs of 16 x taps
    elements, tiles of a group's input channels split across threads. (Pair by pair on
    one thread, its writes a whole weight row apart, it took 1.7 ms of a 512-channel
    3x3 input gradient's 10 at 4x4 positions and batch 32.)"""
    dt, taps, t = cv.dtype, cv.kh * cv.kw, FLIP_TILE
    c_tiles = cdiv(cv.cg, t)

    def pair(bb, wp, op, g, o, c):
        src = bb.add(bb.mul(bb.add(bb.mul(g, i64(cv.og)), o), i64(cv.k)), bb.mul(c, i64(taps)))
        dst = bb.add(bb.mul(bb.add(bb.mul(g, i64(cv.cg)), c), i64(cv.og * taps)),
                     bb.mul(o, i64(taps)))
        loop(bb, taps, lambda k: S.store(bb, op, dt, bb.sub(bb.add(dst, i64(taps - 1)), k),
                                         S.load(bb, wp, dt, bb.add(src, k))), "t")

    def tile(bb, wp, op, u, o0):
        g, c0 = bb.udiv(u, i64(c_tiles)), bb.mul(bb.urem(u, i64(c_tiles)), i64(t))
        c1 = S.at_most(bb, bb.add(c0, i64(t)), cv.cg)
        for_range(bb, o0, S.at_most(bb, bb.add(o0, i64(t)), cv.og), lambda o: for_range(
            bb, c0, c1, lambda c: pair(bb, wp, op, g, o, c), "c"), "o")

    def units(bb, ptrs, lo, hi):
        for_range(bb, lo, hi, lambda u: loop(
            bb, cdiv(cv.og, t), lambda k: tile(bb, *ptrs, u, bb.mul(k, i64(t))), "ot"), "u")

    n = cv.g * c_tiles
    chunks = parallel_chunks(cv.weight_bytes // S.size(dt), n, threads)
    if chunks == 1:
        units(b, [w, out], i64(0), i64(n))
        return
    parallel_region(b, f"{name}.flip", [w, out], [False, True], n, chunks, units)


def emit_implicit(b: ir.IRBuilder, geo: Geometry, x, w, y, scratch, isa: Isa, threads: int,
                  name: str, finish: Finish | None = None) -> None:
    """y = conv(x, w) of `geo`, its `Units` split across threads, each with its own
    scratch (`scratch_bytes`): a chunk's packed slices, and where panels cross images
    (`_gathers`), the chunk's product, put in place after; then `finish` (a forward's
    epilogue, conv_epilogue.py) on the unit's spans of y."""
    dt, el = geo.dtype, S.REG[geo.dtype]
    lanes = isa.lanes(dt)
    blk = blocking(isa, dt, 1 << 20)
    un = Units.of(geo, isa, threads)
    nr = un.panels.width
    mod = b.module
    uk_full = microkernel(mod, dt, lanes, blk.mr, blk.nv, False)
    uk_tail = microkernel(mod, dt, lanes, blk.mr, cdiv(un.panels.tail, lanes), False)
    cs = geo.slice_channels
    packers = {cc: packer(mod, geo, cc, nr, lanes, f"{name}.pack{cc}")
               for cc in {cs, geo.cg % cs} if cc}
    t = forward_threads(geo, isa, threads)
    slice_elems = nr * cs * geo.taps
    per = _thread_bytes(geo, isa, threads)
    gathers = _gathers(geo, isa)
    tiles = cdiv(geo.og, blk.mr)

    def at(bb, ptr, offset):
        return bb.gep(ptr, [offset], inbounds=True, source_etype=el)

    extra = finish.ptrs if finish is not None else []

    def unit(bb, xp, wp, yp, buf, eptrs, u):
        g, pos0, npos, tile0 = un.locate(bb, u)
        tile_end = bb.add(tile0, i64(un.per_block))
        tile_end = S.at_most(bb, tile_end, tiles)
        row0 = bb.mul(tile0, i64(blk.mr))
        rows_end = bb.mul(tile_end, i64(blk.mr))
        rows_end = S.at_most(bb, rows_end, geo.og)
        panels = bb.udiv(bb.add(npos, i64(nr - 1)), i64(nr))
        xg = at(bb, xp, bb.mul(g, i64(geo.cg * geo.h * geo.w)))
        wg = at(bb, wp, bb.mul(g, i64(geo.og * geo.k)))
        if gathers:  # the chunk's product goes to scratch first, from the block's row 0
            product, ldc = at(bb, buf, i64(un.span * slice_elems)), un.span * nr
        else:  # panels inside one image each: straight into y
            ldc = geo.p

        def c_tile(j):
            """Panel j's product, at the block's first row."""
            if gathers:
                return at(bb, product, bb.mul(j, i64(nr)))
            pos = bb.add(pos0, bb.mul(j, i64(nr)))
            image, p0 = bb.udiv(pos, i64(geo.p)), bb.urem(pos, i64(geo.p))
            row = bb.add(bb.add(bb.mul(image, i64(geo.o)), bb.mul(g, i64(geo.og))),
                         bb.mul(tile0, i64(blk.mr)))
            return at(bb, yp, bb.add(bb.mul(row, i64(geo.p)), p0))

        def columns(j):
            """Positions of panel j."""
            cols = bb.sub(npos, bb.mul(j, i64(nr)))
            return S.at_most(bb, cols, nr)

        def k_slice(c0, cc: int):
            """Channels [c0, c0 + cc) of the group: rows k0.. of the columns."""
            kk, k0 = cc * geo.taps, bb.mul(c0, i64(geo.taps))
            x_slice = at(bb, xg, bb.mul(c0, i64(geo.h * geo.w)))
            for_range(bb, i64(0), panels, lambda j: bb.call(packers[cc], [
                x_slice, at(bb, buf, bb.mul(j, i64(slice_elems))),
                bb.add(pos0, bb.mul(j, i64(nr))), columns(j)]), "pack")
            first = bb.icmp_signed(">", k0, i64(0))

            def panel(j):
                cols, c_panel = columns(j), c_tile(j)
                b_panel = at(bb, buf, bb.mul(j, i64(slice_elems)))

                def tile(r):
                    rows = bb.sub(i64(geo.og), bb.mul(r, i64(blk.mr)))
                    rows = S.at_most(bb, rows, blk.mr)
                    a = at(bb, wg, bb.add(bb.mul(r, i64(blk.mr * geo.k)), k0))
                    c = at(bb, c_panel, bb.mul(bb.sub(r, tile0), i64(blk.mr * ldc)))

                    def call(uk):
                        bb.call(uk, [a, i64(geo.k), i64(1), b_panel, i64(nr), c, i64(ldc),
                                     i64(kk), first, rows, cols])
                    if uk_tail is uk_full:  # the last panel's columns are masked all the same
                        call(uk_full)
                        return
                    with bb.if_else(bb.icmp_signed("<", cols, i64(nr))) as (short, whole):
                        with short:
                            call(uk_tail)
                        with whole:
                            call(uk_full)

                for_range(bb, tile0, tile_end, tile, "tile")

            for_range(bb, i64(0), panels, panel, "panel")

        full, rest = divmod(geo.cg, cs)
        loop(bb, full, lambda kb: k_slice(bb.mul(kb, i64(cs)), cs), "kb")
        if rest:
            k_slice(i64(full * cs), rest)
        if gathers:
            def put(q):  # column q of the product: position pos0 + q of some image
                image, p = (f(bb.add(pos0, q), i64(geo.p)) for f in (bb.udiv, bb.urem))
                out = bb.add(bb.mul(bb.add(bb.mul(image, i64(geo.o)), bb.mul(g, i64(geo.og))),
                                    i64(geo.p)), p)
                for_range(bb, row0, rows_end, lambda o: S.store(
                    bb, yp, dt, bb.add(out, bb.mul(o, i64(geo.p))),
                    S.load(bb, product, dt, bb.add(bb.mul(bb.sub(o, row0), i64(ldc)), q))),
                    "o")
            for_range(bb, i64(0), npos, put, "q")
        if finish is not None and not batched:
            _finish_unit(bb, geo, finish, yp, eptrs, g, pos0, npos, row0, rows_end)

    # units of all rows, one after another along the positions: their epilogue runs on a
    # batch of them at a time (a unit of ResNet's or MobileNet's first conv is one panel,
    # and a call per unit and row cost as much as the conv)
    batched = un.blocks == 1 and geo.g == 1
    per_batch = max(1, chunk_bytes() // (un.span * nr * geo.og * S.size(dt)))
    positions = geo.n * geo.p

    def run(bb, xp, wp, yp, own, eptrs, lo, hi):
        # zeros in the columns past the last panel's (which the micro-kernel reads, and
        # left from other kernels could be slow subnormals)
        fill_zero(bb, own, dt, un.span * slice_elems)
        if finish is None or not batched:
            for_range(bb, lo, hi, lambda u: unit(bb, xp, wp, yp, own, eptrs, u), "unit")
            return

        def batch(k):
            u0 = bb.add(lo, bb.mul(k, i64(per_batch)))
            u1 = bb.add(u0, i64(per_batch))
            u1 = S.at_most(bb, u1, hi)
            for_range(bb, u0, u1, lambda u: unit(bb, xp, wp, yp, own, eptrs, u), "unit")
            pos0 = bb.mul(u0, i64(un.span * nr))
            pos1 = bb.mul(u1, i64(un.span * nr))
            pos1 = S.at_most(bb, pos1, positions)
            _finish_unit(bb, geo, finish, yp, eptrs, i64(0), pos0, bb.sub(pos1, pos0),
                         i64(0), i64(geo.og))

        batches = bb.udiv(bb.add(bb.sub(hi, lo), i64(per_batch - 1)), i64(per_batch))
        for_range(bb, i64(0), batches, batch, "batch")

    if t == 1:
        run(b, x, w, y, scratch, extra, i64(0), i64(un.count))
        return

    def share(bb, ptrs, lo, hi):
        own = byte_offset(bb, ptrs[3], bb.mul(chunk_index(bb, lo, un.count, t), i64(per)))
        run(bb, *ptrs[:3], own, ptrs[4:], lo, hi)

    parallel_region(b, f"{name}.units", [x, w, y, scratch, *extra],
                    [False, False, True, True] + [False] * len(extra), un.count, t, share)


def _finish_unit(b: ir.IRBuilder, geo: Geometry, finish: Finish, y, eptrs: list, g, pos0,
                 npos, row0, rows_end) -> None:
    """`finish` on a unit's output: rows [row0, rows_end) of group g at positions
    [pos0, pos0 + npos) of the images one after another, a span per image and row."""
    p = i64(geo.p)
    first, last = b.udiv(pos0, p), b.udiv(b.add(pos0, b.sub(npos, i64(1))), p)

    def image(n):
        start = b.mul(n, p)
        lo = b.sub(pos0, start)
        lo = b.select(b.icmp_signed("<", lo, i64(0)), i64(0), lo)
        hi = b.sub(b.add(pos0, npos), start)
        hi = S.at_most(b, hi, p)
        finish.span(b, y, eptrs, n, b.add(b.mul(g, i64(geo.og)), row0),
                    b.sub(rows_end, row0), lo, hi)

    for_range(b, first, b.add(last, i64(1)), image, "image")


def _gathers(geo: Geometry, isa: Isa) -> bool:
    """Whether panels cross from one image to the next (P not a multiple of the width):
    then each panel's product is put in place from scratch."""
    return geo.p % panel_width(geo, isa) != 0
