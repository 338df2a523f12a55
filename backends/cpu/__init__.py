"""The CPU backend: graphs of core `ember.*` ops compiled to native code with llvmlite.

`compile(graph)` returns an Executable with the interpreter's interface:
`exe(inputs, params) -> list of arrays`, params keyed by the `ember.param` op's `id`.
nn.* ops must be decomposed first (UnsupportedOpError at compile time otherwise). Core
`ember.*` ops each get a loop nest; `kernel.*` ops (the `fuse` pass) get fused loops and
GEMMs (see fused.py, matmul.py, gemm.py).
"""

from __future__ import annotations

from ...ir import Graph
from ..interpreter import UnsupportedOpError
from .codegen import lower
from .executable import Executable
from .fused import KernelCompileError


def compile(graph: Graph, threads: int | None = None) -> Executable:  # noqa: A001
    """Native code for `graph` (loaded from the compile cache when it was compiled
    before); `threads` overrides EMBER_NUM_THREADS."""
    return Executable(graph, threads)


def emit_llvm(graph: Graph) -> str:
    """The LLVM IR the backend generates for `graph`, before optimization."""
    return str(lower(graph).module)


__all__ = ["Executable", "KernelCompileError", "UnsupportedOpError", "compile", "emit_llvm"]
