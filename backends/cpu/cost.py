"""Which GEMM runs a matmul: ember's own or OpenBLAS, from a table of measured speeds.

The table lists, for problem sizes (m, n, k) on a log grid, the measured GFLOP/s of both
engines with this machine's thread count; a problem takes the engine that was faster at
the nearest grid point (log distance). `python -m ember.backends.cpu.tune` measures the
table for this machine and stores it (keyed by CPU name and thread count) in the cache
directory; without one, the table below (measured on a 2-core AVX-512 EPYC) is used.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

from . import blas as B

# (m, n, k): (own GFLOP/s, blas GFLOP/s), measured by tune.py on a 2-core znver4 (AVX-512)
# with the own GEMM's threads on the process's pool; the mean of two runs (each moves by
# up to 15% on this shared VM)
DEFAULT_TABLE: dict[tuple[int, int, int], tuple[float, float]] = {
    (64, 64, 64): (108.0, 107.4), (64, 128, 64): (107.7, 107.3), (128, 10, 64): (64.8, 63.0),
    (64, 10, 128): (65.2, 62.2), (128, 128, 128): (206.7, 131.9),
    (256, 256, 256): (207.7, 177.8), (128, 512, 512): (183.5, 184.9),
    (512, 512, 128): (223.8, 178.5), (128, 512, 784): (193.3, 191.7),
    (784, 512, 128): (214.4, 204.0), (512, 512, 512): (194.4, 202.1),
    (1024, 1024, 1024): (198.2, 202.5), (64, 1024, 1024): (175.6, 173.8),
}
# ember's own GEMM is kept unless OpenBLAS is clearly faster (no foreign threads spinning
# between kernels, the same code everywhere)
MARGIN = 1.05


def cache_dir() -> Path:
    d = os.environ.get("EMBER_CACHE_DIR")
    if d:
        return Path(d)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ember"


def table_path(cpu: str, threads: int) -> Path:
    return cache_dir() / f"gemm-table-{cpu}-{threads}t.json"


@functools.cache
def load_table(cpu: str, threads: int) -> dict:
    path = table_path(cpu, threads)
    try:
        raw = json.loads(path.read_text())
        return {tuple(map(int, k.split("x"))): tuple(v) for k, v in raw.items()}
    except (OSError, ValueError):
        return DEFAULT_TABLE


def choose(p, isa, threads: int) -> str:
    """"blas" or "own" for GemmProblem `p`."""
    if B.find() is None or os.environ.get("EMBER_GEMM") == "own":
        return "own"
    if os.environ.get("EMBER_GEMM") == "blas":
        return "blas"
    from .jit import host_cpu  # noqa: PLC0415

    table = load_table(host_cpu(), threads)
    size = (max(p.m, 1), max(p.n, 1), max(p.k, 1))
    best = min(table, key=lambda g: sum((math.log2(a) - math.log2(b)) ** 2
                                        for a, b in zip(g, size)))
    own, blas = table[best]
    return "own" if own * MARGIN >= blas else "blas"
