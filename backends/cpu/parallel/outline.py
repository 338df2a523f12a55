"""Splitting a kernel's outer loop across threads, from inside generated code.

A parallel kernel is outlined into `body(ptr ctx, i64 lo, i64 hi)` (ctx: its buffer
pointers) and handed to the process's thread pool (pool.py), whose workers and the
calling thread take its chunks of `[0, n)` until none are left. Whoever runs a chunk,
the result is the same. A hand-off costs a few microseconds while the workers are awake
(tens after they slept), so only kernels above a work threshold are split
(`parallel_chunks`). The thread count comes from `host.num_threads()`.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from ..kernels.scalar import I64, PTR, i64
from .pool import BODY, declare

# element-operations each thread gets at least (below twice this a kernel stays on one
# thread): a 1M-element add, exp or tanh (0.35-0.47 ms on one core of an Emerald Rapids VM,
# its data past L2) ran 1.9x faster on two threads, so the hand-off (a few us) pays well
# below that; from 1M to this, GPT A T64's step took 0.92x the time, B's 0.98x
MIN_WORK = 1 << 18


def parallel_chunks(work: float, iterations: int, threads: int) -> int:
    """How many threads a kernel of `work` element-operations over `iterations` outer
    iterations should use (1: run inline)."""
    if threads <= 1 or iterations < 2 or work < MIN_WORK:
        return 1
    return int(min(threads, iterations, max(1, work // MIN_WORK)))


def parallel_for(b: ir.IRBuilder, body: ir.Function, ctx: ir.Value, n: int, threads: int,
                 name: str) -> None:
    """Run `body(ctx, lo, hi)` over [0, n) in `threads` chunks, on the process's thread
    pool (pool.py); one chunk runs inline."""
    if threads <= 1:
        b.call(body, [ctx, i64(0), i64(n)])
        return
    b.call(declare(b.module), [body, ctx, i64(n), i64(threads)])


def parallel_region(b: ir.IRBuilder, name: str, ptrs: list[ir.Value], noalias: list[bool],
                    n: int, threads: int,
                    emit: Callable[[ir.IRBuilder, list[ir.Value], ir.Value, ir.Value], None]
                    ) -> None:
    """`emit(builder, pointers, lo, hi)` over [0, n), split into `threads` chunks.

    The chunk's code gets the pointers as arguments of its own function, `noalias` where
    the kernel's are (outputs, scratch): loaded from the pool's context array instead,
    LLVM would not know they don't overlap and would not vectorize the chunk as it does
    the kernel on one thread. The function is inlined into the pool's body."""
    mod = b.module
    chunk = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR] * len(ptrs) + [I64, I64]),
                        f"{name}.chunk")
    chunk.linkage = "internal"
    for arg, distinct in zip(chunk.args, noalias):
        if distinct:
            arg.add_attribute("noalias")
    cb = ir.IRBuilder(chunk.append_basic_block("entry"))
    emit(cb, list(chunk.args[:len(ptrs)]), chunk.args[-2], chunk.args[-1])
    cb.ret_void()
    body = ir.Function(mod, BODY, f"{name}.body")
    body.linkage = "internal"
    ctx, lo, hi = body.args
    bb = ir.IRBuilder(body.append_basic_block("entry"))
    bb.call(chunk, [bb.load(elem(bb, ctx, PTR, i), typ=PTR) for i in range(len(ptrs))]
            + [lo, hi])
    bb.ret_void()
    arr = stack_array(b, PTR, max(1, len(ptrs)), "ctx")
    for i, p in enumerate(ptrs):
        b.store(p, elem(b, arr, PTR, i))
    parallel_for(b, body, arr, n, threads, name)


def chunk_index(b: ir.IRBuilder, lo: ir.Value, n: int, chunks: int) -> ir.Value:
    """Which of `parallel_for`'s `chunks` chunks of [0, n) starts at `lo` (chunk c starts
    at c n / chunks, rounded down): for a chunk with working memory of its own."""
    return b.udiv(b.add(b.mul(lo, i64(chunks)), i64(n - 1)), i64(n))


def stack_array(b: ir.IRBuilder, ty: ir.Type, n: int, name: str = "") -> ir.Value:
    """An opaque pointer to `n` elements of `ty` on the stack (allocated at function entry,
    so it is allocated once however often the code runs)."""
    block = b.function.entry_basic_block
    if b.block is block:  # a second builder would shift this one's insertion point
        return b.bitcast(b.alloca(ty, size=n, name=name), PTR)
    entry = ir.IRBuilder(block)
    entry.position_at_start(block)
    return entry.bitcast(entry.alloca(ty, size=n, name=name), PTR)


def elem(b: ir.IRBuilder, base: ir.Value, ty: ir.Type, k) -> ir.Value:
    return b.gep(base, [k if isinstance(k, ir.Value) else i64(k)], inbounds=True,
                 source_etype=ty)
