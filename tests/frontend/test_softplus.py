"""`nn.functional.softplus`, the primitive `ember.softplus`, against PyTorch: values and
gradients on the interpreter and the cpu backend, far out where exp(beta x) overflows or
underflows and on both sides of the threshold, in f32 and f64. (Its per-op and fused
kernels on every backend are tested with all elementwise ops, from the registry.)"""

import numpy as np
import pytest

import ember as em
from ember import nn

torch = pytest.importorskip("torch")

EDGES = [-1e4, -100, -30, -20.5, -5, -1, -1e-3, 0, 1e-3, 1, 5, 9.99, 10.01, 19.99, 20, 20.01,
         30, 60.5, 100, 1e4]
X = np.concatenate([EDGES, np.random.default_rng(0).normal(size=44) * 10])
W = np.random.default_rng(1).normal(size=X.shape)
TOL = {"f32": dict(rtol=2e-6, atol=1e-30), "f64": dict(rtol=1e-13, atol=1e-300)}


class Softplus(nn.Module):
    """softplus(p) * r, so that d sum(out * w) / dp = softplus'(p) * r * w."""

    def __init__(self, x, beta, threshold):
        super().__init__()
        self.p = em.Param.from_array(x)
        self.beta, self.threshold = beta, threshold

    def forward(self, r):
        return nn.functional.softplus(self.p, self.beta, self.threshold) * r


@pytest.mark.parametrize("beta, threshold", [(1, 20), (2, 5), (0.5, 30)])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_softplus_against_torch(backend, dtype, beta, threshold):
    x, w = X.astype(dtype.replace("f", "float")), W.astype(dtype.replace("f", "float"))
    model, ones = Softplus(x, beta, threshold), np.ones_like(x)
    p = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.softplus(p, beta, threshold)
    (want * torch.tensor(w)).sum().backward()
    got = em.compile(model, ones, backend=backend)(ones)
    grad = em.compile_grad(model, lambda out, y: (out * y).sum(), backend=backend)(ones, w)
    np.testing.assert_allclose(got, want.detach().numpy(), **TOL[dtype])
    np.testing.assert_allclose(grad[model.p], p.grad.numpy(), **TOL[dtype])


def test_softplus_is_one_primitive():
    x = np.zeros(3, np.float32)
    ops = [op.name for op in em.trace(Softplus(x, 1, 20), x).ops]
    assert ops == ["ember.param", "ember.softplus", "ember.mul", "func.return"]
