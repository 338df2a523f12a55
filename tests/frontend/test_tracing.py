"""Tracing: the graph of a forward pass, lazy params, locations, shape errors, numerics."""

import inspect

import numpy as np
import pytest

import ember as em
from ember import ir, nn
from ember.backends import interpreter

F = nn.functional


class Mlp(nn.Module):
    def __init__(self, d_in=4, hidden=8, d_out=3):
        super().__init__()
        self.layers = [nn.Linear(d_in, hidden), nn.Linear(hidden, hidden)]
        self.head = nn.Linear(hidden, d_out, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))  # LINE: layer call
        return self.head(x)


def _line(marker):
    src, start = inspect.getsourcelines(Mlp)
    return start + next(i for i, s in enumerate(src) if marker in s)


def _values(model):
    return {pid: p.val() for pid, p in model.params_by_id().items()}


def test_trace_records_params_layers_and_stays_lazy():
    model = Mlp()
    graph = em.trace(model, em.TensorSpec((5, 4)))
    names = [op.name for op in graph.ops]
    assert names == ["ember.param"] * 5 + ["nn.linear", "ember.relu"] * 2 + ["nn.linear",
                                                                            "func.return"]
    params = {op.attributes["path"]: op for op in graph.params()}
    for path, p in model.named_parameters():
        attrs = params[path].attributes
        assert attrs["id"] == str(p.id) and attrs["init"] == str(p.init)
        assert "kind" not in attrs and "requires_grad" not in attrs
        assert params[path].result.type == ir.TensorType(p.shape, "f32")
    assert graph.name == "forward" and [a.name for a in graph.args] == ["x"]
    assert graph.result_types == [ir.TensorType((5, 3), "f32")]
    assert not any(p.is_initialized for p in model.parameters())
    text = str(graph)
    assert 'path = "layers.1.weight"' in text and not any(p.is_initialized
                                                          for p in model.parameters())


def test_ops_carry_the_users_source_line():
    graph = em.trace(Mlp(), np.zeros((2, 4), np.float32))
    linear = next(op for op in graph.ops if op.name == "nn.linear")
    assert linear.loc.file == __file__ and linear.loc.line == _line("LINE: layer call")


def test_traced_mlp_matches_numpy():
    model = Mlp()
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    (out,) = interpreter.run(em.trace(model, x), [x], _values(model))
    h = x
    for layer in model.layers:
        h = np.maximum(h @ layer.weight.val() + layer.bias.val(), 0)
    np.testing.assert_allclose(out, h @ model.head.weight.val(), rtol=1e-5, atol=1e-6)


def test_shape_errors_name_the_module_path_and_both_shapes():
    model = nn.Sequential(nn.Linear(64, 128))
    with pytest.raises(em.ShapeError) as e:
        em.trace(model, em.TensorSpec((32, 20)))
    assert str(e.value).startswith(
        "layers.0 (Linear): nn.linear: input [32, 20] does not match weight [64, 128]")
    assert isinstance(e.value, ValueError)


def test_errors_in_the_root_forward_name_the_root():
    class Root(nn.Module):
        def forward(self, x):
            return x + np.zeros((3,), np.float32)

    with pytest.raises(em.ShapeError, match=r"^<root> \(Root\): ember.add: shapes \[2, 4\] and"):
        em.trace(Root(), em.TensorSpec((2, 4)))


class Ops(nn.Module):
    """Params used as tensors, scalars on both sides, reductions and shape ops."""

    def __init__(self):
        super().__init__()
        self.w = em.Param((4, 3), em.init.Normal(0, 1))
        self.scale = em.Param((3,), em.init.Ones(), kind="buffer")

    def forward(self, x):
        y = (x @ self.w) * self.scale + 1.0
        y = 2 - y / 4 - (-y)
        z = y.reshape(-1, 3).transpose().T.reshape((2, 3, 1)).transpose(1, 0, 2)
        m = z.sum(axis=0) + z.mean(axis=(0, 2), keepdims=True).max()
        return m.exp().log(), (y > 0.5).astype("f32").sum(), self.w.T.sum(axis=-1), self.w == 0


def _ops_reference(x, w, scale):
    y = (x @ w) * scale + 1.0
    y = 2 - y / 4 - (-y)
    z = y.reshape(-1, 3).T.T.reshape(2, 3, 1).transpose(1, 0, 2)
    m = z.sum(axis=0) + z.mean(axis=(0, 2), keepdims=True).max()
    return [m, (y > 0.5).astype(np.float32).sum(), w.T.sum(axis=-1), w == 0]


def test_tensor_methods_and_operators_match_numpy():
    model = Ops()
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    graph = em.trace(model, x)
    outs = interpreter.run(graph, [x], _values(model))
    for got, want in zip(outs, _ops_reference(x, model.w.val(), model.scale.val())):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    consts = [op for op in graph.ops if op.name == "ember.constant"]
    assert consts and all(op.result.type == ir.TensorType((), "f32") for op in consts)
    scale = next(op for op in graph.params() if op.attributes["path"] == "scale")
    assert scale.attributes["kind"] == "buffer" and scale.attributes["requires_grad"] is False
    reduce = next(op for op in graph.ops if op.name == "ember.reduce_sum")
    assert reduce.attributes == {"axes": [0], "keepdims": False}


def test_frozen_params_are_marked_and_each_param_appears_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.same = self.fc  # a shared module: one param op, the first path

        def forward(self, x):
            return self.same(self.fc(x))

    model = Tied()
    model.fc.freeze()
    params = em.trace(model, em.TensorSpec((1, 3))).params()
    assert [op.attributes["path"] for op in params] == ["fc.weight", "fc.bias"]
    assert all(op.attributes["requires_grad"] is False for op in params)


def test_flags_are_read_at_trace_time():
    class Switch(nn.Module):
        def __init__(self):
            super().__init__()
            self.training = em.Param.flag(True)

        def forward(self, x):
            return x * 2.0 if self.training else x

    model = Switch()
    assert [op.name for op in em.trace(model, em.TensorSpec((2,))).ops][-2] == "ember.mul"
    assert [op.name for op in em.trace(model.valid(), em.TensorSpec((2,))).ops] == ["func.return"]


def test_trace_function_traces_a_loss_with_integer_labels():
    model = Mlp()
    x = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32)
    y = np.array([0, 2, 1, 1, 0, 2])
    graph = em.frontend.trace.trace_function(
        lambda xb, yb: F.cross_entropy(model(xb), yb), model, [x, em.TensorSpec((6,), "i64")],
        name="loss", arg_names=["x", "y"])
    assert graph.name == "loss" and [str(a.type) for a in graph.args] == [
        "tensor<6x4xf32>", "tensor<6xi64>"]
    assert graph.result_types == [ir.TensorType((), "f32")]
    (loss,) = interpreter.run(graph, [x, y], _values(model))
    (logits,) = interpreter.run(em.trace(model, x), [x], _values(model))
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    np.testing.assert_allclose(loss, -logp[np.arange(6), y].mean(), rtol=1e-5)


def test_functional_ops():
    def fn(a, b):
        return (F.softmax(a), F.log_softmax(a, axis=0), F.sigmoid(a), F.tanh(a), F.mse_loss(a, b),
                F.linear(a, np.ones((3, 2), np.float32)))

    a, b = np.random.default_rng(3).normal(size=(2, 2, 3)).astype(np.float32)
    graph = em.frontend.trace.trace_function(fn, None, [a, b])
    assert [op.attributes["axis"] for op in graph.ops if op.name.endswith("softmax")] == [1, 0]
    got = interpreter.run(graph, [a, b])
    e = np.exp(a - a.max(1, keepdims=True))
    want = [e / e.sum(1, keepdims=True), None, 1 / (1 + np.exp(-a)), np.tanh(a),
            ((a - b) ** 2).mean(), a @ np.ones((3, 2))]
    for g, w in zip(got, want):
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_params_outside_the_model_are_rejected():
    stray = em.Param((4, 3), em.init.Zeros())

    class Uses(nn.Module):
        def forward(self, x):
            return x @ stray

    with pytest.raises(ValueError, match="not in the model"):
        em.trace(Uses(), em.TensorSpec((1, 4)))


def test_outputs_must_be_tensors():
    class Bad(nn.Module):
        def forward(self, x):
            return 3

    with pytest.raises(TypeError, match="returned a int"):
        em.trace(Bad(), em.TensorSpec((1,)))
