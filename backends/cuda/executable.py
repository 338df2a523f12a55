"""A compiled graph on a GPU: one NVRTC module, device buffers allocated once, and a
Python loop of kernel launches and cuBLAS calls on the current stream.

Inputs may be numpy or cupy arrays; params too (numpy ones are copied to the device on
every call, so a runtime keeps them on the device: `to_device`). Results are cupy arrays
that the caller owns: nothing goes back to the host unless the caller asks (`float(loss)`).
A bf16 array is held as its bits in a cupy uint16 array (cupy has no bfloat16): the
kernels read and write those bits, cuBLAS reads them as CUDA_R_16BF, and the runtime's
`to_host` views them as bfloat16 again.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np

from ...ir import Graph, numpy_dtype, verify
from .. import collectives
from . import launch as L
from .codegen import CudaCompileError, lower
from .cublas import COMPUTE_32F, DATA_TYPE, GEMM_DEFAULT
from .device import check_available
from .program import Gemm, GemmEx, HostAllReduce, Launch, Memset, Program

OPTIONS = ("--std=c++17",)
BITS = np.dtype(np.uint16)  # a bf16 array's dtype on the device (ember has no uint16)
_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)  # GemmEx's alpha, beta
_MODULES: dict[tuple[str, int], object] = {}  # (source hash, device) -> RawModule


def load_module(program: Program, device: int):
    """The compiled module of `program` on `device`, cached by the hash of its source (cupy
    also caches the binary on disk); a compile error shows the line and its IR op."""
    import cupy

    key = (hashlib.sha256((program.source + repr(OPTIONS)).encode()).hexdigest(), device)
    mod = _MODULES.get(key)
    if mod is None:
        mod = cupy.RawModule(code=program.source, options=OPTIONS)
        try:
            mod.compile()  # now, not at the first launch
        except cupy.cuda.compiler.CompileException as e:
            raise CudaCompileError(program.explain(e.get_message())) from None
        _MODULES[key] = mod
    return mod


def compile_ptx(program: Program, arch: str = "compute_90") -> str:
    """PTX of the program's translation unit from NVRTC directly, with the options cupy
    adds: needs cupy and the NVRTC library but no GPU or driver (a check this machine can
    run). A compile error raises CudaCompileError with the line and its IR op."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(program.source, f"{program.name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"-arch={arch}", *OPTIONS, "-ftz=true"])
        except nvrtc.NVRTCError:
            raise CudaCompileError(program.explain(nvrtc.getProgramLog(prog))) from None
        ptx = nvrtc.getPTX(prog)
        return ptx.decode() if isinstance(ptx, bytes) else ptx
    finally:
        nvrtc.destroyProgram(prog)


def to_device(x, dtype=None):
    """`x` as a C-contiguous cupy array on the current device, 256-byte aligned (copied
    only when needed: host arrays, other dtypes, strided or misaligned views). A bf16
    array is held as its bits (`dtype` BITS, uint16: cupy has no bfloat16), rounded on
    the host from any numpy floats; a device array for it must hold such bits already."""
    import cupy

    if dtype is not None and np.dtype(dtype) == BITS:
        if isinstance(x, cupy.ndarray) and x.dtype != BITS:
            raise TypeError(f"a bf16 array on the device is a cupy {BITS} array of its bits "
                            f"(what ember returns), got cupy {x.dtype}: pass it as numpy")
        if not isinstance(x, cupy.ndarray):
            x = host_array(x, dtype)
    a = cupy.asarray(x, dtype=dtype)
    if not a.flags.c_contiguous or not L.aligned(a.data.ptr, L.ALIGN):
        a = a.copy()  # C order, a fresh (pool-aligned) allocation
    return a


def host_array(x, dtype) -> np.ndarray:
    """`x` as a numpy array of the device dtype `dtype`: for BITS, rounded to bf16."""
    if np.dtype(dtype) == BITS:
        return np.asarray(x, ml_dtypes.bfloat16).view(BITS)
    return np.asarray(x, dtype)


def device_dtype(dtype: str) -> np.dtype:
    """The cupy dtype that holds an IR dtype: its numpy one, bf16's bits as BITS."""
    return BITS if dtype == "bf16" else numpy_dtype(dtype)


class Executable:
    """`exe(inputs, params)` runs the graph on the GPU and returns cupy arrays."""

    def __init__(self, graph: Graph, device: str | int = "cuda"):
        self.device = check_available(device)
        import cupy

        self._cp = cupy
        self.graph = verify(graph)
        dev = cupy.cuda.Device(self.device)
        with dev:
            sms = dev.attributes.get("MultiProcessorCount", L.DEFAULT_SMS)
            self.program = lower(graph, sms)
            self.source = self.program.source
            mod = load_module(self.program, self.device)
            self._kernels = {k.name: mod.get_function(k.name) for k in self.program.kernels}
            p = self.program
            self._fresh = sorted({i for i, _ in p.outputs if p.slots[i].kind == "temp"})
            self._arena = cupy.empty(max(p.arena_bytes, 1), dtype=np.uint8)  # allocated once
            self._arrays: list = []
            for s in p.slots:
                dt = device_dtype(s.type.dtype)
                if s.kind == "const":
                    self._arrays.append(cupy.asarray(s.value.view(dt)))
                elif s.kind in ("temp", "scratch") and s.offset is not None:
                    raw = self._arena[s.offset:s.offset + s.type.nbytes]
                    self._arrays.append(raw.view(dt).reshape(s.type.shape))
                else:
                    self._arrays.append(None)
        self._bound = [(i, s, device_dtype(s.type.dtype)) for i, s in enumerate(p.slots)
                       if s.kind in ("arg", "param")]
        self._lock = threading.Lock()
        self._matmul_out = True
        self._scalars: dict[int, tuple[bytes, object]] = {}  # slot -> (value, device copy)

    def memory_report(self) -> dict[str, int]:
        """Device bytes: the arena (allocated once), constants, and per call the inputs,
        params and returned results (see Program.memory_report)."""
        return self.program.memory_report()

    def __call__(self, inputs: Sequence, params: Mapping | None = None) -> list:
        cp, p = self._cp, self.program
        params = params or {}
        if len(inputs) != len(self.graph.args):
            raise ValueError(f"graph @{self.graph.name} takes {len(self.graph.args)} inputs, "
                             f"got {len(inputs)}")
        with cp.cuda.Device(self.device), self._lock:
            arrays = list(self._arrays)
            for i, s, dt in self._bound:
                if s.kind == "param" and s.key not in params:
                    raise KeyError(f"no value for param {s.path} (id {s.key})")
                x = inputs[s.key] if s.kind == "arg" else params[s.key]
                a = (self._scalar(i, x, dt) if s.kind == "arg" and not s.type.shape
                     and isinstance(x, np.ndarray | np.generic | float | int) else to_device(x, dt))
                if a.shape != s.type.shape:
                    what = (f"input {s.key}" + (f" ({s.path})" if s.path else "")
                            if s.kind == "arg" else f"param {s.path} (id {s.key})")
                    raise ValueError(f"{what}: expected shape {list(s.type.shape)} ({s.type}), "
                                     f"got {list(a.shape)}")
                arrays[i] = a
            for i in self._fresh:
                s = p.slots[i]
                arrays[i] = cp.empty(s.type.shape, dtype=device_dtype(s.type.dtype))
            for step in p.steps:
                self._run(step, arrays)
            results, owned = [], set(self._fresh)
            for i, t in p.outputs:
                a = arrays[i].reshape(t.shape)
                results.append(a if i in owned else a.copy())
                owned.discard(i)
        return results

    def _scalar(self, slot: int, x, dt):
        """A host scalar input (a training step's lr, a step count) on the device, uploaded
        again only when its value changes: each upload is a synchronous copy costing ~20 us
        of host time, several per step."""
        value = host_array(x, dt)
        key = value.tobytes()
        held = self._scalars.get(slot)
        if held is None or held[0] != key:
            held = self._scalars[slot] = (key, to_device(value))
        return held[1]

    def _run(self, step, arrays) -> None:
        cp = self._cp
        if isinstance(step, Launch):
            c = step.config
            self._kernels[step.kernel](c.grid, c.block, tuple(arrays[i] for i in step.args),
                                       shared_mem=c.shared)
        elif isinstance(step, Gemm) and step.ex is not None:
            self._gemm_ex(step.ex, arrays)
        elif isinstance(step, Gemm):
            a, b, out = (self._view(v, arrays) for v in (step.a, step.b, step.out))
            if self._matmul_out:
                try:
                    cp.matmul(a, b, out=out)
                    return
                except (TypeError, ValueError):  # a cupy without out= for these operands
                    self._matmul_out = False
            out[...] = cp.matmul(a, b)
        elif isinstance(step, Memset):
            a = arrays[step.slot]
            a.data.memset_async(0, a.nbytes)
        elif isinstance(step, HostAllReduce):
            host = arrays[step.src].get()  # waits for the kernels before it
            collectives.allreduce_(host)
            arrays[step.out][...] = cp.asarray(host)
        else:
            raise TypeError(f"unknown step {step!r}")

    def _gemm_ex(self, call: GemmEx, arrays) -> None:
        """The planned cublasGemmStridedBatchedEx (cublas.py): f32 sums on the tensor
        cores, alpha and beta host floats."""
        from cupy.cuda import cublas, device

        handle = device.get_cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        a, b, c = (arrays[m.slot] for m in (call.a, call.b, call.c))
        cublas.gemmStridedBatchedEx(
            handle, call.a.op, call.b.op, call.m, call.n, call.k, _ONE.ctypes.data,
            a.data.ptr, DATA_TYPE[call.a.dtype], call.a.ld, call.a.stride,
            b.data.ptr, DATA_TYPE[call.b.dtype], call.b.ld, call.b.stride, _ZERO.ctypes.data,
            c.data.ptr, DATA_TYPE[call.c.dtype], call.c.ld, call.c.stride,
            call.batch, COMPUTE_32F, GEMM_DEFAULT)

    def _view(self, v, arrays):
        a = arrays[v.slot]
        item = a.itemsize
        return self._cp.lib.stride_tricks.as_strided(
            a.reshape(-1), v.shape, tuple(s * item for s in v.strides))
