"""CUDA C kernels of `kernel.attention` and `kernel.attention_grad` (flash-attention style),
so the [..., Tq, Tk] scores never reach global memory.

Every operand is read in place through its map (any strides, batch of any rank), and every
result is written through its map (contiguous unless the op has `out_maps`). Sizes and
strides are constants in the source, as in every kernel of this backend, and tile sizes
are chosen here from the head dims and the dtype so that a block's shared memory stays
within the 48 KB a launch gets without opting in, and its register accumulators within
ACC_BYTES per thread.

- forward: one block per (batch index, tile of BQ query rows); the Q tile stays in shared
  memory, K/V tiles of BK keys are staged through it, and an online softmax (running max
  m, sum l, rescaled accumulator) runs over the key tiles; key tiles wholly above the
  diagonal are skipped when causal. o = acc / l, lse = m + log(l).
- backward, race-free without atomics: `drow` = rowsum(do * o) into scratch; then one
  block per (batch, key tile) accumulating dK and dV over the query tiles that see it,
  and one block per (batch, query tile) accumulating dQ over its key tiles; both rebuild
  p = exp(s - lse) and ds = p * (do v^T - drow) * scale tile by tile.

Each block has THREADS threads; a thread owns fixed elements of the block's output rows
(register accumulators); K and V rows in shared memory are padded by one element where
threads read consecutive keys, so they hit distinct banks; inner loops are unrolled by a
divisor of their trip count (full unrolling made ptxas spill). Masking is top-left
aligned (key j hidden from query i when j > i), so every query row sees key 0 and the
running max is finite after the first key tile. Rows and keys past the ends are
zero-padded in shared memory and masked to probability 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from ...ir import Operation
from ...ir.dialects.kernel_attention import (
    Attention,
    AttentionGrad,
    AttentionShape,
    attention_shape,
)
from ..errors import UnsupportedFusionError
from ..strides import cdiv, collapse, contiguous_strides
from . import launch as L
from .scalar import ITEMSIZE, ctype, literal, math_fn
from .templates import Kernel, indent, offsets, signature

THREADS = 128              # threads per block of every attention kernel (4 warps)
SMEM_BYTES = 48 * 1024     # dynamic shared memory a launch may use without opting in
ACC_BYTES = 128            # register accumulator bytes per thread (32 floats, 16 doubles)
# (outer, inner) tile sizes in order of preference: outer is the rows a block owns (query
# rows, or keys for dK/dV), inner the rows streamed through shared memory per step
TILES = ((64, 64), (64, 32), (32, 32), (32, 16), (16, 16), (16, 8), (8, 8), (8, 4), (4, 4))
CNAME = {"do": "dout"}     # `do` is a C keyword


@dataclass(frozen=True)
class Geometry(AttentionShape):
    """One attention op's AttentionShape for this backend: `maps` holds the scratch `drow`
    (contiguous over [*batch, Tq]) besides every operand and result, and `itype` is the C
    index type every offset fits in."""

    itype: str

    @property
    def nb(self) -> int:
        return math.prod(self.batch)

    @property
    def t(self) -> str:
        return ctype(self.dtype)

    @property
    def item(self) -> int:
        return ITEMSIZE[self.dtype]

    def at(self, name: str, row: str, col: str | None = None) -> str:
        """The C element of buffer `name` at (row, col) of batch index z (`b_<name>`)."""
        m = self.maps[name][len(self.batch):]
        terms = [f"b_{name}", _mul(row, m[0], self.itype)]
        if col is not None:
            terms.append(_mul(col, m[1], self.itype))
        return f"{CNAME.get(name, name)}[{' + '.join(x for x in terms if x != '0')}]"

    def batch_offsets(self, names: list[str]) -> list[str]:
        """Declarations of `b_<name>`: each buffer's offset at flat batch index `z`."""
        dims = collapse([(n, tuple(self.maps[b][a] for b in names))
                         for a, n in enumerate(self.batch)])
        return offsets("z", dims, [f"b_{b}" for b in names], self.itype)


def geometry(op: Operation) -> Geometry:
    """The Geometry of a `kernel.attention` or `kernel.attention_grad` op."""
    s = attention_shape(op)
    maps = {**s.maps, "drow": tuple(contiguous_strides((*s.batch, s.tq)))}
    sizes = [v.type.size for v in op.operands] + [r.type.size for r in op.results]
    return Geometry(s.batch, s.tq, s.tk, s.d, s.dv, s.causal, s.scale, s.dtype, maps,
                    L.index_type(*sizes))


def _mul(x: str, s: int, itype: str) -> str:
    if s == 0:
        return "0"
    x = x if re.fullmatch(r"\w+", x) else f"({x})"
    x = x if itype == "int" else f"({itype}){x}"
    return x if s == 1 else f"{x} * {s}"


def choose_tiles(outer_len: int, inner_len: int, smem: Callable[[int, int], int],
                 acc: Callable[[int], int], what: str) -> tuple[int, int]:
    """The first TILES entry whose shared memory and per-thread accumulators fit, each size
    clamped to the next power of two of the sequence it tiles (but not below 8): a short
    sequence gets one tile, not idle rows."""
    for o, i in TILES:
        o, i = min(o, max(8, L.next_pow2(outer_len))), min(i, max(8, L.next_pow2(inner_len)))
        if smem(o, i) <= SMEM_BYTES and acc(o) <= ACC_BYTES:
            return o, i
    raise UnsupportedFusionError(f"the cuda backend's {what} kernel has no tiling of these head "
                                 f"dims within {SMEM_BYTES} bytes of shared memory", "attention")


def _smem(t: str, arrays: list[tuple[str, int]]) -> tuple[list[str], int]:
    """Pointers carving the dynamic shared memory into `arrays` (name, elements), and the
    elements in all."""
    lines, start, total = [], "", 0
    for name, n in arrays:
        base = f"reinterpret_cast<{t}*>(ember_smem)" if not start else start
        lines.append(f"{t}* const {name} = {base};")
        start, total = f"{name} + {n}", total + n
    return lines, total


def _load(g: Geometry, dst: str, name: str, rows: int, cols: int | None, pitch: int,
          row0: str, limit: int) -> list[str]:
    """Cooperative copy of rows [row0, row0 + rows) of buffer `name` into shared `dst` (row
    pitch `pitch`), zero past row `limit`; cols None: a vector (lse, drow)."""
    zero = literal(g.dtype, 0)
    if cols is None:
        return [f"for (int r = threadIdx.x; r < {rows}; r += {THREADS}) "
                f"{dst}[r] = {row0} + r < {limit} ? {g.at(name, f'{row0} + r')} : {zero};"]
    return [f"for (int e = threadIdx.x; e < {rows * cols}; e += {THREADS}) {{",
            f"  const int r = e / {cols}, c = e % {cols};",
            f"  {dst}[r * {pitch} + c] = {row0} + r < {limit} ? "
            f"{g.at(name, f'{row0} + r', 'c')} : {zero};",
            "}"]


def _owned(count: int, cols: int, body: list[str]) -> list[str]:
    """`body` once for each element e = r * THREADS + tid this thread owns of a row-major
    [count / cols, cols] tile, with `r` (its register index), row `i` and column `c`."""
    inner = [f"const int i = e / {cols}, c = e % {cols};", *body]
    if count % THREADS:
        inner = [f"if (e < {count}) {{", *indent(inner, 2), "}"]
    return ["#pragma unroll", f"for (int r = 0; r < {cdiv(count, THREADS)}; ++r) {{",
            f"  const int e = r * {THREADS} + (int)threadIdx.x;", *indent(inner, 2), "}"]


def _acc(dtype: str, name: str, count: int) -> list[str]:
    """A zeroed register array of the elements this thread owns (see `_owned`)."""
    n = cdiv(count, THREADS)
    return [f"{ctype(dtype)} {name}[{n}];", "#pragma unroll",
            f"for (int r = 0; r < {n}; ++r) {name}[r] = {literal(dtype, 0)};"]


def _kernel(name: str, g: Geometry, params: list[tuple[str, bool]], grid_x: int,
            smem: tuple[list[str], int], body: list[str]) -> Kernel:
    """A kernel over (grid_x tiles, batch index z striding over grid y) with this body,
    after the shared-memory carving `smem` (lines, elements)."""
    ps = [(g.t, CNAME.get(n, n), w) for n, w in params]
    lines = [*smem[0], f"for ({g.itype} z = blockIdx.y; z < {g.nb}; z += gridDim.y) {{",
             *indent(body, 2), "}"]
    src = (signature(name, ps, THREADS) + " {\n" + "\n".join(indent(lines, 2)) + "\n}\n")
    cfg = L.LaunchConfig((grid_x, min(g.nb, L.MAX_GRID_YZ), 1), (THREADS, 1, 1),
                         smem[1] * g.item)
    return Kernel(name, src, cfg, [CNAME.get(n, n) for n, _ in params])


def _loop(var: str, n: int, stmt: str) -> list[str]:
    """`for var in [0, n): stmt`, unrolled by 4, 2 or 1, whichever divides n: fully unrolled
    tile loops, and remainder loops, made ptxas spill."""
    u = next(u for u in (4, 2, 1) if n % u == 0)
    return [f"#pragma unroll {u}", f"for (int {var} = 0; {var} < {n}; ++{var}) {stmt}"]


def _dot(dtype: str, var: str, a: str, b: str, n: int) -> list[str]:
    return [f"{ctype(dtype)} {var} = {literal(dtype, 0)};", *_loop("x", n, f"{var} += {a} * {b};")]


def _rows_end(g: Geometry, bq: int) -> str:
    """The key tiles a query tile at q0 reads end here: past its last row when causal."""
    if not g.causal:
        return str(g.tk)
    end = min(g.tq, g.tk)
    return f"(q0 + {bq} < {end} ? q0 + {bq} : {end})"


def _masked(g: Geometry) -> str:
    cond = [f"q0 + i >= {g.tq}", f"k0 + j >= {g.tk}"]
    return " || ".join(cond + (["k0 + j > q0 + i"] if g.causal else []))


# -- forward ----------------------------------------------------------------------------------

def forward_kernel(name: str, g: Geometry) -> Kernel:
    """o, lse of one op: blocks over query tiles x batch; online softmax over key tiles."""
    t, d, dv, item = g.t, g.d, g.dv, g.item
    bq, bk = choose_tiles(
        g.tq, g.tk, lambda o, i: item * (o * d + i * (d + 1) + i * dv + o * (i + 1) + 3 * o),
        lambda o: cdiv(o * dv, THREADS) * item, "attention")
    sp, pp = bk + 1, d + 1
    smem = _smem(t, [("sQ", bq * d), ("sK", bk * pp), ("sV", bk * dv), ("sS", bq * sp),
                     ("sM", bq), ("sL", bq), ("sA", bq)])
    nqt = cdiv(g.tq, bq)
    inf = literal(g.dtype, float("inf"))
    exp, log = math_fn("exp", g.dtype), math_fn("log", g.dtype)
    body = [
        f"const int q0 = ({nqt - 1} - (int)blockIdx.x) * {bq};  // the longest rows first",
        *g.batch_offsets(["q"]),
        *_load(g, "sQ", "q", bq, d, d, "q0", g.tq),
        f"if (threadIdx.x < {bq}) {{ sM[threadIdx.x] = -{inf}; "
        f"sL[threadIdx.x] = {literal(g.dtype, 0)}; }}",
        *_acc(g.dtype, "acc", bq * dv),
        *g.batch_offsets(["k", "v"]),
        f"const int kend = {_rows_end(g, bq)};",
        f"for (int k0 = 0; k0 < kend; k0 += {bk}) {{",
        "  __syncthreads();  // the last tile's readers are done; sQ is in",
        *indent(_load(g, "sK", "k", bk, d, pp, "k0", g.tk), 2),
        *indent(_load(g, "sV", "v", bk, dv, dv, "k0", g.tk), 2),
        "  __syncthreads();",
        f"  for (int e = threadIdx.x; e < {bq * bk}; e += {THREADS}) {{",
        f"    const int i = e / {bk}, j = e % {bk};",
        *indent(_dot(g.dtype, "s", f"sQ[i * {d} + x]", f"sK[j * {pp} + x]", d), 4),
        f"    sS[i * {sp} + j] = {_masked(g)} ? -{inf} : s * {literal(g.dtype, g.scale)};",
        "  }",
        "  __syncthreads();",
        f"  if (threadIdx.x < {bq}) {{  // one thread per row: the online softmax step",
        f"    {t}* const row = sS + threadIdx.x * {sp};",
        f"    const {t} m0 = sM[threadIdx.x];",
        f"    {t} m = m0;",
        *indent(_loop("j", bk, "m = row[j] > m ? row[j] : m;"), 4),
        f"    {t} sum = {literal(g.dtype, 0)};",
        *indent(_loop("j", bk, f"{{ const {t} p = {exp}(row[j] - m); row[j] = p; sum += p; }}"),
                4),
        f"    const {t} alpha = {exp}(m0 - m);  // 0 on the first tile (m0 = -inf)",
        "    sA[threadIdx.x] = alpha;",
        "    sL[threadIdx.x] = sL[threadIdx.x] * alpha + sum;",
        "    sM[threadIdx.x] = m;",
        "  }",
        "  __syncthreads();",
        *indent(_owned(bq * dv, dv, [
            f"{t} a = acc[r] * sA[i];",
            *_loop("j", bk, f"a += sS[i * {sp} + j] * sV[j * {dv} + c];"),
            "acc[r] = a;"]), 2),
        "}",
        *g.batch_offsets(["o", "lse"]),
        *_owned(bq * dv, dv, [f"if (q0 + i < {g.tq}) {g.at('o', 'q0 + i', 'c')} = "
                              "acc[r] / sL[i];"]),
        f"if (threadIdx.x < {bq} && q0 + (int)threadIdx.x < {g.tq}) "
        f"{g.at('lse', 'q0 + (int)threadIdx.x')} = sM[threadIdx.x] + {log}(sL[threadIdx.x]);",
        "__syncthreads();  // before the next batch index overwrites shared memory",
    ]
    return _kernel(name, g, [("o", True), ("lse", True), ("q", False), ("k", False),
                             ("v", False)], nqt, smem, body)


# -- backward ---------------------------------------------------------------------------------

def drow_kernel(name: str, g: Geometry, sm_count: int) -> Kernel:
    """drow = rowsum(do * o) over every (batch, query row), contiguous: a grid-stride loop."""
    t, n, itype = g.t, g.nb * g.tq, g.itype
    cfg = L.elementwise(n, sm_count)
    offs = g.batch_offsets(["o", "do"])
    body = [
        f"for ({itype} w = ({itype})blockIdx.x * blockDim.x + threadIdx.x; w < {n}; "
        f"w += ({itype})gridDim.x * blockDim.x) {{",
        *([f"  const {itype} z = w / {g.tq};"] if re.search(r"\bz\b", "".join(offs)) else []),
        f"  const int row = (int)(w % {g.tq});",
        *indent(offs, 2),
        *indent(_dot(g.dtype, "s", g.at("do", "row", "x"), g.at("o", "row", "x"), g.dv), 2),
        "  drow[w] = s;",
        "}",
    ]
    ps = [(t, "drow", True), (t, "o", False), (t, "dout", False)]
    src = signature(name, ps, cfg.block[0]) + " {\n" + "\n".join(indent(body, 2)) + "\n}\n"
    return Kernel(name, src, cfg, [p[1] for p in ps])


def _ds_tile(g: Geometry, bq: int, bk: int, with_p: bool) -> list[str]:
    """The [bq, bk] tile of ds (and of p when `with_p`) for query rows q0.. and keys k0..,
    from sQ, sdO, sLse, sDr, sK, sV; masked and padded entries are 0."""
    t, d, dv, sp = g.t, g.d, g.dv, bk + 1
    zero, scale = literal(g.dtype, 0), literal(g.dtype, g.scale)
    return [
        f"for (int e = threadIdx.x; e < {bq * bk}; e += {THREADS}) {{",
        f"  const int i = e / {bk}, j = e % {bk};",
        f"  {t} p = {zero}, ds = {zero};",
        f"  if (!({_masked(g)})) {{",
        *indent(_dot(g.dtype, "s", f"sQ[i * {d} + x]", f"sK[j * {d + 1} + x]", d), 4),
        *indent(_dot(g.dtype, "dp", f"sdO[i * {dv} + x]", f"sV[j * {dv + 1} + x]", dv), 4),
        f"    p = {math_fn('exp', g.dtype)}(s * {scale} - sLse[i]);",
        f"    ds = p * (dp - sDr[i]) * {scale};",
        "  }",
        *([f"  sP[i * {sp} + j] = p;"] if with_p else []),
        f"  sdS[i * {sp} + j] = ds;",
        "}",
    ]


def _query_tile(g: Geometry, bq: int) -> list[str]:
    """Loads of the query-side tiles at q0: sQ, sdO, sLse, sDr."""
    return [*_load(g, "sQ", "q", bq, g.d, g.d, "q0", g.tq),
            *_load(g, "sdO", "do", bq, g.dv, g.dv, "q0", g.tq),
            *_load(g, "sLse", "lse", bq, None, 1, "q0", g.tq),
            *_load(g, "sDr", "drow", bq, None, 1, "q0", g.tq)]


def _key_tile(g: Geometry, bk: int) -> list[str]:
    return [*_load(g, "sK", "k", bk, g.d, g.d + 1, "k0", g.tk),
            *_load(g, "sV", "v", bk, g.dv, g.dv + 1, "k0", g.tk)]


def dkv_kernel(name: str, g: Geometry) -> Kernel:
    """dk, dv: one block per key tile x batch, over the query tiles that see its keys."""
    t, d, dv, item = g.t, g.d, g.dv, g.item
    bk, bq = choose_tiles(
        g.tk, g.tq, lambda o, i: item * (o * (d + 1) + o * (dv + 1) + i * d + i * dv
                                         + 2 * i * (o + 1) + 2 * i),
        lambda o: (cdiv(o * d, THREADS) + cdiv(o * dv, THREADS)) * item, "attention_grad")
    sp = bk + 1
    smem = _smem(t, [("sK", bk * (d + 1)), ("sV", bk * (dv + 1)), ("sQ", bq * d),
                     ("sdO", bq * dv), ("sP", bq * sp), ("sdS", bq * sp), ("sLse", bq),
                     ("sDr", bq)])
    first = f"(k0 / {bq}) * {bq}" if g.causal else "0"  # queries before k0 see none of it
    body = [
        f"const int k0 = (int)blockIdx.x * {bk};",
        *g.batch_offsets(["k", "v"]),
        *_key_tile(g, bk),
        *_acc(g.dtype, "gk", bk * d),
        *_acc(g.dtype, "gv", bk * dv),
        *g.batch_offsets(["q", "lse", "do", "drow"]),
        f"for (int q0 = {first}; q0 < {g.tq}; q0 += {bq}) {{",
        "  __syncthreads();  // the last tile's readers are done; sK, sV are in",
        *indent(_query_tile(g, bq), 2),
        "  __syncthreads();",
        *indent(_ds_tile(g, bq, bk, True), 2),
        "  __syncthreads();",
        *indent(_owned(bk * dv, dv, [
            f"{t} a = gv[r];",
            *_loop("q", bq, f"a += sP[q * {sp} + i] * sdO[q * {dv} + c];"),
            "gv[r] = a;"]), 2),
        *indent(_owned(bk * d, d, [
            f"{t} a = gk[r];",
            *_loop("q", bq, f"a += sdS[q * {sp} + i] * sQ[q * {d} + c];"),
            "gk[r] = a;"]), 2),
        "}",
        *g.batch_offsets(["dk", "dv"]),
        *_owned(bk * d, d, [f"if (k0 + i < {g.tk}) {g.at('dk', 'k0 + i', 'c')} = gk[r];"]),
        *_owned(bk * dv, dv, [f"if (k0 + i < {g.tk}) {g.at('dv', 'k0 + i', 'c')} = gv[r];"]),
        "__syncthreads();  // before the next batch index overwrites shared memory",
    ]
    return _kernel(name, g, [("dk", True), ("dv", True), ("q", False), ("k", False),
                             ("v", False), ("lse", False), ("do", False), ("drow", False)],
                   cdiv(g.tk, bk), smem, body)


def dq_kernel(name: str, g: Geometry) -> Kernel:
    """dq: one block per query tile x batch, over the key tiles its rows see."""
    t, d, dv, item = g.t, g.d, g.dv, g.item
    bq, bk = choose_tiles(
        g.tq, g.tk, lambda o, i: item * (o * d + o * dv + 2 * o + i * (d + 1) + i * (dv + 1)
                                         + o * (i + 1)),
        lambda o: cdiv(o * d, THREADS) * item, "attention_grad")
    sp = bk + 1
    smem = _smem(t, [("sQ", bq * d), ("sdO", bq * dv), ("sLse", bq), ("sDr", bq),
                     ("sK", bk * (d + 1)), ("sV", bk * (dv + 1)), ("sdS", bq * sp)])
    nqt = cdiv(g.tq, bq)
    body = [
        f"const int q0 = ({nqt - 1} - (int)blockIdx.x) * {bq};  // the longest rows first",
        *g.batch_offsets(["q", "lse", "do", "drow"]),
        *_query_tile(g, bq),
        *_acc(g.dtype, "gq", bq * d),
        *g.batch_offsets(["k", "v"]),
        f"const int kend = {_rows_end(g, bq)};",
        f"for (int k0 = 0; k0 < kend; k0 += {bk}) {{",
        "  __syncthreads();  // the last tile's readers are done; the query tiles are in",
        *indent(_key_tile(g, bk), 2),
        "  __syncthreads();",
        *indent(_ds_tile(g, bq, bk, False), 2),
        "  __syncthreads();",
        *indent(_owned(bq * d, d, [
            f"{t} a = gq[r];",
            *_loop("j", bk, f"a += sdS[i * {sp} + j] * sK[j * {d + 1} + c];"),
            "gq[r] = a;"]), 2),
        "}",
        *g.batch_offsets(["dq"]),
        *_owned(bq * d, d, [f"if (q0 + i < {g.tq}) {g.at('dq', 'q0 + i', 'c')} = gq[r];"]),
        "__syncthreads();  // before the next batch index overwrites shared memory",
    ]
    return _kernel(name, g, [("dq", True), ("q", False), ("k", False), ("v", False),
                             ("lse", False), ("do", False), ("drow", False)],
                   nqt, smem, body)


# -- lowering ---------------------------------------------------------------------------------

def lower_attention(lw, op: Operation) -> None:
    """Adds the op's result slots and launches to `lw` (a codegen.Lowering): the forward
    kernel; or drow into scratch, then the dK/dV and dQ kernels."""
    g = geometry(op)
    outs = [lw.result(r) for r in op.results]
    arg = {n: lw.where[v] for n, v in zip(AttentionGrad.operand_names, op.operands)}
    if op.name == Attention.name:
        lw.launch(forward_kernel(lw.name(op), g), outs + [arg["q"], arg["k"], arg["v"]])
        return
    dq, dk, dv = outs
    drow = lw.scratch((g.nb * g.tq,), g.dtype)
    lw.launch(drow_kernel(lw.name(op, "_drow"), g, lw.sm), [drow, arg["o"], arg["do"]])
    ins = [arg["q"], arg["k"], arg["v"], arg["lse"], arg["do"], drow]
    lw.launch(dkv_kernel(lw.name(op, "_dkv"), g), [dk, dv, *ins])
    lw.launch(dq_kernel(lw.name(op, "_dq"), g), [dq, *ins])


LOWERINGS = {Attention.name: lower_attention, AttentionGrad.name: lower_attention}
