"""Errors every backend raises, in one leaf module: the runtime and the CLI catch them
without importing a backend (or llvmlite, or cupy)."""

from __future__ import annotations


class UnsupportedOpError(NotImplementedError):
    """The backend has no kernel for an op."""


class CodegenError(RuntimeError):
    """A backend could not generate code for a graph that verified (its message names the
    op); a bug in the backend, reported as one line rather than a traceback."""


class KernelCompileError(CodegenError):
    """The cpu backend failed to generate code for one kernel op (the message names it)."""
