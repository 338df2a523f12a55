"""Every conv, pool and matmul kernel variant against a float64 reference, with a tolerance
derived from each output's reduction: forward, grad-input and grad-weight; each GEMM engine;
strides, padding, dilation, groups; images 7 to 224, batches 1 to 64; the work split across
1, 2 and 4 threads.

The tolerance. An output sums L products t_k; float32 summed in a loop leaves an error of
about u sqrt(sum_k S_k^2) (u = 2^-24, S_k the partial sums), which for terms of random sign
is u sqrt(L sum_k t_k^2 / 2). Each output may miss its float64 value by 6 of those
(`TOLERANCE`), plus its own rounding: a kernel that sums at least as well as one plain loop
passes, and one that drops, repeats or misplaces a term of typical size fails for any L
below ~10^6. sum_k t_k^2 is the same op on the squared inputs, in float64; L comes from the
shapes. (A fixed 1e-5 is loose for short sums and cries wolf for long ones.)

Where PyTorch is installed, the long reductions (weight gradients over a whole batch, a
matmul with K = 2^16) are also held to 10x PyTorch float32's own error on the same problem.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from ember.backends import cpu, interpreter
from ember.backends.cpu.parallel import outline as cpu_threads
from ember.ir import Builder, Graph, TensorType, verify

U = 2.0 ** -24
TOLERANCE = 6

# x shape, w shape, stride, padding, dilation, groups; the real sizes are marked slow
CONVS = {
    "stem3x3-224": ((1, 3, 224, 224), (8, 3, 3, 3), 1, 1, 1, 1),
    "stem7x7-s2-224": ((1, 3, 224, 224), (16, 3, 7, 7), 2, 3, 1, 1),
    "s2-56": ((2, 16, 56, 56), (32, 16, 3, 3), 2, 1, 1, 1),
    "batch64-7x7": ((64, 8, 7, 7), (16, 8, 3, 3), 1, 1, 1, 1),
    "dilated-grouped": ((4, 12, 15, 13), (12, 4, 3, 3), 1, 2, 2, 3),
    "depthwise-s2": ((2, 8, 33, 31), (8, 1, 5, 5), 2, 2, 1, 8),
    "depthwise-dilated-3x4": ((2, 6, 3, 4), (6, 1, 3, 3), 1, 2, 2, 6),
    "pointwise": ((2, 32, 28, 28), (64, 32, 1, 1), 1, 0, 1, 1),
    "deep-112": ((1, 64, 112, 112), (32, 64, 3, 3), 2, 1, 1, 1),
    # weights past 32 KiB: images side by side in one GEMM (all 8; 6 in 2 chunks of 3)
    "folded-4x4": ((8, 64, 4, 4), (128, 64, 3, 3), 1, 1, 1, 1),
    "folded-chunks": ((6, 32, 12, 12), (64, 32, 3, 3), 1, 1, 1, 1),
    "folded-grouped-s2": ((6, 64, 9, 7), (96, 32, 3, 3), 2, 1, 1, 2),
    # chunks of 2 on 2 or 4 threads, the weight gradient summed in per-thread copies
    "split-dw": ((8, 32, 16, 16), (64, 32, 3, 3), 1, 1, 1, 1),
}
SLOW_CONVS = {"stem3x3-224", "stem7x7-s2-224", "deep-112", "s2-56"}
SPLITS = [("own", 1), ("own", 2), ("own", 4), ("blas", 1), ("blas", 2)]
SLOW_SPLITS = [("own", 1), ("own", 4), ("blas", 2)]  # the real sizes: each engine, 1 and 4


def _graph(types, dtype: str, fn) -> Graph:
    g = Graph("f", [TensorType(s, dtype) for s in types])
    b = Builder(g.body)
    b.create("func.return", list(fn(b, *g.args)))
    return verify(g)


def _conv_attrs(case) -> dict:
    _, _, s, p, d, groups = case
    return {"stride": [s, s], "padding": [p, p], "dilation": [d, d], "groups": groups}


def _out_hw(case) -> tuple[int, int]:
    (_, _, h, w), (_, _, kh, kw), s, p, d, _ = case
    return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k in ((h, kh), (w, kw)))


def conv_graph(case, dtype: str) -> Graph:
    """conv2d(x, w), conv2d_grad_input(gy, w) and conv2d_grad_weight(x, gy) on inputs x, w,
    gy: each kernel's own reduction, none feeding another."""
    xs, ws = case[:2]
    ys = (xs[0], ws[0], *_out_hw(case))
    a = _conv_attrs(case)

    def fn(b, x, w, gy):
        return [b.create("ember.conv2d", [x, w], a).result,
                b.create("ember.conv2d_grad_input", [gy, w],
                         {**a, "input_shape": list(xs)}).result,
                b.create("ember.conv2d_grad_weight", [x, gy],
                         {**a, "weight_shape": list(ws)}).result]

    return _graph([xs, ws, ys], dtype, fn)


def conv_lengths(case) -> list[int]:
    """The most terms any output of each kernel sums: fwd c/g kh kw; grad-input o/g kh kw
    (fewer where taps fall outside); grad-weight n oh ow."""
    (n, c, _, _), (o, _, kh, kw), *_, groups = case
    oh, ow = _out_hw(case)
    return [c // groups * kh * kw, o // groups * kh * kw, n * oh * ow]


def conv_inputs(case) -> list[np.ndarray]:
    xs, ws = case[:2]
    rng = np.random.default_rng(sum(map(sum, case[:2])))
    return [rng.standard_normal(s).astype(np.float32)
            for s in (xs, ws, (xs[0], ws[0], *_out_hw(case)))]


@functools.cache
def conv_reference(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(float64 results, float64 results on the squared inputs) of CONVS[name]."""
    case = CONVS[name]
    g = conv_graph(case, "f64")
    xs = [x.astype(np.float64) for x in conv_inputs(case)]
    return interpreter.run(g, xs), interpreter.run(g, [x * x for x in xs])


def check_within(got, want, squares, length: int, what: str) -> None:
    """Asserts |got - want| <= TOLERANCE u sqrt(L sum t^2 / 2) + 2 u |want| everywhere (the
    worst output of this sweep reaches 0.72 of it: a plain loop's error is that large)."""
    assert got.shape == want.shape, what
    tol = TOLERANCE * U * np.sqrt(length * squares / 2) + 2 * U * np.abs(want)
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert (err <= tol).all(), (
        f"{what}: {int((err > tol).sum())} of {err.size} outputs beyond tolerance; at "
        f"{tuple(map(int, worst))} {got[worst]!r} vs {want[worst]!r} (tolerance "
        f"{tol[worst]:.3g}, reduction of {length})")


def compiled(g: Graph, engine: str, threads: int, monkeypatch) -> cpu.Executable:
    monkeypatch.setenv("EMBER_GEMM", engine)
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 16)  # every kernel that can split does
    return cpu.Executable(g, threads=threads, use_cache=False)


@pytest.mark.parametrize("name, engine, threads", [
    pytest.param(n, e, t, marks=pytest.mark.slow) if n in SLOW_CONVS else (n, e, t)
    for n in CONVS for e, t in SPLITS
    if n not in SLOW_CONVS or (e, t) in SLOW_SPLITS])
def test_conv_kernels_are_within_their_reduction_tolerance(name, engine, threads,
                                                           monkeypatch):
    case = CONVS[name]
    want, squares = conv_reference(name)
    got = compiled(conv_graph(case, "f32"), engine, threads, monkeypatch)(conv_inputs(case))
    for kernel, g, w, sq, length in zip(("conv2d", "grad_input", "grad_weight"), got, want,
                                        squares, conv_lengths(case)):
        check_within(g, w, sq, length, f"{name} {kernel} ({engine}, {threads} threads)")


POOLS = {  # x shape, kernel, stride, padding (the 224 one is slow)
    "224-3x3-s2": ((1, 8, 224, 224), 3, 2, 1),
    "7x7-global": ((64, 16, 7, 7), 7, 1, 0),
    "odd-overlap": ((2, 5, 15, 13), 3, 1, 1),
}


def pool_graph(case, kind: str, dtype: str) -> Graph:
    xs, k, s, p = case
    a = {"kernel": [k, k], "stride": [s, s], "padding": [p, p]}
    oh, ow = ((n + 2 * p - k) // s + 1 for n in xs[2:])

    def fn(b, x, gy):
        y = b.create(f"ember.{kind}_pool2d", [x], a).result
        if kind == "max":
            return [y, b.create("ember.max_pool2d_grad", [x, gy], a).result]
        return [y, b.create("ember.avg_pool2d_grad", [gy], {**a, "input_shape": list(xs)}).result]

    return _graph([xs, (*xs[:2], oh, ow)], dtype, fn)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if "224" in n else n
                                  for n in POOLS])
def test_pool_kernels_are_within_their_reduction_tolerance(name, kind, threads, monkeypatch):
    """A window sums at most k*k terms; a max is exact, so its gradient only sums the
    gradients routed to one input (at most k*k too)."""
    case = POOLS[name]
    rng = np.random.default_rng(3)
    xs = case[0]
    x = rng.standard_normal(xs).astype(np.float32)
    g32 = pool_graph(case, kind, "f32")
    gy = rng.standard_normal(g32.args[1].type.shape).astype(np.float32)
    got = compiled(g32, "own", threads, monkeypatch)([x, gy])
    g64 = pool_graph(case, kind, "f64")
    want = interpreter.run(g64, [x.astype(np.float64), gy.astype(np.float64)])
    squares = interpreter.run(g64, [x.astype(np.float64) ** 2 if kind == "avg"
                                    else x.astype(np.float64), gy.astype(np.float64) ** 2])
    for what, g, w, sq in zip(("forward", "grad"), got, want, squares):
        if kind == "max" and what == "forward":
            np.testing.assert_array_equal(g, w.astype(np.float32))  # a max rounds nothing
            continue
        check_within(g, w, np.abs(sq), case[1] ** 2, f"{name} {kind} pool {what}")


MATMULS = {  # a shape, b shape: K from 3 to 2^16, skinny and square, batched
    "square-300": ((300, 300), (300, 300)),
    "skinny-n10": ((1024, 784), (784, 10)),
    "long-k": ((64, 65536), (65536, 48)),
    "batched": ((6, 33, 129), (6, 129, 17)),
    "tiny-k": ((257, 3), (3, 65)),
}


@pytest.mark.parametrize("engine, threads", SPLITS, ids=lambda v: str(v))
@pytest.mark.parametrize("name", MATMULS)
def test_matmuls_are_within_their_reduction_tolerance(name, engine, threads, monkeypatch):
    sa, sb = MATMULS[name]
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in (sa, sb))
    g = _graph([sa, sb], "f32", lambda bb, x, y: [bb.op("ember.matmul", x, y)])
    got = compiled(g, engine, threads, monkeypatch)([a, b])[0]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    check_within(got, a64 @ b64, (a64 * a64) @ (b64 * b64), sa[-1],
                 f"matmul {name} ({engine}, {threads} threads)")


# -- long reductions against PyTorch float32's own error --------------------------------------

def _rms(x) -> float:
    return math.sqrt(float(np.mean(np.square(x))))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stem3x3-224", "deep-112", "batch64-7x7"])
@pytest.mark.parametrize("engine", ["own", "blas"])
def test_weight_gradients_are_as_accurate_as_pytorchs(name, engine, monkeypatch):
    """The weight gradient sums n*oh*ow terms (50176 for one 224x224 image): its error
    against float64 within 10x of what PyTorch's float32 conv backward leaves."""
    torch = pytest.importorskip("torch")
    case = CONVS[name]
    x, _, gy = conv_inputs(case)
    want = conv_reference(name)[0][2]
    got = compiled(conv_graph(case, "f32"), engine, 2, monkeypatch)(conv_inputs(case))[2]
    w = torch.zeros(case[1], requires_grad=True)
    s, p, d, groups = case[2:]
    torch.nn.functional.conv2d(torch.from_numpy(x), w, stride=s, padding=p, dilation=d,
                               groups=groups).backward(torch.from_numpy(gy))
    ours, theirs = _rms(got - want), _rms(w.grad.double().numpy() - want)
    assert ours <= 10 * theirs, f"{name}: rms error {ours:.3g} vs PyTorch's {theirs:.3g}"


@pytest.mark.parametrize("engine", ["own", "blas"])
def test_a_long_k_matmul_is_as_accurate_as_pytorchs(engine, monkeypatch):
    torch = pytest.importorskip("torch")
    sa, sb = MATMULS["long-k"]
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in (sa, sb))
    g = _graph([sa, sb], "f32", lambda bb, x, y: [bb.op("ember.matmul", x, y)])
    got = compiled(g, engine, 2, monkeypatch)([a, b])[0]
    want = a.astype(np.float64) @ b.astype(np.float64)
    theirs = (torch.from_numpy(a) @ torch.from_numpy(b)).double().numpy()
    assert _rms(got - want) <= 10 * _rms(theirs - want)
