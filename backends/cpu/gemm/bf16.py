"""The bf16 GEMM: C (f32) = A B for bf16 A and B, the products summed in f32, on AMX tiles
or, on a CPU with AVX512-BF16 but no AMX (AMD's Zen 4 and 5), by vector dot products.

`tdpbf16ps` multiplies a 16 x 32 tile of A by a 32 x 16 tile of B into a 16 x 16 tile of
f32 sums, B's tile in the "VNNI" layout: row k2 holds, for each of its 16 columns, the
pair of elements at k = 2 k2 and 2 k2 + 1. So both operands are packed first, bf16 with
zeros past the edges (one parallel region, by threads):
- A into `Ap[Mp][Kp]`, M padded to 32 rows and K to 32: any strides (A transposed, a
  weight gradient's X^T, goes 16 x 16 blocks at a time through registers); unless its rows
  are unit-stride and M and K multiples of 32 (a Linear's input), when the tiles read it
  where it is;
- B into `Bp[Np / 16][Kp / 2][16][2]`, each 16-column tile's pairs, which a tile load reads
  64 bytes a row.
The micro-kernel keeps a 32 x 32 block of C in four tiles (eight tile registers: C 2 x 2,
A 2, B 2) over all of K, four tile multiplies per 32 of K; threads take blocks of rows
(all of them where A fits in half of L2, else `MB`, whose A stays in L2 while every
column panel of B streams past it) and, where there are fewer blocks than threads, a share
of the panels. A block
inside C is stored from its tiles straight into C; one on C's edge through a 32 x 32
buffer and a masked copy. The tiles need Linux's permission, which `host.host_amx` asks
for once.

`vdpbf16ps` reads the same layout: a 64-byte row of a packed B tile is one vector (16
columns' pairs), an A row's pair one broadcast 32-bit word. Its micro-kernel keeps 8 rows
x 32 columns of C in 16 vector registers over all of K, four times per 32 x 32 block.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ...strides import cdiv
from ..kernels import scalar as S
from ..kernels.loops import carried, for_range, loop
from ..kernels.scalar import I64, PTR, i64
from ..machine.host import Isa, host_caches
from ..parallel.outline import parallel_region, stack_array
from .emit import RowsDone
from .microkernel import GemmProblem, transpose_lanes

I8 = ir.IntType(8)
BF16 = S.REG["bf16"]  # bf16 values as their 16 bits
# every tile is 16 rows of 64 bytes: C's 16 f32, A's 32 bf16 of K, B's 16 pairs of K
TILE = 16
PAIR_K = 32    # K per tile multiply
BLOCK = 32     # rows and columns of C per micro-kernel call (2 x 2 tiles)
# rows per block of C where A does not fit in half of L2: the block's A (MB x Kp bf16:
# 768 KiB at K = 3072) stays in L2 while the panels of B pass. Where all of A fits, a block
# is all rows and threads split the panels: B, read once, may be larger than L2 (a
# 1024 x 3072 x 768 product ran at 0.5x the speed with 128-row blocks re-reading it)
MB = 128
C_TILES, A_TILES, B_TILES = (0, 1, 2, 3), (4, 5), (6, 7)
# work (flops) that a second thread takes a share of
THREAD_FLOPS = 8 << 20


@dataclass(frozen=True)
class Bf16Plan:
    kernel: str    # "tiles" (AMX) or "dots" (AVX512-BF16)
    mp: int        # rows of packed A: M padded to BLOCK
    mb: int        # rows per block
    kp: int        # K padded to PAIR_K
    np_: int       # columns of packed B: N padded to BLOCK
    a_direct: bool  # tiles load A where it is (its rows unit-stride, 32 | K and 32 | M)
    a_ld: int       # elements between A's rows as the kernel reads them (packed: Kp, or
                    # more where Kp would alias in L1)
    groups: int    # column-panel groups per block that threads take separately
    threads: int

    @property
    def panels(self) -> int:
        return self.np_ // BLOCK

    @property
    def blocks(self) -> int:
        """Blocks of mb rows of C."""
        return cdiv(self.mp, self.mb)

    @property
    def a_units(self) -> int:
        """16-row groups of A to pack (none where the kernel reads A in place)."""
        return 0 if self.a_direct else self.mp // TILE

    @property
    def a_bytes(self) -> int:
        return 0 if self.a_direct else self.mp * self.a_ld * 2

    @property
    def scratch(self) -> int:
        return self.a_bytes + self.np_ * self.kp * 2


def plan_bf16(p: GemmProblem, isa: Isa, threads: int) -> Bf16Plan:
    mp, kp, np_ = (cdiv(x, q) * q for x, q in ((p.m, BLOCK), (p.k, PAIR_K), (p.n, BLOCK)))
    mb = mp if mp * kp * 2 <= host_caches().l2 // 2 else MB
    blocks = cdiv(mp, mb)
    t = threads if p.flops >= THREAD_FLOPS else 1
    groups = 1 if blocks >= t else min(np_ // BLOCK, cdiv(t, blocks))
    a_direct = p.sa_k == 1 and p.k == kp and p.m == mp and not _aliases(p.sa_m)
    a_ld = p.sa_m if a_direct else kp + (PAIR_K if _aliases(kp) else 0)
    return Bf16Plan("tiles" if isa.bf16_tiles else "dots", mp, mb, kp, np_, a_direct, a_ld,
                    groups, min(t, blocks * groups))


def _aliases(row: int) -> bool:
    """Whether rows of `row` bf16 elements apart share few L1 sets: a multiple of 1 KiB
    (4 KiB: one set for all 16 rows of a tile, or 8 of the dot kernel's broadcasts, which
    ran at 0.7x the speed at K = 2048)."""
    return row * 2 % 1024 == 0


def amx(mod: ir.Module, name: str, args: list[ir.Type]) -> ir.Function:
    """The AMX intrinsic `llvm.x86.<name>` (tileloadd64, tdpbf16ps, ...)."""
    return S.declare(mod, f"llvm.x86.{name}", ir.VoidType(), args)


def tile_config(mod: ir.Module) -> ir.GlobalVariable:
    """The 64-byte `ldtilecfg` operand: palette 1, eight tiles of 16 rows x 64 bytes."""
    name = "ember.amx.config"
    if name in mod.globals:
        return mod.globals[name]
    raw = bytearray(64)
    raw[0] = 1
    for t in range(8):
        raw[16 + 2 * t] = 64  # bytes per row (little-endian u16)
        raw[48 + t] = TILE    # rows
    ty = ir.ArrayType(I8, 64)
    g = ir.GlobalVariable(mod, ty, name)
    g.global_constant = True
    g.linkage = "internal"
    g.align = 64
    g.initializer = ir.Constant(ty, list(raw))
    return g


def bf16_finishes_rows(p: GemmProblem, isa: Isa, threads: int) -> bool:
    """Whether each work unit of `p`'s GEMM is whole rows of C (all of its panels), so that
    a `RowsDone` can follow each: not where threads share a block's panels."""
    return p.m > 0 and p.n > 0 and plan_bf16(p, isa, threads).groups == 1


def emit_bf16(b: ir.IRBuilder, p: GemmProblem, a, b_ptr, c, scratch, isa: Isa, threads: int,
              name: str, rows_done: RowsDone | None = None) -> None:
    """C = A B (C f32, row-major, leading dimension p.ldc) on AMX tiles or AVX512-BF16 dot
    products; a, b_ptr, c are element pointers, `scratch` `plan_bf16(...).scratch` bytes.
    `rows_done` (where `bf16_finishes_rows`) follows each block of rows a thread finishes,
    while they are in its cache (an epilogue: a Linear's bias and GELU, AdamW's update of
    a weight from its gradient)."""
    if p.m == 0 or p.n == 0:
        return
    plan = plan_bf16(p, isa, threads)
    bp = b.gep(scratch, [i64(plan.a_bytes)], inbounds=True, source_etype=I8)
    units = plan.a_units + plan.np_ // TILE
    parallel_region(b, f"{name}.bf16.pack", [a, b_ptr, scratch, bp], [False, False, True, True],
                    units, min(plan.threads, units),
                    lambda cb, ptrs, lo, hi: for_range(
                        cb, lo, hi, lambda u: _pack(cb, p, plan, ptrs, u), "u"))
    extra = rows_done.pointers if rows_done else []
    parallel_region(b, f"{name}.bf16", [a if plan.a_direct else scratch, bp, c, *extra],
                    [False, True, True] + [False] * len(extra),
                    plan.blocks * plan.groups, plan.threads,
                    lambda cb, ptrs, lo, hi: _compute(cb, p, plan, ptrs, lo, hi, rows_done))


def _pack(b: ir.IRBuilder, p: GemmProblem, plan: Bf16Plan, ptrs: list, u) -> None:
    """Pack unit `u`: A's 16-row group u, or (past A's) B's 16-column tile."""
    a, bsrc, ap, bp = ptrs
    with b.if_else(b.icmp_signed("<", u, i64(plan.a_units))) as (is_a, is_b):
        with is_a:
            _pack_a_group(b, p, plan, a, ap, b.mul(u, i64(TILE)))
        with is_b:
            _pack_b_tile(b, p, plan, bsrc, bp, b.sub(u, i64(plan.a_units)))


def _vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def load_lanes(b: ir.IRBuilder, base, offset, t: ir.Type, n: int):
    """n elements of `t` at bf16 element `offset` of `base` (2-byte aligned)."""
    return b.load(b.gep(base, [offset], inbounds=True, source_etype=BF16), typ=_vec(t, n),
                  align=2)


def store_lanes(b: ir.IRBuilder, base, offset, v) -> None:
    b.store(v, b.gep(base, [offset], inbounds=True, source_etype=BF16), align=2)


def _pack_a_group(b: ir.IRBuilder, p: GemmProblem, plan: Bf16Plan, a, ap, i0) -> None:
    """Ap's rows i0..i0+15: A's rows (zeros past K), zeros past M. A read down its columns
    (transposed) goes 16 x 16 blocks at a time through registers."""
    def row(i):
        at = b.mul(i, i64(plan.a_ld))
        with b.if_else(b.icmp_signed("<", i, i64(p.m))) as (inside, past):
            with inside:
                src = b.mul(i, i64(p.sa_m))
                loop(b, p.k, lambda k: S.store(b, ap, "bf16", b.add(at, k), S.load(
                    b, a, "bf16", b.add(src, b.mul(k, i64(p.sa_k))))), "k")
                _zeros(b, ap, b.add(at, i64(p.k)), plan.a_ld - p.k)
            with past:
                _zeros(b, ap, at, plan.a_ld)

    if p.sa_m != 1 or p.k < TILE:
        loop(b, TILE, lambda r: row(b.add(i0, r)), "r")
        return
    kb = p.k // TILE

    def block(k):  # 16 k by 16 rows: loaded along the rows, stored along k
        k0 = b.mul(k, i64(TILE))
        cols = [load_lanes(b, a, b.add(b.mul(b.add(k0, i64(j)), i64(p.sa_k)), i0), BF16, TILE)
                for j in range(TILE)]
        for r, v in enumerate(transpose_lanes(b, cols)):
            store_lanes(b, ap, b.add(b.mul(b.add(i0, i64(r)), i64(plan.a_ld)), k0), v)

    def rest(i):  # past the blocks: K's tail, then the zeros
        at = b.mul(i, i64(plan.a_ld))
        for_range(b, i64(kb * TILE), i64(p.k), lambda k: S.store(
            b, ap, "bf16", b.add(at, k), S.load(b, a, "bf16", b.add(b.mul(k, i64(p.sa_k)), i))),
            "k")
        _zeros(b, ap, b.add(at, i64(p.k)), plan.a_ld - p.k)

    with b.if_else(b.icmp_signed("<=", b.add(i0, i64(TILE)), i64(p.m))) as (whole, edge):
        with whole:
            loop(b, kb, block, "kb")
            loop(b, TILE, lambda r: rest(b.add(i0, r)), "r")
        with edge:
            loop(b, TILE, lambda r: row(b.add(i0, r)), "r")


def _zeros(b: ir.IRBuilder, dst, start, count: int) -> None:
    zero = S.const("bf16", 0)
    for_range(b, start, b.add(start, i64(count)), lambda i: S.store(b, dst, "bf16", i, zero),
              "z")


def _pack_b_tile(b: ir.IRBuilder, p: GemmProblem, plan: Bf16Plan, src, bp, jt) -> None:
    """Bp's 16-column tile jt: for each pair of K, each column's two elements side by side
    (zeros past N and K). Whole tiles go through vectors: B's rows two at a time,
    interleaved; a transposed B's pairs (adjacent in memory) 16 x 16 at a time,
    transposed as 32-bit words."""
    col0 = b.mul(jt, i64(TILE))
    full_cols = b.icmp_signed("<=", b.add(col0, i64(TILE)), i64(p.n))
    base = b.mul(jt, i64(plan.kp * TILE))  # kp / 2 rows of 16 pairs

    def at(k2):
        return b.add(base, b.mul(k2, i64(2 * TILE)))

    def scalar_row(k2):
        for h in (0, 1):
            k = b.add(b.mul(k2, i64(2)), i64(h))

            def element(j, k=k, h=h):
                col = b.add(col0, j)
                ok = b.and_(b.icmp_signed("<", k, i64(p.k)), b.icmp_signed("<", col, i64(p.n)))
                safe = b.add(b.mul(b.select(ok, k, i64(0)), i64(p.sb_k)),
                             b.mul(b.select(ok, col, i64(0)), i64(p.sb_n)))
                x = b.select(ok, S.load(b, src, "bf16", safe), S.const("bf16", 0))
                S.store(b, bp, "bf16", b.add(at(k2), b.add(b.mul(j, i64(2)), i64(h))), x)
            loop(b, TILE, element, "j")

    def interleaved_row(k2):  # rows 2 k2 and 2 k2 + 1, 16 columns each, as pairs
        rows = [load_lanes(b, src, b.add(b.mul(b.add(b.mul(k2, i64(2)), i64(h)), i64(p.sb_k)),
                                     col0), BF16, TILE) for h in (0, 1)]
        zip_ = ir.Constant(_vec(ir.IntType(32), 2 * TILE),
                           [x for j in range(TILE) for x in (j, TILE + j)])
        store_lanes(b, bp, at(k2), b.shuffle_vector(rows[0], rows[1], zip_))

    def transposed_block(kb):  # pairs 16 kb .. 16 kb + 15 of the 16 columns
        k0 = b.mul(kb, i64(PAIR_K))
        cols = [load_lanes(b, src, b.add(b.mul(b.add(col0, i64(j)), i64(p.sb_n)), k0),
                       ir.IntType(32), TILE) for j in range(TILE)]
        for r, v in enumerate(transpose_lanes(b, cols)):
            store_lanes(b, bp, at(b.add(b.mul(kb, i64(TILE)), i64(r))), v)

    whole_pairs = p.k // 2
    if p.sb_k == 1 and p.sb_n != 1:
        blocks = p.k // PAIR_K
        with b.if_else(full_cols) as (whole, edge):
            with whole:
                loop(b, blocks, transposed_block, "kb")
                for_range(b, i64(blocks * TILE), i64(plan.kp // 2), scalar_row, "k2")
            with edge:
                loop(b, plan.kp // 2, scalar_row, "k2")
        return
    if p.sb_n == 1:
        with b.if_else(full_cols) as (whole, edge):
            with whole:
                loop(b, whole_pairs, interleaved_row, "k2")
                for_range(b, i64(whole_pairs), i64(plan.kp // 2), scalar_row, "k2")
            with edge:
                loop(b, plan.kp // 2, scalar_row, "k2")
        return
    loop(b, plan.kp // 2, scalar_row, "k2")


def _compute(b: ir.IRBuilder, p: GemmProblem, plan: Bf16Plan, ptrs: list, lo, hi,
             rows_done: RowsDone | None) -> None:
    """Work units lo..hi: unit = block * groups + group, a block's mb rows times its group's
    column panels, 32 x 32 blocks of C each over all of K; then `rows_done` on the
    block's rows (one group: all of them)."""
    mod = b.module
    ap, bp, c, *extra = ptrs
    tiles = plan.kernel == "tiles"
    if tiles:
        b.call(amx(mod, "ldtilecfg", [PTR]), [tile_config(mod)])
    block = _tile_block if tiles else _dot_block
    buf = stack_array(b, ir.FloatType(), BLOCK * BLOCK, "cblock")
    per_group = cdiv(plan.panels, plan.groups)

    def unit(u):
        blk, grp = b.udiv(u, i64(plan.groups)), b.urem(u, i64(plan.groups))
        r0 = b.mul(blk, i64(plan.mb))
        p0 = b.mul(grp, i64(per_group))
        p1 = b.select(b.icmp_signed("<", b.add(p0, i64(per_group)), i64(plan.panels)),
                      b.add(p0, i64(per_group)), i64(plan.panels))
        rows = b.select(b.icmp_signed("<", b.add(r0, i64(plan.mb)), i64(plan.mp)),
                        i64(plan.mb), b.sub(i64(plan.mp), r0))
        nsub = b.udiv(rows, i64(BLOCK))

        def panel(jp):
            def sub(s):
                r = b.add(r0, b.mul(s, i64(BLOCK)))
                _store_block(b, p, c, buf, r, jp, lambda dst, ld, row, col: block(
                    b, plan, ap, bp, dst, ld, row, col, r, jp))
            for_range(b, i64(0), nsub, sub, "s")
        for_range(b, p0, p1, panel, "jp")
        if rows_done is not None:
            rows_done.emit(b, extra, r0, S.at_most(b, b.add(r0, rows), p.m))

    for_range(b, lo, hi, unit, "unit")
    if tiles:
        b.call(amx(mod, "tilerelease", []), [])


def tile(i: int) -> ir.Constant:
    return ir.Constant(I8, i)


def _store_block(b: ir.IRBuilder, p: GemmProblem, c, buf, r, jp, compute) -> None:
    """C's 32 x 32 block at rows r, column panel jp: `compute(dst, ld, row, col)` writes it
    at (row, col) of `dst` (leading dimension ld), straight into C where it lies inside,
    else into `buf` and on into C under the edges."""
    col = b.mul(jp, i64(BLOCK))
    inside = b.and_(b.icmp_signed("<=", b.add(r, i64(BLOCK)), i64(p.m)),
                    b.icmp_signed("<=", b.add(col, i64(BLOCK)), i64(p.n)))
    with b.if_else(inside) as (whole, edge):
        with whole:
            compute(c, i64(p.ldc), r, col)
        with edge:
            compute(buf, i64(BLOCK), i64(0), i64(0))
            rows = b.sub(i64(p.m), r)
            cols = b.sub(i64(p.n), col)
            rows = b.select(b.icmp_signed("<", rows, i64(BLOCK)), rows, i64(BLOCK))
            cols = b.select(b.icmp_signed("<", cols, i64(BLOCK)), cols, i64(BLOCK))
            for_range(b, i64(0), rows, lambda i: for_range(b, i64(0), cols, lambda j: S.store(
                b, c, "f32", b.add(b.mul(b.add(r, i), i64(p.ldc)), b.add(col, j)),
                S.load(b, buf, "f32", b.add(b.mul(i, i64(BLOCK)), j))), "j"), "i")


def _b_row(b: ir.IRBuilder, plan: Bf16Plan, jt, k2) -> ir.Value:
    """The bf16 element offset of packed B's tile jt, pair row k2."""
    return b.mul(b.add(b.mul(jt, i64(plan.kp // 2)), k2), i64(2 * TILE))


def _tile_block(b: ir.IRBuilder, plan: Bf16Plan, ap, bp, dst, ld, row, col, r, jp) -> None:
    """A 32 x 32 block of C (rows r, panel jp) in four tiles of sums over all of K, stored
    at (row, col) of dst."""
    mod = b.module
    load = amx(mod, "tileloadd64", [I8, PTR, I64])
    dot = amx(mod, "tdpbf16ps", [I8, I8, I8])
    store = amx(mod, "tilestored64", [I8, PTR, I64])
    zero = amx(mod, "tilezero", [I8])
    for t in C_TILES:
        b.call(zero, [tile(t)])
    jt = b.mul(jp, i64(2))

    def step(ks):
        k0 = b.mul(ks, i64(PAIR_K))
        for h, t in enumerate(A_TILES):
            at = b.add(b.mul(b.add(r, i64(h * TILE)), i64(plan.a_ld)), k0)
            b.call(load, [tile(t), b.gep(ap, [at], inbounds=True, source_etype=BF16),
                          i64(plan.a_ld * 2)])
        for h, t in enumerate(B_TILES):  # tile jt + h, pair rows 16 ks ..
            at = _b_row(b, plan, b.add(jt, i64(h)), b.mul(ks, i64(TILE)))
            b.call(load, [tile(t), b.gep(bp, [at], inbounds=True, source_etype=BF16),
                          i64(4 * TILE)])
        for i, ta in enumerate(A_TILES):
            for j, tb in enumerate(B_TILES):
                b.call(dot, [tile(C_TILES[2 * i + j]), tile(ta), tile(tb)])

    loop(b, plan.kp // PAIR_K, step, "ks")
    f32 = ir.FloatType()
    for n, t in enumerate(C_TILES):
        i, j = divmod(n, 2)
        at = b.add(b.mul(b.add(row, i64(i * TILE)), ld), b.add(col, i64(j * TILE)))
        b.call(store, [tile(t), b.gep(dst, [at], inbounds=True, source_etype=f32),
                       b.mul(ld, i64(4))])


class BFloat(ir.types.Type):
    """LLVM's `bfloat`, which llvmlite lacks: the type of the bf16 intrinsics' vectors."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


DOT_ROWS = 8  # rows of C per dot micro-kernel: 8 x 2 accumulators, 2 B vectors, 1 broadcast


def _dot_block(b: ir.IRBuilder, plan: Bf16Plan, ap, bp, dst, ld, row, col, r, jp) -> None:
    """A 32 x 32 block of C (rows r, panel jp) by `vdpbf16ps`, 8 rows at a time, stored at
    (row, col) of dst."""
    f32, i32 = ir.FloatType(), ir.IntType(32)
    vf, vi, vb = _vec(f32, TILE), _vec(i32, TILE), _vec(BFloat(), 2 * TILE)
    dot = S.declare(b.module, "llvm.x86.avx512bf16.dpbf16ps.512", vf, [vf, vb, vb])
    jt = b.mul(jp, i64(2))
    splat = ir.Constant(_vec(i32, TILE), [0] * TILE)
    undef = ir.Constant(vi, ir.Undefined)

    def rows8(g):
        r8 = b.add(r, b.mul(g, i64(DOT_ROWS)))

        def step(k2, accs):
            bv = [b.bitcast(load_lanes(b, bp, _b_row(b, plan, b.add(jt, i64(h)), k2), i32,
                                       TILE), vb) for h in (0, 1)]
            out = []
            for i in range(DOT_ROWS):
                at = b.add(b.mul(b.add(r8, i64(i)), i64(plan.a_ld)), b.mul(k2, i64(2)))
                pair = b.load(b.gep(ap, [at], inbounds=True, source_etype=BF16), typ=i32,
                              align=2)
                av = b.bitcast(b.shuffle_vector(b.insert_element(undef, pair, i64(0)), undef,
                                                splat), vb)
                out += [b.call(dot, [accs[2 * i + h], av, bv[h]]) for h in (0, 1)]
            return out

        _, accs = carried(b, i64(0), i64(plan.kp // 2), [ir.Constant(vf, None)] * (2 * DOT_ROWS),
                          step, 1, "k2")
        base = b.add(row, b.mul(g, i64(DOT_ROWS)))
        for i in range(DOT_ROWS):
            for h in (0, 1):
                at = b.add(b.mul(b.add(base, i64(i)), ld), b.add(col, i64(h * TILE)))
                ptr = b.gep(dst, [at], inbounds=True, source_etype=f32)
                b.store(accs[2 * i + h], b.bitcast(ptr, ir.PointerType(vf)), align=4)

    loop(b, BLOCK // DOT_ROWS, rows8, "g")
