"""3x3 stride-1 convs as Winograd F(2x2, 3x3) (backends/cpu/kernels/winograd.py,
winograd_weight_grad.py): forward convs, input and weight gradients against the
interpreter on 1, 2 and 4 threads, f32 and f64, with bands of tile rows split across
threads, a short last band, units of several whole images, rows of tiles that end inside
a vector and channels that end inside a tile of the micro-kernel's rows; the conv's
epilogue on each unit (a bias and ReLU fused into the conv)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_cpu_ops import attrs, conv_and_gradients, graph

from ember.backends import cpu, interpreter
from ember.backends.cpu.kernels import winograd, winograd_weight_grad
from ember.backends.cpu.kernels.conv import Conv
from ember.backends.cpu.machine.host import host_isa
from ember.passes import PassManager, parse_pipeline

CASES = [  # x shape, out channels, L2 bytes (bands of fewer rows where small)
    ((2, 3, 8, 6), 5, 1 << 21),      # one band an image, 3 tiles a row
    ((3, 7, 10, 36), 13, 96 << 10),  # 18 tiles a row (a vector and 2), bands of 2, 2, 1
    ((1, 16, 12, 12), 20, 1 << 16),  # bands of 2 tile rows (f64: 1): 3 an image
    ((4, 5, 2, 2), 3, 1 << 21),      # one tile an image, all four images a unit
    ((5, 4, 4, 6), 6, 16 << 10),     # units of 2 whole images (f64: 1), the last of 1
    ((2, 4, 6, 8), 70, 1 << 21),     # outputs past one panel of the micro-kernel's columns
]


@pytest.fixture
def small_bands(monkeypatch):
    """Winograd for every shape, with the L2 of each case."""
    monkeypatch.setattr(winograd, "MIN_VECTORS", 0)
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 0)
    from ember.backends.cpu.kernels import implicit_conv
    from ember.backends.cpu.parallel import outline

    monkeypatch.setattr(implicit_conv, "FLIP_POSITIONS", 1)  # input gradients of few too

    monkeypatch.setattr(outline, "MIN_WORK", 16)  # split even these small convs

    def with_l2(l2: int):
        monkeypatch.setattr(winograd, "host_caches", lambda: SimpleNamespace(l2=l2))
    return with_l2


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("case", CASES)
def test_winograd_conv_and_gradients(case, dtype, threads, small_bands, monkeypatch):
    xs, o, l2 = case
    small_bands(l2)
    monkeypatch.setenv("EMBER_NUM_THREADS", str(threads))
    ws = (o, xs[1], 3, 3)
    a = attrs([1, 1], [1, 1], [1, 1], 1)
    rng = np.random.default_rng(5)
    x, w = (rng.standard_normal(s).astype(dtype.replace("f", "float")) for s in (xs, ws))

    g = conv_and_gradients(xs, ws, a, dtype)
    for op in g.body.ops:
        if op.name.startswith("ember.conv2d"):
            runs = (winograd_weight_grad.runs_weight_grad if op.name.endswith("weight")
                    else winograd.runs_winograd)
            assert runs(Conv(op).implicit(host_isa()), host_isa()), op.name
    want = interpreter.run(g, [x, w])
    got = cpu.Executable(g, use_cache=False)([x, w])
    tol = 2e-6 if dtype == "f32" else 1e-13
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=0, atol=tol * np.abs(wv).max())


@pytest.mark.parametrize("threads", [1, 2])
def test_the_epilogue_runs_on_each_band(threads, small_bands, monkeypatch):
    small_bands(1 << 14)
    monkeypatch.setenv("EMBER_NUM_THREADS", str(threads))
    xs, o = (3, 6, 10, 12), 9

    def fn(b, x, w, bias):
        y = b.op("ember.conv2d", x, w, stride=[1, 1], padding=[1, 1], dilation=[1, 1],
                 groups=1)
        return [b.op("ember.relu", b.op("ember.add", y, b.op("ember.reshape", bias,
                                                               shape=[1, o, 1, 1])))]

    g = graph([(xs, "f32"), ((o, xs[1], 3, 3), "f32"), ((o,), "f32")], fn)
    fused = PassManager(parse_pipeline("fuse")).run(graph(
        [(xs, "f32"), ((o, xs[1], 3, 3), "f32"), ((o,), "f32")], fn))
    assert [op.name for op in fused.body.ops if "conv" in op.name] == ["kernel.conv2d"]
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal(a.type.shape).astype(np.float32) for a in g.args]
    want = interpreter.run(g, inputs)[0]
    got = cpu.Executable(fused, use_cache=False)(inputs)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    assert (got == 0).any() and (got > 0).any()


def test_which_convs_run_as_winograd():
    """3x3, stride 1, padding 1, one group, even sides, a band of enough tiles in L2."""
    isa = host_isa()

    def runs(x, w, stride=1, pad=1, dil=1, groups=1, dtype="f32"):
        a = attrs([stride] * 2, [pad] * 2, [dil] * 2, groups)
        g = graph([(x, dtype), (w, dtype)], lambda b, x, w: [
            b.create("ember.conv2d", [x, w], a).result])
        geo = Conv(next(iter(g.body.ops))).implicit(isa)
        return geo is not None and winograd.runs_winograd(geo, isa)

    assert runs((8, 64, 56, 56), (64, 64, 3, 3))
    assert runs((32, 128, 16, 16), (128, 128, 3, 3), dtype="f64")
    assert not runs((8, 64, 56, 56), (64, 64, 3, 3), stride=2)
    assert not runs((8, 64, 56, 56), (64, 64, 3, 3), pad=2, dil=2)
    assert not runs((8, 64, 56, 56), (64, 32, 3, 3), groups=2)
    assert not runs((8, 64, 55, 55), (64, 64, 3, 3))  # odd sides
    assert not runs((8, 64, 56, 56), (64, 64, 5, 5), pad=2)
    assert runs((32, 512, 4, 4), (512, 512, 3, 3))  # units of 8 images
    assert not runs((1, 512, 4, 4), (512, 512, 3, 3))  # 4 tiles in all
    assert not runs((32, 3, 32, 32), (64, 3, 3, 3))  # an image's 3 channels
