"""`em.onnx.load`: an ONNX model as an ember Module whose forward is the ONNX graph.

At import, every initializer that feeds computation on the model's inputs becomes a Param
(path `initializers.<ONNX name>`, trainable; BatchNormalization's running statistics are
buffers); the rest (shapes, axes, indices, what only shape arithmetic reads) stay numpy
constants. Every node that computes on inputs or Params must be in the op table
(interop/onnx_ops.py) with attributes it supports, and its static inputs (shapes, axes,
pads) must be known: all that is checked first, and one OnnxImportError lists every node
that fails, before anything is built.

While tracing, a node whose inputs are all known (a Constant, shape arithmetic on `Shape`
of a traced tensor, whose shape is static) is folded with numpy by ONNX's reference
implementation; the others are lowered onto ember's ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..frontend import context
from ..frontend.module import Module
from ..frontend.param import Param
from ..frontend.trace import ShapeError, TensorSpec
from ..ir import InferenceError
from .onnx_errors import OnnxImportError
from .onnx_ops import DTYPES, RULES, problems
from .onnx_read import Node, OnnxGraph, read

# ops whose value changes from run to run: folding would freeze one draw
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})


@dataclass
class Plan:
    """What the import decided: which initializers are Params, and of what kind."""

    graph: OnnxGraph
    kinds: dict[str, str]  # initializer name -> "float" | "buffer" (the Params)
    folders: dict = field(default_factory=dict, repr=False)  # node index -> evaluator


def load(model, constants: dict | None = None, base_dir: str | None = None) -> OnnxModule:
    """An ONNX model (a path, bytes or an `onnx.ModelProto`) as an ember Module.

    `constants`: values for graph inputs that are not data (a shape, axes, indices), which
    then become constants of the model. `base_dir`: where external data files are, for a
    model given as bytes or a ModelProto (a path's own folder otherwise).
    """
    graph = read(model, base_dir)
    _bind(graph, constants or {})
    kinds = _param_kinds(graph)
    _check(graph, _dynamic(graph, set(kinds)))
    return OnnxModule(Plan(graph, kinds))


def _bind(graph: OnnxGraph, constants: dict) -> None:
    names = {i.name for i in graph.inputs}
    unknown = sorted(set(constants) - names)
    if unknown:
        raise OnnxImportError(f"constants for {', '.join(map(repr, unknown))}: the graph has no "
                              f"such inputs (its inputs: {', '.join(sorted(names))})")
    graph.initializers.update({k: np.asarray(v) for k, v in constants.items()})
    graph.inputs = [i for i in graph.inputs if i.name not in constants]


def _slots(node: Node, which: str) -> list[tuple[int, str]]:
    """(slot, name) of the node's inputs that are data (`which="data"`) or static."""
    static = RULES[node.op_type].static if node.op_type in RULES else frozenset()
    return [(k, i) for k, i in enumerate(node.inputs)
            if i and ((k in static) == (which == "static"))]


def _dynamic(graph: OnnxGraph, params: set[str]) -> set[str]:
    """The values computed from graph inputs or Params (the rest are known at import).
    `Shape` reads only its input's (static) shape, so its result is always known."""
    dynamic = {i.name for i in graph.inputs} | params
    for n in graph.nodes:
        if n.op_type != "Shape" and any(i in dynamic for i in n.inputs):
            dynamic.update(o for o in n.outputs if o)
    return dynamic


def _param_kinds(graph: OnnxGraph) -> dict[str, str]:
    """The float initializers whose values flow, as data, into computation on the inputs:
    Params, "buffer" where only running-statistics inputs read them."""
    dynamic = _dynamic(graph, set())
    needed: set[str] = set()
    buffer_uses: dict[str, bool] = {}
    for n in reversed(graph.nodes):  # consumers before producers
        if n.op_type == "Shape" or not any(o in dynamic or o in needed for o in n.outputs):
            continue
        buffers = RULES[n.op_type].buffers if n.op_type in RULES else frozenset()
        for k, i in _slots(n, "data"):
            if i not in dynamic:
                needed.add(i)
                buffer_uses[i] = buffer_uses.get(i, True) and k in buffers
    return {name: "buffer" if buffer_uses[name] else "float"
            for name, a in graph.initializers.items() if name in needed and a.dtype.kind == "f"}


def _check(graph: OnnxGraph, dynamic: set[str]) -> None:
    """Every problem of every node, in one OnnxImportError."""
    from onnx import TensorProto

    found = []
    for n in graph.nodes:
        if not any(i in dynamic for i in n.inputs) and n.op_type != "Shape":
            what = []  # folded at import: any op of ONNX's own domain will do
            if n.domain not in ("", "ai.onnx"):
                what.append(f"op {n.domain}.{n.op_type} is not supported")
            elif n.op_type in RANDOM_OPS:
                what.append("random ops are not supported")
        else:
            what = problems(n)
            what += [f"input {k} ({i!r}) must be known at import (an initializer, a Constant "
                     "or shape arithmetic), but it is computed from the graph's inputs"
                     for k, i in _slots(n, "static") if i in dynamic]
            what += [f"{v!r} is {TensorProto.DataType.Name(t).lower()} (ember has float, "
                     "double, float16, int64, int32, bool)"
                     for v in (*n.inputs, *n.outputs) if v in dynamic
                     and (t := graph.value_types.get(v)) is not None and t not in DTYPES]
        found += [f"{n.where}: {w}" for w in what]
    if found:
        nodes = len({f.split(":")[0] for f in found})
        raise OnnxImportError(f"cannot import the model: {nodes} node"
                              f"{'s are' if nodes > 1 else ' is'} not supported:", found)


class OnnxModule(Module):
    """An imported ONNX graph: `forward(*inputs)` in the graph's input order; one result,
    or a tuple of them in the graph's output order."""

    def __init__(self, plan: Plan):
        super().__init__()
        g = plan.graph
        self.initializers = {name: Param.from_array(g.initializers[name],
                                                    kind="buffer" if kind == "buffer" else None)
                             for name, kind in plan.kinds.items()}
        self.plan = plan  # a constant: never visited

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.plan.graph.inputs]

    @property
    def input_dims(self) -> list[tuple | None]:
        """Each input's declared dims (ints, or names of symbolic ones; None: undeclared)."""
        return [i.dims for i in self.plan.graph.inputs]

    def check_inputs(self, *shapes: tuple[int, ...]) -> None:
        """OnnxImportError naming both shapes where an input shape does not fit the model."""
        if len(shapes) != len(self.plan.graph.inputs):
            raise OnnxImportError(f"the model takes {len(self.plan.graph.inputs)} inputs "
                                  f"({', '.join(self.input_names)}), got {len(shapes)}")
        for i, shape in zip(self.plan.graph.inputs, shapes):
            _check_shape(i, tuple(shape))

    def input_specs(self, shapes: dict[str, tuple[int, ...]] | None = None) -> list[TensorSpec]:
        """Each input's declared shape and dtype (`shapes` overrides by name); a clear error
        naming the input when a dim is symbolic and no shape is given."""
        shapes, specs = dict(shapes or {}), []
        unknown = sorted(set(shapes) - set(self.input_names))
        if unknown:
            raise OnnxImportError(f"no graph input named {', '.join(map(repr, unknown))} (the "
                                  f"inputs: {', '.join(self.input_names)})")
        for i in self.plan.graph.inputs:
            dtype = DTYPES.get(i.elem_type)
            if dtype is None:
                raise OnnxImportError(f"input {i.name!r} has ONNX type {i.elem_type}, which "
                                      "ember has not")
            shape = shapes.get(i.name, i.dims)
            if shape is None or not all(isinstance(d, int) for d in shape):
                example = "x".join(str(d if isinstance(d, int) else 1) for d in i.dims or (1,))
                raise OnnxImportError(
                    f"input {i.name!r} has no static shape "
                    f"({_dims(i.dims) if i.dims is not None else 'none declared'}): give one, "
                    f"e.g. --input-shape {i.name}={example}")
            specs.append(TensorSpec(tuple(shape), dtype))
        return specs

    def forward(self, *xs):
        g = self.plan.graph
        if len(xs) != len(g.inputs):
            raise TypeError(f"the ONNX model takes {len(g.inputs)} inputs "
                            f"({', '.join(self.input_names)}), got {len(xs)}")
        t = context.current()
        env = dict(g.initializers)
        env.update({name: t.lift(p) for name, p in self.initializers.items()})
        for i, x in zip(g.inputs, xs):
            env[i.name] = t.lift(x)
        self.check_inputs(*(env[i.name].shape for i in g.inputs))
        for n in g.nodes:
            outs = self._run(n, [env[i] if i else None for i in n.inputs])
            env.update((o, v) for o, v in zip(n.outputs, outs) if o)
        results = [t.lift(env[o]) for o in g.outputs]
        return results[0] if len(results) == 1 else tuple(results)

    def _run(self, n: Node, values: list) -> list:
        """The node's results: folded with numpy when every input is known, else lowered."""
        if all(v is None or isinstance(v, np.ndarray) for v in values):
            return fold(self.plan, n, values)
        try:
            out = RULES[n.op_type].lower(n, *values)
        except OnnxImportError:
            raise
        except (ShapeError, InferenceError, ValueError, TypeError, IndexError, KeyError) as e:
            raise OnnxImportError(f"{n.where}: {e}") from None  # a malformed node, named
        return list(out) if isinstance(out, tuple) else [out]

    def extra_repr(self) -> str:
        g = self.plan.graph
        return (f"inputs={self.input_names}, outputs={g.outputs}, nodes={len(g.nodes)}, "
                f"opset={g.opset}")


# what folding may make of a model's constants: elements of one result, and iterations of
# a Loop (a model of a few hundred bytes could ask for gigabytes, or 2^40 iterations)
MAX_FOLDED_ELEMENTS = 1 << 27
MAX_FOLDED_ITERATIONS = 100_000


def _fold_size(n: Node, values: list) -> str | None:
    """Why folding `n` would take too much memory or time, judged before it runs from the
    inputs that size its result (a shape, repeats, a range, a trip count); None if not."""
    def ints(i):
        return [int(v) for v in np.ravel(values[i])] if len(values) > i and \
            values[i] is not None else None

    op, count = n.op_type, None
    try:
        if op == "Loop":
            trips = ints(0)
            if trips is None or trips[0] > MAX_FOLDED_ITERATIONS:
                return (f"it would loop {'until its condition' if trips is None else trips[0]}"
                        f" times (at most {MAX_FOLDED_ITERATIONS:,} are folded)")
        elif op == "ConstantOfShape":
            count = int(np.prod(ints(0), dtype=object))
        elif op == "Expand":
            count = int(np.prod(np.broadcast_shapes(np.shape(values[0]), tuple(ints(1))),
                                dtype=object))
        elif op == "Tile":
            count = np.size(values[0]) * int(np.prod(ints(1), dtype=object))
        elif op == "Range":
            start, limit, delta = (float(np.ravel(v)[0]) for v in values[:3])
            count = max(0, int(np.ceil((limit - start) / delta))) if delta else None
    except (TypeError, ValueError, OverflowError, IndexError):
        return None  # malformed: the reference implementation says what is wrong
    if count is not None and count > MAX_FOLDED_ELEMENTS:
        return f"its result would have {count:,} elements (at most {MAX_FOLDED_ELEMENTS:,})"
    return None


def fold(plan: Plan, n: Node, values: list) -> list[np.ndarray]:
    """Run one node on numpy values with ONNX's reference implementation (pure numpy),
    unless its result would be too large or its loop too long (`_fold_size`)."""
    from onnx.reference import ReferenceEvaluator

    too_much = _fold_size(n, values)
    if too_much is not None:
        raise OnnxImportError(f"{n.where}: not folded at import: {too_much}")
    ev = plan.folders.get(n.index)
    try:
        if ev is None:
            ev = plan.folders[n.index] = ReferenceEvaluator(n.proto,
                                                            opsets={"": plan.graph.opset})
        feeds = {i: v for i, v in zip(n.inputs, values) if i}
        return [np.asarray(v) for v in ev.run(None, feeds)]
    except Exception as e:  # the reference implementation's own errors, of any class
        raise OnnxImportError(f"{n.where}: folding it at import failed: {type(e).__name__}: "
                              f"{e}") from None


def _dims(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _check_shape(i, shape: tuple) -> None:
    """An input must have the declared shape, but for the batch (first) dim, which exporters
    fix to their example's size."""
    if i.dims is None:
        return
    if len(i.dims) != len(shape) or any(isinstance(d, int) and d != s
                                        for d, s in list(zip(i.dims, shape))[1:]):
        raise OnnxImportError(f"input {i.name!r}: the model takes {_dims(i.dims)}, got "
                              f"{_dims(shape)}")


__all__ = ["OnnxImportError", "OnnxModule", "load"]
