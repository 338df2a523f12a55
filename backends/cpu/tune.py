"""Measure the GEMM cost table for this machine: `python -m ember.backends.cpu.tune`.

For each grid shape (m, n, k), times ember's own GEMM and OpenBLAS (each inside a
compiled one-op graph, median of repetitions) and writes {shape: (own, blas) GFLOP/s} to
the cache directory, where `cost.choose` picks it up (keyed by CPU name and threads).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

from ...files import write_atomically
from ...ir import Builder, Graph, TensorType
from . import blas
from .cost import table_path
from .executable import Executable
from .host import host_cpu, num_threads

GRID = [(64, 64, 64), (64, 128, 64), (128, 10, 64), (64, 10, 128), (128, 128, 128),
        (256, 256, 256), (128, 512, 512), (512, 512, 128), (128, 512, 784),
        (784, 512, 128), (512, 512, 512), (1024, 1024, 1024), (64, 1024, 1024)]


# OpenBLAS's threads spin for tens of milliseconds after a call, and would take a core from
# the next measurement's own threads: each measurement waits for them to sleep first
SETTLE = 0.2


def measure(m: int, n: int, k: int, engine: str, repeat: int = 7) -> float:
    """GFLOP/s of one m x k @ k x n f32 matmul: an unfused `ember.matmul`, which the backend
    lowers to the GEMM (`matmul.as_kernel`) exactly as it would the fused op."""
    g = Graph("tune", [TensorType((m, k), "f32"), TensorType((k, n), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.matmul", *g.args)])
    old = os.environ.get("EMBER_GEMM")
    os.environ["EMBER_GEMM"] = engine
    try:
        exe = Executable(g, use_cache=False)
    finally:
        os.environ.pop("EMBER_GEMM") if old is None else os.environ.__setitem__("EMBER_GEMM", old)
    rng = np.random.default_rng(0)
    a, bb = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    run = exe.bound([a, bb])
    number = max(1, int(2e8 / (2 * m * n * k)))
    time.sleep(SETTLE)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            run()
        times.append((time.perf_counter() - t) / number)
    return 2 * m * n * k / statistics.median(times) / 1e9


def main() -> None:
    if blas.find() is None:
        sys.exit("no OpenBLAS found: every GEMM is ember's own, nothing to tune")
    table = {}
    for m, n, k in GRID:
        own, bl = measure(m, n, k, "own"), measure(m, n, k, "blas")
        table[f"{m}x{n}x{k}"] = (round(own, 1), round(bl, 1))
        print(f"{m:5d} x {n:5d} x {k:5d}: own {own:7.1f}  blas {bl:7.1f} GFLOP/s "
              f"-> {'own' if own >= bl else 'blas'}", flush=True)
    path = table_path(host_cpu(), num_threads())
    write_atomically(str(path), json.dumps(table, indent=1).encode())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
