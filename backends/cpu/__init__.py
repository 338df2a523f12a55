"""The CPU backend: graphs of core `ember.*` ops compiled to native code with llvmlite.

`compile(graph)` returns an Executable with the interpreter's interface:
`exe(inputs, params) -> list of arrays`, params keyed by the `ember.param` op's `id`.
nn.* ops must be decomposed first (UnsupportedOpError at compile time otherwise). Core
`ember.*` ops each get a loop nest; `kernel.*` ops (the `fuse` pass) get fused loops,
GEMMs and attention kernels. One LLVM module per graph (codegen.py), one native call per
run. The folders, one concern each:

- gemm/: matrix multiply (own GEMM or OpenBLAS, chosen by measured cost; bf16 on AMX
  tiles or AVX512-BF16) and kernel.matmul
- attention/: flash attention forward and backward
- kernels/: every other op's loops (elementwise, fused, convolutions, pooling, gathers)
- call/: the Executable, its buffers, and the bound call a training loop makes each step
- parallel/: the thread pool and the outlining of parallel loops into it
- machine/: the host CPU, llvmlite's JIT, and the on-disk cache of object code

Environment: the EMBER_* switches declared in settings.py (`ember --help-env` lists
them): EMBER_NUM_THREADS, EMBER_CACHE/EMBER_CACHE_DIR, EMBER_GEMM, EMBER_GEMM_TUNE,
EMBER_AMX, EMBER_BLAS, EMBER_DUMP_LLVM, EMBER_LLVM_REMARKS, EMBER_PASS_TIMING,
EMBER_LLVM_UNROLL.
"""

from __future__ import annotations

import functools
import warnings

from ...ir import Graph
from ...ir.types import LOW_PRECISION
from ..errors import KernelCompileError, UnsupportedOpError
from .call.executable import Executable
from .codegen import lower
from .machine.host import host_isa

# the inference pipeline's layout pass (passes/layout.py): depthwise conv chains run
# channels last (kernels/depthwise_nhwc.py) with their pointwise convs as GEMMs
LAYOUT = "layout"


def __getattr__(name: str) -> str:
    """`LEGALIZE_LOW_PRECISION`, the passes the runtime's pipeline runs on bf16/f16
    graphs: ops on such values run in f32 (passes/widen.py), except, where the host has
    AMX-BF16 or AVX512-BF16, matmuls on bf16 values (passes/low_precision_gemm.py), and
    where it has AMX tiles, fused attention on bf16 q, k, v too (low_precision_attention.py,
    after `fuse`); kernels store the bf16 values they widen as bf16
    (low_precision_storage.py, after `fuse`)."""
    if name == "LEGALIZE_LOW_PRECISION":
        isa = host_isa()
        return ",".join(["widen-low-precision"] + ["low-precision-gemm"] * isa.bf16_gemm
                        + ["low-precision-attention"] * isa.bf16_tiles
                        + ["low-precision-storage"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def compile(graph: Graph, threads: int | None = None) -> Executable:  # noqa: A001
    """Native code for `graph` (loaded from the compile cache when it was compiled
    before); `threads` overrides EMBER_NUM_THREADS."""
    if not host_isa().bf16_gemm and _casts_down(graph):
        _f32_notice()
    return Executable(graph, threads)


def _casts_down(graph: Graph) -> bool:
    return any(op.name == "ember.cast" and op.attributes["dtype"] in LOW_PRECISION
               for op in graph.walk())


@functools.cache
def _f32_notice() -> None:
    warnings.warn("this CPU has no bf16/f16 GEMM that ember uses (AMX-BF16 or AVX512-BF16): "
                  "low-precision matmuls run in f32 here, with the same results",
                  stacklevel=3)


def emit_llvm(graph: Graph) -> str:
    """The LLVM IR the backend generates for `graph`, before optimization."""
    return str(lower(graph).module)


__all__ = ["LAYOUT", "LEGALIZE_LOW_PRECISION", "Executable", "KernelCompileError",
           "UnsupportedOpError", "compile", "emit_llvm"]
