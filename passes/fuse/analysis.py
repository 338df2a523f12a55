"""What `fuse` knows about one op or value: the iteration space of a fusible op and which
space dim each dim of its operands and result runs along (`describe`), the `kernel`
dialect op an elementwise op becomes (`kernel_op`), the strided layout a chain of views
reads (`strided`), the element of a splat constant, and the forward op each recomputed
copy repeats (`originals`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...ir import Block, Operation, Value
from ...ir.dense import splat_element
from ...ir.memory_plan import RESIDENT_OPS
from ...ir.opdef import has_trait, normalize_axes
from ..narrow import tensor_type

RECOMPUTE = "ember.recompute"  # the recompute pass's mark on recomputed copies
VIEWS = ("ember.transpose", "ember.broadcast", "ember.reshape")
# ops a kernel computes first, its body then their epilogue (kernel.matmul, kernel.conv2d)
CORES = {"ember.matmul": "kernel.matmul", "ember.conv2d": "kernel.conv2d",
         "ember.conv2d_nhwc": "kernel.conv2d_nhwc"}
CONVS = ("ember.conv2d", "ember.conv2d_nhwc")
REDUCTIONS = {"ember.reduce_sum": "add", "ember.reduce_mean": "add", "ember.reduce_max": "max"}
# one entry per dim of a value: the space dim it runs along, None for size 1
Dims = tuple[int | None, ...]
# (space, operand dims, result dims, reduced dims) of a fusible op
Description = tuple[list[int], list[Dims], Dims, frozenset[int]]


def contiguous(shape: Sequence[int]) -> list[int]:
    out: list[int] = []
    s = 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def splat_value(v: Value) -> float | None:
    """The element of a splat `ember.constant` (all elements equal), else None."""
    op = v.op
    if op is None or op.name != "ember.constant":
        return None
    first = splat_element(op.attributes["value"])
    return None if first is None else first.item()


def kernel_op(name: str) -> str | None:
    """The `kernel` dialect op computing elementwise ember op `name` on scalars (its twin,
    which ir/dialects/kernel.py derives for every one), or None."""
    if name.startswith("ember.") and has_trait(name, "elementwise"):
        return "kernel." + name.removeprefix("ember.")
    return None


def _space(shape: Sequence[int]) -> tuple[list[int], dict[int, int]]:
    keep = [i for i, d in enumerate(shape) if d != 1]
    return [shape[i] for i in keep], {i: k for k, i in enumerate(keep)}


def _aligned(shape: Sequence[int], out: Sequence[int], pos: dict[int, int]) -> Dims:
    """Dims of an operand read with numpy broadcasting against result shape `out`."""
    off = len(out) - len(shape)
    return tuple(None if d == 1 else pos[i + off] for i, d in enumerate(shape))


def describe(op: Operation) -> Description | None:
    """(space, operand dims, result dims, reduced dims) of a fusible op; None otherwise."""
    name = op.name
    if len(op.results) != 1 or any(tensor_type(v).size == 0 for v in (*op.operands, op.result)):
        return None
    out = tensor_type(op.result).shape
    if name in CORES:
        if not op.result.type.is_float or op.result.type.dtype not in ("f32", "f64"):
            return None
        space, pos = _space(out)
        return space, [], tuple(pos.get(i) for i in range(len(out))), frozenset()
    if name in REDUCTIONS:
        t = tensor_type(op.operands[0])
        if not t.is_float:
            return None
        axes = normalize_axes(name, op.attributes["axes"], t.rank)
        space, pos = _space(t.shape)
        red = frozenset(pos[a] for a in axes if a in pos)
        keep = op.attributes["keepdims"]
        res = tuple(None if (i in axes or i not in pos) else pos[i]
                    for i in range(t.rank) if keep or i not in axes)
        return space, [tuple(pos.get(i) for i in range(t.rank))], res, red
    space, pos = _space(out)
    res = tuple(pos.get(i) for i in range(len(out)))
    if name == "ember.transpose":
        perm = op.attributes["perm"]
        src: list[int | None] = [None] * len(perm)
        for j, p in enumerate(perm):
            src[p] = pos.get(j)
        return space, [tuple(src)], res, frozenset()
    if name == "ember.reshape":
        shape = tensor_type(op.operands[0]).shape
        if [d for d in shape if d != 1] != space:
            return None
        it = iter(range(len(space)))
        return space, [tuple(None if d == 1 else next(it) for d in shape)], res, frozenset()
    if name == "ember.one_hot":
        labels = tensor_type(op.operands[0]).shape
        return space, [tuple(None if d == 1 else pos[i] for i, d in enumerate(labels))], \
            res, frozenset()
    if name in ("ember.broadcast", "ember.dropout") or kernel_op(name):
        dims = [_aligned(tensor_type(v).shape, out, pos) for v in op.operands]
        return space, dims, res, frozenset()
    return None


def strided(v: Value) -> tuple[Value, list[int]]:
    """`v` as (base value, element strides): transposes, broadcasts and reshapes that keep
    a strided layout are looked through, so a matmul reads them in place."""
    op = v.op
    shape = tensor_type(v).shape
    if op is None or op.name not in VIEWS:
        return v, contiguous(shape)
    base, st = strided(op.operands[0])
    src = tensor_type(op.operands[0]).shape
    if op.name == "ember.transpose":
        return base, [st[p] for p in op.attributes["perm"]]
    if op.name == "ember.broadcast":
        off = len(shape) - len(src)
        return base, [0 if i < off or src[i - off] == 1 else st[i - off]
                      for i in range(len(shape))]
    new = _reshape_strides(src, st, shape)
    return (base, new) if new is not None else (v, contiguous(shape))


def _reshape_strides(src: Sequence[int], st: Sequence[int],
                     shape: Sequence[int]) -> list[int] | None:
    """Strides that read a strided `src` layout as `shape` without a copy, if any."""
    dims = [(d, s) for d, s in zip(src, st) if d != 1]
    out: list[int] = []
    i = 0
    want = [d for d in shape]
    j = 0
    while j < len(want):
        d = want[j]
        if d == 1:
            out.append(0)
            j += 1
            continue
        if i >= len(dims):
            return None
        # gather source dims until their product is a multiple of d, or split one
        size, stride = dims[i]
        if size % d == 0:
            out.append(stride * (size // d))
            dims[i] = (size // d, stride)
            if size // d == 1:
                i += 1
            j += 1
            continue
        if d % size == 0:  # merge consecutive source dims when they are contiguous
            prod, k = size, i
            while prod < d and k + 1 < len(dims) and dims[k][1] == dims[k + 1][0] * dims[k + 1][1]:
                k += 1
                prod *= dims[k][0]
            if prod != d:
                return None
            out.append(dims[k][1])
            i = k + 1
            j += 1
            continue
        return None
    return out if i >= len(dims) else None


def originals(block: Block, forward: set[Operation]) -> dict[Operation, Operation]:
    """The forward op each recomputed copy repeats (views aside: each reader has its own):
    the one with its name and attributes whose operands are the copy's, or the originals
    of the copies it reads, views looked through. Any backward op may be such a copy, not
    only one marked `ember.recompute` (a recomputed attention was rebuilt as a kernel op):
    CSE merged any other backward op equal to a forward one. A copy whose original is gone
    (folded by a later pass) has none."""
    same: dict[Value, Value] = {}  # a copy's result -> the original's

    def operand(v: Value) -> object:
        v = same.get(v, v)
        if v.op is not None and v.op.name in VIEWS:
            return _attrs(v.op), operand(v.op.operands[0])
        return id(v)

    def key(op: Operation) -> tuple[object, ...]:
        return _attrs(op), tuple(map(operand, op.operands))

    skip = (*VIEWS, *RESIDENT_OPS)  # params and constants are never recomputed
    index = {key(op): op for op in block.ops if op in forward and op.name not in skip}
    found: dict[Operation, Operation] = {}
    for op in block.ops:
        if op not in forward and op.name not in skip:
            o = index.get(key(op))
            if o is not None:
                found[op] = o
                same.update(zip(op.results, o.results))
    return found


def _attrs(op: Operation) -> tuple[str, tuple[tuple[str, str], ...]]:
    """op's name and attributes (but the recompute mark), comparable."""
    return op.name, tuple(sorted((k, repr(v)) for k, v in op.attributes.items()
                                 if k != RECOMPUTE))
