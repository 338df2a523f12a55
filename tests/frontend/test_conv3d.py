"""conv3d and conv_transpose3d (compositions of the 2-d ops) as torch's: strides, padding
(ints, "same" with even kernels, "valid"), dilation, groups, output_padding (also past the
stride), unbatched input, float64; values and gradients of input and weight on the
interpreter and the cpu backend; the Conv3d and ConvTranspose3d layers with torch's
arguments, init and weights; what is refused, naming the module path and the shapes."""

import math

import numpy as np
import pytest
from torch_semantics import check

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")
TF = torch.nn.functional
BACKENDS = ["interpreter", "cpu"]


def _randn(*shape, dtype=np.float32):
    return np.random.default_rng(len(shape) + sum(shape)).standard_normal(shape).astype(dtype)


def _both(fn: str, **kw):
    """ember's and torch's `fn` with the same keyword arguments."""
    return (lambda x, w: getattr(F, fn)(x, w, **kw), lambda x, w: getattr(TF, fn)(x, w, **kw))


CASES = {  # name: (ember, torch, input, weight)
    "conv3d strided padded": (*_both("conv3d", stride=(1, 2, 1), padding=(1, 0, 1)),
                              _randn(2, 3, 5, 6, 5), _randn(4, 3, 3, 2, 3)),
    "conv3d same even dilated groups": (*_both("conv3d", padding="same", dilation=(2, 1, 1),
                                               groups=2),
                                        _randn(2, 4, 5, 4, 5), _randn(6, 2, 2, 3, 2)),
    "conv3d valid dilated strided": (*_both("conv3d", stride=2, padding="valid",
                                            dilation=(1, 2, 1)),
                                     _randn(1, 2, 6, 7, 5), _randn(3, 2, 3, 2, 2)),
    "conv3d one depth tap strided": (*_both("conv3d", stride=2), _randn(2, 3, 5, 4, 4),
                                     _randn(4, 3, 1, 1, 1)),
    "conv3d unbatched": (*_both("conv3d", padding=1), _randn(3, 4, 4, 5), _randn(2, 3, 3, 3, 3)),
    "conv_transpose3d output_padding groups": (
        *_both("conv_transpose3d", stride=(2, 1, 2), padding=(1, 0, 1),
               output_padding=(1, 0, 1), groups=2),
        _randn(2, 4, 3, 4, 3), _randn(4, 3, 3, 2, 3)),
    "conv_transpose3d output_padding past the stride": (
        *_both("conv_transpose3d", stride=(1, 2, 1), padding=2, output_padding=(2, 1, 1),
               dilation=(3, 1, 2)),
        _randn(1, 3, 4, 3, 3), _randn(3, 2, 3, 3, 3)),
    "conv_transpose3d unbatched": (*_both("conv_transpose3d", stride=2, output_padding=1),
                                   _randn(3, 2, 3, 2), _randn(3, 2, 2, 3, 2)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_convolutions_match_torch(name, backend):
    ours, theirs, x, w = CASES[name]
    check(ours, theirs, x, w, backend=backend)


@pytest.mark.parametrize("fn, w_shape", [("conv3d", (3, 2, 3, 2, 3)),
                                         ("conv_transpose3d", (2, 3, 3, 2, 3))])
def test_float64_matches_torch_to_1e_10(fn, w_shape):
    ours, theirs = _both(fn, stride=2, padding=1)
    check(ours, theirs, _randn(2, 2, 4, 5, 4, dtype=np.float64),
          _randn(*w_shape, dtype=np.float64), backend="cpu", tol=1e-10)


def _copy_into(theirs, ours):
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(ours.weight.val()))
        theirs.bias.copy_(torch.tensor(ours.bias.val()))
    return theirs


def test_the_layers_take_torchs_arguments_and_weights():
    em.seed(0)
    x = _randn(2, 4, 4, 5, 4)
    pairs = [(nn.Conv3d(4, 6, (2, 3, 2), stride=1, padding="same", dilation=1, groups=2),
              torch.nn.Conv3d(4, 6, (2, 3, 2), 1, "same", 1, 2)),
             (nn.ConvTranspose3d(4, 2, 3, stride=2, padding=1, output_padding=1, groups=2,
                                 bias=True, dilation=1),
              torch.nn.ConvTranspose3d(4, 2, 3, 2, 1, 1, 2, True, 1))]
    for ours, theirs in pairs:
        assert ours.weight.shape == tuple(theirs.weight.shape)
        want = _copy_into(theirs, ours)(torch.tensor(x)).detach().numpy()
        np.testing.assert_allclose(em.compile(ours, x, backend="cpu")(x), want, rtol=1e-5,
                                   atol=1e-5)
    assert repr(pairs[1][0]).startswith(
        "ConvTranspose3d(c_in=4, c_out=2, kernel_size=(3, 3, 3), stride=(2, 2, 2), padding=(1, "
        "1, 1), output_padding=(1, 1, 1), dilation=(1, 1, 1), groups=2, bias=True)")


def test_weights_are_lazy_and_torchs_init():
    """U(±1/sqrt(fan_in)), fan_in = c_in/groups * volume (c_out/groups for the transpose).
    Seeded: the largest of 8 biases lies under 0.7 of the bound 6% of the time."""
    em.seed(0)
    conv, up = nn.Conv3d(4, 8, (3, 2, 2), groups=2), nn.ConvTranspose3d(4, 8, 3, groups=2)
    assert not conv.weight.is_initialized and conv.num_params() == 8 * 2 * 12 + 8
    for layer, fan_in in ((conv, 2 * 12), (up, 4 * 27)):
        for p in (layer.weight, layer.bias):
            bound = np.abs(p.val()).max()
            assert 0.7 / math.sqrt(fan_in) < bound <= 1 / math.sqrt(fan_in)


def test_bad_arguments_are_refused_naming_the_module_and_shapes():
    with pytest.raises(ValueError, match=r"ConvTranspose3d output_padding \(2, 0, 0\) must be "
                                         r"smaller than stride \(2, 2, 2\) or dilation"):
        nn.ConvTranspose3d(3, 2, 3, stride=2, output_padding=(2, 0, 0))
    with pytest.raises(ValueError, match=r"Conv3d: padding='same' needs stride 1"):
        nn.Conv3d(3, 2, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match=r"Conv3d kernel_size must be an integer >= 1 or a "
                                         r"triple of them, got \(3, 3\)"):
        nn.Conv3d(3, 2, (3, 3))
    model = nn.Sequential(nn.Conv3d(3, 4, 3))
    with pytest.raises(em.ShapeError, match=r"^layers.0 \(Conv3d\): conv3d: input must have 5 "
                                            r"dims \(batched\) or 4 \(unbatched\), got "
                                            r"\[3, 8, 8\]"):
        em.trace(model, em.TensorSpec((3, 8, 8), "f32"))
    with pytest.raises(em.ShapeError, match=r"conv3d: weight \[4, 3, 3, 3, 3\] with groups=1 "
                                            r"expects input \[2, 5, 4, 4, 4\] to have 3 channels"):
        em.trace(model, em.TensorSpec((2, 5, 4, 4, 4), "f32"))
    with pytest.raises(em.ShapeError, match=r"conv3d: kernel \[3, 3, 3\] does not fit input "
                                            r"\[1, 3, 2, 4, 4\]"):
        em.trace(model, em.TensorSpec((1, 3, 2, 4, 4), "f32"))
    up = nn.Sequential(nn.ConvTranspose3d(3, 4, 3))
    with pytest.raises(em.ShapeError, match=r"^layers.0 \(ConvTranspose3d\): conv_transpose3d: "
                                            r"input must have 5 dims"):
        em.trace(up, em.TensorSpec((3, 4, 4), "f32"))
