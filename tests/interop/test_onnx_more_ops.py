"""ONNX import of the ops real exports use beyond the basics (interop/onnx_ops_logic.py,
interop/onnx_ops_index.py): And/Or/Xor, IsNaN, IsInf, Mod, Trilu, CumSum, TopK, Einsum,
Range/ConstantOfShape, GatherElements, GatherND, ScatterElements, ScatterND and the
sequence ops. Each is a small graph built with onnx.helper, imported with `em.onnx.load`
with its inputs traced, known at import (Constant nodes: folded) or both, and compared with
onnxruntime (and numpy); the differentiable ones' gradients with finite differences of
onnxruntime in float64. GatherElements over more than 64 entries is folded by ember's own
numpy (ONNX's reference implementation gets it wrong); a BERT exported without
token_type_ids (slow; needs `transformers`) matches PyTorch."""

import copy
import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember as em  # noqa: E402
from ember.interop import onnx_ops_logic  # noqa: E402

OnnxImportError = em.onnx.OnnxImportError
TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
         np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
         np.dtype(bool): TensorProto.BOOL}


def model(nodes, inputs: dict, outputs: dict, consts: dict | None = None,
          inits: dict | None = None, opset: int = 17) -> bytes:
    """A graph of `nodes`: `inputs` (name -> example array) are graph inputs, `consts`
    Constant nodes, `inits` initializers; `outputs` name -> numpy dtype."""
    consts, inits = consts or {}, inits or {}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v))
             for k, v in consts.items()] + list(nodes)
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TYPES[v.dtype], v.shape)
                     for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TYPES[np.dtype(t)], None) for k, t in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]
                             ).SerializeToString()


def run_ort(m: bytes, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)


def run_ember(m: bytes, feeds: dict, backend: str = "interpreter") -> list[np.ndarray]:
    xs = list(feeds.values())
    out = em.compile(em.onnx.load(m), *xs, backend=backend)(*xs)
    return list(out) if isinstance(out, tuple) else [out]


def check(node, data: dict, outputs: dict, static=(), backend="interpreter", rtol=1e-6,
          atol=1e-6, want=None):
    """`node` on `data` (name -> array; the names in `static` as Constant nodes, all of
    them for "all"), in ember and onnxruntime; also against `want` (numpy) when given."""
    names = list(data) if static == "all" else list(static)
    inputs = {k: v for k, v in data.items() if k not in names}
    if not inputs:  # a graph with nothing traced: a dummy input the outputs ignore
        inputs = {"unused": np.zeros(1, np.float32)}
    m = model([node], inputs, outputs, consts={k: data[k] for k in names})
    got, ref = run_ember(m, inputs, backend), run_ort(m, inputs)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, g.dtype, r.shape, r.dtype)
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, equal_nan=True)
    if want is not None:
        for g, w in zip(got, want if isinstance(want, list) else [want]):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    return got


def check_grad(node, w: np.ndarray, rest: dict, wrt: str, out: str = "y", rtol=1e-6,
               atol=1e-8, backend="cpu"):
    """The gradient of sum(y * r) with respect to the node's input `wrt` (given as the
    float64 initializer `w`; `rest` are Constant nodes), by ember against central
    differences of onnxruntime: the node reads `wrt` = w * x, x a graph input of ones."""
    mul = helper.make_node("Mul", ["w", "x"], [wrt])
    x = np.ones_like(w)
    m = model([mul, node], {"x": x}, {out: np.float64}, consts=rest, inits={"w": w})
    y = run_ort(m, {"x": x})[0]
    r = np.random.default_rng(5).standard_normal(y.shape)
    imported = em.onnx.load(m)
    grads = em.compile_grad(imported, lambda o, t: (o * t).sum(), backend=backend)(x, r)
    got = grads[imported.initializers["w"]]
    want, eps = np.zeros_like(w), 1e-6
    for i in range(w.size):
        d = np.zeros(w.size)
        d[i] = eps
        d = d.reshape(w.shape)
        up = (run_ort(model([mul, node], {"x": x}, {out: np.float64}, consts=rest,
                          inits={"w": w + d}), {"x": x})[0] * r).sum()
        down = (run_ort(model([mul, node], {"x": x}, {out: np.float64}, consts=rest,
                              inits={"w": w - d}), {"x": x})[0] * r).sum()
        want.reshape(-1)[i] = (up - down) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=max(atol, 1e-6))


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# -- logic -------------------------------------------------------------------------------

@pytest.mark.parametrize("op, fn", [("And", np.logical_and), ("Or", np.logical_or),
                                    ("Xor", np.logical_xor)])
def test_and_or_xor(op, fn):
    rng = np.random.default_rng(1)
    a, b = rng.random((2, 3, 4)) > 0.5, rng.random((3, 4)) > 0.5
    node = helper.make_node(op, ["a", "b"], ["y"])
    check(node, {"a": a, "b": b}, {"y": bool}, want=fn(a, b))
    check(node, {"a": a, "b": b}, {"y": bool}, static=["b"], want=fn(a, b))
    check(node, {"a": a, "b": b}, {"y": bool}, static="all", want=fn(a, b))


def _specials():
    x = rand(3, 5, seed=2)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    x[2, 1] = -np.nan
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_isnan(dtype):
    x = _specials().astype(dtype)
    check(helper.make_node("IsNaN", ["x"], ["y"]), {"x": x}, {"y": bool}, want=np.isnan(x))


@pytest.mark.parametrize("neg, pos", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_isinf(neg, pos):
    x = _specials()
    node = helper.make_node("IsInf", ["x"], ["y"], detect_negative=neg, detect_positive=pos)
    want = (np.isneginf(x) & bool(neg)) | (np.isposinf(x) & bool(pos))
    check(node, {"x": x}, {"y": bool}, want=want)


# -- Mod ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_of_integers(dtype, fmod):
    a = np.arange(-12, 12, dtype=dtype).reshape(4, 6)
    b = np.array([5, -5, 3, -3, 7, 1], dtype)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    want = np.fmod(a, b) if fmod else np.mod(a, b)
    check(node, {"a": a, "b": b}, {"y": dtype}, want=want)
    check(node, {"a": a, "b": b}, {"y": dtype}, static=["b"], want=want)
    check(node, {"a": a, "b": b}, {"y": dtype}, static="all", want=want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_fmod_of_floats(dtype, backend):
    a = (10 * rand(4, 6, seed=3)).astype(dtype)
    b = (3 * rand(4, 6, seed=4)).astype(dtype)
    a[0, :3], b[0, :3] = [5.5, -5.5, np.inf], [np.inf, 2.0, 3.0]
    a[1, 0], b[1, 0] = 7.0, 0.5
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=1)
    check(node, {"a": a, "b": b}, {"y": dtype}, backend=backend, want=np.fmod(a, b),
          rtol=0, atol=0)


def test_mod_of_floats_without_fmod_is_refused():
    a = rand(2, 3)
    m = model([helper.make_node("Mod", ["a", "b"], ["y"])], {"a": a, "b": a}, {"y": np.float32})
    with pytest.raises(OnnxImportError, match="fmod=0 on floats"):
        em.compile(em.onnx.load(m), a, a, backend="interpreter")


def test_fmod_gradient():
    b = np.array([[1.5, -2.0, 0.7], [3.0, -0.9, 1.1]])
    w = np.array([[5.2, -3.3, 2.0], [-7.1, 4.4, -0.3]])
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=1)
    check_grad(node, w, {"b": b}, wrt="a")
    check_grad(node, b, {"a": w}, wrt="b")


# -- Trilu, CumSum -------------------------------------------------------------------------

@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 0, 2, 7])
@pytest.mark.parametrize("shape", [(2, 3, 4), (5, 3)])
def test_trilu(upper, k, shape):
    x = rand(*shape, seed=4)
    inputs = ["x"] if k is None else ["x", "k"]
    data = {"x": x} if k is None else {"x": x, "k": np.array(k, np.int64)}
    node = helper.make_node("Trilu", inputs, ["y"], upper=upper)
    want = (np.triu if upper else np.tril)(x, 0 if k is None else k)
    check(node, data, {"y": np.float32}, static=["k"] if k is not None else (), want=want)
    check(node, data, {"y": np.float32}, static="all", want=want)


def test_trilu_of_integers_and_its_gradient():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    check(helper.make_node("Trilu", ["x"], ["y"], upper=0), {"x": x}, {"y": np.int64},
          want=np.tril(x))
    check_grad(helper.make_node("Trilu", ["a", "k"], ["y"]), rand(3, 4).astype(np.float64),
               {"k": np.array(1, np.int64)}, wrt="a")


def _cumsum(x, axis, exclusive, reverse):
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis)
    if exclusive:
        y = y - x
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumsum(axis, exclusive, reverse, dtype):
    x = (np.arange(24).reshape(2, 3, 4) * 1.5 - 10).astype(dtype)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive,
                            reverse=reverse)
    data = {"x": x, "axis": np.array(axis, np.int64)}
    want = _cumsum(x, axis, exclusive, reverse)
    check(node, data, {"y": dtype}, static=["axis"], want=want, rtol=1e-6)
    check(node, data, {"y": dtype}, static="all", want=want, rtol=1e-6)


def test_cumsum_of_one_element_exclusive_and_gradient():
    x = rand(3, 1)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1)
    check(node, {"x": x, "axis": np.array(1, np.int64)}, {"y": np.float32}, static=["axis"],
          want=np.zeros_like(x))
    node = helper.make_node("CumSum", ["a", "axis"], ["y"], exclusive=1, reverse=1)
    check_grad(node, rand(3, 5).astype(np.float64), {"axis": np.array(1, np.int64)}, wrt="a")


def test_cumsum_with_a_traced_axis_is_refused():
    x = rand(2, 3)
    m = model([helper.make_node("CumSum", ["x", "a"], ["y"])],
              {"x": x, "a": np.array(0, np.int64)}, {"y": np.float32})
    with pytest.raises(OnnxImportError, match="must be known at import"):
        em.onnx.load(m)


# -- TopK --------------------------------------------------------------------------------

def _topk_data(dtype=np.float32):
    x = rand(3, 7, 5, seed=6)
    x[0, :3, 0] = [1.0, 1.0, 1.0]  # ties: by index
    x[1, 2:4, 1] = 0.5
    return (x * 10).astype(dtype) if np.dtype(dtype).kind == "i" else x.astype(dtype)


@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("steps", [False, True])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_topk(axis, largest, steps, backend, monkeypatch):
    if steps:  # the k-step path, past the ranking's size limit
        monkeypatch.setattr(onnx_ops_logic, "TOPK_RANK_LIMIT", 0)
    x = _topk_data()
    n = x.shape[axis]
    for k in (1, 2, n):
        node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
        data = {"x": x, "k": np.array([k], np.int64)}
        v, i = check(node, data, {"v": np.float32, "i": np.int64}, static=["k"],
                     backend=backend)
        np.testing.assert_array_equal(np.take_along_axis(x, i, axis), v)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64])
def test_topk_other_dtypes_and_folded(dtype):
    x = _topk_data(dtype)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    data = {"x": x, "k": np.array([3], np.int64)}
    check(node, data, {"v": dtype, "i": np.int64}, static=["k"])
    check(node, data, {"v": dtype, "i": np.int64}, static="all")


def test_topk_unsorted_gives_the_same_set():
    x = _topk_data()
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, sorted=0)
    m = model([node], {"x": x}, {"v": np.float32, "i": np.int64},
              consts={"k": np.array([4], np.int64)})
    (gv, gi), (rv, _) = run_ember(m, {"x": x}), run_ort(m, {"x": x})
    np.testing.assert_allclose(np.sort(gv, 1), np.sort(rv, 1))
    np.testing.assert_array_equal(np.take_along_axis(x, gi, 1), gv)


def test_topk_gradient_and_refusals():
    w = rand(3, 6, seed=8).astype(np.float64)
    node = helper.make_node("TopK", ["a", "k"], ["y", "i"], axis=1)
    check_grad(node, w, {"k": np.array([3], np.int64)}, wrt="a")
    for k, what in ((0, "k=0"), (7, "k=7")):
        m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"])], {"x": rand(2, 6)},
                  {"v": np.float32, "i": np.int64}, consts={"k": np.array([k], np.int64)})
        with pytest.raises(OnnxImportError, match=what):
            em.compile(em.onnx.load(m), rand(2, 6), backend="interpreter")


# -- Einsum ------------------------------------------------------------------------------

EINSUMS = [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
           ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
           ("bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)]),
           ("ij,jk", [(3, 4), (4, 5)]), ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]),
           ("ij->j", [(3, 4)]), ("i,i->", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]),
           ("bi,bi->b", [(3, 4), (3, 4)]), ("ijk,kj->ik", [(2, 3, 4), (4, 3)]),
           ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("...ij,jk", [(2, 3, 4), (4, 5)]),
           ("bij,bkj,bk->bi", [(2, 3, 4), (2, 5, 4), (2, 5)]), ("abc,cd->", [(2, 3, 4), (4, 2)])]


@pytest.mark.parametrize("eq, shapes", EINSUMS)
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_einsum(eq, shapes, backend):
    xs = {f"x{i}": rand(*s, seed=10 + i) for i, s in enumerate(shapes)}
    node = helper.make_node("Einsum", list(xs), ["y"], equation=eq)
    check(node, xs, {"y": np.float32}, rtol=1e-5, atol=1e-5, backend=backend,
          want=np.einsum(eq, *xs.values()))
    if len(xs) > 1:
        check(node, xs, {"y": np.float32}, static=["x1"], rtol=1e-5, atol=1e-5)
        check(node, xs, {"y": np.float32}, static="all", rtol=1e-5, atol=1e-5)


def test_einsum_gradient():
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation="bhqd,bhkd->bhqk")
    check_grad(node, rand(1, 2, 3, 4).astype(np.float64), {"b": rand(1, 2, 5, 4, seed=1)
                                                            .astype(np.float64)}, wrt="a")


@pytest.mark.parametrize("eq, shapes, what", [
    ("ii->i", [(3, 3)], "diagonal"), ("ij,jk->ik", [(3, 4), (1, 5)], "broadcasting"),
    ("...i->i", [(2, 3)], "summed away")])
def test_einsum_refusals_name_the_equation(eq, shapes, what):
    xs = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    m = model([helper.make_node("Einsum", list(xs), ["y"], equation=eq)], xs,
              {"y": np.float32})
    with pytest.raises(OnnxImportError, match=f"(?s){eq}.*{what}"):
        em.compile(em.onnx.load(m), *xs.values(), backend="interpreter")


# -- Range and ConstantOfShape ---------------------------------------------------------------

def test_range_and_constant_of_shape_fold_or_are_refused():
    x = rand(2, 3)
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"]),
             helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=numpy_helper.from_array(np.array([2.5], np.float32))),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "rf"], ["y0"]), helper.make_node("Add", ["y0", "c"],
                                                                              ["y"])]
    consts = {"s": np.array(0, np.int64), "l": np.array(3, np.int64),
              "d": np.array(1, np.int64), "shape": np.array([2, 3], np.int64)}
    m = model(nodes, {"x": x}, {"y": np.float32}, consts=consts)
    np.testing.assert_allclose(run_ember(m, {"x": x})[0], x + np.arange(3) + 2.5)
    m = model([helper.make_node("Range", ["s", "l", "d"], ["y"])],
              {"l": np.array(4.0, np.float32)}, {"y": np.float32},
              consts={"s": np.array(0.0, np.float32), "d": np.array(1.0, np.float32)})
    with pytest.raises(OnnxImportError, match="Range.*input 1 .* must be known at import"):
        em.onnx.load(m)
    m = model([helper.make_node("ConstantOfShape", ["s"], ["y"])],
              {"s": np.array([2, 3], np.int64)}, {"y": np.float32})
    with pytest.raises(OnnxImportError, match="ConstantOfShape.*must be known at import"):
        em.onnx.load(m)


# -- GatherElements ------------------------------------------------------------------------

GATHER_CASES = [((1, 512), (1, 8), 1), ((2, 100), (2, 100), 1), ((100, 3), (100, 3), 0),
                ((100, 1), (100, 1), 0), ((70, 3), (5, 2), 0), ((3, 4, 80), (3, 2, 80), 2),
                ((3, 4, 5), (3, 6, 5), 1), ((4, 3), (4, 3), -1)]


def _gather_data(dshape, ishape, axis, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(dshape).astype(np.float32)
    n = dshape[axis]
    idx = rng.integers(-n, n, ishape).astype(np.int64)
    coords = list(np.indices(ishape, sparse=True))
    coords[axis % len(dshape)] = idx
    return data, idx, data[tuple(coords)]


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("dshape, ishape, axis", GATHER_CASES)
def test_gather_elements_folded_traced_and_static(dshape, ishape, axis, backend):
    """Folded (both inputs Constants: the BERT case), with constant indices, and with
    traced indices: each against numpy and onnxruntime."""
    data, idx, want = _gather_data(dshape, ishape, axis)
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=axis)
    feeds = {"data": data, "idx": idx}
    for static in ("all", ["idx"], ()):
        check(node, feeds, {"y": np.float32}, static=static, want=want, rtol=0, atol=0,
              backend=backend)


def test_gather_elements_fold_is_embers_own():
    """Folded past 64 entries of the axis, where ONNX's reference implementation raises or
    (here: axis 0, indices [100, 1]) silently takes each row's own element."""
    data, idx, _ = _gather_data((100, 1), (100, 1), 0)
    idx[:] = 0
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=0)
    check(node, {"data": data, "idx": idx}, {"y": np.float32}, static="all",
          want=np.broadcast_to(data[0], (100, 1)), rtol=0, atol=0)


def test_gather_elements_gradient_and_errors():
    data, idx, _ = _gather_data((3, 70), (3, 5), 1)
    node = helper.make_node("GatherElements", ["a", "idx"], ["y"], axis=1)
    check_grad(node, data.astype(np.float64), {"idx": idx}, wrt="a")
    idx[0, 0] = 70
    m = model([node], {"a": data}, {"y": np.float32}, consts={"idx": idx})
    with pytest.raises(OnnxImportError, match="indices 70 is out of range"):
        em.compile(em.onnx.load(m), data, backend="interpreter")
    u = np.zeros(1, np.float32)
    m = model([helper.make_node("GatherElements", ["a", "idx"], ["y"], axis=1)], {"u": u},
              {"y": np.float32}, consts={"a": data, "idx": idx})
    with pytest.raises(OnnxImportError, match="indices 70 is out of range"):
        em.compile(em.onnx.load(m), u, backend="interpreter")


# -- GatherND, ScatterND, ScatterElements -----------------------------------------------------

def _gather_nd(data, idx, b):
    out = np.empty(idx.shape[:-1] + data.shape[b + idx.shape[-1]:], data.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        out[pos] = data[pos[:b] + tuple(idx[pos])]
    return out


GATHER_ND = [((2, 3, 4), (5, 2), 0), ((2, 3, 4), (5, 3), 0), ((2, 3, 4), (2, 1), 0),
             ((2, 3, 4), (2, 2), 1), ((2, 3, 4), (2, 6, 1), 1), ((2, 3, 4, 5), (2, 3, 1), 2),
             ((4, 3), (2,), 0)]


@pytest.mark.parametrize("dshape, ishape, b", GATHER_ND)
def test_gather_nd(dshape, ishape, b):
    rng = np.random.default_rng(3)
    data = rng.standard_normal(dshape).astype(np.float32)
    m = ishape[-1]
    hi = np.array(dshape[b:b + m])
    idx = (rng.integers(0, 1 << 30, ishape) % hi - (rng.random(ishape) < 0.3) * hi)
    node = helper.make_node("GatherND", ["data", "idx"], ["y"], batch_dims=b)
    feeds = {"data": data, "idx": idx.astype(np.int64)}
    want = _gather_nd(data, idx % hi, b)
    for static in ((), ["idx"], "all"):
        check(node, feeds, {"y": np.float32}, static=static, want=want, rtol=0, atol=0)


def test_gather_nd_gradient():
    node = helper.make_node("GatherND", ["a", "idx"], ["y"])
    check_grad(node, rand(3, 4, 2).astype(np.float64),
               {"idx": np.array([[0, 1], [2, 3], [0, 1]], np.int64)}, wrt="a")


@pytest.mark.parametrize("reduction", ["none", "add"])
@pytest.mark.parametrize("static", [(), ["idx"], "all"])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_scatter_nd(reduction, static, backend):
    rng = np.random.default_rng(4)
    data = rng.standard_normal((4, 3, 2)).astype(np.float32)
    idx = np.array([[1, 2], [3, 0], [0, -1]], np.int64)
    upd = rng.standard_normal((3, 2)).astype(np.float32)
    want = data.copy()
    for i, u in zip(idx, upd):
        if reduction == "add":
            want[tuple(i)] += u
        else:
            want[tuple(i)] = u
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], reduction=reduction)
    check(node, {"data": data, "idx": idx, "upd": upd}, {"y": np.float32}, static=static,
          want=want, rtol=1e-6, backend=backend)


def test_scatter_nd_duplicates_and_whole_rows():
    data = rand(4, 3)
    idx = np.array([[1], [3], [1]], np.int64)
    upd = rand(3, 3, seed=1)
    want = data.copy()
    want[1], want[3] = upd[2], upd[1]  # the last write wins (numpy's, a sequential loop's)
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"])
    m = model([node], {"data": data, "upd": upd}, {"y": np.float32}, consts={"idx": idx})
    np.testing.assert_array_equal(run_ember(m, {"data": data, "upd": upd})[0], want)
    add = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], reduction="add")
    want = data.copy()
    np.add.at(want, idx[:, 0], upd)
    check(add, {"data": data, "idx": idx, "upd": upd}, {"y": np.float32}, static=["idx"],
          want=want, rtol=1e-6)


def test_scatter_gradients():
    idx = np.array([[1, 2], [3, 0], [0, 1], [2, 2]], np.int64)
    for reduction in ("none", "add"):
        node = helper.make_node("ScatterND", ["a", "idx", "upd"], ["y"], reduction=reduction)
        check_grad(node, rand(4, 3).astype(np.float64),
                   {"idx": idx, "upd": rand(4, seed=1).astype(np.float64)}, wrt="a")
        node = helper.make_node("ScatterND", ["data", "idx", "a"], ["y"], reduction=reduction)
        check_grad(node, rand(4).astype(np.float64),
                   {"idx": idx, "data": rand(4, 3).astype(np.float64)}, wrt="a")
        node = helper.make_node("ScatterElements", ["data", "idx", "a"], ["y"], axis=1,
                                reduction=reduction)
        check_grad(node, rand(2, 2).astype(np.float64),
                   {"idx": np.array([[2, 0], [1, 2]], np.int64),
                    "data": rand(2, 3).astype(np.float64)}, wrt="a")


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reduction", ["none", "add"])
@pytest.mark.parametrize("static", [(), ["idx"], "all"])
def test_scatter_elements(axis, reduction, static):
    rng = np.random.default_rng(7)
    data = rng.standard_normal((3, 70)).astype(np.float32)
    n = data.shape[axis]
    ishape = (2, 5) if axis == 0 else (3, 4)
    # distinct positions per row (none's result with duplicates is the order's)
    idx = np.stack([rng.permutation(n)[:ishape[axis]] for _ in range(ishape[1 - axis % 2])],
                   1 - axis % 2).astype(np.int64)
    idx[0, 0] -= n  # a negative one
    upd = rng.standard_normal(ishape).astype(np.float32)
    want = data.copy()
    for pos in np.ndindex(*ishape):
        target = list(pos)
        target[axis] = idx[pos] % n
        if reduction == "add":
            want[tuple(target)] += upd[pos]
        else:
            want[tuple(target)] = upd[pos]
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=axis,
                            reduction=reduction)
    check(node, {"data": data, "idx": idx, "upd": upd}, {"y": np.float32}, static=static,
          want=want, rtol=1e-6)


def test_scatter_of_bools_and_ints():
    data = np.zeros((2, 4), bool)
    idx = np.array([[1, 3], [0, 0]], np.int64)
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=1)
    check(node, {"data": data, "idx": idx, "upd": np.ones((2, 2), bool)}, {"y": bool},
          static=["idx"])
    data = np.arange(8, dtype=np.int64).reshape(2, 4)
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=1,
                            reduction="add")
    check(node, {"data": data, "idx": idx, "upd": np.full((2, 2), 5, np.int64)},
          {"y": np.int64})


@pytest.mark.parametrize("reduction", ["mul", "max", "min"])
def test_scatter_reductions_ember_lacks_are_refused(reduction):
    for op in ("ScatterND", "ScatterElements"):
        m = model([helper.make_node(op, ["x", "i", "u"], ["y"], reduction=reduction)],
                  {"x": rand(3, 2), "u": rand(1, 2)}, {"y": np.float32},
                  consts={"i": np.array([[1]], np.int64)})
        with pytest.raises(OnnxImportError, match=f"reduction='{reduction}' is not supported"):
            em.onnx.load(m)


# -- sequences ---------------------------------------------------------------------------

@pytest.mark.parametrize("split, keepdims, new_axis", [  # stacking needs equal pieces
    (None, 1, 0), (None, 0, 0), (None, 1, 1), (None, 0, 1), (np.array(2, np.int64), 1, 0),
    (np.array([1, 3, 1], np.int64), 1, 0)])
@pytest.mark.parametrize("pos", [0, -1, 1])
def test_split_to_sequence_at_and_concat(split, keepdims, new_axis, pos):
    x = rand(2, 5, 3, seed=9)
    ins = ["x"] if split is None else ["x", "split"]
    nodes = [helper.make_node("SplitToSequence", ins, ["s"], axis=1, keepdims=keepdims),
             helper.make_node("SequenceAt", ["s", "p"], ["a"]),
             helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=-1 if new_axis else 1,
                              new_axis=new_axis),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    consts = {"p": np.array(pos, np.int64)} | ({} if split is None else {"split": split})
    outs = {"a": np.float32, "c": np.float32, "n": np.int64}
    for traced in (True, False):
        m = model(nodes, {"x": x} if traced else {"u": np.zeros(1, np.float32)}, outs,
                  consts=consts | ({} if traced else {"x": x}))
        feeds = {"x": x} if traced else {"u": np.zeros(1, np.float32)}
        for g, r in zip(run_ember(m, feeds), run_ort(m, feeds)):
            assert g.shape == r.shape and g.dtype == r.dtype
            np.testing.assert_array_equal(g, r)


def test_sequence_construct_insert_erase_and_gradient():
    a, b = rand(2, 3), rand(2, 3, seed=1)
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "a", "p"], ["s2"]),
             helper.make_node("SequenceErase", ["s2"], ["s3"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=0)]
    m = model(nodes, {"a": a, "b": b}, {"y": np.float32}, consts={"p": np.array(1, np.int64)})
    np.testing.assert_array_equal(run_ember(m, {"a": a, "b": b})[0],
                                  run_ort(m, {"a": a, "b": b})[0])
    split = helper.make_node("SplitToSequence", ["q"], ["s"], axis=1, keepdims=0)
    at = helper.make_node("SequenceAt", ["s", "p"], ["t"])
    w = rand(3, 4).astype(np.float64)
    x = np.ones_like(w)
    m = model([helper.make_node("Mul", ["w", "x"], ["q"]), split, at,
               helper.make_node("Mul", ["t", "t"], ["y"])], {"x": x}, {"y": np.float64},
              consts={"p": np.array(-1, np.int64)}, inits={"w": w})
    imported = em.onnx.load(m)
    r = rand(3, seed=3).astype(np.float64)
    grads = em.compile_grad(imported, lambda o, t: (o * t).sum())(x, r)
    want = np.zeros_like(w)
    want[:, -1] = 2 * w[:, -1] * r
    np.testing.assert_allclose(grads[imported.initializers["w"]], want, rtol=1e-12)


def test_sequence_at_out_of_range_is_refused():
    x = rand(2, 3)
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    m = model(nodes, {"x": x}, {"y": np.float32}, consts={"p": np.array(2, np.int64)})
    with pytest.raises(OnnxImportError, match="position 2 is out of range"):
        em.compile(em.onnx.load(m), x, backend="interpreter")


# -- a BERT -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("token_types", [True, False])
def test_bert_matches_pytorch(token_types):
    """A small random BERT exported with and without token_type_ids (then its buffer of
    zeros goes through GatherElements over 512 positions, folded at import)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64,
                                     num_attention_heads=2, intermediate_size=128,
                                     vocab_size=100)
    bert = transformers.BertModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask, types=None):
            return self.bert(input_ids=ids, attention_mask=mask,
                             token_type_ids=types).last_hidden_state

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (2, 8)).astype(np.int64)
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    types = (np.arange(8)[None, :].repeat(2, 0) >= 4).astype(np.int64)
    inputs = (ids, mask, types) if token_types else (ids, mask)
    wrapper = Hidden()
    with torch.no_grad():  # before the export, which may leave the model changed
        want = copy.deepcopy(wrapper)(*map(torch.from_numpy, inputs)).numpy()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, tuple(map(torch.from_numpy, inputs)), f, dynamo=False,
                          opset_version=17, input_names=["ids", "mask", "types"][:len(inputs)],
                          output_names=["y"])
    got = em.compile(em.onnx.load(f.getvalue()), *inputs, backend="cpu")(*inputs)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
