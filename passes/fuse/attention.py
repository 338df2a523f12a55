"""Fused attention: a decomposed softmax(q k^T * scale [+ causal mask]) and what reads its
probabilities p (p v in the forward; the attention rule's backward: do v^T, rowsum(dp p),
ds = p (dp - dot) scale, ds k, ds^T q, p^T do) become `kernel.attention` and
`kernel.attention_grad` (ir/dialects/kernel_attention.py), so the [..., Tq, Tk] scores
and probabilities are never stored; the backward keeps only lse, one value per row.

The match is on values, not on how they were written: q, k, v and do are compared as
strided views of their buffers (analysis.strided), so a hand-written
softmax(q @ k.T * s) @ v fuses as nn.attention does, and a copy of p that the recompute
pass recomputes for the backward meets the forward it copies. It is all or nothing per p:
if any value between the scaled scores and the gradients has a reader outside these forms
(a mask other than causal, a user reading the scores or p), that p is left as it was, and
the unfused kernels compute the same values. Only the scores' matmul may have other
readers (a recomputed graph that keeps it and recomputes p from it): it is erased once
none is left.

A result that the graph only reads transposed (o, dq, dk, dv go back from [B, H, T, D] to
the [B, T, H, D] of the projections, and on through a reshape to [B, T, H*D]) is written
in that layout (`out_maps`, `out_types`), so the transpose, which a matmul reading it
through the reshape could not fold into its maps, is never copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ir import Block, Builder, Operation, Value
from ...ir.dialects.kernel_attention import (
    ATTENTION_OPS,
    AttentionOp,
    logical_shapes,
    result_maps,
)
from ...ir.opdef import OPS
from ..narrow import producer, tensor_type
from .analysis import VIEWS, contiguous, splat_value, strided

View = tuple[Value, tuple[int, ...], tuple[int, ...]]  # buffer, element strides, shape


@dataclass
class Probs:
    """p = softmax(q k^T * scale [masked]) and every op from the scores to it."""

    p: Value
    q: View
    k: View
    causal: bool
    scale: float
    chain: list[Operation]


@dataclass
class Readers:
    """What reads one p: forward p v products, and the backward's pieces."""

    forward: list[tuple[Operation, View]] = field(default_factory=list)
    dv: list[Operation] = field(default_factory=list)  # p^T do
    dq: list[Operation] = field(default_factory=list)  # ds k
    dk: list[Operation] = field(default_factory=list)  # ds^T q
    v: View | None = None
    do: View | None = None
    ops: list[Operation] = field(default_factory=list)  # to erase once replaced


def users(v: Value) -> list[Operation]:
    return [op for op, _ in v.uses]


def only_user(v: Value) -> Operation | None:
    return v.uses[0][0] if len(v.uses) == 1 else None


def is_op(v: Value, name: str) -> bool:
    return v.op is not None and v.op.name == name


def swaps_last(op: Operation) -> bool:
    """A transpose of the last two axes only (`op` may be any reader: one without a result
    too, as a function's return)."""
    if op.name != "ember.transpose":
        return False
    r = tensor_type(op.result).rank
    return r >= 2 and op.attributes.get("perm") == [*range(r - 2), r - 1, r - 2]


def view(v: Value) -> View:
    base, st = strided(v)
    return base, tuple(st), tuple(tensor_type(v).shape)


def transposed(v: Value) -> View:
    """The strided view of v^T, for a value read transposed (k^T, v^T)."""
    base, st = strided(v)
    sh = tensor_type(v).shape
    return base, (*st[:-2], st[-1], st[-2]), (*sh[:-2], sh[-1], sh[-2])


def _other(op: Operation, v: Value) -> Value | None:
    """The operand of binary `op` that is not `v` (None when both are)."""
    a, b = op.operands
    return b if a is v and b is not v else a if b is v and a is not v else None


def _constant(v: Value) -> np.ndarray | None:
    """The value of a constant, or of an elementwise op on constants (a causal mask that
    canonicalize did not fold)."""
    op = v.op
    if op is None:
        return None
    if op.name == "ember.constant":
        return np.asarray(op.attributes["value"])
    ref = getattr(OPS.get(op.name), "ref", None)
    args = [_constant(x) for x in op.operands]
    if ref is None or any(a is None for a in args):
        return None
    return np.asarray(ref(op.attributes, *args))


def _causal_mask(cond: Value, tq: int, tk: int) -> np.ndarray | None:
    """`cond` as a [tq, tk] bool array, when it is a constant that varies only there."""
    m = _constant(cond)
    if m is None or m.ndim > len(tensor_type(cond).shape) or any(d != 1 for d in m.shape[:-2]):
        return None
    try:
        return np.broadcast_to(m.reshape(m.shape[-2:] if m.ndim >= 2 else m.shape), (tq, tk))
    except ValueError:
        return None


def match_probs(div: Operation) -> Probs | None:
    """p = div(e, reduce_sum(e)) with e = exp(s - reduce_max(s)), s the scaled (and
    causally masked) scores q k^T of a matmul; each inner value read only inside."""
    e, z = div.operands
    if not (is_op(z, "ember.reduce_sum") and producer(z).operands[0] is e
            and is_op(e, "ember.exp")):
        return None
    x = producer(e).operands[0]
    last = tensor_type(div.result).rank - 1
    zop, eop = producer(z), producer(e)
    if (not _last_axis(zop, last) or sorted(users(e), key=id) != sorted([zop, div], key=id)
            or only_user(z) is not div or only_user(x) is not eop or not is_op(x, "ember.sub")):
        return None
    xop = producer(x)
    s, m = xop.operands
    if not (is_op(m, "ember.reduce_max") and producer(m).operands[0] is s
            and _last_axis(producer(m), last) and only_user(m) is xop):
        return None
    mop = producer(m)
    if sorted(users(s), key=id) != sorted([mop, xop], key=id):
        return None
    chain = [div, zop, eop, xop, mop]
    causal, scores = False, s
    if is_op(s, "ember.select"):
        sop = producer(s)
        cond, hidden, kept = sop.operands
        if splat_value(hidden) != -np.inf or only_user(kept) is not sop:
            return None
        tq, tk = tensor_type(s).shape[-2:]
        mask = _causal_mask(cond, tq, tk)
        if mask is None or not np.array_equal(mask, np.arange(tk) > np.arange(tq)[:, None]):
            return None
        causal, scores = True, kept
        chain.append(sop)
    scale = 1.0
    if is_op(scores, "ember.mul"):
        scale_op = producer(scores)
        a, b = scale_op.operands
        c, mm = (splat_value(b), a) if splat_value(b) is not None else (splat_value(a), b)
        if c is None:
            return None
        scale = float(c)
        chain.append(scale_op)
        scores = mm
    if not is_op(scores, "ember.matmul") or scores.type.dtype not in ("f32", "f64"):
        return None
    mm_op = producer(scores)
    q, kt = mm_op.operands
    batch = tensor_type(scores).shape[:-2]
    if tensor_type(q).shape[:-2] != batch or tensor_type(kt).shape[:-2] != batch:
        return None  # the matmul broadcasts a batch dim: not one of ours
    chain.append(mm_op)
    return Probs(div.result, view(q), transposed(kt), causal, scale, chain)


def _last_axis(op: Operation, last: int) -> bool:
    axes = [a % (last + 1) for a in op.attributes["axes"]]
    return axes == [last] and op.attributes["keepdims"]


def read_p(pr: Probs) -> Readers | None:
    """Classify every reader of p, or None when one is not a form this fuses."""
    r = Readers()
    p = pr.p
    dot_mul: Operation | None = None
    ds_mul: Operation | None = None
    for user in users(p):
        if user.name == "ember.matmul" and user.operands[0] is p and user.operands[1] is not p:
            r.forward.append((user, view(user.operands[1])))
        elif swaps_last(user) and all(u.name == "ember.matmul" and u.operands[0] is user.result
                                      for u in users(user.result)):
            r.dv += users(user.result)
            r.ops.append(user)
        elif user.name == "ember.mul" and (other := _other(user, p)) is not None:
            reader = only_user(user.result)
            if reader is not None and reader.name == "ember.reduce_sum" and dot_mul is None:
                dot_mul = user
            elif is_op(other, "ember.sub") and ds_mul is None:
                ds_mul = user
            else:
                return None
        else:
            return None
    if (dot_mul is None) != (ds_mul is None):
        return None
    if dot_mul is not None and ds_mul is not None and not _read_ds(pr, r, dot_mul, ds_mul):
        return None
    for mm in r.dv:
        if not _same(r, "do", view(mm.operands[1])):
            return None
    return r


def _read_ds(pr: Probs, r: Readers, dot_mul: Operation, ds_mul: Operation) -> bool:
    """dp = do v^T, dot = rowsum(dp p), ds = p (dp - dot) scale, read by ds k, ds^T q."""
    dp = _other(dot_mul, pr.p)
    dot = only_user(dot_mul.result)
    sub = _other(ds_mul, pr.p)
    # read_p took products with an operand other than p, dot_mul the one a reduce_sum reads
    assert dp is not None and sub is not None and dot is not None
    last = tensor_type(pr.p).rank - 1
    if not (is_op(dp, "ember.matmul") and _last_axis(dot, last)
            and producer(sub).operands == [dp, dot.result]
            and only_user(dot.result) is producer(sub) and only_user(sub) is ds_mul
            and sorted(users(dp), key=id) == sorted([dot_mul, producer(sub)], key=id)):
        return False
    ds, scaled = ds_mul.result, only_user(ds_mul.result)
    c = _other(scaled, ds) if scaled is not None and scaled.name == "ember.mul" else None
    if (scaled is not None and c is not None and (cv := splat_value(c)) is not None
            and float(cv) == pr.scale):
        ds = scaled.result
        r.ops.append(scaled)
    elif pr.scale != 1.0:  # a scale of 1 is folded away
        return False
    do, vt = producer(dp).operands
    if not (_same(r, "do", view(do)) and _same(r, "v", transposed(vt))):
        return False
    for user in users(ds):
        if user.name == "ember.matmul" and user.operands[0] is ds and \
                view(user.operands[1]) == pr.k:
            r.dq.append(user)
        elif swaps_last(user) and all(u.name == "ember.matmul" and u.operands[0] is user.result
                                      and view(u.operands[1]) == pr.q
                                      for u in users(user.result)):
            r.dk += users(user.result)
            r.ops.append(user)
        else:
            return False
    r.ops += [producer(dp), dot_mul, dot, producer(sub), ds_mul]
    return True


def _same(r: Readers, name: str, v: View) -> bool:
    """Record the view `name` reads, or check it is the one recorded."""
    have: View | None = getattr(r, name)
    if have is None:
        setattr(r, name, v)
        return True
    return have == v


class AttentionFuser:
    """Rewrites one block: every p that matches, forward products first, so a backward
    (or a recomputed copy of p) finds the forward kernel whose o and lse it reads."""

    def __init__(self, block: Block):
        self.block = block
        self.order = {op: i for i, op in enumerate(block.ops)}
        self.forward: dict[tuple[View, View, bool, float, View],
                           tuple[Operation, Operation]] = {}  # key -> (kernel, p v)
        self.dead: list[Operation] = []
        self.kernels: list[Operation] = []  # each forward before the backwards that read it

    def run(self) -> None:
        found: list[tuple[Probs, Readers]] = []
        for op in list(self.block.ops):
            pr = match_probs(op) if op.name == "ember.div" else None
            r = read_p(pr) if pr is not None else None
            if pr is not None and r is not None and self.fits(pr, r):
                found.append((pr, r))
        for pr, r in found:
            for mm, v in r.forward:
                kernel = self.attention(pr, v, mm)
                mm.result.replace_all_uses_with(kernel.results[0])
                self.forward[(*self.key(pr), v)] = (kernel, mm)
                self.dead.append(mm)
        for pr, r in found:
            if r.dv or r.dq or r.dk:
                self.backward(pr, r)
            self.dead += pr.chain + r.ops + r.dv + r.dq + r.dk
        self.erase()
        for kernel in self.kernels:
            fold_layouts(kernel)

    @staticmethod
    def key(pr: Probs) -> tuple[View, View, bool, float]:
        return pr.q, pr.k, pr.causal, pr.scale

    @staticmethod
    def fits(pr: Probs, r: Readers) -> bool:
        """The shapes the kernels take: no batch broadcast, one dtype, and the one v (and
        do) a backward reads known."""
        if not (r.forward or r.dv or r.dq or r.dk):
            return False
        vs = {v for _, v in r.forward} | ({r.v} if r.v else set())
        if (r.dv or r.dq or r.dk) and len(vs) != 1:
            return False
        *batch, tq, tk = tensor_type(pr.p).shape
        d = pr.q[2][-1]
        want = [(pr.q, [tq, d]), (pr.k, [tk, d])] + [(v, [tk, v[2][-1]]) for v in vs]
        if r.do is not None:
            want.append((r.do, [tq, next(iter(vs))[2][-1]]))
        return all(list(x[2]) == batch + tail and x[0].type.dtype == pr.p.type.dtype
                   for x, tail in want)

    @staticmethod
    def attrs(pr: Probs, v: View) -> dict[str, Any]:
        *batch, tq, tk = tensor_type(pr.p).shape
        return {"batch": batch, "sizes": [tq, tk, pr.q[2][-1], v[2][-1]],
                "causal": pr.causal, "scale": pr.scale}

    def attention(self, pr: Probs, v: View, before: Operation) -> Operation:
        a = self.attrs(pr, v)
        a["maps"] = [list(pr.q[1]), list(pr.k[1]), list(v[1])]
        kernel = Builder.before_op(before).create(
            "kernel.attention", [pr.q[0], pr.k[0], v[0]], a)
        self.kernels.append(kernel)
        return kernel

    def backward(self, pr: Probs, r: Readers) -> None:
        readers_of_do = [mm for mm in r.dv + r.ops if mm.name == "ember.matmul"]
        at = min(readers_of_do, key=self.order.__getitem__)
        v = r.v or r.forward[0][1]
        fwd = self.forward.get((*self.key(pr), v))
        if fwd is None or self.order[fwd[1]] > self.order[at]:
            kernel = self.attention(pr, v, at)
        else:
            kernel = fwd[0]
        o, lse = kernel.results
        assert r.do is not None  # read_p records do for every dv, dq and dk it takes
        a = self.attrs(pr, v)
        a["maps"] = [list(pr.q[1]), list(pr.k[1]), list(v[1]), _contiguous(o), _contiguous(lse),
                     list(r.do[1])]
        grad = Builder.before_op(at).create(
            "kernel.attention_grad", [pr.q[0], pr.k[0], v[0], o, lse, r.do[0]], a)
        self.kernels.append(grad)
        for mms, g in ((r.dq, grad.results[0]), (r.dk, grad.results[1]),
                       (r.dv, grad.results[2])):
            for mm in mms:
                mm.result.replace_all_uses_with(g)

    def erase(self) -> None:
        """The replaced ops, then the views and constants only they read."""
        todo = sorted(set(self.dead), key=self.order.__getitem__)
        while todo:
            op = todo.pop()
            if op.parent is not self.block or any(r.uses for r in op.results):
                continue
            feeds = [x.op for x in op.operands if x.op is not None]
            op.erase()
            todo += [f for f in feeds if f.name in (*VIEWS, "ember.constant")
                     and f.parent is self.block and not f.result.uses]


def fold_layouts(kernel: Operation) -> None:
    """Store each result of a new kernel in the layout of the transposes that read it, when
    they (all with one perm) and attention ops reading it whole through its map are all
    its readers: the transposes go, and the attention readers' maps follow the result."""
    d = OPS[kernel.name]
    assert issubclass(d, AttentionOp)  # one of ATTENTION_OPS
    names = d.result_names
    shapes, maps = logical_shapes(kernel.attributes), result_maps(kernel.name,
                                                                  kernel.attributes)
    folded = False
    for k, (name, r) in enumerate(zip(names, kernel.results)):
        perm = _read_transposed(r, shapes[name], maps[k])
        if perm is None:
            continue
        flips = [op for op, _ in r.uses if op.name == "ember.transpose"]
        layout = tensor_type(flips[0].result)
        st = contiguous(list(layout.shape))
        maps[k] = [st[perm.index(i)] for i in range(len(perm))]
        for op, i in r.uses:
            if op.name != "ember.transpose":
                op.attributes["maps"][i] = maps[k]
        for t in flips:
            t.result.replace_all_uses_with(r)
            t.erase()
        r.type, folded = layout, True
    if folded:
        kernel.attributes["out_maps"] = maps
        kernel.attributes["out_types"] = [r.type for r in kernel.results]


def _read_transposed(r: Value, shape: list[int], m: list[int]) -> list[int] | None:
    """The one perm r's transposes share, if every other reader is an attention op that
    reads r over its own logical shape through r's map."""
    perms = {tuple(op.attributes["perm"]) for op, _ in r.uses if op.name == "ember.transpose"}
    if len(perms) != 1:
        return None
    for op, i in r.uses:
        if op.name == "ember.transpose":
            continue
        if op.name not in ATTENTION_OPS:
            return None
        d = OPS[op.name]
        assert issubclass(d, AttentionOp)  # one of ATTENTION_OPS
        if op.attributes["maps"][i] != m or logical_shapes(
                op.attributes)[d.operand_names[i]] != shape:
            return None
    return list(perms.pop())


def _contiguous(v: Value) -> list[int]:
    """Element strides of a kernel result, which is stored contiguously."""
    return contiguous(list(tensor_type(v).shape))
