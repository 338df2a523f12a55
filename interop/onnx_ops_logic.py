"""ONNX's logic and arithmetic extras, lowered onto ember's ops: And, Or, Xor (selects on
bools), IsNaN, IsInf, Mod (integers either way; floats as C's fmod), Trilu, CumSum
(exclusive, reverse), TopK (k known at import), Einsum (contractions as transposes,
reshapes, matmuls and sums), and Range and ConstantOfShape, whose inputs must be known at
import (they are then folded: the rule is only met with inputs that are not)."""

from __future__ import annotations

import math

import numpy as np

from ..frontend import functional as F
from ..frontend.selection import cumsum, tril, triu
from ..frontend.tensor import Tensor
from ..ir import numpy_dtype
from .onnx_lower import concat, element_base, pad, slice_axes, take_elements, tensor
from .onnx_read import Node
from .onnx_rules import attr, fail, ints, norm_axis, rule

FLOATS = ("f16", "f32", "f64", "bf16")


# -- bools -------------------------------------------------------------------------------

def _bool(t: Tensor, v: bool) -> Tensor:
    return t.trace.lift(np.bool_(v))


def _and(a: Tensor, b: Tensor) -> Tensor:
    return a.trace.op("ember.select", a, b, _bool(a, False))


def _or(a: Tensor, b: Tensor) -> Tensor:
    return a.trace.op("ember.select", a, _bool(a, True), b)


def _bools(node: Node, *xs) -> list[Tensor]:
    out = [tensor(x) for x in xs]
    if any(x.dtype != "i1" for x in out):
        raise fail(node, f"its inputs must be bool, got {', '.join(x.dtype for x in out)}")
    return out


@rule("And")
def _and_rule(node, a, b):
    return _and(*_bools(node, a, b))


@rule("Or")
def _or_rule(node, a, b):
    return _or(*_bools(node, a, b))


@rule("Xor")
def _xor_rule(node, a, b):
    a, b = _bools(node, a, b)
    return a != b


@rule("IsNaN")
def _isnan(node, x):
    x = tensor(x)
    return x != x


@rule("IsInf", attrs="detect_negative detect_positive")
def _isinf(node, x):
    x = tensor(x)
    neg, pos = attr(node, "detect_negative", 1), attr(node, "detect_positive", 1)
    if x.dtype not in FLOATS or not (neg or pos):
        return np.zeros(x.shape, bool)
    inf = x.trace.lift(math.inf, x.dtype)
    if neg and pos:
        return x.abs() == inf
    return x == inf if pos else x == -inf


# -- arithmetic -----------------------------------------------------------------------------

@rule("Mod", attrs="fmod", check=lambda n: [] if attr(n, "fmod", 0) in (0, 1)
      else [f"fmod={attr(n, 'fmod')} (0 or 1)"])
def _mod(node, a, b):
    """fmod=0: the remainder with the divisor's sign (Python's %), integers only, as ONNX
    has it; fmod=1: with the dividend's sign (C's fmod). Integers: a - q b with q the
    floor or truncated quotient (exact below 2**53). Floats: a - trunc(a / b) b in f64,
    exact for f32 and f16 operands whose quotient is below 2**28 or so; fmod(x, inf) is x,
    fmod(inf, y) NaN. Gradients: 1 for a, -trunc(a / b) for b (torch.fmod's)."""
    a = tensor(a)
    b = a.trace.lift(b) if isinstance(b, Tensor) else a.trace.lift(np.asarray(b, numpy_dtype(
        a.dtype)))
    fmod = attr(node, "fmod", 0)
    if a.dtype in FLOATS or b.dtype in FLOATS:
        if not fmod:
            raise fail(node, "fmod=0 on floats: ONNX defines Mod of floats only with fmod=1")
        a64, b64 = a.astype("f64"), b.astype("f64")
        r = a64 - F.div(a64, b64, "trunc") * b64
        inf = a.trace.lift(math.inf, "f64")
        nan = a.trace.lift(math.nan, "f64")
        r = F.where(b64.abs() == inf, F.where(a64.abs() == inf, nan, a64), r)
        return r.astype(a.dtype)
    if a.dtype == "i1":
        raise fail(node, "Mod of bools")
    return a - F.div(a, b, "trunc" if fmod else "floor") * b


@rule("Trilu", attrs="upper", static=(1,))
def _trilu(node, x, k=None):
    x = tensor(x)
    if x.ndim < 2:
        raise fail(node, f"its input {list(x.shape)} has fewer than 2 dims")
    k = 0 if k is None or np.size(k) == 0 else ints(k)[0]
    return triu(x, k) if attr(node, "upper", 1) else tril(x, k)


@rule("CumSum", attrs="exclusive reverse", static=(1,))
def _cumsum(node, x, axis):
    x = tensor(x)
    if x.dtype == "i1":
        raise fail(node, "CumSum of bools")
    if x.ndim == 0:
        raise fail(node, "CumSum of a scalar")
    a = norm_axis(node, ints(axis)[0], x.ndim)
    n = x.shape[a]
    if not n:
        return x
    flip = {a: slice(None, None, -1)}
    if attr(node, "reverse", 0):
        x = slice_axes(x, flip)
    if attr(node, "exclusive", 0):
        if n == 1:
            return np.zeros(x.shape, numpy_dtype(x.dtype))
        x = pad(x, [(1, -1) if d == a else (0, 0) for d in range(x.ndim)])
    y = cumsum(x, a)
    return slice_axes(y, flip) if attr(node, "reverse", 0) else y


# -- TopK ----------------------------------------------------------------------------------

TOPK_RANK_LIMIT = 1 << 24  # elements of the all-pairs comparison the ranking builds
TOPK_STEPS = 64  # past the limit, at most this k (one max and one mask a step)


def _rank(x: Tensor, largest: bool) -> Tensor:
    """Each element's place along the last dim in the order TopK returns (larger first,
    or smaller first; equal ones by index; NaN after every number): a strict total order,
    so the places are 0..n-1, each once. An all-pairs comparison, (..., n, n)."""
    n = x.shape[-1]
    xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)  # element i down dim -2, j along dim -1
    better = xj > xi if largest else xj < xi
    same = xj == xi
    if x.dtype in FLOATS:
        ni, nj = xi != xi, xj != xj
        better = _or(better, _and(nj if largest else ni, (ni if largest else nj) == _bool(x,
                                                                                         False)))
        same = _or(same, _and(ni, nj))
    earlier = tensor(np.arange(n)[None, :] < np.arange(n)[:, None])  # j < i
    before = _or(better, _and(same, earlier))
    return before.astype("i64").sum(-1)


def _topk_by_rank(x: Tensor, k: int, largest: bool) -> Tensor:
    rank = _rank(x, largest)
    n = x.shape[-1]
    hit = rank.unsqueeze(-1) == tensor(np.arange(k, dtype=np.int64))  # (..., n, k)
    iota = tensor(np.arange(n, dtype=np.int64)[:, None])
    return F.where(hit, iota, tensor(np.int64(0))).sum(-2)


def _topk_by_steps(x: Tensor, k: int, largest: bool) -> Tensor:
    """k steps of: the best of the elements not yet taken, and the first index of it."""
    t, n = x.trace, x.shape[-1]
    if x.dtype in FLOATS:
        fill = t.lift(-math.inf, x.dtype)
        key = x if largest else F.where(x != x, fill, -x)  # smallest: NaN last
    else:
        fill = t.lift(int(np.iinfo(numpy_dtype(x.dtype)).min), x.dtype)
        key = x if largest else -x
    iota = tensor(np.arange(n, dtype=np.int64))
    alive = tensor(np.ones(x.shape, bool))
    taken = []
    for _ in range(k):
        cand = F.where(alive, key, fill)
        m = cand.amax(-1, keepdim=True)
        same = cand == m
        if x.dtype in FLOATS:
            same = _or(same, _and(cand != cand, m != m))
        hit = _and(alive, same)
        i = -F.where(hit, -iota, tensor(np.int64(-n))).amax(-1, keepdim=True)
        alive = _and(alive, iota != i)
        taken.append(i)
    return concat(taken, x.ndim - 1)


@rule("TopK", attrs="axis largest sorted", static=(1,))
def _topk(node, x, k):
    """The k largest (smallest) along the axis, always sorted (larger first; equal values
    by index, as onnxruntime), with their int64 indices; the values are a gather of x, so
    gradients flow to them. k <= 64 past TOPK_RANK_LIMIT elements of ranking."""
    x = tensor(x)
    if x.dtype == "i1":
        raise fail(node, "TopK of bools")
    if x.ndim == 0:
        raise fail(node, "TopK of a scalar")
    axis = norm_axis(node, attr(node, "axis", -1), x.ndim)
    k, n = ints(k)[0], x.shape[axis]
    if not 1 <= k <= n:
        raise fail(node, f"k={k} for an axis of {n} (ember takes 1 <= k <= n)")
    perm = [d for d in range(x.ndim) if d != axis] + [axis]
    xt = x.transpose(perm) if axis != x.ndim - 1 else x
    largest = bool(attr(node, "largest", 1))
    if xt.value.type.size * n <= TOPK_RANK_LIMIT:
        idx = _topk_by_rank(xt, k, largest)
    elif k <= TOPK_STEPS:
        idx = _topk_by_steps(xt, k, largest)
    else:
        raise fail(node, f"k={k} of {n} along an axis of a {list(x.shape)} input: too large "
                         f"to rank all pairs ({TOPK_RANK_LIMIT:,} at most), and k > "
                         f"{TOPK_STEPS}")
    base, _ = element_base(xt.shape, idx.shape, xt.ndim - 1)
    values = take_elements(xt, idx + base)
    if axis == x.ndim - 1:
        return values, idx
    back = np.argsort(perm).tolist()
    return values.transpose(back), idx.transpose(back)


# -- Einsum ------------------------------------------------------------------------------

def _einsum_labels(node: Node, eq: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Each operand's labels, one a dim, and the output's; '...' becomes labels of its own
    (right-aligned across operands, as numpy's broadcasting)."""
    eq = eq.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise fail(node, f"equation {eq!r} has {len(terms)} operands, the node {len(ranks)}")
    spans = []
    for term, r in zip(terms, ranks):
        letters = term.replace("...", "")
        if not all(c.isascii() and c.isalpha() for c in letters) or term.count("...") > 1:
            raise fail(node, f"equation {eq!r}: {term!r} is not letters and one '...'")
        e = r - len(letters)
        if e < 0 or (e and "..." not in term):
            raise fail(node, f"equation {eq!r}: {term!r} does not fit an operand of rank {r}")
        spans.append(e)
    most = max(spans, default=0)
    ell = [chr(0x100 + i) for i in range(most)]

    def expand(term: str, e: int) -> list[str]:
        head, _, tail = term.partition("...")
        return list(head) + ell[most - e:] + list(tail) if "..." in term else list(term)

    labels = [expand(t, e) for t, e in zip(terms, spans)]
    if arrow:
        if not all(c.isascii() and c.isalpha() for c in out.replace("...", "")):
            raise fail(node, f"equation {eq!r}: the output {out!r} is not letters and '...'")
        output = expand(out, most) if "..." in out else list(out)
        if most and "..." not in out:
            raise fail(node, f"equation {eq!r}: '...' dims summed away are not supported")
    else:
        counts = {}
        for ls in labels:
            for c in ls:
                counts[c] = counts.get(c, 0) + 1
        output = ell + sorted(c for c, m in counts.items() if m == 1 and c not in ell)
    every = {c for ls in labels for c in ls}
    if len(set(output)) != len(output) or not set(output) <= every:
        raise fail(node, f"equation {eq!r}: output labels must be distinct input labels")
    for ls in labels:
        if len(set(ls)) != len(ls):
            raise fail(node, f"equation {eq!r}: a label repeated in one operand (a diagonal) "
                             "is not supported")
    return labels, output


def _sum_out(x: Tensor, ls: list[str], keep: set[str]) -> tuple[Tensor, list[str]]:
    drop = [d for d, c in enumerate(ls) if c not in keep]
    if not drop:
        return x, ls
    return x.sum(drop), [c for c in ls if c in keep]


def _permuted(x: Tensor, ls: list[str], order: list[str]) -> Tensor:
    perm = [ls.index(c) for c in order]
    return x if perm == list(range(x.ndim)) else x.transpose(perm)


def _contract(a: Tensor, la: list[str], b: Tensor, lb: list[str],
              keep: set[str]) -> tuple[Tensor, list[str]]:
    """The product of a and b summed over their shared labels not in `keep`: one matmul of
    (batch, M, K) by (batch, K, N)."""
    a, la = _sum_out(a, la, keep | set(lb))
    b, lb = _sum_out(b, lb, keep | set(la))
    size = dict(zip(la, a.shape)) | dict(zip(lb, b.shape))
    batch = [c for c in la if c in lb and c in keep]
    inner = [c for c in la if c in lb and c not in keep]
    fa = [c for c in la if c not in lb]
    fb = [c for c in lb if c not in la]
    bs = [size[c] for c in batch]
    m, k, n = (math.prod(size[c] for c in g) for g in (fa, inner, fb))
    a2 = _permuted(a, la, batch + fa + inner).reshape(*bs, m, k)
    b2 = _permuted(b, lb, batch + inner + fb).reshape(*bs, k, n)
    y = (a2 @ b2).reshape(*bs, *(size[c] for c in fa), *(size[c] for c in fb))
    return y, batch + fa + fb


@rule("Einsum", attrs="equation")
def _einsum(node, *xs):
    """Contractions of any number of operands, left to right, each a matmul; labels
    that are in one operand only and not in the output are summed first. Not supported
    (an OnnxImportError naming the equation): a label repeated in one operand (diagonals),
    sizes of one label that differ (broadcasting 1 against n), '...' summed away."""
    xs = [tensor(x) for x in xs]
    eq = attr(node, "equation", "")
    if not xs:
        raise fail(node, f"equation {eq!r} with no operands")
    labels, output = _einsum_labels(node, eq, [x.ndim for x in xs])
    size: dict[str, int] = {}
    for x, ls in zip(xs, labels):
        for c, d in zip(ls, x.shape):
            if size.setdefault(c, d) != d:
                name = "'...'" if ord(c) >= 0x100 else repr(c)
                raise fail(node, f"equation {eq!r}: label {name} has sizes {size[c]} and {d} "
                                 "(broadcasting is not supported)")
    acc, la = xs[0], labels[0]
    for i in range(1, len(xs)):
        keep = set(output).union(*map(set, labels[i + 1:]))
        acc, la = _contract(acc, la, xs[i], labels[i], keep)
    acc, la = _sum_out(acc, la, set(output))
    return _permuted(acc, la, output)


# -- always folded ----------------------------------------------------------------------

@rule("Range", static=(0, 1, 2))
def _range(node, start, limit, delta):
    """Its inputs must be known at import (its length is its value); then it is folded."""
    s = np.asarray(start)
    return np.arange(s.item(), np.asarray(limit).item(), np.asarray(delta).item(),
                     dtype=s.dtype)


@rule("ConstantOfShape", attrs="value", static=(0,))
def _constant_of_shape(node, shape):
    """Its shape must be known at import; then it is folded."""
    from onnx import numpy_helper

    v = attr(node, "value")
    value = np.zeros(1, np.float32) if v is None else numpy_helper.to_array(v)
    return np.full(ints(shape), value.reshape(-1)[0], value.dtype)
