"""Errors every backend raises, in one leaf module: the runtime and the CLI catch them
without importing a backend (or llvmlite, or cupy)."""

from __future__ import annotations


class UnsupportedOpError(NotImplementedError):
    """The backend has no kernel for an op."""


class UnsupportedFusionError(UnsupportedOpError):
    """The backend has no kernel for one fused form (`fuse_option` names the `fuse` pass's
    option that made it, e.g. "attention") but runs the ops it was fused from: the runtime
    compiles once more with that fusion off."""

    def __init__(self, message: str, fuse_option: str):
        super().__init__(message)
        self.fuse_option = fuse_option


class CodegenError(RuntimeError):
    """A backend could not generate code for a graph that verified (its message names the
    op); a bug in the backend, reported as one line rather than a traceback."""


class KernelCompileError(CodegenError):
    """The cpu backend failed to generate code for one kernel op (the message names it)."""
