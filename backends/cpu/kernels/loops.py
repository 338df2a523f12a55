"""Loop nests over static shapes, in the form LLVM's vectorizer likes best.

Every shape is known at compile time, so a loop is emitted bottom-tested with a constant
trip count (a size-1 loop is no loop at all), and indices are i64 with `nuw nsw`; only a
loop with run-time bounds (`for_range`) is top-tested.
A nest walks several buffers at once, each with its own element strides: stride 0 is a
broadcast dimension, a permuted stride a transpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from ...strides import Dim
from . import scalar as S
from .scalar import I64, i64

NUW = ("nuw", "nsw")


def loop(b: ir.IRBuilder, n: int, body: Callable[[ir.Value], None], name: str = "i") -> None:
    """`for i in range(n): body(i)`; nothing at all when n == 0."""
    if n == 0:
        return
    if n == 1:
        body(i64(0))
        return
    pre = b.block
    head = b.append_basic_block(f"{name}.loop")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(i64(0), pre)
    body(i)
    nxt = b.add(i, i64(1), flags=NUW)
    i.add_incoming(nxt, b.block)
    done = b.append_basic_block(f"{name}.done")
    b.cbranch(b.icmp_unsigned("<", nxt, i64(n)), head, done)
    b.position_at_end(done)


def for_range(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, body: Callable[[ir.Value], None],
              name: str = "i") -> None:
    """`for i in range(lo, hi): body(i)` with bounds known only at run time (a thread's
    chunk, a row count), so top-tested."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body_bb = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), body_bb, done)
    b.position_at_end(body_bb)
    body(i)
    i.add_incoming(b.add(i, i64(1)), b.block)
    b.branch(head)
    b.position_at_end(done)


def carried(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, values: list[ir.Value],
            body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]], step: int = 1,
            name: str = "k") -> tuple[ir.Value, list[ir.Value]]:
    """`for k in range(lo, hi - step + 1, step): values = body(k, values)` with run-time
    bounds (top-tested), the values carried in phis so accumulators stay in registers (a
    micro-kernel's tile); returns the k it stopped at and the final values."""
    pre = b.block
    head, body_bb, done = (b.append_basic_block(f"{name}.{s}")
                           for s in ("head", "body", "exit"))
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I64)
    k.add_incoming(lo, pre)
    phis = [b.phi(v.type) for v in values]
    for phi, v in zip(phis, values):
        phi.add_incoming(v, pre)
    last = b.add(k, i64(step - 1)) if step > 1 else k
    b.cbranch(b.icmp_signed("<", last, hi), body_bb, done)
    b.position_at_end(body_bb)
    new = body(k, phis)
    k.add_incoming(b.add(k, i64(step)), b.block)
    for phi, v in zip(phis, new):
        phi.add_incoming(v, b.block)
    b.branch(head)
    b.position_at_end(done)
    return k, phis


def offset(b: ir.IRBuilder, base: ir.Value, i: ir.Value, stride: int) -> ir.Value:
    """base + i*stride, skipping the arithmetic that is zero."""
    if stride == 0:
        return base
    step = i if stride == 1 else b.mul(i, i64(stride), flags=NUW)
    return step if isinstance(base, ir.Constant) and base.constant == 0 else \
        b.add(base, step, flags=NUW)


def nest(b: ir.IRBuilder, dims: Sequence[Dim], body: Callable[[list[ir.Value]], None],
         base: Sequence[ir.Value]) -> None:
    """Loops over `dims` (outermost first); `body` gets each buffer's element offset,
    starting from `base` (one offset per buffer)."""

    def level(k: int, offs: list[ir.Value]) -> None:
        if k == len(dims):
            body(offs)
            return
        size, strides = dims[k]
        loop(b, size, lambda i: level(k + 1, [offset(b, o, i, s) for o, s in
                                              zip(offs, strides)]), name=f"i{k}")

    level(0, list(base))


def fill_zero(b: ir.IRBuilder, ptr: ir.Value, dtype: str, n: int) -> None:
    """ptr[0:n] = 0: sums that start there, or columns a micro-kernel reads past an edge."""
    loop(b, n, lambda i: S.store(b, ptr, dtype, i, S.const(dtype, 0)), "z")
