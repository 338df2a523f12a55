"""The CPU's exp, log, tanh and erf (backends/cpu/kernels/vmath.py: straight-line LLVM IR, no
libmvec) through compiled graphs, f32 and f64: within 2 ulp of a long-double reference over
dense sweeps (denormal results not flushed: exp's exact, erf's within an ulp), every special
value exactly numpy's (math's for erf) in every lane position, the -inf / -1e4 lanes of a
causal mask exactly 0, and the loop vectorized with no call left in it. Their speed on such
lanes is measured, not asserted (benchmarks/run.py, eltwise)."""

import math

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.backends import cpu
from ember.ir import Builder, Graph, TensorType, verify

NP = {"f32": np.float32, "f64": np.float64}
# f64 against numpy's long double: 80-bit on x86, 128-bit on aarch64 Linux; where it is
# only a double, the reference's own error counts too
LONG = np.finfo(np.longdouble).eps < 1e-18
TOL = {"f32": 2.0, "f64": 2.0 if LONG else 3.0}


class Exp(nn.Module):
    def forward(self, x):
        return x.exp(), nn.functional.sigmoid(x)


class Unary(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return nn.functional.erf(x) if self.fn == "erf" else getattr(x, self.fn)()


def reference(fn: str, x: np.ndarray) -> np.ndarray:
    if fn == "erf":
        return erf_reference(x)
    with np.errstate(all="ignore"):
        return getattr(np, fn)(x.astype(np.longdouble))


def math_erf(x: np.ndarray) -> np.ndarray:
    """libm's erf (within an ulp of a double), rounded to x's type."""
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


def erf_reference(x: np.ndarray) -> np.ndarray:
    """erf in long double (numpy has none): for |x| <= 2 the series 2/sqrt(pi) e^-x^2
    sum_n (2x^2)^n x / (2n+1)!!, all of its terms positive (no cancellation); above, 1 -
    libm's erfc, which is below 5e-3 there (its rounding < 0.01 ulp of erf). Where long
    double is only a double, libm's erf."""
    if not LONG:
        return math_erf(x.astype(np.float64)).astype(np.longdouble)
    a = np.abs(x.astype(np.longdouble))
    s = np.minimum(a, 2)
    term, total = s.copy(), s.copy()
    for n in range(1, 70):
        term = term * 2 * s * s / (2 * n + 1)
        total += term
    series = np.longdouble("1.1283791670955125738961589031215452") * np.exp(-s * s) * total
    erfc = np.vectorize(math.erfc, otypes=[np.float64])(a.astype(np.float64))
    return np.sign(x).astype(np.longdouble) * np.where(a <= 2, series, 1 - erfc.astype(a.dtype))


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in ulps of want rounded to got's type (the denormal ulp below the
    normal range), where both are finite."""
    with np.errstate(over="ignore"):
        rounded = want.astype(got.dtype)
    fin = np.isfinite(rounded) & np.isfinite(got)
    ulp = np.spacing(np.abs(rounded[fin])).astype(np.longdouble)
    return np.abs(got[fin].astype(np.longdouble) - want[fin]) / ulp


def sweep(fn: str, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    f32 = dtype == "f32"
    if fn == "exp":
        lo, hi, den = (-105.0, 90.0, -87.4) if f32 else (-746.0, 710.5, -708.4)
        parts = [np.linspace(lo, hi, 200_001), np.linspace(lo, den, 20_001),  # denormals
                 rng.uniform(-1, 1, 20_000), rng.uniform(-1e-6, 1e-6, 1000)]
    elif fn == "log":
        emin, emax = (-149, 128) if f32 else (-1074, 1024)
        parts = [2.0 ** rng.uniform(emin, emax, 200_000), rng.uniform(0.5, 2, 20_000),
                 1 + rng.uniform(-1e-3, 1e-3, 5000)]
    else:  # tanh, erf: odd, saturating (erf at 3.92 in f32, 5.92 in f64)
        emin = -150 if f32 else -1075
        hi = 25 if fn == "tanh" else 7
        parts = [np.linspace(-hi, hi, 200_001), rng.uniform(-1.5, 1.5, 20_000),
                 rng.choice([-1, 1], 20_000) * 2.0 ** rng.uniform(emin, 0, 20_000)]
    with np.errstate(over="ignore"):
        x = np.concatenate(parts).astype(NP[dtype])
    x = x[np.isfinite(x) & ((x > 0) if fn == "log" else True)]
    return x[: len(x) // 16 * 16 - 9]  # a scalar remainder too


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("fn", ["exp", "log", "tanh", "erf"])
def test_within_two_ulp_over_a_dense_sweep(fn, dtype):
    x = sweep(fn, dtype)
    got = em.compile(Unary(fn), x, backend="cpu")(x)
    want = reference(fn, x)
    with np.errstate(over="ignore"):
        rounded = want.astype(got.dtype)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(rounded))
    np.testing.assert_array_equal(got[~np.isfinite(got)], rounded[~np.isfinite(rounded)])
    err = ulps(got, want)
    assert err.max() <= TOL[dtype], (fn, dtype, float(err.max()))
    assert np.mean(err > 1) < 0.02  # mostly within 1 ulp


SPECIAL = {
    "exp": [-np.inf, -1e30, -1e4, -0.0, 0.0, 1e4, 1e30, np.inf, np.nan],
    "log": [-np.inf, -1e4, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan, -np.nan],
    "tanh": [-np.inf, -1e4, -20.0, -0.0, 0.0, 20.0, 1e4, np.inf, np.nan],
    "erf": [-np.inf, -1e4, -7.0, -6.0, -0.0, 0.0, 6.0, 7.0, 1e4, np.inf, np.nan],
}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("fn", ["exp", "log", "tanh", "erf"])
def test_special_values_are_numpys_exactly_in_every_lane(fn, dtype):
    # each value in every position of a 16-lane vector, and in the scalar remainder
    vals = np.array(SPECIAL[fn] * 19, NP[dtype])
    x = np.concatenate([np.roll(vals, k) for k in range(16)] + [vals[:7]])
    got = em.compile(Unary(fn), x, backend="cpu")(x)
    with np.errstate(all="ignore"):
        want = math_erf(x) if fn == "erf" else getattr(np, fn)(x)
    np.testing.assert_array_equal(got, want)  # NaN where numpy's is NaN
    np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(want[want == 0]))


EDGES = {"f32": [-np.inf, -1e30, -1e4, -104.5, -103.99, -103.97, -100.0, -87.4, -87.3, -20.0,
                 -1.0, -0.0, 0.0, 1e-8, 1.0, 20.0, 88.37, 88.38, 88.7, 88.72283, 88.72284,
                 88.8, 89.0, 1e4, np.inf, np.nan],
         "f64": [-np.inf, -1e300, -1e4, -746.0, -745.2, -745.1, -740.0, -708.5, -708.0, -1.0,
                 0.0, 1.0, 709.1, 709.7, 709.78, 709.8, 1e4, np.inf, np.nan]}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_exp_and_sigmoid_agree_with_numpy_over_the_whole_range(dtype):
    # several vectors' worth, each edge in every lane
    x = np.array(EDGES[dtype] * 9, NP[dtype])
    exp, sig = em.compile(Exp(), x, backend="cpu")(x)
    with np.errstate(over="ignore"):
        want_exp, want_sig = np.exp(x), 1 / (1 + np.exp(-x))
    np.testing.assert_array_equal(np.isnan(exp), np.isnan(x))
    np.testing.assert_array_equal(exp == 0, want_exp == 0)  # exactly 0 where numpy's is
    np.testing.assert_array_equal(np.isinf(exp), np.isinf(want_exp))
    assert ulps(exp, reference("exp", x)).max() <= TOL[dtype]
    np.testing.assert_allclose(sig, want_sig, rtol=4 * np.finfo(x.dtype).eps, atol=0)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_exp_denormal_results_are_exact_not_flushed(dtype):
    lo, hi = (-103.97, -87.34) if dtype == "f32" else (-745.13, -708.4)
    x = np.linspace(lo, hi, 4099).astype(NP[dtype])
    got = em.compile(Unary("exp"), x, backend="cpu")(x)
    want = reference("exp", x).astype(x.dtype)
    assert (got > 0).all() and (got < np.finfo(x.dtype).tiny).all()
    assert ulps(got, reference("exp", x)).max() <= 1.0
    assert np.mean(got == want) > 0.9  # mostly correctly rounded


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_erf_of_denormals_is_not_flushed(dtype):
    # erf(x) = 2/sqrt(pi) x there: denormal results (and the smallest normals), both signs
    t = np.finfo(NP[dtype])
    x = np.linspace(t.smallest_subnormal, t.tiny, 4099).astype(NP[dtype])
    x = np.concatenate([x, -x])
    got = em.compile(Unary("erf"), x, backend="cpu")(x)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(x))
    assert (got != 0).all()
    assert ulps(got, erf_reference(x)).max() <= 1.0
    assert np.mean(got == math_erf(x)) > 0.8  # mostly correctly rounded (rounded twice)


@pytest.mark.parametrize("mask", [-np.inf, -1e4])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_causally_masked_softmax_is_exactly_zero_where_masked(mask, dtype):
    class Softmax(nn.Module):
        def forward(self, s):
            return nn.functional.softmax(s, axis=-1)

    t = 37  # rows of an attention score matrix, a vector tail in each
    rng = np.random.default_rng(2)
    future = np.triu(np.ones((t, t), bool), k=1)
    s = np.where(future, mask, 3 * rng.standard_normal((t, t))).astype(NP[dtype])
    got = em.compile(Softmax(), s, backend="cpu")(s)
    e = np.exp(s - s.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    assert (got[future] == 0).all() and not np.signbit(got[future]).any()
    assert (got[~future] > 0).all()
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(s.dtype).eps, atol=0)


@pytest.mark.parametrize("fn", ["exp", "log", "tanh", "erf"])
def test_kernel_loop_is_vectorized_with_no_math_call(fn, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DUMP_LLVM", str(tmp_path))
    g = Graph("f", [TensorType((1000,), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op(f"ember.{fn}", g.args[0])])
    x = np.linspace(0.1, 3, 1000, dtype=np.float32)
    got = cpu.Executable(verify(g), use_cache=False)([x])[0]
    want = math_erf(x) if fn == "erf" else getattr(np, fn)(x)
    np.testing.assert_allclose(got, want, rtol=3e-7)
    opt = "".join(p.read_text() for p in tmp_path.glob("*.opt.ll"))
    assert " x float>" in opt  # vector lanes
    for callee in (f"@{fn}f", f"@ember_{fn}f", f"@llvm.{fn}.", "@_ZGV"):
        assert callee not in opt, callee
