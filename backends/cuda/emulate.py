"""Runs the CUDA backend's Program on the CPU, for testing without a GPU.

The generated translation unit is compiled as C++ by g++ against a small header that
defines CUDA's built-ins; every block of a launch runs its threads as cooperative fibers
(ucontext), so `__syncthreads()` and `__shfl_down_sync` behave as on a GPU (a warp is 32
consecutive threads; a shuffle reads another lane's value at the moment every lane of the
warp has reached it). Kernels without barriers run their threads one after another with
no fibers. GEMMs run through numpy on the same strided views cuBLAS would get. So the
emulator checks the kernels' indexing, reductions, barriers and the host-side plan
(slots, views, arena offsets, in-place epilogues) against the interpreter; what it
cannot check is the GPU's timing, its memory model under real concurrency, and cupy.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ...ir import Graph, numpy_dtype, verify
from ...settings import EMU_CACHE
from .. import collectives
from . import launch as L
from .codegen import lower
from .cublas import OP_N
from .program import Gemm, GemmEx, HostAllReduce, Launch, Matrix, Memset, Program, View

HEADER = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>
#include <vector>

struct dim3 { unsigned int x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct EmuFiber {
  ucontext_t ctx;
  dim3 tid;
  int linear, state;  // 0 runnable, 1 at __syncthreads, 2 at a shuffle, 3 done
  int shfl_d;
  unsigned char shfl_in[8], shfl_out[8];
};

alignas(16) unsigned char ember_smem[1 << 16];
static dim3 blockIdx, blockDim, gridDim;
static EmuFiber* emu_cur;
static EmuFiber emu_seq;  // the one "fiber" of a kernel run without barriers
static ucontext_t emu_sched;
#define threadIdx (emu_cur->tid)

static void emu_yield(int state) {
  emu_cur->state = state;
  swapcontext(&emu_cur->ctx, &emu_sched);
}
static inline void __syncthreads() {
  if (emu_cur == &emu_seq) {
    std::fprintf(stderr, "emu: barrier in a sequential kernel\n");
    std::abort();
  }
  emu_yield(1);
}
template <typename T> static T __shfl_down_sync(unsigned int, T v, int d) {
  if (emu_cur == &emu_seq) {
    std::fprintf(stderr, "emu: shuffle in a sequential kernel\n");
    std::abort();
  }
  std::memcpy(emu_cur->shfl_in, &v, sizeof(T));
  emu_cur->shfl_d = d;
  emu_yield(2);
  T out;
  std::memcpy(&out, emu_cur->shfl_out, sizeof(T));
  return out;
}
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) {
  unsigned int i; std::memcpy(&i, &f, 4); return i;
}
static inline double __longlong_as_double(long long i) {
  double f; std::memcpy(&f, &i, 8); return f;
}
template <typename T> static T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
"""

RUNNER = r"""
#include <utility>
// kernel(a[0], a[1], ...) with each void* cast to the kernel's own parameter type
template <typename... P, size_t... I>
static void emu_invoke(void (*f)(P...), void** a, std::index_sequence<I...>) {
  f(static_cast<P>(a[I])...);
}
template <typename... P> static void emu_invoke(void (*f)(P...), void** a) {
  emu_invoke(f, a, std::index_sequence_for<P...>{});
}
typedef void (*emu_tramp)(void**);
static emu_tramp emu_fn;
static void** emu_args;
static void emu_call() { emu_fn(emu_args); }
static void emu_entry() { emu_call(); emu_cur->state = 3; }

static const size_t EMU_STACK = 1 << 16;
static std::vector<EmuFiber> emu_fibers;
static std::vector<char> emu_stacks;

extern "C" int emu_launch(void* fn, void** args, unsigned gx, unsigned gy, unsigned gz,
                          unsigned bx, unsigned by, unsigned bz, int sequential) {
  emu_fn = (emu_tramp)fn; emu_args = args;
  gridDim = {gx, gy, gz}; blockDim = {bx, by, bz};
  int n = (int)(bx * by * bz);
  if (!sequential && (int)emu_fibers.size() < n) {
    emu_fibers.resize(n);
    emu_stacks.resize((size_t)n * EMU_STACK);
  }
  for (unsigned z = 0; z < gz; ++z)
  for (unsigned y = 0; y < gy; ++y)
  for (unsigned x = 0; x < gx; ++x) {
    blockIdx = {x, y, z};
    if (sequential) {
      emu_cur = &emu_seq;
      for (int t = 0; t < n; ++t) {
        emu_seq.tid = {t % bx, (t / bx) % by, t / (bx * by)};
        emu_call();
      }
      continue;
    }
    for (int t = 0; t < n; ++t) {
      EmuFiber& f = emu_fibers[t];
      f.tid = {t % bx, (t / bx) % by, t / (bx * by)};
      f.linear = t; f.state = 0;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = &emu_stacks[(size_t)t * EMU_STACK];
      f.ctx.uc_stack.ss_size = EMU_STACK;
      f.ctx.uc_link = &emu_sched;
      makecontext(&f.ctx, emu_entry, 0);
    }
    for (;;) {
      bool ran = false;
      for (int t = 0; t < n; ++t) {
        if (emu_fibers[t].state != 0) continue;
        emu_cur = &emu_fibers[t];
        swapcontext(&emu_sched, &emu_cur->ctx);
        ran = true;
      }
      if (ran) continue;
      int done = 0, at_block = 0;
      for (int t = 0; t < n; ++t) {
        done += emu_fibers[t].state == 3;
        at_block += emu_fibers[t].state == 1;
      }
      if (done == n) break;
      bool released = false;
      for (int w = 0; w * 32 < n; ++w) {  // a warp whose live lanes all reached a shuffle
        int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n, waiting = 0, live = 0;
        for (int t = lo; t < hi; ++t) {
          live += emu_fibers[t].state != 3;
          waiting += emu_fibers[t].state == 2;
        }
        if (waiting == 0 || waiting != live) continue;
        for (int t = lo; t < hi; ++t) {
          EmuFiber& f = emu_fibers[t];
          int src = t + f.shfl_d;
          std::memcpy(f.shfl_out, (src < hi ? emu_fibers[src] : f).shfl_in, 8);
        }
        for (int t = lo; t < hi; ++t) emu_fibers[t].state = 0;
        released = true;
      }
      if (released) continue;
      if (at_block + done == n && at_block > 0) {
        if (done) {
          std::fprintf(stderr, "emu: __syncthreads after some threads exited\n");
          return 1;
        }
        for (int t = 0; t < n; ++t) emu_fibers[t].state = 0;
        continue;
      }
      std::fprintf(stderr, "emu: deadlock in block (%u,%u,%u)\n", x, y, z);
      return 1;
    }
  }
  return 0;
}
"""


def available() -> bool:
    return shutil.which("g++") is not None


def _cache_dir() -> Path:
    d = EMU_CACHE.get() or Path(tempfile.gettempdir()) / "ember-cuda-emu"
    d.mkdir(parents=True, exist_ok=True)
    return d


def build(source: str) -> ctypes.CDLL:
    """The TU compiled for the CPU (cached by source hash)."""
    names = re.findall(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(', source)
    tramps = "".join(f'extern "C" void emu_{n}(void** a) {{ emu_invoke({n}, a); }}\n'
                     for n in names)
    text = HEADER + "\n#line 1 \"kernels.cu\"\n" + source + "\n" + RUNNER + tramps
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    lib = _cache_dir() / f"emu-{digest}.so"
    if not lib.exists():
        src = lib.with_suffix(".cpp")
        src.write_text(text)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        r = subprocess.run(["g++", "-O1", "-std=c++17", "-shared", "-fPIC", "-w", "-o", str(tmp),
                            str(src)], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed on the emulated TU:\n{r.stderr[-4000:]}")
        os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


def aligned_empty(shape, dtype, align: int = L.ALIGN) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.zeros(n + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + n].view(dt).reshape(shape)


class EmulatedExecutable:
    """The cuda Executable's interface, on the CPU: `exe(inputs, params)` -> numpy arrays.
    `sm_count` shapes the launch plan (a small one keeps grids small here)."""

    def __init__(self, graph: Graph, sm_count: int = 2):
        self.graph = verify(graph)
        self.program: Program = lower(graph, sm_count)
        self.lib = build(self.program.source)
        self.lib.emu_launch.restype = ctypes.c_int
        self._fns = {k.name: ctypes.cast(getattr(self.lib, f"emu_{k.name}"),
                                         ctypes.c_void_p).value for k in self.program.kernels}
        lines = self.program.source.splitlines()
        self._barriers = {k.name: any(("__syncthreads" in s or "shfl_down(" in s)
                                      for s in lines[k.first_line - 1:k.last_line])
                          for k in self.program.kernels}

    def __call__(self, inputs: Sequence, params: Mapping | None = None) -> list[np.ndarray]:
        p, params = self.program, params or {}
        arrays = []
        arena = aligned_empty((max(p.arena_bytes, 1),), np.uint8)
        arena[...] = 0xA5  # garbage, as uninitialized device memory
        for s in p.slots:
            dt = numpy_dtype(s.type.dtype)
            if s.kind in ("arg", "param"):
                x = inputs[s.key] if s.kind == "arg" else params[s.key]
                a = aligned_empty(s.type.shape, dt)
                a[...] = np.asarray(x, dtype=dt).reshape(s.type.shape)
            elif s.kind == "const":
                a = aligned_empty(s.type.shape, dt)
                a[...] = s.value
            elif s.offset is not None:
                a = arena[s.offset:s.offset + s.type.nbytes].view(dt).reshape(s.type.shape)
            else:  # a returned result: fresh
                a = aligned_empty(s.type.shape, dt)
                a.reshape(-1).view(np.uint8)[...] = 0xA5
            arrays.append(a)
        for step in p.steps:
            if isinstance(step, Launch):
                c = step.config
                ptrs = (ctypes.c_void_p * max(len(step.args), 1))(
                    *[arrays[i].ctypes.data for i in step.args])
                if c.shared > 1 << 16:
                    raise RuntimeError(f"{step.kernel}: {c.shared} bytes of shared memory")
                rc = self.lib.emu_launch(ctypes.c_void_p(self._fns[step.kernel]), ptrs,
                                         *c.grid, *c.block,
                                         0 if self._barriers[step.kernel] else 1)
                if rc:
                    raise RuntimeError(f"emulated launch of {step.kernel} failed")
            elif isinstance(step, Gemm) and step.ex is not None:
                _gemm_ex(step.ex, arrays)
            elif isinstance(step, Gemm):
                out = _view(arrays, step.out, writeable=True)
                out[...] = np.matmul(_view(arrays, step.a), _view(arrays, step.b))
            elif isinstance(step, Memset):
                arrays[step.slot][...] = 0
            elif isinstance(step, HostAllReduce):
                arrays[step.out][...] = arrays[step.src]
                collectives.allreduce_(arrays[step.out])
        out, seen = [], set()
        for i, t in p.outputs:
            a = arrays[i].reshape(t.shape)
            out.append(a.copy() if i in seen else a)
            seen.add(i)
        return out


def _gemm_ex(call: GemmEx, arrays) -> None:
    """cublasGemmStridedBatchedEx on its own column-major terms (not the row-major views
    the call was planned from): products of bf16/f16 values, summed in f32."""
    def matrix(mx: Matrix, rows: int, cols: int, writeable: bool = False) -> np.ndarray:
        shape = (rows, cols) if mx.op == OP_N else (cols, rows)  # as stored
        m = _view(arrays, View(mx.slot, (call.batch, *shape), (mx.stride, 1, mx.ld)),
                  writeable)
        return m if mx.op == OP_N else m.transpose(0, 2, 1)

    a = matrix(call.a, call.m, call.k).astype(np.float32)
    b = matrix(call.b, call.k, call.n).astype(np.float32)
    with np.errstate(all="ignore"):  # inf and NaN as the GPU makes them, silently
        matrix(call.c, call.m, call.n, writeable=True)[...] = a @ b


def _view(arrays, v, writeable=False) -> np.ndarray:
    a = arrays[v.slot].reshape(-1)
    return np.lib.stride_tricks.as_strided(a, v.shape, tuple(s * a.itemsize for s in v.strides),
                                           writeable=writeable)
