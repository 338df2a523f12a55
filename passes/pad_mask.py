"""`pad-mask`: make a graph whose symbolic dimensions were padded to a bucket compute, at
every real position, exactly what the unpadded graph would (XLA's dynamic padder).

The runtime pads each symbolic input axis (runtime/dynamic.py) and passes each dimension's
real size as a `tensor<i64>` argument; the traced graph says so in two attributes:
`ember.padded_args = [[arg, axis, name], ...]` and `ember.length_args = [[name, arg], ...]`;
a constant built from a padded size (`np.arange(x.shape[1])`) carries `ember.padded =
[[axis, name], ...]` (the pass drops it).
The pass follows "axis a of v is padded dim T" forward through every op: elementwise ops
and broadcasts keep it, transposes permute it, reshapes track it whether T stays an axis of
its own or is merged into a flat one (then position i is padded when
(i // inner) % bucket >= len: a `Pad` keeps name, inner and bucket), gathers carry their
indices' axes, matmuls their non-contracted ones, slices and concats the axes they take
whole (one that cuts or joins a padded axis is refused). Every op that mixes positions
along a padded axis is rewritten so padded positions never reach a real result, with
`ember.select` on a mask from a constant position table compared with the length (never a
multiply: padded garbage may be inf or NaN): sums and maxes fill 0 and -inf, a mean
divides the masked sum by the real count, a contraction zeroes the padded positions of each
padded operand, softmaxes see -inf, cross-entropy takes the mean over real rows. Causal
attention needs nothing (a real query never sees a later, padded key); a non-causal one is
spelled out as matmuls and a softmax with the padded keys masked. Any other op that mixes
along a padded axis raises `PadMaskError`, naming the op and the user's line, and the runtime
compiles that length exactly instead: when unsure, refuse.

It runs on the traced graph, before autodiff, so the backward pass differentiates the
masked forward: every select gives a padded position a cotangent of exactly 0. Back through
an op whose padded positions hold inf or NaN (the runtime pads inputs with zeros; a model
takes `log` of them, or normalizes a zero row) that 0 becomes NaN, which a backward sum
into a weight would spread to every real position: with `grads` (the runtime's choice for
a graph it will differentiate) the ops whose backward sums padded positions into an
operand that lacks them see zeros there and zero their padded results too. It
records which result axes carry which dimension, for the runtime to cut them back:
`ember.padded_results = [[result, axis, name, inner, bucket], ...]`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from ..ir import Builder, Graph, Operation, Value, has_trait, numpy_dtype
from ..ir.opdef import normalize_axes
from .decompose import const
from .manager import Pass, PipelineError, register_pass
from .narrow import tensor_type


class PadMaskError(PipelineError):
    """An op mixes positions along a padded axis in a way the pass cannot mask."""


class Pad(NamedTuple):
    """Position i of an axis is padded when (i // inner) % bucket >= the length of `name`."""

    name: str
    inner: int
    bucket: int


Pads = dict[int, Pad]  # axis -> Pad, for one value
Ins = list[Pads | None]  # the pads of each operand of an op, None where it has none
Outs = list[Pads | None]  # the pads of each result, as a rule gives them


def first_pads(ins: Ins) -> Pads:
    """The pads of a one-operand op's operand: a rule runs only on an op with a padded
    operand, here the only one."""
    pads = ins[0]
    assert pads is not None
    return pads


def refuse(op: Operation, why: str) -> PadMaskError:
    where = f" at {op.loc.file}:{op.loc.line}" if op.loc is not None else ""
    return PadMaskError(f"pad-mask: cannot mask {op.name}{where}: {why}")


class Masker:
    """The pads known so far, the length arguments and the masks built from them."""

    def __init__(self, graph: Graph):
        a = graph.attributes
        self.lengths = {name: graph.args[int(i)] for name, i in a["ember.length_args"]}
        self.pads: dict[Value, Pads] = {}
        marked = [(graph.args[int(arg)], axis, name)
                  for arg, axis, name in a.get("ember.padded_args", ())]
        for op in graph.ops:  # constants whose axes follow a size (an arange of it)
            marked += [(op.result, axis, name)
                       for axis, name in op.attributes.pop("ember.padded", ())]
        for v, axis, name in marked:
            self.pads.setdefault(v, {})[int(axis)] = Pad(name, 1, tensor_type(v).shape[int(axis)])
        self._masks: dict[tuple[Pad, int, int, int], Value] = {}
        # selects `zeroed` made: their axes and fill
        self._filled: dict[Value, tuple[tuple[tuple[int, Pad], ...], float]] = {}

    def mask(self, b: Builder, v: Value, axes: Pads) -> Value:
        """i1, true at the real positions of `v` along `axes`, shaped to broadcast with it."""
        out: Value | None = None
        for axis, pad in sorted(axes.items()):
            rank, extent = tensor_type(v).rank, tensor_type(v).shape[axis]
            key = (pad, rank, axis, extent)
            if key not in self._masks:
                shape = [1] * rank
                shape[axis] = extent
                pos = (np.arange(extent, dtype=np.int64) // pad.inner % pad.bucket).reshape(shape)
                self._masks[key] = b.op("ember.cmp", b.op("ember.constant", value=pos),
                                        self.lengths[pad.name], predicate="lt")
            m = self._masks[key]
            out = m if out is None else b.op("ember.select", out, m,
                                              b.op("ember.constant", value=np.array(False)))
        assert out is not None  # every caller masks at least one axis
        return out

    def zeroed(self, b: Builder, v: Value, axes: Pads, fill: float = 0.0) -> Value:
        """`v` with `fill` at its padded positions along `axes` (`v` itself when it is such
        a select already)."""
        dtype = v.type.dtype
        if fill == -math.inf and not v.type.is_float:
            fill = np.iinfo(numpy_dtype(dtype)).min
        key = (tuple(sorted(axes.items())), fill)
        if self._filled.get(v) == key:
            return v
        out = b.op("ember.select", self.mask(b, v, axes), v, const(b, fill, dtype))
        self._filled[out] = key
        return out

    def count(self, b: Builder, v: Value, axes: list[int], dtype: str) -> Value:
        """How many real elements of `v` the reduction over `axes` sees, as `dtype`."""
        pads = self.pads.get(v, {})
        shape = tensor_type(v).shape
        static = math.prod(shape[a] // (pads[a].bucket if a in pads else 1) for a in axes)
        n = None if static == 1 else b.op("ember.constant", value=np.array(static, np.int64))
        for a in axes:
            if a in pads:
                length = self.lengths[pads[a].name]
                n = length if n is None else b.op("ember.mul", n, length)
        assert n is not None  # reduce counts only when a reduced axis is padded
        return b.op("ember.cast", n, dtype=dtype)


def merge(op: Operation, into: Pads, axis: int, pad: Pad) -> None:
    if into.get(axis, pad) != pad:
        raise refuse(op, f"axis {axis} carries both {into[axis].name} and {pad.name}")
    into[axis] = pad


def elementwise(m: Masker, op: Operation, ins: Ins) -> Outs:
    """Operands broadcast right-aligned to the result; a padded axis never broadcasts."""
    shape = tensor_type(op.results[0]).shape
    out: Pads = {}
    for v, pads in zip(op.operands, ins):
        off = len(shape) - tensor_type(v).rank
        for axis, pad in (pads or {}).items():
            if tensor_type(v).shape[axis] != shape[axis + off]:
                raise refuse(op, f"padded axis {axis} is broadcast")
            merge(op, out, axis + off, pad)
    return [out] * len(op.results)


def first_operand(m: Masker, op: Operation, ins: Ins) -> Outs:
    """Ops whose result is their first operand's shape, position by position."""
    if any(ins[1:]):
        raise refuse(op, "a padded operand after the first")
    return [ins[0]]


def reshape(m: Masker, op: Operation, ins: Ins) -> Outs:
    """A padded run of flat positions [F, F * bucket) must fall within one result axis."""
    src, dst = tensor_type(op.operands[0]).shape, tensor_type(op.results[0]).shape
    out: Pads = {}
    for axis, pad in first_pads(ins).items():
        flat = math.prod(src[axis + 1:]) * pad.inner
        for c in range(len(dst)):
            stride = math.prod(dst[c + 1:])
            if stride <= flat < stride * dst[c]:
                break
        else:
            raise refuse(op, f"{pad.name} has no place in the result")
        if flat % stride or (stride * dst[c]) % (flat * pad.bucket):
            raise refuse(op, f"{pad.name} is split across result axes")
        merge(op, out, c, Pad(pad.name, flat // stride, pad.bucket))
    return [out]


def transpose(m: Masker, op: Operation, ins: Ins) -> Outs:
    perm = op.attributes["perm"]
    pads = first_pads(ins)
    return [{j: pads[p] for j, p in enumerate(perm) if p in pads}]


def contract(m: Masker, op: Operation, ins: Ins,
             place: Callable[[int, int], int | None]) -> Outs:
    """Zero the padded positions of each operand padded on its contracted axis; the other
    axes keep their pads where `place(operand, axis)` puts them (None: contracted)."""
    b = Builder.before_op(op)
    out: Pads = {}
    for i, (v, pads) in enumerate(zip(op.operands, ins)):
        contracted = {a: p for a, p in (pads or {}).items() if place(i, a) is None}
        if contracted:
            op.set_operand(i, m.zeroed(b, v, contracted))
        for axis, pad in (pads or {}).items():
            to = place(i, axis)  # None exactly for the contracted axes
            if to is not None:
                merge(op, out, to, pad)
    return [out]


def matmul(m: Masker, op: Operation, ins: Ins) -> Outs:
    """[..., M, K] @ [..., K, N]: M, N and the (right-aligned) batch axes carry pads."""
    rank = tensor_type(op.results[0]).rank
    ranks = [tensor_type(v).rank for v in op.operands]

    def place(i: int, axis: int) -> int | None:
        last = ranks[i] - 1
        if axis == (last if i == 0 else last - 1):
            return None
        if axis >= last - 1:
            return rank - (2 if i == 0 else 1)
        return axis + rank - ranks[i]

    return contract(m, op, ins, place)


def linear(m: Masker, op: Operation, ins: Ins) -> Outs:
    if any(ins[1:]):
        raise refuse(op, "a padded weight or bias")
    last = tensor_type(op.operands[0]).rank - 1
    return contract(m, op, ins, lambda i, axis: None if axis == last else axis)


def reduce(m: Masker, op: Operation, ins: Ins) -> Outs:
    x = op.operands[0]
    axes = normalize_axes(op.name, op.attributes["axes"], tensor_type(x).rank)
    pads = first_pads(ins)
    reduced = {a: pads[a] for a in axes if a in pads}
    keep = op.attributes["keepdims"]
    out = {(a if keep else a - sum(r < a for r in axes)): p
           for a, p in pads.items() if a not in axes}
    if reduced:
        b = Builder.before_op(op)
        fill = -math.inf if op.name == "ember.reduce_max" else 0.0
        op.set_operand(0, m.zeroed(b, x, reduced, fill))
        if op.name == "ember.reduce_mean":
            attrs = dict(op.attributes)
            total = b.op("ember.reduce_sum", op.operands[0], **attrs)
            mean = b.op("ember.div", total, m.count(b, x, axes, x.type.dtype))
            op.results[0].replace_all_uses_with(mean)
            m.pads[mean] = out
            op.erase()
    return [out]


def softmax(m: Masker, op: Operation, ins: Ins) -> Outs:
    x, pads = op.operands[0], first_pads(ins)
    axis = op.attributes["axis"] % tensor_type(x).rank
    if axis in pads:
        op.set_operand(0, m.zeroed(Builder.before_op(op), x, {axis: pads[axis]}, -math.inf))
    return [pads]


def cross_entropy(m: Masker, op: Operation, ins: Ins) -> Outs:
    """The mean over real rows (those also not `ignore_index`) of each row's loss."""
    logits, labels = op.operands
    pads: Pads = dict(ins[0] or {})
    for axis, pad in (ins[1] or {}).items():
        merge(op, pads, axis, pad)
    if 1 in pads:
        raise refuse(op, "the class axis is padded")
    b = Builder.before_op(op)
    dtype = logits.type.dtype
    onehot = b.op("ember.one_hot", labels, num_classes=tensor_type(logits).shape[1], dtype=dtype)
    picked = b.op("ember.mul", b.op("nn.log_softmax", logits, axis=1), onehot)
    rows = b.op("ember.reduce_sum", picked, axes=[1], keepdims=False)
    real = m.mask(b, rows, {0: pads[0]})
    ignore = op.attributes.get("ignore_index")
    if ignore is not None:
        label = b.op("ember.constant", value=np.array(ignore, numpy_dtype(labels.type.dtype)))
        real = b.op("ember.select", real, b.op("ember.cmp", labels, label, predicate="ne"),
                    b.op("ember.constant", value=np.array(False)))
    total = b.op("ember.reduce_sum", b.op("ember.select", real, rows, const(b, 0.0, dtype)),
                 axes=[0], keepdims=False)
    count = b.op("ember.reduce_sum", b.op("ember.cast", real, dtype=dtype), axes=[0],
                 keepdims=False)
    loss = b.op("ember.neg", b.op("ember.div", total, count))
    op.results[0].replace_all_uses_with(loss)
    op.erase()
    return [{}]


def layer_norm(m: Masker, op: Operation, ins: Ins) -> Outs:
    x = op.operands[0]
    axes = normalize_axes(op.name, op.attributes["axes"], tensor_type(x).rank)
    if any(ins[1:]) or any(a in (ins[0] or {}) for a in axes):
        raise refuse(op, "it normalizes over a padded axis")
    return [ins[0]]


def batch_norm(m: Masker, op: Operation, ins: Ins) -> Outs:
    pads = ins[0] or {}
    if any(ins[1:]) or 1 in pads or (pads and op.attributes["training"]):
        raise refuse(op, "batch statistics over a padded axis")
    return [pads, {}, {}]


def attention(m: Masker, op: Operation, ins: Ins) -> Outs:
    """Causal attention whose queries and keys are padded alike needs no mask on the scores
    (a real query attends to earlier keys only, all of them real); a non-causal one is
    spelled out, with -inf at the padded keys' scores before the softmax."""
    q, k, v = op.operands
    rank = tensor_type(q).rank
    pq, pk, pv = (p or {} for p in ins)
    if rank - 1 in pq or rank - 1 in pk:
        raise refuse(op, "the head dimension is padded")
    keys = {p for p in (pk.get(rank - 2), pv.get(rank - 2)) if p is not None}
    if len(keys) > 1:
        raise refuse(op, "keys and values are padded differently")
    b = Builder.before_op(op)
    if rank - 2 in pv:  # a hidden key's weight is 0, which a NaN there would still spoil
        op.set_operand(2, m.zeroed(b, v, {rank - 2: pv[rank - 2]}))
    out: Pads = {}
    for pads in (pq, pk, pv):
        for axis, pad in pads.items():
            if axis < rank - 2:
                merge(op, out, axis, pad)
    if rank - 2 in pq:
        out[rank - 2] = pq[rank - 2]
    if rank - 1 in pv:
        out[rank - 1] = pv[rank - 1]
    query = pq.get(rank - 2)
    if not keys or (op.attributes["causal"] and keys == {query}
                    and query is not None and query.inner == 1
                    and tensor_type(q).shape[-2] == tensor_type(k).shape[-2]):
        return [out]
    if op.attributes["causal"]:
        raise refuse(op, "causal attention whose keys are padded unlike its queries")
    kt = b.op("ember.transpose", k, perm=[*range(rank - 2), rank - 1, rank - 2])
    scores = b.op("ember.mul", b.op("ember.matmul", q, kt),
                  const(b, op.attributes["scale"], q.type.dtype))
    scores = m.zeroed(b, scores, {rank - 1: keys.pop()}, -math.inf)
    y = b.op("ember.matmul", b.op("nn.softmax", scores, axis=rank - 1), op.operands[2])
    op.results[0].replace_all_uses_with(y)
    op.erase()
    m.pads[y] = out
    return [out]


def gather(m: Masker, op: Operation, ins: Ins) -> Outs:
    table, idx = op.operands
    if idx.op is not None and idx.op.name == "ember.constant" \
            and idx.op.attributes["value"].max(initial=0) >= tensor_type(table).shape[0]:
        raise refuse(op, f"its constant indices (from padded sizes, as an arange) reach past "
                         f"the {tensor_type(table).shape[0]} rows of the table")
    pads = dict(ins[1] or {})
    if pads:  # padded indices read row 0: what a model makes of padding (idx - 1) may not
        op.set_operand(1, m.zeroed(Builder.before_op(op), idx, pads))  # be a row at all
    for axis, pad in (ins[0] or {}).items():
        if axis == 0:
            raise refuse(op, "the gathered table's rows are padded")
        merge(op, pads, tensor_type(idx).rank + axis - 1, pad)
    return [pads]


def one_hot(m: Masker, op: Operation, ins: Ins) -> Outs:
    return [dict(first_pads(ins))]


def along_dynamic(op: Operation, doing: str, axis: int, pad: Pad) -> PadMaskError:
    """Why `op` is refused when it `doing` along the padded `axis` of dim `pad.name`."""
    return refuse(op, f"{doing} along the dynamic dim {pad.name} (axis {axis}) is not "
                      f"supported: its bounds were traced on the padded bucket, not on the "
                      f"real length (x[:, -1] would read padding); take {pad.name} whole, or "
                      f"mask positions with em.where instead of cutting them")


def window(m: Masker, op: Operation, ins: Ins) -> Outs:
    """slice and unslice keep the rank: a pad stays on its axis when the window takes that
    axis whole. A window that cuts a padded axis is refused: its bounds were traced on the
    bucket, and `x[:, :4]` cannot be told from `x[:, :x.shape[1] - 4]`, whose real part
    follows the length."""
    a = op.attributes
    n_in, n_out = tensor_type(op.operands[0]).shape, tensor_type(op.results[0]).shape
    for axis, pad in first_pads(ins).items():
        if a["start"][axis] != 0 or n_in[axis] != n_out[axis] or (
                a["step"][axis] != 1 and n_in[axis] > 1):
            doing = "slicing" if op.name == "ember.slice" else "padding (unslice)"
            raise along_dynamic(op, doing, axis, pad)
    return [dict(first_pads(ins))]


def concat(m: Masker, op: Operation, ins: Ins) -> Outs:
    """Every axis but the joined one is shared by all operands: their pads merge, as an
    elementwise op's. Joining along a padded axis would put padding between real parts."""
    axis = op.attributes["axis"] % tensor_type(op.results[0]).rank
    out: Pads = {}
    for pads in ins:
        for a, pad in (pads or {}).items():
            if a == axis:
                raise along_dynamic(op, "concatenating", a, pad)
            merge(op, out, a, pad)
    return [out]


Rule = Callable[[Masker, Operation, Ins], Outs]

RULES: dict[str, Rule] = {"ember.broadcast": elementwise, "ember.reshape": reshape,
         "ember.transpose": transpose, "ember.matmul": matmul, "nn.linear": linear,
         "ember.reduce_sum": reduce, "ember.reduce_mean": reduce, "ember.reduce_max": reduce,
         "nn.softmax": softmax, "nn.log_softmax": softmax, "nn.cross_entropy": cross_entropy,
         "nn.layer_norm": layer_norm, "nn.batch_norm": batch_norm, "nn.attention": attention,
         "ember.gather": gather, "ember.one_hot": one_hot, "ember.dropout": first_operand,
         "ember.slice": window, "ember.unslice": window, "ember.concat": concat,
         "ember.allreduce": first_operand}


def sums_into_unpadded(op: Operation, ins: Ins, outs: Outs) -> bool:
    """Whether the backward of `op` sums its padded positions into an operand that lacks
    them: a weight or bias broadcast along a padded axis (its gradient sums over it), a
    matmul's or linear's weight, a gathered table, a norm's affine."""
    return any(outs) and any(
        not pads and v.type.is_float and v.op is not None and v.op.name != "ember.constant"
        for v, pads in zip(op.operands, ins))


def guard_gradients(m: Masker, op: Operation, ins: Ins, outs: Outs, after: Builder) -> None:
    """Zero the padded positions of `op`'s padded operands and of its padded results (the
    uses read the zeroed copy), so that its backward sums only zeros over them: a
    select's gradient is a select (a NaN or inf a padded position holds, from `log(0)` or
    normalizing a zero row, never reaches a weight as 0 * inf)."""
    before = Builder.before_op(op)
    for i, (v, pads) in enumerate(zip(op.operands, ins)):
        if pads and v.type.is_float:
            op.set_operand(i, m.zeroed(before, v, pads))
    for r, pads in zip(op.results, outs):
        if pads and r.type.is_float:
            uses = list(r.uses)
            zeroed = m.zeroed(after, r, pads)
            for user, i in uses:
                user.set_operand(i, zeroed)
            m.pads[zeroed] = pads


@register_pass
@dataclass(frozen=True)
class PadMask(Pass):
    """Mask the padding of symbolic dimensions out of every op that mixes positions; with
    `grads`, also out of the backward the graph will get (`guard_gradients`)."""

    name: ClassVar[str] = "pad-mask"
    grads: bool = False

    def check(self, graph: Graph) -> None:
        if "ember.length_args" not in graph.attributes:
            raise PipelineError("pad-mask needs the graph attribute ember.length_args "
                                "(the runtime sets it on a graph with symbolic dimensions)")
        if "ember.grads" in graph.attributes:
            raise PipelineError("pad-mask runs on the traced graph, before autodiff")

    def apply(self, graph: Graph) -> Graph:
        m = Masker(graph)
        ops = list(graph.body.ops)
        for op, successor in zip(ops, ops[1:]):  # the return op ends the block
            ins: Ins = [m.pads.get(v) for v in op.operands]
            if op.name == "ember.gather":
                ins = [ins[0] or {}, ins[1] or {}]  # constant indices are checked too
            elif not any(ins):
                continue
            rule = RULES.get(op.name) or (elementwise if has_trait(op.name, "elementwise")
                                          else None)
            if rule is None:
                raise refuse(op, "an op the pass does not know, on a padded operand")
            results = list(op.results)
            outs = rule(m, op, ins)
            for r, pads in zip(results, outs):
                if pads:
                    m.pads[r] = pads
            if self.grads and op.parent is not None and sums_into_unpadded(op, ins, outs):
                guard_gradients(m, op, ins, outs, Builder.before_op(successor))
        graph.attributes["ember.padded_results"] = [
            [i, axis, *pad] for i, v in enumerate(graph.return_op.operands)
            for axis, pad in sorted(m.pads.get(v, {}).items())]
        return graph
