"""The graph's input checks (backends/input_checks.py) compiled into the entry, run before
the first kernel.

Natively they cost one pass over each input, with no temporaries, instead of a few numpy
reductions per step. A failing check k stops the call before any kernel runs and sets
`ember_status` to -(k + 1); the executable raises InputCheckError naming the input.
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.loops import for_range
from ..kernels.scalar import I64, MEM, PTR, i64
from ..parallel.outline import parallel_region, stack_array

# elements from which a scan is split across the threads (a 128x784 f32 batch, 400 KB,
# takes ~20 us on one core; a split costs ~1 us)
PARALLEL_SCAN = 1 << 16

# the exponent bits of a float: all set means Inf or NaN
_EXPONENT = {"f32": (32, 0x7F800000), "f64": (64, 0x7FF0000000000000)}


def emit_checks(b: ir.IRBuilder, checks: list, buffers: list[ir.Value], types: list,
                status: ir.GlobalVariable, threads: int = 1) -> None:
    """At `b`: run every check; the first failing one stores its code and returns."""
    for k, ((_, bound, ignore), ptr, t) in enumerate(zip(checks, buffers, types)):
        bad = _scan(b, _scan_function(b.module, k, t, bound, ignore), k, ptr, t.size, threads)
        fail = b.append_basic_block(f"check{k}.fail")
        ok = b.append_basic_block(f"check{k}.ok")
        b.cbranch(b.icmp_unsigned("!=", bad, ir.Constant(bad.type, 0)), fail, ok)
        b.position_at_end(fail)
        b.store(i64(-(k + 1)), status)
        b.ret(i64(0))
        b.position_at_end(ok)


def _scan(b: ir.IRBuilder, fn: ir.Function, k: int, ptr: ir.Value, size: int,
          threads: int) -> ir.Value:
    """Nonzero where some element is bad: one call of the scan, or, for a large input,
    one per thread on its slice, ORed together."""
    if threads < 2 or size < PARALLEL_SCAN:
        return b.call(fn, [ptr, i64(0), i64(size)])
    found = stack_array(b, I64, 1, f"check{k}.found")
    b.store(i64(0), found)

    def slice_(cb: ir.IRBuilder, ptrs: list, lo: ir.Value, hi: ir.Value) -> None:
        bad = cb.call(fn, [ptrs[0], lo, hi])
        cb.atomic_rmw("or", ptrs[1], cb.zext(cb.icmp_unsigned("!=", bad, ir.Constant(
            bad.type, 0)), I64), "monotonic")  # the pool's join orders it before the load

    parallel_region(b, f"{b.function.name}.check{k}", [ptr, found], [False, False], size,
                    min(threads, size // (PARALLEL_SCAN // 2)), slice_)
    return b.load(found, typ=I64)


def _scan_function(mod: ir.Module, k: int, t, bound: int | None,
                   ignore: int | None) -> ir.Function:
    """`ember_check<k>(ptr, lo, hi)`: the OR over elements [lo, hi) of "this one is bad",
    as integers (so it vectorizes without fast-math flags, which would let LLVM assume no
    NaN)."""
    name = f"ember_check{k}"
    if name in mod.globals:
        return mod.globals[name]
    if bound is None:
        bits, mask = _EXPONENT[t.dtype]
        ity = ir.IntType(bits)
    else:
        ity = MEM[t.dtype]
    fn = ir.Function(mod, ir.FunctionType(ity, [PTR, I64, I64]), name)
    fn.linkage = "internal"
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    acc = b.alloca(ity, name="bad")
    b.store(ir.Constant(ity, 0), acc)

    def one(i):
        v = b.load(b.gep(fn.args[0], [i], inbounds=True, source_etype=ity), typ=ity)
        if bound is None:
            exp = b.and_(v, ir.Constant(ity, mask))
            flag = b.icmp_unsigned("==", exp, ir.Constant(ity, mask))
        else:  # unsigned: a negative label is above any bound
            flag = b.icmp_unsigned(">=", v, ir.Constant(ity, bound))
            if ignore is not None:
                flag = b.and_(flag, b.icmp_signed("!=", v, ir.Constant(ity, ignore)))
        b.store(b.or_(b.load(acc, typ=ity), b.zext(flag, ity)), acc)

    for_range(b, fn.args[1], fn.args[2], one, "i")
    b.ret(b.load(acc, typ=ity))
    return fn


__all__ = ["emit_checks"]
