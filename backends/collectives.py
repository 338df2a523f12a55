"""What `ember.allreduce` does when a compiled graph runs: the reducer the runtime installed
for the call (a data-parallel step's communicator, summing in place across ranks), else
nothing (one process: the sum over one rank is the value itself); and what
`ember.grads_ready` does: call the handler installed for the call, if any.

Backends call `allreduce_` from inside a run (the cpu backend through a native callback,
which cannot raise: it `record`s the error, which `using` raises when its block ends).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

_local = threading.local()


@contextmanager
def using(reducer: Callable[[np.ndarray], object]) -> Iterator[None]:
    """Within the block, `ember.allreduce` sums through `reducer(array)` (in place); an
    error a native callback recorded is raised at its end."""
    previous = getattr(_local, "reducer", None)
    _local.reducer, _local.error = reducer, None
    try:
        yield
    finally:
        _local.reducer = previous
    raise_pending()


def allreduce_(array: np.ndarray) -> None:
    reducer = getattr(_local, "reducer", None)
    if reducer is not None:
        reducer(array)


@contextmanager
def on_grads_ready(handler: Callable[[int], object]) -> Iterator[None]:
    """Within the block, `ember.grads_ready {bucket = k}` calls `handler(k)` (a
    data-parallel step starts reducing bucket k); elsewhere it does nothing."""
    previous = getattr(_local, "ready", None)
    _local.ready = handler
    try:
        yield
    finally:
        _local.ready = previous


def grads_ready(bucket: int) -> None:
    handler = getattr(_local, "ready", None)
    if handler is not None:
        handler(bucket)


def record(error: BaseException) -> None:
    if getattr(_local, "error", None) is None:
        _local.error = error


def raise_pending() -> None:
    """Raise the first error a native callback recorded during the last run, if any."""
    error = getattr(_local, "error", None)
    if error is not None:
        _local.error = None
        raise error
