"""llvmlite: optimize an LLVM module for the host CPU and load it with MCJIT.

Facts this relies on (llvmlite 0.50 / LLVM 22): no `llvm.initialize()`; the new pass
manager, with SLP vectorization switched on by hand (it is off even at O3); a target
machine per engine (reusing one after its engine died crashed); and the engine, module
and target machine must outlive every function pointer taken from them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # exp/log/tanh/pow lower to libm calls; make sure MCJIT can resolve them even when
    # the interpreter did not load libm globally.
    libm = ctypes.util.find_library("m")
    if libm:
        llvm.load_library_permanently(libm)


def target_machine() -> llvm.TargetMachine:
    """A fresh target machine for this host's CPU and features, at O3."""
    _init()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3,
        reloc="static", codemodel="jitdefault", jit=True)


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = pto.slp_vectorization = True
    pto.loop_interleaving = pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


class JitModule:
    """Native code for one `ir.Module`; holds everything that keeps that code mapped.

    With `EMBER_DUMP_LLVM=DIR` set, writes DIR/graph.ll (as generated),
    DIR/graph.opt.ll (after O3) and DIR/graph.s (the host assembly).
    """

    def __init__(self, module: ir.Module, dump_dir: str | None = None):
        self.tm = target_machine()
        module.triple = llvm.get_process_triple()
        module.data_layout = str(self.tm.target_data)
        text = str(module)
        self.mod = llvm.parse_assembly(text)
        self.mod.verify()
        optimize(self.mod, self.tm)
        dump_dir = dump_dir if dump_dir is not None else os.environ.get("EMBER_DUMP_LLVM")
        if dump_dir:
            d = Path(dump_dir)
            d.mkdir(parents=True, exist_ok=True)
            (d / "graph.ll").write_text(text)
            (d / "graph.opt.ll").write_text(str(self.mod))
            (d / "graph.s").write_text(self.tm.emit_assembly(self.mod))
        self.engine = llvm.create_mcjit_compiler(self.mod, self.tm)
        self.engine.finalize_object()

    def function(self, name: str, restype, *argtypes):
        """A ctypes callable for `name`; valid while this JitModule is alive."""
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.engine.get_function_address(name))
