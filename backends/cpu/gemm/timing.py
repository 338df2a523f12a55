"""Timing ember's own GEMM against OpenBLAS on this machine, cheaply enough to do while
compiling (issue 15): `cost.choose` measures a grid point the stored table lacks with
`measure_point`, `python -m ember.backends.cpu.gemm.tune` the whole grid.

Each engine's GEMM is compiled alone (`GemmBench`: no graph, no passes, both engines in one
LLVM module) into an entry that runs it `reps` times natively, so neither Python calls nor
a compile of a whole graph are in what is timed or in what a measurement costs; the
fastest of a few short blocks counts.
"""

from __future__ import annotations

import ctypes
import math
import time

import numpy as np
from llvmlite import ir

from ..call.buffers import raw_bytes
from ..kernels.loops import for_range
from ..kernels.scalar import I64, PTR, i64
from ..machine.host import Isa, host_isa, num_threads
from ..machine.jit import JitModule
from . import blas as B
from .emit import GemmProblem, emit_own, plan_own

Point = tuple[int, int, int]

# OpenBLAS's threads spin after a call (by default 2^28 TSC cycles: 0.1 s at 2.6 GHz) and
# would take a core from the own GEMM's threads: an own measurement starts this long after
# the last OpenBLAS one that used them (OpenBLAS runs m*n*k up to 2^18 on the calling
# thread; were it wrong, the own GEMM would measure slower: a choice of OpenBLAS, not worse)
SETTLE = 0.15
BLAS_SERIAL_WORK = 1 << 18
BLOCK_FLOPS = 40e6  # work per timed block (0.2 ms at 200 GFLOP/s; a large GEMM: one call)
REPEAT = 5  # blocks per measurement, of which the fastest counts: interference only slows
BUDGET = 0.03  # s per engine and point in a compile: two blocks, then more while under it
_last_blas = -math.inf  # time.monotonic() at the end of the last threaded OpenBLAS one


class GemmBench:
    """C = A B for the operands `a`, `b` (2-D float32 arrays, any element strides the
    engines take) by each of `engines` ("own", "blas"), compiled alone into one module;
    `run(engine, reps)` computes it `reps` times in one native call, into `c`."""

    def __init__(self, a: np.ndarray, b: np.ndarray, isa: Isa, threads: int,
                 engines: tuple[str, ...] = ("own", "blas")):
        (m, k), n = a.shape, b.shape[1]
        sa, sb = (tuple(s // 4 for s in x.strides) for x in (a, b))
        p = self.p = GemmProblem(m, n, k, sa[0], sa[1], sb[0], sb[1], n, "f32")
        self.a, self.b = a, b
        self.c = np.zeros((m, n), np.float32)
        self.scratch = raw_bytes(max(plan_own(p, isa, threads).scratch, 64))
        mod = ir.Module(name="gemm_bench")
        for engine in engines:
            _entry(mod, p, engine, isa, threads)
        self._jit = JitModule(mod, name="gemm_bench")
        args = [ctypes.c_void_p] * 4 + [ctypes.c_int64]
        self._fns = {e: self._jit.function(f"bench_{e}", None, *args) for e in engines}

    def run(self, engine: str, reps: int = 1) -> None:
        self._fns[engine](self.a.ctypes.data, self.b.ctypes.data, self.c.ctypes.data,
                          self.scratch.ctypes.data, reps)


def _entry(mod: ir.Module, p: GemmProblem, engine: str, isa: Isa, threads: int) -> None:
    """`engine(a, b, c, scratch, reps)`: C = A B `reps` times."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR] * 4 + [I64]), f"bench_{engine}")
    bld = ir.IRBuilder(fn.append_basic_block("entry"))
    pa, pb, pc, scr, reps = fn.args

    def gemm(_):
        if engine == "own":
            emit_own(bld, p, pa, pb, pc, scr, isa, threads, "bench")
            return
        ta, lda = B.layout(p.m, p.k, p.sa_m, p.sa_k)
        tb, ldb = B.layout(p.k, p.n, p.sb_k, p.sb_n)
        B.call_gemm(bld, "f32", ta, tb, p.m, p.n, p.k, pa, lda, pb, ldb, pc, p.ldc)

    for_range(bld, i64(0), reps, gemm, "rep")
    bld.ret_void()


def _operands(m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)


def _gflops(bench: GemmBench, engine: str, repeat: int, budget: float = BUDGET) -> float:
    """The fastest of up to `repeat` timed blocks (at least two, then until `budget`
    seconds are spent) after one untimed (page faults, threads waking up); an own measurement first
    waits for OpenBLAS's threads to sleep."""
    global _last_blas
    reps = max(1, int(BLOCK_FLOPS // bench.p.flops))
    if engine == "own":
        time.sleep(max(0.0, _last_blas + SETTLE - time.monotonic()))
    start = time.perf_counter()
    bench.run(engine, reps)
    best = math.inf
    for i in range(repeat):
        t = time.perf_counter()
        bench.run(engine, reps)
        best = min(best, time.perf_counter() - t)
        if i >= 1 and time.perf_counter() - start > budget:
            break
    if engine == "blas" and bench.p.m * bench.p.n * bench.p.k > BLAS_SERIAL_WORK:
        _last_blas = time.monotonic()
    return bench.p.flops * reps / best / 1e9


def measure(m: int, n: int, k: int, engine: str, repeat: int = REPEAT,
            isa: Isa | None = None, threads: int | None = None) -> float:
    """GFLOP/s of one m x k @ k x n f32 GEMM by `engine`."""
    bench = GemmBench(*_operands(m, n, k), isa or host_isa(), threads or num_threads(),
                      (engine,))
    return _gflops(bench, engine, repeat)


def measure_point(point: Point, isa: Isa, threads: int, repeat: int = REPEAT,
                  budget: float = BUDGET) -> tuple[float, float]:
    """(own, blas) GFLOP/s at grid point (m, n, k), rounded as stored: one compile for
    both, own first, so that only a change of point waits for OpenBLAS's threads."""
    bench = GemmBench(*_operands(*point), isa, threads)
    own, bl = (_gflops(bench, engine, repeat, budget) for engine in ("own", "blas"))
    return round(own, 1), round(bl, 1)
