"""Matrix multiply: ember's own packed, register-blocked GEMM, or a call into OpenBLAS.

The own GEMM is generated for the host's vector width (AVX-512: 16 f32 lanes, 32
registers; AVX2/NEON/SSE: 8 or 4 lanes, 16 registers). Its micro-kernel keeps an
`mr x (nv * lanes)` tile of C in registers and, for each k, loads `nv` vectors of B and
broadcasts `mr` elements of A into fused multiply-adds. Operands are read through
strides, so transposed A costs nothing and transposed B is packed:
- small problems run the micro-kernel straight on A and B (B packed only if transposed);
- large ones pack B once into `nr`-wide panels and, per thread, `mc x kc` blocks of A
  into `mr`-row panels (kept in L2 while B's panels stream), splitting the rows of C
  across threads.
Edges use micro-kernel variants with fewer rows and a masked last vector, so no size
needs padding. `C` is row-major with unit column stride and leading dimension `ldc`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from . import scalar as S
from .loops import loop
from .scalar import I64, i64
from .threads import elem, parallel_for, stack_array

PTR = ir.PointerType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)


# above these, A and B are packed (cache blocking pays for the copies) ...
PACK_B_BYTES = 256 << 10
PACK_A_BYTES = 512 << 10
# ... and the rows of C are split across threads
THREAD_FLOPS = 8 << 20


@dataclass(frozen=True)
class Isa:
    """The host's vector unit: register width in bits and register count."""

    bits: int
    regs: int

    def lanes(self, dtype: str) -> int:
        return self.bits // (32 if dtype == "f32" else 64)


@functools.cache
def host_isa() -> Isa:
    llvm.initialize_native_target()
    feats = llvm.get_host_cpu_features()
    triple = llvm.get_process_triple()
    if feats.get("avx512f"):
        return Isa(512, 32)
    if feats.get("avx2") or feats.get("avx"):
        return Isa(256, 16)
    return Isa(128, 32 if triple.startswith(("aarch64", "arm64")) else 16)


@dataclass(frozen=True)
class Blocking:
    mr: int
    nv: int   # vectors per row of the C tile
    kc: int
    mc: int

    def nr(self, lanes: int) -> int:
        return self.nv * lanes


def blocking(isa: Isa, dtype: str, n: int) -> Blocking:
    """Register and cache blocking: as many accumulators as registers allow, fewer
    vectors per row when N is narrow."""
    lanes = isa.lanes(dtype)
    nv_max = 2 if isa.regs >= 32 else 2
    nv = max(1, min(nv_max, -(-n // lanes)))
    acc_regs = isa.regs - nv - 2
    mr = max(1, min(14 if isa.regs >= 32 else 6, acc_regs // nv))
    return Blocking(mr, nv, 256, 96 if isa.regs >= 32 else 72)


def _vec(dtype: str, lanes: int) -> ir.VectorType:
    return ir.VectorType(S.REG[dtype], lanes)


def _mask(lanes: int, tail: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(I1, lanes), [ir.Constant(I1, int(i < tail))
                                                  for i in range(lanes)])


def _masked(b: ir.IRBuilder, kind: str, dtype: str, lanes: int, tail: int, ptr, value=None):
    vt = _vec(dtype, lanes)
    suffix = f"v{lanes}{dtype}.p0"
    if kind == "load":
        fn = S.declare(b.module, f"llvm.masked.load.{suffix}", vt,
                       [PTR, I32, ir.VectorType(I1, lanes), vt])
        return b.call(fn, [ptr, ir.Constant(I32, 4), _mask(lanes, tail), ir.Constant(vt, None)])
    fn = S.declare(b.module, f"llvm.masked.store.{suffix}", ir.VoidType(),
                   [vt, PTR, I32, ir.VectorType(I1, lanes)])
    return b.call(fn, [value, ptr, ir.Constant(I32, 4), _mask(lanes, tail)])


def _vload(b, dtype, lanes, ptr, tail):
    if tail < lanes:
        return _masked(b, "load", dtype, lanes, tail, ptr)
    return b.load(ptr, typ=_vec(dtype, lanes), align=S.size(dtype))


def _vstore(b, dtype, lanes, ptr, v, tail):
    if tail < lanes:
        _masked(b, "store", dtype, lanes, tail, ptr, v)
    else:
        b.store(v, ptr, align=S.size(dtype))


def microkernel(mod: ir.Module, dtype: str, lanes: int, mr: int, nv: int, tail: int,
                unroll: int = 4) -> ir.Function:
    """`uk(a, a_rs, a_cs, b, b_rs, c, ldc, kc, accumulate)`: C[mr x cols] (+)= A B over kc,
    where cols = (nv-1)*lanes + tail; A[i,k] = a[i*a_rs + k*a_cs], B[k,j] = b[k*b_rs + j]."""
    name = f"ember.uk.{dtype}.{lanes}x{mr}x{nv}x{tail}"
    if name in mod.globals:
        return mod.globals[name]
    el = S.REG[dtype]
    vt = _vec(dtype, lanes)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR, I64, PTR, I64,
                                                          I64, I1]), name)
    fn.linkage = "internal"
    for a in (0, 3, 5):
        fn.args[a].add_attribute("noalias")
    a, a_rs, a_cs, bp, b_rs, c, ldc, kc, accum = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = S.declare(mod, f"llvm.fma.v{lanes}{dtype}", vt, [vt, vt, vt])
    zero = ir.Constant(vt, None)
    undef = ir.Constant(vt, ir.Undefined)
    splat_mask = ir.Constant(ir.VectorType(I32, lanes), [ir.Constant(I32, 0)] * lanes)
    rows = [b.mul(i64(i), a_rs) for i in range(mr)]
    tails = [lanes] * (nv - 1) + [tail]

    def step(k, accs):
        boff = b.mul(k, b_rs)
        bv = [_vload(b, dtype, lanes, b.gep(bp, [b.add(boff, i64(v * lanes))], inbounds=True,
                                             source_etype=el), tails[v]) for v in range(nv)]
        koff = b.mul(k, a_cs)
        out = []
        for i in range(mr):
            x = b.load(b.gep(a, [b.add(rows[i], koff)], inbounds=True, source_etype=el),
                       typ=el)
            xs = b.shuffle_vector(b.insert_element(undef, x, i64(0)), undef, splat_mask)
            out.append([b.call(fma, [xs, bv[v], accs[i][v]]) for v in range(nv)])
        return out

    def counted(start, count_fn, stride, accs, label):
        """for k in [start, end) step stride; accumulators as phis."""
        pre = b.block
        end = count_fn
        head, body, exit_ = (fn.append_basic_block(f"{label}.{s}") for s in ("head", "body",
                                                                                 "exit"))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64)
        k.add_incoming(start, pre)
        phis = [[b.phi(vt) for _ in range(nv)] for _ in range(mr)]
        for i in range(mr):
            for v in range(nv):
                phis[i][v].add_incoming(accs[i][v], pre)
        b.cbranch(b.icmp_signed("<", b.add(k, i64(stride - 1)), end), body, exit_)
        b.position_at_end(body)
        cur = phis
        for u in range(stride):
            cur = step(b.add(k, i64(u)), cur)
        k.add_incoming(b.add(k, i64(stride)), b.block)
        for i in range(mr):
            for v in range(nv):
                phis[i][v].add_incoming(cur[i][v], b.block)
        b.branch(head)
        b.position_at_end(exit_)
        return k, phis

    accs = [[zero] * nv for _ in range(mr)]
    k, accs = counted(i64(0), kc, unroll, accs, "main")
    if unroll > 1:
        k, accs = counted(k, kc, 1, accs, "rest")
    for i in range(mr):
        crow = b.mul(i64(i), ldc)
        for v in range(nv):
            p = b.gep(c, [b.add(crow, i64(v * lanes))], inbounds=True, source_etype=el)
            with b.if_else(accum) as (add, put):
                with add:
                    old = _vload(b, dtype, lanes, p, tails[v])
                    _vstore(b, dtype, lanes, p, b.fadd(accs[i][v], old), tails[v])
                with put:
                    _vstore(b, dtype, lanes, p, accs[i][v], tails[v])
    b.ret_void()
    return fn


def pack_b(mod: ir.Module, p: GemmProblem, nr: int, name: str) -> ir.Function:
    """`pack(ctx = [src, dst], lo, hi)`: B's column panels lo..hi (each K x nr, zero
    padded past N) into dst[panel][k][nr]; strides are constants, so the copy along the
    unit-stride side vectorizes. Shaped as a `parallel_for` body."""
    el = S.REG[p.dtype]
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), f"{name}.packb")
    fn.linkage = "internal"
    ctx, lo, hi = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    src, dst = (b.load(elem(b, ctx, PTR, i), typ=PTR) for i in range(2))
    full = p.n // nr

    def copy(panel, k, j, guard: bool):
        col = b.add(b.mul(panel, i64(nr)), j)
        d = b.gep(dst, [b.add(b.mul(b.add(b.mul(panel, i64(p.k)), k), i64(nr)), j)],
                  inbounds=True, source_etype=el)
        if not guard:
            x = b.load(b.gep(src, [b.add(b.mul(k, i64(p.sb_k)), b.mul(col, i64(p.sb_n)))],
                             inbounds=True, source_etype=el), typ=el)
            b.store(x, d)
            return
        inside = b.icmp_signed("<", col, i64(p.n))
        safe = b.select(inside, col, i64(0))
        x = b.load(b.gep(src, [b.add(b.mul(k, i64(p.sb_k)), b.mul(safe, i64(p.sb_n)))],
                         inbounds=True, source_etype=el), typ=el)
        b.store(b.select(inside, x, ir.Constant(el, 0.0)), d)

    def panel(q):
        guard = b.icmp_signed(">=", q, i64(full))
        with b.if_else(guard) as (tail, whole):
            for g, blk in ((True, tail), (False, whole)):
                with blk:
                    if p.sb_n == 1 or p.sb_k != 1:  # rows of B are contiguous: k outer
                        loop(b, p.k, lambda k, g=g: loop(b, nr, lambda j: copy(q, k, j, g),
                                                           "j"), "k")
                    else:  # columns are contiguous (B transposed): j outer
                        loop(b, nr, lambda j, g=g: loop(b, p.k, lambda k: copy(q, k, j, g),
                                                         "k"), "j")

    _for(b, lo, hi, panel, "p")
    b.ret_void()
    return fn


def pack_a(mod: ir.Module, p: GemmProblem, mr: int, name: str) -> ir.Function:
    """`pack(src, dst, m, kk)`: A[m x kk] (m <= mc, runtime) into mr-row panels
    dst[panel][k][mr], zero padded past m."""
    el = S.REG[p.dtype]
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]),
                     f"{name}.packa")
    fn.linkage = "internal"
    src, dst, mm, kk = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    panels = b.sdiv(b.add(mm, i64(mr - 1)), i64(mr))

    def one(q, i, k):
        r = b.add(b.mul(q, i64(mr)), i64(i) if isinstance(i, int) else i)
        inside = b.icmp_signed("<", r, mm)
        safe = b.select(inside, r, i64(0))
        x = b.load(b.gep(src, [b.add(b.mul(safe, i64(p.sa_m)), b.mul(k, i64(p.sa_k)))],
                         inbounds=True, source_etype=el), typ=el)
        d = b.gep(dst, [b.add(b.mul(b.add(b.mul(q, kk), k), i64(mr)),
                              i64(i) if isinstance(i, int) else i)], inbounds=True,
                  source_etype=el)
        b.store(b.select(inside, x, ir.Constant(el, 0.0)), d)

    def body(q):
        if p.sa_k == 1:  # rows of A are contiguous: walk each row along k
            loop(b, mr, lambda i: _for(b, i64(0), kk, lambda k: one(q, i, k), "k"), "i")
        else:
            _for(b, i64(0), kk, lambda k: loop(b, mr, lambda i: one(q, i, k), "i"), "k")

    _for(b, i64(0), panels, body, "q")
    b.ret_void()
    return fn


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _for(b: ir.IRBuilder, lo, hi, body, name: str = "i") -> None:
    """for i in [lo, hi) with runtime bounds (top-tested)."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body_bb = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), body_bb, done)
    b.position_at_end(body_bb)
    body(i)
    i.add_incoming(b.add(i, i64(1)), b.block)
    b.branch(head)
    b.position_at_end(done)


@dataclass
class GemmProblem:
    """One (batch element's) C = A B: shapes, element strides, dtype."""

    m: int
    n: int
    k: int
    sa_m: int
    sa_k: int
    sb_k: int
    sb_n: int
    ldc: int
    dtype: str

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def plan_own(p: GemmProblem, isa: Isa, threads: int) -> dict:
    """How the own GEMM runs `p`: blocking, whether A/B are packed, threads, scratch bytes."""
    blk = blocking(isa, p.dtype, p.n)
    lanes = isa.lanes(p.dtype)
    nr = blk.nr(lanes)
    size = S.size(p.dtype)
    big = p.k * p.n * size > PACK_B_BYTES or p.m * p.k * size > PACK_A_BYTES
    pack_a_ = big
    pack_b_ = big or p.sb_n != 1 or p.n == 1 and p.sb_k != 1
    npanels = -(-p.n // nr)
    t = 1
    if pack_a_ and threads > 1 and p.flops >= THREAD_FLOPS:
        t = min(threads, -(-p.m // blk.mr))
    mc = blk.mc // blk.mr * blk.mr
    if t > 1:  # equal row blocks, a multiple of t of them
        blocks = t * _cdiv(p.m, t * mc)
        mc = _cdiv(_cdiv(p.m, blocks), blk.mr) * blk.mr
    scratch = (npanels * nr * p.k * size if pack_b_ else 0) + (
        t * mc * min(blk.kc, p.k) * size if pack_a_ else 0)
    return {"blk": blk, "nr": nr, "pack_a": pack_a_, "pack_b": pack_b_, "threads": t,
            "mc": mc, "scratch": scratch, "npanels": npanels}


def emit_own(b: ir.IRBuilder, p: GemmProblem, a, b_ptr, c, scratch, isa: Isa, threads: int,
             name: str, accumulate: bool = False) -> None:
    """C = A B (C += A B with `accumulate`) with the own GEMM; a, b_ptr, c are element
    pointers (already offset)."""
    mod = b.module
    plan = plan_own(p, isa, threads)
    blk, nr, dt = plan["blk"], plan["nr"], p.dtype
    lanes = isa.lanes(dt)
    el = S.REG[dt]
    if p.m == 0 or p.n == 0:
        return
    if p.k == 0:
        if accumulate:
            return
        loop(b, p.m, lambda i: loop(b, p.n, lambda j: S.store(
            b, c, dt, b.add(b.mul(i, i64(p.ldc)), j), S.const(dt, 0)), "j"), "i")
        return
    bsrc, b_rs = b_ptr, i64(p.sb_k)
    if plan["pack_b"]:
        packed = scratch
        ctx = stack_array(b, PTR, 2, "packctx")
        b.store(b_ptr, elem(b, ctx, PTR, 0))
        b.store(packed, elem(b, ctx, PTR, 1))
        tb = min(plan["threads"], plan["npanels"]) if p.k * p.n >= (1 << 16) else 1
        parallel_for(b, pack_b(mod, p, nr, name), ctx, plan["npanels"], tb, f"{name}.pb")
        bsrc, b_rs = packed, i64(nr)
        scratch = b.gep(scratch, [i64(plan["npanels"] * nr * p.k)], inbounds=True,
                        source_etype=el)
    n_full, n_tail = divmod(p.n, nr)
    col_kinds = [(0, n_full, blk.nv, lanes)] if n_full else []
    if n_tail:
        nv_t = -(-n_tail // lanes)
        col_kinds.append((n_full, 1, nv_t, n_tail - (nv_t - 1) * lanes))

    if not plan["pack_a"]:
        # straight on A: rows in blocks of mr, columns in blocks of nr, all of K at once
        m_full, m_tail = divmod(p.m, blk.mr)
        row_kinds = [(blk.mr, m_full, 0)] if m_full else []
        if m_tail:
            row_kinds.append((m_tail, 1, m_full * blk.mr))
        for jb0, jcount, nv, tail in col_kinds:
            for rows, mcount, mstart in row_kinds:
                uk = microkernel(mod, dt, lanes, rows, nv, tail)

                def tile(jb, i, uk=uk, rows=rows, mstart=mstart, jb0=jb0):
                    j0 = b.mul(b.add(jb, i64(jb0)), i64(nr))
                    if plan["pack_b"]:
                        bp = b.gep(bsrc, [b.mul(b.add(jb, i64(jb0)), i64(nr * p.k))],
                                   inbounds=True, source_etype=el)
                    else:
                        bp = b.gep(bsrc, [b.mul(j0, i64(p.sb_n))], inbounds=True,
                                   source_etype=el)
                    r = b.add(i64(mstart), b.mul(i, i64(rows)))
                    ap = b.gep(a, [b.mul(r, i64(p.sa_m))], inbounds=True, source_etype=el)
                    cp = b.gep(c, [b.add(b.mul(r, i64(p.ldc)), j0)], inbounds=True,
                               source_etype=el)
                    b.call(uk, [ap, i64(p.sa_m), i64(p.sa_k), bp, b_rs, cp, i64(p.ldc),
                                i64(p.k), ir.Constant(I1, int(accumulate))])

                loop(b, jcount, lambda jb, tile=tile, mcount=mcount: loop(
                    b, mcount, lambda i: tile(jb, i), name="mt"), name="nt")
        return

    # packed A: threads take row blocks of mc; each packs its own A blocks per k block
    t, mc, kc = plan["threads"], plan["mc"], min(blk.kc, p.k)
    n_mblocks = -(-p.m // mc)
    body = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), f"{name}.gemm")
    body.linkage = "internal"
    ctx, lo, hi = body.args
    bb = ir.IRBuilder(body.append_basic_block("entry"))
    ta, tb_, tc, tscr = [bb.load(bb.gep(ctx, [i64(i)], inbounds=True, source_etype=PTR),
                                 typ=PTR) for i in range(4)]
    # this thread's A buffer: chunk c of t starts at block floor(c * n / t)
    chunk = (bb.sdiv(bb.add(bb.mul(lo, i64(t)), i64(n_mblocks - 1)), i64(n_mblocks))
             if t > 1 else i64(0))
    abuf = bb.gep(tscr, [bb.mul(chunk, i64(mc * kc))], inbounds=True, source_etype=el)
    pa = pack_a(mod, p, blk.mr, name)
    m_tail = p.m % blk.mr  # mc is a multiple of mr: only the last block has a partial panel

    def kblock(i0, mrows, k0, kk):
        """One kk-deep slice (k0 runtime, kk constant) of row block i0 (mrows rows)."""
        src = bb.gep(ta, [bb.add(bb.mul(i0, i64(p.sa_m)), bb.mul(k0, i64(p.sa_k)))],
                     inbounds=True, source_etype=el)
        bb.call(pa, [src, abuf, mrows, i64(kk)])
        full = bb.sdiv(mrows, i64(blk.mr))
        rest = bb.srem(mrows, i64(blk.mr))
        acc = (ir.Constant(I1, 1) if accumulate else bb.icmp_signed(">", k0, i64(0)))
        for jb0, jcount, nv, tail in col_kinds:
            uk = microkernel(mod, dt, lanes, blk.mr, nv, tail)
            uk_t = microkernel(mod, dt, lanes, m_tail, nv, tail) if m_tail else None

            def panel(jb, uk=uk, uk_t=uk_t, jb0=jb0):
                jp = bb.add(jb, i64(jb0))
                bpp = bb.gep(tb_, [bb.add(bb.mul(jp, i64(nr * p.k)), bb.mul(k0, i64(nr)))],
                             inbounds=True, source_etype=el)
                j0 = bb.mul(jp, i64(nr))

                def call(kernel, r):
                    ap = bb.gep(abuf, [bb.mul(r, i64(blk.mr * kk))], inbounds=True,
                                source_etype=el)
                    row = bb.add(i0, bb.mul(r, i64(blk.mr)))
                    cp = bb.gep(tc, [bb.add(bb.mul(row, i64(p.ldc)), j0)], inbounds=True,
                                source_etype=el)
                    bb.call(kernel, [ap, i64(1), i64(blk.mr), bpp, i64(nr), cp, i64(p.ldc),
                                     i64(kk), acc])

                _for(bb, i64(0), full, lambda r: call(uk, r), "r")
                if uk_t is not None:
                    with bb.if_then(bb.icmp_signed("!=", rest, i64(0))):
                        call(uk_t, full)

            loop(bb, jcount, panel, name="jp")

    def mblock(ib):
        i0 = bb.mul(ib, i64(mc))
        mrows = bb.select(bb.icmp_signed("<", bb.add(i0, i64(mc)), i64(p.m)), i64(mc),
                          bb.sub(i64(p.m), i0))
        k_full, k_tail = divmod(p.k, kc)
        loop(bb, k_full, lambda kb: kblock(i0, mrows, bb.mul(kb, i64(kc)), kc), name="kb")
        if k_tail:
            kblock(i0, mrows, i64(k_full * kc), k_tail)

    _for(bb, lo, hi, mblock, "ib")
    bb.ret_void()
    ctx_arr = stack_array(b, PTR, 4, "ctx")
    for i, v in enumerate((a, bsrc, c, scratch)):
        b.store(v, elem(b, ctx_arr, PTR, i))
    parallel_for(b, body, ctx_arr, n_mblocks, min(t, n_mblocks), name)
