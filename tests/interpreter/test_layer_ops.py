"""The numpy references of the conv/pool/norm/attention/dropout/gather ops, against direct
numpy loops and (where installed) PyTorch, plus their type inference errors."""

import math

import numpy as np
import pytest
from conv_reference import conv2d_loops

from ember.backends import interpreter
from ember.backends.interpreter import rng
from ember.ir import Builder, Graph, InferenceError, TensorType, dtype_of, lookup, verify
from ember.ir.parser import parse

R = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return R.normal(size=shape).astype(dtype)


def run(name, *arrays, **attrs):
    """Build a graph holding one `name` op on graph arguments, verify, print, parse, run."""
    g = Graph("f", [TensorType(a.shape, dtype_of(a.dtype)) for a in arrays])
    b = Builder(g.body)
    op = b.create(name, list(g.args), attrs)
    b.create("func.return", op.results)
    g = parse(str(verify(g)))  # the op's text round-trips
    outs = interpreter.run(g, list(arrays))
    return outs if len(outs) > 1 else outs[0]


def torch():
    return pytest.importorskip("torch")


def t(a):
    return torch().from_numpy(np.ascontiguousarray(a))


# -- erf, gelu ------------------------------------------------------------------------------

def test_erf_and_gelu():
    x = np.linspace(-6, 6, 201)
    np.testing.assert_allclose(run("ember.erf", x), [math.erf(v) for v in x], rtol=0, atol=1e-15)
    x32 = randn(4, 5) * 3
    Phi = 0.5 * (1 + np.vectorize(math.erf)(x32.astype(np.float64) / math.sqrt(2)))
    np.testing.assert_allclose(run("nn.gelu", x32, approximate="none"), x32 * Phi, rtol=1e-6,
                               atol=1e-7)
    F = torch().nn.functional
    for approx in ("none", "tanh"):
        np.testing.assert_allclose(run("nn.gelu", x32, approximate=approx),
                                   F.gelu(t(x32), approximate=approx).numpy(), rtol=1e-5,
                                   atol=1e-6)
    np.testing.assert_allclose(run("ember.erf", x32), torch().erf(t(x32)).numpy(), atol=1e-6)


# -- dropout --------------------------------------------------------------------------------

def _mix_py(x):
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def test_dropout_hash_matches_the_contract_in_plain_python():
    # seed and key: their low 32 bits count; the step's low 32 bits are the step, its high
    # bits the shard, which offsets the first coordinate by shard * rows
    seed, key, step = 0x1_2345_6789, 7, (256 << 32) + 3
    h = rng.dropout_hash((3, 5), seed, key, step)
    m = 0xFFFFFFFF
    for r in range(3):
        for c in range(5):
            index = _mix_py(_mix_py(0 ^ ((256 * 3 + r) & m)) ^ c)
            want = _mix_py((seed & m) ^ _mix_py((key & m) ^ _mix_py((step & m) ^ index)))
            assert int(h[r, c]) == want
    assert h.dtype == np.uint32


def test_dropout_op_keeps_scales_and_varies_by_step_and_key():
    x = randn(64, 64)
    p = 0.25
    y = run("ember.dropout", x, np.array(5, np.int64), p=p, seed=3, key=11)
    keep = rng.dropout_keep(x.shape, p, 3, 11, 5)
    np.testing.assert_array_equal(y, np.where(keep, x / np.float32(1 - p), 0))
    assert abs(keep.mean() - (1 - p)) < 0.02
    u = (rng.dropout_hash(x.shape, 3, 11, 5) >> 8) * 2.0**-24
    assert np.array_equal(keep, u >= p)
    for other in [(3, 11, 6), (3, 12, 5), (4, 11, 5)]:
        assert (rng.dropout_keep(x.shape, p, *other) != keep).mean() > 0.2
    y0 = run("ember.dropout", x, np.array(5, np.int64), p=0.0, seed=3, key=11)
    np.testing.assert_array_equal(y0, x)


def test_dropout_is_random_and_checks_its_operands():
    d = lookup("ember.dropout")
    assert "random" in d.traits and "pure" in d.traits
    x = TensorType((4,), "f32")
    with pytest.raises(InferenceError, match=r"rng must be a tensor<i64> scalar, got "
                                             r"tensor<2xi64>"):
        d.result_types([x, TensorType((2,), "i64")], {"p": 0.5, "seed": 0, "key": 0})
    with pytest.raises(InferenceError, match=r"p must be in \[0, 1\), got 1.0"):
        d.result_types([x, TensorType((), "i64")], {"p": 1.0, "seed": 0, "key": 0})


# -- gather / scatter_add ---------------------------------------------------------------------

def test_gather_and_scatter_add_are_adjoint():
    table, idx = randn(6, 3), np.array([[0, 5, 2], [2, 2, 1]], np.int64)
    out = run("ember.gather", table, idx, axis=0)
    np.testing.assert_array_equal(out, table[idx])
    upd = randn(2, 3, 3)
    s = run("ember.scatter_add", idx, upd, shape=[6, 3])
    want = np.zeros((6, 3), np.float32)
    for i, row in zip(idx.reshape(-1), upd.reshape(-1, 3)):
        want[i] += row
    np.testing.assert_allclose(s, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((out * upd).sum(dtype=np.float64),
                               (table * s).sum(dtype=np.float64), atol=1e-5)
    with pytest.raises(InferenceError, match=r"updates \[2, 3\] do not fit indices \[2, 3\] "
                                             r"into \[6, 3\]"):
        lookup("ember.scatter_add").result_types(
            [TensorType((2, 3), "i64"), TensorType((2, 3), "f32")], {"shape": [6, 3]})
    with pytest.raises(IndexError, match="index 9 out of range"):
        run("ember.gather", table, np.array([9]), axis=0)


# -- conv2d and its gradients -------------------------------------------------------------------

CONVS = [  # x shape, w shape, stride, padding, dilation, groups
    ((2, 3, 7, 6), (4, 3, 3, 3), [1, 1], [0, 0], [1, 1], 1),
    ((1, 4, 9, 8), (6, 2, 3, 2), [2, 1], [1, 2], [1, 2], 2),
    ((2, 4, 8, 8), (4, 1, 3, 3), [2, 3], [2, 1], [2, 1], 4),
    ((1, 2, 5, 1), (3, 2, 3, 1), [1, 1], [1, 0], [1, 1], 1),  # conv1d as H=5, W=1
]


def _attrs(stride, padding, dilation, groups):
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONVS)
def test_conv2d_and_its_gradients(xs, ws, stride, padding, dilation, groups):
    a = _attrs(stride, padding, dilation, groups)
    x, w = randn(*xs, dtype=np.float64), randn(*ws, dtype=np.float64)
    y = run("ember.conv2d", x, w, **a)
    np.testing.assert_allclose(y, conv2d_loops(x, w, stride, padding, dilation, groups),
                               rtol=1e-12, atol=1e-12)
    g = randn(*y.shape, dtype=np.float64)
    dx = run("ember.conv2d_grad_input", g, w, input_shape=list(xs), **a)
    dw = run("ember.conv2d_grad_weight", x, g, weight_shape=list(ws), **a)
    # adjoint identities: <conv(x, w), g> = <x, dx> = <w, dw>
    np.testing.assert_allclose((y * g).sum(), (x * dx).sum(), rtol=1e-10)
    np.testing.assert_allclose((y * g).sum(), (w * dw).sum(), rtol=1e-10)
    b = randn(ws[0], dtype=np.float64)
    yb = run("nn.conv2d", x, w, b, **a)
    np.testing.assert_allclose(yb, y + b[:, None, None], rtol=1e-12)

    th = torch()
    xt, wt = t(x).requires_grad_(), t(w).requires_grad_()
    yt = th.nn.functional.conv2d(xt, wt, None, stride, padding, dilation, groups)
    yt.backward(t(g))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, wt.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_conv2d_grad_input_is_conv_transpose():
    th = torch()
    g, w = randn(2, 4, 3, 4), randn(4, 3, 3, 3)  # ConvTranspose2d(4 -> 6, groups=2)... below
    a = _attrs([2, 2], [1, 1], [1, 1], 1)
    # output_padding 1: the input is one row/column taller than the minimal one
    y = run("ember.conv2d_grad_input", g, w, input_shape=[2, 3, 6, 8], **a)
    want = th.nn.functional.conv_transpose2d(t(g), t(w), None, 2, 1, output_padding=1)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-5, atol=1e-5)


def test_conv2d_errors_show_the_shapes():
    conv = lookup("ember.conv2d")
    a = _attrs([1, 1], [0, 0], [1, 1], 1)
    with pytest.raises(InferenceError, match=r"input \[1, 3, 8, 8\] has 3 channels but weight "
                                             r"\[4, 2, 3, 3\] expects 2"):
        conv.result_types([TensorType((1, 3, 8, 8), "f32"), TensorType((4, 2, 3, 3), "f32")], a)
    with pytest.raises(InferenceError, match=r"groups=2 must divide input channels 3"):
        conv.result_types([TensorType((1, 3, 8, 8), "f32"), TensorType((4, 2, 3, 3), "f32")],
                          {**a, "groups": 2})
    with pytest.raises(InferenceError, match=r"kernel 9x3 .* does not fit input \[1, 3, 8, 8\]"):
        conv.result_types([TensorType((1, 3, 8, 8), "f32"), TensorType((4, 3, 9, 3), "f32")], a)
    with pytest.raises(InferenceError, match=r"'stride' must be two integers >= 1, got \[0, 1\]"):
        conv.result_types([TensorType((1, 3, 8, 8), "f32"), TensorType((4, 3, 3, 3), "f32")],
                          {**a, "stride": [0, 1]})
    with pytest.raises(InferenceError, match=r"input must be NCHW \(rank 4\), got \[3, 8, 8\]"):
        conv.result_types([TensorType((3, 8, 8), "f32"), TensorType((4, 3, 3, 3), "f32")], a)
    assert "compute_bound" in conv.traits
    assert "compute_bound" in lookup("ember.conv2d_grad_input").traits
    assert "compute_bound" in lookup("ember.conv2d_grad_weight").traits


# -- pools ------------------------------------------------------------------------------------

POOLS = [([2, 2], [2, 2], [0, 0]), ([3, 3], [2, 1], [1, 1]), ([3, 2], [1, 2], [1, 0])]


@pytest.mark.parametrize("kernel, stride, padding", POOLS)
def test_pools_and_their_gradients(kernel, stride, padding):
    x = randn(2, 3, 7, 6)
    a = {"kernel": kernel, "stride": stride, "padding": padding}
    mx, av = run("ember.max_pool2d", x, **a), run("ember.avg_pool2d", x, **a)
    g = randn(*mx.shape)
    dmx = run("ember.max_pool2d_grad", x, g, **a)
    dav = run("ember.avg_pool2d_grad", g, input_shape=list(x.shape), **a)
    # a direct loop
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    x0 = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    want_dmx = np.zeros_like(xp)
    for i in range(mx.shape[2]):
        for j in range(mx.shape[3]):
            win = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            np.testing.assert_allclose(mx[:, :, i, j], win.max(axis=(2, 3)))
            np.testing.assert_allclose(av[:, :, i, j], x0[:, :, i * sh:i * sh + kh,
                                                          j * sw:j * sw + kw].mean(axis=(2, 3)),
                                       rtol=1e-5, atol=1e-7)
            arg = win.reshape(*win.shape[:2], -1).argmax(-1)
            for n in range(x.shape[0]):
                for c in range(x.shape[1]):
                    di, dj = divmod(arg[n, c], kw)
                    want_dmx[n, c, i * sh + di, j * sw + dj] += g[n, c, i, j]
    np.testing.assert_allclose(dmx, want_dmx[:, :, ph:ph + 7, pw:pw + 6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((av * g).sum(), (x * dav).sum(), rtol=1e-5)

    F = torch().nn.functional
    for fn, ours, grad in [(F.max_pool2d, mx, dmx), (F.avg_pool2d, av, dav)]:
        xt = t(x).requires_grad_()
        yt = fn(xt, kernel, stride, padding)
        yt.backward(t(g))
        np.testing.assert_allclose(ours, yt.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_max_pool_grad_goes_to_the_first_max():
    x = np.ones((1, 1, 2, 2), np.float32)
    g = np.full((1, 1, 1, 1), 3.0, np.float32)
    d = run("ember.max_pool2d_grad", x, g, kernel=[2, 2], stride=[2, 2], padding=[0, 0])
    np.testing.assert_array_equal(d, [[[[3, 0], [0, 0]]]])
    with pytest.raises(InferenceError, match=r"padding \[2, 0\] must be at most half"):
        lookup("ember.max_pool2d").result_types(
            [TensorType((1, 1, 8, 8), "f32")], {"kernel": [3, 3], "stride": [1, 1],
                                                "padding": [2, 0]})


# -- norms and attention --------------------------------------------------------------------

def test_layer_norm():
    x, gamma, beta = randn(3, 4, 5), randn(4, 5), randn(4, 5)
    y = run("nn.layer_norm", x, gamma, beta, axes=[1, 2], eps=1e-5, affine=True)
    xd = x.astype(np.float64)
    m, v = xd.mean(axis=(1, 2), keepdims=True), xd.var(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(y, (xd - m) / np.sqrt(v + 1e-5) * gamma + beta, rtol=1e-5,
                               atol=1e-6)
    y1 = run("nn.layer_norm", x, axes=[-1], eps=1e-5, affine=False)
    np.testing.assert_allclose(
        y1, torch().nn.functional.layer_norm(t(x), (5,), eps=1e-5).numpy(), atol=1e-5)
    yt = torch().nn.functional.layer_norm(t(x), (4, 5), t(gamma), t(beta), eps=1e-5)
    np.testing.assert_allclose(y, yt.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceError, match=r"axes \[0\] must be the trailing axes of "
                                             r"\[3, 4, 5\]"):
        lookup("nn.layer_norm").result_types([TensorType((3, 4, 5), "f32")],
                                             {"axes": [0], "eps": 1e-5})
    with pytest.raises(InferenceError, match=r"gamma tensor<5xf32> does not match input"):
        lookup("nn.layer_norm").result_types(
            [TensorType((3, 4, 5), "f32")] + [TensorType((5,), "f32")] * 2,
            {"axes": [1, 2], "eps": 1e-5})


@pytest.mark.parametrize("shape", [(6, 3), (2, 3, 4, 5)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_has_three_results(shape, training):
    x = randn(*shape) * 2 + 1
    gamma, beta, rm, rv = randn(3), randn(3), randn(3), np.abs(randn(3)) + 0.5
    y, new_m, new_v = run("nn.batch_norm", x, gamma, beta, rm, rv, eps=1e-5, momentum=0.1,
                          training=training)
    axes = (0,) + tuple(range(2, len(shape)))
    b = (1, 3) + (1,) * (len(shape) - 2)
    xd = x.astype(np.float64)
    if training:
        m, v = xd.mean(axis=axes), xd.var(axis=axes)
        n = x.size // 3
        np.testing.assert_allclose(new_m, 0.9 * rm + 0.1 * m, rtol=1e-5)
        np.testing.assert_allclose(new_v, 0.9 * rv + 0.1 * v * n / (n - 1), rtol=1e-5)
    else:
        m, v = rm, rv
        np.testing.assert_array_equal(new_m, rm)
        np.testing.assert_array_equal(new_v, rv)
    want = (xd - m.reshape(b)) / np.sqrt(v.reshape(b) + 1e-5) * gamma.reshape(b) + beta.reshape(b)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)

    th = torch()
    trm, trv = t(rm.copy()), t(rv.copy())
    yt = th.nn.functional.batch_norm(t(x), trm, trv, t(gamma), t(beta), training, 0.1, 1e-5)
    np.testing.assert_allclose(y, yt.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new_m, trm.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_v, trv.numpy(), rtol=1e-5, atol=1e-6)


def test_batch_norm_errors():
    bn = lookup("nn.batch_norm")
    vec = TensorType((3,), "f32")
    with pytest.raises(InferenceError, match=r"running_var tensor<4xf32> does not match input"):
        bn.result_types([TensorType((2, 3), "f32"), vec, vec, vec, TensorType((4,), "f32")],
                        {"eps": 1e-5, "momentum": 0.1, "training": False})
    with pytest.raises(InferenceError, match=r"more than one value per channel.*\[1, 3\]"):
        bn.result_types([TensorType((1, 3), "f32"), vec, vec, vec, vec],
                        {"eps": 1e-5, "momentum": 0.1, "training": True})


@pytest.mark.parametrize("causal", [False, True])
def test_attention(causal):
    q, k, v = randn(2, 3, 5, 4), randn(2, 3, 5, 4), randn(2, 3, 5, 6)
    scale = 0.5
    y = run("nn.attention", q, k, v, causal=causal, scale=scale)
    s = q.astype(np.float64) @ k.swapaxes(-1, -2) * scale
    if causal:
        s = s + np.triu(np.full((5, 5), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(y, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-6)
    yt = torch().nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=causal,
                                                            scale=scale)
    np.testing.assert_allclose(y, yt.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceError, match=r"q \[5, 4\], k \[5, 3\], v \[5, 6\] do not fit"):
        lookup("nn.attention").result_types(
            [TensorType((5, 4), "f32"), TensorType((5, 3), "f32"), TensorType((5, 6), "f32")],
            {"causal": False, "scale": 1.0})


# -- empty inputs: torch's results, without numpy's warnings (errors under -W error) --------

def empty(*shape):
    return np.zeros(shape, np.float32)


EMPTY = [("nn.softmax", lambda x: x.softmax(1), [empty(3, 0)], {"axis": 1}),
         ("nn.log_softmax", lambda x: x.log_softmax(1), [empty(3, 0)], {"axis": 1}),
         ("nn.softmax", lambda x: x.softmax(1), [empty(0, 3)], {"axis": 1}),
         ("nn.cross_entropy", lambda x, y: torch().nn.functional.cross_entropy(x, y),
          [empty(0, 5), np.zeros(0, np.int64)], {})]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("name, ref, args, attrs", EMPTY)
def test_nn_kernels_on_empty_inputs(name, ref, args, attrs):
    want = ref(*map(t, args)).numpy()
    np.testing.assert_array_equal(run(name, *args, **attrs), want)  # shapes; NaN where torch's
