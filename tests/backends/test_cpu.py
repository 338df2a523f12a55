"""The llvmlite CPU backend against the numpy interpreter, op by op and end to end."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from elementwise import BINARY, POSITIVE, UNARY, UNARY_INT
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.backends import cpu, interpreter
from ember.backends.interpreter import UnsupportedOpError
from ember.ir import Builder, Graph, TensorType, numpy_dtype

FLOATS, INTS = ("f32", "f64"), ("i64", "i32")
RTOL = {"f32": 1e-5, "f64": 1e-12}


def graph(arg_types, fn, names=None) -> Graph:
    """A graph of `arg_types` whose outputs are what `fn(builder, *args)` returns."""
    g = Graph("f", [TensorType(tuple(s), d) for s, d in arg_types], names)
    b = Builder(g.body)
    b.create("func.return", list(fn(b, *g.args)))
    return g


def rand(rng, shape, dtype, lo=-2.0, hi=2.0):
    if dtype == "i1":
        return rng.random(shape) < 0.5
    if dtype in INTS:
        return rng.integers(int(lo), int(hi) + 1, shape).astype(numpy_dtype(dtype))
    return rng.uniform(lo, hi, shape).astype(numpy_dtype(dtype))


def check(g, inputs, params=None, atol=1e-6):
    """cpu and interpreter agree: same dtypes, shapes and values (to rounding)."""
    got, want = cpu.compile(g)(inputs, params), interpreter.run(g, inputs, params)
    assert len(got) == len(want)
    for k, (x, y) in enumerate(zip(got, want)):
        assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, x.shape, y.dtype, y.shape)
        rtol = RTOL.get(str(g.outputs[k].type.dtype), 0)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol if rtol else 0,
                                   err_msg=f"output {k}")
    return got


BCAST = [((7,), (7,)), ((3, 1, 5), (4, 1)), ((), (2, 3)), ((1,), (5,)), ((17, 33), (33,)),
         ((2, 1, 4, 1), (1, 3, 1, 6))]


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op", BINARY)
def test_binary(op, dtype):
    rng = np.random.default_rng(0)
    for sa, sb in BCAST:
        a, b = rand(rng, sa, dtype, -9, 9), rand(rng, sb, dtype, 0.5, 2)
        if op == "div":  # nonzero divisors, both signs
            b = (b + (dtype in INTS)) * np.where(rand(rng, sb, "i1"), 1, -1).astype(b.dtype)
        if op == "pow":
            a, b = (rand(rng, sa, dtype, 0.1, 3), rand(rng, sb, dtype, -2, 2)) \
                if dtype in FLOATS else (rand(rng, sa, dtype, -5, 5), rand(rng, sb, dtype, 0, 5))
        both = not (op == "pow" and dtype in INTS)  # numpy rejects negative int exponents
        g = graph([(sa, dtype), (sb, dtype)], lambda bl, x, y, n=1 + both: [
            bl.op(f"ember.{op}", *p) for p in [(x, y), (y, x)][:n]])
        check(g, [a, b])


@pytest.mark.parametrize("op", "add mul max min".split())
def test_binary_bool(op):
    rng = np.random.default_rng(1)
    g = graph([((4, 5), "i1"), ((5,), "i1")], lambda b, x, y: [b.op(f"ember.{op}", x, y)])
    check(g, [rand(rng, (4, 5), "i1"), rand(rng, (5,), "i1")])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", UNARY)
def test_unary_float(op, dtype):
    rng = np.random.default_rng(2)
    lo = 0.01 if op in POSITIVE else -8
    for shape in [(), (1,), (5, 3), (2, 3, 67)]:
        g = graph([(shape, dtype)], lambda b, x: [b.op(f"ember.{op}", x)])
        check(g, [rand(rng, shape, dtype, lo, 8)])


@pytest.mark.parametrize("dtype", INTS + ("i1",))
@pytest.mark.parametrize("op", UNARY_INT)
def test_unary_int(op, dtype):
    if op == "neg" and dtype == "i1":
        pytest.skip("numpy has no negative of a bool either")
    g = graph([((3, 19), dtype)], lambda b, x: [b.op(f"ember.{op}", x)])
    check(g, [rand(np.random.default_rng(3), (3, 19), dtype, -100, 100)])


def test_nan_propagation():
    x = np.array([np.nan, 1.0, -np.inf, 0.0, np.inf], np.float32)
    y = np.array([2.0, np.nan, 3.0, -0.0, np.nan], np.float32)
    g = graph([((5,), "f32"), ((5,), "f32")], lambda b, x, y: [
        b.op("ember.max", x, y), b.op("ember.min", x, y), b.op("ember.relu", x),
        b.op("ember.reduce_max", x, axes=[0], keepdims=False), b.op("ember.exp", x),
        b.op("ember.tanh", y)])
    check(g, [x, y])


@pytest.mark.parametrize("dtype", FLOATS + INTS + ("i1",))
def test_cmp_select(dtype):
    rng = np.random.default_rng(4)
    a, b = rand(rng, (6, 1, 3), dtype, -2, 2), rand(rng, (4, 3), dtype, -2, 2)
    if dtype in FLOATS:
        a.flat[::5] = np.nan

    def fn(bl, x, y):
        outs = [bl.op("ember.cmp", x, y, predicate=p) for p in "eq ne lt le gt ge".split()]
        return outs + [bl.op("ember.select", outs[2], x, y), bl.op("ember.select", outs[0], y, y)]

    check(graph([((6, 1, 3), dtype), ((4, 3), dtype)], fn), [a, b])


@pytest.mark.parametrize("src", FLOATS + INTS + ("i1",))
def test_cast(src):
    rng = np.random.default_rng(5)
    x = rand(rng, (3, 41), src, -300, 300)
    if src in FLOATS:  # zeros (to bool) and NaN/inf (INT_MIN, numpy's x86 result)
        x.flat[::7] = 0
        x[1, :4] = [np.nan, np.inf, -np.inf, 3e38]
    if src == "i64":  # to i32 wraps, to f32 rounds
        x[0, :3] = [2**40 + 7, -(2**33) - 1, 2**31]
    g = graph([((3, 41), src)], lambda b, v: [b.op("ember.cast", v, dtype=d)
                                              for d in FLOATS + INTS + ("i1",)])
    check(g, [x])


def _axes_combos(rank):
    return [list(c) for r in range(rank + 1) for c in itertools.combinations(range(rank), r)]


@pytest.mark.parametrize("kind", ["reduce_sum", "reduce_mean", "reduce_max"])
@pytest.mark.parametrize("shape,dtype", [((7,), "f32"), ((3, 1, 5), "f32"), ((4, 37), "f64"),
                                         ((2, 3, 4, 5), "f32"), ((3, 2, 33), "i32"),
                                         ((5, 4), "i64"), ((3, 8), "i1"), ((), "f32")])
def test_reduce(kind, shape, dtype):
    """Every axis combination, with and without keepdims, in one compiled graph."""
    combos = [(axes, kd) for axes in _axes_combos(len(shape)) for kd in (False, True)]
    g = graph([(shape, dtype)], lambda b, x: [b.op(f"ember.{kind}", x, axes=a, keepdims=kd)
                                              for a, kd in combos])
    x = rand(np.random.default_rng(6), shape, dtype, 0.5 if dtype in FLOATS else -50, 1.5)
    check(g, [x])


def test_reduce_negative_axes_and_large():
    x = np.random.default_rng(7).uniform(0, 1, (65, 1031)).astype(np.float32)
    g = graph([(x.shape, "f32")], lambda b, v: [
        b.op("ember.reduce_sum", v, axes=[-1], keepdims=True),
        b.op("ember.reduce_mean", v, axes=[-2], keepdims=False),
        b.op("ember.reduce_max", v, axes=[0, 1], keepdims=False)])
    check(g, [x])


@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 1, 5, 2), (5, 7, 1, 9)])
def test_transpose_all_perms(shape):
    perms = list(itertools.permutations(range(len(shape))))
    g = graph([(shape, "f32")], lambda b, x: [b.op("ember.transpose", x, perm=list(p))
                                              for p in perms])
    check(g, [rand(np.random.default_rng(8), shape, "f32")])


@pytest.mark.parametrize("dtype", ["f32", "i64", "i1"])
def test_broadcast_reshape(dtype):
    def fn(b, x):
        y = b.op("ember.broadcast", x, shape=[2, 4, 3, 5])
        r = b.op("ember.reshape", y, shape=[8, 15])
        t = b.op("ember.transpose", r, perm=[1, 0])
        return [y, r, b.op("ember.reshape", t, shape=[120]), b.op("ember.reshape", x, shape=[15])]

    check(graph([((3, 1), dtype)], lambda b, x: fn(b, b.op("ember.broadcast", x, shape=[3, 5]))),
          [rand(np.random.default_rng(9), (3, 1), dtype)])


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64", "i1"])
@pytest.mark.parametrize("sa,sb", [((3, 5), (5, 4)), ((1, 1), (1, 1)), ((17, 33), (33, 9)),
                                   ((2, 3, 4), (4, 5)), ((4, 1, 3, 6), (5, 6, 2)),
                                   ((2, 1, 7, 3), (1, 3, 3, 2)), ((3, 0), (0, 2))])
def test_matmul(dtype, sa, sb):
    rng = np.random.default_rng(10)
    g = graph([(sa, dtype), (sb, dtype)], lambda b, x, y: [b.op("ember.matmul", x, y)])
    check(g, [rand(rng, sa, dtype, -1, 1), rand(rng, sb, dtype, -1, 1)], atol=1e-5)


@pytest.mark.parametrize("label_dtype", INTS)
@pytest.mark.parametrize("dtype", ["f32", "i64", "i1"])
def test_one_hot(label_dtype, dtype):
    labels = np.array([[0, 3, -1], [4, 9, 2]], numpy_dtype(label_dtype))
    g = graph([((2, 3), label_dtype)], lambda b, x: [
        b.op("ember.one_hot", x, num_classes=5, dtype=dtype)])
    check(g, [labels])


def test_empty_tensors_and_no_ops():
    def fn(b, x, y):
        return [x, b.op("ember.add", x, y), b.op("ember.reduce_sum", x, axes=[0], keepdims=False),
                b.op("ember.reduce_mean", x, axes=[0, 1], keepdims=True),
                b.op("ember.reduce_max", x, axes=[1], keepdims=False),
                b.op("ember.transpose", x, perm=[1, 0])]

    check(graph([((0, 3), "f32"), ((3,), "f32")], fn), [np.zeros((0, 3)), np.ones(3)])
    check(graph([((), "i32")], lambda b, x: [x]), [np.int32(7)])


def test_constants():
    c = np.arange(6, dtype=np.float32).reshape(2, 3)

    def fn(b, x):
        k = b.op("ember.constant", value=c)
        two = b.op("ember.constant", value=np.array(2.0, np.float32))
        return [k, b.op("ember.mul", b.op("ember.add", x, k), two)]

    check(graph([((2, 3), "f32")], fn), [np.ones((2, 3), np.float32)])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=0, max_size=4), st.data())
def test_broadcast_add_random_shapes(shape, data):
    """Any operand shape that broadcasts: drop leading dims, set some dims to 1."""
    k = data.draw(st.integers(0, len(shape)))
    other = [d if data.draw(st.booleans()) else 1 for d in shape[k:]]
    rng = np.random.default_rng(11)
    g = graph([(shape, "f32"), (other, "f32")], lambda b, x, y: [
        b.op("ember.sub", x, y), b.op("ember.reduce_sum", b.op("ember.mul", y, x),
                                      axes=list(range(len(shape))), keepdims=False)])
    check(g, [rand(rng, shape, "f32"), rand(rng, other, "f32")], atol=1e-5)


def _param(b, pid, shape):
    return b.create("ember.param", [], {"id": pid, "path": pid},
                    result_types=[TensorType(shape, "f32")]).result


def mlp_graph() -> Graph:
    """Linear-relu-linear, log-softmax by hand, one-hot cross entropy: 21 ops."""
    def fn(b, x, labels):
        h = b.op("ember.relu", b.op("ember.add", b.op("ember.matmul", x, _param(b, "w1", (16, 32))),
                                    _param(b, "b1", (32,))))
        logits = b.op("ember.add", b.op("ember.matmul", h, _param(b, "w2", (32, 10))),
                      _param(b, "b2", (10,)))
        s = b.op("ember.sub", logits, b.op("ember.reduce_max", logits, axes=[1], keepdims=True))
        lse = b.op("ember.log", b.op("ember.reduce_sum", b.op("ember.exp", s), axes=[1],
                                     keepdims=True))
        logp = b.op("ember.sub", s, lse)
        onehot = b.op("ember.one_hot", labels, num_classes=10, dtype="f32")
        picked = b.op("ember.reduce_sum", b.op("ember.mul", logp, onehot), axes=[1],
                      keepdims=False)
        loss = b.op("ember.neg", b.op("ember.reduce_mean", picked, axes=[0], keepdims=False))
        pred = b.op("ember.cast", b.op("ember.cmp", logp, b.op("ember.broadcast", b.op(
            "ember.reduce_max", logp, axes=[1], keepdims=True), shape=[8, 10]),
            predicate="eq"), dtype="i32")
        return [loss, logp, pred]

    return graph([((8, 16), "f32"), ((8,), "i64")], fn, ["x", "labels"])


def mlp_inputs(seed=0):
    rng = np.random.default_rng(seed)
    params = {k: rand(rng, s, "f32", -0.5, 0.5) for k, s in
              [("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 10)), ("b2", (10,))]}
    return [rand(rng, (8, 16), "f32"), rng.integers(0, 10, 8)], params


def test_mlp_end_to_end():
    inputs, params = mlp_inputs()
    loss, logp, _ = check(mlp_graph(), inputs, params)
    assert loss.shape == () and loss > 0 and np.allclose(np.exp(logp).sum(1), 1, rtol=1e-5)


def test_repeated_calls_do_not_clobber():
    exe = cpu.compile(mlp_graph())
    inputs, params = mlp_inputs(1)
    first = exe(inputs, params)
    kept = [a.copy() for a in first]
    other, params2 = mlp_inputs(2)
    exe(other, params2)
    again = exe(inputs, params)
    for a, k, r in zip(first, kept, again):
        np.testing.assert_array_equal(a, k)
        np.testing.assert_array_equal(r, k)


def test_returns_input_and_aliases():
    """Every returned array is the caller's own, even when values share a buffer."""
    def fn(b, x):
        y = b.op("ember.exp", x)
        return [x, b.op("ember.reshape", x, shape=[3, 2]), x, y, b.op("ember.reshape", y,
                                                                       shape=[6]), y]

    x = np.arange(6, dtype=np.float64).reshape(2, 3)[:, ::-1]  # strided, other dtype
    exe = cpu.compile(graph([((2, 3), "f32")], fn))
    out = exe([x])
    assert out[0].dtype == np.float32 and out[1].shape == (3, 2) and out[4].shape == (6,)
    np.testing.assert_array_equal(out[1], x.reshape(3, 2))
    np.testing.assert_allclose(out[5], np.exp(x), rtol=1e-6)
    for k in range(len(out)):
        for j in range(k):
            assert not np.shares_memory(out[k], out[j]), (j, k)
    assert not np.shares_memory(out[0], x)
    exe([x + 1])
    np.testing.assert_allclose(out[3], np.exp(x), rtol=1e-6)


def test_wrong_input_shape():
    exe = cpu.compile(graph([((2, 3), "f32")], lambda b, x: [b.op("ember.exp", x)], ["x"]))
    with pytest.raises(ValueError, match=r"input 0 \(%x\).*\[2, 3\].*\[3, 2\]"):
        exe([np.zeros((3, 2))])
    with pytest.raises(ValueError, match="takes 1 inputs"):
        exe([])
    exe2 = cpu.compile(mlp_graph())
    inputs, params = mlp_inputs()
    with pytest.raises(ValueError, match=r"param w1.*\[16, 32\].*\[32, 16\]"):
        exe2(inputs, {**params, "w1": params["w1"].T})
    with pytest.raises(KeyError, match="b2"):
        exe2(inputs, {k: v for k, v in params.items() if k != "b2"})


def test_unsupported_ops():
    g = graph([((4, 3), "f32"), ((3, 2), "f32")], lambda b, x, w: [b.op("nn.linear", x, w)])
    with pytest.raises(UnsupportedOpError, match=r"'nn.linear'.*decompose"):
        cpu.compile(g)
    g = graph([((4,), "f32")], lambda b, x: [
        b.create("acme.frob", [x], {}, result_types=[x.type]).result])
    with pytest.raises(UnsupportedOpError, match="'acme.frob'"):
        cpu.compile(g)
    with pytest.raises(UnsupportedOpError, match="ember.sub.*i1"):
        cpu.compile(graph([((4,), "i1")] * 2, lambda b, x, y: [b.op("ember.sub", x, y)]))
    with pytest.raises(UnsupportedOpError, match="f16"):
        cpu.compile(graph([((4,), "f16")], lambda b, x: [b.op("ember.exp", x)]))


def test_dump_llvm(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DUMP_LLVM", str(tmp_path))
    cpu.compile(graph([((1000,), "f32")] * 2, lambda b, x, y: [b.op("ember.add", x, y)]))
    assert "ember_entry" in (tmp_path / "f.ll").read_text()  # files named after the graph
    assert " x float>" in (tmp_path / "f.opt.ll").read_text()  # the add loop vectorized
    assert (tmp_path / "f.s").read_text()
