"""The CUDA backend: graphs of core `ember.*` ops and `kernel.*` fused kernels lowered to
CUDA C, compiled with NVRTC (`cupy.RawModule`) and run on cupy device arrays.

`emit_cuda(graph)` returns the one translation unit (pure Python, no GPU needed);
`compile(graph, device="cuda")` returns an Executable with the other backends' interface,
`exe(inputs, params) -> list of cupy arrays`; it raises CudaUnavailableError first, naming
the cause, when cupy or a usable GPU is missing.
"""

from __future__ import annotations

from ...ir import Graph
from ..errors import UnsupportedOpError
from .codegen import CudaCompileError, Program, emit_cuda, lower
from .device import CudaUnavailableError, check_available, parse_device

# ops on bf16 and f16 values run in f32 here (passes/widen.py), except matmuls of them,
# which cuBLAS runs on the tensor cores with f32 sums (passes/low_precision_gemm.py); the
# kernels store what they widen in low precision (passes/low_precision_storage.py)
LEGALIZE_LOW_PRECISION = ("widen-low-precision,low-precision-gemm,low-precision-gemm{dtype=f16},"
                          "low-precision-storage")


def compile(graph: Graph, device: str = "cuda"):  # noqa: A001  (the backend interface's name)
    from .executable import Executable

    return Executable(graph, device)


def compile_ptx(graph: Graph, arch: str = "compute_90") -> str:
    """The PTX NVRTC makes of `emit_cuda(graph)`; needs cupy and NVRTC, not a GPU."""
    from .executable import compile_ptx as ptx

    return ptx(lower(graph), arch)


__all__ = ["LEGALIZE_LOW_PRECISION", "CudaCompileError", "CudaUnavailableError", "Program",
           "UnsupportedOpError", "check_available", "compile", "compile_ptx", "emit_cuda",
           "lower", "parse_device"]
