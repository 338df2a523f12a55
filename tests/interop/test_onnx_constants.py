"""Which ONNX initializers `em.onnx.load` makes Params: weights are trainable Params, the
numbers of a forward (scalars, size-1 broadcasts) stay constants; `trainable=` picks the
weights that train; `import_report()` says what became of each; old opsets are upgraded."""

import glob
import io
import math
import os
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember as em  # noqa: E402

OnnxImportError = em.onnx.OnnxImportError


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


def _model(nodes, initializers, inputs=(("x", [2, 4]),), opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _mixed():
    """Weights of each kind beside the numbers of a forward:
    y = gemm(bn(prelu_like(x @ w + b) * s + c), g, gb), with a [1, 1] weight reached through
    a Transpose, a scalar 0.5, a size-1 shift, BatchNormalization's statistics, and a float
    initializer that only a Shape reads."""
    rng = np.random.default_rng(0)
    inits = [_init("w", rng.standard_normal((4, 3))), _init("b", rng.standard_normal(3)),
             _init("s", 0.5), _init("c", [0.25]),
             _init("bn.scale", rng.uniform(0.5, 1.5, 3)), _init("bn.bias", rng.standard_normal(3)),
             _init("bn.mean", rng.standard_normal(3)), _init("bn.var", rng.uniform(0.5, 2, 3)),
             _init("g", rng.standard_normal((1, 3))), _init("gb", [0.1]),
             _init("u", [[2.0]]), _init("like", np.zeros((2, 1)))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["h1"]),
             helper.make_node("Mul", ["h1", "s"], ["h2"]),
             helper.make_node("Add", ["h2", "c"], ["h3"]),
             helper.make_node("BatchNormalization", ["h3", "bn.scale", "bn.bias", "bn.mean",
                                                     "bn.var"], ["h4"]),
             helper.make_node("Gemm", ["h4", "g", "gb"], ["z"], transB=1),
             helper.make_node("Transpose", ["u"], ["ut"]),
             helper.make_node("MatMul", ["z", "ut"], ["z1"]),
             helper.make_node("Shape", ["like"], ["shape"]),
             helper.make_node("Reshape", ["z1", "shape"], ["y"])]
    return _model(nodes, inits)


def _reference(x, v):
    h = (x @ v["w"] + v["b"]) * v["s"] + v["c"]
    h = (h - v["bn.mean"]) / np.sqrt(v["bn.var"] + 1e-5) * v["bn.scale"] + v["bn.bias"]
    return (h @ v["g"].T + v["gb"]) @ v["u"].T


def _values(m):
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def test_weights_are_params_and_numbers_stay_constants():
    m = em.onnx.load(_mixed())
    report = m.import_report()
    assert report.names("trainable") == ["w", "b", "bn.scale", "bn.bias", "g", "gb", "u"]
    assert report.names("buffer") == ["bn.mean", "bn.var"]
    assert report.names("constant") == ["s", "c", "like"]
    assert report.names("frozen") == []
    assert sorted(m.state_dict()) == sorted(f"initializers.{n}" for n in
                                            report.names("trainable") + report.names("buffer"))
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    want = _reference(x, _values(_mixed()))
    np.testing.assert_allclose(em.compile(m, x, backend="interpreter")(x), want, rtol=1e-5,
                               atol=1e-5)
    ops = em.trace(m, em.TensorSpec.of(x))
    assert sum(op.name == "ember.param" for op in ops.ops) == 9  # no Param for s, c, like


def test_the_report_says_why():
    report = em.onnx.load(_mixed()).import_report()
    text = str(report)
    assert text.splitlines()[0] == ("12 initializers: 7 trainable, 0 frozen, 2 buffers, "
                                    "3 constants")
    rows = {r.name: r for r in report.rows}
    assert rows["s"].role == "constant" and rows["s"].shape == () and \
        rows["s"].why.startswith("a scalar, read by node 2") and "(Mul)" in rows["s"].why
    assert rows["c"].why.startswith("size 1, read by node 3")
    assert rows["gb"].role == "trainable" and "input 2 of node 5" in rows["gb"].why  # Gemm's C
    assert rows["u"].role == "trainable" and "(MatMul)" in rows["u"].why  # through Transpose
    assert rows["b"].why.startswith("3 elements, read by node 1")
    assert rows["bn.mean"].why.startswith("running statistic: node 4")
    assert "shape arithmetic" in rows["like"].why
    assert rows["w"].dtype == "float32" and rows["w"].shape == (4, 3)
    for r in report.rows:  # one line each, in the text
        assert any(line.split()[:2] == [r.role, r.name] for line in text.splitlines())
    with pytest.raises(ValueError, match="role 'param'"):
        report.names("param")


def test_integer_and_bound_values_are_constants():
    idx = numpy_helper.from_array(np.array([2, 0], np.int64), "idx")
    table = _init("table", np.arange(12).reshape(3, 4))
    nodes = [helper.make_node("Gather", ["table", "idx"], ["e"]),
             helper.make_node("Add", ["x", "e"], ["e1"]),
             helper.make_node("Mul", ["e1", "k"], ["y"])]
    m = em.onnx.load(_model(nodes, [idx, table], inputs=(("x", [2, 4]), ("k", [2, 4]))),
                     constants={"k": np.full((2, 4), 3.0, np.float32)})
    rows = {r.name: r for r in m.import_report().rows}
    assert rows["table"].role == "trainable" and "(Gather)" in rows["table"].why  # embedding
    assert rows["idx"].role == "constant" and rows["idx"].why == "not a float: int64"
    assert rows["k"].role == "constant" and rows["k"].why == "given by constants="


@pytest.mark.parametrize("trainable, picked", [
    (None, ["w", "b", "bn.scale", "bn.bias", "g", "gb", "u"]),
    (True, ["w", "b", "bn.scale", "bn.bias", "g", "gb", "u"]),
    (False, []),
    ("bn.*", ["bn.scale", "bn.bias"]),
    (["w", "g*"], ["w", "g", "gb"]),
    (("b",), ["b"]),
    (lambda name, a: a.ndim == 2, ["w", "g", "u"]),
])
def test_trainable_picks_weights_and_freezes_the_rest(trainable, picked):
    m = em.onnx.load(_mixed(), trainable=trainable)
    report = m.import_report()
    assert report.names("trainable") == picked
    weights = ["w", "b", "bn.scale", "bn.bias", "g", "gb", "u"]
    assert report.names("frozen") == [n for n in weights if n not in picked]
    assert report.names("buffer") == ["bn.mean", "bn.var"]  # never trained
    for n in weights:  # frozen ones are still Params, in the state dict
        assert m.initializers[n].requires_grad == (n in picked)
    assert all("trainable= left it out" in r.why for r in report.rows if r.role == "frozen")


def test_a_scalar_named_exactly_becomes_trainable():
    m = em.onnx.load(_mixed(), trainable=["s", "w"])
    assert m.import_report().names("trainable") == ["w", "s"]
    assert m.initializers["s"].requires_grad
    assert next(r for r in m.import_report().rows if r.name == "s").why.endswith(
        "trainable= names it")
    assert "c" not in m.initializers  # a glob never picks a constant
    assert em.onnx.load(_mixed(), trainable=["*"]).import_report().names("constant") == \
        ["s", "c", "like"]


def test_trainable_names_that_match_nothing_are_errors():
    with pytest.raises(OnnxImportError) as e:
        em.onnx.load(_mixed(), trainable=["bn.scal", "bn.mean", "like", "q*", "w"])
    msg = str(e.value)
    assert msg.startswith("trainable= picks 4 names that no weight has (the weights: w, b, ")
    assert "'bn.scal' matches no weight (close: bn.scale" in msg
    assert "'bn.mean' is a buffer, never trained: running statistic" in msg
    assert "'like' is a constant: read only by shape arithmetic" in msg
    assert "'q*' matches no weight" in msg
    with pytest.raises(TypeError, match="trainable takes None, a bool"):
        em.onnx.load(_mixed(), trainable=3)
    with pytest.raises(TypeError, match="trainable takes"):
        em.onnx.load(_mixed(), trainable=["w", 2])


def test_training_updates_only_the_trainable_weights():
    model = _mixed()
    m = em.onnx.load(model, trainable=["w", "b"])
    before = {n: p.val().copy() for n, p in m.initializers.items()}
    step = em.compile_train_step(m, em.nn.functional.mse_loss, em.optim.SGD(lr=0.1),
                                 backend="interpreter")
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 4)).astype(np.float32), np.zeros((2, 1), np.float32)
    losses = [float(step(x, y)) for _ in range(3)]
    assert losses[2] < losses[0]
    for n, p in m.initializers.items():
        assert np.array_equal(p.val(), before[n]) == (n not in ("w", "b")), n
    v = _values(model)  # the constants are the file's, untouched
    v.update({n: p.val() for n, p in m.initializers.items()})
    np.testing.assert_allclose(em.compile(m, x, backend="interpreter")(x), _reference(x, v),
                               rtol=1e-5, atol=1e-5)


# -- torch's dynamo exporter ------------------------------------------------------------

torch = pytest.importorskip("torch")


class Gpt2Block(torch.nn.Module):
    """GPT-2's block in small: a 0.125 attention scale, a causal mask filled with -3.4e38,
    GELU written out as GPT-2's (0.5, 0.044715, sqrt(2/pi), a cube): the dynamo exporter
    stores each of those numbers as a float initializer."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in (q, k, v))
        a = (q @ k.transpose(-1, -2)) * 0.125
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        a = torch.softmax(a.masked_fill(~causal, -3.4e38), dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.up(self.ln2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                        * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.down(h)


def _dynamo_export(model, x) -> bytes:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, (torch.from_numpy(x),), dynamo=True,
                                        verbose=False)
        return program.model_proto.SerializeToString()
    except Exception as e:  # onnxscript missing, or an exporter that cannot
        pytest.skip(f"torch.onnx.export(dynamo=True) is unavailable: {type(e).__name__}: {e}")


def test_a_dynamo_exported_block_fine_tunes_as_in_pytorch():
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((3, 2, 5, 16)).astype(np.float32)
    ys = rng.standard_normal((3, 2, 5, 16)).astype(np.float32)
    torch.manual_seed(0)
    model = Gpt2Block()
    with torch.no_grad():  # the exporter would share the two LayerNorms' equal initial values
        for p in (model.ln1.weight, model.ln2.weight, model.ln1.bias, model.ln2.bias):
            p.uniform_(0.5, 1.5)
    m = em.onnx.load(_dynamo_export(model, xs[0]))
    report = m.import_report()
    numbers = [float(m.plan.graph.initializers[n]) for n in report.names("constant")
               if m.plan.graph.initializers[n].dtype.kind == "f"]
    for number in (0.125, 0.5, 0.044715, -3.4e38):  # constants, not Params
        assert any(math.isclose(v, number, rel_tol=1e-6) for v in numbers), (number, numbers)
    trained = {n for n, p in m.initializers.items() if p.requires_grad}
    assert len(trained) == sum(1 for _ in model.parameters())  # each weight, nothing more
    step = em.compile_train_step(m, em.nn.functional.mse_loss, em.optim.SGD(lr=0.5),
                                 backend="interpreter")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for x, y in zip(xs, ys):
        loss = float(step(x, y))
        opt.zero_grad()
        want = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        opt.step()
        assert math.isfinite(loss)
        assert loss == pytest.approx(want.item(), rel=1e-4, abs=1e-4)
    for n in report.names("constant"):  # the numbers are the file's, untouched
        assert n not in m.initializers


# -- opsets before 13 -------------------------------------------------------------------

def _old_model():
    """Opset 9: Unsqueeze's axes an attribute (an input from 13 on), Softmax over one axis."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Mul", ["h", "s"], ["h1"]),
             helper.make_node("Unsqueeze", ["h1"], ["u"], axes=[0]),
             helper.make_node("Softmax", ["u"], ["y"], axis=2)]
    return _model(nodes, [_init("w", rng.standard_normal((4, 3))), _init("s", 0.5)], opset=9)


def test_an_opset_9_model_is_upgraded_with_a_notice(capsys):
    model = _old_model()
    m = em.onnx.load(model)
    assert capsys.readouterr().err == ("ember: the model's opset 9 was upgraded to 13 on "
                                       "import (onnx.version_converter)\n")
    assert m.plan.graph.opset == 13
    assert m.import_report().names("trainable") == ["w"]
    x = np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)
    h = (x @ _values(model)["w"] * 0.5)[None]
    want = np.exp(h - h.max(2, keepdims=True))
    want /= want.sum(2, keepdims=True)
    np.testing.assert_allclose(em.compile(m, x, backend="interpreter")(x), want, rtol=1e-5,
                               atol=1e-6)


def test_an_old_opset_the_converter_cannot_upgrade_is_refused_with_its_message():
    model = _model([helper.make_node("NoSuchOp", ["x"], ["y"])], [], opset=9)
    with pytest.raises(OnnxImportError, match="the model uses opset 9 of the default ONNX "
                       "domain; ember imports opsets 13 and later, and onnx.version_converter "
                       "cannot upgrade it: .*no registered schema"):
        em.onnx.load(model)


_SHIPPED = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data",
                        "pytorch-converted")


@pytest.mark.parametrize("name", ["test_Linear", "test_Embedding", "test_Softmax",
                                  "test_BatchNorm2d_eval"])
def test_old_models_shipped_with_onnx_import_and_match(name, capsys):
    folder = os.path.join(_SHIPPED, name)
    if not os.path.isfile(os.path.join(folder, "model.onnx")):
        pytest.skip(f"{folder} is not in this onnx package")
    model = onnx.load(os.path.join(folder, "model.onnx"))
    m = em.onnx.load(os.path.join(folder, "model.onnx"))
    assert "was upgraded to 13" in capsys.readouterr().err
    data = os.path.join(folder, "test_data_set_0")

    def arrays(kind):
        out = []
        for f in sorted(glob.glob(os.path.join(data, f"{kind}_*.pb"))):
            t = onnx.TensorProto()
            with open(f, "rb") as fh:
                t.ParseFromString(fh.read())
            out.append(numpy_helper.to_array(t))
        return out

    inputs = arrays("input")
    (want,) = arrays("output")
    got = em.compile(m, *inputs, backend="interpreter")(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # every float initializer of these is a weight (BatchNorm's statistics: buffers)
    floats = [t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT]
    assert sorted(m.initializers) == sorted(floats)


def test_io_bytes_and_paths_load_alike(tmp_path):
    buf = io.BytesIO()
    onnx.save(_mixed(), buf)
    path = tmp_path / "m.onnx"
    path.write_bytes(buf.getvalue())
    for source in (buf.getvalue(), str(path)):
        assert em.onnx.load(source, trainable="w").import_report().names("trainable") == ["w"]
