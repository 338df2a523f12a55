"""Scalar LLVM IR for one element of every core op, matching numpy's semantics.

The kernels (`unfused.py`, `fused.py`) own the loops; this file owns what happens to one
element, so the numerics of each op (NaN propagation, integer division, casts) live in one place.
i1 lives in registers as LLVM `i1` and in memory as one byte (numpy bool). bf16 and f16
are only stored, moved and cast (ops on them run in f32: passes/widen.py): f16 as LLVM's
`half`, bf16 as its 16 bits (llvmlite has no `bfloat` type).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....ir.dialects.ember import expand
from ....ir.precision import rounded
from ....ir.types import LOW_PRECISION
from ...errors import UnsupportedOpError
from . import vmath

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()  # opaque: buffers, contexts, function arguments
REG = {"f32": ir.FloatType(), "f64": ir.DoubleType(), "f16": ir.HalfType(), "bf16": I16,
       "i64": I64, "i32": I32, "i1": ir.IntType(1)}
MEM = {**REG, "i1": ir.IntType(8)}
FLOATS = ("f32", "f64")
CONTRACT = ("contract",)  # lets LLVM fuse a*b+c into an FMA; never changes a lone op
REASSOC = ("reassoc", "contract")  # reduction accumulators: needed to vectorize them

_FCMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def i64(n: int) -> ir.Constant:
    return ir.Constant(I64, n)


def const(dtype: str, value) -> ir.Constant:
    if dtype == "bf16":
        return ir.Constant(I16, int(rounded(value, dtype).view(np.uint16)))
    if dtype == "f16":
        return ir.Constant(REG[dtype], float(rounded(value, dtype)))
    return ir.Constant(REG[dtype], float(value) if dtype in FLOATS else int(value))


def size(dtype: str) -> int:
    """Bytes per element in memory."""
    return {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i1": 1}[dtype]


def declare(mod: ir.Module, name: str, ret: ir.Type, args: list) -> ir.Function:
    """The function `name` of `mod`, declared on first use."""
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, args), name)
    return fn


def intrinsic(b: ir.IRBuilder, name: str, ret: ir.Type, args: list, flags=CONTRACT) -> ir.Value:
    """Call `llvm.<name>`, declaring it once per module (llvmlite knows only a few)."""
    mod = b.module
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, [a.type for a in args]), name)
    return b.call(fn, args, fastmath=flags if isinstance(ret, ir.FloatType | ir.DoubleType)
                  else ())


def load(b: ir.IRBuilder, ptr: ir.Value, dtype: str, offset: ir.Value) -> ir.Value:
    """Element `offset` of a buffer; a stored bool byte becomes an i1 (any nonzero is True)."""
    v = b.load(b.gep(ptr, [offset], inbounds=True, source_etype=MEM[dtype]), typ=MEM[dtype])
    return b.icmp_unsigned("!=", v, ir.Constant(MEM["i1"], 0)) if dtype == "i1" else v


def store(b: ir.IRBuilder, ptr: ir.Value, dtype: str, offset: ir.Value, v: ir.Value) -> None:
    if dtype == "i1":
        v = b.zext(v, MEM["i1"])
    b.store(v, b.gep(ptr, [offset], inbounds=True, source_etype=MEM[dtype]))


def cast(b: ir.IRBuilder, v: ir.Value, src: str, dst: str) -> ir.Value:
    """numpy `astype`: truncation toward zero, bool(x) is x != 0 (NaN is True).

    Float to int goes through `fptosi.sat`, never `fptosi`, so NaN or out-of-range input
    cannot produce poison; those give INT_MIN, numpy's result on x86.
    """
    if src == dst:
        return v
    if src in LOW_PRECISION or dst in LOW_PRECISION:
        return _low_precision_cast(b, v, src, dst)
    s, d = REG[src], REG[dst]
    if dst == "i1":
        return (b.fcmp_unordered("!=", v, ir.Constant(s, 0.0)) if src in FLOATS
                else b.icmp_unsigned("!=", v, ir.Constant(s, 0)))
    if src == "i1":
        return b.uitofp(v, d) if dst in FLOATS else b.zext(v, d)
    if src in FLOATS and dst in FLOATS:
        return b.fpext(v, d) if dst == "f64" else b.fptrunc(v, d)
    if src in FLOATS:  # NaN and >= 2**(w-1) give INT_MIN, as x86's cvtt (so numpy) does
        big = ir.Constant(s, float(2 ** (d.width - 1)))
        return b.select(b.fcmp_ordered("<", v, big),
                        intrinsic(b, f"llvm.fptosi.sat.{dst}.{src}", d, [v]),
                        ir.Constant(d, -(2 ** (d.width - 1))))
    if dst in FLOATS:
        return b.sitofp(v, d)
    return b.sext(v, d) if d.width > s.width else b.trunc(v, d)


def _low_precision_cast(b: ir.IRBuilder, v: ir.Value, src: str, dst: str) -> ir.Value:
    """f32 <-> f16 or bf16, rounding to nearest even (widen-low-precision leaves no other
    cast of them). f16 by LLVM's fpext/fptrunc (F16C's vcvtps2ph on x86); bf16 on its bits:
    the high half of the f32's, rounded up where the low half is above half way or at it
    with an odd high half; a NaN stays a quiet NaN of its sign, as ml_dtypes rounds."""
    if "f32" not in (src, dst):
        raise UnsupportedOpError(f"the cpu backend casts {src} to {dst} through f32: run the "
                                 "widen-low-precision pass first")
    if src == "f16":
        return b.fpext(v, REG[dst])
    if dst == "f16":
        return b.fptrunc(v, REG[dst])
    if src == "bf16":
        return b.bitcast(b.shl(b.zext(v, I32), ir.Constant(I32, 16)), REG[dst])
    bits = b.bitcast(v, I32)
    high = b.lshr(bits, ir.Constant(I32, 16))
    bias = b.add(b.and_(high, ir.Constant(I32, 1)), ir.Constant(I32, 0x7FFF))
    near = b.lshr(b.add(bits, bias), ir.Constant(I32, 16))
    nan = b.or_(b.and_(high, ir.Constant(I32, 0x8000)), ir.Constant(I32, 0x7FC0))
    return b.trunc(b.select(b.fcmp_unordered("uno", v, v), nan, near), I16)


def _ipow(b: ir.IRBuilder, x: ir.Value, e: ir.Value, dtype: str) -> ir.Value:
    """Integer power by squaring (a helper function per dtype, inlined by LLVM).

    numpy rejects negative exponents; here they give the truncated value of 1/x**-e.
    """
    mod, t = b.module, REG[dtype]
    name = f"ember.ipow.{dtype}"
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(t, [t, t]), name)
        fn.linkage = "internal"
        base, exp = fn.args
        entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
        fb = ir.IRBuilder(entry)
        zero, one, neg_one = ir.Constant(t, 0), ir.Constant(t, 1), ir.Constant(t, -1)
        # e == 0 -> 1; e < 0 -> 1 for x == 1, +-1 for x == -1, else 0
        minus = fb.select(fb.icmp_unsigned("!=", fb.and_(exp, one), zero), neg_one, one)
        small = fb.select(fb.icmp_signed("==", base, one), one,
                          fb.select(fb.icmp_signed("==", base, neg_one), minus, zero))
        early = fb.select(fb.icmp_signed("==", exp, zero), one, small)
        fb.cbranch(fb.icmp_signed(">", exp, zero), loop, done)
        fb.position_at_end(loop)
        r, p, k = fb.phi(t), fb.phi(t), fb.phi(t)
        odd = fb.icmp_unsigned("!=", fb.and_(k, one), zero)
        r2 = fb.select(odd, fb.mul(r, p), r)
        p2, k2 = fb.mul(p, p), fb.ashr(k, one)
        for phi, init, nxt in ((r, one, r2), (p, base, p2), (k, exp, k2)):
            phi.add_incoming(init, entry)
            phi.add_incoming(nxt, loop)
        fb.cbranch(fb.icmp_signed(">", k2, zero), loop, done)
        fb.position_at_end(done)
        res = fb.phi(t)
        res.add_incoming(r2, loop)
        res.add_incoming(early, entry)
        fb.ret(res)
    return b.call(fn, [x, e])


def combine(b: ir.IRBuilder, kind: str, acc: ir.Value, x: ir.Value, dtype: str,
            flags=CONTRACT) -> ir.Value:
    """`acc (+|*|max|min) x`, the step of a reduction or a matmul accumulation."""
    _check_precision(kind, dtype)
    if dtype == "i1":
        return b.or_(acc, x) if kind in ("add", "max") else b.and_(acc, x)
    if dtype in FLOATS:
        if kind in ("max", "min"):  # NaN-propagating as numpy's; `nsz`: a tie of -0.0 and
            # +0.0 gives either, as numpy's does, sparing x86 two sign blends per vector
            return intrinsic(b, f"llvm.{kind}imum.{dtype}", REG[dtype], [acc, x],
                             (*flags, "nsz"))
        return (b.fadd if kind == "add" else b.fmul)(acc, x, flags=flags)
    if kind in ("max", "min"):
        return intrinsic(b, f"llvm.s{kind}.{dtype}", REG[dtype], [acc, x])
    return (b.add if kind == "add" else b.mul)(acc, x)


def identity(kind: str, dtype: str) -> ir.Constant:
    """The start of a reduction; -0.0 for float sums so x + identity == x bit for bit."""
    _check_precision(kind, dtype)
    if kind == "add":
        return const(dtype, -0.0 if dtype in FLOATS else 0)
    if kind == "mul":
        return const(dtype, 1)
    sign = -1 if kind == "max" else 1
    if dtype in FLOATS:
        return const(dtype, sign * float("inf"))
    if dtype == "i1":
        return const(dtype, int(kind == "min"))
    w = REG[dtype].width - 1
    return const(dtype, -(1 << w) if kind == "max" else (1 << w) - 1)


def _unsupported(name: str, dtype: str):
    raise UnsupportedOpError(f"the cpu backend has no kernel for '{name}' on {dtype} tensors")


def _check_precision(name: str, dtype: str) -> None:
    """Arithmetic on bf16/f16 runs in f32 here: a graph that still has it is refused."""
    if dtype in LOW_PRECISION:
        raise UnsupportedOpError(f"the cpu backend computes '{name}' on {dtype} in f32: run the "
                                 "widen-low-precision pass first (the runtime's pipeline does)")


def emit(b: ir.IRBuilder, name: str, attrs: dict, args: list, dtype: str) -> ir.Value:
    """One element of elementwise op `name`; `dtype` is the operands' dtype (for select:
    of the two values; for cast: of the source). An op declared as a composition of others
    (its `expand`) is that composition."""
    if name.rsplit(".", 1)[-1] != "cast":
        _check_precision(name, dtype)
    r = expand(name, attrs, args, lambda n, a, v: emit(b, n, a, v, dtype),
               lambda v: const(dtype, v))
    if r is not None:
        return r
    op = name.removeprefix("ember.")
    fl, t = dtype in FLOATS, REG.get(dtype)
    if op == "cast":
        return cast(b, args[0], dtype, attrs["dtype"])
    if op == "select":
        return b.select(*args)
    if op == "cmp":
        pred = attrs["predicate"]
        if fl:
            fcmp = b.fcmp_unordered if pred == "ne" else b.fcmp_ordered
            return fcmp(_FCMP[pred], *args)
        return (b.icmp_unsigned if dtype == "i1" else b.icmp_signed)(_FCMP[pred], *args)
    if op in ("add", "mul", "max", "min") and not fl:
        kind = {"min": "mul"}.get(op, op)  # on bools: or, and, or, and
        if dtype == "i1":
            return combine(b, kind, *args, dtype)
        if op == "min":
            return intrinsic(b, f"llvm.smin.{dtype}", t, args)
        return combine(b, op, *args, dtype)
    if op in ("abs", "relu") and dtype == "i1":
        return args[0]
    if dtype == "i1":
        _unsupported(name, dtype)
    x = args[0]
    if fl:
        match op:
            case "add" | "mul":
                return combine(b, op, *args, dtype)
            case "sub":
                return b.fsub(*args, flags=CONTRACT)
            case "div":
                return b.fdiv(*args, flags=CONTRACT)
            case "max" | "min":
                # NaN-propagating, as np.maximum
                return intrinsic(b, f"llvm.{op}imum.{dtype}", t, args)
            case "exp":
                return vmath.exp(b, dtype, x)
            case "log" | "tanh" | "erf":
                return vmath.call(b, op, dtype, x)
            case "pow" | "sqrt":
                return intrinsic(b, f"llvm.{op}.{dtype}", t, args)
            case "neg":
                return b.fneg(x, flags=CONTRACT)
            case "abs":
                return intrinsic(b, f"llvm.fabs.{dtype}", t, [x])
            case "relu":
                return intrinsic(b, f"llvm.maximum.{dtype}", t, [x, const(dtype, 0.0)])
            case "rsqrt":
                return b.fdiv(const(dtype, 1.0), intrinsic(b, f"llvm.sqrt.{dtype}", t, [x]))
            case "sigmoid":
                e = vmath.exp(b, dtype, b.fneg(x))
                return b.fdiv(const(dtype, 1.0), b.fadd(const(dtype, 1.0), e))
    else:
        match op:
            case "sub":
                return b.sub(*args)
            case "neg":
                return b.sub(const(dtype, 0), x)
            case "abs":
                return intrinsic(b, f"llvm.abs.{dtype}", t, [x, ir.Constant(REG["i1"], 0)])
            case "relu":
                return intrinsic(b, f"llvm.smax.{dtype}", t, [x, const(dtype, 0)])
            case "pow":
                return _ipow(b, *args, dtype)
            case "div":  # numpy: true division in f64, then astype back
                q = b.fdiv(*(b.sitofp(a, REG["f64"]) for a in args))
                return cast(b, q, "f64", dtype)
    _unsupported(name, dtype)


def at_most(b: ir.IRBuilder, v: ir.Value, limit: int | ir.Value) -> ir.Value:
    """min(v, limit) of i64s."""
    bound = i64(limit) if isinstance(limit, int) else limit
    return b.select(b.icmp_signed("<", v, bound), v, bound)
