"""Nothing a compile makes outlives it unless asked for: after a training step compiled and
ran, no llvmlite module (neither the `ir.Module` codegen built, nor its text, nor the
parsed and optimized `ModuleRef`) and no IR text is held; the stage texts live on disk
(runtime/pipeline.py:_TextFiles) and read back as the passes printed them; what the step
holds beyond its buffers stays small (issue 36, item 2)."""

import gc
import os
import sys
import tracemalloc
import types

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir as llvm_ir

import ember as em
from ember import nn, optim
from ember.ir.parser import parse
from ember.ir.printer import print_graph
from ember.passes.manager import PassManager, parse_pipeline


class Mlp(nn.Module):
    def __init__(self, width=64, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(32 if k == 0 else width, width)
                                     for k in range(depth)])
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.gelu(layer(x))
        return self.head(x)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((16, 32)).astype(np.float32), rng.integers(0, 10, 16)


def trained(steps=3, **model):
    em.seed(0)
    step = em.compile_train_step(Mlp(**model), nn.functional.cross_entropy,
                                 optim.AdamW(lr=1e-3), backend="cpu")
    for k in range(steps):
        step(*batch(k))
    return step


@pytest.fixture(params=["no cache", "stage cache hit"])
def cache(request, tmp_path, monkeypatch):
    if request.param == "no cache":
        monkeypatch.setenv("EMBER_CACHE", "0")
    else:
        monkeypatch.setenv("EMBER_CACHE", "1")
        monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
        trained(steps=1)  # the second compile hits the stage and object caches
    return request.param


def reachable(root, limit=500_000):
    """Every object reachable from `root` through gc.get_referents, not through modules,
    classes, functions or code (their globals reach the whole process)."""
    skip = (types.ModuleType, type, types.FunctionType, types.CodeType,
            types.BuiltinFunctionType)
    module_dicts = {id(vars(m)) for m in list(sys.modules.values()) if m is not None}
    seen, todo, out = {id(root)}, [root], []
    while todo and len(out) < limit:
        obj = todo.pop()
        out.append(obj)
        for ref in gc.get_referents(obj):
            if id(ref) in seen or isinstance(ref, skip) or id(ref) in module_dicts:
                continue
            seen.add(id(ref))
            todo.append(ref)
    assert len(out) < limit, "the walk did not end: raise the limit"
    return out


def unowned_modules() -> int:
    """Open llvmlite ModuleRefs no MCJIT engine owns (an engine owns the one it was made
    with, which the object code is loaded beside)."""
    return sum(isinstance(o, llvm.ModuleRef) and not o.closed and not o._owned
               for o in gc.get_objects())


def llvm_modules() -> int:
    return sum(isinstance(o, llvm_ir.Module) for o in gc.get_objects())


def test_no_llvm_module_or_ir_text_outlives_the_compile(cache):
    gc.collect()
    modules, refs = llvm_modules(), unowned_modules()
    step = trained()
    texts = {stage: step.ir(stage, debuginfo=True) for stage in step.stages}
    assert step._last.run.cached == (cache == "stage cache hit")
    gc.collect()
    assert llvm_modules() <= modules  # (a): none made by this compile is left
    assert unowned_modules() <= refs
    objects = reachable(step)
    assert not [o for o in objects if isinstance(o, (llvm_ir.Module, llvm.ModuleRef))
                and not getattr(o, "_owned", False)]
    # (b), (c): no LLVM IR and no stage text (ours or any other IR text) is held
    long_texts = [o for o in objects if isinstance(o, str) and len(o) > 2000]
    assert not [s for s in long_texts if "define " in s]
    assert not [s for s in long_texts if "module {" in s or s in texts.values()]
    # ... yet every stage reads as before, and as the passes print it
    assert {stage: step.ir(stage, debuginfo=True) for stage in step.stages} == texts
    assert step.ir(step.stages[-1]) == step.ir()  # (a hit's final graph has no loc(...))
    graph = parse(texts["traced"])
    printed = [texts["traced"]]
    PassManager(parse_pipeline(",".join(step.pipeline())),
                on_stage=lambda name, g: printed.append(print_graph(g, debuginfo=True))).run(graph)
    assert printed == list(texts.values())
    assert "define " in step._last.run.llvm_ir  # emitted again when asked for


def test_the_stage_texts_folder_goes_with_the_step(cache):
    step = trained(steps=1)
    step.ir("decompose")  # on a stage cache hit, this runs the passes and writes the texts
    folder = step._last.stages._files._dir
    assert folder is not None and len(os.listdir(folder)) == len(step.stages)
    del step
    gc.collect()
    assert not os.path.exists(folder)


def held_beyond_buffers(**model) -> tuple[int, int]:
    """(bytes a compile of `model` and 3 steps leave allocated beyond the step's buffers,
    the compile's peak), by tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        step = trained(**model)
        gc.collect()
        held, peak = (m - base for m in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    return held - step.memory_report()["real_bytes"], peak


def test_what_a_step_holds_beyond_its_buffers_stays_small(monkeypatch):
    """Measured (cpu, 3x64 GELU MLP, AdamW, 3 steps): 0.45 MiB beyond the buffers'
    `real_bytes`, which is the final graph, the kernel plan and the executable's and bound
    call's tables (and the object code's bytes); with the LLVM module, its text and the
    stage texts held it was 5.85 MiB. The bound leaves room for allocator and Python
    version noise, and fails on any one of the three kinds of text coming back."""
    monkeypatch.setenv("EMBER_CACHE", "0")
    trained(steps=1, width=16, depth=2)  # lazy imports and the thread pool, made once
    extra, peak = held_beyond_buffers()
    assert extra < 1.5 * 2**20, f"{extra / 2**20:.2f} MiB held beyond the buffers"
    assert peak < 16 * 2**20, f"compile peak {peak / 2**20:.2f} MiB"
