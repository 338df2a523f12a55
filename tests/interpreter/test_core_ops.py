"""The slice's ops on the interpreter against numpy written out directly (and, for the
losses, from their definitions), with broadcasting and odd shapes."""

import numpy as np
import pytest

from ember.backends import interpreter
from ember.ir import Builder, Graph, TensorType, dtype_of, verify

rng = np.random.default_rng(0)


def run(name, *arrays, **attrs):
    g = Graph("f", [TensorType(a.shape, dtype_of(a.dtype)) for a in arrays])
    b = Builder(g.body)
    b.create("func.return", [b.op(name, *g.args, **attrs)])
    (out,) = interpreter.run(verify(g), list(arrays))
    return out


A = rng.normal(size=(3, 1, 5)).astype(np.float32)
B = rng.normal(size=(4, 1)).astype(np.float32)
POS = rng.uniform(0.5, 2.0, size=(2, 7)).astype(np.float32)

BINARY = {"ember.add": np.add, "ember.sub": np.subtract, "ember.mul": np.multiply,
          "ember.div": np.divide, "ember.max": np.maximum}
UNARY = {"ember.neg": np.negative, "ember.exp": np.exp, "ember.log": np.log,
         "ember.relu": lambda x: np.where(x > 0, x, 0)}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_broadcast_like_numpy(name):
    out = run(name, A, B)
    assert out.shape == (3, 4, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out, BINARY[name](A, B), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops(name):
    np.testing.assert_allclose(run(name, POS), UNARY[name](POS), rtol=1e-6)


@pytest.mark.parametrize("pred,fn", [("gt", np.greater), ("le", np.less_equal),
                                     ("eq", np.equal), ("ne", np.not_equal)])
def test_compare_and_select(pred, fn):
    c = run("ember.cmp", A, B, predicate=pred)
    np.testing.assert_array_equal(c, fn(A, B))
    np.testing.assert_array_equal(run("ember.select", c, A, B), np.where(fn(A, B), A, B))


@pytest.mark.parametrize("name,fn", [("ember.reduce_sum", np.sum), ("ember.reduce_mean", np.mean),
                                     ("ember.reduce_max", np.max)])
@pytest.mark.parametrize("axes", [[0], [2], [0, 2], [0, 1, 2]])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(name, fn, axes, keepdims):
    x = rng.normal(size=(3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(run(name, x, axes=axes, keepdims=keepdims),
                               fn(x, axis=tuple(axes), keepdims=keepdims), rtol=1e-5)


def test_shape_ops_and_matmul():
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run("ember.reshape", x, shape=[6, 4]), x.reshape(6, 4))
    np.testing.assert_array_equal(run("ember.transpose", x, perm=[2, 0, 1]),
                                  np.transpose(x, (2, 0, 1)))
    np.testing.assert_array_equal(run("ember.broadcast", B, shape=[2, 4, 3]),
                                  np.broadcast_to(B, (2, 4, 3)))
    w = rng.normal(size=(4, 6)).astype(np.float32)
    expect = np.einsum("bij,jk->bik", x, w)
    np.testing.assert_allclose(run("ember.matmul", x, w), expect, rtol=1e-5, atol=1e-6)


def test_linear_log_softmax_and_cross_entropy_from_their_definitions():
    x = rng.normal(size=(5, 4)).astype(np.float32)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    bias = rng.normal(size=(3,)).astype(np.float32)
    logits = run("nn.linear", x, w, bias)
    np.testing.assert_allclose(logits, x @ w + bias, rtol=1e-5)
    logp = run("nn.log_softmax", logits, axis=1)
    direct = np.log(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(logp, direct, rtol=1e-5, atol=1e-6)
    labels = np.array([0, 2, 1, 2, 0], dtype=np.int64)
    loss = run("nn.cross_entropy", logits, labels)
    assert loss.shape == ()
    expect = np.mean([-np.log(np.exp(r[t]) / np.exp(r).sum()) for r, t in zip(logits, labels)])
    np.testing.assert_allclose(loss, expect, rtol=1e-5)


def test_log_softmax_is_stable_for_large_logits():
    big = np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32)
    out = run("nn.log_softmax", big, axis=1)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [[0.0, -1000.0, -2000.0]], rtol=1e-6)


def test_a_shard_of_the_batch_draws_its_rows_of_the_global_mask():
    """rng = step | shard << 32: shard r of a [4, 6] batch draws rows 4r..4r+3 of the mask
    that the [8, 6] global batch draws at that step (data-parallel dropout)."""
    from ember.backends.interpreter import rng

    whole = rng.dropout_keep((8, 6), 0.5, seed=3, key=9, step=11)
    for shard in (0, 1):
        part = rng.dropout_keep((4, 6), 0.5, seed=3, key=9, step=11 | shard << 32)
        np.testing.assert_array_equal(part, whole[4 * shard:4 * shard + 4])
