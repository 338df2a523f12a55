"""The CPU backend: graphs of core `ember.*` ops compiled to native code with llvmlite.

`compile(graph)` returns an Executable with the interpreter's interface:
`exe(inputs, params) -> list of arrays`, params keyed by the `ember.param` op's `id`.
nn.* ops must be decomposed first (UnsupportedOpError at compile time otherwise). Core
`ember.*` ops each get a loop nest; `kernel.*` ops (the `fuse` pass) get fused loops,
GEMMs and attention kernels. One LLVM module per graph (codegen.py), one native call per
run. The folders, one concern each:

- gemm/: matrix multiply (own GEMM or OpenBLAS, chosen by measured cost) and kernel.matmul
- attention/: flash attention forward and backward
- kernels/: every other op's loops (elementwise, fused, convolutions, pooling, gathers)
- call/: the Executable, its buffers, and the bound call a training loop makes each step
- parallel/: the thread pool and the outlining of parallel loops into it
- machine/: the host CPU, llvmlite's JIT, and the on-disk cache of object code

Environment: the EMBER_* switches declared in settings.py (`ember --help-env` lists
them): EMBER_NUM_THREADS, EMBER_CACHE/EMBER_CACHE_DIR, EMBER_GEMM, EMBER_GEMM_TUNE,
EMBER_BLAS, EMBER_DUMP_LLVM, EMBER_LLVM_REMARKS, EMBER_PASS_TIMING, EMBER_LLVM_UNROLL.
"""

from __future__ import annotations

from ...ir import Graph
from ..errors import KernelCompileError, UnsupportedOpError
from .call.executable import Executable
from .codegen import lower

# bf16 and f16 values are only stored, moved and cast here: ops on them run in f32
# (passes/widen.py), as the runtime's pipeline arranges
LEGALIZE_LOW_PRECISION = "widen-low-precision"


def compile(graph: Graph, threads: int | None = None) -> Executable:  # noqa: A001
    """Native code for `graph` (loaded from the compile cache when it was compiled
    before); `threads` overrides EMBER_NUM_THREADS."""
    return Executable(graph, threads)


def emit_llvm(graph: Graph) -> str:
    """The LLVM IR the backend generates for `graph`, before optimization."""
    return str(lower(graph).module)


__all__ = ["LEGALIZE_LOW_PRECISION", "Executable", "KernelCompileError", "UnsupportedOpError",
           "compile", "emit_llvm"]
