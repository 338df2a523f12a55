"""Channels-last depthwise convs on the cpu (backends/cpu/kernels/depthwise_nhwc.py)
against the interpreter, and a MobileNet's chain laid out by the layout pass
(passes/layout.py) and fused, four ways."""

from __future__ import annotations

import numpy as np
import pytest
from conv_chains import mobilenet
from fused_checks import close, four_ways, graph, rand

import ember as em
from ember.backends import cpu, interpreter
from ember.backends.errors import UnsupportedOpError
from ember.passes import PassManager, parse_pipeline

CASES = [  # n, channels, size, kernel, stride, padding, dilation
    (2, 16, 10, 3, 1, [1, 1], 1),        # interior and border positions, one vector
    (1, 20, 9, 3, 2, [1, 1], 1),         # a vector and a 4-channel rest, stride 2
    (2, 35, 8, 5, 1, [2, 2], 1),         # 5x5, two vectors and a rest of 3
    (1, 48, 7, 3, 2, [0, 0, 1, 1], 1),   # padding only at the end (TF's "same")
    (1, 16, 12, 3, 1, [2, 2], 2),        # dilation
    (1, 16, 3, 5, 1, [2, 2], 1),         # no position with every tap inside
    (3, 8, 6, 3, 1, [0, 0], 1),          # every position inside
]


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n,c,h,k,s,padding,d", CASES)
def test_depthwise_nhwc_equals_the_interpreter(n, c, h, k, s, padding, d, dtype, threads):
    _equals_the_interpreter([(n, h, h, c), (k, k, 1, c)], s, padding, d, c, dtype, threads)


def _equals_the_interpreter(shapes, s: int, padding, d: int, groups: int, dtype: str,
                            threads: int) -> None:
    def fn(b, x, w):
        return [b.op("ember.conv2d_nhwc", x, w, stride=[s, s], padding=padding,
                     dilation=[d, d], groups=groups)]
    g = graph(shapes, fn, dtype=dtype)
    inputs = [a.astype(dtype.replace("f", "float")) for a in rand(*shapes)]
    close(cpu.Executable(g, threads, use_cache=False)(inputs), interpreter.run(g, inputs))


DENSE = [  # n, input channels, output channels, size, kernel, stride, padding
    (1, 3, 16, 12, 3, 2, [1, 1]),     # an image stem: one vector of outputs, 8 positions a time
    (2, 3, 32, 11, 3, 2, [1, 1]),     # two vectors, 4 positions a time, and a rest
    (1, 1, 20, 9, 5, 1, [2, 2]),      # one input channel, a vector and a rest of 4
    (1, 4, 8, 6, 3, 1, [0, 0, 1, 1]),  # a short vector only, padding at the end
    (1, 2, 16, 3, 3, 1, [1, 1]),      # no position with every tap inside
]


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n,c,o,h,k,s,padding", DENSE)
def test_dense_nhwc_equals_the_interpreter(n, c, o, h, k, s, padding, dtype, threads):
    """One group: each input channel broadcast against vectors of output channels."""
    _equals_the_interpreter([(n, h, h, c), (k, k, c, o)], s, padding, 1, 1, dtype, threads)


def _epilogue(kind: str):
    """conv2d_nhwc (depthwise, 20 channels: a vector and a rest) and what reads it."""
    def fn(b, x, w, bias, r, s):
        y = b.op("ember.conv2d_nhwc", x, w, stride=[1, 1], padding=[1, 1], dilation=[1, 1],
                 groups=20)
        z = b.op("ember.add", y, bias)
        if kind == "bias_relu6":
            six = b.op("ember.constant", value=np.array(6.0, np.float32))
            return [b.op("ember.min", b.op("ember.relu", z), six)]
        if kind == "residual_scale":  # r along every element, s one per image
            return [b.op("ember.mul", b.op("ember.sub", z, r), s)]
        if kind == "raw_too":  # the conv itself is a result as well
            return [b.op("ember.neg", z), y]
        return [b.op("ember.exp", z)]  # (no vector form here: the loop after the conv)
    return fn


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["bias_relu6", "residual_scale", "raw_too", "exp"])
def test_the_epilogue_runs_on_the_accumulators(kind, threads):
    shapes = [(2, 6, 6, 20), (3, 3, 1, 20), (20,), (2, 6, 6, 20), (2, 1, 1, 1)]
    g = graph(shapes, _epilogue(kind))
    f = four_ways(g, rand(*shapes), threads)
    assert [op.name for op in f.ops if "conv" in op.name] == ["kernel.conv2d_nhwc"]
    run = cpu.Executable(f, threads, use_cache=False)
    for seed in (1, 2):  # (a result left unwritten would hold the unfused run's values)
        other = rand(*shapes, seed=seed)
        close(run(other), interpreter.run(g, other), f"seed {seed}")


@pytest.mark.parametrize("groups,c", [(16, 1), (1, 3)])
def test_a_padded_tap_reads_zero_not_the_clamped_input(groups, c):
    """A border tap loads from a clamped address and selects zero: an inf there must not
    turn the border outputs into NaN (0 * inf); depthwise and dense."""
    def fn(b, x, w):
        return [b.op("ember.conv2d_nhwc", x, w, stride=[1, 1], padding=[1, 1],
                     dilation=[1, 1], groups=groups)]
    g = graph([(1, 4, 4, groups * c), (3, 3, c, 16)], fn)
    x, w = rand((1, 4, 4, groups * c), (3, 3, c, 16))
    x[0, 0, 0, :] = np.inf
    got = cpu.Executable(g, 1, use_cache=False)([x, w])[0]
    assert not np.isnan(got[0, 3, 3]).any()  # (its taps all miss the inf)
    np.testing.assert_allclose(got, interpreter.run(g, [x, w])[0], rtol=1e-5, atol=1e-5)


def test_a_grouped_channels_last_conv_is_refused_by_name():
    def fn(b, x, w):
        return [b.op("ember.conv2d_nhwc", x, w, stride=[1, 1], padding=[1, 1],
                     dilation=[1, 1], groups=2)]
    g = graph([(1, 5, 5, 4), (3, 3, 2, 8)], fn)
    with pytest.raises(UnsupportedOpError,
                       match=r"only when depthwise .* weight \[3, 3, 2, 8\] and 2 groups"):
        cpu.Executable(g, 1, use_cache=False)


@pytest.mark.parametrize("threads,engine", [(1, "own"), (2, "own"), (4, "own"), (2, "blas")])
def test_a_laid_out_mobilenet_fuses_and_runs_four_ways(threads, engine, monkeypatch):
    """Its pointwise convs are GEMMs: ember's own or OpenBLAS (EMBER_GEMM)."""
    monkeypatch.setenv("EMBER_GEMM", engine)
    g, shapes = mobilenet(2, 16, 16)
    laid = PassManager(parse_pipeline("layout,canonicalize,cse,dce")).run(g)
    inputs = rand(*shapes)
    f = four_ways(laid, inputs, threads)
    close(interpreter.run(f, inputs), interpreter.run(g, inputs))
    assert "kernel.conv2d_nhwc" in [op.name for op in f.ops]


class _InvertedResidual(em.nn.Module):
    """Stem, pointwise expand, depthwise, pointwise project, residual, pooled head."""

    def __init__(self):
        super().__init__()
        nn = em.nn
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.expand = nn.Conv2d(16, 32, 1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.project = nn.Conv2d(32, 16, 1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        relu = em.nn.functional.relu
        y = relu(self.stem(x))
        z = self.project(relu(self.dw(relu(self.expand(y))))) + y
        return self.head(z.mean(axis=(2, 3)))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_compiled_model_runs_its_depthwise_chain_channels_last(dtype):
    """em.compile on the cpu lays the chain out channels last (its inference pipeline
    runs the layout pass); the result is the interpreter's, which runs it NCHW."""
    from small_models import ToDtype

    em.seed(0)
    model = _InvertedResidual()
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    if dtype != "f32":
        model = model.map(ToDtype(dtype))
        x = x.astype(em.ir.numpy_dtype(dtype))
    f = em.compile(model, x, backend="cpu")
    assert {"ember.conv2d_nhwc", "kernel.conv2d_nhwc"} & {op.name for op in f.graph.ops}
    want = em.compile(model, x, backend="interpreter")(x)
    np.testing.assert_allclose(np.asarray(f(x), np.float64), np.asarray(want, np.float64),
                               rtol=1e-5, atol=1e-5)
