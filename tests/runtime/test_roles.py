"""Graph roles the runtime serves: the RNG counter (dropout) and buffer updates (BatchNorm)."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim

N = 10_000


class Drop(nn.Module):
    """A trainable gate of ones, then dropout: the output shows the mask."""

    def __init__(self, p=0.5):
        super().__init__()
        self.w = em.Param((N,), em.init.Ones())
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(x * self.w)


def with_output(out, y):
    d = out - y
    return (d * d).mean(), out


def train_output(model, backend):
    step = em.compile_train_step(model, with_output, optim.SGD(lr=1e-9), backend=backend)
    ones = np.ones(N, np.float32)
    _, out = step(ones, ones)
    return out, step


BACKENDS = ["interpreter", "cpu"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_table(backend):
    """p=0.5 on 10,000 ones: a training step zeroes about half and doubles the rest;
    valid(), freeze() and an inference compile zero none."""
    em.seed(0)
    model = Drop()
    out, step = train_output(model, backend)
    assert 0.47 < (out == 0).mean() < 0.53
    assert set(np.unique(out)) == {0.0, 2.0}
    _, again = step(np.ones(N, np.float32), np.ones(N, np.float32))
    assert 0.4 < (again != out).mean() < 0.6  # a new mask each step (the rng counter moved)
    assert step.rng_step == 2

    model.valid()
    out, _ = train_output(model, backend)
    assert (out == 1).all()

    model.train()
    model.drop.freeze()
    model.train()  # freeze survives train()
    out, _ = train_output(model, backend)
    assert (out == 1).all()

    model.unfreeze().train()
    fwd = em.compile(model, np.ones(N, np.float32), backend=backend)
    assert bool(model.drop.training) and (fwd(np.ones(N, np.float32)) == 1).all()


def test_dropout_masks_agree_across_backends():
    em.seed(3)
    outs = [train_output(Drop(0.3), b)[0] for b in BACKENDS]
    np.testing.assert_array_equal(outs[0], outs[1])


class BnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.fc(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_running_stats_are_written_back_as_pytorch_does(backend):
    torch = pytest.importorskip("torch")
    em.seed(0)
    model = BnNet()
    rng = np.random.default_rng(0)
    xs = [rng.normal(1.0, 3.0, size=(8, 4)).astype(np.float32) for _ in range(3)]
    y = np.arange(8) % 3
    t = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    with torch.no_grad():
        t[0].weight.copy_(torch.from_numpy(model.fc.weight.val().T.copy()))
        t[0].bias.copy_(torch.from_numpy(model.fc.bias.val()))
    topt = torch.optim.SGD(t.parameters(), lr=0.1)
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend=backend)
    mean_id = model.bn.running_mean.id
    for x in xs:
        step(x, y)
        topt.zero_grad()
        torch.nn.functional.cross_entropy(t(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        topt.step()
    assert model.bn.running_mean.id == mean_id
    np.testing.assert_allclose(model.bn.running_mean.val(), t[1].running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bn.running_var.val(), t[1].running_var.numpy(),
                               rtol=1e-5, atol=1e-6)
    # evaluation uses the running stats and leaves them alone
    t.eval()
    fwd = em.compile(model, xs[0], backend=backend)
    np.testing.assert_allclose(fwd(xs[0]), t(torch.from_numpy(xs[0])).detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.bn.running_mean.val(), t[1].running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
