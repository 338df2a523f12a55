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
A B that stays the same from call to call (an inference graph's weight) may come packed
already (`GemmProblem.prepacked`, `pack_function`): the GEMM then reads its panels and
packs nothing.
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
from ..kernels.loops import for_range, loop
from ..kernels.scalar import I64, PTR, i64
from ..machine.host import Caches, Isa, host_caches
from ..parallel.outline import elem, parallel_for, stack_array
from .microkernel import I1, GemmProblem, microkernel, pack_b

# above these, K and M are blocked and B is packed (cache blocking pays for the copies) ...
PACK_B_BYTES = 256 << 10
BLOCK_A_BYTES = 512 << 10
# ... and the rows of C are split across threads
# (~5 us on one core; the pool's hand-off to a spinning worker costs ~1 us: at 4 MFLOP, C
# 3136 x 72 (K 16) and 196 x 240 (K 40) ran on one core 1.5-1.6x as long as on two)
THREAD_FLOPS = 1 << 20
# k per packed block: B's kc x nr micro-panel streams from L2 (64 KiB on AVX-512, over any
# L1d), so L1 does not bound kc, and at 256 C's loads and stores are amortized (kc from 128
# to 512 measured within 3% of each other on a znver4)
KC = 256
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


@dataclass(frozen=True)
class OwnPlan:
    """How the own GEMM runs one problem (`plan_own`)."""

    blk: Blocking
    nr: int            # columns per panel of B and C (blk.nv vectors)
    blocked: bool      # K blocked by kc and M by mc (else all of K, straight on A)
    pack_b: bool       # B packed into nr-wide panels (else read in place)
    threads: int       # threads the work is split over
    split: str         # what they split: "m" row blocks, "n" column panels
    mc: int            # rows per block of A, a multiple of blk.mr (when blocked)
    kc: int            # depth of a slice of K (when blocked)
    scratch: int       # bytes of packed B
    npanels: int       # column panels: cdiv(N, nr)
    pack_per_k: bool   # B packed a kc-deep slice at a time, just before its use


def plan_own(p: GemmProblem, isa: Isa, threads: int) -> OwnPlan:
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
    pack_b_ = p.prepacked or blocked or p.sb_n != 1 or (
        p.m >= 8 * blk.mr and p.k * p.n * size > caches.l1d)
    npanels = cdiv(p.n, nr)
    split, t = "m", 1
    mblocks = cdiv(p.m, blk.mr)
    if threads > 1 and p.flops >= THREAD_FLOPS:
        if not blocked and not pack_b_:
            t = min(threads, mblocks)
        elif (p.m < p.n or not blocked) and npanels >= 2 and not (
                p.finish_rows and not blocked and mblocks >= threads) and not (
                not blocked and _busiest(p.m, blk.mr, threads) < _busiest(p.n, nr, threads)):
            split, t = "n", min(threads, npanels)
        else:
            t = min(threads, mblocks)
    mc = blk.mc // blk.mr * blk.mr
    if blocked:  # equal row blocks (512: 174 + 174 + 164, not 252 + 252 + 8)
        tm = t if split == "m" else 1  # and a multiple of t of them when threads split rows
        mc = cdiv(cdiv(p.m, tm * cdiv(p.m, tm * mc)), blk.mr) * blk.mr
    kc = min(blk.kc, p.k)
    # one thread, one block of rows (a slice of a weight gradient's long K, M small): B is
    # packed a kc-deep block at a time, just before its one use, and stays in L2; packed
    # whole (K x N, 2 MB for 1024 x 512) it was written past L2: 128 x 512 x 1024 ran at
    # 122 GFLOP/s on one core, 151 packed by blocks (150 at K = 128)
    per_k = pack_b_ and blocked and t == 1 and p.m <= mc and not p.prepacked
    scratch = npanels * nr * (kc if per_k else p.k) * size if pack_b_ and not p.prepacked else 0
    return OwnPlan(blk=blk, nr=nr, blocked=blocked, pack_b=pack_b_, threads=t, split=split,
                   mc=mc, kc=kc, scratch=scratch, npanels=npanels, pack_per_k=per_k)


def _busiest(size: int, unit: int, threads: int) -> float:
    """The share of `size` rows (or columns) that the busiest of `threads` threads
    computes when they split them in blocks of `unit` (C 3136 x 72 by 64-wide panels:
    one thread 64 columns, the other 8; by 14-row blocks, 1568 rows each)."""
    blocks = cdiv(size, unit)
    return min(size, cdiv(blocks, min(threads, blocks)) * unit) / size


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
    return p.m > 0 and p.n > 0 and p.k > 0 and (plan.split == "m" or plan.threads == 1)


def packs_b(p: GemmProblem, isa: Isa, threads: int) -> bool:
    """Whether the own GEMM of `p` packs B: then a B that stays the same from call to call
    (a weight) may come packed already (`GemmProblem.prepacked`, `pack_function`)."""
    return p.m > 0 and p.n > 0 and p.k > 0 and plan_own(p, isa, threads).pack_b


def pack_function(mod: ir.Module, p: GemmProblem, isa: Isa, threads: int,
                  name: str) -> ir.Function:
    """`name(ptr b, ptr packed)`: all of B into the panels the GEMM of `p` reads when B
    comes `prepacked` (K x nr each, zero padded past N), on up to `threads` threads."""
    plan = plan_own(replace(p, prepacked=True), isa, threads)
    packb = pack_b(mod, p, plan.nr, isa.lanes(p.dtype), name)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    _pack_panels(b, packb, *fn.args, p, plan.npanels, threads, name)
    b.ret_void()
    return fn


def _pack_panels(b: ir.IRBuilder, packb: ir.Function, b_ptr, packed_b, p: GemmProblem,
                 npanels: int, threads: int, name: str) -> None:
    """All of B's panels packed, on up to `threads` threads from 64K elements of B (below,
    a parallel region costs more)."""
    ctx = stack_array(b, PTR, 2, "packctx")
    b.store(b_ptr, elem(b, ctx, PTR, 0))
    b.store(packed_b, elem(b, ctx, PTR, 1))
    threads = min(threads, npanels) if p.k * p.n >= (1 << 16) else 1
    parallel_for(b, packb, ctx, npanels, threads, f"{name}.pb")


def emit_own(b: ir.IRBuilder, p: GemmProblem, a, b_ptr, c, scratch, isa: Isa, threads: int,
             name: str, accumulate: bool = False, rows_done: RowsDone | None = None) -> None:
    """C = A B (C += A B with `accumulate`) with the own GEMM; a, b_ptr, c are element
    pointers (already offset); `scratch` holds the packed B where `p.prepacked`. `rows_done`
    (where `finishes_rows`) follows every finished block of rows."""
    if p.m == 0 or p.n == 0:
        return
    if p.k == 0:
        if not accumulate:
            _zero(b, p, c)
        return
    gemm = _OwnGemm(b.module, p, plan_own(p, isa, threads), isa.lanes(p.dtype), name,
                    accumulate, rows_done)
    gemm.emit(b, a, b_ptr, c, scratch)


def _zero(b: ir.IRBuilder, p: GemmProblem, c) -> None:
    """C = 0: with K empty there is nothing to multiply, but C must still be written."""
    dt = p.dtype
    loop(b, p.m, lambda i: loop(b, p.n, lambda j: S.store(
        b, c, dt, b.add(b.mul(i, i64(p.ldc)), j), S.const(dt, 0)), "j"), "i")


@dataclass(frozen=True)
class _KSlice:
    """What every micro-kernel call in one kk-deep slice of a block of rows shares."""

    i0: ir.Value          # the block's first row
    rows: ir.Value        # its row count (mc, fewer in the last block)
    k0: ir.Value          # the slice's first k
    kk: int               # its depth: kc, or K's remainder
    a: ir.Value           # A at (i0, k0)
    tiles: ir.Value       # mr-row tiles in the block
    accumulate: ir.Value  # i1: add into C (past the first slice, or with `accumulate`)


class _OwnGemm:
    """Emits one own GEMM (M, N, K > 0) as planned: B's packing function and micro-kernels,
    and `{name}.gemm(ctx = [a, b, packed b, c, *rows_done pointers], lo, hi)`, a
    `parallel_for` body over the row blocks or column panels the threads split. `emit`
    writes into the caller's builder; the methods after `_body` into the body's, `self.bb`.
    The order of emission is the generated IR's: keep it when editing."""

    def __init__(self, mod: ir.Module, p: GemmProblem, plan: OwnPlan, lanes: int, name: str,
                 accumulate: bool, rows_done: RowsDone | None):
        self.mod, self.p, self.plan, self.lanes, self.name = mod, p, plan, lanes, name
        self.accumulate, self.rows_done = accumulate, rows_done
        self.el = S.REG[p.dtype]
        self.n_full, self.n_tail = divmod(p.n, plan.nr)
        # threads split the columns: each packs the B panels it multiplies
        self.packs_own_panels = plan.split == "n" and plan.threads > 1 and not p.prepacked
        # straight on A the row blocks are evened out (16 rows: 8 + 8, not 14 + a 2-row block
        # that computes 14); blocked, they are mr rows
        self.mr = plan.blk.mr if plan.blocked else cdiv(p.m, cdiv(p.m, plan.blk.mr))
        self.b_rs = i64(plan.nr) if plan.pack_b else i64(p.sb_k)  # B's row stride as read

    def emit(self, b: ir.IRBuilder, a, b_ptr, c, packed_b) -> None:
        """The whole GEMM into the caller's builder `b`: pack B (unless it comes packed, or
        the threads or the k slices pack it), then run the body on the threads."""
        plan = self.plan
        packb = (pack_b(self.mod, self.p, plan.nr, self.lanes, self.name)
                 if plan.pack_b and not plan.pack_per_k and not self.p.prepacked else None)
        if packb is not None and not self.packs_own_panels:  # before any thread multiplies
            _pack_panels(b, packb, b_ptr, packed_b, self.p, plan.npanels, plan.threads,
                         self.name)
        self._micro_kernels()
        body, items = self._body(packb)
        extra = self.rows_done.pointers if self.rows_done else []
        ctx = stack_array(b, PTR, 4 + len(extra), "ctx")
        for i, v in enumerate((a, b_ptr, packed_b, c, *extra)):
            b.store(v, elem(b, ctx, PTR, i))
        parallel_for(b, body, ctx, items, min(plan.threads, items), self.name)

    def _micro_kernels(self) -> None:
        """One micro-kernel for full panels and, where N leaves a remainder, one as narrow
        as the last panel (B's loads masked where B is read in place, not padded)."""
        p, plan = self.p, self.plan
        prefetch_a = p.sa_k != 1 and p.k > 1  # A transposed: read down its columns
        self.uk_full = microkernel(self.mod, p.dtype, self.lanes, self.mr, plan.blk.nv, False,
                                   prefetch_a=prefetch_a)
        self.uk_tail = (microkernel(self.mod, p.dtype, self.lanes, self.mr,
                                    cdiv(self.n_tail, self.lanes), not plan.pack_b,
                                    prefetch_a=prefetch_a) if self.n_tail else None)

    def _body(self, packb: ir.Function | None) -> tuple[ir.Function, int]:
        """`{name}.gemm(ctx, lo, hi)` over the thread's share [lo, hi) of the row blocks
        (split "m") or column panels (split "n"); returns it and the number of those."""
        p, plan = self.p, self.plan
        fn = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]),
                         f"{self.name}.gemm")
        fn.linkage = "internal"
        ctx, lo, hi = fn.args
        bb = self.bb = ir.IRBuilder(fn.append_basic_block("entry"))
        n_extra = len(self.rows_done.pointers) if self.rows_done else 0
        self.a, self.b_src, self.b_packed, self.c, *self.extra = [
            bb.load(elem(bb, ctx, PTR, i), typ=PTR) for i in range(4 + n_extra)]
        if self.packs_own_panels:
            self._pack_own_panels(packb, lo, hi)
        self.panels = self._share("n", lo, hi, plan.npanels)
        row_blocks = cdiv(p.m, plan.mc if plan.blocked else self.mr)
        if plan.blocked and plan.pack_per_k:
            self._k_packers()
        row_block = self._m_block if plan.blocked else self._row_block
        for_range(bb, *self._share("m", lo, hi, row_blocks), row_block, "ib")
        bb.ret_void()
        return fn, row_blocks if plan.split == "m" else plan.npanels

    def _share(self, split: str, lo, hi, count: int) -> tuple[ir.Value, ir.Value]:
        """The range of row blocks or panels (`split` "m" or "n") a thread takes: its share
        [lo, hi) where the threads split them, else all `count`."""
        return (lo, hi) if self.plan.split == split else (i64(0), i64(count))

    def _pack_own_panels(self, packb: ir.Function, lo, hi) -> None:
        """Threads split the columns: each packs just the panels [lo, hi) of B it uses."""
        bb = self.bb
        ctx = stack_array(bb, PTR, 2, "packctx")
        bb.store(self.b_src, elem(bb, ctx, PTR, 0))
        bb.store(self.b_packed, elem(bb, ctx, PTR, 1))
        bb.call(packb, [ctx, lo, hi])

    def _k_packers(self) -> None:
        """B packed per k slice (`pack_per_k`): a packing function for each slice depth (kc,
        and K's remainder), and their context, whose destination is the scratch."""
        p, kc, bb = self.p, self.plan.kc, self.bb
        self.pack_k = {kk: pack_b(self.mod, replace(p, k=kk), self.plan.nr, self.lanes,
                                  f"{self.name}.k{kk}")
                       for kk in {kc, p.k % kc} if kk}
        self.kctx = stack_array(bb, PTR, 2, "packctx")
        bb.store(self.b_packed, elem(bb, self.kctx, PTR, 1))

    def _rows_finished(self, r0, r1) -> None:
        """`rows_done` on rows [r0, r1), which this thread has just finished."""
        if self.rows_done is not None:
            self.rows_done.emit(self.bb, self.extra, r0, r1)

    def _over_panels(self, call: Callable) -> None:
        """`call(kernel, panel, columns)` for each of the thread's column panels."""
        for_range(self.bb, *self.panels, lambda jp: self._panel(jp, call), "jp")

    def _panel(self, jp, call: Callable) -> None:
        """`call` on panel jp with the kernel for its width: all nr columns, or (the last
        panel, where N leaves a remainder) fewer, decided at run time."""
        if not self.n_tail:
            call(self.uk_full, jp, self.plan.nr)
            return
        bb = self.bb
        with bb.if_else(bb.icmp_signed("<", jp, i64(self.n_full))) as (full, tail):
            with full:
                call(self.uk_full, jp, self.plan.nr)
            with tail:
                call(self.uk_tail, jp, self.n_tail)

    def _b_panel(self, jp, k0, kk: int) -> ir.Value:
        """Where B's panel jp starts at row k0: in the kk-deep slice just packed (per k), in
        the packed panels, or in B itself."""
        bb, p, nr, el = self.bb, self.p, self.plan.nr, self.el
        if self.plan.pack_per_k:
            return bb.gep(self.b_packed, [bb.mul(jp, i64(nr * kk))], inbounds=True,
                          source_etype=el)
        if self.plan.pack_b:
            return bb.gep(self.b_packed, [bb.add(bb.mul(jp, i64(nr * p.k)),
                                                 bb.mul(k0, i64(nr)))],
                          inbounds=True, source_etype=el)
        return bb.gep(self.b_src, [bb.add(bb.mul(bb.mul(jp, i64(nr)), i64(p.sb_n)),
                                          bb.mul(k0, i64(p.sb_k)))], inbounds=True,
                      source_etype=el)

    def _c_tile(self, row, jp) -> ir.Value:
        """Where C's tile at `row` in panel jp starts."""
        bb = self.bb
        return bb.gep(self.c, [bb.add(bb.mul(row, i64(self.p.ldc)),
                                      bb.mul(jp, i64(self.plan.nr)))],
                      inbounds=True, source_etype=self.el)

    def _kernel(self, uk: ir.Function, c, a, b, kk: int, accumulate, rows, cols: int) -> None:
        """One micro-kernel call: C's rows x cols tile at c (+)= A's rows at a times B's
        panel at b, kk deep (c comes first: its address is computed before B's)."""
        p = self.p
        self.bb.call(uk, [a, i64(p.sa_m), i64(p.sa_k), b, self.b_rs, c, i64(p.ldc), i64(kk),
                          accumulate, rows, i64(cols)])

    def _row_block(self, ib) -> None:
        """Straight on A: row block ib (mr rows, fewer in the last) times all of K, across
        the thread's panels; then those rows are finished."""
        bb, p, mr = self.bb, self.p, self.mr
        r0 = bb.mul(ib, i64(mr))
        rows = bb.select(bb.icmp_signed("<", bb.add(r0, i64(mr)), i64(p.m)),
                         i64(mr), bb.sub(i64(p.m), r0))
        a = bb.gep(self.a, [bb.mul(r0, i64(p.sa_m))], inbounds=True, source_etype=self.el)
        accumulate = ir.Constant(I1, int(self.accumulate))
        self._over_panels(lambda uk, jp, cols: self._kernel(
            uk, self._c_tile(r0, jp), a, self._b_panel(jp, i64(0), p.k), p.k, accumulate,
            rows, cols))
        self._rows_finished(r0, bb.add(r0, rows))

    def _m_block(self, ib) -> None:
        """Blocked: row block ib (mc rows, fewer in the last) one kc-deep slice of K at a
        time, A's block staying in L2; then those rows are finished."""
        bb, p, mc, kc = self.bb, self.p, self.plan.mc, self.plan.kc
        i0 = bb.mul(ib, i64(mc))
        rows = bb.select(bb.icmp_signed("<", bb.add(i0, i64(mc)), i64(p.m)), i64(mc),
                         bb.sub(i64(p.m), i0))
        k_full, k_tail = divmod(p.k, kc)
        loop(bb, k_full, lambda kb: self._k_slice(i0, rows, bb.mul(kb, i64(kc)), kc), "kb")
        if k_tail:
            self._k_slice(i0, rows, i64(k_full * kc), k_tail)
        self._rows_finished(i0, bb.add(i0, rows))

    def _k_slice(self, i0, rows, k0, kk: int) -> None:
        """The kk-deep slice at k0 (run time; kk constant) of the row block at i0, across
        the thread's panels (B's slice packed first, when packed per k)."""
        bb, p, mr = self.bb, self.p, self.plan.blk.mr
        a = bb.gep(self.a, [bb.add(bb.mul(i0, i64(p.sa_m)), bb.mul(k0, i64(p.sa_k)))],
                   inbounds=True, source_etype=self.el)
        if self.plan.pack_per_k:
            self._pack_k_slice(k0, kk)
        tiles = bb.sdiv(bb.add(rows, i64(mr - 1)), i64(mr))
        accumulate = (ir.Constant(I1, 1) if self.accumulate
                      else bb.icmp_signed(">", k0, i64(0)))
        s = _KSlice(i0, rows, k0, kk, a, tiles, accumulate)
        self._over_panels(lambda uk, jp, cols: self._slice_panel(s, uk, jp, cols))

    def _pack_k_slice(self, k0, kk: int) -> None:
        """B's kk-deep slice at k0 into the scratch, just before its one use (it stays in
        L2: packed whole, B was written past it)."""
        bb = self.bb
        bb.store(bb.gep(self.b_src, [bb.mul(k0, i64(self.p.sb_k))], inbounds=True,
                        source_etype=self.el), elem(bb, self.kctx, PTR, 0))
        bb.call(self.pack_k[kk], [self.kctx, i64(0), i64(self.plan.npanels)])

    def _slice_panel(self, s: _KSlice, uk: ir.Function, jp, cols: int) -> None:
        """Panel jp of a slice: B's panel located once, then each mr-row tile of the block."""
        b = self._b_panel(jp, s.k0, s.kk)
        for_range(self.bb, i64(0), s.tiles, lambda r: self._slice_tile(s, uk, jp, cols, b, r),
                  "r")

    def _slice_tile(self, s: _KSlice, uk: ir.Function, jp, cols: int, b, r) -> None:
        """Tile r (mr rows, fewer in the last) of a slice's panel jp."""
        bb, p, mr = self.bb, self.p, self.plan.blk.mr
        a = bb.gep(s.a, [bb.mul(r, i64(mr * p.sa_m))], inbounds=True, source_etype=self.el)
        row = bb.add(s.i0, bb.mul(r, i64(mr)))
        rows = bb.sub(s.rows, bb.mul(r, i64(mr)))
        rows = bb.select(bb.icmp_signed("<", rows, i64(mr)), rows, i64(mr))
        self._kernel(uk, self._c_tile(row, jp), a, b, s.kk, s.accumulate, rows, cols)
