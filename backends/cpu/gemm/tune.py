"""Measure this machine's whole GEMM table: `python -m ember.backends.cpu.gemm.tune`.

Times both engines at every grid point (cost.GRID; more and longer than a compile's
on-demand measurement) and stores them over whatever the table held, for `cost.choose`.
"""

from __future__ import annotations

import sys

from ..machine.host import host_cpu, host_isa, num_threads
from . import blas
from .cost import GRID, locked, stored, table_path, write_table
from .timing import measure_point


def main() -> None:
    if blas.find() is None:
        sys.exit("no OpenBLAS found: every GEMM is ember's own, nothing to tune")
    isa, threads = host_isa(), num_threads()
    table = {}
    for point in GRID:
        own, bl = table[point] = measure_point(point, isa, threads, repeat=9, budget=1.0)
        m, n, k = point
        print(f"{m:5d} x {n:5d} x {k:5d}: own {own:7.1f}  blas {bl:7.1f} GFLOP/s "
              f"-> {'own' if own >= bl else 'blas'}", flush=True)
    path = table_path(host_cpu(), threads)
    with locked(path):
        write_table(path, {**stored(path), **table})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
