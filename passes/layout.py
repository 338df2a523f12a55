"""layout: channels last (NHWC) for the conv chains that run faster that way on a cpu.

In NCHW a depthwise conv walks planes of 7 to 112 columns one by one and a pointwise conv
multiplies [c_out, c] by each image's [c, h*w]; channels last, the first takes a vector
of channels per tap and the second is one GEMM over every position ([n*h*w, c] by
[c, c_out]). A *chain* is convs joined by elementwise ops and zero padding (a
MobileNet's inverted residual blocks); in a chain that holds a depthwise conv and
another conv of these kinds, each depthwise conv and each image stem (a conv of at most
STEM_CHANNELS input channels) becomes `ember.conv2d_nhwc` and each pointwise conv a
matmul, between a transpose to NHWC and one back (a lone depthwise conv
stays NCHW: at 112x112x32 it takes 0.087 ms channels last against 0.096, less than its
two transposes would cost, ~0.1 ms each). Each transpose back then sinks through the
elementwise ops and paddings below it until it meets the next conv's transpose to NHWC,
which canonicalize cancels, or a reader that needs NCHW (a full conv, a reshape, a result);
each transpose to NHWC rises above a padding or elementwise op that only it reads (a
full conv's bias and activation then run channels last, in the kernel that transposes):
the transposes left are where a chain starts and ends. Graph inputs and results keep
their NCHW layout. A chain without a depthwise conv (a ResNet's) stays NCHW: its 3x3
convs are the cpu's implicit GEMMs, and NHWC pointwise convs between them would cost two
transposes each. A pointwise conv of a 1 x 1 image (a squeeze-and-excite's), whose NCHW
and NHWC agree, is a matmul in any chain: as a conv it was a GEMM of one column, 4-8x
slower. Only graphs without a backward: conv gradients are NCHW only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from ..ir import Graph
from ..ir.builder import Builder
from ..ir.core import Operation, Value
from ..ir.memory_plan import backward_result_count
from ..ir.opdef import OPS
from .manager import Pass, register_pass
from .narrow import producer, tensor_type

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
HWIO = [2, 3, 1, 0]  # an [O, I, kh, kw] conv weight as [kh, kw, I, O]
STEM_CHANNELS = 4


def _kind(op: Operation) -> str | None:
    """"depthwise" (one input channel per output channel), "pointwise" (a 1x1 conv that
    is a GEMM), "stem" (a conv of at most STEM_CHANNELS input channels: an image's) or
    None, for an ember.conv2d."""
    a = op.attributes
    o, cg, kh, kw = tensor_type(op.operands[1]).shape
    if cg == 1 and o == a["groups"]:
        return "depthwise"
    if (kh, kw) == (1, 1) and a["groups"] == 1 and a["padding"] == [0, 0] \
            and a["stride"] == [1, 1]:
        return "pointwise"
    if a["groups"] == 1 and cg <= STEM_CHANNELS:
        return "stem"
    return None


def _is_elementwise(op: Operation) -> bool:
    d = OPS.get(op.name)
    return d is not None and "elementwise" in d.traits and len(op.results) == 1


def _padding(op: Operation) -> bool:
    """An unslice that places its operand in a larger rank-4 tensor (zero padding)."""
    return (op.name == "ember.unslice" and set(op.attributes["step"]) == {1}
            and tensor_type(op.result).rank == 4)


class _Chains:
    """Union-find over values: a conv's input and output, an elementwise op's result and
    its same-shaped operands, a padding's operand and result are in one chain."""

    def __init__(self) -> None:
        self.parent: dict[Value, Value] = {}

    def find(self, v: Value) -> Value:
        while self.parent.get(v, v) is not v:
            v = self.parent[v]
        return v

    def join(self, a: Value, b: Value) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[ra] = rb

    @classmethod
    def of(cls, graph: Graph) -> _Chains:
        chains = cls()
        for op in graph.body.ops:
            if op.name == "ember.conv2d" or _padding(op):
                chains.join(op.operands[0], op.result)
            elif _is_elementwise(op) and tensor_type(op.result).rank == 4:
                for v in op.operands:
                    if tensor_type(v).shape == tensor_type(op.result).shape:
                        chains.join(v, op.result)
        return chains


def _to_nhwc(b: Builder, op: Operation, kind: str) -> Value:
    """The conv `op` (of `_kind` kind) channels last, between transposes: the NCHW value
    that replaces it."""
    x, w = op.operands
    xt = b.op("ember.transpose", x, perm=TO_NHWC)
    if kind in ("depthwise", "stem"):
        a = op.attributes
        yt = b.op("ember.conv2d_nhwc", xt, b.op("ember.transpose", w, perm=HWIO),
                  stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                  groups=a["groups"])
    else:
        yt = _pointwise_matmul(b, xt, w)
    return b.op("ember.transpose", yt, perm=TO_NCHW)


def _pointwise_matmul(b: Builder, xt: Value, w: Value) -> Value:
    """A pointwise conv of the channels-last `xt` by `w` [O, C, 1, 1]: one GEMM
    [n*h*w, C] x [C, O] (the weight's transpose a view), channels last."""
    n, h, wd, c = tensor_type(xt).shape
    o = tensor_type(w).shape[0]
    rows = b.op("ember.reshape", xt, shape=[n * h * wd, c])
    wm = b.op("ember.transpose", b.op("ember.reshape", w, shape=[o, c]), perm=[1, 0])
    return b.op("ember.reshape", b.op("ember.matmul", rows, wm), shape=[n, h, wd, o])


def _of_one_pixel(op: Operation) -> bool:
    """A conv of a 1 x 1 image (a squeeze-and-excite's), whose NCHW and NHWC agree."""
    return tensor_type(op.operands[0]).shape[2:] == (1, 1)


def _one_pixel_matmul(b: Builder, op: Operation) -> Value:
    """The pointwise conv `op` of a 1 x 1 image as a matmul, with no transpose: the value
    that replaces it."""
    x, w = op.operands
    n, c = tensor_type(x).shape[:2]
    yt = _pointwise_matmul(b, b.op("ember.reshape", x, shape=[n, 1, 1, c]), w)
    return b.op("ember.reshape", yt, shape=list(tensor_type(op.result).shape))


def _from_nhwc(v: Value) -> Value | None:
    """The channels-last value that `v` is the transpose to NCHW of, if it is one."""
    if v.op is not None and v.op.name == "ember.transpose" and v.op.attributes["perm"] == TO_NCHW:
        return v.op.operands[0]
    return None


def _padded_nhwc(b: Builder, x: Value, pad: Operation) -> Value:
    """Padding `pad` (an NCHW unslice) of the channels-last `x`."""
    a, shape = pad.attributes, tensor_type(pad.result).shape
    return b.op("ember.unslice", x, start=[a["start"][p] for p in TO_NHWC], step=[1] * 4,
                shape=[shape[p] for p in TO_NHWC])


def _channels_last(b: Builder, v: Value, shape: tuple[int, ...]) -> Value | None:
    """Operand `v` of an elementwise op with NCHW result `shape`, channels last: the
    transposed value a sunk transpose came from, the value itself (a scalar), or a
    reshape (one that broadcasts along H and W: a bias, a per-image scale); None where a
    transpose would have to move data."""
    t = tensor_type(v)
    last = _from_nhwc(v)
    if last is not None and t.shape == shape:
        return last
    if t.rank == 0:
        return v
    full = (1,) * (4 - t.rank) + t.shape
    if t.rank > 4 or full[2:] != (1, 1):
        return None
    return b.op("ember.reshape", v, shape=[full[0], 1, 1, full[1]])


def _sink(op: Operation) -> Value | None:
    """`op`, one of whose operands is a transpose to NCHW, computed channels last and then
    transposed: the value that replaces it; None where that would move more data."""
    if len(op.results) != 1:
        return None
    b = Builder.before_op(op)
    shape = tensor_type(op.result).shape
    if _padding(op):
        x = _from_nhwc(op.operands[0])
        if x is None:
            return None
        return b.op("ember.transpose", _padded_nhwc(b, x, op), perm=TO_NCHW)
    if not _is_elementwise(op) or len(shape) != 4:
        return None
    operands = _all_channels_last(b, op.operands, shape, {})
    if operands is None:
        return None  # (reshapes made before giving up go with dce)
    y = b.create(op.name, operands, attrs=dict(op.attributes)).result
    return b.op("ember.transpose", y, perm=TO_NCHW)


def _all_channels_last(b: Builder, values: list[Value], shape: tuple[int, ...],
                       known: dict[Value, Value]) -> list[Value] | None:
    """`_channels_last` of each value (`known`'s where it has one), or None."""
    out = []
    for v in values:
        last = known.get(v) or _channels_last(b, v, shape)
        if last is None:
            return None
        out.append(last)
    return out


def _sink_all(back: list[Value]) -> None:
    """Sink each transpose to NCHW in `back` through every reader it can pass."""
    while back:
        t = back.pop()
        for user in list(dict.fromkeys(u for u, _ in t.uses)):
            if user.parent is None:
                continue
            new = _sink(user)
            if new is not None:
                user.result.replace_all_uses_with(new)
                user.erase()
                back.append(new)


def _raise(t: Operation) -> list[Operation] | None:
    """Transpose `t` to NHWC moved above the padding or elementwise op it reads when `t`
    is that op's only reader (the op then runs channels last): the transposes to NHWC that
    took its place, or None where it stays (more than one operand would need one)."""
    p = t.operands[0].op
    if p is None or len(p.result.uses) != 1 or not (_padding(p) or _is_elementwise(p)):
        return None
    shape = tensor_type(p.result).shape
    full = p.operands[:1] if _padding(p) else \
        [v for v in p.operands if tensor_type(v).shape == shape]
    if len(full) != 1 or len(shape) != 4:
        return None
    b = Builder.before_op(p)
    xt = b.op("ember.transpose", full[0], perm=TO_NHWC)
    if _padding(p):
        y = _padded_nhwc(b, xt, p)
    else:
        operands = _all_channels_last(b, p.operands, shape, {full[0]: xt})
        if operands is None:
            return None
        y = b.create(p.name, operands, attrs=dict(p.attributes)).result
    t.result.replace_all_uses_with(y)
    t.erase()
    p.erase()
    return [producer(xt)]


def _raise_all(fronts: list[Operation]) -> None:
    """Raise each transpose to NHWC in `fronts` as far as `_raise` takes it."""
    while fronts:
        fronts += _raise(fronts.pop()) or []


@register_pass
@dataclass(frozen=True)
class Layout(Pass):
    name: ClassVar[str] = "layout"

    def apply(self, graph: Graph) -> Graph:
        if backward_result_count(graph):
            return graph
        chains = _Chains.of(graph)
        kinds = {op: kind for op in graph.body.ops
                 if op.name == "ember.conv2d" and (kind := _kind(op)) is not None}
        chain = {op: chains.find(op.operands[0]) for op in kinds}
        count = Counter(chain.values())
        nhwc = {chain[op] for op, kind in kinds.items()
                if kind == "depthwise" and count[chain[op]] > 1}
        back = []
        for op, kind in kinds.items():
            if chain[op] in nhwc:
                y = _to_nhwc(Builder.before_op(op), op, kind)
                back.append(y)
            elif kind == "pointwise" and _of_one_pixel(op):
                y = _one_pixel_matmul(Builder.before_op(op), op)
            else:
                continue
            op.result.replace_all_uses_with(y)
            op.erase()
        _sink_all(back)
        _raise_all([op for op in graph.body.ops if op.name == "ember.transpose"
                    and op.attributes["perm"] == TO_NHWC])
        return graph
