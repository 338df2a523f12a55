"""Training and eval traces: dropout's rng argument, BatchNorm's buffer updates."""

import numpy as np
import pytest

import ember as em
from ember import ir, nn
from ember.backends import interpreter
from ember.backends.interpreter import rng
from ember.frontend.trace import trace_function
from ember.ir.parser import parse

F = nn.functional


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.drop1 = nn.Dropout(0.5)
        self.drop2 = nn.Dropout(0.25)

    def forward(self, x):
        return self.drop2(self.drop1(self.bn(self.fc(x))))


def names(graph):
    return [op.name for op in graph.ops]


def run(model, graph, *inputs):
    return interpreter.run(graph, list(inputs), {k: p.val() for k, p in
                                                 model.params_by_id().items()})


def test_eval_trace_has_no_random_ops_and_no_updates():
    model = Net()
    for g in (em.trace(model, em.TensorSpec((8, 4))),
              em.trace(model.valid(), em.TensorSpec((8, 4)), training=True)):
        assert "ember.dropout" not in names(g)
        assert "ember.rng" not in g.attributes and "ember.buffer_updates" not in g.attributes
        assert len(g.args) == 1 and len(g.outputs) == 1
        bn = next(op for op in g.ops if op.name == "nn.batch_norm")
        assert bn.attributes["training"] is False


def test_training_trace_adds_rng_and_buffer_updates():
    em.seed(7)
    model = Net()
    g = em.trace(model, em.TensorSpec((8, 4)), training=True)
    drops = [op for op in g.ops if op.name == "ember.dropout"]
    assert len(drops) == 2 and drops[0].attributes["key"] != drops[1].attributes["key"]
    assert drops[0].attributes["seed"] == 7 and drops[1].attributes["p"] == 0.25
    i = g.attributes["ember.rng"]
    assert g.args[i].name == "rng" and g.args[i].type == ir.TensorType((), "i64")
    assert all(op.operands[1] is g.args[i] for op in drops)
    assert g.attributes["ember.buffer_updates"] == [str(model.bn.running_mean.id),
                                                    str(model.bn.running_var.id)]
    assert [str(t) for t in g.result_types] == ["tensor<8x4xf32>", "tensor<4xf32>",
                                                "tensor<4xf32>"]
    assert "ember.rng = 1" in str(g) and parse(str(g)).attributes == g.attributes

    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    y, mean, var = run(model, g, x, np.array(3, np.int64))
    h = x @ model.fc.weight.val() + model.fc.bias.val()
    m, v = h.mean(0), h.var(0)
    np.testing.assert_allclose(mean, 0.1 * m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(var, 0.9 + 0.1 * v * 8 / 7, rtol=1e-5)
    h = (h - m) / np.sqrt(v + 1e-5)
    keys = [op.attributes["key"] for op in drops]
    h = rng.dropout(h.astype(np.float32), 0.5, 7, keys[0], 3)
    h = rng.dropout(h, 0.25, 7, keys[1], 3)
    np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-6)
    (y4, *_), (y3, *_) = run(model, g, x, np.array(4, np.int64)), run(model, g, x,
                                                                     np.array(3, np.int64))
    assert not np.array_equal(y4 == 0, y3 == 0) and np.array_equal(y3, y)


def test_a_frozen_dropout_is_inactive_in_a_training_trace():
    model = Net()
    model.drop1.freeze()
    model.train()
    g = em.trace(model, em.TensorSpec((8, 4)), training=True)
    assert [op.attributes["p"] for op in g.ops if op.name == "ember.dropout"] == [0.25]


def test_functional_dropout_and_update_buffer_rules():
    model = Net()

    def fn(x):
        y = F.dropout(x, 0.5, training=True)
        return F.dropout(y, 0.0) + F.dropout(x, 0.3, training=False)

    assert "ember.dropout" not in names(trace_function(fn, model, [em.TensorSpec((3,))]))
    assert names(trace_function(fn, model, [em.TensorSpec((3,))], training=True)).count(
        "ember.dropout") == 1
    with pytest.raises(ValueError, match=r"got 1.5"):
        trace_function(lambda x: F.dropout(x, 1.5), model, [em.TensorSpec((3,))])

    def bad_kind(x):
        em.frontend.context.current().update_buffer(model.fc.bias, x)
        return x

    with pytest.raises(TypeError, match="update_buffer needs a buffer Param, got a float"):
        trace_function(bad_kind, model, [em.TensorSpec((4,))], training=True)

    def bad_shape(x):
        em.frontend.context.current().update_buffer(model.bn.running_mean, x)
        return x

    with pytest.raises(em.ShapeError, match=r"new value tensor<5xf32> does not match buffer "
                                            r"tensor<4xf32>"):
        trace_function(bad_shape, model, [em.TensorSpec((5,))], training=True)
