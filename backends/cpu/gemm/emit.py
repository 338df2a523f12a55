"""Matrix multiply: ember's own packed, register-blocked GEMM, or a call into OpenBLAS.

The own GEMM is generated for the host's vector width (AVX-512: 16 f32 lanes, 32
registers; AVX2/NEON/SSE: 8 or 4 lanes, 16 registers). Its micro-kernel keeps an
`mr x (nv * lanes)` tile of C in registers (6 x 64 on AVX-512) and, for each k, loads
`nv` vectors of B and broadcasts `mr` elements of A into fused multiply-adds. Operands
are read through strides, so transposed A costs nothing and transposed B is packed:
- small problems run the micro-kernel straight on A, and on B unless B is transposed or
  reused enough that its rows (a power-of-two stride apart) would alias in L1: then B
  is packed into `nr`-wide panels first;
- large ones block K (`kc`) and M (`mc` rows, as many as fit their share of the host's L2,
  host.host_caches) and pack B; A is read in place, its `mc x kc` block staying in L2
  while B's panels stream past it. The micro-kernel's broadcasts load A's elements
  straight from memory, which reads well both ways round (`mr` rows walked along k, or,
  A transposed, `mr` adjacent elements per k), so A is never packed: a packing copy
  cost 10-25% of the multiply when N is narrow (N = 128: 256 flops per copied element)
  and 5% at 512^3 on a znver4, more than its contiguous panels saved.
Threads split the rows of C (B packed by all first) or, when C is wider than tall, its
column panels (each thread packs its own B panels), so a GEMM is one or two parallel
regions. Edges take the same micro-kernel with a run-time row count and column mask: no
size needs padding, and compile time stays low. `C` is row-major with unit column stride
and leading dimension `ldc`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from llvmlite import ir

from ...strides import cdiv
from ..kernels import scalar as S
from ..kernels.loops import carried, for_range, loop
from ..kernels.scalar import I32, I64, PTR, i64
from ..machine.host import Caches, Isa, host_caches
from ..parallel.outline import elem, parallel_for, stack_array

I1 = ir.IntType(1)


# above these, K and M are blocked and B is packed (cache blocking pays for the copies) ...
PACK_B_BYTES = 256 << 10
BLOCK_A_BYTES = 512 << 10
# ... and the rows of C are split across threads
THREAD_FLOPS = 4 << 20  # ~40 us on one core (below, the pool's hand-off and spinning cost more)
# k per packed block: B's kc x nr micro-panel streams from L2 (64 KiB on AVX-512, over any
# L1d), so L1 does not bound kc, and at 256 C's loads and stores are amortized (kc from 128
# to 512 measured within 3% of each other on a znver4)
KC = 256
# the micro-kernel prefetches A this many k steps ahead: A transposed (a weight gradient
# X^T dY) is read down its columns, a row a large stride apart per k, which the hardware
# prefetchers (within a 4 KiB page) do not follow, so from DRAM each k waited for memory
PREFETCH_K = 16
# A's mc x kc block (read in place, re-read for every column panel) takes a quarter of L2:
# on a znver4's 1 MiB, 2 threads, a half or all of it measured the same, an eighth 5% slower
# on 512 x 128 x 2048 and 512^3 (each row block streams B's kc x N block past it again);
# and it has at least MC_MIN rows
A_BLOCK_L2 = 4
MC_MIN = 72


@dataclass(frozen=True)
class Blocking:
    mr: int
    nv: int   # vectors per row of the C tile
    kc: int
    mc: int

    def nr(self, lanes: int) -> int:
        return self.nv * lanes


def blocking(isa: Isa, dtype: str, n: int, caches: Caches | None = None) -> Blocking:
    """Register and cache blocking: as many accumulators as registers allow, fewer
    vectors per row when N is narrow; A's blocks as many rows as fit their share of L2."""
    lanes = isa.lanes(dtype)
    nv_max = 4 if isa.regs >= 32 else 2
    nv = max(1, min(nv_max, -(-n // lanes)))
    acc_regs = isa.regs - nv - 2
    mr = max(1, min(14 if isa.regs >= 32 else 6, acc_regs // nv))
    l2 = (caches or host_caches()).l2
    return Blocking(mr, nv, KC, max(MC_MIN, l2 // A_BLOCK_L2 // (KC * S.size(dtype))))


def _vec(dtype: str, lanes: int) -> ir.VectorType:
    return ir.VectorType(S.REG[dtype], lanes)


def microkernel(mod: ir.Module, dtype: str, lanes: int, mr: int, nv: int, masked_b: bool,
                unroll: int = 1, prefetch_a: bool = False) -> ir.Function:
    """`uk(a, a_rs, a_cs, b, b_rs, c, ldc, kc, accumulate, rows, cols)`: C[rows x cols]
    (+)= A B over kc, rows <= mr and (nv-1)*lanes < cols <= nv*lanes, with
    A[i,k] = a[i*a_rs + k*a_cs] and B[k,j] = b[k*b_rs + j]. Rows past `rows` recompute
    the last valid row (never read out of bounds) and are not stored; the last vector of
    each row is stored under a mask, and B's last vector is loaded under one when
    `masked_b` (else B must be readable up to nv*lanes, as packed panels are). One
    micro-kernel per shape class serves every edge, which keeps compile time down. The k
    loop is not unrolled: measured, unrolling it 2 or 4 times gained nothing (the
    out-of-order core overlaps iterations) and doubled the micro-kernel's compile time.
    `prefetch_a`: A is read down its columns (see PREFETCH_K)."""
    name = (f"ember.uk.{dtype}.{lanes}x{mr}x{nv}{'m' if masked_b else ''}"
            f"{'p' if prefetch_a else ''}")
    if name in mod.globals:
        return mod.globals[name]
    el = S.REG[dtype]
    vt = _vec(dtype, lanes)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR, I64, PTR, I64,
                                                          I64, I1, I64, I64]), name)
    fn.linkage = "internal"
    for a in (0, 3, 5):
        fn.args[a].add_attribute("noalias")
    a, a_rs, a_cs, bp, b_rs, c, ldc, kc, accum, rows, cols = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = S.declare(mod, f"llvm.fma.v{lanes}{dtype}", vt, [vt, vt, vt])
    zero = ir.Constant(vt, None)
    undef = ir.Constant(vt, ir.Undefined)
    splat_mask = ir.Constant(ir.VectorType(I32, lanes), [ir.Constant(I32, 0)] * lanes)
    last = b.sub(rows, i64(1))
    row_off = [b.mul(b.select(b.icmp_signed("<", i64(i), rows), i64(i), last), a_rs)
               for i in range(mr)]
    # lanes of the last vector that are columns: iota + (nv-1)*lanes < cols
    iota = ir.Constant(ir.VectorType(I64, lanes), [i64((nv - 1) * lanes + i)
                                                   for i in range(lanes)])
    cvec = b.shuffle_vector(b.insert_element(ir.Constant(ir.VectorType(I64, lanes),
                                                         ir.Undefined), cols, i64(0)),
                            ir.Constant(ir.VectorType(I64, lanes), ir.Undefined), splat_mask)
    mask = b.icmp_signed("<", iota, cvec)

    def vload(ptr, masked):
        if masked:
            return _masked_rt(b, "load", dtype, lanes, mask, ptr)
        return b.load(ptr, typ=vt, align=S.size(dtype))

    if prefetch_a:  # A's elements PREFETCH_K steps on: first and last row (no fault)
        prefetch = S.declare(mod, "llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        ahead = [b.add(row_off[i], b.mul(i64(PREFETCH_K), a_cs)) for i in (0, mr - 1)]

    def step(k, accs):
        if prefetch_a:
            for off in ahead:
                b.call(prefetch, [b.gep(a, [b.add(off, b.mul(k, a_cs))], source_etype=el),
                                  ir.Constant(I32, 0), ir.Constant(I32, 3),
                                  ir.Constant(I32, 1)])
        boff = b.mul(k, b_rs)
        bv = [vload(b.gep(bp, [b.add(boff, i64(v * lanes))], inbounds=True, source_etype=el),
                    masked_b and v == nv - 1) for v in range(nv)]
        koff = b.mul(k, a_cs)
        out = []
        for i in range(mr):
            x = b.load(b.gep(a, [b.add(row_off[i], koff)], inbounds=True, source_etype=el),
                       typ=el)
            xs = b.shuffle_vector(b.insert_element(undef, x, i64(0)), undef, splat_mask)
            out.append([b.call(fma, [xs, bv[v], accs[i][v]]) for v in range(nv)])
        return out

    def counted(start, end, stride, accs, label):
        """for k in [start, end) step stride, the accumulators as phis."""
        def unrolled(k, flat):
            cur = [flat[i * nv:(i + 1) * nv] for i in range(mr)]
            for u in range(stride):
                cur = step(b.add(k, i64(u)), cur)
            return [x for row in cur for x in row]

        k, flat = carried(b, start, end, [x for row in accs for x in row], unrolled, stride,
                          label)
        return k, [flat[i * nv:(i + 1) * nv] for i in range(mr)]

    accs = [[zero] * nv for _ in range(mr)]
    k, accs = counted(i64(0), kc, unroll, accs, "main")
    if unroll > 1:
        k, accs = counted(k, kc, 1, accs, "rest")

    def store_row(i):
        crow = b.mul(i64(i), ldc)
        for v in range(nv):
            p = b.gep(c, [b.add(crow, i64(v * lanes))], inbounds=True, source_etype=el)
            masked = v == nv - 1
            with b.if_else(accum) as (add, put):
                with add:
                    old = (_masked_rt(b, "load", dtype, lanes, mask, p) if masked
                           else b.load(p, typ=vt, align=S.size(dtype)))
                    new = b.fadd(accs[i][v], old)
                    if masked:
                        _masked_rt(b, "store", dtype, lanes, mask, p, new)
                    else:
                        b.store(new, p, align=S.size(dtype))
                with put:
                    if masked:
                        _masked_rt(b, "store", dtype, lanes, mask, p, accs[i][v])
                    else:
                        b.store(accs[i][v], p, align=S.size(dtype))

    for i in range(mr):
        if i == 0:
            store_row(0)
        else:
            with b.if_then(b.icmp_signed("<", i64(i), rows)):
                store_row(i)
    b.ret_void()
    return fn


def _masked_rt(b: ir.IRBuilder, kind: str, dtype: str, lanes: int, mask, ptr, value=None):
    """A masked vector load or store with a mask computed at run time."""
    vt = _vec(dtype, lanes)
    mt = ir.VectorType(I1, lanes)
    suffix = f"v{lanes}{dtype}.p0"
    if kind == "load":
        fn = S.declare(b.module, f"llvm.masked.load.{suffix}", vt, [PTR, I32, mt, vt])
        return b.call(fn, [ptr, ir.Constant(I32, S.size(dtype)), mask, ir.Constant(vt, None)])
    fn = S.declare(b.module, f"llvm.masked.store.{suffix}", ir.VoidType(), [vt, PTR, I32, mt])
    return b.call(fn, [value, ptr, ir.Constant(I32, S.size(dtype)), mask])


def _transpose(b: ir.IRBuilder, rows: list) -> list:
    """The L x L block rows[j][k] (L vectors of L lanes, L a power of two) as cols[k][j]:
    per bit s, elements (j, k + s) and (j + s, k) with that bit clear in j and k trade
    places, one two-input shuffle per vector."""
    n = len(rows)
    s = 1
    while s < n:
        lo = ir.Constant(ir.VectorType(I32, n), [k if not k & s else n + k - s
                                                 for k in range(n)])
        hi = ir.Constant(ir.VectorType(I32, n), [k + s if not k & s else n + k
                                                 for k in range(n)])
        out = list(rows)
        for j in range(n):
            if not j & s:
                out[j] = b.shuffle_vector(rows[j], rows[j | s], lo)
                out[j | s] = b.shuffle_vector(rows[j], rows[j | s], hi)
        rows, s = out, 2 * s
    return rows


def pack_b(mod: ir.Module, p: GemmProblem, nr: int, lanes: int, name: str) -> ir.Function:
    """`pack(ctx = [src, dst], lo, hi)`: B's column panels lo..hi (each K x nr, zero
    padded past N) into dst[panel][k][nr]; strides are constants, so the copy along the
    unit-stride side vectorizes, and a transposed B's whole panels go lanes x lanes blocks
    at a time through registers (vector loads and stores both; copied element by element
    they cost 15% of a 128 x 512 x 512 multiply on a znver4). Shaped as a `parallel_for`
    body."""
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

    vt = _vec(p.dtype, lanes)

    def block(q, kb, jb):
        """lanes x lanes of a transposed B: vectors down its columns, stored as rows."""
        j0 = b.add(b.mul(q, i64(nr)), b.mul(jb, i64(lanes)))
        k0 = b.mul(kb, i64(lanes))
        rows = [b.load(b.gep(src, [b.add(b.mul(b.add(j0, i64(j)), i64(p.sb_n)), k0)],
                             inbounds=True, source_etype=el), typ=vt, align=S.size(p.dtype))
                for j in range(lanes)]
        for k, v in enumerate(_transpose(b, rows)):
            row = b.add(b.mul(q, i64(p.k)), b.add(k0, i64(k)))
            d = b.gep(dst, [b.add(b.mul(row, i64(nr)), b.mul(jb, i64(lanes)))],
                      inbounds=True, source_etype=el)
            b.store(v, d, align=S.size(p.dtype))

    def transposed(q):
        kv = p.k // lanes
        loop(b, kv, lambda kb: loop(b, nr // lanes, lambda jb: block(q, kb, jb), "jb"), "kb")
        loop(b, p.k - kv * lanes, lambda k: loop(
            b, nr, lambda j: copy(q, b.add(k, i64(kv * lanes)), j, False), "j"), "k")

    def panel(q):
        guard = b.icmp_signed(">=", q, i64(full))
        with b.if_else(guard) as (tail, whole):
            for g, blk in ((True, tail), (False, whole)):
                with blk:
                    if not g and p.sb_k == 1 and p.sb_n != 1:
                        transposed(q)
                    elif p.sb_n == 1 or p.sb_k != 1:  # rows of B are contiguous: k outer
                        loop(b, p.k, lambda k, g=g: loop(b, nr, lambda j: copy(q, k, j, g),
                                                           "j"), "k")
                    else:  # columns are contiguous (B transposed): j outer
                        loop(b, nr, lambda j, g=g: loop(b, p.k, lambda k: copy(q, k, j, g),
                                                         "k"), "j")

    for_range(b, lo, hi, panel, "p")
    b.ret_void()
    return fn


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
    # an epilogue follows each block of rows a thread finishes (`RowsDone`): threads then
    # split the rows rather than the columns wherever both would do
    finish_rows: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def plan_own(p: GemmProblem, isa: Isa, threads: int) -> dict:
    """How the own GEMM runs `p`: blocking, whether B is packed, how threads split the
    work ("m": row blocks, B packed first by all threads; "n": column panels, each thread
    packs its own panels of B and reads all of A), and the scratch bytes. With A not
    blocked either split does, and a GEMM whose rows an epilogue follows (`p.finish_rows`)
    splits the rows, so that each thread runs the epilogue on rows still in its cache: for
    the SGD update of a 784 x 512 weight gradient (K 128) the columns' split left the
    update to a second pass over 1.6 MB, and the MLP 784-512-512-10 step took 8% longer."""
    caches = host_caches()
    blk = blocking(isa, p.dtype, p.n, caches)
    lanes = isa.lanes(p.dtype)
    nr = blk.nr(lanes)
    size = S.size(p.dtype)
    blocked = p.k * p.n * size > PACK_B_BYTES or p.m * p.k * size > BLOCK_A_BYTES
    # B's rows a large power-of-two stride apart alias in L1: pack B when it is reused
    pack_b_ = blocked or p.sb_n != 1 or (p.m >= 8 * blk.mr and p.k * p.n * size > caches.l1d)
    npanels = cdiv(p.n, nr)
    split, t = "m", 1
    if threads > 1 and p.flops >= THREAD_FLOPS:
        if not blocked and not pack_b_:
            t = min(threads, cdiv(p.m, blk.mr))
        elif (p.m < p.n or not blocked) and npanels >= 2 and not (
                p.finish_rows and not blocked and cdiv(p.m, blk.mr) >= threads):
            split, t = "n", min(threads, npanels)
        else:
            t = min(threads, cdiv(p.m, blk.mr))
    mc = blk.mc // blk.mr * blk.mr
    if blocked:  # equal row blocks (512: 174 + 174 + 164, not 252 + 252 + 8)
        tm = t if split == "m" else 1  # and a multiple of t of them when threads split rows
        mc = cdiv(cdiv(p.m, tm * cdiv(p.m, tm * mc)), blk.mr) * blk.mr
    kc = min(blk.kc, p.k)
    # one thread, one block of rows (a slice of a weight gradient's long K, M small): B is
    # packed a kc-deep block at a time, just before its one use, and stays in L2; packed
    # whole (K x N, 2 MB for 1024 x 512) it was written past L2: 128 x 512 x 1024 ran at
    # 122 GFLOP/s on one core, 151 packed by blocks (150 at K = 128)
    per_k = pack_b_ and blocked and t == 1 and p.m <= mc
    scratch = npanels * nr * (kc if per_k else p.k) * size if pack_b_ else 0
    return {"blk": blk, "nr": nr, "blocked": blocked, "pack_b": pack_b_, "threads": t,
            "split": split, "mc": mc, "kc": kc, "scratch": scratch, "npanels": npanels,
            "pack_per_k": per_k}


@dataclass
class RowsDone:
    """What runs on rows [r0, r1) of C as soon as the thread that computed them has
    finished them (the matmul's epilogue, while the rows are still in its cache):
    `emit(builder, pointers, r0, r1)`, with `pointers` passed through to the threads."""

    pointers: list
    emit: Callable[[ir.IRBuilder, list, ir.Value, ir.Value], None]


def finishes_rows(p: GemmProblem, isa: Isa, threads: int) -> bool:
    """Whether each thread of the own GEMM finishes whole rows of C (all of N) in turn, so
    that a `RowsDone` can follow each block of rows: not when threads split the columns."""
    plan = plan_own(p, isa, threads)
    return p.m > 0 and p.n > 0 and p.k > 0 and (plan["split"] == "m" or plan["threads"] == 1)


def emit_own(b: ir.IRBuilder, p: GemmProblem, a, b_ptr, c, scratch, isa: Isa, threads: int,
             name: str, accumulate: bool = False, rows_done: RowsDone | None = None) -> None:
    """C = A B (C += A B with `accumulate`) with the own GEMM; a, b_ptr, c are element
    pointers (already offset). `rows_done` (where `finishes_rows`) follows every finished
    block of rows."""
    mod = b.module
    plan = plan_own(p, isa, threads)
    extra = rows_done.pointers if rows_done else []
    blk, nr, dt = plan["blk"], plan["nr"], p.dtype
    lanes = isa.lanes(dt)
    el = S.REG[dt]
    if p.m == 0 or p.n == 0:
        return
    if p.k == 0:
        if not accumulate:
            loop(b, p.m, lambda i: loop(b, p.n, lambda j: S.store(
                b, c, dt, b.add(b.mul(i, i64(p.ldc)), j), S.const(dt, 0)), "j"), "i")
        return
    t, split = plan["threads"], plan["split"]
    n_full, n_tail = divmod(p.n, nr)
    packed_b = scratch
    per_k = plan["pack_per_k"]
    packb = pack_b(mod, p, nr, lanes, name) if plan["pack_b"] and not per_k else None
    if packb is not None and not (split == "n" and t > 1):
        ctx = stack_array(b, PTR, 2, "packctx")
        b.store(b_ptr, elem(b, ctx, PTR, 0))
        b.store(packed_b, elem(b, ctx, PTR, 1))
        tb = min(t, plan["npanels"]) if p.k * p.n >= (1 << 16) else 1
        parallel_for(b, packb, ctx, plan["npanels"], tb, f"{name}.pb")
    # straight on A the row blocks are evened out (16 rows: 8 + 8, not 14 + a 2-row block
    # that computes 14); blocked, they are mr rows
    mr = blk.mr if plan["blocked"] else cdiv(p.m, cdiv(p.m, blk.mr))
    transposed_a = p.sa_k != 1 and p.k > 1
    uk_full = microkernel(mod, dt, lanes, mr, blk.nv, False, prefetch_a=transposed_a)
    nv_t = cdiv(n_tail, lanes) if n_tail else 0
    uk_tail = (microkernel(mod, dt, lanes, mr, nv_t, not plan["pack_b"], prefetch_a=transposed_a)
               if n_tail else None)

    def panels(bb, p0, p1, call):
        """call(kernel, panel index, columns) for column panels [p0, p1)."""
        def one(jp):
            if not n_tail:
                call(uk_full, jp, nr)
                return
            with bb.if_else(bb.icmp_signed("<", jp, i64(n_full))) as (full, tail):
                with full:
                    call(uk_full, jp, nr)
                with tail:
                    call(uk_tail, jp, n_tail)
        for_range(bb, p0, p1, one, "jp")

    body = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), f"{name}.gemm")
    body.linkage = "internal"
    ctx, lo, hi = body.args
    bb = ir.IRBuilder(body.append_basic_block("entry"))
    ta, tsrc, tb_, tc, *t_extra = [bb.load(elem(bb, ctx, PTR, i), typ=PTR)
                                   for i in range(4 + len(extra))]

    def finished(r0, r1):
        if rows_done is not None:
            rows_done.emit(bb, t_extra, r0, r1)
    b_rs = i64(nr) if plan["pack_b"] else i64(p.sb_k)

    def bpanel(jp, k0, kk):
        if per_k:  # the kk-deep block just packed
            return bb.gep(tb_, [bb.mul(jp, i64(nr * kk))], inbounds=True, source_etype=el)
        if plan["pack_b"]:
            return bb.gep(tb_, [bb.add(bb.mul(jp, i64(nr * p.k)), bb.mul(k0, i64(nr)))],
                          inbounds=True, source_etype=el)
        return bb.gep(tsrc, [bb.add(bb.mul(bb.mul(jp, i64(nr)), i64(p.sb_n)),
                                    bb.mul(k0, i64(p.sb_k)))], inbounds=True, source_etype=el)

    if split == "n" and t > 1:  # each thread packs the B panels it multiplies
        pctx = stack_array(bb, PTR, 2, "packctx")
        bb.store(tsrc, elem(bb, pctx, PTR, 0))
        bb.store(tb_, elem(bb, pctx, PTR, 1))
        bb.call(packb, [pctx, lo, hi])
    p0, p1 = (lo, hi) if split == "n" else (i64(0), i64(plan["npanels"]))
    if not plan["blocked"]:
        # straight on A, all of K at once; threads take row blocks or column panels
        m_blocks = cdiv(p.m, mr)

        def rowblock(ib):
            r0 = bb.mul(ib, i64(mr))
            rows = bb.select(bb.icmp_signed("<", bb.add(r0, i64(mr)), i64(p.m)),
                             i64(mr), bb.sub(i64(p.m), r0))
            ap = bb.gep(ta, [bb.mul(r0, i64(p.sa_m))], inbounds=True, source_etype=el)

            def call(uk, jp, cols):
                cp = bb.gep(tc, [bb.add(bb.mul(r0, i64(p.ldc)), bb.mul(jp, i64(nr)))],
                            inbounds=True, source_etype=el)
                bb.call(uk, [ap, i64(p.sa_m), i64(p.sa_k), bpanel(jp, i64(0), p.k), b_rs, cp,
                             i64(p.ldc), i64(p.k), ir.Constant(I1, int(accumulate)), rows,
                             i64(cols)])

            panels(bb, p0, p1, call)
            finished(r0, bb.add(r0, rows))

        if split == "n":
            for_range(bb, i64(0), i64(m_blocks), rowblock, "ib")
            items = plan["npanels"]
        else:
            for_range(bb, lo, hi, rowblock, "ib")
            items = m_blocks
    else:
        mc, kc = plan["mc"], plan["kc"]
        n_mblocks = cdiv(p.m, mc)
        items = n_mblocks if split == "m" else plan["npanels"]

        if per_k:  # B's kc-deep blocks packed as they come: kc, and K's remainder
            pack_k = {kk: pack_b(mod, replace(p, k=kk), nr, lanes, f"{name}.k{kk}")
                      for kk in {plan["kc"], p.k % plan["kc"]} if kk}
            kctx = stack_array(bb, PTR, 2, "packctx")
            bb.store(tb_, elem(bb, kctx, PTR, 1))

        def kblock(i0, mrows, k0, kk):
            """One kk-deep slice (k0 runtime, kk constant) of row block i0."""
            src = bb.gep(ta, [bb.add(bb.mul(i0, i64(p.sa_m)), bb.mul(k0, i64(p.sa_k)))],
                         inbounds=True, source_etype=el)
            if per_k:
                bb.store(bb.gep(tsrc, [bb.mul(k0, i64(p.sb_k))], inbounds=True,
                                source_etype=el), elem(bb, kctx, PTR, 0))
                bb.call(pack_k[kk], [kctx, i64(0), i64(plan["npanels"])])
            n_rb = bb.sdiv(bb.add(mrows, i64(blk.mr - 1)), i64(blk.mr))
            acc = ir.Constant(I1, 1) if accumulate else bb.icmp_signed(">", k0, i64(0))

            def call(uk, jp, cols):
                bpp = bpanel(jp, k0, kk)

                def rb(r):
                    ap = bb.gep(src, [bb.mul(r, i64(blk.mr * p.sa_m))], inbounds=True,
                                source_etype=el)
                    row = bb.add(i0, bb.mul(r, i64(blk.mr)))
                    rows = bb.sub(mrows, bb.mul(r, i64(blk.mr)))
                    rows = bb.select(bb.icmp_signed("<", rows, i64(blk.mr)), rows,
                                     i64(blk.mr))
                    cp = bb.gep(tc, [bb.add(bb.mul(row, i64(p.ldc)), bb.mul(jp, i64(nr)))],
                                inbounds=True, source_etype=el)
                    bb.call(uk, [ap, i64(p.sa_m), i64(p.sa_k), bpp, i64(nr), cp, i64(p.ldc),
                                 i64(kk), acc, rows, i64(cols)])

                for_range(bb, i64(0), n_rb, rb, "r")

            panels(bb, p0, p1, call)

        def mblock(ib):
            i0 = bb.mul(ib, i64(mc))
            mrows = bb.select(bb.icmp_signed("<", bb.add(i0, i64(mc)), i64(p.m)), i64(mc),
                              bb.sub(i64(p.m), i0))
            k_full, k_tail = divmod(p.k, kc)
            loop(bb, k_full, lambda kb: kblock(i0, mrows, bb.mul(kb, i64(kc)), kc), "kb")
            if k_tail:
                kblock(i0, mrows, i64(k_full * kc), k_tail)
            finished(i0, bb.add(i0, mrows))

        if split == "m":
            for_range(bb, lo, hi, mblock, "ib")
        else:
            for_range(bb, i64(0), i64(n_mblocks), mblock, "ib")
    bb.ret_void()
    ctx_arr = stack_array(b, PTR, 4 + len(extra), "ctx")
    for i, v in enumerate((a, b_ptr, packed_b, c, *extra)):
        b.store(v, elem(b, ctx_arr, PTR, i))
    parallel_for(b, body, ctx_arr, items, min(t, items), name)
