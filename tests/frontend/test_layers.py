"""Every layer: its traced forward, run by the interpreter in eval and training traces,
equals a numpy reference and (where installed) PyTorch; losses likewise."""

import math

import numpy as np
import pytest
from conv_reference import conv2d_loops

import ember as em
from ember import nn
from ember.backends import interpreter
from ember.backends.interpreter import rng
from ember.frontend.records import load_torch
from ember.frontend.trace import trace_function

F = nn.functional
R = np.random.default_rng(0)
_erf = np.vectorize(math.erf)


def randn(*shape):
    return R.normal(size=shape).astype(np.float32)


def forward(model, *xs, training=False, step=0):
    g = em.trace(model, *xs, training=training)
    inputs = list(xs) + ([np.array(step, np.int64)] if "ember.rng" in g.attributes else [])
    outs = interpreter.run(g, inputs, {k: p.val() for k, p in model.params_by_id().items()})
    return outs[0] if len(outs) == 1 else outs


def both_modes(model, *xs):
    """The output of an eval and a training trace; for layers without modes they agree."""
    a, b = forward(model, *xs), forward(model, *xs, training=True)
    np.testing.assert_array_equal(a, b)
    return a


def torch_or_skip():
    return pytest.importorskip("torch")


def tt(a):
    return torch_or_skip().from_numpy(np.ascontiguousarray(a))


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(a, b.detach().numpy() if hasattr(b, "detach") else b,
                               rtol=tol, atol=tol)


# -- convolutions ---------------------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs, pad", [
    ((3, 4, 3), dict(stride=(2, 1), padding=1, dilation=(1, 2)), (1, 1)),
    ((4, 6, 3), dict(padding="same", groups=2), (1, 1)),
    ((4, 4, (3, 2)), dict(padding="valid", groups=4, bias=False), (0, 0)),
])
def test_conv2d(args, kwargs, pad):
    m = nn.Conv2d(*args, **kwargs)
    x = randn(2, args[0], 7, 6)
    y = both_modes(m, x)
    b = None if m.bias is None else m.bias.val()
    close(y, conv2d_loops(x, m.weight.val(), m.stride, pad, m.dilation, m.groups, b))
    torch = torch_or_skip()
    tm = torch.nn.Conv2d(*args, **kwargs)
    load_torch(m, tm.state_dict())
    close(forward(m, x), tm(tt(x)))


def test_conv1d():
    m = nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2)
    x = randn(2, 3, 9)
    y = both_modes(m, x)
    w = m.weight.val()[:, :, None]
    close(y, conv2d_loops(x[:, :, None], w, (1, 2), (0, 1), (1, 2), 1, m.bias.val())[:, :, 0])
    torch = torch_or_skip()
    tm = torch.nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2)
    load_torch(m, tm.state_dict())
    close(forward(m, x), tm(tt(x)))
    same = nn.Conv1d(2, 2, 3, padding="same")
    assert forward(same, randn(1, 2, 5)).shape == (1, 2, 5)


def test_conv_transpose2d():
    m = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    x = randn(2, 4, 3, 4)
    y = both_modes(m, x)
    assert y.shape == (2, 6, 6, 8)
    w, want = m.weight.val(), np.zeros((2, 6, 8, 10))  # padded by 1 on each side
    for c in range(4):
        g = c // 2
        for o in range(3):
            for ki in range(3):
                for kj in range(3):
                    want[:, g * 3 + o, ki:ki + 5:2, kj:kj + 7:2] += x[:, c] * w[c, o, ki, kj]
    close(y, want[:, :, 1:7, 1:9] + m.bias.val()[:, None, None])
    torch = torch_or_skip()
    tm = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    load_torch(m, tm.state_dict())
    close(forward(m, x), tm(tt(x)))


# -- normalization --------------------------------------------------------------------------

def randomize(*params):
    for p in params:
        p.set_value(R.normal(size=p.shape).astype(np.float32))


def test_layer_group_and_rms_norm():
    x = randn(3, 4, 5)
    ln, gn, rms = nn.LayerNorm((4, 5)), nn.GroupNorm(2, 4), nn.RMSNorm(5)
    randomize(ln.gamma, ln.beta, gn.gamma, gn.beta, rms.gamma)
    xd = x.astype(np.float64)
    m, v = xd.mean((1, 2), keepdims=True), xd.var((1, 2), keepdims=True)
    close(both_modes(ln, x), (xd - m) / np.sqrt(v + 1e-5) * ln.gamma.val() + ln.beta.val())
    xg = xd.reshape(3, 2, 10)
    m, v = xg.mean(2, keepdims=True), xg.var(2, keepdims=True)
    want = ((xg - m) / np.sqrt(v + 1e-5)).reshape(3, 4, 5)
    close(both_modes(gn, x), want * gn.gamma.val()[:, None] + gn.beta.val()[:, None])
    ms = (xd * xd).mean(-1, keepdims=True)
    close(both_modes(rms, x), xd / np.sqrt(ms + 1e-5) * rms.gamma.val())
    torch = torch_or_skip()
    tf = torch.nn.functional
    close(forward(ln, x), tf.layer_norm(tt(x), (4, 5), tt(ln.gamma.val()), tt(ln.beta.val())))
    close(forward(gn, x), tf.group_norm(tt(x), 2, tt(gn.gamma.val()), tt(gn.beta.val())))
    close(forward(rms, x), tf.rms_norm(tt(x), (5,), tt(rms.gamma.val()), eps=1e-5))


@pytest.mark.parametrize("layer, shape", [(nn.BatchNorm1d, (6, 3)), (nn.BatchNorm1d, (4, 3, 5)),
                                          (nn.BatchNorm2d, (2, 3, 4, 5))])
def test_batch_norm_modes(layer, shape):
    bn = layer(3, momentum=0.2)
    randomize(bn.gamma, bn.beta)
    bn.running_mean.set_value(np.array([0.5, -1, 2], np.float32))
    bn.running_var.set_value(np.array([1.5, 0.5, 2], np.float32))
    x = randn(*shape) * 2 + 1
    axes = (0,) + tuple(range(2, len(shape)))
    b = (1, 3) + (1,) * (len(shape) - 2)
    g, beta = bn.gamma.val().reshape(b), bn.beta.val().reshape(b)
    rm, rv = bn.running_mean.val(), bn.running_var.val()
    # eval trace (or flag off): running statistics, no updates
    want = (x - rm.reshape(b)) / np.sqrt(rv.reshape(b) + 1e-5) * g + beta
    close(forward(bn, x), want)
    close(forward(bn.valid(), x, training=True), want)
    bn.train()
    y, new_m, new_v = forward(bn, x, training=True)
    m, v = x.mean(axes), x.var(axes)
    n = x.size // 3
    close(y, (x - m.reshape(b)) / np.sqrt(v.reshape(b) + 1e-5) * g + beta)
    close(new_m, 0.8 * rm + 0.2 * m)
    close(new_v, 0.8 * rv + 0.2 * v * n / (n - 1))
    torch = torch_or_skip()
    tm = (torch.nn.BatchNorm1d if layer is nn.BatchNorm1d else torch.nn.BatchNorm2d)(
        3, momentum=0.2)
    with torch.no_grad():
        tm.weight.copy_(tt(bn.gamma.val()))
        tm.bias.copy_(tt(bn.beta.val()))
        tm.running_mean.copy_(tt(rm))
        tm.running_var.copy_(tt(rv))
    close(y, tm.train()(tt(x)))
    close(new_m, tm.running_mean)
    close(new_v, tm.running_var)
    bn.running_mean.set_value(new_m)
    bn.running_var.set_value(new_v)
    close(forward(bn, x), tm.eval()(tt(x)))


# -- dropout, embedding, pools, activations, attention -----------------------------------

def test_dropout_modes():
    em.seed(3)
    d = nn.Dropout(0.4)
    x = randn(6, 7)
    np.testing.assert_array_equal(forward(d, x), x)
    y = forward(d, x, training=True, step=9)
    np.testing.assert_array_equal(y, rng.dropout(x, 0.4, 3, 0, 9))
    assert 0 < (y == 0).mean() < 0.8
    np.testing.assert_array_equal(forward(d.valid(), x, training=True, step=9), x)


def test_embedding():
    e = nn.Embedding(10, 4)
    idx = np.array([[1, 9, 0], [3, 3, 2]])
    out = both_modes(e, idx)
    np.testing.assert_array_equal(out, e.weight.val()[idx])
    assert e.weight.val().std() > 0.5  # N(0, 1)
    close(out, torch_or_skip().nn.functional.embedding(tt(idx), tt(e.weight.val())))


def _pool_ref(x, k, s, p, fn, fill):
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    oh, ow = (x.shape[2] + 2 * p - k) // s + 1, (x.shape[3] + 2 * p - k) // s + 1
    return np.stack([np.stack([fn(xp[:, :, i * s:i * s + k, j * s:j * s + k], axis=(2, 3))
                               for j in range(ow)], -1) for i in range(oh)], -2)


def test_pools():
    x = randn(2, 3, 7, 5)
    mx, av = nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(3, 2, 1)
    close(both_modes(mx, x), _pool_ref(x, 3, 2, 1, np.max, -np.inf))
    close(both_modes(av, x), _pool_ref(x, 3, 2, 1, np.mean, 0.0))
    assert forward(nn.MaxPool2d(2), x).shape == (2, 3, 3, 2)
    ad = nn.AdaptiveAvgPool2d((3, 2))
    want = np.zeros((2, 3, 3, 2))
    for i in range(3):
        for j in range(2):
            h0, h1 = i * 7 // 3, -(-(i + 1) * 7 // 3)
            w0, w1 = j * 5 // 2, -(-(j + 1) * 5 // 2)
            want[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    close(both_modes(ad, x), want)
    close(forward(nn.AdaptiveAvgPool2d(1), x), x.mean(axis=(2, 3), keepdims=True))
    tf = torch_or_skip().nn.functional
    close(forward(mx, x), tf.max_pool2d(tt(x), 3, 2, 1))
    close(forward(av, x), tf.avg_pool2d(tt(x), 3, 2, 1))
    close(forward(ad, x), tf.adaptive_avg_pool2d(tt(x), (3, 2)))


ACTIVATIONS = [
    (nn.ReLU(), lambda x: np.maximum(x, 0), "relu"),
    (nn.LeakyReLU(0.2), lambda x: np.where(x > 0, x, 0.2 * x), "leaky_relu"),
    (nn.GELU(), lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), "gelu"),
    (nn.GELU("tanh"), lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                         * (x + 0.044715 * x ** 3))), "gelu_t"),
    (nn.SiLU(), lambda x: x / (1 + np.exp(-x)), "silu"),
    (nn.Tanh(), np.tanh, "tanh"),
    (nn.Sigmoid(), lambda x: 1 / (1 + np.exp(-x)), "sigmoid"),
    (nn.Softmax(axis=1), lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True), "softmax"),
    (nn.Flatten(), lambda x: x.reshape(2, -1), "flatten"),
    (nn.Flatten(0, 1), lambda x: x.reshape(6, 4), "flatten01"),
]


@pytest.mark.parametrize("layer, ref, name", ACTIVATIONS, ids=[a[2] for a in ACTIVATIONS])
def test_activations_and_flatten(layer, ref, name):
    x = randn(2, 3, 4) * 3
    y = both_modes(layer, x)
    close(y, ref(x.astype(np.float64)))
    torch = torch_or_skip()
    tf = torch.nn.functional
    torch_fn = {"relu": tf.relu, "leaky_relu": lambda t: tf.leaky_relu(t, 0.2), "gelu": tf.gelu,
                "gelu_t": lambda t: tf.gelu(t, approximate="tanh"), "silu": tf.silu,
                "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                "softmax": lambda t: tf.softmax(t, 1), "flatten": lambda t: t.flatten(1),
                "flatten01": lambda t: t.flatten(0, 1)}[name]
    close(y, torch_fn(tt(x)))


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention(causal):
    mha = nn.MultiHeadAttention(8, 2, causal=causal)
    x, mem = randn(2, 5, 8), randn(2, 3, 8)
    y = both_modes(mha, x)

    def ref(q_in, kv_in, causal):
        def heads(a, lin):
            h = a @ lin.weight.val() + lin.bias.val()
            return h.reshape(a.shape[0], a.shape[1], 2, 4).transpose(0, 2, 1, 3)
        q, k, v = heads(q_in, mha.query), heads(kv_in, mha.key), heads(kv_in, mha.value)
        s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / 2.0
        if causal:
            s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = (p / p.sum(-1, keepdims=True)) @ v
        o = o.transpose(0, 2, 1, 3).reshape(q_in.shape[0], q_in.shape[1], 8)
        return o @ mha.output.weight.val() + mha.output.bias.val(), (q, k, v)

    want, (q, k, v) = ref(x, x, causal)
    close(y, want)
    cross = trace_function(lambda a, b: mha(a, b, causal=False), mha, [x, mem])
    (yc,) = interpreter.run(cross, [x, mem], {k_: p.val() for k_, p in
                                              mha.params_by_id().items()})
    close(yc, ref(x, mem, False)[0])
    tf = torch_or_skip().nn.functional
    o = tf.scaled_dot_product_attention(tt(q), tt(k), tt(v), is_causal=causal)
    o = o.permute(0, 2, 1, 3).reshape(2, 5, 8).numpy()
    close(y, o @ mha.output.weight.val() + mha.output.bias.val())


def test_a_small_cnn_in_both_modes():
    em.seed(1)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Dropout(0.5), nn.Flatten(), nn.Linear(36, 3))
    x = randn(4, 1, 6, 6)
    y_eval = forward(model, x)
    y_train, mean, var = forward(model, x, training=True, step=1)
    assert y_eval.shape == y_train.shape == (4, 3) and mean.shape == var.shape == (4,)
    assert not np.allclose(y_eval, y_train)


# -- losses ----------------------------------------------------------------------------

def loss(fn, *arrays):
    (out,) = interpreter.run(trace_function(fn, None, arrays), list(arrays))
    return float(out)


def test_losses():
    logits, labels = randn(6, 4), np.array([0, 3, 1, 1, 2, 0])
    probs = np.exp(randn(6, 4))
    probs /= probs.sum(1, keepdims=True)
    ld = logits.astype(np.float64)
    logp = ld - np.log(np.exp(ld).sum(1, keepdims=True))
    nll = -logp[np.arange(6), labels].mean()
    assert loss(F.cross_entropy, logits, labels) == pytest.approx(nll, rel=1e-5)
    assert loss(F.nll_loss, logp.astype(np.float32), labels) == pytest.approx(nll, rel=1e-5)
    smooth = 0.9 * nll - 0.1 * logp.mean(1).mean()
    assert loss(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1), logits,
                labels) == pytest.approx(smooth, rel=1e-5)
    soft = -(probs * logp).sum(1).mean()
    assert loss(F.cross_entropy, logits, probs.astype(np.float32)) == pytest.approx(soft, 1e-5)
    t = (R.random((6, 4)) > 0.5).astype(np.float32)
    bce = np.mean(np.maximum(ld, 0) - ld * t + np.log1p(np.exp(-np.abs(ld))))
    assert loss(F.binary_cross_entropy_with_logits, logits * 30, t) == pytest.approx(
        np.mean(np.maximum(ld * 30, 0) - ld * 30 * t + np.log1p(np.exp(-np.abs(ld * 30)))),
        rel=1e-5)
    assert loss(F.binary_cross_entropy_with_logits, logits, t) == pytest.approx(bce, rel=1e-5)
    assert loss(F.mse_loss, logits, t) == pytest.approx(((ld - t) ** 2).mean(), rel=1e-5)

    torch = torch_or_skip()
    tf = torch.nn.functional
    tl, tlab = tt(logits), tt(labels)
    close(loss(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1), logits, labels),
          tf.cross_entropy(tl, tlab, label_smoothing=0.1))
    close(loss(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.2), logits,
               probs.astype(np.float32)),
          tf.cross_entropy(tl, tt(probs.astype(np.float32)), label_smoothing=0.2))
    close(loss(F.binary_cross_entropy_with_logits, logits, t),
          tf.binary_cross_entropy_with_logits(tl, tt(t)))
    close(loss(F.nll_loss, logp.astype(np.float32), labels),
          tf.nll_loss(tt(logp.astype(np.float32)), tlab))


# -- shape errors name the module path and both shapes ---------------------------------------

@pytest.mark.parametrize("model, shape, message", [
    (nn.Sequential(nn.Conv2d(3, 4, 3)), (2, 5, 8, 8),
     r"^layers.0 \(Conv2d\): nn.conv2d: input \[2, 5, 8, 8\] has 5 channels but weight "
     r"\[4, 3, 3, 3\] expects 3"),
    (nn.Sequential(nn.Linear(4, 3), nn.BatchNorm2d(3)), (2, 4),
     r"^layers.1 \(BatchNorm2d\): BatchNorm2d input must be \(N, C, H, W\), got \[2, 3\]"),
    (nn.Sequential(nn.BatchNorm1d(3)), (2, 4),
     r"^layers.0 \(BatchNorm1d\): nn.batch_norm: gamma tensor<3xf32> does not match input "
     r"tensor<2x4xf32>"),
    (nn.Sequential(nn.LayerNorm(8)), (2, 6),
     r"^layers.0 \(LayerNorm\): input \[2, 6\] does not end with the normalized shape \[8\]"),
    (nn.Sequential(nn.MaxPool2d(4)), (1, 1, 3, 3),
     r"^layers.0 \(MaxPool2d\): ember.max_pool2d: kernel 4x4 does not fit input \[1, 1, 3, 3\]"),
    (nn.Sequential(nn.MultiHeadAttention(8, 2)), (2, 8),
     r"^layers.0 \(MultiHeadAttention\): multi_head_attention: query must be \[B, T, D\], "
     r"got \[2, 8\]"),
])
def test_shape_errors_name_the_module_path_and_shapes(model, shape, message):
    with pytest.raises(em.ShapeError, match=message):
        em.trace(model, em.TensorSpec(shape))


def test_dropout_p_1_drops_everything_in_training_and_nothing_in_eval():
    import numpy as np

    import ember as em

    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = nn.Linear(5, 5), nn.Dropout(1.0)

        def forward(self, x):
            return self.drop(self.fc(x))

    x = np.ones((4, 5), np.float32)
    model = Drop()
    grad = em.compile_grad(model, lambda o, t: (o * t).sum(), backend="interpreter")
    grads = grad(x, x)  # through a dropout that keeps nothing: loss and gradients 0, not NaN
    assert grad.loss == 0.0 and not grads[model.fc.weight.id].any()
    want = em.compile(model.fc, x)(x)
    np.testing.assert_allclose(em.compile(model.valid(), x)(x), want)
