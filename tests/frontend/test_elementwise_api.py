"""The elementwise functions PyTorch users call by name (maximum, minimum, where, clamp,
rsqrt, broadcast_to): values and gradients against torch, on the interpreter and cpu."""

import numpy as np
import pytest

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")

CASES = {
    "maximum": (lambda x, w: F.maximum(x, w), lambda x, w: torch.maximum(x, w)),
    "minimum": (lambda x, w: F.minimum(x * 2.0, w), lambda x, w: torch.minimum(x * 2.0, w)),
    "where": (lambda x, w: F.where(x > w, x, w * 3.0),
              lambda x, w: torch.where(x > w, x, w * 3.0)),
    "clamp": (lambda x, w: F.clamp(x + w, -0.5, 0.7), lambda x, w: torch.clamp(x + w, -0.5, 0.7)),
    "clamp_min": (lambda x, w: F.clamp(x * w, min=0.1), lambda x, w: torch.clamp(x * w, min=0.1)),
    "maximum_scalar": (lambda x, w: F.maximum(0.25, x * w), lambda x, w: torch.clamp(x * w,
                                                                                   min=0.25)),
    "rsqrt": (lambda x, w: F.rsqrt(x * x + w * w + 0.1),
              lambda x, w: torch.rsqrt(x * x + w * w + 0.1)),
    "broadcast_to": (lambda x, w: F.broadcast_to(w, (3, 4, 5)) * x,
                     lambda x, w: torch.broadcast_to(w, (3, 4, 5)) * x),
}


class Net(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.w = em.Param.from_array(np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5))
        self.fn = fn

    def forward(self, x):
        return self.fn(x, self.w)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_torch(name, backend):
    ours, theirs = CASES[name]
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    net = Net(ours)
    out = em.compile(net, x, backend=backend)(x)
    grads = em.compile_grad(net, lambda o, t: ((o - t) ** 2).mean(), backend=backend)(
        x, np.zeros_like(x))
    tx, tw = torch.tensor(x), torch.tensor(net.w.val(), requires_grad=True)
    want = theirs(tx, tw)
    ((want - 0) ** 2).mean().backward()
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[net.w.id], tw.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_where_needs_a_boolean_condition():
    with pytest.raises(em.ShapeError, match="condition must be a boolean tensor"):
        em.compile(Net(lambda x, w: F.where(x, x, w)), np.zeros((3, 4, 5), np.float32))
