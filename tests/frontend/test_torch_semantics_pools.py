"""max_pool2d and avg_pool2d with torch's other arguments (ceil_mode, dilation,
return_indices; count_include_pad, divisor_override), on batched and unbatched input, and
the MaxPool2d/AvgPool2d modules that take them: values and gradients against torch."""

import numpy as np
import pytest
from torch_semantics import check

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")
TF = torch.nn.functional
BACKENDS = ["interpreter", "cpu"]

MAX = {  # name: keyword arguments of both max_pool2d's, after the kernel size
    "ceil": dict(kernel_size=3, stride=2, ceil_mode=True),
    "ceil padded": dict(kernel_size=(3, 2), stride=2, padding=1, ceil_mode=True),
    "dilation": dict(kernel_size=3, stride=1, dilation=2),
    "dilation padded ceil": dict(kernel_size=2, stride=(2, 3), padding=1, dilation=(2, 1),
                                 ceil_mode=True),
    "indices": dict(kernel_size=2, return_indices=True),
    "indices overlapping padded": dict(kernel_size=3, stride=1, padding=1, return_indices=True),
    "indices dilation ceil": dict(kernel_size=2, stride=2, dilation=2, ceil_mode=True,
                                  return_indices=True),
}
AVG = {
    "exclude pad": dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    "divisor": dict(kernel_size=2, divisor_override=3),
    "ceil": dict(kernel_size=3, stride=2, ceil_mode=True),
    "ceil padded": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    "ceil exclude pad": dict(kernel_size=(2, 3), stride=2, padding=1, ceil_mode=True,
                             count_include_pad=False),
    "ceil divisor": dict(kernel_size=2, stride=2, ceil_mode=True, divisor_override=5),
}


def _input(shape=(2, 3, 7, 8)):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


POOLS = {**{f"max_pool2d {name}": ("max_pool2d", kw) for name, kw in MAX.items()},
         **{f"avg_pool2d {name}": ("avg_pool2d", kw) for name, kw in AVG.items()}}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", POOLS)
def test_pools_match_torch(name, backend):
    fn, kw = POOLS[name]
    check(lambda x: getattr(F, fn)(x, **kw), lambda x: getattr(TF, fn)(x, **kw), _input(),
          backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pool", ["max", "max indices", "avg"])
def test_pools_take_unbatched_input(pool, backend):
    kw = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    ours, theirs = (F.avg_pool2d, TF.avg_pool2d) if pool == "avg" else (F.max_pool2d,
                                                                        TF.max_pool2d)
    if pool == "max indices":
        kw["return_indices"] = True
    check(lambda x: ours(x, **kw), lambda x: theirs(x, **kw), _input((3, 7, 8)),
          backend=backend)


def test_the_modules_take_torchs_arguments():
    x = _input()
    pairs = [(nn.MaxPool2d(3, 2, 1, dilation=1, return_indices=True, ceil_mode=True),
              torch.nn.MaxPool2d(3, 2, 1, dilation=1, return_indices=True, ceil_mode=True)),
             (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False,
                           divisor_override=None),
              torch.nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False))]
    for ours, theirs in pairs:
        check(lambda x, m=ours: m(x), theirs, x, backend="cpu")
    assert repr(pairs[0][0]) == ("MaxPool2d(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), "
                                 "ceil_mode=True)")


def test_bad_pool_arguments_are_refused():
    with pytest.raises(ValueError, match=r"MaxPool2d padding \(2, 2\) must be at most half "
                                         r"the kernel \(3, 3\)"):
        nn.MaxPool2d(3, padding=2)
    with pytest.raises(ValueError, match="AvgPool2d divisor_override must be a positive"):
        nn.AvgPool2d(2, divisor_override=0)
    with pytest.raises(em.ShapeError, match=r"max_pool2d: input must have 4 dims \(batched\) "
                                            r"or 3 \(unbatched\), got \[7, 8\]"):
        check(lambda x: F.max_pool2d(x, 2), lambda x: x, _input((7, 8)), backend="interpreter")
    with pytest.raises(em.ShapeError, match=r"max_pool2d: kernel \(3, 3\) \(dilation \(3, 3\)\) "
                                            r"does not fit input \[1, 1, 5, 5\]"):
        check(lambda x: F.max_pool2d(x, 3, dilation=3), lambda x: x, _input((1, 1, 5, 5)),
              backend="interpreter")
