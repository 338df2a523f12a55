"""A depthwise `ember.conv2d_nhwc` (one input channel per output channel, the channels
last): each output position sums its taps a vector of channels at a time, in registers,
and is stored once. In NCHW the same conv walks each plane's rows of 7 to 112 columns;
here every load is a run of channels (passes/layout.py picks this form).

Positions whose taps all land inside the input (the interior rows and columns) load with
no test; the border positions load each tap from a clamped address and multiply it by a
input of zero where it lands in the padding (a select, no branch per tap), as the
padding's zeros would be.
"""

from __future__ import annotations

from llvmlite import ir

from ....ir.dialects.ember_windows import sides
from ...errors import UnsupportedOpError
from ..machine.host import Isa
from ..parallel.outline import parallel_chunks, parallel_region
from . import scalar as S
from .implicit_pack import valid_outputs
from .loops import for_range, loop
from .scalar import i64


def depthwise(op) -> bool:
    """Whether a conv2d_nhwc is one this kernel runs: depthwise with one output channel
    per input channel."""
    x, w = (v.type.shape for v in op.operands)
    return w[2] == 1 and w[3] == x[3] == op.attributes["groups"]


def emit_depthwise_nhwc(b: ir.IRBuilder, op, outs, ins, isa: Isa, threads: int,
                        name: str) -> None:
    if not depthwise(op):
        raise UnsupportedOpError(f"{op.name}: the cpu runs channels-last convs only when "
                                 "depthwise (weight [kh, kw, 1, c]); this one has weight "
                                 f"{list(op.operands[1].type.shape)}")
    n, h, wd, c = op.operands[0].type.shape
    kh, kw = op.operands[1].type.shape[:2]
    oh, ow = op.result.type.shape[1:3]
    if 0 in (n, c, oh, ow):
        return
    a = op.attributes
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    ph, pw = sides(op.name, a["padding"])[:2]  # (the bottom and right ones: oh and ow)
    dt = op.result.type.dtype
    lanes = isa.lanes(dt)
    vh = [valid_outputs(oh, h, sh, ph, i, dh) for i in range(kh)]
    vw = [valid_outputs(ow, wd, sw, pw, j, dw) for j in range(kw)]
    rows = range(max(r.start for r in vh), min(r.stop for r in vh))
    cols = range(max(r.start for r in vw), min(r.stop for r in vw))
    edge_cols = [q for q in range(ow) if q not in cols]

    def row(bb: ir.IRBuilder, x, w, y, r) -> None:
        """Output row r of the n * oh rows."""
        image, orow = bb.sdiv(r, i64(oh)), bb.srem(r, i64(oh))
        ihs = [bb.add(bb.mul(orow, i64(sh)), i64(i * dh - ph)) for i in range(kh)]

        def position(q, checked: bool) -> None:
            """Output (r, q): its taps' input offsets, and whether each lands inside."""
            taps = []
            for i in range(kh):
                for j in range(kw):
                    iw = bb.add(bb.mul(q, i64(sw)), i64(j * dw - pw))
                    at = bb.mul(bb.add(bb.mul(bb.add(bb.mul(image, i64(h)), ihs[i]),
                                              i64(wd)), iw), i64(c))
                    inside = None
                    if checked:
                        inside = bb.and_(_within(bb, ihs[i], h), _within(bb, iw, wd))
                        at = bb.select(inside, at, i64(0))
                    taps.append((at, (i * kw + j) * c, inside))
            out = bb.mul(bb.add(bb.mul(r, i64(ow)), q), i64(c))
            _channels(bb, x, w, y, dt, c, lanes, taps, out)

        def all_checked() -> None:
            loop(bb, ow, lambda q: position(q, True), "q")

        def interior() -> None:
            loop(bb, len(cols), lambda q: position(bb.add(q, i64(cols.start)), False), "q")
            for q in edge_cols:
                position(i64(q), True)

        if not len(rows) or not len(cols):
            all_checked()
            return
        inside = bb.and_(bb.icmp_signed(">=", orow, i64(rows.start)),
                         bb.icmp_signed("<", orow, i64(rows.stop)))
        with bb.if_else(inside) as (yes, no):
            with yes:
                interior()
            with no:
                all_checked()

    total = n * oh
    t = parallel_chunks(2 * total * ow * c * kh * kw, total, threads)
    x, w = ins
    if t == 1:
        loop(b, total, lambda r: row(b, x, w, outs[0], r), "r")
        return
    parallel_region(b, f"{name}.rows", [x, w, outs[0]], [False, False, True], total, t,
                    lambda bb, ptrs, lo, hi: for_range(
                        bb, lo, hi, lambda r: row(bb, *ptrs, r), "r"))


def _within(b: ir.IRBuilder, v, size: int):
    return b.icmp_unsigned("<", v, i64(size))  # (a negative v is a huge unsigned one)


def _channels(b: ir.IRBuilder, x, w, y, dt: str, c: int, lanes: int, taps: list,
              out) -> None:
    """y[out + ch] = sum over taps of x[at + ch] * w[tap + ch] for every channel ch, a
    vector of `lanes` channels at a time, then the rest as one shorter vector."""
    def block(c0, width: int) -> None:
        vt = ir.VectorType(S.REG[dt], width)
        fma = S.declare(b.module, f"llvm.fma.v{width}{dt}", vt, [vt, vt, vt])
        acc = ir.Constant(vt, None)
        for at, tap, inside in taps:
            xv = _vload(b, x, b.add(at, c0), vt, dt)
            if inside is not None:
                xv = b.select(inside, xv, ir.Constant(vt, None))
            wv = _vload(b, w, b.add(i64(tap), c0), vt, dt)
            acc = b.call(fma, [xv, wv, acc])
        b.store(acc, b.gep(y, [b.add(out, c0)], inbounds=True, source_etype=S.MEM[dt]),
                align=S.size(dt))

    loop(b, c // lanes, lambda k: block(b.mul(k, i64(lanes)), lanes), "ch")
    if c % lanes:
        block(i64(c - c % lanes), c % lanes)


def _vload(b: ir.IRBuilder, base, offset, vt: ir.VectorType, dt: str):
    return b.load(b.gep(base, [offset], inbounds=True, source_etype=S.MEM[dt]), typ=vt,
                  align=S.size(dt))
