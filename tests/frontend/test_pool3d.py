"""The pools beyond 2-d as torch's: max_pool3d/avg_pool3d (stride, padding, dilation,
ceil_mode, flat D*H*W indices, count_include_pad, divisor_override), max_pool1d/avg_pool1d,
and the adaptive ones (avg 1d/2d/3d, max 1d/2d/3d with indices, None in output_size), on
batched and unbatched input: values and gradients on the interpreter and the cpu backend;
their modules with torch's arguments; what is refused."""

import numpy as np
import pytest
from torch_semantics import check

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")
TF = torch.nn.functional
BACKENDS = ["interpreter", "cpu"]


def _input(*shape, dtype=np.float32):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


X3, X1 = _input(2, 3, 5, 6, 7), _input(2, 3, 9)
POOLS = {  # name: (function, keyword arguments of both, input)
    "max3d planes on the core op": ("max_pool3d", dict(kernel_size=(3, 2, 2), stride=2,
                                                       padding=1), X3),
    "max3d dilation": ("max_pool3d", dict(kernel_size=(2, 3, 2), stride=(1, 2, 2),
                                          padding=(1, 1, 0), dilation=(2, 1, 1)), X3),
    "max3d indices ceil padded": ("max_pool3d", dict(kernel_size=3, stride=2, padding=1,
                                                     ceil_mode=True, return_indices=True), X3),
    "max3d indices dilation unbatched": ("max_pool3d", dict(kernel_size=2, stride=(2, 1, 2),
                                                            dilation=(1, 2, 1),
                                                            return_indices=True), X3[0]),
    "avg3d planes on the core op": ("avg_pool3d", dict(kernel_size=(3, 2, 2), stride=(1, 2, 2),
                                                       padding=1), X3),
    "avg3d ceil exclude pad": ("avg_pool3d", dict(kernel_size=3, stride=2, padding=1,
                                                  ceil_mode=True, count_include_pad=False), X3),
    "avg3d ceil divisor unbatched": ("avg_pool3d", dict(kernel_size=2, stride=2, ceil_mode=True,
                                                        divisor_override=5), X3[0]),
    "max1d indices ceil": ("max_pool1d", dict(kernel_size=3, stride=2, padding=1,
                                              ceil_mode=True, return_indices=True), X1),
    "max1d dilation unbatched": ("max_pool1d", dict(kernel_size=2, dilation=3), X1[0]),
    "avg1d exclude pad ceil": ("avg_pool1d", dict(kernel_size=4, stride=3, padding=2,
                                                  ceil_mode=True, count_include_pad=False), X1),
    "adaptive avg1d": ("adaptive_avg_pool1d", dict(output_size=4), X1),
    "adaptive avg2d None": ("adaptive_avg_pool2d", dict(output_size=(None, 4)), X3[:, :, 0]),
    "adaptive avg3d": ("adaptive_avg_pool3d", dict(output_size=(2, 4, 3)), X3),
    "adaptive avg3d divides unbatched": ("adaptive_avg_pool3d", dict(output_size=(5, 3, 1)),
                                         X3[0]),
    "adaptive max1d indices": ("adaptive_max_pool1d", dict(output_size=4, return_indices=True),
                               X1),
    "adaptive max2d unbatched": ("adaptive_max_pool2d", dict(output_size=(4, 3)), X3[0, :, 1]),
    "adaptive max3d indices": ("adaptive_max_pool3d", dict(output_size=(2, 4, 3),
                                                           return_indices=True), X3),
    "adaptive max3d divides": ("adaptive_max_pool3d", dict(output_size=(1, 3, 7)), X3),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", POOLS)
def test_pools_match_torch(name, backend):
    fn, kw, x = POOLS[name]
    check(lambda x: getattr(F, fn)(x, **kw), lambda x: getattr(TF, fn)(x, **kw), x,
          backend=backend)


def test_float64_matches_torch_to_1e_10():
    x = _input(2, 2, 5, 4, 6, dtype=np.float64)
    for fn, kw in (("max_pool3d", dict(kernel_size=3, stride=2, padding=1, return_indices=True)),
                   ("avg_pool3d", dict(kernel_size=2, stride=(1, 2, 2), count_include_pad=False,
                                       padding=1)),
                   ("adaptive_avg_pool3d", dict(output_size=(3, 3, 4)))):
        check(lambda x, fn=fn, kw=kw: getattr(F, fn)(x, **kw),
              lambda x, fn=fn, kw=kw: getattr(TF, fn)(x, **kw), x, backend="cpu", tol=1e-10)


def test_the_modules_take_torchs_arguments():
    pairs = [(nn.MaxPool3d(3, 2, 1, dilation=1, return_indices=True, ceil_mode=True),
              torch.nn.MaxPool3d(3, 2, 1, dilation=1, return_indices=True, ceil_mode=True), X3),
             (nn.AvgPool3d(3, 2, 1, ceil_mode=True, count_include_pad=False,
                           divisor_override=None),
              torch.nn.AvgPool3d(3, 2, 1, ceil_mode=True, count_include_pad=False), X3),
             (nn.MaxPool1d(2, 1, 1, 2, True, True), torch.nn.MaxPool1d(2, 1, 1, 2, True, True),
              X1),
             (nn.AvgPool1d(3, 2, 1, True, False), torch.nn.AvgPool1d(3, 2, 1, True, False), X1),
             (nn.AdaptiveAvgPool1d(4), torch.nn.AdaptiveAvgPool1d(4), X1),
             (nn.AdaptiveAvgPool3d((None, 2, 3)), torch.nn.AdaptiveAvgPool3d((None, 2, 3)), X3),
             (nn.AdaptiveMaxPool1d(4, True), torch.nn.AdaptiveMaxPool1d(4, True), X1),
             (nn.AdaptiveMaxPool2d((3, None)), torch.nn.AdaptiveMaxPool2d((3, None)), X3[0]),
             (nn.AdaptiveMaxPool3d(2, return_indices=True),
              torch.nn.AdaptiveMaxPool3d(2, return_indices=True), X3)]
    for ours, theirs, x in pairs:
        check(lambda x, m=ours: m(x), theirs, x, backend="interpreter")
    assert repr(pairs[0][0]) == ("MaxPool3d(kernel_size=(3, 3, 3), stride=(2, 2, 2), "
                                 "padding=(1, 1, 1), ceil_mode=True)")
    assert repr(pairs[5][0]) == "AdaptiveAvgPool3d(output_size=(None, 2, 3))"


def test_bad_pool_arguments_are_refused_naming_the_module_and_shapes():
    with pytest.raises(ValueError, match=r"MaxPool3d padding \(2, 2, 2\) must be at most half "
                                         r"the kernel \(3, 3, 3\)"):
        nn.MaxPool3d(3, padding=2)
    with pytest.raises(ValueError, match="AvgPool3d divisor_override must be a positive"):
        nn.AvgPool3d(2, divisor_override=0)
    with pytest.raises(ValueError, match=r"AdaptiveMaxPool3d output_size must be an integer >= 1 "
                                         r"or a triple of them \(None keeps the input's size\), "
                                         r"got \(2, 2\)"):
        nn.AdaptiveMaxPool3d((2, 2))
    with pytest.raises(TypeError):
        nn.AvgPool1d(2, divisor_override=2)  # torch's AvgPool1d has none either
    model = nn.Sequential(nn.MaxPool3d(2), nn.AdaptiveAvgPool3d(1))
    with pytest.raises(em.ShapeError, match=r"^layers.0 \(MaxPool3d\): max_pool3d: input must "
                                            r"have 5 dims \(batched\) or 4 \(unbatched\), got "
                                            r"\[4, 4, 4\]"):
        em.trace(model, em.TensorSpec((4, 4, 4), "f32"))
    with pytest.raises(em.ShapeError, match=r"^layers.0 \(MaxPool3d\): max_pool3d: kernel "
                                            r"\(2, 2, 2\) \(dilation \(1, 1, 1\)\) does not fit "
                                            r"input \[1, 2, 1, 4, 4\]"):
        em.trace(model, em.TensorSpec((1, 2, 1, 4, 4), "f32"))
    with pytest.raises(em.ShapeError, match=r"^layers.0 \(AdaptiveAvgPool3d\): "
                                            r"adaptive_avg_pool3d: input \[1, 2, 0, 2, 2\] is "
                                            r"empty in a non-batch dimension"):
        em.trace(nn.Sequential(nn.AdaptiveAvgPool3d(1)), em.TensorSpec((1, 2, 0, 2, 2), "f32"))
