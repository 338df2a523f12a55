"""How benchmarks/run.py times things and describes the machine: medians of repetitions,
interleaved blocks (every contender sees the same drift of a shared VM), a step's Python
alone, the FMA peak measured rather than read from /proc/cpuinfo, numpy's BLAS, and the
PyTorch training step every comparison times (`torch_train`)."""

from __future__ import annotations

import ctypes
import functools
import os
import statistics
import subprocess
import time
from pathlib import Path

REPEAT = 7  # repetitions of each timing (`--quick`: 3)
SETTLE = 0.2  # s: OpenBLAS's threads spin for tens of ms after a call, ember's for ~40 us


def median_time(fn, number: int, repeat: int | None = None) -> float:
    """Median seconds per call of `fn` over `repeat` blocks of `number` calls, after the
    threads of whatever ran before (OpenBLAS's, ember's pool) have gone back to sleep."""
    time.sleep(SETTLE)
    fn()
    times = []
    for _ in range(repeat or REPEAT):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number)
    return statistics.median(times)


def calls_for(seconds_each: float, budget: float = 0.05) -> int:
    return max(1, int(budget / max(seconds_each, 1e-7)))


# -- machine -----------------------------------------------------------------------------------

FMA_UNITS = {"znver5": (2, 512), "znver4": (2, 256), "znver3": (2, 256), "znver2": (2, 256),
             "skylake-avx512": (2, 512), "cascadelake": (2, 512), "icelake-server": (2, 512),
             "sapphirerapids": (2, 512), "haswell": (2, 256), "skylake": (2, 256)}


def fma_throughput() -> float:
    """FLOP/s of one core running independent vector FMAs (no memory): the core's peak,
    which is lanes x FMA units x 2 x the clock it really runs at."""
    import ctypes

    from llvmlite import ir

    from ember.backends.cpu.kernels import scalar as S
    from ember.backends.cpu.machine.host import host_isa
    from ember.backends.cpu.machine.jit import JitModule

    lanes = host_isa().bits // 32
    vt = ir.VectorType(ir.FloatType(), lanes)
    mod = ir.Module("peak")
    fn = ir.Function(mod, ir.FunctionType(ir.FloatType(), [S.I64]), "spin")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = S.declare(mod, f"llvm.fma.v{lanes}f32", vt, [vt, vt, vt])
    pre, body, done = b.block, fn.append_basic_block("body"), fn.append_basic_block("done")
    b.branch(body)
    b.position_at_end(body)
    k = b.phi(S.I64)
    k.add_incoming(S.i64(0), pre)
    one = ir.Constant(vt, [ir.Constant(ir.FloatType(), 1.0000001)] * lanes)
    accs = [b.phi(vt) for _ in range(12)]
    for a in accs:
        a.add_incoming(ir.Constant(vt, [ir.Constant(ir.FloatType(), 0.5)] * lanes), pre)
    new = accs
    for _ in range(8):
        new = [b.call(fma, [x, one, one]) for x in new]
    for a, v in zip(accs, new):
        a.add_incoming(v, b.block)
    k2 = b.add(k, S.i64(1))
    k.add_incoming(k2, b.block)
    b.cbranch(b.icmp_signed("<", k2, fn.args[0]), body, done)
    b.position_at_end(done)
    total = new[0]
    for x in new[1:]:
        total = b.fadd(total, x)
    b.ret(b.extract_element(total, S.i64(0)))
    jm = JitModule(mod)
    f = jm.function("spin", ctypes.c_float, ctypes.c_int64)
    n = 1_000_000
    best = min(median_time(lambda: f(n), 1, 1) for _ in range(5))
    return n * 8 * 12 * lanes * 2 / best


def machine() -> dict:
    from ember.backends.cpu.gemm import blas
    from ember.backends.cpu.machine import host

    cpu = host.host_cpu()
    isa = host.host_isa()
    units, width = FMA_UNITS.get(cpu, (2, isa.bits))
    mhz = 0.0
    try:
        text = Path("/proc/cpuinfo").read_text()
        mhz = max(float(line.split(":")[1]) for line in text.splitlines()
                  if line.startswith("cpu MHz"))
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("CPU max MHz"):
                mhz = max(mhz, float(line.split(":")[1]))
    except (OSError, ValueError):
        pass
    cores = host.num_threads()
    core = fma_throughput()
    clock = core / (units * (width // 32) * 2)
    b = blas.find()
    return {"cpu": cpu, "vector_bits": isa.bits, "fma": f"{units}x{width}-bit",
            "mhz": mhz, "clock_mhz": clock / 1e6, "cores": cores,
            "peak_gflops": core * cores / 1e9, "blas": b.path if b else None,
            "env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")}}


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')} "
                     f"threads={i['num_threads']}" for i in threadpool_info()
                     if i.get("user_api") == "blas")


# -- graphs ------------------------------------------------------------------------------------

def interleaved(fns: dict, number: int, rounds: int | None = None,
                per_call: bool = False) -> dict:
    """Median seconds per call of each function, timed in alternating blocks of `number`
    calls, in an order rotated every round: on a machine whose speed drifts (a shared VM)
    every contender sees the same drift, so the ratios hold when absolute times move. Each
    block starts with one untimed call, as `median_time` does: a training loop's steps
    follow each other, while the first call after the settling sleep refills caches and
    wakes sleeping threads (a GPT B step: ember +8.7%, PyTorch eager +4%), which with the
    GPT rows' one call per block was most of what a block timed. `per_call`: the median of
    every call's own time rather than of the blocks' means, for a figure compared with a
    kernel's (its median over runs): a block's mean also holds the interrupts and
    preemptions that a median leaves out (on a 2-core VM 4% of a 30 us step)."""
    times: dict = {k: [] for k in fns}
    order = list(fns)
    clock = time.perf_counter
    for r in range(rounds or REPEAT):
        for k in order[r % len(order):] + order[:r % len(order)]:  # rotated each round
            fn = fns[k]
            time.sleep(SETTLE)  # the last contender's spinning pool threads go to sleep
            fn()  # warm: steady-state steps are what is compared
            if per_call:
                for _ in range(number):
                    t = clock()
                    fn()
                    times[k].append(clock() - t)
                continue
            t = clock()
            for _ in range(number):
                fn()
            times[k].append((clock() - t) / number)
    return {k: statistics.median(v) for k, v in times.items()}


def python_path(step, x, y, number: int) -> float:
    """The step's median time with its native entry swapped for one that returns at once
    (nothing refused, nothing run): its Python and the ctypes call alone."""
    exe = step._last.run
    real, exe._entry = exe._entry, _noop_entry()[1]
    try:
        return interleaved({"python": lambda: step(x, y)}, number, per_call=True)["python"]
    finally:
        exe._entry = real


@functools.cache
def _noop_entry():
    """(its module, kept alive; a ctypes `i64 (ptr)` that returns 0)."""
    from llvmlite import ir

    from ember.backends.cpu.machine.jit import JitModule

    mod = ir.Module("noop")
    fn = ir.Function(mod, ir.FunctionType(ir.IntType(64), [ir.PointerType()]), "noop")
    ir.IRBuilder(fn.append_basic_block()).ret(ir.Constant(ir.IntType(64), 0))
    jit = JitModule(mod, name="noop", needs_pool=False)
    return jit, jit.function("noop", ctypes.c_int64, ctypes.c_void_p)


# -- PyTorch -------------------------------------------------------------------------------------

def torch_train(loss_fn, opt, compile_: bool, x, y):
    """A zero-argument PyTorch training step on (x, y): zero_grad, `loss_fn(x, y)` backward,
    `opt.step()`; the whole of it under torch.compile when `compile_`. Threads as ember's."""
    import torch

    torch.set_num_threads(int(os.environ.get("EMBER_NUM_THREADS", 0)) or os.cpu_count())

    def train(tx, ty):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(tx, ty)
        loss.backward()
        opt.step()
        return loss

    fn = torch.compile(train) if compile_ else train
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    return lambda: fn(tx, ty)
