"""Conv epilogues (`kernel.conv2d`) on the cpu, against the interpreter: the body run on
each span an implicit conv finishes (a unit, or a batch of units; panels across images
included), or after the whole conv (depthwise, pointwise and im2col convs, and an operand
whose strides do not walk a plane as one run), in place over the first result or from
scratch (a mask as the only result)."""

from __future__ import annotations

import pytest
from fused_checks import close, four_ways, graph, rand

from ember.backends import cpu, interpreter

CONV = dict(dilation=[1, 1])


def check(g, inputs, threads):
    """`four_ways`, then the fused graph again on other inputs: a result the epilogue left
    unwritten would otherwise hold the unfused run's values, freed and handed back."""
    f = four_ways(g, inputs, threads=threads)
    run = cpu.Executable(f, threads, use_cache=False)
    for seed in (1, 2):
        other = [a.astype(x.dtype) for a, x in zip(rand(*(x.shape for x in inputs),
                                                            seed=seed), inputs)]
        close(run(other), interpreter.run(g, other), f"seed {seed}")
    assert [op.name for op in f.ops if "conv" in op.name] == ["kernel.conv2d"]


def _bias_residual_relu(o: int, stride: int, pad: int, groups: int, raw: bool):
    def fn(b, x, w, bias, r):
        y = b.op("ember.conv2d", x, w, stride=[stride] * 2, padding=[pad] * 2, groups=groups,
                 **CONV)
        z = b.op("ember.add", y, b.op("ember.reshape", bias, shape=[1, o, 1, 1]))
        return [b.op("ember.relu", b.op("ember.add", z, r))] + ([y] if raw else [])
    return fn


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("n,c,o,h,k,stride,pad,groups,raw", [
    (2, 8, 8, 10, 3, 1, 1, 1, False),    # implicit, a panel per unit
    (3, 16, 16, 7, 3, 1, 1, 1, False),   # implicit, panels across images
    (2, 8, 8, 10, 3, 1, 1, 8, False),    # depthwise: after the conv
    (2, 16, 32, 9, 1, 1, 0, 1, False),   # pointwise: after the GEMM
    (2, 16, 32, 9, 1, 2, 0, 1, False),   # pointwise stride 2: after im2col and GEMM
    (2, 6, 8, 11, 3, 2, 1, 2, False),    # grouped, by units of each group
    (4, 128, 128, 4, 1, 2, 0, 1, False),  # im2col of 4 images a GEMM
    (4, 64, 64, 4, 3, 1, 1, 1, True),    # the raw conv stored too
    (1, 8, 8, 3, 3, 1, 0, 1, False),     # one output position
])
def test_epilogue_on_each_finished_span(n, c, o, h, k, stride, pad, groups, raw, threads):
    oh = (h + 2 * pad - k) // stride + 1
    shapes = [(n, c, h, h), (o, c // groups, k, k), (o,), (n, o, oh, oh)]
    check(graph(shapes, _bias_residual_relu(o, stride, pad, groups, raw)), rand(*shapes),
          threads)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("threads", [1, 2])
def test_product_in_scratch_and_epilogue_after_the_conv(dtype, threads):
    """A mask as the only result (the product goes to scratch), and a residual read
    transposed (its strides do not walk a plane as one run: the epilogue follows the
    whole conv)."""
    shapes = [(2, 8, 6, 6), (8, 8, 3, 3), (2, 8, 6, 6)]

    def conv(b, x, w):
        return b.op("ember.conv2d", x, w, stride=[1, 1], padding=[1, 1], groups=1, **CONV)

    def mask(b, x, w, r):
        return [b.op("ember.cmp", conv(b, x, w), r, predicate="gt")]

    def transposed(b, x, w, r):
        y, rt = conv(b, x, w), b.op("ember.transpose", r, perm=[0, 1, 3, 2])
        return [b.op("ember.mul", y, rt), b.op("ember.cmp", y, rt, predicate="gt")]

    ins = [a.astype("float32" if dtype == "f32" else "float64") for a in rand(*shapes)]
    for fn in (mask, transposed):
        check(graph(shapes, fn, dtype), ins, threads)
