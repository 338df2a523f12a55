"""The implicit conv's packers (implicit_conv.py): a slice of a panel's im2col columns,
buf[k][q], written straight from the image, one masked load per (channel, tap) and vector
of positions; a flat packer where a tap's inputs run on across output rows (stride 1,
output the input's size), a row packer for any other conv. `geo` is an
implicit_conv.Geometry (not imported: implicit_conv imports this module).
"""

from __future__ import annotations

from llvmlite import ir

from ..gemm.microkernel import I1, masked_rt, splat
from . import scalar as S
from .loops import for_range, loop
from .scalar import I32, I64, PTR, i64


def valid_outputs(n_out: int, size: int, stride: int, pad: int, tap: int, dil: int) -> range:
    """Output positions whose input coordinate o*stride - pad + tap*dil lies in [0, size)."""
    lo = max(0, -(-(pad - tap * dil) // stride))
    hi = min(n_out, (size - 1 + pad - tap * dil) // stride + 1)
    return range(lo, max(lo, hi))


def packer(mod: ir.Module, geo, channels: int, nr: int, lanes: int,
           name: str) -> ir.Function:
    """`pack(x, buf, pos0, npos)`: buf[k][q] = cols[k, pos0 + q] of the `channels`
    channels at x (of image 0: the positions run on across the images, P each), for
    q < npos (0 where a tap lands in the padding)."""
    if (geo.sh, geo.sw, geo.oh, geo.ow) == (1, 1, geo.h, geo.w):
        return _flat_packer(mod, geo, channels, nr, lanes, name)
    return _row_packer(mod, geo, channels, nr, lanes, name)


def _pack_function(mod: ir.Module, name: str, lanes: int) -> tuple:
    """A `packer`'s function, `pack(x, buf, pos0, npos)`, a builder at its entry and the
    lanes' indices (a vector of i64)."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]), name)
    fn.linkage = "internal"
    for a in fn.args[:2]:
        a.add_attribute("noalias")
    return (fn, ir.IRBuilder(fn.append_basic_block("entry")),
            ir.Constant(ir.VectorType(I64, lanes), list(range(lanes))))


def _flat_packer(mod: ir.Module, geo, channels: int, nr: int, lanes: int,
                 name: str) -> ir.Function:
    """`packer` of a stride-1 conv whose output is the input's size (3x3 with padding 1):
    a tap's inputs for consecutive positions of an image are consecutive elements, across
    its rows too (x[oh + i - ph, ow + j - pw] lies (i - ph) * W + j - pw past position
    (oh, ow)), so each vector of `lanes` positions is one masked load per (channel, tap),
    the masks (the taps' inputs inside the image, per lane) computed once per vector;
    a vector across two images loads from each (images of fewer positions than lanes
    gather). The row packer (`_row_packer`) splits vectors at every output row: 4x4
    images filled a quarter of each."""
    dt = geo.dtype
    el = S.REG[dt]
    fn, b, iota = _pack_function(mod, name, lanes)
    x, buf, pos0, npos = fn.args
    vi = iota.type
    hw, image_elems = geo.h * geo.w, geo.c * geo.h * geo.w

    def const(v: int):
        return ir.Constant(vi, [v] * lanes)

    def vec(v):
        first = b.add(pos0, b.mul(v, i64(lanes)))
        q = b.add(splat(b, first, lanes), iota)
        stored = b.icmp_signed("<", b.add(splat(b, b.mul(v, i64(lanes)), lanes), iota),
                               splat(b, npos, lanes))
        image, p = b.udiv(q, const(geo.p)), b.urem(q, const(geo.p))
        oh, ow = b.udiv(p, const(geo.w)), b.urem(p, const(geo.w))
        taps = []  # per tap: (its offset from the position's own input, its mask)
        for i in range(geo.kh):
            h = b.add(oh, const(i * geo.dh - geo.ph))
            h_in = b.and_(b.icmp_signed(">=", h, const(0)), b.icmp_signed("<", h, const(geo.h)))
            for j in range(geo.kw):
                w = b.add(ow, const(j * geo.dw - geo.pw))
                inside = b.and_(b.and_(stored, h_in), b.and_(
                    b.icmp_signed(">=", w, const(0)), b.icmp_signed("<", w, const(geo.w))))
                taps.append(((i * geo.dh - geo.ph) * geo.w + j * geo.dw - geo.pw, inside))
        own = b.add(b.mul(image, const(image_elems)), p)  # each lane's position's input
        first_image = b.udiv(first, i64(geo.p))
        last_image = b.udiv(b.add(first, i64(lanes - 1)), i64(geo.p))
        dst0 = b.mul(v, i64(lanes))

        # lanes in the next image: their inputs lie one image less its positions further
        later = b.icmp_unsigned("!=", image, splat(b, first_image, lanes))

        def channels_loop(across: bool):
            def load(start, mask):
                return masked_rt(b, "load", dt, lanes, mask, b.gep(x, [start], source_etype=el))

            def channel(c):
                for t, (offset, mask) in enumerate(taps):
                    at = b.add(b.mul(c, i64(hw)), i64(offset))
                    start = b.add(b.add(b.mul(first_image, i64(image_elems - geo.p)), first),
                                  at)
                    if not across:
                        value = load(start, mask)
                    elif geo.p >= lanes:  # two images: a load from each
                        value = b.select(later, load(b.add(start, i64(image_elems - geo.p)),
                                                     b.and_(mask, later)),
                                         load(start, b.and_(mask, b.not_(later))))
                    else:
                        value = masked_gather(b, x, b.add(own, splat(b, at, lanes)), mask, dt,
                                              lanes)
                    k = b.add(b.mul(c, i64(geo.taps)), i64(t))
                    dst = b.gep(buf, [b.add(b.mul(k, i64(nr)), dst0)], inbounds=True,
                                source_etype=el)
                    b.store(value, dst, align=S.size(dt))
            loop(b, channels, channel, "c")

        with b.if_else(b.icmp_signed("==", first_image, last_image)) as (within, across):
            with within:
                channels_loop(False)
            with across:
                channels_loop(True)

    count = b.udiv(b.add(npos, i64(lanes - 1)), i64(lanes))
    for_range(b, i64(0), count, vec, "v")
    b.ret_void()
    return fn


def masked_gather(b: ir.IRBuilder, x, index, mask, dt: str, lanes: int):
    """x[index[lane]] on the lanes of `mask`, 0 on the others (whose addresses are never
    read: no `inbounds`)."""
    el = S.REG[dt]
    vt, pv, vi = ir.VectorType(el, lanes), ir.VectorType(PTR, lanes), ir.VectorType(I64, lanes)
    base = splat(b, b.ptrtoint(x, I64), lanes)
    ptrs = b.inttoptr(b.add(base, b.mul(index, ir.Constant(vi, [S.size(dt)] * lanes))), pv)
    gather = S.declare(b.module, f"llvm.masked.gather.v{lanes}{dt}.v{lanes}p0", vt,
                       [pv, I32, ir.VectorType(I1, lanes), vt])
    return b.call(gather, [ptrs, ir.Constant(I32, S.size(dt)), mask, ir.Constant(vt, None)])


def _row_packer(mod: ir.Module, geo, channels: int, nr: int, lanes: int,
                name: str) -> ir.Function:
    """`packer` of any conv. Per output row the panel covers and vector of its columns,
    each (channel, tap) is one masked load (two and a shuffle, or a gather, for strided
    convs: `_load`) and one masked store: the taps are unrolled, so which columns each
    reaches is a constant mask, and whether its input row lies inside the image one test
    per row.
    Columns past npos are left as they are: the micro-kernel stores none of their sums."""
    dt = geo.dtype
    el = S.REG[dt]
    fn, b, iota = _pack_function(mod, name, lanes)
    x, buf, pos0, npos = fn.args
    vi = iota.type
    all_lanes, no_lanes = (ir.Constant(ir.VectorType(I1, lanes), [on] * lanes) for on in (1, 0))

    end = b.add(pos0, npos)

    def out_row(r):
        """The panel's part of output row r (of all the images' rows, one after another):
        its columns [s0, s1), at buf column d + s0."""
        image, r_in = b.udiv(r, i64(geo.oh)), b.urem(r, i64(geo.oh))
        x_image = b.mul(image, i64(geo.c * geo.h * geo.w))
        r0 = b.mul(r, i64(geo.ow))
        s0 = b.sub(b.select(b.icmp_signed(">", pos0, r0), pos0, r0), r0)
        r1 = b.add(r0, i64(geo.ow))
        s1 = b.sub(b.select(b.icmp_signed("<", end, r1), end, r1), r0)
        d = b.sub(r0, pos0)
        rows_inside = []
        for i in range(geo.kh):
            h = b.add(b.mul(r_in, i64(geo.sh)), i64(i * geo.dh - geo.ph))
            rows_inside.append((h, b.and_(b.icmp_signed(">=", h, i64(0)),
                                          b.icmp_signed("<", h, i64(geo.h)))))
        s1_v = splat(b, s1, lanes)

        def vec(v):
            q = b.add(s0, b.mul(v, i64(lanes)))
            qv = b.add(splat(b, q, lanes), iota)
            stored = b.icmp_signed("<", qv, s1_v)
            reach = []  # per tap column j: the columns whose input column lies inside
            for j in range(geo.kw):
                inside = valid_outputs(geo.ow, geo.w, geo.sw, geo.pw, j, geo.dw)
                reach.append(b.and_(stored, b.and_(
                    b.icmp_signed(">=", qv, ir.Constant(vi, [inside.start] * lanes)),
                    b.icmp_signed("<", qv, ir.Constant(vi, [inside.stop] * lanes)))))
            dst0 = b.add(d, q)

            def channel(c):
                for i, (h, h_inside) in enumerate(rows_inside):
                    xrow = b.add(b.add(x_image, b.mul(c, i64(geo.h * geo.w))),
                                 b.mul(h, i64(geo.w)))
                    row_mask = b.select(h_inside, all_lanes, no_lanes)
                    for j in range(geo.kw):
                        mask = b.and_(reach[j], row_mask)
                        col = b.add(xrow, i64(j * geo.dw - geo.pw))
                        value = _load(b, x, col, q, geo.sw, mask, dt, lanes)
                        k = b.add(b.mul(c, i64(geo.taps)), i64(i * geo.kw + j))
                        dst = b.gep(buf, [b.add(b.mul(k, i64(nr)), dst0)], inbounds=True,
                                    source_etype=el)
                        masked_rt(b, "store", dt, lanes, stored, dst, value)

            loop(b, channels, channel, "c")

        count = b.udiv(b.add(b.sub(s1, s0), i64(lanes - 1)), i64(lanes))
        for_range(b, i64(0), count, vec, "v")

    first_row = b.udiv(pos0, i64(geo.ow))
    rows_end = b.udiv(b.add(end, i64(geo.ow - 1)), i64(geo.ow))
    for_range(b, first_row, rows_end, out_row, "orow")
    b.ret_void()
    return fn


def _load(b: ir.IRBuilder, x, col, q, stride: int, mask, dt: str, lanes: int):
    """x[col + (q + lane) * stride] on the lanes of `mask`, 0 on the others: a masked load;
    for stride 2, two masked loads of the lanes' span (odd elements masked off) and a
    shuffle of the even ones (a gather of 16 lanes cost about twice as much); a masked
    gather for other strides. Masked-off lanes may lie outside x (their addresses are
    never read): no `inbounds`."""
    el = S.REG[dt]
    start = b.add(col, b.mul(q, i64(stride)))
    if stride == 1:
        return masked_rt(b, "load", dt, lanes, mask, b.gep(x, [start], source_etype=el))
    if stride == 2:
        off = ir.Constant(ir.VectorType(I1, lanes), [0] * lanes)
        halves = [b.shuffle_vector(mask, off, ir.Constant(
            ir.VectorType(I32, lanes), [h * lanes // 2 + e // 2 + (lanes if e % 2 else 0)
                                        for e in range(lanes)])) for h in (0, 1)]
        lo, hi = (masked_rt(b, "load", dt, lanes, m,
                            b.gep(x, [b.add(start, i64(h * lanes))], source_etype=el))
                  for h, m in enumerate(halves))
        return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, lanes),
                                                    list(range(0, 2 * lanes, 2))))
    step = ir.Constant(ir.VectorType(I64, lanes), [lane * stride for lane in range(lanes)])
    return masked_gather(b, x, b.add(splat(b, start, lanes), step), mask, dt, lanes)
