"""The weight gradient of a Winograd-shaped conv (winograd.py) as F(3x3, 2x2): the forward
is y = A^T [(G g G^T) * V] A per tile, so dW[o, c] = G^T [sum over tiles of
(A dy A^T)[o] * V[c]] G: 16 GEMMs over the tiles, dW^T[e] (C x O) += V[e] (C x T) @
D[e]^T (T x O), with 2.25x fewer multiplies than the implicit GEMM's.

Bands of tile rows (winograd.Bands) go to threads; per band, the input's transform V (as
the forward's) and the output gradient's D = A dy A^T, then per transformed element D[e]
is transposed (16 x 16 blocks through registers) into the micro-kernel's B layout and
multiplied into the thread's own dW^T[e]. After the bands, the threads' sums are added
and transformed back into dW (G^T . G, 4x4 -> 3x3).
"""

from __future__ import annotations

from llvmlite import ir

from ...strides import cdiv
from ..gemm.emit import blocking
from ..gemm.microkernel import I1, masked_rt, microkernel, splat, transpose_lanes
from ..machine.host import Isa, host_caches
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from . import scalar as S
from .implicit_conv import panel_width
from .loops import fill_zero, for_range, loop
from .scalar import I64, i64
from .winograd import (
    Bands,
    E,
    Place,
    bands,
    each_tile_vector,
    even_odd,
    runs_winograd,
    store_transformed,
    transform_input,
)


def runs_weight_grad(geo, isa: Isa) -> bool:
    """Whether the weight gradient of the forward conv `geo` runs here: a Winograd-shaped
    conv whose 16 x C x O sums, one copy a thread, fit half of L2."""
    return (runs_winograd(geo, isa)
            and _sums_elems(geo, isa) * S.size(geo.dtype) <= host_caches().l2 // 2)


def _o_width(geo, isa: Isa) -> int:
    """dW^T's rows: O rounded up to whole micro-kernel panels."""
    nr = panel_width(geo, isa)
    return cdiv(geo.o, nr) * nr


def _sums_elems(geo, isa: Isa) -> int:
    return E * geo.c * _o_width(geo, isa)


def _regions(geo, isa: Isa) -> tuple[int, list[int]]:
    """(elements of a thread's scratch, offsets of: V, D, D[e]^T, dW^T)."""
    bd = bands(geo, isa)
    sizes = [E * bd.plane(geo.c), E * bd.plane(geo.o), bd.width * _o_width(geo, isa),
             _sums_elems(geo, isa)]
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    return sum(sizes), offsets


def threads_for(geo, isa: Isa, threads: int) -> int:
    return parallel_chunks(geo.flops / 8, bands(geo, isa).units, threads)


def scratch_bytes(geo, isa: Isa, threads: int) -> int:
    return threads_for(geo, isa, threads) * _regions(geo, isa)[0] * S.size(geo.dtype)


def emit_weight_grad(b: ir.IRBuilder, geo, x, dy, dw, scratch, isa: Isa, threads: int,
                     name: str) -> None:
    """dw = conv2d_grad_weight(x, dy) of the forward conv `geo` (`runs_weight_grad`)."""
    dt, el = geo.dtype, S.REG[geo.dtype]
    lanes = isa.lanes(dt)
    bd = bands(geo, isa)
    blk = blocking(isa, dt, 1 << 20)
    nr = panel_width(geo, isa)
    ow = _o_width(geo, isa)
    panels = [min(nr, geo.o - j * nr) for j in range(cdiv(geo.o, nr))]  # their columns
    kernels = {cdiv(cols, lanes): microkernel(b.module, dt, lanes, blk.mr, cdiv(cols, lanes),
                                              False) for cols in panels}
    units = bd.units
    t = threads_for(geo, isa, threads)
    per, (v_at, d_at, dt_at, sums_at) = _regions(geo, isa)

    def at(bb, ptr, offset):
        return bb.gep(ptr, [offset], inbounds=True, source_etype=el)

    def unit(bb, xp, dyp, own, un):
        place = bd.locate(bb, un)
        tiles = place.tiles
        v, d, d_t, sums = (at(bb, own, i64(k)) for k in (v_at, d_at, dt_at, sums_at))
        transform_input(bb, geo, bd, xp, v, place, lanes)
        _transform_gradient(bb, geo, bd, dyp, d, place, lanes)

        def gemm(e):
            _transpose(bb, geo, bd, at(bb, d, bb.mul(e, i64(bd.plane(geo.o)))), d_t, ow, lanes)
            ve = at(bb, v, bb.mul(e, i64(bd.plane(geo.c))))
            se = at(bb, sums, bb.mul(e, i64(geo.c * ow)))

            def panel(j, cols):
                def tile(r):
                    rows_r = S.at_most(bb, bb.sub(i64(geo.c), bb.mul(r, i64(blk.mr))), blk.mr)
                    bb.call(kernels[cdiv(cols, lanes)], [
                        at(bb, ve, bb.mul(r, i64(blk.mr * bd.width))), i64(bd.width), i64(1),
                        at(bb, d_t, i64(j * nr)), i64(ow),
                        at(bb, se, bb.add(bb.mul(r, i64(blk.mr * ow)), i64(j * nr))), i64(ow),
                        tiles, ir.Constant(I1, 1), rows_r, i64(cols)])

                loop(bb, cdiv(geo.c, blk.mr), tile, "tile")

            for j, cols in enumerate(panels):
                panel(j, cols)

        loop(bb, E, gemm, "e")

    def run(bb, xp, dyp, own, lo, hi):
        # the sums start at zero, and so do D^T's columns past O, which the micro-kernel
        # reads (V and D are read only up to the unit's tiles, written before)
        fill_zero(bb, at(bb, own, i64(dt_at)), dt, per - dt_at)
        for_range(bb, lo, hi, lambda un: unit(bb, xp, dyp, own, un), "unit")

    if t == 1:
        run(b, x, dy, scratch, i64(0), i64(units))
    else:
        def share(bb, ptrs, lo, hi):
            own = at(bb, ptrs[2], bb.mul(chunk_index(bb, lo, units, t), i64(per)))
            run(bb, ptrs[0], ptrs[1], own, lo, hi)

        parallel_region(b, f"{name}.winograd", [x, dy, scratch], [False, False, True],
                        units, t, share)
    _transform_sums(b, geo, scratch, dw, [k * per + sums_at for k in range(t)], ow)


def _transform_gradient(b: ir.IRBuilder, geo, bd: Bands, dy, d, place: Place,
                        lanes: int) -> None:
    """d[e][o][r * tw + tx] = (A dy A^T)[e] for the unit's tiles, dy's 2x2 block at rows
    2ty.., columns 2tx.. (two loads of a row's 2 x lanes columns, split into its even and
    odd ones)."""
    dt = geo.dtype
    el = S.REG[dt]
    iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))

    def a(v0, v1):  # A (v0, v1)
        return [v0, b.fadd(v0, v1), b.fsub(v0, v1), b.fneg(v1)]

    def vector(o, r, tx0):
        cols = [b.add(splat(b, b.add(b.mul(tx0, i64(2)), i64(h * lanes)), lanes), iota)
                for h in (0, 1)]
        masks = [b.icmp_signed("<", c, splat(b, i64(geo.w), lanes)) for c in cols]
        image, ty = place.tile_row(b, r)
        plane = b.mul(b.add(b.mul(image, i64(geo.o)), o), i64(geo.p))
        g = []  # g[i] = (dy[2ty + i, 2tx], dy[2ty + i, 2tx + 1])
        for i in range(2):
            oh = b.add(b.mul(ty, i64(2)), i64(i))
            start = b.add(b.add(plane, b.mul(oh, i64(geo.w))), b.mul(tx0, i64(2)))
            halves = [masked_rt(b, "load", dt, lanes, masks[h], b.gep(
                dy, [b.add(start, i64(h * lanes))], inbounds=True, source_etype=el))
                for h in (0, 1)]
            g.append(list(even_odd(b, *halves, lanes)))
        col = [a(g[0][j], g[1][j]) for j in range(2)]  # col[j][i] = (A dy)[i][j]
        store_transformed(b, bd, d, geo.o, dt, lanes, o, r, tx0,
                          [a(col[0][i], col[1][i]) for i in range(4)])

    each_tile_vector(b, bd, geo.o, place, lanes, vector)


def _transpose(b: ir.IRBuilder, geo, bd: Bands, de, d_t, ow: int, lanes: int) -> None:
    """d_t[q][o] = de[o][q] for the band's `width` columns, lanes x lanes blocks through
    registers; rows of `de` past O repeat its last (their columns' sums are not stored)."""
    dt = geo.dtype
    el = S.REG[dt]
    vt = ir.VectorType(el, lanes)

    def block(ob, qb):
        o0, q0 = b.mul(ob, i64(lanes)), b.mul(qb, i64(lanes))
        rows = []
        for k in range(lanes):
            o = b.add(o0, i64(k))
            o = b.select(b.icmp_signed("<", o, i64(geo.o)), o, i64(geo.o - 1))
            rows.append(b.load(b.gep(de, [b.add(b.mul(o, i64(bd.width)), q0)], inbounds=True,
                                     source_etype=el), typ=vt, align=S.size(dt)))
        for k, value in enumerate(transpose_lanes(b, rows)):
            b.store(value, b.gep(d_t, [b.add(b.mul(b.add(q0, i64(k)), i64(ow)), o0)],
                                 inbounds=True, source_etype=el), align=S.size(dt))

    loop(b, cdiv(geo.o, lanes), lambda ob: loop(
        b, bd.width // lanes, lambda qb: block(ob, qb), "qb"), "ob")


def _transform_sums(b: ir.IRBuilder, geo, scratch, dw, copies: list[int], ow: int) -> None:
    """dw[o, c] = G^T M G with M[e] the threads' dW^T[e][c][o] added up."""
    dt = geo.dtype
    half = S.const(dt, 0.5)

    def pair(o, c):
        m = []
        for e in range(E):
            at = b.add(i64(e * geo.c * ow), b.add(b.mul(c, i64(ow)), o))
            total = S.load(b, scratch, dt, b.add(at, i64(copies[0])))
            for off in copies[1:]:
                total = b.fadd(total, S.load(b, scratch, dt, b.add(at, i64(off))))
            m.append(total)

        def g_t(v0, v1, v2, v3):  # G^T (v0 .. v3): 3 values
            mid = b.fmul(half, b.fadd(v1, v2))
            return [b.fadd(v0, mid), b.fmul(half, b.fsub(v1, v2)), b.fadd(mid, v3)]

        cols = [g_t(*(m[4 * i + j] for i in range(4))) for j in range(4)]  # cols[j][i]
        for i in range(3):
            for j, value in enumerate(g_t(*(cols[jj][i] for jj in range(4)))):
                S.store(b, dw, dt, b.add(b.mul(b.add(b.mul(o, i64(geo.c)), c), i64(9)),
                                         i64(3 * i + j)), value)

    loop(b, geo.o, lambda o: loop(b, geo.c, lambda c: pair(o, c), "c"), "o")
