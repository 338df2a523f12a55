"""`em.onnx.load`: an ONNX model as an ember Module whose forward is the ONNX graph.

Which initializers become Params (path `initializers.<ONNX name>`), the rule, for the float
initializers that computation on the model's inputs reads as data:
- a *weight* is a trainable Param: one that reaches, directly or through ops that only move
  values (Transpose, Reshape, Cast, Slice, Concat, ...; `MOVES`), a weight input of
  MatMul, Gemm, Conv, ConvTranspose, the scale or bias of a normalization, Gather's data
  (an embedding) or PRelu's slope (`WEIGHT_INPUTS`), whatever its size; or one with more
  than one element that any other op reads (an Add's bias, a Mul's scale);
- a *buffer* (a Param never trained) is one only running-statistics inputs read
  (BatchNormalization's mean and variance);
- a *constant* (a numpy value, folded into the graph) is any other: a scalar or size-1
  broadcast that only arithmetic reads. Exporters store the Python numbers of a forward
  that way (torch's dynamo exporter: an attention scale 0.125, GELU's 0.5 and 0.044715, a
  mask fill -3.4e38); in PyTorch they were never parameters, and training them diverges.
  So are integer and bool initializers (shapes, axes, indices, masks), floats only shape
  arithmetic or static inputs read, and inputs given values by `constants=`.
`load(..., trainable=...)` picks which weights train (the others are frozen Params,
`requires_grad=False`, as `requires_grad_(False)` in PyTorch), and `module.import_report()`
says what became of each initializer and why.

Every node that computes on inputs or Params must be in the op table
(interop/onnx_ops.py) with attributes it supports, and its static inputs (shapes, axes,
pads) must be known: all that is checked first, and one OnnxImportError lists every node
that fails, before anything is built.

While tracing, a node whose inputs are all known (a Constant, shape arithmetic on `Shape`
of a traced tensor, whose shape is static) is folded with numpy by ONNX's reference
implementation; the others are lowered onto ember's ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..frontend import context
from ..frontend.module import Module
from ..frontend.param import Param
from ..frontend.trace import ShapeError, TensorSpec
from ..ir import InferenceError, is_float
from .onnx_errors import OnnxImportError
from .onnx_ops import DTYPES, RULES, problems
from .onnx_read import Node, OnnxGraph, read

# ops whose value changes from run to run: folding would freeze one draw
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})


# inputs that make an initializer a weight whatever its size (see the module docstring)
WEIGHT_INPUTS = {"MatMul": (0, 1), "Gemm": (0, 1, 2), "Conv": (1, 2), "ConvTranspose": (1, 2),
                 "LayerNormalization": (1, 2), "BatchNormalization": (1, 2),
                 "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2),
                 "Gather": (0,), "PRelu": (1,)}
# ops whose results are their data inputs' values moved, as a weight reaches a MatMul through
# a Transpose
MOVES = frozenset({"Identity", "Cast", "CastLike", "Transpose", "Reshape", "Flatten", "Squeeze",
                   "Unsqueeze", "Expand", "Slice", "Split", "Concat", "Tile"})


@dataclass
class ImportPlan:
    """What the import decided: which initializers are Params, of what kind, and why."""

    graph: OnnxGraph
    kinds: dict[str, str]  # initializer name -> "float" | "frozen" | "buffer" (the Params)
    folders: dict = field(default_factory=dict, repr=False)  # node index -> evaluator
    why: dict[str, str] = field(default_factory=dict)  # initializer name -> the reason


ROLES = ("trainable", "frozen", "buffer", "constant")


class ReportRow(NamedTuple):
    name: str  # the ONNX initializer's name (the Param's path is `initializers.<name>`)
    role: str  # one of ROLES
    shape: tuple
    dtype: str
    why: str


@dataclass(frozen=True)
class ImportReport:
    """`OnnxModule.import_report()`: a row for each initializer, Params first; `str()` is
    the table a user reads."""

    rows: tuple[ReportRow, ...]

    def names(self, role: str) -> list[str]:
        """The initializers of one role ("trainable", "frozen", "buffer" or "constant")."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}: one of {', '.join(ROLES)}")
        return [r.name for r in self.rows if r.role == role]

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {r}{'s' * (n != 1 and r in ('buffer', 'constant'))}"
                           for r in ROLES for n in [len(self.names(r))])
        lines = [f"{len(self.rows)} initializers: {counts}"]
        width = max((len(r.name) for r in self.rows), default=0)
        for r in self.rows:
            shape = f"{r.dtype}[{', '.join(map(str, r.shape))}]"
            lines.append(f"  {r.role:<9}  {r.name:<{width}}  {shape:<16} {r.why}")
        return "\n".join(lines)


def load(model, constants: dict | None = None, base_dir: str | None = None, *,
         trainable=None) -> OnnxModule:
    """An ONNX model (a path, bytes or an `onnx.ModelProto`) as an ember Module.

    `constants`: values for graph inputs that are not data (a shape, axes, indices), which
    then become constants of the model. `base_dir`: where external data files are, for a
    model given as bytes or a ModelProto (a path's own folder otherwise).

    `trainable`: which weights (see the module docstring) are trainable Params; the others
    become frozen Params (`requires_grad=False`: still in `parameters()` and the state dict,
    unfrozen by setting `requires_grad`), never constants. By ONNX initializer name:
    - None or True: every weight (the default);
    - False: none (feature extraction, inference);
    - a name, a glob (`"h.0.*"`, fnmatch) or a list of them: the weights they match. An
      exact name may also pick a constant float initializer (a scalar), which then becomes
      a trainable Param (a temperature to learn); globs match weights only;
    - a predicate `(name, array) -> bool`, asked of each weight.
    A name or glob that matches nothing, or names a buffer or an integer initializer, is an
    OnnxImportError listing the close names. Buffers never train.
    """
    graph = read(model, base_dir)
    _bind(graph, constants or {})
    roles = _param_kinds(graph, set(constants or {}))
    kinds = _trainable(graph, roles, trainable)
    _check(graph, _dynamic(graph, set(kinds)))
    why = {n: w for n, (_, w) in roles.items()}
    for n, kind in kinds.items():
        if kind == "frozen" or roles[n][0] == "number":
            why[n] += "; trainable= " + ("left it out" if kind == "frozen" else "names it")
    return OnnxModule(ImportPlan(graph, kinds, why=why))


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


def _param_kinds(graph: OnnxGraph, bound: set[str]) -> dict[str, tuple[str, str]]:
    """Each initializer's role by the module docstring's rule, and why, in words: "weight",
    "buffer", "number" (a constant of size 1 that computation reads: `trainable=` may name
    it) or "constant". `bound`: those `constants=` gave."""
    dynamic = _dynamic(graph, set())
    needed: set[str] = set()
    buffer_uses: dict[str, bool] = {}
    reader: dict[str, Node] = {}  # the first node that reads each value as data
    for n in reversed(graph.nodes):  # consumers before producers
        if n.op_type == "Shape" or not any(o in dynamic or o in needed for o in n.outputs):
            continue
        buffers = RULES[n.op_type].buffers if n.op_type in RULES else frozenset()
        for k, i in _slots(n, "data"):
            if i not in dynamic:
                needed.add(i)
                buffer_uses[i] = buffer_uses.get(i, True) and k in buffers
                reader[i] = n
    weight_use = _weight_uses(graph)
    roles = {}
    for name, a in graph.initializers.items():
        if name in bound:
            roles[name] = ("constant", "given by constants=")
        elif not is_float(a.dtype):
            roles[name] = ("constant", f"not a float: {a.dtype}")
        elif name not in needed:
            roles[name] = ("constant", "read only by shape arithmetic or as a static input "
                           "(a shape, axes), folded at import" if any(
                               name in n.inputs for n in graph.nodes) else "unused")
        elif buffer_uses[name]:
            roles[name] = ("buffer", f"running statistic: {reader[name].where}")
        elif name in weight_use:
            roles[name] = ("weight", weight_use[name])
        elif a.size > 1:
            roles[name] = ("weight", f"{a.size} elements, read by {reader[name].where}")
        else:
            roles[name] = ("number", f"{'a scalar' if a.ndim == 0 else 'size 1'}, read by "
                           f"{reader[name].where}")
    return roles


def _weight_uses(graph: OnnxGraph) -> dict[str, str]:
    """The initializers that reach a weight input (WEIGHT_INPUTS), through MOVES only: the
    first such input of each, in words."""
    origins = {name: {name} for name in graph.initializers}
    found: dict[str, str] = {}
    for n in graph.nodes:
        data = _slots(n, "data")
        for k, i in data:
            if k in WEIGHT_INPUTS.get(n.op_type, ()):
                for name in origins.get(i, ()):
                    found.setdefault(name, f"input {k} of {n.where}")
        if n.op_type in MOVES:
            moved = set().union(*(origins.get(i, set()) for _, i in data))
            origins.update((o, moved) for o in n.outputs if o and moved)
    return found


def _trainable(graph: OnnxGraph, roles: dict[str, tuple[str, str]], trainable) -> dict[str, str]:
    """The Params, name -> kind ("float": trainable, "frozen", "buffer"), as `trainable`
    (see `load`) picks among the weights."""
    weights = [n for n, (role, _) in roles.items() if role == "weight"]
    if trainable is None or trainable is True or trainable is False:
        picked = set() if trainable is False else set(weights)
    elif callable(trainable):
        picked = {n for n in weights if trainable(n, graph.initializers[n])}
    elif isinstance(trainable, str) or (isinstance(trainable, (list, tuple, set, frozenset))
                                        and all(isinstance(p, str) for p in trainable)):
        picked = _matching(roles, weights, [trainable] if isinstance(trainable, str)
                           else list(trainable))
    else:
        raise TypeError("trainable takes None, a bool, a name or glob, a list of them, or a "
                        f"predicate (name, array) -> bool; got {trainable!r}")
    kinds = {n: "buffer" for n, (role, _) in roles.items() if role == "buffer"}
    kinds.update((n, "float" if n in picked else "frozen") for n in weights)
    kinds.update((n, "float") for n in picked)  # a constant named exactly: trained
    return {n: kinds[n] for n in graph.initializers if n in kinds}  # in the file's order


def _matching(roles: dict[str, tuple[str, str]], weights: list[str],
              patterns: list[str]) -> set[str]:
    """The weights the names and globs match, and the float constants named exactly; one
    OnnxImportError for every pattern that matches none, naming the close names."""
    import difflib
    import fnmatch

    picked, problems = set(), []
    for p in patterns:
        role, why = roles.get(p, (None, ""))
        if role in ("weight", "number"):
            picked.add(p)
            continue
        if role is not None:
            problems.append(f"{p!r} is a {'buffer, never trained' if role == 'buffer' else role}"
                            f": {why}")
            continue
        matched = fnmatch.filter(weights, p)
        if matched:
            picked.update(matched)
            continue
        close = difflib.get_close_matches(p, list(roles), n=5, cutoff=0.5)
        problems.append(f"{p!r} matches no weight" + (f" (close: {', '.join(close)})" if close
                                                      else ""))
    if problems:
        raise OnnxImportError(f"trainable= picks {len(problems)} name"
                              f"{'s' * (len(problems) > 1)} that no weight has (the weights: "
                              f"{_few(weights)}):", problems)
    return picked


def _few(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most
                                      else "") if names else "none"


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
                     "double, float16, bfloat16, int64, int32, bool)"
                     for v in (*n.inputs, *n.outputs) if v in dynamic
                     and (t := graph.value_types.get(v)) is not None and t not in DTYPES]
        found += [f"{n.where}: {w}" for w in what]
    found += [f"output {o!r}: {TensorProto.DataType.Name(t).lower()} (ember has float, double, "
              "float16, bfloat16, int64, int32, bool)"
              for o in graph.outputs  # (folded ones too)
              if (t := graph.value_types.get(o)) is not None and t not in DTYPES]
    if found:
        nodes = len({f.split(":")[0] for f in found})
        raise OnnxImportError(f"cannot import the model: {nodes} node"
                              f"{'s are' if nodes > 1 else ' is'} not supported:", found)


class OnnxModule(Module):
    """An imported ONNX graph: `forward(*inputs)` in the graph's input order; one result,
    or a tuple of them in the graph's output order."""

    def __init__(self, plan: ImportPlan):
        super().__init__()
        g = plan.graph
        self.initializers = {name: Param.from_array(
            g.initializers[name], requires_grad=False if kind == "frozen" else None,
            kind="buffer" if kind == "buffer" else None) for name, kind in plan.kinds.items()}
        self.plan = plan  # a constant: never visited

    def import_report(self) -> ImportReport:
        """What became of each initializer, and why: `print()` it, or read its `rows`."""
        rows = []
        for name, a in self.plan.graph.initializers.items():
            p = self.initializers.get(name)
            role = "constant" if p is None else "buffer" if p.kind == "buffer" else \
                "trainable" if p.requires_grad else "frozen"
            rows.append(ReportRow(name, role, tuple(a.shape), str(a.dtype),
                                  self.plan.why.get(name, "")))
        return ImportReport(tuple(sorted(rows, key=lambda r: ROLES.index(r.role))))

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.plan.graph.inputs]

    @property
    def input_dims(self) -> list[tuple | None]:
        """Each input's declared dims (ints, or names of symbolic ones: `batch`, `N`,
        `sequence`, "?" where unnamed; None: undeclared). A symbolic dim takes any size."""
        return [i.dims for i in self.plan.graph.inputs]

    def check_inputs(self, *shapes: tuple[int, ...]) -> None:
        """OnnxImportError naming both shapes where an input shape does not fit the model.

        A symbolic dim takes any size, the same in every input that names it. A fixed batch
        (first) dim takes another size where the graph runs it: exporters fix it to their
        example's, and a graph that reads it only through MatMul, Conv or `Shape` runs any
        batch; one whose constants hold it (a Reshape to [8, 256], as a static export of a
        flatten has) cannot, which is checked here by tracing the graph at the new batch and
        said with the fix: export it with a symbolic batch."""
        inputs = self.plan.graph.inputs
        if len(shapes) != len(inputs):
            raise OnnxImportError(f"the model takes {len(inputs)} inputs "
                                  f"({', '.join(self.input_names)}), got {len(shapes)}")
        sizes: dict[str, tuple[str, int]] = {}
        for i, shape in zip(inputs, shapes):
            _check_shape(i, tuple(shape), sizes)
        moved = [(i, s[0]) for i, s in zip(inputs, shapes) if i.dims and len(s)
                 and isinstance(i.dims[0], int) and s[0] != i.dims[0]]
        dtypes = [DTYPES.get(i.elem_type) for i in inputs]
        t = context.active()
        if not moved or None in dtypes or (t is not None and t.graph.name == "onnx_batch_check"):
            return  # (the trace below calls this again: it checks nothing more)
        from ..frontend.trace import trace_function

        try:
            trace_function(self, self, [TensorSpec(tuple(s), d) for s, d in zip(shapes, dtypes)],
                           name="onnx_batch_check")
        except OnnxImportError as e:
            (i, n), shape = moved[0], ", ".join(['"N"', *(str(d) for d in moved[0][0].dims[1:])])
            raise OnnxImportError(
                f"input {i.name!r}: the model was exported for a batch of {i.dims[0]} and its "
                f"graph does not run a batch of {n} ({e}): export it with a symbolic batch "
                f"dim (ember: em.onnx.save(model, path, em.TensorSpec(({shape})))); torch: "
                "torch.onnx.export(..., dynamic_axes=...))") from None

    def input_specs(self, shapes: dict[str, tuple[int, ...]] | None = None) -> list[TensorSpec]:
        """Each input's declared shape and dtype (`shapes` overrides by name, and must fit
        as `check_inputs` says: any size for a symbolic dim or the batch); a clear error
        naming the input when a dim is symbolic and no shape is given."""
        shapes, specs, sizes = dict(shapes or {}), [], {}
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
            _check_shape(i, tuple(shape), sizes)
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


def fold(plan: ImportPlan, n: Node, values: list) -> list[np.ndarray]:
    """Run one node on numpy values with ONNX's reference implementation (pure numpy),
    or ember's own numpy where that one is wrong (`NUMPY_FOLDS`, interop/onnx_ops_index.py),
    unless its result would be too large or its loop too long (`_fold_size`). A sequence
    result stays a list of arrays."""
    from onnx.reference import ReferenceEvaluator

    from .onnx_ops import NUMPY_FOLDS

    too_much = _fold_size(n, values)
    if too_much is not None:
        raise OnnxImportError(f"{n.where}: not folded at import: {too_much}")
    if n.op_type in NUMPY_FOLDS and n.domain in ("", "ai.onnx"):
        try:
            return [np.asarray(v) for v in NUMPY_FOLDS[n.op_type](n, *values)]
        except OnnxImportError:
            raise
        except (ValueError, TypeError, IndexError) as e:
            raise OnnxImportError(f"{n.where}: folding it at import failed: {e}") from None
    ev = plan.folders.get(n.index)
    try:
        if ev is None:
            ev = plan.folders[n.index] = ReferenceEvaluator(n.proto,
                                                            opsets={"": plan.graph.opset})
        feeds = {i: v for i, v in zip(n.inputs, values) if i}
        return [[np.asarray(a) for a in v] if isinstance(v, list) else np.asarray(v)
                for v in ev.run(None, feeds)]
    except Exception as e:  # the reference implementation's own errors, of any class
        raise OnnxImportError(f"{n.where}: folding it at import failed: {type(e).__name__}: "
                              f"{e}") from None


def _dims(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _check_shape(i, shape: tuple, sizes: dict | None = None) -> None:
    """An input must have the declared shape, but for the batch (first) dim, which exporters
    fix to their example's size (`check_inputs` checks the graph runs another), and its
    symbolic dims (`batch`, `sequence`, any name), which take any size: the same size in
    every input that names it (`sizes`: name -> (input, size) so far)."""
    if i.dims is None:
        return
    if len(i.dims) != len(shape) or any(isinstance(d, int) and d != s
                                        for d, s in list(zip(i.dims, shape))[1:]):
        raise OnnxImportError(f"input {i.name!r}: the model takes {_dims(i.dims)}, got "
                              f"{_dims(shape)}")
    for d, n in zip(i.dims, shape):
        if sizes is None or not isinstance(d, str) or d == "?":
            continue
        other, m = sizes.setdefault(d, (i.name, n))
        if m != n:
            who = f"input {i.name!r}'s dims" if other == i.name else \
                f"inputs {other!r} and {i.name!r}"
            raise OnnxImportError(f"{who} disagree on symbolic dim {d}: {m} vs {n} (the model "
                                  f"takes {_dims(i.dims)}, got {_dims(shape)})")


__all__ = ["OnnxImportError", "OnnxModule", "load"]
