"""CUDA C for one element of every elementwise op, matching numpy's semantics.

Kernel templates (`templates.py`) own the loops and the indexing; this file owns what happens to one
element, so per-op kernels and fused kernels emit exactly the same expressions. The
numerics follow the CPU backend's `scalar.py`: NaN-propagating max/min, integer true
division truncated back, float-to-int casts that give INT_MIN for NaN and out-of-range
values (as numpy on x86), bool stored as one byte. Math functions are the CUDA ones
without fast-math (exp/log/tanh/erf within 2 ulp, IEEE division and sqrt). bf16 and f16
are stored as their 16 bits and only moved and cast (ops on them run in f32:
passes/widen.py).
"""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np

from ...ir.dialects.ember import expand
from ...ir.opdef import ops_with
from ...ir.precision import rounded
from ...ir.types import LOW_PRECISION
from ..errors import UnsupportedOpError

CTYPE = {"f32": "float", "f64": "double", "f16": "unsigned short", "bf16": "unsigned short",
         "i64": "long long", "i32": "int", "i1": "bool"}
FLOATS = ("f32", "f64")
ITEMSIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i1": 1}
_FN = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "pow": "pow",
       "abs": "fabs"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

# Helpers every translation unit starts with. No #include: NVRTC has no standard headers,
# and nvcc (used by the tests) must accept the same text.
PRELUDE = r"""#define EMBER_INF_F __int_as_float(0x7f800000)
#define EMBER_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define EMBER_I32_MIN (-2147483647 - 1)
#define EMBER_I64_MIN (-9223372036854775807LL - 1)

extern __shared__ __align__(16) unsigned char ember_smem[];

// numpy's maximum/minimum: a NaN in either operand wins.
template <typename T> __device__ __forceinline__ T ember_fmax(T a, T b) {
  return (a > b || a != a) ? a : b;
}
template <typename T> __device__ __forceinline__ T ember_fmin(T a, T b) {
  return (a < b || a != a) ? a : b;
}
template <typename T> __device__ __forceinline__ T ember_imax(T a, T b) { return a > b ? a : b; }
template <typename T> __device__ __forceinline__ T ember_imin(T a, T b) { return a < b ? a : b; }

// float -> int as numpy on x86: truncation; NaN and out of range give INT_MIN.
__device__ __forceinline__ int ember_f2i32(double x) {
  return (x != x || x >= 2147483648.0 || x < -2147483648.0) ? EMBER_I32_MIN : (int)x;
}
__device__ __forceinline__ long long ember_f2i64(double x) {
  return (x != x || x >= 9223372036854775808.0 || x < -9223372036854775808.0)
      ? EMBER_I64_MIN : (long long)x;
}

// f32 <-> bf16 and f16 on their bits, to nearest even; a NaN stays a quiet NaN of its sign.
// In integer arithmetic: no cuda_bf16.h / cuda_fp16.h, which NVRTC has not here.
__device__ __forceinline__ float ember_bf16_to_f32(unsigned short h) {
  return __uint_as_float((unsigned int)h << 16);
}
__device__ __forceinline__ unsigned short ember_f32_to_bf16(float x) {
  const unsigned int u = __float_as_uint(x);
  if (x != x) return (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float ember_f16_to_f32(unsigned short h) {
  const unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = h & 0x7fffu;
  if (e >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | (e & 0x3ffu) << 13);
  if (e >= 0x400u) return __uint_as_float(sign | (e + 0x1c000u) << 13);  // rebias 15 -> 127
  return __uint_as_float(sign | __float_as_uint((float)e * 5.9604644775390625e-8f));  // 2^-24
}
__device__ __forceinline__ unsigned short ember_f32_to_f16(float x) {
  const unsigned int u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to inf
  if (a >= 0x38800000u) {  // normal: rebias 127 -> 15, round the 13 bits dropped
    const unsigned int r = a - 0x38000000u;
    return (unsigned short)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }  // subnormal: adding 0.5 (whose ulp is 2^-24) rounds to a multiple of 2^-24
  return (unsigned short)(sign | (__float_as_uint(__uint_as_float(a) + 0.5f) - 0x3f000000u));
}

// Integer power by squaring; a negative exponent gives the truncated 1 / x**-e.
template <typename T> __device__ __forceinline__ T ember_ipow(T x, T e) {
  if (e < 0) return x == 1 ? 1 : (x == -1 ? ((e & 1) ? -1 : 1) : 0);
  T r = 1;
  while (e > 0) { if (e & 1) r *= x; x *= x; e >>= 1; }
  return r;
}

// The counter-based generator of ember.dropout (backends/interpreter/rng.py).
__device__ __forceinline__ unsigned int ember_mix32(unsigned int x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}
__device__ __forceinline__ unsigned int ember_dropout_hash(unsigned int seed, unsigned int key,
                                                           unsigned int step,
                                                           unsigned int index) {
  return ember_mix32(seed ^ ember_mix32(key ^ ember_mix32(step ^ index)));
}

// Reductions: one warp, then one block (the result is valid in warp 0, lane 0).
template <typename T> __device__ __forceinline__ T ember_shfl_down(T v, int d) {
  return __shfl_down_sync(0xffffffffu, v, d);
}
"""


def ctype(dtype: str) -> str:
    if dtype not in CTYPE:
        raise UnsupportedOpError(f"the cuda backend does not support {dtype} tensors; "
                                 f"supported dtypes: {', '.join(CTYPE)}")
    return CTYPE[dtype]


def literal(dtype: str, value) -> str:
    """A C literal of `dtype` (floats through a double literal, rounded by the cast)."""
    if dtype == "i1":
        return "true" if value else "false"
    if dtype in LOW_PRECISION:  # its bits
        return f"((unsigned short)0x{int(rounded(value, dtype).view(np.uint16)):04X}u)"
    if dtype in FLOATS:
        v = float(value)
        if v != v:
            return f"(({ctype(dtype)})(0.0 / 0.0))"
        if v in (float("inf"), float("-inf")):
            inf = "EMBER_INF_F" if dtype == "f32" else "EMBER_INF_D"
            return inf if v > 0 else f"(-{inf})"
        text = repr(v)
        return f"{text}f" if dtype == "f32" and _exact_f32(v) else \
            (f"(float){text}" if dtype == "f32" else text)
    if dtype == "i64":
        v = int(value)
        return "EMBER_I64_MIN" if v == -(1 << 63) else f"{v}LL"
    v = int(value)
    return "EMBER_I32_MIN" if v == -(1 << 31) else str(v)


def _exact_f32(v: float) -> bool:
    import numpy as np

    return float(np.float32(v)) == v


def math_fn(name: str, dtype: str) -> str:
    """`expf` for f32, `exp` for f64."""
    base = _FN[name]
    return base + "f" if dtype == "f32" else base


def identity(kind: str, dtype: str) -> str:
    """The start of an add/max/min/mul reduction, as a C literal of the accumulator's dtype
    (-0.0 for float sums, so x + identity == x bit for bit)."""
    _check_precision(kind, dtype)
    if kind == "add":
        return literal(dtype, -0.0 if dtype in FLOATS else 0)
    if kind == "mul":
        return literal(dtype, 1)
    sign = 1 if kind == "min" else -1
    if dtype in FLOATS:
        return literal(dtype, sign * float("inf"))
    if dtype == "i1":
        return literal(dtype, kind == "min")
    bits = 8 * ITEMSIZE[dtype] - 1
    return literal(dtype, (1 << bits) - 1 if kind == "min" else -(1 << bits))


def combine(kind: str, a: str, b: str, dtype: str) -> str:
    """The step of an add/max/min/mul reduction (on bools: or, or, and, and)."""
    _check_precision(kind, dtype)
    if dtype == "i1":
        return f"({a} || {b})" if kind in ("add", "max") else f"({a} && {b})"
    if kind in ("max", "min"):
        return f"ember_{'f' if dtype in FLOATS else 'i'}{kind}({a}, {b})"
    return f"({a} {'+' if kind == 'add' else '*'} {b})"


def cast(x: str, src: str, dst: str) -> str:
    """numpy `astype`: truncation toward zero, bool(x) is x != 0 (NaN is True)."""
    if src == dst:
        return x
    if src in LOW_PRECISION or dst in LOW_PRECISION:
        if "f32" not in (src, dst):
            raise UnsupportedOpError(f"the cuda backend casts {src} to {dst} through f32: run "
                                     "the widen-low-precision pass first")
        return f"ember_{src}_to_{dst}({x})"
    if dst == "i1":
        return f"({x} != 0)"
    if src in FLOATS and dst in ("i32", "i64"):
        return f"ember_f2{dst}((double){x})"
    return f"(({ctype(dst)}){x})"


def _unsupported(name: str, dtype: str):
    raise UnsupportedOpError(f"the cuda backend has no kernel for '{name}' on {dtype} tensors")


def _check_precision(name: str, dtype: str) -> None:
    """Arithmetic on bf16/f16 runs in f32 here: a graph that still has it is refused."""
    if dtype in LOW_PRECISION:
        raise UnsupportedOpError(f"the cuda backend computes '{name}' on {dtype} in f32: run "
                                 "the widen-low-precision pass first (the runtime's pipeline "
                                 "does)")


# Composed ops' device functions, by name, each after the ones it calls. A definition is a
# pure function of its name (which hashes it), so one table serves every translation unit.
_COMPOSED: dict[str, str] = {}
_COMPOSED_CALL = re.compile(r"\bember_c_\w+(?=\()")


def _composed(name: str, xs: list[str], lets: list[str], result: str) -> str:
    """The name of a `__device__` function computing one element of a composed op: one
    `const auto` per value, so nothing is computed twice. A function rather than a lambda
    called in place: NVRTC 13.0 refuses lambdas in kernels ("host functions are not allowed
    in JIT mode"); 13.5 and nvcc accept them."""
    params = ", ".join(f"const X{k} {x}" for k, x in enumerate(xs))
    typenames = ", ".join(f"typename X{k}" for k in range(len(xs)))
    body = f"({params}) {{\n  " + "\n  ".join([*lets, f"return {result};"]) + "\n}"
    fn = f"ember_c_{name.split('.', 1)[-1]}_{hashlib.sha1(body.encode()).hexdigest()[:10]}"
    _COMPOSED.setdefault(
        fn, f"template <{typenames}> __device__ __forceinline__ auto {fn}{body}\n")
    return fn


def composed_definitions(source: str) -> str:
    """The definitions of the composed ops' functions `source` calls, callees first."""
    needed = set(_COMPOSED_CALL.findall(source))
    for fn in reversed(_COMPOSED):
        if fn in needed:
            needed.update(_COMPOSED_CALL.findall(_COMPOSED[fn]))
    return "".join(d for fn, d in _COMPOSED.items() if fn in needed)


def expr(name: str, attrs: dict, args: list[str], dtype: str) -> str:
    """A C expression for one element of elementwise op `name` (any dialect prefix);
    `dtype` is the operands' dtype (for select: of the two values; for cast: the source's).
    An op declared as a composition of others (its `expand`) is a call of a `__device__`
    function computing that composition (`composed`)."""
    if name.rsplit(".", 1)[-1] != "cast":
        _check_precision(name, dtype)
    lets: list[str] = []

    def let(n: str, a: dict, v: list[str]) -> str:
        lets.append(f"const auto e{len(lets)} = {expr(n, a, v, dtype)};")
        return f"e{len(lets) - 1}"

    xs = [f"x{k}" for k in range(len(args))]
    r = expand(name, attrs, xs, let, lambda v: literal(dtype, v))
    if r is not None:
        return f"{_composed(name, xs, lets, r)}({', '.join(args)})"
    op = name.split(".", 1)[-1]
    ctype(dtype)
    fl = dtype in FLOATS
    if op == "cast":
        return cast(args[0], dtype, attrs["dtype"])
    if op == "select":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if op == "cmp":
        return f"({args[0]} {_CMP[attrs['predicate']]} {args[1]})"
    a = args[0]
    b = args[1] if len(args) > 1 else None
    if dtype == "i1":
        match op:
            case "add" | "max":
                return f"({a} || {b})"
            case "mul" | "min":
                return f"({a} && {b})"
            case "abs" | "relu":
                return a
        _unsupported(name, dtype)
    match op:
        case "add":
            return f"({a} + {b})"
        case "sub":
            return f"({a} - {b})"
        case "mul":
            return f"({a} * {b})"
        case "neg":
            return f"(-{a})"
        case "max" | "min":
            return f"ember_{'f' if fl else 'i'}{op}({a}, {b})"
    if fl:
        one = literal(dtype, 1.0)
        match op:
            case "div":
                return f"({a} / {b})"
            case "exp" | "log" | "sqrt" | "tanh" | "erf" | "abs":
                return f"{math_fn(op, dtype)}({a})"
            case "pow":
                return f"{math_fn('pow', dtype)}({a}, {b})"
            case "rsqrt":
                return f"({one} / {math_fn('sqrt', dtype)}({a}))"
            case "sigmoid":
                return f"({one} / ({one} + {math_fn('exp', dtype)}(-{a})))"
            case "relu":
                return f"ember_fmax({a}, {literal(dtype, 0.0)})"
    else:
        match op:
            case "div":  # numpy: true division in f64, then astype back
                return cast(f"((double){a} / (double){b})", "f64", dtype)
            case "abs":
                return f"({a} < 0 ? -{a} : {a})"
            case "relu":
                return f"ember_imax({a}, ({ctype(dtype)})0)"
            case "pow":
                return f"ember_ipow<{ctype(dtype)}>({a}, {b})"
    _unsupported(name, dtype)


def dropout(x: str, step: str, coords: list[str], attrs: dict, dtype: str, rows: int) -> str:
    """One element of `ember.dropout` (`kernel.dropout`) at `coords` of a result whose first
    dimension is `rows`: kept with probability 1 - p by the counter hash of (seed, key, step,
    the coordinates, the first offset by shard * rows), then scaled by 1 / (1 - p) rounded to
    the dtype, as `backends/interpreter/rng.py`. keep = (h >> 8) >= ceil(p * 2**24),
    exactly."""
    p = float(attrs["p"])
    if p == 0:
        return x
    keep = math.ceil(p * 2**24)
    seed, key = (int(attrs[k]) & 0xFFFFFFFF for k in ("seed", "key"))
    index = "0u"
    for k, c in enumerate(coords):
        c = f"({c}) + ((long long)({step}) >> 32) * {rows}LL" if k == 0 else c
        index = f"ember_mix32({index} ^ (unsigned int)({c}))"
    h = f"ember_dropout_hash({seed}u, {key}u, (unsigned int){step}, {index})"
    return f"(({h} >> 8) >= {keep}u ? {x} / {literal(dtype, 1.0 - p)} : {literal(dtype, 0)})"


ELEMENTWISE = ops_with("elementwise", "ember")  # from the registry: each lowered by `expr`
