"""exp, log and tanh in LLVM IR, at one speed whatever the input; erf from libmvec.

LLVM turns a call to `expf` into `llvm.exp`, which codegen scalarizes into 16 libm calls
per vector. glibc's libmvec, which the vector function ABI hands to the loop vectorizer,
sends a whole vector down a scalar slow path when one lane is out of its range: exp of
the -inf / -1e4 lanes of a causal mask (5-14x slower here), of a denormal result or an
overflow; log of 0, inf, a negative, NaN or a denormal (4-14x); tanh of +-inf or NaN
(1.5-2.6x). So exp, log and tanh are written here as internal always-inline functions
of straight-line code (range reduction, a polynomial, exponent bits, selects for the
special values; no branch, so every lane runs the same path). They inline into the
kernel's loop, which the loop vectorizer vectorizes like any arithmetic, and the scalar
remainder runs the same code: a value never depends on its position. No float arithmetic
in them makes a denormal, and log and tanh keep denormal arguments out of theirs: each
costs a microcode assist (exp of a half -inf vector ran 1.6x slower from one underflowing
multiply). Denormal results are exact, not flushed. Measured: exp <= 1.06 ulp, log <=
0.96, tanh <= 1.5, f32 (every input) and f64 (dense sweeps against long double);
libmvec's f32 log was 3.9 ulp off.

erf (no slow path measured but on denormal arguments) calls `ember_erff` etc.
(resolved to libm at load time), with libmvec's `_ZGVeN16v_erff` (and the 8- and 4-lane
variants) declared as its vector versions through the attribute
`vector-function-abi-variant`; without libmvec (not glibc, not x86_64) the scalar libm
function is called."""

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


# -- exp, log, tanh in LLVM IR -------------------------------------------------------------------
# Coefficients: Chebyshev fits (mpmath) on the reduced range, rounded to the type; each fit
# is within 0.1 ulp there, so the result's error is the evaluation's rounding (<= 1 ulp).
_LOG2E = 1.4426950408889634
# exp(r) = 1 + r + r^2 q(r), |r| <= ln2/2 (+1%); q's coefficients from the highest power
_EXP_Q = {"f32": (1.3926926767453551e-3, 8.363774046301842e-3, 4.166654869914055e-2,
                  1.6666573286056519e-1, 0.5),
          "f64": (2.510134692835034e-08, 2.7621338669142925e-07, 2.75572664186123e-06,
                  2.4801518641395993e-05, 1.9841269864380513e-4, 1.3888888918939168e-3,
                  8.333333333329793e-3, 4.166666666662064e-2, 0.16666666666666669,
                  0.5000000000000001)}
# ln2 as C1 + C2 (Cody-Waite): C1 has few enough bits that n*C1 is exact for every n here
_LN2_SPLIT = {"f32": (0.693359375, -2.1219444170128554e-4),
              "f64": (0.693145751953125, 1.4286068203094173e-06)}
# exp(x) rounds to +0 below LO (the largest such x, to 5 digits); HI: the largest x whose
# exp is finite (exp(HI) is ~60 ulp below the largest float: no rounding takes it over)
_EXP_RANGE = {"f32": (-103.98, 88.72283), "f64": (-745.14, 709.782712893384)}
# f32 log(1+f) = f - f^2/2 + f^3 p(f), f in [sqrt(1/2)-1, sqrt(2)-1] (+0.1%)
_LOG_P32 = (-7.902456820011139e-2, 0.12625670433044434, -0.12999576330184937,
            0.1421419084072113, -0.16641156375408173, 0.2000105232000351,
            -0.2500030994415283, 0.3333333134651184)
# f64 log(1+f) = 2 atanh(s), s = f/(2+f): = f - f^2/2 + s (f^2/2 + z g(z)), z = s^2
_LOG_G64 = (0.14621885923046002, 0.15331280911137393, 0.18182902409658547,
            0.22222210952099322, 0.2857142862709691, 0.3999999999989703, 0.666666666666667)
# tanh(x) = x + x^3 p(x^2), |x| < 1/2
_TANH_P = {"f32": (-6.941306404769421e-3, 2.146996557712555e-2, -5.393337085843086e-2,
                   0.1333322525024414, -0.3333333134651184),
           "f64": (5.944155766274143e-05, -2.2104241386209256e-4, 5.8495219119942e-4,
                   -1.4549562533523034e-3, 3.5920330337445463e-3, -8.863229235282589e-3,
                   2.1869488295668458e-2, -5.3968253963575e-2, 0.13333333333329794,
                   -0.3333333333333333)}
_LN2_HI_LO = (0.6931471803691238, 1.9082149292705877e-10)  # f64: hi has 32 bits
CONTRACT = ("contract",)  # a*b+c may become an FMA: more exact, never less


class _Emit:
    """IR helpers for one float type and the integer of its width."""

    def __init__(self, b: ir.IRBuilder, dtype: str):
        self.b = b
        self.f = ir.FloatType() if dtype == "f32" else ir.DoubleType()
        self.i = ir.IntType(32 if dtype == "f32" else 64)
        self.mant, self.bias = (23, 127) if dtype == "f32" else (52, 1023)

    def k(self, v: float) -> ir.Constant:
        return ir.Constant(self.f, v)

    def ki(self, v: int) -> ir.Constant:
        return ir.Constant(self.i, v)

    def fma(self, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.fadd(self.b.fmul(a, x, flags=CONTRACT), c, flags=CONTRACT)

    def horner(self, x: ir.Value, coefs: tuple[float, ...]) -> ir.Value:
        p = self.k(coefs[0])
        for c in coefs[1:]:
            p = self.fma(p, x, self.k(c))
        return p

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.i)

    def pow2(self, n: ir.Value) -> ir.Value:
        """2^n for n in the normal exponent range, by building its bits."""
        return self.b.bitcast(self.b.shl(self.b.add(n, self.ki(self.bias)),
                                         self.ki(self.mant)), self.f)


def _intrinsic(b: ir.IRBuilder, name: str, t: ir.Type, args: list) -> ir.Value:
    mod = b.module
    full = f"{name}.{'f32' if isinstance(t, ir.FloatType) else 'f64'}"
    f = mod.globals.get(full) or ir.Function(mod, ir.FunctionType(t, [t] * len(args)), full)
    return b.call(f, args)


def _reduce(e: _Emit, dtype: str, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(n, expm1(r)) with x = n ln2 + r, |r| <= ln2/2; n as an integer (the lanes of an x
    beyond +-2^(mant-1) get garbage, for the caller to select away)."""
    b = e.b
    magic = 1.5 * 2.0 ** e.mant  # t's low bits are round(x log2e), two's complement
    t = e.fma(x, e.k(_LOG2E), e.k(magic))
    n = b.fsub(t, e.k(magic))
    c1, c2 = _LN2_SPLIT[dtype]
    r = e.fma(b.fneg(n), e.k(c2), e.fma(b.fneg(n), e.k(c1), x))
    s = e.fma(b.fmul(r, r), e.horner(r, _EXP_Q[dtype]), r)
    return b.sub(e.bits(t), e.bits(e.k(magic))), s


def _exp_body(e: _Emit, dtype: str, x: ir.Value) -> ir.Value:
    """exp(x) = 2^n p, x = n ln2 + r, p = exp(r). 2^n is added to p's exponent bits; where
    that leaves the normal range the result is a denormal (or 0), whose bits are
    round(p 2^(n + 149)) (f32) as an integer. No floating-point op ever sees or makes a
    denormal: each costs a microcode assist (a half -inf vector ran 1.6x slower)."""
    b = e.b
    lo, hi = _EXP_RANGE[dtype]
    xc = b.select(b.fcmp_ordered("<", x, e.k(lo)), e.k(lo), x)  # NaN stays NaN
    ni, s = _reduce(e, dtype, xc)
    p = b.fadd(s, e.k(1.0))
    yb = b.add(e.bits(p), b.shl(ni, e.ki(e.mant)))
    # denormal results: p 2^(n + bias - 1 + mant) < 2^mant, rounded by adding 2^mant
    nd = b.select(b.icmp_signed("<", ni, e.ki(1 - e.bias)), ni, e.ki(1 - e.bias))
    u = b.fmul(p, e.pow2(b.add(nd, e.ki(e.bias - 1 + e.mant))))
    one = e.k(2.0 ** e.mant)
    den = b.bitcast(b.sub(e.bits(b.fadd(u, one)), e.bits(one)), e.f)
    y = b.select(b.icmp_signed("<", yb, e.ki(1 << e.mant)), den, b.bitcast(yb, e.f))
    # above hi (and NaN) the lanes computed garbage: inf (NaN) instead
    big = b.fcmp_unordered(">", x, e.k(hi))
    return b.select(big, b.fadd(x, e.k(float("inf"))), y)


def _tanh_body(e: _Emit, dtype: str, x: ir.Value) -> ir.Value:
    """|x| < 1/2: x + x^3 p(x^2). Above: tanh|x| = m / (m + 2), m = expm1(2|x|) =
    2^n expm1(r) + 2^n - 1, with |x| > 20 (tanh 1 in f32 and f64) clamped; NaN propagates.
    (m / (m + 2) alone is 2.5 ulp off near 0.1, from the rounding of m + 2.) Each side
    gets inputs that make no denormal (a microcode assist each): tiny x is its own tanh."""
    b = e.b
    fabs = _intrinsic(b, "llvm.fabs", e.f, [x])
    a = b.select(b.fcmp_ordered("<", fabs, e.k(0.5)), e.k(0.5), fabs)
    a = b.select(b.fcmp_ordered(">", a, e.k(20.0)), e.k(20.0), a)
    ni, s = _reduce(e, dtype, b.fadd(a, a))
    two_n = e.pow2(ni)
    m = e.fma(two_n, s, b.fsub(two_n, e.k(1.0)))
    big = _intrinsic(b, "llvm.copysign", e.f, [b.fdiv(m, b.fadd(m, e.k(2.0))), x])
    xs = b.select(b.fcmp_ordered("<", fabs, e.k(2.0 ** -(e.mant // 2 + 2))), e.k(0.0), x)
    z = b.fmul(xs, xs)
    small = e.fma(b.fmul(xs, z), e.horner(z, _TANH_P[dtype]), x)
    return b.select(b.fcmp_ordered("<", fabs, e.k(0.5)), small, big)


def _log_body(e: _Emit, dtype: str, x: ir.Value) -> ir.Value:
    """log(x) = k ln2 + log(m), x = 2^k m with m in [sqrt(1/2), sqrt(2)); then the
    special values by select: 0 -> -inf, < 0 -> NaN, inf -> inf, NaN -> NaN."""
    b = e.b
    # a denormal x is j 2^(1 - bias - mant), j its bits: j as a float, by integer ops (a
    # float op on a denormal costs a microcode assist), with the exponent taken back
    tiny = b.fcmp_ordered("<", x, e.k(2.0 ** (1 - e.bias)))  # denormal (or <= 0)
    one = e.k(2.0 ** e.mant)
    j = b.fsub(b.bitcast(b.or_(e.bits(x), e.bits(one)), e.f), one)
    ix = b.select(tiny, b.sub(e.bits(j), e.ki((e.bias - 1 + e.mant) << e.mant)), e.bits(x))
    k = b.ashr(b.sub(ix, e.bits(e.k(0.5 ** 0.5))), e.ki(e.mant))
    m = b.bitcast(b.sub(ix, b.shl(k, e.ki(e.mant))), e.f)
    if dtype == "f32":
        kf = b.sitofp(k, e.f)
    else:  # no i64 -> f64 vector conversion before AVX-512: k sits in 1.5 2^52's bits
        big = e.k(1.5 * 2.0 ** e.mant)
        kf = b.fsub(b.bitcast(b.add(k, e.bits(big)), e.f), big)
    f = b.fsub(m, e.k(1.0))
    ff = b.fmul(f, f)
    if dtype == "f32":  # f + f^2 (-1/2 + f p(f)) + k ln2: ln2's rounding is < 0.1 ulp
        y = e.fma(ff, e.fma(f, e.horner(f, _LOG_P32), e.k(-0.5)), f)
        y = e.fma(kf, e.k(0.6931471805599453), y)
    else:
        hi, lo = _LN2_HI_LO
        s = b.fdiv(f, b.fadd(f, e.k(2.0)))
        z = b.fmul(s, s)
        hfsq = b.fmul(e.k(0.5), ff)
        r = b.fmul(z, e.horner(z, _LOG_G64))
        y = e.fma(s, b.fadd(hfsq, r), b.fmul(kf, e.k(lo)))
        y = e.fma(kf, e.k(hi), b.fsub(f, b.fsub(hfsq, y)))
    y = b.select(b.fcmp_ordered("==", x, e.k(float("inf"))), x, y)
    y = b.select(b.fcmp_ordered("==", x, e.k(0.0)), e.k(float("-inf")), y)
    return b.select(b.fcmp_unordered("<", x, e.k(0.0)), e.k(float("nan")), y)


_BODIES = {"exp": _exp_body, "log": _log_body, "tanh": _tanh_body}


def _own(mod: ir.Module, fn: str, dtype: str) -> ir.Function:
    """The module's internal always-inline `ember.<fn>.<dtype>`, built on first use."""
    name = f"ember.{fn}.{dtype}"
    f = mod.globals.get(name)
    if f is None:
        t = ir.FloatType() if dtype == "f32" else ir.DoubleType()
        f = ir.Function(mod, ir.FunctionType(t, [t]), name)
        f.linkage = "internal"
        f.attributes.add("alwaysinline")
        f.attributes.add("nounwind")
        b = ir.IRBuilder(f.append_basic_block())
        b.ret(_BODIES[fn](_Emit(b, dtype), dtype, f.args[0]))
    return f


def exp(b: ir.IRBuilder, dtype: str, x: ir.Value) -> ir.Value:
    """exp(x), vectorizable, at one speed whatever x (-inf, -1e4, overflow, NaN)."""
    return b.call(_own(b.module, "exp", dtype), [x])


def log(b: ir.IRBuilder, dtype: str, x: ir.Value) -> ir.Value:
    """log(x), vectorizable, at one speed whatever x (0, negative, denormal, inf)."""
    return b.call(_own(b.module, "log", dtype), [x])


def tanh(b: ir.IRBuilder, dtype: str, x: ir.Value) -> ir.Value:
    """tanh(x), vectorizable, at one speed whatever x (libmvec's slows on +-inf, NaN)."""
    return b.call(_own(b.module, "tanh", dtype), [x])


_OWN = {"exp": exp, "log": log, "tanh": tanh}


def call(b: ir.IRBuilder, fn: str, dtype: str, x: ir.Value) -> ir.Value:
    """`fn(x)` for a float scalar (fn in FUNCS), vectorizable."""
    if fn in _OWN:
        return _OWN[fn](b, dtype, x)
    return _libcall(b, fn, dtype, x)


def _libcall(b: ir.IRBuilder, fn: str, dtype: str, x: ir.Value) -> ir.Value:
    """`fn(x)` through libm, vectorizable where libmvec has the function."""
    mod = b.module
    t = x.type
    if _libm() is None or not hasattr(_libm(), _libname(fn, dtype)):
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
