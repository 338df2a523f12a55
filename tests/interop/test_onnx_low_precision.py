"""ONNX float16 and bfloat16: initializers, inputs and Casts export with their bits and
import back to the same model. onnxruntime's CPU runs float16 ops, and of bfloat16 only
Cast and data movement (and its Python API takes no bfloat16 arrays): the bf16 model
here takes and returns f32."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import ToDtype

import ember as em
from ember import nn
from ember.ir import numpy_dtype

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)).transpose(0, 1).transpose(0, 1))


class Bf16Inside(Mlp):
    """f32 in and out, bf16 params and activations in between: every op on them is an nn.*
    op (lowered in f32 between casts) or data movement."""

    def forward(self, x):
        return super().forward(x.astype("bf16")).astype("f32")


def export(model, x, tmp_path):
    path = str(tmp_path / "model.onnx")
    em.onnx.save(model, path, x)
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    return path, proto


def onnxruntime(path, x):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("dtype,make,x_dtype", [("f16", Mlp, "f16"),
                                                 ("bf16", Bf16Inside, "f32")])
def test_low_precision_models_export_run_in_onnxruntime_and_import_back(tmp_path, dtype,
                                                                        make, x_dtype):
    em.seed(0)
    model = make().map(ToDtype(dtype))
    x = np.random.default_rng(0).normal(size=(8, 16)).astype(numpy_dtype(x_dtype))
    ours = em.compile(model, x, backend="interpreter")(x)
    path, proto = export(model, x, tmp_path)
    inits = {t.name: t for t in proto.graph.initializer}
    want = onnx.TensorProto.FLOAT16 if dtype == "f16" else onnx.TensorProto.BFLOAT16
    for name, p in model.named_parameters():
        assert inits[name].data_type == want
        assert onnx.numpy_helper.to_array(inits[name]).tobytes() == p.val().tobytes()
    theirs = onnxruntime(path, x)  # f32 matmuls of their own: a last bit may differ
    assert theirs.dtype == ours.dtype
    eps = float(np.finfo(np.float16).eps) if dtype == "f16" else 2.0**-7
    np.testing.assert_allclose(theirs.astype(np.float32), ours.astype(np.float32), rtol=eps,
                               atol=eps)
    back = em.onnx.load(path)
    assert {p.dtype for p in back.parameters()} == {dtype}
    assert em.compile(back, x, backend="interpreter")(x).tobytes() == ours.tobytes()


def test_onnx_casts_to_and_from_bf16_import():
    """A Cast to BFLOAT16 rounds as ember's does (to nearest even), and back."""
    h = onnx.helper
    graph = h.make_graph([h.make_node("Cast", ["x"], ["b"], to=onnx.TensorProto.BFLOAT16),
                          h.make_node("Cast", ["b"], ["y"], to=onnx.TensorProto.FLOAT)], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    model = em.onnx.load(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-12, -2.0], np.float32)
    want = np.array([1.0, 1 + 2**-6, 1 + 2**-7, -2.0], np.float32)
    np.testing.assert_array_equal(em.compile(model, x, backend="cpu")(x), want)
