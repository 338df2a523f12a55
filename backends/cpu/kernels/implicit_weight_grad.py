"""A conv's weight gradient as an implicit GEMM: dW^T (K x O) = sum over images of
cols(x[n]) (K x P) @ dy[n]^T (P x O), the columns never written out. Each panel of an
image's output positions packs all K rows of its columns straight from the image (the
forward's packer, implicit_conv.py) and its dy^T (P x O panels, a copy of the output
gradient's few rows); the micro-kernel multiplies them into each thread's own dW^T,
and the threads' copies are added up (and transposed into dW) after. im2col wrote the
columns first, and the GEMM packed them again, or read them a row K apart.

Used where a group's weight, so each thread's dW^T, stays in L2 (`copied_weight_bytes`);
larger weights split blocks of dW's rows across threads instead
(implicit_weight_grad_blocks.py).
"""

from __future__ import annotations

from llvmlite import ir

from ...strides import cdiv
from ..gemm.emit import blocking
from ..gemm.matmul import byte_offset
from ..gemm.microkernel import microkernel
from ..machine.host import Isa, host_caches
from ..parallel.outline import chunk_index, parallel_region
from . import implicit_weight_grad_blocks as by_blocks
from . import scalar as S
from .implicit_conv import Geometry, Panels, panel_width, threads_for
from .implicit_pack import packer
from .loops import fill_zero, for_range, loop
from .scalar import i64


def weight_bytes() -> int:
    """The largest weight (of a group) whose gradient runs as an implicit GEMM: its dW^T
    is one more copy of it (in blocks, past `copied_weight_bytes`)."""
    return 16 * host_caches().l2


def copied_weight_bytes() -> int:
    """The largest weight (of a group) whose gradient the threads sum in copies of dW^T of
    their own."""
    return host_caches().l2 // 2


def _o_panels(geo: Geometry, isa: Isa) -> tuple[int, int, int]:
    """(panel width, panels, micro-kernel rows) of dW^T's O columns."""
    blk = blocking(isa, geo.dtype, geo.og)
    width = blk.nr(isa.lanes(geo.dtype))
    return width, cdiv(geo.og, width), blk.mr


def _regions(geo: Geometry, isa: Isa) -> tuple[int, int, int]:
    """Bytes of one thread's scratch and offsets in it of the packed dy^T and dW^T (the
    columns first)."""
    size = S.size(geo.dtype)
    nr = panel_width(geo, isa)
    width, panels, _ = _o_panels(geo, isa)
    cols = geo.k * nr * size
    dy_t = panels * nr * width * size
    return cols + dy_t + geo.o * geo.k * size, cols, cols + dy_t


def _copied(geo: Geometry) -> bool:
    return geo.weight_bytes <= copied_weight_bytes()


def weight_grad_scratch(geo: Geometry, isa: Isa, threads: int) -> int:
    if not _copied(geo):
        return by_blocks.scratch_bytes(geo, isa, threads)
    return threads_for(geo, isa, threads) * _regions(geo, isa)[0]


def emit_weight_grad(b: ir.IRBuilder, geo: Geometry, x, dy, dw, scratch, isa: Isa,
                     threads: int, name: str) -> None:
    """dw = conv2d_grad_weight(x, dy) of `geo`: items (`Panels`) split across threads,
    each summing into its own dW^T in `scratch` (by blocks of dW's rows, past
    `copied_weight_bytes`)."""
    if not _copied(geo):
        by_blocks.emit_by_blocks(b, geo, x, dy, dw, scratch, isa, threads, name)
        return
    dt, el = geo.dtype, S.REG[geo.dtype]
    lanes = isa.lanes(dt)
    pn = Panels.of(geo, isa)
    nr = pn.width
    width, o_panels, mr = _o_panels(geo, isa)
    o_tail = geo.og - (o_panels - 1) * width
    mod = b.module
    uk_full = microkernel(mod, dt, lanes, mr, cdiv(width, lanes), False)
    uk_tail = microkernel(mod, dt, lanes, mr, cdiv(o_tail, lanes), False)
    pack_cols = packer(mod, geo, geo.cg, nr, lanes, f"{name}.pack")
    t = threads_for(geo, isa, threads)
    per, dy_off, dw_off = _regions(geo, isa)
    weights = geo.o * geo.k

    def at(bb, ptr, offset):
        return bb.gep(ptr, [offset], inbounds=True, source_etype=el)

    def item(bb, xp, dyp, cols, dy_t, dw_t, it):
        g, pos0, npos, _ = pn.locate(bb, it)
        bb.call(pack_cols, [at(bb, xp, bb.mul(g, i64(geo.cg * geo.h * geo.w))), cols, pos0,
                            npos])

        def transpose(q):  # dy_t[o / width][q][o % width] = dy[image, g*og + o, p]
            image, p = (f(bb.add(pos0, q), i64(geo.p)) for f in (bb.udiv, bb.urem))
            src = bb.add(bb.mul(bb.add(bb.mul(image, i64(geo.o)), bb.mul(g, i64(geo.og))),
                                i64(geo.p)), p)
            row = bb.mul(q, i64(width))
            for op in range(o_panels):
                n_cols = o_tail if op == o_panels - 1 else width
                loop(bb, n_cols, lambda o, op=op: S.store(
                    bb, dy_t, dt, bb.add(row, bb.add(i64(op * nr * width), o)),
                    S.load(bb, dyp, dt, bb.add(src, bb.mul(bb.add(o, i64(op * width)),
                                                           i64(geo.p))))), "o")

        for_range(bb, i64(0), npos, transpose, "q")
        dwg = at(bb, dw_t, bb.mul(g, i64(geo.k * geo.og)))

        def tile(r):
            rows = bb.sub(i64(geo.k), bb.mul(r, i64(mr)))
            rows = bb.select(bb.icmp_signed("<", rows, i64(mr)), rows, i64(mr))
            a = at(bb, cols, bb.mul(r, i64(mr * nr)))
            for op in range(o_panels):
                uk, n_cols = (uk_tail, o_tail) if op == o_panels - 1 else (uk_full, width)
                bb.call(uk, [a, i64(nr), i64(1), at(bb, dy_t, i64(op * nr * width)),
                             i64(width), at(bb, dwg, bb.add(bb.mul(r, i64(mr * geo.og)),
                                                            i64(op * width))),
                             i64(geo.og), npos, ir.Constant(ir.IntType(1), 1), rows,
                             i64(n_cols)])

        loop(bb, cdiv(geo.k, mr), tile, "tile")

    def run(bb, xp, dyp, own, lo, hi):
        cols, dy_t, dw_t = (byte_offset(bb, own, o) for o in (0, dy_off, dw_off))
        # dW^T's sums start at zero, and so do dy^T's columns past O (which the micro-kernel
        # reads: left from other kernels they could be slow subnormals)
        for buf, count in ((dw_t, weights), (dy_t, o_panels * nr * width)):
            fill_zero(bb, buf, dt, count)
        for_range(bb, lo, hi, lambda it: item(bb, xp, dyp, cols, dy_t, dw_t, it), "item")

    if t == 1:
        run(b, x, dy, scratch, i64(0), i64(pn.items))
    else:
        def share(bb, ptrs, lo, hi):
            own = byte_offset(bb, ptrs[2], bb.mul(chunk_index(bb, lo, pn.items, t), i64(per)))
            run(bb, ptrs[0], ptrs[1], own, lo, hi)

        parallel_region(b, f"{name}.items", [x, dy, scratch], [False, False, True],
                        pn.items, t, share)

    def gather(g, o, k):  # dw[g, o, k] = sum of the threads' dW^T[g, k, o]
        at_t = b.add(b.mul(g, i64(geo.k * geo.og)), b.add(b.mul(k, i64(geo.og)), o))
        total = S.load(b, byte_offset(b, scratch, dw_off), dt, at_t)
        for th in range(1, t):
            total = b.fadd(total, S.load(b, byte_offset(b, scratch, th * per + dw_off), dt,
                                         at_t))
        S.store(b, dw, dt, b.add(b.mul(b.add(b.mul(g, i64(geo.og)), o), i64(geo.k)), k), total)

    loop(b, geo.g, lambda g: loop(b, geo.og, lambda o: loop(
        b, geo.k, lambda k: gather(g, o, k), "k"), "o"), "g")
