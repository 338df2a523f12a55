"""Gradients of the new core and nn ops: against central finite differences in float64 (on
hypothesis-chosen shapes, through the interpreter), through the dedicated rule and through
the decomposition's core rules; then against PyTorch in float32 at 1e-5 relative."""

from __future__ import annotations

import functools
import math

import gradcheck
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.backends import interpreter
from ember.backends.interpreter import rng as ember_rng
from ember.ir import Builder, Graph, TensorType, dtype_of
from ember.passes.autodiff import RULES, Autodiff

T = TensorType
R_SEED = 2024  # the weights r of loss = sum(out * r); never a seed the inputs use
FEW = settings(max_examples=6, deadline=None)
seeds = st.integers(0, 2**32 - 1)


# the shared harness, with r drawn from R_SEED (the torch comparisons redraw it)
build = functools.partial(gradcheck.build, seed=R_SEED)
gradients = functools.partial(gradcheck.gradients, seed=R_SEED)
grad_check = functools.partial(gradcheck.grad_check, seed=R_SEED)


def op(name, **attrs):
    return lambda b, *xs: b.op(name, *xs, **attrs)


def batch_norm(training: bool, eps=1e-5, momentum=0.1):
    def fn(b, x, gamma, beta, rm, rv):
        return b.create("nn.batch_norm", [x, gamma, beta, rm, rv],
                        dict(eps=eps, momentum=momentum, training=training)).results[0]
    return fn


def distinct(rng, shape):
    """Normal values with no ties (max pooling's gradient has a kink at ties)."""
    n = int(np.prod(shape))
    return (rng.permutation(n) + rng.uniform(0.1, 0.9, n)).reshape(shape) / n


# --- finite differences in float64 --------------------------------------------------------

@FEW
@given(seed=seeds, n=st.integers(1, 4))
def test_erf(seed, n):
    grad_check(op("ember.erf"), [np.random.default_rng(seed).normal(size=(n, 2))], {0})


@pytest.mark.parametrize("dtype,rtol", [("f32", 1e-7), ("f16", 2**-11), ("bf16", 2**-8)])
def test_cast_gradient_is_the_gradient_cast_back(dtype, rtol):
    """So through bf16 the gradient is rounded to bf16 (within 2**-8). x and x +- eps are
    multiples of 2**-7 in [0.5, 2), which every dtype here holds: exact differences."""
    x = np.random.default_rng(0).integers(4, 16, size=(3, 4)) / 8
    graph = grad_check(lambda b, x: b.op("ember.cast", b.op("ember.cast", x, dtype=dtype),
                                         dtype="f64"), [x], {0}, eps=2**-7, rtol=rtol)
    assert [op.result.type.dtype for op in graph.ops if op.name == "ember.cast"] == \
        [dtype, "f64", dtype, "f64"]  # forward, then backward: the casts reversed


def test_cast_gradient_through_f32_math():
    grad_check(lambda b, x: b.op("ember.cast", b.op("ember.exp", b.op("ember.cast", x,
                                                                      dtype="f32")),
                                 dtype="f64"),
               [np.random.default_rng(1).normal(size=(2, 3))], {0}, eps=1e-3, rtol=1e-3)


@FEW
@given(seed=seeds, p=st.sampled_from([0.0, 0.3, 0.7]), step=st.integers(0, 5))
def test_dropout_regenerates_the_mask(seed, p, step):
    x = np.random.default_rng(seed).normal(size=(3, 4))
    fn = op("ember.dropout", p=p, seed=11, key=3)
    grad_check(fn, [x, np.array(step)], {0})
    graph = Autodiff().apply(build(fn, [x, np.array(step)], {0}, "f64"))
    assert [o.name for o in graph.ops].count("ember.dropout") == 2  # forward, and on the grad
    _, grad = interpreter.run(graph, [np.array(step)], {"p0": x})
    r = np.random.default_rng(R_SEED).normal(size=x.shape)
    keep = ember_rng.dropout_keep(x.shape, p, 11, 3, step)
    np.testing.assert_allclose(grad, np.where(keep, r / (1 - p), 0))


@FEW
@given(seed=seeds, rows=st.integers(1, 4), idx_shape=st.sampled_from([(3,), (2, 2), ()]))
def test_gather_and_scatter_add(seed, rows, idx_shape):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, rows, idx_shape)
    grad_check(op("ember.gather", axis=0), [rng.normal(size=(rows, 2)), idx], {0})
    upd = rng.normal(size=idx_shape + (2,))
    grad_check(lambda b, i, u: b.op("ember.scatter_add", i, u, shape=[rows, 2]), [idx, upd], {1})


conv_attrs = st.fixed_dictionaries({
    "stride": st.lists(st.integers(1, 2), min_size=2, max_size=2),
    "padding": st.lists(st.integers(0, 1), min_size=2, max_size=2),
    "dilation": st.lists(st.integers(1, 2), min_size=2, max_size=2),
    "groups": st.sampled_from([1, 2])})


@FEW
@given(seed=seeds, a=conv_attrs, bias=st.booleans(), decompose=st.booleans())
def test_conv2d(seed, a, bias, decompose):
    rng = np.random.default_rng(seed)
    g = a["groups"]
    args = [rng.normal(size=(2, 2 * g, 5, 4)), rng.normal(size=(2 * g, 2, 2, 2))]
    grad_check(op("ember.conv2d", **a), args, {0, 1})
    grad_check(op("nn.conv2d", **a), args + ([rng.normal(size=2 * g)] if bias else []),
               {0, 1, 2} if bias else {0, 1}, decompose=decompose)


@FEW
@given(seed=seeds, a=conv_attrs)
def test_conv2d_gradient_ops(seed, a):
    """The gradient ops' own gradients (second order through a conv)."""
    rng = np.random.default_rng(seed)
    x, w = rng.normal(size=(2, 2 * a["groups"], 5, 4)), rng.normal(size=(2 * a["groups"], 2, 2, 2))
    y = interpreter.run(_single(op("ember.conv2d", **a), x, w), [x, w])[0]
    grad_check(op("ember.conv2d_grad_input", **a, input_shape=list(x.shape)),
               [rng.normal(size=y.shape), w], {0, 1})
    grad_check(op("ember.conv2d_grad_weight", **a, weight_shape=list(w.shape)),
               [x, rng.normal(size=y.shape)], {0, 1})


def _single(fn, *args) -> Graph:
    g = Graph("f", [T(a.shape, dtype_of(a.dtype)) for a in args])
    b = Builder(g.body)
    b.create("func.return", [fn(b, *g.args)])
    return g


pool_attrs = st.fixed_dictionaries({
    "kernel": st.lists(st.integers(1, 3), min_size=2, max_size=2),
    "stride": st.lists(st.integers(1, 2), min_size=2, max_size=2),
    "padding": st.lists(st.integers(0, 1), min_size=2, max_size=2)}).filter(
        lambda a: all(2 * p <= k for p, k in zip(a["padding"], a["kernel"])))


@FEW
@given(seed=seeds, a=pool_attrs)
def test_pools(seed, a):
    rng = np.random.default_rng(seed)
    x = distinct(rng, (2, 2, 5, 4))
    grad_check(op("ember.max_pool2d", **a), [x], {0})
    grad_check(op("ember.avg_pool2d", **a), [x], {0})
    y = interpreter.run(_single(op("ember.avg_pool2d", **a), x), [x])[0]
    grad_check(op("ember.avg_pool2d_grad", **a, input_shape=list(x.shape)),
               [rng.normal(size=y.shape)], {0})


@FEW
@given(seed=seeds, lead=st.sampled_from([(3,), (2, 3), (1,)]), norm=st.sampled_from([(4,), (2, 3)]),
       affine=st.booleans(), decompose=st.booleans())
def test_layer_norm(seed, lead, norm, affine, decompose):
    rng = np.random.default_rng(seed)
    axes = list(range(-len(norm), 0))
    args = [rng.normal(size=lead + norm)]
    args += [rng.normal(size=norm), rng.normal(size=norm)] if affine else []
    grad_check(op("nn.layer_norm", axes=axes, eps=1e-5, affine=affine), args,
               set(range(len(args))), decompose=decompose)


@FEW
@given(seed=seeds, shape=st.sampled_from([(4, 3), (3, 2, 2, 3), (2, 3, 1, 1)]),
       training=st.booleans(), decompose=st.booleans())
def test_batch_norm(seed, shape, training, decompose):
    rng = np.random.default_rng(seed)
    c = shape[1]
    args = [rng.normal(size=shape), rng.normal(size=c), rng.normal(size=c), rng.normal(size=c),
            rng.uniform(0.5, 2.0, c)]
    grad_check(batch_norm(training), args, {0, 1, 2}, decompose=decompose)


@FEW
@given(seed=seeds, approximate=st.sampled_from(["none", "tanh"]), decompose=st.booleans())
def test_gelu(seed, approximate, decompose):
    x = np.random.default_rng(seed).normal(size=(3, 4)) * 2
    grad_check(op("nn.gelu", approximate=approximate), [x], {0}, decompose=decompose)


@FEW
@given(seed=seeds, batch=st.sampled_from([(), (2,), (2, 1)]), tq=st.integers(1, 3),
       tk=st.integers(1, 3), causal=st.booleans(), decompose=st.booleans(),
       wrt=st.sampled_from([{0, 1, 2}, {2}, {0}]))
def test_attention(seed, batch, tq, tk, causal, decompose, wrt):
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=batch + (tq, 3)), rng.normal(size=batch + (tk, 3)),
            rng.normal(size=batch + (tk, 2))]
    grad_check(op("nn.attention", causal=causal, scale=0.7), args, wrt, decompose=decompose)


def test_max_pool2d_grad_has_no_rule():
    """Second order through max pooling is not supported: autodiff names the op."""
    assert "ember.max_pool2d_grad" not in RULES


# --- against PyTorch, float32 ---------------------------------------------------------------

def _torch_cases():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    conv = dict(stride=[2, 1], padding=[1, 1], dilation=[1, 2], groups=2)
    tconv = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)
    pool = dict(kernel=[3, 2], stride=[2, 1], padding=[1, 1])
    rng = np.random.default_rng(0)
    x4 = rng.normal(size=(2, 4, 7, 6))
    return torch, [
        ("erf", op("ember.erf"), torch.erf, [rng.normal(size=(3, 5))]),
        ("gather", op("ember.gather", axis=0), lambda t, i: t[i],
         [rng.normal(size=(5, 3)), np.array([[0, 4], [4, 2]])]),
        ("conv2d", op("nn.conv2d", **conv), lambda x, w, b: F.conv2d(x, w, b, **tconv),
         [x4, rng.normal(size=(6, 2, 3, 2)), rng.normal(size=6)]),
        ("max_pool2d", op("ember.max_pool2d", **pool),
         lambda x: F.max_pool2d(x, (3, 2), (2, 1), (1, 1)), [distinct(rng, (2, 4, 7, 6))]),
        ("avg_pool2d", op("ember.avg_pool2d", **pool),
         lambda x: F.avg_pool2d(x, (3, 2), (2, 1), (1, 1), count_include_pad=True), [x4]),
        ("layer_norm", op("nn.layer_norm", axes=[-2, -1], eps=1e-5, affine=True),
         lambda x, g, b: F.layer_norm(x, (3, 8), g, b, 1e-5),
         [rng.normal(size=(4, 3, 8)) * 3 + 1, rng.normal(size=(3, 8)), rng.normal(size=(3, 8))]),
        ("batch_norm_train", batch_norm(True),
         lambda x, g, b, m, v: F.batch_norm(x, m.clone(), v.clone(), g, b, True, 0.1, 1e-5),
         [x4 * 2 + 1, rng.normal(size=4), rng.normal(size=4), rng.normal(size=4),
          rng.uniform(0.5, 2, 4)]),
        ("batch_norm_eval", batch_norm(False),
         lambda x, g, b, m, v: F.batch_norm(x, m, v, g, b, False, 0.1, 1e-5),
         [x4, rng.normal(size=4), rng.normal(size=4), rng.normal(size=4),
          rng.uniform(0.5, 2, 4)]),
        ("gelu", op("nn.gelu", approximate="none"), lambda x: F.gelu(x),
         [rng.normal(size=(4, 6)) * 2]),
        ("gelu_tanh", op("nn.gelu", approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"),
         [rng.normal(size=(4, 6)) * 2]),
        ("attention", op("nn.attention", causal=True, scale=0.4),
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.4),
         [rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 6, 3))]),
        # empty dimensions: NaN means and empty gradients, never a ZeroDivisionError
        ("mean_of_no_rows", op("ember.reduce_mean", axes=[0], keepdims=False),
         lambda x: x.mean(0), [np.zeros((0, 3))]),
        ("mean_of_nothing", op("ember.reduce_mean", axes=[0], keepdims=False),
         lambda x: x.mean(), [np.zeros(0)]),
        ("softmax_empty_axis", op("nn.softmax", axis=1), lambda x: x.softmax(1),
         [np.zeros((3, 0))]),
        ("log_softmax_empty_axis", op("nn.log_softmax", axis=1), lambda x: x.log_softmax(1),
         [np.zeros((3, 0))]),
        ("cross_entropy_no_rows", op("nn.cross_entropy"), F.cross_entropy,
         [np.zeros((0, 5)), np.zeros(0, np.int64)]),
        ("linear_no_features", op("nn.linear"), lambda x, w, b: x @ w + b,
         [np.zeros((2, 0)), np.zeros((0, 3)), rng.normal(size=3)]),
    ]


WRT = {"gather": {0}, "batch_norm_train": {0, 1, 2}, "batch_norm_eval": {0, 1, 2},
       "cross_entropy_no_rows": {0}}
CASES = ["erf", "gather", "conv2d", "max_pool2d", "avg_pool2d", "layer_norm",
         "batch_norm_train", "batch_norm_eval", "gelu", "gelu_tanh", "attention",
         "mean_of_no_rows", "mean_of_nothing", "softmax_empty_axis", "log_softmax_empty_axis",
         "cross_entropy_no_rows", "linear_no_features"]


@pytest.mark.parametrize("decompose", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_against_torch_float32(name, decompose):
    torch, cases = _torch_cases()
    _, fn, tfn, args = next(c for c in cases if c[0] == name)
    wrt = WRT.get(name, set(range(len(args))))
    args32 = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in args]
    _, _, _, ours = gradients(fn, args32, wrt, dtype="f32", decompose=decompose)
    targs = [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(args32)]
    out = tfn(*targs)
    r = np.random.default_rng(R_SEED).normal(size=tuple(out.shape)).astype(np.float32)
    (out * torch.tensor(r)).sum().backward()
    for i in sorted(wrt):
        want = targs[i].grad.numpy()
        got = ours[f"p{i}"]
        scale = float(np.abs(want).max(initial=0.0)) or 1.0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale,
                                   err_msg=f"{name} operand {i}")


def test_torch_layer_norm_is_stable_for_large_offsets():
    """x = 1e3 + small noise: the dedicated rule (centered, two-pass) stays accurate."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = (1e3 + rng.normal(size=(3, 16))).astype(np.float32)
    _, _, _, ours = gradients(op("nn.layer_norm", axes=[-1], eps=1e-5, affine=False), [x], {0},
                              dtype="f32")
    t = torch.tensor(x, requires_grad=True)
    r = np.random.default_rng(R_SEED).normal(size=x.shape).astype(np.float32)
    (torch.nn.functional.layer_norm(t, (16,), eps=1e-5) * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(ours["p0"], t.grad.numpy(), rtol=1e-3,
                               atol=1e-3 * float(np.abs(t.grad.numpy()).max()))
    assert math.isfinite(float(np.abs(ours["p0"]).sum()))
