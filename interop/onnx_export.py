"""`em.onnx.save(model, path, *example_inputs)`: a module's inference forward as an ONNX file.

The graph is the one `em.compile` runs, stopped before `fuse`: traced as an inference trace
(Dropout off and BatchNorm on its running statistics, whatever the module's flags say), then
`decompose` and the simplifications. Fused kernels hold scalar bodies that ONNX has no op
for; the core ops before them each have a rule in `onnx_export_ops.RULES`.

Params become initializers named by their module path (`fc1.weight`), so an import keeps
the names. Shapes are the example inputs' static ones, unless a spec names a dim:
`em.TensorSpec(("N", 3, 224, 224))` makes N symbolic in the file. ember's graphs are
static (a reshape to [N*T, d], a broadcast to [N, ...] hold numbers), so the model is traced
at several sizes of each symbolic dim (`FIT_SIZES`, every combination, then `CHECK_SIZES`);
the graphs must be the same but for those numbers, and each number that differs must be
a polynomial of the sizes, at most linear in each (`2*N*T + 1`): fitted on the first
traces, checked on the others. The file computes those numbers at run time from `Shape` of
the inputs; a constant whose shape follows a size must be a fill, an arange or a
triangular mask (a causal attention's), made at run time too. Anything else (a branch on a
size, `x[:N // 2]`, a constant 1/N) is refused with the op, its source line and why.

Nothing is written unless the whole model is built and passes `onnx.checker` (full check,
with shape inference), and then atomically: an error never leaves a file behind.
`onnx` is imported only here, inside the functions.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

from ..files import write_atomically
from ..frontend.module import Module
from ..frontend.trace import TensorSpec, trace_function
from ..ir import Graph, Location, Operation, Value, is_float, numpy_dtype
from ..runtime.params import ParamTable
from ..runtime.pipeline import Stages, inference_pipeline
from .onnx_export_ops import (
    ONNX_DTYPES,
    OPSET,
    RULES,
    STRUCTURAL,
    Const,
    Node,
    Nodes,
    Poly,
    missing,
)

IR_VERSION = 8  # the ONNX IR of opset 18 (onnx 1.13): what every runtime of that opset reads


# each symbolic dim is traced at both fit sizes (every combination of them): the shape
# numbers are fitted there (sizes 1 apart: integer coefficients), then checked at the
# check sizes (the k-th symbolic dim at the k-th size of each), which tell the dims apart
FIT_SIZES = (2, 3)
CHECK_SIZES = ((5, 4, 7, 6, 9, 8), (4, 5, 6, 7, 8, 9))


class OnnxExportError(ValueError):
    """The model cannot be exported: ops that ONNX export has no rule for (all of them are
    listed), or a graph that does not follow its symbolic dims as ONNX can."""


def _specs(example_inputs) -> tuple[TensorSpec, ...]:
    if not example_inputs:
        raise TypeError("em.onnx.save needs an example input (a numpy array or em.TensorSpec) "
                        "for each argument of forward")
    return tuple(TensorSpec.of(x) for x in example_inputs)


def _export(model: Module, specs: tuple[TensorSpec, ...]) -> Graph:
    graph = trace_function(model, model, specs, name="forward", training=False)
    return Stages(graph, [p for p in inference_pipeline() if p != "fuse"]).graph


def export_graph(model: Module, *example_inputs) -> Graph:
    """The graph that is exported: the inference pipeline on `model.forward`, without `fuse`
    (with symbolic dims: the graph at size 2 of each)."""
    specs = _specs(example_inputs)
    return _export(model, _resized(specs, dict.fromkeys(_symbols(specs), FIT_SIZES[0])))


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
    """An ONNX TensorProto of ember dtype `dtype`."""
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(value, numpy_dtype(dtype), order="C"), name)


def _value_info(name: str, v: Value, dims: list | None = None):
    """`v`'s ONNX type: its shape, or `dims` (ints, names of symbolic dims, None: unknown)."""
    from onnx import helper

    return helper.make_tensor_value_info(name, ONNX_DTYPES[v.type.dtype],
                                         list(v.type.shape) if dims is None else dims)


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

    specs = _specs(example_inputs)
    if _symbols(specs):
        graph, onnx_nodes, names, outputs, dims = _dynamic(model, specs)
        arg_dims = [list(s.shape) for s in specs]
    else:
        graph = _export(model, specs)
        check_exportable(graph)
        b, names, outputs = _translate(graph)
        onnx_nodes, dims, arg_dims = b.nodes, {}, [None] * len(specs)
    table = ParamTable(model)()
    initializers = [_tensor(op.attributes["path"], table[op.attributes["id"]].val(),
                            op.result.type.dtype) for op in graph.params()]
    nodes = [helper.make_node(n.op_type, n.inputs, n.outputs, doc_string=n.doc,
                              **{k: _tensor("", v.value, v.dtype) if isinstance(v, Const) else v
                                 for k, v in n.attrs.items()})
             for n in onnx_nodes]
    computed = [op.result for op in graph.ops if op.name not in STRUCTURAL]
    onnx_graph = helper.make_graph(  # every value typed: the full check compares the types
        nodes, graph.name, [_value_info(names[a], a, d) for a, d in zip(graph.args, arg_dims)],
        [_value_info(name, v, dims.get(v)) for name, v in outputs], initializers,
        value_info=[_value_info(names[v], v, dims.get(v)) for v in computed])
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
    inputs get their shapes and dtypes; a named dim, `em.TensorSpec(("N", 64))`, is
    symbolic in the file) to `path`, atomically; returns `path`."""
    write_atomically(path, to_onnx(model, *example_inputs).SerializeToString())
    return path


# symbolic dims: the model traced at several sizes, the numbers that follow them fitted

def _symbols(specs) -> list[str]:
    """The names of the symbolic dims, in the order the inputs first have them."""
    return list(dict.fromkeys(name for s in specs for name in s.symbols.values()))


def _resized(specs, sizes: dict[str, int]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(tuple(sizes[d] if isinstance(d, str) else d for d in s.shape),
                            s.dtype) for s in specs)


def _points(symbols: list[str]) -> list[dict[str, int]]:
    """The sizes the model is traced at: every combination of FIT_SIZES (the first 2**k,
    size 2 of each first), then CHECK_SIZES."""
    return [dict(zip(symbols, sizes)) for sizes in
            [*itertools.product(FIT_SIZES, repeat=len(symbols)), *CHECK_SIZES]]


def _at(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name}={n}" for name, n in sizes.items())


def _subsets(items) -> list[tuple]:
    return [c for r in range(len(items) + 1) for c in itertools.combinations(items, r)]


def _fit(symbols: list[str], points: list[dict[str, int]], values) -> Poly | None:
    """The integer polynomial of the sizes, at most linear in each, that is `values` at
    `points`: fitted on the first 2**k (Moebius inversion of the differences between
    sizes 1 apart), checked on the others; None where there is none."""
    try:
        ints = [int(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        return None
    if any(isinstance(v, (bool, np.bool_)) or i != v for i, v in zip(ints, values)):
        return None
    lo, hi = FIT_SIZES
    grid = {tuple(p[s] for s in symbols): v for p, v in zip(points, ints)}

    def f(high: tuple) -> int:  # the value with the `high` symbols at hi, the others at lo
        return grid[tuple(hi if s in high else lo for s in symbols)]

    coefficients: dict[tuple, int] = {}  # f = sum over S of diff_S * prod_{s in S} (s - lo)
    for high in _subsets(symbols):
        diff = sum((-1) ** (len(high) - len(t)) * f(t) for t in _subsets(high))
        for m in _subsets(high):
            coefficients[m] = coefficients.get(m, 0) + diff * (-lo) ** (len(high) - len(m))
    poly = Poly.of(coefficients)
    return poly if all(poly(p) == v for p, v in zip(points, ints)) else None


def _dim(p: Poly | None) -> int | str | None:
    """An ONNX dim: a size, a symbolic dim's name, or unknown (None) for N*T and the like."""
    if p is None:
        return None
    return p.constant if p.constant is not None else p.symbol


class _Refused(ValueError):
    """Why a value that follows a symbolic size cannot be exported (the caller says where)."""


class _Dynamic:
    """The traces at every size of `_points`, and what is refused, named."""

    def __init__(self, model: Module, specs: tuple[TensorSpec, ...]):
        self.symbols = _symbols(specs)
        self.points = _points(self.symbols)
        k = len(self.symbols)
        self.head = (f"cannot export {type(model).__name__} with symbolic dim"
                     f"{'s' if k > 1 else ''} {', '.join(self.symbols)}")
        self.form = (f"a*{self.symbols[0]} + b" if k == 1 else
                     f"linear in each of {', '.join(self.symbols)}")
        if k > len(CHECK_SIZES[0]):
            raise OnnxExportError(f"{self.head}: at most {len(CHECK_SIZES[0])} symbolic dims "
                                  f"can be exported (each doubles the traces), got {k}")
        tried = sorted({p[name] for p in self.points for name in self.symbols})
        self.graphs: list[Graph] = []
        for sizes in self.points:
            try:
                self.graphs.append(_export(model, _resized(specs, sizes)))
            except Exception as e:  # noqa: BLE001  (what the model raises at a size not given)
                raise OnnxExportError(
                    f"{self.head}: the model does not trace at {_at(sizes)}: "
                    f"{type(e).__name__}: {e} (the export traces it at sizes "
                    f"{', '.join(map(str, tried))} of each symbolic dim to see how its shapes "
                    "follow them)") from e
            if len(self.graphs) == 1:
                check_exportable(self.graphs[0])

    def values(self, values) -> str:
        return "; ".join(f"{v} at {_at(p)}" for v, p in zip(values, self.points))

    def fit(self, values) -> Poly | None:
        return _fit(self.symbols, self.points, values)

    def refuse(self, op: Operation, why: str) -> OnnxExportError:
        return OnnxExportError(f"{self.head}: {op.name}{_where(op.loc)}: {why}")

    def check_graphs(self) -> None:
        """The same ops on the same operands at every size; their attributes the same but
        for numbers that follow the sizes (constants: judged by `follow`)."""
        base, *others = self.graphs
        refs = [_wiring(g) for g in self.graphs]
        for g, r, sizes in zip(others, refs[1:], self.points[1:]):
            k = next((k for k, (a, b) in enumerate(zip(refs[0], r)) if a != b),
                     min(len(refs[0]), len(r)))
            if k < max(len(refs[0]), len(r)):
                raise OnnxExportError(
                    f"{self.head}: the traced graph changes with the sizes: its op {k} is "
                    f"{_op_at(base, k)} at {_at(self.points[0])} but {_op_at(g, k)} at "
                    f"{_at(sizes)} (does forward branch on a size?)")
        for k, op in enumerate(base.ops):
            ops = [g.ops[k] for g in self.graphs]
            for key, v in op.attributes.items():
                vs = [o.attributes.get(key) for o in ops]
                if isinstance(v, np.ndarray) or all(_same(v, w) for w in vs[1:]):
                    continue
                leaves = [_int_leaves(w) for w in vs]
                if any(x is None or len(x) != len(leaves[0]) for x in leaves) or any(
                        self.fit([x[j] for x in leaves]) is None for j in range(len(leaves[0]))):
                    raise self.refuse(op, f"its {key} is {self.values(vs)}: not {self.form}, "
                                          "which the file could compute from the input shapes")

    def dims(self) -> dict[Value, list]:
        """Each value's ONNX dims: sizes, symbolic dims' names, unknown (None) for others."""
        out = {}
        for vs in zip(*([*g.args, *(r for op in g.ops for r in op.results)]
                        for g in self.graphs)):
            shapes = [v.type.shape for v in vs]
            out[vs[0]] = [_dim(self.fit([s[a] for s in shapes])) for a in range(len(shapes[0]))]
        return out

    def follow(self, builds: list[Nodes], sources: dict[str, tuple[str, int]],
               keep: set[str]) -> list[Node]:
        """The first build's nodes, each Constant that differs between the builds made at
        run time from the sizes instead (`keep`: names that must stay, the values' own)."""
        base, others = builds[0], builds[1:]
        e = Nodes(reserved=base.taken)
        e.sources = sources
        out: list[Node] = []
        alias: dict[str, str] = {}
        for k, n in enumerate(base.nodes):
            alts = [o.nodes[k] if k < len(o.nodes) else None for o in others]
            if all(a is not None and _same_node(n, a) for a in alts):
                out.append(Node(n.op_type, [alias.get(i, i) for i in n.inputs], n.outputs,
                                n.attrs, n.doc))
                continue
            where = n.doc or "func.return"
            if n.op_type != "Constant" or any(
                    a is None or a.op_type != "Constant" or a.outputs != n.outputs for a in alts):
                raise OnnxExportError(f"{self.head}: the ONNX nodes of {where} change with "
                                      "the sizes")
            start, want = len(e.nodes), n.outputs[0]
            e.doc = n.doc
            try:
                got = self.constant(e, [n.attrs["value"], *(a.attrs["value"] for a in alts)])
            except _Refused as why:
                raise OnnxExportError(f"{self.head}: {where}: {why}") from None
            if len(e.nodes) > start and e.rename_last(got, want):
                pass
            elif want in keep:
                e.node("Identity", got, out=want)
            else:
                alias[want] = got
            out += e.nodes[start:]
        if any(len(o.nodes) != len(base.nodes) for o in others):
            raise OnnxExportError(f"{self.head}: the ONNX nodes change with the sizes")
        return out

    def constant(self, e: Nodes, consts: list[Const]) -> str:
        """A constant that differs between the sizes, made at run time: numbers that
        follow the sizes (shapes, ends of windows), or a fill, an arange or a triangular
        mask whose shape follows them."""
        dtype, arrays = consts[0].dtype, [np.asarray(c.value) for c in consts]
        if any(c.dtype != dtype for c in consts) or len({a.ndim for a in arrays}) > 1:
            raise _Refused("its dtype or rank changes with the sizes")
        shapes = [a.shape for a in arrays]
        if len(set(shapes)) == 1:
            entries = [self.fit([a.flat[j] for a in arrays]) for j in range(arrays[0].size)]
            if arrays[0].ndim > 1 or dtype == "i1" or None in entries:
                raise _Refused(f"its value is {self.values(a.tolist() for a in arrays)}: not "
                               f"{self.form}, which the file could compute from the input "
                               "shapes")
            out = e.sizes(entries)
            out = out if arrays[0].ndim else e.node("Squeeze", out)
            return out if dtype == "i64" else e.node("Cast", out, to=ONNX_DTYPES[dtype])
        dims = [self.fit([s[a] for s in shapes]) for a in range(len(shapes[0]))]
        if None in dims:
            raise _Refused(f"its shape is {self.values(map(list, shapes))}: not {self.form}")
        first = arrays[0].ravel()
        if all(a.size and (a == first[0]).all() for a in arrays):
            return e.node("Expand", e.const(first[0], dtype), e.sizes(dims))
        if arrays[0].ndim == 1 and dtype != "i1" and (ramp := _arange(arrays)) is not None:
            start, step = ramp
            out = e.range(dims[0])
            out = out if dtype == "i64" else e.node("Cast", out, to=ONNX_DTYPES[dtype])
            out = out if step == 1 else e.node("Mul", out, e.const(step, dtype))
            return out if start == 0 else e.node("Add", out, e.const(start, dtype))
        tri = [_triangle(a) for a in arrays]
        if all(t is not None and t[:2] == tri[0][:2] for t in tri) and \
                (k := self.fit([t[2] for t in tri])) is not None:
            p, q, _ = tri[0]
            rows = e.node("Unsqueeze", e.range(dims[-2]), e.ints([1]))
            upper = e.node("GreaterOrEqual", e.node("Sub", e.range(dims[-1]), rows),
                           e.sizes([k]))
            if dtype == "i1":
                out = upper if p else e.node("Not", upper)
            else:
                out = e.node("Where", upper, e.const(p, dtype), e.const(q, dtype))
            lead = len(dims) - 2
            return out if not lead else e.node("Unsqueeze", out, e.ints(range(lead)))
        raise _Refused(f"its shape follows the sizes ({self.values(map(list, shapes))}), but "
                       "it is no fill, arange or triangular mask, which the file could make at "
                       "run time: compute it from the input in forward, or export without "
                       "symbolic dims")


def _wiring(graph: Graph) -> list[tuple]:
    """Each op's name and where its operands come from (an argument, an earlier op)."""
    where: dict[Value, tuple] = {a: ("arg", i) for i, a in enumerate(graph.args)}
    out = []
    for k, op in enumerate(graph.ops):
        out.append((op.name, tuple(where.get(v) for v in op.operands)))
        where.update((r, (k, j)) for j, r in enumerate(op.results))
    return out


def _op_at(graph: Graph, k: int) -> str:
    return (f"{graph.ops[k].name}{_where(graph.ops[k].loc)}" if k < len(graph.ops)
            else "the end of the graph")


def _same(v, w) -> bool:
    if isinstance(v, np.ndarray) or isinstance(w, np.ndarray):
        v, w = np.asarray(v), np.asarray(w)
        return v.shape == w.shape and v.dtype == w.dtype and \
            np.array_equal(v, w, equal_nan=is_float(v.dtype) or v.dtype.kind == "c")
    return type(v) is type(w) and v == w


def _same_node(n: Node, m: Node) -> bool:
    if (n.op_type, n.inputs, n.outputs, n.attrs.keys()) != \
            (m.op_type, m.inputs, m.outputs, m.attrs.keys()):
        return False
    for k, v in n.attrs.items():
        w = m.attrs[k]
        if isinstance(v, Const):
            if not isinstance(w, Const) or v.dtype != w.dtype or not _same(v.value, w.value):
                return False
        elif not _same(v, w):
            return False
    return True


def _int_leaves(v) -> list[int] | None:
    """The ints of an int or a (nested) list of them; None for anything else."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, np.integer)):
        return [int(v)]
    if isinstance(v, (list, tuple)):
        leaves = [_int_leaves(x) for x in v]
        return None if None in leaves else [i for x in leaves for i in x]
    return None


def _arange(arrays: list[np.ndarray]) -> tuple | None:
    """(start, step) where every array is start + step * arange(its length)."""
    long = next((a for a in arrays if a.size >= 2), None)
    if long is None:
        return None
    start, step = long[0], long[1] - long[0]
    for a in arrays:
        if not np.array_equal(a, (start + step * np.arange(a.size)).astype(a.dtype)):
            return None
    return start, step


def _triangle(a: np.ndarray) -> tuple | None:
    """(p, q, k) where `a` (leading dims of 1) holds p where column - row >= k, else q."""
    if a.ndim < 2 or any(n != 1 for n in a.shape[:-2]) or 0 in a.shape:
        return None
    m = a.reshape(a.shape[-2:])
    rows, cols = m.shape
    d = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    p, q = m[0, -1], m[-1, 0]
    if _same(np.asarray(p), np.asarray(q)):
        return None
    high = m == p
    k = int(d[high].min())
    if not np.array_equal(high, d >= k) or not np.array_equal(m[~high], np.full((~high).sum(),
                                                                                 q, m.dtype)):
        return None
    return p.item(), q.item(), k


def _dynamic(model: Module, specs: tuple[TensorSpec, ...]):
    """What `to_onnx` writes for specs with symbolic dims: the graph at size 2 of each,
    its ONNX nodes with the numbers that follow the sizes computed at run time, its
    value names and outputs, and every value's ONNX dims."""
    d = _Dynamic(model, specs)
    d.check_graphs()
    builds = [_translate(g) for g in d.graphs]
    b, names, outputs = builds[0]
    sources: dict[str, tuple[str, int]] = {}
    for arg, spec in zip(d.graphs[0].args, specs):
        for axis, name in spec.symbols.items():
            sources.setdefault(name, (names[arg], axis))
    nodes = d.follow([t[0] for t in builds], sources, set(names.values()))
    return d.graphs[0], nodes, names, outputs, d.dims()
