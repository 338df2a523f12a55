"""llvmlite: optimize an LLVM module for the host CPU and load it with MCJIT.

Facts this relies on (llvmlite 0.50 / LLVM 22): no `llvm.initialize()`; the new pass
manager, with SLP vectorization switched on by hand (it is off even at O3); a target
machine per engine (reusing one after its engine died crashed); and the engine, module
and target machine must outlive every function pointer taken from them.

Loop unrolling is off: it roughly doubled compile time for no measured gain, since the
GEMM micro-kernels are unrolled by hand and vectorized loops are interleaved anyway.
Object code can be saved (`object_code`) and loaded back (`JitModule.from_object`), which
is what the compile cache stores (`OBJECTS`); the thread pool's too (`_POOLS`, a folder of
its own): it is the same for every graph, and compiling it took 0.03 s of every process's
first cached load. Timings per
stage are kept in `timings`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import mmap
import os
import threading
import time
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
from llvmlite import ir

from ....cache_store import Store, source_hash
from ....files import cache_enabled
from ....settings import DUMP_LLVM, LLVM_REMARKS, LLVM_UNROLL
from ...errors import KernelCompileError
from ..gemm import blas
from ..kernels import collective
from ..parallel import pool
from .host import host_amx, host_cpu, host_features, num_threads


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # pow lowers to a libm call; make sure MCJIT can resolve it even when the interpreter
    # did not load libm globally.
    libm = ctypes.util.find_library("m")
    if libm:
        llvm.load_library_permanently(libm)
    blas.load_symbols()
    collective.load_symbols()
    if LLVM_REMARKS.get():
        llvm.set_option("", "--pass-remarks=loop-vectorize|slp-vectorizer")
        llvm.set_option("", "--pass-remarks-missed=loop-vectorize")


def fingerprint() -> str:
    """What object code depends on besides the IR: CPU, features, AMX, llvmlite, BLAS.
    Asking `host_amx` here also makes sure this process has the tiles' permission before
    code loaded from the cache runs a tile instruction."""
    b = blas.find()
    return (f"{llvm.get_process_triple()}|{host_cpu()}|{host_features()}|amx {host_amx()}|"
            f"llvmlite {llvmlite.__version__}|blas {b.path if b else None}")


def target_machine() -> llvm.TargetMachine:
    """A fresh target machine for this host's CPU and features, at O3."""
    _init()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=host_cpu(), features=host_features(), opt=3,
        reloc="static", codemodel="jitdefault", jit=True)


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = pto.slp_vectorization = True
    pto.loop_interleaving = True
    pto.loop_unrolling = LLVM_UNROLL.get()
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def _dump_dir(dump_dir: str | None) -> Path | None:
    d = dump_dir if dump_dir is not None else DUMP_LLVM.get()
    if not d:
        return None
    path = Path(d)
    path.mkdir(parents=True, exist_ok=True)
    return path


OBJECTS = Store("cpu", ".o", b"emberobj", 1)  # the compile cache's object code (cache.py)
_POOLS = Store("cpu-pool", ".o", b"emberobj", 1)  # the thread pool's, per host and workers
_pool_lock = threading.Lock()
_pool = None  # the JitModule holding the thread pool's code (pool.py), kept for the process


def _unlock_in_child() -> None:
    """A child forked while another thread was compiling the pool inherits `_pool_lock`
    held by a thread that does not exist there."""
    global _pool_lock
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_in_child)


def load_pool() -> None:
    """Compile the pool once and make `ember_parallel_for` resolvable by generated code."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            return
        jm = _pool_module(num_threads() - 1)
        llvm.add_symbol(pool.SYMBOL, jm.engine.get_function_address(pool.SYMBOL))
        _pool = jm


def _pool_module(workers: int) -> JitModule:
    """The pool's code, from the compile cache where this host compiled it before (keyed by
    the workers, the host and the cpu backend's source), else compiled and kept there."""
    k = None
    if cache_enabled() and DUMP_LLVM.get() is None:  # dumps need a build
        h = hashlib.sha256(f"pool {workers}\0{fingerprint()}\0".encode())
        h.update(source_hash(Path(__file__).parents[1]).encode())
        k = h.hexdigest()[:40]
        obj = _POOLS.load(k)
        if obj is not None:
            try:
                return JitModule(None, name="ember_pool", obj=obj, needs_pool=False)
            except (RuntimeError, ValueError):  # LLVM refused an intact entry
                _POOLS.discard(k)
    jm = JitModule(pool.build(workers), name="ember_pool", needs_pool=False)
    if k is not None:
        _POOLS.store(k, jm.object_code)
    return jm


# what LLVM's parse, O3 and codegen take beyond the IR text, measured on deep MLP steps
# (0.6-2.3 MiB of text: 7-15 MiB more at the peak): 8x the text and 16 MiB is above that
LLVM_BYTES_PER_TEXT_BYTE, LLVM_BASE_BYTES = 8, 16 << 20


def _room_for_llvm(text_bytes: int, name: str) -> None:
    """MemoryError, before LLVM starts, where this process could not map what LLVM will
    need (under an address-space limit, `ulimit -v`): LLVM aborts the process when an
    allocation fails inside it, which no caller can catch. The space is only reserved and
    released, never touched."""
    need = LLVM_BYTES_PER_TEXT_BYTE * text_bytes + LLVM_BASE_BYTES
    try:
        mmap.mmap(-1, need).close()
    except (OSError, ValueError, MemoryError):
        raise MemoryError(f"compiling @{name} needs about {need >> 20} MiB more than this "
                          f"process may map (an address-space limit?): LLVM would abort "
                          f"the process") from None


class JitModule:
    """Native code for one `ir.Module`; holds everything that keeps that code mapped: the
    MCJIT engine (with the object code loaded into it) and its target machine, and the
    object code's bytes (`object_code`, what the compile cache stores). Nothing else of the
    build stays: neither the `ir.Module` (the caller's), nor its text, nor the parsed and
    optimized llvmlite module, which is disposed of once the object code is emitted (LLVM
    memory, a few times the text's size).

    With `EMBER_DUMP_LLVM=DIR` set, writes DIR/<name>.ll (as generated), DIR/<name>.opt.ll
    (after O3) and DIR/<name>.s (the host assembly, one labelled function per kernel).
    """

    def __init__(self, module: ir.Module | None, dump_dir: str | None = None,
                 name: str = "graph", obj: bytes | None = None, needs_pool: bool = True):
        self.timings: dict[str, float] = {}
        self.tm = target_machine()
        if needs_pool:  # parallel loops call into the process's thread pool
            load_pool()
        self._load(obj if obj is not None else self._build(module, dump_dir, name))

    def _build(self, module: ir.Module, dump_dir: str | None, name: str) -> bytes:
        """The object code of `module`; what it took to make it goes with this frame."""
        t = time.perf_counter()
        module.triple = llvm.get_process_triple()
        module.data_layout = str(self.tm.target_data)
        text = str(module)
        self.timings["llvm-ir"] = time.perf_counter() - t
        _room_for_llvm(len(text), name)
        t = time.perf_counter()
        try:
            mod = llvm.parse_assembly(text)
            mod.verify()
        except RuntimeError as e:
            keep = Path(os.environ.get("TMPDIR", "/tmp")) / f"ember-failed-{os.getpid()}.ll"
            keep.write_text(text)
            raise KernelCompileError(f"LLVM rejected the generated IR for @{name} (kept in "
                                     f"{keep}): {e}") from None
        self.timings["parse"] = time.perf_counter() - t
        try:
            d = _dump_dir(dump_dir)
            if d:
                (d / f"{name}.ll").write_text(text)
            del text  # LLVM has its own copy now
            t = time.perf_counter()
            optimize(mod, self.tm)
            self.timings["optimize"] = time.perf_counter() - t
            if d:
                (d / f"{name}.opt.ll").write_text(str(mod))
                (d / f"{name}.s").write_text(self.tm.emit_assembly(mod))
            t = time.perf_counter()
            obj = self.tm.emit_object(mod)
            self.timings["codegen"] = time.perf_counter() - t
        finally:
            mod.close()  # the optimized module's LLVM memory, now rather than at collection
        return obj

    def _load(self, obj: bytes) -> None:
        t = time.perf_counter()
        self.object_code = obj
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm)
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self.engine.finalize_object()
        self.timings["load"] = time.perf_counter() - t

    @classmethod
    def from_object(cls, obj: bytes) -> JitModule:
        return cls(None, obj=obj)

    def function(self, name: str, restype, *argtypes):
        """A ctypes callable for `name`; valid while this JitModule is alive."""
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KernelCompileError(f"no function {name} in the compiled module")
        return ctypes.CFUNCTYPE(restype, *argtypes)(addr)
