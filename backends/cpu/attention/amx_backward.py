"""`kernel.attention_grad` on bf16 q, k, v and do (f32 o and lse) on AMX tiles: the
backward of amx.py's flash attention, all of one batch element per item.

The item packs its keys and values once (`kp` [Tkp][Dp] and `vp` [Tkp][DVp], rows; `kt`
[Dp][Tkp], k transposed) and sums dk and dv over every query block in f32 (`dka`, `dva`).
Per block of 32 queries: q^T and do^T in the VNNI layout (`qt`, `dot`), q and do by
pairs of rows (`qv`, `dov`: the B operands of products over queries), Drow =
rowsum(do * o) and lse. Per block of 32 keys, five products of tiles, as transposes with
keys in rows so that every softmax quantity is a vector over queries:
- s^T = k q^T and dp^T = v do^T (exact: bf16 times bf16, f32 sums);
- p^T = exp(s^T scale - lse) (masked), ds^T = p^T (dp^T - Drow) scale, each rounded to
  bf16 as rows (`pa`, `dsa`) and ds^T also by pairs of keys (`dsv`);
- dv += p^T do, dk += ds^T q (tiles loaded from and stored back to dva, dka) and
  dq^T += k^T ds^T (`dqt`, written to dq after the block's last key).
p and ds rounded to bf16 before they multiply are the backward's roundings (PyTorch's bf16
flash attention makes them too); every sum is f32.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ..gemm.bf16 import BF16, PAIR_K, TILE, load_lanes, store_lanes
from ..kernels import scalar as S
from ..kernels import vmath
from ..kernels.loops import fill_zero, for_range, loop
from ..kernels.scalar import i64
from ..kernels.vmath import splat_constant
from .amx import BK, BQ, HALVES, NV, VF, ZIP, Geometry, Item, pack_transposed_pairs
from .tiles import item_function, query_indices

IO = ["dq", "dk", "dv", "q", "k", "v", "o", "lse", "do"]


def backward_item(mod: ir.Module, g: Geometry, bufs: list[str], name: str) -> ir.Function:
    """`item(dq, dk, dv, q, k, v, o, lse, do, <scratch buffers>, bi)`: batch element bi."""
    fn = item_function(mod, f"{name}.amx_grad", IO + bufs, {"dq", "dk", "dv", *bufs})
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Item(b, g, dict(zip(IO + bufs, fn.args)))
    bi = fn.args[-1]
    for n in IO:
        e.batch_ptr(n, bi)
    for buf, n in (("kp", g.tkp * g.dp), ("vp", g.tkp * g.dvp), ("kt", g.dp * g.tkp)):
        fill_zero(b, e.a[buf], "bf16", n)
    for buf, n in (("dka", g.tkp * g.dp), ("dva", g.tkp * g.dvp)):
        fill_zero(b, e.a[buf], "f32", n)
    e.pack_rows("kp", "k", g.tk, g.d, g.dp)
    e.pack_rows("vp", "v", g.tk, g.dv, g.dvp)
    e.pack_transposed("kt", "k", g.tk, g.d, g.tkp, False)
    loop(b, g.nqb, lambda qb: _query_block(e, b.mul(qb, i64(BQ))), "qb")
    for res, acc, width, ld in (("dk", "dka", g.d, g.dp), ("dv", "dva", g.dv, g.dvp)):
        rs, cs = g.strides(res)
        dt = g.dtypes[res]
        loop(b, g.tk, lambda j, res=res, acc=acc, width=width, ld=ld, rs=rs, cs=cs, dt=dt: loop(
            b, width, lambda c: e.st(res, dt, b.add(b.mul(j, i64(rs)), b.mul(c, i64(cs))),
                                     S.cast(b, e.ld(acc, "f32", b.add(b.mul(j, i64(ld)), c)),
                                            "f32", dt)), "c"), "j")
    b.ret_void()
    return fn


def _pack_rows_by_pairs(e: Item, dst: str, src: str, nq, full, width: int, ld: int) -> None:
    """dst[i // 2][c][i % 2] = src[i, c] (dst zeroed; src from the block's first row) for
    rows i < nq and c < width: 16 columns of two rows interleaved by one shuffle where
    src's rows are unit-stride and the block full, element by element past them."""
    b, g = e.b, e.g
    rs, cs = g.strides(src)
    vecs = width // TILE if cs == 1 else 0

    def pair(r2):
        for k in range(vecs):
            rows = [load_lanes(b, e.a[src], b.add(b.mul(b.add(b.mul(r2, i64(2)), i64(h)),
                                                        i64(rs)), i64(k * TILE)), BF16, TILE)
                    for h in (0, 1)]
            store_lanes(b, e.a[dst], b.mul(b.add(b.mul(r2, i64(ld)), i64(k * TILE)), i64(2)),
                        b.shuffle_vector(rows[0], rows[1], ZIP))

    def element(i, c):
        x = e.ld(src, "bf16", b.add(b.mul(i, i64(rs)), b.mul(c, i64(cs))))
        at = b.add(b.mul(b.add(b.mul(b.udiv(i, i64(2)), i64(ld)), c), i64(2)), b.urem(i, i64(2)))
        e.st(dst, "bf16", at, x)

    with b.if_else(full) as (whole, edge):
        with whole:
            loop(b, BQ // 2, pair, "r2")
            loop(b, BQ, lambda i: for_range(b, i64(vecs * TILE), i64(width),
                                            lambda c: element(i, c), "c"), "i")
        with edge:
            for_range(b, i64(0), nq, lambda i: loop(b, width, lambda c: element(i, c), "c"),
                      "i")


def _query_block(e: Item, i0: ir.Value) -> None:
    b, g = e.b, e.g
    nq = S.at_most(b, b.sub(i64(g.tq), i0), BQ)
    full = b.icmp_signed("==", nq, i64(BQ))
    for buf, n in (("qt", g.dp), ("dot", g.dvp), ("qv", g.dp), ("dov", g.dvp)):
        fill_zero(b, e.a[buf], "bf16", n * BQ)
    with e.rows_from("q", i0):
        pack_transposed_pairs(e, "qt", "q", nq, full, g.d)
        _pack_rows_by_pairs(e, "qv", "q", nq, full, g.d, g.dp)
    with e.rows_from("do", i0):
        pack_transposed_pairs(e, "dot", "do", nq, full, g.dv)
        _pack_rows_by_pairs(e, "dov", "do", nq, full, g.dv, g.dvp)
    (ors, ocs), (drs, dcs) = g.strides("o"), g.strides("do")
    lse_stride = g.maps["lse"][g.nb]

    def rows(i):  # Drow = rowsum(do * o), 0 past Tq; lse, +inf past Tq (so p = 0)
        inside = b.icmp_signed("<", i, nq)
        r = b.add(i0, b.select(inside, i, i64(0)))
        e.st("drow", "f32", i, S.const("f32", 0.0))
        loop(b, g.dv, lambda c: e.st("drow", "f32", i, b.fadd(e.ld("drow", "f32", i), b.fmul(
            S.cast(b, e.ld("do", "bf16", b.add(b.mul(r, i64(drs)), b.mul(c, i64(dcs)))),
                   "bf16", "f32"),
            S.cast(b, e.ld("o", g.dtypes["o"], b.add(b.mul(r, i64(ors)), b.mul(c, i64(ocs)))),
                   g.dtypes["o"], "f32")))), "c")
        e.st("drow", "f32", i, b.select(inside, e.ld("drow", "f32", i), S.const("f32", 0.0)))
        e.st("lse_b", "f32", i, b.select(inside, e.ld("lse", "f32", b.mul(r, i64(lse_stride))),
                                         S.const("f32", math.inf)))

    loop(b, BQ, rows, "i")
    fill_zero(b, e.a["dqt"], "f32", g.dp * BQ)
    for_range(b, i64(0), e.key_blocks(i0, nq), lambda kb: _key_block(e, i0, b.mul(kb, i64(BK))),
              "kb")
    e.write_rows("dq", "dqt", i0, nq, full, g.d)


def _key_block(e: Item, i0: ir.Value, j0: ir.Value) -> None:
    """Keys j0 .. j0 + 31 for the queries from i0."""
    b, g = e.b, e.g
    e.tiles("kp", b.mul(j0, i64(g.dp)), g.dp, "qt", i64(0), BQ, g.dp // PAIR_K, PAIR_K,
            TILE * BQ * 2, "s", i64(0), BQ)
    e.tiles("vp", b.mul(j0, i64(g.dvp)), g.dvp, "dot", i64(0), BQ, g.dvp // PAIR_K, PAIR_K,
            TILE * BQ * 2, "dp", i64(0), BQ)
    scale = splat_constant(VF, g.scale)
    lse = [e.vld("lse_b", i64(v * TILE)) for v in range(NV)]
    drow = [e.vld("drow", i64(v * TILE)) for v in range(NV)]
    ivec = query_indices(b, i0, TILE, NV)

    def pair(j2, masked: bool):
        for v in range(NV):
            p, ds = [], []
            for h in (0, 1):
                j = b.add(b.mul(j2, i64(2)), i64(h))
                at = b.add(b.mul(j, i64(BQ)), i64(v * TILE))
                x = e.score(at, b.add(j0, j), ivec[v], masked)
                p.append(vmath.exp(b, "f32", b.fsub(x, lse[v])))
                ds.append(b.fmul(b.fmul(p[h], b.fsub(e.vld("dp", at), drow[v])), scale))
            for vals, rows_buf, pairs_buf in ((p, "pa", None), (ds, "dsa", "dsv")):
                bits = e.to_bf16(vals[0], vals[1])
                for h in (0, 1):  # the two keys' rows
                    row = b.add(b.mul(b.add(b.mul(j2, i64(2)), i64(h)), i64(BQ)), i64(v * TILE))
                    store_lanes(b, e.a[rows_buf], row, b.shuffle_vector(bits, bits, HALVES[h]))
                if pairs_buf:
                    store_lanes(b, e.a[pairs_buf],
                                b.mul(b.add(b.mul(j2, i64(BQ)), i64(v * TILE)), i64(2)),
                                b.shuffle_vector(bits, bits, ZIP))

    with b.if_else(e.unmasked(i0, j0)) as (plain, masked):
        with plain:
            loop(b, BK // 2, lambda j2: pair(j2, False), "j2")
        with masked:
            loop(b, BK // 2, lambda j2: pair(j2, True), "j2")
    for hh in range(g.dvp // PAIR_K):  # dv += p do
        e.tiles("pa", i64(0), BQ, "dov", i64(hh * PAIR_K * 2), g.dvp, 1, 0, 0, "dva",
                b.add(b.mul(j0, i64(g.dvp)), i64(hh * PAIR_K)), g.dvp, accumulate=True)
    for hh in range(g.dp // PAIR_K):  # dk += ds q, dq^T += k^T ds^T
        e.tiles("dsa", i64(0), BQ, "qv", i64(hh * PAIR_K * 2), g.dp, 1, 0, 0, "dka",
                b.add(b.mul(j0, i64(g.dp)), i64(hh * PAIR_K)), g.dp, accumulate=True)
        e.tiles("kt", b.add(i64(hh * PAIR_K * g.tkp), j0), g.tkp, "dsv", i64(0), BQ, 1, 0, 0,
                "dqt", i64(hh * PAIR_K * BQ), BQ, accumulate=True)
