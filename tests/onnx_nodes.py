"""Small ONNX graphs for the op tests (tests/interop/test_onnx_more_ops.py and
test_onnx_index_ops.py): build one with onnx.helper, run it in onnxruntime and in ember, and
compare values and gradients. Import it after `pytest.importorskip("onnx")`."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ember as em

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
