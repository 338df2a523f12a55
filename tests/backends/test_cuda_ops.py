"""The CUDA backend against the numpy interpreter, op by op.

Every case below becomes part of ONE graph (so one compile covers them all); it runs
per op and again after the `fuse` pass (kernel.fused / kernel.matmul). Two runners:
- "emulator": the generated CUDA C compiled for the CPU by g++ and run with CUDA's
  thread, warp and block semantics (backends/cuda/emulate.py): runs everywhere;
- "gpu": the real backend through cupy; skipped, with the reason, without a usable GPU.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from elementwise import BINARY, POSITIVE, UNARY, UNARY_INT

from ember.backends import cuda, interpreter
from ember.backends.cuda import emulate
from ember.backends.interpreter import rng as ember_rng
from ember.ir import Builder, Graph, TensorType, numpy_dtype
from ember.passes.manager import PassManager, parse_pipeline


def gpu_skip_reason() -> str | None:
    try:
        cuda.check_available()
    except cuda.CudaUnavailableError as e:
        return f"no usable GPU here: {e}"
    return None


GPU_REASON = gpu_skip_reason()
RUNNERS = [
    pytest.param("emulator", marks=pytest.mark.skipif(
        not emulate.available(), reason="the CUDA emulator needs g++")),
    pytest.param("gpu", marks=pytest.mark.skipif(GPU_REASON is not None,
                                                 reason=GPU_REASON or "")),
]
RTOL = {"f32": 1e-5, "f64": 1e-12}
ATOL = {"f32": 1e-5, "f64": 1e-12}

# name -> (arg specs [(shape, dtype, (lo, hi))], fn(builder, *args) -> [values])
CASES: dict[str, tuple[list, object]] = {}


def case(name, args, fn):
    CASES[name] = (args, fn)


def R(shape, dtype="f32", lo=-2.0, hi=2.0):
    return (tuple(shape), dtype, (lo, hi))


for _dt in ("f32", "f64", "i32", "i64"):
    for _op in BINARY:
        lo, hi = (0.5, 2.0) if _op in ("pow", "div") else (-9, 9)
        if _op == "pow" and _dt in ("i32", "i64"):
            lo, hi = 0, 4
        case(f"{_op}_{_dt}", [R((3, 1, 5), _dt, lo, hi), R((4, 1), _dt, lo, hi)],
             lambda b, x, y, _op=_op: [b.op(f"ember.{_op}", x, y)])
    case(f"add_vec_{_dt}", [R((1030,), _dt), R((1030,), _dt)],  # float4 body and tail
         lambda b, x, y: [b.op("ember.add", x, y), b.op("ember.mul", x, y)])
for _op in "add mul max min".split():
    case(f"{_op}_i1", [R((4, 5), "i1"), R((5,), "i1")],
         lambda b, x, y, _op=_op: [b.op(f"ember.{_op}", x, y)])
for _dt in ("f32", "f64"):
    for _op in UNARY:
        lo = 0.05 if _op in POSITIVE else -4.0
        case(f"{_op}_{_dt}", [R((7, 9), _dt, lo, 4.0)], lambda b, x, _op=_op: [
            b.op(f"ember.{_op}", x)])
for _dt in ("i32", "i64"):
    for _op in UNARY_INT:
        case(f"{_op}_{_dt}", [R((5, 7), _dt, -50, 50)], lambda b, x, _op=_op: [
            b.op(f"ember.{_op}", x)])
for _dt in ("f32", "i64", "i1"):
    case(f"cmp_select_{_dt}", [R((6, 1, 3), _dt, -2, 2), R((4, 3), _dt, -2, 2)],
         lambda b, x, y: [b.op("ember.cmp", x, y, predicate=p) for p in
                          "eq ne lt le gt ge".split()] + [
             b.op("ember.select", b.op("ember.cmp", x, y, predicate="lt"), x, y)])
for _src in ("f32", "f64", "i32", "i64", "i1"):
    case(f"cast_{_src}", [R((3, 41), _src, -300, 300)], lambda b, x: [
        b.op("ember.cast", x, dtype=d) for d in ("f32", "f64", "i32", "i64", "i1")])
for _kind in ("sum", "mean", "max"):
    case(f"reduce_{_kind}", [R((2, 3, 4, 5), "f32", 0.5, 1.5)], lambda b, x, _kind=_kind: [
        b.op(f"ember.reduce_{_kind}", x, axes=a, keepdims=kd)
        for a, kd in [([3], True), ([0], False), ([1, 3], False), ([0, 2], True),
                      ([0, 1, 2, 3], False), ([], False), ([2], False)]])
    case(f"reduce_{_kind}_split", [R((3, 9000), "f32", 0.0, 1.0), R((600, 7), "f32", 0, 1)],
         lambda b, x, y, _kind=_kind: [
             b.op(f"ember.reduce_{_kind}", x, axes=[1], keepdims=False),
             b.op(f"ember.reduce_{_kind}", x, axes=[0, 1], keepdims=False),
             b.op(f"ember.reduce_{_kind}", y, axes=[0], keepdims=True)])
    case(f"reduce_{_kind}_int", [R((3, 2, 33), "i32", -50, 50), R((5, 4), "i64", -50, 50)],
         lambda b, x, y, _kind=_kind: [
             b.op(f"ember.reduce_{_kind}", x, axes=[2], keepdims=False),
             b.op(f"ember.reduce_{_kind}", x, axes=[0, 1], keepdims=True),
             b.op(f"ember.reduce_{_kind}", y, axes=[0], keepdims=False)])
case("reduce_i1", [R((3, 8), "i1")], lambda b, x: [
    b.op(f"ember.reduce_{k}", x, axes=a, keepdims=False)
    for k in ("sum", "max") for a in ([0], [1])])
for _shape, _perms in [((33, 70), [[1, 0]]), ((3, 34, 40), [[0, 2, 1], [2, 1, 0], [1, 0, 2]]),
                       ((2, 3, 5, 37), [[0, 2, 3, 1], [3, 1, 2, 0], [0, 1, 3, 2]])]:
    for _dt in ("f32", "i1"):
        case(f"transpose_{'x'.join(map(str, _shape))}_{_dt}", [R(_shape, _dt)],
             lambda b, x, _perms=_perms: [b.op("ember.transpose", x, perm=p) for p in _perms])
case("broadcast_reshape", [R((3, 1), "f32")], lambda b, x: [
    b.op("ember.reshape", b.op("ember.broadcast", x, shape=[2, 4, 3, 5]), shape=[8, 15]),
    b.op("ember.broadcast", x, shape=[3, 6])])
_WINDOWS = [  # (shape, start, step, window): steps and offsets; a row block; everything
    ((5, 7, 9), [1, 2, 0], [2, 1, 3], [2, 4, 3]), ((6, 5), [2, 0], [1, 1], [3, 5]),
    ((4, 33), [0, 1], [3, 4], [2, 8]), ((3, 37), [0, 0], [1, 1], [3, 37])]
for _dt in ("f32", "i64", "i1"):
    for _k, (_shape, _start, _step, _win) in enumerate(_WINDOWS):
        _a = dict(start=_start, step=_step)
        case(f"slice_unslice_{_k}_{_dt}", [R(_shape, _dt), R(_win, _dt)],
             lambda b, x, y, _a=_a, _shape=_shape, _win=_win: [
                 b.op("ember.slice", x, shape=_win, **_a),
                 b.op("ember.unslice", y, shape=list(_shape), **_a)])
    case(f"concat_{_dt}", [R((2, 3, 4), _dt), R((2, 1, 4), _dt), R((2, 5, 4), _dt),
                           R((2, 0, 4), _dt)], lambda b, x, y, z, e: [
        b.op("ember.concat", x, y, z, axis=1), b.op("ember.concat", e, x, e, z, axis=-2),
        b.op("ember.concat", x, x, axis=0), b.op("ember.concat", x, x, x, axis=-1),
        b.op("ember.concat", x, axis=1)])
for _dt in ("f32", "f64", "i32"):
    for _sa, _sb in [((3, 5), (5, 4)), ((2, 3, 4), (4, 5)), ((4, 1, 3, 6), (5, 6, 2)),
                     ((17, 33), (33, 9))]:
        case(f"matmul_{_dt}_{len(_sa)}x{len(_sb)}_{_sa[-1]}",
             [R(_sa, _dt, -1, 1), R(_sb, _dt, -1, 1)],
             lambda b, x, y: [b.op("ember.matmul", x, y)])
case("matmul_transposed", [R((6, 4)), R((5, 4)), R((2, 3, 4))], lambda b, x, y, z: [
    b.op("ember.matmul", b.op("ember.transpose", x, perm=[1, 0]), x),
    b.op("ember.matmul", x, b.op("ember.transpose", y, perm=[1, 0])),
    b.op("ember.matmul", z, b.op("ember.transpose", z, perm=[0, 2, 1]))])
case("matmul_bias_relu", [R((8, 5)), R((5, 6)), R((6,))], lambda b, x, w, c: [
    b.op("ember.relu", b.op("ember.add", b.op("ember.matmul", x, w), c))])
for _lab in ("i64", "i32"):
    for _dt in ("f32", "i1"):
        case(f"one_hot_{_lab}_{_dt}", [R((2, 3), _lab, -1, 6)], lambda b, x, _dt=_dt: [
            b.op("ember.one_hot", x, num_classes=5, dtype=_dt)])
case("constant", [R((2, 3))], lambda b, x: [
    b.op("ember.add", x, b.op("ember.constant", value=np.arange(6, dtype=np.float32)
                              .reshape(2, 3))),
    b.op("ember.constant", value=np.array([True, False]))])
case("gather", [R((7, 3)), R((2, 4), "i64", 0, 6), R((9,), "f64"), R((5,), "i32", 0, 8)],
     lambda b, t, i, u, j: [b.op("ember.gather", t, i), b.op("ember.gather", u, j)])
case("scatter_add", [R((2, 4), "i64", 0, 6), R((2, 4, 3)), R((6,), "i32", 0, 3), R((6,), "f64")],
     lambda b, i, u, j, v: [b.op("ember.scatter_add", i, u, shape=[7, 3]),
                            b.op("ember.scatter_add", j, v, shape=[4])])
_CONV_ATTRS = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)
_CONVS = [((2, 3, 7, 6), (4, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),
          ((2, 4, 9, 8), (6, 2, 3, 2), [2, 1], [1, 0], [1, 2], 2),
          ((1, 2, 5, 5), (3, 2, 1, 1), [1, 1], [0, 0], [1, 1], 1),
          ((3, 2, 5, 5), (4, 2, 1, 1), [1, 1], [0, 0], [1, 1], 1),
          ((2, 3, 8, 8), (3, 1, 3, 3), [2, 2], [1, 1], [1, 1], 3)]
for _k, (_xs, _ws, _st, _pd, _dl, _g) in enumerate(_CONVS):
    _a = dict(stride=_st, padding=_pd, dilation=_dl, groups=_g)
    case(f"conv2d_{_k}", [R(_xs), R(_ws)], lambda b, x, w, _a=_a: (lambda y: [
        y, b.op("ember.conv2d_grad_input", y, w, input_shape=list(x.type.shape), **_a),
        b.op("ember.conv2d_grad_weight", x, y, weight_shape=list(w.type.shape), **_a)])(
        b.op("ember.conv2d", x, w, **_a)))
# channels last (passes/layout.py's form on the cpu): depthwise padded at the end only, and
# grouped with two input channels a group and dilation
case("conv2d_nhwc", [R((2, 7, 7, 6)), R((3, 3, 1, 6)), R((1, 6, 5, 4)), R((3, 2, 2, 6))],
     lambda b, x, w, u, v: [
         b.op("ember.conv2d_nhwc", x, w, stride=[2, 2], padding=[0, 0, 1, 1],
              dilation=[1, 1], groups=6),
         b.op("ember.conv2d_nhwc", u, v, stride=[1, 1], padding=[1, 0], dilation=[2, 1],
              groups=2)])
case("conv_nhwc_epilogue", [R((1, 5, 5, 8)), R((3, 3, 1, 8)), R((8,))], lambda b, x, w, c: [
    b.op("ember.relu", b.op("ember.add", b.op(
        "ember.conv2d_nhwc", x, w, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=8),
        c))])
# fused: a kernel.conv2d whose epilogue writes in place (bias, ReLU), and one writing a mask
# beside it (its product in scratch)
case("conv_epilogue", [R((2, 3, 7, 6)), R((4, 3, 3, 3)), R((4,))], lambda b, x, w, c: (
    lambda y: [b.op("ember.relu", b.op("ember.add", y, b.op("ember.reshape", c,
                                                            shape=[1, 4, 1, 1]))),
               b.op("ember.cmp", b.op("ember.neg", y), y, predicate="gt")])(
    b.op("ember.conv2d", x, w, **_CONV_ATTRS)))
for _k, (_xs, _kn, _st, _pd) in enumerate([((2, 3, 8, 8), [2, 2], [2, 2], [0, 0]),
                                          ((1, 2, 7, 6), [3, 3], [2, 1], [1, 1])]):
    _a = dict(kernel=_kn, stride=_st, padding=_pd)
    case(f"pool_{_k}", [R(_xs)], lambda b, x, _a=_a: (lambda m, v: [
        m, v, b.op("ember.max_pool2d_grad", x, m, **_a),
        b.op("ember.avg_pool2d_grad", v, input_shape=list(x.type.shape), **_a)])(
        b.op("ember.max_pool2d", x, **_a), b.op("ember.avg_pool2d", x, **_a)))
case("max_pool_ties", [R((1, 1, 4, 4), "f32", 1, 1)], lambda b, x: (lambda m: [
    m, b.op("ember.max_pool2d_grad", x, m, kernel=[3, 3], stride=[1, 1], padding=[1, 1])])(
    b.op("ember.max_pool2d", x, kernel=[3, 3], stride=[1, 1], padding=[1, 1])))
case("softmax_layer_norm", [R((4, 10)), R((3, 5, 16)), R((16,)), R((16,))],
     lambda b, x, y, g, c: [b.op("nn.softmax", x, axis=1), b.op("nn.log_softmax", x, axis=0),
                            b.op("nn.layer_norm", y, g, c, axes=[2], eps=1e-5)])
case("allreduce", [R((3, 5)), R((4,), "f64")], lambda b, x, y: [  # one process: the value
    b.op("ember.mul", b.op("ember.allreduce", x), x), b.op("ember.allreduce", y)])
case("grads_ready", [R((3, 5)), R((4,))], lambda b, x, y: [  # its token: the bucket
    b.op("ember.grads_ready", x, y, bucket=3)])
case("dropout", [R((5, 37)), R((), "i64", 3, 3)], lambda b, x, s: [
    b.op("ember.dropout", x, s, p=0.3, seed=7, key=11),
    b.op("ember.dropout", x, s, p=0.0, seed=7, key=12)])


def random_input(rng, shape, dtype, bounds):
    lo, hi = bounds
    if dtype == "i1":
        return rng.random(shape) < 0.5
    if dtype in ("i32", "i64"):
        return rng.integers(int(lo), int(hi) + 1, shape).astype(numpy_dtype(dtype))
    return rng.uniform(lo, hi, shape).astype(numpy_dtype(dtype))


@functools.cache
def combined(fused: bool):
    """One graph holding every case, its inputs, and each case's output range."""
    specs = [(n, s) for n, (args, _) in CASES.items() for s in args]
    g = Graph("cases", [TensorType(s[0], s[1]) for _, s in specs])
    b = Builder(g.body)
    outs, ranges, k = [], {}, 0
    for name, (args, fn) in CASES.items():
        vals = list(fn(b, *g.args[k:k + len(args)]))
        ranges[name] = (len(outs), len(outs) + len(vals))
        outs += vals
        k += len(args)
    b.create("func.return", outs)
    passes = "decompose,fuse" if fused else "decompose"
    g = PassManager(parse_pipeline(passes), verify_each=True).run(g)
    rng = np.random.default_rng(0)
    inputs = [random_input(rng, *s) for _, s in specs]
    return g, inputs, ranges


@functools.cache
def results(runner: str, fused: bool, sm_count: int = 2):
    g, inputs, _ = combined(fused)
    with np.errstate(all="ignore"):
        want = interpreter.run(g, inputs)
    if runner == "emulator":
        got = emulate.EmulatedExecutable(g, sm_count)(inputs)
    else:
        got = [a.get() for a in cuda.compile(g)(inputs)]
    return got, want


@pytest.mark.parametrize("fused", [False, True], ids=["per-op", "fused"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_every_op_matches_the_interpreter(runner, fused):
    check_all(runner, fused)


@pytest.mark.skipif(not emulate.available(), reason="the CUDA emulator needs g++")
def test_every_op_matches_with_an_h200_launch_plan():
    """The emulator again, with the grids and reduction splits planned for 132 SMs."""
    check_all("emulator", False, 132)


def check_all(runner, fused, sm_count=2):
    g, _, ranges = combined(fused)
    got, want = results(runner, fused, sm_count) if runner == "emulator" else \
        results(runner, fused)
    bad = []
    for name, (lo, hi) in ranges.items():
        for k in range(lo, hi):
            x, y, dt = got[k], want[k], g.outputs[k].type.dtype
            ok = x.dtype == y.dtype and x.shape == y.shape and np.allclose(
                x, y, rtol=RTOL.get(dt, 0), atol=ATOL.get(dt, 0), equal_nan=True)
            if not ok:
                err = np.nanmax(np.abs(x.astype(np.float64) - y)) if x.shape == y.shape else "?"
                bad.append(f"{name} (output {k - lo}, {dt}{list(y.shape)}): max error {err}")
    assert not bad, "mismatches:\n" + "\n".join(bad)


@pytest.mark.parametrize("runner", RUNNERS)
def test_dropout_mask_is_the_cpus_bit_for_bit(runner):
    got, _ = results(runner, False)
    g, inputs, ranges = combined(False)
    lo, _ = ranges["dropout"]
    names = list(CASES)
    k = sum(len(CASES[n][0]) for n in names[:names.index("dropout")])
    x, step = inputs[k], int(inputs[k + 1])
    want = ember_rng.dropout(x, 0.3, 7, 11, step)
    np.testing.assert_array_equal(got[lo], want)
    np.testing.assert_array_equal(got[lo] != 0, ember_rng.dropout_keep(x.shape, 0.3, 7, 11, step))
    np.testing.assert_array_equal(got[lo + 1], x)


def test_the_cases_cover_every_core_op():
    """Each op the interpreter implements (but nn.*, which decompose lowers) has a case."""
    g, _, _ = combined(False)
    seen = {op.name for op in g.walk()}
    core = {n for n in interpreter.reference.KERNELS if n.startswith("ember.")}
    assert core - seen - {"ember.reshape"} == set()
    fused = {op.name for op in combined(True)[0].walk()}
    assert {"kernel.fused", "kernel.matmul"} <= fused


def test_emulator_catches_a_wrong_kernel(monkeypatch):
    """The emulated runs are a real check: a kernel with an off-by-one fails them."""
    from ember.backends.cuda import scalar

    if not emulate.available():
        pytest.skip("the CUDA emulator needs g++")
    orig = scalar.expr
    monkeypatch.setattr("ember.backends.cuda.codegen.expr", lambda n, a, v, d: orig(
        "ember.sub" if n == "ember.add" else n, a, v, d))
    g = Graph("f", [TensorType((5,), "f32")] * 2)
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.add", *g.args)])
    x = np.ones(5, np.float32)
    assert not np.allclose(emulate.EmulatedExecutable(g)([x, x])[0], 2 * x)


@pytest.mark.skipif(not emulate.available(), reason="the CUDA emulator needs g++")
def test_a_concat_of_many_operands_is_a_kernel_per_group_of_them(monkeypatch):
    """Past CONCAT_OPERANDS operands a concat takes one kernel per group of them, each
    writing its slab of the result (here: groups of 2, so slabs at offsets)."""
    from ember.backends.cuda import windows

    monkeypatch.setattr(windows, "CONCAT_OPERANDS", 2)
    shapes = [(2, 3, 5), (2, 1, 5), (2, 0, 5), (2, 4, 5), (2, 2, 5), (2, 1, 5)]
    g = Graph("f", [TensorType(s, "f64") for s in shapes])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.concat", *g.args, axis=1)])
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(s) for s in shapes]
    exe = emulate.EmulatedExecutable(g)
    assert [k.name for k in exe.program.kernels] == ["k0_concat_0", "k0_concat_1",
                                                     "k0_concat_2"]
    np.testing.assert_array_equal(exe(xs)[0], np.concatenate(xs, axis=1))


def test_math_is_exact_where_it_should_be():
    assert math.ceil(0.3 * 2**24) == 5033165  # the dropout threshold the kernel bakes in
