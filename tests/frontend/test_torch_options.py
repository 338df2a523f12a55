"""Options as PyTorch spells them (loss reduction, class weight, pos_weight, linear's torch
layout): values and gradients against torch on the interpreter and cpu."""

import numpy as np
import pytest

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")
TF = torch.nn.functional
W = np.array([0.5, 2.0, 1.0, 3.0], np.float32)

CASES = {
    "ce sum": (lambda o, y: F.cross_entropy(o, y, reduction="sum"),
               lambda o, y: TF.cross_entropy(o, y, reduction="sum")),
    "ce none": (lambda o, y: F.cross_entropy(o, y, reduction="none"),
                lambda o, y: TF.cross_entropy(o, y, reduction="none")),
    "ce weight": (lambda o, y: F.cross_entropy(o, y, weight=W),
                  lambda o, y: TF.cross_entropy(o, y, weight=torch.tensor(W))),
    "ce weight sum": (lambda o, y: F.cross_entropy(o, y, weight=W, reduction="sum"),
                      lambda o, y: TF.cross_entropy(o, y, weight=torch.tensor(W),
                                                    reduction="sum")),
    "ce smoothing none": (lambda o, y: F.cross_entropy(o, y, 0.1, reduction="none"),
                          lambda o, y: TF.cross_entropy(o, y, label_smoothing=0.1,
                                                        reduction="none")),
    "nll weight": (lambda o, y: F.nll_loss(F.log_softmax(o, 1), y, weight=W),
                   lambda o, y: TF.nll_loss(o.log_softmax(1), y, weight=torch.tensor(W))),
    "mse sum": (lambda o, y: F.mse_loss(o, o * 0.5 + 1.0, reduction="sum"),
                lambda o, y: TF.mse_loss(o, o * 0.5 + 1.0, reduction="sum")),
    "bce pos_weight": (lambda o, y: F.binary_cross_entropy_with_logits(
        o, o * 0.0 + 0.5, pos_weight=W),
        lambda o, y: TF.binary_cross_entropy_with_logits(
            o, o.detach() * 0.0 + 0.5, pos_weight=torch.tensor(W))),
}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("name", CASES)
def test_loss_options_match_torch(name, backend):
    ours, theirs = CASES[name]
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 4, 8)
    em.seed(0)
    model = Head()
    loss = em.compile_grad(model, lambda o, t: ours(o, t).sum(), backend=backend)
    grads = loss(x, y)
    w = torch.tensor(model.fc.weight.val(), requires_grad=True)
    b = torch.tensor(model.fc.bias.val(), requires_grad=True)
    out = torch.tensor(x) @ w + b
    want = theirs(out, torch.tensor(y))
    want.sum().backward()
    got = em.compile(_Loss(model, ours), x, y, backend=backend)(x, y)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[model.fc.weight.id], w.grad.numpy(), rtol=1e-4, atol=1e-6)


class _Loss(nn.Module):
    def __init__(self, model, fn):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, x, y):
        return self.fn(self.model(x), y)


def test_bad_options_are_refused():
    x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
    with pytest.raises(ValueError, match="reduction must be one of mean, sum, none"):
        em.compile(_Loss(nn.Linear(4, 4), lambda o, t: F.cross_entropy(o, t, reduction="avg")),
                   x, y)
    with pytest.raises(em.ShapeError, match=r"one value per class, \[4\]"):
        em.compile(_Loss(nn.Linear(4, 4), lambda o, t: F.nll_loss(o, t, weight=W[:3])), x, y)
    with pytest.raises(em.ShapeError, match="without label smoothing"):
        em.compile(_Loss(nn.Linear(4, 4), lambda o, t: F.cross_entropy(o, t, 0.1, weight=W)),
                   x, y)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_linear_takes_a_torch_weight_with_layout_torch(backend):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w, b = rng.standard_normal((4, 4)).astype(np.float32), np.arange(4, dtype=np.float32)

    class Lin(nn.Module):
        def forward(self, x):
            return F.linear(x, w, b, layout="torch")

    want = TF.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b)).numpy()
    np.testing.assert_allclose(em.compile(Lin(), x, backend=backend)(x), want, rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="layout must be one of ember, torch"):
        em.compile(_Loss(nn.Linear(4, 4), lambda o, t: F.linear(o, w, layout="pt")), x, x)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_dtype_computes_in_that_dtype(fn):
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)

    class Soft(nn.Module):
        def forward(self, x):
            return getattr(F, fn)(x, 1, dtype=np.float64)

    got = em.compile(Soft(), x, backend="cpu")(x)
    want = getattr(TF, fn)(torch.tensor(x), 1, dtype=torch.float64).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)
