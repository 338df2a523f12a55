"""A compiled graph: native code plus buffers allocated once and reused on every call."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from ...ir import Graph, numpy_dtype, verify
from .buffers import aligned_copy, aligned_empty, as_input
from .codegen import ENTRY, lower
from .jit import JitModule


class Executable:
    """`exe(inputs, params)` runs the graph natively and returns fresh arrays.

    Intermediate buffers are allocated once and overwritten by every call (a lock
    serializes concurrent calls). An op result that the graph returns is instead written
    straight into a new array each call, which the caller then owns: that costs the same
    allocation a copy would, without the copy. Returned inputs, params and constants, and
    a buffer returned twice, are copied.
    """

    def __init__(self, graph: Graph):
        self.graph = verify(graph)
        lowered = lower(graph)
        self.llvm_ir = str(lowered.module)
        self.slots, self.outputs = lowered.slots, lowered.outputs
        self._jit = JitModule(lowered.module)
        self._entry = self._jit.function(ENTRY, None, ctypes.c_void_p)
        fresh = {i for i, _ in self.outputs if self.slots[i].kind == "temp"}
        self._fresh = sorted(fresh)
        # fixed buffers: constants and intermediates; None where each call binds its own
        self._arrays = [aligned_copy(s.value, s.type) if s.kind == "const" else
                        aligned_empty(s.type)[0] if s.kind == "temp" and i not in fresh
                        else None for i, s in enumerate(self.slots)]
        self._ptrs = (ctypes.c_void_p * max(len(self.slots), 1))(
            *[a.ctypes.data if a is not None else None for a in self._arrays])
        self._bound = [(i, s, numpy_dtype(s.type.dtype), self._describe(s))
                       for i, s in enumerate(self.slots) if s.kind in ("arg", "param")]
        self._lock = threading.Lock()

    @staticmethod
    def _describe(s) -> str:
        if s.kind == "arg":
            return f"input {s.key}" + (f" ({s.path})" if s.path else "")
        return f"param {s.path} (id {s.key})"

    def __call__(self, inputs: Sequence[np.ndarray],
                 params: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        params = params or {}
        if len(inputs) != len(self.graph.args):
            raise ValueError(f"graph @{self.graph.name} takes {len(self.graph.args)} inputs, "
                             f"got {len(inputs)}")
        arrays = list(self._arrays)
        ptrs = {}
        for i, s, dtype, what in self._bound:
            if s.kind == "param" and s.key not in params:
                raise KeyError(f"no value for param {s.path} (id {s.key})")
            x = inputs[s.key] if s.kind == "arg" else params[s.key]
            arrays[i] = as_input(x, s.type, dtype, what)
            ptrs[i] = arrays[i].ctypes.data
        for i in self._fresh:
            arrays[i], ptrs[i] = aligned_empty(self.slots[i].type)
        with self._lock:
            for i, p in ptrs.items():
                self._ptrs[i] = p
            self._entry(self._ptrs)
        owned, results = set(self._fresh), []
        for i, t in self.outputs:
            view = arrays[i].reshape(t.shape)
            results.append(view if i in owned else view.copy())
            owned.discard(i)
        return results
