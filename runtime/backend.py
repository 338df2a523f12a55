"""Chooses a backend by name; each backend module has `compile(graph) -> Executable`.

Results may be device arrays (the cuda backend returns cupy arrays); `to_host` brings
one to numpy, and is the identity on numpy arrays.
"""

from __future__ import annotations

import importlib

import numpy as np

BACKENDS = ("interpreter", "cpu", "cuda")
DEVICE_BACKENDS = ("cuda",)  # results live on a device; the runtime keeps params there


class BackendUnavailableError(RuntimeError):
    """The backend cannot run on this machine; the message says why."""


def get_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module = importlib.import_module(f"ember.backends.{name}")
    check = getattr(module, "check_available", None)
    if check is not None:  # fail here, with the reason, not at the first step
        try:
            check()
        except Exception as e:  # noqa: BLE001  (the backend's own "unavailable" error)
            raise BackendUnavailableError(str(e)) from None
    return module


def to_host(a) -> np.ndarray:
    """A numpy array of `a` (a device array is copied back; numpy arrays pass through)."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)
    return get() if callable(get) else np.asarray(a)
