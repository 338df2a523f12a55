"""The CPU backend: graphs of core `ember.*` ops compiled to native code with llvmlite.

`compile(graph)` returns an Executable with the interpreter's interface:
`exe(inputs, params) -> list of arrays`, params keyed by the `ember.param` op's `id`.
nn.* ops must be decomposed first (UnsupportedOpError at compile time otherwise).
"""

from __future__ import annotations

from ...ir import Graph
from ..interpreter import UnsupportedOpError
from .codegen import lower
from .executable import Executable


def compile(graph: Graph) -> Executable:  # noqa: A001  (the backend interface's name)
    return Executable(graph)


def emit_llvm(graph: Graph) -> str:
    """The LLVM IR the backend generates for `graph`, before optimization."""
    return str(lower(graph).module)


__all__ = ["Executable", "UnsupportedOpError", "compile", "emit_llvm"]
