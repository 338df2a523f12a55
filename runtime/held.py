"""What a compiled step's Python side holds, measured from the arrays themselves: the
`held_*` rows of `memory_report()`, next to the memory plan's, so that a copy the plan
does not know of (params held three times once went unseen while the plan was exact)
shows as `held_bytes` above `peak_bytes`."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def _block(a) -> object:
    """The array that owns `a`'s memory (a view's base, through any chain of views)."""
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a


def distinct_bytes(arrays: Iterable) -> int:
    """Bytes of `arrays`, each memory block once: views of one buffer (a flat arena, a
    param shared by two layers) count the buffer, whole, one time."""
    blocks = {id(b): b for b in map(_block, arrays)}
    return sum(int(getattr(b, "nbytes", 0)) for b in blocks.values())


def held(step) -> dict[str, int]:
    """`held_params` (params and buffers, host or device), `held_optimizer_state`,
    `held_gradients` (accumulation and data-parallel buffers), `held_executables` (what
    every cached executable keeps for itself: arenas, constants; the buffers it returns
    are counted where they are held: new params, state), and their sum `held_bytes`."""
    params = [a for p in step.param_table().values() for a in p.held_arrays()]
    opt = getattr(step, "optimizer", None)
    state = [a for slots in opt.state.values() for a in slots.values()] if opt else []
    acc = getattr(step, "accumulator", None)
    grads = list(acc.grads.values()) if acc is not None else []
    grads += [f.buffer for flat in getattr(step, "_flat", {}).values() for f in flat.flats]
    runs = [entry.run for entry in step._cache.values()]
    runs += [found[1] for found in getattr(step, "_updates", {}).values()]
    own = [m["total"] - m["results"] for m in (run.memory() for run in runs
                                               if hasattr(run, "memory"))]
    out = {"held_params": distinct_bytes(params),
           "held_optimizer_state": distinct_bytes(state),
           "held_gradients": distinct_bytes(grads),
           "held_executables": sum(own)}
    out["held_bytes"] = sum(out.values())
    return out


__all__ = ["distinct_bytes", "held"]
