"""One LLVM function per op: `void kN_<op>(ptr noalias out, ptr noalias in...)`.

Every buffer is contiguous and every shape static, so each kernel is a loop nest with
constant trip counts. `noalias` holds because an op always writes a buffer of its own
(operands may share a buffer, but they are only read). Loop orders are chosen so the
innermost loop walks memory contiguously and LLVM vectorizes it: elementwise maps over
the output, reductions keep the contiguous axis innermost, matmul runs i-k-j.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from ....ir import Operation, TensorType
from ....ir.opdef import normalize_axes, ops_with
from ...strides import broadcast_strides, collapse, contiguous_strides
from . import scalar as S
from .collective import allreduce, grads_ready
from .loops import loop, nest, offset
from .scalar import PTR

OneOpLoop = Callable[[ir.IRBuilder, ir.Value, list[ir.Value], Operation], None]


def strided_map(b: ir.IRBuilder, out: ir.Value, ins: list[ir.Value], out_type: TensorType,
                in_strides: list[list[int]], in_dtypes: list[str],
                fn: Callable[[list[ir.Value]], ir.Value], out_strides: list[int] | None = None,
                starts: list[int] | None = None) -> None:
    """out[idx] = fn(in_k[idx . strides_k]) over `out_type`'s shape in order: elementwise
    ops with numpy broadcasting, broadcast, transpose and the windows of slice, unslice
    and concat are all this one loop nest. `out_strides` (contiguous by default) and
    `starts` (element offsets of out and each input, 0 by default) place a window."""
    if out_type.size == 0:
        return
    strides = zip(out_strides or contiguous_strides(out_type.shape), *in_strides)
    dims = collapse(list(zip(out_type.shape, strides)))

    def body(offs):
        vals = [S.load(b, p, dt, o) for p, dt, o in zip(ins, in_dtypes, offs[1:])]
        S.store(b, out, out_type.dtype, offs[0], fn(vals))

    nest(b, dims, body, [S.i64(k) for k in starts or [0] * (1 + len(ins))])


def elementwise(b, out, ins, op):
    types = [v.type for v in op.operands]
    dtype = types[-1].dtype  # select: the values' dtype, not the condition's
    shape = op.result.type.shape
    strides = [broadcast_strides(t.shape, shape) for t in types]
    strided_map(b, out, ins, op.result.type, strides, [t.dtype for t in types],
                lambda vals: S.emit(b, op.name, op.attributes, vals, dtype))


def broadcast(b, out, ins, op):
    t = op.operands[0].type
    strided_map(b, out, ins, op.result.type, [broadcast_strides(t.shape, op.result.type.shape)],
                [t.dtype], lambda vals: vals[0])


def transpose(b, out, ins, op):
    t = op.operands[0].type
    st = contiguous_strides(t.shape)
    strided_map(b, out, ins, op.result.type, [[st[p] for p in op.attributes["perm"]]],
                [t.dtype], lambda vals: vals[0])


def _window(shape, attrs) -> tuple[list[int], int]:
    """(strides, start offset) of a slice/unslice window in a contiguous `shape`."""
    st = contiguous_strides(shape)
    return ([s * k for s, k in zip(st, attrs["step"])],
            sum(s * a for s, a in zip(st, attrs["start"])))


def _copy(b, out, ins, part: TensorType, out_strides, starts, in_strides=None):
    strided_map(b, out, ins, part, [in_strides or contiguous_strides(part.shape)],
                [part.dtype], lambda vals: vals[0], out_strides, starts)


def slice_(b, out, ins, op):
    strides, start = _window(op.operands[0].type.shape, op.attributes)
    _copy(b, out, ins, op.result.type, None, [0, start], strides)


def _zero(b, out, t: TensorType) -> None:
    if t.size:
        _zero_bytes(b, out, t.nbytes)


def _zero_bytes(b, ptr, nbytes: int) -> None:
    b.call(S.declare(b.module, "llvm.memset.p0.i64", ir.VoidType(),
                     [PTR, ir.IntType(8), S.I64, ir.IntType(1)]),
           [ptr, ir.Constant(ir.IntType(8), 0), S.i64(nbytes), ir.Constant(ir.IntType(1), 0)])


def unslice(b, out, ins, op):
    if set(op.attributes["step"]) <= {1} and op.result.type.rank:
        _unslice_rows(b, out, ins[0], op)
        return
    _zero(b, out, op.result.type)
    strides, start = _window(op.result.type.shape, op.attributes)
    _copy(b, out, ins, op.operands[0].type, strides, [start, 0])


def _unslice_rows(b, out, x, op) -> None:
    """A step-1 unslice (zero padding) written once, row by row (along the last dim): zeros
    where the window misses the row, else zeros, the input's row, zeros. Zeroing all of
    it first wrote the output twice (MobileNet's padded inputs: 1.4 of its 8 ms)."""
    full, part = op.result.type.shape, op.operands[0].type.shape
    start, dt = op.attributes["start"], op.result.type.dtype
    el, size = S.REG[dt], S.size(dt)
    width, inner, at = full[-1], part[-1], start[-1]
    memcpy = S.declare(b.module, "llvm.memcpy.p0.p0.i64", ir.VoidType(),
                       [PTR, PTR, S.I64, ir.IntType(1)])

    def zero(ptr, at_elem, n: int):
        if n:
            _zero_bytes(b, b.gep(ptr, [at_elem], source_etype=el), n * size)

    outer, part_strides = full[:-1], contiguous_strides(part)

    def row(r):
        base = b.mul(r, S.i64(width))
        inside, src, rest = ir.Constant(ir.IntType(1), 1), S.i64(0), r
        for d in reversed(range(len(outer))):
            c = b.urem(rest, S.i64(outer[d]))
            rest = b.udiv(rest, S.i64(outer[d]))
            k = b.sub(c, S.i64(start[d]))
            inside = b.and_(inside, b.icmp_unsigned("<", k, S.i64(part[d])))
            src = b.add(src, b.mul(k, S.i64(part_strides[d])))
        with b.if_else(inside) as (copy, blank):
            with copy:
                zero(out, base, at)
                b.call(memcpy, [b.gep(out, [b.add(base, S.i64(at))], source_etype=el),
                                b.gep(x, [src], source_etype=el), S.i64(inner * size),
                                ir.Constant(ir.IntType(1), 0)])
                zero(out, b.add(base, S.i64(at + inner)), width - at - inner)
            with blank:
                zero(out, base, width)

    loop(b, op.result.type.size // width if width else 0, row, "row")


def concat(b, out, ins, op):
    """Each operand copied into its window of the output along the axis."""
    t = op.result.type
    axis = normalize_axes(op.name, [op.attributes["axis"]], t.rank)[0]
    st, at = contiguous_strides(t.shape), 0
    for p, v in zip(ins, op.operands):
        _copy(b, out, [p], v.type, st, [at * st[axis], 0])
        at += v.type.shape[axis]


def reduce(b, out, ins, op):
    """Sum, mean or max over `axes`.

    When the input's innermost (collapsed) axis is kept, the output is filled with the
    identity and updated elementwise (`out[o] = out[o] + in[i]`, vectorized across the
    kept axis). Otherwise each output element accumulates in a register over the reduced
    axes (vectorized as a horizontal reduction thanks to `reassoc`). Integer means sum in
    f64 and truncate, as numpy's mean-then-astype does.
    """
    (inp,), t, t_out = ins, op.operands[0].type, op.result.type
    if t_out.size == 0:
        return
    axes = normalize_axes(op.name, op.attributes["axes"], t.rank)
    kind = "max" if op.name == "ember.reduce_max" else "add"
    mean = op.name == "ember.reduce_mean"
    dt = t.dtype
    count = 1
    for a in axes:
        count *= t.shape[a]
    out_st = iter(contiguous_strides([d for i, d in enumerate(t.shape) if i not in axes]))
    dims = collapse([(n, (0 if i in axes else next(out_st), s))
                     for i, (n, s) in enumerate(zip(t.shape, contiguous_strides(t.shape)))])
    zero = [S.i64(0), S.i64(0)]
    acc_dt = "f64" if mean and dt not in S.FLOATS else dt
    if dims and dims[-1][1][0] != 0 and acc_dt == dt:
        loop(b, t_out.size, lambda o: S.store(b, out, dt, o, S.identity(kind, dt)))

        def update(offs):
            o, i = offs
            S.store(b, out, dt, o, S.combine(b, kind, S.load(b, out, dt, o),
                                             S.load(b, inp, dt, i), dt))

        nest(b, dims, update, zero)
        if mean:
            loop(b, t_out.size, lambda o: S.store(b, out, dt, o, b.fdiv(
                S.load(b, out, dt, o), S.const(dt, count))))
        return
    acc = b.alloca(S.REG[acc_dt], name="acc")  # promoted to a register by SROA

    def per_output(offs):
        b.store(S.identity(kind, acc_dt), acc)

        def step(offs2):
            x = S.cast(b, S.load(b, inp, dt, offs2[1]), dt, acc_dt)
            b.store(S.combine(b, kind, b.load(acc), x, acc_dt, flags=S.REASSOC), acc)

        nest(b, [d for d in dims if d[1][0] == 0], step, offs)
        v = b.load(acc)
        if mean:
            v = b.fdiv(v, S.const(acc_dt, count))
        S.store(b, out, dt, offs[0], S.cast(b, v, acc_dt, dt))

    nest(b, [d for d in dims if d[1][0] != 0], per_output, zero)


def matmul(b, out, ins, op):
    """C[..., i, :] = sum_k A[..., i, k] * B[..., k, :], in i-k-j order so the inner loop
    streams a row of B into a row of C (vectorized; `contract` makes the update an FMA)."""
    (pa, pb), (ta, tb), tc = ins, [v.type for v in op.operands], op.result.type
    if tc.size == 0:
        return
    (M, K), N, dt = ta.shape[-2:], tb.shape[-1], tc.dtype
    batch = tc.shape[:-2]

    def batch_strides(t):
        return [s * t.shape[-2] * t.shape[-1] for s in broadcast_strides(t.shape[:-2], batch)]

    c_st = [s * M * N for s in contiguous_strides(batch)]
    dims = collapse(list(zip(batch, zip(c_st, batch_strides(ta), batch_strides(tb)))))

    def per_batch(offs):
        c0, a0, b0 = offs

        def row(i):
            crow, arow = offset(b, c0, i, N), offset(b, a0, i, K)
            loop(b, N, lambda j: S.store(b, out, dt, offset(b, crow, j, 1), S.const(dt, 0)),
                 name="j0")

            def kstep(k):
                a, brow = S.load(b, pa, dt, offset(b, arow, k, 1)), offset(b, b0, k, N)

                def update(j):
                    c = offset(b, crow, j, 1)
                    prod = S.combine(b, "mul", a, S.load(b, pb, dt, offset(b, brow, j, 1)), dt)
                    S.store(b, out, dt, c, S.combine(b, "add", S.load(b, out, dt, c), prod, dt))

                loop(b, N, update, name="j")

            loop(b, K, kstep, name="k")

        loop(b, M, row, name="m")

    nest(b, dims, per_batch, [S.i64(0)] * 3)


def one_hot(b, out, ins, op):
    """out[l, c] = (labels[l] == c); labels outside [0, C) give an all-zero row."""
    (pl,), t, dt = ins, op.operands[0].type, op.result.type.dtype
    C = op.attributes["num_classes"]
    if op.result.type.size == 0:
        return

    def per_label(l):
        lab = S.load(b, pl, t.dtype, l)
        lab = b.sext(lab, S.I64) if t.dtype != "i64" else lab
        base = offset(b, S.i64(0), l, C)
        loop(b, C, lambda c: S.store(b, out, dt, offset(b, base, c, 1), b.select(
            b.icmp_signed("==", lab, c), S.const(dt, 1), S.const(dt, 0))), name="c")

    loop(b, t.size, per_label, name="l")


ONE_OP_LOOPS: dict[str, OneOpLoop] = {
    **dict.fromkeys(ops_with("elementwise", "ember"), elementwise),  # from the registry
    **dict.fromkeys(("ember.reduce_sum", "ember.reduce_mean", "ember.reduce_max"), reduce),
    "ember.broadcast": broadcast,
    "ember.transpose": transpose,
    "ember.slice": slice_,
    "ember.unslice": unslice,
    "ember.concat": concat,
    "ember.matmul": matmul,
    "ember.one_hot": one_hot,
    "ember.allreduce": allreduce,
    "ember.grads_ready": grads_ready,
}


def emit_kernel(mod: ir.Module, name: str, op: Operation) -> ir.Function:
    """The kernel function of `op`: arguments are the result buffer, then the operands'."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR] * (1 + len(op.operands))), name)
    fn.linkage = "internal"
    for k, a in enumerate(fn.args):
        a.name = f"in{k - 1}" if k else "out"
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ONE_OP_LOOPS[op.name](b, fn.args[0], list(fn.args[1:]), op)
    b.ret_void()
    return fn
