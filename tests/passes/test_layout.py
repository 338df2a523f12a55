"""The layout pass (passes/layout.py): which convs go channels last, that the values stay
the interpreter's, and that the transposes left are where a chain meets NCHW."""

from __future__ import annotations

import numpy as np
import pytest
from conv_chains import CONV, conv, mobilenet
from fused_checks import close, graph, rand

from ember.backends import interpreter
from ember.ir import InferenceError
from ember.passes import PassManager, parse_pipeline


def laid_out(g):
    return PassManager(parse_pipeline("layout,canonicalize,cse,dce"), verify_each=True).run(g)


def names(g) -> list[str]:
    return [op.name for op in g.ops]


@pytest.mark.parametrize("n", [1, 2])
def test_a_mobilenet_runs_channels_last_with_the_same_values(n):
    g, shapes = mobilenet(n, 8, 16)
    inputs = rand(*shapes)
    want = interpreter.run(g, inputs)
    out = laid_out(g)
    ops = names(out)
    # the stem (3 input channels) and both depthwise convs channels last
    assert ops.count("ember.conv2d_nhwc") == 3 and ops.count("ember.matmul") == 4
    assert "ember.conv2d" not in ops
    assert "ember.unslice" not in ops  # each padding went into its depthwise conv
    perms = [op.attributes["perm"] for op in out.ops if op.name == "ember.transpose"]
    # the image into the chain, the residual sum back out; the weights' own
    assert sorted(perms) == sorted([[0, 2, 3, 1], [0, 3, 1, 2]] + [[2, 3, 1, 0]] * 3
                                   + [[1, 0]] * 4), perms
    close(interpreter.run(out, inputs), want)


def test_a_chain_without_a_depthwise_conv_stays_nchw():
    def fn(b, x, w1, w3):
        return [conv(b, conv(b, x, w1), w3, pad=1)]
    g = graph([(2, 8, 6, 6), (8, 8, 1, 1), (8, 8, 3, 3)], fn)
    before = str(g)
    assert str(laid_out(g)) == before


def test_a_pointwise_conv_of_one_pixel_is_a_matmul_in_any_chain():
    """A squeeze-and-excite's 1x1 convs of a pooled [n, c, 1, 1]: NCHW and NHWC agree, so
    they are matmuls with no transpose, chain or not (the pooled value's own chain holds
    no depthwise conv)."""
    def fn(b, x, w1, w2):
        pooled = b.op("ember.reduce_mean", x, axes=[2, 3], keepdims=True)
        return [conv(b, b.op("ember.relu", conv(b, pooled, w1)), w2)]
    shapes = [(2, 8, 5, 5), (4, 8, 1, 1), (8, 4, 1, 1)]
    g = graph(shapes, fn)
    inputs = rand(*shapes)
    want = interpreter.run(g, inputs)
    out = laid_out(g)
    ops = names(out)
    assert ops.count("ember.matmul") == 2 and "ember.conv2d" not in ops
    assert [op.attributes["perm"] for op in out.ops if op.name == "ember.transpose"] \
        == [[1, 0]] * 2  # (the weights')
    close(interpreter.run(out, inputs), want)


def test_an_image_stem_without_a_depthwise_conv_stays_nchw():
    """A ResNet's 3-channel stem: its chain has no depthwise conv."""
    def fn(b, x, w, p):
        return [conv(b, b.op("ember.relu", conv(b, x, w, stride=2, pad=1)), p)]
    g = graph([(1, 3, 8, 8), (8, 3, 3, 3), (8, 8, 1, 1)], fn)
    before = str(g)
    assert str(laid_out(g)) == before


def test_a_lone_depthwise_conv_stays_nchw():
    """Its two transposes would cost more than channels last saves it."""
    def fn(b, x, w):
        return [b.op("ember.relu", conv(b, x, w, pad=1, groups=8))]
    g = graph([(1, 8, 6, 6), (8, 1, 3, 3)], fn)
    before = str(g)
    assert str(laid_out(g)) == before


def test_a_depthwise_conv_with_more_outputs_than_inputs_stays_nchw():
    """A channel multiplier of 2 (groups = c_in, c_out = 2 c_in) is not what the cpu's
    channels-last kernel runs: that chain keeps NCHW."""
    def fn(b, x, w, p):
        return [conv(b, conv(b, x, w, pad=1, groups=8), p)]
    g = graph([(1, 8, 6, 6), (16, 1, 3, 3), (8, 16, 1, 1)], fn)
    before = str(g)
    assert str(laid_out(g)) == before


def test_a_graph_with_a_backward_stays_nchw():
    g, _ = mobilenet(1, 8, 16)
    g.attributes["ember.grads"] = ["p"]
    before = str(g)
    assert str(PassManager(parse_pipeline("layout")).run(g)) == before


@pytest.mark.parametrize("padding,out", [([1, 2], (2, 7, 9, 4)), ([0, 1, 2, 0], (2, 7, 6, 4))])
def test_conv2d_nhwc_pads_each_side(padding, out):
    """[ph, pw] pads as much after as before; [top, left, bottom, right] each side its own."""
    def fn(b, x, w):
        return [b.op("ember.conv2d_nhwc", x, w, stride=[1, 1], padding=padding, groups=4,
                     **CONV)]
    g = graph([(2, 7, 7, 4), (3, 3, 1, 4)], fn)
    assert g.ops[0].result.type.shape == out
    x, w = rand((2, 7, 7, 4), (3, 3, 1, 4))
    top, left, bottom, right = padding * 2 if len(padding) == 2 else padding
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    want = sum(xp[:, i:i + out[1], j:j + out[2], :] * w[i, j, 0]
               for i in range(3) for j in range(3))
    np.testing.assert_allclose(interpreter.run(g, [x, w])[0], want, rtol=1e-6, atol=1e-6)


def test_conv2d_nhwc_names_a_bad_padding():
    def fn(b, x, w):
        return [b.op("ember.conv2d_nhwc", x, w, stride=[1, 1], padding=[1, 1, 1],
                     groups=4, **CONV)]
    with pytest.raises(InferenceError, match=r"'padding' must be \[ph, pw\] or \[top, left, "
                                             r"bottom, right\]"):
        graph([(1, 5, 5, 4), (3, 3, 1, 4)], fn)
