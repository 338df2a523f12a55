"""The graph's input checks (backends/input_checks.py) compiled into the entry, run before
the first kernel.

Natively they cost one pass over each input, with no temporaries, instead of a few numpy
reductions per step. A failing check k stops the call before any kernel runs and sets
`ember_status` to -(k + 1); the executable raises InputCheckError naming the input.
"""

from __future__ import annotations

from llvmlite import ir

from .loops import loop
from .scalar import MEM, PTR, i64

# the exponent bits of a float: all set means Inf or NaN
_EXPONENT = {"f32": (32, 0x7F800000), "f64": (64, 0x7FF0000000000000)}


def emit_checks(b: ir.IRBuilder, checks: list, buffers: list[ir.Value], types: list,
                status: ir.GlobalVariable) -> None:
    """At `b`: run every check; the first failing one stores its code and returns."""
    for k, ((_, bound, ignore), ptr, t) in enumerate(zip(checks, buffers, types)):
        bad = b.call(_scan_function(b.module, k, t, bound, ignore), [ptr])
        fail = b.append_basic_block(f"check{k}.fail")
        ok = b.append_basic_block(f"check{k}.ok")
        b.cbranch(b.icmp_unsigned("!=", bad, ir.Constant(bad.type, 0)), fail, ok)
        b.position_at_end(fail)
        b.store(i64(-(k + 1)), status)
        b.ret_void()
        b.position_at_end(ok)


def _scan_function(mod: ir.Module, k: int, t, bound: int | None,
                   ignore: int | None) -> ir.Function:
    """`ember_check<k>(ptr)`: the OR over the elements of "this one is bad", as integers
    (so it vectorizes without fast-math flags, which would let LLVM assume no NaN)."""
    name = f"ember_check{k}"
    if name in mod.globals:
        return mod.globals[name]
    if bound is None:
        bits, mask = _EXPONENT[t.dtype]
        ity = ir.IntType(bits)
    else:
        ity = MEM[t.dtype]
    fn = ir.Function(mod, ir.FunctionType(ity, [PTR]), name)
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

    loop(b, t.size, one, "i")
    b.ret(b.load(acc, typ=ity))
    return fn


__all__ = ["emit_checks"]
