"""Which GEMM runs a matmul: ember's own or OpenBLAS, from speeds measured on this CPU.

A table lists, for problem sizes (m, n, k) on a log grid (GRID), the GFLOP/s of both
engines on one CPU model with one thread count; a problem takes the engine that was faster
at the nearest grid point (log distance), the own one unless OpenBLAS is MARGIN faster.
The table is the file in the cache directory for this CPU name and thread count (`python
-m ember.backends.cpu.gemm.tune` measures the whole grid), else DEFAULT_TABLE on the CPU and
thread count it was measured on (DEFAULT_HOST), else empty: speeds measured on one CPU say
little about another (on an Emerald Rapids VM DEFAULT_TABLE picked the own GEMM for 1024^3
at 0.72x OpenBLAS). A grid point the table lacks is measured when a compile first needs it
(`gemm_timing.measure_point`: both engines' GEMMs compiled alone, a fraction of a second)
and added to the file, so later compiles and processes reuse it. `EMBER_GEMM_TUNE=0` turns
measuring off; a point neither stored nor measured follows `rule`. The file is JSON,
{"MxNxK": [own, blas]}; a measured point is merged into it under a lock file and the file
replaced atomically, so concurrent processes neither tear it nor lose each other's points
(and one waits while another measures instead of disturbing it).

The compile cache keys code by this table (cache.options), and the code's scratch layout
depends on each choice, so the table a compile ends with must give every choice it made:
points are only ever added, never changed, and only when a choice reads them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import threading
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from ....files import cache_dir, write_atomically
from ....settings import GEMM, GEMM_TUNE
from ..machine.host import Isa, host_cpu, num_threads
from . import blas as B
from .emit import GemmProblem
from .timing import Point, measure_point

GRID: list[Point] = [
    (64, 64, 64), (64, 128, 64), (128, 10, 64), (64, 10, 128), (128, 128, 128),
    (256, 256, 256), (128, 512, 512), (512, 512, 128), (128, 512, 784), (784, 512, 128),
    (512, 512, 512), (1024, 1024, 1024), (64, 1024, 1024)]

# (m, n, k): (own GFLOP/s, blas GFLOP/s), measured by tune.py on a 2-core znver4 (AVX-512)
# with the own GEMM's threads on the process's pool; the mean of two runs (each moves by
# up to 15% on this shared VM)
DEFAULT_TABLE: dict[Point, tuple[float, float]] = {
    (64, 64, 64): (108.0, 107.4), (64, 128, 64): (107.7, 107.3), (128, 10, 64): (64.8, 63.0),
    (64, 10, 128): (65.2, 62.2), (128, 128, 128): (206.7, 131.9),
    (256, 256, 256): (207.7, 177.8), (128, 512, 512): (183.5, 184.9),
    (512, 512, 128): (223.8, 178.5), (128, 512, 784): (193.3, 191.7),
    (784, 512, 128): (214.4, 204.0), (512, 512, 512): (194.4, 202.1),
    (1024, 1024, 1024): (198.2, 202.5), (64, 1024, 1024): (175.6, 173.8),
}
DEFAULT_HOST = ("znver4", 2)  # host_cpu() and thread count DEFAULT_TABLE was measured with
# ember's own GEMM is kept unless OpenBLAS is clearly faster (no foreign threads spinning
# between kernels, the same code everywhere)
MARGIN = 1.05
# without a measurement, problems up to this m*n*k keep the own GEMM (OpenBLAS's per-call
# overhead and thread hand-off are a large part of them), larger ones take OpenBLAS
RULE_OWN_WORK = 64 * 64 * 64

_lock = threading.Lock()  # one measurement at a time in this process (they would compete)
_failed: set[tuple[str, int]] = set()  # tables that could not be measured or stored


def table_path(cpu: str, threads: int) -> Path:
    return cache_dir() / f"gemm-table-{cpu}-{threads}t.json"


def read_table(path: Path) -> dict[Point, tuple[float, float]]:
    """The table in `path`; FileNotFoundError, or ValueError (OSError) when damaged."""
    return parse_table(json.loads(path.read_text(), parse_int=float))


def parse_table(raw: object) -> dict[Point, tuple[float, float]]:
    """{"MxNxK": [own, blas], ...} as {(m, n, k): (own, blas)}; ValueError for anything
    else."""
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


def _is_speed(v: object) -> bool:
    return isinstance(v, float) and math.isfinite(v) and v > 0  # ints are read as floats


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the lock file beside `path` (other processes wait)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def stored(path: Path) -> dict[Point, tuple[float, float]]:
    """What `path` holds; empty when absent or damaged (the next write replaces it)."""
    try:
        return read_table(path)
    except (OSError, ValueError, RecursionError):
        return {}


def write_table(path: Path, table: dict[Point, tuple[float, float]]) -> None:
    text = json.dumps({"x".join(map(str, p)): list(v) for p, v in sorted(table.items())},
                      indent=1)
    write_atomically(str(path), text.encode())


@functools.cache
def load_table(cpu: str, threads: int) -> dict[Point, tuple[float, float]]:
    """The stored table for `cpu` with `threads`, else DEFAULT_TABLE where it was measured,
    else an empty one that `choose` fills. The table only chooses between two correct GEMMs,
    so a damaged file is ignored with a warning (and replaced once a point is measured)."""
    fallback = DEFAULT_TABLE if (cpu, threads) == DEFAULT_HOST else {}
    path = table_path(cpu, threads)
    try:
        return read_table(path)
    except FileNotFoundError:
        return fallback
    except (OSError, ValueError, RecursionError) as e:
        warnings.warn(f"ignoring the damaged GEMM table {path} ({e}); the grid points a "
                      "compile needs are measured again", stacklevel=2)
        return fallback


def nearest(size: Point, points: Iterable[Point]) -> Point:
    """The point closest to `size` in log distance."""
    return min(points, key=lambda g: sum((math.log2(a) - math.log2(b)) ** 2
                                         for a, b in zip(g, size)))


def tuning() -> bool:
    """Whether a missing grid point is measured (off under EMBER_GEMM_TUNE=0)."""
    return GEMM_TUNE.get()


def rule(p: GemmProblem) -> str:
    """The engine without a measurement: OpenBLAS unless the problem is small. A matmul's
    epilogue is its own loop after either engine, so it plays no part."""
    return "own" if p.m * p.n * p.k <= RULE_OWN_WORK else "blas"


def choose(p: GemmProblem, isa: Isa, threads: int) -> str:
    """"blas" or "own" for GemmProblem `p` on `threads` threads. Fewer than the pool's (a
    convolution's GEMM per image) take the own GEMM: OpenBLAS cannot be held to them, so it
    would start its threads on the cores the pool uses, and they spin 0.1 s after the call,
    taking a core from every parallel kernel that follows (ViT's patch embedding, one
    OpenBLAS call per forward, left every kernel after it on one core)."""
    engine = GEMM.get()
    if B.find() is None or engine == "own":
        return "own"
    if engine == "blas":
        return "blas"
    if threads < num_threads():
        return "own"
    cpu = host_cpu()
    table = load_table(cpu, threads)
    point = nearest((max(p.m, 1), max(p.n, 1), max(p.k, 1)), dict.fromkeys([*GRID, *table]))
    speeds = table.get(point) or _measured(cpu, threads, point, isa, table)
    if speeds is None:
        return rule(p)
    own, blas = speeds
    return "own" if own * MARGIN >= blas else "blas"


def _measured(cpu: str, threads: int, point: Point, isa: Isa,
              table: dict[Point, tuple[float, float]]) -> tuple[float, float] | None:
    """`point`'s speeds, measured now (unless another process stored them meanwhile),
    stored, and added to `table`; None when measuring is off or fails (then a warning,
    and no more tries in this process)."""
    if not tuning() or (cpu, threads) in _failed:
        return None
    with _lock:
        if point in table:  # another thread measured it meanwhile
            return table[point]
        path = table_path(cpu, threads)
        try:
            with locked(path):
                on_disk = stored(path)
                if point not in on_disk:
                    on_disk[point] = measure_point(point, isa, threads)
                    write_table(path, on_disk)
        except (OSError, RuntimeError, MemoryError) as e:
            _failed.add((cpu, threads))
            warnings.warn(f"could not measure the GEMM engines into {path} ({e}); "
                          "choosing by size instead", stacklevel=3)
            return None
        table[point] = on_disk[point]
        return table[point]
