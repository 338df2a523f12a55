"""`kernel.attention` and `kernel.attention_grad` on the cpu: flash attention, so the
[..., Tq, Tk] scores never exist whole (one block of `bk` keys x `bq` queries per thread).

The queries sit in the vector lanes throughout. A block's scores are kept transposed
(s[j][i], one row per key), so the online softmax's running max m, sum l and rescale
factor are vectors over queries (no horizontal reductions), and keys and values are
broadcast one element at a time straight from their strided buffers (no packing,
whatever the maps); only the query block is copied, transposed and pre-scaled. Every
product is one register tile (`Emitter.tile`): MR broadcast rows times `nv` vectors of
accumulators; exp and log are scalar loops that LLVM vectorizes (vmath).

Forward, per (batch element, query block), parallel over both: for each key block,
s = (q*scale) k^T (hidden entries -inf), m' = max(m, colmax s), p = exp(s - m'),
l = l e^(m-m') + colsum p, acc = acc e^(m-m') + v^T p; then o = acc / l, lse = m + log l.
Backward, per batch element (one thread owns its element's dq, dk and dv, so nothing
races): per query block, q (both layouts), do and Drow = rowsum(do*o) are packed; per key
block p = exp(s - lse) and ds = p (v do^T - Drow) scale are rebuilt, then dv += p do and
dk += ds q (key rows in registers) and dq^T += k^T ds (queries in lanes).

A causal mask skips the key blocks past a query block's diagonal and, within a block, the
query vectors an MR-row group of keys cannot see (`first_vector`). Queries past Tq and
key rows past a block's last key are computed from clamped or zeroed data and never
stored; in the backward their p is 0 (padded queries get lse = +inf).

Results are written through their maps too, so o, dq, dk and dv can land straight in the
[B, T, H, D] layout the projections read. The shared blocking and register tiles are in
tiles.py, the backward item in backward.py.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ....ir import Operation
from ..call.buffers import regions
from ..gemm.matmul import byte_offset
from ..kernels import scalar as S
from ..kernels import vmath
from ..kernels.loops import for_range, loop
from ..kernels.scalar import i64
from ..machine.host import Isa
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from .amx import amx_attention_scratch, emit_amx_attention, forward_item
from .amx_backward import backward_item as amx_backward_item
from .backward import backward_item
from .tiles import Blocking, Emitter, item_function


def _on_tiles(op: Operation) -> bool:
    """bf16 operands: what low-precision-attention leaves only where the cpu has tiles."""
    return op.operands[0].type.dtype == "bf16"


def _regions(g: Blocking, forward: bool) -> tuple[dict[str, int], int]:
    """Byte offsets of one thread's scratch buffers (element counts below) and its bytes."""
    bq, bk = g.bq, g.bk
    if forward:
        sizes = {"qt": g.d * bq, "s": bk * bq, "acc": g.dv * bq, "m": bq, "l": bq,
                 "alpha": bq, "bmax": bq}
    else:
        tkp = g.nkb * bk
        sizes = {"qt": g.d * bq, "qp": bq * g.pad(g.d), "dot": g.dv * bq,
                 "dop": bq * g.pad(g.dv), "drow": bq, "lse_b": bq, "s": bk * bq, "ds": bk * bq,
                 "dqt": g.d * bq, "dka": tkp * g.pad(g.d), "dva": tkp * g.pad(g.dv)}
    offs, total = regions(*(n * S.size(g.dtype) for n in sizes.values()))
    return dict(zip(sizes, offs)), total


def _threads(g: Blocking, forward: bool, threads: int) -> tuple[int, int]:
    """(parallel items, threads): (batch, query block) pairs forward, batch elements
    backward; small ones stay on one thread (a hand-off costs more than they take)."""
    flops = 2 * g.nbatch * g.tq * g.tk * (g.d + g.dv) * (1 if forward else 3) / (
        2 if g.causal else 1)  # a causal mask hides half the scores
    items = g.nbatch * (g.nqb if forward else 1)
    return items, parallel_chunks(flops / 4, items, threads)


def attention_scratch(op: Operation, isa: Isa, threads: int) -> int:
    """Scratch bytes of an attention op: one set of block buffers per thread."""
    if _on_tiles(op):
        return amx_attention_scratch(op, threads)
    g, forward = Blocking(op, isa), op.name == "kernel.attention"
    return _threads(g, forward, threads)[1] * _regions(g, forward)[1]


FWD_IO = ["o", "lse", "q", "k", "v"]


def _forward_item(mod: ir.Module, g: Blocking, bufs: list[str], name: str) -> ir.Function:
    """`item(o, lse, q, k, v, <scratch buffers>, it)`: query block it % nqb of batch
    element it // nqb."""
    fn = item_function(mod, f"{name}.block", FWD_IO + bufs, {"o", "lse", *bufs})
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b, g)
    a = dict(zip(FWD_IO + bufs, fn.args))
    it = fn.args[-1]
    bi, qb = b.udiv(it, i64(g.nqb)), b.urem(it, i64(g.nqb))
    q, k, v, o, lse = (e.batch_ptr(a[n], bi, n) for n in ("q", "k", "v", "o", "lse"))
    i0 = b.mul(qb, i64(g.bq))
    nq = S.at_most(b, b.sub(i64(g.tq), i0), g.bq)
    e.pack(a["qt"], q, "q", i0, nq, g.d, False, g.scale)
    m, l_, alpha, bmax, s, acc = (a[n] for n in ("m", "l", "alpha", "bmax", "s", "acc"))

    def init(i):
        for buf, x in ((m, -math.inf), (l_, 0.0), (bmax, -math.inf)):
            e.st(e.c(x), buf, i)

    loop(b, g.bq, init, "i")
    e.zero(acc, g.dv * g.bq)
    ivec = e.query_ivec(i0)
    exp = vmath.exp

    def key_block(kb):
        j0, nk, groups = e.block_keys(i0, nq, kb)
        e.scores(s, k, "k", a["qt"], g.d, j0, groups, i0, ivec, bmax)

        def rescale(i):
            mo = e.ld(m, i)
            mn = S.intrinsic(b, f"llvm.maxnum.{g.dtype}", e.el, [mo, e.ld(bmax, i)])
            e.st(mn, m, i)
            e.st(exp(b, g.dtype, b.fsub(mo, mn)), alpha, i)
            e.st(e.c(-math.inf), bmax, i)

        loop(b, g.bq, rescale, "i")

        def prob(j, start):
            def one(i):
                x = b.fsub(e.ld(s, (j, g.bq), i), e.ld(m, i))
                e.st(exp(b, g.dtype, x), s, (j, g.bq), i)
            for_range(b, start, i64(g.bq), one, "i")

        e.rows_live(j0, groups, i0, prob)
        e.query_lanes(acc, v, "v", g.dv, j0, e.segments(i0, j0, nk), s, alpha, l_)

    for_range(b, i64(0), e.key_blocks(i0, nq), key_block, "kb")

    (ors, ocs), lse_stride = g.strides("o"), g.maps["lse"][g.nb]

    def out(i):
        row = b.add(i0, i)
        inv = b.fdiv(e.c(1.0), e.ld(l_, i))
        loop(b, g.dv, lambda c: e.st(b.fmul(e.ld(acc, (c, g.bq), i), inv), o,
                                     (row, ors), (c, ocs)), "c")
        e.st(b.fadd(e.ld(m, i), vmath.call(b, "log", g.dtype, e.ld(l_, i))), lse,
             (row, lse_stride))

    for_range(b, i64(0), nq, out, "i")
    b.ret_void()
    return fn


def emit_attention(b: ir.IRBuilder, op: Operation, outs: list, ins: list, scratch: ir.Value,
                   isa: Isa, threads: int, name: str) -> None:
    """The op's kernel: its items (see `_threads`) over the thread pool, each thread
    with its own block buffers in `scratch`; on bf16 operands, the tiles' (amx.py)."""
    if _on_tiles(op):
        emit_amx_attention(b, op, outs, ins, scratch, isa, threads, name,
                           forward_item if op.name == "kernel.attention" else amx_backward_item)
        return
    g, forward = Blocking(op, isa), op.name == "kernel.attention"
    offs, per = _regions(g, forward)
    item = (_forward_item if forward else backward_item)(b.module, g, list(offs), name)
    items, t = _threads(g, forward, threads)
    ptrs = list(outs) + list(ins) + [scratch]

    def chunk(bb, ps, lo, hi):
        base = byte_offset(bb, ps[-1], bb.mul(chunk_index(bb, lo, items, t), i64(per)))
        regs = [byte_offset(bb, base, off) for off in offs.values()]
        for_range(bb, lo, hi, lambda it: bb.call(item, ps[:-1] + regs + [it]), "item")

    if t == 1:
        chunk(b, ptrs, i64(0), i64(items))
        return
    parallel_region(b, f"{name}.items", ptrs, [True] * len(outs) + [False] * len(ins) + [True],
                    items, t, chunk)
