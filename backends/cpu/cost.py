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
import warnings
from pathlib import Path

from ...files import cache_dir
from . import blas as B
from .host import host_cpu

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


def table_path(cpu: str, threads: int) -> Path:
    return cache_dir() / f"gemm-table-{cpu}-{threads}t.json"


@functools.cache
def load_table(cpu: str, threads: int) -> dict:
    """This machine's measured table, else DEFAULT_TABLE. The table only chooses between two
    correct GEMMs, so a damaged file is ignored with a warning (the tuner rewrites it)."""
    path = table_path(cpu, threads)
    try:
        return _parse_table(json.loads(path.read_text(), parse_int=float))
    except FileNotFoundError:
        return DEFAULT_TABLE
    except (OSError, ValueError, RecursionError) as e:
        warnings.warn(f"ignoring the damaged GEMM table {path} ({e}); "
                      "`python -m ember.backends.cpu.tune` measures it again", stacklevel=2)
        return DEFAULT_TABLE


def _parse_table(raw) -> dict[tuple[int, int, int], tuple[float, float]]:
    """{"MxNxK": [own, blas], ...} as DEFAULT_TABLE's type; ValueError for anything else."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError("not a non-empty JSON object")
    table = {}
    for name, speeds in raw.items():
        size = tuple(map(int, name.split("x")))
        if len(size) != 3 or min(size) < 1 or not isinstance(speeds, list) \
                or len(speeds) != 2 or not all(map(_is_speed, speeds)):
            raise ValueError(f"bad entry {name!r}: {speeds!r}")
        table[size] = tuple(speeds)
    return table


def _is_speed(v) -> bool:
    return isinstance(v, float) and math.isfinite(v) and v > 0  # ints are read as floats


def choose(p, isa, threads: int) -> str:
    """"blas" or "own" for GemmProblem `p`."""
    if B.find() is None or os.environ.get("EMBER_GEMM") == "own":
        return "own"
    if os.environ.get("EMBER_GEMM") == "blas":
        return "blas"
    table = load_table(host_cpu(), threads)
    size = (max(p.m, 1), max(p.n, 1), max(p.k, 1))
    best = min(table, key=lambda g: sum((math.log2(a) - math.log2(b)) ** 2
                                        for a, b in zip(g, size)))
    own, blas = table[best]
    return "own" if own * MARGIN >= blas else "blas"
