"""Timing an Executable (executable.py): its native call alone, its buffers bound once
(`bound`, what benchmarks and the GEMM tuner time); each kernel inside one native call,
read from the CPU's cycle counter (`profile`, `kernel_timer`, `KernelTimer`); and its
compile time per stage (`timing_report`, as `--pass-timing` prints it). The Executable's
methods of the same names call these."""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable

from ..codegen import PROFILED
from .buffers import aligned_empty


def timing_table(exe, inputs, params) -> tuple[ctypes.Array, list]:
    """A buffer table of `exe` bound to `inputs` and `params`, with buffers of its own for
    the returned results, for running the native code alone; the list keeps alive every
    array it points to (inputs as converted for the native code included). The result
    buffers are written once here, as a step's reused ones are: the first timed run would
    otherwise fault their pages in (a GPT-2-small step's 1 GB of new params and moments:
    its profile of 2 runs read 3.7 s for a 2.1 s step)."""
    keep = exe._run(inputs, exe._values(params))
    table = (ctypes.c_void_p * len(exe._ptrs))(*exe._ptrs)
    for i in exe._fresh:
        keep[i], table[i] = aligned_empty(exe.slots[i].type)
        keep[i].fill(0)
    return table, keep


def bound(exe, inputs, params=None) -> Callable[[], None]:
    """`exe`'s native call alone, its buffers bound once: what benchmarks and the GEMM
    tuner time."""
    table, keep = timing_table(exe, inputs, params)
    call = functools.partial(exe._entry, table)
    call.buffers, call.executable = keep, exe  # alive as long as the call
    call.results = [keep[row.slot] for row in exe._results]
    return call


def profile(exe, inputs, params=None, repeat: int = 20) -> list[tuple[str, float]]:
    """Seconds per kernel of `exe` (median of `repeat` runs), read from the CPU's cycle
    counter around each kernel inside one native call: where a step's time goes. A
    kernel's time leaves out the call around the kernels (which `bound()` times)."""
    timer = kernel_timer(exe, inputs, params)
    for _ in range(repeat):
        timer()
    return timer.seconds()


def kernel_timer(exe, inputs, params=None) -> KernelTimer:
    """`profile`'s runs one at a time, for a benchmark that interleaves them with what
    it compares them to (a machine's speed drifts between blocks of calls)."""
    table, keep = timing_table(exe, inputs, params)
    return KernelTimer(exe, table, keep)


def timing_report(exe) -> str:
    """`exe`'s compile time per stage, as `--pass-timing` prints it."""
    total = exe.timings.get("total", 0.0) or 1e-12
    lines = [f"  cpu backend compile{' (cache hit)' if exe.cached else ''}: "
             f"{total * 1e3:.1f} ms"]
    lines += [f"  {v * 1e3:9.1f} ms ({100 * v / total:5.1f}%)  {k}"
              for k, v in exe.timings.items() if k != "total"]
    return "\n".join(lines)


class KernelTimer:
    """Profiled native calls on one bound table (`__call__` runs one); `seconds()`: each
    kernel's median over the runs so far. The cycle counter's rate is measured against
    the clock between the first run's first stamp and a later one, at least `SPAN` apart
    (a calibration run, not counted, where the runs were shorter)."""

    SPAN = 0.01

    def __init__(self, exe, table, keep: list):
        # the executable and the arrays the table points to stay alive as long as this
        self._exe, self._table, self._keep = exe, table, keep
        self._fn = exe._jit.function(PROFILED, None, ctypes.c_void_p, ctypes.c_void_p)
        self._names = [st.name for st in exe.plan.steps]
        self._ticks = (ctypes.c_int64 * (len(self._names) + 1))()
        self._runs: list[list[int]] = []
        self._first: tuple[float, int] | None = None  # (clock, counter) at the first run

    def __call__(self) -> None:
        self._runs.append(self._run())

    def _run(self) -> list[int]:
        t = time.perf_counter()
        self._fn(self._table, self._ticks)
        if self._first is None:
            self._first = (t, self._ticks[0])
        return list(self._ticks)

    def seconds(self) -> list[tuple[str, float]]:
        if not self._runs:
            raise ValueError("no run timed yet")
        t0, c0 = self._first
        wait = self.SPAN - (time.perf_counter() - t0)
        if wait > 0:
            time.sleep(wait)
        t = time.perf_counter()
        c = self._run()[0]  # the same distance from the call's start as the first stamp
        rate = max(c - c0, 1) / (t - t0)  # counter ticks per second
        runs, mid = self._runs, len(self._runs) // 2
        return [(name, sorted(r[k + 1] - r[k] for r in runs)[mid] / rate)
                for k, name in enumerate(self._names)]


__all__ = ["KernelTimer", "bound", "kernel_timer", "profile", "timing_report", "timing_table"]
