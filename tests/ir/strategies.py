"""Graphs for the IR text tests: one example per registered op, random graphs, and an
equality that compares structure (not value names), so a text round trip can be checked.

Random graphs come from `random_graph(rng)`, a plain function of a `random.Random`: under
hypothesis (`graphs()`) the stream is drawn and shrunk by hypothesis; the mlir-opt tests
feed it fixed seeds so that many graphs go through one mlir-opt run.
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from elementwise import BINARY, UNARY
from hypothesis import strategies as st

from ember.ir import (
    OPS,
    Block,
    Builder,
    Graph,
    InferenceError,
    Location,
    Operation,
    Region,
    ScalarType,
    TensorType,
    Value,
)

F32 = "f32"
DENSE_DTYPES = ("f32", "f64", "f16", "i64", "i32", "i1")
SPECIAL_FLOATS = (0.0, -0.0, 1.0, 0.1, 1 / 3, -2.5, 1e-5, 1e20, 5e-324, 1e-300, 1.797e308,
                  math.inf, -math.inf, math.nan, 0.5773502691896258, 65504.0, 6e-8, 3.4e38)
NAMES = (None, None, "x", "y", "input", "x.1", "a-b", "$v", "_t", "arg0", "arg1", "arg2", "0",
         "bad name", "")
KEYS = ("axis", "id", "ember.grads", "k", "value2", "weird key", "a-b", "_x", "x$1")
STRINGS = ("", "fc1.weight", 'q"uote', "back\\slash", "new\nline\ttab", "é€😀", "\x00\x7f",
           "9199rs1gnooc6")
FILES = ("model.py", "a/b c.py", 'q"x.py', "ünï.py")


# -- equality --------------------------------------------------------------------------------

def attrs_equal(a: Any, b: Any) -> bool:
    """Attribute values equal in type and value; floats and arrays bit for bit (NaN == NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape
                and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(attrs_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(attrs_equal(a[k], b[k]) for k in a)
    return a == b


def assert_graphs_equal(a: Graph, b: Graph, locs: bool | str = False) -> None:
    """Same ops, attributes, types, regions and operand wiring (by position, not by name).

    `locs`: False ignores locations, True compares them, "given" checks only those `a` has
    (mlir-opt --mlir-print-debuginfo invents file locations for the rest).
    """
    ids_a: dict[Value, int] = {}
    ids_b: dict[Value, int] = {}

    def loc_ok(x, y):
        return not locs or (locs == "given" and x is None) or x == y

    def block(x: Block, y: Block, where: str):
        assert [v.type for v in x.args] == [v.type for v in y.args], f"{where}: block arg types"
        for v, w in zip(x.args, y.args):
            ids_a[v], ids_b[w] = len(ids_a), len(ids_b)
        assert len(x.ops) == len(y.ops), f"{where}: {len(x.ops)} ops vs {len(y.ops)}"
        for i, (p, q) in enumerate(zip(x.ops, y.ops)):
            op(p, q, f"{where}/{i}:{p.name}")

    def op(p: Operation, q: Operation, where: str):
        assert p.name == q.name, f"{where}: name {q.name}"
        assert [ids_a.get(v) for v in p.operands] == [ids_b.get(v) for v in q.operands], \
            f"{where}: operands"
        assert [v.type for v in p.results] == [v.type for v in q.results], f"{where}: types"
        assert attrs_equal(p.attributes, q.attributes), \
            f"{where}: attributes {p.attributes!r} vs {q.attributes!r}"
        assert loc_ok(p.loc, q.loc), f"{where}: loc {p.loc} vs {q.loc}"
        for v, w in zip(p.results, q.results):
            ids_a[v], ids_b[w] = len(ids_a), len(ids_b)
        assert len(p.regions) == len(q.regions), f"{where}: regions"
        for r, (x, y) in enumerate(zip(p.regions, q.regions)):
            assert len(x.blocks) == len(y.blocks), f"{where}: region {r} blocks"
            for k, (bx, by) in enumerate(zip(x.blocks, y.blocks)):
                block(bx, by, f"{where}/r{r}b{k}")

    assert a.name == b.name, f"graph name {a.name!r} vs {b.name!r}"
    assert attrs_equal(a.attributes, b.attributes), f"graph attributes {b.attributes!r}"
    assert loc_ok(a.loc, b.loc), f"graph loc {a.loc} vs {b.loc}"
    block(a.body, b.body, f"@{a.name}")


def graphs_equal(a: Graph, b: Graph, locs: bool | str = False) -> bool:
    try:
        assert_graphs_equal(a, b, locs)
    except AssertionError:
        return False
    return True


# -- one graph per registered op --------------------------------------------------------------

def _param(b: Builder, shape, path="fc.weight", pid="9199rs1gnooc6") -> Value:
    return b.create("ember.param", [], {"id": pid, "path": path,
                                        "init": "kaiming_uniform"},
                    result_types=[TensorType(shape, F32)]).result


def _named(b: Builder, name: str, *shape: int) -> Value:
    """A param of `shape` with `name` as its path and id, an operand of the op shown."""
    return _param(b, shape, name, name)


CONV = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}
POOL = {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}


def _examples() -> dict[str, Any]:
    """name -> fn(builder, x: f32[2,3], labels: i64[2]) building that op."""
    ex: dict[str, Any] = {
        "ember.param": lambda b, x, l: _param(b, (3, 4)),
        "ember.constant": lambda b, x, l: b.op("ember.constant",
                                               value=np.array([[0.5, -1.0, 2.0]], np.float32)),
        "ember.cmp": lambda b, x, l: b.op("ember.cmp", x, x, predicate="lt"),
        "ember.select": lambda b, x, l: b.op("ember.select",
                                             b.op("ember.cmp", x, x, predicate="ge"), x, x),
        "ember.cast": lambda b, x, l: b.op("ember.cast", x, dtype="f64"),
        "ember.broadcast": lambda b, x, l: b.op("ember.broadcast", x, shape=[4, 2, 3]),
        "ember.reshape": lambda b, x, l: b.op("ember.reshape", x, shape=[3, 2]),
        "ember.transpose": lambda b, x, l: b.op("ember.transpose", x, perm=[1, 0]),
        "ember.matmul": lambda b, x, l: b.op("ember.matmul", x, _param(b, (3, 4))),
        "ember.one_hot": lambda b, x, l: b.op("ember.one_hot", l, num_classes=5, dtype="f32"),
        "func.return": lambda b, x, l: x,
        "nn.linear": lambda b, x, l: b.op("nn.linear", x, _param(b, (3, 4)),
                                          _param(b, (4,), "fc.bias", "tumvmkapa4mm2")),
        "nn.softmax": lambda b, x, l: b.op("nn.softmax", x, axis=1),
        "nn.log_softmax": lambda b, x, l: b.op("nn.log_softmax", x, axis=-1),
        "nn.cross_entropy": lambda b, x, l: b.op("nn.cross_entropy", x, l),
        "nn.layer_norm": lambda b, x, l: b.op("nn.layer_norm", x, axes=[1], eps=1e-5),
        "nn.gelu": lambda b, x, l: b.op("nn.gelu", x, approximate="none"),
        "nn.batch_norm": lambda b, x, l: b.create("nn.batch_norm", [x] + [
            _named(b, n, 3) for n in ("bn.gamma", "bn.beta", "bn.mean", "bn.var")],
            {"eps": 1e-5, "momentum": 0.1, "training": True}).results[0],
        "ember.dropout": lambda b, x, l: b.op("ember.dropout", x, b.op(
            "ember.constant", value=np.array(3, np.int64)), p=0.5, seed=1, key=2),
        "ember.scatter_add": lambda b, x, l: b.op("ember.scatter_add", l, x, shape=[4, 3]),
        "ember.slice": lambda b, x, l: b.op("ember.slice", x, start=[1, 0], step=[1, 2],
                                            shape=[1, 2]),
        "ember.unslice": lambda b, x, l: b.op("ember.unslice", x, start=[1, 0], step=[1, 2],
                                              shape=[4, 5]),
        "ember.concat": lambda b, x, l: b.op("ember.concat", x, b.op("ember.exp", x), x,
                                             axis=-1),
        "ember.conv2d": lambda b, x, l: b.op("ember.conv2d", _named(b, "x", 1, 2, 5, 5),
                                             _named(b, "w", 4, 2, 3, 3), **CONV),
        "ember.conv2d_nhwc": lambda b, x, l: b.op(  # (depthwise: what the cpu runs)
            "ember.conv2d_nhwc", _named(b, "x", 1, 5, 5, 4), _named(b, "w", 3, 3, 1, 4),
            **{**CONV, "groups": 4}),
        "nn.conv2d": lambda b, x, l: b.op("nn.conv2d", _named(b, "x", 1, 2, 5, 5),
                                          _named(b, "w", 4, 2, 3, 3), _named(b, "b", 4), **CONV),
        "ember.conv2d_grad_input": lambda b, x, l: b.op(
            "ember.conv2d_grad_input", _named(b, "g", 1, 4, 5, 5), _named(b, "w", 4, 2, 3, 3),
            input_shape=[1, 2, 5, 5], **CONV),
        "ember.conv2d_grad_weight": lambda b, x, l: b.op(
            "ember.conv2d_grad_weight", _named(b, "x", 1, 2, 5, 5), _named(b, "g", 1, 4, 5, 5),
            weight_shape=[4, 2, 3, 3], **CONV),
        "ember.max_pool2d_grad": lambda b, x, l: b.op(
            "ember.max_pool2d_grad", _named(b, "x", 1, 2, 4, 4), _named(b, "g", 1, 2, 2, 2),
            **POOL),
        "ember.avg_pool2d_grad": lambda b, x, l: b.op(
            "ember.avg_pool2d_grad", _named(b, "g", 1, 2, 2, 2), input_shape=[1, 2, 4, 4],
            **POOL),
    }
    for n in ("max_pool2d", "avg_pool2d"):
        ex[f"ember.{n}"] = lambda b, x, l, n=n: b.op(f"ember.{n}", _named(b, "x", 1, 2, 4, 4),
                                                    **POOL)
    for n in BINARY:
        ex[f"ember.{n}"] = lambda b, x, l, n=n: b.op(f"ember.{n}", x, x)
    for n in UNARY:
        ex[f"ember.{n}"] = lambda b, x, l, n=n: b.op(f"ember.{n}", x)
    for n in "reduce_sum reduce_mean reduce_max".split():
        ex[f"ember.{n}"] = lambda b, x, l, n=n: b.op(f"ember.{n}", x, axes=[1], keepdims=False)
    return ex


EXAMPLES = _examples()
_DEFAULT_ATTR = {int: 1, float: 0.5, bool: False, str: "f32", list: [0], np.ndarray: np.ones(2)}


def _fallback(b: Builder, x: Value, labels: Value, name: str) -> Value:
    """A registered op with no entry in EXAMPLES (added since): try common operand shapes,
    else build it with an explicit result type (text round-trips need no valid types)."""
    d = OPS[name]
    attrs = {k: _DEFAULT_ATTR.get(t if isinstance(t, type) else type(t), 1)
             for k, t in d.attrs.items()}
    for operands in ([], [x], [x, x], [x, labels], [x, x, x]):
        try:
            return b.create(name, operands, attrs).results[0]
        except (InferenceError, IndexError, KeyError, TypeError, ValueError):
            continue
    return b.create(name, [x], attrs, result_types=[x.type]).result


def op_graph(name: str) -> Graph:
    """A small graph whose last computed value comes from op `name`."""
    g = Graph("forward", [TensorType((2, 3), F32), TensorType((2,), "i64")], ["x", "labels"])
    b = Builder(g.body)
    x, labels = g.args
    make = EXAMPLES.get(name)
    out = make(b, x, labels) if make else _fallback(b, x, labels, name)
    b.create("func.return", [out])
    return g


# -- random graphs ----------------------------------------------------------------------------

def rand_float(rng: random.Random) -> float:
    if rng.random() < 0.4:
        return rng.choice(SPECIAL_FLOATS) * rng.choice((1, -1))
    return rng.uniform(-1, 1) * 10.0 ** rng.randint(-40, 40)


def rand_array(rng: random.Random, dtype: str | None = None, shape=None) -> np.ndarray:
    dtype = dtype or rng.choice(DENSE_DTYPES)
    if shape is None:
        shape = tuple(rng.randint(0, 4) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.1:
            shape = rng.choice([(101,), (11, 10), (130,)])  # mlir-opt prints these as hex
    n = math.prod(shape)
    if dtype == "i1":
        vals = [rng.random() < 0.5 for _ in range(n)]
    elif dtype in ("i32", "i64"):
        hi = 2 ** (31 if dtype == "i32" else 63)
        vals = [rng.choice((0, 1, -1, hi - 1, -hi, rng.randint(-hi, hi - 1))) for _ in range(n)]
    else:
        vals = [rand_float(rng) for _ in range(n)]
    if n and rng.random() < 0.3:
        vals = [vals[0]] * n  # a splat
    with np.errstate(over="ignore"):
        return np.array(vals, {"f32": np.float32, "f64": np.float64, "f16": np.float16,
                               "i32": np.int32, "i64": np.int64, "i1": np.bool_}[dtype]
                        ).reshape(shape)


def rand_attr(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["bool", "int", "float", "str", "type", "array"] + ["list", "dict"] * (depth < 2)
    kind = rng.choice(kinds)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice((0, 1, -1, 3, 2**63 - 1, -2**63, rng.randint(-1000, 1000)))
    if kind == "float":
        return rand_float(rng)
    if kind == "str":
        return rng.choice(STRINGS)
    if kind == "type":
        return rng.choice((TensorType((2, 3), F32), TensorType((), "i1"), ScalarType("bf16")))
    if kind == "array":
        return rand_array(rng)
    if kind == "list":
        return [rand_attr(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rand_attrs(rng, depth + 1)


def rand_attrs(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {rng.choice(KEYS): rand_attr(rng, depth) for _ in range(rng.randint(0, 3))}


def rand_type(rng: random.Random) -> TensorType:
    shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 3)))
    return TensorType(shape, rng.choice((F32, F32, F32, "f64", "i64", "i1", "bf16")))


def rand_loc(rng: random.Random) -> Location | None:
    return Location(rng.choice(FILES), rng.randint(1, 500), rng.randint(0, 80)) \
        if rng.random() < 0.5 else None


def _pick(rng, pool, pred=lambda t: True) -> Value | None:
    vals = [v for v in pool if isinstance(v.type, TensorType) and pred(v.type)]
    return rng.choice(vals) if vals else None


def _floats(t: TensorType) -> bool:
    return t.is_float


def _region(rng: random.Random, operands: list[Value], outer: list[Value], depth: int) -> Region:
    """A scalar body `^bb0(%a: f32, ...)` of kernel ops ending in `kernel.yield`; sometimes
    empty, sometimes with a second block or a nested region, sometimes using outer values."""
    r = Region()
    if rng.random() < 0.1:
        return r
    block = r.append(Block([ScalarType(v.type.dtype) for v in operands],
                           [rng.choice(NAMES) for _ in operands]))
    vals = list(block.args)
    for _ in range(rng.randint(0, 3)):
        ins = [rng.choice(vals + outer) for _ in range(rng.randint(0, 2))] if vals else []
        t = ins[0].type if ins else ScalarType(F32)
        regions = [_region(rng, ins[:1], vals, depth + 1)] if depth < 2 and rng.random() < 0.2 \
            else []
        op = block.append(Operation(rng.choice(("kernel.mul", "kernel.add", "test.scalar")),
                                    ins, [t], rand_attrs(rng, 1) if rng.random() < 0.3 else {},
                                    regions, rand_loc(rng)))
        vals.append(op.result)
    second = rng.random() < 0.15  # MLIR allows an empty block only as a region's only one
    if second or rng.random() < 0.9:
        block.append(Operation("kernel.yield", vals[-1:], []))
    if second:
        r.append(Block([ScalarType("i32")], [rng.choice(NAMES)])).append(
            Operation("test.end", [], []))
    return r


def _region_op(rng, b, pool):
    ins = [v for v in (_pick(rng, pool) for _ in range(rng.randint(0, 3))) if v is not None]
    outs = [v.type for v in ins[:rng.randint(0, 2)]] or ([] if rng.random() < 0.3 else
                                                        [TensorType((2,), F32)])
    regions = [_region(rng, ins, pool, 0) for _ in range(rng.choice((1, 1, 2)))]
    name = rng.choice(("kernel.fused", "test.op", "foo.bar"))
    return b.create(name, ins, rand_attrs(rng), outs, regions).results


def _binary(rng, b, pool):
    x = _pick(rng, pool, lambda t: t.dtype != "i1")
    y = _pick(rng, pool, lambda t: x and t.dtype == x.type.dtype) if x else None
    name = rng.choice(BINARY)
    return [b.op(f"ember.{name}", x, y if rng.random() < 0.7 else x)] if x else []


def _unary(rng, b, pool):
    x = _pick(rng, pool, _floats)
    name = rng.choice(UNARY)
    return [b.op(f"ember.{name}", x)] if x else []


def _cmp_select(rng, b, pool):
    x = _pick(rng, pool, lambda t: t.dtype != "i1")
    if x is None:
        return []
    c = b.op("ember.cmp", x, x, predicate=rng.choice(("eq", "ne", "lt", "le", "gt", "ge")))
    return [c, b.op("ember.select", c, x, x)] if rng.random() < 0.5 else [c]


def _shape_op(rng, b, pool):
    x = _pick(rng, pool)
    if x is None:
        return []
    kind = rng.choice(("cast", "reduce", "broadcast", "reshape", "transpose"))
    if kind == "cast":
        return [b.op("ember.cast", x, dtype=rng.choice(("f32", "f64", "i32", "bf16")))]
    if kind == "reduce":
        axes = [a for a in range(x.type.rank) if rng.random() < 0.5]
        name = rng.choice(("reduce_sum", "reduce_mean", "reduce_max"))
        return [b.op(f"ember.{name}", x, axes=axes, keepdims=rng.random() < 0.5)]
    if kind == "broadcast":
        return [b.op("ember.broadcast", x, shape=[rng.randint(1, 3), *x.type.shape])]
    if kind == "reshape":
        return [b.op("ember.reshape", x, shape=[x.type.size])]
    perm = list(range(x.type.rank))
    rng.shuffle(perm)
    return [b.op("ember.transpose", x, perm=perm)]


def _layer(rng, b, pool):
    x = _pick(rng, pool, lambda t: t.dtype == F32 and t.rank >= 1)
    if x is None:
        return [_param(b, rand_type(rng).shape, rng.choice(STRINGS))]
    kind = rng.choice(("matmul", "linear", "softmax", "ce", "one_hot"))
    n = rng.randint(1, 4)
    if kind == "matmul" and x.type.rank >= 2:
        return [b.op("ember.matmul", x, _param(b, (x.type.shape[-1], n)))]
    if kind == "linear":
        bias = [_param(b, (n,), "l.bias")] if rng.random() < 0.5 else []
        return [b.op("nn.linear", x, _param(b, (x.type.shape[-1], n)), *bias)]
    if kind == "ce" and x.type.rank == 2:
        labels = b.op("ember.constant", value=rand_array(rng, "i64", x.type.shape[:1]))
        return [labels, b.op("nn.cross_entropy", x, labels)]
    if kind == "one_hot":
        labels = b.op("ember.constant", value=rand_array(rng, "i32", x.type.shape))
        return [b.op("ember.one_hot", labels, num_classes=n, dtype=rng.choice(("f32", "i1")))]
    name = rng.choice(("nn.softmax", "nn.log_softmax"))
    return [b.op(name, x, axis=rng.randint(-x.type.rank, x.type.rank - 1))]


def _constant(rng, b, pool):
    return [b.op("ember.constant", value=rand_array(rng))]


MAKERS = (_binary, _unary, _cmp_select, _shape_op, _layer, _constant, _region_op)


def random_graph(rng: random.Random) -> Graph:
    """A random valid-looking chain of registered and unregistered ops (verification aside)."""
    types = [rand_type(rng) for _ in range(rng.randint(0, 3))]
    g = Graph(rng.choice(("forward", "main", "train_step", "my fn")), types,
              [rng.choice(NAMES) for _ in types], loc=rand_loc(rng))
    b = Builder(g.body)
    pool = list(g.args)
    for _ in range(rng.randint(0, 10)):
        n = len(g.ops)
        try:
            pool += rng.choice(MAKERS)(rng, b, pool)
        except InferenceError:
            pass
        for op in g.ops[n:]:
            op.loc = op.loc or rand_loc(rng)
    outs = rng.sample(pool, rng.randint(0, min(3, len(pool))))
    b.create("func.return", outs, loc=rand_loc(rng))
    if rng.random() < 0.5:
        g.attributes = rand_attrs(rng)
    return g


def graphs():
    """Hypothesis strategy of random graphs (shrinks through the drawn random stream)."""
    return st.builds(random_graph, st.randoms(use_true_random=False))


def mlir_opt() -> str | None:
    """Upstream mlir-opt 19 if installed (Debian's mlir-19-tools), else None."""
    for exe in ("mlir-opt", "mlir-opt-19"):
        if path := shutil.which(exe):
            return path
    p = Path("/usr/lib/llvm-19/bin/mlir-opt")
    return str(p) if p.exists() else None


# -- texts as ember and mlir-opt print them (notes/mlir-text.md) ------------------------------

NOTES_INPUT = """\
module {
  func.func @forward(%x: tensor<5x20xf32>) -> tensor<5x48xf32> {
    %0 = "ember.param"() {id = "9199rs1gnooc6", path = "a.weight", init = "kaiming_uniform", gain = 0.5773502691896258 : f64} : () -> tensor<20x48xf32>
    %1 = "ember.param"() {id = "tumvmkapa4mm2", path = "a.bias"} : () -> tensor<48xf32>
    %2 = "nn.linear"(%x, %0, %1) : (tensor<5x20xf32>, tensor<20x48xf32>, tensor<48xf32>) -> tensor<5x48xf32>
    %3 = "ember.relu"(%2) : (tensor<5x48xf32>) -> tensor<5x48xf32>
    %4 = "ember.constant"() {value = dense<1.000000e-01> : tensor<f32>} : () -> tensor<f32>
    %5 = "ember.reduce_sum"(%3) {axes = [1], keepdims = false} : (tensor<5x48xf32>) -> tensor<5xf32>
    %6 = "kernel.fused"(%3, %4) ({
    ^bb0(%a: f32, %b: f32):
      %c = "kernel.mul"(%a, %b) : (f32, f32) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) : (tensor<5x48xf32>, tensor<f32>) -> tensor<5x48xf32>
    func.return %3 : tensor<5x48xf32>
  } loc("model.py":12:5)
}
"""  # noqa: E501

NOTES_GENERIC = """\
#loc1 = loc("model.py":12:5)
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<5x20xf32>) -> tensor<5x48xf32>, sym_name = "forward"}> ({
  ^bb0(%arg0: tensor<5x20xf32> loc("in.mlir":2:22)):
    %0 = "ember.param"() {gain = 0.57735026918962584 : f64, id = "9199rs1gnooc6", init = "kaiming_uniform", path = "a.weight"} : () -> tensor<20x48xf32> loc(#loc3)
    %1 = "ember.param"() {id = "tumvmkapa4mm2", path = "a.bias"} : () -> tensor<48xf32> loc(unknown)
    %2 = "nn.linear"(%arg0, %0, %1) : (tensor<5x20xf32>, tensor<20x48xf32>, tensor<48xf32>) -> tensor<5x48xf32> loc(callsite("f"("a.py":1:2) at "b.py":3:4))
    %3 = "ember.relu"(%2) : (tensor<5x48xf32>) -> tensor<5x48xf32> loc("relu"("c.py":5:6))
    %4 = "ember.constant"() {value = dense<1.000000e-01> : tensor<f32>} : () -> tensor<f32> loc(fused<"x">["a.py":1:2, "b.py":3:4])
    %5 = "ember.reduce_sum"(%3) {axes = [1], keepdims = false} : (tensor<5x48xf32>) -> tensor<5xf32>
    %6 = "kernel.fused"(%3, %4) ({
    ^bb0(%arg1: f32, %arg2: f32):
      %7 = "kernel.mul"(%arg1, %arg2) : (f32, f32) -> f32
      "kernel.yield"(%7) : (f32) -> ()
    }) : (tensor<5x48xf32>, tensor<f32>) -> tensor<5x48xf32>
    "func.return"(%3) : (tensor<5x48xf32>) -> ()
  }) : () -> () loc(#loc1)
}) : () -> () loc(#loc)
#loc = loc("in.mlir":1:1)
#loc3 = loc(#loc2)
#loc2 = loc("model.py":7:9)
"""  # noqa: E501
