"""A depthwise `ember.conv2d_nhwc` (one input channel per output channel, the channels
last), or a `kernel.conv2d_nhwc` (that conv and its epilogue): each output position sums
its taps a vector of channels at a time, in registers. In NCHW the same conv walks each
plane's rows of 7 to 112 columns; here every load is a run of channels (passes/layout.py
picks this form). A dense one (one group: an image stem's 3 input channels) broadcasts
each input channel's value against vectors of output channels, several positions at a
time sharing each weight vector. A kernel op's epilogue (bias, activation, residual) runs on the
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
from ...strides import cdiv
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

DENSE_ACCUMULATORS = 8


def depthwise(op) -> bool:
    """Whether a conv2d_nhwc is depthwise with one output channel per input channel."""
    x, w = (v.type.shape for v in op.operands[:2])
    return w[2] == 1 and w[3] == x[3] == op.attributes["groups"]


def runs(op) -> bool:
    """Whether this kernel runs a conv2d_nhwc: depthwise, or dense (one group; each
    input channel's value broadcast against a vector of output channels: made for an
    image stem's 3 channels)."""
    return depthwise(op) or op.attributes["groups"] == 1


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
    if not runs(op):
        raise UnsupportedOpError(f"{op.name}: the cpu runs channels-last convs only when "
                                 "depthwise (weight [kh, kw, 1, c]) or of one group; this "
                                 f"one has weight {list(op.operands[1].type.shape)} and "
                                 f"{op.attributes['groups']} groups")
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
    kh, kw, cg, o = op.operands[1].type.shape
    dense = not depthwise(op)
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
    # a dense conv's interior positions side by side, sharing each weight vector (8 of a
    # 16-channel stem, 4 of a 32-channel one: DENSE_ACCUMULATORS vectors; a weight load
    # per position and input was the bottleneck, 3x slower)
    group = max(1, DENSE_ACCUMULATORS // cdiv(o, lanes)) if dense else 1

    def row(bb: ir.IRBuilder, ptrs: list, r) -> None:
        """Output row r of the n * oh rows."""
        x, w, rest = ptrs[0], ptrs[1], ptrs[2:]
        image, orow = bb.sdiv(r, i64(oh)), bb.srem(r, i64(oh))
        ihs = [bb.add(bb.mul(orow, i64(sh)), i64(i * dh - ph)) for i in range(kh)]

        rowbase = [bb.mul(bb.add(bb.mul(image, i64(h)), ih), i64(wd * c)) for ih in ihs]

        def taps(q0, p: int, checked: bool) -> list:
            """Output (r, q0 + p)'s taps: input offset, weight offset, whether inside (an
            interior position's offsets: a row's base plus a constant, so that a group
            of positions keeps kh offsets live, not kh * kw per position)."""
            out = []
            for i in range(kh):
                for j in range(kw):
                    col = p * sw + j * dw - pw
                    inside = None
                    if checked:
                        iw = bb.add(bb.mul(q0, i64(sw)), i64(col))
                        inside = bb.and_(_within(bb, ihs[i], h), _within(bb, iw, wd))
                        at = bb.select(inside, bb.add(rowbase[i], bb.mul(iw, i64(c))), i64(0))
                    else:
                        at = bb.add(bb.add(rowbase[i], bb.mul(q0, i64(sw * c))), i64(col * c))
                    out.append((at, (i * kw + j) * cg * o, inside))
            return out

        def store(q):
            if epilogue is None:
                out = bb.mul(bb.add(bb.mul(r, i64(ow)), q), i64(o))
                return lambda c0, acc, width: bb.store(
                    acc, bb.gep(rest[0], [bb.add(out, c0)], inbounds=True,
                                source_etype=S.MEM[dt]), align=S.size(dt))
            return lambda c0, acc, width: epilogue.store(bb, rest, [image, orow, q], c0,
                                                         acc, width)

        def positions(q0, count: int, checked: bool) -> None:
            """Outputs (r, q0 + p) for p < count, which share each weight vector loaded."""
            _channels(bb, x, w, dt, o, cg if dense else 0, lanes,
                      [taps(q0, p, checked) for p in range(count)],
                      [store(bb.add(q0, i64(p))) for p in range(count)])

        def position(q, checked: bool) -> None:
            positions(q, 1, checked)

        def all_checked() -> None:
            loop(bb, ow, lambda q: position(q, True), "q")

        def interior() -> None:
            def block(k):
                positions(bb.add(bb.mul(k, i64(group)), i64(cols.start)), group, False)

            loop(bb, len(cols) // group, block, "q")
            for q in range(cols.start + len(cols) // group * group, cols.stop):
                position(i64(q), False)
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
    t = parallel_chunks(2 * total * ow * o * cg * kh * kw, total, threads)
    if t == 1:
        loop(b, total, lambda r: row(b, ptrs, r), "r")
        return
    parallel_region(b, f"{name}.rows", ptrs, written, total, t,
                    lambda bb, chunk, lo, hi: for_range(
                        bb, lo, hi, lambda r: row(bb, chunk, r), "r"))


def _within(b: ir.IRBuilder, v, size: int):
    return b.icmp_unsigned("<", v, i64(size))  # (a negative v is a huge unsigned one)


def _channels(b: ir.IRBuilder, x, w, dt: str, c: int, dense: int, lanes: int,
              taps: list[list], stores: list[Callable]) -> None:
    """For each position p (its `taps` and `stores`), stores[p](ch0, sum over its taps of
    x[at + ch] * w[tap + ch], width) for the output channels ch0.. of each vector of
    `lanes` channels, then the rest as one shorter vector; a `dense` conv's sum is over
    its `dense` input channels i of each tap too, x[at + i] (broadcast) * w[tap + i * c +
    ch], every vector of channels at once (each input broadcast once). The positions
    share each weight vector loaded."""
    def blocks(starts: list) -> None:
        """The vectors of channels (c0, width) in `starts`, together."""
        vts = [ir.VectorType(S.REG[dt], width) for _, width in starts]
        fmas = [S.declare(b.module, f"llvm.fma.v{vt.count}{dt}", vt, [vt, vt, vt])
                for vt in vts]
        accs = [[ir.Constant(vt, None) for vt in vts] for _ in taps]
        for t, (_, tap, _) in enumerate(taps[0]):
            for i in range(dense or 1):
                wvs = [_vload(b, w, b.add(i64(tap + i * c), c0), vt, dt)
                       for (c0, _), vt in zip(starts, vts)]
                for p, pos in enumerate(taps):
                    at, _, inside = pos[t]
                    if dense:
                        xs = S.load(b, x, dt, b.add(at, i64(i)))
                        if inside is not None:
                            xs = b.select(inside, xs, ir.Constant(xs.type, 0))
                    for k, ((c0, width), vt) in enumerate(zip(starts, vts)):
                        if dense:
                            xv = splat(b, xs, width)
                        else:
                            xv = _vload(b, x, b.add(at, c0), vt, dt)
                            if inside is not None:
                                xv = b.select(inside, xv, ir.Constant(vt, None))
                        accs[p][k] = b.call(fmas[k], [xv, wvs[k], accs[p][k]])
        for store, acc in zip(stores, accs):
            for (c0, width), v in zip(starts, acc):
                store(c0, v, width)

    tail = [(i64(c - c % lanes), c % lanes)] if c % lanes else []
    if dense:
        blocks([(i64(k * lanes), lanes) for k in range(c // lanes)] + tail)
        return
    loop(b, c // lanes, lambda k: blocks([(b.mul(k, i64(lanes)), lanes)]), "ch")
    if tail:
        blocks(tail)


def _vload(b: ir.IRBuilder, base, offset, vt: ir.VectorType, dt: str):
    return b.load(b.gep(base, [offset], inbounds=True, source_etype=S.MEM[dt]), typ=vt,
                  align=S.size(dt))
