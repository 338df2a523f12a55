"""`nn.functional.interpolate` and `nn.Upsample` (compositions of gathers, products and
sums with constants) against PyTorch: values and gradients on the interpreter and the cpu
backend for nearest, nearest-exact, linear, bilinear and trilinear, align_corners either
way, to a size or by integer and non-integer scale factors (1.5, 0.6), up and down; the
sampling arithmetic itself against torch's at every output position of many sizes; the
layer; the errors, each naming its argument (and the module path for shapes)."""

import math

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.frontend.resize import torch_taps

torch = pytest.importorskip("torch")
F = nn.functional
TF = torch.nn.functional

CASES = [  # (input shape, interpolate's keywords)
    ((2, 3, 5, 7), dict(scale_factor=2)),
    ((2, 3, 5, 7), dict(scale_factor=1.5)),
    ((2, 3, 5, 7), dict(scale_factor=0.6)),
    ((2, 3, 5, 7), dict(size=(8, 9))),
    ((2, 3, 5, 7), dict(size=(3, 4))),
    ((1, 2, 6, 5), dict(scale_factor=(1.5, 0.6))),
    ((1, 2, 6, 5), dict(scale_factor=1.5, mode="nearest-exact")),
    ((1, 2, 6, 5), dict(size=(4, 11), mode="nearest-exact")),
    ((2, 3, 5, 7), dict(scale_factor=2, mode="bilinear")),
    ((2, 3, 5, 7), dict(scale_factor=1.5, mode="bilinear")),
    ((2, 3, 5, 7), dict(scale_factor=0.6, mode="bilinear")),
    ((2, 3, 5, 7), dict(size=(8, 9), mode="bilinear")),
    ((2, 3, 5, 7), dict(size=(3, 4), mode="bilinear")),
    ((2, 3, 5, 7), dict(size=(1, 1), mode="bilinear")),
    ((2, 3, 5, 7), dict(scale_factor=2, mode="bilinear", align_corners=True)),
    ((2, 3, 5, 7), dict(scale_factor=1.5, mode="bilinear", align_corners=True)),
    ((2, 3, 5, 7), dict(scale_factor=0.6, mode="bilinear", align_corners=True)),
    ((2, 3, 5, 7), dict(size=(3, 11), mode="bilinear", align_corners=True)),
    ((2, 3, 5, 7), dict(size=(1, 4), mode="bilinear", align_corners=True)),
    ((1, 2, 6, 5), dict(scale_factor=(0.6, 1.5), mode="bilinear")),
    ((1, 2, 6, 5), dict(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)),
    ((2, 3, 9), dict(scale_factor=1.5, mode="linear")),
    ((2, 3, 9), dict(scale_factor=0.6, mode="linear")),
    ((2, 3, 9), dict(size=13, mode="linear", align_corners=True)),
    ((2, 3, 9), dict(size=4, mode="linear", align_corners=False)),
    ((2, 3, 9), dict(scale_factor=2.5)),
    ((1, 2, 3, 4, 5), dict(scale_factor=(1.5, 2, 0.6), mode="trilinear")),
    ((1, 2, 3, 4, 5), dict(size=(2, 6, 3))),
]
TOL = {"f32": dict(rtol=1e-5, atol=1e-6), "f64": dict(rtol=1e-12, atol=1e-12)}


class Resized(nn.Module):
    """interpolate(p) * r, so that d sum(out * w) / dp is interpolate's backward of r * w."""

    def __init__(self, x, **kw):
        super().__init__()
        self.kw, self.p = kw, em.Param.from_array(x)

    def forward(self, r):
        return F.interpolate(self.p, **self.kw) * r


def _torch(x: np.ndarray, w: np.ndarray | None, kw: dict):
    p = torch.tensor(x, requires_grad=True)
    y = TF.interpolate(p, **kw)
    if w is not None:
        (y * torch.tensor(w)).sum().backward()
    return y.detach().numpy(), p.grad


def _case(shape, kw, dtype="f32", backend="cpu"):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(dtype.replace("f", "float"))
    want, _ = _torch(x, None, kw)
    w = rng.standard_normal(want.shape).astype(x.dtype)
    want, grad = _torch(x, w, kw)
    model, ones = Resized(x, **kw), np.ones(want.shape, x.dtype)
    got = em.compile(model, ones, backend=backend)(ones)
    grads = em.compile_grad(model, lambda out, y: (out * y).sum(), backend=backend)(ones, w)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **TOL[dtype])
    np.testing.assert_allclose(grads[model.p], grad.numpy(), **TOL[dtype])


@pytest.mark.parametrize("shape, kw", CASES, ids=[f"{len(s)}d-{k}" for s, k in CASES])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_values_and_gradients_against_torch(backend, shape, kw):
    _case(shape, kw, backend=backend)


@pytest.mark.parametrize("kw", [dict(scale_factor=0.6), dict(scale_factor=1.5, mode="bilinear"),
                                dict(size=(3, 11), mode="bilinear", align_corners=True)])
def test_f64_against_torch(kw):
    _case((2, 3, 5, 7), kw, dtype="f64")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_sampling_is_torchs_at_every_position(dtype):
    """torch_taps (indices and weights of every output position) against torch's own
    interpolation of the identity, for sizes 1..12 to 1..24 and many scale factors: nearest
    picks torch's pixel even where the float arithmetic decides it."""
    def taps_matrix(size, out, scale, mode, align):
        index, weight = torch_taps(size, out, scale, mode, bool(align), dtype)
        m = np.zeros((out, size))
        for k in range(index.shape[1]):
            np.add.at(m, (np.arange(out), index[:, k]), 1 if weight is None else weight[:, k])
        return m

    for mode, align in [("nearest", None), ("nearest-exact", None), ("linear", False),
                        ("linear", True)]:
        for size in range(1, 13):
            eye = torch.eye(size, dtype=torch.float32 if dtype == np.float32 else torch.float64)
            eye = eye.reshape(size, 1, size)
            specs = [dict(size=o) for o in range(1, 25)] + [
                dict(scale_factor=s) for s in (0.3, 0.5, 0.6, 0.7, 0.9, 1.1, 1.3, 1.5, 1.7, 2.0,
                                               2.5, 3.0, 1 / 3, 2 / 3, 4.2)
                if math.floor(size * s) >= 1]
            for kw in specs:
                want = TF.interpolate(eye, mode=mode, align_corners=align, **kw)[:, 0].T.numpy()
                got = taps_matrix(size, want.shape[0], kw.get("scale_factor"), mode, align)
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6,
                                           err_msg=f"{mode} {align} {size} {kw}")


def test_it_is_a_composition_of_core_ops():
    traced = em.trace(Resized(np.zeros((1, 2, 5, 7), np.float32), scale_factor=1.5,
                              mode="bilinear"), em.TensorSpec((1, 2, 7, 10)))
    ops = {op.name for op in traced.ops}
    assert ops <= {"ember.param", "ember.constant", "ember.transpose", "ember.gather",
                   "ember.mul", "ember.add", "func.return"}, ops


def test_an_unchanged_size_is_x_itself():
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32)
    for kw in (dict(size=(5, 7)), dict(size=(5, 7), mode="bilinear"),
               dict(scale_factor=1.0, mode="bilinear", align_corners=True)):
        traced = em.trace(Resized(x, **kw), em.TensorSpec((1, 2, 5, 7)))
        assert "ember.gather" not in {op.name for op in traced.ops}, kw


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(4, 9), mode="bilinear"),
                                dict(scale_factor=0.6, mode="bilinear", align_corners=True)])
def test_the_upsample_layer_is_torchs(kw):
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 7)).astype(np.float32)
    model = nn.Sequential(nn.Upsample(**kw))
    want = torch.nn.Upsample(**kw)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(em.compile(model, x, backend="cpu")(x), want, **TOL["f32"])


def test_the_upsample_layer_reprs_as_torchs():
    assert repr(nn.Upsample(scale_factor=2.0)) == "Upsample(scale_factor=2.0, mode='nearest')"
    assert repr(nn.Upsample(size=(4, 5), mode="bilinear", align_corners=True)) == (
        "Upsample(size=(4, 5), mode='bilinear', align_corners=True)")


@pytest.mark.parametrize("kw, message", [
    (dict(), r"interpolate: give exactly one of size and scale_factor, got neither"),
    (dict(size=4, scale_factor=2), r"interpolate: give exactly one of size and scale_factor, "
                                   r"got both"),
    (dict(size=4, mode="bicubic"), r"interpolate mode must be one of 'nearest', .*'bicubic'"),
    (dict(size=4, mode="area"), r"interpolate mode must be one of .*got 'area'"),
    (dict(size=4, align_corners=True), r"interpolate align_corners can only be set with the "
                                       r"interpolating modes .*not mode 'nearest'"),
    (dict(size=0), r"interpolate size must be a positive integer or a tuple of them, got 0"),
    (dict(size=(4, 2.5)), r"interpolate size must be a positive integer .*got \(4, 2.5\)"),
    (dict(scale_factor=0), r"interpolate scale_factor must be a positive finite number"),
    (dict(scale_factor=float("nan")), r"interpolate scale_factor must be a positive finite"),
    (dict(scale_factor=(2, -1)), r"interpolate scale_factor must be .*got \(2, -1\)"),
])
def test_configuration_errors_name_the_argument(kw, message):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match=message):
        em.trace(Resized(x, **kw), em.TensorSpec((1, 1, 4, 4)))
    layer_message = message.replace("interpolate", "Upsample")
    with pytest.raises(ValueError, match=layer_message):
        nn.Upsample(**kw)


@pytest.mark.parametrize("layer, shape, message", [
    (nn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 5),
     r"^layers.0 \(Upsample\): interpolate: mode 'bilinear' needs a 4-d input \[N, C, \.\.\.\], "
     r"got \[1, 2, 5\]"),
    (nn.Upsample(size=4, mode="linear"), (1, 2, 5, 5),
     r"^layers.0 \(Upsample\): interpolate: mode 'linear' needs a 3-d input"),
    (nn.Upsample(size=4), (2, 5),
     r"^layers.0 \(Upsample\): interpolate: mode 'nearest' needs a 3-d or 4-d or 5-d input"),
    (nn.Upsample(size=(4, 4, 4)), (1, 2, 5, 5),
     r"^layers.0 \(Upsample\): interpolate: size \[4, 4, 4\] must give one value for each of "
     r"the 2 spatial dims of input \[1, 2, 5, 5\]"),
    (nn.Upsample(scale_factor=0.1), (1, 2, 5, 5),
     r"^layers.0 \(Upsample\): interpolate: output size \[0, 0\] of input \[1, 2, 5, 5\] must "
     r"be at least 1"),
])
def test_shape_errors_name_the_module_path(layer, shape, message):
    with pytest.raises(em.ShapeError, match=message):
        em.trace(nn.Sequential(layer), em.TensorSpec(shape))


def test_integer_input_nearest_and_not_linear():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    got = em.compile(nn.Upsample(scale_factor=1.5), x, backend="cpu")(x)
    want = TF.interpolate(torch.tensor(x, dtype=torch.float64), scale_factor=1.5).numpy()
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)
    with pytest.raises(em.ShapeError, match="interpolate: mode 'bilinear' needs a float input, "
                                            "got i64"):
        em.trace(nn.Upsample(size=3, mode="bilinear"), em.TensorSpec((1, 2, 4, 4), "i64"))
