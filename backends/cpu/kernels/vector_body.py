"""A kernel body evaluated on vectors of elements rather than one element: a conv's
epilogue applied to its accumulator registers before they are stored (depthwise_nhwc.py),
instead of a loop over the stored output after. Only the ops epilogues are made of (bias,
residual, scale, clamps); `evaluable` says False for a body with any other op or a value
not of the product's float dtype, and that body runs as a fused loop instead."""

from __future__ import annotations

from llvmlite import ir

from ....ir.types import ScalarType
from . import scalar as S

_BINARY = {"kernel.add": "fadd", "kernel.sub": "fsub", "kernel.mul": "fmul",
           "kernel.div": "fdiv"}
_CLAMPS = {"kernel.max": "maximum", "kernel.min": "minimum"}  # NaN-propagating, as numpy
OPS = {*_BINARY, *_CLAMPS, "kernel.neg", "kernel.relu", "kernel.constant", "kernel.yield"}


def evaluable(block, dtype: str) -> bool:
    values = [*block.args, *(r for op in block.ops for r in op.results)]
    return dtype in S.FLOATS and all(op.name in OPS for op in block.ops) and all(
        v.type == ScalarType(dtype) for v in values)


def evaluate(b: ir.IRBuilder, block, args: list[ir.Value], dtype: str, width: int
             ) -> list[ir.Value]:
    """The body's yields for vectors `args` (one per block argument) of `width` lanes."""
    vt = ir.VectorType(S.REG[dtype], width)
    vals = dict(zip(block.args, args))

    def clamp(kind: str, x, y):
        fn = S.declare(b.module, f"llvm.{kind}.v{width}{dtype}", vt, [vt, vt])
        return b.call(fn, [x, y])

    for op in block.ops:
        xs = [vals[v] for v in op.operands]
        if op.name == "kernel.yield":
            return xs
        if op.name == "kernel.constant":
            vals[op.result] = ir.Constant(vt, [S.const(dtype, op.attributes["value"])] * width)
        elif op.name in _BINARY:
            vals[op.result] = getattr(b, _BINARY[op.name])(*xs, flags=S.CONTRACT)
        elif op.name in _CLAMPS:
            vals[op.result] = clamp(_CLAMPS[op.name], *xs)
        elif op.name == "kernel.neg":
            vals[op.result] = b.fneg(xs[0])
        else:  # kernel.relu
            vals[op.result] = clamp("maximum", xs[0], ir.Constant(vt, None))
    raise ValueError("a kernel body without a kernel.yield")
