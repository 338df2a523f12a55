"""The cpu backend's convolutions, pools, gather/scatter, dropout and erf against the
interpreter, unfused and fused, with odd sizes, groups, strides, dilation and padding."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends import cpu, interpreter
from ember.ir import Builder, Graph, TensorType, verify
from ember.passes import PassManager, parse_pipeline

CONV = [  # x shape, w shape, stride, padding, dilation, groups
    ((2, 3, 7, 6), (5, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    ((1, 4, 9, 8), (6, 2, 3, 2), [2, 1], [0, 1], [1, 2], 2),
    ((3, 2, 5, 5), (4, 2, 1, 1), [1, 1], [0, 0], [1, 1], 1),
    ((2, 6, 8, 7), (6, 1, 3, 3), [2, 2], [1, 1], [1, 1], 6),
    # implicit GEMMs (kernels/implicit_conv.py): a panel and a tail of positions, ...
    ((2, 5, 11, 9), (7, 5, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    # ... K past a slice (135 = 128 + 7), groups, dilation, uneven padding, ...
    ((1, 30, 10, 12), (8, 15, 3, 3), [1, 1], [2, 1], [2, 1], 2),
    # ... unpadded, and strided (the input gradient then through im2col)
    ((1, 4, 12, 12), (3, 4, 3, 3), [1, 1], [0, 0], [1, 1], 1),
    ((2, 3, 20, 18), (4, 3, 5, 3), [2, 2], [2, 1], [1, 1], 1),
]


def run_both(g: Graph, inputs, rtol=1e-5, fused=True):
    want = interpreter.run(g, inputs)
    graphs = [g]
    if fused:
        from ember.ir.parser import parse

        graphs.append(PassManager(parse_pipeline("fuse"), verify_each=True).run(parse(str(g))))
    for gg in graphs:
        got = cpu.Executable(gg, use_cache=False)(inputs)
        for x, y in zip(got, want):
            assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(1, np.abs(y).max()))


def graph(types, fn) -> Graph:
    g = Graph("f", [TensorType(s, d) for s, d in types])
    b = Builder(g.body)
    b.create("func.return", list(fn(b, *g.args)))
    return verify(g)


def attrs(stride, padding, dilation, groups):
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


def conv_and_gradients(xs, ws, a: dict, dtype: str = "f32") -> Graph:
    """(x, w) -> [y = conv2d(x, w), and its input and weight gradients for dy = tanh(y)]."""
    def fn(b, x, w):
        y = b.create("ember.conv2d", [x, w], a).result
        gy = b.op("ember.tanh", y)
        gx = b.create("ember.conv2d_grad_input", [gy, w], {**a, "input_shape": list(xs)}).result
        gw = b.create("ember.conv2d_grad_weight", [x, gy], {**a, "weight_shape": list(ws)}).result
        return [y, gx, gw]

    return graph([(xs, dtype), (ws, dtype)], fn)


@pytest.mark.parametrize("case", CONV)
def test_conv2d_and_both_gradients(case, monkeypatch):
    from ember.backends.cpu.parallel import outline as threads

    monkeypatch.setattr(threads, "MIN_WORK", 16)  # images split across threads
    xs, ws, stride, pad, dil, groups = case
    a = attrs(stride, pad, dil, groups)
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws))

    run_both(conv_and_gradients(xs, ws, a), [x, w], rtol=2e-5)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("xs,kernel,stride,pad", [
    ((2, 3, 8, 6), [2, 2], [2, 2], [0, 0]),  # windows tile the input exactly
    ((2, 3, 7, 6), [2, 2], [2, 2], [0, 0]),  # ... with a row left over
    ((2, 3, 7, 6), [2, 2], [3, 2], [0, 0]),  # ... with gaps
    ((2, 3, 7, 6), [3, 2], [2, 1], [1, 1]),  # overlapping, padded
    ((2, 3, 7, 6), [3, 3], [1, 1], [1, 0])])
def test_pools_and_gradients(kind, xs, kernel, stride, pad):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 0, :2, :2] = 1.0  # ties: the gradient goes to the first maximum
    a = {"kernel": kernel, "stride": stride, "padding": pad}

    def fn(b, x):
        y = b.create(f"ember.{kind}_pool2d", [x], a).result
        g = b.op("ember.sigmoid", y)
        if kind == "max":
            dx = b.create("ember.max_pool2d_grad", [x, g], a).result
        else:
            dx = b.create("ember.avg_pool2d_grad", [g], {**a, "input_shape": list(xs)}).result
        return [y, dx]

    run_both(graph([(xs, "f32")], fn), [x])


def test_gather_scatter_add_and_bad_index():
    def fn(b, t, i):
        rows = b.op("ember.gather", t, i)
        return [rows, b.create("ember.scatter_add", [i, b.op("ember.exp", rows)],
                               {"shape": [7, 3]}).result]

    g = graph([((7, 3), "f32"), ((2, 5), "i64")], fn)
    t = np.random.default_rng(2).standard_normal((7, 3)).astype(np.float32)
    idx = np.array([[0, 6, 3, 3, 1], [2, 2, 2, 5, 6]])
    run_both(g, [t, idx])
    exe = cpu.Executable(g, use_cache=False)
    with pytest.raises(IndexError, match="ember.gather.*out of range.*7 rows"):
        exe([t, np.array([[0, 7, 1, 1, 1], [0, 0, 0, 0, -1]])])
    exe([t, idx])  # the error is reported once, then the next call runs normally


def test_dropout_matches_reference_mask_fused_and_not():
    def fn(b, x, step):
        y = b.create("ember.dropout", [x, step], {"p": 0.3, "seed": 7, "key": 123}).result
        return [b.op("ember.mul", y, x)]

    g = graph([((33, 17), "f32"), ((), "i64")], fn)
    x = np.random.default_rng(3).standard_normal((33, 17)).astype(np.float32)
    for step in (0, 1, 2**33 + 5):
        run_both(g, [x, np.array(step, np.int64)], rtol=0)


def test_erf_and_gelu_vectorized():
    def fn(b, x):
        half = b.op("ember.constant", value=np.array(0.5, np.float32))
        inv = b.op("ember.constant", value=np.array(0.7071067811865476, np.float32))
        one = b.op("ember.constant", value=np.array(1.0, np.float32))
        e = b.op("ember.erf", b.op("ember.mul", x, inv))
        return [b.op("ember.mul", b.op("ember.mul", x, half), b.op("ember.add", e, one))]

    x = np.linspace(-6, 6, 1001, dtype=np.float32)
    run_both(graph([((1001,), "f32")], fn), [x])


@pytest.mark.parametrize("part,start,full,dtype", [
    ((2, 3, 4, 5), [0, 0, 1, 1], (2, 3, 6, 7), "f32"),   # padded on both sides
    ((2, 3, 4, 5), [0, 0, 0, 0], (2, 3, 5, 6), "f32"),   # at the end only (TF's "same")
    ((3, 4), [2, 3], (6, 9), "i64"),                     # every row of another dim padded
    ((5,), [2], (9,), "f64"),                            # one row
    ((2, 0, 3), [0, 1, 0], (2, 2, 3), "f32"),            # an empty input: all zeros
])
def test_unslice_writes_each_row_once(part, start, full, dtype):
    """A step-1 unslice, row by row: zeros, the input's row, zeros; zeros where the window
    misses a row (the input's values at the window, every other element zero)."""
    g = Graph("f", [TensorType(part, dtype)])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.unslice", g.args[0], start=start,
                                  step=[1] * len(part), shape=list(full))])
    x = (np.arange(np.prod(part)) + 1).reshape(part).astype(
        {"f32": np.float32, "f64": np.float64, "i64": np.int64}[dtype])
    (got,) = cpu.Executable(verify(g), use_cache=False)([x])
    want = np.zeros(full, x.dtype)
    want[tuple(slice(s, s + n) for s, n in zip(start, part))] = x
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(interpreter.run(g, [x])[0], want)
