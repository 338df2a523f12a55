"""Graph -> LLVM module: a storage plan and one entry function that runs every op.

Each graph value that needs memory gets a slot: graph inputs and params (the caller's
arrays, set per call), constants (filled once at compile time), and op results
(preallocated once per compile). A reshape takes its operand's slot, since every buffer
is contiguous. `ember_entry(ptr %buffers)` receives one pointer per slot and calls the
op kernels in graph order, so one native call runs the whole graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from ...ir import Graph, TensorType, Value, numpy_dtype
from ..interpreter import UnsupportedOpError
from .kernels import KERNELS, PTR, emit_kernel
from .scalar import REG, i64

ENTRY = "ember_entry"


@dataclass
class Slot:
    """Storage of one buffer: kind is "arg" (key: input index), "param" (key: param id),
    "const" (value: its data) or "temp" (an op result)."""

    kind: str
    type: TensorType
    key: int | str | None = None
    path: str = ""
    value: np.ndarray | None = None


@dataclass
class Lowered:
    module: ir.Module
    slots: list[Slot] = field(default_factory=list)
    outputs: list[tuple[int, TensorType]] = field(default_factory=list)


def _check_type(op_name: str, t) -> TensorType:
    if not isinstance(t, TensorType) or t.dtype not in REG:
        raise UnsupportedOpError(f"the cpu backend does not support {t} (in '{op_name}'); "
                                 f"supported dtypes: {', '.join(REG)}")
    return t


def lower(graph: Graph) -> Lowered:
    """Plan storage and emit the module; UnsupportedOpError names the first op without a
    kernel."""
    out = Lowered(ir.Module(name=graph.name))
    where: dict[Value, int] = {}

    def new_slot(v: Value, kind: str, **kw) -> None:
        where[v] = len(out.slots)
        out.slots.append(Slot(kind, _check_type("graph argument", v.type), **kw))

    for i, a in enumerate(graph.args):
        new_slot(a, "arg", key=i, path=f"%{a.name}" if a.name else "")
    calls = []
    for k, op in enumerate(graph.ops):
        for v in op.operands:
            _check_type(op.name, v.type)
        if op.name == "func.return":
            out.outputs = [(where[v], v.type) for v in op.operands]
        elif op.name == "ember.param":
            new_slot(op.result, "param", key=op.attributes["id"],
                     path=op.attributes.get("path", ""))
        elif op.name == "ember.constant":
            t = op.result.type
            value = np.asarray(op.attributes["value"], dtype=numpy_dtype(t.dtype))
            new_slot(op.result, "const", value=value.reshape(t.shape))
        elif op.name == "ember.reshape":
            _check_type(op.name, op.result.type)
            where[op.result] = where[op.operands[0]]
        elif op.name in KERNELS and not op.regions:
            new_slot(op.result, "temp")
            fn = emit_kernel(out.module, f"k{k}_{op.name.removeprefix('ember.')}", op)
            calls.append((fn, [where[op.result]] + [where[v] for v in op.operands]))
        else:
            raise UnsupportedOpError(
                f"the cpu backend has no kernel for '{op.name}': it runs core ember.* ops "
                "only; run the `decompose` pass first (it lowers nn.* ops to them)")

    entry = ir.Function(out.module, ir.FunctionType(ir.VoidType(), [PTR]), ENTRY)
    entry.args[0].name = "buffers"
    entry.args[0].add_attribute("noalias")
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    # every pointer is loaded before any kernel runs, so no store can be thought to change it
    ptrs = [b.load(b.gep(entry.args[0], [i64(i)], inbounds=True, source_etype=PTR), typ=PTR,
                   name=f"buf{i}") for i in range(len(out.slots))]
    for fn, slots in calls:
        b.call(fn, [ptrs[s] for s in slots])
    b.ret_void()
    return out
