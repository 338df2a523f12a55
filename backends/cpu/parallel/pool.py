"""One process-wide pool of worker threads that every compiled graph's parallel loops share.

Creating threads per kernel costs tens of microseconds, more than a small kernel takes,
so the workers are created once (on the first parallel loop) and then wait: they spin
for a few tens of microseconds after each loop (a training step's kernels follow each
other closely), then sleep on a futex. The pool is native code in its own LLVM module
(built here, loaded once by `jit.load_pool`); generated kernels call its
`ember_parallel_for(body, ctx, n, chunks)`, which runs `body(ctx, lo, hi)` on `chunks`
slices of [0, n), on the caller and the workers.

Chunks are claimed from one 64-bit word, generation (high half) and next chunk (low
half): a dispatch first blocks the word (chunk index all ones), then writes the job,
then opens it; a claim is a compare-and-swap on the word seen, so a worker that read a
job while the next one was being written can never run it. The caller runs chunks too
and returns once every chunk is done. A nested or concurrent call (another executable
in another Python thread), a forked child (its workers did not survive the fork) and a
machine without futexes run the loop's chunks one after the other on the calling thread
instead: slower, never wrong, and the same arithmetic (a chunk may own a partial sum, so
running [0, n) as one chunk would reassociate it: results would depend on contention).
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir

from ..kernels import scalar as S
from ..kernels.scalar import I32, I64, PTR, i64

SYMBOL = "ember_parallel_for"
BODY = ir.FunctionType(ir.VoidType(), [PTR, I64, I64])
# a waiting worker spins on a pause instruction (reacts within ~0.1 us), then yields the
# CPU (another thread may need it), then sleeps: ~40 us awake in all after each job
PAUSES, YIELDS = 2048, 64
FUTEX = {"x86_64": 202, "aarch64": 98}  # SYS_futex
WAIT, WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE


def declare(mod: ir.Module) -> ir.Function:
    """`ember_parallel_for` in a kernel module (resolved against the pool when loaded)."""
    return S.declare(mod, SYMBOL, ir.VoidType(), [PTR, PTR, I64, I64])


def build(workers: int) -> ir.Module:
    """The pool's module: `workers` threads besides the caller (0: every loop is serial)."""
    mod = ir.Module(name="ember_pool")
    arch = llvm.get_process_triple().split("-")[0]
    futex = FUTEX.get(arch) if "linux" in llvm.get_process_triple() else None
    if futex is None:
        workers = 0
    g = _Globals(mod)
    claim = _claim(mod, g)
    syscall = ir.Function(mod, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
    sched_yield = ir.Function(mod, ir.FunctionType(I32, []), "sched_yield")
    worker = _worker(mod, g, claim, syscall, sched_yield, futex or 0)
    _dispatch(mod, g, claim, syscall, worker, workers, futex or 0)
    return mod


class _Globals:
    def __init__(self, mod: ir.Module):
        def var(name, ty):
            v = ir.GlobalVariable(mod, ty, f"pool.{name}")
            v.linkage = "internal"
            v.initializer = ir.Constant(ty, None if ty is PTR else 0)
            return v

        self.word, self.done = var("word", I64), var("done", I64)
        self.gen, self.sleepers = var("gen", I32), var("sleepers", I32)
        self.busy, self.started, self.pid = var("busy", I32), var("started", I32), \
            var("pid", I32)
        self.fn, self.ctx = var("fn", PTR), var("ctx", PTR)
        self.n, self.chunks = var("n", I64), var("chunks", I64)


def _load(b, ptr, ty, order="monotonic"):
    return b.load_atomic(ptr, order, 8 if ty is not I32 else 4, typ=ty)


def _store(b, value, ptr, order="monotonic"):
    """An atomic store (as an exchange: llvmlite's store_atomic needs typed pointers)."""
    b.atomic_rmw("xchg", ptr, value, order)


def _claim(mod: ir.Module, g: _Globals) -> ir.Function:
    """`claim()`: run chunks of the open job until none is left (or a newer job began)."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), []), "pool.claim")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    head, try_, run, out = (fn.append_basic_block(s) for s in ("head", "try", "run", "out"))
    b.branch(head)
    b.position_at_end(head)
    w = _load(b, g.word, I64, "acquire")
    idx = b.and_(w, i64(0xFFFFFFFF))
    body = _load(b, g.fn, BODY.as_pointer())  # typed, so that it can be called
    ctx = _load(b, g.ctx, PTR)
    n, chunks = _load(b, g.n, I64), _load(b, g.chunks, I64)
    b.cbranch(b.icmp_unsigned(">=", idx, chunks), out, try_)  # done, or blocked (all ones)
    b.position_at_end(try_)
    swapped = b.cmpxchg(g.word, w, b.add(w, i64(1)), "acq_rel", "acquire")
    b.cbranch(b.extract_value(swapped, 1), run, head)
    b.position_at_end(run)
    b.call(body, [ctx, *_bounds(b, idx, n, chunks)])
    b.atomic_rmw("add", g.done, i64(1), "release")
    b.branch(head)
    b.position_at_end(out)
    b.ret_void()
    return fn


def _worker(mod, g, claim, syscall, sched_yield, futex: int) -> ir.Function:
    """`ptr worker(ptr)`: forever wait for a new job (spin, then sleep), claim its chunks."""
    fn = ir.Function(mod, ir.FunctionType(PTR, [PTR]), "pool.worker")
    fn.linkage = "internal"
    entry = fn.append_basic_block("entry")
    wait, spin, sleep, got = (fn.append_basic_block(s) for s in ("wait", "spin", "sleep", "got"))
    b = ir.IRBuilder(entry)
    b.branch(wait)
    b.position_at_end(wait)
    seen = b.phi(I32, "seen")
    spins = b.phi(I32, "spins")
    seen.add_incoming(ir.Constant(I32, 0), entry)  # created before the first job opens
    spins.add_incoming(ir.Constant(I32, 0), entry)
    now = _load(b, g.gen, I32, "acquire")
    b.cbranch(b.icmp_unsigned("!=", now, seen), got, spin)
    b.position_at_end(spin)
    pause_block, yield_block = (_spin_block(fn, call, wait, seen, spins) for call in (
        _pause(mod), lambda y: y.call(sched_yield, [])))
    more = fn.append_basic_block("more")
    b.cbranch(b.icmp_unsigned("<", spins, ir.Constant(I32, PAUSES)), pause_block, more)
    b.position_at_end(more)
    b.cbranch(b.icmp_unsigned("<", spins, ir.Constant(I32, PAUSES + YIELDS)), yield_block,
              sleep)
    b.position_at_end(sleep)
    b.atomic_rmw("add", g.sleepers, ir.Constant(I32, 1), "seq_cst")
    b.call(syscall, [i64(futex), g.gen, i64(WAIT), b.zext(seen, I64), ir.Constant(PTR, None)])
    b.atomic_rmw("sub", g.sleepers, ir.Constant(I32, 1), "seq_cst")
    seen.add_incoming(seen, b.block)
    spins.add_incoming(spins, b.block)
    b.branch(wait)
    b.position_at_end(got)
    b.call(claim, [])
    seen.add_incoming(now, b.block)
    spins.add_incoming(ir.Constant(I32, 0), b.block)
    b.branch(wait)
    return fn


def _spin_block(fn, wait_once, wait, seen, spins) -> ir.Block:
    """A block that waits a little (`wait_once(builder)`) and goes back to `wait`."""
    block = fn.append_basic_block("spin")
    y = ir.IRBuilder(block)
    wait_once(y)
    seen.add_incoming(seen, block)
    spins.add_incoming(y.add(spins, ir.Constant(I32, 1)), block)
    y.branch(wait)
    return block


def _pause(mod: ir.Module):
    """The CPU's spin-wait hint (x86 `pause`, arm `yield`): lets the sibling thread run."""
    arch = llvm.get_process_triple().split("-")[0]
    if arch == "aarch64":
        hint = mod.globals.get("llvm.aarch64.hint") or ir.Function(
            mod, ir.FunctionType(ir.VoidType(), [I32]), "llvm.aarch64.hint")
        return lambda b: b.call(hint, [ir.Constant(I32, 1)])
    name = "llvm.x86.sse2.pause"
    pause = mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ir.VoidType(), []), name)
    return lambda b: b.call(pause, [])


def _bounds(b: ir.IRBuilder, c, n, chunks):
    """[lo, hi) of chunk c of [0, n) in `chunks` chunks: the split `claim` makes."""
    return b.udiv(b.mul(c, n), chunks), b.udiv(b.mul(b.add(c, i64(1)), n), chunks)


def _each_chunk(fn: ir.Function, b: ir.IRBuilder, run, n, chunks) -> None:
    """`run(lo, hi)` for every chunk of [0, n) (at least one), in order."""
    pre, head = b.block, fn.append_basic_block("chunk")
    b.branch(head)
    b.position_at_end(head)
    c = b.phi(I64, "c")
    c.add_incoming(i64(0), pre)
    run(*_bounds(b, c, n, chunks))
    nxt = b.add(c, i64(1))
    c.add_incoming(nxt, b.block)
    after = fn.append_basic_block("chunks.done")
    b.cbranch(b.icmp_signed("<", nxt, chunks), head, after)
    b.position_at_end(after)


def _dispatch(mod, g, claim, syscall, worker, workers: int, futex: int) -> None:
    """`ember_parallel_for`: start the workers on first use, open the job, take chunks,
    wait for the rest; or run the whole loop here (see the module's docstring)."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [BODY.as_pointer(), PTR, I64, I64]),
                     SYMBOL)
    body, ctx, n, chunks = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    serial, pooled, start, go = (fn.append_basic_block(s) for s in
                                 ("serial", "pooled", "start", "go"))
    getpid = ir.Function(mod, ir.FunctionType(I32, []), "getpid")
    create = ir.Function(mod, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), "pthread_create")
    tid = b.alloca(I64, name="tid")
    if workers == 0:
        b.branch(serial)
    else:
        pid = b.call(getpid, [])
        started = _load(b, g.started, I32, "acquire")
        forked = b.and_(b.icmp_unsigned("!=", started, ir.Constant(I32, 0)),
                        b.icmp_unsigned("!=", _load(b, g.pid, I32), pid))
        small = b.icmp_signed("<=", chunks, i64(1))
        with b.if_then(b.not_(b.or_(forked, small))):
            took = b.cmpxchg(g.busy, ir.Constant(I32, 0), ir.Constant(I32, 1), "acquire",
                             "monotonic")
            b.cbranch(b.extract_value(took, 1), pooled, serial)
        b.branch(serial)
    b.position_at_end(serial)  # the same chunks, in order: the same arithmetic as pooled
    _each_chunk(fn, b, lambda lo, hi: b.call(body, [ctx, lo, hi]), n, chunks)
    b.ret_void()

    b.position_at_end(pooled)
    b.cbranch(b.icmp_unsigned("==", _load(b, g.started, I32), ir.Constant(I32, 0)), start, go)
    b.position_at_end(start)  # the first parallel loop of this process starts the workers
    _store(b, b.call(getpid, []), g.pid)
    for _ in range(workers):
        b.call(create, [tid, ir.Constant(PTR, None), worker, ir.Constant(PTR, None)])
    _store(b, ir.Constant(I32, 1), g.started, "release")
    b.branch(go)
    b.position_at_end(go)
    gen = b.add(b.lshr(_load(b, g.word, I64), i64(32)), i64(1))
    head = b.shl(gen, i64(32))
    _store(b, b.or_(head, i64(0xFFFFFFFF)), g.word, "seq_cst")  # blocked while written
    for var, value in ((g.fn, body), (g.ctx, ctx), (g.n, n), (g.chunks, chunks),
                       (g.done, i64(0))):
        _store(b, value, var)
    _store(b, head, g.word, "release")  # open: chunk 0 is next
    b.atomic_rmw("add", g.gen, ir.Constant(I32, 1), "seq_cst")
    with b.if_then(b.icmp_unsigned("!=", _load(b, g.sleepers, I32, "seq_cst"),
                                   ir.Constant(I32, 0))):
        b.call(syscall, [i64(futex), g.gen, i64(WAKE), i64(0x7FFFFFFF)])
    b.call(claim, [])
    wait, finished = fn.append_basic_block("wait"), fn.append_basic_block("finished")
    b.branch(wait)
    b.position_at_end(wait)
    all_done = b.icmp_unsigned(">=", _load(b, g.done, I64, "acquire"), chunks)
    with b.if_then(b.not_(all_done)):
        _pause(mod)(b)
    b.cbranch(all_done, finished, wait)
    b.position_at_end(finished)
    _store(b, ir.Constant(I32, 0), g.busy, "release")
    b.ret_void()
