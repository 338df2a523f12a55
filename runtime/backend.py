"""Chooses a backend by name; each backend module has `compile(graph) -> Executable`."""

from __future__ import annotations

import importlib

BACKENDS = ("interpreter", "cpu", "cuda")


class BackendUnavailableError(RuntimeError):
    """The backend cannot run on this machine; the message says why."""


def get_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "cuda":
        try:
            import cupy  # noqa: F401
        except ImportError:
            raise BackendUnavailableError(
                "backend 'cuda' needs cupy: pip install 'ember[gpu]'") from None
        raise BackendUnavailableError("backend 'cuda' is not built yet in this version of ember")
    return importlib.import_module(f"ember.backends.{name}")
