"""exp, log, tanh and erf that vectorize: glibc's libmvec through the vector function ABI.

LLVM turns a call to `expf` into `llvm.exp`, which codegen then scalarizes into 16 libm
calls per vector. So generated code calls `ember_expf` instead (resolved to libm's
`expf` at load time) and declares, with the attribute `vector-function-abi-variant`, that
`_ZGVeN16v_expf` (and the 8- and 4-lane variants) computes it on a vector: the loop
vectorizer then calls libmvec's SIMD versions (numpy's speed, within a few ulp).
Without libmvec (not glibc, not x86_64) the scalar libm function is called.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import re

import llvmlite.binding as llvm
from llvmlite import ir

FUNCS = ("exp", "log", "tanh", "erf")
# (ISA letter, f32 lanes) for each x86 vector width; libmvec names _ZGV<isa>N<lanes>v_<fn>
_ISAS = (("b", 4), ("d", 8), ("e", 16))


def _libname(fn: str, dtype: str) -> str:
    return fn + ("f" if dtype == "f32" else "")


@functools.cache
def _libm():
    name = ctypes.util.find_library("m")
    return ctypes.CDLL(name) if name else None


@functools.cache
def _libmvec():
    if platform.machine() not in ("x86_64", "AMD64") or platform.system() != "Linux":
        return None
    try:
        return ctypes.CDLL("libmvec.so.1")
    except OSError:
        return None


@functools.cache
def variants(fn: str, dtype: str, bits: int) -> tuple[tuple[str, int], ...]:
    """(libmvec symbol, lanes) for `fn` on `dtype` usable with `bits`-wide registers."""
    lib = _libmvec()
    if lib is None:
        return ()
    out = []
    for isa, lanes32 in _ISAS:
        if lanes32 * 32 > bits:
            continue
        lanes = lanes32 if dtype == "f32" else lanes32 // 2
        sym = f"_ZGV{isa}N{lanes}v_{_libname(fn, dtype)}"
        if hasattr(lib, sym):
            out.append((sym, lanes))
    return tuple(out)


@functools.cache
def load_symbols() -> None:
    """Make `ember_<fn>` (libm) and libmvec's variants resolvable by MCJIT."""
    libm = _libm()
    if _libmvec() is not None:
        llvm.load_library_permanently(ctypes.util.find_library("mvec") or "libmvec.so.1")
    if libm is None:
        return
    for fn in FUNCS:
        for dtype in ("f32", "f64"):
            f = getattr(libm, _libname(fn, dtype), None)
            if f is not None:
                llvm.add_symbol(scalar_name(fn, dtype), ctypes.cast(f, ctypes.c_void_p).value)


def scalar_name(fn: str, dtype: str) -> str:
    return f"ember_{_libname(fn, dtype)}"


# An exp argument below ln(FLT_MIN) (or DBL_MIN) sends its whole libmvec vector down the
# scalar path, ~15x slower: the -inf or -1e4 lanes of a causal mask do. Where the result
# underflows to 0 anyway (below Z), the lane is selected to 0 and computes exp(0)
# meanwhile; between Z and ln(FLT_MIN), results are denormals, rare enough to leave to
# libmvec's slow path (shifting them into range cost every exp 1.7x here).
_EXP_ZERO_BELOW = {"f32": -103.98, "f64": -745.14}  # largest x whose exp rounds to 0


def exp(b: ir.IRBuilder, dtype: str, x: ir.Value) -> ir.Value:
    """exp(x) at libmvec's speed on masked (-inf, -1e4) lanes too."""
    if _libmvec() is None:  # the scalar libm has no slow path to avoid
        return call(b, "exp", dtype, x)
    zero = ir.Constant(x.type, 0.0)
    gone = b.fcmp_ordered("<", x, ir.Constant(x.type, _EXP_ZERO_BELOW[dtype]))  # not NaN
    return b.select(gone, zero, call(b, "exp", dtype, b.select(gone, zero, x)))


def call(b: ir.IRBuilder, fn: str, dtype: str, x: ir.Value) -> ir.Value:
    """`fn(x)` for a float scalar; vectorizable when libmvec has the function."""
    mod = b.module
    t = x.type
    if _libm() is None or not hasattr(_libm(), _libname(fn, dtype)):
        if fn in ("exp", "log"):
            f = mod.globals.get(f"llvm.{fn}.{dtype}") or ir.Function(
                mod, ir.FunctionType(t, [t]), f"llvm.{fn}.{dtype}")
            return b.call(f, [x], fastmath=("contract",))
        raise NotImplementedError(f"no libm {fn} for {dtype} on this system")
    name = scalar_name(fn, dtype)
    f = mod.globals.get(name)
    if f is None:
        f = ir.Function(mod, ir.FunctionType(t, [t]), name)
        uses = getattr(mod, "ember_vmath", set())
        uses.add((fn, dtype))
        mod.ember_vmath = uses
    return b.call(f, [x])


def patch_text(mod: ir.Module, text: str, bits: int) -> str:
    """The module's IR text with the vector variants of every math function it calls
    declared, attached to the scalar declarations, and kept alive until vectorization."""
    uses = sorted(getattr(mod, "ember_vmath", ()))
    if not uses:
        return text
    decls, keep, lines = [], [], []
    for fn, dtype in uses:
        t = "float" if dtype == "f32" else "double"
        name = scalar_name(fn, dtype)
        vs = variants(fn, dtype, bits)
        abi = ",".join(f"{sym[:sym.index('v_') + 1]}_{name}({sym})" for sym, _ in vs)
        for sym, lanes in vs:
            decls.append(f"declare <{lanes} x {t}> @{sym}(<{lanes} x {t}>) nounwind")
            keep.append(f"ptr @{sym}")
        attrs = f'nounwind willreturn memory(none) "vector-function-abi-variant"="{abi}"' \
            if vs else "nounwind willreturn memory(none)"
        group = f"#{9000 + len(lines)}"
        lines.append(f"attributes {group} = {{ {attrs} }}")
        text = re.sub(rf'declare {t} @"?{name}"?\([^)]*\)[^\n]*',
                      f'declare {t} @{name}({t}) {group}', text)
    if keep:
        decls.append(f"@llvm.compiler.used = appending global [{len(keep)} x ptr] "
                     f"[{', '.join(keep)}], section \"llvm.metadata\"")
    return text + "\n" + "\n".join(decls + lines) + "\n"
