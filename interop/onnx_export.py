"""`em.onnx.save(model, path, *example_inputs)`: a module's inference forward as an ONNX file.

The graph is the one `em.compile` runs, stopped before `fuse`: traced as an inference trace
(Dropout off and BatchNorm on its running statistics, whatever the module's flags say), then
`decompose` and the simplifications. Fused kernels hold scalar bodies that ONNX has no op
for; the core ops before them each have a rule in `onnx_export_ops.RULES`.

Params become initializers named by their module path (`fc1.weight`), so an import keeps
the names. Shapes are the example inputs' static ones: ember's shape attributes (a reshape
to [B*T, d], a broadcast to [B, ...]) bake the batch size in, so a symbolic batch dimension
would be a promise the graph does not keep.

Nothing is written unless the whole model is built and passes `onnx.checker` (full check,
with shape inference), and then atomically: an error never leaves a file behind.
`onnx` is imported only here, inside the functions.
"""

from __future__ import annotations

import os

import numpy as np

from ..files import write_atomically
from ..frontend.module import Module
from ..frontend.trace import TensorSpec, trace_function
from ..ir import Graph, Location, Operation, Value, numpy_dtype
from ..runtime.params import ParamTable
from ..runtime.pipeline import Stages, inference_pipeline
from .onnx_export_ops import ONNX_DTYPES, OPSET, RULES, STRUCTURAL, Const, Nodes, missing

IR_VERSION = 8  # the ONNX IR of opset 18 (onnx 1.13): what every runtime of that opset reads


class OnnxExportError(ValueError):
    """The model has ops that ONNX export has no rule for (all of them are listed)."""


def export_graph(model: Module, *example_inputs) -> Graph:
    """The graph that is exported: the inference pipeline on `model.forward`, without `fuse`."""
    if not example_inputs:
        raise TypeError("em.onnx.save needs an example input (a numpy array or em.TensorSpec) "
                        "for each argument of forward")
    specs = tuple(TensorSpec.of(x) for x in example_inputs)
    graph = trace_function(model, model, specs, name="forward", training=False)
    return Stages(graph, [p for p in inference_pipeline() if p != "fuse"]).graph


def _where(loc: Location | None) -> str:
    return f" (at {loc.file}:{loc.line})" if loc else ""


def check_exportable(graph: Graph) -> None:
    """One error naming every op without an export rule, with its source line."""
    found = missing(graph.ops)
    if found:
        lines = "".join(f"\n  {op.name}{_where(op.loc)}{': ' + why if why else ''}"
                        for op, why in found)
        raise OnnxExportError(
            f"cannot export @{graph.name} to ONNX: {len(found)} op(s) have no export rule:"
            f"{lines}\nops with a rule: {', '.join(sorted(RULES))}")


def _doc(op: Operation) -> str:
    """What ONNX nodes came from: the ember op and its source line (the file's name only)."""
    return op.name + (f" ({os.path.basename(op.loc.file)}:{op.loc.line})" if op.loc else "")


def _tensor(name: str, value: np.ndarray, dtype: str):
    """An ONNX TensorProto of ember dtype `dtype` (bf16 from the f32 values ember holds)."""
    from onnx import helper, numpy_helper

    if dtype == "bf16":
        return helper.make_tensor(name, ONNX_DTYPES[dtype], value.shape,
                                  np.asarray(value, np.float32).ravel().tolist())
    return numpy_helper.from_array(np.asarray(value, numpy_dtype(dtype), order="C"), name)


def _value_info(name: str, v: Value):
    from onnx import helper

    return helper.make_tensor_value_info(name, ONNX_DTYPES[v.type.dtype], list(v.type.shape))


def _translate(graph: Graph) -> tuple[Nodes, dict[Value, str], list[tuple[str, Value]]]:
    """The ONNX nodes of `graph`'s ops, every value's ONNX name (params: their paths) and
    the graph outputs (`y`, `y1`, ...: Identity nodes, so an output may be an input too)."""
    names: dict[Value, str] = {op.result: op.attributes["path"] for op in graph.params()}
    b = Nodes(reserved=set(names.values()))
    names.update((a, b.fresh(a.name or "x")) for a in graph.args)
    for op in graph.ops:
        if op.name not in STRUCTURAL:
            b.doc = _doc(op)
            names[op.result] = RULES[op.name](b, op, *(names[v] for v in op.operands))
    b.doc = "func.return"
    outputs = [(b.node("Identity", names[v], out=b.fresh(f"y{i or ''}")), v)
               for i, v in enumerate(graph.outputs)]
    return b, names, outputs


def to_onnx(model: Module, *example_inputs):
    """The `onnx.ModelProto` of `model.forward` on `example_inputs` (checked, not written)."""
    import onnx
    from onnx import helper

    graph = export_graph(model, *example_inputs)
    check_exportable(graph)
    table = ParamTable(model)()
    initializers = [_tensor(op.attributes["path"], table[op.attributes["id"]].val(),
                            op.result.type.dtype) for op in graph.params()]
    b, names, outputs = _translate(graph)
    nodes = [helper.make_node(n.op_type, n.inputs, n.outputs, doc_string=n.doc,
                              **{k: _tensor("", v.value, v.dtype) if isinstance(v, Const) else v
                                 for k, v in n.attrs.items()})
             for n in b.nodes]
    computed = [op.result for op in graph.ops if op.name not in STRUCTURAL]
    onnx_graph = helper.make_graph(  # every value typed: the full check compares the types
        nodes, graph.name, [_value_info(names[a], a) for a in graph.args],
        [_value_info(name, v) for name, v in outputs], initializers,
        value_info=[_value_info(names[v], v) for v in computed])
    proto = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ember", ir_version=IR_VERSION,
                              doc_string=f"{type(model).__name__}.forward, exported by ember")
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise OnnxExportError(f"ember built an invalid ONNX model (a bug in its export rules): "
                              f"{e}") from e
    return proto


def save(model: Module, path: str, *example_inputs) -> str:
    """Export `model.forward` on `example_inputs` (numpy arrays or em.TensorSpecs: the ONNX
    inputs get their static shapes and dtypes) to `path`, atomically; returns `path`."""
    write_atomically(path, to_onnx(model, *example_inputs).SerializeToString())
    return path
