"""`canonicalize`: local simplifications as a pattern table keyed by op name.

Each pattern is `(op, rewriter) -> bool` and only fires when the replacement has exactly
the op's result type, so no simplification changes a shape through broadcasting. Small
all-constant ops are folded with the numpy table of `passes/fold.py` (elementwise
arithmetic, casts, shape ops, reductions). Dead pure ops are erased, as MLIR's
canonicalizer does. The patterns autodiff output needs are here too: transposes of
transposes, a sum of a broadcast, multiplying by ones and adding zeros (also when the
ones or zeros are a broadcast or reshape of a splat constant), and the gradients of
split pieces, zero-padded blocks added up, joined into one concat. A conv of a
symmetrically zero-padded input takes the padding as its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..ir import Graph, Operation, TensorType, Value
from ..ir.dense import splat_element
from ..ir.dialects.ember_windows import sides
from ..ir.precision import rounded
from ..ir.rewriter import Pattern, Rewriter, apply_patterns
from .dce import is_dead
from .fold import FOLDERS, fold
from .manager import Pass, register_pass
from .narrow import producer, tensor_type

FOLD_LIMIT = 1024  # largest result (in elements) that folding materializes
FOLD_INPUT_LIMIT = 1 << 20  # largest operand folding reads (a huge splat stays unread)


def splat(v: Value) -> float | None:
    """The single value of a constant whose elements are all equal, else None; a broadcast
    or reshape of such a constant (how autodiff spells zeros and ones) counts too."""
    op = v.op
    while op is not None and op.name in ("ember.broadcast", "ember.reshape"):
        op = op.operands[0].op
    if op is None or op.name != "ember.constant":
        return None
    first = splat_element(op.attributes["value"])
    return None if first is None else first.item()


def constant(rw: Rewriter, at: Operation, value: object, type: TensorType) -> Value:
    arr = np.ascontiguousarray(rounded(value, type.dtype)).reshape(type.shape)
    return rw.op(at, "ember.constant", value=arr)


def same(op: Operation, v: Value) -> bool:
    return v.type == op.result.type


# --- patterns --------------------------------------------------------------------------

def fold_constants(op: Operation, rw: Rewriter) -> bool:
    if (op.name not in FOLDERS or len(op.results) != 1 or op.regions or not op.operands
            or tensor_type(op.result).size > FOLD_LIMIT
            or any(tensor_type(v).size > FOLD_INPUT_LIMIT for v in op.operands)
            or any(v.op is None or v.op.name != "ember.constant" for v in op.operands)):
        return False
    value = fold(op.name, op.attributes, *[producer(v).attributes["value"] for v in op.operands])
    return rw.replace(op, constant(rw, op, value, tensor_type(op.result)))


def erase_dead(op: Operation, rw: Rewriter) -> bool:
    if op.name == "ember.param" or not is_dead(op):  # unused params are dce's call
        return False
    op.erase()
    rw.changed = True
    return True


def identity_operand(index: int, unit: float) -> Pattern:
    """`x op unit -> x` for the operand at `index` (`x*1`, `x+0`, `x-0`, `x/1`)."""
    def pattern(op: Operation, rw: Rewriter) -> bool:
        x, c = op.operands[index], op.operands[1 - index]
        return splat(c) == unit and same(op, x) and rw.replace(op, x)
    return pattern


def neg_neg(op: Operation, rw: Rewriter) -> bool:
    x = op.operands[0].op
    return x is not None and x.name == "ember.neg" and rw.replace(op, x.operands[0])


def cube(op: Operation, rw: Rewriter) -> bool:
    """`x ** 3 -> x * x * x`: multiplies that vectorize, where a float power is a libm call
    per element (the tanh GELU's cube: in GPT-2's MLP, fused after its GEMM, it took as long
    as the GEMM); within an ulp of the power's rounding."""
    x = op.operands[0]
    return (splat(op.operands[1]) == 3 and same(op, x) and tensor_type(x).is_float
            and rw.replace(op, rw.op(op, "ember.mul", rw.op(op, "ember.mul", x, x), x)))


def transpose(op: Operation, rw: Rewriter) -> bool:
    x, perm = op.operands[0], op.attributes["perm"]
    if perm == sorted(perm):
        return rw.replace(op, x)
    inner = x.op
    if inner is None or inner.name != "ember.transpose":
        return False
    composed = [inner.attributes["perm"][p] for p in perm]
    y = inner.operands[0]
    if composed == sorted(composed):
        return rw.replace(op, y)
    return rw.replace(op, rw.op(op, "ember.transpose", y, perm=composed))


def reshape(op: Operation, rw: Rewriter) -> bool:
    x = op.operands[0]
    if same(op, x):
        return rw.replace(op, x)
    if x.op is not None and x.op.name == "ember.reshape":
        return rw.replace(op, rw.op(op, "ember.reshape", x.op.operands[0],
                                    shape=op.attributes["shape"]))
    return False


def broadcast(op: Operation, rw: Rewriter) -> bool:
    x = op.operands[0]
    if same(op, x):
        return rw.replace(op, x)
    if x.op is None or x.op.name not in ("ember.broadcast", "ember.reshape"):
        return False
    src = x.op.operands[0]
    xs, ss = tensor_type(x).shape, tensor_type(src).shape
    lead = len(xs) - len(ss)  # a reshape that only prepends 1s is a broadcast too
    if x.op.name == "ember.reshape" and not (lead >= 0 and xs[lead:] == ss
                                             and set(xs[:lead]) <= {1}):
        return False
    return rw.replace(op, rw.op(op, "ember.broadcast", src, shape=op.attributes["shape"]))


def reduce_of_broadcast(op: Operation, rw: Rewriter) -> bool:
    """sum/mean over exactly the broadcast axes of broadcast(x) is x * count / x."""
    src = op.operands[0].op
    if src is None or src.name != "ember.broadcast" or op.result.type.dtype == "i1":
        return False
    x, shape = src.operands[0], tensor_type(src.result).shape
    padded = (1,) * (len(shape) - tensor_type(x).rank) + tensor_type(x).shape
    axes = {a % len(shape) for a in op.attributes["axes"]}
    if any(padded[a] != 1 for a in axes) or any(
            padded[a] != shape[a] for a in range(len(shape)) if a not in axes):
        return False
    count = int(np.prod([shape[a] for a in axes]))
    if op.name == "ember.reduce_sum" and float(rounded(count, op.result.type.dtype)) != count:
        return False  # x * count would round the count (bf16 holds 257 as 256)
    if op.name == "ember.reduce_sum" and count != 1:
        x = rw.op(op, "ember.mul", x, constant(rw, op, count, tensor_type(x).with_shape(())))
    if tensor_type(x).shape != tensor_type(op.result).shape:
        x = rw.op(op, "ember.reshape", x, shape=list(tensor_type(op.result).shape))
    return rw.replace(op, x)


def _whole(op: Operation, full: tuple[int, ...]) -> bool:
    """A slice/unslice window that is all of `full`: it moves nothing."""
    a = op.attributes
    return set(a["step"]) <= {1} and not any(a["start"]) and tuple(a["shape"]) == full


def slice_(op: Operation, rw: Rewriter) -> bool:
    """The whole of x is x; a slice of an unslice through the same window is its operand;
    a slice of a concat that reads exactly one of its operands is that operand."""
    x = op.operands[0]
    if _whole(op, tensor_type(x).shape):
        return rw.replace(op, x)
    src = x.op
    if src is None:
        return False
    if src.name == "ember.unslice" and src.attributes == {**op.attributes,
                                                          "shape": list(tensor_type(x).shape)} \
            and same(op, src.operands[0]):
        return rw.replace(op, src.operands[0])
    if src.name == "ember.concat":
        axis = src.attributes["axis"] % tensor_type(x).rank
        at = 0
        for v in src.operands:
            start = [at if i == axis else 0 for i in range(tensor_type(x).rank)]
            if op.attributes["start"] == start and set(op.attributes["step"]) <= {1} \
                    and same(op, v):
                return rw.replace(op, v)
            at += tensor_type(v).shape[axis]
    return False


def unslice(op: Operation, rw: Rewriter) -> bool:
    x = op.operands[0]
    return _whole(op, tensor_type(op.result).shape) and same(op, x) and rw.replace(op, x)


def conv_of_padding(op: Operation, rw: Rewriter) -> bool:
    """A conv of x zero-padded by an unslice (spatial dims only) is the conv of x with that
    much more padding: ONNX's Pad before a Conv (Keras' ZeroPadding2D) then copies nothing.
    ember.conv2d pads as much after as before, so only such a padding folds into it;
    ember.conv2d_nhwc pads each side by its own amount, so any does."""
    pad = op.operands[0].op
    if pad is None or pad.name != "ember.unslice" or set(pad.attributes["step"]) != {1}:
        return False
    x = pad.operands[0]
    inner, full, start = tensor_type(x).shape, tensor_type(pad.result).shape, \
        pad.attributes["start"]
    dims = (1, 2) if op.name == "ember.conv2d_nhwc" else (2, 3)
    if any(inner[d] != full[d] or start[d] for d in range(4) if d not in dims):
        return False
    before = [start[d] for d in dims]
    after = [full[d] - inner[d] - start[d] for d in dims]
    a = op.attributes
    if op.name == "ember.conv2d_nhwc":
        top, left, bottom, right = sides(op.name, a["padding"])
        padding = [top + before[0], left + before[1], bottom + after[0], right + after[1]]
    elif before == after:
        padding = [p + s for p, s in zip(a["padding"], before)]
    else:
        return False
    return rw.replace(op, rw.op(op, op.name, x, op.operands[1], stride=a["stride"],
                                padding=padding, dilation=a["dilation"], groups=a["groups"]))


def _block(v: Value) -> tuple[int, int, int] | None:
    """(axis, start, end) of an unslice that places v's operand as a block along one axis
    (step 1, the whole of every other dim); None otherwise."""
    op = v.op
    if op is None or op.name != "ember.unslice" or set(op.attributes["step"]) != {1}:
        return None
    x, full = tensor_type(op.operands[0]).shape, tensor_type(op.result).shape
    start = op.attributes["start"]
    cut = [i for i in range(len(full)) if x[i] != full[i] or start[i]]
    if len(cut) != 1:
        return None
    (axis,) = cut
    return axis, start[axis], start[axis] + x[axis]


def add_of_unslices(op: Operation, rw: Rewriter) -> bool:
    """unslice(a) + unslice(b) placing adjacent blocks along one axis is the unslice of
    concat(a, b): how the gradients of a split's pieces (q, k, v of a fused projection)
    meet, written once instead of as full-size zero-padded terms added up."""
    a, b = op.operands
    ba, bb = _block(a), _block(b)
    if ba is None or bb is None or ba[0] != bb[0] or not same(op, a) or not same(op, b):
        return False
    if ba[1] > bb[1]:
        (a, ba), (b, bb) = (b, bb), (a, ba)
    if ba[2] != bb[1]:
        return False
    axis = ba[0]
    joined = rw.op(op, "ember.concat", producer(a).operands[0], producer(b).operands[0],
                   axis=axis)
    start = [ba[1] if i == axis else 0 for i in range(tensor_type(op.result).rank)]
    return rw.replace(op, rw.op(op, "ember.unslice", joined, start=start,
                                step=[1] * len(start), shape=list(tensor_type(op.result).shape)))


def concat(op: Operation, rw: Rewriter) -> bool:
    """A concat of one operand is it; an operand that is a concat along the same axis used
    only here is spliced in."""
    if len(op.operands) == 1:
        return rw.replace(op, op.operands[0])
    axis = op.attributes["axis"] % tensor_type(op.result).rank
    parts: list[Value] = []
    spliced = False
    for v in op.operands:
        inner = v.op
        if (inner is not None and inner.name == "ember.concat" and len(v.uses) == 1
                and inner.attributes["axis"] % tensor_type(v).rank == axis):
            parts += inner.operands
            spliced = True
        else:
            parts.append(v)
    return spliced and rw.replace(op, rw.op(op, "ember.concat", *parts, axis=axis))


PATTERNS: dict[str, list[Pattern]] = {
    "ember.add": [identity_operand(0, 0), identity_operand(1, 0), add_of_unslices],
    "ember.sub": [identity_operand(0, 0)],
    "ember.mul": [identity_operand(0, 1), identity_operand(1, 1)],
    "ember.div": [identity_operand(0, 1)],
    "ember.neg": [neg_neg],
    "ember.pow": [cube],
    "ember.transpose": [transpose],
    "ember.reshape": [reshape],
    "ember.broadcast": [broadcast],
    "ember.slice": [slice_],
    "ember.unslice": [unslice],
    "ember.concat": [concat],
    "ember.conv2d": [conv_of_padding],
    "ember.conv2d_nhwc": [conv_of_padding],
    "ember.reduce_sum": [reduce_of_broadcast],
    "ember.reduce_mean": [reduce_of_broadcast],
    "*": [fold_constants, erase_dead],
}


@register_pass
@dataclass(frozen=True)
class Canonicalize(Pass):
    name: ClassVar[str] = "canonicalize"

    def apply(self, graph: Graph) -> Graph:
        apply_patterns(graph, PATTERNS)
        return graph
