"""3x3 stride-1 convs as Winograd F(2x2, 3x3) (Lavin and Gray, 2015): each 2x2 block of
outputs of a channel pair is A^T [(G g G^T) * (B^T d B)] A, d the 4x4 input patch under it,
so a conv is 16 GEMMs of its channels, M[e] = U[e] (O x C) @ V[e] (C x tiles), with 16
multiplies per block where the implicit GEMM has 36: 2.25x fewer.

The weight's transform U (16 x O x C, 16/9 of the weight) is computed first on every
call. Then units go to threads (`Bands`: whole tile rows of one image, or several whole
images, as many tiles as keep V and M in L2): the unit's input is transformed into V
(vectors of `lanes` tiles along a row: three loads and four shuffles give the four
columns a tile reads), the 16 GEMMs run on the own GEMM's micro-kernel, and M is
transformed back into the unit's output rows (two tiles' columns interleaved by a
shuffle), where the conv's epilogue (`Finish`) then runs on them.

Measured on this Xeon (f32, 2 threads, one process), implicit GEMM -> Winograd:
ResNet-18's 64-channel convs at 56x56, batch 8, 5.86 -> 3.23 ms; at 32x32, batch 32,
7.58 -> 3.87; 128 channels at 16x16, batch 32, 7.48 -> 4.59 (with the V and M planes
skewed by a cache line: 16 planes 32 KiB apart fell in one L1 set, 3.87 -> 3.12 at
56x56); in units of whole images, 256 channels at 8x8 7.44 -> 4.32, 512 at 4x4 7.98 ->
5.99. The largest error against float64 is 1.2-1.7x PyTorch's float32 conv's (3-5e-7 of
the largest output).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ...strides import cdiv
from ..gemm.emit import blocking
from ..gemm.matmul import byte_offset
from ..gemm.microkernel import I1, masked_rt, microkernel, splat
from ..machine.host import Isa, host_caches
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from . import scalar as S
from .conv_epilogue import Finish
from .implicit_conv import panel_width
from .implicit_pack import masked_gather
from .loops import fill_zero, for_range, loop
from .scalar import I32, I64, i64

E = 16  # elements of a transformed 4x4 tile
# a unit's tiles fill at least this many vectors: with one, the micro-kernel loads as many
# elements as it multiplies; 1.75 still won (ResNet-18's 256-channel convs at 14x14,
# batch 8, in bands of 28 tiles: 6.45 -> 5.08 ms)
MIN_VECTORS = 1.5
# input and output channels a conv has at least: the transforms cost per channel what the
# GEMMs save per pair of channels (measured at 32x32, batch 32: 3 -> 64 channels 0.49 ms
# against 0.74 through Winograd, 8 -> 8 even, 16 -> 16 0.64 against 0.44)
MIN_CHANNELS = 16
SKEW = 16  # elements


@dataclass(frozen=True)
class Place:
    """A unit's images [image0, image0 + images), tile rows [ty0, ty0 + rows) of each, and
    its tiles; its tile row r is row ty0 + r % rows of image image0 + r // rows."""

    image0: ir.Value
    images: ir.Value
    ty0: ir.Value
    rows: ir.Value
    tiles: ir.Value

    def tile_row(self, b: ir.IRBuilder, r) -> tuple:
        """(image, tile row in it) of the unit's tile row r."""
        return b.add(self.image0, b.udiv(r, self.rows)), b.add(self.ty0, b.urem(r, self.rows))

    def all_rows(self, b: ir.IRBuilder):
        """The unit's tile rows, over all its images."""
        return b.mul(self.images, self.rows)


@dataclass(frozen=True)
class Bands:
    """A conv's units: bands of `rows` tile rows of an image (the last one may be short),
    or, where a band is a whole image, `images` whole images (the last unit may have
    fewer); `tw` tiles a row. A unit's tile rows run on from image to image, so its tiles
    are one sequence; `width` columns of V and M per transformed element (a unit's tiles,
    rounded up to whole micro-kernel panels)."""

    n: int
    th: int
    tw: int
    rows: int
    per_image: int
    images: int
    width: int

    @property
    def units(self) -> int:
        return cdiv(self.n, self.images) * self.per_image

    def locate(self, b: ir.IRBuilder, unit) -> Place:
        """Where a unit lies."""
        group, band = b.udiv(unit, i64(self.per_image)), b.urem(unit, i64(self.per_image))
        image0 = b.mul(group, i64(self.images))
        ty0 = b.mul(band, i64(self.rows))
        rows = S.at_most(b, b.sub(i64(self.th), ty0), self.rows)
        images = S.at_most(b, b.sub(i64(self.n), image0), self.images)
        return Place(image0, images, ty0, rows, b.mul(b.mul(images, rows), i64(self.tw)))

    def plane(self, channels: int) -> int:
        """Elements from one transformed element's matrix of V or M to the next: its
        channels' rows and a skew of a cache line, so that the 16 a tile's transform
        writes or reads do not all fall in one L1 set (a plane of 64 channels x 128 tiles
        is 32 KiB)."""
        return channels * self.width + SKEW


def bands(geo, isa: Isa) -> Bands | None:
    """The units of `geo`, or None where a band would fill under MIN_VECTORS vectors. A
    band's V and M take half of L2; all of it where U, which every band reads, is larger
    than that and comes from L3 anyway: then twice the tiles read it half as often
    (ResNet-18's 256-channel convs at 14x14, batch 8: whole images, 4.92 -> 3.98 ms)."""
    th, tw = geo.h // 2, geo.w // 2
    column = E * (geo.c + geo.o) * S.size(geo.dtype)  # V's and M's bytes per tile
    l2 = host_caches().l2
    budget = l2 if _transformed_weight_bytes(geo) > l2 // 2 else l2 // 2
    most = budget // column
    rows = min(th, most // tw)
    images = max(1, min(geo.n, most // (th * tw))) if rows == th else 1
    if rows == 0 or images * rows * tw < MIN_VECTORS * isa.lanes(geo.dtype):
        return None
    nr = panel_width(geo, isa)
    return Bands(geo.n, th, tw, rows, cdiv(th, rows), images,
                 cdiv(images * rows * tw, nr) * nr)


def runs_winograd(geo, isa: Isa) -> bool:
    """Whether `geo` (an implicit_conv.Geometry) runs as Winograd F(2x2, 3x3): a 3x3 conv
    of stride 1, padding 1 and dilation 1 of one group, even height and width, f32 or f64,
    at least MIN_CHANNELS input and output channels, whose bands fit L2 (`bands`)."""
    return (geo.kh == geo.kw == 3 and (geo.sh, geo.sw, geo.dh, geo.dw) == (1, 1, 1, 1)
            and (geo.ph, geo.pw) == (1, 1) and geo.g == 1 and geo.h % 2 == 0
            and geo.w % 2 == 0 and min(geo.c, geo.o) >= MIN_CHANNELS
            and geo.dtype in S.FLOATS and bands(geo, isa) is not None)


def _transformed_weight_bytes(geo) -> int:
    return E * geo.o * geo.c * S.size(geo.dtype)


def _thread_bytes(geo, isa: Isa) -> int:
    bd = bands(geo, isa)
    return E * (bd.plane(geo.c) + bd.plane(geo.o)) * S.size(geo.dtype)


def threads_for(geo, isa: Isa, threads: int) -> int:
    bd = bands(geo, isa)
    return parallel_chunks(geo.flops / 8, bd.units, threads)


def scratch_bytes(geo, isa: Isa, threads: int) -> int:
    """U, then each thread's V and M."""
    return (_transformed_weight_bytes(geo)
            + threads_for(geo, isa, threads) * _thread_bytes(geo, isa))


def emit_winograd(b: ir.IRBuilder, geo, x, w, y, scratch, isa: Isa, threads: int, name: str,
                  finish: Finish | None = None, flipped: bool = False) -> None:
    """y = conv(x, w) of `geo` (`runs_winograd`), then `finish` on each unit's output;
    `flipped`: `geo` is an input gradient's and w the forward's weight."""
    dt, el = geo.dtype, S.REG[geo.dtype]
    lanes = isa.lanes(dt)
    bd = bands(geo, isa)
    u = scratch
    _transform_weight(b, geo, w, u, lanes, threads, name, flipped)
    local = byte_offset(b, scratch, i64(_transformed_weight_bytes(geo)))
    blk = blocking(isa, dt, 1 << 20)
    nr = panel_width(geo, isa)  # bd.width is a multiple
    kernels = {nv: microkernel(b.module, dt, lanes, blk.mr, nv, False)
               for nv in range(1, cdiv(nr, lanes) + 1)}
    units = bd.units
    t = threads_for(geo, isa, threads)
    per = _thread_bytes(geo, isa)
    vp, mp = bd.plane(geo.c), bd.plane(geo.o)
    extra = finish.ptrs if finish is not None else []

    def at(bb, ptr, offset):
        return bb.gep(ptr, [offset], inbounds=True, source_etype=el)

    def unit(bb, xp, up, yp, own, eptrs, un):
        place = bd.locate(bb, un)
        tiles = place.tiles
        v, m = own, at(bb, own, i64(E * vp))
        transform_input(bb, geo, bd, xp, v, place, lanes)

        def gemm(e):
            ue = at(bb, up, bb.mul(e, i64(geo.o * geo.c)))
            ve = at(bb, v, bb.mul(e, i64(vp)))
            me = at(bb, m, bb.mul(e, i64(mp)))

            def panel(j):
                cols = S.at_most(bb, bb.sub(tiles, bb.mul(j, i64(nr))), nr)

                def tile(r):
                    rows_r = S.at_most(bb, bb.sub(i64(geo.o), bb.mul(r, i64(blk.mr))), blk.mr)
                    args = [at(bb, ue, bb.mul(r, i64(blk.mr * geo.c))), i64(geo.c), i64(1),
                            at(bb, ve, bb.mul(j, i64(nr))), i64(bd.width),
                            at(bb, me, bb.add(bb.mul(r, i64(blk.mr * bd.width)),
                                              bb.mul(j, i64(nr)))),
                            i64(bd.width), i64(geo.c), ir.Constant(I1, 0), rows_r, cols]
                    call_by_vectors(bb, kernels, cols, lanes, args)

                loop(bb, cdiv(geo.o, blk.mr), tile, "tile")

            panels = bb.udiv(bb.add(tiles, i64(nr - 1)), i64(nr))
            for_range(bb, i64(0), panels, panel, "panel")

        loop(bb, E, gemm, "e")
        _transform_output(bb, geo, bd, m, yp, place, lanes)
        if finish is not None:
            first = bb.mul(place.ty0, i64(2 * geo.w))
            end = bb.add(first, bb.mul(place.rows, i64(2 * geo.w)))
            for_range(bb, i64(0), place.images, lambda i: finish.span(
                bb, yp, eptrs, bb.add(place.image0, i), i64(0), i64(geo.o), first, end),
                "image")

    def run(bb, xp, up, yp, own, eptrs, lo, hi):
        # V's columns past a unit's tiles are read by the micro-kernel (their sums are not
        # stored): zeros, not whatever subnormals other kernels left (M is written before
        # it is read)
        fill_zero(bb, own, dt, E * vp)
        for_range(bb, lo, hi, lambda un: unit(bb, xp, up, yp, own, eptrs, un), "unit")

    if t == 1:
        run(b, x, u, y, local, extra, i64(0), i64(units))
        return

    def share(bb, ptrs, lo, hi):
        own = byte_offset(bb, ptrs[3], bb.mul(chunk_index(bb, lo, units, t), i64(per)))
        run(bb, *ptrs[:3], own, ptrs[4:], lo, hi)

    parallel_region(b, f"{name}.winograd", [x, u, y, local, *extra],
                    [False, False, True, True] + [False] * len(extra), units, t, share)


def call_by_vectors(b: ir.IRBuilder, kernels: dict, cols, lanes: int, args: list) -> None:
    """The micro-kernel of as many vectors as `cols` columns fill."""
    most = max(kernels)
    if most == 1:
        b.call(kernels[1], args)
        return
    with b.if_else(b.icmp_signed(">", cols, i64((most - 1) * lanes))) as (full, fewer):
        with full:
            b.call(kernels[most], args)
        with fewer:
            call_by_vectors(b, {nv: k for nv, k in kernels.items() if nv < most}, cols,
                             lanes, args)


def _vec_type(dt: str, lanes: int) -> ir.VectorType:
    return ir.VectorType(S.REG[dt], lanes)


def _transform_weight(b: ir.IRBuilder, geo, w, u, lanes: int, threads: int, name: str,
                      flipped: bool) -> None:
    """u[e][o][c] = (G g G^T)[e] of each (o, c) pair's 3x3 taps g, `lanes` pairs at a time
    (a gather of each tap), split across threads. g is w[o, c]; `flipped`: the conv is an
    input gradient and w the forward's weight, so g is w[c, o] turned by 180 degrees (the
    flip that implicit_conv.flip_weight writes out, read in place)."""
    dt = geo.dtype
    vi = ir.VectorType(I64, lanes)
    vt = _vec_type(dt, lanes)
    pairs = geo.o * geo.c
    half = ir.Constant(vt, [0.5] * lanes)
    iota = ir.Constant(vi, list(range(lanes)))

    def const(v: int):
        return ir.Constant(vi, [v] * lanes)

    def vector(bb, wp, up, k):
        p0 = bb.mul(k, i64(lanes))
        p = bb.add(splat(bb, p0, lanes), iota)
        mask = bb.icmp_signed("<", p, const(pairs))
        if flipped:  # pair (o, c) = w[c, o], its taps last to first
            o, c = bb.udiv(p, const(geo.c)), bb.urem(p, const(geo.c))
            base = bb.add(bb.mul(bb.add(bb.mul(c, const(geo.o)), o), const(9)), const(8))
        else:
            base = bb.mul(p, const(9))
        tap = (lambda i, j: bb.sub(base, const(3 * i + j))) if flipped else (
            lambda i, j: bb.add(base, const(3 * i + j)))
        g = [[masked_gather(bb, wp, tap(i, j), mask, dt, lanes) for j in range(3)]
             for i in range(3)]

        def g_(v0, v1, v2):  # G (v0, v1, v2)
            return [v0, bb.fmul(half, bb.fadd(bb.fadd(v0, v1), v2)),
                    bb.fmul(half, bb.fadd(bb.fsub(v0, v1), v2)), v2]

        gg = [g_(*(g[i][j] for i in range(3))) for j in range(3)]  # gg[j][r] = (G g)[r][j]
        for r in range(4):
            for c, value in enumerate(g_(*(gg[j][r] for j in range(3)))):
                at = bb.gep(up, [bb.add(i64((4 * r + c) * pairs), p0)], inbounds=True,
                            source_etype=S.REG[dt])
                masked_rt(bb, "store", dt, lanes, mask, at, value)

    vectors = cdiv(pairs, lanes)
    t = parallel_chunks(E * pairs, vectors, threads)

    def chunk(bb, ptrs, lo, hi):
        for_range(bb, lo, hi, lambda k: vector(bb, *ptrs, k), "wt")

    if t == 1:
        chunk(b, [w, u], i64(0), i64(vectors))
    else:
        parallel_region(b, f"{name}.weight", [w, u], [False, True], vectors, t, chunk)


def each_tile_vector(b: ir.IRBuilder, bd: Bands, channels: int, place: Place, lanes: int,
                     body) -> None:
    """body(c, r, tx0) for each channel, tile row r of the unit (`Place.tile_row`) and
    vector of `lanes` tiles along it from tx0 (lanes past the row's `tw` tiles are not
    stored)."""
    loop(b, channels, lambda c: for_range(b, i64(0), place.all_rows(b), lambda r: loop(
        b, cdiv(bd.tw, lanes), lambda k: body(c, r, b.mul(k, i64(lanes))), "tx"), "ty"), "c")


def store_transformed(b: ir.IRBuilder, bd: Bands, dst, channels: int, dt: str, lanes: int,
                      c, r, tx0, values: list) -> None:
    """dst[e][c][r * tw + tx0 + lane] = values[e // 4][e % 4] on the lanes that are tiles
    (e's matrices `bd.plane(channels)` apart)."""
    iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    tiles = b.icmp_signed("<", b.add(splat(b, tx0, lanes), iota), splat(b, i64(bd.tw), lanes))
    at = b.add(b.add(b.mul(c, i64(bd.width)), b.mul(r, i64(bd.tw))), tx0)
    for e in range(E):
        ptr = b.gep(dst, [b.add(at, i64(e * bd.plane(channels)))], inbounds=True,
                    source_etype=S.REG[dt])
        masked_rt(b, "store", dt, lanes, tiles, ptr, values[e // 4][e % 4])


def even_odd(b: ir.IRBuilder, lo, hi, lanes: int) -> tuple:
    """The even and the odd elements of the 2 x lanes run lo, hi: two shuffles."""
    pick = [ir.Constant(ir.VectorType(I32, lanes), list(range(k, 2 * lanes, 2))) for k in (0, 1)]
    return b.shuffle_vector(lo, hi, pick[0]), b.shuffle_vector(lo, hi, pick[1])


def transform_input(b: ir.IRBuilder, geo, bd: Bands, x, v, place: Place, lanes: int) -> None:
    """v[e][c][r * tw + tx] = (B^T d B)[e] for the unit's tiles, d the 4x4 patch of x's
    image at rows 2ty - 1 .., columns 2tx - 1 .. (zeros outside)."""
    dt = geo.dtype
    el = S.REG[dt]
    vi = ir.VectorType(I64, lanes)
    iota = ir.Constant(vi, list(range(lanes)))
    shift = [ir.Constant(ir.VectorType(I32, lanes), list(range(1, lanes)) + [lanes + k])
             for k in (0, 1)]
    no = ir.Constant(ir.VectorType(I1, lanes), [0] * lanes)

    def b_t(v0, v1, v2, v3):  # B^T (v0 .. v3)
        return [b.fsub(v0, v2), b.fadd(v1, v2), b.fsub(v2, v1), b.fsub(v1, v3)]

    def vector(c, r, tx0):
        col0 = b.sub(b.mul(tx0, i64(2)), i64(1))
        col_masks = []
        for part in range(3):
            col = b.add(splat(b, b.add(col0, i64(part * lanes)), lanes), iota)
            col_masks.append(b.and_(b.icmp_signed(">=", col, splat(b, i64(0), lanes)),
                                    b.icmp_signed("<", col, splat(b, i64(geo.w), lanes))))
        image, ty = place.tile_row(b, r)
        plane = b.mul(b.add(b.mul(image, i64(geo.c)), c), i64(geo.h * geo.w))
        d = []  # d[i][j]: the patch's row i, column j, for each lane's tile
        for i in range(4):
            h = b.add(b.sub(b.mul(ty, i64(2)), i64(1)), i64(i))
            inside = b.and_(b.icmp_signed(">=", h, i64(0)), b.icmp_signed("<", h, i64(geo.h)))
            start = b.add(b.add(plane, b.mul(h, i64(geo.w))), col0)
            parts = [masked_rt(b, "load", dt, lanes, b.select(inside, col_masks[p], no),
                               b.gep(x, [b.add(start, i64(p * lanes))], source_etype=el))
                     for p in range(3)]
            even, odd = even_odd(b, parts[0], parts[1], lanes)
            d.append([even, odd, b.shuffle_vector(even, parts[2], shift[0]),
                      b.shuffle_vector(odd, parts[2], shift[1])])
        t = [b_t(*(d[i][j] for i in range(4))) for j in range(4)]  # t[j][i] = (B^T d)[i][j]
        store_transformed(b, bd, v, geo.c, dt, lanes, c, r, tx0,
                          [b_t(*(t[j][i] for j in range(4))) for i in range(4)])

    each_tile_vector(b, bd, geo.c, place, lanes, vector)


def _transform_output(b: ir.IRBuilder, geo, bd: Bands, m, y, place: Place, lanes: int) -> None:
    """The unit's output rows from m[e][o][r * tw + tx]: A^T m A, a 2x2 block per tile,
    each output row's two columns of `lanes` tiles interleaved into two vectors."""
    dt = geo.dtype
    el = S.REG[dt]
    vi = ir.VectorType(I64, lanes)
    iota = ir.Constant(vi, list(range(lanes)))
    low = ir.Constant(ir.VectorType(I32, lanes), [k // 2 + (lanes if k % 2 else 0)
                                                  for k in range(lanes)])
    high = ir.Constant(ir.VectorType(I32, lanes), [lanes // 2 + k // 2 + (lanes if k % 2 else 0)
                                                   for k in range(lanes)])

    def a_t(v0, v1, v2, v3):  # A^T (v0 .. v3)
        return [b.fadd(b.fadd(v0, v1), v2), b.fsub(b.fsub(v1, v2), v3)]

    def vector(o, r, tx0):
        tile = b.add(b.mul(r, i64(bd.tw)), tx0)
        valid = b.icmp_signed("<", b.add(splat(b, tx0, lanes), iota), splat(b, i64(bd.tw), lanes))
        mm = [[masked_rt(b, "load", dt, lanes, valid, b.gep(m, [b.add(b.add(
            i64((4 * i + j) * bd.plane(geo.o)), b.mul(o, i64(bd.width))), tile)],
            inbounds=True, source_etype=el)) for j in range(4)] for i in range(4)]
        s = [a_t(*(mm[i][j] for i in range(4))) for j in range(4)]  # s[j][i] = (A^T m)[i][j]
        image, ty = place.tile_row(b, r)
        plane = b.mul(b.add(b.mul(image, i64(geo.o)), o), i64(geo.h * geo.w))
        for i in range(2):
            y0, y1 = a_t(*(s[j][i] for j in range(4)))
            oh = b.add(b.mul(ty, i64(2)), i64(i))
            start = b.add(b.add(plane, b.mul(oh, i64(geo.w))), b.mul(tx0, i64(2)))
            col = b.add(splat(b, b.mul(tx0, i64(2)), lanes), iota)
            for half, order in enumerate((low, high)):
                cols = b.add(col, splat(b, i64(half * lanes), lanes))
                inside = b.icmp_signed("<", cols, splat(b, i64(geo.w), lanes))
                masked_rt(b, "store", dt, lanes, inside, b.gep(
                    y, [b.add(start, i64(half * lanes))], inbounds=True, source_etype=el),
                    b.shuffle_vector(y0, y1, order))

    each_tile_vector(b, bd, geo.o, place, lanes, vector)
