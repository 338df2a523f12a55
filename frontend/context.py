"""The active trace, kept apart so `Param` and `Module` can find it without importing the tracer."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

_ACTIVE: ContextVar[Any] = ContextVar("ember_trace", default=None)


def active():
    """The trace being recorded, or None outside `em.trace`."""
    return _ACTIVE.get()


def current():
    """The trace being recorded; an error outside `em.trace`."""
    t = _ACTIVE.get()
    if t is None:
        raise RuntimeError("ember tensors exist only while tracing: call the model through "
                           "em.trace(model, spec) or em.compile(...), not directly")
    return t


def lift(x):
    """x (a Tensor, Param, array or scalar) as a Tensor of the trace being recorded."""
    return current().lift(x)


def enter(trace):
    return _ACTIVE.set(trace)


def leave(token) -> None:
    _ACTIVE.reset(token)
