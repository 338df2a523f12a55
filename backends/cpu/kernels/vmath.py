"""exp, log, tanh and erf in LLVM IR, vectorizable and at one speed whatever the input.

LLVM turns a call to `expf` into `llvm.exp`, which codegen scalarizes into 16 libm calls
per vector. glibc's libmvec, which the vector function ABI hands to the loop vectorizer,
sends a whole vector down a scalar slow path when one lane is out of its range: exp of
the -inf / -1e4 lanes of a causal mask (5-14x slower here), of a denormal result or an
overflow; log of 0, inf, a negative, NaN or a denormal (4-14x); tanh of +-inf or NaN
(1.5-2.6x); erf of a denormal (1.6x f32, 2.6x f64). So all four are written here as
internal always-inline functions of straight-line code (range reduction, polynomials,
exponent bits, selects for the special values and the ranges; no branch, so every lane
runs the same path). They inline into the kernel's loop, which the loop vectorizer
vectorizes like any arithmetic, and the scalar remainder runs the same code: a value never
depends on its position. No float arithmetic in them makes a denormal, and log, tanh and
erf keep denormal arguments out of theirs: each costs a microcode assist (exp of a half
-inf vector ran 1.6x slower from one underflowing multiply). Denormal results are
computed, not flushed. Measured: exp <= 1.06 ulp, log <= 0.96, tanh <= 1.5, erf <= 1.24,
f32 (every input) and f64 (dense sweeps against long double, erf's checked on mpmath);
libmvec's f32 log was 3.9 ulp off. erf runs at 1.2-1.5x libmvec's speed in f32 (bias +
exact GELU: 1.2x), 0.7-0.8x in f64, whose polynomials are more than twice as long."""

from __future__ import annotations

from llvmlite import ir

# -- exp, log, tanh, erf in LLVM IR --------------------------------------------------------------
# exp, log, tanh coefficients: Chebyshev fits (mpmath) on the reduced range, rounded to the
# type; each fit is within 0.1 ulp there, so the result's error is the evaluation's rounding
# (<= 1 ulp).
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
# erf: |x| < A: x + x q(x^2), q ~ erf(x)/x - 1; [A, T]: p(t) ~ log2(erfc(t)); Remez fits
# (mpmath) to the relative error of erf, rounded to the type lowest-order coefficient first,
# the rest refitted each time: within 2^-27.6 (f32), 2^-55.3 (f64). (A, T, q, p)
_ERF = {"f32": (0.5625, 4.0,
                (0.00460077216848731, -0.02670116163790226, 0.11282031238079071,
                 -0.3761257827281952, 0.12837916612625122),
                (0.00032191036734730005, -0.004750394262373447, 0.03340337052941322,
                 -0.15251539647579193, -0.9165462851524353, -1.628379225730896,
                 4.9350848712492734e-05)),
        "f64": (1.0, 6.0,
                (-7.607828062975576e-10, 1.3616710040620551e-08, -1.6183993906460129e-07,
                 1.6444150923391441e-06, -1.4924465665460581e-05, 0.00012055280497661016,
                 -0.0008548325485024743, 0.005223977596736197, -0.026866170641959154,
                 0.1128379167093695, -0.37612638903183343, 0.12837916709551256),
                (-7.110742132133049e-12, 2.9503556357952207e-10, -5.6761214040326516e-09,
                 6.697620863262104e-08, -5.385792676643496e-07, 3.0812296969912576e-06,
                 -1.2504501370872927e-05, 3.29273358510326e-05, -2.9242332513635165e-05,
                 -0.00019482885151665775, 0.0011117908252873342, -0.0027641065556196502,
                 0.0005923960767368831, 0.0273970474984223, -0.14816974846267333,
                 -0.918482603035237, -1.6278997036051066, -7.254123008295377e-07))}
# 2^f = 1 + f e(f), |f| <= 1/2, to 2^-26 (f32), 2^-56 (f64): erf needs no more
_EXP2 = {"f32": (0.00013332995877135545, 0.001338792615570128, 0.009625444188714027,
                 0.055503662675619125, 0.24022594094276428, 0.6931471824645996),
         "f64": (4.5194267785482163e-10, 7.075625619473721e-09, 1.0177655264912775e-07,
                 1.321542444361811e-06, 1.5252734739377845e-05, 0.00015403530478894586,
                 0.001333355814556696, 0.00961812910757706, 0.055504108664824574,
                 0.24022650695910172, 0.6931471805599453)}
CONTRACT = ("contract",)  # a*b+c may become an FMA: more exact, never less


class _Emit:
    """IR helpers for one float type and the integer of its width."""

    def __init__(self, b: ir.IRBuilder, dtype: str, lanes: int = 1):
        self.b = b
        self.f = _vector(ir.FloatType() if dtype == "f32" else ir.DoubleType(), lanes)
        self.i = _vector(ir.IntType(32 if dtype == "f32" else 64), lanes)
        self.mant, self.bias = (23, 127) if dtype == "f32" else (52, 1023)

    def k(self, v: float) -> ir.Constant:
        return splat_constant(self.f, v)

    def ki(self, v: int) -> ir.Constant:
        return splat_constant(self.i, v)

    def fma(self, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.fadd(self.b.fmul(a, x, flags=CONTRACT), c, flags=CONTRACT)

    def horner(self, x: ir.Value, coefs: tuple[float, ...]) -> ir.Value:
        p = self.k(coefs[0])
        for c in coefs[1:]:
            p = self.fma(p, x, self.k(c))
        return p

    def horner2(self, x: ir.Value, coefs: tuple[float, ...]) -> ir.Value:
        """p(x) = e(x^2) + x o(x^2): two Horner chains of half the length."""
        x2 = self.b.fmul(x, x)
        odd, even = coefs[-2::-2][::-1], coefs[::-2][::-1]
        return self.fma(self.horner(x2, odd), x, self.horner(x2, even))

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.i)

    def pow2(self, n: ir.Value) -> ir.Value:
        """2^n for n in the normal exponent range, by building its bits."""
        return self.b.bitcast(self.b.shl(self.b.add(n, self.ki(self.bias)),
                                         self.ki(self.mant)), self.f)


def _vector(t: ir.Type, lanes: int) -> ir.Type:
    return t if lanes == 1 else ir.VectorType(t, lanes)


def splat_constant(t: ir.Type, v) -> ir.Constant:
    """`v` in every lane of vector type `t` (or of scalar type `t`)."""
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [ir.Constant(t.element, v)] * t.count)
    return ir.Constant(t, v)


def _intrinsic(b: ir.IRBuilder, name: str, t: ir.Type, args: list) -> ir.Value:
    mod = b.module
    el = t.element if isinstance(t, ir.VectorType) else t
    lanes = f"v{t.count}" if isinstance(t, ir.VectorType) else ""
    full = f"{name}.{lanes}{'f32' if isinstance(el, ir.FloatType) else 'f64'}"
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


def _erf_body(e: _Emit, dtype: str, x: ir.Value) -> ir.Value:
    """|x| < A: x + x q(x^2). Above: 1 - 2^p(t), t = |x| clamped to T (erf rounds to 1
    from T on), as 1 - 2^n - 2^n f e(f), p(t) = n + f: one rounding, not exp's and then
    the subtraction's; in base 2 the reduction is exact and needs no multiply. p(t) = p0 +
    p1 t + t^2 s(t) keeps its largest product unrounded (f32: 1.44 ulp -> 1.24). |x| is
    held at 2^-(mant + 2) and up in both, where the x^2 term is below the rounding but no
    product of it is denormal. NaN propagates through p; the sign is x's, copied last."""
    b = e.b
    lo, hi, q, p = _ERF[dtype]
    # f64's chains are long enough that the loop's iterations wait on them (split: 14%
    # faster); f32's are not, and the split's extra live values cost register copies in a
    # loop nest (bias + GELU: 25% slower)
    poly = e.horner2 if dtype == "f64" else e.horner
    a = _intrinsic(b, "llvm.fabs", e.f, [x])
    den = b.fcmp_ordered("<", a, e.k(2.0 ** (1 - e.bias)))  # denormal or 0
    one = e.k(2.0 ** e.mant)
    j = b.fsub(b.bitcast(b.or_(e.bits(a), e.bits(one)), e.f), one)  # a's bits, as a float
    # a denormal x as j: j + j q(0) is then its erf in units of the least denormal
    am = b.select(den, j, a)
    lo_z = e.k(2.0 ** -(e.mant + 2))
    az = b.select(b.fcmp_ordered("<", a, lo_z), lo_z, a)  # NaN stays NaN
    y = e.fma(am, e.horner(b.fmul(az, az), q), am)
    t = b.select(b.fcmp_ordered(">", az, e.k(hi)), e.k(hi), az)
    lg = e.fma(e.k(p[-2]), t, e.fma(b.fmul(t, t), poly(t, p[:-2]), e.k(p[-1])))
    magic = e.k(1.5 * 2.0 ** e.mant)  # lg + magic: round(lg) in its low bits
    m = b.fadd(lg, magic)
    f = b.fsub(lg, b.fsub(m, magic))
    two_n = e.pow2(b.sub(e.bits(m), e.bits(magic)))
    big = e.fma(b.fneg(two_n), b.fmul(f, poly(f, _EXP2[dtype])), b.fsub(e.k(1.0), two_n))
    y = b.select(b.fcmp_ordered("<", a, e.k(lo)), y, big)
    y = b.select(den, _erf_tiny(e, y), y)
    return _intrinsic(b, "llvm.copysign", e.f, [y, x])


def _erf_tiny(e: _Emit, u: ir.Value) -> ir.Value:
    """|erf(x)| for a denormal x from u = 2/sqrt(pi) j, j its bits: the result's bits are
    round(u), a denormal or, from 2^mant on, one of the smallest normals (whose bits are
    as linear in the value), built without float arithmetic that makes a denormal."""
    b = e.b
    one = e.k(2.0 ** e.mant)
    den = b.sub(e.bits(b.fadd(u, one)), e.bits(one))
    norm = b.sub(e.bits(u), e.ki((e.bias + e.mant - 1) << e.mant))
    return b.bitcast(b.select(b.fcmp_ordered("<", u, one), den, norm), e.f)


_BODIES = {"exp": _exp_body, "log": _log_body, "tanh": _tanh_body, "erf": _erf_body}


def _own(mod: ir.Module, fn: str, dtype: str, lanes: int) -> ir.Function:
    """The module's internal always-inline `ember.<fn>.<dtype>` (`.v<lanes>` on vectors),
    built on first use."""
    name = f"ember.{fn}.{dtype}" + (f".v{lanes}" if lanes > 1 else "")
    f = mod.globals.get(name)
    if f is None:
        t = _vector(ir.FloatType() if dtype == "f32" else ir.DoubleType(), lanes)
        f = ir.Function(mod, ir.FunctionType(t, [t]), name)
        f.linkage = "internal"
        f.attributes.add("alwaysinline")
        f.attributes.add("nounwind")
        b = ir.IRBuilder(f.append_basic_block())
        b.ret(_BODIES[fn](_Emit(b, dtype, lanes), dtype, f.args[0]))
    return f


def call(b: ir.IRBuilder, fn: str, dtype: str, x: ir.Value) -> ir.Value:
    """`fn(x)` for a float scalar or vector of `dtype`, fn one of exp, log, tanh, erf:
    vectorizable, and at one speed whatever x."""
    lanes = x.type.count if isinstance(x.type, ir.VectorType) else 1
    return b.call(_own(b.module, fn, dtype, lanes), [x])


def exp(b: ir.IRBuilder, dtype: str, x: ir.Value) -> ir.Value:
    """exp(x), vectorizable, at one speed whatever x (-inf, -1e4, overflow, NaN)."""
    return call(b, "exp", dtype, x)
