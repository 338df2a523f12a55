"""The own GEMM's building blocks (gemm/emit.py arranges them): the micro-kernel, which
keeps an `mr x (nv * lanes)` tile of C in registers and, for each k, loads `nv` vectors of
B and broadcasts `mr` elements of A into fused multiply-adds (rows and columns past an edge
masked at run time), and `pack_b`, which copies B into `nr`-wide panels where it is
transposed or reused enough to alias in L1; and `GemmProblem`, the product both read."""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..kernels import scalar as S
from ..kernels.loops import carried, for_range, loop
from ..kernels.scalar import I32, I64, PTR, i64
from ..parallel.outline import elem

I1 = ir.IntType(1)

# the micro-kernel prefetches A this many k steps ahead: A transposed (a weight gradient
# X^T dY) is read down its columns, a row a large stride apart per k, which the hardware
# prefetchers (within a 4 KiB page) do not follow, so from DRAM each k waited for memory
PREFETCH_K = 16


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
    # B comes packed already, all of K in `pack_b`'s panels (a constant weight packed once
    # when bound, call/executable.py): the GEMM reads the panels and packs nothing
    prepacked: bool = False
    # C's dtype where it is not A's and B's: f32 sums of bf16 products (gemm/amx.py)
    sums: str | None = None

    @property
    def c_dtype(self) -> str:
        return self.sums or self.dtype

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


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
    last = b.sub(rows, i64(1))
    row_off = [b.mul(b.select(b.icmp_signed("<", i64(i), rows), i64(i), last), a_rs)
               for i in range(mr)]
    # lanes of the last vector that are columns: iota + (nv-1)*lanes < cols
    iota = ir.Constant(ir.VectorType(I64, lanes), [i64((nv - 1) * lanes + i)
                                                   for i in range(lanes)])
    cvec = splat(b, cols, lanes)
    mask = b.icmp_signed("<", iota, cvec)

    def vload(ptr, masked):
        if masked:
            return masked_rt(b, "load", dtype, lanes, mask, ptr)
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
            xs = splat(b, x, lanes)
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
                    old = (masked_rt(b, "load", dtype, lanes, mask, p) if masked
                           else b.load(p, typ=vt, align=S.size(dtype)))
                    new = b.fadd(accs[i][v], old)
                    if masked:
                        masked_rt(b, "store", dtype, lanes, mask, p, new)
                    else:
                        b.store(new, p, align=S.size(dtype))
                with put:
                    if masked:
                        masked_rt(b, "store", dtype, lanes, mask, p, accs[i][v])
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


def splat(b: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
    """`value` in every lane of a vector (an insert and a broadcast shuffle)."""
    undef = ir.Constant(ir.VectorType(value.type, lanes), ir.Undefined)
    return b.shuffle_vector(b.insert_element(undef, value, i64(0)), undef,
                            ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def masked_rt(b: ir.IRBuilder, kind: str, dtype: str, lanes: int, mask, ptr, value=None):
    """A masked vector load or store with a mask computed at run time."""
    vt = _vec(dtype, lanes)
    mt = ir.VectorType(I1, lanes)
    suffix = f"v{lanes}{dtype}.p0"
    if kind == "load":
        fn = S.declare(b.module, f"llvm.masked.load.{suffix}", vt, [PTR, I32, mt, vt])
        return b.call(fn, [ptr, ir.Constant(I32, S.size(dtype)), mask, ir.Constant(vt, None)])
    fn = S.declare(b.module, f"llvm.masked.store.{suffix}", ir.VoidType(), [vt, PTR, I32, mt])
    return b.call(fn, [value, ptr, ir.Constant(I32, S.size(dtype)), mask])


def transpose_lanes(b: ir.IRBuilder, rows: list) -> list:
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
        for k, v in enumerate(transpose_lanes(b, rows)):
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
