"""A conv's weight gradient as an implicit GEMM: dW^T (K x O) = sum over images of
cols(x[n]) (K x P) @ dy[n]^T (P x O), the columns never written out. Each panel of an
image's output positions packs all K rows of its columns straight from the image (the
forward's packer, implicit_conv.py) and its dy^T (P x O panels, a copy of the output
gradient's few rows); the micro-kernel multiplies them into each thread's own dW^T,
and the threads' copies are added up (and transposed into dW) after. im2col wrote the
columns first, and the GEMM packed them again, or read them a row K apart.

Used where a group's weight, so each thread's dW^T, stays in L2 (`weight_bytes`).
"""

from __future__ import annotations

from llvmlite import ir

from ...strides import cdiv
from ..gemm.emit import blocking
from ..gemm.matmul import byte_offset
from ..gemm.microkernel import microkernel
from ..machine.host import Isa, host_caches
from ..parallel.outline import chunk_index, parallel_region
from . import scalar as S
from .implicit_conv import Geometry, packer, panel_width, threads_for, work_items
from .loops import for_range, loop
from .scalar import i64


def weight_bytes() -> int:
    """The largest weight (of a group) whose gradient this kernel takes."""
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


def weight_grad_scratch(geo: Geometry, isa: Isa, threads: int) -> int:
    return threads_for(geo, isa, threads) * _regions(geo, isa)[0]


def emit_weight_grad(b: ir.IRBuilder, geo: Geometry, x, dy, dw, scratch, isa: Isa,
                     threads: int, name: str) -> None:
    """dw = conv2d_grad_weight(x, dy) of `geo`: items (image, group, panel of positions)
    split across threads, each summing into its own dW^T in `scratch`."""
    dt, el = geo.dtype, S.REG[geo.dtype]
    lanes = isa.lanes(dt)
    nr = panel_width(geo, isa)
    npanels = cdiv(geo.p, nr)
    tail = geo.p - (npanels - 1) * nr
    width, o_panels, mr = _o_panels(geo, isa)
    o_tail = geo.og - (o_panels - 1) * width
    mod = b.module
    uk_full = microkernel(mod, dt, lanes, mr, cdiv(width, lanes), False)
    uk_tail = microkernel(mod, dt, lanes, mr, cdiv(o_tail, lanes), False)
    pack_cols = packer(mod, geo, geo.cg, nr, lanes, f"{name}.pack")
    n_items, t = work_items(geo, isa), threads_for(geo, isa, threads)
    per, dy_off, dw_off = _regions(geo, isa)
    weights = geo.o * geo.k

    def at(bb, ptr, offset):
        return bb.gep(ptr, [offset], inbounds=True, source_etype=el)

    def item(bb, xp, dyp, cols, dy_t, dw_t, it):
        jp = bb.urem(it, i64(npanels))
        ng = bb.udiv(it, i64(npanels))  # image * groups + group
        g = bb.urem(ng, i64(geo.g))
        pos0 = bb.mul(jp, i64(nr))
        npos = bb.select(bb.icmp_signed("==", jp, i64(npanels - 1)), i64(tail), i64(nr))
        xg = at(bb, xp, bb.mul(bb.add(bb.mul(bb.udiv(ng, i64(geo.g)), i64(geo.c)),
                                      bb.mul(g, i64(geo.cg))), i64(geo.h * geo.w)))
        bb.call(pack_cols, [xg, cols, pos0, npos])
        dyg = at(bb, dyp, bb.add(bb.mul(ng, i64(geo.og * geo.p)), pos0))

        def transpose(o):  # dy_t[o / width][q][o % width] = dy[o][q]
            base = bb.add(bb.mul(bb.udiv(o, i64(width)), i64(nr * width)),
                          bb.urem(o, i64(width)))
            for_range(bb, i64(0), npos, lambda q: S.store(
                bb, dy_t, dt, bb.add(base, bb.mul(q, i64(width))),
                S.load(bb, dyg, dt, bb.add(bb.mul(o, i64(geo.p)), q))), "q")

        loop(bb, geo.og, transpose, "o")
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
            loop(bb, count, lambda i, buf=buf: S.store(bb, buf, dt, i, S.const(dt, 0)), "z")
        for_range(bb, lo, hi, lambda it: item(bb, xp, dyp, cols, dy_t, dw_t, it), "item")

    if t == 1:
        run(b, x, dy, scratch, i64(0), i64(n_items))
    else:
        def share(bb, ptrs, lo, hi):
            own = byte_offset(bb, ptrs[2], bb.mul(chunk_index(bb, lo, n_items, t), i64(per)))
            run(bb, ptrs[0], ptrs[1], own, lo, hi)

        parallel_region(b, f"{name}.items", [x, dy, scratch], [False, False, True],
                        n_items, t, share)

    def gather(g, o, k):  # dw[g, o, k] = sum of the threads' dW^T[g, k, o]
        at_t = b.add(b.mul(g, i64(geo.k * geo.og)), b.add(b.mul(k, i64(geo.og)), o))
        total = S.load(b, byte_offset(b, scratch, dw_off), dt, at_t)
        for th in range(1, t):
            total = b.fadd(total, S.load(b, byte_offset(b, scratch, th * per + dw_off), dt,
                                         at_t))
        S.store(b, dw, dt, b.add(b.mul(b.add(b.mul(g, i64(geo.og)), o), i64(geo.k)), k), total)

    loop(b, geo.g, lambda g: loop(b, geo.og, lambda o: loop(
        b, geo.k, lambda k: gather(g, o, k), "k"), "o"), "g")
