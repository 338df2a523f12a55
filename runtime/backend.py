"""Chooses a backend by name; each backend module has `compile(graph) -> Executable`.

Results may be device arrays (the cuda backend returns cupy arrays); `to_host` brings
one to numpy, and is the identity on numpy arrays.
"""

from __future__ import annotations

import importlib

import ml_dtypes
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
    """A numpy array of `a` (a device array is copied back; numpy arrays pass through).
    A device array of uint16 holds bf16 bits (cupy has no bfloat16, ember no uint16):
    its host copy is ml_dtypes' bfloat16."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)
    if not callable(get):
        return np.asarray(a)
    host = get()
    return host.view(ml_dtypes.bfloat16) if host.dtype == np.uint16 else host
