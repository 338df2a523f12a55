"""Splitting a kernel's outer loop across threads, from inside generated code.

A parallel kernel is outlined into `body(ptr ctx, i64 lo, i64 hi)` (ctx: its buffer
pointers). The caller spawns `n - 1` pthreads that, like the calling thread itself, take
chunks of `[0, n)` from an atomic counter until none are left, then joins them. If a
thread cannot be created, the remaining threads (at least the caller) do its chunks, so
the result never depends on how many threads ran. Spawning costs tens of microseconds,
so only kernels above a work threshold are split (`parallel_chunks`).

`EMBER_NUM_THREADS` overrides the thread count (default: the CPUs this process may use).
"""

from __future__ import annotations

import os

from llvmlite import ir

from .scalar import I64, i64

PTR = ir.PointerType()
I32 = ir.IntType(32)
MIN_WORK = 1 << 20  # element-operations (~0.1-0.2 ms) below which a kernel stays on one thread


def num_threads() -> int:
    env = os.environ.get("EMBER_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"EMBER_NUM_THREADS must be a positive integer, got {env!r}") \
                from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def parallel_chunks(work: float, iterations: int, threads: int) -> int:
    """How many threads a kernel of `work` element-operations over `iterations` outer
    iterations should use (1: run inline)."""
    if threads <= 1 or iterations < 2 or work < MIN_WORK:
        return 1
    return int(min(threads, iterations, max(1, work // MIN_WORK)))


def _declare(mod: ir.Module, name: str, ret, args) -> ir.Function:
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, args), name)
    return fn


def parallel_for(b: ir.IRBuilder, body: ir.Function, ctx: ir.Value, n: int, threads: int,
                 name: str) -> None:
    """Run `body(ctx, lo, hi)` over [0, n) on `threads` threads (one chunk each)."""
    mod = b.module
    if threads <= 1:
        b.call(body, [ctx, i64(0), i64(n)])
        return
    worker = _worker(mod, body, n, name)
    create = _declare(mod, "pthread_create", I32, [PTR, PTR, PTR, PTR])
    join = _declare(mod, "pthread_join", I32, [I64, PTR])
    cnt = stack_array(b, I64, 3, "counters")
    job = stack_array(b, PTR, 2, "job")
    tids = stack_array(b, I64, threads - 1, "tids")
    oks = stack_array(b, I32, threads - 1, "oks")
    for k, v in enumerate((i64(0), i64(threads), i64(n))):
        b.store(v, elem(b, cnt, I64, k))
    b.store(ctx, elem(b, job, PTR, 0))
    b.store(cnt, elem(b, job, PTR, 1))
    for t in range(threads - 1):
        rc = b.call(create, [elem(b, tids, I64, t), ir.Constant(PTR, None), worker, job])
        b.store(rc, elem(b, oks, I32, t))
    b.call(worker, [job])
    for t in range(threads - 1):
        rc = b.load(elem(b, oks, I32, t), typ=I32)
        with b.if_then(b.icmp_signed("==", rc, ir.Constant(I32, 0))):
            b.call(join, [b.load(elem(b, tids, I64, t), typ=I64), ir.Constant(PTR, None)])


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


def _worker(mod: ir.Module, body: ir.Function, n: int, name: str) -> ir.Function:
    """`ptr worker(ptr job)`: takes chunks until none are left, runs `body` on each."""
    fn = ir.Function(mod, ir.FunctionType(PTR, [PTR]), f"{name}.worker")
    fn.linkage = "internal"
    job = fn.args[0]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = b.load(elem(b, job, PTR, 0), typ=PTR)
    cnt = b.load(elem(b, job, PTR, 1), typ=PTR)
    nxt = elem(b, cnt, I64, 0)
    chunks = b.load(elem(b, cnt, I64, 1), typ=I64)
    total = b.load(elem(b, cnt, I64, 2), typ=I64)
    loop, done = fn.append_basic_block("take"), fn.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    c = b.atomic_rmw("add", nxt, i64(1), "monotonic")
    run = fn.append_basic_block("run")
    b.cbranch(b.icmp_signed("<", c, chunks), run, done)
    b.position_at_end(run)
    lo = b.sdiv(b.mul(c, total), chunks)
    hi = b.sdiv(b.mul(b.add(c, i64(1)), total), chunks)
    b.call(body, [ctx, lo, hi])
    b.branch(loop)
    b.position_at_end(done)
    b.ret(ir.Constant(PTR, None))
    return fn
