"""`kernel.attention` on bf16 q, k and v (passes/low_precision_attention.py) on AMX tiles:
flash attention whose two products are `tdpbf16ps` tile multiplies, f32 sums (the
backward, amx_backward.py, shares the blocks and the tile code here).

One item per batch element, split across threads. An item packs its keys and values once,
bf16 with zeros past the edges: `kp` [Tkp][Dp] (the keys' rows, the scores' A tiles) and
`vt` [DVp][Tkp] (v transposed, the values' A tiles; 16 x 16 blocks through registers).
Then per block of 32 queries, whose q^T is packed in the VNNI layout B tiles read
(`qt`: for each pair of q's columns, each query's two elements side by side), and per
block of 32 keys:
- the scores' transpose s^T = k q^T: 2 x 2 tiles over D, stored as [key][query] f32, so
  that, as in the f32 kernel (forward.py), the running max m and sum l are vectors over
  queries and need no horizontal reductions;
- scaled, masked (keys past Tk, and above the diagonal where causal: only in blocks that
  hide a key), the block's column max; where it passes m + RESCALE for some query, m
  becomes the max and acc and l are rescaled by e^(m_old - m) (lazily, so rarely: p
  stays below e^RESCALE); p = exp(s - m) rounded to bf16 into `pp` in the VNNI layout
  (two keys' p side by side per query), and l += the column sums of the rounded p, so o
  is a weighted mean of v whose weights sum to one;
- acc (o^T, f32) += v^T p^T: per 32 rows of o^T, 2 x 2 tiles loaded from acc, over the
  block's 32 keys, stored back.
Finally o = acc / l and lse = m + log l. Rounding p to bf16 for the product with v is
the one rounding the f32 kernel does not make (as in PyTorch's bf16 flash attention);
every sum is f32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from llvmlite import ir

from ....ir import Operation
from ....ir.dialects.kernel_attention import attention_shape
from ...strides import cdiv, contiguous_strides
from ..call.buffers import regions
from ..gemm.bf16 import (
    A_TILES,
    B_TILES,
    BF16,
    C_TILES,
    I8,
    PAIR_K,
    TILE,
    BFloat,
    amx,
    load_lanes,
    store_lanes,
    tile,
    tile_config,
)
from ..gemm.matmul import byte_offset
from ..gemm.microkernel import splat, transpose_lanes
from ..kernels import scalar as S
from ..kernels import vmath
from ..kernels.loops import carried, fill_zero, for_range, loop
from ..kernels.scalar import I32, I64, PTR, i64
from ..kernels.vmath import splat_constant
from ..machine.host import Isa
from ..parallel.outline import chunk_index, parallel_chunks, parallel_region
from .tiles import item_function, query_indices

BQ = 32  # queries per block: two B tiles of 16 columns
BK = 32  # keys per block: two A tiles of 16 rows of scores, one K step of the values
NV = BQ // TILE  # query vectors per block
RESCALE = 8.0  # how far a max may grow before acc is rescaled: p = exp(s - m) < e^8
F32 = ir.FloatType()
VF = ir.VectorType(F32, TILE)
IO = ["o", "lse", "q", "k", "v"]
VB = ir.VectorType(BF16, 2 * TILE)  # 32 bf16 (their bits): two rows of 16, or 16 pairs
# two 16-lane rows as 16 pairs (the VNNI layout), and each row alone
ZIP = ir.Constant(ir.VectorType(I32, 2 * TILE), [x for i in range(TILE) for x in (i, TILE + i)])
HALVES = [ir.Constant(ir.VectorType(I32, TILE), list(range(h * TILE, (h + 1) * TILE)))
          for h in (0, 1)]


class Geometry:
    """One bf16 attention op's sizes, padded sizes and scratch layout."""

    def __init__(self, op: Operation):
        s = attention_shape(op)
        self.tq, self.tk, self.d, self.dv = s.tq, s.tk, s.d, s.dv
        self.batch, self.maps, self.causal, self.scale = s.batch, s.maps, s.causal, s.scale
        self.nb, self.nbatch = len(s.batch), math.prod(s.batch)
        self.dp, self.dvp, self.tkp = (cdiv(n, PAIR_K) * PAIR_K for n in (s.d, s.dv, s.tk))
        self.nqb = cdiv(s.tq, BQ)
        # each buffer's dtype: bf16 operands, f32 results (or bf16: low-precision-attention
        # folds a cast to bf16 into them)
        self.dtypes = {n: v.type.dtype for n, v in zip(s.maps, [*op.operands, *op.results])}
        # scratch per thread, bytes: packed operands, then f32 blocks and query vectors
        dp, dvp, tkp = self.dp, self.dvp, self.tkp
        if op.name == "kernel.attention":
            self.sizes = {"kp": tkp * dp * 2, "vt": dvp * tkp * 2, "qt": dp * BQ * 2,
                          "s": BK * BQ * 4, "pp": BK * BQ * 2, "acc": dvp * BQ * 4,
                          "m": BQ * 4, "l": BQ * 4}
        else:  # the backward's (amx_backward.py)
            self.sizes = {"kp": tkp * dp * 2, "vp": tkp * dvp * 2, "kt": dp * tkp * 2,
                          "qt": dp * BQ * 2, "dot": dvp * BQ * 2, "qv": BQ * dp * 2,
                          "dov": BQ * dvp * 2, "s": BK * BQ * 4, "dp": BK * BQ * 4,
                          "pa": BK * BQ * 2, "dsa": BK * BQ * 2, "dsv": BK * BQ * 2,
                          "dka": tkp * dp * 4, "dva": tkp * dvp * 4, "dqt": dp * BQ * 4,
                          "drow": BQ * 4, "lse_b": BQ * 4}

    def strides(self, name: str) -> tuple[int, int]:
        """(row, column) element strides of buffer `name`."""
        m = self.maps[name]
        return m[self.nb], m[self.nb + 1]

    def threads(self, threads: int) -> int:
        flops = 2 * self.nbatch * self.tq * self.tk * (self.d + self.dv) / (
            2 if self.causal else 1)
        return parallel_chunks(flops / 16, self.nbatch, threads)

    def regions(self) -> tuple[dict[str, int], int]:
        offs, total = regions(*self.sizes.values())
        return dict(zip(self.sizes, offs)), total


def amx_attention_scratch(op: Operation, threads: int) -> int:
    """Scratch bytes: one set of packed operands and block buffers per thread."""
    g = Geometry(op)
    return g.threads(threads) * g.regions()[1]


class Item:
    """The code of one item (batch element) over one builder."""

    def __init__(self, b: ir.IRBuilder, g: Geometry, a: dict[str, ir.Value]):
        self.b, self.g, self.a = b, g, a
        mod = b.module
        self.load = amx(mod, "tileloadd64", [I8, PTR, I64])
        self.dot = amx(mod, "tdpbf16ps", [I8] * 3)
        self.store = amx(mod, "tilestored64", [I8, PTR, I64])
        self.zero = amx(mod, "tilezero", [I8])

    # --- addressing
    def ptr(self, name: str, dtype: str, off) -> ir.Value:
        return self.b.gep(self.a[name], [off], inbounds=True, source_etype=S.MEM[dtype])

    def batch_ptr(self, name: str, bi) -> ir.Value:
        """Buffer `name` advanced to batch element `bi` (through its map)."""
        b, g, off = self.b, self.g, i64(0)
        for n, cs, s in zip(g.batch, contiguous_strides(list(g.batch)), g.maps[name]):
            if n > 1 and s:
                off = b.add(off, b.mul(b.urem(b.udiv(bi, i64(cs)), i64(n)), i64(s)))
        self.a[name] = self.ptr(name, g.dtypes[name], off)
        return self.a[name]

    @contextmanager
    def rows_from(self, name: str, i0) -> Iterator[None]:
        """Buffer `name` read from its row i0 (a query block's) inside the block."""
        saved = self.a[name]
        self.a[name] = self.ptr(name, self.g.dtypes[name],
                                self.b.mul(i0, i64(self.g.strides(name)[0])))
        yield
        self.a[name] = saved

    def ld(self, name: str, dtype: str, off) -> ir.Value:
        return S.load(self.b, self.a[name], dtype, off)

    def st(self, name: str, dtype: str, off, v) -> None:
        S.store(self.b, self.a[name], dtype, off, v)

    def vld(self, name: str, off) -> ir.Value:
        return self.b.load(self.ptr(name, "f32", off), typ=VF, align=4)

    def vst(self, name: str, off, v) -> None:
        self.b.store(v, self.ptr(name, "f32", off), align=4)

    def to_bf16(self, lo: ir.Value, hi: ir.Value) -> ir.Value:
        """Two f32 vectors rounded to bf16 (to nearest even), lo's 16 then hi's (`VB`):
        `HALVES` takes each back out, `ZIP` pairs them lane by lane."""
        cvt = S.declare(self.b.module, "llvm.x86.avx512bf16.cvtne2ps2bf16.512",
                        ir.VectorType(BFloat(), 2 * TILE), [VF, VF])
        return self.b.bitcast(self.b.call(cvt, [hi, lo]), VB)

    def widen(self, bits: ir.Value) -> ir.Value:
        """16 bf16 (their bits) as f32."""
        vi32 = ir.VectorType(I32, TILE)
        return self.b.bitcast(self.b.shl(self.b.zext(bits, vi32), splat_constant(vi32, 16)), VF)

    def key_blocks(self, i0, nq) -> ir.Value:
        """How many key blocks the nq queries from i0 see (causal: up to the last's)."""
        b, g = self.b, self.g
        if not g.causal:
            return i64(g.tkp // BK)
        last = b.udiv(b.sub(b.add(i0, nq), i64(1)), i64(BK))
        return S.at_most(b, b.add(last, i64(1)), g.tkp // BK)

    def unmasked(self, i0, j0) -> ir.Value:
        """Whether the block of keys from j0 hides none from the queries from i0: none
        past Tk, and (causal) none after the block's first query."""
        b, g = self.b, self.g
        last = b.add(j0, i64(BK - 1))
        whole = b.icmp_signed("<", last, i64(g.tk))
        return b.and_(whole, b.icmp_signed("<=", last, i0)) if g.causal else whole

    def score(self, at, key, queries: ir.Value, masked: bool) -> ir.Value:
        """The 16 scores s[at..] times the scale, for `key` and the `queries` (an i32
        vector of their indices); `masked`, -inf where the key is past Tk or (causal)
        after the query."""
        b, g = self.b, self.g
        x = b.fmul(self.vld("s", at), splat_constant(VF, g.scale))
        if masked and g.causal:
            kv = splat(b, b.trunc(key, I32), TILE)
            x = b.select(b.icmp_signed(">", kv, queries), splat_constant(VF, -math.inf), x)
        if masked:
            x = b.select(b.icmp_signed(">=", key, i64(g.tk)), splat_constant(VF, -math.inf), x)
        return x

    def scaled_scores(self, i0, j0) -> list[ir.Value]:
        """s[j][i] *= scale for the block's keys from j0 and queries from i0, -inf where
        hidden (a key past Tk, or above the diagonal where causal: only in blocks that
        have such keys); returns the columns' max, one vector per 16 queries."""
        b = self.b
        ivec = query_indices(b, i0, TILE, NV)
        maxnum = S.declare(b.module, "llvm.maxnum.v16f32", VF, [VF, VF])

        def rows(masked: bool) -> list[ir.Value]:
            def row(j, maxes):
                out = []
                for v in range(NV):
                    at = b.add(b.mul(j, i64(BQ)), i64(v * TILE))
                    x = self.score(at, b.add(j0, j), ivec[v], masked)
                    self.vst("s", at, x)
                    out.append(b.call(maxnum, [maxes[v], x]))
                return out
            ninf = splat_constant(VF, -math.inf)
            return carried(b, i64(0), i64(BK), [ninf] * NV, row, name="j")[1]

        with b.if_else(self.unmasked(i0, j0)) as (plain, masked):
            with plain:
                plain_max, plain_end = rows(False), b.block
            with masked:
                masked_max, masked_end = rows(True), b.block
        out = []
        for x, y in zip(plain_max, masked_max):
            phi = b.phi(VF)
            phi.add_incoming(x, plain_end)
            phi.add_incoming(y, masked_end)
            out.append(phi)
        return out

    # --- packing
    def pack_rows(self, dst: str, src: str, rows: int, cols: int, ld: int) -> None:
        """dst[r][c] (leading dimension ld) = src[r, c] for r < rows, c < cols (the rest of
        dst is zero already): the keys' rows, 32 elements a vector where unit-stride."""
        b, (rs, cs) = self.b, self.g.strides(src)
        vecs = cols // (2 * TILE) if cs == 1 else 0

        def row(r):
            for k in range(vecs):
                x = load_lanes(b, self.a[src], b.add(b.mul(r, i64(rs)), i64(k * 2 * TILE)),
                               BF16, 2 * TILE)
                store_lanes(b, self.a[dst], b.add(b.mul(r, i64(ld)), i64(k * 2 * TILE)), x)
            loop(b, cols - vecs * 2 * TILE, lambda c: self.st(
                dst, "bf16", b.add(b.mul(r, i64(ld)), b.add(c, i64(vecs * 2 * TILE))),
                self.ld(src, "bf16", b.add(b.mul(r, i64(rs)), b.mul(
                    b.add(c, i64(vecs * 2 * TILE)), i64(cs))))), "c")

        loop(b, rows, row, "r")

    def pack_transposed(self, dst: str, src: str, rows: int, cols: int, ld: int,
                        words: bool) -> None:
        """dst[c][r] (leading dimension ld) = src[r, c] for r < rows, c < cols, as 16 x 16
        blocks through registers where src's columns are unit-stride, element by element
        past them. With `words`, c counts pairs of src's columns (32-bit words: the VNNI
        layout of q^T); else bf16 elements (v^T)."""
        b, (rs, cs) = self.b, self.g.strides(src)
        unit = I32 if words else BF16
        scale = 2 if words else 1  # bf16 elements per unit
        rb, cb = (rows // TILE, cols // TILE) if cs == 1 else (0, 0)

        def block(r0, c0):
            vs = [load_lanes(b, self.a[src], b.add(b.mul(b.add(r0, i64(r)), i64(rs)),
                                                   b.mul(c0, i64(scale))), unit, TILE)
                  for r in range(TILE)]
            for c, v in enumerate(transpose_lanes(b, vs)):
                store_lanes(b, self.a[dst], b.mul(b.add(b.mul(b.add(c0, i64(c)), i64(ld)), r0),
                                                  i64(scale)), v)

        loop(b, rb, lambda i: loop(b, cb, lambda j: block(
            b.mul(i, i64(TILE)), b.mul(j, i64(TILE))), "cb"), "rb")

        def element(r, c):
            for h in range(scale):
                x = self.ld(src, "bf16", b.add(b.mul(r, i64(rs)),
                                               b.mul(b.add(b.mul(c, i64(scale)), i64(h)),
                                                     i64(cs))))
                at = b.add(b.mul(b.add(b.mul(c, i64(ld)), r), i64(scale)), i64(h))
                self.st(dst, "bf16", at, x)

        # the rest: rows past the blocks (all columns), then columns past them
        for_range(b, i64(rb * TILE), i64(rows), lambda r: loop(
            b, cols, lambda c: element(r, c), "c"), "r")
        loop(b, rb * TILE, lambda r: for_range(b, i64(cb * TILE), i64(cols),
                                               lambda c: element(r, c), "c"), "r")

    # --- tiles
    def tiles(self, a: str, a_off, a_ld: int, bsrc: str, b_off, b_ld: int, steps: int,
              a_step: int, b_step: int, dst: str, d_off, d_ld: int,
              accumulate: bool = False) -> None:
        """The 32 x 32 block of f32 dst (rows d_ld apart, from d_off) = (with `accumulate`:
        +=) A B over `steps` steps of 32 along K: A bf16 rows a_ld apart from a_off, B
        (`bsrc`) VNNI pair rows of b_ld columns from b_off (bf16 elements), A and B
        advancing a_step and b_step elements a step."""
        b = self.b
        for n, t in enumerate(C_TILES):
            if accumulate:
                b.call(self.load, [tile(t), self._c_ptr(dst, d_off, d_ld, n), i64(d_ld * 4)])
            else:
                b.call(self.zero, [tile(t)])

        def step(ks):
            for h, t in enumerate(A_TILES):
                at = b.add(a_off, b.add(i64(h * TILE * a_ld), b.mul(ks, i64(a_step))))
                b.call(self.load, [tile(t), self.ptr(a, "bf16", at), i64(a_ld * 2)])
            for h, t in enumerate(B_TILES):
                at = b.add(b_off, b.add(i64(h * TILE * 2), b.mul(ks, i64(b_step))))
                b.call(self.load, [tile(t), self.ptr(bsrc, "bf16", at), i64(b_ld * 4)])
            for i, ta in enumerate(A_TILES):
                for j, tb in enumerate(B_TILES):
                    b.call(self.dot, [tile(C_TILES[2 * i + j]), tile(ta), tile(tb)])

        loop(b, steps, step, "ks")
        for n, t in enumerate(C_TILES):
            b.call(self.store, [tile(t), self._c_ptr(dst, d_off, d_ld, n), i64(d_ld * 4)])

    def _c_ptr(self, dst: str, d_off, d_ld: int, n: int) -> ir.Value:
        i, j = divmod(n, 2)
        return self.ptr(dst, "f32", self.b.add(d_off, i64(i * TILE * d_ld + j * TILE)))

    def write_rows(self, dst: str, acc: str, i0, nq, full, width: int, scale=None) -> None:
        """dst[i0 + i, c] = acc[c][i] (times scale[i // 16] lane i % 16, if given; rounded
        where dst is bf16) for queries i < nq and c < width: acc is a transposed [.][BQ]
        block, 16 x 16 blocks through registers where dst's rows are unit-stride and the
        block `full`, element by element past them."""
        b, g = self.b, self.g
        rs, cs = g.strides(dst)
        dtype = g.dtypes[dst]
        blocks = width // TILE if cs == 1 else 0

        def block(c0):
            for v in range(NV):
                rows = [self.vld(acc, b.add(b.mul(b.add(c0, i64(c)), i64(BQ)), i64(v * TILE)))
                        for c in range(TILE)]
                rows = [b.fmul(x, scale[v]) for x in rows] if scale else rows
                for i, x in enumerate(transpose_lanes(b, rows)):
                    at = b.add(b.mul(b.add(i0, i64(v * TILE + i)), i64(rs)), c0)
                    if dtype == "bf16":
                        bits = self.to_bf16(x, x)
                        store_lanes(b, self.a[dst], at, b.shuffle_vector(bits, bits, HALVES[0]))
                    else:
                        self.vst(dst, at, x)

        def element(i, c):
            x = self.ld(acc, "f32", b.add(b.mul(c, i64(BQ)), i))
            if scale:
                lane = b.urem(i, i64(TILE))
                pick = b.icmp_signed("<", i, i64(TILE))
                x = b.fmul(x, b.select(pick, b.extract_element(scale[0], lane),
                                       b.extract_element(scale[-1], lane)))
            self.st(dst, dtype, b.add(b.mul(b.add(i0, i), i64(rs)), b.mul(c, i64(cs))),
                    S.cast(b, x, "f32", dtype))

        with b.if_else(full) as (whole, edge):
            with whole:
                loop(b, blocks, lambda k: block(b.mul(k, i64(TILE))), "cb")
                loop(b, BQ, lambda i: loop(b, width - blocks * TILE, lambda c: element(
                    i, b.add(c, i64(blocks * TILE))), "c"), "i")
            with edge:
                for_range(b, i64(0), nq, lambda i: loop(b, width, lambda c: element(i, c),
                                                        "c"), "i")


def forward_item(mod: ir.Module, g: Geometry, bufs: list[str], name: str) -> ir.Function:
    """`item(o, lse, q, k, v, <scratch buffers>, bi)`: batch element bi."""
    fn = item_function(mod, f"{name}.amx", IO + bufs, {"o", "lse", *bufs})
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Item(b, g, dict(zip(IO + bufs, fn.args)))
    bi = fn.args[-1]
    for n in IO:
        e.batch_ptr(n, bi)
    fill_zero(b, e.a["kp"], "bf16", g.tkp * g.dp)
    fill_zero(b, e.a["vt"], "bf16", g.dvp * g.tkp)
    e.pack_rows("kp", "k", g.tk, g.d, g.dp)
    e.pack_transposed("vt", "v", g.tk, g.dv, g.tkp, False)
    loop(b, g.nqb, lambda qb: _query_block(e, b.mul(qb, i64(BQ))), "qb")
    b.ret_void()
    return fn


def _query_block(e: Item, i0: ir.Value) -> None:
    b, g = e.b, e.g
    nq = S.at_most(b, b.sub(i64(g.tq), i0), BQ)
    fill_zero(b, e.a["qt"], "bf16", g.dp * BQ)
    full = b.icmp_signed("==", nq, i64(BQ))
    with e.rows_from("q", i0):
        pack_transposed_pairs(e, "qt", "q", nq, full, g.d)
    fill_zero(b, e.a["acc"], "f32", g.dvp * BQ)
    for v in range(NV):
        e.vst("m", i64(v * TILE), splat_constant(VF, -math.inf))
        e.vst("l", i64(v * TILE), splat_constant(VF, 0.0))
    for_range(b, i64(0), e.key_blocks(i0, nq), lambda kb: _key_block(e, i0, b.mul(kb, i64(BK))),
              "kb")
    _store_output(e, i0, nq, full)


def _store_output(e: Item, i0: ir.Value, nq: ir.Value, full: ir.Value) -> None:
    """o = acc / l and lse = m + log l, queries i < nq."""
    b, g = e.b, e.g
    inv = [b.fdiv(splat_constant(VF, 1.0), e.vld("l", i64(v * TILE))) for v in range(NV)]
    e.write_rows("o", "acc", i0, nq, full, g.dv, inv)
    lse_stride = g.maps["lse"][g.nb]
    for_range(b, i64(0), nq, lambda i: e.st("lse", "f32", b.mul(b.add(i0, i), i64(lse_stride)),
                                            b.fadd(e.ld("m", "f32", i), vmath.call(
                                                b, "log", "f32", e.ld("l", "f32", i)))), "i")


def pack_pairs_elements(e: Item, dst: str, src: str, nq, width: int) -> None:
    """dst's VNNI pairs of src^T (dst[c // 2][i][c % 2] = src[i, c]) element by element,
    rows i < nq (a block's last, or odd D)."""
    b, g = e.b, e.g
    rs, cs = g.strides(src)

    def one(i, c):
        x = e.ld(src, "bf16", b.add(b.mul(i, i64(rs)), b.mul(c, i64(cs))))
        at = b.add(b.mul(b.udiv(c, i64(2)), i64(2 * BQ)), b.add(b.mul(i, i64(2)),
                                                              b.urem(c, i64(2))))
        e.st(dst, "bf16", at, x)

    for_range(b, i64(0), nq, lambda i: loop(b, width, lambda c: one(i, c), "c"), "i")


def pack_transposed_pairs(e: Item, dst: str, src: str, nq, full, width: int) -> None:
    """dst (zeroed) = src^T's VNNI pairs for the block's rows i < nq (src at its first)."""
    with e.b.if_else(full) as (whole, edge):
        with whole:
            if width % 2:
                pack_pairs_elements(e, dst, src, i64(BQ), width)
            else:
                e.pack_transposed(dst, src, BQ, width // 2, BQ, True)
        with edge:
            pack_pairs_elements(e, dst, src, nq, width)


def _key_block(e: Item, i0: ir.Value, j0: ir.Value) -> None:
    """Keys j0 .. j0 + 31 for the queries from i0: scores, online softmax, values. The
    softmax runs on the two 16-query vectors of each key row."""
    b, g = e.b, e.g
    e.tiles("kp", b.mul(j0, i64(g.dp)), g.dp, "qt", i64(0), BQ, g.dp // PAIR_K, PAIR_K,
            TILE * BQ * 2, "s", i64(0), BQ)
    bmax = e.scaled_scores(i0, j0)
    m = [e.vld("m", i64(v * TILE)) for v in range(NV)]
    # rescale acc, l and m only where a query's max grew past m + RESCALE (lazily: until
    # then p = exp(s - m) stays below e^RESCALE)
    grown = [b.fcmp_ordered(">", bmax[v], b.fadd(m[v], splat_constant(VF, RESCALE)))
             for v in range(NV)]
    any_grown = b.icmp_unsigned("!=", b.bitcast(b.or_(*grown), ir.IntType(TILE)),
                                ir.Constant(ir.IntType(TILE), 0))
    with b.if_then(any_grown):
        _rescale(e, m, bmax)
    m = [e.vld("m", i64(v * TILE)) for v in range(NV)]

    def probs(j2, sums):
        out = []
        for v in range(NV):
            p = [vmath.exp(b, "f32", b.fsub(e.vld("s", b.add(
                b.mul(b.add(b.mul(j2, i64(2)), i64(h)), i64(BQ)), i64(v * TILE))), m[v]))
                for h in (0, 1)]
            bits = e.to_bf16(p[0], p[1])
            store_lanes(b, e.a["pp"], b.mul(b.add(b.mul(j2, i64(BQ)), i64(v * TILE)), i64(2)),
                        b.shuffle_vector(bits, bits, ZIP))
            total = sums[v]
            for h in (0, 1):  # the rounded p, back in f32
                total = b.fadd(total, e.widen(b.shuffle_vector(bits, bits, HALVES[h])))
            out.append(total)
        return out

    _, sums = carried(b, i64(0), i64(BK // 2), [splat_constant(VF, 0.0)] * NV, probs, name="j2")
    for hh in range(g.dvp // PAIR_K):  # acc += v^T p^T, on the tiles
        e.tiles("vt", b.add(i64(hh * PAIR_K * g.tkp), j0), g.tkp, "pp", i64(0), BQ, 1, 0, 0,
                "acc", i64(hh * PAIR_K * BQ), BQ, accumulate=True)
    for v in range(NV):
        at = i64(v * TILE)
        e.vst("l", at, b.fadd(e.vld("l", at), sums[v]))


def _rescale(e: Item, m: list[ir.Value], bmax: list[ir.Value]) -> None:
    """m' = max(m, bmax); acc and l times e^(m - m')."""
    b, g = e.b, e.g
    maxnum = S.declare(b.module, "llvm.maxnum.v16f32", VF, [VF, VF])
    alpha = []
    for v in range(NV):
        mn = b.call(maxnum, [m[v], bmax[v]])
        e.vst("m", i64(v * TILE), mn)
        alpha.append(vmath.exp(b, "f32", b.fsub(m[v], mn)))
        at = i64(v * TILE)
        e.vst("l", at, b.fmul(e.vld("l", at), alpha[v]))

    def row(c):
        for v in range(NV):
            at = b.add(b.mul(c, i64(BQ)), i64(v * TILE))
            e.vst("acc", at, b.fmul(e.vld("acc", at), alpha[v]))

    loop(b, g.dv, row, "c")


def emit_amx_attention(b: ir.IRBuilder, op: Operation, outs: list, ins: list,
                       scratch: ir.Value, isa: Isa, threads: int, name: str,
                       item_fn: Callable[[ir.Module, Geometry, list[str], str], ir.Function]
                       ) -> None:
    """The op's kernel: its items (`item_fn`'s, one per batch element: `forward_item`,
    or amx_backward's) over the thread pool, each thread with its own scratch and tile
    configuration."""
    if not isa.bf16_tiles:
        raise NotImplementedError("attention on bf16 operands needs AMX tiles; "
                                  "low-precision-attention runs only where the cpu has them")
    g = Geometry(op)
    offs, per = g.regions()
    item = item_fn(b.module, g, list(offs), name)
    t = g.threads(threads)
    ptrs = list(outs) + list(ins) + [scratch]
    mod = b.module

    def chunk(bb, ps, lo, hi):
        base = byte_offset(bb, ps[-1], bb.mul(chunk_index(bb, lo, g.nbatch, t), i64(per)))
        regs = [byte_offset(bb, base, off) for off in offs.values()]
        bb.call(amx(mod, "ldtilecfg", [PTR]), [tile_config(mod)])
        for_range(bb, lo, hi, lambda it: bb.call(item, ps[:-1] + regs + [it]), "item")
        bb.call(amx(mod, "tilerelease", []), [])

    if t == 1:
        chunk(b, ptrs, i64(0), i64(g.nbatch))
        return
    parallel_region(b, f"{name}.items", ptrs, [True] * len(outs) + [False] * len(ins) + [True],
                    g.nbatch, t, chunk)
