"""A step's kernels as a Chrome trace (`chrome://tracing`, https://ui.perfetto.dev): one
complete event ("ph": "X") per kernel, laid end to end in the order the native code runs
them, each as long as its median time (`Executable.profile`). The times are medians of
separate runs, so the trace shows where a typical step's time goes, not one run."""

from __future__ import annotations

import json

from ..files import write_atomically


def chrome_trace(kernels: list[tuple[str, float]], process: str) -> dict:
    """The trace of (kernel name, seconds) pairs; `ts` and `dur` in microseconds."""
    events, now = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                    "args": {"name": process}}], 0.0
    for i, (name, seconds) in enumerate(kernels):
        dur = seconds * 1e6
        events.append({"name": name, "cat": name.rsplit("_", 1)[-1], "ph": "X", "ts": now,
                       "dur": dur, "pid": 0, "tid": 0, "args": {"index": i}})
        now += dur
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str, kernels: list[tuple[str, float]], process: str) -> str:
    """Write the trace as JSON, atomically; returns `path`."""
    write_atomically(path, json.dumps(chrome_trace(kernels, process), indent=1).encode())
    return path
