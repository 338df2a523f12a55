"""Reading an ONNX model into plain data: its nodes in an order that computes each value
before it is used, its initializers as numpy arrays, its inputs and outputs.

Nothing in a file is executed or unpickled: the protobuf is parsed by `onnx`, external
data is read here (`load_external_data=False`), only from files inside the model's own
folder, each bounds-checked. A model of an opset before 13 is upgraded to 13 by
`onnx.version_converter` (one notice on stderr). A damaged file, a missing external file,
a name used but never defined, or a cycle raises OnnxImportError before anything is built.
"""

from __future__ import annotations

import graphlib
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from .onnx_errors import OnnxImportError

# older opsets define Softmax, Squeeze, ReduceSum, ... differently: a model of one is
# upgraded to MIN_OPSET by onnx.version_converter on import (`_upgrade`)
MIN_OPSET = 13


@dataclass(frozen=True)
class Node:
    """One ONNX node: `where` names it for messages ("node 3 'conv1' (Conv)")."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]  # "" where an optional input is left out
    outputs: tuple[str, ...]
    attrs: dict
    proto: object = field(repr=False, compare=False)

    @property
    def where(self) -> str:
        named = f" {self.name!r}" if self.name else ""
        return f"node {self.index}{named} ({self.op_type})"


@dataclass(frozen=True)
class Input:
    """A graph input: its ONNX element type and its dims (ints, or names of symbolic ones)."""

    name: str
    elem_type: int
    dims: tuple | None  # None: no shape declared


@dataclass
class OnnxGraph:
    nodes: list[Node]  # in an order that defines every value before its use
    initializers: dict[str, np.ndarray]
    inputs: list[Input]  # without those that initializers give values to
    outputs: list[str]
    opset: int
    value_types: dict[str, int]  # element types, from the file and shape inference


def read(model, base_dir: str | None = None) -> OnnxGraph:
    """A path, bytes or an `onnx.ModelProto` as an OnnxGraph; OnnxImportError if damaged."""
    proto, base_dir = _parse(model, base_dir)
    graph = proto.graph
    opset = _opset(proto)
    if opset is None:
        raise OnnxImportError("the model imports no opset of the default ONNX domain")
    if opset < MIN_OPSET:
        proto, opset = _upgrade(proto, opset), MIN_OPSET
        graph = proto.graph
    initializers = {t.name: _array(t, base_dir) for t in graph.initializer}
    if graph.sparse_initializer:
        raise OnnxImportError("sparse initializers are not supported: "
                              f"{', '.join(s.values.name for s in graph.sparse_initializer)}")
    inputs = [_input(i) for i in graph.input if i.name not in initializers]
    nodes = [_node(i, n) for i, n in enumerate(graph.node)]
    outputs = [o.name for o in graph.output]
    if not outputs:
        raise OnnxImportError("the graph has no outputs")
    kinds = {o.name: o.type.WhichOneof("value") for o in graph.output}
    if not_tensors := [f"{n!r} ({k.removesuffix('_type')})" for n, k in kinds.items()
                       if k not in (None, "tensor_type")]:
        raise OnnxImportError(f"graph outputs {', '.join(not_tensors)} are not tensors (an "
                              "imported model returns tensors; sequences may be used inside "
                              "the graph)")
    nodes = _ordered(nodes, set(initializers) | {i.name for i in inputs}, outputs)
    return OnnxGraph(nodes, initializers, inputs, outputs, opset, _value_types(proto))


def _opset(proto) -> int | None:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def _upgrade(proto, opset: int):
    """A model of an opset before MIN_OPSET, converted to MIN_OPSET by
    `onnx.version_converter` with a one-line notice; OnnxImportError with the converter's
    own message where it cannot convert the model."""
    from onnx import version_converter

    resizes = sorted({n.op_type for n in proto.graph.node
                      if n.op_type in ("Resize", "Upsample") and n.domain in ("", "ai.onnx")})
    if opset < 11 and resizes:  # the converter keeps their asymmetric coordinates implicit,
        raise OnnxImportError(  # which opset 13 reads as half_pixel: a silently wrong image
            f"the model uses opset {opset} with {' and '.join(resizes)}, whose coordinate "
            f"mapping onnx.version_converter does not carry over to opset {MIN_OPSET}: "
            "export it again at opset 11 or later")
    try:
        upgraded = version_converter.convert_version(proto, MIN_OPSET)
    except Exception as e:  # the converter's C++ assertions arrive as RuntimeError, ...
        raise OnnxImportError(f"the model uses opset {opset} of the default ONNX domain; ember "
                              f"imports opsets {MIN_OPSET} and later, and onnx.version_converter "
                              f"cannot upgrade it: {str(e).strip()}") from None
    print(f"ember: the model's opset {opset} was upgraded to {MIN_OPSET} on import "
          "(onnx.version_converter)", file=sys.stderr)
    return upgraded


def _parse(model, base_dir: str | None):
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return model, base_dir
    if isinstance(model, (bytes, bytearray)):
        data, where = bytes(model), "the model bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise OnnxImportError(f"cannot read {path}: {e.strerror or e}") from None
        where, base_dir = path, os.path.dirname(os.path.abspath(path)) if base_dir is None \
            else base_dir
    else:
        raise TypeError(f"em.onnx.load takes a path, bytes or an onnx.ModelProto, got a "
                        f"{type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise OnnxImportError(f"{where} is not a valid ONNX model (truncated or damaged?): "
                              f"{e}") from None
    if not proto.HasField("graph") or not proto.opset_import:
        raise OnnxImportError(f"{where} is not a valid ONNX model: it has no "
                              f"{'graph' if not proto.HasField('graph') else 'opset_import'}")
    return proto, base_dir


def _array(tensor, base_dir: str | None) -> np.ndarray:
    """An initializer's value; external data is read from inside `base_dir` only."""
    from onnx import TensorProto, numpy_helper

    if tensor.data_location == TensorProto.EXTERNAL:
        tensor = _with_external_data(tensor, base_dir)
    try:
        return numpy_helper.to_array(tensor)
    except Exception as e:  # a value that does not fit its shape, an unknown type, ...
        raise OnnxImportError(f"initializer {tensor.name!r} is damaged: {e}") from None


def _with_external_data(tensor, base_dir: str | None):
    info = {e.key: e.value for e in tensor.external_data}
    name = tensor.name
    if base_dir is None:
        raise OnnxImportError(f"initializer {name!r} keeps its data in an external file, but "
                              "the model was given without a folder to find it in: load it "
                              "from its path")
    location = info.get("location", "")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if not location or os.path.isabs(location) or os.path.commonpath([root, path]) != root:
        raise OnnxImportError(f"initializer {name!r}: external data location {location!r} is "
                              f"not a file inside the model's folder {base_dir}")
    if not os.path.isfile(path):
        raise OnnxImportError(f"initializer {name!r}: external data file {location!r} is "
                              f"missing (looked in {base_dir})")
    need = _byte_size(tensor)
    try:
        offset, length = int(info.get("offset", 0)), info.get("length")
        size = os.path.getsize(path)
        length = (need if need is not None else size - offset) if length is None \
            else int(length)
    except ValueError:
        raise OnnxImportError(f"initializer {name!r}: bad external data offset/length "
                              f"{info}") from None
    if need is not None and length != need:
        raise OnnxImportError(f"initializer {name!r}: its external data holds {length} bytes, "
                              f"its shape {list(tensor.dims)} and type need {need}")
    if offset < 0 or length < 0 or offset + length > size:
        raise OnnxImportError(f"initializer {name!r}: external data [{offset}, "
                              f"{offset + length}) is outside {location!r} ({size} bytes)")
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    from onnx import TensorProto

    inline = TensorProto()
    inline.CopyFrom(tensor)
    del inline.external_data[:]
    inline.data_location = TensorProto.DEFAULT
    inline.raw_data = raw
    return inline


def _byte_size(tensor) -> int | None:
    """The bytes a tensor's shape and type take (None for types not one whole byte or more
    an element): what is read of its external file, never the rest of it."""
    from onnx import helper

    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    packed = {"INT4", "UINT4", "FLOAT4E2M1"}  # two elements a byte
    if helper.tensor_dtype_to_string(tensor.data_type).removeprefix("TensorProto.") in packed:
        return None
    return math.prod(tensor.dims) * itemsize


def _input(value_info) -> Input:
    t = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type"):
        raise OnnxImportError(f"graph input {value_info.name!r} is not a tensor")
    dims = None
    if t.HasField("shape"):
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in t.shape.dim)
    return Input(value_info.name, t.elem_type, dims)


def _node(index: int, proto) -> Node:
    from onnx import helper

    if any(a.type == a.GRAPH or a.type == a.GRAPHS for a in proto.attribute):
        attrs = {a.name: None for a in proto.attribute}  # subgraphs: If, Loop, Scan
    else:
        attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
    return Node(index, proto.name, proto.op_type, proto.domain, tuple(proto.input),
                tuple(proto.output), attrs, proto)


def _ordered(nodes: list[Node], given: set[str], outputs: list[str]) -> list[Node]:
    """The nodes in an order that computes every value before its use (ONNX requires the
    file's order to be one; a graph with a cycle has none)."""
    producer: dict[str, Node] = {}
    problems = []
    for n in nodes:
        for o in n.outputs:
            if o and (o in producer or o in given):
                problems.append(f"{n.where}: output {o!r} is already defined")
            producer.setdefault(o, n)
    for n in nodes:
        problems += [f"{n.where}: input {i!r} is not defined by any node, initializer or "
                     "graph input" for i in n.inputs if i and i not in producer and i not in given]
    problems += [f"graph output {o!r} is not defined" for o in outputs
                 if o not in producer and o not in given]
    if problems:
        raise OnnxImportError("the graph is malformed:", problems)
    deps = {n.index: {producer[i].index for i in n.inputs if i in producer} for n in nodes}
    try:
        order = list(graphlib.TopologicalSorter(deps).static_order())
    except graphlib.CycleError as e:
        cycle = " -> ".join(nodes[i].where for i in e.args[1])
        raise OnnxImportError(f"the graph has a cycle: {cycle}") from None
    return [nodes[i] for i in order]


def _value_types(proto) -> dict[str, int]:
    """Element types of every value that the file or ONNX's shape inference knows."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False).graph
    except Exception:  # inference is a help for messages, not a requirement
        inferred = proto.graph
    out = {}
    for v in (*inferred.value_info, *inferred.input, *inferred.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            out[v.name] = v.type.tensor_type.elem_type
    for t in proto.graph.initializer:
        out[t.name] = t.data_type
    return out
