"""`kernel.matmul`: per batch element a GEMM (OpenBLAS or ember's own, chosen by the
measured cost table), then the epilogue as one fused loop over the output. Batch dims
that only continue the rows of A and C (a Linear on [B, T, C]) are rows of one GEMM.
When the own GEMM computes the whole product in one call, each thread runs the epilogue
on every block of rows it finishes, while they are in its cache, instead of a second
pass over the output (a bias + GELU epilogue of a 2048 x 512 product: 0.55 -> 0.15 ms).

The GEMM accumulates straight into the first result when that result is the plain
product layout (row-major, unit column stride); otherwise into scratch memory that the
epilogue reads. Operand strides come from the op's maps, so transposes are free: BLAS
gets them as transpose flags, the own GEMM reads A through strides and packs B.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llvmlite import ir

from ....ir import Block, Operation, Region, ScalarType
from ....ir.dialects.kernel import accumulator_dtype
from ....ir.memory_plan import overwritable_operands
from ....ir.types import LOW_PRECISION
from ...errors import UnsupportedOpError
from ...strides import contiguous_strides
from ..call.buffers import regions
from ..kernels import scalar as S
from ..kernels.fused import FusedEmitter
from ..kernels.loops import for_range, loop
from ..kernels.scalar import i64
from ..machine.host import Isa
from ..parallel.outline import parallel_chunks, parallel_region
from . import blas as B
from .bf16 import bf16_finishes_rows, emit_bf16, plan_bf16
from .cost import choose
from .emit import THREAD_FLOPS, GemmProblem, RowsDone, emit_own, finishes_rows, packs_b, plan_own


@dataclass
class MatmulPlan:
    batch: list[int]  # the batch dims the GEMMs loop over (the others folded into M)
    problem: GemmProblem
    a_batch: list[int]
    b_batch: list[int]
    c_batch: list[int]
    c_map: list[int]  # the product's strides over the space less K, read by the epilogue
    in_place: bool  # accumulate into result 0
    engine: str  # "blas" | "own" | "bf16" (bf16 operands, f32 sums: gemm/bf16.py)
    trivial: bool  # the epilogue only stores the product
    swapped: bool  # the GEMM computes the product's transpose (see plan_matmul)
    # scratch: the product (unless in place), then the GEMM's packed panels (own engine)
    gemm_offset: int  # bytes from the start of scratch to the GEMM's part
    scratch: int  # bytes in all
    k_slices: int = 1  # threads that each multiply a slice of K into a product of their own


def as_kernel(op):
    """An unfused `ember.matmul` as the equivalent `kernel.matmul` (an epilogue that only
    stores the product), so graphs that were not fused still get the fast GEMM."""
    a, b = (v.type for v in op.operands)
    out = op.result.type
    nb = out.rank - 2
    space = list(out.shape) + [a.shape[-1]]
    maps = []
    for t, (row, col) in ((a, (nb, nb + 2)), (b, (nb + 2, nb + 1))):
        st = contiguous_strides(t.shape)
        m = [0] * len(space)
        lead = nb - (t.rank - 2)
        for i, d in enumerate(t.shape[:-2]):
            m[lead + i] = st[i] if d != 1 else 0
        m[row], m[col] = st[-2], st[-1]
        maps.append(m)
    block = Block([ScalarType(out.dtype)])
    block.append(Operation("kernel.yield", [block.args[0]], []))
    stand_ins = Block([a, b]).args  # the graph's values get no extra uses
    return Operation("kernel.matmul", stand_ins, [out],
                     {"space": space, "maps": maps,
                      "out_maps": [contiguous_strides(out.shape) + [0]], "out_types": [out]},
                     [Region([block])])


def _updates_an_input(op) -> bool:
    """Whether result 0 is computed over an input of the graph that it may overwrite (a
    param or optimizer state, as a training step's weight update fused into its gradient's
    GEMM): its product then goes to scratch, so that a step updating that input in place
    (call/bound.py) reads it before the result is written."""
    k = overwritable_operands(op, 0, range(len(op.operands)))
    return any(op.operands[i].op is None or op.operands[i].op.name == "ember.param" for i in k)


def plan_matmul(op, isa: Isa, threads: int, prepack: bool = False) -> MatmulPlan:
    """How `op` runs. `prepack`: its B (operand 1) stays the same from call to call, so the
    own GEMM may read it packed ahead of the call (`problem.prepacked`; call/executable.py
    packs it when bound) where it would pack it anyway: one GEMM (no batch loop), not
    swapped, and never OpenBLAS, which packs on every call."""
    a = op.attributes
    space, maps = a["space"], a["maps"]
    nb = len(space) - 3
    batch, (m, n, k) = space[:nb], space[nb:]
    ma, mb = maps[0], maps[1]
    dt = op.operands[0].type.dtype
    sums = accumulator_dtype(op)
    o = a["out_maps"][0][:-1]
    t0 = a["out_types"][0]
    in_place = (t0.dtype == sums and (o[nb + 1] == 1 or n == 1)
                and (m == 1 or o[nb] >= n) and all(s or d == 1 for s, d in zip(o, space))
                and not _updates_an_input(op))

    def layout(in_place: bool):
        """C's leading dimension and map (the epilogue's), and the batch folded into rows:
        in the first result when in place, else in contiguous scratch."""
        ldc = (o[nb] if m > 1 else n) if in_place else n
        c_batch = o[:nb] if in_place else [s * m * n for s in contiguous_strides(batch)]
        c_map = list(c_batch) + [ldc if m > 1 else 0, 1 if n > 1 else 0]
        return (ldc, c_map, *_fold_rows(batch, ma[:nb], mb[:nb], c_batch, m, ma[nb], ldc))

    ldc, c_map, loop, a_batch, b_batch, c_batch, rows = layout(in_place)
    p = GemmProblem(rows, n, k, ma[nb], ma[nb + 2], mb[nb + 2], mb[nb + 1], ldc, dt,
                    sums=sums if sums != dt else None)
    if dt in LOW_PRECISION:  # bf16 into f32 (low-precision-gemm), gemm/bf16.py
        return _low_precision_plan(op, p, loop, a_batch, b_batch, c_batch, c_map, in_place,
                                   isa, threads)
    # C narrower than a vector but tall, with A read down its columns (a weight gradient
    # X^T dY of a classifier head): computing C^T = B^T A^T instead puts M in the vector
    # lanes and reads A^T's rows contiguously; the epilogue reads the product transposed
    lanes = isa.lanes(dt)
    swapped = nb == 0 and ma[nb] == 1 and k > 1 and n < lanes and m >= 2 * lanes
    if swapped:  # the product is C^T, row-major: element (i, j) at j * M + i
        in_place = False
        p = GemmProblem(n, m, k, mb[nb + 1], mb[nb + 2], ma[nb + 2], ma[nb], m, dt)
        c_map = [1 if m > 1 else 0, m if n > 1 else 0]
    if prepack and not swapped and _prod(loop) == 1 and packs_b(p, isa, threads):
        p = replace(p, prepacked=True)
    engine = "own" if p.prepacked else engine_for(p, isa, threads)
    slices = 1 if swapped or p.prepacked or _prod(loop) != 1 else k_slices(p, engine, threads)
    if slices > 1 and in_place:  # the slices' products go to scratch, the epilogue adds them
        in_place = False
        ldc, c_map, loop, a_batch, b_batch, c_batch, rows = layout(False)
        p = replace(p, m=rows, ldc=ldc)
    trivial = _trivial(op, in_place)
    if not trivial and engine == "own" and not swapped and slices == 1 and _prod(loop) == 1:
        p = replace(p, finish_rows=True)  # the epilogue may follow its rows (`_rows_done`)
    c_bytes = slices * _prod(batch) * m * n * S.size(dt) if not in_place else 0
    gemm_bytes = (gemm_scratch(p, engine, isa, threads) if slices == 1 else
                  regions(*[gemm_scratch(_slice(p, slices), engine, isa, 1)] * slices)[1])
    (_, gemm_offset), total = regions(c_bytes, gemm_bytes)
    return MatmulPlan(loop, p, a_batch, b_batch, c_batch, c_map, in_place, engine, trivial,
                      swapped, gemm_offset, total, slices)


def _low_precision_plan(op, p: GemmProblem, loop, a_batch, b_batch, c_batch, c_map,
                        in_place: bool, isa: Isa, threads: int) -> MatmulPlan:
    """The plan of a GEMM on bf16 operands (f32 sums, gemm/bf16.py): not swapped, not split
    along K; one GEMM (no batch loop) runs its epilogue on each block of rows a thread
    finishes, as the own engine does."""
    if p.dtype != "bf16" or p.c_dtype != "f32" or not isa.bf16_gemm:
        raise UnsupportedOpError(f"the cpu backend multiplies {p.dtype} into {p.c_dtype} only "
                                 "as bf16 into f32, with AMX or AVX512-BF16: run "
                                 "widen-low-precision, without low-precision-gemm")
    trivial = _trivial(op, in_place)
    if not trivial and _prod(loop) == 1:
        p = replace(p, finish_rows=True)
    c_bytes = 0 if in_place else _prod(loop) * p.m * p.n * S.size(p.c_dtype)
    (_, gemm_offset), total = regions(c_bytes, plan_bf16(p, isa, threads).scratch)
    return MatmulPlan(loop, p, a_batch, b_batch, c_batch, c_map, in_place, "bf16",
                      trivial, False, gemm_offset, total)


def _trivial(op, in_place: bool) -> bool:
    """Whether the epilogue only stores the product, where the GEMM put it."""
    block = op.regions[0].blocks[0]
    body = block.ops
    return (in_place and len(body) == 1 and len(body[0].operands) == 1
            and body[0].operands[0] is block.args[0])


# K at least this long, and this many times C's longer side, splits across threads
SPLIT_K_MIN = 1024
SPLIT_K_RATIO = 4


def k_slices(p: GemmProblem, engine: str, threads: int) -> int:
    """Slices of K that threads multiply each into a product of its own, added up after:
    for a small C and a long K (a weight gradient X^T dY, K = batch x tokens). Split by
    rows or columns of C, every thread would stream all of the packed B (half of it from
    the other core's cache) for a sliver of C; split by K, each reads only its half of A
    and B, and the products (C's size, small here) are added up once."""
    if (threads < 2 or engine != "own" or p.flops < THREAD_FLOPS or p.k < SPLIT_K_MIN
            or p.k < SPLIT_K_RATIO * max(p.m, p.n)):
        return 1
    t = threads
    while p.k % t:
        t -= 1
    return t


def _slice(p: GemmProblem, slices: int) -> GemmProblem:
    return replace(p, k=p.k // slices)


def _fold_rows(batch, a_batch, b_batch, c_batch, m, sa_m, ldc):
    """Trailing batch dims that only continue A's and C's rows (B the same for each: a
    Linear on [B, T, C] with the weight broadcast) become rows of one taller GEMM, so
    M = B*T is one call, not B calls of T rows. Returns what is left of the batch (its
    strides in A, B and C) and the rows."""
    batch, a_batch, b_batch, c_batch = (list(x) for x in (batch, a_batch, b_batch, c_batch))
    while batch and (batch[-1] == 1 or (
            m > 1 and b_batch[-1] == 0 and a_batch[-1] == m * sa_m and c_batch[-1] == m * ldc)):
        m *= batch.pop()
        for x in (a_batch, b_batch, c_batch):
            x.pop()
    return batch, a_batch, b_batch, c_batch, m


def engine_for(p: GemmProblem, isa: Isa, threads: int) -> str:
    """"blas" when the cost table prefers it and BLAS can take these strides, else "own"."""
    engine = choose(p, isa, threads)
    if engine == "blas" and (B.find() is None or B.layout(p.m, p.k, p.sa_m, p.sa_k) is None
                             or B.layout(p.k, p.n, p.sb_k, p.sb_n) is None):
        return "own"
    return engine


def gemm_scratch(p: GemmProblem, engine: str, isa: Isa, threads: int) -> int:
    return plan_own(p, isa, threads).scratch if engine == "own" else 0


def gemm_call(b: ir.IRBuilder, p: GemmProblem, engine: str, pa, pb, pc, scratch, isa: Isa,
              threads: int, name: str, accumulate: bool = False,
              rows_done: RowsDone | None = None) -> None:
    """C (+)= A B for element pointers pa, pb, pc with `engine` (`accumulate`: not bf16)."""
    if engine == "bf16":
        assert not accumulate
        emit_bf16(b, p, pa, pb, pc, scratch, isa, threads, name, rows_done)
    elif engine == "blas":
        ta, lda = B.layout(p.m, p.k, p.sa_m, p.sa_k)
        tb, ldb = B.layout(p.k, p.n, p.sb_k, p.sb_n)
        B.call_gemm(b, p.dtype, ta, tb, p.m, p.n, p.k, pa, lda, pb, ldb, pc, p.ldc,
                    1.0 if accumulate else 0.0)
    else:
        emit_own(b, p, pa, pb, pc, scratch, isa, threads, name, accumulate, rows_done)


def scratch_bytes(op, isa: Isa, threads: int, prepack: bool = False) -> int:
    return plan_matmul(op, isa, threads, prepack).scratch


def packed_b(op, isa: Isa, threads: int) -> GemmProblem | None:
    """The GEMM problem of `op` with its B read prepacked, where it can be (`plan_matmul`'s
    `prepack`); its packed panels take `packed_bytes` of it."""
    p = plan_matmul(op, isa, threads, prepack=True).problem
    return p if p.prepacked else None


def packed_bytes(p: GemmProblem, isa: Isa, threads: int) -> int:
    """Bytes of B's panels over all of K, as `pack_function` writes them."""
    nr = plan_own(p, isa, threads).nr
    return -(-p.n // nr) * nr * p.k * S.size(p.dtype)


def byte_offset(b: ir.IRBuilder, ptr, nbytes) -> ir.Value:
    """`ptr` advanced by `nbytes` (an int or an i64 value): scratch regions are laid out
    in bytes (buffers.regions), whatever the element type."""
    if isinstance(nbytes, int):
        if not nbytes:
            return ptr
        nbytes = i64(nbytes)
    return b.gep(ptr, [nbytes], inbounds=True, source_etype=ir.IntType(8))


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def emit_matmul(b: ir.IRBuilder, op, outs: list, ins: list, scratch, isa: Isa, threads: int,
                name: str, packed=None) -> None:
    """`op`'s GEMM and epilogue; `packed`: its B's panels, packed ahead of the call (where
    `packed_b` allows), else None."""
    pl = plan_matmul(op, isa, threads, prepack=packed is not None)
    p = pl.problem
    els = [S.REG[p.dtype], S.REG[p.dtype], S.REG[p.c_dtype]]
    c = outs[0] if pl.in_place else scratch
    gscr = byte_offset(b, scratch, pl.gemm_offset)
    nbatch = _prod(pl.batch)
    bstr = contiguous_strides(pl.batch)

    epilogue = None if pl.trivial else _epilogue(op, pl, name)
    rows_done = _rows_done(b, epilogue, pl, [c] + list(ins[2:]), outs, isa, threads)

    batch_threads = _batch_threads(pl, isa, threads)
    gemm_threads = 1 if batch_threads > 1 else threads

    def one(bb: ir.IRBuilder, ptrs: list, bi) -> None:
        """The GEMM of batch element bi on `ptrs`: A, B, C and its scratch (or packed B)."""
        offs = [i64(0), i64(0), i64(0)]
        if pl.batch:
            for d, (n_d, st) in enumerate(zip(pl.batch, bstr)):
                coord = bb.urem(bb.udiv(bi, i64(st)), i64(n_d)) if n_d > 1 else None
                if coord is None:
                    continue
                for j, strides in enumerate((pl.a_batch, pl.b_batch, pl.c_batch)):
                    if strides[d]:
                        offs[j] = bb.add(offs[j], bb.mul(coord, i64(strides[d])))
        pa, pb, pc = (bb.gep(ptr, [o], inbounds=True, source_etype=el)
                      for ptr, o, el in zip(ptrs, offs, els))
        gemm_call(bb, p, pl.engine, pa, pb, pc, ptrs[3], isa, gemm_threads, name,
                  rows_done=rows_done)

    first, second = (ins[1], ins[0]) if pl.swapped else (ins[0], ins[1])
    ptrs = [first, second, c, gscr if packed is None else packed]
    if pl.k_slices > 1:
        _emit_k_slices(b, pl, ins[0], ins[1], c, gscr, isa, name)
    elif batch_threads > 1:
        parallel_region(b, f"{name}.batch", ptrs, [False, False, True, True], nbatch,
                        batch_threads, lambda cb, q, lo, hi: for_range(
                            cb, lo, hi, lambda bi: one(cb, q, bi), "batch"))
    else:
        loop(b, nbatch, lambda bi: one(b, ptrs, bi), name="batch")
    if epilogue is not None and rows_done is None:
        epilogue.emit(b, [c] + list(ins[2:]), outs, threads)


def _batch_threads(pl: MatmulPlan, isa: Isa, threads: int) -> int:
    """Threads that each take whole GEMMs of the batch loop (one hand-off for the batch):
    where every GEMM is small (WHOLE_GEMM_FLOPS) or too small to split, and packs nothing
    on one thread (its panels would be scratch they share). A BERT layer's attention, 12
    heads of 128 x 128 x 64, ran on one core otherwise."""
    if pl.engine != "own" or pl.k_slices > 1:
        return 1
    splits_itself = plan_own(pl.problem, isa, threads).threads > 1 \
        and pl.problem.flops >= WHOLE_GEMM_FLOPS
    if splits_itself or plan_own(pl.problem, isa, 1).scratch:
        return 1
    n = _prod(pl.batch)
    return parallel_chunks(n * pl.problem.flops / 2, n, threads)


# a batch's GEMMs below this go whole to threads even where each could split (each split
# is a hand-off: 12 heads of 128 x 64 x 128, 2 MFLOP each, split one by one took longer)
WHOLE_GEMM_FLOPS = 4 << 20


def _epilogue(op, pl: MatmulPlan, name: str) -> FusedEmitter:
    a = op.attributes
    return FusedEmitter(op.regions[0].blocks[0], a["space"][:-1],
                        [pl.c_map] + [m[:-1] for m in a["maps"][2:]],
                        [m[:-1] for m in a["out_maps"]],
                        [pl.problem.c_dtype] + [v.type.dtype for v in op.operands[2:]],
                        [t.dtype for t in a["out_types"]], f"{name}.epilogue")


def _rows_done(b: ir.IRBuilder, epilogue: FusedEmitter | None, pl: MatmulPlan, ins: list,
               outs: list, isa: Isa, threads: int) -> RowsDone | None:
    """The epilogue on each block of rows the own or bf16 GEMM finishes, where it can: one
    GEMM (no batch loop) computing the product itself (not its transpose), threads
    finishing whole rows, and an epilogue that maps over the product's rows."""
    p = pl.problem
    finishes = bf16_finishes_rows if pl.engine == "bf16" else finishes_rows
    if epilogue is None or not p.finish_rows or not finishes(p, isa, threads):
        return None  # (`finish_rows`: plan_matmul's GEMM, unbatched, unswapped, unsliced)
    unit = epilogue.row_unit(p.m, p.n)
    if unit is None:
        return None
    fn = epilogue.rows_function(b.module, len(ins), len(outs), unit)
    return RowsDone(list(ins) + list(outs), lambda bb, ptrs, r0, r1: bb.call(fn, [*ptrs, r0, r1]))


def _emit_k_slices(b: ir.IRBuilder, pl: MatmulPlan, a, b_ptr, c, scratch, isa: Isa,
                   name: str) -> None:
    """One thread per slice of K multiplies it into its own product (slice s's at
    c + s*M*N), then the products are added into the first, which the epilogue reads."""
    p, n = pl.problem, pl.k_slices
    sub = _slice(p, n)
    el = S.REG[p.dtype]
    offsets, _ = regions(*[gemm_scratch(sub, "own", isa, 1)] * n)
    step = offsets[1] - offsets[0]
    mn = p.m * p.n

    def chunk(cb, ptrs, lo, hi):
        pa, pb, pc, scr = ptrs

        def one(s):
            k0 = cb.mul(s, i64(sub.k))
            at = [cb.gep(ptr, [cb.mul(k0, i64(stride))], inbounds=True, source_etype=el)
                  for ptr, stride in ((pa, p.sa_k), (pb, p.sb_k))]
            pcs = cb.gep(pc, [cb.mul(s, i64(mn))], inbounds=True, source_etype=el)
            emit_own(cb, sub, *at, pcs, byte_offset(cb, scr, cb.mul(s, i64(step))), isa, 1,
                     f"{name}.k")

        for_range(cb, lo, hi, one, "ks")

    parallel_region(b, f"{name}.ks", [a, b_ptr, c, scratch], [False, False, True, True], n, n,
                    chunk)

    def add(i):
        total = S.load(b, c, p.dtype, i)
        for s in range(1, n):
            total = b.fadd(total, S.load(b, c, p.dtype, b.add(i, i64(s * mn))))
        S.store(b, c, p.dtype, i, total)

    loop(b, mn, add, name="ksum")
