"""ONNX HardSwish, HardSigmoid (MobileNetV3's activations) and Sign: a PyTorch model
exported with them (the TorchScript exporter, opset 17) imports and computes as
onnxruntime and PyTorch do, and its gradients are PyTorch's, kinks included; HardSigmoid's
own alpha and beta; ONNX's node tests of the three ops; `ember.sign` exports as Sign."""

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from torch_onnx import torch_export  # noqa: E402

import ember as em  # noqa: E402
from ember import nn  # noqa: E402

helper, TensorProto = onnx.helper, onnx.TensorProto


class Hard(torch.nn.Module):
    """Hardswish and Hardsigmoid, each also on exactly x (`x * one`), so that x = -3 and
    x = 3 hit their kinks."""

    def __init__(self):
        super().__init__()
        self.one = torch.nn.Parameter(torch.ones(6))
        self.fc = torch.nn.Linear(6, 6)
        self.swish, self.sigmoid = torch.nn.Hardswish(), torch.nn.Hardsigmoid()

    def forward(self, x):
        h = self.swish(x * self.one)
        return self.sigmoid(self.fc(h)) * self.sigmoid(x * self.one) + self.swish(4 * self.fc(h))


def _ort(model: bytes, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model).run(None, {"x": x})[0]


def _x() -> np.ndarray:
    x = 3 * np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    x[0, :4] = [-3, 3, -3.5, 3.5]
    return x


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_torch_export_matches_onnxruntime_and_torch(backend):
    torch.manual_seed(0)
    model, x = Hard().eval(), _x()
    onnx_bytes = torch_export(model, x)
    ops = {n.op_type for n in onnx.load_from_string(onnx_bytes).graph.node}
    assert {"HardSwish", "HardSigmoid"} <= ops
    got = em.compile(em.onnx.load(onnx_bytes), x, backend=backend)(x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, _ort(onnx_bytes, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_gradients_of_the_import_are_torchs():
    """The loss sum(out * w) through the imported model, differentiated by ember, against
    torch's backward of the original, for every param (`one`'s gradient crosses the kinks)."""
    torch.manual_seed(0)
    model, x = Hard(), _x()
    w = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)
    m = em.onnx.load(torch_export(model, x))
    grads = em.compile_grad(m, lambda out, y: (out * y).sum(), backend="cpu")(x, w)
    (model(torch.from_numpy(x)) * torch.from_numpy(w)).sum().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[m.initializers[name]], p.grad.numpy(), rtol=1e-5,
                                   atol=1e-5, err_msg=name)


def _one_node(op: str, dtype=TensorProto.FLOAT, **attrs) -> bytes:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", dtype, [4, 5])],
        [helper.make_tensor_value_info("y", dtype, [4, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("op, attrs", [("HardSigmoid", {}), ("HardSigmoid", dict(alpha=0.5)),
                                       ("HardSigmoid", dict(alpha=0.3, beta=0.2)),
                                       ("HardSwish", {}), ("Sign", {})])
def test_single_nodes_match_onnxruntime(op, attrs):
    x = 4 * np.random.default_rng(2).standard_normal((4, 5)).astype(np.float32)
    x[0] = [-3, 3, 0, np.nan, -0.0]
    model = _one_node(op, **attrs)
    got = em.compile(em.onnx.load(model), x, backend="cpu")(x)
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-6, atol=1e-7, equal_nan=True)


def test_sign_of_integers_imports():
    x = np.arange(-10, 10, dtype=np.int64).reshape(4, 5)
    model = _one_node("Sign", TensorProto.INT64)
    np.testing.assert_array_equal(em.compile(em.onnx.load(model), x)(x), _ort(model, x))


def test_onnx_node_tests_of_the_three_ops():
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in node.collect_testcases() if len(c.model.graph.node) == 1
                 and c.model.graph.node[0].op_type in ("HardSigmoid", "HardSwish", "Sign")
                 and not c.name.endswith("_expanded")]
    assert len(cases) >= 5
    for case in cases:
        inputs, (want,) = case.data_sets[0]
        x = np.asarray(onnx.numpy_helper.to_array(inputs[0]) if isinstance(
            inputs[0], onnx.TensorProto) else inputs[0])
        got = em.compile(em.onnx.load(case.model), x, backend="cpu")(x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=case.name)


class Signs(nn.Module):
    def forward(self, x):
        return nn.functional.sign(x) * x + (x > 0).sign().astype("f32")


def test_sign_exports_as_sign(tmp_path):
    x = np.array([[-2.0, 0.0, 3.0], [-0.0, 1.0, -1e-3]], np.float32)
    path = tmp_path / "sign.onnx"
    em.onnx.save(Signs(), str(path), x)
    assert "Sign" in {n.op_type for n in onnx.load(str(path)).graph.node}
    np.testing.assert_allclose(_ort(path.read_bytes(), x), np.abs(x) + (x > 0), rtol=1e-7)
