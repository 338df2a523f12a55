"""The CPU backend: graphs of core `ember.*` ops compiled to native code with llvmlite.

`compile(graph)` returns an Executable with the interpreter's interface:
`exe(inputs, params) -> list of arrays`, params keyed by the `ember.param` op's `id`.
nn.* ops must be decomposed first (UnsupportedOpError at compile time otherwise). Core
`ember.*` ops each get a loop nest; `kernel.*` ops (the `fuse` pass) get fused loops and
GEMMs (fused.py, matmul.py, gemm.py); convolutions, pools and gather/scatter are in
spatial.py, dropout in dropout.py. One LLVM module per graph, one native call per run.

Environment:
- EMBER_NUM_THREADS: threads for large kernels (default: the CPUs this process may use)
- EMBER_CACHE=0 / EMBER_CACHE_DIR: the compile cache of object code (~/.cache/ember)
- EMBER_GEMM=own|blas: force a GEMM engine (default: the cost table, cost.py/tune.py);
  EMBER_GEMM_TUNE=0: never measure a point the table lacks; EMBER_BLAS=0: never call
  OpenBLAS
- EMBER_DUMP_LLVM=DIR: LLVM IR before/after optimization and assembly per graph
- EMBER_LLVM_REMARKS=1: LLVM's vectorization remarks on stderr
- EMBER_PASS_TIMING=1: the backend's compile time per stage on stderr
- EMBER_LLVM_UNROLL=1: let LLVM unroll loops (off: no measured gain, compiles 1.5-5x
  slower)
"""

from __future__ import annotations

from ...ir import Graph
from ..errors import KernelCompileError, UnsupportedOpError
from .codegen import lower
from .executable import Executable


def compile(graph: Graph, threads: int | None = None) -> Executable:  # noqa: A001
    """Native code for `graph` (loaded from the compile cache when it was compiled
    before); `threads` overrides EMBER_NUM_THREADS."""
    return Executable(graph, threads)


def emit_llvm(graph: Graph) -> str:
    """The LLVM IR the backend generates for `graph`, before optimization."""
    return str(lower(graph).module)


__all__ = ["Executable", "KernelCompileError", "UnsupportedOpError", "compile", "emit_llvm"]
