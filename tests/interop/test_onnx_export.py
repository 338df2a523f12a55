"""`em.onnx.save`: exported models run in onnxruntime as they run in ember, pass the full
ONNX check, keep param paths as initializer names, and a failed export writes nothing."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.frontend import context
from ember.interop.onnx_export import OnnxExportError
from ember.interop.onnx_export_ops import ONNX_DTYPES
from ember.runtime import models

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

F = nn.functional
TOL = {"atol": 1e-5, "rtol": 1e-5}


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(32)
        self.dropout = nn.Dropout(0.3)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(self.dropout(self.norm(self.act(F.relu(self.fc1(x))))))


class DigitsCnn(nn.Module):
    """8x8 digits: conv - batch norm - relu - max pool - avg pool - flatten - linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.flat = nn.Flatten()
        self.head = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.head(self.flat(self.avg(x)))


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a feed-forward, residuals."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiHeadAttention(d, 4, causal=True)
        self.ln2 = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x)), "tanh"))


def _digits_cnn():
    m = DigitsCnn()
    rng = np.random.default_rng(1)  # running stats that differ from batch statistics
    m.bn.running_mean.set_value(rng.normal(0, 0.5, 8).astype(np.float32))
    m.bn.running_var.set_value(rng.uniform(0.5, 2.0, 8).astype(np.float32))
    return m


MODELS = {
    "mlp": (Mlp, (8, 16)),
    "digits_cnn": (_digits_cnn, (8, 1, 8, 8)),
    "transformer_block": (Block, (2, 5, 16)),
    "builtin_mlp": (models.Mlp, (8, 64)),
    "builtin_cnn": (models.Cnn, (8, 1, 8, 8)),
}


def _x(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(path, *xs) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, xs)))


def _param_paths(model) -> set[str]:
    return {path for path, _ in model.named_parameters() + model.named_buffers()}


@pytest.fixture(params=list(MODELS))
def exported(request, tmp_path):
    em.seed(0)
    make, shape = MODELS[request.param]
    model, x = make(), _x(shape)
    path = tmp_path / "model.onnx"
    assert em.onnx.save(model, str(path), x) == str(path)
    return model, x, path


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_onnxruntime_matches_ember(exported, backend):
    model, x, path = exported
    (got,) = _run(path, x)
    np.testing.assert_allclose(got, em.compile(model, x, backend=backend)(x), **TOL)


def test_the_file_passes_the_full_check_and_keeps_param_paths(exported):
    model, _, path = exported
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == {18}
    values = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    assert set(values) == _param_paths(model)
    for path, p in model.named_parameters() + model.named_buffers():
        np.testing.assert_array_equal(values[path], p.val())


def test_inputs_and_outputs_have_the_example_shapes(tmp_path):
    em.seed(0)
    path = tmp_path / "m.onnx"
    em.onnx.save(Mlp(), str(path), em.TensorSpec((3, 16), "f32"))
    graph = onnx.load(str(path)).graph
    dims = [[d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*graph.input, *graph.output)]
    assert ([v.name for v in graph.input], [v.name for v in graph.output]) == (["x"], ["y"])
    assert dims == [[3, 16], [3, 10]]


def test_flags_never_change_the_exported_inference_graph(tmp_path):
    """Dropout is off and BatchNorm uses its running stats in the export, flags on or off."""
    em.seed(0)
    model = nn.Sequential(_digits_cnn(), nn.Dropout(0.5))
    x = _x((4, 1, 8, 8))
    on, off = tmp_path / "train.onnx", tmp_path / "valid.onnx"
    em.onnx.save(model.train(), str(on), x)
    em.onnx.save(model.valid(), str(off), x)
    assert on.read_bytes() == off.read_bytes()
    graph = onnx.load(str(on)).graph
    assert [i.name for i in graph.input] == ["x"]  # no rng argument: nothing random
    assert not {n.op_type for n in graph.node} & {"Dropout", "RandomUniformLike"}
    (got,) = _run(on, x)
    np.testing.assert_allclose(got, em.compile(model, x, backend="interpreter")(x), **TOL)


class Fn(nn.Module):
    """A forward of core ops given as a function (a constant field, never visited)."""

    def __init__(self, fn, param_shape=(4,)):
        super().__init__()
        self.fn = fn
        self.w = em.Param.from_array(_x(param_shape, seed=3))

    def forward(self, *xs):
        return self.fn(self.w, *xs)


def _unslice(x, **window):
    """ember.unslice, which only gradients and imported Pads make."""
    return x.trace.op("ember.unslice", x, **window)


FORWARDS = {
    "arith": lambda w, x: ((x - w) * 2.0 / (w.abs() + 1.0)) ** 2.0,
    "unary": lambda w, x: (x.exp().log() + x.abs().sqrt() + x.tanh() + x.sigmoid() - F.erf(x)),
    "minmax": lambda w, x: F.maximum(x, w) + F.minimum(-x, w) + F.clamp(x, -0.5, 0.5),
    "softplus": lambda w, x: F.softplus(x) + F.softplus(x * 10.0, beta=2.0, threshold=3.0),
    "cmp": lambda w, x: sum(F.where(c, x, w) for c in (x < w, x <= w, x > w, x >= w, x == w,
                                                        x != w)),
    "cast": lambda w, x: (x > 0).astype("f32") + x.astype("i64").astype("f32"),
    "reductions": lambda w, x: (x.sum(axis=1) + x.max(axis=1) + x.mean()
                                + x.sum(axis=(0, 1), keepdims=True).reshape(1)),
    "broadcast": lambda w, x: F.broadcast_to(w, (3, 4)) + x.transpose(1, 0).T,
    "softmax": lambda w, x: F.log_softmax(x, 1) + F.softmax(x * w, 0) + F.silu(x),
    "norms": lambda w, x: F.rms_norm(x, 4, w) + F.leaky_relu(x, 0.2),
    "indexing": lambda w, x: (em.cat([x[:, 1:3], x[..., ::2] * w[:2]], 1) + x[1:, ::3].sum()
                              + em.cat(x.split([1, 3], 1)[::-1], 1) + em.cat([x[-1:], x[:-1]])),
    "unslice": lambda w, x: (_unslice(x, start=[0, 1], step=[1, 1], shape=[6, 6])
                             + _unslice(x[:, :3], start=[1, 0], step=[2, 2], shape=[6, 6])
                             + _unslice(x[:2], start=[0, 1], step=[3, 1], shape=[6, 6])),
}


@pytest.mark.parametrize("name", list(FORWARDS))
def test_core_ops_match_the_interpreter(name, tmp_path):
    model, x = Fn(FORWARDS[name]), _x((3, 4))
    path = tmp_path / f"{name}.onnx"
    em.onnx.save(model, str(path), x)
    (got,) = _run(path, x)
    np.testing.assert_allclose(got, em.compile(model, x, backend="interpreter")(x), **TOL)


@pytest.mark.parametrize("name", list(FORWARDS))
def test_core_ops_import_back(name, tmp_path):
    """What ember exports, ember imports (comparisons, Not, Softplus included)."""
    model, x = Fn(FORWARDS[name]), _x((3, 4))
    path = tmp_path / f"{name}.onnx"
    em.onnx.save(model, str(path), x)
    got = em.compile(em.onnx.load(str(path)), x)(x)
    np.testing.assert_allclose(got, em.compile(model, x, backend="interpreter")(x), **TOL)


def _windows(w, x):
    img = x.reshape(1, 2, 2, 3)
    conv = F.conv2d(img, w, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    pools = F.max_pool2d(img, 2, 1, 1) + F.avg_pool2d(img, 2, 1, 1)
    return conv.sum() + pools.sum(axis=(2, 3))


def test_windows_with_stride_padding_dilation_and_groups(tmp_path):
    model, x = Fn(_windows, param_shape=(4, 1, 2, 2)), _x((3, 4))
    path = tmp_path / "windows.onnx"
    em.onnx.save(model, str(path), x)
    (got,) = _run(path, x)
    np.testing.assert_allclose(got, em.compile(model, x, backend="interpreter")(x), **TOL)


def test_embedding_one_hot_conv_transpose_and_adaptive_pool(tmp_path):
    em.seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 6)
            self.up = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1)
            self.pool = nn.AdaptiveAvgPool2d((3, 5))

        def forward(self, idx, labels, img):
            t = context.current()
            hot = t.op("ember.one_hot", t.lift(labels), num_classes=6, dtype="f32")
            return self.emb(idx) * hot, self.pool(self.up(img))

    model = Net()
    idx = np.array([[0, 3], [9, 4]], np.int64)
    labels = np.array([[5, 0], [2, 1]], np.int64)
    inputs = idx, labels, _x((2, 2, 4, 4))
    path = tmp_path / "net.onnx"
    em.onnx.save(model, str(path), *inputs)
    got = _run(path, *inputs)
    want = em.compile(model, *inputs, backend="interpreter")(*inputs)
    graph = onnx.load(str(path)).graph
    assert [v.name for v in (*graph.input, *graph.output)] == ["x", "x1", "x2", "y", "y1"]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **TOL)
    labels[1, 1] = -1  # no class, as ember's one_hot (ONNX's OneHot would pick the last)
    hot = _run(path, idx, labels, inputs[2])[0]
    assert not hot[1, 1].any() and hot[0, 0].any()


def test_outputs_that_are_an_input_or_a_param(tmp_path):
    model, x = Fn(lambda w, x: (x, w, x + w)), _x((3, 4))
    path = tmp_path / "m.onnx"
    em.onnx.save(model, str(path), x)
    for g, w in zip(_run(path, x), em.compile(model, x, backend="interpreter")(x)):
        np.testing.assert_allclose(g, w, **TOL)


def test_onnx_dtype_numbers_are_onnx_protos():
    names = {"f32": "FLOAT", "f64": "DOUBLE", "f16": "FLOAT16", "bf16": "BFLOAT16",
             "i64": "INT64", "i32": "INT32", "i1": "BOOL"}
    assert ONNX_DTYPES == {d: getattr(onnx.TensorProto, n) for d, n in names.items()}


def _unexportable(w, x):
    """Two ops without an export rule, each on its own line of this file."""
    t = context.current()
    idx = t.lift(np.array([0, 2, 0], np.int64))
    scattered = t.op("ember.scatter_add", idx, t.lift(x), shape=[3, 4])
    img = t.lift(x).reshape(1, 1, 3, 4)
    routed = t.op("ember.max_pool2d_grad", img, img, kernel=[1, 1], stride=[1, 1],
                  padding=[0, 0])
    return scattered + routed.reshape(3, 4) + w


def test_ops_without_a_rule_are_all_listed_and_nothing_is_written(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(OnnxExportError) as e:
        em.onnx.save(Fn(_unexportable), str(path), _x((3, 4)))
    message = str(e.value)
    assert "2 op(s) have no export rule" in message
    for op in ("ember.scatter_add", "ember.max_pool2d_grad"):
        line = next(m for m in message.splitlines() if m.strip().startswith(op))
        assert f"{os.path.basename(__file__)}:" in line and "only in training graphs" in line
    assert os.listdir(tmp_path) == []  # neither the file nor a temporary one


def test_a_failed_export_leaves_an_existing_file_as_it_was(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    with pytest.raises(OnnxExportError):
        em.onnx.save(Fn(_unexportable), str(path), _x((3, 4)))
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_an_example_input_is_required(tmp_path):
    with pytest.raises(TypeError, match="example input"):
        em.onnx.save(Mlp(), str(tmp_path / "m.onnx"))
    assert os.listdir(tmp_path) == []


def test_round_trip_through_onnx_import(exported):
    """em.onnx.load of the exported file computes the same outputs (the import side is
    written separately: skipped until it can read these files)."""
    try:
        from ember.interop import onnx_import  # noqa: F401
    except ImportError:
        pytest.skip("onnx import not available yet")
    _, x, path = exported
    try:
        loaded = em.onnx.load(str(path))
        got = em.compile(loaded, x, backend="interpreter")(x)
    except Exception as e:  # what the importer cannot read yet; any other error fails
        if isinstance(e, NotImplementedError) or (type(e).__name__ == "OnnxImportError"
                                                  and "support" in str(e)):
            pytest.skip("onnx import not available yet")
        raise
    (want,) = _run(path, x)
    np.testing.assert_allclose(got, want, **TOL)
