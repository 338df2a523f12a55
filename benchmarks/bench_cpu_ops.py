"""Times the cpu backend against numpy on three kernels: add, a reduction, a matmul.

Run: `python benchmarks/bench_cpu_ops.py`. "call" is the whole Executable call (input
checks, native run, a fresh output array); "kernel" is the native entry point alone on
preallocated buffers. Ratio = ember time / numpy time (below 1 is faster than numpy).
numpy's matmul runs OpenBLAS (multithreaded, and throttled on machines that set
OPENBLAS_CORETYPE); ember's is a single-threaded loop nest until a later fast-GEMM pass.
"""

from __future__ import annotations

import os
import time
import timeit

import numpy as np

from ember.backends import cpu
from ember.ir import Builder, Graph, TensorType


def build(arg_shapes, op, **attrs) -> Graph:
    g = Graph("bench", [TensorType(s, "f32") for s in arg_shapes])
    b = Builder(g.body)
    b.create("func.return", [b.op(op, *g.args, **attrs)])
    return g


def best(fn, number: int) -> float:
    """Best of 7 repeats, seconds per call."""
    return min(timeit.repeat(fn, number=number, repeat=7)) / number


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    tuned = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")}
    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')} "
                     f"threads={i['num_threads']}" for i in blas) + f" env={tuned}"


def run_case(rng, name, g, number, ref, work, unit) -> None:
    inputs = [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.args]
    t0 = time.perf_counter()
    exe = cpu.compile(g)
    t_compile = time.perf_counter() - t0
    np.testing.assert_allclose(exe(inputs)[0], ref(*inputs), rtol=1e-3, atol=1e-3)
    t_np = best(lambda: ref(*inputs), number)
    t_call = best(lambda: exe(inputs), number)
    exe(inputs)  # binds the input pointers; the bare entry then reruns on the same buffers
    ptrs, keep = exe._ptrs, []
    for i, s in enumerate(exe.slots):  # a returned result gets its own buffer per call
        if exe._arrays[i] is None and s.kind == "temp":
            keep.append(np.empty(s.type.shape, np.float32))
            ptrs[i] = keep[-1].ctypes.data
    t_kern = best(lambda: exe._entry(ptrs), number)
    rate = work / 1e9
    print(f"{name:22s} {t_compile * 1e3:6.1f}ms {t_np * 1e6:8.1f}us {t_call * 1e6:8.1f}us "
          f"{t_kern * 1e6:8.1f}us {t_call / t_np:8.2f} {t_kern / t_np:8.2f}  "
          f"{rate / t_kern:7.1f} vs {rate / t_np:7.1f} {unit}")


def main() -> None:
    rng = np.random.default_rng(0)
    n = 1 << 20
    cases = [
        ("add 1M f32", build([(n,), (n,)], "ember.add"), 200, lambda x, y: np.add(x, y),
         3 * 4 * n, "GB/s"),
        ("sum rows 1024x1024", build([(1024, 1024)], "ember.reduce_sum", axes=[1],
                                     keepdims=False), 200, lambda x: x.sum(axis=1),
         4 * n, "GB/s"),
        ("sum cols 1024x1024", build([(1024, 1024)], "ember.reduce_sum", axes=[0],
                                     keepdims=False), 200, lambda x: x.sum(axis=0),
         4 * n, "GB/s"),
        ("matmul 256^3", build([(256, 256), (256, 256)], "ember.matmul"), 50,
         lambda x, y: x @ y, 2 * 256**3, "GFLOP/s"),
    ]
    print(f"numpy {np.__version__}; BLAS: {blas_info()}")
    print(f"{'case':22s} {'compile':>8s} {'numpy':>10s} {'call':>10s} {'kernel':>10s} "
          f"{'call/np':>8s} {'kern/np':>8s}  throughput (kernel, numpy)")
    for case in cases:
        run_case(rng, *case)

if __name__ == "__main__":
    main()
