"""Every backward rule against central finite differences in float64, through the
interpreter; then what autodiff emits (frozen params, output contract) and its errors."""

import numpy as np
import pytest
from elementwise import BINARY, POSITIVE, UNARY
from gradcheck import build, grad_check, param
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ember.backends import interpreter
from ember.ir import Builder, Graph, Location, TensorType, verify
from ember.passes.autodiff import Autodiff, AutodiffError, bound_class
from ember.passes.manager import PipelineError

T = TensorType


shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=1, max_side=3)
seeds = st.integers(0, 2**32 - 1)
SLOW = settings(max_examples=15, deadline=None)


def values(rng, shape, kind="normal"):
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if kind == "nonzero":  # away from the kink at 0 of relu and abs
        return rng.uniform(0.2, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    return rng.normal(size=shape)


def op(name, **attrs):
    return lambda b, *xs: b.op(name, *xs, **attrs)


# how each operand is drawn where "normal" will not do: an op's domain, a kink at 0
KINDS = {"div": ("normal", "nonzero"), "pow": ("positive", "normal"), "abs": ("nonzero",),
         "relu": ("nonzero",), **dict.fromkeys(POSITIVE, ("positive",))}


@pytest.mark.parametrize("name", BINARY)
@SLOW
@given(shapes=pairs, seed=seeds, wrt=st.sampled_from([{0}, {1}, {0, 1}]))
def test_binary(name, shapes, seed, wrt):
    rng = np.random.default_rng(seed)
    kinds = KINDS.get(name, ("normal", "normal"))
    args = [values(rng, s, k) for s, k in zip(shapes.input_shapes, kinds)]
    grad_check(op(f"ember.{name}"), args, wrt)


@pytest.mark.parametrize("name", UNARY)
@SLOW
@given(shape=shapes, seed=seeds)
def test_unary(name, shape, seed):
    (kind,) = KINDS.get(name, ("normal",))
    grad_check(op(f"ember.{name}"), [values(np.random.default_rng(seed), shape, kind)], {0})


@SLOW
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3),
       seed=seeds, wrt=st.sampled_from([{1}, {2}, {1, 2}]))
def test_select(shapes, seed, wrt):
    rng = np.random.default_rng(seed)
    c, x, y = shapes.input_shapes
    grad_check(op("ember.select"), [rng.random(c) < 0.5, rng.normal(size=x), rng.normal(size=y)],
               wrt)


@SLOW
@given(shape=shapes, seed=seeds)
def test_cast_through_f32(shape, seed):
    def fn(b, x):
        return b.op("ember.cast", b.op("ember.cast", x, dtype="f32"), dtype="f64")
    grad_check(fn, [values(np.random.default_rng(seed), shape)], {0}, eps=1e-2, rtol=1e-4,
               atol=1e-5)


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean", "reduce_max"])
@SLOW
@given(data=st.data(), seed=seeds, keepdims=st.booleans())
def test_reduce(name, data, seed, keepdims):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=3))
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                              unique_by=lambda a: a % len(shape)))
    grad_check(op(f"ember.{name}", axes=axes, keepdims=keepdims),
               [values(np.random.default_rng(seed), shape)], {0})


def test_reduce_max_splits_ties():
    graph = Autodiff().apply(build(op("ember.reduce_max", axes=[0], keepdims=False),
                                   [np.ones(4)], {0}))
    _, grad = interpreter.run(graph, [], {"p0": np.array([1.0, 3.0, 3.0, 2.0])})
    r = np.random.default_rng(0).normal(size=())
    np.testing.assert_allclose(grad, [0, r / 2, r / 2, 0])


@SLOW
@given(data=st.data(), seed=seeds)
def test_broadcast(data, seed):
    target = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=3))
    keep = data.draw(st.integers(0, len(target)))
    ones = data.draw(st.lists(st.booleans(), min_size=keep, max_size=keep))
    shape = tuple(1 if one else d for one, d in zip(ones, target[len(target) - keep:]))
    grad_check(op("ember.broadcast", shape=list(target)),
               [values(np.random.default_rng(seed), shape)], {0})


@SLOW
@given(shape=shapes, seed=seeds, flat=st.booleans())
def test_reshape(shape, seed, flat):
    new = [int(np.prod(shape))] if flat else list(reversed(shape)) + [1]
    grad_check(op("ember.reshape", shape=new), [values(np.random.default_rng(seed), shape)], {0})


@SLOW
@given(data=st.data(), seed=seeds)
def test_transpose(data, seed):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=3))
    perm = data.draw(st.permutations(range(len(shape))))
    grad_check(op("ember.transpose", perm=list(perm)),
               [values(np.random.default_rng(seed), shape)], {0})


@SLOW
@given(batch=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3),
       mkn=st.tuples(*[st.integers(1, 3)] * 3), seed=seeds,
       wrt=st.sampled_from([{0}, {1}, {0, 1}]))
def test_matmul(batch, mkn, seed, wrt):
    (ba, bb), (m, k, n) = batch.input_shapes, mkn
    rng = np.random.default_rng(seed)
    grad_check(op("ember.matmul"), [rng.normal(size=ba + (m, k)), rng.normal(size=bb + (k, n))],
               wrt)


@SLOW
@given(lead=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
       d=st.integers(1, 3), o=st.integers(1, 3), bias=st.booleans(), seed=seeds,
       wrt=st.sampled_from([{0}, {1}, {2}, {0, 1}, {0, 1, 2}]))
def test_linear(lead, d, o, bias, seed, wrt):
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=lead + (d,)), rng.normal(size=(d, o))]
    args += [rng.normal(size=o)] if bias else []
    wrt = {i for i in wrt if i < len(args)} or {1}
    grad_check(op("nn.linear"), args, wrt)


# decomposed: the lowering's backward (with its max marked stop_gradient) is also right
@pytest.mark.parametrize("decompose", [False, True])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@SLOW
@given(data=st.data(), seed=seeds)
def test_softmaxes(name, decompose, data, seed):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=3))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    grad_check(op(f"nn.{name}", axis=axis), [values(np.random.default_rng(seed), shape)], {0},
               decompose=decompose)


@pytest.mark.parametrize("decompose", [False, True])
@SLOW
@given(n=st.integers(1, 4), c=st.integers(1, 4), seed=seeds)
def test_cross_entropy(decompose, n, c, seed):
    rng = np.random.default_rng(seed)
    grad = grad_check(op("nn.cross_entropy"), [rng.normal(size=(n, c)), rng.integers(0, c, n)],
                      {0}, decompose=decompose)
    assert count(grad, "ember.cmp") == 0  # nothing flows back through the max


def test_value_used_twice_and_chains_accumulate():
    def fn(b, x, w):
        h = b.op("ember.tanh", b.op("ember.matmul", x, w))
        return b.op("ember.add", b.op("ember.mul", h, h), b.op("ember.matmul", h, w))
    rng = np.random.default_rng(1)
    grad_check(fn, [rng.normal(size=(2, 3)), rng.normal(size=(3, 3))], {0, 1})


def test_bound_classes():  # that every op has a rule: tests/ir/test_registry.py
    assert bound_class("ember.matmul") == bound_class("nn.linear") == "compute"
    assert bound_class("ember.exp") == "memory"


# --- what autodiff emits -----------------------------------------------------------------

def two_layer(frozen_first: bool, **first_attrs) -> Graph:
    g = Graph("f", [T((4, 3), "f32")], ["x"])
    b = Builder(g.body)
    attrs = {"requires_grad": False} if frozen_first else first_attrs
    w1, w2 = param(b, (3, 5), "w1", "f32", **attrs), param(b, (5, 2), "w2", "f32")
    out = b.op("ember.matmul", b.op("ember.matmul", g.args[0], w1), w2)
    loss = b.op("ember.reduce_sum", out, axes=[0, 1], keepdims=False)
    b.create("func.return", [loss, out])
    return g


def count(graph: Graph, name: str) -> int:
    return sum(op.name == name for op in graph.ops)


def test_output_contract():
    g = verify(Autodiff().apply(two_layer(False)))
    assert g.attributes["ember.grads"] == ["w1", "w2"]
    assert [str(t) for t in g.result_types] == ["tensor<f32>", "tensor<4x2xf32>",
                                                "tensor<3x5xf32>", "tensor<5x2xf32>"]
    assert count(g, "ember.matmul") == 2 + 3  # dh, dw1, dw2; never dx (x is an input)


@pytest.mark.parametrize("attrs", [{"frozen_first": True},
                                   {"frozen_first": False, "kind": "buffer"},
                                   {"frozen_first": False, "kind": "flag"}])
def test_frozen_param_gets_no_gradient_and_no_backward_ops(attrs):
    g = verify(Autodiff().apply(two_layer(**attrs)))
    assert g.attributes["ember.grads"] == ["w2"]
    assert len(g.outputs) == 3
    assert count(g, "ember.matmul") == 2 + 1  # only dw2 = h^T @ g


def test_unused_param_gets_zeros():
    g = Graph("f", [T((3,), "f64")])
    b = Builder(g.body)
    param(b, (2, 2), "unused")
    w = param(b, (3,), "w")
    b.create("func.return", [b.op("ember.reduce_sum", b.op("ember.mul", g.args[0], w), axes=[0],
                                  keepdims=False)])
    g = verify(Autodiff().apply(g))
    _, d_unused, d_w = interpreter.run(g, [np.arange(3.0)], {"unused": np.ones((2, 2)),
                                                           "w": np.ones(3)})
    np.testing.assert_array_equal(d_unused, np.zeros((2, 2)))
    np.testing.assert_array_equal(d_w, np.arange(3.0))


def test_loss_must_be_a_scalar():
    g = Graph("f", [T((3,), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.mul", g.args[0], param(b, (3,), "w", "f32"))])
    with pytest.raises(AutodiffError, match=r"scalar.*tensor<3xf32>"):
        Autodiff().apply(g)


def test_needs_a_trainable_param():
    with pytest.raises(AutodiffError, match="no trainable ember.param"):
        Autodiff().apply(_all_frozen())


def _all_frozen() -> Graph:
    g = Graph("f", [T((3,), "f32")])
    b = Builder(g.body)
    w = param(b, (3,), "w", "f32", requires_grad=False)
    b.create("func.return", [b.op("ember.reduce_sum", b.op("ember.mul", g.args[0], w), axes=[0],
                                  keepdims=False)])
    return g


def test_op_without_rule_is_named_with_its_location():
    g = Graph("f", [])
    b = Builder(g.body)
    w = param(b, (3,), "w", "f32")
    y = b.create("foo.mystery", [w], result_types=[T((3,), "f32")],
                 loc=Location("model.py", 7, 3)).result
    b.create("func.return", [b.op("ember.reduce_sum", y, axes=[0], keepdims=False)])
    with pytest.raises(AutodiffError, match=r"'foo.mystery' at loc\(\"model.py\":7:3\)"):
        Autodiff().apply(g)


def test_runs_once():
    g = Autodiff().apply(two_layer(False))
    with pytest.raises(PipelineError, match="already"):
        Autodiff().check(g)
