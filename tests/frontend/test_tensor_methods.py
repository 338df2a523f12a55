"""The tensor methods a PyTorch user types inside `forward`, with torch's names and
meanings (dim/keepdim beside numpy's axis/keepdims, transpose of two dims, permute, view,
unsqueeze, squeeze, flatten, unflatten, expand, size, amax/amin, var/std, masked_fill,
clamp), against numpy on the interpreter and the cpu backend."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import Fn

import ember as em
from ember import nn

F = nn.functional
X = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)


CASES = {  # method: (ember's call, numpy's reference)
    "sum(dim, keepdim)": (lambda x: x.sum(dim=-1, keepdim=True),
                          lambda x: x.sum(-1, keepdims=True)),
    "mean(dim tuple)": (lambda x: x.mean(dim=(0, 2)), lambda x: x.mean((0, 2))),
    "amax": (lambda x: x.amax(1), lambda x: x.max(1)),
    "amin(keepdim)": (lambda x: x.amin(-1, keepdim=True), lambda x: x.min(-1, keepdims=True)),
    "var": (lambda x: x.var(1), lambda x: x.var(1, ddof=1)),
    "std(correction=0)": (lambda x: x.std(dim=-1, correction=0), lambda x: x.std(-1)),
    "var(all)": (lambda x: x.var(), lambda x: np.asarray(x.var(ddof=1))),
    "transpose(-2, -1)": (lambda x: x.transpose(-2, -1), lambda x: x.swapaxes(-2, -1)),
    "transpose(0, 2)": (lambda x: x.transpose(0, 2), lambda x: x.swapaxes(0, 2)),
    "transpose(perm)": (lambda x: x.transpose(1, 0, 2), lambda x: x.transpose(1, 0, 2)),
    "mT": (lambda x: x.mT, lambda x: x.swapaxes(-1, -2)),
    "permute": (lambda x: x.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1)),
    "view": (lambda x: x.view(6, -1), lambda x: x.reshape(6, -1)),
    "unsqueeze": (lambda x: x.unsqueeze(-1), lambda x: x[..., None]),
    "unsqueeze(1)": (lambda x: x.unsqueeze(1), lambda x: x[:, None]),
    "squeeze": (lambda x: x.unsqueeze(0).unsqueeze(3).squeeze(), lambda x: x),
    "squeeze(dim)": (lambda x: x.unsqueeze(1).squeeze(1), lambda x: x),
    "flatten(1)": (lambda x: x.flatten(1), lambda x: x.reshape(2, 12)),
    "flatten": (lambda x: x.flatten(), lambda x: x.reshape(-1)),
    "unflatten": (lambda x: x.unflatten(2, (2, 2)), lambda x: x.reshape(2, 3, 2, 2)),
    "expand": (lambda x: x.unsqueeze(0).expand(5, -1, -1, -1),
               lambda x: np.broadcast_to(x, (5, 2, 3, 4))),
    "size": (lambda x: x.reshape(x.size(0), x.size(-1) * x.size()[1]),
             lambda x: x.reshape(2, 12)),
    "dim, numel": (lambda x: x.reshape(x.dim(), x.numel() // 3), lambda x: x.reshape(3, 8)),
    "masked_fill": (lambda x: x.masked_fill(x < 0, -1.0), lambda x: np.where(x < 0, -1.0, x)),
    "clamp": (lambda x: x.clamp(-0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5)),
    "softmax(dim)": (lambda x: F.softmax(x, dim=1),
                     lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True)),
    "log_softmax(dim)": (lambda x: F.log_softmax(x, dim=-1),
                         lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))),
}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("name", CASES)
def test_a_method_means_what_it_means_in_torch(name, backend):
    ours, reference = CASES[name]
    got = em.compile(Fn(ours), X, backend=backend)(X)
    want = reference(X.astype(np.float64))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_both_spellings_at_once_and_dims_out_of_range_are_refused():
    with pytest.raises(em.ShapeError, match="give axis or dim, not both"):
        em.trace(Fn(lambda x: x.sum(0, dim=1)), X)
    with pytest.raises(em.ShapeError, match="dim 3 is out of range for \\[2, 3, 4\\]"):
        em.trace(Fn(lambda x: x.transpose(0, 3)), X)
    with pytest.raises(em.ShapeError, match="dim -5 is out of range"):
        em.trace(Fn(lambda x: x.unsqueeze(-5)), X)


def test_softmax_module_takes_dim():
    np.testing.assert_allclose(
        em.compile(nn.Softmax(dim=1), X, backend="interpreter")(X),
        em.compile(nn.Softmax(axis=1), X, backend="interpreter")(X))
