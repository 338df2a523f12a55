"""The epilogue of a `kernel.conv2d` (its body: bias, activation, residual). An implicit
conv runs it on each span of output it has just finished, while still in cache: after
each unit (a block of channels over a chunk of positions) or batch of units; a span is
positions [lo, hi) of planes (image n, channels o0..o1). Other convs (depthwise,
pointwise, im2col) run it after, over the whole output (`emit_after`): after each
depthwise plane or each block of a GEMM's rows it was slower (conv.py says by how much).

The conv writes its product into the first result where that is the product's own layout
(the raw conv, or a value of its dtype the body computes from it), and the body then runs
in place there, each element read before it is written; otherwise into scratch memory
(`product_bytes`). An epilogue whose operands are not laid out plane by plane (strides
along the output's rows and columns that do not walk it as one flat run) runs after the
conv, over the whole output (`emit_after`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from ....ir.dialects.kernel import accumulator_dtype, epilogue_maps, holds_product
from ...strides import contiguous_strides
from . import scalar as S
from .fused import FusedEmitter
from .loops import for_range
from .scalar import PTR, i64


@dataclass
class Finish:
    """What a conv kernel calls on each span it finishes: `span` with the pointers it was
    handed (`ptrs`, passed through its parallel regions after its own)."""

    fn: ir.Function
    ptrs: list

    def span(self, b: ir.IRBuilder, y, ptrs: list, n, o, rows, lo, hi) -> None:
        """The epilogue on positions [lo, hi) of planes (n, o) .. (n, o + rows - 1) of the
        product at y."""
        b.call(self.fn, [y, *ptrs, n, o, b.add(o, rows), lo, hi])


def at_plane(b: ir.IRBuilder, ptr, m: list[int], dtype: str, n, o):
    off = b.add(b.mul(n, i64(m[0])), b.mul(o, i64(m[1])))
    return b.gep(ptr, [off], inbounds=True, source_etype=S.REG[dtype])


class ConvEpilogue:
    """The body of one `kernel.conv2d` op over its output [N, O, OH, OW]."""

    def __init__(self, op, name: str):
        self.op, self.name = op, name
        space, maps, out_maps = epilogue_maps(op)
        self.space = space
        self.dtype = accumulator_dtype(op)
        product = contiguous_strides(space)
        self.in_maps = [product] + maps
        self.out_maps = out_maps
        self.in_dtypes = [self.dtype] + [v.type.dtype for v in op.operands[2:]]
        self.out_dtypes = [t.dtype for t in op.attributes["out_types"]]
        self.in_place = holds_product(op)
        ow = space[3]
        self.flat = all(m[2] == m[3] * ow for m in self.in_maps + out_maps)

    @property
    def product_bytes(self) -> int:
        """Scratch for the conv's product, where it cannot be the first result."""
        return 0 if self.in_place else math.prod(self.space) * S.size(self.dtype)

    def finish(self, b: ir.IRBuilder, ins: list, outs: list) -> Finish | None:
        """The span function and its pointers (the epilogue operands', the results'), or
        None where the epilogue must run after the conv (`flat` False)."""
        if not self.flat:
            return None
        return Finish(self._span_function(b.module), [*ins, *outs])

    def _span_function(self, module: ir.Module) -> ir.Function:
        """`f(product, epilogue operands..., results..., n, o0, o1, lo, hi)`: positions
        [lo, hi) of planes (n, o0) .. (n, o1 - 1)."""
        n_in, n_out = len(self.in_maps), len(self.out_maps)
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * (n_in + n_out)
                                                 + [ir.IntType(64)] * 5), f"{self.name}.span")
        fn.linkage = "internal"
        # the product and the results overlap nothing the body reads but each other, and
        # in place the first result is the product, read and written through one pointer:
        # with two, LLVM's run-time overlap check failed and the loop ran scalar
        args = list(fn.args[:n_in + n_out])
        if self.in_place:
            args[n_in] = args[0]
        for k in (0, *range(n_in + self.in_place, n_in + n_out)):
            fn.args[k].add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        n, o0, o1, lo, hi = fn.args[-5:]
        p = self.space[2] * self.space[3]
        em = FusedEmitter(self.op.regions[0].blocks[0], [p], [[m[3]] for m in self.in_maps],
                          [[m[3]] for m in self.out_maps], self.in_dtypes, self.out_dtypes,
                          f"{self.name}.epilogue")

        def plane(o):
            planes = [at_plane(b, ptr, m, dt, n, o) for ptr, m, dt in zip(
                args, self.in_maps + self.out_maps, self.in_dtypes + self.out_dtypes)]
            em.ins, em.outs = planes[:n_in], planes[n_in:]
            em.run(b, (lo, hi))

        for_range(b, o0, o1, plane, "o")
        b.ret_void()
        return fn

    def emit_after(self, b: ir.IRBuilder, product, ins: list, outs: list,
                   threads: int) -> None:
        """The whole epilogue over the finished product, split across threads."""
        FusedEmitter(self.op.regions[0].blocks[0], self.space, self.in_maps, self.out_maps,
                     self.in_dtypes, self.out_dtypes, f"{self.name}.epilogue").emit(
            b, [product, *ins], outs, threads)
