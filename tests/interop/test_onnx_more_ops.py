"""ONNX import of the ops real exports use beyond the basics, part one (interop/
onnx_ops_logic.py): And/Or/Xor, IsNaN, IsInf, Mod, Trilu, CumSum, TopK, Einsum and
Range/ConstantOfShape. Each is a small graph built with onnx.helper, imported with
`em.onnx.load` with its inputs traced, known at import (Constant nodes: folded) or both,
and compared with onnxruntime (and numpy); the differentiable ones' gradients with finite
differences of onnxruntime in float64 (tests/onnx_nodes.py). Part two, the gathers,
scatters and sequences: test_onnx_index_ops.py."""


import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_nodes import OnnxImportError, check, check_grad, model, rand, run_ember, run_ort  # noqa: E402

import ember as em  # noqa: E402
from ember.interop import onnx_ops_logic  # noqa: E402

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
