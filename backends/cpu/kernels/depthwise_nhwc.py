"""A depthwise `ember.conv2d_nhwc` (one input channel per output channel, the channels
last), or a `kernel.conv2d_nhwc` (that conv and its epilogue): each output position sums
its taps a vector of channels at a time, in registers. In NCHW the same conv walks each
plane's rows of 7 to 112 columns; here every load is a run of channels (passes/layout.py
picks this form). A kernel op's epilogue (bias, activation, residual) runs on the
accumulators before the one store (vector_body.py), where its ops and its operands'
strides along the channels (1, or 0: broadcast) allow; else the conv is stored and the
epilogue runs after it as a fused loop (conv_epilogue.py).

Positions whose taps all land inside the input (the interior rows and columns) load with
no test; the border positions load each tap from a clamped address and take an input of
zero where it lands in the padding (a select, no branch per tap), as the padding's zeros
would be.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from ....ir.dialects.ember_windows import sides
from ....ir.dialects.kernel import conv_output, epilogue_maps
from ...errors import UnsupportedOpError
from ..call.buffers import regions
from ..gemm.microkernel import splat
from ..machine.host import Isa
from ..parallel.outline import parallel_chunks, parallel_region
from . import scalar as S
from . import vector_body
from .conv_epilogue import ConvEpilogue
from .implicit_pack import valid_outputs
from .loops import for_range, loop
from .scalar import i64


def depthwise(op) -> bool:
    """Whether a conv2d_nhwc is one this kernel runs: depthwise with one output channel
    per input channel."""
    x, w = (v.type.shape for v in op.operands[:2])
    return w[2] == 1 and w[3] == x[3] == op.attributes["groups"]


def _in_registers(op) -> bool:
    """Whether a kernel op's epilogue runs on the accumulators (`vector_body`)."""
    _, maps, out_maps = epilogue_maps(op)
    return vector_body.evaluable(op.regions[0].blocks[0], op.operands[0].type.dtype) \
        and all(m[3] in (0, 1) for m in maps) and all(m[3] == 1 for m in out_maps)


def depthwise_scratch(op, isa: Isa, threads: int) -> int:
    """Where a kernel op's epilogue runs after the conv: its product, unless its first
    result is laid out as it."""
    if op.name != "kernel.conv2d_nhwc" or _in_registers(op):
        return 0
    return regions(ConvEpilogue(op, "").product_bytes)[1]


def emit_depthwise_nhwc(b: ir.IRBuilder, op, outs, ins, scratch, isa: Isa, threads: int,
                        name: str) -> None:
    if not depthwise(op):
        raise UnsupportedOpError(f"{op.name}: the cpu runs channels-last convs only when "
                                 "depthwise (weight [kh, kw, 1, c]); this one has weight "
                                 f"{list(op.operands[1].type.shape)}")
    if 0 in conv_output(op):
        return
    if op.name != "kernel.conv2d_nhwc":
        _emit(b, op, ins, outs[0], [], None, isa, threads, name)
    elif _in_registers(op):
        _emit(b, op, ins, None, outs, _RegisterEpilogue(op, len(ins) - 2), isa, threads,
              name)
    else:
        epi = ConvEpilogue(op, name)
        y = outs[0] if epi.in_place else scratch
        _emit(b, op, ins[:2], y, [], None, isa, threads, name)
        epi.emit_after(b, y, ins[2:], outs, threads)


class _RegisterEpilogue:
    """A kernel op's body on each vector of accumulators: its operands loaded, its results
    stored, at an output position's element offset along each one's map."""

    def __init__(self, op, n_in: int):
        _, self.maps, self.out_maps = epilogue_maps(op)
        self.block = op.regions[0].blocks[0]
        self.dtype = op.operands[0].type.dtype
        self.n_in = n_in

    def store(self, b: ir.IRBuilder, ptrs: list, pos: list, c0, acc, width: int) -> None:
        """The body at output position `pos` (image, row, column), channels c0.., from
        the accumulators `acc`; `ptrs`: the epilogue operands', then the results'."""
        vt = ir.VectorType(S.REG[self.dtype], width)
        args = [acc]
        for ptr, m in zip(ptrs, self.maps):
            at = _offset(b, m, pos)
            if m[3]:
                args.append(_vload(b, ptr, b.add(at, c0), vt, self.dtype))
            else:  # (the same along the channels: a per-image or per-position scale)
                args.append(splat(b, S.load(b, ptr, self.dtype, at), width))
        for ptr, m, v in zip(ptrs[self.n_in:], self.out_maps,
                             vector_body.evaluate(b, self.block, args, self.dtype, width)):
            b.store(v, b.gep(ptr, [b.add(_offset(b, m, pos), c0)], inbounds=True,
                             source_etype=S.MEM[self.dtype]), align=S.size(self.dtype))


def _offset(b: ir.IRBuilder, m: list[int], pos: list) -> ir.Value:
    at = i64(0)
    for stride, v in zip(m[:3], pos):
        if stride:
            at = b.add(at, b.mul(v, i64(stride)))
    return at


def _emit(b: ir.IRBuilder, op, ins: list, y, outs: list, epilogue: _RegisterEpilogue | None,
          isa: Isa, threads: int, name: str) -> None:
    """The conv, each vector of accumulators stored to y, or to the results through
    `epilogue` (then `ins` holds the epilogue operands after x and w)."""
    n, h, wd, c = op.operands[0].type.shape
    kh, kw = op.operands[1].type.shape[:2]
    a = op.attributes
    oh, ow = conv_output(op)[1:3]
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    ph, pw = sides(op.name, a["padding"])[:2]  # (the bottom and right ones: oh and ow)
    dt = op.operands[0].type.dtype
    lanes = isa.lanes(dt)
    vh = [valid_outputs(oh, h, sh, ph, i, dh) for i in range(kh)]
    vw = [valid_outputs(ow, wd, sw, pw, j, dw) for j in range(kw)]
    rows = range(max(r.start for r in vh), min(r.stop for r in vh))
    cols = range(max(r.start for r in vw), min(r.stop for r in vw))
    edge_cols = [q for q in range(ow) if q not in cols]

    def row(bb: ir.IRBuilder, ptrs: list, r) -> None:
        """Output row r of the n * oh rows."""
        x, w, rest = ptrs[0], ptrs[1], ptrs[2:]
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
            if epilogue is None:
                out = bb.mul(bb.add(bb.mul(r, i64(ow)), q), i64(c))

                def store(c0, acc, width):
                    bb.store(acc, bb.gep(rest[0], [bb.add(out, c0)], inbounds=True,
                                         source_etype=S.MEM[dt]), align=S.size(dt))
            else:
                def store(c0, acc, width):
                    epilogue.store(bb, rest, [image, orow, q], c0, acc, width)
            _channels(bb, x, w, dt, c, lanes, taps, store)

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
    ptrs = [*ins, *outs] if epilogue is not None else [*ins, y]
    written = [False] * len(ins) + [True] * (len(ptrs) - len(ins))
    t = parallel_chunks(2 * total * ow * c * kh * kw, total, threads)
    if t == 1:
        loop(b, total, lambda r: row(b, ptrs, r), "r")
        return
    parallel_region(b, f"{name}.rows", ptrs, written, total, t,
                    lambda bb, chunk, lo, hi: for_range(
                        bb, lo, hi, lambda r: row(bb, chunk, r), "r"))


def _within(b: ir.IRBuilder, v, size: int):
    return b.icmp_unsigned("<", v, i64(size))  # (a negative v is a huge unsigned one)


def _channels(b: ir.IRBuilder, x, w, dt: str, c: int, lanes: int, taps: list,
              store: Callable) -> None:
    """store(ch0, sum over taps of x[at + ch] * w[tap + ch], width) for the channels
    ch0.. of each vector of `lanes` channels, then the rest as one shorter vector."""
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
        store(c0, acc, width)

    loop(b, c // lanes, lambda k: block(b.mul(k, i64(lanes)), lanes), "ch")
    if c % lanes:
        block(i64(c - c % lanes), c % lanes)


def _vload(b: ir.IRBuilder, base, offset, vt: ir.VectorType, dt: str):
    return b.load(b.gep(base, [offset], inbounds=True, source_etype=S.MEM[dt]), typ=vt,
                  align=S.size(dt))
