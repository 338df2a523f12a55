"""Convolutions as torch's: unbatched inputs ([C, H, W], [C, L]), padding="same" with even
kernels (the extra pad after), conv_transpose2d's output_padding up to max(stride,
dilation) - 1: values and gradients (input and weight) against torch."""

import numpy as np
import pytest
from torch_semantics import check

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")
TF = torch.nn.functional
BACKENDS = ["interpreter", "cpu"]


def _randn(*shape):
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


CASES = {  # name: (ember, torch, input, weight)
    "conv2d unbatched": (lambda x, w: F.conv2d(x, w, stride=2, padding=1),
                         lambda x, w: TF.conv2d(x, w, stride=2, padding=1),
                         _randn(3, 7, 6), _randn(4, 3, 3, 3)),
    "conv1d unbatched": (lambda x, w: F.conv1d(x, w, padding=1, dilation=2),
                         lambda x, w: TF.conv1d(x, w, padding=1, dilation=2),
                         _randn(3, 9), _randn(4, 3, 3)),
    "conv2d same even": (lambda x, w: F.conv2d(x, w, padding="same"),
                         lambda x, w: TF.conv2d(x, w, padding="same"),
                         _randn(2, 3, 7, 6), _randn(4, 3, 2, 4)),
    "conv2d same even dilated": (lambda x, w: F.conv2d(x, w, padding="same", dilation=(3, 1)),
                                 lambda x, w: TF.conv2d(x, w, padding="same",
                                                        dilation=(3, 1)),
                                 _randn(2, 3, 8, 5), _randn(4, 3, 2, 2)),
    "conv1d same even unbatched": (lambda x, w: F.conv1d(x, w, padding="same"),
                                   lambda x, w: TF.conv1d(x, w, padding="same"),
                                   _randn(3, 8), _randn(2, 3, 4)),
    "conv_transpose2d output_padding": (
        lambda x, w: F.conv_transpose2d(x, w, stride=3, padding=1, output_padding=2),
        lambda x, w: TF.conv_transpose2d(x, w, stride=3, padding=1, output_padding=2),
        _randn(2, 3, 4, 5), _randn(3, 2, 3, 3)),
    "conv_transpose2d output_padding past the stride": (
        lambda x, w: F.conv_transpose2d(x, w, stride=(1, 2), padding=(2, 1),
                                        output_padding=(2, 1), dilation=(3, 2)),
        lambda x, w: TF.conv_transpose2d(x, w, stride=(1, 2), padding=(2, 1),
                                         output_padding=(2, 1), dilation=(3, 2)),
        _randn(2, 3, 4, 5), _randn(3, 2, 3, 2)),
    "conv_transpose2d unbatched": (
        lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1),
        lambda x, w: TF.conv_transpose2d(x, w, stride=2, output_padding=1),
        _randn(3, 4, 5), _randn(3, 2, 3, 3)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_convolutions_match_torch(name, backend):
    ours, theirs, x, w = CASES[name]
    check(ours, theirs, x, w, backend=backend)


def test_layers_take_even_same_padding_and_unbatched_input():
    em.seed(0)
    conv = nn.Conv2d(3, 4, (2, 4), padding="same")
    x = _randn(3, 7, 6)
    ref = torch.nn.Conv2d(3, 4, (2, 4), padding="same")
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(conv.weight.val()))
        ref.bias.copy_(torch.tensor(conv.bias.val()))
    got = em.compile(conv, x, backend="cpu")(x)
    np.testing.assert_allclose(got, ref(torch.tensor(x)).detach().numpy(), atol=1e-5)
    assert nn.ConvTranspose2d(3, 2, 3, stride=1, dilation=2, output_padding=1).output_padding \
        == (1, 1)


def test_bad_convolution_arguments_are_refused():
    with pytest.raises(ValueError, match=r"ConvTranspose2d output_padding \(2, 2\) must be "
                                         r"smaller than stride \(2, 2\) or dilation \(1, 1\)"):
        nn.ConvTranspose2d(3, 2, 3, stride=2, output_padding=2)
    x, w = _randn(2, 3, 4, 5), _randn(3, 2, 3, 3)
    with pytest.raises(ValueError, match=r"conv_transpose2d output_padding \(1, 1\) must be "
                                         r"smaller than stride \(1, 1\) or dilation \(1, 1\)"):
        check(lambda x, w: F.conv_transpose2d(x, w, output_padding=1), None, x, w,
              backend="interpreter")
    with pytest.raises(em.ShapeError, match=r"conv2d: input must have 4 dims \(batched\) or 3 "
                                            r"\(unbatched\), got \[7, 6\]"):
        check(F.conv2d, None, _randn(7, 6), _randn(4, 3, 3, 3), backend="interpreter")
